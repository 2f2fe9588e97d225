"""Small Hugging Face models for tests that trace, serve or decode a real transformers model on CPU.

A test wants the model's code (transformers' attention, its caches, its rotary embedding), not its
size: 64-wide hidden states, 4 query heads over 2 key/value heads of 16 (grouped-query attention,
as Llama 3's), a 128-token vocabulary, and weights drawn from a fixed seed, so every test that
builds one gets the same model. A test skips where transformers is not installed.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn


def tiny_llama(num_hidden_layers: int = 2, **config: Any) -> nn.Module:
    """A ``LlamaForCausalLM`` of the sizes above with ``num_hidden_layers`` layers, in eval mode,
    weights from ``torch.manual_seed(0)``; ``config`` adds to or overrides ``LlamaConfig``'s
    arguments (``attn_implementation="eager"``, say)."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    sizes: dict[str, Any] = {
        "vocab_size": 128, "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
        "num_key_value_heads": 2, "max_position_embeddings": 64,
    }  # fmt: skip
    llama_config = transformers.LlamaConfig(num_hidden_layers=num_hidden_layers, **(sizes | config))
    model: nn.Module = transformers.LlamaForCausalLM(llama_config).eval()
    return model

"""Built-in models, and loading the models the whole-model commands work on.

Built-in models are plain PyTorch (no transformers), one short file each, written the way people
write them (``nn.LayerNorm``, the Hugging Face RMSNorm with its float32 upcast, the ``rotate_half``
rotary embedding, ``F.scaled_dot_product_attention``, ``nn.SiLU``), so that profiles and pattern
matching see what they would see in users' models:

========================  =================================================================
name                      model
========================  =================================================================
``gpt2``                  GPT-2 124M: LayerNorm, tanh GELU, learned positions, tied LM head
``llama-160m``            LLaMA-style 160M: RMSNorm, rotary, SwiGLU, 12 heads over 4 KV heads
``llama-7b``              the LLaMA-2 7B configuration (6.74B parameters)
``bert-base``             BERT-base encoder: post-LayerNorm, erf GELU, bidirectional, padding mask
========================  =================================================================

>>> from kernelsmith.models import get_model, example_inputs
>>> model = get_model("llama-160m", tiny=True)           # 2 layers, hidden 64: for tests
>>> inputs = example_inputs(model, batch=2, seq=32, device="cpu")
>>> model(*inputs).shape
torch.Size([2, 32, 512])
>>> big = get_model("llama-7b", device="meta")           # no memory: parameters are meta tensors
>>> round(sum(p.numel() for p in big.parameters()) / 1e9, 2)
6.74

:func:`load_model` resolves the ``MODEL`` argument of the commands (a built-in name,
``path/to/file.py:ClassName``, or a Hugging Face config) to a module.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from typing import Any

import torch
from torch import nn

from kernelsmith.models import bert, gpt2, llama
from kernelsmith.models._load import LoadedModel, load_model, max_positions


@dataclass(frozen=True)
class BuiltinModel:
    """A registry entry: how to build the model, its configuration, and its tiny test configuration."""

    name: str
    summary: str
    build: Callable[[Any], nn.Module]
    config: Any
    tiny: dict[str, Any]


_REGISTRY: dict[str, BuiltinModel] = {
    entry.name: entry
    for entry in (
        BuiltinModel("gpt2", "GPT-2 124M (LayerNorm, tanh GELU)", gpt2.GPT2, gpt2.GPT2Config(), gpt2.TINY),
        BuiltinModel(
            "llama-160m",
            "LLaMA-style 160M (RMSNorm, rotary, SwiGLU, GQA)",
            llama.Llama,
            llama.LlamaConfig(),
            llama.TINY,
        ),
        BuiltinModel(
            "llama-7b", "LLaMA-2 7B configuration", llama.Llama, llama.LlamaConfig(**llama.LLAMA_7B), llama.TINY
        ),
        BuiltinModel("bert-base", "BERT-base encoder (LayerNorm, erf GELU)", bert.Bert, bert.BertConfig(), bert.TINY),
    )
}


def model_names() -> list[str]:
    """Names :func:`get_model` accepts."""
    return list(_REGISTRY)


def builtin(name: str) -> BuiltinModel:
    """The registry entry for ``name``; ValueError for an unknown name."""
    if name not in _REGISTRY:
        raise ValueError(f"unknown built-in model {name!r} (built-in: {', '.join(_REGISTRY)})")
    return _REGISTRY[name]


def get_model(
    name: str,
    *,
    tiny: bool = False,
    device: str | torch.device | None = None,
    dtype: torch.dtype | None = None,
    **overrides: Any,
) -> nn.Module:
    """Build the built-in model ``name`` with fresh random weights (normal, std 0.02).

    ``tiny=True`` takes the family's small test configuration (2 layers, hidden 64, vocabulary
    512); ``overrides`` set configuration fields on top (``get_model("gpt2", n_layers=2)``;
    the fields are those of :class:`~kernelsmith.models.gpt2.GPT2Config`,
    :class:`~kernelsmith.models.llama.LlamaConfig` and :class:`~kernelsmith.models.bert.BertConfig`).
    The parameters are created directly on ``device`` (``"meta"`` allocates nothing), then cast
    to ``dtype`` when given.
    """
    entry = builtin(name)
    known = {f.name for f in fields(entry.config)}
    unknown = sorted(set(overrides) - known)
    if unknown:
        raise ValueError(f"{name} has no configuration field {', '.join(unknown)} (fields: {', '.join(sorted(known))})")
    config = replace(entry.config, **{**(entry.tiny if tiny else {}), **overrides})
    with torch.device(device if device is not None else "cpu"):
        model = entry.build(config)
    return model.to(dtype) if dtype is not None else model


def example_inputs(
    model: nn.Module, batch: int, seq: int, device: str | torch.device = "cpu", seed: int = 0
) -> tuple[torch.Tensor, ...]:
    """Positional inputs for one forward of ``model``: ``model(*example_inputs(model, ...))``.

    Token ids ``(batch, seq)`` in the model's vocabulary range, and what else the model needs
    (BERT: an attention mask with padding on odd rows). A model defining
    ``example_inputs(batch, seq, device, seed)`` (every built-in model does) is asked; for others,
    a Hugging Face model's ``config.vocab_size`` or the model's first ``nn.Embedding`` gives the
    vocabulary. ValueError when neither exists: define ``example_inputs`` on the model.
    """
    own = getattr(model, "example_inputs", None)
    if callable(own):
        return tuple(own(batch, seq, device, seed))
    from kernelsmith.models._common import token_ids

    vocab = getattr(getattr(model, "config", None), "vocab_size", None)
    if not isinstance(vocab, int):
        vocab = next((m.num_embeddings for m in model.modules() if isinstance(m, nn.Embedding)), None)
    if vocab is None:
        raise ValueError(
            f"cannot make inputs for {type(model).__name__}: it has no vocabulary (no config.vocab_size, no "
            "nn.Embedding); define example_inputs(self, batch, seq, device, seed) on the model, returning a "
            "tuple of positional inputs"
        )
    limit = max_positions(model)
    if limit is not None and seq > limit:
        raise ValueError(f"seq {seq} exceeds the model's {limit} positions")
    return (token_ids(vocab, batch, seq, device, seed),)


def parameter_count(model: nn.Module) -> int:
    """Parameters, each shared tensor counted once (GPT-2's tied embedding and LM head)."""
    return sum(p.numel() for p in model.parameters())


__all__ = [
    "BuiltinModel",
    "LoadedModel",
    "builtin",
    "example_inputs",
    "get_model",
    "load_model",
    "max_positions",
    "model_names",
    "parameter_count",
]

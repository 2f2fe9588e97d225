"""BERT-base encoder, written the way Hugging Face's ``modeling_bert`` writes it.

Post-LayerNorm layers (``LayerNorm(x + sublayer(x))``, eps 1e-12), separate query/key/value
projections, bidirectional ``F.scaled_dot_product_attention`` with a boolean padding mask, an MLP
with the exact (erf) GELU as ``nn.GELU()``, word + learned position + token type embeddings.
No pooler and no dropout: the model returns the last hidden states ``(batch, seq, hidden)``
(108.9M parameters in the base configuration).

>>> from kernelsmith.models import get_model, example_inputs
>>> model = get_model("bert-base", tiny=True)
>>> ids, mask = example_inputs(model, batch=2, seq=16, device="cpu")
>>> model(ids, mask).shape
torch.Size([2, 16, 64])
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from kernelsmith.models._common import token_ids


@dataclass(frozen=True)
class BertConfig:
    vocab_size: int = 30522
    hidden: int = 768
    n_layers: int = 12
    n_heads: int = 12
    intermediate: int = 3072
    max_positions: int = 512
    type_vocab_size: int = 2
    eps: float = 1e-12


TINY = {"vocab_size": 512, "hidden": 64, "n_layers": 2, "n_heads": 4, "intermediate": 256, "max_positions": 64}


class Embeddings(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden)
        self.position_embeddings = nn.Embedding(config.max_positions, config.hidden)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, config.hidden)
        self.LayerNorm = nn.LayerNorm(config.hidden, eps=config.eps)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None) -> torch.Tensor:
        positions = torch.arange(input_ids.shape[1], device=input_ids.device).unsqueeze(0)
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        x = self.word_embeddings(input_ids) + self.position_embeddings(positions)
        return self.LayerNorm(x + self.token_type_embeddings(token_type_ids))


class SelfAttention(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        if config.hidden % config.n_heads:
            raise ValueError(f"hidden {config.hidden} is not a multiple of n_heads {config.n_heads}")
        self.n_heads = config.n_heads
        self.head_dim = config.hidden // config.n_heads
        self.query = nn.Linear(config.hidden, config.hidden)
        self.key = nn.Linear(config.hidden, config.hidden)
        self.value = nn.Linear(config.hidden, config.hidden)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        b, s, h = x.shape
        q = self.query(x).view(b, s, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.key(x).view(b, s, self.n_heads, self.head_dim).transpose(1, 2)
        v = self.value(x).view(b, s, self.n_heads, self.head_dim).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return y.transpose(1, 2).reshape(b, s, h)


class Layer(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.attention = SelfAttention(config)
        self.attention_output = nn.Linear(config.hidden, config.hidden)
        self.attention_norm = nn.LayerNorm(config.hidden, eps=config.eps)
        self.intermediate = nn.Linear(config.hidden, config.intermediate)
        self.act = nn.GELU()
        self.output = nn.Linear(config.intermediate, config.hidden)
        self.output_norm = nn.LayerNorm(config.hidden, eps=config.eps)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        x = self.attention_norm(x + self.attention_output(self.attention(x, mask)))
        return self.output_norm(x + self.output(self.act(self.intermediate(x))))


class Bert(nn.Module):
    """BERT encoder: token ids and a ``(batch, seq)`` attention mask (1 = token, 0 = padding) to
    hidden states ``(batch, seq, hidden)``."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.config = config
        self.embeddings = Embeddings(config)
        self.layers = nn.ModuleList(Layer(config) for _ in range(config.n_layers))
        self.apply(self._init_weights)

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear | nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        # (batch, 1, 1, seq) booleans, True where a key may be attended to: every query sees
        # every real token, none sees padding.
        mask = None if attention_mask is None else attention_mask[:, None, None, :].bool()
        x = self.embeddings(input_ids, token_type_ids)
        for layer in self.layers:
            x = layer(x, mask)
        return x

    def example_inputs(
        self, batch: int, seq: int, device: str | torch.device, seed: int = 0
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Token ids and an attention mask whose odd rows end in padding (a quarter of the sequence)."""
        if seq > self.config.max_positions:
            raise ValueError(f"seq {seq} exceeds BERT's {self.config.max_positions} learned positions")
        ids = token_ids(self.config.vocab_size, batch, seq, device, seed)
        mask = torch.ones(batch, seq, dtype=torch.long)
        mask[1::2, seq - seq // 4 :] = 0
        return ids, mask.to(device)

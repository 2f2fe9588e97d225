"""GPT-2 (124M), written the way people write it: nanoGPT's layout with Hugging Face's names.

Pre-LayerNorm blocks (``nn.LayerNorm``), one fused ``c_attn`` projection split into q, k, v,
causal ``F.scaled_dot_product_attention``, an MLP with the tanh-approximated GELU written out as
Hugging Face's ``gelu_new`` does, learned position embeddings, and an LM head tied to the token
embedding. No dropout: profiles and verification compare deterministic forwards.

>>> from kernelsmith.models import get_model, example_inputs
>>> model = get_model("gpt2", tiny=True)
>>> (ids,) = example_inputs(model, batch=2, seq=16, device="cpu")
>>> model(ids).shape
torch.Size([2, 16, 512])
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from kernelsmith.models._common import token_ids


@dataclass(frozen=True)
class GPT2Config:
    vocab_size: int = 50257
    max_positions: int = 1024
    n_layers: int = 12
    hidden: int = 768
    n_heads: int = 12
    eps: float = 1e-5


TINY = {"vocab_size": 512, "max_positions": 64, "n_layers": 2, "hidden": 64, "n_heads": 4}


class NewGELU(nn.Module):
    """GELU, tanh approximation, as Hugging Face's ``gelu_new`` activation writes it."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPT2Config) -> None:
        super().__init__()
        if config.hidden % config.n_heads:
            raise ValueError(f"hidden {config.hidden} is not a multiple of n_heads {config.n_heads}")
        self.n_heads = config.n_heads
        self.c_attn = nn.Linear(config.hidden, 3 * config.hidden)
        self.c_proj = nn.Linear(config.hidden, config.hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        q, k, v = self.c_attn(x).split(h, dim=2)
        q = q.view(b, s, self.n_heads, h // self.n_heads).transpose(1, 2)
        k = k.view(b, s, self.n_heads, h // self.n_heads).transpose(1, 2)
        v = v.view(b, s, self.n_heads, h // self.n_heads).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        y = y.transpose(1, 2).contiguous().view(b, s, h)
        return self.c_proj(y)


class MLP(nn.Module):
    def __init__(self, config: GPT2Config) -> None:
        super().__init__()
        self.c_fc = nn.Linear(config.hidden, 4 * config.hidden)
        self.act = NewGELU()
        self.c_proj = nn.Linear(4 * config.hidden, config.hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(self.act(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self, config: GPT2Config) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.hidden, eps=config.eps)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.hidden, eps=config.eps)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT2(nn.Module):
    """GPT-2 language model: token ids ``(batch, seq)`` to logits ``(batch, seq, vocab_size)``."""

    def __init__(self, config: GPT2Config) -> None:
        super().__init__()
        self.config = config
        self.wte = nn.Embedding(config.vocab_size, config.hidden)
        self.wpe = nn.Embedding(config.max_positions, config.hidden)
        self.h = nn.ModuleList(Block(config) for _ in range(config.n_layers))
        self.ln_f = nn.LayerNorm(config.hidden, eps=config.eps)
        self.lm_head = nn.Linear(config.hidden, config.vocab_size, bias=False)
        self.apply(self._init_weights)
        self.lm_head.weight = self.wte.weight  # tied, as in GPT-2

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear | nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        x = self.wte(input_ids) + self.wpe(positions)
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x))

    def example_inputs(self, batch: int, seq: int, device: str | torch.device, seed: int = 0) -> tuple[torch.Tensor]:
        if seq > self.config.max_positions:
            raise ValueError(f"seq {seq} exceeds GPT-2's {self.config.max_positions} learned positions")
        return (token_ids(self.config.vocab_size, batch, seq, device, seed),)


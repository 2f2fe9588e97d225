"""A LLaMA-style decoder, written the way Hugging Face's ``modeling_llama`` writes it.

RMSNorm with the float32 upcast, rotary position embedding in the ``rotate_half`` form (cos and
sin computed from the position ids in float32 each forward, then cast to the activations'
dtype), grouped-query attention (``repeat_kv`` then causal ``F.scaled_dot_product_attention``),
a SwiGLU MLP ``down(silu(gate(x)) * up(x))``, no biases, an untied LM head.

Configurations: ``llama-160m`` (12 layers, hidden 768, 12 heads over 4 key/value heads,
intermediate 3328: 160.1M parameters) and ``llama-7b`` (LLaMA-2 7B: 32 layers, hidden 4096, 32
heads, intermediate 11008, vocabulary 32000: 6.74B parameters). The 7B builds on the meta device
without allocating (``get_model("llama-7b", device="meta")``): nothing here computes on a
parameter at construction.

>>> from kernelsmith.models import get_model, example_inputs
>>> model = get_model("llama-160m", tiny=True)
>>> (ids,) = example_inputs(model, batch=2, seq=16, device="cpu")
>>> model(ids).shape
torch.Size([2, 16, 512])
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from kernelsmith.models._common import token_ids


@dataclass(frozen=True)
class LlamaConfig:
    vocab_size: int = 32000
    hidden: int = 768
    intermediate: int = 3328
    n_layers: int = 12
    n_heads: int = 12
    n_kv_heads: int = 4
    eps: float = 1e-5
    rope_theta: float = 10000.0
    max_positions: int = 2048  # what the configuration was trained for; rotary itself has no limit


LLAMA_7B = {
    "hidden": 4096,
    "intermediate": 11008,
    "n_layers": 32,
    "n_heads": 32,
    "n_kv_heads": 32,
    "max_positions": 4096,
}
TINY = {"vocab_size": 512, "hidden": 64, "intermediate": 176, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2}


class RMSNorm(nn.Module):
    """Hugging Face's ``LlamaRMSNorm``: normalize in float32, cast back, then scale."""

    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.to(torch.float32)
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        return self.weight * hidden_states.to(input_dtype)


class RotaryEmbedding(nn.Module):
    """cos and sin ``(batch, seq, head_dim)`` for the position ids (the two halves repeat the frequencies)."""

    def __init__(self, head_dim: int, theta: float) -> None:
        super().__init__()
        self.head_dim = head_dim
        self.theta = theta

    @torch.no_grad()
    def forward(self, x: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        exponents = torch.arange(0, self.head_dim, 2, dtype=torch.int64, device=x.device).float() / self.head_dim
        inv_freq = 1.0 / (self.theta**exponents)
        freqs = position_ids[:, :, None].float() * inv_freq[None, None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(x.dtype), emb.sin().to(x.dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary_pos_emb(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    cos = cos.unsqueeze(1)  # (batch, 1, seq, head_dim): broadcast over heads
    sin = sin.unsqueeze(1)
    return (q * cos) + (rotate_half(q) * sin), (k * cos) + (rotate_half(k) * sin)


def repeat_kv(hidden_states: torch.Tensor, n_rep: int) -> torch.Tensor:
    """``(batch, kv_heads, seq, head_dim)`` to ``(batch, kv_heads * n_rep, seq, head_dim)``."""
    batch, kv_heads, seq, head_dim = hidden_states.shape
    if n_rep == 1:
        return hidden_states
    hidden_states = hidden_states[:, :, None, :, :].expand(batch, kv_heads, n_rep, seq, head_dim)
    return hidden_states.reshape(batch, kv_heads * n_rep, seq, head_dim)


class Attention(nn.Module):
    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        if config.hidden % config.n_heads or config.n_heads % config.n_kv_heads:
            raise ValueError(
                f"hidden {config.hidden} must be a multiple of n_heads {config.n_heads}, "
                f"and n_heads a multiple of n_kv_heads {config.n_kv_heads}"
            )
        self.head_dim = config.hidden // config.n_heads
        self.n_rep = config.n_heads // config.n_kv_heads
        self.q_proj = nn.Linear(config.hidden, config.n_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(config.hidden, config.n_kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(config.hidden, config.n_kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(config.n_heads * self.head_dim, config.hidden, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q = self.q_proj(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        k = repeat_kv(k, self.n_rep)
        v = repeat_kv(v, self.n_rep)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(y.transpose(1, 2).reshape(b, s, -1))


class MLP(nn.Module):
    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden, config.intermediate, bias=False)
        self.up_proj = nn.Linear(config.hidden, config.intermediate, bias=False)
        self.down_proj = nn.Linear(config.intermediate, config.hidden, bias=False)
        self.act_fn = nn.SiLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden, eps=config.eps)
        self.self_attn = Attention(config)
        self.post_attention_layernorm = RMSNorm(config.hidden, eps=config.eps)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class Llama(nn.Module):
    """LLaMA language model: token ids ``(batch, seq)`` to logits ``(batch, seq, vocab_size)``."""

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden)
        self.layers = nn.ModuleList(DecoderLayer(config) for _ in range(config.n_layers))
        self.norm = RMSNorm(config.hidden, eps=config.eps)
        self.rotary_emb = RotaryEmbedding(config.hidden // config.n_heads, config.rope_theta)
        self.lm_head = nn.Linear(config.hidden, config.vocab_size, bias=False)
        self.apply(self._init_weights)

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear | nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.embed_tokens(input_ids)
        position_ids = torch.arange(input_ids.shape[1], device=input_ids.device).unsqueeze(0)
        cos, sin = self.rotary_emb(x, position_ids)
        for layer in self.layers:
            x = layer(x, cos, sin)
        return self.lm_head(self.norm(x))

    def example_inputs(self, batch: int, seq: int, device: str | torch.device, seed: int = 0) -> tuple[torch.Tensor]:
        return (token_ids(self.config.vocab_size, batch, seq, device, seed),)

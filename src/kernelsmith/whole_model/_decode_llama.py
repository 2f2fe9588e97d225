"""The built-in Llama with a static KV cache, greedy generation, and the bytes a step reads.

Part of the decode stage (:mod:`kernelsmith.whole_model.decode`): :class:`KVCacheLlama` runs the
built-in Llama one token at a time over a preallocated cache (static shapes, so a step can be a
CUDA graph); :func:`greedy` generates with it and :func:`compare_tokens` compares two generations
with ties allowed within rounding; :func:`weight_bytes` and :func:`hf_static_cache_bytes` give the
bytes a step must read, for the bandwidth figures of the report.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

# =================================================================================================
# The built-in Llama with a static KV cache
# =================================================================================================


class KVCacheLlama(nn.Module):
    """:class:`kernelsmith.models.llama.Llama`'s modules with a static KV cache: incremental decoding.

    ``forward(ids, positions, valid)``: ``ids`` ``(B, S)`` the new tokens, ``positions`` ``(S,)``
    int64 their cache positions (the prompt's ``0..P-1``, then one position a step), ``valid``
    ``(B, cache_len)`` bool, the positions that hold a real token of each sequence (False on a
    left-padded prompt's padding). Returns the logits ``(B, S, vocab)``. Each layer writes the
    new keys and values into its cache at ``positions`` and attends over the whole cache,
    masked to the positions at or before the query's that are valid (a position always sees
    itself, so a padding row is finite, and never read). The projections and norms are the
    model's own modules, so the backend sees the graph a user's decoder gives it.
    """

    def __init__(self, model: nn.Module, batch: int, cache_len: int) -> None:
        super().__init__()
        config: Any = model.config
        self.model = model
        self.cache_len = cache_len
        self.head_dim = config.hidden // config.n_heads
        parameter = next(model.parameters())
        shape = (batch, config.n_kv_heads, cache_len, self.head_dim)
        self.caches: list[tuple[torch.Tensor, torch.Tensor]] = []
        for i in range(config.n_layers):
            k = torch.zeros(shape, dtype=parameter.dtype, device=parameter.device)
            v = torch.zeros_like(k)
            self.register_buffer(f"k_cache_{i}", k, persistent=False)
            self.register_buffer(f"v_cache_{i}", v, persistent=False)
            for t in (k, v):  # what Hugging Face's StaticCache does: reduce-overhead keeps them in place
                torch._dynamo.mark_static_address(t)
            self.caches.append((k, v))

    def forward(self, ids: torch.Tensor, positions: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        from kernelsmith.models.llama import apply_rotary_pos_emb, repeat_kv

        model: Any = self.model
        b, s = ids.shape
        x = model.embed_tokens(ids)
        cos, sin = model.rotary_emb(x, positions[None, :].expand(b, s))
        keys = torch.arange(self.cache_len, device=ids.device)
        visible = (keys[None, :] <= positions[:, None])[None, None] & valid[:, None, None, :]
        mask = visible | (keys[None, :] == positions[:, None])[None, None]  # (B, 1, S, cache_len)
        for layer, (k_cache, v_cache) in zip(model.layers, self.caches, strict=True):
            attn = layer.self_attn
            h = layer.input_layernorm(x)
            q = attn.q_proj(h).view(b, s, -1, self.head_dim).transpose(1, 2)
            k = attn.k_proj(h).view(b, s, -1, self.head_dim).transpose(1, 2)
            v = attn.v_proj(h).view(b, s, -1, self.head_dim).transpose(1, 2)
            q, k = apply_rotary_pos_emb(q, k, cos, sin)
            k_cache.index_copy_(2, positions, k)
            v_cache.index_copy_(2, positions, v)
            y = F.scaled_dot_product_attention(
                q, repeat_kv(k_cache, attn.n_rep), repeat_kv(v_cache, attn.n_rep), attn_mask=mask
            )
            x = x + attn.o_proj(y.transpose(1, 2).reshape(b, s, -1))
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        return model.lm_head(model.norm(x))  # type: ignore[no-any-return]

    def cache_bytes(self) -> int:
        return sum(k.nbytes + v.nbytes for k, v in self.caches)


# =================================================================================================
# Generation
# =================================================================================================


@dataclass
class Generation:
    """One greedy generation: ``tokens`` ``(B, N)``, each step's two best logits and their tokens
    ``(N, B, 2)`` (for the tie check; None on a timed run), and the decode steps' wall time."""

    tokens: torch.Tensor
    top_values: torch.Tensor | None
    top_tokens: torch.Tensor | None
    seconds: float
    steps: int


def check_cache_room(prompt_len: int, new_tokens: int, cache_len: int) -> None:
    """ValueError unless the prompt and the new tokens fit in the cache: the last token generated
    is never fed back, so ``prompt_len + new_tokens - 1`` positions are written."""
    if prompt_len < 1 or new_tokens < 1:
        raise ValueError(f"a prompt of at least one token and at least one new token (got {prompt_len}, {new_tokens})")
    needed = prompt_len + new_tokens - 1
    if needed > cache_len:
        raise ValueError(f"a prompt of {prompt_len} tokens and {new_tokens} new ones write {needed} cache positions; "
                         f"the cache holds {cache_len}: nothing was run")  # fmt: skip


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def greedy(
    prefill: Callable[..., torch.Tensor],
    step: Callable[..., torch.Tensor],
    prompt: torch.Tensor,
    valid: torch.Tensor,
    new_tokens: int,
    cache_len: int,
    keep_logits: bool,
) -> Generation:
    """Greedy generation with a :class:`KVCacheLlama`-shaped step: ``prefill(prompt, positions,
    valid)`` once, then ``step(ids, position, valid)`` for each new token but the last. The
    position lives on the device and is advanced there, and the next token is picked there, so
    the loop never waits for the GPU until it ends."""
    prompt_len = prompt.shape[1]
    check_cache_room(prompt_len, new_tokens, cache_len)
    device = prompt.device
    with torch.no_grad():
        logits = prefill(prompt, torch.arange(prompt_len, device=device), valid)[:, -1]
        position = torch.full((1,), prompt_len, dtype=torch.int64, device=device)
        tokens, tops = [], []
        _sync(device)
        start = time.perf_counter()
        for t in range(new_tokens):
            if keep_logits:
                tops.append(torch.topk(logits.float(), 2, dim=-1))
            token = logits.argmax(-1)
            tokens.append(token)
            if t == new_tokens - 1:
                break
            logits = step(token[:, None], position, valid)[:, -1]
            position += 1
        _sync(device)
        seconds = time.perf_counter() - start
    result = torch.stack(tokens, dim=1).cpu()
    if not keep_logits:
        return Generation(result, None, None, seconds, new_tokens - 1)
    values = torch.stack([v for v, _ in tops]).cpu()
    indices = torch.stack([i for _, i in tops]).cpu()
    return Generation(result, values, indices, seconds, new_tokens - 1)


def tie_tolerance(dtype: torch.dtype, logit: float) -> float:
    """How close eager's two best logits must be for a different greedy pick to count as a tie:
    a few units of the last place of a 16-bit logit after a stack of layers (2% of its size, at
    least 0.02), 1e-3 relative in float32."""
    scale = max(1.0, abs(logit))
    return (1e-3 if dtype == torch.float32 else 2e-2) * scale


@dataclass
class Comparison:
    """A variant's tokens against eager's: the same, or where they first part and whether that is a tie."""

    same: bool
    ok: bool
    first_difference: dict[str, Any] | None = None


def compare_tokens(eager: Generation, other: torch.Tensor, dtype: torch.dtype) -> Comparison:
    """``other`` ``(B, N)`` against eager's tokens: equal, or each sequence's first differing
    token a tie in eager's logits (its second-best pick, within :func:`tie_tolerance`)."""
    if torch.equal(eager.tokens, other):
        return Comparison(True, True)
    assert eager.top_values is not None and eager.top_tokens is not None
    differs = eager.tokens != other
    first: dict[str, Any] | None = None
    ok = True
    for b in range(eager.tokens.shape[0]):
        steps = differs[b].nonzero()
        if steps.numel() == 0:
            continue
        t = int(steps[0])
        best, second = (float(v) for v in eager.top_values[t, b])
        tie = int(other[b, t]) == int(eager.top_tokens[t, b, 1]) and best - second <= tie_tolerance(dtype, best)
        ok = ok and tie
        if first is None or not tie:
            first = {"sequence": b, "step": t, "eager": int(eager.tokens[b, t]), "got": int(other[b, t]),
                     "eager_gap": best - second, "tie": tie}  # fmt: skip
    return Comparison(False, ok, first)


# =================================================================================================
# Bytes a step reads
# =================================================================================================


def weight_bytes(model: nn.Module) -> int:
    """Bytes of the parameters a decode step reads: every parameter once (a tied LM head and
    embedding once), less the embedding table when it is not also the LM head (a step reads only
    its rows)."""
    seen: dict[int, int] = {}
    for p in model.parameters():
        seen.setdefault(p.data_ptr(), p.nbytes)
    total = sum(seen.values())
    embedding = _embedding_weight(model)
    head = getattr(getattr(model, "lm_head", None), "weight", None)
    if embedding is not None and (head is None or head.data_ptr() != embedding.data_ptr()):
        total -= embedding.nbytes
    return total


def _embedding_weight(model: nn.Module) -> torch.Tensor | None:
    getter = getattr(model, "get_input_embeddings", None)
    module = getter() if callable(getter) else getattr(model, "embed_tokens", None)
    weight = getattr(module, "weight", None)
    return weight if isinstance(weight, torch.Tensor) else None


def hf_static_cache_bytes(config: Any, batch: int, cache_len: int, dtype: torch.dtype) -> int:
    """Bytes of a Hugging Face static cache for ``config``: keys and values of every layer."""
    heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    itemsize = torch.empty((), dtype=dtype).element_size()
    return 2 * config.num_hidden_layers * batch * heads * cache_len * head_dim * itemsize


# =================================================================================================

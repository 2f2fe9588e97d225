"""Decode attention in captured graphs (:mod:`kernelsmith.frontends.patterns.decode_attention`):
Hugging Face's Llama decoding over a ``StaticCache`` under ``torch.compile`` served by the
``decode_attention`` kernel with eager's tokens and logits, plain modules over static and dynamic
caches, and every mask, layout and position the kernels must not serve left to the original code.

CPU, interpreter mode (conftest). As in test_backend, Inductor is replaced by a recorder that runs
the graph it is handed, and winners are stored directly (interpreter timings never win).
"""

from __future__ import annotations

import logging

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from kernelsmith.frontends import backend as ks_backend
from kernelsmith.frontends.patterns.decode_attention import lengths_from_positions
from kernelsmith.testing.decisions import store_kernel_decisions
from test_backend import kernel_ops, record_inductor, spy_runners

CACHE_LEN = 17


def attention_sites(fn, *inputs) -> list[ks_backend.Site]:
    torch._dynamo.reset()
    probe = ks_backend.KernelsmithBackend(discover=True, families=("decode_attention",))
    with torch.no_grad():
        torch.compile(fn, backend=probe)(*inputs)
    return probe.sites


def refusal(caplog, fn, *inputs) -> str:
    """Why ``fn``'s attention is not a site (the backend's debug line), asserting it is none."""
    caplog.clear()
    with caplog.at_level(logging.DEBUG, logger="kernelsmith.frontends.backend"):
        assert attention_sites(fn, *inputs) == []
    reasons = [r.getMessage() for r in caplog.records if "is not a decode attention site" in r.getMessage()]
    assert len(reasons) == 1, caplog.text
    return reasons[0]


# ---- Hugging Face Llama with a StaticCache -------------------------------------------------------


@pytest.fixture(scope="module")
def hf_llama() -> nn.Module:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64,
    )  # fmt: skip
    return transformers.LlamaForCausalLM(config).eval()


def prefilled(model: nn.Module, ids: torch.Tensor):
    """A StaticCache of CACHE_LEN positions holding the prompt ``ids``, and the prompt's logits."""
    from transformers import StaticCache

    cache = StaticCache(config=model.config, max_cache_len=CACHE_LEN)
    with torch.no_grad():
        logits = model(ids, past_key_values=cache, use_cache=True).logits
    return cache, logits


def decode_steps(step, model: nn.Module, ids: torch.Tensor, steps: int) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Greedy decoding of ``steps`` tokens after the prompt through ``step``: (tokens, logits)."""
    cache, logits = prefilled(model, ids)
    tokens, all_logits = [], []
    token = logits[:, -1:].argmax(-1)
    with torch.no_grad():
        for _ in range(steps):
            out = step(token, past_key_values=cache, use_cache=True).logits
            all_logits.append(out)
            token = out[:, -1:].argmax(-1)
            tokens.append(token)
    return torch.cat(tokens, dim=1), all_logits


def test_hf_static_cache_attention_is_a_site_per_layer(hf_llama):
    ids = torch.randint(0, 128, (2, 5), generator=torch.Generator().manual_seed(1))
    cache, logits = prefilled(hf_llama, ids)
    sites = attention_sites(
        lambda t: hf_llama(t, past_key_values=cache, use_cache=True).logits, logits[:, -1:].argmax(-1)
    )
    assert [s.op for s in sites] == ["decode_attention", "decode_attention"]
    spec = sites[0].spec
    assert [str(t) for t in spec.inputs] == ["2x4x1x16:float32", "2x2x17x16:float32", "2x2x17x16:float32", "2:int64"]
    assert spec.constants == {"cache": "static", "scale": 0.25}
    # The SDPA call and repeat_kv's views are replaced; the mask stays for the other layer and Inductor.
    assert [n.target for n in sites[0].region][-1] is torch._C._nn.scaled_dot_product_attention
    assert len(sites[0].region) == 7


@pytest.mark.parametrize("batch", [1, 3])
def test_hf_decoding_with_the_served_kernel_gives_eager_tokens_and_logits(hf_llama, tmp_path, monkeypatch, batch):
    ids = torch.randint(0, 128, (batch, 5), generator=torch.Generator().manual_seed(2))
    eager_tokens, eager_logits = decode_steps(hf_llama, hf_llama, ids, 4)
    db = str(tmp_path / "k.db")
    cache, logits = prefilled(hf_llama, ids)
    sites = attention_sites(
        lambda t: hf_llama(t, past_key_values=cache, use_cache=True).logits, logits[:, -1:].argmax(-1)
    )
    store_kernel_decisions(db, [s.spec for s in sites])
    seen = record_inductor(monkeypatch)
    calls = spy_runners(monkeypatch)
    torch._dynamo.reset()
    backend = ks_backend.KernelsmithBackend(db=db, families=("decode_attention",))
    tokens, served_logits = decode_steps(torch.compile(hf_llama, backend=backend), hf_llama, ids, 4)
    assert {s.status for s in backend.sites} == {"replaced"}, [(s.status, s.reason) for s in backend.sites]
    assert kernel_ops(seen[0]).count("decode_attention") == 2  # one per layer
    assert not any(n.target is torch._C._nn.scaled_dot_product_attention for n in seen[0].graph.nodes)
    assert len(calls) >= 2 * 4  # every layer of every step ran the kernel (in the interpreter)
    assert torch.equal(tokens, eager_tokens)
    for ours, theirs in zip(served_logits, eager_logits, strict=True):
        torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-4)


def test_hf_cache_position_past_the_end_fails_as_eager_does(hf_llama, tmp_path, monkeypatch):
    """The cache write before the attention refuses a position past the cache, served or not: the
    kernel never attends a cache that does not hold the token."""
    ids = torch.randint(0, 128, (1, 5), generator=torch.Generator().manual_seed(3))
    cache, logits = prefilled(hf_llama, ids)
    token = logits[:, -1:].argmax(-1)
    sites = attention_sites(lambda t: hf_llama(t, past_key_values=cache, use_cache=True).logits, token)
    db = str(tmp_path / "k.db")
    store_kernel_decisions(db, [s.spec for s in sites])
    record_inductor(monkeypatch)
    torch._dynamo.reset()
    backend = ks_backend.KernelsmithBackend(db=db, families=("decode_attention",))
    compiled = torch.compile(hf_llama, backend=backend)
    with torch.no_grad():
        compiled(token, past_key_values=cache, use_cache=True)  # position 5: fits
        assert {s.status for s in backend.sites} == {"replaced"}
        for layer in cache.layers:
            layer.cumulative_length.fill_(CACHE_LEN)  # the next token would sit past the cache's end
        with pytest.raises((IndexError, RuntimeError)):
            hf_llama(token, past_key_values=cache, use_cache=True)
        with pytest.raises((IndexError, RuntimeError)):
            compiled(token, past_key_values=cache, use_cache=True)


def test_hf_generate_s_prepared_mask_is_left_to_the_original_code(hf_llama, caplog):
    """generate() builds its 4-D mask (padding included) outside the compiled step and passes it in:
    its contents are known only at run time, so the attention is not a decode_attention site."""
    from kernelsmith.whole_model import decode

    probe = ks_backend.KernelsmithBackend(discover=True, families=("decode_attention",))
    ids, mask = decode.prompt_batch(128, 2, 5, torch.device("cpu"), ragged=True)
    torch._dynamo.reset()
    with caplog.at_level(logging.DEBUG, logger="kernelsmith.frontends.backend"):
        decode.hf_generate(hf_llama, ids, mask, 2, "kernelsmith", probe)
    assert probe.sites == []
    assert "attention_mask" in caplog.text and "besides the query positions" in caplog.text


def test_a_mask_passed_in_is_left_to_the_original_code(caplog):
    mask = torch.ones(2, 1, 1, CACHE_LEN, dtype=torch.bool)
    mask[1, :, :, :2] = False  # left padding

    def step(q, k, v, attention_mask):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attention_mask, scale=0.25)

    inputs = (torch.randn(2, 4, 1, 16), torch.randn(2, 4, CACHE_LEN, 16), torch.randn(2, 4, CACHE_LEN, 16), mask)
    assert "the mask depends on l_attention_mask_ besides the query positions" in refusal(caplog, step, *inputs)


# ---- plain modules --------------------------------------------------------------------------------


class StaticDecoder(nn.Module):
    """One attention step over a static cache the way Hugging Face writes it: the new keys and values
    written at their positions, repeat_kv, and the causal mask built from the positions."""

    def __init__(self, batch: int, heads: int, kv_heads: int, head_dim: int, cache_len: int, q_len: int = 1,
                 mask: str = "causal") -> None:  # fmt: skip
        super().__init__()
        self.heads, self.kv_heads, self.q_len, self.mask = heads, kv_heads, q_len, mask
        self.register_buffer("k_cache", torch.zeros(batch, kv_heads, cache_len, head_dim))
        self.register_buffer("v_cache", torch.zeros(batch, kv_heads, cache_len, head_dim))

    def forward(self, q, k, v, offset, valid=None):
        positions = torch.arange(self.q_len) + offset
        self.k_cache.index_copy_(2, positions, k)
        self.v_cache.index_copy_(2, positions, v)
        keys = torch.arange(self.k_cache.shape[2])[None, None, None, :]
        query = positions[None, None, :, None]
        if self.mask == "causal":
            mask = keys <= query
        elif self.mask == "hides-own-position":
            mask = keys < query
        elif self.mask == "padding":
            mask = (keys <= query) & valid[:, None, None, :]
        else:  # "additive"
            mask = torch.where(keys <= query, 0.0, float("-inf"))
        group = self.heads // self.kv_heads
        b, hk, n, d = self.k_cache.shape
        key = self.k_cache[:, :, None].expand(b, hk, group, n, d).reshape(b, hk * group, n, d)
        value = self.v_cache[:, :, None].expand(b, hk, group, n, d).reshape(b, hk * group, n, d)
        return F.scaled_dot_product_attention(q, key, value, attn_mask=mask)


def decoder_inputs(batch, heads, kv_heads, head_dim, q_len, offset):
    g = torch.Generator().manual_seed(4)
    new_k, new_v = (torch.randn(batch, kv_heads, q_len, head_dim, generator=g) for _ in range(2))
    return torch.randn(batch, heads, q_len, head_dim, generator=g), new_k, new_v, torch.tensor(offset)


@pytest.mark.parametrize(
    ("batch", "heads", "kv_heads", "head_dim", "cache_len", "q_len"),
    [(1, 8, 2, 64, 17, 1), (3, 4, 1, 80, 100, 1), (3, 8, 2, 16, 17, 3), (1, 2, 2, 16, 1, 1)],
    ids=["gqa-4:1", "mqa-hd80", "three-new-tokens", "cache-of-one"],
)
def test_a_plain_static_cache_decoder_is_a_site(batch, heads, kv_heads, head_dim, cache_len, q_len):
    decoder = StaticDecoder(batch, heads, kv_heads, head_dim, cache_len, q_len)
    offset = cache_len - q_len
    sites = attention_sites(decoder, *decoder_inputs(batch, heads, kv_heads, head_dim, q_len, offset))
    assert [s.op for s in sites] == ["decode_attention"], sites
    q, k, _, lengths = sites[0].spec.inputs
    assert (q.shape, lengths.shape) == ((batch, heads, q_len, head_dim), (batch,))
    assert k.shape == (batch, kv_heads, cache_len, head_dim)


def test_a_served_plain_decoder_matches_eager_at_every_offset(tmp_path, monkeypatch):
    batch, heads, kv_heads, head_dim, cache_len = 3, 8, 2, 16, 17
    eager = StaticDecoder(batch, heads, kv_heads, head_dim, cache_len)
    served = StaticDecoder(batch, heads, kv_heads, head_dim, cache_len)
    sites = attention_sites(served, *decoder_inputs(batch, heads, kv_heads, head_dim, 1, 0))
    db = str(tmp_path / "k.db")
    store_kernel_decisions(db, [s.spec for s in sites])
    seen = record_inductor(monkeypatch)
    torch._dynamo.reset()
    backend = ks_backend.KernelsmithBackend(db=db, families=("decode_attention",))
    compiled = torch.compile(served, backend=backend)
    with torch.no_grad():
        for offset in range(cache_len):  # a cache filling up one position a step, to its last position
            inputs = decoder_inputs(batch, heads, kv_heads, head_dim, 1, offset)
            torch.testing.assert_close(compiled(*inputs), eager(*inputs), rtol=1e-5, atol=1e-5)
    assert kernel_ops(seen[0]) == ["decode_attention"]


def test_a_dynamic_cache_without_a_mask_is_a_site():
    def step(q, k_cache, v_cache):
        return F.scaled_dot_product_attention(q, k_cache, v_cache, enable_gqa=True)

    sites = attention_sites(step, torch.randn(1, 8, 1, 16), torch.randn(1, 2, 9, 16), torch.randn(1, 2, 9, 16))
    assert [(s.op, s.spec.const("cache"), len(s.spec.inputs)) for s in sites] == [("decode_attention", "dynamic", 3)]


@pytest.mark.parametrize(
    ("mask", "reason"),
    [("hides-own-position", "does not compute decode_attention"), ("padding", "the mask depends on l_valid_"),
     ("additive", "the mask is not boolean")],
)  # fmt: skip
def test_masks_that_are_not_a_causal_prefix_of_positions_stay_the_original_code(caplog, mask, reason):
    decoder = StaticDecoder(2, 4, 2, 16, CACHE_LEN, mask=mask)
    inputs = decoder_inputs(2, 4, 2, 16, 1, 5)
    valid = torch.ones(2, CACHE_LEN, dtype=torch.bool)
    valid[1, :3] = False
    assert reason in refusal(caplog, decoder, *inputs, valid)


def test_per_sequence_lengths_and_other_layouts_stay_the_original_code(caplog):

    def ragged(q, k, v, lengths):  # sequences of different lengths: the mask reads a (B,) tensor
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=torch.arange(CACHE_LEN)[None, None, None, :] < lengths[:, None, None, None]
        )

    def causal_flag(q, k, v):  # torch's is_causal aligns top-left: the query would see key 0 only
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    def three_tokens_unmasked(q, k, v):  # every new token sees every position: not causal decoding
        return F.scaled_dot_product_attention(q, k, v)

    def given_positions(q, k, v, positions):  # positions an input: nothing says they are consecutive
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=torch.arange(CACHE_LEN)[None, None, None, :] <= (positions + 0)[None, None, :, None]
        )

    def odd_head_dim(q, k, v):  # a head dim the kernels do not take (not a multiple of 16)
        return F.scaled_dot_product_attention(q, k, v)

    q, kv = torch.randn(2, 4, 1, 16), torch.randn(2, 4, CACHE_LEN, 16)
    assert "l_lengths_ besides the query positions" in refusal(caplog, ragged, q, kv, kv, torch.tensor([3, 9]))
    assert "is_causal" in refusal(caplog, causal_flag, q, kv, kv)
    q3 = torch.randn(2, 4, 3, 16)
    assert "no mask over 3 new tokens" in refusal(caplog, three_tokens_unmasked, q3, kv, kv)
    assert "not arange(3) + an offset" in refusal(caplog, given_positions, q3, kv, kv, torch.tensor([4, 6, 5]))
    q24, kv24 = torch.randn(1, 2, 1, 24), torch.randn(1, 2, 5, 24)
    assert "head dimension must be a multiple of 16" in refusal(caplog, odd_head_dim, q24, kv24, kv24)


def test_lengths_come_from_the_last_position_on_the_device():
    lengths = lengths_from_positions(torch.tensor([6, 7, 8]), 3)
    assert lengths.dtype == torch.int64 and lengths.is_contiguous() and lengths.tolist() == [9, 9, 9]
    assert lengths_from_positions(torch.tensor([0]), 1).tolist() == [1]

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
from kernelsmith.frontends.patterns import decode_attention as pattern
from kernelsmith.frontends.patterns.decode_attention import lengths_from_positions
from kernelsmith.frontends.patterns.decode_cache_writes import first_position
from kernelsmith.testing.decisions import store_kernel_decisions
from kernelsmith.testing.models import tiny_llama
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
    return tiny_llama()


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


def test_hf_static_cache_attention_is_a_site_per_layer(hf_llama, monkeypatch):
    """The read-only site of each layer (folding off; the folded first layer is
    test_decode_hf_static_cache_writes')."""
    monkeypatch.setattr(pattern, "FOLD_CACHE_WRITES", False)
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


@pytest.mark.parametrize("batch", [1, pytest.param(3, marks=pytest.mark.slow)])  # ~25 s each
def test_hf_decoding_with_the_served_kernel_gives_eager_tokens_and_logits(hf_llama, tmp_path, monkeypatch, batch):
    """The read-only sites served (folding off: every layer's writes stay in the graph; the folded
    first layer is served in test_decode_hf_static_cache_writes)."""
    monkeypatch.setattr(pattern, "FOLD_CACHE_WRITES", False)
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


@pytest.mark.slow  # ~20-25 s: a compile and two interpreted steps
def test_hf_cache_position_past_the_end_fails_as_eager_does(hf_llama, tmp_path, monkeypatch):
    """The cache write before the attention refuses a position past the cache, served or not: the
    kernel never attends a cache that does not hold the token. (With the first layer's writes
    folded, as by default, it is the second layer's index_copy_ that fails; the folded kernel
    writes nothing there and gives NaN, the family's guard.)"""
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


def test_hf_generate_with_padding_serves_its_prepared_mask_with_eager_tokens(hf_llama, tmp_path, monkeypatch):
    """generate() builds its 4-D boolean mask (the padding included) outside the compiled step and
    passes it in: the attention is a site of the masked layout, which reads that mask, and a
    left-padded batch generates eager's tokens."""
    from kernelsmith.whole_model import decode

    ids, mask = decode.prompt_batch(128, 2, 5, torch.device("cpu"), ragged=True)
    assert not bool(mask.all())  # a padded batch
    eager, _ = decode.hf_generate(hf_llama, ids, mask, 3, "eager")
    db = str(tmp_path / "k.db")
    probe = ks_backend.KernelsmithBackend(discover=True, families=("decode_attention",))
    torch._dynamo.reset()
    decode.hf_generate(hf_llama, ids, mask, 2, "kernelsmith", probe)
    assert {(s.op, s.spec.const("cache")) for s in probe.sites} == {("decode_attention", "masked")}
    store_kernel_decisions(db, [s.spec for s in probe.sites])
    seen = record_inductor(monkeypatch)
    torch._dynamo.reset()
    backend = ks_backend.KernelsmithBackend(db=db, families=("decode_attention",))
    served, _ = decode.hf_generate(hf_llama, ids, mask, 3, "kernelsmith", backend)
    assert {s.status for s in backend.sites} == {"replaced"}, [(s.status, s.reason) for s in backend.sites]
    assert any(kernel_ops(gm).count("decode_attention") == 2 for gm in seen)
    assert torch.equal(served.tokens, eager.tokens)


def test_a_mask_passed_in_is_read_by_the_masked_layout():
    mask = torch.ones(2, 1, 1, CACHE_LEN, dtype=torch.bool)
    mask[1, :, :, :2] = False  # left padding

    def step(q, k, v, attention_mask):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attention_mask, scale=0.25)

    inputs = (torch.randn(2, 4, 1, 16), torch.randn(2, 4, CACHE_LEN, 16), torch.randn(2, 4, CACHE_LEN, 16), mask)
    sites = attention_sites(step, *inputs)
    assert [(s.spec.const("cache"), str(s.spec.inputs[3])) for s in sites] == [("masked", "2x1x1x17:bool")]


# ---- plain modules --------------------------------------------------------------------------------


class StaticDecoder(nn.Module):
    """One attention step over a static cache the way Hugging Face writes it: the new keys and values
    written at their positions, repeat_kv, and the causal mask built from the positions."""

    def __init__(self, batch: int, heads: int, kv_heads: int, head_dim: int, cache_len: int, q_len: int = 1,
                 mask: str = "causal", write: str = "at-positions") -> None:  # fmt: skip
        super().__init__()
        self.heads, self.kv_heads, self.q_len, self.mask, self.write = heads, kv_heads, q_len, mask, write
        self.register_buffer("k_cache", torch.zeros(batch, kv_heads, cache_len, head_dim))
        self.register_buffer("v_cache", torch.zeros(batch, kv_heads, cache_len, head_dim))
        # "own-cursor": the cache counts its own positions, as transformers 5's StaticCache keeps a
        # cumulative_length per layer (equal to the offset only while the caller keeps them so)
        self.register_buffer("cursor", torch.zeros((), dtype=torch.int64))

    def write_index(self, positions: torch.Tensor, offset: torch.Tensor) -> torch.Tensor:
        """Where the new rows are written: at the mask's positions, or at a tensor computed apart
        ("same-expression": arange + offset again, as StaticCache's first layer does; "commuted":
        offset + arange; "own-cursor":
        from the cursor; "moved-between": from the offset after an in-place change of it)."""
        arange = torch.arange(self.q_len, device=positions.device)
        if self.write == "same-expression":
            return arange + offset
        if self.write == "commuted":
            return offset + arange
        if self.write == "own-cursor":
            index = arange + self.cursor
            self.cursor.add_(self.q_len)
            return index
        if self.write == "moved-between":
            offset.add_(1)
            return arange + offset
        return positions

    def forward(self, q, k, v, offset, valid=None):
        device = self.k_cache.device
        positions = torch.arange(self.q_len, device=device) + offset
        index = self.write_index(positions, offset)
        self.k_cache.index_copy_(-2 if self.write == "dim-minus-2" else 2, index, k)
        self.v_cache.index_copy_(2, index, v)
        peek = self.k_cache.sum() if self.write == "read-between" else None  # a reader of the new rows
        keys = torch.arange(self.k_cache.shape[2], device=device)[None, None, None, :]
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
        out = F.scaled_dot_product_attention(q, key, value, attn_mask=mask)
        return out if peek is None else out + peek


def served_ops(gm: torch.fx.GraphModule) -> list[tuple[str, str]]:
    """(kernelsmith op, family) of each kernelsmith call of a rewritten graph: "kernel" for a
    read-only site, "kernel_mutating" for one that writes its inputs (folded cache writes)."""
    ops = {torch.ops.kernelsmith.kernel.default: "kernel",
           torch.ops.kernelsmith.kernel_mutating.default: "kernel_mutating"}  # fmt: skip
    return [(ops[n.target], n.args[0]) for n in gm.graph.nodes if n.target in ops]


def decoder_inputs(batch, heads, kv_heads, head_dim, q_len, offset):
    g = torch.Generator().manual_seed(4)
    new_k, new_v = (torch.randn(batch, kv_heads, q_len, head_dim, generator=g) for _ in range(2))
    return torch.randn(batch, heads, q_len, head_dim, generator=g), new_k, new_v, torch.tensor(offset)


@pytest.mark.parametrize(
    ("batch", "heads", "kv_heads", "head_dim", "cache_len", "q_len"),
    [(1, 8, 2, 64, 17, 1), (3, 4, 1, 80, 100, 1), (3, 8, 2, 16, 17, 3), (1, 2, 2, 16, 1, 1)],
    ids=["gqa-4:1", "mqa-hd80", "three-new-tokens", "cache-of-one"],
)
def test_a_plain_static_cache_decoder_is_a_site(monkeypatch, batch, heads, kv_heads, head_dim, cache_len, q_len):
    """The read-only site (folding off): its inputs are q, the caches and the lengths. The folded
    site's are test_folded_cache_writes_become_write_kv_inputs'."""
    monkeypatch.setattr(pattern, "FOLD_CACHE_WRITES", False)
    decoder = StaticDecoder(batch, heads, kv_heads, head_dim, cache_len, q_len)
    offset = cache_len - q_len
    sites = attention_sites(decoder, *decoder_inputs(batch, heads, kv_heads, head_dim, q_len, offset))
    assert [s.op for s in sites] == ["decode_attention"], sites
    q, k, _, lengths = sites[0].spec.inputs
    assert (q.shape, lengths.shape) == ((batch, heads, q_len, head_dim), (batch,))
    assert k.shape == (batch, kv_heads, cache_len, head_dim)


@pytest.mark.parametrize(
    ("mask", "cache"), [("causal", "static"), ("padding", "masked"), ("hides-own-position", "masked")]
)
def test_a_served_plain_decoder_matches_eager_at_every_offset(tmp_path, monkeypatch, mask, cache):
    """The positions' causal prefix is a static cache's lengths, its writes folded in by default
    (served through kernelsmith::kernel_mutating); a padding mask, or one that is not that prefix
    (a position hidden from itself), is read as it is (broadcast from (1, 1, 1, L)), the writes
    left in the graph."""
    batch, heads, kv_heads, head_dim, cache_len = 3, 8, 2, 16, 17
    eager = StaticDecoder(batch, heads, kv_heads, head_dim, cache_len, mask=mask)
    served = StaticDecoder(batch, heads, kv_heads, head_dim, cache_len, mask=mask)
    valid = torch.ones(batch, cache_len, dtype=torch.bool)
    valid[1, :4] = False  # left padding
    valid[2, 7] = False  # a hole
    sites = attention_sites(served, *decoder_inputs(batch, heads, kv_heads, head_dim, 1, 0), valid)
    assert [s.spec.const("cache") for s in sites] == [cache]
    assert [s.spec.constants.get("write_kv", False) for s in sites] == [cache == "static"]
    with torch.no_grad():
        eager(*decoder_inputs(batch, heads, kv_heads, head_dim, 1, 0), valid)  # the row discovery wrote
    db = str(tmp_path / "k.db")
    store_kernel_decisions(db, [s.spec for s in sites])
    seen = record_inductor(monkeypatch)
    torch._dynamo.reset()
    backend = ks_backend.KernelsmithBackend(db=db, families=("decode_attention",))
    compiled = torch.compile(served, backend=backend)
    with torch.no_grad():
        for offset in range(5, cache_len):  # a cache filling up one position a step, to its last position
            inputs = decoder_inputs(batch, heads, kv_heads, head_dim, 1, offset)
            torch.testing.assert_close(compiled(*inputs, valid), eager(*inputs, valid), rtol=1e-5, atol=1e-5)
            assert torch.equal(served.k_cache, eager.k_cache) and torch.equal(served.v_cache, eager.v_cache)
    assert served_ops(seen[0]) == [("kernel_mutating" if cache == "static" else "kernel", "decode_attention")]


def test_a_dynamic_cache_without_a_mask_is_a_site():
    def step(q, k_cache, v_cache):
        return F.scaled_dot_product_attention(q, k_cache, v_cache, enable_gqa=True)

    sites = attention_sites(step, torch.randn(1, 8, 1, 16), torch.randn(1, 2, 9, 16), torch.randn(1, 2, 9, 16))
    assert [(s.op, s.spec.const("cache"), len(s.spec.inputs)) for s in sites] == [("decode_attention", "dynamic", 3)]


def test_additive_masks_stay_the_original_code(caplog):
    decoder = StaticDecoder(2, 4, 2, 16, CACHE_LEN, mask="additive")
    assert "the mask is not boolean" in refusal(caplog, decoder, *decoder_inputs(2, 4, 2, 16, 1, 5))


def test_per_sequence_lengths_are_a_mask_and_other_layouts_stay_the_original_code(caplog):
    def ragged(q, k, v, lengths):  # sequences of different lengths: the mask reads a (B,) tensor
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=torch.arange(CACHE_LEN)[None, None, None, :] < lengths[:, None, None, None]
        )

    def given_positions(q, k, v, positions):  # positions an input: nothing says they are consecutive
        keys = torch.arange(CACHE_LEN)[None, None, None, :]
        return F.scaled_dot_product_attention(q, k, v, attn_mask=keys <= (positions + 0)[None, None, :, None])

    def causal_flag(q, k, v):  # torch's is_causal aligns top-left: the query would see key 0 only
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    def unmasked(q, k, v):  # every new token sees every position: not causal decoding
        return F.scaled_dot_product_attention(q, k, v)

    def per_head(q, k, v, mask):  # a mask per head: a layout the kernels do not read
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)

    q, kv = torch.randn(2, 4, 1, 16), torch.randn(2, 4, CACHE_LEN, 16)
    q3 = torch.randn(2, 4, 3, 16)
    assert [s.spec.const("cache") for s in attention_sites(ragged, q, kv, kv, torch.tensor([3, 9]))] == ["masked"]
    given = attention_sites(given_positions, q3, kv, kv, torch.tensor([4, 6, 5]))
    assert [s.spec.const("cache") for s in given] == ["masked"]  # read as a mask, not as lengths
    assert "is_causal" in refusal(caplog, causal_flag, q, kv, kv)
    assert "no mask over 3 new tokens" in refusal(caplog, unmasked, q3, kv, kv)
    heads_mask = torch.ones(2, 4, 1, CACHE_LEN, dtype=torch.bool)
    assert "is not (B | 1, 1, Sq | 1, L)" in refusal(caplog, per_head, q, kv, kv, heads_mask)
    q24, kv24 = torch.randn(1, 2, 1, 24), torch.randn(1, 2, 5, 24)
    assert "head dimension must be a multiple of 16" in refusal(caplog, unmasked, q24, kv24, kv24)


def test_lengths_come_from_the_last_position_on_the_device():
    lengths = lengths_from_positions(torch.tensor([6, 7, 8]), 3)
    assert lengths.dtype == torch.int64 and lengths.is_contiguous() and lengths.tolist() == [9, 9, 9]
    assert lengths_from_positions(torch.tensor([0]), 1).tolist() == [1]


# ---- folding the cache writes into the site (write_kv; on by default) ------------------------------


def _target(node) -> str:
    return node.target if isinstance(node.target, str) else node.target.__name__


@pytest.mark.parametrize(
    ("batch", "heads", "kv_heads", "cache_len", "q_len", "write"),
    [(1, 8, 2, 17, 1, "at-positions"), (3, 4, 1, 19, 3, "at-positions"), (3, 8, 2, 17, 1, "dim-minus-2"),
     (1, 2, 2, 1, 1, "at-positions"), (2, 4, 2, 17, 3, "same-expression"), (1, 4, 2, 17, 1, "commuted")],
    ids=["gqa-one-token", "mqa-three-tokens", "dim-minus-2", "cache-of-one", "same-expression", "commuted"],
)
def test_folded_cache_writes_become_write_kv_inputs(monkeypatch, batch, heads, kv_heads, cache_len, q_len, write):
    """With folding on, the two index_copy_ writes are in the site's region (the rewrite erases
    them), and its inputs are q, the caches, the new rows and the first position; the site's check
    ran the writes too (the caches they leave vs the family's update)."""
    monkeypatch.setattr(pattern, "FOLD_CACHE_WRITES", True)
    head_dim = 64
    decoder = StaticDecoder(batch, heads, kv_heads, head_dim, cache_len, q_len, write=write)
    inputs = decoder_inputs(batch, heads, kv_heads, head_dim, q_len, cache_len - q_len)
    sites = attention_sites(decoder, *inputs)
    assert [s.op for s in sites] == ["decode_attention"], sites
    spec = sites[0].spec
    assert spec.constants["write_kv"] is True and sites[0].constants["write_kv"] is True
    assert [str(t) for t in spec.inputs[3:]] == [f"{batch}x{kv_heads}x{q_len}x{head_dim}:float32"] * 2 + ["1:int64"]
    region = [_target(n) for n in sites[0].region]
    assert region.count("index_copy_") == 2 and region[-1] == "scaled_dot_product_attention"
    assert sites[0].inputs[5].derive is first_position


def test_without_folding_the_writes_stay_the_original_code(monkeypatch):
    monkeypatch.setattr(pattern, "FOLD_CACHE_WRITES", False)
    decoder = StaticDecoder(3, 4, 1, 16, 19, 3)
    (site,) = attention_sites(decoder, *decoder_inputs(3, 4, 1, 16, 3, 16))
    assert "write_kv" not in site.spec.constants and len(site.spec.inputs) == 4
    assert "index_copy_" not in [_target(n) for n in site.region]


@pytest.mark.parametrize(
    ("write", "reason"),
    [
        ("own-cursor", "nothing in the graph proves them equal"),
        ("moved-between", "writes in place between the reads"),
        ("read-between", "between the cache write and the attention"),
    ],
)
def test_writes_that_cannot_fold_leave_the_read_only_site(monkeypatch, caplog, write, reason):
    """A write at an index the graph does not prove equal to the mask's positions (computed from
    another tensor, equal or not at run time: nothing proves it without the host; or from the
    same one changed in place in between), or a reader of the cache between the write and the
    attention: the writes stay, and the attention is the read-only static site."""
    monkeypatch.setattr(pattern, "FOLD_CACHE_WRITES", True)
    decoder = StaticDecoder(2, 4, 2, 16, CACHE_LEN, write=write)
    with caplog.at_level(logging.DEBUG, logger="kernelsmith.frontends.backend"):
        sites = attention_sites(decoder, *decoder_inputs(2, 4, 2, 16, 1, 5))
    assert [(s.spec.const("cache"), len(s.spec.inputs)) for s in sites] == [("static", 4)]
    kept = [r.getMessage() for r in caplog.records if "keeps its cache writes" in r.getMessage()]
    assert len(kept) == 1 and reason in kept[0], caplog.text


def test_the_fold_check_runs_the_writes_against_the_family_update(monkeypatch, caplog):
    """Planted: a family whose update is a different write (one position later). The region's
    index_copy_ writes leave other caches, so the check refuses the fold (the read-only site stays):
    the written cache state is part of the check, not only the output."""
    from kernelsmith.ops.decode_attention import DecodeAttention

    def shifted(self, spec, inputs):
        k, v = inputs[1].clone(), inputs[2].clone()
        index = (inputs[5].to(torch.int64) + 1).clamp(max=k.shape[2] - 1)
        return [k.index_copy_(2, index, inputs[3]), v.index_copy_(2, index, inputs[4])]

    monkeypatch.setattr(pattern, "FOLD_CACHE_WRITES", True)
    monkeypatch.setattr(DecodeAttention, "reference_written", shifted)
    decoder = StaticDecoder(2, 4, 2, 16, CACHE_LEN)
    with caplog.at_level(logging.DEBUG, logger="kernelsmith.frontends.backend"):
        sites = attention_sites(decoder, *decoder_inputs(2, 4, 2, 16, 1, 5))
    assert [len(s.spec.inputs) for s in sites] == [4]
    kept = [r.getMessage() for r in caplog.records if "keeps its cache writes" in r.getMessage()]
    assert len(kept) == 1 and "the key cache it leaves is not the family's" in kept[0], caplog.text


def test_the_first_position_is_a_device_op():
    position = first_position(torch.tensor([6, 7, 8], dtype=torch.int32))
    assert position.dtype == torch.int64 and position.tolist() == [6]

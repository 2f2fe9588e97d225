"""Decode attention spelled out as matmuls and a softmax (:mod:`kernelsmith.frontends.patterns.
decode_attention_eager`): a hand-written eager attention module over a static cache, served by the
``decode_attention`` kernel with eager's output and float64's, with the additive mask built from the
positions (the static layout) or passed in (the masked layout, read converted); each refusal; and
Hugging Face's Llama with ``attn_implementation="eager"``.

CPU, interpreter mode (conftest); Inductor replaced by a recorder and winners stored directly, as in
test_decode_attention_sites (whose builders these tests import).
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from kernelsmith.frontends import backend as ks_backend
from kernelsmith.frontends.patterns.decode_attention_eager import additive_mask, visible_where_additive
from kernelsmith.testing.decisions import store_kernel_decisions
from kernelsmith.testing.models import tiny_llama
from test_backend import kernel_ops, record_inductor, spy_runners
from test_decode_attention_sites import attention_sites, decode_steps, prefilled, refusal

CACHE_LEN, HEAD_DIM = 37, 16


def repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    """transformers' repeat_kv: (B, Hk, L, D) -> (B, Hk * n_rep, L, D)."""
    batch, kv_heads, length, head_dim = x.shape
    if n_rep == 1:
        return x
    return x[:, :, None, :, :].expand(batch, kv_heads, n_rep, length, head_dim).reshape(
        batch, kv_heads * n_rep, length, head_dim
    )


class EagerDecoder(nn.Module):
    """One decoding step over a static cache, its attention written as transformers'
    eager_attention_forward; the keyword arguments plant what a site must refuse."""

    def __init__(self, batch: int, heads: int, kv_heads: int, mask: str = "positions", dropout: float = 0.0,
                 scaling: str = "constant", softmax_dim: int = -1, mask_after_softmax: bool = False,
                 return_weights: bool = False) -> None:  # fmt: skip
        super().__init__()
        self.heads, self.kv_heads, self.mask, self.dropout = heads, kv_heads, mask, dropout
        self.softmax_dim, self.mask_after_softmax, self.return_weights = softmax_dim, mask_after_softmax, return_weights
        self.register_buffer("k_cache", torch.zeros(batch, kv_heads, CACHE_LEN, HEAD_DIM))
        self.register_buffer("v_cache", torch.zeros(batch, kv_heads, CACHE_LEN, HEAD_DIM))
        # a tensor scaling (a learned temperature, say) is not a constant the site can bake in
        self.scaling: float | nn.Parameter = HEAD_DIM**-0.5
        if scaling == "tensor":
            self.scaling = nn.Parameter(torch.tensor(HEAD_DIM**-0.5))

    def forward(self, q, k, v, offset, attention_mask=None):
        positions = torch.arange(q.shape[2], device=q.device) + offset
        self.k_cache.index_copy_(2, positions, k)
        self.v_cache.index_copy_(2, positions, v)
        key_states = repeat_kv(self.k_cache, self.heads // self.kv_heads)
        value_states = repeat_kv(self.v_cache, self.heads // self.kv_heads)
        if self.mask == "positions":  # transformers' eager_mask: where(causal, 0, finfo.min)
            keys = torch.arange(CACHE_LEN, device=q.device)[None, None, None, :]
            causal = keys <= positions[None, None, :, None]
            attention_mask = torch.where(causal, torch.zeros((), dtype=q.dtype), torch.finfo(q.dtype).min)
        attn_weights = torch.matmul(q, key_states.transpose(2, 3)) * self.scaling
        if attention_mask is not None and not self.mask_after_softmax:
            attn_weights = attn_weights + attention_mask
        attn_weights = F.softmax(attn_weights, dim=self.softmax_dim, dtype=torch.float32).to(q.dtype)
        if attention_mask is not None and self.mask_after_softmax:
            attn_weights = attn_weights + attention_mask
        attn_weights = F.dropout(attn_weights, p=self.dropout, training=self.training)
        attn_output = torch.matmul(attn_weights, value_states)
        attn_output = attn_output.transpose(1, 2).contiguous()
        return (attn_output, attn_weights) if self.return_weights else attn_output


def step_inputs(batch: int, heads: int, kv_heads: int, offset: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, heads, 1, HEAD_DIM, generator=g)
    new_k, new_v = (torch.randn(batch, kv_heads, 1, HEAD_DIM, generator=g) for _ in range(2))
    return q, new_k, new_v, torch.tensor(offset)


def padding_mask(batch: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """An additive (B, 1, 1, L) mask as transformers writes it: the last sequence left-padded by 3."""
    visible = torch.ones(batch, 1, 1, CACHE_LEN, dtype=torch.bool)
    visible[-1, :, :, :3] = False
    return torch.where(visible, 0.0, torch.finfo(dtype).min).to(dtype)


@pytest.mark.parametrize(
    ("batch", "heads", "kv_heads", "mask", "cache", "last"),
    [(1, 4, 2, "positions", "static", "1:int64"), (2, 4, 1, "positions", "static", "2:int64"),
     (2, 4, 2, "input", "masked", "2x1x1x37:bool"), (1, 4, 1, "none", "dynamic", None)],
    ids=["static-gqa", "static-mqa", "masked-input", "no-mask"],
)  # fmt: skip
def test_the_eager_spelling_is_a_site(batch, heads, kv_heads, mask, cache, last):
    decoder = EagerDecoder(batch, heads, kv_heads, mask=mask).eval()
    inputs = step_inputs(batch, heads, kv_heads, 5)
    (site,) = attention_sites(decoder, *inputs, padding_mask(batch) if mask == "input" else None)
    assert site.op == "decode_attention" and site.spec.const("cache") == cache
    want = [f"{batch}x{heads}x1x16:float32", *[f"{batch}x{kv_heads}x37x16:float32"] * 2]
    assert [str(t) for t in site.spec.inputs] == want + ([last] if last else [])
    assert site.spec.const("scale") == 0.25
    # the region: repeat_kv's views (none at G = 1), the transpose, two matmuls, scaling, the mask's
    # add, softmax, cast and dropout; the attention's output (the second matmul) last
    names = [n.target if isinstance(n.target, str) else n.target.__name__ for n in site.region]
    assert names[-1] == "matmul" and names.count("softmax") == 1 and "dropout" in names
    assert names.count("add") == (0 if mask == "none" else 1)


def float64_step(decoder: nn.Module, inputs, mask):
    """The same step in float64 (the module and its caches copied), for the served output's error."""
    wide = copy.deepcopy(decoder).double()
    return wide(*(t.double() if t.is_floating_point() else t for t in inputs), None if mask is None else mask.double())


@pytest.mark.parametrize(
    ("batch", "kv_heads", "mask", "cache"),
    [(2, 2, "positions", "static"), (1, 1, "positions", "static"), (2, 1, "input", "masked")],
    ids=["static-b2-gqa", "static-b1-mqa", "masked-b2-mqa"],
)
def test_a_served_eager_decoder_matches_eager_and_float64(tmp_path, monkeypatch, batch, kv_heads, mask, cache):
    heads = 4
    eager, served = (EagerDecoder(batch, heads, kv_heads, mask=mask).eval() for _ in range(2))
    attention_mask = padding_mask(batch) if mask == "input" else None
    sites = attention_sites(served, *step_inputs(batch, heads, kv_heads, 0), attention_mask)
    assert [s.spec.const("cache") for s in sites] == [cache]
    with torch.no_grad():
        eager(*step_inputs(batch, heads, kv_heads, 0), attention_mask)  # the row discovery wrote
    db = str(tmp_path / "k.db")
    store_kernel_decisions(db, [s.spec for s in sites])
    seen = record_inductor(monkeypatch)
    calls = spy_runners(monkeypatch)
    torch._dynamo.reset()
    backend = ks_backend.KernelsmithBackend(db=db, families=("decode_attention",), compare=False)
    compiled = torch.compile(served, backend=backend)
    offsets = [1, 2, 17, CACHE_LEN - 1]  # the cache filling up, to its last position
    with torch.no_grad():
        for step, offset in enumerate(offsets):
            inputs = step_inputs(batch, heads, kv_heads, offset, seed=step + 1)
            expected64 = float64_step(eager, inputs, attention_mask)  # before eager writes its cache
            expected = eager(*inputs, attention_mask)
            got = compiled(*inputs, attention_mask)
            torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(got.double(), expected64, rtol=1e-5, atol=1e-5)
    assert {s.status for s in backend.sites} == {"replaced"}, [(s.status, s.reason) for s in backend.sites]
    assert kernel_ops(seen[0]) == ["decode_attention"]
    assert not any("softmax" in str(n.target) for n in seen[0].graph.nodes)
    assert len(calls) >= len(offsets)  # the kernel ran at every step (in the interpreter)


def test_the_additive_mask_is_read_as_the_boolean_the_family_takes():
    visible = torch.rand(2, 1, 3, CACHE_LEN, generator=torch.Generator().manual_seed(0)) < 0.5
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        additive = additive_mask(visible, dtype)
        assert set(additive.float().unique().tolist()) <= {0.0, torch.finfo(dtype).min, -float("inf")}
        read = visible_where_additive(additive, torch.finfo(dtype).min / 2, (2, 1, 3, CACHE_LEN))
        assert torch.equal(read, visible)
    read = visible_where_additive(padding_mask(1), torch.finfo(torch.float32).min / 2, (3, 1, 1, CACHE_LEN))
    assert read.shape == (3, 1, 1, CACHE_LEN) and read.stride()[0] == 0  # broadcast, not copied


def test_a_passed_in_mask_holding_a_soft_bias_is_an_error_not_a_wrong_answer(tmp_path, monkeypatch):
    """A mask the caller passes is data no graph node describes: one holding a soft bias (ALiBi's
    slopes, -1e4 for hidden keys) would be read as all visible. The served site checks the values
    where it reads them (a device-side assert: no host sync) and fails loudly instead."""
    batch, heads, kv_heads = 2, 4, 1
    served = EagerDecoder(batch, heads, kv_heads, mask="input").eval()
    sites = attention_sites(served, *step_inputs(batch, heads, kv_heads, 0), padding_mask(batch))
    db = str(tmp_path / "k.db")
    store_kernel_decisions(db, [s.spec for s in sites])
    record_inductor(monkeypatch)
    torch._dynamo.reset()
    backend = ks_backend.KernelsmithBackend(db=db, families=("decode_attention",), compare=False)
    compiled = torch.compile(served, backend=backend)
    with torch.no_grad():
        compiled(*step_inputs(batch, heads, kv_heads, 1, seed=1), padding_mask(batch))  # HF's values: served
        assert {s.status for s in backend.sites} == {"replaced"}
        soft = padding_mask(batch).clone()
        soft[0, :, :, :5] = -1e4  # a soft bias: eager gives these keys a little weight, the conversion all
        with pytest.raises(RuntimeError, match=r"other than 0 and finfo\.min"):
            compiled(*step_inputs(batch, heads, kv_heads, 2, seed=2), soft)


# ---- refusals -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("planted", "reason"),
    [
        ({"dropout": 0.1, "training": True}, "dropout p=0.1 in training"),
        ({"scaling": "tensor"}, "scales the scores by a tensor, not a constant number"),
        ({"softmax_dim": -2}, "the softmax is over dim -2"),
        ({"mask_after_softmax": True}, "a mask added after the softmax"),
        ({"return_weights": True}, "returned to the caller, as output_attentions=True does"),
    ],
    ids=["dropout-in-training", "tensor-scaling", "softmax-over-queries", "mask-after-softmax", "weights-returned"],
)
def test_what_the_kernel_does_not_compute_stays_the_original_code(caplog, planted, reason):
    planted = dict(planted)
    training = planted.pop("training", False)
    decoder = EagerDecoder(2, 4, 2, **planted).train(training)
    assert reason in refusal(caplog, decoder, *step_inputs(2, 4, 2, 5))


def test_dropout_of_zero_in_training_is_the_identity_and_a_site():
    decoder = EagerDecoder(2, 4, 2, dropout=0.0).train()
    assert [s.spec.const("cache") for s in attention_sites(decoder, *step_inputs(2, 4, 2, 5))] == ["static"]


def test_masks_the_conversion_cannot_read_stay_the_original_code(caplog):
    """A mask the graph computes other than torch.where(c, 0, finfo.min) (here a scaled one, whose
    hidden value -3.4e8 the conversion would call visible while eager's softmax hides it), a boolean
    one added to the scores, and a per-head mask."""
    inputs = step_inputs(2, 4, 2, 5)

    class Scaled(EagerDecoder):
        def forward(self, q, k, v, offset, attention_mask=None):
            return super().forward(q, k, v, offset, attention_mask * 1e-30)

    reason = refusal(caplog, Scaled(2, 4, 2, mask="input").eval(), *inputs, padding_mask(2))
    assert "nothing proves its values 0 or hidden" in reason
    boolean = padding_mask(2) == 0
    assert "is not a float tensor" in refusal(caplog, EagerDecoder(2, 4, 2, mask="input").eval(), *inputs, boolean)
    per_head = padding_mask(2).expand(2, 4, 1, CACHE_LEN).contiguous()
    reason = refusal(caplog, EagerDecoder(2, 4, 2, mask="input").eval(), *inputs, per_head)
    assert "is not (B | 1, 1, Sq | 1, L)" in reason


def test_the_check_decides_the_eager_spelling_too(monkeypatch, caplog):
    """Planted: a family whose math (both references) is 1% off. The eager region, which the
    matcher accepts, no longer computes it, and the site's check (not an assumption) refuses it."""
    from kernelsmith.ops.decode_attention import DecodeAttention

    for name in ("reference", "reference_fp64"):
        exact = getattr(DecodeAttention, name)
        monkeypatch.setattr(DecodeAttention, name, lambda self, spec, inputs, exact=exact: tuple(
            1.01 * out for out in exact(self, spec, inputs)))  # fmt: skip
    decoder = EagerDecoder(2, 4, 2).eval()
    assert "does not compute decode_attention" in refusal(caplog, decoder, *step_inputs(2, 4, 2, 5))


def test_a_positions_mask_that_is_not_the_causal_prefix_is_read_as_a_mask():
    """A mask from the positions that hides each token from itself fails the static check (at
    every offset the lengths would show one key more) and is read converted, as it is."""

    class HidesOwnPosition(EagerDecoder):
        def forward(self, q, k, v, offset, attention_mask=None):
            keys = torch.arange(CACHE_LEN)[None, None, None, :]
            hidden = keys >= (torch.arange(1) + offset)[None, None, :, None]
            mask = torch.where(hidden, torch.finfo(q.dtype).min, 0.0)
            return super().forward(q, k, v, offset, mask)

    sites = attention_sites(HidesOwnPosition(2, 4, 2, mask="input").eval(), *step_inputs(2, 4, 2, 5))
    read = [(s.spec.const("cache"), str(s.spec.inputs[3])) for s in sites]
    assert read == [("masked", "2x1x1x37:bool@(0, 37, 37, 1)")]  # (1, 1, 1, L) broadcast over the batch


# ---- Hugging Face Llama, attn_implementation="eager" -----------------------------------------------


@pytest.fixture(scope="module")
def hf_eager_llama() -> nn.Module:
    model = tiny_llama(attn_implementation="eager")
    assert model.config._attn_implementation == "eager"
    return model


def test_hf_eager_llama_decoding_with_the_served_kernel_gives_eager_tokens_and_logits(
    hf_eager_llama, tmp_path, monkeypatch
):
    """transformers' eager_attention_forward over a StaticCache, its float mask built in the graph
    from the positions (eager_mask): one static-layout site per layer, served."""
    ids = torch.randint(0, 128, (2, 5), generator=torch.Generator().manual_seed(2))
    eager_tokens, eager_logits = decode_steps(hf_eager_llama, hf_eager_llama, ids, 3)
    cache, logits = prefilled(hf_eager_llama, ids)
    sites = attention_sites(
        lambda t: hf_eager_llama(t, past_key_values=cache, use_cache=True).logits, logits[:, -1:].argmax(-1)
    )
    assert [(s.op, s.spec.const("cache")) for s in sites] == [("decode_attention", "static")] * 2
    assert [str(t) for t in sites[0].spec.inputs] == ["2x4x1x16:float32", "2x2x17x16:float32", "2x2x17x16:float32",
                                                      "2:int64"]  # fmt: skip
    db = str(tmp_path / "k.db")
    store_kernel_decisions(db, [s.spec for s in sites])
    seen = record_inductor(monkeypatch)
    torch._dynamo.reset()
    backend = ks_backend.KernelsmithBackend(db=db, families=("decode_attention",), compare=False)
    tokens, served_logits = decode_steps(torch.compile(hf_eager_llama, backend=backend), hf_eager_llama, ids, 3)
    assert {s.status for s in backend.sites} == {"replaced"}, [(s.status, s.reason) for s in backend.sites]
    assert kernel_ops(seen[0]) == ["decode_attention"] * 2
    assert not any("softmax" in str(n.target) for n in seen[0].graph.nodes)
    assert torch.equal(tokens, eager_tokens)
    for ours, theirs in zip(served_logits, eager_logits, strict=True):
        torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_eager_rounding_is_within_the_family_tolerance(dtype):
    """The eager spelling rounds the scores to the low precision and its float32 softmax back to
    it before the second matmul; the site's check (not an assumption) finds that within the
    family's tolerance at every offset, and for the mask passed in (its finfo.min in that dtype)."""
    for mask in ("positions", "input"):
        decoder = EagerDecoder(2, 4, 2, mask=mask).eval().to(dtype)
        inputs = [t.to(dtype) if t.is_floating_point() else t for t in step_inputs(2, 4, 2, 5)]
        sites = attention_sites(decoder, *inputs, padding_mask(2, dtype) if mask == "input" else None)
        assert [(s.spec.const("cache"), s.spec.inputs[0].torch_dtype) for s in sites] == [
            ("static" if mask == "positions" else "masked", dtype)
        ]

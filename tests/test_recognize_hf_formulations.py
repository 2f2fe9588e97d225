"""Formulations of real model code the families compute, recognized where they are written.

Each formulation is tried on the Hugging Face transformers class or function itself (skipped
where transformers is not installed) and on a plain-code spelling, with the refusals that keep
look-alikes out (another offset, a downcast, a wrong dim, an extra op, swapped caches...), and
end to end through ``@kernelsmith.optimize`` (and the backend's site finding) in the
interpreter, where the serving side exists:

- Gemma's ``x * (1 + weight)`` RMSNorm: recognized, with the constant ``weight_offset=1.0``,
  and served (forward and backward);
- norms that upcast the weight (``weight.float()``, Cohere's ``weight.to(torch.float32)``);
- ``F.cross_entropy(logits.view(-1, V), labels.view(-1))``;
- attention helpers ending in ``.transpose(1, 2).contiguous()``, returning ``(out, None)``;
- ``apply_rotary_pos_emb``, returning ``(q_embed, k_embed)``;
- ``softmax(x / t)``: recognized, with the constant ``scale=1 / t``, and served.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import kernelsmith
from kernelsmith.frontends.patterns import rmsnorm as rmsnorm_pattern
from kernelsmith.frontends.patterns import softmax as softmax_pattern
from kernelsmith.frontends.recognize import Match, Recognition, recognize
from kernelsmith.ops import get_op
from test_backend import discover
from test_decorator import store_decision

N = 64
EPS = 1e-6


def _x(shape: tuple[int, ...] = (2, 8, N), dtype: torch.dtype = torch.float32, seed: int = 0) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def _w(n: int = N, dtype: torch.dtype = torch.float32, seed: int = 1) -> torch.Tensor:
    return (0.1 * torch.randn(n, generator=torch.Generator().manual_seed(seed))).to(dtype)


def _matched(fn, args: tuple, kwargs: dict | None = None) -> Match:
    rec = recognize(fn, args, kwargs or {})
    assert rec.match is not None, rec.reason
    return rec.match


def _refused(fn, args: tuple, kwargs: dict | None = None, *, reason: str) -> Recognition:
    rec = recognize(fn, args, kwargs or {})
    assert rec.match is None, f"unexpectedly matched {rec.match}"
    assert reason.lower() in rec.reason.lower(), rec.reason
    return rec


def _bound_close(match: Match, args: tuple, expected: torch.Tensor, kwargs: dict | None = None) -> None:
    """The match's family reference on the bound inputs computes the function's output."""
    family = get_op(match.op)
    inputs = match.bind(args, kwargs or {})
    spec = family.spec_for(*inputs, **match.constants)
    torch.testing.assert_close(family.reference(spec, inputs)[0], expected, rtol=2e-2, atol=2e-2)


@pytest.fixture
def db(tmp_path) -> str:
    return str(tmp_path / "formulations.db")


def test_the_families_take_the_constants_the_patterns_probe_for():
    # The patterns match Gemma's norm and a temperature only where their family serves the
    # constant (and refuse them by name otherwise): both families do.
    assert rmsnorm_pattern._weight_offset_unsupported() is None
    assert softmax_pattern._scale_unsupported() is None


# ---------------------------------------------------------------------------------------------
# Gemma's x * (1 + weight) RMSNorm
# ---------------------------------------------------------------------------------------------


def _gemma_classes() -> list[type]:
    transformers = pytest.importorskip("transformers")
    del transformers
    from transformers.models.gemma.modeling_gemma import GemmaRMSNorm
    from transformers.models.gemma2.modeling_gemma2 import Gemma2RMSNorm
    from transformers.models.gemma3.modeling_gemma3 import Gemma3RMSNorm

    return [GemmaRMSNorm, Gemma2RMSNorm, Gemma3RMSNorm]


def gemma_plain(x, w):
    xf = x.float()
    out = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS)
    return (out * (1.0 + w.float())).type_as(x)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gemma_norm_classes_match_with_the_weight_offset(dtype):
    for cls in _gemma_classes():
        norm = cls(N, eps=EPS).to(dtype)
        with torch.no_grad():
            norm.weight.copy_(_w(dtype=dtype))
        x = _x(dtype=dtype)
        match = _matched(norm, (x,))
        assert match.op == "rmsnorm" and match.constants == {"eps": EPS, "weight_offset": 1.0}, cls
        assert match.inputs[1].tensor is norm.weight  # the weight itself: no 1 + weight tensor per call
        with torch.no_grad():
            _bound_close(match, (x,), norm(x))


@pytest.mark.parametrize(
    "fn",
    [
        gemma_plain,
        lambda x, w: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * (1 + w),
        lambda x, w: (1.0 + w) * (x * torch.rsqrt(torch.mean(x * x, dim=-1, keepdim=True) + EPS)),
        lambda x, w: F.rms_norm(x, (N,), eps=EPS) * (w + 1.0),
    ],
    ids=["hf-upcast", "plain", "reordered", "functional"],
)
def test_gemma_plain_spellings_match(fn):
    match = _matched(fn, (_x(), _w()))
    assert match.op == "rmsnorm" and match.constants == {"eps": EPS, "weight_offset": 1.0}
    assert [ref.index for ref in match.inputs] == [0, 1]
    _bound_close(match, (_x(), _w()), fn(_x(), _w()))


@pytest.mark.parametrize(
    ("fn", "args", "reason"),
    [
        (lambda x, w: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * (2.0 + w), None, "only Gemma's"),
        (lambda x, w: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * (w - 1.0), None, "factors other"),
        # (1 + w) in bfloat16 rounds (1 + 0.001 is 1 there); the kernels add in float32.
        (lambda x, w: (x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + EPS)
                       * (1.0 + w).float()).to(x.dtype),
         (_x(dtype=torch.bfloat16), _w(dtype=torch.bfloat16)), "rounds"),
        # eps outside the square root
        (lambda x, w: x * (torch.rsqrt(x.pow(2).mean(-1, keepdim=True)) + EPS) * (1.0 + w), None, "1/sqrt"),
        (lambda x, w: x * torch.rsqrt(x.pow(2).mean(0, keepdim=True) + EPS) * (1.0 + w), None, "the mean is over"),
        (lambda x, w: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * (1.0 + w) + 1.0, None, "after the"),
        (lambda x, w: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * (1.0 + w) * (1.0 + w), None,
         "more than one"),
    ],
    ids=["offset-2", "minus-1", "bf16-add", "eps-outside", "wrong-dim", "extra-add", "two-offsets"],
)
def test_gemma_look_alikes_are_refused(fn, args, reason):
    _refused(fn, args or (_x(), _w()), reason=reason)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gemma_norm_is_served_through_the_decorator(db, monkeypatch, dtype):
    monkeypatch.setenv("KERNELSMITH_INTERPRET", "1")
    (cls, *_) = _gemma_classes()
    norm = cls(N, eps=EPS).to(dtype)
    with torch.no_grad():
        norm.weight.copy_(_w(dtype=dtype))
    x = _x(dtype=dtype)
    store_decision(db, get_op("rmsnorm").spec_for(x, norm.weight.detach(), eps=EPS, weight_offset=1.0))
    fn = kernelsmith.optimize(norm, mode="db", db=db)
    with torch.no_grad():
        fn(x)
        served = fn(x)
        expected = norm(x)
    assert fn.kernelsmith.stats["kernel_calls"] == 1, fn.kernelsmith.reasons
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(served, expected, rtol=tol, atol=tol)


def test_gemma_norm_trains_through_the_decorator(db, monkeypatch):
    """Forward and backward kernels (the backward spec carries the offset too): the gradients
    of x and of the weight are Gemma's own."""
    monkeypatch.setenv("KERNELSMITH_INTERPRET", "1")
    (cls, *_) = _gemma_classes()
    norm = cls(N, eps=EPS)
    with torch.no_grad():
        norm.weight.copy_(_w())
    x = _x().requires_grad_()
    weight = norm.weight.detach()
    store_decision(db, get_op("rmsnorm").spec_for(x.detach(), weight, eps=EPS, weight_offset=1.0))
    dy = _x(seed=5)
    backward = get_op("rmsnorm_backward").spec_for(dy, x.detach(), weight, eps=EPS, weight_offset=1.0)
    store_decision(db, backward, variant="two_stage")
    fn = kernelsmith.optimize(norm, mode="db", db=db)
    fn(x)
    y = fn(x)
    assert fn.kernelsmith.stats["kernel_calls"] == 1, fn.kernelsmith.reasons
    assert "KernelFunction" in type(y.grad_fn).__name__
    y.backward(dy)
    gx, gw = x.grad.clone(), norm.weight.grad.clone()
    x.grad = norm.weight.grad = None
    norm(x).backward(dy)
    torch.testing.assert_close(gx, x.grad, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(gw, norm.weight.grad, atol=1e-5, rtol=1e-4)


def test_the_backend_finds_the_gemma_norm_and_folds_its_residual_add():
    """The site is an RMSNorm with the offset; a residual add before it is folded into
    add_rmsnorm, which takes the offset too (Gemma's residual add + norm)."""
    (cls, *_) = _gemma_classes()
    norm = cls(N, eps=EPS).to(torch.bfloat16)
    torch._dynamo.reset()
    (site,) = discover(norm, _x(dtype=torch.bfloat16))
    assert (site.op, site.status, site.constants) == ("rmsnorm", "found", {"eps": EPS, "weight_offset": 1.0})
    torch._dynamo.reset()
    h, r = _x(dtype=torch.bfloat16), _x(dtype=torch.bfloat16, seed=2)
    sites = discover(lambda h, r: norm(h + r), h, r)
    assert [(s.op, s.constants.get("weight_offset")) for s in sites] == [("add_rmsnorm", 1.0)]
    assert sites[0].residual_add is not None and sites[0].spec.constants == {"eps": EPS, "weight_offset": 1.0}


# ---------------------------------------------------------------------------------------------
# Norms that upcast the weight: the families' own float32 math
# ---------------------------------------------------------------------------------------------


def test_weight_upcasting_norm_classes_match():
    pytest.importorskip("transformers")
    from transformers.models.cohere.modeling_cohere import CohereLayerNorm
    from transformers.models.gemma3n.modeling_gemma3n import Gemma3nRMSNorm
    from transformers.models.helium.modeling_helium import HeliumRMSNorm

    x = _x(dtype=torch.bfloat16)
    for cls, op, constants in [
        (Gemma3nRMSNorm, "rmsnorm", {"eps": EPS}),
        (HeliumRMSNorm, "rmsnorm", {"eps": EPS}),
        (CohereLayerNorm, "layernorm", {"eps": 1e-5, "affine": "weight"}),
    ]:
        norm = cls(N).to(torch.bfloat16)
        with torch.no_grad():
            norm.weight.copy_(1.0 + _w(dtype=torch.bfloat16))
        match = _matched(norm, (x,))
        assert (match.op, match.constants) == (op, constants), cls
        with torch.no_grad():
            _bound_close(match, (x,), norm(x))


def rms_weight_upcast(x, w):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS) * w.float()).to(x.dtype)


def ln_weight_bias_upcast(x, w, b):
    xf = x.to(torch.float32)
    mu = xf.mean(-1, keepdim=True)
    var = (xf - mu).pow(2).mean(-1, keepdim=True)
    return (w.to(torch.float32) * ((xf - mu) * torch.rsqrt(var + 1e-5)) + b.float()).to(x.dtype)


def test_plain_weight_upcasts_match():
    x, w = _x(dtype=torch.bfloat16), (1.0 + _w()).to(torch.bfloat16)
    match = _matched(rms_weight_upcast, (x, w))
    assert (match.op, match.constants) == ("rmsnorm", {"eps": EPS})
    _bound_close(match, (x, w), rms_weight_upcast(x, w))
    b = _w(seed=5).to(torch.bfloat16)
    match = _matched(ln_weight_bias_upcast, (x, w, b))
    assert (match.op, match.constants) == ("layernorm", {"eps": 1e-5, "affine": "weight_bias"})
    _bound_close(match, (x, w, b), ln_weight_bias_upcast(x, w, b))


@pytest.mark.parametrize(
    ("fn", "reason"),
    [
        # a downcast of the weight rounds it: the kernels never do
        (lambda x, w: (x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + EPS)
                       * w.to(torch.float16)).to(x.dtype), "casts the weight"),
        (lambda x, w: (x.double() * torch.rsqrt(x.double().pow(2).mean(-1, keepdim=True) + EPS)
                       * w.double()).to(x.dtype), "float32"),
        # the upcast product is never cast back: a float32 output of a bfloat16 x
        (lambda x, w: x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + EPS) * w.float(),
         "the output is torch.float32"),
        (lambda x, w: ((x.float() - x.float().mean(-1, keepdim=True))
                       * torch.rsqrt(x.float().var(-1, keepdim=True, unbiased=False) + EPS)
                       * w.double()).to(x.dtype), "casts the weight to torch.float64"),
    ],
    ids=["rms-downcast", "rms-float64", "rms-not-cast-back", "ln-float64-weight"],
)
def test_weight_cast_look_alikes_are_refused(fn, reason):
    _refused(fn, (_x(dtype=torch.bfloat16), (1.0 + _w()).to(torch.bfloat16)), reason=reason)


def test_weight_upcasting_norms_are_served_through_the_decorator(db, monkeypatch):
    pytest.importorskip("transformers")
    from transformers.models.cohere.modeling_cohere import CohereLayerNorm

    monkeypatch.setenv("KERNELSMITH_INTERPRET", "1")
    x, w = _x(dtype=torch.bfloat16), (1.0 + _w()).to(torch.bfloat16)
    cohere = CohereLayerNorm(N).to(torch.bfloat16)
    with torch.no_grad():
        cohere.weight.copy_(w)
    store_decision(db, get_op("rmsnorm").spec_for(x, w, eps=EPS))
    layernorm = get_op("layernorm")
    store_decision(db, layernorm.spec_for(x, w, eps=1e-5, affine="weight"), variant=layernorm.variants[0].name)
    for fn, args in [(rms_weight_upcast, (x, w)), (cohere, (x,))]:
        optimized = kernelsmith.optimize(fn, mode="db", db=db)
        with torch.no_grad():
            optimized(*args)
            served = optimized(*args)
            expected = fn(*args)
        assert optimized.kernelsmith.stats["kernel_calls"] == 1, optimized.kernelsmith.reasons
        torch.testing.assert_close(served, expected, rtol=1e-2, atol=1e-2)


def test_the_backend_finds_weight_upcasting_norms():
    pytest.importorskip("transformers")
    from transformers.models.cohere.modeling_cohere import CohereLayerNorm
    from transformers.models.gemma3n.modeling_gemma3n import Gemma3nRMSNorm

    x = _x(dtype=torch.bfloat16)
    for cls, op in [(Gemma3nRMSNorm, "rmsnorm"), (CohereLayerNorm, "layernorm")]:
        torch._dynamo.reset()
        sites = discover(cls(N).to(torch.bfloat16), x)
        assert [(s.op, s.status) for s in sites] == [(op, "found")], cls


# ---------------------------------------------------------------------------------------------
# F.cross_entropy(logits.view(-1, V), labels.view(-1))
# ---------------------------------------------------------------------------------------------

V = 50


def ce_viewed(logits, labels):
    return F.cross_entropy(logits.view(-1, logits.shape[-1]).float(), labels.view(-1))


@pytest.mark.parametrize(
    "fn",
    [
        ce_viewed,
        lambda logits, labels: F.cross_entropy(logits.float().view(-1, V), labels.view(-1), ignore_index=-100),
        lambda logits, labels: F.cross_entropy(logits.reshape(-1, V).float(), labels.flatten(), reduction="sum"),
        lambda logits, labels: torch.nn.CrossEntropyLoss()(logits.view(-1, V).float(), labels.reshape(-1)),
    ],
    ids=["view", "cast-then-view", "reshape-flatten", "module"],
)
def test_cross_entropy_of_viewed_logits_matches(fn):
    logits = _x((2, 8, V), torch.bfloat16)
    labels = torch.randint(0, V, (2, 8), generator=torch.Generator().manual_seed(3))
    match = _matched(fn, (logits, labels))
    assert match.op == "cross_entropy"
    assert [ref.reshape for ref in match.inputs] == [(16, V), (16,)]
    family = get_op("cross_entropy")
    inputs = match.bind((logits, labels), {})
    spec = family.spec_for(*inputs, **match.constants)
    torch.testing.assert_close(family.reference(spec, inputs)[0], fn(logits, labels))


@pytest.mark.parametrize(
    ("fn", "reason"),
    [
        # the labels shifted inside the function: a computed target
        (lambda logits, labels: F.cross_entropy(logits[:, :-1].reshape(-1, V).float(), labels[:, 1:].reshape(-1)),
         "computed by"),
        (lambda logits, labels: F.cross_entropy(logits.view(-1, V), labels.view(-1)), "another function"),
        (lambda logits, labels: F.cross_entropy(logits.view(-1, V).float(), labels.view(-1)) * 2.0, "after the"),
        (lambda logits, labels: F.cross_entropy(logits.view(-1, V).double(), labels.view(-1)), "float64"),
    ],
    ids=["shifted", "no-upcast", "scaled", "float64"],
)
def test_cross_entropy_view_look_alikes_are_refused(fn, reason):
    logits = _x((2, 8, V), torch.bfloat16)
    labels = torch.randint(0, V, (2, 8), generator=torch.Generator().manual_seed(3))
    _refused(fn, (logits, labels), reason=reason)


def test_cross_entropy_of_viewed_logits_is_served_through_the_decorator(db, monkeypatch):
    monkeypatch.setenv("KERNELSMITH_INTERPRET", "1")
    logits = _x((2, 8, V), torch.bfloat16)
    labels = torch.randint(0, V, (2, 8), generator=torch.Generator().manual_seed(3))
    family = get_op("cross_entropy")
    spec = family.spec_for(logits.view(-1, V), labels.view(-1), reduction="mean", ignore_index=-100,
                           label_smoothing=0.0)
    store_decision(db, spec, variant=family.variants[0].name)
    fn = kernelsmith.optimize(ce_viewed, mode="db", db=db)
    with torch.no_grad():
        fn(logits, labels)
        served = fn(logits, labels)
    assert fn.kernelsmith.stats["kernel_calls"] == 1, fn.kernelsmith.reasons
    torch.testing.assert_close(served, ce_viewed(logits, labels), rtol=1e-5, atol=1e-5)


def test_the_backend_finds_cross_entropy_of_viewed_logits():
    torch._dynamo.reset()
    logits = _x((2, 8, V), torch.bfloat16)
    labels = torch.randint(0, V, (2, 8), generator=torch.Generator().manual_seed(3))
    (site,) = discover(ce_viewed, logits, labels)
    assert site.op == "cross_entropy" and [i.reshape for i in site.inputs] == [(16, V), (16,)]
    assert site.spec.describe().startswith("cross_entropy(16x50:bfloat16, 16:int64")


# ---------------------------------------------------------------------------------------------
# Attention helpers ending in .transpose(1, 2).contiguous()
# ---------------------------------------------------------------------------------------------


class _AttentionModule(torch.nn.Module):
    """What Hugging Face's attention helpers read from the layer."""

    num_key_value_groups = 1
    is_causal = True


def _qkv(b: int = 1, h: int = 2, s: int = 16, d: int = 16) -> tuple[torch.Tensor, ...]:
    return tuple(_x((b, h, s, d), seed=i) for i in range(3))


def test_hf_sdpa_helper_matches_as_the_bshd_layout_returning_out_and_none():
    pytest.importorskip("transformers")
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    q, k, v = _qkv()
    args, kwargs = (_AttentionModule().eval(), q, k, v, None), {"scaling": 0.25}
    match = _matched(sdpa_attention_forward, args, kwargs)
    assert match.op == "attention" and match.returns == (0, None)
    assert match.constants == {"layout": "bshd", "causal": True, "scale": 0.25}
    assert [(ref.index, ref.transpose) for ref in match.inputs] == [(1, (1, 2)), (2, (1, 2)), (3, (1, 2))]
    out, none = sdpa_attention_forward(*args, **kwargs)
    assert none is None
    _bound_close(match, args, out, kwargs)


def test_hf_eager_attention_is_refused_for_its_attention_weights():
    pytest.importorskip("transformers")
    from transformers.models.llama.modeling_llama import eager_attention_forward

    q, k, v = _qkv()
    _refused(eager_attention_forward, (_AttentionModule().eval(), q, k, v, None), {"scaling": 0.25},
             reason="never form the weights")


@pytest.mark.parametrize(
    "fn",
    [
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).contiguous(),
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2),
        lambda q, k, v: (F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).contiguous(), None),
    ],
    ids=["contiguous", "view", "tuple"],
)
def test_plain_attention_transposed_at_the_end_matches(fn):
    q, k, v = _qkv()
    match = _matched(fn, (q, k, v))
    assert match.constants["layout"] == "bshd" and all(ref.transpose == (1, 2) for ref in match.inputs)
    out = fn(q, k, v)
    _bound_close(match, (q, k, v), out[0] if isinstance(out, tuple) else out)


@pytest.mark.parametrize(
    ("fn", "reason"),
    [
        (lambda q, k, v: F.scaled_dot_product_attention(q, k, v).transpose(1, 3).contiguous(), "not (1, 2)"),
        (lambda q, k, v: (F.scaled_dot_product_attention(q, k, v).transpose(1, 2), q * 2), "besides"),
        (lambda q, k, v: (None, F.scaled_dot_product_attention(q, k, v).transpose(1, 2)), "besides"),
        (lambda q, k, v: F.scaled_dot_product_attention(q, k, v).transpose(1, 2).contiguous() * 2, "not from an"),
    ],
    ids=["other-dims", "second-tensor", "none-first", "extra-op"],
)
def test_attention_tuple_look_alikes_are_refused(fn, reason):
    _refused(fn, _qkv(), reason=reason)


def test_hf_sdpa_helper_is_served_through_the_decorator(db, monkeypatch):
    pytest.importorskip("transformers")
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    monkeypatch.setenv("KERNELSMITH_INTERPRET", "1")
    module = _AttentionModule().eval()
    q, k, v = _qkv()

    def layer(q, k, v):
        return sdpa_attention_forward(module, q, k, v, None, scaling=0.25)

    match = _matched(layer, (q, k, v))
    family = get_op("attention")
    store_decision(db, family.spec_for(*match.bind((q, k, v), {}), **match.constants),
                   variant=family.variants[0].name)
    fn = kernelsmith.optimize(layer, mode="db", db=db)
    with torch.no_grad():
        fn(q, k, v)
        out, none = fn(q, k, v)
        expected, _ = layer(q, k, v)
    assert fn.kernelsmith.stats["kernel_calls"] == 1, fn.kernelsmith.reasons
    assert none is None and out.shape == expected.shape == (1, 16, 2, 16) and out.is_contiguous()
    torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-4)


# ---------------------------------------------------------------------------------------------
# RoPE: apply_rotary_pos_emb
# ---------------------------------------------------------------------------------------------


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rope_plain(q, k, cos, sin, unsqueeze_dim=1):
    cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


def _rope_inputs(layout: str = "bhsd", h: int = 4, hk: int = 2, s: int = 8, d: int = 16) -> tuple[torch.Tensor, ...]:
    shape = (lambda heads: (2, heads, s, d)) if layout == "bhsd" else (lambda heads: (2, s, heads, d))
    angles = torch.arange(s)[:, None] * (10000.0 ** (-torch.arange(0, d, 2) / d))[None, :]
    freqs = torch.cat((angles, angles), dim=-1).expand(2, s, d)
    return _x(shape(h), seed=0), _x(shape(hk), seed=1), freqs.cos().contiguous(), freqs.sin().contiguous()


def _hf_ropes() -> list:
    pytest.importorskip("transformers")
    from transformers.models.gemma.modeling_gemma import apply_rotary_pos_emb as gemma
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb as llama
    from transformers.models.qwen2.modeling_qwen2 import apply_rotary_pos_emb as qwen2

    return [llama, gemma, qwen2]


@pytest.mark.parametrize(("layout", "unsqueeze_dim"), [("bhsd", 1), ("bshd", 2)])
def test_hf_apply_rotary_pos_emb_matches(layout, unsqueeze_dim):
    args = _rope_inputs(layout)
    for fn in [*_hf_ropes(), rope_plain]:
        match = _matched(fn, args, {"unsqueeze_dim": unsqueeze_dim})
        assert match.op == "rope" and match.returns == (0, 1), fn
        assert match.constants == {"layout": layout, "style": "half"}
        family = get_op("rope")
        inputs = match.bind(args, {"unsqueeze_dim": unsqueeze_dim})
        spec = family.spec_for(*inputs, **match.constants)
        q_out, k_out = fn(*args, unsqueeze_dim=unsqueeze_dim)
        torch.testing.assert_close(family.reference(spec, inputs), (q_out, k_out))


def test_rope_returning_k_first_binds_q_by_its_heads():
    q, k, cos, sin = _rope_inputs()
    match = _matched(lambda q, k, cos, sin: rope_plain(q, k, cos, sin)[::-1], (q, k, cos, sin))
    assert match.returns == (1, 0) and [ref.index for ref in match.inputs] == [0, 1, 2, 3]


def test_rope_caches_are_bound_by_role_not_by_name():
    # x * sin + rotate_half(x) * cos is rope with the arguments named the other way round.
    def swapped(q, k, cos, sin):
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        return q * sin + rotate_half(q) * cos, k * sin + rotate_half(k) * cos

    match = _matched(swapped, _rope_inputs())
    assert [ref.index for ref in match.inputs] == [0, 1, 3, 2]


def test_a_two_dim_cache_unsqueezed_on_dim_0_broadcasts_over_batch_and_heads():
    q, k, cos, sin = _rope_inputs()
    match = _matched(lambda q, k, cos, sin: rope_plain(q, k, cos, sin, unsqueeze_dim=0), (q, k, cos[0], sin[0]))
    assert match.constants["layout"] == "bhsd"


def _other_caches(q, k, cos, sin, cos_k, sin_k):
    q_out, _ = rope_plain(q, k, cos, sin)
    _, k_out = rope_plain(q, k, cos_k, sin_k)
    return q_out, k_out


def _wrong_sign(q, k, cos, sin):
    def rot(x):
        return torch.cat((x[..., 8:], -x[..., :8]), dim=-1)

    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    return q * cos + rot(q) * sin, k * cos + rot(k) * sin


def rope_partial(q, k, cos, sin, passed_from=None):
    """GPT-NeoX's partial rotary: the first R channels rotate, the rest pass through."""
    rotary = cos.shape[-1]
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    q_rot, q_pass = q[..., :rotary], (q if passed_from is None else passed_from)[..., rotary:]
    k_rot, k_pass = k[..., :rotary], k[..., rotary:]
    q_embed = q_rot * cos + rotate_half(q_rot) * sin
    k_embed = k_rot * cos + rotate_half(k_rot) * sin
    return torch.cat([q_embed, q_pass], dim=-1), torch.cat([k_embed, k_pass], dim=-1)


def _wrong_pass_through(q, k, cos, sin):
    return rope_partial(q, k, cos[..., :8], sin[..., :8], passed_from=k.repeat(1, 2, 1, 1))


def _halves_of_the_whole_head(q, k, cos, sin):
    cos, sin = cos[..., :8].unsqueeze(1), sin[..., :8].unsqueeze(1)
    return q[..., :8] * cos + rotate_half(q)[..., :8] * sin, k[..., :8] * cos + rotate_half(k)[..., :8] * sin


@pytest.mark.parametrize("rotary", [8, 16])
def test_partial_rotary_matches(rotary):
    q, k, cos, sin = _rope_inputs()
    args = (q, k, cos[..., :rotary].contiguous(), sin[..., :rotary].contiguous())
    functions = [rope_partial]
    try:
        from transformers.models.gpt_neox.modeling_gpt_neox import apply_rotary_pos_emb as neox

        functions.append(neox)
    except ImportError:
        pass
    for fn in functions:
        match = _matched(fn, args)
        assert match.op == "rope" and [ref.index for ref in match.inputs] == [0, 1, 2, 3], fn
        family = get_op("rope")
        inputs = match.bind(args, {})
        spec = family.spec_for(*inputs, **match.constants)
        torch.testing.assert_close(family.reference(spec, inputs), fn(*args))


@pytest.mark.parametrize(
    ("fn", "reason"),
    [
        (lambda q, k, cos, sin: rope_plain(q, k, cos, sin)[0], "rotates one tensor"),
        (lambda q, k, cos, sin: (*rope_plain(q, k, cos, sin), q), "without computing it"),
        (lambda q, k, cos, sin: (*rope_plain(q, k, cos, sin), q * 2), "returns 3 values"),
        (lambda q, k, cos, sin: rope_plain(q.float(), k.float(), cos, sin), "not x times the cos"),
        (lambda q, k, cos, sin: tuple(t * 2 for t in rope_plain(q, k, cos, sin)), "not from x * cos"),
        (_wrong_sign, "not negated"),
        (_wrong_pass_through, "comes from torch.cat"),
        (_halves_of_the_whole_head, "exactly one rotate_half"),
    ],
    ids=["one-tensor", "input-returned", "three-values", "upcast", "scaled", "wrong-sign", "wrong-pass",
         "whole-head-halves"],
)
def test_rope_look_alikes_are_refused(fn, reason):
    _refused(fn, tuple(t.to(torch.bfloat16) for t in _rope_inputs()), reason=reason)


def test_rope_with_other_caches_for_k_is_refused():
    q, k, cos, sin = _rope_inputs()
    _refused(_other_caches, (q, k, cos, sin, cos * 0.5, sin * 0.5), reason="different cos / sin caches")


def test_hf_apply_rotary_pos_emb_is_served_through_the_decorator(db, monkeypatch):
    monkeypatch.setenv("KERNELSMITH_INTERPRET", "1")
    (llama, *_) = _hf_ropes()
    args = _rope_inputs()
    match = _matched(llama, args)
    family = get_op("rope")
    store_decision(db, family.spec_for(*match.bind(args, {}), **match.constants), variant=family.variants[0].name)
    fn = kernelsmith.optimize(llama, mode="db", db=db)
    with torch.no_grad():
        fn(*args)
        served = fn(*args)
    assert fn.kernelsmith.stats["kernel_calls"] == 1, fn.kernelsmith.reasons
    assert isinstance(served, tuple) and len(served) == 2
    torch.testing.assert_close(served, llama(*args), rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------------------------------
# Softmax with a temperature
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fn", "scale"),
    [
        (lambda x: torch.softmax(x / 0.5, dim=-1), 2.0),
        (lambda x: F.softmax(0.25 * x, dim=-1), 0.25),
        (lambda x: F.softmax(x.float() / 0.5, dim=-1).to(x.dtype), 2.0),
    ],
    ids=["div", "mul", "upcast"],
)
def test_softmax_with_a_temperature_matches_with_a_scale(fn, scale):
    x = _x(dtype=torch.bfloat16)
    match = _matched(fn, (x,))
    assert (match.op, match.constants) == ("softmax", {"dim": -1, "scale": scale})
    _bound_close(match, (x,), fn(x))
    _refused(lambda x: torch.softmax(x * 0.0, dim=-1), (_x(),), reason="not a finite non-zero")
    _refused(lambda x: torch.softmax(x / 0.5, dim=0), (_x(),), reason="not the last dim")
    _refused(lambda x: torch.softmax(x / 0.5, dim=-1) * 2.0, (_x(),), reason="after the softmax")


def test_a_temperature_inside_the_explicit_softmax_is_refused():
    def f(x):
        e = torch.exp(x / 0.5 - (x / 0.5).amax(-1, keepdim=True))
        return e / e.sum(-1, keepdim=True)

    _refused(f, (_x(),), reason="explicit softmax of x scaled")


def test_softmax_of_a_tensor_scale_is_no_temperature():
    # A scale from a tensor is a computed input like any other, not a constant the family could take.
    _refused(lambda x, t: torch.softmax(x / t, dim=-1), (_x(), torch.tensor(0.7)), reason="not an input tensor")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_softmax_with_a_temperature_is_served_through_the_decorator(db, monkeypatch, dtype):
    monkeypatch.setenv("KERNELSMITH_INTERPRET", "1")

    def sample_probs(logits):
        return torch.softmax(logits / 0.7, dim=-1)

    x = _x(dtype=dtype)
    store_decision(db, get_op("softmax").spec_for(x, dim=-1, scale=1 / 0.7))
    fn = kernelsmith.optimize(sample_probs, mode="db", db=db)
    fn(x)
    served = fn(x)
    assert fn.kernelsmith.stats["kernel_calls"] == 1, fn.kernelsmith.reasons
    tol = 1e-5 if dtype == torch.float32 else 2e-2  # the kernel scales in float32, the function in bfloat16
    torch.testing.assert_close(served, sample_probs(x), rtol=tol, atol=tol)


def test_the_backend_finds_a_softmax_with_a_temperature():
    torch._dynamo.reset()
    (site,) = discover(lambda x: torch.softmax(x * 0.5, dim=-1), _x())
    assert (site.op, site.constants) == ("softmax", {"dim": -1, "scale": 0.5})
    assert sorted(n.name for n in site.region) == ["mul", "softmax"]

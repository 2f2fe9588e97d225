"""The recognizer's single-output op families beyond RMSNorm and softmax: layernorm, gelu and
gelu_tanh, swiglu and geglu, sum / mean / max, cross_entropy.

Each positive case checks the op, the constants, that ``bind`` returns the right tensors (by
identity), that the family's ``spec_for`` takes the match's inputs and constants, and that the
function's own output passes the decorator's numerical check against the family's reference
(so the match is not a coincidence of names). Each negative case checks that nothing matched
and that the reason names the problem. One end-to-end call per family goes through
``@kernelsmith.optimize`` in database-only mode: recognized, checked, then "not tuned".
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import kernelsmith
from kernelsmith.frontends.capture import Kind, capture
from kernelsmith.frontends.decorator import _differs_from_op
from kernelsmith.frontends.patterns import PATTERNS
from kernelsmith.frontends.recognize import InputRef, Recognition, recognize
from kernelsmith.ops import get_op, op_names

N = 64
EPS = 1e-5
ARG0, ARG1, ARG2 = (InputRef("arg", index=i) for i in range(3))


def _t(shape: tuple[int, ...], dtype: torch.dtype = torch.float32, seed: int = 0, scale: float = 1.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (scale * torch.randn(shape, generator=g)).to(dtype)


def _matched(
    fn, args: tuple, op: str, constants: dict, refs: tuple[InputRef, ...] | None = None
) -> tuple[torch.Tensor, ...]:
    """Recognized as ``op`` with ``constants``; the family accepts it and its output is the op's."""
    rec = recognize(fn, args, {})
    assert rec.match is not None, rec.reason
    assert rec.reason == ""
    assert rec.match.op == op
    assert rec.match.constants == constants
    if refs is not None:
        assert rec.match.inputs == refs
    inputs = rec.match.bind(args, {})
    family = get_op(op)
    spec = family.spec_for(*inputs, **rec.match.constants)
    assert _differs_from_op(family, spec, inputs, rec.output) is None
    return inputs


def _refused(fn, args: tuple, *, reason: str) -> Recognition:
    rec = recognize(fn, args, {})
    assert rec.match is None, f"unexpectedly matched {rec.match}"
    assert reason.lower() in rec.reason.lower(), rec.reason
    return rec


def _end_to_end(fn, args: tuple, op: str, tmp_path) -> None:
    """One call through the decorator in database-only mode: recognized, numerically checked as
    the op, then no stored decision ("not tuned")."""
    wrapped = kernelsmith.optimize(fn, mode="db", db=tmp_path / "x.db")
    out = wrapped(*args)
    torch.testing.assert_close(out, fn(*args), rtol=0, atol=0)
    (reason,) = wrapped.kernelsmith.reasons.values()
    assert op in reason and "not tuned" in reason, reason


def test_registry_has_every_new_family_under_its_op_name():
    new = {"layernorm", "gelu", "gelu_tanh", "swiglu", "geglu", "sum", "mean", "max", "cross_entropy"}
    assert new <= set(PATTERNS)
    assert set(PATTERNS) <= set(op_names())


# =============================================================================================
# LayerNorm
# =============================================================================================


def ln_functional(x, w, b):
    return F.layer_norm(x, (x.shape[-1],), w, b, EPS)


def ln_torch_namespace(x, w, b):
    return torch.layer_norm(x, [x.shape[-1]], w, b, EPS)


def ln_explicit_var(x, w, b):
    mu = x.mean(-1, keepdim=True)
    return (x - mu) / torch.sqrt(x.var(-1, keepdim=True, unbiased=False) + EPS) * w + b


def ln_explicit_correction(x, w, b):
    rstd = torch.rsqrt(torch.var(x, -1, keepdim=True, correction=0) + EPS)
    return b + w * ((x - x.mean(dim=-1, keepdim=True)) * rstd)


def ln_explicit_mean_square(x, w, b):
    xc = x - x.mean(-1, keepdim=True)
    return xc / (xc.pow(2).mean(-1, keepdim=True) + EPS).sqrt() * w + b


def ln_explicit_twice_centred(x, w, b):
    var = ((x - x.mean(-1, keepdim=True)) ** 2).mean(-1, keepdim=True)
    return (x - x.mean(-1, keepdim=True)) * (EPS + var) ** -0.5 * w + b


def ln_upcast(x, w, b):
    xf = x.float()
    xc = xf - xf.mean(-1, keepdim=True)
    y = xc * torch.rsqrt((xc * xc).mean(-1, keepdim=True) + EPS)
    return y.to(x.dtype) * w + b


def ln_functional_upcast(x, w, b):
    return F.layer_norm(x.float(), (x.shape[-1],), w.float(), b.float(), EPS).to(x.dtype)


def ln_functional_then_affine(x, w, b):
    return F.layer_norm(x, (x.shape[-1],), eps=EPS) * w + b


LN_FORMS = [
    ln_functional,
    ln_torch_namespace,
    ln_explicit_var,
    ln_explicit_correction,
    ln_explicit_mean_square,
    ln_explicit_twice_centred,
    ln_upcast,
    ln_functional_upcast,
    ln_functional_then_affine,
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("form", LN_FORMS, ids=lambda f: f.__name__)
def test_layernorm_forms(form, dtype):
    x, w, b = _t((2, 3, N), dtype), 1 + _t((N,), dtype, 1, 0.1), _t((N,), dtype, 2, 0.1)
    bx, bw, bb = _matched(form, (x, w, b), "layernorm", {"eps": EPS, "affine": "weight_bias"}, (ARG0, ARG1, ARG2))
    assert bx is x and bw is w and bb is b


@pytest.mark.parametrize(
    ("module", "affine"),
    [
        (nn.LayerNorm(N), "weight_bias"),
        (nn.LayerNorm(N, eps=1e-6, bias=False), "weight"),
        (nn.LayerNorm(N, elementwise_affine=False), "none"),
    ],
    ids=["affine", "no-bias", "no-affine"],
)
def test_layernorm_modules(module, affine):
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(_t(p.shape, seed=3))
    x = _t((5, N))
    inputs = _matched(module, (x,), "layernorm", {"eps": module.eps, "affine": affine})
    assert inputs[0] is x
    assert list(inputs[1:]) == [p for p in (module.weight, module.bias) if p is not None]
    assert all(a is b for a, b in zip(inputs[1:], [module.weight, module.bias], strict=False))


def test_layernorm_without_weight_or_bias_and_row_shaped_parameters():
    x = _t((4, N))
    _matched(lambda x: F.layer_norm(x, (N,)), (x,), "layernorm", {"eps": 1e-5, "affine": "none"}, (ARG0,))
    _matched(
        lambda x, w: (x - x.mean(-1, keepdim=True)) / torch.sqrt(x.var(-1, keepdim=True, unbiased=False)) * w,
        (x, _t((N,), seed=1)),
        "layernorm",
        {"eps": 0.0, "affine": "weight"},
        (ARG0, ARG1),
    )
    w, b = _t((1, N), seed=1), _t((1, N), seed=2)
    _, bw, bb = _matched(ln_explicit_var, (x, w, b), "layernorm", {"eps": EPS, "affine": "weight_bias"})
    assert bw.shape == (N,) and bw.data_ptr() == w.data_ptr() and bb.data_ptr() == b.data_ptr()


def test_layernorm_unbiased_variance_is_refused():
    def f(x, w, b):
        return (x - x.mean(-1, keepdim=True)) / torch.sqrt(x.var(-1, keepdim=True) + EPS) * w + b

    def g(x, w, b):
        return (x - x.mean(-1, keepdim=True)) * torch.rsqrt(torch.var(x, -1, keepdim=True, correction=1) + EPS) * w + b

    args = (_t((4, N)), _t((N,)), _t((N,)))
    _refused(f, args, reason="the variance is unbiased")
    _refused(g, args, reason="correction=1")


def test_layernorm_over_other_or_several_dims_is_refused():
    x = _t((4, 8, N))
    _refused(lambda x: F.layer_norm(x, (8, N)), (x,), reason="normalized_shape (8, 64)")

    def dim0(x):
        return (x - x.mean(0, keepdim=True)) / torch.sqrt(x.var(0, keepdim=True, unbiased=False) + EPS)

    def two_dims(x):
        xc = x - x.mean((-2, -1), keepdim=True)
        return xc * torch.rsqrt(x.var((-2, -1), keepdim=True, unbiased=False) + EPS)

    def var_other_dim(x):
        return (x - x.mean(-1, keepdim=True)) / torch.sqrt(x.var(1, keepdim=True, unbiased=False) + EPS)

    _refused(dim0, (x,), reason="not the last dim")
    _refused(two_dims, (x,), reason="dims (1, 2)")
    _refused(var_other_dim, (x,), reason="the variance is over dims (1,)")


def test_layernorm_parameters_on_another_axis_are_refused():
    x = _t((8, N))
    _refused(ln_explicit_var, (x, _t((8, 1)), _t((N,))), reason="weight has shape (8, 1)")
    _refused(ln_explicit_var, (x, _t((N,)), _t((8, 1))), reason="bias has shape (8, 1)")


def test_layernorm_look_alikes_are_refused():
    x, w, b = _t((4, N)), _t((N,)), _t((N,))
    _refused(lambda x, b: F.layer_norm(x, (N,), None, b), (x, b), reason="bias without a weight")
    # eps outside the square root is another function.
    _refused(
        lambda x, w, b: (x - x.mean(-1, keepdim=True)) / (x.std(-1, keepdim=True, unbiased=False) + EPS) * w + b,
        (x, w, b),
        reason="0 factors of the form 1/sqrt",
    )
    _refused(
        lambda x, y, w, b: (x - x.mean(-1, keepdim=True)) / torch.sqrt(y.var(-1, keepdim=True, unbiased=False)) * w + b,
        (x, _t((4, N), seed=5), w, b),
        reason="variance is of another tensor",
    )
    _refused(lambda x, w, b: ln_functional(x, w, b) * 2, (x, w, b), reason="multiplies layer_norm(x) by")
    _refused(lambda x, w, b: F.layer_norm(x, (N,), w) * w, (x, w, b), reason="already has a weight")
    _refused(lambda x, w, b: F.layer_norm(x, (N,), w, b).exp(), (x, w, b), reason="not the last step of a layer norm")
    _refused(lambda x, w, b: ln_functional(x, w, b) + x, (x, w, b), reason="after the normalization")
    _refused(lambda x, w, b: ln_explicit_var(x, w, b) + ln_explicit_var(x, w, b), (x, w, b), reason="not a normalized")
    _refused(lambda x, w, b: F.layer_norm(x, (N,), w, b).double(), (x, w, b), reason="the output is torch.float64")


# =============================================================================================
# GELU
# =============================================================================================


def gelu_functional(x):
    return F.gelu(x)


def gelu_module(x):
    return nn.GELU()(x)


def gelu_erf(x):
    return 0.5 * x * (1 + torch.erf(x / math.sqrt(2)))


def gelu_erf_hf(x):
    return x * 0.5 * (1.0 + torch.erf(x / math.sqrt(2.0)))


def gelu_erf_halved(x):
    return x * (1 + torch.special.erf(x * 0.7071067811865476)) / 2


def gelu_erf_upcast(x):
    xf = x.float()
    return (0.5 * xf * (1 + torch.erf(xf / math.sqrt(2)))).to(x.dtype)


def gelu_tanh_functional(x):
    return F.gelu(x, approximate="tanh")


def gelu_tanh_module(x):
    return nn.GELU(approximate="tanh")(x)


def gelu_tanh_explicit(x):
    return 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))


def gelu_tanh_hf_fast(x):
    return 0.5 * x * (1.0 + torch.tanh(x * 0.7978845608 * (1.0 + 0.044715 * x * x)))


def gelu_tanh_pow(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


def gelu_tanh_sigmoid(x):
    return x * torch.sigmoid(math.sqrt(8 / math.pi) * (x + 0.044715 * x * x * x))


@pytest.mark.parametrize(
    ("form", "op"),
    [
        (gelu_functional, "gelu"),
        (gelu_module, "gelu"),
        (gelu_erf, "gelu"),
        (gelu_erf_hf, "gelu"),
        (gelu_erf_halved, "gelu"),
        (gelu_erf_upcast, "gelu"),
        (gelu_tanh_functional, "gelu_tanh"),
        (gelu_tanh_module, "gelu_tanh"),
        (gelu_tanh_explicit, "gelu_tanh"),
        (gelu_tanh_hf_fast, "gelu_tanh"),
        (gelu_tanh_pow, "gelu_tanh"),
        (gelu_tanh_sigmoid, "gelu_tanh"),
    ],
    ids=lambda v: getattr(v, "__name__", v),
)
def test_gelu_forms(form, op):
    x = _t((4, 3, N), scale=3.0)
    (bx,) = _matched(form, (x,), op, {}, (ARG0,))
    assert bx is x


def test_gelu_of_bf16_upcast_and_cast_back():
    x = _t((4, N), torch.bfloat16, scale=3.0)
    _matched(lambda x: F.gelu(x.float(), approximate="tanh").to(x.dtype), (x,), "gelu_tanh", {}, (ARG0,))
    _matched(gelu_erf_upcast, (x,), "gelu", {}, (ARG0,))
    _refused(lambda x: F.gelu(x.float()), (x,), reason="the output is torch.float32")


def test_gelu_with_other_constants_is_refused():
    x = _t((4, N))
    _refused(
        lambda x: 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.04 * x**3))),
        (x,),
        reason="gelu_tanh: computes",
    )
    _refused(lambda x: 0.5 * x * (1 + torch.erf(x / 1.4)), (x,), reason="not 0.5 * x * (1 + erf(x / sqrt(2)))")
    _refused(lambda x: 0.5 * x * (1 + torch.erf(x / math.sqrt(2))) + 1, (x,), reason="gelu: computes")
    _refused(lambda x: x * (1 + torch.erf(x / math.sqrt(2))), (x,), reason="gelu: computes 1 * x + 1 * x * t")


def test_quick_gelu_is_refused():
    _refused(lambda x: x * torch.sigmoid(1.702 * x), (_t((4, N)),), reason="'quick' GELU")


def test_gelu_look_alikes_are_refused():
    x = _t((4, N))
    _refused(lambda x: F.gelu(x) * 2, (x,), reason="after the gelu")
    _refused(lambda x: F.gelu(x + 1), (x,), reason="not an input tensor")
    _refused(lambda x, y: 0.5 * x * (1 + torch.erf(y / math.sqrt(2))), (x, _t((4, N), seed=3)), reason="two different")
    _refused(lambda x: 0.5 * x * (1 + torch.erf(x.exp())), (x,), reason="computes torch.Tensor.exp")


def test_gelu_capture_kinds():
    x = _t((4, N))
    graph = capture(gelu_tanh_module, (x,), {})
    assert [n.kind for n in graph.nodes] == [Kind.GELU] and graph.nodes[0].params == {"approximate": "tanh"}
    for f, kind in ((torch.erf, Kind.ERF), (torch.tanh, Kind.TANH), (F.sigmoid, Kind.SIGMOID)):
        assert [n.kind for n in capture(f, (x,), {}).nodes] == [kind]


# =============================================================================================
# SwiGLU / GeGLU
# =============================================================================================


def swiglu_silu(a, b):
    return F.silu(a) * b


def swiglu_reversed(a, b):
    return b * F.silu(a)


def swiglu_sigmoid(a, b):
    return a * torch.sigmoid(a) * b


def swiglu_sigmoid_other_order(a, b):
    return b * (torch.sigmoid(a) * a)


def swiglu_module(a, b):
    return nn.SiLU()(a) * b


def geglu_exact(a, b):
    return F.gelu(a) * b


def geglu_tanh(a, b):
    return b * F.gelu(a, approximate="tanh")


@pytest.mark.parametrize(
    ("form", "op", "extra"),
    [
        (swiglu_silu, "swiglu", {}),
        (swiglu_reversed, "swiglu", {}),
        (swiglu_sigmoid, "swiglu", {}),
        (swiglu_sigmoid_other_order, "swiglu", {}),
        (swiglu_module, "swiglu", {}),
        (geglu_exact, "geglu", {"approximate": "none"}),
        (geglu_tanh, "geglu", {"approximate": "tanh"}),
    ],
    ids=lambda v: getattr(v, "__name__", None),
)
def test_gated_pair_forms(form, op, extra):
    a, b = _t((2, 5, N), scale=3.0), _t((2, 5, N), seed=1)
    ba, bb = _matched(form, (a, b), op, {"layout": "pair", **extra}, (ARG0, ARG1))
    assert ba is a and bb is b


def test_gated_gate_is_whichever_argument_is_activated():
    a, b = _t((4, N)), _t((4, N), seed=1)
    ba, bb = _matched(lambda up, gate: F.silu(gate) * up, (b, a), "swiglu", {"layout": "pair"}, (ARG1, ARG0))
    assert ba is a and bb is b


def swiglu_chunk(x):
    a, b = x.chunk(2, dim=-1)
    return F.silu(a) * b


def swiglu_torch_chunk(x):
    a, b = torch.chunk(x, 2, -1)
    return b * (a * torch.sigmoid(a))


def swiglu_slices(x):
    h = x.shape[-1] // 2
    return F.silu(x[..., :h]) * x[..., h:]


def swiglu_split(x):
    a, b = x.split(x.shape[-1] // 2, dim=x.ndim - 1)
    return F.silu(a) * b


def swiglu_narrow(x):
    h = x.shape[-1] // 2
    return F.silu(x.narrow(-1, 0, h)) * x.narrow(-1, h, h)


def geglu_chunk(x):
    a, b = x.chunk(2, -1)
    return F.gelu(a, approximate="tanh") * b


@pytest.mark.parametrize(
    ("form", "op", "extra"),
    [
        (swiglu_chunk, "swiglu", {}),
        (swiglu_torch_chunk, "swiglu", {}),
        (swiglu_slices, "swiglu", {}),
        (swiglu_split, "swiglu", {}),
        (swiglu_narrow, "swiglu", {}),
        (geglu_chunk, "geglu", {"approximate": "tanh"}),
    ],
    ids=lambda v: getattr(v, "__name__", None),
)
def test_gated_concat_forms(form, op, extra):
    x = _t((3, 2 * N), scale=3.0)
    (bx,) = _matched(form, (x,), op, {"layout": "concat", **extra}, (ARG0,))
    assert bx is x


def test_gated_2d_slice_form():
    x = _t((3, 2 * N))
    _matched(lambda x: F.silu(x[:, :N]) * x[:, N:], (x,), "swiglu", {"layout": "concat"}, (ARG0,))


def test_gate_on_the_second_half_is_refused():
    def f(x):
        a, b = x.chunk(2, -1)
        return a * F.silu(b)

    _refused(f, (_t((3, 2 * N)),), reason="the gate (the activated operand) is the second half")
    _refused(lambda x: F.silu(x[..., N:]) * x[..., :N], (_t((3, 2 * N)),), reason="second half")


def test_gated_split_along_another_dim_is_refused():
    def f(x):
        a, b = x.chunk(2, 0)
        return F.silu(a) * b

    _refused(f, (_t((4, N)),), reason="splits x along dim 0, not the last dim")


def test_gated_look_alikes_are_refused():
    a, b = _t((4, N)), _t((4, N), seed=1)
    _refused(lambda a, b: torch.sigmoid(a) * b, (a, b), reason="GLU, not a SwiGLU")
    _refused(lambda a, b, c: a * torch.sigmoid(c) * b, (a, b, _t((4, N), seed=2)), reason="not a * sigmoid(a) * b")
    _refused(lambda a, b: F.silu(a) * b[0], (a, b), reason="computed by")
    _refused(lambda a, b: F.silu(a) * b, (a, _t((N,), seed=1)), reason="differ in shape")
    _refused(lambda a, b: F.silu(a) * b * 2, (a, b), reason="not by one tensor b")
    _refused(lambda a, b: F.silu(a) * b + 1, (a, b), reason="no registered pattern")
    _refused(lambda x: F.silu(x[..., :10]) * x[..., 10:20], (_t((4, N)),), reason="not its two halves")
    _refused(lambda x, y: F.silu(x[..., :N]) * y[..., N:], (_t((4, 2 * N)), _t((4, 2 * N))), reason="two different")


def test_split_and_slice_capture_params():
    x = _t((4, 2 * N))
    graph = capture(lambda x: x.tensor_split(2, dim=-1), (x,), {})
    (node,) = graph.nodes
    assert node.kind is Kind.SPLIT and node.params == {"dim": 1, "sections": ((0, N), (N, 2 * N))}
    graph = capture(lambda x: x[..., 3:-5], (x,), {})
    assert graph.nodes[0].kind is Kind.SLICE and graph.nodes[0].params == {"dim": 1, "start": 3, "stop": 2 * N - 5}
    graph = capture(lambda x: x[:, ::2], (x,), {})  # a step: not a SLICE
    assert graph.nodes[0].kind is Kind.OTHER


# =============================================================================================
# Row reductions
# =============================================================================================


@pytest.mark.parametrize(
    ("form", "op"),
    [
        (lambda x: x.sum(-1), "sum"),
        (lambda x: torch.sum(x, dim=-1), "sum"),
        (lambda x: x.sum(dim=(x.ndim - 1,)), "sum"),
        (lambda x: x.mean(-1), "mean"),
        (lambda x: torch.mean(x, dim=x.ndim - 1), "mean"),
        (lambda x: x.sum(-1) / x.shape[-1], "mean"),
        (lambda x: x.amax(-1), "max"),
        (lambda x: x.max(-1).values, "max"),
        (lambda x: torch.max(x, dim=-1)[0], "max"),
        (lambda x: torch.amax(x, dim=x.ndim - 1), "max"),
    ],
    ids=[
        "sum",
        "torch.sum",
        "sum-tuple-dim",
        "mean",
        "torch.mean-ndim",
        "sum-over-n",
        "amax",
        "max.values",
        "torch.max[0]",
        "torch.amax-ndim",
    ],
)
@pytest.mark.parametrize("shape", [(6, N), (2, 3, N)], ids=["2d", "3d"])
def test_reduction_forms(form, op, shape):
    x = _t(shape)
    (bx,) = _matched(form, (x,), op, {"dim": -1}, (ARG0,))
    assert bx is x


def test_reductions_upcast_and_cast_back():
    x = _t((6, N), torch.bfloat16)
    _matched(lambda x: x.float().sum(-1).to(x.dtype), (x,), "sum", {"dim": -1}, (ARG0,))
    _matched(lambda x: x.sum(-1, dtype=torch.float32).to(x.dtype), (x,), "sum", {"dim": -1}, (ARG0,))
    _matched(lambda x: x.mean(-1, dtype=torch.bfloat16), (x,), "mean", {"dim": -1}, (ARG0,))
    _matched(lambda x: x.sum(), (_t((N,)),), "sum", {"dim": -1}, (ARG0,))  # 1-D: every dim is the last


def test_reductions_refusals():
    x = _t((6, N))
    _refused(lambda x: x.sum(-1, keepdim=True), (x,), reason="sum: keepdim=True")
    _refused(lambda x: x.amax(-1, keepdim=True), (x,), reason="max: keepdim=True")
    _refused(lambda x: x.mean(0), (x,), reason="mean: reduces dims (0,)")
    _refused(lambda x: x.sum((0, 1)), (_t((2, 3, N)),), reason="several dims (0, 1)")
    _refused(lambda x: x.sum(), (x,), reason="every dim of a 2-D tensor")
    _refused(lambda x: x.sum(-1, dtype=torch.float64), (x,), reason="dtype=torch.float64 argument")
    xb = _t((6, N), torch.bfloat16)
    _refused(lambda x: x.sum(-1, dtype=torch.float32), (xb,), reason="dtype=torch.float32 argument")
    _refused(lambda x: x.float().mean(-1), (xb,), reason="the output is torch.float32")
    _refused(lambda x: x.max(-1).indices, (x,), reason="indices")
    _refused(lambda x: (x * 2).sum(-1), (x,), reason="computed by torch.Tensor.mul")
    _refused(lambda x: x.sum(-1) * 2, (x,), reason="no registered pattern")


# =============================================================================================
# Cross-entropy
# =============================================================================================

V = 40


def _logits_target(dtype: torch.dtype = torch.float32, rows: int = 12) -> tuple[torch.Tensor, torch.Tensor]:
    target = torch.randint(0, V, (rows,), generator=torch.Generator().manual_seed(4))
    target[3], target[5] = 5, 7  # rows that ignore_index=5 or 7 leaves out
    return _t((rows, V), dtype, scale=2.0), target


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize(
    ("form", "constants"),
    [
        (lambda z, t: F.cross_entropy(z.float(), t), {}),
        (lambda z, t: F.cross_entropy(z.float(), t, reduction="sum"), {"reduction": "sum"}),
        (
            lambda z, t: F.cross_entropy(z.to(torch.float32), t, ignore_index=5, reduction="none"),
            {"reduction": "none", "ignore_index": 5},
        ),
        (lambda z, t: F.cross_entropy(z.float(), t, label_smoothing=0.1), {"label_smoothing": 0.1}),
        (lambda z, t: nn.CrossEntropyLoss(reduction="sum")(z.float(), t), {"reduction": "sum"}),
    ],
    ids=["default", "sum", "none-ignore", "smoothing", "module"],
)
def test_cross_entropy_forms(form, constants, dtype):
    z, t = _logits_target(dtype)
    expected = {"reduction": "mean", "ignore_index": -100, "label_smoothing": 0.0, **constants}
    bz, bt = _matched(form, (z, t), "cross_entropy", expected, (ARG0, ARG1))
    assert bz is z and bt is t


def test_cross_entropy_of_fp32_logits_without_upcast():
    z, t = _logits_target()
    _matched(lambda z, t: F.cross_entropy(z, t), (z, t), "cross_entropy",
             {"reduction": "mean", "ignore_index": -100, "label_smoothing": 0.0}, (ARG0, ARG1))  # fmt: skip
    loss = nn.CrossEntropyLoss(ignore_index=7, label_smoothing=0.05)
    _matched(loss, (z, t), "cross_entropy", {"reduction": "mean", "ignore_index": 7, "label_smoothing": 0.05})


def test_cross_entropy_refusals():
    z, t = _logits_target()
    zb, _ = _logits_target(torch.bfloat16)
    _refused(lambda z, t: F.cross_entropy(z, t), (zb, t), reason="logits in torch.bfloat16")
    _refused(lambda z, t: F.cross_entropy(z.double(), t), (z, t), reason="casts the logits to torch.float64")
    _refused(lambda z, t, w: F.cross_entropy(z, t, weight=w), (z, t, torch.rand(V)), reason="class weights")
    _refused(nn.CrossEntropyLoss(weight=torch.rand(V)), (z, t), reason="class weights")
    probs = torch.softmax(_t((12, V), seed=9), -1)
    _refused(lambda z, p: F.cross_entropy(z, p), (z, probs), reason="class probabilities")
    z3, t3 = _t((2, V, 3)), torch.randint(0, V, (2, 3))
    _refused(lambda z, t: F.cross_entropy(z, t), (z3, t3), reason="logits are 3-D")
    _refused(lambda z, t: F.cross_entropy(z, t) * 2, (z, t), reason="after the cross-entropy")
    _refused(lambda z, t: F.cross_entropy(z.float(), t).to(z.dtype), (zb, t), reason="after the cross-entropy")
    _refused(lambda z, t: F.cross_entropy(z, t), (z, t.to(torch.uint8)), reason="targets are torch.uint8")
    with pytest.warns(UserWarning, match="deprecated"):
        _refused(lambda z, t: F.cross_entropy(z, t, reduce=False), (z, t), reason="legacy reduce")


# =============================================================================================
# End to end, through the decorator (database-only mode: recognized, checked, not tuned)
# =============================================================================================


def _e2e_cases() -> list:
    x = _t((4, N), scale=2.0)
    w, b = 1 + _t((N,), seed=1, scale=0.1), _t((N,), seed=2, scale=0.1)
    z, t = _logits_target(torch.bfloat16)
    return [
        pytest.param(ln_explicit_var, (x, w, b), "layernorm", id="layernorm"),
        pytest.param(gelu_erf, (x,), "gelu", id="gelu"),
        pytest.param(gelu_tanh_hf_fast, (x,), "gelu_tanh", id="gelu_tanh"),
        pytest.param(swiglu_sigmoid, (x, w.expand(4, N).contiguous()), "swiglu", id="swiglu"),
        pytest.param(geglu_chunk, (_t((4, 2 * N)),), "geglu", id="geglu"),
        pytest.param(lambda x: torch.sum(x, dim=-1), (x,), "sum", id="sum"),
        pytest.param(lambda x: x.sum(-1) / x.shape[-1], (x,), "mean", id="mean"),
        pytest.param(lambda x: x.max(-1).values, (x,), "max", id="max"),
        pytest.param(
            lambda z, t: F.cross_entropy(z.float(), t, label_smoothing=0.1), (z, t), "cross_entropy", id="cross_entropy"
        ),
    ]


@pytest.mark.parametrize(("fn", "args", "op"), _e2e_cases())
def test_decorator_recognizes_and_checks_the_op(fn, args, op, tmp_path):
    _end_to_end(fn, args, op, tmp_path)

"""The recognizer tells RMSNorm and last-dim softmax apart from look-alikes, by structure.

Each positive case checks the op, the constants (eps exactly), that ``bind`` returns the
right tensors (by identity for external weights), and that the function's own output equals
the op computed in float64 on the bound inputs (so the match is not a coincidence of names).
Each negative case checks that nothing matched and that the reason names the problem.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from kernelsmith.frontends import capture as capture_module
from kernelsmith.frontends.capture import Kind, capture
from kernelsmith.frontends.patterns import PATTERNS
from kernelsmith.frontends.recognize import InputRef, Match, MatchDoesNotApply, Recognition, recognize
from kernelsmith.ops import op_names

EPS = 1e-6
N = 64

# ---------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------


def _x(shape: tuple[int, ...] = (8, N), dtype: torch.dtype = torch.float32, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g).to(dtype)


def _w(n: int = N, dtype: torch.dtype = torch.float32, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (1 + 0.1 * torch.randn(n, generator=g)).to(dtype)


def _rmsnorm64(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    xd = x.double()
    return xd * torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + eps) * w.double()


def _tol(dtype: torch.dtype) -> float:
    return {torch.float32: 1e-5, torch.bfloat16: 3e-2, torch.float16: 3e-3}[dtype]


def _assert_computes(rec: Recognition, args: tuple, kwargs: dict | None = None) -> tuple[torch.Tensor, ...]:
    """The match's op on the bound inputs is what the function returned."""
    kwargs = kwargs or {}
    assert rec.match is not None, rec.reason
    assert rec.reason == ""
    inputs = rec.match.bind(args, kwargs)
    if rec.match.op == "rmsnorm":
        x, w = inputs
        assert w.dim() == 1 and w.shape[0] == x.shape[-1]
        expected = _rmsnorm64(x, w, rec.match.constants["eps"])
    else:
        assert rec.match.constants == {"dim": -1}
        (x,) = inputs
        expected = torch.softmax(x.double(), dim=-1)
    out = rec.output
    assert isinstance(out, torch.Tensor) and out.dtype == x.dtype and out.shape == x.shape
    torch.testing.assert_close(out.double(), expected, rtol=_tol(x.dtype), atol=_tol(x.dtype))
    return inputs


def _refused(fn, args: tuple, kwargs: dict | None = None, *, reason: str) -> Recognition:
    rec = recognize(fn, args, kwargs or {})
    assert rec.match is None, f"unexpectedly matched {rec.match}"
    assert reason.lower() in rec.reason.lower(), rec.reason
    return rec


# ---------------------------------------------------------------------------------------------
# RMSNorm: the ways people write it
# ---------------------------------------------------------------------------------------------


def rms_hf_function(x, w):
    input_dtype = x.dtype
    hidden = x.to(torch.float32)
    variance = hidden.pow(2).mean(-1, keepdim=True)
    hidden = hidden * torch.rsqrt(variance + EPS)
    return w * hidden.to(input_dtype)


def rms_plain(x, w):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * w


def rms_div_sqrt(x, w):
    return x / torch.sqrt(torch.mean(x**2, dim=-1, keepdim=True) + EPS) * w


def rms_weight_first(x, w):
    return w * (x * (x * x).mean(-1, keepdim=True).add(EPS).rsqrt())


def rms_pow_minus_half(x, w):
    return x * (torch.square(x).mean(-1, keepdim=True) + EPS) ** -0.5 * w


def rms_div_pow_half(x, w):
    return x / (x.pow(2).mean(dim=x.ndim - 1, keepdim=True) + EPS) ** 0.5 * w


def rms_one_over_sqrt(x, w):
    return x * (1 / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + EPS)) * w


def rms_sqrt_reciprocal(x, w):
    return torch.mul(torch.mul(x, torch.sqrt(torch.pow(x, 2).mean(-1, True) + EPS).reciprocal()), w)


def rms_sum_over_n(x, w):
    return x * torch.rsqrt(x.pow(2).sum(-1, keepdim=True) / x.shape[-1] + EPS) * w


def rms_eps_first(x, w):
    return w * x * torch.rsqrt(EPS + x.pow(2).mean(-1, keepdim=True))


def rms_t5_style(x, w):
    # Older HF / T5: the square in float32, the product with the raw x (promoted to float32).
    variance = x.to(torch.float32).pow(2).mean(-1, keepdim=True)
    x = x * torch.rsqrt(variance + EPS)
    if w.dtype in (torch.float16, torch.bfloat16):
        x = x.to(w.dtype)
    return w * x


def rms_cast_after_weight(x, w):
    xf = x.float()
    return (w * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS))).to(x.dtype)


def _meta_norm(x):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS)


def rms_meta_llama(x, w):
    # Meta's reference Llama: output = self._norm(x.float()).type_as(x); return output * self.weight
    output = _meta_norm(x.float()).type_as(x)
    return output * w


def rms_functional_then_weight(x, w):
    return F.rms_norm(x, (x.shape[-1],), eps=EPS) * w


def rms_functional(x, w):
    return F.rms_norm(x, (x.shape[-1],), w, EPS)


def rms_functional_kwargs(x, w):
    return F.rms_norm(x, [x.shape[-1]], weight=w, eps=EPS)


def rms_torch_namespace(x, w):
    return torch.rms_norm(x, (x.shape[-1],), w, EPS)


RMS_FORMS = [
    rms_hf_function,
    rms_plain,
    rms_div_sqrt,
    rms_weight_first,
    rms_pow_minus_half,
    rms_div_pow_half,
    rms_one_over_sqrt,
    rms_sqrt_reciprocal,
    rms_sum_over_n,
    rms_eps_first,
    rms_t5_style,
    rms_cast_after_weight,
    rms_meta_llama,
    rms_functional_then_weight,
    rms_functional,
    rms_functional_kwargs,
    rms_torch_namespace,
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("shape", [(8, N), (2, 3, N)], ids=["2d", "3d"])
@pytest.mark.parametrize("form", RMS_FORMS, ids=lambda f: f.__name__)
def test_rmsnorm_forms_are_recognized(form, shape, dtype):
    x, w = _x(shape, dtype), _w(dtype=dtype)
    rec = recognize(form, (x, w), {})
    assert rec.match is not None, rec.reason
    assert rec.match.op == "rmsnorm"
    assert rec.match.constants == {"eps": EPS}
    assert rec.match.inputs == (InputRef("arg", index=0), InputRef("arg", index=1))
    bx, bw = _assert_computes(rec, (x, w))
    assert bx is x and bw is w


class LlamaRMSNorm(nn.Module):
    """Hugging Face's LlamaRMSNorm, written out as in transformers."""

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


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("as_module", [False, True], ids=["forward", "module"])
def test_llama_rmsnorm_module_forward(dtype, as_module):
    module = LlamaRMSNorm(N, eps=1e-5).to(dtype)
    with torch.no_grad():
        module.weight.copy_(_w(dtype=dtype))
    x = _x((2, 5, N), dtype)
    rec = recognize(module if as_module else module.forward, (x,), {})
    assert rec.match is not None and rec.match.op == "rmsnorm", rec.reason
    assert rec.match.constants["eps"] == 1e-5
    assert rec.match.inputs[0] == InputRef("arg", index=0)
    assert rec.match.inputs[1].kind == "external" and rec.match.inputs[1].tensor is module.weight
    bx, bw = _assert_computes(rec, (x,))
    assert bx is x and bw is module.weight


def test_class_level_forward_with_self_as_an_argument():
    """A forward decorated on the class gets self as argument 0: the weight is reached from it."""
    a, b = LlamaRMSNorm(N), LlamaRMSNorm(N)
    x = _x()
    rec = recognize(LlamaRMSNorm.forward, (a, x), {})
    assert rec.match is not None and rec.match.op == "rmsnorm", rec.reason
    assert rec.match.inputs[0] == InputRef("arg", index=1)
    assert rec.match.bind((a, x), {})[1] is a.weight
    # Another instance is another weight: the match does not carry over.
    assert not rec.match.applies_to((b, x), {})
    with pytest.raises(MatchDoesNotApply):
        rec.match.bind((b, x), {})


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("eps", [None, 1e-5], ids=["default-eps", "eps"])
def test_torch_nn_rmsnorm_module(dtype, eps):
    norm = nn.RMSNorm(N, eps=eps, dtype=dtype)
    with torch.no_grad():
        norm.weight.copy_(_w(dtype=dtype))

    def f(x):
        return norm(x)

    x = _x((3, 4, N), dtype)
    rec = recognize(f, (x,), {})
    assert rec.match is not None and rec.match.op == "rmsnorm", rec.reason
    # torch's eps=None is the opmath type's epsilon: float32's for bf16/fp16/fp32 inputs.
    assert rec.match.constants["eps"] == (torch.finfo(torch.float32).eps if eps is None else eps)
    assert rec.match.inputs[1].tensor is norm.weight
    torch.testing.assert_close(rec.output, F.rms_norm(x, (N,), norm.weight, eps))
    _assert_computes(rec, (x,))


def test_default_eps_is_what_torch_computes():
    """eps=None really is finfo(float32).eps for bfloat16 (finfo(bfloat16).eps would differ)."""
    x = _x(dtype=torch.bfloat16) * 0.01  # small rows, so that eps matters
    w = torch.ones(N, dtype=torch.bfloat16)
    rec = recognize(lambda x, w: F.rms_norm(x, (N,), w), (x, w), {})
    assert rec.match is not None
    eps = rec.match.constants["eps"]
    assert eps == torch.finfo(torch.float32).eps
    xf = x.float()
    ours = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)
    torch.testing.assert_close(rec.output, ours)


def test_closure_weight_is_external_and_bound_by_identity():
    w = _w()

    def make():
        def f(x):
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * w

        return f

    f = make()
    x = _x()
    rec = recognize(f, (x,), {})
    assert rec.match is not None, rec.reason
    assert rec.match.constants == {"eps": 1e-5}
    ref = rec.match.inputs[1]
    assert ref.kind == "external" and ref.tensor is w
    x2 = _x(seed=5)
    bx, bw = rec.match.bind((x2,), {})
    assert bx is x2 and bw is w


GLOBAL_WEIGHT = _w()


def _helper_norm(x):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * GLOBAL_WEIGHT


def rms_via_helper(x):
    return _helper_norm(x)


def test_global_weight_used_by_a_helper_function():
    rec = recognize(rms_via_helper, (_x(),), {})
    assert rec.match is not None, rec.reason
    assert rec.match.inputs[1].tensor is GLOBAL_WEIGHT
    _assert_computes(rec, (_x(),))


def test_rebinding_an_external_weight_invalidates_the_match():
    module = LlamaRMSNorm(N)
    x = _x()
    rec = recognize(module, (x,), {})
    assert rec.match is not None and rec.match.applies_to((x,), {})
    module.weight = nn.Parameter(torch.full((N,), 2.0))
    assert not rec.match.applies_to((x,), {})
    with pytest.raises(MatchDoesNotApply, match="different tensor"):
        rec.match.bind((x,), {})


def test_weight_as_keyword_argument():
    x, w = _x(), _w()
    rec = recognize(rms_plain, (x,), {"w": w})
    assert rec.match is not None, rec.reason
    assert rec.match.inputs == (InputRef("arg", index=0), InputRef("kwarg", name="w"))
    bx, bw = _assert_computes(rec, (x,), {"w": w})
    assert bx is x and bw is w


def test_row_broadcast_weight_is_reshaped_to_the_op_weight():
    x, w = _x(), _w().reshape(1, N)
    rec = recognize(rms_plain, (x, w), {})
    assert rec.match is not None, rec.reason
    assert rec.match.inputs[1].reshape == (N,)
    _, bw = _assert_computes(rec, (x, w))
    assert bw.shape == (N,) and bw.data_ptr() == w.data_ptr()


def test_formula_without_eps_is_rmsnorm_with_eps_zero():
    rec = recognize(lambda x, w: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True)) * w, (_x(), _w()), {})
    assert rec.match is not None and rec.match.constants == {"eps": 0.0}, rec.reason


def test_tensor_eps_made_inside_the_function():
    def f(x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + torch.tensor(1e-5)) * w

    rec = recognize(f, (_x(), _w()), {})
    assert rec.match is not None and rec.match.constants == {"eps": 1e-5}, rec.reason


def test_eps_argument_is_pinned_by_the_signature():
    def f(x, w, eps=1e-6):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w

    x, w = _x(), _w()
    rec = recognize(f, (x, w, 1e-5), {})
    assert rec.match is not None and rec.match.constants == {"eps": 1e-5}
    assert rec.match.applies_to((x, w, 1e-5), {})
    assert not rec.match.applies_to((x, w, 1e-3), {})  # another eps: recognize again
    assert not rec.match.applies_to((x, w), {})  # the default: another signature


def test_bind_rejects_a_call_with_other_shapes():
    x, w = _x(), _w()
    rec = recognize(rms_plain, (x, w), {})
    assert rec.match is not None
    with pytest.raises(MatchDoesNotApply, match="argument 0"):
        rec.match.bind((_x((4, N)), w), {})
    assert rec.match.bind((_x((4, N)), w), {}, check=False)[0].shape == (4, N)


# ---------------------------------------------------------------------------------------------
# RMSNorm: look-alikes that are not the op
# ---------------------------------------------------------------------------------------------


def test_weight_on_the_wrong_axis_is_refused():
    x = _x()
    _refused(rms_plain, (x, _w(8).reshape(8, 1)), reason="does not scale the last axis")


def test_weight_with_more_dims_than_x_is_refused():
    x = _x((N,))
    _refused(rms_plain, (x, _w().reshape(1, N)), reason="does not scale the last axis")


def test_mean_over_dim_0_is_refused():
    def f(x, w):
        return x * torch.rsqrt(x.pow(2).mean(0, keepdim=True) + EPS) * w

    _refused(f, (_x((N, N)), _w()), reason="not the last dim")


def test_mean_without_keepdim_then_unsqueeze_is_refused():
    """Views are not followed: mean(-1).unsqueeze(-1) is refused (the kernel path is safe, not
    all-knowing; the user's function runs unchanged)."""

    def f(x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1).unsqueeze(-1) + EPS) * w

    _refused(f, (_x(), _w()), reason="not of mean(x*x, -1, keepdim=True)")


def test_extra_computation_after_rmsnorm_is_refused():
    _refused(lambda x, w: rms_plain(x, w) + 1, (_x(), _w()), reason="after the normalization")
    _refused(lambda x, w: rms_plain(x, w) * 2.0, (_x(), _w()), reason="other than x, 1/rms and the weight: ['2.0']")


def test_extra_computation_on_the_side_is_refused():
    def f(x, w):
        torch.randn(3)  # advances the RNG: not something a kernel may drop
        return rms_plain(x, w)

    _refused(f, (_x(), _w()), reason="also computes")


def test_x_computed_inside_the_function_is_refused():
    _refused(lambda x, w: rms_plain(x + 1, w), (_x(), _w()), reason="not an input tensor")


def test_rmsnorm_returning_two_outputs_is_refused():
    def f(x, w):
        rstd = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS)
        return x * rstd * w, rstd

    _refused(f, (_x(), _w()), reason="returns 2 values")


def test_in_place_mutation_of_the_input_is_refused():
    def f(x, w):
        x.mul_(torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS))
        return x * w

    x = _x()
    _refused(f, (x, _w()), reason="mutates a tensor in place")


def test_setitem_and_out_are_mutations():
    def setitem(x, w):
        y = rms_plain(x, w)
        y[0] = 0
        return y

    def out(x, w):
        y = torch.empty_like(x)
        torch.mul(x, torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS), out=y)
        return y * w

    _refused(setitem, (_x(), _w()), reason="mutates")
    _refused(out, (_x(), _w()), reason="mutates")


def test_output_cast_to_another_dtype_is_refused():
    x, w = _x(dtype=torch.bfloat16), _w(dtype=torch.bfloat16)
    _refused(lambda x, w: rms_hf_function(x, w).float(), (x, w), reason="casts the normalized value to torch.float32")
    # The HF formula without the cast back returns float32 for a bfloat16 x.
    _refused(
        lambda x, w: x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + EPS) * w,
        (x, w),
        reason="the output is torch.float32",
    )


def test_cast_of_the_weight_is_refused():
    # weight.float() is the kernels' own math (tests/test_recognize_hf_formulations.py); a
    # downcast of the weight rounds it, which they never do.
    def f(x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * w.to(torch.bfloat16)

    _refused(f, (_x(), _w()), reason="casts the weight")


def test_upcast_to_float64_is_refused():
    def f(x, w):
        xd = x.double()
        return (xd * torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + EPS)).to(x.dtype) * w

    _refused(f, (_x(), _w()), reason="float32")


def test_square_of_another_tensor_is_refused():
    def f(x, y, w):
        return y * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * w

    _refused(f, (_x(), _x(seed=3), _w()), reason="not the one whose mean square is taken")


def test_weight_offset_other_than_gemmas_is_refused():
    # Gemma's 1 + weight is tested in tests/test_recognize_hf_formulations.py.
    def f(x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * (2.0 + w)

    _refused(f, (_x(), _w()), reason="only Gemma's 1 + weight")


def test_rmsnorm_without_weight_is_refused():
    norm = nn.RMSNorm(N, elementwise_affine=False)
    _refused(norm, (_x(),), reason="no weight")
    _refused(lambda x: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS), (_x(),), reason="no weight")


def test_rms_norm_with_weight_times_another_weight_is_refused():
    x, w = _x(), _w()
    _refused(lambda x, w: F.rms_norm(x, (N,), w, EPS) * w, (x, w), reason="already has a weight")


def test_rms_norm_over_two_dims_is_refused():
    x = _x((4, 8, N))
    _refused(lambda x, w: F.rms_norm(x, (8, N), w), (x, torch.ones(8, N)), reason="normalized_shape")


def test_external_tensor_eps_is_refused():
    eps = torch.tensor(1e-6)

    def f(x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w

    _refused(f, (_x(), _w()), reason="not a Python number")


def test_weight_made_inside_the_function_is_refused():
    def f(x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * torch.ones(x.shape[-1])

    _refused(f, (_x(),), reason="factors other than x, 1/rms and the weight: ['torch.ones']")


def test_weight_of_unknown_origin_is_refused():
    """A tensor made by code the capture cannot see must not be held and replayed."""

    def f(x):
        w = torch.from_numpy(np.ones(N, dtype=np.float32))
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * w

    _refused(f, (_x(),), reason="capture cannot see")


def test_weight_inside_a_container_argument_is_refused():
    def f(x, params):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * params[0]

    _refused(f, (_x(), [_w()]), reason="container argument")


def test_reading_values_into_python_is_refused():
    def f(x, w):
        if x.abs().max() > 100:  # data-dependent control flow: one capture says nothing
            return x
        return rms_plain(x, w)

    _refused(f, (_x(), _w()), reason="reads tensor values")


# ---------------------------------------------------------------------------------------------
# Softmax
# ---------------------------------------------------------------------------------------------


def sm_torch(x):
    return torch.softmax(x, -1)


def sm_functional(x):
    return F.softmax(x, dim=-1)


def sm_method(x):
    return x.softmax(-1)


def sm_ndim_minus_one(x):
    return torch.nn.functional.softmax(x, dim=x.ndim - 1)


def sm_special(x):
    return torch.special.softmax(x, dim=-1)


def sm_explicit_amax(x):
    e = torch.exp(x - x.amax(-1, keepdim=True))
    return e / e.sum(-1, keepdim=True)


def sm_explicit_max_values(x):
    e = (x - x.max(-1, keepdim=True).values).exp()
    return e / e.sum(dim=-1, keepdim=True)


def sm_explicit_max_index0(x):
    e = torch.exp(x - torch.max(x, dim=-1, keepdim=True)[0])
    return e / torch.sum(e, dim=-1, keepdim=True)


def sm_explicit_reciprocal(x):
    e = torch.exp(x - x.amax(-1, keepdim=True))
    return e * e.sum(-1, keepdim=True).reciprocal()


def sm_without_max(x):
    # exp(x) / sum(exp(x)) is the same function as softmax (shift invariance); the kernel
    # subtracts the max anyway, so it is only more robust than this.
    e = torch.exp(x)
    return e / e.sum(-1, keepdim=True)


def sm_hf_attention(x):
    return F.softmax(x, dim=-1, dtype=torch.float32).to(x.dtype)


def sm_upcast_explicit(x):
    xf = x.float()
    e = torch.exp(xf - xf.amax(-1, keepdim=True))
    return (e / e.sum(-1, keepdim=True)).to(x.dtype)


SOFTMAX_MODULE = nn.Softmax(dim=-1)


def sm_module(x):
    return SOFTMAX_MODULE(x)


SM_FORMS = [
    sm_torch,
    sm_functional,
    sm_method,
    sm_ndim_minus_one,
    sm_special,
    sm_explicit_amax,
    sm_explicit_max_values,
    sm_explicit_max_index0,
    sm_explicit_reciprocal,
    sm_without_max,
    sm_hf_attention,
    sm_upcast_explicit,
    sm_module,
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("shape", [(8, N), (2, 3, N)], ids=["2d", "3d"])
@pytest.mark.parametrize("form", SM_FORMS, ids=lambda f: f.__name__)
def test_softmax_forms_are_recognized(form, shape, dtype):
    x = _x(shape, dtype)
    rec = recognize(form, (x,), {})
    assert rec.match is not None, rec.reason
    assert rec.match.op == "softmax"
    assert rec.match.constants == {"dim": -1}
    assert rec.match.inputs == (InputRef("arg", index=0),)
    (bx,) = _assert_computes(rec, (x,))
    assert bx is x


def test_softmax_positive_dim_of_3d_tensor():
    x = _x((2, 3, N))
    rec = recognize(lambda x: torch.softmax(x, dim=2), (x,), {})
    assert rec.match is not None and rec.match.constants == {"dim": -1}, rec.reason


def test_softmax_over_dim_0_is_refused():
    _refused(lambda x: torch.softmax(x, 0), (_x(),), reason="dim 0")
    _refused(lambda x: F.softmax(x, dim=1), (_x((2, 3, N)),), reason="dim 1")
    _refused(nn.Softmax(dim=0), (_x(),), reason="dim 0")


def test_explicit_softmax_over_another_dim_is_refused():
    def f(x):
        e = torch.exp(x - x.amax(0, keepdim=True))
        return e / e.sum(0, keepdim=True)

    _refused(f, (_x(),), reason="not the last dim")


def test_max_without_keepdim_is_refused():
    def f(x):
        e = torch.exp(x - x.amax(-1).unsqueeze(-1))
        return e / e.sum(-1, keepdim=True)

    _refused(f, (_x(),), reason="subtracts something other than the row max")


def test_log_softmax_is_refused():
    _refused(lambda x: F.log_softmax(x, dim=-1), (_x(),), reason="log_softmax")
    _refused(lambda x: x.log_softmax(-1), (_x(),), reason="log_softmax")


def test_softmax_returning_float32_for_bf16_input_is_refused():
    x = _x(dtype=torch.bfloat16)
    _refused(lambda x: torch.softmax(x, -1, dtype=torch.float32), (x,), reason="the output is torch.float32")
    _refused(lambda x: torch.softmax(x.float(), -1), (x,), reason="the output is torch.float32")


def test_softmax_in_lower_precision_is_refused():
    x = _x()
    _refused(lambda x: torch.softmax(x, -1, dtype=torch.bfloat16).float(), (x,), reason="less precise")


def test_extra_computation_after_softmax_is_refused():
    _refused(lambda x: torch.softmax(x, -1) * 2, (_x(),), reason="after the softmax")
    _refused(lambda x: torch.softmax(x, -1) + x, (_x(),), reason="after the softmax")


def test_softmax_of_a_computed_value_is_refused():
    _refused(lambda x: torch.softmax(x.exp(), -1), (_x(),), reason="not an input tensor")
    # A constant scale (a temperature) is not a computed value: the family's scale constant.
    rec = recognize(lambda x: torch.softmax(x * 0.125, -1), (_x(),), {})
    assert rec.match is not None and rec.match.constants == {"dim": -1, "scale": 0.125}, rec.reason


def test_softmax_with_two_outputs_is_refused():
    _refused(lambda x: (torch.softmax(x, -1), x.amax(-1)), (_x(),), reason="returns 2 values")


def test_softmax_mutating_its_input_is_refused():
    def f(x):
        x.sub_(x.amax(-1, keepdim=True))
        e = x.exp()
        return e / e.sum(-1, keepdim=True)

    _refused(f, (_x(),), reason="mutates a tensor in place")


def test_division_by_another_sum_is_refused():
    def f(x):
        e = torch.exp(x)
        return e / x.sum(-1, keepdim=True)

    _refused(f, (_x(),), reason="its own sum")


# ---------------------------------------------------------------------------------------------
# The contract of recognize()
# ---------------------------------------------------------------------------------------------


def test_user_exception_propagates_unchanged():
    boom = RuntimeError("the user's own error")

    def f(x):
        torch.softmax(x, -1)
        raise boom

    with pytest.raises(RuntimeError) as info:
        recognize(f, (_x(),), {})
    assert info.value is boom


def test_function_runs_exactly_once_and_its_output_is_returned():
    calls = []

    def f(x):
        calls.append(1)
        return torch.softmax(x, -1)

    x = _x()
    rec = recognize(f, (x,), {})
    assert len(calls) == 1
    assert rec.match is not None
    torch.testing.assert_close(rec.output, torch.softmax(x, -1))


def test_non_tensor_output_is_refused_but_returned():
    rec = _refused(lambda x: float(torch.softmax(x, -1).sum()), (_x(),), reason="reads tensor values")
    assert isinstance(rec.output, float)
    rec = _refused(lambda x: "not a tensor", (_x(),), reason="returns a str")
    assert rec.output == "not a tensor"


def test_identity_function_is_not_an_op():
    x = _x()
    rec = _refused(lambda x: x, (x,), reason="without computing it")
    assert rec.output is x


def test_unrelated_function_gives_a_reason():
    rec = _refused(lambda x: x.relu(), (_x(),), reason="no registered pattern")
    assert "relu" in rec.reason


def test_capture_errors_never_raise(monkeypatch: pytest.MonkeyPatch):
    def broken(self, *args, **kwargs):
        raise KeyError("recorder bug")

    monkeypatch.setattr(capture_module.Recorder, "record", broken)
    x = _x()
    rec = recognize(sm_torch, (x,), {})
    assert rec.match is None and "internal capture error" in rec.reason
    torch.testing.assert_close(rec.output, torch.softmax(x, -1))


def test_capture_setup_errors_never_raise(monkeypatch: pytest.MonkeyPatch):
    def broken(*args, **kwargs):
        raise RuntimeError("walk bug")

    monkeypatch.setattr(capture_module, "reachable_tensors", broken)
    x = _x()
    rec = recognize(sm_torch, (x,), {})
    assert rec.match is None and "set-up failed" in rec.reason
    torch.testing.assert_close(rec.output, torch.softmax(x, -1))


def test_partial_and_lambda_callables():
    w = _w()
    f = functools.partial(rms_plain, w=w)
    rec = recognize(f, (_x(),), {})
    assert rec.match is not None, rec.reason
    assert rec.match.inputs[1].kind == "external" and rec.match.inputs[1].tensor is w


def test_registry_names_the_op_families():
    assert {"rmsnorm", "softmax"} <= set(PATTERNS) <= set(op_names())  # every pattern names a registered family
    assert all(callable(p) for p in PATTERNS.values())


def test_capture_normalizes_the_usual_spellings():
    """x*x, x**2, pow(2), square are one SQUARE; 1/sqrt, **-0.5, sqrt().reciprocal() one RSQRT."""
    x = _x()
    for square in (lambda x: x * x, lambda x: x**2, lambda x: x.pow(2), lambda x: torch.square(x)):
        graph = capture(square, (x,), {})
        assert [n.kind for n in graph.nodes] == [Kind.SQUARE]
    for rsqrt in (
        lambda x: torch.rsqrt(x),
        lambda x: 1 / torch.sqrt(x),
        lambda x: x**-0.5,
        lambda x: torch.sqrt(x).reciprocal(),
    ):
        graph = capture(rsqrt, (x.abs(),), {})
        assert graph.producer(graph.output_value).kind is Kind.RSQRT  # type: ignore[union-attr]
    graph = capture(lambda x: x.to(torch.bfloat16), (x,), {})
    assert graph.nodes[0].kind is Kind.CAST and graph.nodes[0].params["dtype"] == torch.bfloat16
    graph = capture(lambda x: x.float(), (x,), {})  # already float32: no computation at all
    assert graph.nodes == [] and graph.output is x


def test_match_equality_and_bind_of_externals():
    w = _w()
    a = Match("rmsnorm", (InputRef("arg", index=0), InputRef("external", tensor=w)), {"eps": EPS})
    b = Match("rmsnorm", (InputRef("arg", index=0), InputRef("external", tensor=w)), {"eps": EPS})
    assert a == b
    assert a != Match("rmsnorm", (InputRef("arg", index=0), InputRef("external", tensor=_w())), {"eps": EPS})
    x = _x()
    bx, bw = a.bind((x,), {})
    assert bx is x and bw is w


def test_rebinding_a_global_weight_invalidates_the_match(monkeypatch: pytest.MonkeyPatch):
    import sys

    x = _x()
    rec = recognize(rms_via_helper, (x,), {})
    assert rec.match is not None and rec.match.applies_to((x,), {})
    monkeypatch.setattr(sys.modules[__name__], "GLOBAL_WEIGHT", _w(seed=9))
    assert not rec.match.applies_to((x,), {})


class _Holder:
    def scale(self) -> float:
        return 1.0


def test_non_tensor_arguments_are_pinned():
    """Python control flow on a non-tensor argument is invisible: such arguments must repeat."""

    def f(x, callback, flag=True):
        return torch.softmax(x, -1) if flag else x

    x, holder = _x(), _Holder()
    rec = recognize(f, (x, holder.scale), {"flag": True})
    assert rec.match is not None
    assert rec.match.applies_to((x, holder.scale), {"flag": True})  # a new bound method, same one
    assert not rec.match.applies_to((x, _Holder().scale), {"flag": True})
    assert not rec.match.applies_to((x, holder.scale), {"flag": False})
    assert not rec.match.applies_to((x, holder.scale), {"flag": 1})  # 1 is not True here
    assert not rec.match.applies_to((x, holder.scale), {})

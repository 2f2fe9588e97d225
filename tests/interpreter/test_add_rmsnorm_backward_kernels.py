"""Residual add + RMSNorm backward: specs, inputs, the references, the spaces, Gemma's weight
offset, and the kernels against an independent formula.

What the row-wise families share is tested once for all of them in test_rowwise_families.py.
The kernels run in the Triton interpreter here (tests/conftest.py), so shapes stay small.
"""

from __future__ import annotations

import pytest
import torch

from kernelsmith.evaluate.errors import check_close
from kernelsmith.ops import UnsupportedWorkload, get_op
from kernelsmith.ops.add_rmsnorm_backward import OP, AddRMSNormBackward
from kernelsmith.ops.rmsnorm_backward import OP as RMSNORM_BACKWARD
from kernelsmith.spec import OpSpec
from kernelsmith.testing.kernels import assert_guarded_outputs, launch_guarded

# The two schedules of a row in one program; split_row (rows of more than 8 KB, cut across
# programs) has its own file, test_rmsnorm_backward_split_row.py, and its space case here.
SCHEDULES = [v.name for v in OP.variants if v.name != "split_row"]


def formula_fp64(inputs: tuple[torch.Tensor, ...], eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The module docstring's formula in float64, written out (no autograd)."""
    dy, dh, h, w = (t.double() for t in inputs)
    n = h.shape[-1]
    r = 1 / torch.sqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    g = dy * w
    dsum = dh + r * g - h * (r**3 / n) * (g * h).sum(-1, keepdim=True)
    dw = (dy * h * r).reshape(-1, n).sum(0)
    return dsum, dw


def assert_correct(spec: OpSpec, inputs: tuple[torch.Tensor, ...], outs: list[torch.Tensor],
                   guards: list[torch.Tensor], what: str) -> None:
    assert_guarded_outputs(OP, spec, inputs, outs, guards, ("dsum", "dw"), what)


# ---- the kernels ----------------------------------------------------------------------------


@pytest.mark.parametrize("variant", SCHEDULES)
def test_kernels_match_an_independent_formula(variant: str, device: str) -> None:
    spec = OP.spec((9, 200), "float32", eps=1e-5)
    inputs = OP.make_inputs(spec, seed=4, distribution="outliers", device=device)
    dsum64, dw64 = formula_fp64(inputs, 1e-5)
    config = OP.variant(variant).space(spec).configs()[0]
    (dsum, dw), _ = launch_guarded(OP, variant, spec, config, inputs)
    assert dsum.dtype == torch.float32 and dsum.shape == (9, 200)
    assert dw.dtype == torch.float32 and dw.shape == (200,)
    assert torch.allclose(dsum.double(), dsum64, rtol=1e-4, atol=1e-5 * float(dsum64.abs().max()))
    assert torch.allclose(dw.double(), dw64, rtol=1e-4, atol=1e-5 * float(dw64.abs().max()))


def test_bfloat16_stores_round_to_nearest(device: str) -> None:
    # float32 arithmetic rounded once to nearest: almost every element is the float64 truth
    # correctly rounded (truncation, the interpreter's own conversion, would miss about half).
    spec = OP.spec((8, 256), "bfloat16")
    inputs = OP.make_inputs(spec, seed=5, device=device)
    truth = OP.reference_fp64(spec, inputs)[0].to(torch.bfloat16)
    for name in SCHEDULES:
        (dsum, _), _ = launch_guarded(OP, name, spec, OP.variant(name).space(spec).configs()[0], inputs)
        assert float((dsum == truth).double().mean()) > 0.95, name


# ---- references and tolerance -----------------------------------------------------------------


@pytest.mark.parametrize("dtype", ("float16", "bfloat16"))
def test_the_tolerance_covers_the_hf_rounding_and_catches_mistakes(dtype: str, device: str) -> None:
    spec = OP.spec((16, 256), dtype)
    inputs = OP.make_inputs(spec, seed=7, distribution="normal", device=device)
    dy, dh, h, w = inputs
    dsum64, dw64 = OP.reference_fp64(spec, inputs)
    lowp_dsum, lowp_dw = OP.reference(spec, inputs)
    # The HF forward's exact gradient (float64 everywhere but the rounding of h * r) differs from
    # the truth only in dw, by that rounding: the tolerance admits it.
    hd = h.double()
    r = torch.rsqrt(hd.pow(2).mean(-1, keepdim=True) + 1e-6)
    hf_dw = (dy.double() * (hd * r).to(h.dtype).double()).sum(0)
    assert not torch.equal(hf_dw, dw64)
    assert check_close(hf_dw.float(), dw64, lowp_dw, OP.tolerance) is None
    # The exact answer rounded once passes.
    assert check_close(dsum64.to(h.dtype), dsum64, lowp_dsum, OP.tolerance) is None
    assert check_close(dw64.float(), dw64, lowp_dw, OP.tolerance) is None
    # Forgetting dh, the norm's gradient, its r**3 term or the weight fails.
    norm_part = dsum64 - dh.double()
    for wrong in (norm_part, dh.double(), dh.double() + r * dy.double() * w.double(),
                  formula_fp64((dy, dh, h, torch.ones_like(w)), 1e-6)[0]):
        assert check_close(wrong.to(h.dtype), dsum64, lowp_dsum, OP.tolerance) is not None
    assert check_close((dy.double() * hd).sum(0).float(), dw64, lowp_dw, OP.tolerance) is not None


def test_references(device: str) -> None:
    spec = OP.spec((2, 3, 64), "bfloat16", eps=1e-5)
    inputs = OP.make_inputs(spec, seed=2, device=device)
    dsum, dw = OP.reference(spec, inputs)
    assert dsum.dtype == torch.bfloat16 and dsum.shape == (2, 3, 64)
    assert dw.dtype == torch.float32 and dw.shape == (64,)
    dsum64, dw64 = OP.reference_fp64(spec, inputs)
    assert dsum64.dtype == dw64.dtype == torch.float64
    fdsum, fdw = formula_fp64(inputs, 1e-5)
    assert torch.allclose(dsum64, fdsum, rtol=1e-9, atol=1e-12)
    assert torch.allclose(dw64, fdw, rtol=1e-9, atol=1e-12)
    with torch.no_grad():  # autograd is switched on inside
        assert torch.equal(OP.reference(spec, inputs)[1], dw)


def test_the_reference_is_rmsnorm_backward_plus_dh(device: str) -> None:
    spec = OP.spec((6, 96), "float16")
    dy, dh, h, w = OP.make_inputs(spec, seed=8, distribution="outliers", device=device)
    plain = RMSNORM_BACKWARD.spec((6, 96), "float16")
    dx64, dw64 = RMSNORM_BACKWARD.reference_fp64(plain, (dy, h, w))
    dsum64, dsum_dw64 = OP.reference_fp64(spec, (dy, dh, h, w))
    assert torch.allclose(dsum64, dx64 + dh.double(), rtol=1e-12, atol=1e-12)
    assert torch.equal(dsum_dw64, dw64)
    # In the input dtype, autograd rounds the norm's gradient and then its sum with dh.
    dx, dw = RMSNORM_BACKWARD.reference(plain, (dy, h, w))
    dsum, dsum_dw = OP.reference(spec, (dy, dh, h, w))
    assert torch.equal(dsum, dx + dh) and torch.equal(dsum_dw, dw)


def test_the_reference_is_the_gradient_of_x_and_of_residual(device: str) -> None:
    # Through the whole forward (h = x + residual, in float64): both gradients are dsum.
    spec = OP.spec((4, 32), "float32")
    dy, dh, h, w = (t.double() for t in OP.make_inputs(spec, seed=6, device=device))
    x = (h * 0.25).requires_grad_()
    residual = (h - h * 0.25).requires_grad_()
    hsum = x + residual
    y = w * (hsum * torch.rsqrt(hsum.pow(2).mean(-1, keepdim=True) + 1e-6))
    dx, dresidual = torch.autograd.grad((y, hsum), (x, residual), (dy, dh))
    dsum64, _ = OP.reference_fp64(spec, (dy, dh, hsum.detach(), w))
    assert torch.equal(dx, dresidual)
    assert torch.allclose(dx, dsum64, rtol=1e-12, atol=1e-12)


# ---- specs, inputs, spaces ----------------------------------------------------------------------


def test_specs() -> None:
    spec = OP.spec((8192, 4096), "bf16")
    dy, dh, h, w = spec.inputs
    assert dy.shape == dh.shape == h.shape == (8192, 4096) and w.shape == (4096,)
    assert spec.const("eps") == 1e-6
    dsum, dw = OP.output_specs(spec)
    assert dsum.shape == (8192, 4096) and dsum.dtype == "bfloat16"
    assert dw.shape == (4096,) and dw.dtype == "float32"
    assert OP.bytes_moved(spec) == 4 * 8192 * 4096 * 2 + 4096 * 2 + 4096 * 4
    t = torch.zeros(16, 128, dtype=torch.float16)
    assert OP.spec_for(t, t, t, torch.ones(128, dtype=torch.float16)) == OP.spec((16, 128), "fp16")
    assert OP.spec((5,), "float32").inputs[2].shape == (5,)
    assert isinstance(OP, AddRMSNormBackward) and OP.name == "add_rmsnorm_backward"
    assert get_op("add_rmsnorm_backward") is OP
    assert get_op("add_rmsnorm").backward == OP.name


@pytest.mark.parametrize(
    "make",
    [
        pytest.param(lambda: (torch.zeros(4, 8), torch.zeros(4, 8), torch.zeros(4, 8), torch.zeros(4)),
                     id="weight-size"),
        pytest.param(lambda: (torch.zeros(4, 9), torch.zeros(4, 8), torch.zeros(4, 8), torch.zeros(8)),
                     id="dy-shape"),
        pytest.param(lambda: (torch.zeros(4, 8), torch.zeros(5, 8), torch.zeros(4, 8), torch.zeros(8)),
                     id="dh-shape"),
        pytest.param(lambda: (torch.zeros(4, 8), torch.zeros(4, 8, dtype=torch.float16), torch.zeros(4, 8),
                              torch.zeros(8)), id="dh-dtype"),
        pytest.param(lambda: (torch.zeros(4, 8), torch.zeros(4, 8), torch.zeros(4, 8),
                              torch.zeros(8, dtype=torch.bfloat16)), id="weight-dtype"),
        pytest.param(lambda: (torch.zeros(4, 8, dtype=torch.int32),) * 3 + (torch.zeros(8, dtype=torch.int32),),
                     id="integers"),
        pytest.param(lambda: (torch.zeros(0, 8), torch.zeros(0, 8), torch.zeros(0, 8), torch.zeros(8)),
                     id="empty"),
        pytest.param(lambda: (torch.zeros(4, 8), torch.zeros(8, 4).t(), torch.zeros(4, 8), torch.zeros(8)),
                     id="transposed"),
        pytest.param(lambda: (torch.zeros(4, 8), torch.zeros(4, 8), torch.zeros(8)), id="three-inputs"),
        pytest.param(lambda: (torch.zeros(4, 8), torch.zeros(4, 8), torch.zeros(4, 8), torch.zeros(1, 8)),
                     id="2d-weight"),
    ],
)
def test_spec_for_rejects_what_the_kernels_cannot_do(make) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(UnsupportedWorkload):
        OP.spec_for(*make())


@pytest.mark.parametrize(
    "call",
    [
        pytest.param(lambda: OP.spec((0, 8), "float16"), id="zero-size"),
        pytest.param(lambda: OP.spec((), "float16"), id="no-shape"),
        pytest.param(lambda: OP.spec((4, 8), "float16", eps=-1.0), id="negative-eps"),
        pytest.param(lambda: OP.spec((4, 8), "float16", alpha=2), id="unknown-constant"),
        pytest.param(lambda: OP.spec((4, 8), "float64"), id="float64"),
    ],
)
def test_spec_rejects_bad_workloads(call) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(UnsupportedWorkload):
        call()


# ---- Gemma's weight offset: the gradient of rmsnorm(h) * (weight + weight_offset) --------------


@pytest.mark.parametrize("variant", SCHEDULES)
def test_weight_offset_reaches_every_variant(variant: str, device: str) -> None:
    """dsum scales dy by the weight the forward used (weight + 1); dw is unchanged in form. The
    kernels match the formula with that weight, and the same config without the offset does not."""
    spec = OP.spec((5, 37), "float32", weight_offset=1.0)
    dy, dh, h, w = inputs = OP.make_inputs(spec, seed=3, distribution="outliers", device=device)
    config = OP.variant(variant).space(spec).configs()[0]
    outs, guards = launch_guarded(OP, variant, spec, config, inputs)
    assert_correct(spec, inputs, outs, guards, f"{variant} offset 1")
    dsum64, dw64 = formula_fp64((dy, dh, h, w + 1.0), 1e-6)
    close = {"rtol": 1e-4, "atol": 1e-5 * float(dsum64.abs().max())}
    assert torch.allclose(outs[0].double(), dsum64, **close)
    assert torch.allclose(outs[1].double(), dw64, rtol=1e-4, atol=1e-5 * float(dw64.abs().max()))
    (plain, _), _ = launch_guarded(OP, variant, OP.spec((5, 37), "float32"), config, inputs)
    assert not torch.allclose(plain.double(), dsum64, **close)


def test_a_zero_weight_offset_is_no_offset() -> None:
    assert OP.spec((6, 100), "bfloat16", weight_offset=0.0) == OP.spec((6, 100), "bfloat16")

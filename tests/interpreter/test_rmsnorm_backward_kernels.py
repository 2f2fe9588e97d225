"""RMSNorm backward: specs, inputs, the references, the spaces, Gemma's weight offset, and the
kernels against an independent formula.

What the row-wise families share is tested once for all of them in test_rowwise_families.py.
The kernels run in the Triton interpreter here (tests/conftest.py), so shapes stay small.
"""

from __future__ import annotations

import pytest
import torch

from kernelsmith.evaluate.errors import check_close
from kernelsmith.ops import UnsupportedWorkload
from kernelsmith.ops.rmsnorm_backward import OP, RMSNormBackward
from kernelsmith.spec import OpSpec
from kernelsmith.testing.kernels import assert_guarded_outputs, launch_guarded

# The two schedules of a row in one program; split_row (rows of more than 8 KB, cut across
# programs) has its own file, test_rmsnorm_backward_split_row.py, and its space case here.
SCHEDULES = [v.name for v in OP.variants if v.name != "split_row"]


def formula_fp64(inputs: tuple[torch.Tensor, ...], eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The module docstring's formula in float64, written out (no autograd)."""
    dy, x, w = (t.double() for t in inputs)
    n = x.shape[-1]
    r = 1 / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    g = dy * w
    dx = r * g - x * (r**3 / n) * (g * x).sum(-1, keepdim=True)
    dw = (dy * x * r).reshape(-1, n).sum(0)
    return dx, dw


def assert_correct(spec: OpSpec, inputs: tuple[torch.Tensor, ...], outs: list[torch.Tensor],
                   guards: list[torch.Tensor], what: str) -> None:
    assert_guarded_outputs(OP, spec, inputs, outs, guards, ("dx", "dw"), what)


# ---- the kernels ----------------------------------------------------------------------------


@pytest.mark.parametrize("variant", SCHEDULES)
def test_kernels_match_an_independent_formula(variant: str, device: str) -> None:
    spec = OP.spec((9, 200), "float32", eps=1e-5)
    inputs = OP.make_inputs(spec, seed=4, distribution="outliers", device=device)
    dx64, dw64 = formula_fp64(inputs, 1e-5)
    config = OP.variant(variant).space(spec).configs()[0]
    (dx, dw), _ = launch_guarded(OP, variant, spec, config, inputs)
    assert dw.dtype == torch.float32 and dw.shape == (200,)
    assert torch.allclose(dx.double(), dx64, rtol=1e-4, atol=1e-5 * float(dx64.abs().max()))
    assert torch.allclose(dw.double(), dw64, rtol=1e-4, atol=1e-5 * float(dw64.abs().max()))


# ---- references and tolerance -----------------------------------------------------------------


@pytest.mark.parametrize("dtype", ("float16", "bfloat16"))
def test_the_tolerance_covers_the_hf_rounding_and_catches_mistakes(dtype: str, device: str) -> None:
    spec = OP.spec((16, 256), dtype)
    inputs = OP.make_inputs(spec, seed=7, distribution="outliers", device=device)
    dy, x, w = inputs
    dx64, dw64 = OP.reference_fp64(spec, inputs)
    lowp_dx, lowp_dw = OP.reference(spec, inputs)
    # The HF forward's exact gradient (float64 everywhere but the rounding of x * r) differs from
    # the truth only in dw, by that rounding: the tolerance admits it.
    xd = x.double()
    normed = (xd * torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype).double()
    hf_dw = (dy.double() * normed).sum(0)
    assert not torch.equal(hf_dw, dw64)
    assert check_close(hf_dw.float(), dw64, lowp_dw, OP.tolerance) is None
    # The exact answer rounded once passes; forgetting the r**3 term, the weight or r fails.
    assert check_close(dx64.to(x.dtype), dx64, lowp_dx, OP.tolerance) is None
    assert check_close(dw64.float(), dw64, lowp_dw, OP.tolerance) is None
    r = torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + 1e-6)
    assert check_close((r * dy.double() * w.double()).to(x.dtype), dx64, lowp_dx, OP.tolerance) is not None
    assert check_close(formula_fp64((dy, x, torch.ones_like(w)), 1e-6)[0].to(x.dtype), dx64, lowp_dx,
                       OP.tolerance) is not None
    assert check_close((dy.double() * xd).sum(0).float(), dw64, lowp_dw, OP.tolerance) is not None


def test_references(device: str) -> None:
    spec = OP.spec((2, 3, 64), "bfloat16", eps=1e-5)
    inputs = OP.make_inputs(spec, seed=2, device=device)
    dx, dw = OP.reference(spec, inputs)
    assert dx.dtype == torch.bfloat16 and dx.shape == (2, 3, 64)
    assert dw.dtype == torch.float32 and dw.shape == (64,)
    dx64, dw64 = OP.reference_fp64(spec, inputs)
    assert dx64.dtype == dw64.dtype == torch.float64
    fdx, fdw = formula_fp64(inputs, 1e-5)
    assert torch.allclose(dx64, fdx, rtol=1e-9, atol=1e-12)
    assert torch.allclose(dw64, fdw, rtol=1e-9, atol=1e-12)
    with torch.no_grad():  # autograd is switched on inside
        assert torch.equal(OP.reference(spec, inputs)[1], dw)


# ---- specs, inputs, spaces ----------------------------------------------------------------------


def test_specs() -> None:
    spec = OP.spec((8192, 4096), "bf16")
    dy, x, w = spec.inputs
    assert dy.shape == x.shape == (8192, 4096) and w.shape == (4096,)
    assert spec.const("eps") == 1e-6
    dx, dw = OP.output_specs(spec)
    assert dx.shape == (8192, 4096) and dx.dtype == "bfloat16"
    assert dw.shape == (4096,) and dw.dtype == "float32"
    assert OP.bytes_moved(spec) == 3 * 8192 * 4096 * 2 + 4096 * 2 + 4096 * 4
    t = torch.zeros(16, 128, dtype=torch.float16)
    assert OP.spec_for(t, t, torch.ones(128, dtype=torch.float16)) == OP.spec((16, 128), "fp16")
    assert isinstance(OP, RMSNormBackward) and OP.name == "rmsnorm_backward"


@pytest.mark.parametrize(
    "make",
    [
        pytest.param(lambda: (torch.zeros(4, 8), torch.zeros(4, 8), torch.zeros(4)), id="weight-size"),
        pytest.param(lambda: (torch.zeros(4, 9), torch.zeros(4, 8), torch.zeros(8)), id="dy-shape"),
        pytest.param(lambda: (torch.zeros(4, 8, dtype=torch.float16), torch.zeros(4, 8), torch.zeros(8)),
                     id="dtypes"),
        pytest.param(lambda: (torch.zeros(0, 8), torch.zeros(0, 8), torch.zeros(8)), id="empty"),
        pytest.param(lambda: (torch.zeros(8, 4).t(), torch.zeros(4, 8), torch.zeros(8)), id="transposed"),
        pytest.param(lambda: (torch.zeros(4, 8), torch.zeros(8)), id="two-inputs"),
    ],
)
def test_spec_for_rejects_what_the_kernels_cannot_do(make) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(UnsupportedWorkload):
        OP.spec_for(*make())


# ---- Gemma's weight offset: the forward scales by weight + weight_offset -----------------------

# (Each schedule with the offset against the reference, and without it: test_rowwise_families.py.)


@pytest.mark.parametrize("variant", SCHEDULES)
def test_weight_offset_kernels_match_the_formula_with_the_offset_weight(variant: str, device: str) -> None:
    spec = OP.spec((9, 200), "float32", eps=1e-5, weight_offset=1.0)
    dy, x, w = inputs = OP.make_inputs(spec, seed=4, distribution="outliers", device=device)
    dx64, dw64 = formula_fp64((dy, x, w.double() + 1.0), 1e-5)
    (dx, dw), _ = launch_guarded(OP, variant, spec, OP.variant(variant).space(spec).configs()[0], inputs)
    assert torch.allclose(dx.double(), dx64, rtol=1e-4, atol=1e-5 * float(dx64.abs().max()))
    assert torch.allclose(dw.double(), dw64, rtol=1e-4, atol=1e-5 * float(dw64.abs().max()))


def test_weight_offset_reference_is_autograd_through_gemmas_forward(device: str) -> None:
    spec = OP.spec((3, 64), "bfloat16", weight_offset=1.0)
    dy, x, w = inputs = OP.make_inputs(spec, seed=5, device=device)
    xg, wg = x.clone().requires_grad_(), w.clone().requires_grad_()
    xf = xg.float()
    gemma = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6) * (1.0 + wg.float())).type_as(xg)
    gemma.backward(dy)
    dx, dw = OP.reference(spec, inputs)
    assert torch.equal(dx, xg.grad) and torch.equal(dw, wg.grad.float())
    dx64, dw64 = OP.reference_fp64(spec, inputs)
    fdx, fdw = formula_fp64((dy, x, w.double() + 1.0), 1e-6)
    assert torch.allclose(dx64, fdx, rtol=1e-9, atol=1e-12) and torch.allclose(dw64, fdw, rtol=1e-9, atol=1e-12)


def test_weight_offset_specs() -> None:
    t, w = torch.zeros(16, 128, dtype=torch.float16), torch.ones(128, dtype=torch.float16)
    assert OP.spec((16, 128), "fp16", weight_offset=0.0) == OP.spec((16, 128), "fp16")  # hashes as before
    gemma = OP.spec((16, 128), "fp16", weight_offset=1.0)
    assert gemma.constants == {"eps": 1e-6, "weight_offset": 1.0}
    assert OP.spec_for(t, t, w, eps=1e-6, weight_offset=1.0) == gemma
    with pytest.raises(UnsupportedWorkload, match="weight_offset"):
        OP.spec_for(t, t, w, weight_offset=float("nan"))

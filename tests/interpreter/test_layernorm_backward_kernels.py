"""LayerNorm backward: specs, inputs, the references, the spaces, and the kernels against an
independent formula and the most accurate float32 result.

What the row-wise families share is tested once for all of them in test_rowwise_families.py.
The kernels run in the Triton interpreter here (tests/conftest.py), so shapes stay small.
"""

from __future__ import annotations

import math

import pytest
import torch

from kernelsmith.evaluate.errors import check_close, error_stats
from kernelsmith.ops import UnsupportedWorkload, get_op
from kernelsmith.ops.layernorm import AFFINE
from kernelsmith.ops.layernorm import OP as FORWARD
from kernelsmith.ops.layernorm_backward import OP, LayerNormBackward
from kernelsmith.spec import OpSpec
from kernelsmith.testing.kernels import assert_guarded_outputs, launch_guarded

VARIANTS = [v.name for v in OP.variants]
def formula(inputs: tuple[torch.Tensor, ...], eps: float, dtype: torch.dtype = torch.float64,
            exact_centring: bool = False) -> tuple[torch.Tensor, ...]:
    """The module docstring's formulas written out (no autograd), computed in ``dtype``.

    With ``exact_centring`` the centred values ``x - mean`` are computed in float64 and rounded
    once to ``dtype``: the most accurate a ``dtype`` computation can be (PyTorch's CUDA backward,
    whose mean happens to round well, is about that accurate). dx is returned in the inputs' dtype
    when ``dtype`` is float32, dw and db in float32."""
    dy, x, *params = (t.to(dtype) for t in inputs)
    n = x.shape[-1]
    if exact_centring:
        x64 = inputs[1].double()
        xc = (x64 - x64.mean(-1, keepdim=True)).to(dtype)
    else:
        xc = x - x.mean(-1, keepdim=True)
    rstd = torch.rsqrt(xc.pow(2).mean(-1, keepdim=True) + eps)
    xhat = xc * rstd
    g = dy * params[0] if params else dy
    dx = rstd * (g - g.mean(-1, keepdim=True) - xhat * (g * xhat).mean(-1, keepdim=True))
    grads = [dx if dtype == torch.float64 else dx.to(inputs[1].dtype)]
    if params:
        grads.append((dy * xhat).reshape(-1, n).sum(0))
    if len(params) > 1:
        grads.append(dy.reshape(-1, n).sum(0))
    return tuple(grads)


def assert_correct(spec: OpSpec, inputs: tuple[torch.Tensor, ...], outs: list[torch.Tensor],
                   guards: list[torch.Tensor], what: str) -> None:
    assert_guarded_outputs(OP, spec, inputs, outs, guards, ("dx", "dw", "db")[: len(outs)], what)


# ---- the kernels ----------------------------------------------------------------------------


@pytest.mark.parametrize("affine", AFFINE)
@pytest.mark.parametrize("variant", VARIANTS)
def test_kernels_match_an_independent_formula(variant: str, affine: str, device: str) -> None:
    spec = OP.spec((9, 200), "float32", eps=1e-5, affine=affine)
    inputs = OP.make_inputs(spec, seed=4, distribution="uniform", device=device)
    expected = formula(inputs, 1e-5)
    config = OP.variant(variant).space(spec).configs()[0]
    outs, _ = launch_guarded(OP, variant, spec, config, inputs)
    assert len(outs) == len(inputs) - 1  # dx, and a gradient per parameter
    for out, ref in zip(outs, expected, strict=True):
        assert out.dtype == torch.float32
        assert torch.allclose(out.double(), ref, rtol=1e-4, atol=1e-5 * float(ref.abs().max()))


@pytest.mark.parametrize("variant", VARIANTS)
def test_large_means_keep_float32_accuracy(variant: str, device: str) -> None:
    """On 'offset' rows (|mean| 100..400, std 1), and on a single row (where PyTorch's error can be
    luckily small), the kernels stay within the tolerance of the most accurate float32 result,
    not just of PyTorch's CPU backward (which is far less accurate there, see below)."""
    for rows, affine in ((1, "weight_bias"), (33, "weight_bias"), (33, "none")):
        spec = OP.spec((rows, 341), "float32", affine=affine)
        for distribution in ("offset", "normal"):
            inputs = OP.make_inputs(spec, seed=rows, distribution=distribution, device=device)
            best = formula(inputs, 1e-5, torch.float32, exact_centring=True)
            outs, _ = launch_guarded(OP, variant, spec, OP.variant(variant).space(spec).configs()[0], inputs)
            for out, ref64, lowp in zip(outs, OP.reference_fp64(spec, inputs), best, strict=True):
                problem = check_close(out, ref64, lowp, OP.tolerance)
                assert problem is None, f"{variant} {spec.describe()} {distribution}: {problem}"


@pytest.mark.parametrize("variant", VARIANTS)
def test_an_outlier_first_element_costs_no_accuracy(variant: str, device: str) -> None:
    """Rows whose first element is a spike (the 'spikes' stress data's case): the statistics are
    shifted by the mean of the first elements, as in the forward, not by the spike itself (which
    put every other element near -spike, with an ulp of 1e4 of rounding error each)."""
    spec = OP.spec((3, 1000), "float32", affine="none")
    for seed, spike in ((0, 3e4), (1, -2e4)):
        dy, x = OP.make_inputs(spec, seed=seed, device=device)
        x[:, 0] = spike
        inputs = (dy, x)
        best = formula(inputs, 1e-5, torch.float32, exact_centring=True)
        outs, _ = launch_guarded(OP, variant, spec, OP.variant(variant).space(spec).configs()[0], inputs)
        for out, ref64, lowp in zip(outs, OP.reference_fp64(spec, inputs), best, strict=True):
            problem = check_close(out, ref64, lowp, OP.tolerance)
            assert problem is None, f"{variant} seed {seed}: {problem}"


def test_the_accuracy_test_catches_sums_of_raw_x(device: str) -> None:
    # Forming the dx sums from raw x (sum(g * x) - mean * sum(g), as PyTorch's CPU backward does)
    # cancels on 'offset' rows and fails the test above; centring first passes it.
    spec = OP.spec((33, 341), "float32", affine="none")
    for distribution, raw_fails in (("offset", True), ("normal", False)):
        inputs = OP.make_inputs(spec, seed=1, distribution=distribution, device=device)
        dy, x = inputs
        mean = x.mean(-1, keepdim=True)
        rstd = torch.rsqrt((x - mean).pow(2).mean(-1, keepdim=True) + 1e-5)
        b = (dy.sum(-1, keepdim=True) * mean - (dy * x).sum(-1, keepdim=True)) * rstd**3 / 341
        raw = rstd * dy + b * x - b * mean - dy.sum(-1, keepdim=True) * rstd / 341
        (ref64,) = OP.reference_fp64(spec, inputs)
        (best,) = formula(inputs, 1e-5, torch.float32, exact_centring=True)
        assert (check_close(raw, ref64, best, OP.tolerance) is not None) == raw_fails, distribution


# ---- references and tolerance -----------------------------------------------------------------


@pytest.mark.parametrize("affine", AFFINE)
def test_references(affine: str, device: str) -> None:
    spec = OP.spec((2, 3, 64), "bfloat16", eps=1e-5, affine=affine)
    inputs = OP.make_inputs(spec, seed=2, device=device)
    grads = OP.reference(spec, inputs)
    assert len(grads) == len(inputs) - 1
    assert grads[0].dtype == torch.bfloat16 and grads[0].shape == (2, 3, 64)
    assert all(g.dtype == torch.float32 and g.shape == (64,) for g in grads[1:])
    grads64 = OP.reference_fp64(spec, inputs)
    for got, expected in zip(grads64, formula(inputs, 1e-5), strict=True):
        assert got.dtype == torch.float64
        assert torch.allclose(got, expected, rtol=1e-9, atol=1e-12)
    with torch.no_grad():  # autograd is switched on inside
        assert all(torch.equal(a, b) for a, b in zip(OP.reference(spec, inputs), grads, strict=True))


@pytest.mark.parametrize("dtype", ("float16", "bfloat16"))
def test_the_tolerance_catches_mistakes(dtype: str, device: str) -> None:
    spec = OP.spec((16, 256), dtype)
    inputs = OP.make_inputs(spec, seed=7, device=device)
    dy, x, w, _ = inputs
    dx64, dw64, db64 = OP.reference_fp64(spec, inputs)
    lowp_dx, lowp_dw, lowp_db = OP.reference(spec, inputs)
    # The exact answer rounded once passes.
    assert check_close(dx64.to(x.dtype), dx64, lowp_dx, OP.tolerance) is None
    assert check_close(dw64.float(), dw64, lowp_dw, OP.tolerance) is None
    assert check_close(db64.float(), db64, lowp_db, OP.tolerance) is None
    # Forgetting either mean term of dx, or the weight, or rstd in dw fails.
    xd, gd = x.double(), dy.double() * w.double()
    xc = xd - xd.mean(-1, keepdim=True)
    rstd = torch.rsqrt(xc.pow(2).mean(-1, keepdim=True) + 1e-5)
    xhat = xc * rstd
    for wrong in (rstd * (gd - xhat * (gd * xhat).mean(-1, keepdim=True)), rstd * (gd - gd.mean(-1, keepdim=True)),
                  formula((dy, x), 1e-5)[0]):
        assert check_close(wrong.to(x.dtype), dx64, lowp_dx, OP.tolerance) is not None
    assert check_close((dy.double() * xc).sum(0).float(), dw64, lowp_dw, OP.tolerance) is not None


# ---- specs, inputs, spaces ----------------------------------------------------------------------


def test_specs() -> None:
    spec = OP.spec((8192, 4096), "bf16")
    dy, x, w, b = spec.inputs
    assert dy.shape == x.shape == (8192, 4096) and w.shape == b.shape == (4096,)
    assert spec.const("eps") == 1e-5 and spec.const("affine") == "weight_bias"
    dx, dw, db = OP.output_specs(spec)
    assert dx.shape == (8192, 4096) and dx.dtype == "bfloat16"
    assert dw.shape == db.shape == (4096,) and dw.dtype == db.dtype == "float32"
    assert OP.bytes_moved(spec) == 3 * 8192 * 4096 * 2 + 2 * 4096 * 2 + 2 * 4096 * 4
    assert [len(OP.output_specs(OP.spec((4, 8), "fp32", affine=a))) for a in AFFINE] == [3, 2, 1]
    t = torch.zeros(16, 128, dtype=torch.float16)
    p = torch.ones(128, dtype=torch.float16)
    for tensors, affine in (((t, t, p, p), "weight_bias"), ((t, t, p), "weight"), ((t, t), "none")):
        assert OP.spec_for(*tensors) == OP.spec((16, 128), "fp16", affine=affine)
        assert OP.spec_for(*tensors, eps=1e-6, affine=affine).const("eps") == 1e-6
    assert isinstance(OP, LayerNormBackward) and OP.name == "layernorm_backward"


def test_the_forward_names_this_family_and_its_inputs_mirror_the_forward() -> None:
    assert get_op(FORWARD.backward or "") is OP
    for affine in AFFINE:
        forward = FORWARD.spec((4, 3, 40), "bfloat16", eps=1e-6, affine=affine)
        backward = OP.spec((4, 3, 40), "bfloat16", eps=1e-6, affine=affine)
        assert backward.inputs == (forward.inputs[0], *forward.inputs)
        assert dict(backward.constants) == dict(forward.constants)
        assert [t.shape for t in OP.output_specs(backward)] == [t.shape for t in forward.inputs]


@pytest.mark.parametrize(
    "call",
    [
        pytest.param(lambda: OP.spec((0, 8), "float16"), id="empty-shape"),
        pytest.param(lambda: OP.spec((), "float16"), id="no-shape"),
        pytest.param(lambda: OP.spec((4, 8), "float16", affine="bias"), id="affine"),
        pytest.param(lambda: OP.spec((4, 8), "float16", eps=-1.0), id="eps"),
        pytest.param(lambda: OP.spec((4, 8), "float16", momentum=0.1), id="constant"),
        pytest.param(lambda: OP.spec((4, 8), "float64"), id="dtype"),
    ],
)
def test_spec_rejects_what_the_kernels_cannot_do(call) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(UnsupportedWorkload):
        call()


def _t(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.zeros(shape, dtype=dtype)


@pytest.mark.parametrize(
    "make, constants",
    [
        pytest.param(lambda: (_t(4, 8), _t(4, 8), _t(4)), {}, id="weight-size"),
        pytest.param(lambda: (_t(4, 8), _t(4, 8), _t(8), _t(7)), {}, id="bias-size"),
        pytest.param(lambda: (_t(4, 8), _t(4, 8), _t(2, 4)), {}, id="weight-2d"),
        pytest.param(lambda: (_t(4, 9), _t(4, 8), _t(8)), {}, id="dy-shape"),
        pytest.param(lambda: (_t(4, 8, dtype=torch.float16), _t(4, 8), _t(8)), {}, id="dtypes"),
        pytest.param(lambda: (_t(4, 8), _t(4, 8), _t(8), _t(8, dtype=torch.bfloat16)), {}, id="bias-dtype"),
        pytest.param(lambda: (_t(0, 8), _t(0, 8)), {}, id="empty"),
        pytest.param(lambda: (_t(8, 4).t(), _t(4, 8)), {}, id="transposed"),
        pytest.param(lambda: (_t(4, 8),), {}, id="one-input"),
        pytest.param(lambda: (_t(4, 8), _t(4, 8), _t(8), _t(8), _t(8)), {}, id="five-inputs"),
        pytest.param(lambda: (_t(4, 8), _t(4, 8), None, _t(8)), {}, id="bias-without-weight"),
        pytest.param(lambda: (_t(4, 8), _t(4, 8), _t(8)), {"affine": "weight_bias"}, id="affine-mismatch"),
        pytest.param(lambda: (_t(4, 8), _t(4, 8)), {"affine": "nope"}, id="affine-unknown"),
        pytest.param(lambda: (_t(4, 8), _t(4, 8)), {"eps": math.nan}, id="eps"),
        pytest.param(lambda: (_t(4, 8), _t(4, 8)), {"momentum": 0.1}, id="constant"),
        pytest.param(lambda: (_t(4, 8, dtype=torch.int32), _t(4, 8, dtype=torch.int32)), {}, id="int"),
    ],
)
def test_spec_for_rejects_what_the_kernels_cannot_do(make, constants) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(UnsupportedWorkload):
        OP.spec_for(*make(), **constants)


def test_make_inputs_draws_the_forwards_inputs(device: str) -> None:
    """x and the parameters are what the forward draws for the same seed (that inputs are
    deterministic by seed is tested for every family in test_rowwise_families.py)."""
    for affine in AFFINE:
        spec = OP.spec((2, 5, 48), "bfloat16", affine=affine)
        forward = FORWARD.spec((2, 5, 48), "bfloat16", affine=affine)
        for distribution in OP.distributions:
            _dy, *drawn = OP.make_inputs(spec, seed=11, distribution=distribution, device=device)
            same = FORWARD.make_inputs(forward, seed=11, distribution=distribution, device=device)
            assert all(torch.equal(p, q) for p, q in zip(drawn, same, strict=True))


@pytest.mark.parametrize("width", [1, 2, 3, 17, 341, 1000, 4096, 8192, 16384, 32768, 65536])
def test_spaces_are_non_empty_and_valid(width: int) -> None:
    for affine in AFFINE:
        spec = OP.spec((8, width), "bfloat16", affine=affine)
        for variant in OP.variants:
            space = variant.space(spec)
            # two_stage holds whole rows: up to 16384 columns with every affine form, 32768
            # without a bias (five row-sized vectors would need more than 128 values a thread).
            if variant.name == "two_stage" and (width > 32768 or (width == 32768 and affine == "weight_bias")):
                assert len(space) == 0
                continue
            assert len(space) > 0, f"{variant.name} has no config at width {width} ({affine})"
            for config in space:
                assert space.violations(config) == []


def test_space_sizes_are_modest() -> None:
    for width in (4096, 8192):
        for affine in AFFINE:
            total = sum(len(v.space(OP.spec((8192, width), "bfloat16", affine=affine))) for v in OP.variants)
            assert 20 <= total <= 160, (width, affine, total)
    assert len({v.source_hash for v in OP.variants}) == len(OP.variants)


def test_error_stats_of_the_kernels_are_near_float32_rounding(device: str) -> None:
    # A plain number to read in a failure: float32 kernels are within a few ulps of the truth.
    spec = OP.spec((7, 341), "float32")
    inputs = OP.make_inputs(spec, seed=0, distribution="offset", device=device)
    for variant in VARIANTS:
        outs, _ = launch_guarded(OP, variant, spec, OP.variant(variant).space(spec).configs()[0], inputs)
        for out, ref64 in zip(outs, OP.reference_fp64(spec, inputs), strict=True):
            assert error_stats(out, ref64).rel_l2 < 1e-6, (variant, error_stats(out, ref64))

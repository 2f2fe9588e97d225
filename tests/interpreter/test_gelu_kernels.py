"""The GELU families (``gelu``, exact, and ``gelu_tanh``): kernels in the Triton interpreter
without a GPU (every distribution, schedules at their edges, extreme inputs, the polynomial erf),
specs, inputs and spaces.

Kernel outputs are pre-filled with NaN and followed by a NaN guard, so a kernel that skips an
element or writes past the end is caught; results are compared with the float64 reference under
the harness's own tolerance (``check_close``: a few times PyTorch's error in the same dtype).
Every variant's config classes on small and odd shapes, the harness and the variants' hashes are
the shared elementwise suite's (test_families.py).
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from kernelsmith.evaluate.errors import check_close
from kernelsmith.evaluate.validate import validate
from kernelsmith.ops import UnsupportedWorkload
from kernelsmith.ops._base import tail_rows
from kernelsmith.ops.gelu import GELU, GELU_TANH, ODD_TAIL, Gelu, GeluTanh
from kernelsmith.space import Config
from kernelsmith.spec import OpSpec
from kernelsmith.testing.kernels import assert_matches_fp64, run_single_output

FAMILIES = {"gelu": GELU, "gelu_tanh": GELU_TANH}
DTYPES = ("float16", "bfloat16", "float32")


# ---- every distribution, schedules at their edges, special values ---------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_every_distribution_in_every_dtype(family: str, dtype: str, device: str) -> None:
    op = FAMILIES[family]
    spec = op.spec((3, 333), dtype)
    for variant in op.variants:
        config = variant.space(spec).configs()[0]
        for distribution in op.distributions:
            (x,) = op.make_inputs(spec, seed=7, distribution=distribution, device=device)
            y = run_single_output(op, spec, variant.name, config, (x,))
            assert_matches_fp64(op, spec, (x,), y, f"{family}/{variant.name} {dtype} {distribution}")


def test_persistent_programs_walk_several_blocks(device: str) -> None:
    # 4097 elements in blocks of 1024 are 5 blocks; without a GPU there are 4 "SMs", so with one
    # program per SM program 0 takes blocks 0 and 4 (the partial one).
    spec = GELU_TANH.spec((4097,), "float32")
    (x,) = GELU_TANH.make_inputs(spec, seed=3, distribution="wide", device=device)
    config = Config(PROGRAMS_PER_SM=1, BLOCK=1024, num_warps=4, num_stages=2)
    y = run_single_output(GELU_TANH, spec, "persistent", config, (x,))
    assert_matches_fp64(GELU_TANH, spec, (x,), y, "persistent, 4 programs for 5 blocks")


def test_multi_block_masks_whole_blocks_past_the_end(device: str) -> None:
    # 300 elements, 8 blocks of 256 per program: block 0 full, block 1 partial, blocks 2..7 empty.
    spec = GELU.spec((300,), "bfloat16")
    (x,) = GELU.make_inputs(spec, seed=4, device=device)
    config = Config(BLOCK=256, ITEMS=8, num_warps=1, num_stages=3, FAST_ERF=False)
    y = run_single_output(GELU, spec, "multi_block", config, (x,))
    assert_matches_fp64(GELU, spec, (x,), y, "multi_block ITEMS=8 on 300 elements")


@pytest.mark.filterwarnings("error::RuntimeWarning")
def test_no_overflow_at_extreme_inputs(device: str) -> None:
    # exp never sees a positive argument: x = -1e4 (x^3 = -1e12) stays finite and gives -0.
    x = torch.tensor([-1e4, -100.0, -11.0, -3.0, 0.0, 3.0, 11.0, 100.0, 1e4], device=device)
    for op in FAMILIES.values():
        spec = op.spec_for(x)
        y = run_single_output(op, spec, "blocked", op.variant("blocked").space(spec).configs()[0], (x,))
        assert_matches_fp64(op, spec, (x,), y, f"{op.name} at extreme inputs")
        assert float(y[0]) == 0.0 and float(y[-1]) == 1e4 and float(y[4]) == 0.0


def test_the_two_formulas_are_told_apart(device: str) -> None:
    # The tanh formula is off by up to 4.7e-4 (5% at x = -2.7): as an answer to the exact GELU
    # (and the reverse) it fails the tolerance in float32, while each kernel passes its own.
    spec_exact, spec_tanh = GELU.spec((4, 500), "float32"), GELU_TANH.spec((4, 500), "float32")
    assert spec_exact.workload_hash != spec_tanh.workload_hash
    (x,) = GELU.make_inputs(spec_exact, seed=1, device=device)
    config = GELU.variant("blocked").space(spec_exact).configs()[0]
    y_exact = run_single_output(GELU, spec_exact, "blocked", config, (x,))
    config_tanh = GELU_TANH.variant("blocked").space(spec_tanh).configs()[0]
    y_tanh = run_single_output(GELU_TANH, spec_tanh, "blocked", config_tanh, (x,))
    exact64, tanh64 = GELU.reference_fp64(spec_exact, (x,))[0], GELU_TANH.reference_fp64(spec_tanh, (x,))[0]
    exact32, tanh32 = GELU.reference(spec_exact, (x,))[0], GELU_TANH.reference(spec_tanh, (x,))[0]
    assert check_close(y_exact, exact64, exact32, GELU.tolerance) is None
    assert check_close(y_tanh, tanh64, tanh32, GELU_TANH.tolerance) is None
    assert check_close(y_tanh, exact64, exact32, GELU.tolerance) is not None
    assert check_close(y_exact, tanh64, tanh32, GELU_TANH.tolerance) is not None


# ---- the harness ---------------------------------------------------------------------------------


def test_validation_specs() -> None:
    spec = GELU.spec((2, 40, 3000), "float16")
    shapes = [s.inputs[0].shape for s in GELU.validation_specs(spec)]
    assert shapes == [(2, 40, 3000)] + [(r, 3000) for r in tail_rows(80)] + [(ODD_TAIL,)]
    assert ODD_TAIL % 2 == 1 and ODD_TAIL > 3 * 8192
    small = [s.inputs[0].shape for s in GELU_TANH.validation_specs(GELU_TANH.spec((3, 10), "float32"))]
    assert small == [(3, 10)] + [(r, 10) for r in tail_rows(3)] + [(ODD_TAIL,)]
    one_d = [s.inputs[0].shape for s in GELU.validation_specs(GELU.spec((7,), "float32"))]
    assert one_d == [(7,), (ODD_TAIL,)]
    for vspec in GELU.validation_specs(spec):
        assert vspec.op == "gelu" and vspec.inputs[0].dtype == "float16"
        for variant in GELU.variants:  # spaces depend on the dtype only
            assert variant.space(vspec).configs() == variant.space(spec).configs()


def test_bucket_rounds_rows_up_at_a_fixed_width() -> None:
    assert GELU.rowwise
    assert GELU.bucket(GELU.spec((5000, 4096), "bfloat16")).inputs[0].shape == (8192, 4096)
    assert GELU.bucket(GELU.spec((2, 3, 100), "bfloat16")) == GELU.bucket(GELU.spec((8, 100), "bfloat16"))
    assert GELU.bucket(GELU.spec((100,), "float32")).inputs[0].shape == (100,)  # one row: its own bucket


# ---- specs ---------------------------------------------------------------------------------------


def test_spec_from_the_command_line() -> None:
    spec = GELU.spec((8192, 14336), "bf16")
    assert spec.op == "gelu" and spec.constants == {}
    assert spec.inputs[0].shape == (8192, 14336) and spec.inputs[0].dtype == "bfloat16"
    assert GELU_TANH.spec((8192, 14336), "bf16").op == "gelu_tanh"
    (out,) = GELU.output_specs(spec)
    assert out.shape == (8192, 14336) and out.dtype == "bfloat16"
    assert "8192x14336" in GELU.shape_help


def test_spec_for_matches_spec() -> None:
    x = torch.zeros(4, 16, 96, dtype=torch.float16)
    for op in FAMILIES.values():
        from_tensor = op.spec_for(x)
        assert from_tensor == op.spec((4, 16, 96), "float16")
        assert from_tensor.workload_hash == op.spec((4, 16, 96), "fp16").workload_hash
        # F.gelu's keyword naming the family's own formula is accepted and changes nothing
        assert op.spec_for(x, approximate=op.approximate).workload_hash == from_tensor.workload_hash
    assert GELU.spec_for(x).workload_hash != GELU.spec_for(x.view(64, 96)).workload_hash
    assert OpSpec.from_dict(GELU.spec_for(x).to_dict()) == GELU.spec_for(x)


@pytest.mark.parametrize(
    ("make", "constants"),
    [
        (lambda: (torch.zeros(4, 8, dtype=torch.float64),), {}),
        (lambda: (torch.zeros(4, 8, dtype=torch.int32),), {}),
        (lambda: (torch.zeros(()),), {}),
        (lambda: (torch.zeros(0, 8),), {}),
        (lambda: (torch.zeros(8, 4).t(),), {}),
        (lambda: (torch.zeros(4, 16)[:, ::2],), {}),
        (lambda: (torch.zeros(4, 8), torch.zeros(4, 8)), {}),
        (lambda: (), {}),
        (lambda: (torch.zeros(4, 8),), {"dim": -1}),
    ],
    ids=["float64", "int32", "scalar", "empty", "transposed", "strided", "two-inputs", "none", "constant"],
)
def test_spec_for_rejects_what_the_kernels_cannot_do(make, constants) -> None:  # type: ignore[no-untyped-def]
    for op in FAMILIES.values():
        with pytest.raises(UnsupportedWorkload):
            op.spec_for(*make(), **constants)


def test_the_other_formula_is_the_other_family() -> None:
    x = torch.zeros(4, 8)
    with pytest.raises(UnsupportedWorkload, match="approximate"):
        GELU.spec_for(x, approximate="tanh")
    with pytest.raises(UnsupportedWorkload, match="approximate"):
        GELU_TANH.spec((4, 8), "fp32", approximate="none")


def test_bad_command_line_specs() -> None:
    with pytest.raises(UnsupportedWorkload):
        GELU.spec((4, 8), "fp64")
    with pytest.raises(UnsupportedWorkload):
        GELU.spec((4, 0), "fp32")
    with pytest.raises(UnsupportedWorkload):
        GELU.spec((), "fp32")
    with pytest.raises(UnsupportedWorkload):
        GELU_TANH.spec((4, 8), "fp32", eps=1e-6)
    with pytest.raises(ValueError):
        GELU.spec((4, 8), "int3")


def test_bytes_and_flops() -> None:
    spec = GELU.spec((16384, 8192), "bfloat16")
    assert GELU.bytes_moved(spec) == 2 * 16384 * 8192 * 2  # read x, write y
    assert GELU.bytes_moved(GELU_TANH.spec((3, 5), "float32")) == 2 * 15 * 4
    assert GELU.flops(spec) == 5 * 16384 * 8192
    assert GELU_TANH.flops(GELU_TANH.spec((16384, 8192), "bfloat16")) == 10 * 16384 * 8192


def test_references() -> None:
    x = torch.linspace(-6, 6, 97, dtype=torch.bfloat16)
    spec = GELU.spec_for(x)
    assert torch.equal(GELU.reference(spec, (x,))[0], F.gelu(x))
    assert torch.equal(GELU_TANH.reference(GELU_TANH.spec_for(x), (x,))[0], F.gelu(x, approximate="tanh"))
    (y64,) = GELU.reference_fp64(spec, (x,))
    xd = x.double()
    assert y64.dtype == torch.float64
    assert torch.allclose(y64, 0.5 * xd * (1 + torch.erf(xd / math.sqrt(2))), rtol=1e-12, atol=1e-15)
    (t64,) = GELU_TANH.reference_fp64(GELU_TANH.spec_for(x), (x,))
    u = math.sqrt(2 / math.pi) * (xd + 0.044715 * xd**3)
    assert torch.allclose(t64, 0.5 * xd * (1 + torch.tanh(u)), rtol=1e-12, atol=1e-15)
    assert isinstance(GELU, Gelu) and isinstance(GELU_TANH, GeluTanh)
    assert (GELU.name, GELU_TANH.name) == ("gelu", "gelu_tanh")


# ---- inputs --------------------------------------------------------------------------------------


def test_make_inputs_is_deterministic_by_seed(device: str) -> None:
    spec = GELU.spec((2, 5, 48), "bfloat16")
    for distribution in GELU.distributions:
        (a,) = GELU.make_inputs(spec, seed=11, distribution=distribution, device=device)
        (b,) = GELU.make_inputs(spec, seed=11, distribution=distribution, device=device)
        (c,) = GELU.make_inputs(spec, seed=12, distribution=distribution, device=device)
        assert torch.equal(a, b) and not torch.equal(a, c)
        assert a.shape == (2, 5, 48) and a.dtype == torch.bfloat16 and a.is_contiguous()
        assert a.device.type == torch.device(device).type
    with pytest.raises(ValueError, match="distribution"):
        GELU.make_inputs(spec, seed=0, distribution="cauchy", device=device)


def test_distributions_have_their_shape(device: str) -> None:
    spec = GELU.spec((64, 512), "float32")
    xs = {d: GELU.make_inputs(spec, seed=0, distribution=d, device=device)[0] for d in GELU.distributions}
    assert 0.9 < float(xs["normal"].std()) < 1.1
    assert 7 < float(xs["wide"].std()) < 9
    assert 0.9e-3 < float(xs["small"].std()) < 1.1e-3
    tails = xs["tails"].abs()
    assert 9.5 < float(tails.mean()) < 10.5 and float(tails.min()) > 0.5
    assert 0.45 < float((xs["tails"] > 0).float().mean()) < 0.55  # both signs
    # fp16 keeps them finite
    (x16,) = GELU.make_inputs(GELU.spec((64, 512), "float16"), seed=0, distribution="wide", device=device)
    assert bool(torch.isfinite(x16).all())


# ---- spaces --------------------------------------------------------------------------------------


def test_space_sizes_are_modest() -> None:
    for dtype in DTYPES:
        spec = GELU_TANH.spec((16384, 8192), dtype)
        sizes = {v.name: len(v.space(spec)) for v in GELU_TANH.variants}
        assert all(size >= 20 for size in sizes.values()), sizes
        assert 150 <= sum(sizes.values()) <= 200, sizes
        # The exact form also chooses its erf (FAST_ERF): twice the configs.
        exact = GELU.spec((16384, 8192), dtype)
        assert {v.name: len(v.space(exact)) for v in GELU.variants} == {k: 2 * n for k, n in sizes.items()}


@pytest.mark.parametrize("dtype", DTYPES)
def test_every_config_respects_its_budgets(dtype: str) -> None:
    spec = GELU.spec((1,), dtype)
    itemsize = torch.empty((), dtype=spec.inputs[0].torch_dtype).element_size()
    for variant in GELU.variants:
        space = variant.space(spec)
        assert len(space) > 0
        for config in space:
            per_thread = config["BLOCK"] / (32 * config["num_warps"])
            assert 4 <= per_thread <= 32
            assert ("num_stages" in config) == (variant.name != "blocked")  # only loops pipeline
            if variant.name == "multi_block":
                assert config["num_stages"] <= config["ITEMS"]
            if variant.name == "persistent":
                assert config["PROGRAMS_PER_SM"] * config["num_warps"] <= 64
                in_flight = config["PROGRAMS_PER_SM"] * (config["num_stages"] - 1) * config["BLOCK"] * itemsize
                assert in_flight <= 192 * 1024


def test_build_rejects_a_config_outside_the_space() -> None:
    spec = GELU.spec((64,), "float32")
    with pytest.raises(ValueError, match="not in the space"):
        GELU.variant("blocked").build(spec, Config(BLOCK=8192, num_warps=1, EVICT_X=""))  # 256 a thread
    with pytest.raises(ValueError, match="not in the space"):
        GELU.variant("multi_block").build(spec, Config(BLOCK=1024, ITEMS=2, num_warps=4, num_stages=3))
    with pytest.raises(ValueError, match="not in the space"):
        GELU.variant("persistent").build(spec, Config(BLOCK=1024, num_warps=4))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
@pytest.mark.parametrize("variant", ["blocked", "multi_block", "persistent"])
def test_polynomial_erf_passes_the_harness(variant: str, dtype: str, device: str) -> None:
    """FAST_ERF (Abramowitz & Stegun erf) is a search choice of the exact form: the full
    validation (every distribution, tails and extremes included) decides whether it is close
    enough; it must be, in every dtype, for the search to have a real choice."""

    spec = GELU.spec((7, 333), dtype)
    space = GELU.variant(variant).space(spec)
    config = next(c for c in space.configs() if c["FAST_ERF"])
    assert validate(GELU, spec, GELU.variant(variant).build, config, device, lambda: None) > 0


def test_polynomial_erf_keeps_float32_accuracy_near_zero(device: str) -> None:
    """Inputs of a few thousandths (the 'small' distribution): the erfc form's alternating
    polynomial cost about 4.5 ulp there, which failed the float32 tolerance now and then; the
    odd erf polynomial used near zero stays within about 1 ulp of each element."""
    x = torch.randn(4099, generator=torch.Generator().manual_seed(0), dtype=torch.float64).mul(1e-3)
    x = torch.cat([x, torch.linspace(-0.7, 0.7, 1001, dtype=torch.float64)]).float().to(device)
    spec = GELU.spec_for(x)
    config = next(c for c in GELU.variant("blocked").space(spec).configs() if c["FAST_ERF"])
    y = run_single_output(GELU, spec, "blocked", config, (x,)).double()
    xd = x.double()
    ref = 0.5 * xd * (1 + torch.erf(xd / math.sqrt(2)))
    ulps = ((y - ref).abs() / (torch.finfo(torch.float32).eps * ref.abs())).max()
    assert float(ulps) <= 2.5, float(ulps)


def test_polynomial_erf_at_extreme_inputs(device: str) -> None:
    x = torch.tensor([-1e4, -100.0, -11.0, -3.0, -1e-3, 0.0, 1e-3, 3.0, 11.0, 100.0, 1e4], device=device)
    spec = GELU.spec_for(x)
    config = next(c for c in GELU.variant("blocked").space(spec).configs() if c["FAST_ERF"])
    y = run_single_output(GELU, spec, "blocked", config, (x,))
    assert torch.isfinite(y).all()
    assert_matches_fp64(GELU, spec, (x,), y, "polynomial erf at extreme inputs")

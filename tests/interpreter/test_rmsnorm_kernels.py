"""RMSNorm: specs, inputs, the reference, the spaces, Gemma's weight offset, and what is peculiar
to its kernels.

What the row-wise families share (every variant's config classes against the float64 reference,
the realigned variants, the harness, multi_row's masked rows, persistent programs, eps) is tested
once for all of them in test_rowwise_families.py. Without a GPU the kernels run in the Triton
interpreter (tests/conftest.py sets it up), which is slow: shapes stay small, and instead of every
config a variant runs a *covering* set, in which every value of every parameter appears once.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from kernelsmith.evaluate.errors import check_close
from kernelsmith.ops import UnsupportedWorkload, get_op
from kernelsmith.ops._rowwise import MAX_WHOLE_ROW
from kernelsmith.ops.rmsnorm import OP, RMSNorm
from kernelsmith.space import Config
from kernelsmith.spec import OpSpec

# The four schedules; the realigned variants (aligned_row, split_row) have their own cases.
REALIGNED = ("aligned_row", "split_row")
SCHEDULES = [v.name for v in OP.variants if v.name not in REALIGNED]
GUARD = 64  # NaN elements after the output: a kernel writing past its end overwrites them


def run_launcher(variant_name: str, spec: OpSpec, config: Config, inputs: tuple[torch.Tensor, ...]
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """Launch into a NaN-filled output followed by a NaN guard; return (output, guard)."""
    x = inputs[0]
    buffer = torch.full((x.numel() + GUARD,), math.nan, dtype=x.dtype, device=x.device)
    out = buffer[: x.numel()].view(x.shape)
    OP.variant(variant_name).build(spec, config)(inputs, (out,))
    return out, buffer[x.numel():]


def assert_correct(spec: OpSpec, inputs: tuple[torch.Tensor, ...], out: torch.Tensor,
                   guard: torch.Tensor, what: str) -> None:
    assert bool(torch.isfinite(out).all()), f"{what}: some output elements were never written"
    assert bool(torch.isnan(guard).all()), f"{what}: the kernel wrote past the end of its output"
    (ref64,) = OP.reference_fp64(spec, inputs)
    (lowp,) = OP.reference(spec, inputs)
    problem = check_close(out, ref64, lowp, OP.tolerance)
    assert problem is None, f"{what}: {problem}"


# ---- the launchers --------------------------------------------------------------------------


@pytest.mark.gpu
def test_launchers_only_take_views(device: str) -> None:
    """Launchers may view and query tensors but never compute with torch or allocate."""

    class Recorder(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.ops: list[str] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            self.ops.append(str(func))
            return func(*args, **(kwargs or {}))

    spec = OP.spec((2, 3, 256), "bfloat16")
    inputs = OP.make_inputs(spec, seed=0, device=device)
    for variant in OP.variants:
        configs = variant.space(spec).configs()
        if not configs:  # aligned_row: 256 columns, rows Triton proves aligned
            continue
        out = torch.full_like(inputs[0], math.nan)
        launch = variant.build(spec, configs[0])
        launch(inputs, (out,))  # compile outside the recorder
        with Recorder() as recorder:
            launch(inputs, (out,))
        # split_row allocates its scratch of chunk statistics (through the caching allocator), as
        # the backward families' launchers do: allocation, never computation.
        allowed = ("aten.view", "aten.new_empty", "aten.empty") if variant.name == "split_row" else ("aten.view",)
        assert all(op.startswith(allowed) for op in recorder.ops), recorder.ops
        assert not out.isnan().any()  # the launch ran (inside the recorder too)
    with Recorder() as recorder:  # the recorder does see torch calls: the check above can fail
        inputs[0].view(-1)
        inputs[0].sum()
    assert recorder.ops[0].startswith("aten.view") and "sum" in recorder.ops[1]


# ---- tolerance discriminates ----------------------------------------------------------------


def test_the_tolerance_catches_a_misplaced_weight_or_eps(device: str) -> None:
    spec = OP.spec((6, 32), "bfloat16")
    x, w = OP.make_inputs(spec, seed=1, device=device)
    (ref64,) = OP.reference_fp64(spec, (x, w))
    (lowp,) = OP.reference(spec, (x, w))
    xf = x.float()
    rstd = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)
    right = (xf * rstd * w.float()).to(x.dtype)
    no_weight = (xf * rstd).to(x.dtype)
    rolled_weight = (xf * rstd * w.float().roll(1)).to(x.dtype)
    assert check_close(right, ref64, lowp, OP.tolerance) is None
    assert check_close(no_weight, ref64, lowp, OP.tolerance) is not None
    assert check_close(rolled_weight, ref64, lowp, OP.tolerance) is not None

    small = OP.spec((6, 32), "float32")
    xs, ws = OP.make_inputs(small, seed=1, distribution="small", device=device)
    (ref64,) = OP.reference_fp64(small, (xs, ws))
    (lowp,) = OP.reference(small, (xs, ws))
    eps_outside = xs / (xs.pow(2).mean(-1, keepdim=True).sqrt() + 1e-6) * ws
    assert check_close(eps_outside, ref64, lowp, OP.tolerance) is not None


# ---- reference ------------------------------------------------------------------------------


def test_reference_is_the_llama_formula(device: str) -> None:
    spec = OP.spec((2, 3, 64), "float16", eps=1e-5)
    x, w = OP.make_inputs(spec, seed=2, device=device)
    (y,) = OP.reference(spec, (x, w))
    xf = x.float()
    expected = w * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-5)).to(torch.float16)
    assert y.dtype == torch.float16 and y.shape == x.shape
    assert torch.equal(y, expected)

    (y64,) = OP.reference_fp64(spec, (x, w))
    assert y64.dtype == torch.float64 and y64.shape == x.shape
    # Each row of y / weight has a mean square of about 1 (exactly 1 / (1 + eps / mean(x^2))).
    ms = (y64 / w.double()).pow(2).mean(-1)
    assert torch.allclose(ms, torch.ones_like(ms), atol=1e-3)
    assert (y.double() - y64).abs().max() < 0.05


# ---- specs ----------------------------------------------------------------------------------


def test_spec_from_command_line_shape() -> None:
    spec = OP.spec((8192, 4096), "bf16")
    assert spec.op == "rmsnorm"
    x, w = spec.inputs
    assert x.shape == (8192, 4096) and w.shape == (4096,)
    assert x.dtype == w.dtype == "bfloat16"
    assert spec.const("eps") == 1e-6
    assert OP.spec((2, 3, 64), "fp32").inputs[1].shape == (64,)
    assert OP.spec((64,), "fp16").inputs[0].shape == (64,)
    assert "8192x4096" in OP.shape_help


@pytest.mark.parametrize(
    "make",
    [
        pytest.param(lambda: (torch.zeros(4, 8), torch.zeros(4)), id="weight-size"),
        pytest.param(lambda: (torch.zeros(4, 8), torch.zeros(1, 8)), id="weight-rank"),
        pytest.param(lambda: (torch.zeros(()), torch.zeros(1)), id="scalar-x"),
        pytest.param(lambda: (torch.zeros(0, 8), torch.zeros(8)), id="empty"),
        pytest.param(lambda: (torch.zeros(4, 8), torch.zeros(8, dtype=torch.float16)), id="dtypes"),
        pytest.param(lambda: (torch.zeros(4, 8, dtype=torch.float64),
                              torch.zeros(8, dtype=torch.float64)), id="float64"),
        pytest.param(lambda: (torch.zeros(4, 8, dtype=torch.int32),
                              torch.zeros(8, dtype=torch.int32)), id="int32"),
        pytest.param(lambda: (torch.zeros(8, 4).t(), torch.zeros(8)), id="transposed"),
        pytest.param(lambda: (torch.zeros(4, 16)[:, ::2], torch.zeros(8)), id="strided"),
        pytest.param(lambda: (torch.zeros(4, 8), torch.zeros(16)[::2]), id="strided-weight"),
        pytest.param(lambda: (torch.zeros(4, 8),), id="one-input"),
    ],
)
def test_spec_for_rejects_what_the_kernels_cannot_do(make) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(UnsupportedWorkload):
        OP.spec_for(*make())


def test_output_specs_bytes_and_flops() -> None:
    spec = OP.spec((8192, 4096), "bfloat16")
    (out,) = OP.output_specs(spec)
    assert out.shape == (8192, 4096) and out.dtype == "bfloat16"
    # x read, weight read, y written
    assert OP.bytes_moved(spec) == 8192 * 4096 * 2 * 2 + 4096 * 2
    assert OP.bytes_moved(OP.spec((2, 3, 10), "float32")) == (60 + 10 + 60) * 4
    assert OP.flops(spec) == 4 * 8192 * 4096


def test_registered_under_its_name() -> None:
    assert get_op("rmsnorm") is OP
    assert isinstance(OP, RMSNorm) and OP.name == "rmsnorm"


# ---- inputs ---------------------------------------------------------------------------------


def test_distributions_differ_as_described(device: str) -> None:
    spec = OP.spec((64, 512), "float16")
    xs = {d: OP.make_inputs(spec, seed=0, distribution=d, device=device)[0].float()
          for d in OP.distributions}
    for d1 in OP.distributions:
        assert bool(torch.isfinite(xs[d1]).all()), d1
        for d2 in OP.distributions:
            if d1 < d2:
                assert not torch.equal(xs[d1], xs[d2]), (d1, d2)
    std = {d: float(x.std()) for d, x in xs.items()}
    assert 0.9 < std["normal"] < 1.1
    assert float(xs["uniform"].abs().max()) <= 1.0 and 0.5 < std["uniform"] < 0.65
    assert 90 < std["large"] < 110
    assert 0.9e-3 < std["small"] < 1.1e-3
    # about 0.1% of 32768 elements, i.e. ~33, are 50 times larger than N(0, 1) values
    big = int((xs["outliers"].abs() > 6).sum())
    assert 5 < big < 100
    # the reference stays finite even for 'large' float16 inputs
    inputs = OP.make_inputs(spec, seed=0, distribution="large", device=device)
    assert bool(torch.isfinite(OP.reference(spec, inputs)[0]).all())


def test_weight_is_one_plus_half_normal(device: str) -> None:
    spec = OP.spec((2, 8192), "float32")
    _, w = OP.make_inputs(spec, seed=4, device=device)
    assert abs(float(w.mean()) - 1) < 0.05 and abs(float(w.std()) - 0.5) < 0.05


def test_unknown_distribution_is_rejected(device: str) -> None:
    with pytest.raises(ValueError, match="distribution"):
        OP.make_inputs(OP.spec((2, 8), "float32"), seed=0, distribution="cauchy", device=device)


# ---- spaces ---------------------------------------------------------------------------------


@pytest.mark.parametrize("width", [1, 2, 3, 17, 64, 341, 1000, 4096, 8192, 16384, 65536])
def test_spaces_are_non_empty_and_valid(width: int) -> None:
    spec = OP.spec((8, width), "bfloat16")
    for variant in OP.variants:
        space = variant.space(spec)
        if variant.name == "multi_row" and width > 8192:
            assert len(space) == 0  # two rows no longer fit the register budget
            continue
        if variant.name == "aligned_row" and width % 16 == 0:
            assert len(space) == 0  # Triton proves these rows aligned: whole_row is the same kernel
            continue
        if variant.name == "split_row" and width <= 4096:
            assert len(space) == 0  # rows of at most 8 KB are not split
            continue
        assert len(space) > 0, f"{variant.name} has no config at width {width}"
        for config in space:
            assert space.violations(config) == []
            if "num_warps" in config:
                assert config["num_warps"] in (1, 2, 4, 8, 16, 32)


def test_space_sizes_are_modest() -> None:
    for width in (4096, 8192):
        spec = OP.spec((8192, width), "bfloat16")
        total = sum(len(v.space(spec)) for v in OP.variants)
        assert 100 <= total <= 250, (width, total)
    assert {v.name for v in OP.variants} >= {"whole_row", "multi_row", "looped"}
    assert len({v.source_hash for v in OP.variants}) == len(OP.variants)


def test_validation_specs_share_the_space() -> None:
    spec = OP.spec((4, 25, 3000), "float16")
    tails = OP.validation_specs(spec)
    assert len(tails) > 1
    for variant in OP.variants:
        configs = variant.space(spec).configs()
        for tail in tails[1:]:
            assert tail.inputs[1] == spec.inputs[1]
            assert variant.space(tail).configs() == configs


# ---- Gemma's weight offset: y = x * rstd * (weight + weight_offset) ---------------------------

# (Each schedule with the offset against the reference, and without it: test_rowwise_families.py.)


def test_other_weight_offsets_and_eps(device: str) -> None:
    # Any finite offset is the family's (the recognizer only emits Gemma's 1.0): -0.5 and 3.0,
    # with another eps, through the first config of every variant.
    for offset in (-0.5, 3.0):
        spec = OP.spec((5, 24), "float32", eps=1e-3, weight_offset=offset)
        inputs = OP.make_inputs(spec, seed=2, device=device)
        for variant in OP.variants:
            configs = variant.space(spec).configs()
            if not configs:  # split_row: rows of at most 8 KB
                continue
            out, guard = run_launcher(variant.name, spec, configs[0], inputs)
            assert_correct(spec, inputs, out, guard, f"{variant.name} offset {offset}")


def test_weight_offset_reference_is_gemmas_formula(device: str) -> None:
    spec = OP.spec((2, 3, 64), "bfloat16", eps=1e-6, weight_offset=1.0)
    x, w = OP.make_inputs(spec, seed=2, device=device)
    (y,) = OP.reference(spec, (x, w))
    xf = x.float()
    normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)
    assert torch.equal(y, (normed * (1.0 + w.float())).type_as(x))  # GemmaRMSNorm.forward: one rounding
    (y64,) = OP.reference_fp64(spec, (x, w))
    xd = x.double()
    assert torch.equal(y64, xd * torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + 1e-6) * (w.double() + 1.0))


def test_weight_offset_specs_leave_other_workloads_alone() -> None:
    x, w = torch.zeros(16, 128, dtype=torch.bfloat16), torch.zeros(128, dtype=torch.bfloat16)
    plain = OP.spec((16, 128), "bfloat16")
    # 0 is no offset: the constant is left out, and the workload hashes as it always did.
    assert OP.spec((16, 128), "bfloat16", weight_offset=0.0) == plain == OP.spec_for(x, w, weight_offset=0)
    assert "weight_offset" not in plain.constants
    gemma = OP.spec((16, 128), "bfloat16", weight_offset=1.0)
    assert gemma.constants == {"eps": 1e-6, "weight_offset": 1.0}
    assert OP.spec_for(x, w, weight_offset=1.0) == gemma
    assert gemma.workload_hash != plain.workload_hash
    assert OpSpec.from_dict(gemma.to_dict()).workload_hash == gemma.workload_hash
    assert OP.bucket(OP.spec((5, 128), "bfloat16", weight_offset=1.0)).constants == gemma.constants
    for bad in (math.inf, -math.inf, math.nan):
        with pytest.raises(UnsupportedWorkload, match="weight_offset"):
            OP.spec((16, 128), "bfloat16", weight_offset=bad)
        with pytest.raises(UnsupportedWorkload, match="weight_offset"):
            OP.spec_for(x, w, weight_offset=bad)


def test_weight_offset_inputs_scale_rows_alike(device: str) -> None:
    # The weight is drawn less the offset: the weight the rows are scaled by is 1 + 0.5 * N(0, 1)
    # either way, and Gemma's stored weight is about 0.
    plain = OP.make_inputs(OP.spec((2, 256), "float32"), seed=4, device=device)[1]
    offset = OP.make_inputs(OP.spec((2, 256), "float32", weight_offset=1.0), seed=4, device=device)[1]
    assert torch.allclose(offset + 1.0, plain) and abs(float(offset.mean())) < 0.1


# ---- realigned rows (aligned_row) and rows split across programs (split_row) ------------------
# Their cases against the reference, at unaligned addresses and through the harness:
# test_rowwise_families.py.


def test_split_row_sums_many_chunks(device: str) -> None:
    # 4097 columns in chunks of 256: 17 (row, chunk) programs a row, the last chunk partly masked.
    spec = OP.spec((1, 4097), "bfloat16")
    config = Config(BLOCK_N=256, num_warps=1)
    assert config in OP.variant("split_row").space(spec)
    inputs = OP.make_inputs(spec, seed=5, distribution="large", device=device)
    out, guard = run_launcher("split_row", spec, config, inputs)
    assert_correct(spec, inputs, out, guard, "split_row BLOCK_N=256")


def test_realigned_spaces() -> None:
    aligned, split = OP.variant("aligned_row"), OP.variant("split_row")
    # aligned_row: only where Triton cannot prove the rows aligned, and whole_row's budget.
    for width in (4095, 4097, 4104, 32001):
        spec = OP.spec((8, width), "bfloat16")
        assert aligned.space(spec).configs() == OP.variant("whole_row").space(spec).configs()
    assert len(aligned.space(OP.spec((8, 4096), "bfloat16"))) == 0
    assert len(aligned.space(OP.spec((8, MAX_WHOLE_ROW + 3), "bfloat16"))) == 0
    # split_row: rows of more than 8 KB, those wider than a program holds included, two to
    # MAX_SPLITS chunks.
    for width in (4097, 50257, 128257, 1 << 20):
        configs = split.space(OP.spec((8, width), "bfloat16")).configs()
        assert configs, width
        assert all(2 <= math.ceil(width / c["BLOCK_N"]) <= 1024 for c in configs), width
    assert len(split.space(OP.spec((8, 4096), "bfloat16"))) == 0
    assert len(split.space(OP.spec((8, 2048), "float32"))) == 0 < len(split.space(OP.spec((8, 2049), "float32")))

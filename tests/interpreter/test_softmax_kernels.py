"""The softmax op family: spaces, specs, its temperature (scale), and what is peculiar to its
kernels (rows summing to one, masked -inf scores).

What the row-wise families share (every variant's config classes on small and odd shapes against
the float64 reference, the realigned variants, the harness, the validation specs' tails, launchers
that are reusable, take views only and reject configs outside their space) is tested once for all
of them in test_rowwise_families.py. Kernels run in the Triton interpreter without a GPU. Every
kernel test here pre-fills the output with NaN, so a kernel that skips an element fails the
comparison with the float64 reference, and compares with the same tolerance the harness applies
(``check_close``: at most a few times PyTorch's own error in the same dtype).
"""

from __future__ import annotations

import math
import re

import pytest
import torch

from kernelsmith.evaluate.errors import check_close
from kernelsmith.ops import UnsupportedWorkload, get_op
from kernelsmith.ops.softmax import OP
from kernelsmith.space import Config, next_power_of_two
from kernelsmith.spec import OpSpec
from kernelsmith.testing.kernels import covering_configs

# The four schedules; the realigned variants (aligned_row, split_row) have their own cases, and
# aligned_row joins the cheap tests (ALL_VARIANTS: split_row has no configs for their narrow rows,
# and has its own below).
REALIGNED = ("aligned_row", "split_row")
VARIANTS = [v.name for v in OP.variants if v.name not in REALIGNED]
ALL_VARIANTS = [*VARIANTS, "aligned_row"]
DTYPES = ("float16", "bfloat16", "float32")


def run_variant(variant: str, spec: OpSpec, config: Config, x: torch.Tensor) -> torch.Tensor:
    """Launch one config into a NaN-filled output; check x is untouched; return the output."""
    x_before = x.clone()
    y = torch.full(spec.inputs[0].shape, float("nan"), dtype=x.dtype, device=x.device)
    OP.variant(variant).build(spec, config)((x,), (y,))
    assert torch.equal(x, x_before), f"{variant} {config.key} modified its input"
    return y


def assert_close_to_reference(y: torch.Tensor, spec: OpSpec, x: torch.Tensor, what: str) -> None:
    (ref64,) = OP.reference_fp64(spec, (x,))
    (lowp,) = OP.reference(spec, (x,))
    problem = check_close(y, ref64, lowp, OP.tolerance)
    assert problem is None, f"{what}: {problem}"


# ---- every dtype and distribution, masked scores ------------------------------------------------


@pytest.mark.filterwarnings("error::RuntimeWarning")
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("distribution", OP.distributions)
def test_dtypes_and_distributions(variant: str, dtype: str, distribution: str, device: str) -> None:
    spec = OP.spec((9, 200), dtype)
    (x,) = OP.make_inputs(spec, seed=5, distribution=distribution, device=device)
    configs = OP.variant(variant).space(spec).configs()
    for config in {configs[0], configs[-1]}:
        y = run_variant(variant, spec, config, x)
        assert y.dtype == x.dtype
        assert_close_to_reference(y, spec, x, f"{variant} {config.key} {distribution}")
        sums = y.double().sum(dim=-1)
        assert torch.allclose(sums, torch.ones_like(sums), atol=0.05), sums


def _smallest_block(variant: str, spec: OpSpec) -> Config:
    """The config with the smallest blocks: for online, 64-column steps through the row."""
    return OP.variant(variant).space(spec).configs()[0]


@pytest.mark.filterwarnings("error::RuntimeWarning")
@pytest.mark.parametrize("variant", ALL_VARIANTS)
def test_masked_prefix(variant: str, device: str) -> None:
    """Rows starting with -inf (masked attention scores): online's rescale must not make NaN.

    With 64-column blocks the first three blocks of every row are -inf throughout, so the running
    max is still -inf when they are folded in: -inf - (-inf) would be NaN without the guard.
    """
    spec = OP.spec((5, 300), "float32")
    (x,) = OP.make_inputs(spec, seed=2, distribution="normal", device=device)
    x[:, :200] = float("-inf")
    x[1, :299] = float("-inf")  # one row with a single finite value: softmax is exactly one-hot
    config = _smallest_block(variant, spec)
    y = run_variant(variant, spec, config, x)
    assert_close_to_reference(y, spec, x, f"{variant} {config.key}")
    assert torch.all(y[:, :200] == 0)
    assert y[1, 299].item() == 1.0


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # -inf - (-inf) is computed on purpose
@pytest.mark.parametrize("variant", ALL_VARIANTS)
def test_fully_masked_row_is_nan_like_torch(variant: str, device: str) -> None:
    spec = OP.spec((3, 100), "float32")
    (x,) = OP.make_inputs(spec, seed=3, distribution="normal", device=device)
    x[1] = float("-inf")
    y = run_variant(variant, spec, _smallest_block(variant, spec), x)
    assert torch.isnan(torch.softmax(x[1], dim=-1)).all()  # what torch does
    assert torch.isnan(y[1]).all()
    assert_close_to_reference(y, spec, x, variant)  # and the other rows are right


# ---- spaces --------------------------------------------------------------------------------------


@pytest.mark.parametrize("width", [1024, 4096, 8192])
def test_space_sizes_are_modest(width: int) -> None:
    spec = OP.spec((8192, width), "bfloat16")
    sizes = {v.name: len(v.space(spec)) for v in OP.variants}
    assert sizes.pop("aligned_row") == 0  # Triton proves these rows aligned: whole_row is the same kernel
    if width <= 4096:
        assert sizes.pop("split_row") == 0  # rows of at most 8 KB are not split
    assert all(size > 0 for size in sizes.values()), sizes
    assert 100 <= sum(sizes.values()) <= 250, sizes


@pytest.mark.parametrize("width", [1, 2, 3, 17, 64])
def test_tiny_rows_have_a_config_in_every_variant(width: int) -> None:
    spec = OP.spec((5, width), "float16")
    for v in OP.variants:
        if (v.name == "aligned_row" and width % 16 == 0) or v.name == "split_row":
            assert len(v.space(spec)) == 0  # rows Triton proves aligned; rows of at most 8 KB
            continue
        assert len(v.space(spec)) > 0, (v.name, width)
    warps = sorted({c["num_warps"] for c in OP.variant("whole_row").space(spec)})
    assert warps == ([1] if width <= 32 else [1, 2])  # at least one value a thread


def test_wide_rows_leave_only_the_variants_that_can_hold_them() -> None:
    def sizes(width: int) -> dict[str, int]:
        spec = OP.spec((2, width), "float32")
        return {v.name: len(v.space(spec)) for v in OP.variants}

    assert sizes(8192)["multi_row"] > 0
    assert sizes(8193)["multi_row"] == 0  # two 16384-padded rows exceed the register budget
    assert sizes(65536)["whole_row"] > 0 and sizes(65536)["persistent"] > 0
    wide = sizes(65537)
    assert wide["whole_row"] == wide["persistent"] == wide["multi_row"] == 0
    assert wide["online"] > 0  # any width: the row is walked in blocks


@pytest.mark.parametrize("width", [3, 100, 1000, 4096, 20000])
@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_every_config_respects_its_budgets(width: int, dtype: str) -> None:
    spec = OP.spec((16, width), dtype)
    block = next_power_of_two(width)
    itemsize = spec.inputs[0].torch_dtype.itemsize
    for c in OP.variant("online").space(spec):
        assert 64 <= c["BLOCK_N"] <= max(64, block)
        assert c["num_warps"] == 1 or 32 * c["num_warps"] <= c["BLOCK_N"]
    for c in OP.variant("multi_row").space(spec):
        assert c["ROWS"] * block <= 16384
        assert c["num_warps"] == 1 or 32 * c["num_warps"] <= c["ROWS"] * block
    for c in OP.variant("persistent").space(spec):
        assert c["PROGRAMS_PER_SM"] * c["num_warps"] <= 64
        assert c["PROGRAMS_PER_SM"] * (c["num_stages"] - 1) * block * itemsize <= 192 * 1024
    for name in VARIANTS:
        for c in OP.variant(name).space(spec):
            elements = block * c.get("ROWS", 1) if name != "online" else c["BLOCK_N"]
            assert elements <= 64 * 32 * c["num_warps"], (name, c)


def test_variants_are_described() -> None:
    assert len(VARIANTS) == len(set(VARIANTS)) >= 3
    for v in OP.variants:
        assert v.summary
        assert re.fullmatch(r"[0-9a-f]{16}", v.source_hash)


# ---- specs ---------------------------------------------------------------------------------------


def test_registry_returns_this_module() -> None:
    assert get_op("softmax") is OP
    assert OP.name == "softmax"
    assert "8192x4096" in OP.shape_help and "last" in OP.shape_help


def test_spec_from_the_command_line() -> None:
    spec = OP.spec((8192, 4096), "bf16")
    assert spec.op == "softmax"
    assert spec.inputs[0].shape == (8192, 4096)
    assert spec.inputs[0].dtype == "bfloat16"
    assert dict(spec.constants) == {"dim": -1}
    assert OP.output_specs(spec) == (spec.inputs[0],)


def test_bytes_and_flops() -> None:
    spec = OP.spec((8192, 4096), "bf16")
    assert OP.bytes_moved(spec) == 2 * 8192 * 4096 * 2 == 134_217_728  # read x, write y
    assert OP.flops(spec) == 5 * 8192 * 4096
    small = OP.spec((2, 3, 5), "float32")
    assert OP.bytes_moved(small) == 2 * 30 * 4
    assert OP.bytes_moved(OP.spec((2, 3, 5), "float16")) == 2 * 30 * 2


# ---- reference and inputs ------------------------------------------------------------------------


def test_references() -> None:
    spec = OP.spec((4, 33), "bfloat16")
    (x,) = OP.make_inputs(spec, seed=0, device="cpu")
    (low,) = OP.reference(spec, (x,))
    (ref,) = OP.reference_fp64(spec, (x,))
    assert low.dtype == torch.bfloat16 and ref.dtype == torch.float64
    assert low.shape == ref.shape == x.shape
    assert torch.allclose(ref.sum(-1), torch.ones(4, dtype=torch.float64))
    assert torch.allclose(low.double(), ref, atol=1e-2)


@pytest.mark.parametrize("distribution", OP.distributions)
def test_make_inputs_is_deterministic(distribution: str, device: str) -> None:
    spec = OP.spec((2, 16, 48), "float16")
    (a,) = OP.make_inputs(spec, seed=7, distribution=distribution, device=device)
    (b,) = OP.make_inputs(spec, seed=7, distribution=distribution, device=device)
    (c,) = OP.make_inputs(spec, seed=8, distribution=distribution, device=device)
    assert a.shape == (2, 16, 48) and a.dtype == torch.float16 and a.device.type == device
    assert torch.equal(a, b)
    assert not torch.equal(a, c)
    assert torch.isfinite(a).all()


def test_distributions_have_their_shape() -> None:
    spec = OP.spec((64, 256), "float16")

    def draw(distribution: str) -> torch.Tensor:
        return OP.make_inputs(spec, seed=1, distribution=distribution, device="cpu")[0].float()

    uniform = draw("uniform")
    assert uniform.min() >= -1 and uniform.max() <= 1
    large = draw("large")
    assert torch.isfinite(large).all()  # representable in float16...
    assert torch.isinf(torch.exp(large)).any()  # ...yet exp alone would overflow even in fp32
    outliers = draw("outliers")
    peak = torch.softmax(outliers.double(), dim=-1).amax(dim=-1)
    assert (peak > 0.99).all()  # every row nearly one-hot
    assert outliers.max() >= 35 and outliers.min() <= -35
    assert not math.isclose(float(draw("normal").std()), 0.0)
    with pytest.raises(ValueError, match="unknown distribution"):
        OP.make_inputs(spec, seed=1, distribution="cauchy", device="cpu")


# ---- a temperature: softmax(x * scale) ---------------------------------------------------------

# (shape, dtype, distribution, scale): small and odd shapes, scales below and above 1 (1 / t for
# t = 2 and 0.7) and a negative one (softmin), whose multiply turns the -inf padding into +inf
# unless the kernels set the padding again.
SCALE_CASES = [
    ((1, 1), "float32", "normal", 0.5),
    ((7, 3), "float16", "outliers", 1 / 0.7),
    ((33, 341), "bfloat16", "large", 0.5),
    ((2, 3, 100), "float16", "uniform", -1.3),
    ((1000,), "float32", "outliers", 1 / 0.7),
    ((7, 37), "bfloat16", "normal", 2.0),
]


@pytest.mark.filterwarnings("error::RuntimeWarning")
@pytest.mark.parametrize("variant", VARIANTS)
def test_scale_reaches_every_variant(variant: str, device: str) -> None:
    """Every config class of one case, the first config of the others, against the float64
    reference; the same config without the scale, on the same inputs, is rejected where the
    data can tell (not on nearly one-hot rows, which any scale above 1 leaves one-hot)."""
    for i, (shape, dtype, distribution, scale) in enumerate(SCALE_CASES):
        spec = OP.spec(shape, dtype, scale=scale)
        configs = covering_configs(OP.variant(variant).space(spec))
        (x,) = OP.make_inputs(spec, seed=i, distribution=distribution, device=device)
        for config in configs if i == 2 else configs[:1]:
            y = run_variant(variant, spec, config, x)
            assert_close_to_reference(y, spec, x, f"{variant} {config.key} {spec.describe()} scale {scale:g}")
        plain = run_variant(variant, OP.spec(shape, dtype), configs[0], x)
        if distribution in ("normal", "uniform") and shape[-1] > 1:
            (ref64,) = OP.reference_fp64(spec, (x,))
            assert check_close(plain, ref64, OP.reference(spec, (x,))[0], OP.tolerance) is not None


@pytest.mark.filterwarnings("error::RuntimeWarning")
@pytest.mark.parametrize("variant", ALL_VARIANTS)
def test_scale_keeps_a_masked_prefix_at_zero(variant: str, device: str) -> None:
    # -inf scores stay -inf under a positive scale: online's guard still holds, the row is right.
    spec = OP.spec((5, 300), "float32", scale=0.125)
    (x,) = OP.make_inputs(spec, seed=2, device=device)
    x[:, :200] = float("-inf")
    y = run_variant(variant, spec, _smallest_block(variant, spec), x)
    assert_close_to_reference(y, spec, x, f"{variant} scale 0.125")
    assert torch.all(y[:, :200] == 0)


def test_scale_specs_leave_other_workloads_alone() -> None:
    x = torch.zeros(4, 8, dtype=torch.bfloat16)
    plain = OP.spec((4, 8), "bfloat16")
    assert OP.spec((4, 8), "bfloat16", scale=1.0) == plain == OP.spec_for(x, dim=-1, scale=1)
    assert plain.constants == {"dim": -1}
    scaled = OP.spec((4, 8), "bfloat16", dim=-1, scale=0.5)  # the pattern's probe
    assert scaled.constants == {"dim": -1, "scale": 0.5} and OP.spec_for(x, scale=0.5) == scaled
    assert scaled.workload_hash != plain.workload_hash
    assert OpSpec.from_dict(scaled.to_dict()).workload_hash == scaled.workload_hash
    for bad in (0, 0.0, math.inf, -math.inf, math.nan, True, "0.5", None):
        with pytest.raises(UnsupportedWorkload, match="scale"):
            OP.spec((4, 8), "float32", scale=bad)
        with pytest.raises(UnsupportedWorkload, match="scale"):
            OP.spec_for(x, scale=bad)


def test_scale_reference_and_inputs(device: str) -> None:
    spec = OP.spec((4, 33), "bfloat16", scale=2.0)
    (x,) = OP.make_inputs(spec, seed=0, distribution="outliers", device=device)
    (low,) = OP.reference(spec, (x,))
    assert torch.equal(low, torch.softmax(x.float() * 2.0, dim=-1).to(torch.bfloat16))  # one rounding
    (ref,) = OP.reference_fp64(spec, (x,))
    assert torch.equal(ref, torch.softmax(x.double() * 2.0, dim=-1))
    # x is drawn divided by the scale: x * scale has the distribution's shape (here one hot value
    # of about +40 a row), so the data tells a missing or doubled scale apart.
    unscaled = OP.make_inputs(OP.spec((4, 33), "bfloat16"), seed=0, distribution="outliers", device=device)[0]
    torch.testing.assert_close((x.float() * 2.0), unscaled.float(), rtol=1e-2, atol=1e-2)


# ---- realigned rows (aligned_row) and rows split across programs (split_row) ------------------
# Their cases against the reference, at unaligned addresses and through the harness:
# test_rowwise_families.py.


def _one_config(variant: str, spec: OpSpec) -> Config:
    """aligned_row: its first config; split_row: the widest chunks that still cut the row (at
    4097 columns, a second chunk that the head and tail can leave empty), few programs either way."""
    configs = OP.variant(variant).space(spec).configs()
    return max(configs, key=lambda c: (c["BLOCK_N"], -c["num_warps"])) if variant == "split_row" else configs[0]


@pytest.mark.filterwarnings("error::RuntimeWarning")
def test_split_row_masked_prefix_and_empty_chunks(device: str) -> None:
    """Rows of 4097 in chunks of 1024: a -inf prefix fills chunks 0-2 (their max is -inf where the
    row's is not), and the head and tail may leave the fifth chunk empty; neither makes a NaN."""
    spec = OP.spec((2, 4097), "float32")
    (x,) = OP.make_inputs(spec, seed=2, device=device)
    x[:, :3500] = float("-inf")
    y = run_variant("split_row", spec, Config(BLOCK_N=1024, num_warps=4), x)
    assert_close_to_reference(y, spec, x, "split_row masked prefix")
    assert torch.all(y[:, :3500] == 0)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # -inf - (-inf) is computed on purpose
def test_split_row_fully_masked_row_is_nan_like_torch(device: str) -> None:
    spec = OP.spec((3, 2049), "float32")
    (x,) = OP.make_inputs(spec, seed=3, device=device)
    x[1] = float("-inf")
    y = run_variant("split_row", spec, _one_config("split_row", spec), x)
    assert torch.isnan(y[1]).all()
    assert_close_to_reference(y, spec, x, "split_row")  # and the other rows are right



"""The row-reduction families (sum, mean, max over the last dim): spaces, specs, inputs, and what
is peculiar to their kernels (agreeing with the PyTorch call they replace, special values, the
compensated sum).

What the row-wise families share (every variant's config classes on small and odd shapes against
the float64 reference, the harness, the validation specs' tails, launchers that take views only
and reject configs outside their space) is tested once for all of them in
test_rowwise_families.py. Kernels run in the Triton interpreter without a GPU. Every kernel test
here pre-fills the output with NaN, so a kernel that skips a row fails, and compares with the
tolerance the harness applies (``check_close``: at most a few times PyTorch's own error in the
same dtype).
"""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest
import torch

from kernelsmith.evaluate.errors import check_close
from kernelsmith.evaluate.validate import _canary_problem
from kernelsmith.ops import UnsupportedWorkload
from kernelsmith.ops._base import OpFamily
from kernelsmith.ops.reductions import MAX, MEAN, SUM
from kernelsmith.space import Config, next_power_of_two
from kernelsmith.spec import OpSpec
from kernelsmith.testing.kernels import covering_configs

FAMILIES = {"sum": SUM, "mean": MEAN, "max": MAX}
NAMES = list(FAMILIES)
VARIANTS = ["whole_row", "looped", "multi_row"]
DTYPES = ("float16", "bfloat16", "float32")
TORCH_OPS: dict[str, Callable[..., torch.Tensor]] = {"sum": torch.sum, "mean": torch.mean, "max": torch.amax}


def run_variant(op: OpFamily, variant: str, spec: OpSpec, config: Config, x: torch.Tensor) -> torch.Tensor:
    """Launch one config into a NaN-filled output; check x is untouched; return the output."""
    x_before = x.clone()
    (out_spec,) = op.output_specs(spec)
    y = torch.full(out_spec.shape, float("nan"), dtype=x.dtype, device=x.device)
    op.variant(variant).build(spec, config)((x,), (y,))
    assert torch.equal(_bits(x), _bits(x_before)), f"{op.name} {variant} {config.key} modified its input"
    return y


def _bits(t: torch.Tensor) -> torch.Tensor:
    """The raw bits, so that inputs holding NaN compare equal to their clones."""
    return t.view({2: torch.int16, 4: torch.int32}[t.element_size()])


def assert_close_to_reference(op: OpFamily, y: torch.Tensor, spec: OpSpec, x: torch.Tensor, what: str) -> None:
    (ref64,) = op.reference_fp64(spec, (x,))
    (lowp,) = op.reference(spec, (x,))
    assert y.shape == ref64.shape and y.dtype == x.dtype, what
    problem = check_close(y, ref64, lowp, op.tolerance)
    assert problem is None, f"{what}: {problem}"


# ---- the families' kernels: shared spaces, every dtype and distribution ---------------------------


def test_families_share_their_spaces() -> None:
    """The reduction kind is a constexpr of the same kernels: the spaces do not depend on it."""
    spec = {name: op.spec((64, 1000), "bf16") for name, op in FAMILIES.items()}
    for variant in VARIANTS:
        configs = {name: op.variant(variant).space(spec[name]).configs() for name, op in FAMILIES.items()}
        assert configs["sum"] == configs["mean"] == configs["max"], variant


@pytest.mark.filterwarnings("error::RuntimeWarning")
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", NAMES)
def test_dtypes_and_distributions(name: str, dtype: str, variant: str, device: str) -> None:
    op = FAMILIES[name]
    spec = op.spec((9, 200), dtype)
    configs = op.variant(variant).space(spec).configs()
    for distribution in op.distributions:
        (x,) = op.make_inputs(spec, seed=5, distribution=distribution, device=device)
        for config in {configs[0], configs[-1]}:
            y = run_variant(op, variant, spec, config, x)
            assert y.dtype == x.dtype and y.shape == (9,)
            assert_close_to_reference(op, y, spec, x, f"{name} {variant} {config.key} {distribution}")
            # And agrees with the PyTorch call it replaces in float64, up to one rounding of the
            # output and the float32 accumulation's (tiny) error.
            expected = TORCH_OPS[name](x.double(), dim=-1)
            slack = 2 * torch.finfo(x.dtype).eps * expected.abs() + 1e-5 * x.double().abs().sum(dim=-1)
            assert ((y.double() - expected).abs() <= slack).all(), (y, expected)


# ---- through the harness itself ------------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_the_harness_specs_have_tails(name: str) -> None:
    """The specs test_rowwise_families.py validates on have two tails or more: 1 row and an odd count."""
    op = FAMILIES[name]
    for spec in (op.spec((9, 100), "bfloat16"), op.spec((2, 3, 5), "float16")):
        tails = [s.inputs[0].shape[:-1] for s in op.validation_specs(spec)[1:]]
        assert len(tails) >= 2 and (1,) in tails, tails


# ---- special values ------------------------------------------------------------------------------


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_max_propagates_nan_like_torch_amax(variant: str, dtype: str, device: str) -> None:
    spec = MAX.spec((6, 300), dtype)
    (x,) = MAX.make_inputs(spec, seed=1, distribution="normal", device=device)
    x[0, 17] = float("nan")  # one NaN in the middle
    x[1, 299] = float("nan")  # in the last column (the last, partial block of looped)
    x[2, :] = float("nan")
    x[3, 5] = -float("nan")  # a NaN with the sign bit set
    x[4, 7] = float("inf")
    x[4, 8] = float("nan")  # NaN wins over +inf too
    expected = torch.amax(x, dim=-1)
    assert torch.isnan(expected[:5]).all()
    for config in covering_configs(MAX.variant(variant).space(spec)):
        y = run_variant(MAX, variant, spec, config, x)
        assert torch.isnan(y[:5]).all(), (config.key, y)
        assert torch.equal(y[5:], expected[5:]), config.key
        assert_close_to_reference(MAX, y, spec, x, f"{variant} {config.key}")


@pytest.mark.parametrize("variant", VARIANTS)
def test_max_of_infinite_and_negative_rows(variant: str, device: str) -> None:
    spec = MAX.spec((7, 300), "bfloat16")
    (x,) = MAX.make_inputs(spec, seed=2, distribution="normal", device=device)
    x[0] = float("-inf")  # -inf throughout: the max is -inf
    x[1, :299] = float("-inf")  # one finite value
    x[2, 150] = float("inf")
    x[3] = -x[3].abs() - 1  # negative throughout: a kernel padding with 0 would say 0
    x[4] = -0.0
    x[5] = torch.finfo(torch.bfloat16).min
    x[6, 100:] = float("-inf")
    for config in covering_configs(MAX.variant(variant).space(spec)):
        y = run_variant(MAX, variant, spec, config, x)
        assert torch.equal(y, torch.amax(x, dim=-1)), (config.key, y)
        assert y[0].item() == float("-inf") and y[2].item() == float("inf") and y[3].item() < 0
        assert_close_to_reference(MAX, y, spec, x, f"{variant} {config.key}")


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # inf - inf is computed on purpose
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("name", ["sum", "mean"])
def test_sums_of_infinities_and_nan_match_torch(name: str, variant: str, device: str) -> None:
    """An inf makes the sum inf, inf and -inf (or a NaN) make it NaN: the looped kernel's
    compensation must not turn an infinite sum into NaN."""
    op = FAMILIES[name]
    spec = op.spec((5, 300), "float32")
    (x,) = op.make_inputs(spec, seed=3, distribution="normal", device=device)
    x[0, 10] = float("inf")  # in the first block: every later block is added to an inf
    x[1, 250] = float("-inf")
    x[2, 10], x[2, 200] = float("inf"), float("-inf")
    x[3, 100] = float("nan")
    expected = TORCH_OPS[name](x, dim=-1)
    for config in covering_configs(op.variant(variant).space(spec)):
        y = run_variant(op, variant, spec, config, x)
        assert y[0].item() == float("inf") and y[1].item() == float("-inf"), (config.key, y)
        assert torch.isnan(y[2]) and torch.isnan(y[3]), (config.key, y)
        assert torch.allclose(y[4], expected[4]), config.key


def test_looped_sum_is_compensated(device: str) -> None:
    """Each lane first holds 2**24, then adds 100 ones, then subtracts 2**24: a plain float32
    running sum loses every one (2**24 + 1 rounds back to 2**24) and ends at 0; the compensated
    sum of the looped kernel is exact."""
    block = 64
    spec = SUM.spec((2, block * 102), "float32")
    x = torch.ones(spec.inputs[0].shape, device=device)
    x[:, :block] = 2.0**24
    x[:, -block:] = -(2.0**24)
    plain = torch.zeros(block, device=device)
    for chunk in x[0].view(-1, block):
        plain += chunk
    assert float(plain.sum()) == 0.0  # what an uncompensated per-lane sum would give
    config = Config(BLOCK_N=block, num_warps=1, num_stages=2)
    for op, exact in ((SUM, 100.0 * block), (MEAN, 100.0 * block / spec.inputs[0].shape[-1])):
        y = run_variant(op, "looped", spec, config, x)
        assert torch.equal(y, torch.full_like(y, exact)), (op.name, y)


def test_mean_divides_by_the_width_exactly(device: str) -> None:
    """mean is the sum divided by N, correctly rounded: ones give exactly 1, threes exactly 3."""
    spec = MEAN.spec((2, 3, 1000), "float32")
    x = torch.ones(spec.inputs[0].shape, device=device)
    x[1] = 3.0
    for variant in VARIANTS:
        y = run_variant(MEAN, variant, spec, MEAN.variant(variant).space(spec).configs()[0], x)
        assert torch.equal(y, torch.tensor([[1.0] * 3, [3.0] * 3], device=device)), (variant, y)


# ---- launchers -----------------------------------------------------------------------------------


@pytest.mark.parametrize("variant", VARIANTS)
def test_bucketed_spec_builds_and_runs(variant: str, device: str) -> None:
    """The tuner looks configs up by the bucketed (rows rounded up to a power of two) 2-D spec."""
    spec = SUM.spec((3, 5, 100), "float16")
    bucket = SUM.bucket(spec)
    assert bucket.inputs[0].shape == (16, 100)
    assert SUM.output_specs(bucket)[0].shape == (16,)
    config = SUM.variant(variant).space(bucket).configs()[0]
    (x,) = SUM.make_inputs(spec, seed=6, device=device)
    y = run_variant(SUM, variant, spec, config, x)
    assert y.shape == (3, 5)
    assert_close_to_reference(SUM, y, spec, x, variant)


# ---- spaces --------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(8192, 4096), (32768, 1024), (4096, 8192), (8192, 256)])
@pytest.mark.parametrize("name", NAMES)
def test_space_sizes_are_modest(name: str, shape: tuple[int, int]) -> None:
    op = FAMILIES[name]
    spec = op.spec(shape, "bfloat16")
    sizes = {v.name: len(v.space(spec)) for v in op.variants}
    # split_row has its own tests (test_reductions_split_row.py); its space is empty for rows of
    # at most 8 KB, so that the spaces recorded for those rows are unchanged.
    assert [v.name for v in op.variants] == [*VARIANTS, "split_row"]
    assert all(sizes[name] > 0 for name in VARIANTS), sizes
    assert (sizes["split_row"] > 0) == (shape[1] * 2 > 8192), sizes
    assert 30 <= sum(sizes.values()) <= 200, sizes
    if shape == (8192, 4096):
        assert sizes == {"whole_row": 10, "looped": 78, "multi_row": 7, "split_row": 0}
    if shape == (32768, 1024):
        assert sizes == {"whole_row": 12, "looped": 42, "multi_row": 18, "split_row": 0}


@pytest.mark.parametrize("width", [1, 2, 3, 17, 64, 100])
def test_tiny_rows_have_a_config_in_every_variant(width: int) -> None:
    spec = SUM.spec((5, width), "float16")
    for name in VARIANTS:
        assert len(SUM.variant(name).space(spec)) > 0, (name, width)
    assert len(SUM.variant("split_row").space(spec)) == 0  # a row of 8 KB or less is never split
    warps = sorted({c["num_warps"] for c in SUM.variant("whole_row").space(spec)})
    assert warps == ([1] if width <= 32 else [1, 2] if width <= 64 else [1, 2, 4])
    assert {c["BLOCK_N"] for c in SUM.variant("looped").space(spec)} == {64}


def test_wide_rows_leave_only_the_variants_that_can_hold_them() -> None:
    def sizes(width: int) -> dict[str, int]:
        spec = MAX.spec((2, width), "float32")
        return {v.name: len(v.space(spec)) for v in MAX.variants}

    assert sizes(8192)["multi_row"] > 0
    assert sizes(8193)["multi_row"] == 0  # two 16384-padded rows exceed the register budget
    assert sizes(65536)["whole_row"] > 0
    wide = sizes(65537)
    assert wide["whole_row"] == wide["multi_row"] == 0
    assert wide["looped"] > 0  # any width: the row is walked in blocks
    assert wide["split_row"] > 0  # cut in chunks across programs (up to 1024 chunks of 8192)
    assert sizes(10**7)["looped"] > 0


@pytest.mark.parametrize("width", [3, 100, 1000, 4096, 20000])
def test_every_config_respects_its_budgets(width: int) -> None:
    spec = MEAN.spec((16, width), "float32")
    block = next_power_of_two(width)
    for c in MEAN.variant("looped").space(spec):
        assert c["BLOCK_N"] < block or c["BLOCK_N"] == 64
        assert c["num_warps"] == 1 or 32 * c["num_warps"] <= c["BLOCK_N"]
        assert c["num_stages"] in (1, 2, 3)
    for c in MEAN.variant("multi_row").space(spec):
        assert c["ROWS"] * block <= 16384
        assert "num_stages" not in c  # no loop to pipeline
    assert "num_stages" not in MEAN.variant("whole_row").space(spec).configs()[0]
    for variant in VARIANTS:
        for c in MEAN.variant(variant).space(spec):
            elements = c["BLOCK_N"] if variant == "looped" else block * c.get("ROWS", 1)
            # At most 64 values a thread: no spills, and a short sequential part in GPU sums.
            assert elements <= 64 * 32 * c["num_warps"], (variant, c)


def test_variants_are_described() -> None:
    for op in FAMILIES.values():
        assert [v.name for v in op.variants] == [*VARIANTS, "split_row"]
        for v in op.variants:
            assert v.summary
            assert re.fullmatch(r"[0-9a-f]{16}", v.source_hash)


# ---- specs ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_spec_from_the_command_line(name: str) -> None:
    op = FAMILIES[name]
    assert op.name == name and op.rowwise
    assert "8192x4096" in op.shape_help and "last" in op.shape_help
    spec = op.spec((8192, 4096), "bf16")
    assert spec.op == name
    assert spec.inputs[0].shape == (8192, 4096) and spec.inputs[0].dtype == "bfloat16"
    assert dict(spec.constants) == {"dim": -1}
    (out,) = op.output_specs(spec)
    assert out.shape == (8192,) and out.dtype == "bfloat16"
    assert op.output_specs(op.spec((2, 3, 5), "float16"))[0].shape == (2, 3)
    assert op.output_specs(op.spec((5,), "float32"))[0].shape == ()  # torch.sum of a 1-D x is 0-d


def test_spec_takes_a_dim_tuple_and_keepdim_false_only() -> None:
    # (the last-dim and tensor rules they share with softmax: test_rowwise_families.py)
    x = torch.zeros(3, 5, 7, dtype=torch.float16)
    for op in FAMILIES.values():
        assert op.spec((4, 8), "float32", dim=(-1,)) == op.spec((4, 8), "float32", keepdim=False)
        assert op.spec_for(x, dim=-1, keepdim=False) == op.spec_for(x, dim=-1)
        with pytest.raises(UnsupportedWorkload, match="keepdim"):
            op.spec((4, 8), "float32", keepdim=True)
    assert SUM.spec((4, 8), "float32") != MEAN.spec((4, 8), "float32")  # the op is in the spec


def test_bytes_and_flops() -> None:
    spec = SUM.spec((8192, 4096), "bf16")
    assert SUM.bytes_moved(spec) == 8192 * 4096 * 2 + 8192 * 2  # read x, write one value a row
    assert MAX.bytes_moved(MAX.spec((8192, 4096), "bf16")) == SUM.bytes_moved(spec)
    assert SUM.flops(spec) == MAX.flops(MAX.spec((8192, 4096), "bf16")) == 8192 * 4096
    assert MEAN.flops(MEAN.spec((8192, 4096), "bf16")) == 8192 * 4096 + 8192
    assert MEAN.bytes_moved(MEAN.spec((2, 3, 5), "float32")) == (30 + 6) * 4
    assert SUM.bytes_moved(SUM.spec((5,), "float16")) == (5 + 1) * 2


# ---- references and inputs -----------------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_references(name: str) -> None:
    op = FAMILIES[name]
    spec = op.spec((4, 3, 33), "bfloat16")
    (x,) = op.make_inputs(spec, seed=0, distribution="positive", device="cpu")
    (low,) = op.reference(spec, (x,))
    (ref,) = op.reference_fp64(spec, (x,))
    assert low.dtype == torch.bfloat16 and ref.dtype == torch.float64
    assert low.shape == ref.shape == (4, 3)
    assert torch.equal(ref, TORCH_OPS[name](x.double(), dim=-1))
    assert torch.allclose(low.double(), ref, rtol=1e-2)
    assert check_close(low, ref, low, op.tolerance) is None


@pytest.mark.parametrize("name", NAMES)
def test_make_inputs_is_deterministic(name: str, device: str) -> None:
    op = FAMILIES[name]
    spec = op.spec((2, 16, 48), "float16")
    for distribution in op.distributions:
        (a,) = op.make_inputs(spec, seed=7, distribution=distribution, device=device)
        (b,) = op.make_inputs(spec, seed=7, distribution=distribution, device=device)
        (c,) = op.make_inputs(spec, seed=8, distribution=distribution, device=device)
        assert a.shape == (2, 16, 48) and a.dtype == torch.float16 and a.device.type == device
        assert torch.equal(a, b), distribution
        assert not torch.equal(a, c), distribution
        assert torch.isfinite(a).all(), distribution


def test_distributions_have_their_shape() -> None:
    assert SUM.distributions == MEAN.distributions == ("normal", "positive", "large")
    assert MAX.distributions == ("normal", "positive", "large", "negative_ties")

    def draw(op: OpFamily, distribution: str, shape: tuple[int, ...] = (64, 256)) -> torch.Tensor:
        return op.make_inputs(op.spec(shape, "float16"), seed=1, distribution=distribution, device="cpu")[0].float()

    positive = draw(SUM, "positive")
    assert positive.min() >= 0 and positive.max() <= 1
    row_max = positive.amax(dim=-1)
    assert row_max.max() - row_max.min() > 0.3  # rows are scaled differently
    large = draw(MEAN, "large")
    assert large.abs().max() > 10000 and torch.isfinite(large).all()
    assert (large.sum(dim=-1).abs() > 65504).any()  # row sums past float16's range: accumulate in float32
    assert draw(MAX, "large").abs().max() > 10000
    assert draw(SUM, "large", (64, 4)).abs().max() > 1000  # narrow rows: large elements...
    assert draw(SUM, "large", (64, 4096)).sum(-1).abs().max() < 20000  # ...wide rows: sums that fit
    ties = draw(MAX, "negative_ties")
    assert ties.max() < 0
    assert torch.equal(ties * 4, (ties * 4).round())  # multiples of 1/4, exact in every dtype
    assert ((ties == ties.amax(dim=-1, keepdim=True)).sum(dim=-1) > 1).all()  # the max is tied
    assert ties.amax(dim=-1).unique().numel() > 10  # and differs between rows
    with pytest.raises(ValueError, match="unknown distribution"):
        SUM.make_inputs(SUM.spec((2, 4), "float16"), seed=1, distribution="negative_ties", device="cpu")
    with pytest.raises(ValueError, match="unknown distribution"):
        MAX.make_inputs(MAX.spec((2, 4), "float16"), seed=1, distribution="cauchy", device="cpu")


@pytest.mark.parametrize("shape", [(64, 4096), (2, 2**17), (512, 7)])
@pytest.mark.parametrize("name", NAMES)
def test_results_fit_float16_and_canaries_fail_on_wide_rows(name: str, shape: tuple[int, int]) -> None:
    """On rows far wider than the kernel tests use: PyTorch's own float16 result stays finite (a
    sum past 65504 would be inf where the float64 reference is not, and fail every candidate),
    and the harness's zero and constant canaries fail the tolerance (rows differ enough)."""
    op = FAMILIES[name]
    for dtype in DTYPES:
        spec = op.spec(shape, dtype)
        for distribution in op.distributions:
            (x,) = op.make_inputs(spec, seed=3, distribution=distribution, device="cpu")
            (ref64,) = op.reference_fp64(spec, (x,))
            (lowp,) = op.reference(spec, (x,))
            assert torch.isfinite(lowp).all(), (dtype, distribution)
            assert _canary_problem(op, spec, (x,), ref64, lowp) is None, (dtype, distribution)


def test_registry_attributes() -> None:
    """The registry maps names to "module:ATTR": each family sits under its own attribute."""
    import importlib

    module = importlib.import_module("kernelsmith.ops.reductions")
    for name, attribute in (("sum", "SUM"), ("mean", "MEAN"), ("max", "MAX")):
        op = getattr(module, attribute)
        assert op is FAMILIES[name] and op.name == name and isinstance(op, OpFamily)

"""The cross-entropy op family: its kernels (in the Triton interpreter without a GPU), spaces and specs.

Every kernel test launches into a NaN-filled output (a kernel that skips an element fails) and
compares with the float64 reference under the harness's own tolerance (``check_close``: at most
a few times PyTorch's own float32 error). The interpreter is slow, so shapes stay small and each
variant runs a *covering* set of configs, in which every value of every parameter appears.
"""

from __future__ import annotations

import math
import re

import pytest
import torch
import torch.nn.functional as F
from cross_entropy_cases import (
    REDUCTIONS,
    assert_build_rejects_a_config_outside_the_space,
    assert_every_planned_config,
    assert_the_plan_takes_every_value,
    plan_configs,
    reduction_sweep,
    run_launcher,
    shape_cases,
)
from cross_entropy_cases import assert_correct as assert_outputs_correct

from kernelsmith.evaluate.validate import TorchOpWatch, validate
from kernelsmith.ops import UnsupportedWorkload
from kernelsmith.ops._base import tail_rows
from kernelsmith.ops.cross_entropy import OP
from kernelsmith.space import Config
from kernelsmith.spec import OpSpec, TensorSpec

VARIANTS = [v.name for v in OP.variants]


def run_variant(variant: str, spec: OpSpec, config: Config, inputs: tuple[torch.Tensor, ...]) -> torch.Tensor:
    """Launch one config into a NaN-filled, guarded loss; check the inputs are untouched."""
    (out,) = run_launcher(OP, variant, spec, config, inputs)
    return out


def assert_correct(out: torch.Tensor, spec: OpSpec, inputs: tuple[torch.Tensor, ...], what: str) -> None:
    assert_outputs_correct(OP, [out], spec, inputs, what)


# ---- every variant, every config class, small and odd shapes ------------------------------------

# The odd shapes of cross_entropy_cases.py; split_vocab's 6 chunks of 7 x 3000 under "none".
SHAPE_CASES = shape_cases(split_vocab_reduction="none")
PLAN = plan_configs(OP, SHAPE_CASES)


# RuntimeWarnings are errors: with finite logits no kernel may compute a NaN or an overflow, not
# even in masked lanes, in ignored rows or in the rows past the end of a combine block.
@pytest.mark.filterwarnings("error::RuntimeWarning")
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("index", range(len(SHAPE_CASES)), ids=[str(c) for c in SHAPE_CASES])
def test_every_config_class(variant: str, index: int, device: str) -> None:
    assert_every_planned_config(OP, variant, SHAPE_CASES, PLAN, index, device)


@pytest.mark.parametrize("variant", VARIANTS)
def test_the_configs_run_take_every_parameter_value(variant: str) -> None:
    """Across SHAPE_CASES, the configs run above take every value of every parameter."""
    assert_the_plan_takes_every_value(OP, variant, SHAPE_CASES, PLAN)


@pytest.mark.filterwarnings("error::RuntimeWarning")
@pytest.mark.parametrize("variant", VARIANTS)
def test_every_dtype_reduction_and_smoothing(variant: str, device: str) -> None:
    """Every (dtype, reduction, smoothing) with ignored rows (cross_entropy_cases.reduction_sweep);
    "none" gives torch's 0 for ignored rows."""
    for run in reduction_sweep(OP, variant, device):
        out = run_variant(variant, run.spec, run.config, run.inputs)
        assert_correct(out, run.spec, run.inputs, f"{variant} {run.config.key} {run.spec.describe()} "
                       f"{run.distribution}")  # fmt: skip
        if run.spec.const("reduction") == "none":
            assert torch.all(out[run.ignored] == 0)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_reduction_over_many_row_blocks(variant: str, reduction: str, device: str, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The final reduction loops over rows in blocks (1024 rows on a GPU; 16 here, so that 67
    rows take five steps with a ragged last one); split_vocab's combine then runs several
    programs (64 rows each) that write per-row losses for it."""
    from kernelsmith.ops import _cross_entropy_launch

    monkeypatch.setattr(_cross_entropy_launch, "_REDUCE_BLOCK", 16)
    spec = OP.spec((67, 20), "bfloat16", reduction=reduction, label_smoothing=0.1)
    inputs = OP.make_inputs(spec, seed=5, distribution="large", device=device)
    out = run_variant(variant, spec, OP.variant(variant).space(spec).configs()[-1], inputs)
    assert_correct(out, spec, inputs, f"{variant} {reduction}")


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_every_row_ignored_is_like_torch(variant: str, smoothing: float, device: str) -> None:
    """mean over no rows is NaN (0 / 0, as in torch); sum is 0; none is all zeros."""
    expected = {"mean": math.nan, "sum": 0.0}
    for reduction in REDUCTIONS:
        spec = OP.spec((5, 40), "bfloat16", reduction=reduction, label_smoothing=smoothing)
        logits, target = OP.make_inputs(spec, seed=1, device=device)
        target = torch.full_like(target, -100)
        out = run_variant(variant, spec, OP.variant(variant).space(spec).configs()[0], (logits, target))
        (torch_out,) = OP.reference(spec, (logits, target))
        assert torch.equal(out, torch_out) or (out.isnan().all() and torch_out.isnan().all())
        if reduction == "none":
            assert torch.equal(out, torch.zeros(5))
        else:
            value = float(out)
            assert (math.isnan(value) and math.isnan(expected[reduction])) or value == expected[reduction]


@pytest.mark.filterwarnings("error::RuntimeWarning")
@pytest.mark.parametrize("variant", VARIANTS)
def test_masked_vocabulary_prefix(variant: str, device: str) -> None:
    """-inf logits (a masked-out part of the vocabulary) at the start of every row: the running
    max is -inf through the first blocks (and whole split chunks), which must not make NaN."""
    spec = OP.spec((4, 1500), "float32", reduction="none")
    logits, target = OP.make_inputs(spec, seed=2, distribution="peaked", device=device)
    logits[:, :1100] = -math.inf
    target = torch.tensor([1200, 1499, -100, 1100])
    space = OP.variant(variant).space(spec)
    for config in (space.configs()[0], space.configs()[-1]):
        out = run_variant(variant, spec, config, (logits, target))
        assert torch.isfinite(out).all(), (config.key, out)
        assert_correct(out, spec, (logits, target), f"{variant} {config.key}")


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("variant", VARIANTS)
def test_out_of_range_target_is_nan_and_reads_nothing_outside(variant: str, device: str) -> None:
    """torch raises on a target outside [0, V); the kernels cannot raise, so that row is NaN
    (and no load leaves the row: the scalar load of x[t] is masked)."""
    spec = OP.spec((4, 64), "float32", reduction="none")
    logits, target = OP.make_inputs(spec, seed=3, device=device)
    target = torch.tensor([5, 64, -1, -100])
    out = run_variant(variant, spec, OP.variant(variant).space(spec).configs()[-1], (logits, target))
    assert math.isnan(float(out[1])) and math.isnan(float(out[2]))
    assert float(out[3]) == 0.0
    expected = F.cross_entropy(logits[:1].double(), target[:1], reduction="none")
    assert torch.allclose(out[:1].double(), expected, rtol=1e-6)


@pytest.mark.parametrize("variant", VARIANTS)
def test_the_harness_accepts_each_variant(variant: str, device: str) -> None:
    """The real harness: the tails, every distribution (the stress data on the tails), canaries,
    input mutation, and two runs that must agree bit for bit (the mean must be deterministic)."""
    spec = OP.spec((12, 100), "bfloat16", reduction="mean", label_smoothing=0.1)
    config = OP.variant(variant).space(spec).configs()[-1]
    runs = validate(OP, spec, OP.variant(variant).build, config, device, lambda: None)
    assert runs == 2 * (len(OP.distributions) + len(OP.validation_specs(spec)) - 1)


def test_the_harness_accepts_per_row_losses(device: str) -> None:
    """reduction="none" through the harness: canaries are live (zeros or a constant would pass
    for the right (R,) output otherwise), and the split combine writes every row."""
    spec = OP.spec((12, 100), "float16", reduction="none")
    config = OP.variant("split_vocab").space(spec).configs()[0]
    runs = validate(OP, spec, OP.variant("split_vocab").build, config, device, lambda: None)
    assert runs == 2 * (len(OP.distributions) + len(OP.validation_specs(spec)) - 1)


@pytest.mark.parametrize("variant", VARIANTS)
def test_two_runs_agree_bit_for_bit(variant: str, device: str) -> None:
    spec = OP.spec((67, 40), "float16", reduction="mean", label_smoothing=0.1)
    inputs = OP.make_inputs(spec, seed=4, distribution="large", device=device)
    config = OP.variant(variant).space(spec).configs()[0]
    first = run_variant(variant, spec, config, inputs)
    second = run_variant(variant, spec, config, inputs)
    assert torch.equal(first.view(torch.int32), second.view(torch.int32))
    assert_correct(first, spec, inputs, variant)


@pytest.mark.parametrize("variant", VARIANTS)
def test_launcher_is_reusable_and_issues_no_torch_compute(variant: str, device: str) -> None:
    """A launcher keeps no state between calls, and only takes views and allocates its scratch
    (the harness watches candidates with a dispatch mode)."""
    spec = OP.spec((6, 50), "bfloat16", reduction="sum", label_smoothing=0.1)
    launch = OP.variant(variant).build(spec, OP.variant(variant).space(spec).configs()[-1])
    results = []
    for seed in (1, 2):
        inputs = OP.make_inputs(spec, seed=seed, device=device)
        out = torch.full((), math.nan)
        watch = TorchOpWatch()
        with watch:
            launch(inputs, (out,))
        assert watch.issued == []
        assert_correct(out, spec, inputs, f"{variant} seed {seed}")
        results.append(float(out))
    assert results[0] != results[1]


@pytest.mark.parametrize("variant", VARIANTS)
def test_build_rejects_a_config_outside_the_space(variant: str) -> None:
    assert_build_rejects_a_config_outside_the_space(OP, variant)


# ---- spaces --------------------------------------------------------------------------------------


def sizes(rows: int, vocab: int, dtype: str = "bfloat16") -> dict[str, int]:
    spec = OP.spec((rows, vocab), dtype)
    return {v.name: len(v.space(spec)) for v in OP.variants}


def test_space_sizes_are_modest() -> None:
    llama3 = sizes(8192, 128256)
    assert llama3["whole_row"] == 0  # a 128256-wide row does not fit in registers
    assert llama3["online_row"] > 0 and llama3["split_vocab"] > 0
    assert 50 <= sum(llama3.values()) <= 250, llama3
    few_rows = sizes(64, 128256)
    assert few_rows["split_vocab"] > llama3["split_vocab"]  # more splits pay with fewer rows
    assert sum(few_rows.values()) <= 320, few_rows
    gpt2 = sizes(8192, 50257)
    assert gpt2["whole_row"] > 0 and 50 <= sum(gpt2.values()) <= 250, gpt2


@pytest.mark.parametrize("vocab", [1, 2, 3, 17, 64])
@pytest.mark.parametrize("rows", [1, 7, 100_000])
def test_tiny_vocabularies_have_a_config_in_every_variant(rows: int, vocab: int) -> None:
    assert all(size > 0 for size in sizes(rows, vocab).values()), (rows, vocab)


def test_whole_row_stops_at_65536_columns_and_the_others_go_on() -> None:
    assert sizes(2, 65536)["whole_row"] > 0
    wide = sizes(2, 65537)
    assert wide["whole_row"] == 0
    assert wide["online_row"] > 0 and wide["split_vocab"] > 0
    huge = sizes(3, 10_000_000)  # far more steps than the step limit: the widest block remains
    assert huge["online_row"] > 0 and huge["split_vocab"] > 0


@pytest.mark.parametrize(("rows", "vocab"), [(1, 3), (7, 1000), (64, 128256), (8192, 128256), (4, 50257)])
def test_every_config_respects_its_budgets(rows: int, vocab: int) -> None:
    spec = OP.spec((rows, vocab), "float16")
    for c in OP.variant("online_row").space(spec):
        assert c["num_warps"] == 1 or 32 * c["num_warps"] <= c["BLOCK_V"] <= 32 * 32 * c["num_warps"]
        assert c["BLOCK_V"] <= max(64, 1 << (vocab - 1).bit_length())
        assert math.ceil(vocab / c["BLOCK_V"]) <= 512 or c["BLOCK_V"] == 8192
    for c in OP.variant("split_vocab").space(spec):
        assert 32 * c["num_warps"] <= c["BLOCK_V"] <= 32 * 32 * c["num_warps"]
        assert rows * c["SPLITS"] <= 8192 or c["SPLITS"] == 2
    for c in OP.variant("whole_row").space(spec):
        block = 1 << (vocab - 1).bit_length()
        assert block <= 65536 and (c["num_warps"] == 1 or 32 * c["num_warps"] <= block)
    for name in VARIANTS:  # loop-free whole_row has no pipelining depth to tune
        has_stages = "num_stages" in {p.name for p in OP.variant(name).space(spec).params}
        assert has_stages == (name != "whole_row")


@pytest.mark.parametrize(("rows", "vocab"), [(8192, 128256), (64, 128256), (60, 50257), (5, 1000)])
def test_a_config_stays_valid_for_every_validation_spec(rows: int, vocab: int) -> None:
    """The harness builds the target's config for the tail shapes too: no space may drop it."""
    target = OP.spec((rows, vocab), "bfloat16")
    for variant in OP.variants:
        configs = variant.space(target).configs()
        for spec in OP.validation_specs(target)[1:]:
            tail = variant.space(spec)
            assert all(c in tail for c in configs), (variant.name, spec.describe())


def test_split_chunks_cover_the_vocabulary_in_whole_blocks() -> None:
    from kernelsmith.ops._cross_entropy_launch import _split_layout

    for vocab in (1, 3, 1000, 50257, 128256):
        for splits in (2, 8, 64):
            for block in (512, 4096):
                chunk, n = _split_layout(vocab, splits, block)
                assert chunk % block == 0 and 1 <= n <= splits
                assert (n - 1) * chunk < vocab <= n * chunk  # every chunk starts inside the row


def test_variants_are_described() -> None:
    assert VARIANTS == ["online_row", "split_vocab", "whole_row"]
    for v in OP.variants:
        assert v.summary
        assert re.fullmatch(r"[0-9a-f]{16}", v.source_hash)


# ---- specs ---------------------------------------------------------------------------------------


def test_spec_from_the_command_line() -> None:
    spec = OP.spec((8192, 128256), "bf16")
    assert spec.op == OP.name == "cross_entropy"
    assert spec.inputs == (TensorSpec((8192, 128256), "bfloat16"), TensorSpec((8192,), "int64"))
    assert dict(spec.constants) == {"reduction": "mean", "ignore_index": -100, "label_smoothing": 0.0}
    assert OP.output_specs(spec) == (TensorSpec((), "float32"),)
    none = OP.spec((8192, 128256), "fp16", reduction="none", ignore_index=0, label_smoothing=0.1)
    assert OP.output_specs(none) == (TensorSpec((8192,), "float32"),)
    assert dict(none.constants) == {"reduction": "none", "ignore_index": 0, "label_smoothing": 0.1}
    assert OP.spec((4, 8), "float32", label_smoothing=0) == OP.spec((4, 8), "float32")  # 0 is 0.0
    assert "8192x128256" in OP.shape_help


def test_spec_for_example_tensors() -> None:
    logits = torch.zeros(5, 7, dtype=torch.bfloat16)
    target = torch.zeros(5, dtype=torch.int64)
    assert OP.spec_for(logits, target) == OP.spec((5, 7), "bfloat16")
    assert OP.spec_for(logits, target, reduction="sum", weight=None) == OP.spec((5, 7), "bf16", reduction="sum")
    smoothed = OP.spec_for(logits, target, label_smoothing=0.2, ignore_index=3)
    assert smoothed == OP.spec((5, 7), "bf16", label_smoothing=0.2, ignore_index=3)


@pytest.mark.parametrize(
    ("make", "constants"),
    [
        (lambda: (torch.zeros(5, 7, dtype=torch.float64), torch.zeros(5, dtype=torch.int64)), {}),
        (lambda: (torch.zeros(5, 7), torch.zeros(5, dtype=torch.int32)), {}),  # int32 targets
        (lambda: (torch.zeros(5, 7), torch.zeros(5)), {}),  # float targets (probabilities)
        (lambda: (torch.zeros(5, 7), torch.zeros(5, 7)), {}),
        (lambda: (torch.zeros(2, 5, 7), torch.zeros(2, 7, dtype=torch.int64)), {}),  # (N, C, d)
        (lambda: (torch.zeros(7), torch.tensor(3)), {}),  # a single unbatched row
        (lambda: (torch.zeros(5, 7), torch.zeros(4, dtype=torch.int64)), {}),  # row mismatch
        (lambda: (torch.zeros(7, 5).t(), torch.zeros(5, dtype=torch.int64)), {}),  # non-contiguous
        (lambda: (torch.zeros(5, 7), torch.zeros(10, dtype=torch.int64)[::2]), {}),
        (lambda: (torch.zeros(0, 7), torch.zeros(0, dtype=torch.int64)), {}),  # empty
        (lambda: (torch.zeros(5, 7),), {}),
        (lambda: (torch.zeros(5, 7), torch.zeros(5, dtype=torch.int64)), {"reduction": "batchmean"}),
        (lambda: (torch.zeros(5, 7), torch.zeros(5, dtype=torch.int64)), {"ignore_index": True}),
        (lambda: (torch.zeros(5, 7), torch.zeros(5, dtype=torch.int64)), {"ignore_index": -100.0}),
        (lambda: (torch.zeros(5, 7), torch.zeros(5, dtype=torch.int64)), {"label_smoothing": 1.5}),
        (lambda: (torch.zeros(5, 7), torch.zeros(5, dtype=torch.int64)), {"label_smoothing": -0.1}),
        (lambda: (torch.zeros(5, 7), torch.zeros(5, dtype=torch.int64)), {"label_smoothing": math.nan}),
        (lambda: (torch.zeros(5, 7), torch.zeros(5, dtype=torch.int64)), {"weight": torch.ones(7)}),
        (lambda: (torch.zeros(5, 7), torch.zeros(5, dtype=torch.int64)), {"eps": 1e-5}),
    ],
)
def test_spec_for_rejects(make, constants) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(UnsupportedWorkload):
        OP.spec_for(*make(), **constants)


def test_spec_rejects_what_the_kernels_cannot_do() -> None:
    with pytest.raises(UnsupportedWorkload):
        OP.spec((4, 8), "float64")
    with pytest.raises(ValueError):
        OP.spec((4, 8), "int8")
    for shape in [(4, 0), (0, 8), (8,), (2, 4, 8)]:
        with pytest.raises(UnsupportedWorkload):
            OP.spec(shape, "float32")
    with pytest.raises(UnsupportedWorkload, match="unknown constants"):
        OP.spec((4, 8), "float32", dim=-1)
    bad_target = OpSpec(OP.name, (TensorSpec((4, 8), "float32"), TensorSpec((4,), "float32")), {})
    with pytest.raises(UnsupportedWorkload, match="int64"):
        OP.check_supported(bad_target)


def test_validation_specs_keep_targets_in_step_with_rows() -> None:
    spec = OP.spec((40, 1000), "bfloat16", reduction="none", label_smoothing=0.1)
    specs = OP.validation_specs(spec)
    assert specs[0] == spec
    assert [s.inputs[0].shape for s in specs] == [(r, 1000) for r in (40, *tail_rows(40, OP.row_block))]
    for s in specs:
        assert s.inputs[1] == TensorSpec((s.inputs[0].shape[0],), "int64")
        assert s.constants == spec.constants
        OP.check_supported(s)
    assert [s.inputs[0].shape[0] for s in OP.validation_specs(OP.spec((8192, 5), "float16"))] == [
        8192, *tail_rows(8192, OP.row_block)]
    assert len(OP.validation_specs(OP.spec((1, 5), "float16"))) == 1  # one row: no tail has fewer


def test_bytes_and_flops() -> None:
    spec = OP.spec((8192, 128256), "bf16")
    logits, targets = 8192 * 128256 * 2, 8192 * 8
    assert OP.bytes_moved(spec) == logits + targets + 4  # a 0-d float32 loss
    none = OP.spec((8192, 128256), "bf16", reduction="none")
    assert OP.bytes_moved(none) == logits + targets + 8192 * 4
    assert OP.bytes_moved(OP.spec((3, 5), "float32")) == 3 * 5 * 4 + 3 * 8 + 4
    assert OP.flops(spec) == 4 * 8192 * 128256
    assert OP.flops(OP.spec((8192, 128256), "bf16", label_smoothing=0.1)) == 5 * 8192 * 128256


# ---- reference and inputs ------------------------------------------------------------------------


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_references_follow_the_smoothing_formula(reduction: str) -> None:
    spec = OP.spec((12, 33), "bfloat16", reduction=reduction, label_smoothing=0.25)
    logits, target = OP.make_inputs(spec, seed=0, distribution="normal", device="cpu")
    (low,) = OP.reference(spec, (logits, target))
    (ref,) = OP.reference_fp64(spec, (logits, target))
    assert low.dtype == torch.float32 and ref.dtype == torch.float64 and low.shape == ref.shape
    # loss = lse - (1 - eps) x[t] - eps mean(x) on kept rows; mean divides by their number.
    x = logits.double()
    kept = target != -100
    x_t = x.gather(1, target.clamp(min=0)[:, None])[:, 0]
    rows = torch.where(kept, x.logsumexp(1) - 0.75 * x_t - 0.25 * x.mean(1), 0.0)
    manual = {"mean": rows.sum() / kept.sum(), "sum": rows.sum(), "none": rows}[reduction]
    assert torch.allclose(ref, manual, rtol=1e-12)
    assert torch.allclose(low.double(), ref, rtol=1e-5)


@pytest.mark.parametrize("distribution", OP.distributions)
def test_make_inputs_is_deterministic(distribution: str, device: str) -> None:
    spec = OP.spec((30, 48), "float16", ignore_index=-1)
    a = OP.make_inputs(spec, seed=7, distribution=distribution, device=device)
    b = OP.make_inputs(spec, seed=7, distribution=distribution, device=device)
    c = OP.make_inputs(spec, seed=8, distribution=distribution, device=device)
    logits, target = a
    assert logits.shape == (30, 48) and logits.dtype == torch.float16 and logits.device.type == device
    assert target.shape == (30,) and target.dtype == torch.int64
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert not torch.equal(a[0], c[0]) and not torch.equal(a[1], c[1])
    assert torch.isfinite(logits).all()
    ignored = target == -1
    assert int(ignored.sum()) == 3  # 10% of 30 rows
    assert bool(((target[~ignored] >= 0) & (target[~ignored] < 48)).all())


def test_distributions_have_their_shape() -> None:
    spec = OP.spec((64, 256), "float16")

    def draw(distribution: str) -> tuple[torch.Tensor, torch.Tensor]:
        logits, target = OP.make_inputs(spec, seed=1, distribution=distribution, device="cpu")
        return logits.float(), target

    large, _ = draw("large")
    assert torch.isfinite(large).all()  # representable in float16...
    assert torch.isinf(torch.exp(large)).any(dim=1).all()  # ...yet exp overflows in every row
    peaked, target = draw("peaked")
    hot = peaked.argmax(dim=1)
    assert (peaked.amax(dim=1) > 25).all()
    kept = target != -100
    even = torch.arange(64) % 2 == 0
    assert torch.equal(hot[kept & even], target[kept & even])  # right and confident
    assert not (hot[kept & ~even] == target[kept & ~even]).any()  # wrong and confident
    losses = F.cross_entropy(peaked.double(), target, reduction="none")
    assert (losses[kept & even] < 1e-6).all() and (losses[kept & ~even] > 20).all()
    assert not math.isclose(float(draw("normal")[0].std()), 0.0)
    with pytest.raises(ValueError, match="unknown distribution"):
        OP.make_inputs(spec, seed=1, distribution="cauchy", device="cpu")

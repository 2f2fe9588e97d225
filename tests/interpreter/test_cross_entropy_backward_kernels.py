"""Cross-entropy backward and fused loss-and-gradient: kernels (in the Triton interpreter without
a GPU), references, spaces and specs.

Every kernel test launches into NaN-filled outputs, each followed by a NaN guard (a kernel that
skips an element, or writes past the end, fails), and compares with the float64 autograd
reference under the harness's own tolerance (``check_close``). The interpreter is slow, so shapes
stay small and each variant runs a *covering* set of configs, in which every value of every
parameter appears.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from cross_entropy_cases import (
    DTYPES,
    REDUCTIONS,
    assert_build_rejects_a_config_outside_the_space,
    assert_correct,
    assert_every_planned_config,
    assert_the_plan_takes_every_value,
    plan_configs,
    reduction_sweep,
    run_launcher,
    same_bits,
    shape_cases,
)

from kernelsmith.evaluate.errors import check_close
from kernelsmith.evaluate.validate import TorchOpWatch, validate
from kernelsmith.ops import UnsupportedWorkload, _cross_entropy_launch, get_op
from kernelsmith.ops._base import tail_rows
from kernelsmith.ops._cross_entropy_launch import _SCALE_ONE, _SCALE_PER_ROW, _SCALE_SCALAR, _Plan
from kernelsmith.ops.cross_entropy import OP as FORWARD
from kernelsmith.ops.cross_entropy_backward import FUSED, OP
from kernelsmith.spec import OpSpec, TensorSpec
from kernelsmith.testing.validation_runs import validation_runs

VARIANTS = [v.name for v in OP.variants]


def formula_fp64(
    dloss: torch.Tensor,
    logits: torch.Tensor,
    target: torch.Tensor,
    reduction: str,
    smoothing: float,
    ignore_index: int = -100,
) -> torch.Tensor:
    """The module docstring's gradient in float64, written out (no autograd)."""
    x = logits.double()
    vocab = x.shape[1]
    kept = target != ignore_index
    onehot = torch.zeros_like(x)
    onehot[kept.nonzero()[:, 0], target[kept]] = 1.0
    grad = torch.softmax(x, dim=1) - (1 - smoothing) * onehot - smoothing / vocab
    scale = {"mean": dloss.double() / kept.sum(), "sum": dloss.double(), "none": dloss.double()}[reduction]
    scale = scale[:, None] if reduction == "none" else scale
    return torch.where(kept[:, None], grad * scale, 0.0)


# ---- every variant, every config class, small and odd shapes ------------------------------------

# The odd shapes of cross_entropy_cases.py; split_vocab's 6 chunks of 7 x 3000 under "mean".
SHAPE_CASES = shape_cases(split_vocab_reduction="mean")
PLAN = plan_configs(OP, SHAPE_CASES)


# RuntimeWarnings are errors: with finite logits no kernel may compute a NaN or an overflow, not
# even in masked lanes or in ignored rows.
@pytest.mark.filterwarnings("error::RuntimeWarning")
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("index", range(len(SHAPE_CASES)), ids=[str(c) for c in SHAPE_CASES])
def test_every_config_class(variant: str, index: int, device: str) -> None:
    assert_every_planned_config(OP, variant, SHAPE_CASES, PLAN, index, device)


@pytest.mark.parametrize("variant", VARIANTS)
def test_the_configs_run_take_every_parameter_value(variant: str) -> None:
    assert_the_plan_takes_every_value(OP, variant, SHAPE_CASES, PLAN)


@pytest.mark.filterwarnings("error::RuntimeWarning")
@pytest.mark.parametrize("variant", VARIANTS)
def test_every_dtype_reduction_and_smoothing(variant: str, device: str) -> None:
    """Every (dtype, reduction, smoothing) with ignored rows (cross_entropy_cases.reduction_sweep);
    ignored rows get exact zeros."""
    for run in reduction_sweep(OP, variant, device):
        (dlogits,) = run_launcher(OP, variant, run.spec, run.config, run.inputs)
        assert_correct(OP, [dlogits], run.spec, run.inputs, f"{variant} {run.config.key} {run.spec.describe()}")
        assert torch.all(dlogits[run.ignored] == 0)


@pytest.mark.parametrize("variant", VARIANTS)
def test_kernels_match_an_independent_formula(variant: str, device: str) -> None:
    for reduction in REDUCTIONS:
        spec = OP.spec((9, 200), "float32", reduction=reduction, label_smoothing=0.2)
        dloss, logits, target = OP.make_inputs(spec, seed=4, device=device)
        expected = formula_fp64(dloss, logits, target, reduction, 0.2)
        (dlogits,) = run_launcher(
            OP, variant, spec, OP.variant(variant).space(spec).configs()[0], (dloss, logits, target)
        )
        assert torch.allclose(dlogits.double(), expected, rtol=1e-5, atol=1e-6 * float(expected.abs().max()))


@pytest.mark.parametrize("variant", VARIANTS)
def test_the_mean_count_loops_over_many_row_blocks(variant: str, device: str, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The "mean" count walks the targets in blocks of 1024 rows on a GPU; 16 here, so that 67
    rows take five steps with a ragged last one."""
    monkeypatch.setattr(_cross_entropy_launch, "_REDUCE_BLOCK", 16)
    spec = OP.spec((67, 20), "bfloat16", label_smoothing=0.1)
    inputs = OP.make_inputs(spec, seed=5, distribution="large", device=device)
    outs = run_launcher(OP, variant, spec, OP.variant(variant).space(spec).configs()[-1], inputs)
    assert_correct(OP, outs, spec, inputs, variant)


@pytest.mark.filterwarnings("error::RuntimeWarning")
@pytest.mark.parametrize("variant", VARIANTS)
def test_every_row_ignored_gives_zeros_like_torch(variant: str, device: str) -> None:
    """No row counts for "mean" (the scale is never used); NaN upstream gradients of ignored rows
    ("none") do not leak either: torch's gradient is all zeros in both cases."""
    for reduction in REDUCTIONS:
        spec = OP.spec((5, 40), "bfloat16", reduction=reduction, label_smoothing=0.1)
        dloss, logits, _ = OP.make_inputs(spec, seed=1, device=device)
        target = torch.full((5,), -100, dtype=torch.int64, device=device)
        if reduction == "none":
            dloss = torch.full_like(dloss, math.nan)
        (dlogits,) = run_launcher(
            OP, variant, spec, OP.variant(variant).space(spec).configs()[0], (dloss, logits, target)
        )
        (expected,) = OP.reference(spec, (dloss, logits, target))
        assert same_bits(dlogits, torch.zeros_like(dlogits)) and same_bits(expected, dlogits)  # +0, as torch


@pytest.mark.filterwarnings("error::RuntimeWarning")
@pytest.mark.parametrize("variant", VARIANTS)
def test_masked_vocabulary_prefix(variant: str, device: str) -> None:
    """-inf logits at the start of every row (whole blocks and split chunks of them): the
    gradient there is -scale * eps / V, no NaN."""
    spec = OP.spec((4, 1500), "float32", reduction="none", label_smoothing=0.1)
    dloss, logits, _ = OP.make_inputs(spec, seed=2, distribution="peaked", device=device)
    logits[:, :1100] = -math.inf
    target = torch.tensor([1200, 1499, -100, 1100], device=device)
    space = OP.variant(variant).space(spec)
    for config in (space.configs()[0], space.configs()[-1]):
        (dlogits,) = run_launcher(OP, variant, spec, config, (dloss, logits, target))
        assert torch.isfinite(dlogits).all(), config.key
        assert_correct(OP, [dlogits], spec, (dloss, logits, target), f"{variant} {config.key}")


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("variant", VARIANTS)
def test_out_of_range_target_is_a_nan_row(variant: str, device: str) -> None:
    """torch raises on a target outside [0, V); the kernels cannot, so that row is NaN (as the
    forward's loss), and the other rows are right."""
    spec = OP.spec((4, 64), "float32", reduction="none")
    dloss, logits, _ = OP.make_inputs(spec, seed=3, device=device)
    target = torch.tensor([5, 64, -1, -100], device=device)
    (dlogits,) = run_launcher(OP, variant, spec, OP.variant(variant).space(spec).configs()[-1], (dloss, logits, target))
    assert dlogits[1:3].isnan().all()
    assert torch.equal(dlogits[3], torch.zeros(64, device=device))
    expected = formula_fp64(dloss[:1], logits[:1], target[:1], "none", 0.0)
    assert torch.allclose(dlogits[:1].double(), expected, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("variant", VARIANTS)
def test_the_harness_accepts_each_variant(variant: str, device: str) -> None:
    """The real harness: tails of 1, 7 and 15 rows, every distribution, canaries, input mutation,
    torch ops in the launcher, and two runs that must agree bit for bit."""
    spec = OP.spec((12, 100), "bfloat16", reduction="mean", label_smoothing=0.1)
    config = OP.variant(variant).space(spec).configs()[-1]
    runs = validate(OP, spec, OP.variant(variant).build, config, device, lambda: None)
    assert {runs} == validation_runs(OP, spec)  # no blind data: the target on all, each tail on one


def test_the_harness_accepts_per_row_upstream_gradients(device: str) -> None:
    spec = OP.spec((12, 100), "float16", reduction="none")
    config = OP.variant("split_vocab").space(spec).configs()[0]
    runs = validate(OP, spec, OP.variant("split_vocab").build, config, device, lambda: None)
    assert {runs} == validation_runs(OP, spec)  # no blind data: the target on all, each tail on one


@pytest.mark.parametrize("variant", VARIANTS)
def test_launcher_is_reusable_deterministic_and_issues_no_torch_compute(variant: str, device: str) -> None:
    spec = OP.spec((6, 50), "bfloat16", reduction="mean", label_smoothing=0.1)
    launch = OP.variant(variant).build(spec, OP.variant(variant).space(spec).configs()[-1])
    results = []
    for seed in (1, 2, 1):
        inputs = OP.make_inputs(spec, seed=seed, device=device)
        out = torch.full((6, 50), math.nan, dtype=torch.bfloat16, device=device)
        watch = TorchOpWatch()
        with watch:
            launch(inputs, (out,))
        assert watch.issued == []
        assert_correct(OP, [out], spec, inputs, f"{variant} seed {seed}")
        results.append(out)
    assert not torch.equal(results[0], results[1])
    assert same_bits(results[0], results[2])


@pytest.mark.parametrize("variant", VARIANTS)
def test_build_rejects_a_config_outside_the_space(variant: str) -> None:
    assert_build_rejects_a_config_outside_the_space(OP, variant)


# ---- the fused loss and gradient ------------------------------------------------------------------

FUSED_CASES = [
    (7, 3, "bfloat16", "peaked", "none", 0.1),
    (33, 341, "float16", "large", "mean", 0.0),
    (7, 1000, "float32", "normal", "sum", 0.1),
    (1, 1, "bfloat16", "normal", "mean", 0.1),
    (2, 50257, "bfloat16", "peaked", "mean", 0.1),
]


@pytest.mark.filterwarnings("error::RuntimeWarning")
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("case", FUSED_CASES, ids=str)
def test_fused_loss_and_gradient(variant: str, case: tuple[int, int, str, str, str, float], device: str) -> None:
    rows, vocab, dtype, distribution, reduction, smoothing = case
    spec = FUSED.spec((rows, vocab), dtype, reduction=reduction, label_smoothing=smoothing)
    inputs = FUSED.make_inputs(spec, seed=3, distribution=distribution, device=device)
    configs = FUSED.variant(variant).space(spec).configs()
    # The widest blocks, and the narrowest too where the interpreter walks them quickly.
    for config in dict.fromkeys((configs[-1], configs[0] if vocab <= 1000 else configs[-1])):
        outs = run_launcher(FUSED, variant, spec, config, inputs)
        assert_correct(FUSED, outs, spec, inputs, f"fused {variant} {config.key} {spec.describe()}")


@pytest.mark.parametrize("variant", VARIANTS)
def test_fused_every_reduction_and_smoothing(variant: str, device: str) -> None:
    """Ignored rows present, ignore_index inside the vocabulary on every other case."""
    for case, (reduction, smoothing) in enumerate((r, s) for r in REDUCTIONS for s in (0.0, 0.1)):
        spec = FUSED.spec(
            (6, 100), "bfloat16", reduction=reduction, label_smoothing=smoothing, ignore_index=(-100, 2)[case % 2]
        )
        inputs = FUSED.make_inputs(spec, seed=case, distribution=FUSED.distributions[case % 3], device=device)
        configs = FUSED.variant(variant).space(spec).configs()
        outs = run_launcher(FUSED, variant, spec, configs[case % 2 - 1], inputs)
        assert_correct(FUSED, outs, spec, inputs, f"fused {variant} {spec.describe()}")


@pytest.mark.parametrize("variant", VARIANTS)
def test_fused_equals_forward_and_backward(variant: str, device: str) -> None:
    """The fused loss is the forward kernel's (same statistics, same reduction) and its gradient
    the backward's for dloss = 1 ("sum": the same arithmetic whether the 1 is loaded or not):
    bit for bit in the interpreter, within a rounding where a compiler may contract the float32
    operations differently (fused multiply-adds)."""
    spec = FUSED.spec((7, 300), "bfloat16", reduction="sum", label_smoothing=0.1)
    logits, target = FUSED.make_inputs(spec, seed=8, device=device)
    config = FUSED.variant(variant).space(spec).configs()[-1]
    loss, dlogits = run_launcher(FUSED, variant, spec, config, (logits, target))
    forward_spec = FORWARD.spec((7, 300), "bfloat16", reduction="sum", label_smoothing=0.1)
    (forward_loss,) = run_launcher(FORWARD, variant, forward_spec, config, (logits, target))
    backward_spec = OP.spec((7, 300), "bfloat16", reduction="sum", label_smoothing=0.1)
    one = torch.ones((), device=device)
    (backward_dlogits,) = run_launcher(OP, variant, backward_spec, config, (one, logits, target))
    if device == "cpu":
        assert same_bits(loss, forward_loss) and same_bits(dlogits, backward_dlogits)
    else:
        assert torch.allclose(loss, forward_loss, rtol=1e-6, atol=0)
        assert torch.allclose(dlogits.float(), backward_dlogits.float(), rtol=2**-7, atol=1e-6)


@pytest.mark.parametrize("variant", VARIANTS)
def test_the_harness_accepts_each_fused_variant(variant: str, device: str) -> None:
    spec = FUSED.spec((12, 100), "float16", reduction="mean", label_smoothing=0.1)
    config = FUSED.variant(variant).space(spec).configs()[0]
    runs = validate(FUSED, spec, FUSED.variant(variant).build, config, device, lambda: None)
    assert {runs} == validation_runs(FUSED, spec)  # no blind data: the target on all, each tail on one


def test_fused_specs_and_references(device: str) -> None:
    spec = FUSED.spec((5, 7), "bf16", reduction="none", label_smoothing=0.1)
    assert spec.op == "cross_entropy_fused" and get_op("cross_entropy_fused") is FUSED
    assert spec.inputs == FORWARD.spec((5, 7), "bf16").inputs
    assert FUSED.output_specs(spec) == (TensorSpec((5,), "float32"), TensorSpec((5, 7), "bfloat16"))
    assert FUSED.output_specs(FUSED.spec((5, 7), "fp16"))[0] == TensorSpec((), "float32")
    logits, target = FUSED.make_inputs(spec, seed=1, device=device)
    assert FUSED.spec_for(logits, target, reduction="none", label_smoothing=0.1) == spec
    loss, dlogits = FUSED.reference(spec, (logits, target))
    (forward_loss,) = FORWARD.reference(
        FORWARD.spec((5, 7), "bf16", reduction="none", label_smoothing=0.1), (logits, target)
    )
    assert torch.equal(loss, forward_loss) and dlogits.dtype == torch.bfloat16
    _, dlogits64 = FUSED.reference_fp64(spec, (logits, target))
    assert torch.allclose(dlogits64, formula_fp64(torch.ones(5), logits, target, "none", 0.1), rtol=1e-12, atol=1e-15)
    assert [s.inputs[0].shape for s in FUSED.validation_specs(spec)] == [(r, 7) for r in (5, *tail_rows(5))]
    assert FUSED.flops(spec) == (5 + 5) * 35
    with pytest.raises(UnsupportedWorkload):
        FUSED.spec_for(logits, target.int())


# ---- references and tolerance ---------------------------------------------------------------------


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_references_follow_the_formula(reduction: str, device: str) -> None:
    spec = OP.spec((12, 33), "bfloat16", reduction=reduction, label_smoothing=0.25, ignore_index=3)
    dloss, logits, target = OP.make_inputs(spec, seed=0, device=device)
    (low,) = OP.reference(spec, (dloss, logits, target))
    (ref,) = OP.reference_fp64(spec, (dloss, logits, target))
    assert low.dtype == torch.bfloat16 and ref.dtype == torch.float64 and low.shape == ref.shape == (12, 33)
    manual = formula_fp64(dloss, logits, target, reduction, 0.25, ignore_index=3)
    assert torch.allclose(ref, manual, rtol=1e-10, atol=1e-15)
    with torch.no_grad():  # autograd is switched on inside
        assert torch.equal(OP.reference(spec, (dloss, logits, target))[0], low)


@pytest.mark.parametrize("dtype", DTYPES)
def test_the_tolerance_catches_mistakes(dtype: str, device: str) -> None:
    """The exact gradient rounded once passes; forgetting the smoothing, dividing "mean" by every
    row instead of the kept ones, or letting ignored rows through fails."""
    spec = OP.spec((40, 64), dtype, label_smoothing=0.1)
    dloss, logits, target = OP.make_inputs(spec, seed=6, device=device)
    (ref64,) = OP.reference_fp64(spec, (dloss, logits, target))
    (lowp,) = OP.reference(spec, (dloss, logits, target))
    out_dtype = logits.dtype
    assert check_close(ref64.to(out_dtype), ref64, lowp, OP.tolerance) is None
    no_smoothing = formula_fp64(dloss, logits, target, "mean", 0.0)
    assert check_close(no_smoothing.to(out_dtype), ref64, lowp, OP.tolerance) is not None
    kept = target != -100
    every_row = ref64 * (int(kept.sum()) / 40)
    assert check_close(every_row.to(out_dtype), ref64, lowp, OP.tolerance) is not None
    leaky = torch.where(kept[:, None], ref64, torch.softmax(logits.double(), 1) * float(dloss) / 40)
    assert check_close(leaky.to(out_dtype), ref64, lowp, OP.tolerance) is not None


# ---- spaces ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(("rows", "vocab"), [(1, 1), (7, 3), (8192, 128256), (64, 128256), (4, 50257), (2, 65537)])
def test_spaces_are_the_forwards(rows: int, vocab: int) -> None:
    forward = FORWARD.spec((rows, vocab), "bfloat16")
    for op in (OP, FUSED):
        spec = op.spec((rows, vocab), "bfloat16")
        for variant in op.variants:
            assert variant.space(spec).configs() == FORWARD.variant(variant.name).space(forward).configs()
    assert (len(OP.variant("whole_row").space(OP.spec((rows, vocab), "bfloat16"))) == 0) == (vocab > 65536)


def test_validation_specs_keep_dloss_and_targets_in_step() -> None:
    spec = OP.spec((40, 1000), "bfloat16", reduction="none", label_smoothing=0.1)
    specs = OP.validation_specs(spec)
    assert specs[0] == spec
    assert [s.inputs[1].shape for s in specs] == [(r, 1000) for r in (40, *tail_rows(40, FORWARD.row_block))]
    for s in specs:
        rows = s.inputs[1].shape[0]
        assert s.inputs[0] == TensorSpec((rows,), "float32") and s.inputs[2] == TensorSpec((rows,), "int64")
        assert s.constants == spec.constants
        OP.check_supported(s)
    mean = OP.validation_specs(OP.spec((8, 5), "float16"))
    assert all(s.inputs[0] == TensorSpec((), "float32") for s in mean)


def test_plans_pick_the_scale() -> None:
    modes = {
        (op.name, r): _Plan(op.spec((4, 8), "float32", reduction=r)).scale_mode
        for op in (OP, FUSED)
        for r in REDUCTIONS
    }
    assert modes == {
        ("cross_entropy_backward", "mean"): _SCALE_SCALAR,
        ("cross_entropy_backward", "sum"): _SCALE_SCALAR,
        ("cross_entropy_backward", "none"): _SCALE_PER_ROW,
        ("cross_entropy_fused", "mean"): _SCALE_SCALAR,
        ("cross_entropy_fused", "sum"): _SCALE_ONE,
        ("cross_entropy_fused", "none"): _SCALE_ONE,
    }


# ---- specs, inputs, registry ---------------------------------------------------------------------


def test_spec_from_the_command_line() -> None:
    spec = OP.spec((8192, 128256), "bf16")
    assert spec.op == OP.name == "cross_entropy_backward"
    assert spec.inputs == (
        TensorSpec((), "float32"),
        TensorSpec((8192, 128256), "bfloat16"),
        TensorSpec((8192,), "int64"),
    )
    assert dict(spec.constants) == {"reduction": "mean", "ignore_index": -100, "label_smoothing": 0.0}
    assert OP.output_specs(spec) == (TensorSpec((8192, 128256), "bfloat16"),)
    none = OP.spec((8192, 128256), "fp16", reduction="none", ignore_index=0, label_smoothing=0.1)
    assert none.inputs[0] == TensorSpec((8192,), "float32")
    assert OP.bytes_moved(spec) == 4 + 2 * 8192 * 128256 * 2 + 8192 * 8
    assert OP.flops(spec) == 9 * 8192 * 128256


def test_spec_for_example_tensors() -> None:
    logits = torch.zeros(5, 7, dtype=torch.bfloat16)
    target = torch.zeros(5, dtype=torch.int64)
    assert OP.spec_for(torch.ones(()), logits, target) == OP.spec((5, 7), "bfloat16")
    assert OP.spec_for(torch.ones(5), logits, target, reduction="none", label_smoothing=0.2) == OP.spec(
        (5, 7), "bf16", reduction="none", label_smoothing=0.2
    )


@pytest.mark.parametrize(
    ("make", "constants"),
    [
        (lambda: (torch.ones(()), torch.zeros(5, 7), torch.zeros(5, dtype=torch.int64)), {"reduction": "none"}),
        (lambda: (torch.ones(5), torch.zeros(5, 7), torch.zeros(5, dtype=torch.int64)), {}),  # (R,) for mean
        (lambda: (torch.ones(4), torch.zeros(5, 7), torch.zeros(5, dtype=torch.int64)), {"reduction": "none"}),
        (lambda: (torch.ones((), dtype=torch.bfloat16), torch.zeros(5, 7), torch.zeros(5, dtype=torch.int64)), {}),
        (lambda: (torch.ones(10)[::2], torch.zeros(5, 7), torch.zeros(5, dtype=torch.int64)), {"reduction": "none"}),
        (lambda: (torch.ones(()), torch.zeros(5, 7), torch.zeros(5, dtype=torch.int32)), {}),
        (lambda: (torch.ones(()), torch.zeros(5, 7, dtype=torch.float64), torch.zeros(5, dtype=torch.int64)), {}),
        (lambda: (torch.ones(()), torch.zeros(7, 5).t(), torch.zeros(5, dtype=torch.int64)), {}),
        (lambda: (torch.ones(()), torch.zeros(5, 7), torch.zeros(4, dtype=torch.int64)), {}),
        (lambda: (torch.ones(()), torch.zeros(0, 7), torch.zeros(0, dtype=torch.int64)), {}),
        (lambda: (torch.zeros(5, 7), torch.zeros(5, dtype=torch.int64)), {}),
        (lambda: (torch.ones(()), torch.zeros(5, 7), torch.zeros(5, dtype=torch.int64)), {"label_smoothing": 2.0}),
        (lambda: (torch.ones(()), torch.zeros(5, 7), torch.zeros(5, dtype=torch.int64)), {"weight": torch.ones(7)}),
    ],
)
def test_spec_for_rejects(make, constants) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(UnsupportedWorkload):
        OP.spec_for(*make(), **constants)


def test_spec_rejects_what_the_kernels_cannot_do() -> None:
    with pytest.raises(UnsupportedWorkload):
        OP.spec((4, 8), "float64")
    for shape in [(4, 0), (8,), (2, 4, 8)]:
        with pytest.raises(UnsupportedWorkload):
            OP.spec(shape, "float32")
    logits, target = TensorSpec((4, 8), "float32"), TensorSpec((4,), "int64")
    constants = dict(OP.spec((4, 8), "float32").constants)  # reduction="mean": a 0-d dloss
    with pytest.raises(UnsupportedWorkload, match="dloss"):
        OP.check_supported(OpSpec(OP.name, (TensorSpec((4,), "float32"), logits, target), constants))
    with pytest.raises(UnsupportedWorkload, match="takes"):
        OP.check_supported(OpSpec(OP.name, (logits, target), constants))


@pytest.mark.parametrize("distribution", OP.distributions)
def test_make_inputs_is_deterministic(distribution: str, device: str) -> None:
    spec = OP.spec((30, 48), "float16", reduction="none", ignore_index=-1)
    a = OP.make_inputs(spec, seed=7, distribution=distribution, device=device)
    b = OP.make_inputs(spec, seed=7, distribution=distribution, device=device)
    c = OP.make_inputs(spec, seed=8, distribution=distribution, device=device)
    assert all(torch.equal(p, q) for p, q in zip(a, b, strict=True))
    assert not any(torch.equal(p, q) for p, q in zip(a, c, strict=True))
    dloss, logits, target = a
    assert dloss.shape == (30,) and dloss.dtype == torch.float32
    assert bool(((dloss.abs() >= 0.5) & (dloss.abs() < 2)).all()) and (dloss < 0).any() and (dloss > 0).any()
    forward = FORWARD.make_inputs(FORWARD.spec((30, 48), "float16", ignore_index=-1), 7, distribution, device)
    assert torch.equal(logits, forward[0]) and torch.equal(target, forward[1])
    (scalar, *_) = OP.make_inputs(OP.spec((30, 48), "float16"), seed=7, distribution=distribution, device=device)
    assert scalar.shape == () and 0.5 <= abs(float(scalar)) < 2


def test_registered_as_the_forwards_backward() -> None:
    assert get_op("cross_entropy").backward == "cross_entropy_backward"
    assert get_op("cross_entropy_backward") is OP
    logits, target = torch.zeros(2, 3), torch.zeros(2, dtype=torch.int64)
    dlogits = torch.ones(2, 3)
    assert FORWARD.backward_inputs((torch.ones(()),), (logits, target), (torch.ones(()),))[1] is logits
    assert FORWARD.input_gradients((dlogits,), (logits, target)) == (dlogits, None)
    for v in (*OP.variants, *FUSED.variants):
        assert v.summary
    assert [v.name for v in FUSED.variants] == VARIANTS == ["online_row", "split_vocab", "whole_row"]


def test_autograd_through_the_reference_matches_torch_directly(device: str) -> None:
    """The reference is exactly what a training step's ``loss.backward()`` leaves in ``.grad``."""
    spec = OP.spec((6, 20), "float16", reduction="mean", label_smoothing=0.1)
    dloss, logits, target = OP.make_inputs(spec, seed=2, device=device)
    leaf = logits.clone().requires_grad_()
    F.cross_entropy(leaf.float(), target, label_smoothing=0.1).backward(dloss)
    assert leaf.grad is not None and torch.equal(OP.reference(spec, (dloss, logits, target))[0], leaf.grad)

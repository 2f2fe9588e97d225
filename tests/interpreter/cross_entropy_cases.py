"""What the cross-entropy forward's and backward's interpreter tests share (test_cross_entropy_kernels.py,
test_cross_entropy_backward_kernels.py): launching into guarded outputs, the check against the float64
reference, the odd shapes every config class runs on, the plan of configs run on them, and the
(dtype, reduction, smoothing) sweep with ignored rows.

Cross-entropy is not one of the row-wise families of test_rowwise_families.py (its rows reduce to
a loss, its backward needs the targets), so its two files share this module instead.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import pytest
import torch

from kernelsmith.evaluate.errors import check_close
from kernelsmith.ops._base import OpFamily
from kernelsmith.space import Config
from kernelsmith.spec import OpSpec

DTYPES = ("float16", "bfloat16", "float32")
REDUCTIONS = ("mean", "sum", "none")
GUARD = 16  # NaN elements after each output: a kernel writing past its end overwrites them

# (rows, vocab, dtype, distribution, reduction, label_smoothing)
Case = tuple[int, int, str, str, str, float]


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bitwise equality (NaN equals NaN, -0.0 differs from 0.0)."""
    as_int = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
    return a.dtype == b.dtype and torch.equal(a.view(as_int), b.view(as_int))


def run_launcher(
    op: OpFamily, variant: str, spec: OpSpec, config: Config, inputs: Sequence[torch.Tensor]
) -> list[torch.Tensor]:
    """Launch into NaN-filled outputs followed by NaN guards; check the guards and that the
    inputs come back bit for bit."""
    before = [t.clone() for t in inputs]
    outs, guards = [], []
    for out_spec in op.output_specs(spec):
        n = out_spec.numel
        buffer = torch.full((n + GUARD,), math.nan, dtype=out_spec.torch_dtype, device=inputs[0].device)
        outs.append(buffer[:n].view(out_spec.shape))
        guards.append(buffer[n:])
    op.variant(variant).build(spec, config)(tuple(inputs), outs)
    for t, b in zip(inputs, before, strict=True):
        assert same_bits(t, b), f"{variant} {config.key} modified an input"
    for guard in guards:
        assert bool(torch.isnan(guard).all()), f"{variant} {config.key} wrote past the end of an output"
    return outs


def assert_correct(
    op: OpFamily, outs: Sequence[torch.Tensor], spec: OpSpec, inputs: Sequence[torch.Tensor], what: str
) -> None:
    """Every output has its spec's dtype and shape and is within the harness's tolerance
    (``check_close``) of the float64 reference."""
    refs64 = op.reference_fp64(spec, tuple(inputs))
    lowps = op.reference(spec, tuple(inputs))
    for out, ref64, lowp, expected in zip(outs, refs64, lowps, op.output_specs(spec), strict=True):
        assert out.dtype == expected.torch_dtype and out.shape == ref64.shape, what
        problem = check_close(out, ref64, lowp, op.tolerance)
        assert problem is None, f"{what}: {problem}"


# ---- every variant, every config class, small and odd shapes ------------------------------------


def shape_cases(split_vocab_reduction: str) -> list[Case]:
    """Rows 1, 7, 33 and vocabularies 1, 3, 341, 1000, 3000 (never a power of two), each dtype,
    distribution, reduction and smoothing at least once; 7 x 3000 gives split_vocab six chunks,
    the last one ragged, under the reduction the file names; the 2 x 50257 case (a GPT-2
    vocabulary) admits the widest blocks and most splits."""
    return [
        (1, 1, "float32", "normal", "mean", 0.0),
        (7, 1, "bfloat16", "large", "none", 0.1),
        (7, 3, "bfloat16", "peaked", "none", 0.1),
        (7, 3, "float16", "large", "sum", 0.0),
        (33, 341, "bfloat16", "large", "none", 0.0),
        (33, 341, "float16", "peaked", "mean", 0.1),
        (7, 1000, "float32", "normal", "sum", 0.1),
        (1, 1000, "bfloat16", "peaked", "none", 0.0),
        (7, 3000, "float16", "peaked", split_vocab_reduction, 0.1),
        (2, 50257, "bfloat16", "normal", "mean", 0.1),
    ]


def case_spec(op: OpFamily, case: Case) -> OpSpec:
    rows, vocab, dtype, _, reduction, smoothing = case
    return op.spec((rows, vocab), dtype, reduction=reduction, label_smoothing=smoothing)


def plan_configs(op: OpFamily, cases: Sequence[Case]) -> dict[tuple[str, int], list[Config]]:
    """The configs each (variant, case index) runs: the last config of the space (the widest
    blocks), the first on small vocabularies (the narrowest: many steps, cheap there), and every
    config that brings a (parameter, value) no earlier case ran. Narrow blocks are run on narrow
    rows, where the interpreter walks them quickly; the wide case adds only what needs its width."""
    plan = {}
    for variant in (v.name for v in op.variants):
        seen: set[tuple[str, object]] = set()
        for index, case in enumerate(cases):
            configs = op.variant(variant).space(case_spec(op, case)).configs()
            chosen = [configs[-1]] + ([configs[0]] if case[1] <= 1000 else [])
            for c in configs:
                if not set(c.items()) <= seen | {item for k in chosen for item in k.items()}:
                    chosen.append(c)
            plan[variant, index] = list(dict.fromkeys(chosen))
            seen |= {item for c in chosen for item in c.items()}
    return plan


def assert_the_plan_takes_every_value(
    op: OpFamily, variant: str, cases: Sequence[Case], plan: dict[tuple[str, int], list[Config]]
) -> None:
    """Across the cases, the planned configs take every value of every parameter, and each
    case's configs lie in its own space."""
    seen = {item for index in range(len(cases)) for c in plan[variant, index] for item in c.items()}
    for param in op.variant(variant).space(case_spec(op, cases[0])).params:
        missing = [v for v in param.choices if (param.name, v) not in seen]
        assert not missing, f"{variant}: {param.name} values {missing} never tested"
    for index, case in enumerate(cases):
        space = op.variant(variant).space(case_spec(op, case))
        assert plan[variant, index] and all(c in space for c in plan[variant, index])


def assert_every_planned_config(
    op: OpFamily, variant: str, cases: Sequence[Case], plan: dict[tuple[str, int], list[Config]], index: int,
    device: str,
) -> None:  # fmt: skip
    """Run the planned configs of one case (its distribution, seed 11) against the reference."""
    spec = case_spec(op, cases[index])
    distribution = cases[index][3]
    inputs = op.make_inputs(spec, seed=11, distribution=distribution, device=device)
    for config in plan[variant, index]:
        outs = run_launcher(op, variant, spec, config, inputs)
        assert_correct(op, outs, spec, inputs, f"{variant} {config.key} {spec.describe()} {distribution}")


def assert_build_rejects_a_config_outside_the_space(op: OpFamily, variant: str) -> None:
    spec = op.spec((4, 64), "float32")
    config = op.variant(variant).space(spec).configs()[0].replace(num_warps=3)
    with pytest.raises(ValueError, match="not in the space"):
        op.variant(variant).build(spec, config)


# ---- every (dtype, reduction, smoothing) with ignored rows --------------------------------------


@dataclass(frozen=True)
class SweepRun:
    """One run of :func:`reduction_sweep`: ``ignored`` marks the rows whose target is ignored."""

    spec: OpSpec
    config: Config
    inputs: tuple[torch.Tensor, ...]
    ignored: torch.Tensor
    distribution: str


def reduction_sweep(op: OpFamily, variant: str, device: str) -> Iterator[SweepRun]:
    """Every (dtype, reduction, smoothing) on 6 rows of 100 classes, the first and the last
    config in turn, the distributions in turn, with the ignore_index outside the vocabulary
    (-100) or inside it (2: rows whose target is class 2 are ignored too) two cases each. Some
    but not all rows are ignored in every case (the targets are the last input)."""
    case = 0
    for dtype in DTYPES:
        for reduction in REDUCTIONS:
            for smoothing in (0.0, 0.1):
                ignore_index = (-100, 2)[(case // 2) % 2]
                spec = op.spec((6, 100), dtype, reduction=reduction, ignore_index=ignore_index,
                               label_smoothing=smoothing)  # fmt: skip
                distribution = op.distributions[case % len(op.distributions)]
                inputs = op.make_inputs(spec, seed=case, distribution=distribution, device=device)
                ignored = inputs[-1] == ignore_index
                assert 1 <= int(ignored.sum()) < 6
                configs = op.variant(variant).space(spec).configs()
                config = configs[0] if case % 2 else configs[-1]
                yield SweepRun(spec, config, tuple(inputs), ignored, distribution)
                case += 1

"""What the row-wise families' interpreter tests share, once, parametrized over family and variant:
RMSNorm, residual add + RMSNorm, LayerNorm, softmax, the row reductions (sum, mean, max) and the
backwards of the three norms.

- every schedule's config classes (every value of every parameter of the space of every case:
  the covering configs) on small and odd shapes (1 row, row counts no ROWS divides, odd widths,
  several leading dims, a 1-D x) in every dtype, against the float64 reference under the
  harness's own tolerance (``check_close``);
- the realigned variants (aligned_row, split_row), one config per case on their own odd widths,
  and at unaligned addresses;
- every variant through the harness (``validate``), with the run counts its data allow;
- what the families' schedules share: multi_row's masked rows, persistent programs walking several
  rows, eps reaching the kernels, the backwards' row groups and bitwise determinism, launchers
  that take views only and reject configs outside their space;
- what their specs share: inputs drawn deterministically by seed, the backwards' buckets and
  tails keeping the row-shaped inputs alike, the RMSNorm backwards' spaces, the RMSNorm
  forwards' row limits, hashes and rejected specs; softmax's and the reductions' specs (the last
  dim only, bad tensors);
- Gemma's weight offset reaching every schedule of RMSNorm, add_rmsnorm and RMSNorm backward.

Every kernel writes into NaN-filled outputs followed by NaN guards (a kernel that skips an element
or writes past the end is caught), and its inputs must come back unchanged. What is peculiar to a
family (its specs, inputs, references, spaces' budgets, special values, weight offsets, scales)
stays in its own file, test_<family>_kernels.py.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import product

import pytest
import torch
from real_compiler_run import assert_every_kernel_lowers

from kernelsmith.evaluate.errors import check_close
from kernelsmith.evaluate.validate import TorchOpWatch, validate
from kernelsmith.ops import UnsupportedWorkload
from kernelsmith.ops._base import OpFamily, tail_rows
from kernelsmith.ops._rowwise import BACKWARD_MAX_ROW, MAX_WHOLE_ROW, SPLIT_MIN_ROW_BYTES
from kernelsmith.ops.add_rmsnorm import OP as ADD_RMSNORM
from kernelsmith.ops.add_rmsnorm_backward import OP as ADD_RMSNORM_BACKWARD
from kernelsmith.ops.layernorm import AFFINE
from kernelsmith.ops.layernorm import OP as LAYERNORM
from kernelsmith.ops.layernorm_backward import OP as LAYERNORM_BACKWARD
from kernelsmith.ops.reductions import MAX, MEAN, SUM
from kernelsmith.ops.rmsnorm import OP as RMSNORM
from kernelsmith.ops.rmsnorm_backward import OP as RMSNORM_BACKWARD
from kernelsmith.ops.softmax import OP as SOFTMAX
from kernelsmith.space import Config
from kernelsmith.spec import OpSpec
from kernelsmith.testing.kernels import assert_guarded_outputs, covering_configs, launch_guarded
from kernelsmith.testing.validation_runs import validation_runs

DTYPES = ("float16", "bfloat16", "float32")
Shape = tuple[int, ...]
Constants = dict[str, object]
GUARD = 64  # NaN elements after each output: a kernel writing past its end overwrites them


# ---- how a family is described -------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    """One width in one dtype. The covering configs of its space run: the first (``first``, an
    index into them) on every shape of ``leads`` (leading dims before the width), each further one
    on the next of ``others`` in turn; the distributions rotate from ``distribution`` on."""

    width: int
    dtype: str
    leads: tuple[Shape, ...]
    others: tuple[Shape, ...]
    distribution: int = 0
    first: int = 0


def norm_cases(leads: tuple[Shape, ...], others: tuple[Shape, ...], first: int = 0) -> tuple[Case, ...]:
    """The norms' cases: widths 1, 3, 341 and 1000 (never a power of two, never a multiple of a
    block), each in every dtype."""
    return tuple(Case(w, dtype, leads, others, first=first) for w, dtype in product((1, 3, 341, 1000), DTYPES))


def shape_cases(op: OpFamily, cases: Sequence[tuple[Shape, str, int | str]]) -> tuple[Case, ...]:
    """Softmax's and the reductions' cases: one shape each, every covering config on it, the
    distributions rotating from the one named (by name, or by index into the family's list)."""
    out = []
    for shape, dtype, distribution in cases:
        start = op.distributions.index(distribution) if isinstance(distribution, str) else distribution
        out.append(Case(shape[-1], dtype, (shape[:-1],), (shape[:-1],), start % len(op.distributions)))
    return tuple(out)


@dataclass(frozen=True)
class Realigned:
    """A realigned variant's case: one config (:func:`one_config`) on one shape."""

    shape: Shape
    dtype: str
    constants: Constants
    distribution: str


@dataclass(frozen=True)
class Harness:
    """A run of ``validate``: a variant at a spec, the config picked from its space, and the run
    counts the family's data allow (``runs(op, spec)``)."""

    variant: str
    shape: Shape
    dtype: str
    constants: Constants = field(default_factory=dict)
    pick: str = "last"  # "last": the largest blocks; "covering": the last covering config; "one": one_config
    runs: Callable[[OpFamily, OpSpec], set[int]] = validation_runs


def _denormal_blind(op: OpFamily, spec: OpSpec) -> set[int]:
    # denormal data is blind on every draw, not some: x lies within 2^16 of bfloat16's smallest
    # normal, so mean(x^2) is nothing beside eps, x / rms is about 1e3 x and dw, dy times that,
    # rounds to zero; the tail that starts on it always draws the next distribution too
    return {max(validation_runs(op, spec, maybe_blind=("denormal",)))}


def _denormal_maybe_blind(op: OpFamily, spec: OpSpec) -> set[int]:
    return validation_runs(op, spec, maybe_blind=("denormal",))


def _max_blind(op: OpFamily, spec: OpSpec) -> set[int]:
    # the max of a 2-row tail can be blind: two row maxima close enough that their mean passes
    # for both (measured on 100 seeds: 13% of normal draws, 7% positive, 2% large)
    return validation_runs(op, spec, maybe_blind=("normal", "positive", "large"))


@dataclass(frozen=True)
class Family:
    """A row-wise family as the shared tests run it."""

    id: str
    op: OpFamily
    outputs: tuple[str, ...]  # the outputs' names, for messages
    cases: tuple[Case, ...]
    # Constant sets taking turns in the config-class runs: a run takes the first, from its turn
    # on, whose space holds its config (LayerNorm's affine forms; the covering configs are drawn
    # from the first set's space, the fullest).
    forms: tuple[Constants, ...] = ({},)
    realigned: dict[str, tuple[Realigned, ...]] = field(default_factory=dict)
    harness: tuple[Harness, ...] = ()
    # Cases whose space is empty by design, as (variant, width): reductions' multi_row holds no
    # row wider than 8192 columns.
    empty: tuple[tuple[str, int], ...] = ()
    # RuntimeWarnings are errors for softmax and the reductions: with finite inputs no kernel may
    # compute a NaN or an overflow, not even in padding lanes or rows past the end of a block.
    strict_warnings: bool = False
    # A check beyond the tolerance: add_rmsnorm's h is bitwise PyTorch's rounded sum.
    exact: Callable[[OpSpec, Sequence[torch.Tensor], Sequence[torch.Tensor], str], None] | None = None
    # The shared schedule tests: the family's eps pair, and the inputs multi_row and persistent take.
    eps: tuple[float, float] = (1e-6, 1.0)
    multi_row_distribution: str = "normal"
    persistent: tuple[Constants, str] = ({}, "outliers")
    # A width (one float32 row) whose space's parameter choices the cases must all run.
    choices_at: int | None = None

    @property
    def schedules(self) -> list[str]:
        """The variants the config-class runs cover (the realigned ones have their own cases)."""
        return [v.name for v in self.op.variants if v.name not in self.realigned]


def _h_is_the_rounded_sum(spec: OpSpec, inputs: Sequence[torch.Tensor], outs: Sequence[torch.Tensor],
                          what: str) -> None:  # fmt: skip
    # h is the correctly rounded sum, bit for bit what PyTorch stores (every dtype, every kernel).
    assert torch.equal(outs[1], ADD_RMSNORM.reference(spec, inputs)[1]), f"{what}: h is not residual + x rounded"


# Leading shapes: odd row counts (multiples of no ROWS), 1 row, several leading dims, and a 1-D x.
NORM_LEADS: tuple[Shape, ...] = ((7,), (33,), (1,), (2, 3), ())
# add_rmsnorm's and LayerNorm's further configs skip the 33 rows (the interpreter's time grows with
# rows times loop steps); the backwards' first config also meets a 2-D lead, the others 1, 7 and
# 33 rows.
SMALL_LEADS: tuple[Shape, ...] = ((7,), (1,), (2, 3), ())
BACKWARD_ROWS: tuple[Shape, ...] = ((1,), (7,), (33,))

# Softmax: rows 1, 7 and 33, widths 1, 3, 341, 1000, leading dimensions, a 1-D input, and one row
# wider than 4096 so that the widest online blocks (up to 8192) and whole-row blocks are exercised
# too. Every dtype meets "large" and "outliers" on at least one odd shape.
SOFTMAX_CASES = shape_cases(SOFTMAX, [
    ((1, 1), "float32", "normal"), ((1, 3), "bfloat16", "outliers"), ((7, 3), "float16", "outliers"),
    ((7, 3), "float32", "large"), ((33, 341), "bfloat16", "large"), ((33, 341), "float16", "outliers"),
    ((7, 1000), "float32", "outliers"), ((7, 1000), "bfloat16", "large"), ((2, 3, 341), "float16", "uniform"),
    ((1000,), "bfloat16", "normal"), ((3, 4099), "float16", "large"),
])  # fmt: skip
# The reductions: as softmax's, plus one row wider than 8192 so that the widest looped block
# (8192, narrower than the 16384-padded row) is exercised; a 1-D input has a 0-d result. The
# distribution index is taken modulo the family's own list ("negative_ties" is max's 4th).
REDUCTION_SHAPES: list[tuple[Shape, str, int | str]] = [
    ((1, 1), "float32", 0), ((7, 3), "float16", 1), ((33, 3), "bfloat16", 3), ((33, 100), "float32", 2),
    ((7, 341), "bfloat16", 2), ((1, 1000), "float16", 3), ((2, 3, 341), "float32", 1), ((3, 1, 3), "bfloat16", 0),
    ((1000,), "bfloat16", 1), ((1, 8200), "float32", 0),
]  # fmt: skip

# The realigned variants' cases: 1 and 3 rows, every dtype (ALIGN = 4 and 8). aligned_row: widths
# 1, 7, 33, 1000 and 4097 (none a multiple of 16); split_row: rows of more than 8 KB, just above
# 4096 and 2048 elements (narrower ones: test_rowwise_pieces.py). The norms with Gemma's weight
# offset, softmax with a negative scale (the padding set back to -inf) and others.
OFFSET: Constants = {"weight_offset": 1.0}
NONE: Constants = {}


def _norm_realigned(op: OpFamily, cases: dict[str, Sequence[tuple[Shape, str, Constants]]]
                    ) -> dict[str, tuple[Realigned, ...]]:  # fmt: skip
    # the distributions take turns over each variant's cases
    return {v: tuple(Realigned(s, d, c, op.distributions[i % len(op.distributions)]) for i, (s, d, c) in enumerate(cs))
            for v, cs in cases.items()}  # fmt: skip


RMSNORM_REALIGNED = _norm_realigned(RMSNORM, {
    "aligned_row": [((1, 1), "float32", NONE), ((3, 7), "bfloat16", OFFSET), ((3, 33), "float16", NONE),
                    ((1, 1000), "bfloat16", NONE), ((3, 1000), "float16", OFFSET), ((1, 4097), "float32", NONE)],
    "split_row": [((1, 4097), "bfloat16", NONE), ((3, 4100), "float16", OFFSET), ((1, 2049), "float32", NONE),
                  ((3, 2051), "float32", OFFSET)],
})  # fmt: skip
ADD_RMSNORM_REALIGNED = _norm_realigned(ADD_RMSNORM, {
    "aligned_row": [((1, 1), "float32", NONE), ((3, 7), "bfloat16", OFFSET), ((3, 33), "float16", NONE),
                    ((3, 1000), "bfloat16", OFFSET), ((1, 4097), "float32", NONE)],
    "split_row": [((1, 4097), "bfloat16", NONE), ((3, 4100), "float16", OFFSET), ((3, 2051), "float32", NONE)],
})  # fmt: skip
# The backwards' split_row (rows over 8 KB cut into column chunks; its own file is
# test_rmsnorm_backward_split_row.py): one row just above 8 KB in bfloat16, 3 rows with the
# weight offset in float32, each cut in two chunks at its widest.
RMSNORM_BACKWARD_REALIGNED = _norm_realigned(RMSNORM_BACKWARD, {
    "split_row": [((1, 4097), "bfloat16", NONE), ((3, 2051), "float32", OFFSET)],
})  # fmt: skip
ADD_RMSNORM_BACKWARD_REALIGNED = _norm_realigned(ADD_RMSNORM_BACKWARD, {
    "split_row": [((3, 4099), "float16", OFFSET), ((1, 2049), "float32", NONE)],
})  # fmt: skip
SOFTMAX_REALIGNED = {
    "aligned_row": (
        Realigned((1, 1), "float32", NONE, "normal"), Realigned((3, 7), "bfloat16", NONE, "outliers"),
        Realigned((3, 33), "float16", {"scale": -1.3}, "uniform"), Realigned((1, 1000), "bfloat16", NONE, "large"),
        Realigned((3, 1000), "float16", {"scale": 0.5}, "outliers"), Realigned((1, 4097), "float32", NONE, "normal"),
    ),
    "split_row": (
        Realigned((1, 4097), "bfloat16", NONE, "large"), Realigned((3, 4100), "float16", {"scale": -1.3}, "uniform"),
        Realigned((1, 2049), "float32", {"scale": 0.5}, "outliers"), Realigned((3, 2051), "float32", NONE, "normal"),
    ),
}  # fmt: skip
# LayerNorm's aligned_row and split_row are not among these: their tests also compare the row
# statistics of a training forward (test_layernorm_kernels.py, test_layernorm_split_row.py); they
# are still kept out of the config-class runs.
LAYERNORM_REALIGNED: dict[str, tuple[Realigned, ...]] = {"aligned_row": (), "split_row": ()}

REALIGNED_HARNESS = (Harness("aligned_row", (3, 100), "float32", OFFSET, "one"),
                     Harness("split_row", (2, 2049), "float32", OFFSET, "one"))  # fmt: skip
SOFTMAX_SCALE: Constants = {"scale": 1 / 0.7}


def _reduction(op: OpFamily, runs: Callable[[OpFamily, OpSpec], set[int]] = validation_runs) -> Family:
    # validate on the target and on tails (1 row, an odd count); multi_row's last config: ROWS
    # divides no tail
    # split_row (rows over 8 KB cut across programs) has its own file, test_reductions_split_row.py
    return Family(op.name, op, ("y",), shape_cases(op, REDUCTION_SHAPES), empty=(("multi_row", 8200),),
                  realigned={"split_row": ()}, strict_warnings=True, choices_at=16384,
                  harness=(*(Harness(v, shape, dtype, runs=runs) for v in ("whole_row", "looped", "multi_row")
                             for shape, dtype in (((9, 100), "bfloat16"), ((2, 3, 5), "float16"))),
                           Harness("split_row", (2, 4099), "bfloat16", pick="one", runs=runs)))  # fmt: skip


FAMILIES = {
    f.id: f
    for f in (
        Family("rmsnorm", RMSNORM, ("y",), norm_cases(NORM_LEADS, NORM_LEADS), realigned=RMSNORM_REALIGNED,
               harness=(*(Harness(v, (9, 200), "bfloat16", OFFSET) for v in ("whole_row", "multi_row", "looped",
                                                                            "persistent")),
                        *REALIGNED_HARNESS)),
        Family("add_rmsnorm", ADD_RMSNORM, ("y", "h"), norm_cases(NORM_LEADS, SMALL_LEADS),
               realigned=ADD_RMSNORM_REALIGNED, exact=_h_is_the_rounded_sum,
               harness=(*(Harness(v, (9, 200), "bfloat16") for v in ("whole_row", "multi_row", "looped",
                                                                    "persistent")),
                        Harness("whole_row", (9, 200), "bfloat16", OFFSET), *REALIGNED_HARNESS)),
        # the last covering config on every lead (for welford the widest block, the fastest to
        # interpret), the others on the smaller leads, as add_rmsnorm's
        Family("layernorm", LAYERNORM, ("y",), norm_cases(NORM_LEADS, SMALL_LEADS, first=1),
               forms=tuple({"affine": a} for a in AFFINE), realigned=LAYERNORM_REALIGNED, eps=(1e-5, 1.0),
               multi_row_distribution="offset", persistent=({"affine": "weight"}, "uniform"),
               harness=(Harness("two_pass", (5, 100), "float16", {"affine": "weight_bias"}, "covering"),
                        Harness("welford", (5, 100), "bfloat16", {"affine": "weight"}, "covering"),
                        Harness("multi_row", (5, 100), "float32", {"affine": "none"}, "covering"),
                        Harness("persistent", (5, 100), "bfloat16", {"affine": "weight_bias"}, "covering"),
                        Harness("aligned_row", (3, 100), "bfloat16"),
                        Harness("split_row", (2, 2049), "float32", {"affine": "weight_bias"}, "one"))),
        Family("softmax", SOFTMAX, ("y",), SOFTMAX_CASES, realigned=SOFTMAX_REALIGNED, strict_warnings=True,
               choices_at=8192,
               harness=(*(Harness(v, (9, 200), "bfloat16", SOFTMAX_SCALE) for v in ("whole_row", "online",
                                                                                   "multi_row", "persistent",
                                                                                   "aligned_row")),
                        Harness("split_row", (2, 2049), "float32", SOFTMAX_SCALE, "one"))),
        _reduction(SUM),
        _reduction(MEAN),
        _reduction(MAX, _max_blind),
        Family("rmsnorm_backward", RMSNORM_BACKWARD, ("dx", "dw"),
               norm_cases((*BACKWARD_ROWS, (3, 5)), BACKWARD_ROWS), realigned=RMSNORM_BACKWARD_REALIGNED,
               harness=(*(Harness(v, (20, 300), "bfloat16", runs=_denormal_blind) for v in ("two_stage", "looped")),
                        *(Harness(v, (20, 300), "bfloat16", OFFSET, runs=_denormal_maybe_blind)
                          for v in ("two_stage", "looped")),
                        Harness("split_row", (2, 2049), "float32", OFFSET, "one"))),
        Family("add_rmsnorm_backward", ADD_RMSNORM_BACKWARD, ("dsum", "dw"),
               norm_cases((*BACKWARD_ROWS, (3, 5)), BACKWARD_ROWS), realigned=ADD_RMSNORM_BACKWARD_REALIGNED,
               harness=(*(Harness(v, (20, 300), "bfloat16", runs=_denormal_blind) for v in ("two_stage", "looped")),
                        Harness("two_stage", (6, 100), "bfloat16", OFFSET, runs=_denormal_blind),
                        Harness("split_row", (2, 2049), "float32", pick="one"))),
        # float16: in bfloat16, PyTorch's CPU backward is so inaccurate on 'offset' rows (dw
        # relative error ~0.4, measured) that the harness's canaries would pass its tolerance
        Family("layernorm_backward", LAYERNORM_BACKWARD, ("dx", "dw", "db"),
               norm_cases((*BACKWARD_ROWS, (3, 5), ()), BACKWARD_ROWS), forms=tuple({"affine": a} for a in AFFINE),
               eps=(1e-5, 1.0), harness=tuple(Harness(v, (20, 100), "float16") for v in ("two_stage", "looped"))),
    )
}  # fmt: skip


def _marks(f: Family) -> list[pytest.MarkDecorator]:
    return [pytest.mark.filterwarnings("error::RuntimeWarning")] if f.strict_warnings else []


def run_and_check(f: Family, variant: str, spec: OpSpec, config: Config, inputs: Sequence[torch.Tensor],
                  what: str) -> list[torch.Tensor]:  # fmt: skip
    """Launch into guarded NaN-filled outputs; every output fully written, nothing past its end,
    the inputs unchanged, and within the family's tolerance of the float64 reference."""
    before = [t.clone() for t in inputs]
    outs, guards = launch_guarded(f.op, variant, spec, config, inputs, GUARD)
    assert all(torch.equal(t, b) for t, b in zip(inputs, before, strict=True)), f"{what}: modified its inputs"
    assert_guarded_outputs(f.op, spec, inputs, outs, guards, f.outputs[: len(outs)], what)
    if f.exact is not None:
        f.exact(spec, inputs, outs, what)
    return outs


def guarded_outputs(op: OpFamily, spec: OpSpec, device: str, before: int = 0
                    ) -> tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor]]:  # fmt: skip
    """NaN-filled outputs, each ``before`` NaN elements into its buffer and followed by a NaN
    guard: (outputs, guards, buffers)."""
    outs, guards, buffers = [], [], []
    for out in op.output_specs(spec):
        buffer = torch.full((before + out.numel + GUARD,), math.nan, dtype=out.torch_dtype, device=device)
        outs.append(buffer[before : before + out.numel].view(out.shape))
        guards.append(buffer[before + out.numel :])
        buffers.append(buffer)
    return outs, guards, buffers


# ---- every schedule, every config class, small and odd shapes, every dtype -----------------------


def config_class_runs(f: Family, variant: str, dtype: str) -> list[tuple[OpSpec, Config, str, int]]:
    """The (spec, config, distribution, seed) runs of one family, schedule and dtype (see :class:`Case`)."""
    v = f.op.variant(variant)
    runs: list[tuple[OpSpec, Config, str, int]] = []
    for case in (c for c in f.cases if c.dtype == dtype):
        space = v.space(f.op.spec((7, case.width), dtype, **f.forms[0]))
        if (variant, case.width) in f.empty:
            assert len(space) == 0, (variant, case.width)
            continue
        configs = covering_configs(space)
        first = configs[case.first % len(configs)]
        plan = [(first, lead) for lead in case.leads]
        plan += [(c, case.others[i % len(case.others)]) for i, c in enumerate(c for c in configs if c != first)]
        for i, (config, lead) in enumerate(plan):
            # the forms take turns: the first, from this run's turn on, whose space holds the config
            turn = f.forms[i % len(f.forms) :] + f.forms[: i % len(f.forms)]
            spec = next(s for s in (f.op.spec((*lead, case.width), dtype, **c) for c in turn) if config in v.space(s))
            distribution = f.op.distributions[(case.distribution + i) % len(f.op.distributions)]
            runs.append((spec, config, distribution, i))
    return runs


@pytest.mark.parametrize(
    ("family", "variant", "dtype"),
    [pytest.param(f.id, v, dtype, id=f"{f.id}-{v}-{dtype}", marks=_marks(f))
     for f in FAMILIES.values() for v in f.schedules for dtype in DTYPES],
)  # fmt: skip
def test_every_config_class_matches_the_reference(family: str, variant: str, dtype: str, device: str) -> None:
    f = FAMILIES[family]
    runs = config_class_runs(f, variant, dtype)
    assert runs, f"{family}/{variant} has no case in {dtype}"
    for spec, config, distribution, seed in runs:
        inputs = f.op.make_inputs(spec, seed=seed, distribution=distribution, device=device)
        run_and_check(f, variant, spec, config, inputs, f"{family}/{variant} {config} {spec.describe()} {distribution}")


@pytest.mark.parametrize("family", list(FAMILIES))
def test_the_config_class_runs_cover_every_value_shape_and_form(family: str) -> None:
    """Across a family's cases, every value of every parameter of each case's space is run, on
    every width and leading shape of its cases, in every form, meeting every distribution; and
    where the family names a width (``choices_at``), the cases' spaces together hold every
    choice its parameters offer."""
    f = FAMILIES[family]
    for variant in f.schedules:
        runs = [run for dtype in DTYPES for run in config_class_runs(f, variant, dtype)]
        for case in f.cases:
            if (variant, case.width) in f.empty:
                continue
            space = f.op.variant(variant).space(f.op.spec((7, case.width), case.dtype, **f.forms[0]))
            mine = [c for s, c, _, _ in runs if (s.inputs[0].shape[-1], s.inputs[0].dtype) == (case.width, case.dtype)]
            assert {kv for c in mine for kv in c.items()} == {kv for c in space for kv in c.items()}, (variant, case)
        assert {s.inputs[0].shape for s, *_ in runs} == {
            (*lead, c.width) for c in f.cases if (variant, c.width) not in f.empty for lead in (*c.leads, *c.others)
        }
        assert all(any(dict(s.constants).items() >= form.items() for s, *_ in runs) for form in f.forms), variant
        assert {d for _, _, d, _ in runs} == set(f.op.distributions), variant
        if f.choices_at is not None:
            seen = {kv for _, c, _, _ in runs for kv in c.items()}
            for param in f.op.variant(variant).space(f.op.spec((1, f.choices_at), "float32")).params:
                missing = set(param.choices) - {v for k, v in seen if k == param.name}
                assert not missing, f"{family}/{variant}: {param.name} values {sorted(missing)} never run"


# ---- the realigned variants: one config per case, odd widths, unaligned addresses ----------------


def one_config(op: OpFamily, variant: str, spec: OpSpec) -> Config:
    """aligned_row: its first config; split_row: the widest chunks that still cut the row in two
    or more (its first chunk then ends mid-row, with the head and tail of chunk 0 apart). Few
    programs: the interpreter runs each in Python."""
    configs = op.variant(variant).space(spec).configs()
    if variant == "split_row":
        return max(configs, key=lambda c: (c["BLOCK_N"], -c["num_warps"]))
    return configs[0]


REALIGNED_PARAMS = [pytest.param(f.id, v, id=f"{f.id}-{v}", marks=_marks(f))
                    for f in FAMILIES.values() for v, cases in f.realigned.items() if cases]  # fmt: skip


@pytest.mark.parametrize(("family", "variant"), REALIGNED_PARAMS)
def test_the_realigned_variants_match_the_reference(family: str, variant: str, device: str) -> None:
    f = FAMILIES[family]
    for i, case in enumerate(f.realigned[variant]):
        spec = f.op.spec(case.shape, case.dtype, **case.constants)
        config = one_config(f.op, variant, spec)
        inputs = f.op.make_inputs(spec, seed=i, distribution=case.distribution, device=device)
        run_and_check(f, variant, spec, config, inputs, f"{family}/{variant} {config} {spec.describe()} "
                      f"{case.distribution}")  # fmt: skip


# a bfloat16 shape each variant has configs for
UNALIGNED_SHAPES = {"aligned_row": (3, 1000), "split_row": (3, 4097)}


@pytest.mark.parametrize(("family", "variant"), [
    *((p.values[0], p.values[1]) for p in REALIGNED_PARAMS), ("layernorm", "aligned_row")])  # fmt: skip
def test_the_realigned_variants_at_unaligned_addresses(family: str, variant: str, device: str) -> None:
    """Every row-shaped input 2, 4, ... bytes past an aligned address and the outputs 6 bytes past
    it (views at a storage offset, as a slice of a bigger buffer is): the pieces assume an aligned
    base only for speed, never for which elements they cover, nor which they write."""
    f = FAMILIES[family]
    spec = f.op.spec(UNALIGNED_SHAPES[variant], "bfloat16")
    inputs = f.op.make_inputs(spec, seed=7, device=device)
    moved, k = [], 0
    for t in inputs:
        if t.shape == inputs[0].shape:  # x, and add_rmsnorm's residual
            k += 1
            t = torch.empty(t.numel() + k, dtype=t.dtype, device=device)[k:].view(t.shape).copy_(t)
        moved.append(t)
    outs, guards, buffers = guarded_outputs(f.op, spec, device, before=3)
    f.op.variant(variant).build(spec, one_config(f.op, variant, spec))(moved, outs)
    assert all(bool(torch.isnan(b[:3]).all()) for b in buffers), f"{family}/{variant} wrote before its output"
    what = f"{family}/{variant} at unaligned addresses"
    assert_guarded_outputs(f.op, spec, inputs, outs, guards, f.outputs, what)
    if f.exact is not None:
        f.exact(spec, inputs, outs, what)


# ---- the harness ---------------------------------------------------------------------------------


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the stress data holds inf: inf - inf is NaN
@pytest.mark.parametrize(
    ("family", "index"),
    [pytest.param(f.id, i, id="-".join((f.id, h.variant, *map(str, h.shape), h.dtype, *map(str, h.constants.values()))))
     for f in FAMILIES.values() for i, h in enumerate(f.harness)],
)  # fmt: skip
def test_every_variant_passes_the_harness(family: str, index: int, device: str) -> None:
    """The real validation: every distribution on the target, the tails (the stress data on
    them), every output checked, canaries, torch-op watch, re-run on differently poisoned outputs."""
    f = FAMILIES[family]
    h = f.harness[index]
    spec = f.op.spec(h.shape, h.dtype, **h.constants)
    v = f.op.variant(h.variant)
    config = {"last": lambda: v.space(spec).configs()[-1], "covering": lambda: covering_configs(v.space(spec))[-1],
              "one": lambda: one_config(f.op, h.variant, spec)}[h.pick]()  # fmt: skip
    runs = validate(f.op, spec, v.build, config, device, lambda: None)
    assert runs in h.runs(f.op, spec), (h, runs)


def test_every_variant_meets_the_harness() -> None:
    for f in FAMILIES.values():
        assert {h.variant for h in f.harness} == {v.name for v in f.op.variants}, f.id


# ---- what the schedules share --------------------------------------------------------------------

NORMS = ("rmsnorm", "add_rmsnorm", "layernorm")
BACKWARDS = ("rmsnorm_backward", "add_rmsnorm_backward", "layernorm_backward")


@pytest.mark.parametrize("rows", [1, 31, 33])
@pytest.mark.parametrize("family", NORMS)
def test_multi_row_masks_the_rows_past_the_end(family: str, rows: int, device: str) -> None:
    # Every ROWS value on row counts that no ROWS divides (or fewer rows than ROWS).
    f = FAMILIES[family]
    spec = f.op.spec((rows, 5), "float32")
    inputs = f.op.make_inputs(spec, seed=rows, distribution=f.multi_row_distribution, device=device)
    by_rows = {c["ROWS"]: c for c in f.op.variant("multi_row").space(spec)}
    assert sorted(by_rows) == [2, 4, 8, 16, 32]
    for config in by_rows.values():
        run_and_check(f, "multi_row", spec, config, inputs, f"{family}/multi_row {config} rows={rows}")


@pytest.mark.parametrize("family", NORMS)
def test_persistent_programs_loop_over_several_rows(family: str, device: str) -> None:
    # 33 rows on at most 4 * PROGRAMS_PER_SM programs (the CPU stand-in has 4 "SMs"; a GPU has
    # more): with PROGRAMS_PER_SM=1 each program takes 8 or 9 rows; with 8, most take one.
    f = FAMILIES[family]
    constants, distribution = f.persistent
    spec = f.op.spec((33, 24), "float16", **constants)
    inputs = f.op.make_inputs(spec, seed=9, distribution=distribution, device=device)
    for programs in (1, 8):
        config = Config(PROGRAMS_PER_SM=programs, num_warps=1, num_stages=2)
        run_and_check(f, "persistent", spec, config, inputs, f"{family}/persistent PROGRAMS_PER_SM={programs}")


# (family, variant, num_stages, width, dtype, distribution): 1000 columns in blocks of 64 are 16
# blocks, the last one 40 wide (add_rmsnorm's pass 2 re-reads h); LayerNorm's 130 are 3 blocks,
# the last with 2 live lanes (Welford's lanes hold 3 or 2 values), on offset rows, where the
# merge must not cancel.
MANY_BLOCKS = [
    ("rmsnorm", "looped", 2, 1000, "bfloat16", "large"),
    *(("add_rmsnorm", "looped", stages, 1000, "bfloat16", "large") for stages in (1, 3)),
    *(("layernorm", "welford", 2, width, dtype, "offset") for width in (130, 1000)
      for dtype in ("bfloat16", "float32")),
]  # fmt: skip


@pytest.mark.parametrize(("family", "variant", "stages", "width", "dtype", "distribution"), MANY_BLOCKS)
def test_a_row_of_many_blocks(family: str, variant: str, stages: int, width: int, dtype: str, distribution: str,
                              device: str) -> None:  # fmt: skip
    f = FAMILIES[family]
    spec = f.op.spec((3, width), dtype)
    config = Config(BLOCK_N=64, num_warps=2, num_stages=stages)
    assert config in f.op.variant(variant).space(spec)
    inputs = f.op.make_inputs(spec, seed=5, distribution=distribution, device=device)
    run_and_check(f, variant, spec, config, inputs, f"{family}/{variant} BLOCK_N=64 {spec.describe()}")


@pytest.mark.parametrize("family", [*NORMS, *BACKWARDS])
def test_eps_reaches_the_kernels(family: str, device: str) -> None:
    """With a tiny x, eps dominates its mean square (its variance): the family's eps and 1 give
    very different outputs, and each kernel must match the reference for its own eps."""
    f = FAMILIES[family]
    results = []
    for eps in f.eps:
        # LayerNorm's forward without its parameters (with them, the bias would dominate y)
        constants = {"affine": "none"} if f.op is LAYERNORM else {}
        spec = f.op.spec((4, 16), "float32", eps=eps, **constants)
        inputs = f.op.make_inputs(spec, seed=3, distribution="small", device=device)
        for variant in f.op.variants:
            configs = variant.space(spec).configs()
            if not configs:  # aligned_row: 16 columns, rows Triton proves aligned
                continue
            outs = run_and_check(f, variant.name, spec, configs[0], inputs, f"{family}/{variant.name} eps={eps}")
        # add_rmsnorm_backward's dsum is dh plus the norm's gradient: the norm's part
        results.append(outs[0] - inputs[1] if f.op is ADD_RMSNORM_BACKWARD else outs[0])
    assert not torch.allclose(results[0], results[1], rtol=0.1)


@pytest.mark.parametrize("family", BACKWARDS)
def test_groups_walk_several_rows_and_the_reduction_several_steps(family: str, device: str) -> None:
    # 33 rows: with GROUPS=1 (4 programs in the interpreter) each program takes 8 or 9 rows; with
    # GROUPS=4 (16 programs) and BLOCK_R=8 the parameters' reduction takes two steps, the second
    # masked.
    f = FAMILIES[family]
    op = f.op
    spec = op.spec((33, 40), "float16")
    inputs = op.make_inputs(spec, seed=9, distribution="uniform" if op is LAYERNORM_BACKWARD else "large",
                            device=device)  # fmt: skip
    for groups, block_r in product((1, 4), (8, 32)):
        config = Config(GROUPS=groups, BLOCK_R=block_r, num_warps=1, num_stages=2)
        run_and_check(f, "two_stage", spec, config, inputs, f"{family}/two_stage {config}")
    # Four column blocks, the last one 232 wide. LayerNorm's Welford lanes hold 4 or 3 values,
    # merged without cancelling on offset rows.
    config = Config(BLOCK_N=256, GROUPS=4, num_warps=2, num_stages=3)
    wides = ([(op.spec((5, 1000), dtype, affine="weight"), "offset") for dtype in ("bfloat16", "float32")]
             if op is LAYERNORM_BACKWARD else [(op.spec((5, 1000), "bfloat16"), "small")])  # fmt: skip
    for wide, distribution in wides:
        inputs = op.make_inputs(wide, seed=1, distribution=distribution, device=device)
        run_and_check(f, "looped", wide, config, inputs, f"{family}/looped BLOCK_N=256 {wide.describe()}")


@pytest.mark.parametrize(("family", "variant"), [(f, v.name) for f in BACKWARDS for v in FAMILIES[f].op.variants])
def test_the_backwards_are_bitwise_deterministic(family: str, variant: str, device: str) -> None:
    op = FAMILIES[family].op
    spec = op.spec((33, 4097 if variant == "split_row" else 100), "bfloat16")  # split_row: rows over 8 KB
    inputs = op.make_inputs(spec, seed=2, device=device)
    config = op.variant(variant).space(spec).configs()[-1]
    first, _ = launch_guarded(op, variant, spec, config, inputs, GUARD)
    second, _ = launch_guarded(op, variant, spec, config, inputs, GUARD)
    for a, b in zip(first, second, strict=True):
        assert torch.equal(a, b)


# The families whose launchers these tests watch, and the variants (split_row allocates its
# scratch of chunk statistics: RMSNorm's GPU test of the launchers allows it that, and no more).
WATCHED = [(f, v.name) for f in ("layernorm", "softmax", "sum", "mean", "max") for v in FAMILIES[f].op.variants
           if v.name != "split_row"]  # fmt: skip


@pytest.mark.parametrize(("family", "variant"), WATCHED)
def test_launchers_issue_no_torch_compute(family: str, variant: str, device: str) -> None:
    """The harness watches candidates with a dispatch mode: a launcher may only take views."""
    f = FAMILIES[family]
    constants = {"affine": "weight"} if f.op is LAYERNORM else {}
    spec = f.op.spec((2, 3, 100), "float16" if f.op is LAYERNORM else "bfloat16", **constants)
    inputs = f.op.make_inputs(spec, seed=9, device=device)
    outs, guards, _ = guarded_outputs(f.op, spec, device)
    launch = f.op.variant(variant).build(spec, f.op.variant(variant).space(spec).configs()[-1])
    watch = TorchOpWatch()
    with watch:
        launch(inputs, outs)
    assert watch.issued == []
    assert_guarded_outputs(f.op, spec, inputs, outs, guards, f.outputs, f"{family}/{variant}")


@pytest.mark.parametrize(("family", "variant"), [(f, v) for f, v in WATCHED if f in ("softmax", "mean")])
def test_launchers_are_reusable(family: str, variant: str, device: str) -> None:
    """A launcher holds no state from one call to the next: new inputs, new outputs."""
    f = FAMILIES[family]
    spec = f.op.spec((6, 50), "float16")
    launch = f.op.variant(variant).build(spec, f.op.variant(variant).space(spec).configs()[0])
    results = []
    for seed in (1, 2):
        inputs = f.op.make_inputs(spec, seed=seed, device=device)
        outs, guards, _ = guarded_outputs(f.op, spec, device)
        launch(inputs, outs)
        assert_guarded_outputs(f.op, spec, inputs, outs, guards, f.outputs, f"{family}/{variant} seed {seed}")
        results.append(outs[0])
    assert not torch.equal(results[0], results[1])


@pytest.mark.parametrize(
    ("family", "variant"), [(f, v) for f in ("softmax", "sum", "mean", "max") for v in FAMILIES[f].schedules]
)
def test_one_config_is_right_for_every_validation_spec(family: str, variant: str, device: str) -> None:
    """A config is chosen for a width and must be right for any row count, the tails included
    (multi_row's last config: 32 or 64 rows a program, which divides none of them)."""
    f = FAMILIES[family]
    target = f.op.spec((40, 100), "bfloat16")
    config = f.op.variant(variant).space(target).configs()[-1]
    specs = f.op.validation_specs(target)
    assert [s.inputs[0].shape[0] for s in specs] == [40, *tail_rows(40, f.op.row_block)]
    for spec in specs:
        assert config in f.op.variant(variant).space(spec)
        distribution = "outliers" if f.op is SOFTMAX else "large"
        inputs = f.op.make_inputs(spec, seed=4, distribution=distribution, device=device)
        run_and_check(f, variant, spec, config, inputs, f"{family}/{variant} {config.key} {spec.describe()}")


@pytest.mark.parametrize(
    ("family", "variant"),
    [(f, v) for f in ("add_rmsnorm", "layernorm", "softmax", "max") for v in FAMILIES[f].schedules],
)  # fmt: skip
def test_build_rejects_a_config_outside_the_space(family: str, variant: str) -> None:
    op = FAMILIES[family].op
    spec = op.spec((4, 64), "float32")
    config = op.variant(variant).space(spec).configs()[0]
    with pytest.raises(ValueError, match="not in the space"):
        op.variant(variant).build(spec, config.replace(num_warps=3))
    with pytest.raises(ValueError, match="not in the space"):
        op.variant(variant).build(spec, config.replace(BOGUS=1))


# ---- Gemma's weight offset: the norms scale by weight + weight_offset ----------------------------


@dataclass(frozen=True)
class OffsetCases:
    """A family's weight-offset runs: small and odd (shape, dtype) cases; the one whose every
    config class runs (the others run their space's first config); the outputs the offset does
    not change (RMSNorm backward's dw, add_rmsnorm's h)."""

    cases: tuple[tuple[Shape, str], ...]
    covering: int | None
    blind: tuple[int, ...] = ()


# One column, one row of an odd width, leading dims of a width no power of two, a row count no
# ROWS divides, a 1-D x; every dtype.
ODD_OFFSET_CASES: tuple[tuple[Shape, str], ...] = (
    ((7, 1), "float32"), ((1, 37), "bfloat16"), ((2, 3, 341), "float16"), ((33, 100), "bfloat16"), ((37,), "float32"))
WEIGHT_OFFSET = {
    "rmsnorm": OffsetCases(ODD_OFFSET_CASES, covering=3),
    "add_rmsnorm": OffsetCases(ODD_OFFSET_CASES[:3], covering=None, blind=(1,)),
    "rmsnorm_backward": OffsetCases(ODD_OFFSET_CASES[:4], covering=3, blind=(1,)),
}  # fmt: skip


@pytest.mark.parametrize(("family", "variant"), [(f, v) for f in WEIGHT_OFFSET for v in FAMILIES[f].schedules])
def test_weight_offset_reaches_every_variant(family: str, variant: str, device: str) -> None:
    """Each variant with Gemma's offset (1) against the float64 reference; the same config without
    the offset, on the same inputs, gets every output the offset changes wrong beyond the
    tolerance (the offset does not hide in it), and the others right."""
    f, offset = FAMILIES[family], WEIGHT_OFFSET[family]
    for i, (shape, dtype) in enumerate(offset.cases):
        spec = f.op.spec(shape, dtype, weight_offset=1.0)
        configs = covering_configs(f.op.variant(variant).space(spec))
        distribution = f.op.distributions[i % len(f.op.distributions)]
        inputs = f.op.make_inputs(spec, seed=i, distribution=distribution, device=device)
        for config in configs if i == offset.covering else configs[:1]:
            run_and_check(f, variant, spec, config, inputs, f"{family}/{variant} {config} {spec.describe()} offset 1")
        plain, _ = launch_guarded(f.op, variant, f.op.spec(shape, dtype), configs[0], inputs, GUARD)
        truths = zip(f.op.reference_fp64(spec, inputs), f.op.reference(spec, inputs), strict=True)
        for k, (out, (ref64, lowp)) in enumerate(zip(plain, truths, strict=True)):
            wrong = check_close(out, ref64, lowp, f.op.tolerance) is not None
            assert wrong == (k not in offset.blind), f"{family}/{variant} {spec.describe()} without the offset: {k}"


# ---- inputs, buckets and spaces the families' specs share ----------------------------------------

# How many of a family's inputs are row-shaped (x, and the residual, dy, dh, h): they come first,
# the parameter vectors (weight, bias) after them.
ROW_INPUTS = {"rmsnorm": 1, "add_rmsnorm": 2, "rmsnorm_backward": 2, "add_rmsnorm_backward": 3,
              "layernorm_backward": 2}  # fmt: skip


@pytest.mark.parametrize("family", list(ROW_INPUTS))
def test_make_inputs_is_deterministic_by_seed(family: str, device: str) -> None:
    """In every form and distribution: the same seed draws the same inputs, another seed draws
    every input anew; row-shaped inputs first, then the vectors, all contiguous on the device in
    the spec's dtype, and no two row-shaped inputs alike (x is not the residual, dy is not x)."""
    f = FAMILIES[family]
    rows = ROW_INPUTS[family]
    for form in f.forms:
        spec = f.op.spec((2, 5, 48), "bfloat16", **form)
        for distribution in f.op.distributions:
            a = f.op.make_inputs(spec, seed=11, distribution=distribution, device=device)
            b = f.op.make_inputs(spec, seed=11, distribution=distribution, device=device)
            c = f.op.make_inputs(spec, seed=12, distribution=distribution, device=device)
            what = f"{family} {form} {distribution}"
            assert all(torch.equal(p, q) for p, q in zip(a, b, strict=True)), what
            assert not any(torch.equal(p, q) for p, q in zip(a, c, strict=True)), what
            assert [tuple(t.shape) for t in a] == [(2, 5, 48)] * rows + [(48,)] * (len(spec.inputs) - rows), what
            assert all(t.dtype == torch.bfloat16 and t.is_contiguous() for t in a), what
            assert {t.device.type for t in a} == {torch.device(device).type}, what
            assert all(not torch.equal(p, q) for i, p in enumerate(a[:rows]) for q in a[i + 1 : rows]), what


@pytest.mark.parametrize("family", BACKWARDS)
def test_the_backwards_bucket_and_tails_keep_the_row_inputs_alike(family: str) -> None:
    """A bucket flattens the leading dims of every row-shaped input alike (100 rows to 128) and
    keeps the vectors; every validation tail keeps the row-shaped inputs alike, is supported and
    has the target's space (a config is chosen for a width, whatever the rows)."""
    op, rows = FAMILIES[family].op, ROW_INPUTS[family]
    spec = op.spec((4, 25, 3000), "float16")
    vectors = len(spec.inputs) - rows
    assert [t.shape for t in op.bucket(spec).inputs] == [(128, 3000)] * rows + [(3000,)] * vectors
    tails = op.validation_specs(spec)
    assert len(tails) > 1
    for tail in tails:
        assert len({t.shape for t in tail.inputs[:rows]}) == 1, tail.describe()
        assert [t.shape for t in tail.inputs[rows:]] == [(3000,)] * vectors, tail.describe()
        op.check_supported(tail)
        for variant in op.variants:
            assert variant.space(tail).configs() == variant.space(spec).configs(), (variant.name, tail.describe())


RMS_BACKWARDS = ("rmsnorm_backward", "add_rmsnorm_backward")


@pytest.mark.parametrize("width", [1, 2, 3, 17, 341, 1000, 4096, 8192, 32768, 65536])
@pytest.mark.parametrize("family", RMS_BACKWARDS)
def test_the_rms_backwards_spaces_are_non_empty_and_valid(family: str, width: int) -> None:
    """Every variant has configs at every width it takes, and only valid ones: two_stage holds
    whole rows up to BACKWARD_MAX_ROW, split_row takes rows of more than SPLIT_MIN_ROW_BYTES."""
    op = FAMILIES[family].op
    spec = op.spec((8, width), "bfloat16")
    for variant in op.variants:
        space = variant.space(spec)
        if variant.name == "two_stage" and width > BACKWARD_MAX_ROW:
            assert len(space) == 0
            continue
        if variant.name == "split_row" and width * 2 <= SPLIT_MIN_ROW_BYTES:  # bf16 rows of at most 8 KB
            assert len(space) == 0
            continue
        assert len(space) > 0, f"{family}/{variant.name} has no config at width {width}"
        for config in space:
            assert space.violations(config) == []


@pytest.mark.parametrize("family", RMS_BACKWARDS)
def test_the_rms_backwards_space_sizes_are_modest(family: str) -> None:
    f = FAMILIES[family]
    for width in (4096, 8192):
        spec = f.op.spec((8192, width), "bfloat16")
        total = sum(len(f.op.variant(name).space(spec)) for name in f.schedules)
        assert 30 <= total <= 160, (width, total)
        assert len(f.op.variant("split_row").space(spec)) <= 80, width
    assert len({v.source_hash for v in f.op.variants}) == len(f.op.variants)


@pytest.mark.parametrize("family", ["rmsnorm", "add_rmsnorm"])
def test_the_rms_norms_row_limits(family: str) -> None:
    op = FAMILIES[family].op
    too_wide = op.spec((2, MAX_WHOLE_ROW + 1), "bfloat16")
    assert len(op.variant("whole_row").space(too_wide)) == 0
    assert len(op.variant("persistent").space(too_wide)) == 0
    assert len(op.variant("looped").space(too_wide)) > 0  # the wide-row fallback
    # looped blocks are narrower than the row, except the smallest one for narrow rows
    assert {c["BLOCK_N"] for c in op.variant("looped").space(op.spec((2, 4096), "fp16"))} == {
        64, 128, 256, 512, 1024, 2048}
    assert {c["BLOCK_N"] for c in op.variant("looped").space(op.spec((2, 40), "fp16"))} == {64}
    # multi_row never holds more than 16384 elements in one block
    assert {c["ROWS"] for c in op.variant("multi_row").space(op.spec((2, 4096), "fp16"))} == {2, 4}


def rms_example_tensors(family: str, rows: int, width: int) -> list[torch.Tensor]:
    """bfloat16 example tensors for RMSNorm (x, weight) or add_rmsnorm (x, residual, weight)."""
    return [torch.zeros(rows, width, dtype=torch.bfloat16) for _ in range(ROW_INPUTS[family])] + [
        torch.ones(width, dtype=torch.bfloat16)]  # fmt: skip


@pytest.mark.parametrize("family", ["rmsnorm", "add_rmsnorm"])
def test_the_rms_norms_spec_for_matches_spec_and_hashes(family: str) -> None:
    """A spec from example tensors is the command line's, hash included; the default eps hashes
    as no eps; eps, dtype, width and leading dims each change the hash; the hash survives JSON."""
    op = FAMILIES[family].op
    example = rms_example_tensors(family, 16, 128)
    from_tensors = op.spec_for(*example)
    from_cli = op.spec((16, 128), "bfloat16")
    assert from_tensors == from_cli and from_tensors.workload_hash == from_cli.workload_hash
    assert op.spec_for(*example, eps=1e-6).workload_hash == from_cli.workload_hash
    others = {
        op.spec((16, 128), "bfloat16", eps=1e-5).workload_hash,
        op.spec((16, 128), "float16").workload_hash,
        op.spec((16, 256), "bfloat16").workload_hash,
        op.spec((2, 8, 128), "bfloat16").workload_hash,
    }
    assert from_cli.workload_hash not in others and len(others) == 4
    assert OpSpec.from_dict(from_cli.to_dict()).workload_hash == from_cli.workload_hash


@pytest.mark.parametrize("family", ["rmsnorm", "add_rmsnorm"])
def test_the_rms_norms_bad_specs_are_rejected(family: str) -> None:
    op = FAMILIES[family].op
    example = [t.float() for t in rms_example_tensors(family, 4, 8)]
    for eps in (-1.0, math.inf, math.nan):
        with pytest.raises(UnsupportedWorkload):
            op.spec_for(*example, eps=eps)
        with pytest.raises(UnsupportedWorkload):
            op.spec((4, 8), "fp32", eps=eps)
    with pytest.raises(UnsupportedWorkload):
        op.spec((4, 8), "fp64")
    with pytest.raises(UnsupportedWorkload):
        op.spec((4, 0), "fp32")
    with pytest.raises(UnsupportedWorkload):
        op.spec((4, 8), "fp32", dim=0)
    with pytest.raises(UnsupportedWorkload):
        op.spec_for(*example, dim=0)
    with pytest.raises(ValueError):
        op.spec((4, 8), "int3")


# Softmax and the reductions: one tensor in, normalized or reduced along its last dim only.
ONE_TENSOR = ("softmax", "sum", "mean", "max")


@pytest.mark.parametrize("family", ONE_TENSOR)
def test_the_one_tensor_specs_normalise_the_last_dim(family: str) -> None:
    op = FAMILIES[family].op
    assert op.spec((4, 8), "float32", dim=1) == op.spec((4, 8), "float32", dim=-1)
    assert op.spec((2, 4, 8), "float32", dim=2).workload_hash == op.spec((2, 4, 8), "fp32").workload_hash
    assert op.spec((8,), "float32", dim=0).constants["dim"] == -1
    for shape, dim in [((4, 8), 0), ((2, 4, 8), 1), ((2, 4, 8), -2), ((4, 8), 2), ((4, 8), (0, 1))]:
        with pytest.raises(UnsupportedWorkload, match="last dimension"):
            op.spec(shape, "float32", dim=dim)


@pytest.mark.parametrize("family", ONE_TENSOR)
def test_the_one_tensor_specs_reject_what_the_kernels_cannot_do(family: str) -> None:
    op = FAMILIES[family].op
    with pytest.raises(UnsupportedWorkload):
        op.spec((4, 8), "float64")
    with pytest.raises(ValueError):
        op.spec((4, 8), "int8")
    with pytest.raises(UnsupportedWorkload):
        op.spec((4, 0), "float32")
    with pytest.raises(UnsupportedWorkload):
        op.spec((), "float32")
    with pytest.raises(UnsupportedWorkload, match="unknown constants"):
        op.spec((4, 8), "float32", eps=1e-5)


@pytest.mark.parametrize("family", ONE_TENSOR)
def test_the_one_tensor_specs_from_example_tensors(family: str) -> None:
    op = FAMILIES[family].op
    x = torch.zeros(3, 5, 7, dtype=torch.float16)
    assert op.spec_for(x) == op.spec((3, 5, 7), "float16")
    assert op.spec_for(x, dim=2) == op.spec_for(x, dim=-1)
    assert op.spec_for(torch.zeros(7, dtype=torch.bfloat16), dim=0) == op.spec((7,), "bf16")
    with pytest.raises(UnsupportedWorkload):
        op.spec_for(x, x)
    with pytest.raises(UnsupportedWorkload):
        op.spec_for()


BAD_TENSORS = [
    pytest.param(lambda: torch.zeros(5, 7).t(), {}, id="non-contiguous"),
    pytest.param(lambda: torch.zeros(5, 8)[:, ::2], {}, id="strided-rows"),
    pytest.param(lambda: torch.zeros(5, 7, dtype=torch.float64), {}, id="float64"),
    pytest.param(lambda: torch.zeros(5, 7, dtype=torch.int32), {}, id="int32"),
    pytest.param(lambda: torch.zeros(5, 7, dtype=torch.bool), {}, id="bool"),
    pytest.param(lambda: torch.tensor(1.0), {}, id="0-d"),
    pytest.param(lambda: torch.zeros(5, 0), {}, id="empty-rows"),
    pytest.param(lambda: torch.zeros(0, 7), {}, id="no-rows"),
    pytest.param(lambda: torch.zeros(5, 7), {"dim": 0}, id="dim-0"),
    pytest.param(lambda: torch.zeros(5, 7), {"dim": -2}, id="dim--2"),
    pytest.param(lambda: torch.zeros(5, 7), {"dim": True}, id="dim-bool"),
    pytest.param(lambda: torch.zeros(5, 7), {"dim": -1.0}, id="dim-float"),
    pytest.param(lambda: torch.zeros(5, 7), {"dim": (0, 1)}, id="dims"),
    pytest.param(lambda: torch.zeros(5, 7), {"keepdim": True}, id="keepdim"),
    pytest.param(lambda: torch.zeros(5, 7), {"dim": -1, "dtype": torch.float32}, id="dtype"),
    pytest.param(lambda: torch.zeros(5, 7), {"dim": -1, "eps": 0.1}, id="eps"),
]  # fmt: skip


@pytest.mark.parametrize(("make", "constants"), BAD_TENSORS)
@pytest.mark.parametrize("family", ONE_TENSOR)
def test_the_one_tensor_specs_reject_bad_tensors(family: str, make: Callable[[], torch.Tensor],
                                                  constants: Constants) -> None:  # fmt: skip
    with pytest.raises(UnsupportedWorkload):
        FAMILIES[family].op.spec_for(make(), **constants)


# ---- the real compiler ---------------------------------------------------------------------------


def real_compiler_cases() -> list[tuple[OpFamily, str, OpSpec, Config]]:
    """Every family, form and variant at the first config of its space (the smallest blocks) and
    the last (the largest), the dtype rotating over the families, on 7 rows of 241 columns
    (split_row: 4100 columns, more than 8 KB a row in every dtype)."""
    cases = []
    for i, f in enumerate(FAMILIES.values()):
        for form in f.forms:
            for variant in f.op.variants:
                width = 4100 if variant.name == "split_row" else 241
                spec = f.op.spec((7, width), DTYPES[i % len(DTYPES)], **form)
                configs = variant.space(spec).configs()
                assert configs, (f.id, variant.name, form)
                cases += [(f.op, variant.name, spec, c) for c in {configs[0], configs[-1]}]
    return cases


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the other tests compile for real")
def test_every_variant_compiles_under_the_real_triton_compiler() -> None:
    """The interpreter accepts what the compiler may not (module docstring of real_compiler.py):
    every kernel, as its launchers launch it, is lowered to Triton IR by the real front end."""
    assert_every_kernel_lowers("test_rowwise_families:real_compiler_cases")

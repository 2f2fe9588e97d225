"""RMSNorm backward's split_row variant (issue 19): rows cut into column chunks across programs,
(chunk, row group) programs walking their group's rows store each chunk's partial row sums
(sum(x * x), sum(dy * w * x)) in a float32 scratch, then, on the same grid, merge a row's partials
in a fixed order and write dx and the chunk's dw share; the backward skeleton's fixed-order share
sum adds the shares (kernelsmith.ops._rowwise_backward).

- odd widths just above 8 KB a row (4097 in 16-bit, 2049/4099/5000/8193...), 1 and 3 rows and a
  2-D lead, every dtype, with and without Gemma's weight offset, dx and dw against the float64
  reference under the harness's tolerance, into NaN-filled outputs followed by NaN guards;
- every config class (every value of every parameter of the space) on one spec;
- row groups walking several rows (the dw share summed over them) and the share sum of several
  groups;
- bitwise reproducibility across runs; the harness's validation, and a planted bug (one group's
  dw share left out of the sum) that it rejects;
- the space: empty for rows of 8 KB or less (so that the recorded spaces stand);
- add_rmsnorm_backward's split_row (the same statistics kernel on h, dh added in its rows
  kernel) on a few of the cases.

The real compiler's lowering is in the row-wise families' suite (test_rowwise_families.py:
every variant of every family at both ends of its space) and the fp64-scalar suite
(test_inductor_float_scalars.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import pytest
import torch

from kernelsmith.evaluate.validate import Rejected, validate
from kernelsmith.ops import _rowwise as skeleton
from kernelsmith.ops import _rowwise_backward as backward
from kernelsmith.ops._base import OpFamily
from kernelsmith.ops.add_rmsnorm_backward import OP as ADD_RMSNORM_BACKWARD
from kernelsmith.ops.rmsnorm_backward import OP as RMSNORM_BACKWARD
from kernelsmith.space import Config
from kernelsmith.spec import OpSpec
from kernelsmith.testing.kernels import assert_guarded_outputs, covering_configs, launch_guarded
from kernelsmith.testing.validation_runs import validation_runs

OP = RMSNORM_BACKWARD
GUARD = 64
OFFSET = {"weight_offset": 1.0}


def widest(spec: OpSpec, groups: int = 4) -> Config:
    """The widest chunks that still cut the row in two or more, at the fewest warps: the fewest
    programs (the interpreter runs each in Python), and a last chunk mostly empty."""
    configs = [c for c in OP.variant("split_row").space(spec).configs() if c["GROUPS"] == groups]
    return max(configs, key=lambda c: (c["BLOCK_N"], -c["num_warps"]))


def run_and_check(spec: OpSpec, config: Config, inputs: Sequence[torch.Tensor], what: str,
                  op: OpFamily = OP) -> list[torch.Tensor]:  # fmt: skip
    """Launch into guarded NaN-filled outputs: dx (dsum) and dw fully written, nothing past their
    ends, the inputs unchanged, each within the tolerance of the float64 reference. Returns them."""
    before = [t.clone() for t in inputs]
    outs, guards = launch_guarded(op, "split_row", spec, config, inputs, GUARD)
    assert all(torch.equal(t, b) for t, b in zip(inputs, before, strict=True)), f"{what}: modified its inputs"
    assert_guarded_outputs(op, spec, inputs, outs, guards, ("dx", "dw"), what)
    return outs


# (leading shape, width, dtype, constants): widths just above 8 KB a row in their dtype and odd
# (none a multiple of a chunk), every dtype with 1, 3 and (2, 2) rows, the weight offset on some.
CASES = [
    ((1,), 4097, "bfloat16", {}), ((3,), 4099, "float16", OFFSET), ((2, 2), 5000, "bfloat16", {}),
    ((1,), 2049, "float32", OFFSET), ((3,), 4099, "float32", {}), ((2, 2), 2051, "float32", {}),
    ((3,), 8193, "bfloat16", OFFSET), ((1,), 5000, "float16", {}), ((2, 2), 4097, "float16", {}),
]  # fmt: skip


def test_the_cases_cover_every_dtype_and_row_count() -> None:
    assert {(lead, d) for lead, _, d, _ in CASES} == {(lead, d) for lead in ((1,), (3,), (2, 2))
                                                      for d in ("float16", "bfloat16", "float32")}  # fmt: skip
    for _, width, dtype, _ in CASES:  # more than 8 KB a row, and a multiple of no chunk (64 and up)
        assert width * torch.empty((), dtype=getattr(torch, dtype)).element_size() > skeleton.SPLIT_MIN_ROW_BYTES
        assert width % 64 != 0


@pytest.mark.parametrize(("lead", "width", "dtype", "constants"), CASES)
def test_split_row_matches_the_reference(lead: tuple[int, ...], width: int, dtype: str,
                                         constants: dict[str, float], device: str) -> None:  # fmt: skip
    spec = OP.spec((*lead, width), dtype, **constants)
    config = widest(spec)
    distribution = OP.distributions[CASES.index((lead, width, dtype, constants)) % len(OP.distributions)]
    inputs = OP.make_inputs(spec, seed=width, distribution=distribution, device=device)
    run_and_check(spec, config, inputs, f"split_row {config} {spec.describe()} {distribution}")


@pytest.mark.parametrize(("lead", "width", "dtype", "constants"), [CASES[i] for i in (0, 1, 5)])
def test_add_rmsnorm_backward_split_row_matches_the_reference(
        lead: tuple[int, ...], width: int, dtype: str, constants: dict[str, float], device: str) -> None:
    """add_rmsnorm_backward's split_row: RMSNorm's statistics kernel on h, its own rows kernel
    adding dh (every dtype, 1, 3 and (2, 2) rows)."""
    spec = ADD_RMSNORM_BACKWARD.spec((*lead, width), dtype, **constants)
    configs = [c for c in ADD_RMSNORM_BACKWARD.variant("split_row").space(spec).configs() if c["GROUPS"] == 1]
    config = max(configs, key=lambda c: (c["BLOCK_N"], -c["num_warps"]))
    inputs = ADD_RMSNORM_BACKWARD.make_inputs(spec, seed=width, distribution="large", device=device)
    run_and_check(spec, config, inputs, f"add_rmsnorm_backward split_row {config} {spec.describe()}",
                  ADD_RMSNORM_BACKWARD)


@pytest.mark.slow  # about 11 s interpreted
def test_every_config_class_matches_the_reference(device: str) -> None:
    """Every value of every parameter (BLOCK_N from 64, 33 chunks a row, to 2048; every warp
    count; both GROUPS) on 2 rows of 2049 float32 columns."""
    spec = OP.spec((2, 2049), "float32", **OFFSET)
    space = OP.variant("split_row").space(spec)
    configs = covering_configs(space)
    for i, config in enumerate(configs):
        distribution = OP.distributions[i % len(OP.distributions)]
        inputs = OP.make_inputs(spec, seed=i, distribution=distribution, device=device)
        run_and_check(spec, config, inputs, f"split_row {config} {spec.describe()} {distribution}")
    assert {kv for c in configs for kv in c.items()} == {kv for c in space for kv in c.items()}


def test_groups_walk_several_rows(device: str) -> None:
    """9 rows on GROUPS=1 (4 row groups in the interpreter: both kernels' programs walk 2 or 3
    rows, the rows kernel adding their dw terms in its share) and GROUPS=4 (9 groups, one row
    each: 9 shares summed)."""
    spec = OP.spec((9, 4100), "bfloat16")
    inputs = OP.make_inputs(spec, seed=3, distribution="large", device=device)
    for groups in (1, 4):
        config = Config(BLOCK_N=1024, GROUPS=groups, num_warps=2)  # 5 chunks, the last 4 columns
        assert config in OP.variant("split_row").space(spec)
        run_and_check(spec, config, inputs, f"split_row {config} {spec.describe()}")


def test_runs_are_bitwise_reproducible(device: str) -> None:
    """The same input gives the same bits, run after run (differently poisoned outputs): the
    chunks' sums and the shares are added in one fixed order, with no atomics."""
    spec = OP.spec((5, 4099), "float16")
    config = Config(BLOCK_N=1024, GROUPS=1, num_warps=4)
    inputs = OP.make_inputs(spec, seed=5, device=device)
    launch = OP.variant("split_row").build(spec, config)
    runs = []
    for poison in (math.nan, 0.0, -1.0):
        outs = [torch.full(o.shape, poison, dtype=o.torch_dtype, device=device) for o in OP.output_specs(spec)]
        launch(inputs, outs)
        runs.append(outs)
    assert all(torch.equal(a, b) for later in runs[1:] for a, b in zip(runs[0], later, strict=True))


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the stress data holds inf: inf - inf is NaN
def test_split_row_passes_the_harness(device: str) -> None:
    """The real validation (every distribution on the target, the tails, canaries, torch-op
    watch, differently poisoned outputs), at the widest chunks."""
    spec = OP.spec((2, 2049), "float32", **OFFSET)
    runs = validate(OP, spec, OP.variant("split_row").build, widest(spec), device, lambda: None)
    assert runs in validation_runs(OP, spec), runs


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_the_harness_rejects_a_share_left_out(monkeypatch: pytest.MonkeyPatch, device: str) -> None:
    """A planted bug: the dw sum adds every row group's share but the last (dx is right; dw misses
    one group's rows). The harness must reject it."""
    right = backward.reducer

    def one_short(n: int, block_r: int) -> Callable[[torch.Tensor, torch.Tensor, int], None]:
        reduce = right(n, block_r)
        return lambda partial, out, programs: reduce(partial, out, programs - 1)

    monkeypatch.setattr(backward, "reducer", one_short)
    spec = OP.spec((2, 2049), "float32")
    with pytest.raises(Rejected):
        validate(OP, spec, OP.variant("split_row").build, widest(spec), device, lambda: None)


def test_the_space() -> None:
    """Rows of more than 8 KB only (the forwards' rule, so that the recorded spaces of narrower
    rows stand), cut in two to 1024 chunks, four chunk vectors under the norms' register rule,
    and both row-group counts."""
    split = OP.variant("split_row")
    assert len(split.space(OP.spec((8, 4096), "bfloat16"))) == 0  # 8192 bytes: not split
    assert len(split.space(OP.spec((8, 2048), "float32"))) == 0
    assert len(split.space(OP.spec((8, 1000), "float16"))) == 0
    assert len(split.space(OP.spec((8, 4097), "bfloat16"))) > 0
    assert len(split.space(OP.spec((8, 2049), "float32"))) > 0
    for width in (4099, 65536, 100_000):
        space = split.space(OP.spec((8, width), "float16"))
        assert all(2 <= math.ceil(width / c["BLOCK_N"]) <= skeleton.MAX_SPLITS for c in space)
        assert all(skeleton.NORM_WARPS.fit(4 * c["BLOCK_N"], c["num_warps"]) for c in space)
        assert {c["GROUPS"] for c in space} == set(skeleton.LOOPED_GROUPS)
        assert set(space.configs()[0]) == {"BLOCK_N", "num_warps", "GROUPS"}
    with pytest.raises(ValueError, match="not in the space"):
        split.build(OP.spec((1, 4099), "float32"), Config({"BLOCK_N": 8192, "GROUPS": 1, "num_warps": 4}))

"""The row reductions' split_row variant (sum, mean, max): rows cut into chunks across programs,
each chunk reduced to one float32 statistic, the chunks' statistics merged a row in a fixed order
by a second launch (kernelsmith.ops.reductions).

- odd widths 4099-32999 (none a multiple of a chunk), 1 and 3 rows and a 2-D lead, every dtype,
  every family, against the float64 reference under the harness's tolerance, into NaN-filled
  outputs followed by NaN guards;
- every config class (every value of every parameter of the space) on one spec per dtype;
- max: a NaN in any chunk (the last, the edge) propagates, as torch.amax; rows -inf throughout;
- bitwise reproducibility across runs; the harness's validation, and a planted bug (the last
  chunk dropped) that it rejects;
- the space (rows of more than 8 KB only) and the real compiler's lowering of both kernels.

The row pieces (head, body, tail, empty chunks) are the skeleton's, tested in
test_rowwise_pieces.py.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import partial
from itertools import product

import pytest
import torch
import triton
from real_compiler_run import LaunchCase, lowered_kernels

from kernelsmith.evaluate.validate import Rejected, validate
from kernelsmith.ops import _rowwise as skeleton
from kernelsmith.ops import reductions
from kernelsmith.ops._base import Launcher, OpFamily
from kernelsmith.ops.reductions import MAX, MEAN, SUM
from kernelsmith.space import Config
from kernelsmith.spec import OpSpec
from kernelsmith.testing.kernels import covering_configs, run_guarded_and_check
from kernelsmith.testing.validation_runs import validation_runs

OPS = {"sum": SUM, "mean": MEAN, "max": MAX}
DTYPES = ("float16", "bfloat16", "float32")
GUARD = 64


def widest(op: OpFamily, spec: OpSpec) -> Config:
    """The widest chunks that still cut the row in two or more, at the fewest warps: the fewest
    programs (the interpreter runs each in Python), and a last chunk mostly or wholly empty."""
    return max(op.variant("split_row").space(spec).configs(), key=lambda c: (c["BLOCK_N"], -c["num_warps"]))


def run_and_check(op: OpFamily, spec: OpSpec, config: Config, inputs: Sequence[torch.Tensor],
                  what: str) -> torch.Tensor:  # fmt: skip
    """Launch into a guarded NaN-filled output: fully written, nothing past its end, the input
    unchanged, within the tolerance of the float64 reference. Returns the result."""
    return run_guarded_and_check(op, "split_row", spec, config, inputs, ("y",), what, GUARD)[0]


# (family, leading shape, width, dtype): every width with every dtype once or more, every family
# with every dtype, 1 and 3 rows and a 2-D lead. The distributions take turns.
CASES = [
    ("sum", (1,), 4099, "float32"), ("mean", (3,), 4099, "bfloat16"), ("max", (3,), 4099, "float16"),
    ("sum", (3,), 8201, "bfloat16"), ("mean", (1,), 8201, "float16"), ("max", (2, 2), 8201, "float32"),
    ("sum", (1,), 16385, "float16"), ("mean", (3,), 16385, "float32"), ("max", (1,), 16385, "bfloat16"),
    ("max", (1,), 32999, "float32"), ("sum", (3,), 32999, "float32"), ("mean", (1,), 32999, "bfloat16"),
    ("sum", (1,), 32999, "bfloat16"), ("mean", (1,), 32999, "float16"), ("max", (3,), 32999, "float16"),
]  # fmt: skip


def test_the_cases_cover_every_width_dtype_and_family() -> None:
    assert {(w, d) for _, _, w, d in CASES} == set(product((4099, 8201, 16385, 32999), DTYPES))
    assert {(o, d) for o, _, _, d in CASES} == set(product(OPS, DTYPES))
    assert {w for _, _, w, _ in CASES} == {4099, 8201, 16385, 32999}
    assert all(w % 2 == 1 for _, _, w, _ in CASES)


@pytest.mark.parametrize(("name", "lead", "width", "dtype"), CASES)
def test_split_row_matches_the_reference(name: str, lead: tuple[int, ...], width: int, dtype: str,
                                         device: str) -> None:  # fmt: skip
    op = OPS[name]
    spec = op.spec((*lead, width), dtype)
    config = widest(op, spec)
    distribution = op.distributions[CASES.index((name, lead, width, dtype)) % len(op.distributions)]
    inputs = op.make_inputs(spec, seed=width, distribution=distribution, device=device)
    run_and_check(op, spec, config, inputs, f"{name} split_row {config} {spec.describe()} {distribution}")


@pytest.mark.parametrize(("name", "shape", "dtype"), [("sum", (3, 4099), "float32"), ("mean", (2, 8200), "bfloat16"),
                                                      ("max", (1, 8200), "float16")])  # fmt: skip
def test_every_config_class_matches_the_reference(name: str, shape: tuple[int, int], dtype: str,
                                                  device: str) -> None:  # fmt: skip
    op = OPS[name]
    spec = op.spec(shape, dtype)
    space = op.variant("split_row").space(spec)
    configs = covering_configs(space)
    for i, config in enumerate(configs):
        distribution = op.distributions[i % len(op.distributions)]
        inputs = op.make_inputs(spec, seed=i, distribution=distribution, device=device)
        run_and_check(op, spec, config, inputs, f"{name} split_row {config} {spec.describe()} {distribution}")
    assert {kv for c in configs for kv in c.items()} == {kv for c in space for kv in c.items()}


def launch_poisoned(op: OpFamily, spec: OpSpec, config: Config, x: torch.Tensor) -> torch.Tensor:
    """split_row into an output filled with a finite poison (the results under test are NaN or
    infinite, so the guarded check's NaN fill cannot tell written from unwritten)."""
    out = torch.full(tuple(op.output_specs(spec)[0].shape), 12345.0, dtype=x.dtype, device=x.device)
    op.variant("split_row").build(spec, config)((x,), (out,))
    return out


@pytest.mark.parametrize("where", ["first", "edge", "last"])
def test_max_propagates_a_nan_from_any_chunk(where: str, device: str) -> None:
    """One NaN in row 1, in chunk 0's body, in the edge (the tail, which chunk 0 takes), or in the
    last chunk: that row's max is NaN (torch.amax), the other rows' exactly torch's."""
    spec = MAX.spec((3, 4099), "float32")
    config = next(c for c in MAX.variant("split_row").space(spec) if c["BLOCK_N"] == 1024)  # 5 chunks a row
    (x,) = MAX.make_inputs(spec, seed=11, device=device)
    x[1, {"first": 5, "edge": 4098, "last": 4096}[where]] = math.nan
    y = launch_poisoned(MAX, spec, config, x)
    assert bool(torch.isnan(y[1])), y
    assert torch.equal(y[[0, 2]], torch.amax(x, -1)[[0, 2]])  # a max is exact: bitwise torch's


def test_infinities_merge_as_torch(device: str) -> None:
    """A row -inf throughout has the max -inf (every chunk's identity is -inf too); a sum with
    +inf in one chunk is inf, with +inf and -inf in different chunks NaN, as torch.sum."""
    spec = MAX.spec((2, 4099), "float32")
    (x,) = MAX.make_inputs(spec, seed=2, device=device)
    x[0] = -math.inf
    y = launch_poisoned(MAX, spec, widest(MAX, spec), x)
    assert torch.equal(y, torch.amax(x, -1)) and y[0].item() == -math.inf
    spec = SUM.spec((2, 4099), "float32")
    (s,) = SUM.make_inputs(spec, seed=2, device=device)
    s[0, 4000], s[1, 10], s[1, 4000] = math.inf, math.inf, -math.inf
    got = launch_poisoned(SUM, spec, widest(SUM, spec), s)
    assert got[0].item() == math.inf and math.isnan(got[1].item())
    assert got[0].item() == torch.sum(s, -1)[0].item() and bool(torch.isnan(torch.sum(s, -1)[1]))


@pytest.mark.parametrize("name", list(OPS))
def test_runs_are_bitwise_reproducible(name: str, device: str) -> None:
    """The same input gives the same bits, run after run (differently poisoned outputs): the
    chunks' statistics are merged in one fixed order, with no atomics."""
    op = OPS[name]
    spec = op.spec((3, 8201), "float32")
    config = next(c for c in op.variant("split_row").space(spec) if c["BLOCK_N"] == 1024)  # 9 chunks a row
    inputs = op.make_inputs(spec, seed=5, device=device)
    runs = []
    for poison in (math.nan, 0.0, -1.0):
        out = torch.full((3,), poison, dtype=torch.float32, device=device)
        op.variant("split_row").build(spec, config)(inputs, (out,))
        runs.append(out)
    assert all(torch.equal(runs[0], later) for later in runs[1:])


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the stress data holds inf: inf - inf is NaN
@pytest.mark.parametrize(("name", "dtype"), [("sum", "float16"), ("mean", "bfloat16"), ("max", "float32")])
def test_split_row_passes_the_harness(name: str, dtype: str, device: str) -> None:
    """The real validation (every distribution on the target, the tails, canaries, torch-op
    watch, differently poisoned outputs), at the widest chunks."""
    op = OPS[name]
    spec = op.spec((3, 4100), dtype)
    runs = validate(op, spec, op.variant("split_row").build, widest(op, spec), device, lambda: None)
    assert runs in validation_runs(op, spec), runs


def _last_chunk_dropped(op: OpFamily) -> object:
    """A planted bug: split_row's two kernels over one chunk fewer than the row has, so the last
    chunk's elements are never read (the merge sees a consistent but short row)."""

    def build(spec: OpSpec, config: Config) -> Launcher:
        n = spec.inputs[0].shape[-1]
        rows = spec.inputs[0].numel // n
        block_n = int(config["BLOCK_N"])
        splits = triton.cdiv(n, block_n) - 1  # the bug
        meta = {"KIND": op.kind, "BLOCK_N": block_n, "SPLITS": triton.next_power_of_2(splits),  # type: ignore[attr-defined]
                "ALIGN": skeleton.alignment(spec), "num_warps": int(config["num_warps"])}

        def launch(inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> None:
            partial = inputs[0].new_empty((rows, splits, 1), dtype=torch.float32)
            reductions._reduce_split_stats_kernel[(rows, splits)](inputs[0], partial, n, **meta)
            reductions._reduce_split_merge_kernel[(rows, splits)](partial, outputs[0], n, float(n), **meta)

        return launch

    return build


# (family, shape, BLOCK_N) of the planted bug. Sums: a 4100-wide float32 row at 1024-element
# chunks has 5 chunks, the last holding only 4 elements (the row is aligned: no head or tail), so
# only 4 elements a row go missing. The max: dropping 4 elements of 4100 changes a row's max only
# where one of them is the max (about 1 row in 1000 of random data), which no harness drawing
# random inputs sees; a dropped half row (8192 wide, two 4096-element chunks) changes it in half
# the rows.
PLANTED = [("sum", (3, 4100), 1024), ("mean", (3, 4100), 1024), ("max", (3, 8192), 4096)]


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize(("name", "shape", "block_n"), PLANTED)
def test_the_harness_rejects_a_dropped_last_chunk(name: str, shape: tuple[int, int], block_n: int,
                                                  device: str) -> None:  # fmt: skip
    """The planted bug launches the same kernels over one chunk fewer: the harness must reject it."""
    op = OPS[name]
    spec = op.spec(shape, "float32")
    config = next(c for c in op.variant("split_row").space(spec) if c["BLOCK_N"] == block_n)
    with pytest.raises(Rejected):
        validate(op, spec, _last_chunk_dropped(op), config, device, lambda: None)  # type: ignore[arg-type]


def test_the_space() -> None:
    """Rows of more than 8 KB (the skeleton's rule, so that the recorded spaces of narrower rows
    stand), cut in two to 1024 chunks, the same for every family."""
    for op in OPS.values():
        split = op.variant("split_row")
        assert len(split.space(op.spec((8, 4096), "bfloat16"))) == 0  # 8192 bytes: not split
        assert len(split.space(op.spec((8, 2048), "float32"))) == 0
        assert len(split.space(op.spec((8, 4097), "bfloat16"))) > 0
        assert len(split.space(op.spec((8, 2049), "float32"))) > 0
        for width in (4099, 65536, 100_000):
            space = split.space(op.spec((8, width), "float16"))
            assert all(2 <= math.ceil(width / c["BLOCK_N"]) <= skeleton.MAX_SPLITS for c in space)
            assert all(skeleton.REDUCTION_WARPS.fit(c["BLOCK_N"], c["num_warps"]) for c in space)
            assert set(space.configs()[0]) == {"BLOCK_N", "num_warps"}
        with pytest.raises(ValueError, match="not in the space"):
            split.build(op.spec((1, 4099), "float32"), Config({"BLOCK_N": 8192, "num_warps": 4}))


# ---- the real compiler ---------------------------------------------------------------------------
# Every launch recorded, then lowered to Triton IR by the real front end, in a child process
# without the interpreter (real_compiler_run.lowered_kernels, as test_layernorm_split_row.py).


def split_row_launches() -> list[LaunchCase]:
    """Every family and dtype, the narrowest chunks and the widest (ALIGN 4 and 8): two launches
    each, the chunks' statistics and their merge."""
    cases = []
    for i, (name, pick) in enumerate(product(OPS, (0, -1))):
        op = OPS[name]
        spec = op.spec((3, 4099), DTYPES[i % 3])
        config = op.variant("split_row").space(spec).configs()[pick]
        outputs = tuple(torch.empty(o.shape, dtype=o.torch_dtype) for o in op.output_specs(spec))
        cases.append(LaunchCase(f"{name} {spec.describe()} {config}", reductions,
                                partial(op.variant("split_row").build, spec, config),
                                op.make_inputs(spec, seed=0, device="cpu"), outputs, launches=2))  # fmt: skip
    return cases


@pytest.mark.parametrize("floats", ["fp32", "fp64"])
def test_both_kernels_lower_under_the_real_triton_compiler(floats: str) -> None:
    """split_row_launches, the mean's width typed as Triton types it (fp32) and as Inductor does
    (fp64), float32 math either way."""
    lowered = lowered_kernels("test_reductions_split_row:split_row_launches", floats)
    assert lowered == ["_reduce_split_merge_kernel", "_reduce_split_stats_kernel"]

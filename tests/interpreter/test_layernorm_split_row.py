"""LayerNorm's split_row variant: rows cut into chunks across programs, the chunks' counts, means
and M2 merged with Chan's formula (kernelsmith.ops._layernorm_split).

- small and odd shapes (1 and 3 rows, a 2-D lead; widths 4099, 8200, 16385 and 33000, none a
  multiple of a chunk), every affine form, every dtype, against the float64 reference under the
  harness's tolerance (``check_close``), into NaN-filled outputs followed by NaN guards;
- every config class (every value of every parameter of the space) on one spec per dtype;
- the training statistics (mean, rstd) against float64, and y the same with and without them;
- bitwise reproducibility across runs, and float32 accuracy on rows of large means;
- rows at unaligned addresses, and the harness's validation;
- the space (rows of more than 8 KB only, two to 1024 chunks) and the real compiler's lowering of
  both kernels, with and without the statistics.

The row pieces the kernels share with RMSNorm's and softmax's split_row (head, body, tail, empty
chunks) are tested in test_rowwise_pieces.py.
"""

from __future__ import annotations

import math
from functools import partial
from itertools import product

import pytest
import torch
from real_compiler_run import LaunchCase, lowered_kernels

from kernelsmith.evaluate.errors import error_stats
from kernelsmith.evaluate.validate import validate
from kernelsmith.ops import _rowwise as skeleton
from kernelsmith.ops import layernorm
from kernelsmith.ops.layernorm import AFFINE, OP, build_with_stats, stats_output_specs
from kernelsmith.space import Config
from kernelsmith.spec import OpSpec
from kernelsmith.testing.kernels import assert_guarded_outputs, covering_configs, run_guarded_and_check
from kernelsmith.testing.validation_runs import validation_runs

SPLIT = OP.variant("split_row")
DTYPES = ("float16", "bfloat16", "float32")
GUARD = 64


def widest(spec: OpSpec) -> Config:
    """The widest chunks that still cut the row in two or more, at the fewest warps: the fewest
    programs (the interpreter runs each in Python), and a last chunk mostly or wholly empty."""
    return max(SPLIT.space(spec).configs(), key=lambda c: (c["BLOCK_N"], -c["num_warps"]))


def run_and_check(spec: OpSpec, config: Config, inputs: tuple[torch.Tensor, ...], what: str) -> torch.Tensor:
    """Launch into a guarded NaN-filled output: fully written, nothing past its end, the inputs
    unchanged, within the tolerance of the float64 reference. Returns y."""
    return run_guarded_and_check(OP, "split_row", spec, config, inputs, ("y",), what, GUARD)[0]


# (leading shape, width, dtype, affine): 1 and 3 rows and a 2-D lead, every width with every dtype
# once or more, every affine form with every dtype. The distributions take turns.
CASES = [
    ((1,), 4099, "float32", "weight_bias"), ((3,), 4099, "bfloat16", "none"), ((3,), 4099, "float16", "weight"),
    ((3,), 8200, "float32", "none"), ((1,), 8200, "bfloat16", "weight_bias"), ((2, 2), 8200, "float16", "weight_bias"),
    ((1,), 16385, "float32", "weight"), ((3,), 16385, "float16", "none"), ((1,), 16385, "bfloat16", "weight"),
    ((1,), 33000, "bfloat16", "weight_bias"), ((3,), 33000, "float32", "weight_bias"), ((1,), 33000, "float16", "none"),
]  # fmt: skip


def test_the_cases_cover_every_width_dtype_and_form() -> None:
    assert {(w, d) for _, w, d, _ in CASES} >= set(product((16385, 33000), DTYPES))
    assert {(d, a) for _, _, d, a in CASES} == set(product(DTYPES, AFFINE))
    assert {w for _, w, _, _ in CASES} == {4099, 8200, 16385, 33000}


@pytest.mark.parametrize(("lead", "width", "dtype", "affine"), CASES)
def test_split_row_matches_the_reference(lead: tuple[int, ...], width: int, dtype: str, affine: str,
                                         device: str) -> None:  # fmt: skip
    spec = OP.spec((*lead, width), dtype, affine=affine)
    config = widest(spec)
    distribution = OP.distributions[CASES.index((lead, width, dtype, affine)) % len(OP.distributions)]
    inputs = OP.make_inputs(spec, seed=width, distribution=distribution, device=device)
    run_and_check(spec, config, inputs, f"split_row {config} {spec.describe()} {distribution}")


@pytest.mark.parametrize(("shape", "dtype"), [((3, 4099), "float32"), ((2, 8200), "bfloat16"),
                                              ((1, 8200), "float16")])  # fmt: skip
def test_every_config_class_matches_the_reference(shape: tuple[int, int], dtype: str, device: str) -> None:
    """Every value of every parameter of the space (the widest chunks of these widths: 4096 in
    float32, 8192 in 16-bit dtypes), the affine forms and the distributions taking turns."""
    configs = covering_configs(SPLIT.space(OP.spec(shape, dtype)))
    for i, config in enumerate(configs):
        spec = OP.spec(shape, dtype, affine=AFFINE[i % len(AFFINE)])
        distribution = OP.distributions[i % len(OP.distributions)]
        inputs = OP.make_inputs(spec, seed=i, distribution=distribution, device=device)
        run_and_check(spec, config, inputs, f"split_row {config} {spec.describe()} {distribution}")
    space = SPLIT.space(OP.spec(shape, dtype))
    assert {kv for c in configs for kv in c.items()} == {kv for c in space for kv in c.items()}


@pytest.mark.parametrize(("shape", "dtype", "affine"), [((3, 4099), "float32", "weight_bias"),
                                                        ((1, 16385), "bfloat16", "none")])  # fmt: skip
def test_the_training_statistics_are_the_rows_mean_and_rstd(shape: tuple[int, int], dtype: str, affine: str,
                                                            device: str) -> None:  # fmt: skip
    """build_with_stats: y bitwise that of the launcher without statistics, and each row's mean
    and rstd within float32 rounding of the float64 ones (one program a row writes them)."""
    spec = OP.spec(shape, dtype, affine=affine)
    config = widest(spec)
    inputs = OP.make_inputs(spec, seed=3, distribution="offset", device=device)
    y = run_and_check(spec, config, inputs, f"split_row {config} {spec.describe()}")
    stats = [torch.full(t.shape, math.nan, dtype=t.torch_dtype, device=device) for t in stats_output_specs(spec)]
    build_with_stats("split_row", spec, config)(inputs, stats)
    assert torch.equal(stats[0], y)
    xd = inputs[0].double()
    mean = xd.mean(-1)
    rstd = torch.rsqrt(xd.var(-1, unbiased=False) + float(spec.const("eps")))
    # |mean| is 100..400 ('offset' rows): a few float32 ulps of it; rstd about 1
    torch.testing.assert_close(stats[1].double(), mean, rtol=4e-7, atol=0)
    torch.testing.assert_close(stats[2].double(), rstd, rtol=2e-6, atol=0)


@pytest.mark.parametrize("block_n", [64, 1024, 2048])
def test_chunks_of_different_means_merge_to_the_row_statistics(block_n: int, device: str) -> None:
    """Rows whose first third sits at +3, the rest at -2 (std 1): most of the variance is the
    spread of the chunks' means, the ``sum n_c (mean_c - mean)^2`` term of Chan's merge, and the
    chunks hold different counts (chunk 0 also takes the head and tail; 8200 = 4 * 2048 + 8 leaves
    a last chunk of 8 elements, or none). float32 and the 'offset' shift on top, so the tolerance
    is float32's."""
    spec = OP.spec((3, 8200), "float32")
    config = next(c for c in SPLIT.space(spec) if c["BLOCK_N"] == block_n)
    x, weight, bias = OP.make_inputs(spec, seed=block_n, distribution="offset", device=device)
    cols = torch.arange(8200, device=device)
    x = x + torch.where(cols < 8200 // 3, 3.0, -2.0)
    stats = [torch.full(t.shape, math.nan, dtype=t.torch_dtype, device=device) for t in stats_output_specs(spec)]
    build_with_stats("split_row", spec, config)((x, weight, bias), stats)
    y = run_and_check(spec, config, (x, weight, bias), f"split_row {config} steps")
    assert torch.equal(stats[0], y)
    xd = x.double()
    torch.testing.assert_close(stats[2].double(), torch.rsqrt(xd.var(-1, unbiased=False) + 1e-5), rtol=2e-6, atol=0)


def test_runs_are_bitwise_reproducible(device: str) -> None:
    """The same inputs give the same bits, run after run (differently poisoned outputs): the
    chunks' statistics are merged in one fixed order, with no atomics."""
    spec = OP.spec((3, 8200), "float32")
    config = next(c for c in SPLIT.space(spec) if c["BLOCK_N"] == 1024)  # 9 chunks a row
    inputs = OP.make_inputs(spec, seed=5, device=device)
    runs = []
    for poison in (math.nan, 0.0, -1.0):
        outs = [torch.full(t.shape, poison, dtype=t.torch_dtype, device=device) for t in stats_output_specs(spec)]
        build_with_stats("split_row", spec, config)(inputs, outs)
        runs.append(outs)
    for later in runs[1:]:
        assert all(torch.equal(a, b) for a, b in zip(runs[0], later, strict=True))


def test_large_means_do_not_cost_float32_accuracy(device: str) -> None:
    """'offset' rows (|mean| 100..400, std 1): the shift (the mean of the row's first elements) and the
    centred chunk statistics
    keep the error at float32 rounding of the output, as the other variants' (test_layernorm_kernels.py)."""
    spec = OP.spec((3, 4099), "float32", affine="none")
    for seed in range(2):
        inputs = OP.make_inputs(spec, seed=seed, distribution="offset", device=device)
        out = run_and_check(spec, widest(spec), inputs, "split_row offset")
        (ref64,) = OP.reference_fp64(spec, inputs)
        assert error_stats(out, ref64).rel_l2 < 1e-6, error_stats(out, ref64)


def test_an_outlier_first_element_costs_no_accuracy(device: str) -> None:
    """Rows whose first element is a spike: every chunk shifts by the mean of the row's first
    elements (the same value in each program of a row), not by the spike itself."""
    spec = OP.spec((2, 4099), "float32", affine="none")
    for seed, spike in ((0, 3e4), (1, -2e4)):
        (x,) = OP.make_inputs(spec, seed=seed, device=device)
        x[:, 0] = spike
        run_and_check(spec, widest(spec), (x,), f"split_row spike {spike}")


def test_split_row_at_unaligned_addresses(device: str) -> None:
    """x 2 bytes past an aligned address, the output 6 bytes past it (views at a storage offset,
    as slices of bigger buffers are): each row's head, body and tail then start elsewhere, and the
    pieces must still cover each row exactly once, writing nothing before or after the output."""
    spec = OP.spec((3, 4097), "bfloat16")
    config = widest(spec)
    x, weight, bias = OP.make_inputs(spec, seed=7, device=device)
    moved = torch.empty(x.numel() + 1, dtype=x.dtype, device=device)[1:].view(x.shape).copy_(x)
    buffer = torch.full((3 + x.numel() + GUARD,), math.nan, dtype=x.dtype, device=device)
    out = buffer[3 : 3 + x.numel()].view(x.shape)
    SPLIT.build(spec, config)((moved, weight, bias), (out,))
    assert bool(torch.isnan(buffer[:3]).all()), "split_row wrote before its output"
    assert_guarded_outputs(OP, spec, (x, weight, bias), (out,), (buffer[3 + x.numel() :],), ("y",), "unaligned")
    aligned = run_and_check(spec, config, (x, weight, bias), "aligned")
    assert torch.equal(out, aligned)  # the same values, wherever the rows start


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the stress data holds inf: inf - inf is NaN
def test_split_row_passes_the_harness_in_float16(device: str) -> None:
    """The real validation (every distribution on the target, the tails, canaries, torch-op
    watch, differently poisoned outputs), at the widest chunks; float32 with a weight and a bias
    is test_rowwise_families.py's harness case."""
    spec = OP.spec((3, 4100), "float16", affine="weight")
    runs = validate(OP, spec, SPLIT.build, widest(spec), device, lambda: None)
    assert runs in validation_runs(OP, spec), runs


def test_the_space() -> None:
    """Rows of more than 8 KB (the skeleton's rule, so that the recorded spaces of narrower rows
    stand), cut in two to 1024 chunks; chunks no wider than LayerNorm's register share allows."""
    assert len(SPLIT.space(OP.spec((8, 4096), "bfloat16"))) == 0  # 8192 bytes: not split
    assert len(SPLIT.space(OP.spec((8, 2048), "float32"))) == 0
    assert len(SPLIT.space(OP.spec((8, 4097), "bfloat16"))) > 0
    assert len(SPLIT.space(OP.spec((8, 2049), "float32"))) > 0
    for width in (4099, 65536, 100_000):
        spec = OP.spec((8, width), "float16")
        space = SPLIT.space(spec)
        assert all(space.violations(c) == [] for c in space)
        assert all(2 <= math.ceil(width / c["BLOCK_N"]) <= skeleton.MAX_SPLITS for c in space)
        assert all(skeleton.LAYERNORM_WARPS.fit(c["BLOCK_N"], c["num_warps"]) for c in space)
        assert set(space.configs()[0]) == {"BLOCK_N", "num_warps"}  # no loop: no num_stages
    assert min(c["BLOCK_N"] for c in SPLIT.space(OP.spec((1, 100_000), "float16"))) == 128  # 782 chunks
    with pytest.raises(ValueError, match="not in the space"):
        SPLIT.build(OP.spec((1, 4099), "float32"), Config({"BLOCK_N": 8192, "num_warps": 4}))


# ---- the real compiler ---------------------------------------------------------------------------
# As real_compiler.py's main (which builds without statistics), also for build_with_stats: every
# launch recorded, then lowered to Triton IR by the real front end, in a child process without the
# interpreter (real_compiler_run.lowered_kernels).


def split_row_launches() -> list[LaunchCase]:
    """Every affine form, with and without the statistics, each dtype, the narrowest chunks and
    the widest (ALIGN 4 and 8): two launches each, the chunks' statistics and the apply."""
    cases = []
    for i, (affine, stats, pick) in enumerate(product(AFFINE, (False, True), (0, -1))):
        spec = OP.spec((3, 4099), DTYPES[i % 3], affine=affine)
        config = SPLIT.space(spec).configs()[pick]
        build = partial(build_with_stats, "split_row", spec, config) if stats else partial(SPLIT.build, spec, config)
        specs = stats_output_specs(spec) if stats else OP.output_specs(spec)
        outputs = tuple(torch.empty(o.shape, dtype=o.torch_dtype) for o in specs)
        cases.append(LaunchCase(f"{spec.describe()} stats={stats} {config}", layernorm, build,
                                OP.make_inputs(spec, seed=0, device="cpu"), outputs, launches=2))  # fmt: skip
    return cases


@pytest.mark.parametrize("floats", ["fp32", "fp64"])
def test_both_kernels_lower_under_the_real_triton_compiler(floats: str) -> None:
    """split_row_launches, eps typed as Triton types it (fp32) and as Inductor does (fp64),
    float32 math either way."""
    lowered = lowered_kernels("test_layernorm_split_row:split_row_launches", floats)
    assert lowered == ["_layernorm_split_apply_kernel", "_layernorm_split_stats_kernel"]

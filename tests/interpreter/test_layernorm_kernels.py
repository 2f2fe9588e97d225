"""LayerNorm: specs, inputs, the references, the spaces, and what is peculiar to its kernels
(accuracy on rows of large means, the row statistics of a training forward, aligned_row's).

What the row-wise families share (every variant's config classes on every affine form against
the float64 reference, the harness, multi_row, welford and persistent schedules, eps, launchers
that take views only) is tested once for all of them in test_rowwise_families.py. Every kernel
here writes into a NaN-filled output followed by a NaN guard, and is compared with the float64
reference under the tolerance the harness applies (``check_close``: a few times PyTorch's own
error in the same dtype).
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from kernelsmith.evaluate.errors import check_close, error_stats
from kernelsmith.ops import UnsupportedWorkload
from kernelsmith.ops._base import tail_rows
from kernelsmith.ops.layernorm import AFFINE, AFFINE_PARAMS, OP, build_with_stats, stats_output_specs
from kernelsmith.space import Config, next_power_of_two
from kernelsmith.spec import OpSpec
from kernelsmith.testing.kernels import covering_configs

# The four schedules; aligned_row (the realigned rows) has its own cases at the end, split_row (rows
# of more than 8 KB cut across programs) its own file, test_layernorm_split_row.py.
VARIANTS = [v.name for v in OP.variants if v.name not in ("aligned_row", "split_row")]
DTYPES = ("float16", "bfloat16", "float32")
GUARD = 64  # NaN elements after the output: a kernel writing past its end overwrites them


def run_launcher(
    variant: str, spec: OpSpec, config: Config, inputs: tuple[torch.Tensor, ...]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Launch into a NaN-filled output followed by a NaN guard; return (output, guard)."""
    x = inputs[0]
    clones = [t.clone() for t in inputs]
    buffer = torch.full((x.numel() + GUARD,), math.nan, dtype=x.dtype, device=x.device)
    out = buffer[: x.numel()].view(x.shape)
    OP.variant(variant).build(spec, config)(inputs, (out,))
    assert all(torch.equal(t, c) for t, c in zip(inputs, clones, strict=True)), f"{variant} modified its inputs"
    return out, buffer[x.numel() :]


def assert_correct(
    spec: OpSpec, inputs: tuple[torch.Tensor, ...], out: torch.Tensor, guard: torch.Tensor, what: str
) -> None:
    assert bool(torch.isfinite(out).all()), f"{what}: some output elements were never written"
    assert bool(torch.isnan(guard).all()), f"{what}: the kernel wrote past the end of its output"
    (ref64,) = OP.reference_fp64(spec, inputs)
    (lowp,) = OP.reference(spec, inputs)
    problem = check_close(out, ref64, lowp, OP.tolerance)
    assert problem is None, f"{what}: {problem}"


# ---- the kernels --------------------------------------------------------------------------------


@pytest.mark.parametrize("variant", VARIANTS)
def test_large_means_do_not_cost_float32_accuracy(variant: str, device: str) -> None:
    """On 'offset' rows (|mean| 100..400, std 1) the kernels' float32 error stays at float32
    rounding of the output (~1e-7), far below the ~1e-5 that an unshifted mean's own rounding
    error costs (and that made single-row validation flaky against PyTorch's luckier roundings)."""
    spec = OP.spec((3, 341), "float32", affine="none")
    for seed in range(2):
        inputs = OP.make_inputs(spec, seed=seed, distribution="offset", device=device)
        out, guard = run_launcher(variant, spec, OP.variant(variant).space(spec).configs()[0], inputs)
        assert_correct(spec, inputs, out, guard, variant)
        (ref64,) = OP.reference_fp64(spec, inputs)
        assert error_stats(out, ref64).rel_l2 < 1e-6, (variant, error_stats(out, ref64))


@pytest.mark.parametrize("variant", [*VARIANTS, "aligned_row"])
@pytest.mark.parametrize("spike", [3e4, -2e4])
def test_an_outlier_first_element_costs_no_accuracy(variant: str, spike: float, device: str) -> None:
    """Rows of unit spread whose first element is a spike (what the harness's 'spikes' stress
    data does to one row in sixty-odd): the shift is the mean of the first elements, which the
    spike moves by a 64th of itself. Shifting by the first element itself put every other element
    near -spike, whose rounding errors (an ulp of 1e4 each) failed the tolerance here."""
    spec = OP.spec((3, 1000), "float32", affine="none")
    for seed in range(3):
        (x,) = OP.make_inputs(spec, seed=seed, device=device)
        x[:, 0] = spike
        out, guard = run_launcher(variant, spec, OP.variant(variant).space(spec).configs()[0], (x,))
        assert_correct(spec, (x,), out, guard, f"{variant} seed {seed}")


@pytest.mark.parametrize("variant", VARIANTS)
def test_stats_launchers_save_mean_and_rstd(variant: str, device: str) -> None:
    """build_with_stats (for a future backward) writes the same y plus each row's statistics."""
    spec = OP.spec((2, 3, 100), "bfloat16")
    inputs = OP.make_inputs(spec, seed=4, distribution="offset", device=device)
    config = covering_configs(OP.variant(variant).space(spec))[-1]
    y_spec, mean_spec, rstd_spec = stats_output_specs(spec)
    assert mean_spec.shape == rstd_spec.shape == (2, 3) and mean_spec.dtype == "float32"
    outs = [torch.full(t.shape, math.nan, dtype=t.torch_dtype, device=device) for t in (y_spec, mean_spec, rstd_spec)]
    build_with_stats(variant, spec, config)(inputs, outs)
    y, mean, rstd = outs
    plain, _ = run_launcher(variant, spec, config, inputs)
    assert torch.equal(y, plain)
    xd = inputs[0].double()
    assert torch.allclose(mean.double(), xd.mean(-1), rtol=1e-6, atol=0)
    assert torch.allclose(rstd.double(), torch.rsqrt(xd.var(-1, unbiased=False) + 1e-5), rtol=1e-5, atol=0)
    with pytest.raises(KeyError):
        build_with_stats("naive", spec, config)


# ---- the tolerance and the distributions discriminate -------------------------------------------


def test_the_tolerance_catches_a_misplaced_weight_bias_or_eps(device: str) -> None:
    spec = OP.spec((6, 32), "float16")
    x, w, b = OP.make_inputs(spec, seed=1, device=device)
    (ref64,) = OP.reference_fp64(spec, (x, w, b))
    (lowp,) = OP.reference(spec, (x, w, b))
    xf = x.float()
    xhat = (xf - xf.mean(-1, keepdim=True)) * torch.rsqrt(xf.var(-1, unbiased=False, keepdim=True) + 1e-5)
    assert check_close((xhat * w.float() + b.float()).to(x.dtype), ref64, lowp, OP.tolerance) is None
    wrong = {
        "no bias": xhat * w.float(),
        "no weight": xhat + b.float(),
        "rolled weight": xhat * w.float().roll(1) + b.float(),
        "unbiased variance": (xf - xf.mean(-1, keepdim=True))
        * torch.rsqrt(xf.var(-1, unbiased=True, keepdim=True) + 1e-5)
        * w.float()
        + b.float(),
    }
    for name, y in wrong.items():
        assert check_close(y.to(x.dtype), ref64, lowp, OP.tolerance) is not None, name

    small = OP.spec((6, 32), "float32", affine="none")
    (xs,) = OP.make_inputs(small, seed=1, distribution="small", device=device)
    (ref64,) = OP.reference_fp64(small, (xs,))
    (lowp,) = OP.reference(small, (xs,))
    centred = xs - xs.mean(-1, keepdim=True)
    eps_outside = centred / (centred.pow(2).mean(-1, keepdim=True).sqrt() + 1e-5)
    assert check_close(eps_outside, ref64, lowp, OP.tolerance) is not None


@pytest.mark.parametrize(("dtype", "width"), [("float32", 64), ("float32", 1000), ("float16", 1000)])
def test_offset_rows_defeat_the_naive_variance(dtype: str, width: int, device: str) -> None:
    """E[x^2] - E[x]^2 (in float32) cancels catastrophically on 'offset' rows and fails the
    tolerance; the same formula passes on centred rows, and the kernels pass on both."""
    spec = OP.spec((8, width), dtype)
    for distribution, naive_fails in (("offset", True), ("normal", False)):
        x, w, b = OP.make_inputs(spec, seed=0, distribution=distribution, device=device)
        (ref64,) = OP.reference_fp64(spec, (x, w, b))
        (lowp,) = OP.reference(spec, (x, w, b))
        xf = x.float()
        mean = xf.mean(-1, keepdim=True)
        var = (xf * xf).mean(-1, keepdim=True) - mean * mean
        naive = ((xf - mean) * torch.rsqrt(var.clamp_min(0) + 1e-5) * w.float() + b.float()).to(x.dtype)
        assert (check_close(naive, ref64, lowp, OP.tolerance) is not None) == naive_fails, distribution


# ---- the references -----------------------------------------------------------------------------


@pytest.mark.parametrize("affine", AFFINE)
def test_references(affine: str, device: str) -> None:
    spec = OP.spec((2, 3, 64), "float16", eps=1e-5, affine=affine)
    inputs = OP.make_inputs(spec, seed=2, device=device)
    weight = inputs[1] if len(inputs) > 1 else None
    bias = inputs[2] if len(inputs) > 2 else None
    (y,) = OP.reference(spec, inputs)
    assert y.dtype == torch.float16 and y.shape == (2, 3, 64)
    assert torch.equal(y, F.layer_norm(inputs[0], (64,), weight, bias, 1e-5))

    (y64,) = OP.reference_fp64(spec, inputs)
    assert y64.dtype == torch.float64 and y64.shape == (2, 3, 64)
    assert torch.allclose(
        y64,
        F.layer_norm(inputs[0].double(), (64,), *(t.double() if t is not None else None for t in (weight, bias)), 1e-5),
        rtol=1e-12,
        atol=1e-12,
    )
    assert (y.double() - y64).abs().max() < 0.02
    if affine == "none":  # each row normalised: mean 0, variance var / (var + eps), about 1
        assert torch.allclose(y64.mean(-1), torch.zeros(2, 3, dtype=torch.float64), atol=1e-12)
        assert torch.allclose(y64.var(-1, unbiased=False), torch.ones(2, 3, dtype=torch.float64), atol=1e-4)


# ---- specs --------------------------------------------------------------------------------------


def test_spec_from_command_line_shape() -> None:
    spec = OP.spec((8192, 4096), "bf16")
    assert spec.op == "layernorm"
    x, w, b = spec.inputs
    assert x.shape == (8192, 4096) and w.shape == b.shape == (4096,)
    assert x.dtype == w.dtype == b.dtype == "bfloat16"
    assert spec.const("eps") == 1e-5 and spec.const("affine") == "weight_bias"
    assert [t.shape for t in OP.spec((2, 3, 64), "fp32", affine="weight").inputs] == [(2, 3, 64), (64,)]
    assert [t.shape for t in OP.spec((64,), "fp16", affine="none").inputs] == [(64,)]
    assert "8192x4096" in OP.shape_help


def test_spec_for_matches_spec_and_hashes() -> None:
    x = torch.zeros(16, 128, dtype=torch.bfloat16)
    w = torch.ones(128, dtype=torch.bfloat16)
    b = torch.zeros(128, dtype=torch.bfloat16)
    hashes = set()
    for affine, tensors in (("weight_bias", (w, b)), ("weight", (w,)), ("none", ())):
        from_cli = OP.spec((16, 128), "bfloat16", affine=affine)
        forms = [
            OP.spec_for(x, *tensors),
            OP.spec_for(x, *tensors, affine=affine, eps=1e-5),
            OP.spec_for(x, **dict(zip(("weight", "bias"), tensors, strict=False))),
            OP.spec_for(x, *tensors, *(None,) * (2 - len(tensors))),
        ]
        assert all(f == from_cli and f.workload_hash == from_cli.workload_hash for f in forms), affine
        assert OpSpec.from_dict(from_cli.to_dict()).workload_hash == from_cli.workload_hash
        hashes.add(from_cli.workload_hash)
    assert OP.spec_for(x, w, bias=b) == OP.spec((16, 128), "bfloat16")
    others = {
        OP.spec((16, 128), "bfloat16", eps=1e-6).workload_hash,
        OP.spec((16, 128), "float16").workload_hash,
        OP.spec((16, 256), "bfloat16").workload_hash,
        OP.spec((2, 8, 128), "bfloat16").workload_hash,
    }
    assert len(hashes) == 3 and not hashes & others and len(others) == 4


@pytest.mark.parametrize(
    ("make", "kwargs"),
    [
        pytest.param(lambda: (torch.zeros(4, 8), None, torch.zeros(8)), {}, id="bias-without-weight"),
        pytest.param(lambda: (torch.zeros(4, 8),), {"bias": torch.zeros(8)}, id="bias-kw-without-weight"),
        pytest.param(lambda: (torch.zeros(4, 8), torch.zeros(4)), {}, id="weight-size"),
        pytest.param(lambda: (torch.zeros(4, 8), torch.zeros(8), torch.zeros(1, 8)), {}, id="bias-rank"),
        pytest.param(lambda: (torch.zeros(()), torch.zeros(1)), {}, id="scalar-x"),
        pytest.param(lambda: (torch.zeros(0, 8),), {}, id="empty"),
        pytest.param(lambda: (torch.zeros(4, 8), torch.zeros(8, dtype=torch.float16)), {}, id="dtypes"),
        pytest.param(lambda: (torch.zeros(4, 8, dtype=torch.float64),), {}, id="float64"),
        pytest.param(lambda: (torch.zeros(4, 8, dtype=torch.int32),), {}, id="int32"),
        pytest.param(lambda: (torch.zeros(8, 4).t(),), {}, id="transposed"),
        pytest.param(lambda: (torch.zeros(4, 16)[:, ::2],), {}, id="strided"),
        pytest.param(lambda: (torch.zeros(4, 8), torch.zeros(16)[::2]), {}, id="strided-weight"),
        pytest.param(lambda: (torch.zeros(4, 8), torch.zeros(8), torch.zeros(8), torch.zeros(8)), {}, id="four"),
        pytest.param(lambda: (torch.zeros(4, 8), torch.zeros(8)), {"weight": torch.zeros(8)}, id="weight-twice"),
        pytest.param(lambda: (torch.zeros(4, 8), torch.zeros(8)), {"affine": "none"}, id="affine-mismatch"),
        pytest.param(lambda: (torch.zeros(4, 8),), {"affine": "bias"}, id="affine-unknown"),
        pytest.param(lambda: (torch.zeros(4, 8),), {"dim": -1}, id="unknown-constant"),
        pytest.param(lambda: (torch.zeros(4, 8),), {"eps": -1.0}, id="negative-eps"),
        pytest.param(lambda: (torch.zeros(4, 8),), {"eps": math.nan}, id="nan-eps"),
    ],
)
def test_spec_for_rejects_what_the_kernels_cannot_do(make, kwargs) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(UnsupportedWorkload):
        OP.spec_for(*make(), **kwargs)


def test_bad_specs_are_rejected() -> None:
    for eps in (-1.0, math.inf, math.nan):
        with pytest.raises(UnsupportedWorkload):
            OP.spec((4, 8), "fp32", eps=eps)
    for bad in ({"affine": "bias"}, {"affine": None}, {"dim": 0}):
        with pytest.raises(UnsupportedWorkload):
            OP.spec((4, 8), "fp32", **bad)
    with pytest.raises(UnsupportedWorkload):
        OP.spec((4, 8), "fp64")
    with pytest.raises(UnsupportedWorkload):
        OP.spec((4, 0), "fp32")
    with pytest.raises(ValueError):
        OP.spec((4, 8), "int3")


def test_output_specs_bytes_and_flops() -> None:
    spec = OP.spec((8192, 4096), "bfloat16")
    (out,) = OP.output_specs(spec)
    assert out.shape == (8192, 4096) and out.dtype == "bfloat16"
    # x read, weight and bias read, y written
    assert OP.bytes_moved(spec) == 8192 * 4096 * 2 * 2 + 2 * 4096 * 2
    assert OP.bytes_moved(OP.spec((2, 3, 10), "float32", affine="weight")) == (60 + 10 + 60) * 4
    assert OP.bytes_moved(OP.spec((2, 3, 10), "float16", affine="none")) == (60 + 60) * 2
    assert OP.flops(spec) == 7 * 8192 * 4096
    assert OP.flops(OP.spec((8, 10), "float32", affine="none")) == 5 * 80


def test_bucket_and_validation_specs_keep_the_parameters() -> None:
    spec = OP.spec((4, 25, 3000), "float16", affine="weight")
    bucket = OP.bucket(spec)
    assert bucket.inputs[0].shape == (128, 3000) and bucket.inputs[1:] == spec.inputs[1:]
    assert bucket.constants == spec.constants
    tails = OP.validation_specs(spec)
    assert [t.inputs[0].shape[0] for t in tails[1:]] == tail_rows(100, OP.row_block)
    for variant in OP.variants:
        configs = variant.space(spec).configs()
        for tail in tails[1:]:
            assert tail.inputs[1:] == spec.inputs[1:] and tail.constants == spec.constants
            assert variant.space(tail).configs() == configs


# ---- inputs -------------------------------------------------------------------------------------


@pytest.mark.parametrize("affine", AFFINE)
def test_make_inputs_is_deterministic_by_seed(affine: str, device: str) -> None:
    spec = OP.spec((2, 5, 48), "bfloat16", affine=affine)
    for distribution in OP.distributions:
        a = OP.make_inputs(spec, seed=11, distribution=distribution, device=device)
        b = OP.make_inputs(spec, seed=11, distribution=distribution, device=device)
        c = OP.make_inputs(spec, seed=12, distribution=distribution, device=device)
        assert len(a) == len(spec.inputs)
        assert all(torch.equal(p, q) for p, q in zip(a, b, strict=True))
        assert all(not torch.equal(p, q) for p, q in zip(a, c, strict=True))
        for t, t_spec in zip(a, spec.inputs, strict=True):
            assert t.shape == t_spec.shape and t.dtype == torch.bfloat16 and t.is_contiguous()
            assert t.device.type == torch.device(device).type


def test_distributions_differ_as_described(device: str) -> None:
    spec = OP.spec((64, 512), "float16")
    xs = {d: OP.make_inputs(spec, seed=0, distribution=d, device=device)[0].float() for d in OP.distributions}
    for d1 in OP.distributions:
        assert bool(torch.isfinite(xs[d1]).all()), d1
        for d2 in OP.distributions:
            if d1 < d2:
                assert not torch.equal(xs[d1], xs[d2]), (d1, d2)
    assert 0.9 < float(xs["normal"].std()) < 1.1
    assert float(xs["uniform"].abs().max()) <= 1.0 and 0.5 < float(xs["uniform"].std()) < 0.65
    assert 0.9e-3 < float(xs["small"].std()) < 1.1e-3
    # offset: every row's mean is 100 to 400 in magnitude, both signs occur, the spread is ~1
    means = xs["offset"].mean(-1)
    assert bool(((means.abs() > 99) & (means.abs() < 401)).all())
    assert bool((means > 0).any()) and bool((means < 0).any())
    assert 0.9 < float(xs["offset"].std(-1).mean()) < 1.1
    inputs = OP.make_inputs(spec, seed=0, distribution="offset", device=device)
    assert bool(torch.isfinite(OP.reference(spec, inputs)[0]).all())


def test_parameters_are_drawn_around_one_and_zero(device: str) -> None:
    spec = OP.spec((2, 8192), "float32")
    _, w, b = OP.make_inputs(spec, seed=4, device=device)
    assert abs(float(w.mean()) - 1) < 0.05 and abs(float(w.std()) - 0.5) < 0.05
    assert abs(float(b.mean())) < 0.05 and abs(float(b.std()) - 0.5) < 0.05


def test_unknown_distribution_is_rejected(device: str) -> None:
    with pytest.raises(ValueError, match="distribution"):
        OP.make_inputs(OP.spec((2, 8), "float32"), seed=0, distribution="cauchy", device=device)


# ---- spaces -------------------------------------------------------------------------------------


@pytest.mark.parametrize("width", [1, 2, 3, 17, 64, 341, 1000, 4096, 8192, 16384, 16385, 65536])
def test_spaces_are_non_empty_and_valid(width: int) -> None:
    for affine in AFFINE:
        spec = OP.spec((8, width), "bfloat16", affine=affine)
        for variant in OP.variants:
            space = variant.space(spec)
            # At most 16 values a thread at 32 warps: 16384 a program. persistent holds the
            # weight and bias next to the row, at about half a register an element.
            block_n = next_power_of_two(width)
            expected_empty = {
                "two_pass": block_n > 16384,
                "welford": False,
                "multi_row": block_n > 8192,
                "persistent": block_n + block_n * AFFINE_PARAMS[affine] // 2 > 16384,
                "aligned_row": block_n > 16384 or width % 16 == 0,  # rows Triton proves aligned
                "split_row": width * 2 <= 8192,  # rows of 8 KB or less are not split
            }[variant.name]
            assert (len(space) == 0) == expected_empty, (variant.name, width, affine)
            for config in space:
                assert space.violations(config) == []
                # num_stages only where the kernel has a loop to pipeline
                assert ("num_stages" in config) == (variant.name in ("welford", "persistent"))


@pytest.mark.parametrize("shape", [(8192, 4096), (4096, 8192), (32768, 1024)])
def test_space_sizes_are_modest(shape: tuple[int, int]) -> None:
    for dtype in DTYPES:
        for affine in AFFINE:
            spec = OP.spec(shape, dtype, affine=affine)
            sizes = {v.name: len(v.space(spec)) for v in OP.variants}
            assert sizes.pop("aligned_row") == 0  # Triton proves these rows aligned: two_pass is the same kernel
            row_bytes = shape[1] * spec.inputs[0].torch_dtype.itemsize
            assert (sizes.pop("split_row") == 0) == (row_bytes <= 8192)  # only rows of more than 8 KB are split
            assert all(size > 0 for size in sizes.values()), sizes
            assert 100 <= sum(sizes.values()) <= 250, (shape, dtype, affine, sizes)
    assert len({v.source_hash for v in OP.variants}) == len(OP.variants)


def test_block_limits() -> None:
    welford = OP.variant("welford")
    # welford blocks are narrower than the padded row, except the smallest one for narrow rows
    assert {c["BLOCK_N"] for c in welford.space(OP.spec((2, 4096), "fp16"))} == {64, 128, 256, 512, 1024, 2048}
    assert {c["BLOCK_N"] for c in welford.space(OP.spec((2, 40), "fp16"))} == {64}
    assert max(c["BLOCK_N"] for c in welford.space(OP.spec((2, 100_000), "fp16"))) == 8192
    # the register share of a thread shrinks with the warp count: 64 values up to 8 warps, 16 at 32
    two_pass = {c["num_warps"] for c in OP.variant("two_pass").space(OP.spec((2, 16384), "fp16"))}
    assert two_pass == {8, 16, 32}
    # multi_row never holds more than 16384 elements in one block
    assert {c["ROWS"] for c in OP.variant("multi_row").space(OP.spec((2, 4096), "fp16"))} == {2, 4}
    # persistent keeps the weight and bias in registers too: fewer warps fit without them
    with_params = OP.variant("persistent").space(OP.spec((2, 8192), "fp16"))
    without = OP.variant("persistent").space(OP.spec((2, 8192), "fp16", affine="none"))
    assert min(c["num_warps"] for c in with_params) > min(c["num_warps"] for c in without)


# ---- realigned rows (aligned_row) -----------------------------------------------------------------
# At unaligned addresses and through the harness: test_rowwise_families.py.

# (rows, width, dtype, affine): widths 1, 7, 33, 1000 and 4097 (none a multiple of 16), 1 and 3
# rows, every dtype (ALIGN = 4 and 8), every affine form.
REALIGNED_CASES = ((1, 1, "float32", "weight_bias"), (3, 7, "bfloat16", "none"), (3, 33, "float16", "weight"),
                   (3, 1000, "bfloat16", "weight_bias"), (1, 4097, "float32", "weight_bias"))


def test_aligned_row_matches_the_reference_and_two_pass_statistics(device: str) -> None:
    for i, (rows, width, dtype, affine) in enumerate(REALIGNED_CASES):
        spec = OP.spec((rows, width), dtype, affine=affine)
        config = OP.variant("aligned_row").space(spec).configs()[0]
        distribution = OP.distributions[i % len(OP.distributions)]
        inputs = OP.make_inputs(spec, seed=i, distribution=distribution, device=device)
        out, guard = run_launcher("aligned_row", spec, config, inputs)
        assert_correct(spec, inputs, out, guard, f"aligned_row {config} {spec.describe()} {distribution}")
        # With statistics (a training forward): y and the row statistics of two_pass, whose math it is.
        stats = [torch.full(t.shape, math.nan, dtype=t.torch_dtype, device=device) for t in stats_output_specs(spec)]
        build_with_stats("aligned_row", spec, config)(inputs, stats)
        two_pass = [torch.full_like(t, math.nan) for t in stats]
        build_with_stats("two_pass", spec, OP.variant("two_pass").space(spec).configs()[0])(inputs, two_pass)
        assert torch.equal(stats[0], out)
        for mine, theirs in zip(stats[1:], two_pass[1:], strict=True):
            torch.testing.assert_close(mine, theirs, rtol=1e-6, atol=1e-6)



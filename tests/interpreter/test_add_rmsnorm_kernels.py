"""Residual add + RMSNorm: specs, inputs, the references, the spaces, Gemma's weight offset, and
what is peculiar to its kernels (y normalises the rounded h, the hand rounding to bfloat16, the
harness telling y and h apart).

What the row-wise families share (every variant's config classes against the float64 reference,
with h bitwise PyTorch's rounded sum; the realigned variants; the harness; multi_row, looped and
persistent schedules; eps) is tested once for all of them in test_rowwise_families.py. Both
outputs (y, then h) are pre-filled with NaN, followed by NaN guards, and compared with the float64
reference by the harness's own test.
"""

from __future__ import annotations

import math

import pytest
import torch
import triton
import triton.language as tl

from kernelsmith.evaluate.errors import check_close
from kernelsmith.evaluate.validate import Rejected, validate
from kernelsmith.ops import UnsupportedWorkload
from kernelsmith.ops._base import tail_rows
from kernelsmith.ops.add_rmsnorm import OP, AddRMSNorm, _to_storage
from kernelsmith.space import Config
from kernelsmith.spec import OpSpec
from kernelsmith.testing.kernels import assert_guarded_outputs
from kernelsmith.testing.validation_runs import validation_runs

# The four schedules; the realigned variants (aligned_row, split_row) have their own cases.
REALIGNED = ("aligned_row", "split_row")
VARIANTS = [v.name for v in OP.variants if v.name not in REALIGNED]
GUARD = 64  # NaN elements after each output: a kernel writing past its end overwrites them


def run_launcher(variant: str, spec: OpSpec, config: Config, inputs: tuple[torch.Tensor, ...]
                 ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Launch into NaN-filled outputs (y, h), each followed by a NaN guard; check the inputs are
    untouched; return (outputs, guards)."""
    before = [t.clone() for t in inputs]
    x = inputs[0]
    buffers = [torch.full((x.numel() + GUARD,), math.nan, dtype=x.dtype, device=x.device) for _ in range(2)]
    outputs = [b[: x.numel()].view(x.shape) for b in buffers]
    OP.variant(variant).build(spec, config)(inputs, outputs)
    assert all(torch.equal(a, b) for a, b in zip(inputs, before, strict=True)), f"{variant} modified an input"
    return outputs, [b[x.numel():] for b in buffers]


def assert_correct(spec: OpSpec, inputs: tuple[torch.Tensor, ...], outputs: list[torch.Tensor],
                   guards: list[torch.Tensor], what: str) -> None:
    assert_guarded_outputs(OP, spec, inputs, outputs, guards, "yh", what)
    # h is the correctly rounded sum, bit for bit what PyTorch stores (every dtype, every kernel).
    h_pytorch = OP.reference(spec, inputs)[1]
    assert torch.equal(outputs[1], h_pytorch), f"{what}: h is not residual + x rounded to nearest-even"


# ---- the kernels ----------------------------------------------------------------------------


@pytest.mark.parametrize("variant", VARIANTS)
def test_y_is_the_norm_of_the_rounded_h(variant: str, device: str) -> None:
    """y is computed from the bfloat16-rounded h the kernel stores, not from the float32 sum.

    Both candidates are emulated in float32 with one final rounding (as the kernels do); they
    differ on a good fraction of the elements, and the kernel matches the rounded-h one (up to
    rare last-bit flips from a different summation order).
    """
    spec = OP.spec((16, 256), "bfloat16")
    x, r, w = inputs = OP.make_inputs(spec, seed=21, device=device)
    config = OP.variant(variant).space(spec).configs()[0]
    (y, _), _ = run_launcher(variant, spec, config, inputs)

    def emulate(hf: torch.Tensor) -> torch.Tensor:
        rstd = torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + spec.const("eps"))
        return (hf * rstd * w.float()).to(torch.bfloat16)

    from_rounded = emulate((r + x).float())
    from_unrounded = emulate(x.float() + r.float())
    differ = float((from_rounded != from_unrounded).float().mean())
    assert differ > 0.05, "the inputs do not tell the two apart"
    matches_rounded = float((y == from_rounded).float().mean())
    matches_unrounded = float((y == from_unrounded).float().mean())
    assert matches_rounded > 0.995, matches_rounded
    assert matches_unrounded < matches_rounded - differ / 2


@triton.jit
def _to_storage_kernel(v_ptr, out_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, _to_storage(tl.load(v_ptr + offs), out_ptr))


def test_the_hand_rounding_to_bfloat16_keeps_every_nan(device: str) -> None:
    """An NVIDIA GPU's arithmetic NaN (0x7FFFFFFF: NaN + x, Inf - Inf, Inf * 0) once rounded to
    -0.0, so rows holding a NaN or an Inf came out finite on the GPU (the stress data's nonfinite
    rows); the interpreter's own NaNs never showed it. Every NaN pattern stays NaN; infinities and
    finite values round to nearest-even as before."""
    patterns = [0x7FFFFFFF, 0xFFFFFFFF, 0x7FC00000, 0xFFC00000, 0x7F800001, 0x7FBFFFFF,  # NaNs
                0x7F800000, 0xFF800000, 0x3F808000, 0x3F818000, 0x3F80C000, 0x00000000,
                0x7F7FFFFF, 0x80000001, 0x3F800000, 0x40490FDB]  # +-Inf, ties, overflow, ...
    bits = torch.tensor([p - (1 << 32) if p >= 1 << 31 else p for p in patterns], dtype=torch.int32)
    values = bits.view(torch.float32).to(device)
    out = torch.empty(len(patterns), dtype=torch.bfloat16, device=device)
    _to_storage_kernel[(1,)](values, out, BLOCK=len(patterns))
    nan = values.isnan()
    assert bool(out[nan].isnan().all()), out
    assert torch.equal(out[~nan], values[~nan].to(torch.bfloat16)), out  # PyTorch rounds to nearest-even


# ---- the harness ----------------------------------------------------------------------------


def test_the_harness_rejects_swapped_or_wrong_outputs(device: str) -> None:
    spec = OP.spec((9, 200), "float16")
    whole_row = OP.variant("whole_row")
    config = whole_row.space(spec).configs()[0]

    def swapped(s: OpSpec, c: Config):  # type: ignore[no-untyped-def]
        launch = whole_row.build(s, c)
        return lambda inputs, outputs: launch(inputs, (outputs[1], outputs[0]))

    def wrong_h(s: OpSpec, c: Config):  # type: ignore[no-untyped-def]
        launch = whole_row.build(s, c)

        def run(inputs, outputs):  # type: ignore[no-untyped-def]
            launch(inputs, outputs)  # right y and h, then h overwritten with x + x
            x, _, w = inputs
            launch((x, x, w), (torch.empty_like(x), outputs[1]))

        return run

    with pytest.raises(Rejected, match="output 0 wrong"):
        validate(OP, spec, swapped, config, device, lambda: None)
    with pytest.raises(Rejected, match="output 1 wrong"):  # y alone right is not enough
        validate(OP, spec, wrong_h, config, device, lambda: None)
    assert {validate(OP, spec, whole_row.build, config, device, lambda: None)} == validation_runs(OP, spec)


# ---- the tolerance discriminates --------------------------------------------------------------


def test_the_tolerance_catches_a_missing_residual_or_a_misplaced_weight(device: str) -> None:
    spec = OP.spec((6, 32), "bfloat16")
    x, r, w = inputs = OP.make_inputs(spec, seed=1, device=device)
    y64, h64 = OP.reference_fp64(spec, inputs)
    y_lowp, h_lowp = OP.reference(spec, inputs)

    def norm(hf: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return (hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + 1e-6) * weight).to(torch.bfloat16)

    hf = h_lowp.float()
    assert check_close(norm(hf, w.float()), y64, y_lowp, OP.tolerance) is None
    assert check_close(h_lowp, h64, h_lowp, OP.tolerance) is None
    assert check_close(norm(x.float(), w.float()), y64, y_lowp, OP.tolerance) is not None  # no residual
    assert check_close(norm(hf, w.float().roll(1)), y64, y_lowp, OP.tolerance) is not None
    assert check_close(x, h64, h_lowp, OP.tolerance) is not None  # h = x
    assert check_close(r, h64, h_lowp, OP.tolerance) is not None  # h = residual


# ---- references -----------------------------------------------------------------------------


def test_reference_is_the_llama_decoder_formula(device: str) -> None:
    spec = OP.spec((2, 3, 64), "bfloat16", eps=1e-5)
    x, r, w = inputs = OP.make_inputs(spec, seed=2, device=device)
    y, h = OP.reference(spec, inputs)
    # transformers' LlamaDecoderLayer: hidden_states = residual + hidden_states, then LlamaRMSNorm
    expected_h = r + x
    hf = expected_h.to(torch.float32)
    variance = hf.pow(2).mean(-1, keepdim=True)
    expected_y = w * (hf * torch.rsqrt(variance + 1e-5)).to(torch.bfloat16)
    assert y.dtype == h.dtype == torch.bfloat16 and y.shape == h.shape == x.shape
    assert torch.equal(h, expected_h) and torch.equal(y, expected_y)

    y64, h64 = OP.reference_fp64(spec, inputs)
    assert y64.dtype == h64.dtype == torch.float64 and y64.shape == h64.shape == x.shape
    # h's float64 truth is the sum as models store it: rounded to the input dtype...
    assert torch.equal(h64, expected_h.double())
    assert not torch.equal(h64, x.double() + r.double())  # ...which is not the exact sum
    # ...and y is the exact RMSNorm of that h: each row of y / weight has a mean square of ~1.
    ms = (y64 / w.double()).pow(2).mean(-1)
    assert torch.allclose(ms, torch.ones_like(ms), atol=1e-3)
    assert (y.double() - y64).abs().max() < 0.05


# ---- specs ----------------------------------------------------------------------------------


def test_spec_from_command_line_shape() -> None:
    spec = OP.spec((8192, 4096), "bf16")
    assert spec.op == "add_rmsnorm"
    x, r, w = spec.inputs
    assert x.shape == r.shape == (8192, 4096) and w.shape == (4096,)
    assert x.dtype == r.dtype == w.dtype == "bfloat16"
    assert spec.const("eps") == 1e-6
    assert OP.spec((2, 3, 64), "fp32").inputs[2].shape == (64,)
    assert OP.spec((64,), "fp16").inputs[1].shape == (64,)
    assert "8192x4096" in OP.shape_help
    assert isinstance(OP, AddRMSNorm) and OP.name == "add_rmsnorm" and OP.rowwise


@pytest.mark.parametrize(
    "make",
    [
        pytest.param(lambda: (torch.zeros(4, 8), torch.zeros(4, 8), torch.zeros(4)), id="weight-size"),
        pytest.param(lambda: (torch.zeros(4, 8), torch.zeros(4, 8), torch.zeros(1, 8)), id="weight-rank"),
        pytest.param(lambda: (torch.zeros(4, 8), torch.zeros(8), torch.zeros(8)), id="residual-broadcast"),
        pytest.param(lambda: (torch.zeros(4, 8), torch.zeros(2, 8), torch.zeros(8)), id="residual-rows"),
        pytest.param(lambda: (torch.zeros(()), torch.zeros(()), torch.zeros(1)), id="scalar-x"),
        pytest.param(lambda: (torch.zeros(0, 8), torch.zeros(0, 8), torch.zeros(8)), id="empty"),
        pytest.param(lambda: (torch.zeros(4, 8), torch.zeros(4, 8, dtype=torch.float16), torch.zeros(8)),
                     id="residual-dtype"),
        pytest.param(lambda: (torch.zeros(4, 8), torch.zeros(4, 8), torch.zeros(8, dtype=torch.bfloat16)),
                     id="weight-dtype"),
        pytest.param(lambda: (torch.zeros(4, 8, dtype=torch.float64), torch.zeros(4, 8, dtype=torch.float64),
                              torch.zeros(8, dtype=torch.float64)), id="float64"),
        pytest.param(lambda: (torch.zeros(4, 8, dtype=torch.int32), torch.zeros(4, 8, dtype=torch.int32),
                              torch.zeros(8, dtype=torch.int32)), id="int32"),
        pytest.param(lambda: (torch.zeros(4, 8), torch.zeros(8, 4).t(), torch.zeros(8)), id="transposed-residual"),
        pytest.param(lambda: (torch.zeros(4, 16)[:, ::2], torch.zeros(4, 8), torch.zeros(8)), id="strided-x"),
        pytest.param(lambda: (torch.zeros(4, 8), torch.zeros(4, 8), torch.zeros(16)[::2]), id="strided-weight"),
        pytest.param(lambda: (torch.zeros(4, 8), torch.zeros(8)), id="two-inputs"),
    ],
)
def test_spec_for_rejects_what_the_kernels_cannot_do(make) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(UnsupportedWorkload):
        OP.spec_for(*make())


def test_a_spec_of_inconsistent_inputs_is_rejected() -> None:
    # (the rejections add_rmsnorm shares with rmsnorm: test_rowwise_families.py)
    # a spec built by hand (or read from a database) with inconsistent inputs
    good = OP.spec((4, 8), "fp32")
    with pytest.raises(UnsupportedWorkload):
        OP.check_supported(OpSpec(OP.name, (good.inputs[0], good.inputs[0].with_shape((2, 8)), good.inputs[2])))
    with pytest.raises(UnsupportedWorkload):
        OP.check_supported(OpSpec(OP.name, good.inputs[:2]))


def test_output_specs_bytes_and_flops() -> None:
    spec = OP.spec((8192, 4096), "bfloat16")
    y, h = OP.output_specs(spec)
    assert y.shape == h.shape == (8192, 4096) and y.dtype == h.dtype == "bfloat16"
    # x and residual read, weight read, y and h written
    assert OP.bytes_moved(spec) == 4 * 8192 * 4096 * 2 + 4096 * 2
    assert OP.bytes_moved(OP.spec((2, 3, 10), "float32")) == (4 * 60 + 10) * 4
    assert OP.flops(spec) == 5 * 8192 * 4096


def test_bucket_and_validation_specs_reshape_the_residual_with_x() -> None:
    spec = OP.spec((5, 1000, 4096), "bfloat16")
    bucket = OP.bucket(spec)
    assert bucket == OP.spec((8192, 4096), "bfloat16")  # the command-line spec of the bucket
    assert bucket.inputs[1].shape == bucket.inputs[0].shape == (8192, 4096)
    specs = OP.validation_specs(OP.spec((4, 25, 3000), "float16"))
    assert [s.inputs[0].shape for s in specs] == [(4, 25, 3000)] + [(r, 3000) for r in tail_rows(100, OP.row_block)]
    for s in specs:
        x, r, w = s.inputs
        assert r == x and w.shape == (3000,)
        OP.check_supported(s)
        for variant in OP.variants:  # a config is chosen for a width: the same space for every tail
            assert variant.space(s).configs() == variant.space(specs[0]).configs()


# ---- inputs ---------------------------------------------------------------------------------


def test_distributions_differ_as_described(device: str) -> None:
    spec = OP.spec((64, 2048), "float16")
    drawn = {d: [t.float() for t in OP.make_inputs(spec, seed=0, distribution=d, device=device)]
             for d in OP.distributions}
    for d, (x, r, _) in drawn.items():
        assert bool(torch.isfinite(x).all() and torch.isfinite(r).all()), d
        assert 0.5 < float(r.std()) / float(x.std()) < 2, f"{d}: residual and x are not of comparable scale"
    std = {d: float(x.std()) for d, (x, _, _) in drawn.items()}
    assert 0.9 < std["normal"] < 1.1
    assert 90 < std["large"] < 110
    assert 0.9e-3 < std["small"] < 1.1e-3
    x, r, _ = drawn["outliers"]
    assert 30 < int((x.abs() > 6).sum()) < 300  # about 0.1% of 131072 elements, times 50
    hot = (r.abs() > 6).any(0)  # residual outliers sit in whole columns ("massive activations")
    assert 0 < int(hot.sum()) < 20
    assert float(r[:, hot].abs().mean()) > 10 * float(r[:, ~hot].abs().mean())
    inputs = OP.make_inputs(spec, seed=0, distribution="large", device=device)
    assert all(bool(torch.isfinite(t).all()) for t in OP.reference(spec, inputs))
    with pytest.raises(ValueError, match="distribution"):
        OP.make_inputs(spec, seed=0, distribution="cauchy", device=device)


def test_weight_is_one_plus_half_normal(device: str) -> None:
    _, _, w = OP.make_inputs(OP.spec((2, 8192), "float32"), seed=4, device=device)
    assert abs(float(w.mean()) - 1) < 0.05 and abs(float(w.std()) - 0.5) < 0.05


# ---- spaces ---------------------------------------------------------------------------------


@pytest.mark.parametrize("width", [1, 2, 3, 17, 64, 341, 1000, 4096, 8192, 16384, 65536])
def test_spaces_are_non_empty_and_valid(width: int) -> None:
    spec = OP.spec((8, width), "bfloat16")
    for variant in OP.variants:
        space = variant.space(spec)
        if (variant.name == "multi_row" and width > 8192) or (variant.name == "persistent" and width > 32768):
            assert len(space) == 0  # two rows (or x, residual and weight) exceed the register budget
            continue
        if variant.name == "aligned_row" and width % 16 == 0:
            assert len(space) == 0  # Triton proves these rows aligned: whole_row is the same kernel
            continue
        if variant.name == "split_row" and width <= 4096:
            assert len(space) == 0  # rows of at most 8 KB are not split
            continue
        assert len(space) > 0, f"{variant.name} has no config at width {width}"
        for config in space:
            assert space.violations(config) == []
            assert config["num_warps"] in (1, 2, 4, 8, 16, 32)
            # num_stages only where there is a loop to pipeline
            assert ("num_stages" in config) == (variant.name in ("looped", "persistent"))


def test_space_sizes_are_modest() -> None:
    for width in (1024, 4096, 8192):
        spec = OP.spec((8192, width), "bfloat16")
        total = sum(len(v.space(spec)) for v in OP.variants)
        assert 50 <= total <= 250, (width, total)
    assert sum(len(OP.variant(v).space(OP.spec((8192, 4096), "bfloat16"))) for v in VARIANTS) == 144
    assert set(VARIANTS) == {"whole_row", "multi_row", "looped", "persistent"}
    assert len({v.source_hash for v in OP.variants}) == len(OP.variants)


def test_persistent_programs_fit_an_sm() -> None:
    # (the limits add_rmsnorm shares with rmsnorm: test_rowwise_families.py's row-limits test)
    # persistent: the programs of an SM stay resident, and pipelined rows fit in shared memory
    for c in OP.variant("persistent").space(OP.spec((2, 8192), "fp32")):
        assert c["PROGRAMS_PER_SM"] * c["num_warps"] <= 64
        assert c["PROGRAMS_PER_SM"] * (c["num_stages"] - 1) * 2 * 8192 * 4 <= 192 * 1024


# ---- Gemma's weight offset: y = rmsnorm(h) * (weight + weight_offset) ---------------------------

# (Each schedule with the offset against the reference, and without it: test_rowwise_families.py.)


def test_weight_offset_reference_is_gemmas_formula(device: str) -> None:
    spec = OP.spec((2, 3, 64), "bfloat16", weight_offset=1.0)
    x, r, w = inputs = OP.make_inputs(spec, seed=2, device=device)
    y, h = OP.reference(spec, inputs)
    # transformers' Gemma decoder layer: residual + hidden_states, then GemmaRMSNorm (float32,
    # times 1 + weight, rounded once)
    hf = (r + x).float()
    normed = hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + 1e-6)
    assert torch.equal(h, r + x) and torch.equal(y, (normed * (1.0 + w.float())).type_as(x))
    y64, h64 = OP.reference_fp64(spec, inputs)
    hd = (r + x).double()
    assert torch.equal(h64, hd)
    assert torch.equal(y64, (w.double() + 1.0) * (hd * torch.rsqrt(hd.pow(2).mean(-1, keepdim=True) + 1e-6)))


def test_weight_offset_specs_leave_other_workloads_alone(device: str) -> None:
    x, w = torch.zeros(16, 128, dtype=torch.bfloat16), torch.zeros(128, dtype=torch.bfloat16)
    plain = OP.spec((16, 128), "bfloat16")
    assert OP.spec((16, 128), "bfloat16", weight_offset=0.0) == plain == OP.spec_for(x, x, w, weight_offset=0)
    assert "weight_offset" not in plain.constants
    gemma = OP.spec((16, 128), "bfloat16", weight_offset=1.0)
    assert gemma.constants == {"eps": 1e-6, "weight_offset": 1.0} and OP.spec_for(x, x, w, weight_offset=1.0) == gemma
    assert gemma.workload_hash != plain.workload_hash
    for bad in (math.inf, math.nan):
        with pytest.raises(UnsupportedWorkload, match="weight_offset"):
            OP.spec((16, 128), "bfloat16", weight_offset=bad)
    # The weight is drawn less the offset: the rows are scaled by 1 + 0.5 * N(0, 1) either way.
    w_plain = OP.make_inputs(OP.spec((2, 256), "float32"), seed=4, device=device)[2]
    w_gemma = OP.make_inputs(OP.spec((2, 256), "float32", weight_offset=1.0), seed=4, device=device)[2]
    assert torch.allclose(w_gemma + 1.0, w_plain)

"""Random validation draws on which the harness rejects a correct kernel, reproduced from their seeds.

The harness passes a candidate when its error is at most ``k`` times PyTorch's own error in the
inputs' dtype plus a floor of a few ulps (:mod:`kernelsmith.evaluate.errors`). On a few draws
PyTorch's own error is small by luck, far below what its arithmetic guarantees, and a kernel whose
rounding is as good as PyTorch's on average is rejected. Each test here pins one such draw (found by
simulating many seeds of validation: the seed, spec and distribution are the ones validation drew).

The cases below are *not fixed*, so they are strict xfails: a fix turns them into passes (and then
they must become plain tests). For linear cross-entropy and attention the cause is the tolerance
rule, which has no floor for the op's condition (softmax of logits or scores of magnitude |z| moves
by about |z| * eps under any float32 rounding of them), not the kernel's math; for LayerNorm's
backward it is the kernel's float32 row mean under cancelling spikes (see each test).
"""

from __future__ import annotations

import pytest
import torch

from kernelsmith.evaluate.errors import check_close
from kernelsmith.ops import get_op
from kernelsmith.space import Config

LCE_BACKWARD = get_op("linear_cross_entropy_backward")

# linear_cross_entropy_backward in float32 (the harness test's spec, (9, 16, 40) mean with label
# smoothing 0.1 and a bias), its 1-row validation tail, which draws the spike stress data first.
# The spike (1.1e3 in one of h's 16 columns) makes every logit z = W h + b about 10^2..10^3, and
# the two largest are 0.8 apart (569.22 and 568.42): softmax is (0.69, 0.31, ~0...).
LCE_SPIKE_SEED = 485356618176330108


def _lce_spike_draw() -> tuple:
    spec = LCE_BACKWARD.spec((9, 16, 40), "float32", reduction="mean", label_smoothing=0.1, bias=True)
    tail = LCE_BACKWARD.validation_specs(spec)[1]
    assert tail.inputs[1].shape == (1, 16)  # the 1-row tail
    inputs = LCE_BACKWARD.validation_inputs(tail, LCE_SPIKE_SEED, "spikes", "cpu")
    return tail, inputs, LCE_BACKWARD.reference_fp64(tail, inputs), LCE_BACKWARD.reference(tail, inputs)


def _softmax_gradient(z: torch.Tensor, target: torch.Tensor, dloss: float, smoothing: float) -> torch.Tensor:
    """d loss / d z of a mean, label-smoothed cross-entropy over one row, in float64, from logits ``z``."""
    z = z.double()
    onehot = torch.nn.functional.one_hot(target, z.shape[-1]).double()
    return (torch.softmax(z, -1) - (1 - smoothing) * onehot - smoothing / z.shape[-1]) * dloss


@pytest.mark.xfail(strict=True, reason="tolerance rule: PyTorch's float32 logits are correctly rounded by luck "
                                       "on this draw; see test_one_ulp_logits_are_rejected_on_the_lce_spike_draw")
def test_lce_backward_kernel_passes_the_float32_spike_draw(device: str) -> None:
    """The real kernel on the draw: its dh, dW and db are ~3e-5 off (relative L2), PyTorch's ~1e-7;
    the limit is 4 x PyTorch's + 2 ulps, ~7e-7. (Measured: 2 rejections in 139 seeds of this tail.)"""
    tail, inputs, refs64, lowps = _lce_spike_draw()
    inputs = [t.to(device) for t in inputs]
    config = Config(BLOCK_K=32, BLOCK_M=64, BLOCK_N=64, BLOCK_V=64, CHUNK=16, DW_ACC="float32", num_stages=2,
                    num_warps=4)  # fmt: skip
    outs = [torch.full(t.shape, float("nan"), dtype=t.torch_dtype, device=device)
            for t in LCE_BACKWARD.output_specs(tail)]  # fmt: skip
    LCE_BACKWARD.variant("chunked").build(tail, config)(inputs, outs)
    problems = [check_close(out.cpu(), ref, low, LCE_BACKWARD.tolerance)
                for out, ref, low in zip(outs, refs64, lowps, strict=True)]  # fmt: skip
    assert problems == [None] * len(outs)


@pytest.mark.xfail(strict=True, reason="tolerance rule: the floor does not scale with softmax's condition |z| * eps")
def test_one_ulp_logits_are_rejected_on_the_lce_spike_draw() -> None:
    """Why the kernel above fails, with no kernel: the bias gradient db (= the logits' gradient g of the
    one row) computed exactly from float32 logits that are one ulp off the correctly rounded ones (the
    top one, 569.22, by 6.1e-5; the others as rounded) is rejected.

    Every float32 kernel holds float32 logits, and a float32 dot product of 16 terms is not correctly
    rounded in general (within a few ulps of |z| is what its arithmetic guarantees). An error d in
    z_i - z_j moves g by about p_i p_j d, relative to |g| ~ 1: with |z| ~ 600, one ulp is ~6e-5. On
    this draw PyTorch's two top logits happen to be rounded by nearly the same amount (-3.70e-6 and
    -3.95e-6), so their difference, all softmax sees, is off by only 2.5e-7, and PyTorch's own error
    (the tolerance's base) is ~1e-7. A principled floor would be about eps * max|z| * |g| on such rows
    (the condition of softmax, from the float64 logits), which needs the family to give it to the
    harness; errors.check_close sees only the outputs."""
    _, (dloss, h, w, target, b), refs64, lowps = _lce_spike_draw()
    z64 = (h.double() @ w.double().T + b.double())[0]
    rounded = z64.float()
    top, second = (int(i) for i in z64.topk(2).indices)
    pytorch = torch.nn.functional.linear(h, w, b)[0]
    assert torch.equal(pytorch[[top, second]], rounded[[top, second]])  # PyTorch's top two: correctly rounded
    one_ulp_off = rounded.clone()
    one_ulp_off[top] = torch.nextafter(rounded[top], torch.tensor(float("inf")))
    # (the formula is db's: from the exact logits it gives the float64 reference)
    assert torch.allclose(_softmax_gradient(z64, target[0], float(dloss), 0.1), refs64[2], rtol=0, atol=1e-12)
    db = _softmax_gradient(one_ulp_off, target[0], float(dloss), 0.1).float()
    assert check_close(db, refs64[2], lowps[2], LCE_BACKWARD.tolerance) is None


ATTENTION = get_op("attention")
# attention in float32, (2, 2, 5, 32) causal (the flash harness test's shape), the spike stress data
# on the target: spikes in both q and k make scores up to 6.9e7. Measured: 1 rejection in 194 seeds.
ATTENTION_SPIKE_SEED = 3904735234890330547


@pytest.mark.xfail(strict=True, reason="tolerance rule: no floor for softmax's condition |score| * eps")
def test_flash_attention_passes_the_float32_spike_draw(device: str) -> None:
    """The flash kernel is 4.7e-7 off (relative L2) against a limit of 3.5e-7 (PyTorch's own 2.8e-8).
    Not the kernel's math: the output computed exactly from the *correctly rounded* float32 scores
    is already 2.7e-7 off, ten times PyTorch's error on this draw, so any float32 kernel is within a
    factor of two of rejection here."""
    spec = ATTENTION.spec((2, 2, 5, 32), "float32", causal=True)
    inputs = ATTENTION.validation_inputs(spec, ATTENTION_SPIKE_SEED, "spikes", "cpu")
    (ref64,), (lowp,) = ATTENTION.reference_fp64(spec, inputs), ATTENTION.reference(spec, inputs)
    out = torch.full(ref64.shape, float("nan"), dtype=torch.float32, device=device)
    config = Config(BLOCK_M=16, BLOCK_N=32, TWO_LOOPS=True, num_warps=2, num_stages=2)
    ATTENTION.variant("flash").build(spec, config)([t.to(device) for t in inputs], [out])
    assert check_close(out.cpu(), ref64, lowp, ATTENTION.tolerance) is None


LAYERNORM_BACKWARD = get_op("layernorm_backward")
# layernorm_backward in float32, the 1-row tail of (20, 100) weight_bias, spike stress data: x holds
# -10288.8 and +11371.8, whose sum cancels to 1083 (sum |x| / |sum x| ~ 20). Measured: 1 rejection
# in 72 seeds of the tail.
LAYERNORM_BACKWARD_SPIKE_SEED = 378339608034625827


@pytest.mark.xfail(strict=True, reason="layernorm_backward's row mean under cancelling spikes (not fixed here)")
def test_layernorm_backward_passes_the_float32_spike_draw(device: str) -> None:
    """dw (= dy * xhat for one row) is 9.3e-7 off against a limit of 3.8e-7; PyTorch's 3.5e-8 is
    exactly the error of dy times the correctly rounded xhat, so here the kernel, not the rule, is
    the less accurate: its float32 mean(d) adds the row's small values to each spike before the
    spikes meet (each addition rounded at the spikes' ulp, 1e-3), while PyTorch's sum happens to
    add the two spikes to each other first (exactly, by Sterbenz) and then the small values to
    1083. xhat = (d - mean(d)) rstd inherits the mean's ~2.6e-5 error on every element."""
    spec = LAYERNORM_BACKWARD.spec((20, 100), "float32", affine="weight_bias")
    tail = LAYERNORM_BACKWARD.validation_specs(spec)[1]
    assert tail.inputs[0].shape == (1, 100)
    inputs = LAYERNORM_BACKWARD.validation_inputs(tail, LAYERNORM_BACKWARD_SPIKE_SEED, "spikes", "cpu")
    refs64, lowps = LAYERNORM_BACKWARD.reference_fp64(tail, inputs), LAYERNORM_BACKWARD.reference(tail, inputs)
    variant = LAYERNORM_BACKWARD.variant("two_stage")
    outs = [torch.full(t.shape, float("nan"), dtype=t.torch_dtype, device=device)
            for t in LAYERNORM_BACKWARD.output_specs(tail)]  # fmt: skip
    variant.build(tail, variant.space(spec).configs()[-1])([t.to(device) for t in inputs], outs)
    problems = [check_close(out.cpu(), ref, low, LAYERNORM_BACKWARD.tolerance)
                for out, ref, low in zip(outs, refs64, lowps, strict=True)]  # fmt: skip
    assert problems == [None] * len(outs)

"""The linear + cross-entropy floor covers the reference's own rounding of the logits.

The reference computes ``F.linear(h, W)`` in the inputs' dtype, so every logit is rounded once to
bfloat16 before the loss. A kernel that keeps its logits in that dtype too (the library-GEMM
variant) rounds them as much, at other places (another GEMM kernel, another summation order). On a
draw where PyTorch's roundings cancel in a "mean", the bare rule (4x PyTorch's own error) rejected
such a kernel on the H200 (2026-12-02). Here the same situation is made without a kernel: the exact
logits, shifted by less than half a bfloat16 ulp at random and rounded, give a loss that is a
correct rounding of the same function; the floor must accept it on every draw, a 1% canary must
still fail on every draw, and at least one draw must be one the bare rule rejects.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kernelsmith.evaluate import errors
from kernelsmith.ops import get_op

OP = get_op("linear_cross_entropy_fused")
SPEC = OP.spec((1000, 256, 5003), "bfloat16", reduction="mean")


def _rounded_elsewhere(inputs: list[torch.Tensor], seed: int) -> torch.Tensor:
    h, w, t = inputs
    exact = h.double() @ w.double().T
    g = torch.Generator().manual_seed(100 + seed)
    shift = (torch.rand(exact.shape, generator=g, dtype=torch.float64) - 0.5) * exact.abs()
    shifted = exact + shift * torch.finfo(torch.bfloat16).eps / 2  # under half an ulp either way
    return F.cross_entropy(shifted.to(torch.bfloat16).float(), t)


def test_a_loss_from_logits_rounded_elsewhere_passes_and_a_canary_does_not() -> None:
    bare_rejections = 0
    for seed in range(4):  # (seed 2 is a draw the bare rule rejects)
        inputs = OP.make_inputs(SPEC, seed=seed, distribution="large", device="cpu")
        refs = errors.references(OP, SPEC, inputs)
        loss = _rounded_elsewhere(inputs, seed)
        others = list(refs.lowp[1:])  # PyTorch's own dh and dW: only the loss is on trial here
        assert refs.problem([loss, *others], OP.tolerance) is None, seed
        assert refs.problem([loss * 1.01, *others], OP.tolerance) is not None, seed
        bare_rejections += errors.check_close(loss, refs.fp64[0], refs.lowp[0], OP.tolerance) is not None
    assert bare_rejections >= 1  # the case is real on these draws (seed 2: PyTorch's own error 1.7e-06)

"""Rule 1, a partial write: only the first half of every row's columns is stored.

The harness compares every element of a NaN-poisoned output, so the unwritten half is NaN
where the reference is finite, and the kernel is rejected ("validate").
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import triton
import triton.language as tl

from kernelsmith.space import Config, next_power_of_two
from kernelsmith.spec import OpSpec


@triton.jit
def _rmsnorm_half_kernel(x_ptr, w_ptr, y_ptr, N, eps, BLOCK_N: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < N
    x = tl.load(x_ptr + row * N + cols, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    y = x * tl.rsqrt(tl.sum(x * x, axis=0) / N + eps) * w
    tl.store(y_ptr + row * N + cols, y.to(y_ptr.dtype.element_ty), mask=cols < N // 2)


def build(spec: OpSpec, config: Config):
    n = spec.inputs[0].shape[-1]
    rows = spec.inputs[0].numel // n
    eps = float(spec.const("eps"))
    block_n = next_power_of_two(n)

    def launch(inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> None:
        _rmsnorm_half_kernel[(rows,)](inputs[0], inputs[1], outputs[0], n, eps,
                                      BLOCK_N=block_n, num_warps=config["num_warps"])

    return launch

"""Rule 3, a constant output: softmax answered with 1/N everywhere.

The most plausible constant there is: every row sums to exactly 1, the mean is exactly right,
and on flat inputs each value is off by a small amount in absolute terms. The harness's
tolerance is relative to the reference's scale and PyTorch's own error, and a constant canary
must fail it on the same data, so this kernel is rejected ("validate").
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import triton
import triton.language as tl

from kernelsmith.space import Config, next_power_of_two
from kernelsmith.spec import OpSpec


@triton.jit
def _uniform_kernel(y_ptr, N, BLOCK_N: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    y = tl.full([BLOCK_N], 1.0, tl.float32) / N
    tl.store(y_ptr + row * N + cols, y.to(y_ptr.dtype.element_ty), mask=cols < N)


def build(spec: OpSpec, config: Config):
    n = spec.inputs[0].shape[-1]
    rows = spec.inputs[0].numel // n
    block_n = next_power_of_two(n)

    def launch(inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> None:
        _uniform_kernel[(rows,)](outputs[0], n, BLOCK_N=block_n, num_warps=config["num_warps"])

    return launch

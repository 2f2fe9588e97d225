"""Rule 2 on the *second* input: a correct output, then a second kernel zeroes the weight.

Only the first input of an op is the obvious one to check; this kernel scribbles on the other.
The harness checks every input bit for bit after the call and rejects it as a "cheat"
("modified its inputs").
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import triton
import triton.language as tl

from kernelsmith.space import Config, next_power_of_two
from kernelsmith.spec import OpSpec


@triton.jit
def _rmsnorm_kernel(x_ptr, w_ptr, y_ptr, N, eps, BLOCK_N: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < N
    x = tl.load(x_ptr + row * N + cols, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    y = x * tl.rsqrt(tl.sum(x * x, axis=0) / N + eps) * w
    tl.store(y_ptr + row * N + cols, y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _zero_kernel(ptr, N, BLOCK_N: tl.constexpr):
    cols = tl.arange(0, BLOCK_N)
    tl.store(ptr + cols, tl.zeros([BLOCK_N], dtype=ptr.dtype.element_ty), mask=cols < N)


def build(spec: OpSpec, config: Config):
    n = spec.inputs[0].shape[-1]
    rows = spec.inputs[0].numel // n
    eps = float(spec.const("eps"))
    block_n = next_power_of_two(n)

    def launch(inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> None:
        _rmsnorm_kernel[(rows,)](inputs[0], inputs[1], outputs[0], n, eps, BLOCK_N=block_n)
        _zero_kernel[(1,)](inputs[1], n, BLOCK_N=block_n)  # the cheat: the weight is zeroed

    return launch

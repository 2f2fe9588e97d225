"""Control: a correct softmax kernel (max-subtracted, float32 math), proposed from source.

The harness must accept it (status "ok"), so that the rejections of the planted softmax cheats
are shown to come from their cheating and not from a harness that rejects every softmax.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import triton
import triton.language as tl

from kernelsmith.space import Config, Param, Space, next_power_of_two
from kernelsmith.spec import OpSpec


@triton.jit
def _softmax_kernel(x_ptr, y_ptr, N, BLOCK_N: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < N
    x = tl.load(x_ptr + row * N + cols, mask=mask, other=float("-inf")).to(tl.float32)
    p = tl.exp(x - tl.max(x, axis=0))
    y = p / tl.sum(p, axis=0)
    tl.store(y_ptr + row * N + cols, y.to(y_ptr.dtype.element_ty), mask=mask)


def space(spec: OpSpec) -> Space:
    return Space([Param("num_warps", (1, 2, 4, 8))])


def build(spec: OpSpec, config: Config):
    n = spec.inputs[0].shape[-1]
    rows = spec.inputs[0].numel // n
    block_n = next_power_of_two(n)
    num_warps = config["num_warps"]

    def launch(inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> None:
        _softmax_kernel[(rows,)](inputs[0], outputs[0], n, BLOCK_N=block_n, num_warps=num_warps)

    return launch

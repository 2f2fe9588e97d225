"""Softmax over the last dimension, one program per row: ``exp(x - max(x)) / sum(exp(x - max(x)))``.

The whole row (padded to a power of two, ``BLOCK_N``) is loaded once into registers; padding
lanes load -inf, which never wins the max and adds exp(-inf) = 0 to the sum. Subtracting the row
maximum keeps every exponent <= 0 (no overflow) and the sum >= 1 (no division by zero). All math
is float32; the result is rounded once, to the output's dtype, on the store.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import triton
import triton.language as tl

from kernelsmith.ops._base import Launcher, rows_and_width
from kernelsmith.space import Config, Constraint, Param, Space, next_power_of_two
from kernelsmith.spec import OpSpec

WARPS = (1, 2, 4, 8, 16, 32)
MAX_BLOCK_N = 65536  # the widest row kept in registers
MAX_VALUES_PER_THREAD = 64  # beyond this a thread's registers spill


@triton.jit
def _softmax_row_kernel(
    x_ptr,
    y_ptr,
    x_row_stride,
    y_row_stride,
    N,
    BLOCK_N: tl.constexpr,
    EVICT_X: tl.constexpr,  # "" (default policy) or "evict_first": x is read once
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < N
    x = tl.load(x_ptr + row * x_row_stride + cols, mask=mask, other=float("-inf"), eviction_policy=EVICT_X)
    x = x.to(tl.float32)
    p = tl.exp(x - tl.max(x, axis=0))
    y = p / tl.sum(p, axis=0)
    tl.store(y_ptr + row * y_row_stride + cols, y.to(y_ptr.dtype.element_ty), mask=mask)


def space(spec: OpSpec) -> Space:
    block_n = next_power_of_two(rows_and_width(spec)[1])
    return Space(
        [Param("num_warps", WARPS), Param("EVICT_X", ("", "evict_first"))],
        [
            Constraint(f"the row fits in registers (BLOCK_N <= {MAX_BLOCK_N})", lambda c: block_n <= MAX_BLOCK_N),
            Constraint(
                "no idle warps, no spilling",
                lambda c: (c["num_warps"] == 1 or 32 * c["num_warps"] <= block_n)
                and block_n <= MAX_VALUES_PER_THREAD * 32 * c["num_warps"],
            ),
        ],
    )


def build(spec: OpSpec, config: Config) -> Launcher:
    rows, n = rows_and_width(spec)
    block_n = next_power_of_two(n)
    num_warps = int(config["num_warps"])
    evict_x = str(config["EVICT_X"])

    def launch(inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> None:
        x = inputs[0].view(-1, n)
        y = outputs[0].view(-1, n)
        _softmax_row_kernel[(rows,)](
            x, y, x.stride(0), y.stride(0), n, BLOCK_N=block_n, EVICT_X=evict_x, num_warps=num_warps
        )

    return launch

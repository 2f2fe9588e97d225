"""RMSNorm, one program per row: ``y = x / sqrt(mean(x**2) + eps) * weight``.

The whole row (padded to a power of two, ``BLOCK_N``) is loaded once into registers, reduced in
float32, scaled, multiplied by the weight and stored in the output's dtype. Padding lanes load
0.0, which adds nothing to the sum of squares. Row offsets are 64-bit so that tensors of more
than 2**31 elements address correctly.
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
MAX_VALUES_PER_THREAD = 128  # beyond this a thread's registers spill


@triton.jit
def _rmsnorm_row_kernel(
    x_ptr,
    w_ptr,
    y_ptr,
    x_row_stride,
    y_row_stride,
    N,
    eps,
    BLOCK_N: tl.constexpr,
    EVICT_X: tl.constexpr,  # "" (default policy) or "evict_first": x is read once
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < N
    x = tl.load(x_ptr + row * x_row_stride + cols, mask=mask, other=0.0, eviction_policy=EVICT_X).to(tl.float32)
    rstd = tl.rsqrt(tl.sum(x * x, axis=0) / N + eps)  # mean over the N real elements
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + row * y_row_stride + cols, (x * rstd * w).to(y_ptr.dtype.element_ty), mask=mask)


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
    eps = float(spec.const("eps"))
    num_warps = int(config["num_warps"])
    evict_x = str(config["EVICT_X"])

    def launch(inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> None:
        x = inputs[0].view(-1, n)
        y = outputs[0].view(-1, n)
        _rmsnorm_row_kernel[(rows,)](
            x, inputs[1], y, x.stride(0), y.stride(0), n, eps, BLOCK_N=block_n, EVICT_X=evict_x, num_warps=num_warps
        )

    return launch

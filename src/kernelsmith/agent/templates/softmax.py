"""Softmax over the last dimension, one program per row: ``exp(x - max(x)) / sum(exp(x - max(x)))``.

The whole row (padded to a power of two, ``BLOCK_N``) is loaded once into registers; padding
lanes load -inf, which never wins the max and adds exp(-inf) = 0 to the sum. Subtracting the row
maximum keeps every exponent <= 0 (no overflow) and the sum >= 1 (no division by zero). All math
is float32; the result is rounded once, to the output's dtype, on the store.
"""

import triton
import triton.language as tl

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


SPACE = {"num_warps": [1, 2, 4, 8, 16, 32], "EVICT_X": ["", "evict_first"]}

CONSTRAINTS = [
    "next_power_of_two(N) <= MAX_BLOCK_N",  # the row fits in registers
    "num_warps == 1 or 32 * num_warps <= next_power_of_two(N)",  # no idle warps
    "next_power_of_two(N) <= MAX_VALUES_PER_THREAD * 32 * num_warps",  # no spilling
]

LAUNCH = {
    "kernel": "_softmax_row_kernel",
    "grid": ["rows"],
    "args": ["in0", "out0", "row_stride(in0)", "row_stride(out0)", "N"],
    "constexprs": {"BLOCK_N": "next_power_of_two(N)", "EVICT_X": "EVICT_X"},
    "num_warps": "num_warps",
}

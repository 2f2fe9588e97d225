"""RMSNorm, one program per row: ``y = x / sqrt(mean(x**2) + eps) * weight``.

The whole row (padded to a power of two, ``BLOCK_N``) is loaded once into registers, reduced in
float32, scaled, multiplied by the weight and stored in the output's dtype. Padding lanes load
0.0, which adds nothing to the sum of squares. Row offsets are 64-bit so that tensors of more
than 2**31 elements address correctly.
"""

import triton
import triton.language as tl

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


SPACE = {"num_warps": [1, 2, 4, 8, 16, 32], "EVICT_X": ["", "evict_first"]}

CONSTRAINTS = [
    "next_power_of_two(N) <= MAX_BLOCK_N",  # the row fits in registers
    "num_warps == 1 or 32 * num_warps <= next_power_of_two(N)",  # no idle warps
    "next_power_of_two(N) <= MAX_VALUES_PER_THREAD * 32 * num_warps",  # no spilling
]

LAUNCH = {
    "kernel": "_rmsnorm_row_kernel",
    "grid": ["rows"],
    "args": ["in0", "in1", "out0", "row_stride(in0)", "row_stride(out0)", "N", "eps"],
    "constexprs": {"BLOCK_N": "next_power_of_two(N)", "EVICT_X": "EVICT_X"},
    "num_warps": "num_warps",
}

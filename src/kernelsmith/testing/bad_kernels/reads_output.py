"""Rule 9, reading uninitialized memory: the kernel adds a little of what its output held.

The output buffer's old contents (NaN poison reads as 0, invisible to a NaN check) leak into the
result by 1e-3 of their value: small enough to pass a tolerance on one run. The harness runs
twice on buffers pre-filled with different values and requires the same bits: rejected
("validate", "bit for bit").
"""

import triton
import triton.language as tl


@triton.jit
def _rmsnorm_kernel(x_ptr, w_ptr, y_ptr, N, eps, BLOCK_N: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < N
    x = tl.load(x_ptr + row * N + cols, mask=mask, other=0.0).to(tl.float32)
    rstd = tl.rsqrt(tl.sum(x * x, axis=0) / N + eps)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    y = x * rstd * w
    old = tl.load(y_ptr + row * N + cols, mask=mask, other=0.0).to(tl.float32)  # uninitialized
    old = tl.where(old != old, 0.0, old)  # NaN poison reads as 0: invisible to NaN checks
    y = y + old * 1e-3
    tl.store(y_ptr + row * N + cols, y.to(y_ptr.dtype.element_ty), mask=mask)


SPACE = {"num_warps": [1, 2, 4, 8]}

LAUNCH = {
    "kernel": "_rmsnorm_kernel",
    "grid": ["rows"],
    "args": ["in0", "in1", "out0", "N", "eps"],
    "constexprs": {"BLOCK_N": "next_power_of_two(N)"},
    "num_warps": "num_warps",
}

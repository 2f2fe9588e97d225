"""Rule 8, a precision downgrade: float32 RMSNorm computed in float16.

The loads are converted to float16 and the sum of squares and the scaling done there; the output
dtype is right, so a dtype check passes. The tolerance is derived from PyTorch's own float32
error, which float16 arithmetic exceeds by orders of magnitude: rejected ("validate").
"""

import triton
import triton.language as tl


@triton.jit
def _rmsnorm_kernel(x_ptr, w_ptr, y_ptr, N, eps, BLOCK_N: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < N
    x = tl.load(x_ptr + row * N + cols, mask=mask, other=0.0).to(tl.float16)  # the downgrade
    mean_square = (tl.sum(x * x, axis=0) / N).to(tl.float16)
    rstd = tl.rsqrt(mean_square.to(tl.float32) + eps).to(tl.float16)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float16)
    y = x * rstd * w
    tl.store(y_ptr + row * N + cols, y.to(y_ptr.dtype.element_ty), mask=mask)


SPACE = {"num_warps": [1, 2, 4, 8]}

LAUNCH = {
    "kernel": "_rmsnorm_kernel",
    "grid": ["rows"],
    "args": ["in0", "in1", "out0", "N", "eps"],
    "constexprs": {"BLOCK_N": "next_power_of_two(N)"},
    "num_warps": "num_warps",
}

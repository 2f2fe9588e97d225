"""A blind spot of the validation data (issue 12): wrong only on rows holding a huge element.

The kernel clamps every input to [-2048, 2048] before normalising: right on every distribution
whose values stay below a few thousand in magnitude (normal, large = 100 N(0, 1), outliers =
50x a few elements), wrong by a large factor on a row with one element of 1e4 (an activation
spike of a real model). The validation data must include such rows: rejected ("validate").
"""

import triton
import triton.language as tl


@triton.jit
def _rmsnorm_kernel(x_ptr, w_ptr, y_ptr, N, eps, BLOCK_N: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < N
    x = tl.load(x_ptr + row * N + cols, mask=mask, other=0.0).to(tl.float32)
    x = tl.minimum(tl.maximum(x, -2048.0), 2048.0)  # the blind spot: huge values clamped
    rstd = tl.rsqrt(tl.sum(x * x, axis=0) / N + eps)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
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

"""Rule 3, a zero output: the kernel stores zeros.

RMSNorm outputs are of order 1, and a tolerance that is absolute, or relative to a tiny
reference, could let zeros through. The harness's tolerance scales with the reference (relative
L2 error), and a zeros canary must fail it on the same data: rejected ("validate").
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
    tl.store(y_ptr + row * N + cols, (y * 0.0).to(y_ptr.dtype.element_ty), mask=mask)


SPACE = {"num_warps": [1, 2, 4, 8]}

LAUNCH = {
    "kernel": "_rmsnorm_kernel",
    "grid": ["rows"],
    "args": ["in0", "in1", "out0", "N", "eps"],
    "constexprs": {"BLOCK_N": "next_power_of_two(N)"},
    "num_warps": "num_warps",
}

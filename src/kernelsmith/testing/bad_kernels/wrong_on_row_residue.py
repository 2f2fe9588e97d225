"""A blind spot of the validation shapes (issue 12): wrong for one residue of the row count.

The launch skips the last row when the row count is 2 modulo 4. Validation ran the target and a
few tails (1, 7, rows + 3 rows); with a target of 16 rows none of them is 2 modulo 4, while a
bucket of 16 rows serves every call of 9 to 16 rows, 10 and 14 among them. The validation
shapes must cover every residue a launch can depend on: rejected ("validate").
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
    tl.store(y_ptr + row * N + cols, y.to(y_ptr.dtype.element_ty), mask=mask)


SPACE = {"num_warps": [1, 2, 4, 8]}

LAUNCH = {
    "kernel": "_rmsnorm_kernel",
    "grid": ["rows - 1 if rows % 4 == 2 else rows"],  # the blind spot
    "args": ["in0", "in1", "out0", "N", "eps"],
    "constexprs": {"BLOCK_N": "next_power_of_two(N)"},
    "num_warps": "num_warps",
}

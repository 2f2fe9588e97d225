"""Rule 4, a formula bug that only some data shows: softmax without subtracting the row max.

On inputs of order 1 ``exp(x) / sum(exp(x))`` is the softmax. On the "large" inputs (values above
88.7) ``exp`` overflows float32 to inf and the row becomes NaN. The harness validates several
value distributions, "large" among them: rejected ("validate", "large inputs").
"""

import triton
import triton.language as tl


@triton.jit
def _softmax_kernel(x_ptr, y_ptr, N, BLOCK_N: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < N
    x = tl.load(x_ptr + row * N + cols, mask=mask, other=float("-inf")).to(tl.float32)
    p = tl.exp(x)  # the bug: no max subtraction
    y = p / tl.sum(p, axis=0)
    tl.store(y_ptr + row * N + cols, y.to(y_ptr.dtype.element_ty), mask=mask)


SPACE = {"num_warps": [1, 2, 4, 8]}

LAUNCH = {
    "kernel": "_softmax_kernel",
    "grid": ["rows"],
    "args": ["in0", "out0", "N"],
    "constexprs": {"BLOCK_N": "next_power_of_two(N)"},
    "num_warps": "num_warps",
}

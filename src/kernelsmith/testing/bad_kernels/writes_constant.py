"""Rule 3, a constant output: every element of a row is ``1 / N``.

A softmax output sums to 1 over each row and many of its elements are close to ``1 / N``; a
loose or absolute tolerance would let the uniform distribution through. The harness's constant
canary must fail the tolerance on the same data, and the validation data has rows far from
uniform: rejected ("validate").
"""

import triton
import triton.language as tl


@triton.jit
def _softmax_kernel(x_ptr, y_ptr, N, BLOCK_N: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < N
    x = tl.load(x_ptr + row * N + cols, mask=mask, other=float("-inf")).to(tl.float32)
    y = tl.full([BLOCK_N], 1.0, tl.float32) / N + 0.0 * x  # the cheat: uniform
    tl.store(y_ptr + row * N + cols, y.to(y_ptr.dtype.element_ty), mask=mask)


SPACE = {"num_warps": [1, 2, 4, 8]}

LAUNCH = {
    "kernel": "_softmax_kernel",
    "grid": ["rows"],
    "args": ["in0", "out0", "N"],
    "constexprs": {"BLOCK_N": "next_power_of_two(N)"},
    "num_warps": "num_warps",
}

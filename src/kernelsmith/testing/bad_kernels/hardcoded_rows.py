"""Rule 4, a hard-coded shape: softmax that assumes the input always has 16 rows.

The row width is taken as ``numel // 16`` instead of the real last dimension. On the target
shape of 16 rows that is the right width and the answer is right; on every other row count the
kernel normalises the wrong groups of elements. The harness validates tail shapes (1 row, 7
rows, rows + 3) besides the target, so the kernel is rejected on a tail ("validate").
"""

import triton
import triton.language as tl


@triton.jit
def _softmax_kernel(x_ptr, y_ptr, N, BLOCK_N: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < N
    x = tl.load(x_ptr + row * N + cols, mask=mask, other=float("-inf")).to(tl.float32)
    p = tl.exp(x - tl.max(x, axis=0))
    y = p / tl.sum(p, axis=0)
    tl.store(y_ptr + row * N + cols, y.to(y_ptr.dtype.element_ty), mask=mask)


ASSUMED_ROWS = 16

SPACE = {"num_warps": [1, 2, 4, 8]}

LAUNCH = {
    "kernel": "_softmax_kernel",
    "grid": ["ASSUMED_ROWS"],
    "args": ["in0", "out0", "numel // ASSUMED_ROWS"],  # the cheat: the row count is assumed
    "constexprs": {"BLOCK_N": "next_power_of_two(numel // ASSUMED_ROWS)"},
    "num_warps": "num_warps",
}

"""Rule 1 (and rule 4's tail shapes): the last, partial block of rows is never written.

Each program normalises ROWS = 4 rows (ROWS_PER_PROGRAM), and the grid is ``rows // ROWS`` (floor, where it should
be ``cdiv``). On the target shape of 16 rows that is exactly right; on a tail such as 7 rows the
rows 4 to 6 are never written. The harness validates tail shapes (1, 7, rows + 3 rows) on
poisoned outputs, so the unwritten rows are found and the kernel is rejected ("validate").
"""

import triton
import triton.language as tl


@triton.jit
def _rmsnorm_rows_kernel(x_ptr, w_ptr, y_ptr, n_rows, N, eps, ROWS: tl.constexpr, BLOCK_N: tl.constexpr):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK_N)
    mask = (rows < n_rows)[:, None] & (cols < N)[None, :]
    offsets = rows.to(tl.int64)[:, None] * N + cols[None, :]
    x = tl.load(x_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    rstd = tl.rsqrt(tl.sum(x * x, axis=1) / N + eps)
    w = tl.load(w_ptr + cols, mask=cols < N, other=0.0).to(tl.float32)
    y = x * rstd[:, None] * w[None, :]
    tl.store(y_ptr + offsets, y.to(y_ptr.dtype.element_ty), mask=mask)


ROWS_PER_PROGRAM = 4

SPACE = {"num_warps": [1, 2, 4, 8]}

LAUNCH = {
    "kernel": "_rmsnorm_rows_kernel",
    "grid": ["max(1, rows // ROWS_PER_PROGRAM)"],  # the bug: floor division drops the partial last block
    "args": ["in0", "in1", "out0", "rows", "N", "eps"],
    "constexprs": {"ROWS": "ROWS_PER_PROGRAM", "BLOCK_N": "next_power_of_two(N)"},
    "num_warps": "num_warps",
}

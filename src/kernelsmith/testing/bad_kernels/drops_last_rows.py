"""Rule 1 (and rule 4's tail shapes): the last, partial block of rows is never written.

Each program normalises ROWS = 4 rows, and the grid is ``rows // ROWS`` (floor, where it should
be ``cdiv``). On the target shape of 16 rows that is exactly right; on a tail such as 7 rows the
rows 4 to 6 are never written. The harness validates tail shapes (1, 7, rows + 3 rows) on
NaN-poisoned outputs, so the unwritten rows are NaN and the kernel is rejected ("validate").
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import triton
import triton.language as tl

from kernelsmith.space import Config, next_power_of_two
from kernelsmith.spec import OpSpec

ROWS = 4


@triton.jit
def _rmsnorm_rows_kernel(x_ptr, w_ptr, y_ptr, n_rows, N, eps, ROWS: tl.constexpr,
                         BLOCK_N: tl.constexpr):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK_N)
    mask = (rows < n_rows)[:, None] & (cols < N)[None, :]
    offsets = rows.to(tl.int64)[:, None] * N + cols[None, :]
    x = tl.load(x_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    rstd = tl.rsqrt(tl.sum(x * x, axis=1) / N + eps)
    w = tl.load(w_ptr + cols, mask=cols < N, other=0.0).to(tl.float32)
    y = x * rstd[:, None] * w[None, :]
    tl.store(y_ptr + offsets, y.to(y_ptr.dtype.element_ty), mask=mask)


def build(spec: OpSpec, config: Config):
    n = spec.inputs[0].shape[-1]
    rows = spec.inputs[0].numel // n
    eps = float(spec.const("eps"))
    block_n = next_power_of_two(n)
    grid = (max(1, rows // ROWS),)  # the bug: floor division drops the partial last block

    def launch(inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> None:
        _rmsnorm_rows_kernel[grid](inputs[0], inputs[1], outputs[0], rows, n, eps,
                                   ROWS=ROWS, BLOCK_N=block_n, num_warps=config["num_warps"])

    return launch

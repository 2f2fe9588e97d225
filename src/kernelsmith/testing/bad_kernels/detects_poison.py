"""Telling the harness from a user's process by the output buffer's contents (issue 12).

The kernel reads the first element of its output row before writing it. A harness that always
pre-fills outputs with NaN is recognised by it: there the kernel computes the right answer; on
any other buffer (a user's ``torch.empty``, or one that still holds the previous call's answer)
it skips the work and leaves the row as it found it, which in service returns garbage or stale
values. The harness pre-fills outputs with more than one value (NaN, then 777.0 or random finite
values) and requires every run to be right and the runs to agree bit for bit: rejected
("validate").
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
    first = tl.load(y_ptr + row * N).to(tl.float32)
    if first != first:  # NaN: the harness's poison, so do the work
        tl.store(y_ptr + row * N + cols, y.to(y_ptr.dtype.element_ty), mask=mask)


SPACE = {"num_warps": [1, 2, 4, 8]}

LAUNCH = {
    "kernel": "_rmsnorm_kernel",
    "grid": ["rows"],
    "args": ["in0", "in1", "out0", "N", "eps"],
    "constexprs": {"BLOCK_N": "next_power_of_two(N)"},
    "num_warps": "num_warps",
}

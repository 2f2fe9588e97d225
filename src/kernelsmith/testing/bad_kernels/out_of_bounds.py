"""A CUDA fault (GPU only): the kernel stores far past the end of its output.

An illegal memory access poisons the CUDA context of the process that made it: every later
CUDA call there fails. The harness runs candidates only in worker processes, reports the fault
("runtime", or "crash" if the worker dies) and replaces the worker, so the next candidate runs
in a clean context. Never run this in the interpreter: there the store lands in host memory.
"""

import triton
import triton.language as tl

FAR_AWAY = tl.constexpr(1099511627776)  # 2**40 elements: terabytes past the output


@triton.jit
def _rmsnorm_kernel(x_ptr, w_ptr, y_ptr, N, eps, BLOCK_N: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < N
    x = tl.load(x_ptr + row * N + cols, mask=mask, other=0.0).to(tl.float32)
    rstd = tl.rsqrt(tl.sum(x * x, axis=0) / N + eps)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    y = x * rstd * w
    tl.store(y_ptr + FAR_AWAY + row * N + cols, y.to(y_ptr.dtype.element_ty), mask=mask)


SPACE = {"num_warps": [1, 2, 4, 8]}

LAUNCH = {
    "kernel": "_rmsnorm_kernel",
    "grid": ["rows"],
    "args": ["in0", "in1", "out0", "N", "eps"],
    "constexprs": {"BLOCK_N": "next_power_of_two(N)"},
    "num_warps": "num_warps",
}

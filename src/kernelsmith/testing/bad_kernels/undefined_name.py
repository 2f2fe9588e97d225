"""A kernel that uses a name it never defines (``undefined_scale``).

In a Python module this is a compile error on the kernel's first launch. A kernel file is
checked before anything runs: the gate sees a name in a ``@triton.jit`` body that is neither a
parameter, a local, a constant of the file nor an allowed builtin, and rejects the file with
the name and its line, costing no evaluation.
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
    tl.store(y_ptr + row * N + cols, (y * undefined_scale).to(y_ptr.dtype.element_ty), mask=mask)  # type: ignore[name-defined]  # noqa: F821


SPACE = {"num_warps": [1, 2, 4, 8]}

LAUNCH = {
    "kernel": "_rmsnorm_kernel",
    "grid": ["rows"],
    "args": ["in0", "in1", "out0", "N", "eps"],
    "constexprs": {"BLOCK_N": "next_power_of_two(N)"},
    "num_warps": "num_warps",
}

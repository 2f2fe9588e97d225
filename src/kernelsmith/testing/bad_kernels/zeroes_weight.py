"""Rule 2, mutating an input from a second launch: after computing the output, a second
kernel zeroes the weight.

A harness that computed the reference after the run would compare against the all-zero output
of a zero weight, and could also be fooled into checking later runs against wrong data. The
harness compares every input bit for bit with a clone after each call: rejected ("cheat",
"modified its inputs").
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


@triton.jit
def _zero_kernel(ptr, N, BLOCK_N: tl.constexpr):
    cols = tl.arange(0, BLOCK_N)
    tl.store(ptr + cols, tl.zeros([BLOCK_N], dtype=ptr.dtype.element_ty), mask=cols < N)


SPACE = {"num_warps": [1, 2, 4, 8]}

LAUNCH = [
    {
        "kernel": "_rmsnorm_kernel",
        "grid": ["rows"],
        "args": ["in0", "in1", "out0", "N", "eps"],
        "constexprs": {"BLOCK_N": "next_power_of_two(N)"},
        "num_warps": "num_warps",
    },
    {
        "kernel": "_zero_kernel",  # the cheat: the weight is zeroed after use
        "grid": ["1"],
        "args": ["in1", "N"],
        "constexprs": {"BLOCK_N": "next_power_of_two(N)"},
    },
]

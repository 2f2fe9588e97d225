"""GELU with the tanh approximation, elementwise: ``0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))``.

One program per ``BLOCK`` consecutive elements of the flat tensor (the op's tensors are
contiguous); only the last program is partial, and its loads and stores are masked. The math is
float32, rounded once on the store, and written as ``x * sigmoid(2u)`` (the same function) with
an overflow-free sigmoid: ``t = exp(-|z|)`` is in (0, 1], so nothing overflows for any ``x``.
"""

import triton
import triton.language as tl


@triton.jit
def _sigmoid_f32(z):
    t = tl.exp(-tl.abs(z))
    r = 1.0 / (1.0 + t)
    return tl.where(z >= 0, r, t * r)


@triton.jit
def _gelu_tanh_kernel(
    x_ptr,
    y_ptr,
    n,
    BLOCK: tl.constexpr,  # elements per program
    EVICT_X: tl.constexpr,  # "" or "evict_first": x is read once
):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0, eviction_policy=EVICT_X).to(tl.float32)
    # 2u = sqrt(8/pi) * x * (1 + 0.044715 x^2)
    y = x * _sigmoid_f32(1.5957691216057308 * x * (1.0 + 0.044715 * x * x))
    tl.store(y_ptr + offs, y.to(y_ptr.dtype.element_ty), mask=mask)


SPACE = {"BLOCK": [256, 512, 1024, 2048, 4096, 8192], "num_warps": [1, 2, 4, 8, 16], "EVICT_X": ["", "evict_first"]}

CONSTRAINTS = [
    "32 * num_warps <= BLOCK",  # every thread has work
    "BLOCK <= 32 * 32 * num_warps",  # at most 32 values a thread
]

LAUNCH = {
    "kernel": "_gelu_tanh_kernel",
    "grid": ["cdiv(numel, BLOCK)"],
    "args": ["in0", "out0", "numel"],
    "constexprs": {"BLOCK": "BLOCK", "EVICT_X": "EVICT_X"},
    "num_warps": "num_warps",
}

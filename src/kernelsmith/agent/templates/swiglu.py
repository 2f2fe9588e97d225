"""SwiGLU, elementwise: ``y = silu(a) * b = a * sigmoid(a) * b``.

Inputs ``in0 = a`` (the gate projection) and ``in1 = b`` (the up projection), of the same
contiguous shape (the op's ``layout="pair"``, the default); output ``out0 = y`` of that shape.
One program per ``BLOCK`` consecutive elements of the flat tensors; the last program is masked.
The math is float32 with an overflow-free sigmoid (``t = exp(-|a|)`` is in (0, 1]), rounded once
on the store (PyTorch rounds twice, so this is a little more accurate than the baseline).

The ``layout="concat"`` form (one input ``(..., 2H)`` holding ``a`` and ``b`` side by side) is
not launched by this file: the constraint below leaves the space empty for it.
"""

import triton
import triton.language as tl


@triton.jit
def _sigmoid_f32(z):
    t = tl.exp(-tl.abs(z))
    r = 1.0 / (1.0 + t)
    return tl.where(z >= 0, r, t * r)


@triton.jit
def _swiglu_kernel(
    a_ptr,
    b_ptr,
    y_ptr,
    n,
    BLOCK: tl.constexpr,  # elements per program
    EVICT: tl.constexpr,  # "" or "evict_first": a and b are read once
):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    a = tl.load(a_ptr + offs, mask=mask, other=0.0, eviction_policy=EVICT).to(tl.float32)
    b = tl.load(b_ptr + offs, mask=mask, other=0.0, eviction_policy=EVICT).to(tl.float32)
    y = a * _sigmoid_f32(a) * b
    tl.store(y_ptr + offs, y.to(y_ptr.dtype.element_ty), mask=mask)


SPACE = {"BLOCK": [256, 512, 1024, 2048, 4096], "num_warps": [1, 2, 4, 8, 16], "EVICT": ["", "evict_first"]}

CONSTRAINTS = [
    "layout == 'pair'",  # two inputs of the output's shape
    "32 * num_warps <= BLOCK",  # every thread has work
    "BLOCK <= 32 * 16 * num_warps",  # at most 16 values of each input a thread
]

LAUNCH = {
    "kernel": "_swiglu_kernel",
    "grid": ["cdiv(numel, BLOCK)"],
    "args": ["in0", "in1", "out0", "numel"],
    "constexprs": {"BLOCK": "BLOCK", "EVICT": "EVICT"},
    "num_warps": "num_warps",
}

"""LayerNorm with weight and bias, one program per row: ``(x - mean) / sqrt(var + eps) * w + b``.

The whole row (padded to a power of two, ``BLOCK_N``) is loaded once into registers. The
statistics are taken of the row shifted by its own mean, ``d = x - mean(x)`` (in float32, so
only near the true mean): with a large common offset (the "offset" inputs) ``mean(x**2) -
mean(x)**2`` would cancel catastrophically, while the shifted values are small and, the mean
being within a factor of two of every element there, exact. Pass 1 takes the mean of ``d``, which
recovers the rounding error of the first mean (the "corrected two-pass" algorithm); pass 2, over
the same registers, the variance of the centred values. (Shifting by the first element instead
fails when that element is an outlier: the "spikes" inputs.) Padding lanes are zeroed explicitly
(a padded 0.0 minus the shift is not zero). All math is float32, rounded once on the store.

Only the ``affine="weight_bias"`` form (``torch.nn.LayerNorm``'s default, inputs ``x, weight,
bias``) is launched by this file: the constraint below leaves the space empty for the others.
"""

import triton
import triton.language as tl

MAX_BLOCK_N = 65536  # the widest row kept in registers
MAX_VALUES_PER_THREAD = 128  # beyond this a thread's registers spill


@triton.jit
def _layernorm_row_kernel(
    x_ptr,
    w_ptr,
    b_ptr,
    y_ptr,
    x_row_stride,
    y_row_stride,
    N,
    eps,
    BLOCK_N: tl.constexpr,
    EVICT_X: tl.constexpr,  # "" (default policy) or "evict_first": x is read once
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < N
    x_row = x_ptr + row * x_row_stride
    x = tl.load(x_row + cols, mask=mask, other=0.0, eviction_policy=EVICT_X).to(tl.float32)
    shift = tl.sum(x, axis=0) / N  # padding lanes loaded as 0.0: they add nothing
    d = tl.where(mask, x - shift, 0.0)
    mean_d = tl.sum(d, axis=0) / N  # over the N real elements, not BLOCK_N
    xc = tl.where(mask, d - mean_d, 0.0)
    rstd = tl.rsqrt(tl.sum(xc * xc, axis=0) / N + eps)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    y = xc * rstd * w + b
    tl.store(y_ptr + row * y_row_stride + cols, y.to(y_ptr.dtype.element_ty), mask=mask)


SPACE = {"num_warps": [1, 2, 4, 8, 16, 32], "EVICT_X": ["", "evict_first"]}

CONSTRAINTS = [
    "affine == 'weight_bias'",  # the inputs this file launches with: x, weight, bias
    "next_power_of_two(N) <= MAX_BLOCK_N",  # the row fits in registers
    "num_warps == 1 or 32 * num_warps <= next_power_of_two(N)",  # no idle warps
    "next_power_of_two(N) <= MAX_VALUES_PER_THREAD * 32 * num_warps",  # no spilling
]

LAUNCH = {
    "kernel": "_layernorm_row_kernel",
    "grid": ["rows"],
    "args": ["in0", "in1", "in2", "out0", "row_stride(in0)", "row_stride(out0)", "N", "eps"],
    "constexprs": {"BLOCK_N": "next_power_of_two(N)", "EVICT_X": "EVICT_X"},
    "num_warps": "num_warps",
}

"""LayerNorm's kernels: the math of :mod:`kernelsmith.ops.layernorm`, one kernel a variant.

Split from the family's module (its specs, references, inputs, spaces and launchers) at the seam
a reader looks for: the module docstring of :mod:`kernelsmith.ops.layernorm` says what each
kernel computes and why (the shift by the mean of the row's first elements, the centred variance, Welford's
pass, the statistics a training forward stores); this module holds the kernels themselves, and
the jitted pieces of row math they share with :mod:`kernelsmith.ops.layernorm_backward`
(:func:`row_shift`, :func:`centred_row`, and Welford's pass: :func:`welford_start`, :func:`welford_step`,
:func:`welford_merge`). The variants' source hashes, the backward's too, cover it
(``Variant.modules``).
"""

from __future__ import annotations

import triton
import triton.language as tl

from kernelsmith.ops import _rowwise as skeleton

# =================================================================================================
# The row math the kernels share
# =================================================================================================


@triton.jit
def _affine(xhat, w_ptr, b_ptr, cols, mask, HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr):
    """xhat * weight[cols] + bias[cols] in float32, each part only when the op has it.

    ``cols`` and ``mask`` have the shape the parameters should broadcast as (``[BLOCK_N]`` for
    one row, ``[1, BLOCK_N]`` for a block of rows)."""
    y = xhat
    if HAS_WEIGHT:
        y = y * tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_BIAS:
        y = y + tl.load(b_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    return y


# How many of a row's first elements the shift averages (see row_shift). A Triton global must be
# a constexpr.
SHIFT_SPAN = tl.constexpr(64)


@triton.jit
def row_shift(x_row, N):
    """The row's shift: the float32 mean of its first ``min(N, SHIFT_SPAN)`` elements (``x_row``
    points at the row's first element).

    A value near the row's mean that every program of a row computes alike, before any pass
    over the row (the module docstring of :mod:`kernelsmith.ops.layernorm` says why the kernels
    shift). The first element alone would do for rows of a large mean, but not when it is itself
    an outlier: shifting by a spike of 1e4 puts every other element near -1e4, whose rounding
    errors then swamp the spread. (two_pass shifts by the first element and re-centres on an
    outlier instead: FAR_SHIFT.)"""
    span = tl.arange(0, SHIFT_SPAN)
    head = tl.load(x_row + span, mask=span < N, other=0.0).to(tl.float32)
    return tl.sum(head, axis=0) / tl.minimum(N, SHIFT_SPAN).to(tl.float32)


# How far, in standard deviations, the first element may lie from the row's mean before a kernel
# that shifts by it (two_pass) shifts the row again. The first pass measures it: mean(d) is the
# mean's distance from x[0] and rstd is 1 / std. Shifting by x[0] puts a rounding error of about
# half an ulp of |x[0] - mean| into every d = x - x[0]; relative to the spread that is float32's
# epsilon times |x[0] - mean| / std, so at most about 3 epsilon below the bound (row_shift's mean
# of 64 elements is typically std / 8 from the mean). A spike on x[0] lies about sqrt(N)
# standard deviations out (it dominates the row's spread too: 11 at 129 columns, 31 at 1000),
# and shifting by it cost the tolerance; above the bound the row is shifted again, by the mean
# the first pass found, whose own error (the spike's rounding errors, averaged) is a few
# epsilon of a standard deviation, and the centred values come out as accurate as with
# row_shift (checked in float32 for spikes of 2e4-3e4 at 129-8192 columns). Under normal data
# x[0] is more than three standard deviations out in 0.3% of rows: they pay a second pair of
# reductions and a reload of the row from cache.
FAR_SHIFT = tl.constexpr(3.0)


@triton.jit
def rows_shift(x_rows, row_mask, N):
    """:func:`row_shift` of a block of rows at once (``x_rows``: their first elements' pointers)."""
    span = tl.arange(0, SHIFT_SPAN)
    mask = row_mask[:, None] & (span[None, :] < N)
    head = tl.load(x_rows[:, None] + span[None, :], mask=mask, other=0.0).to(tl.float32)
    return tl.sum(head, axis=1) / tl.minimum(N, SHIFT_SPAN).to(tl.float32)


@triton.jit
def centred_row(x, shift, mask, N, eps):
    """The shifted two-pass statistics of one row held in registers (float32 ``x`` on the lanes
    of ``mask``): ``(mean(d), xc, rstd)`` with ``d = x - shift`` (the row's :func:`row_shift`)
    and ``xc = d - mean(d)``, the centred values, zero on the padding lanes."""
    # Padding lanes zeroed, so that they add nothing to the sums (a padded 0.0 minus the shift is
    # not zero).
    d = tl.where(mask, x - shift, 0.0)
    # Pass 1 (over registers): the mean of the N real elements (divide by N, not BLOCK_N).
    mean_d = tl.sum(d, axis=0) / N
    # Pass 2: the variance of the centred values, sum((x - mean)^2) / N: they are small even
    # when the mean is large, so nothing cancels. (Padding lanes re-zeroed: -mean_d there.)
    xc = tl.where(mask, d - mean_d, 0.0)
    rstd = tl.rsqrt(tl.sum(xc * xc, axis=0) / N + eps)
    return mean_d, xc, rstd


@triton.jit
def welford_start(BLOCK_N: tl.constexpr):
    """Welford's statistics before the first block: ``(lane_mean, lane_m2, blocks)``, zero."""
    return tl.zeros([BLOCK_N], dtype=tl.float32), tl.zeros([BLOCK_N], dtype=tl.float32), tl.full([], 0.0, tl.float32)


@triton.jit
def welford_step(d, mask, lane_mean, lane_m2, blocks):
    """One column block of Welford's running statistics, lane by lane: lane j sees columns j,
    j + BLOCK_N, j + 2 * BLOCK_N, ... and keeps the running mean and M2 (the sum of squared
    deviations from the mean) of their ``d`` values:

        n     <- n + 1
        delta  = d - mean
        mean  <- mean + delta / n
        M2    <- M2 + delta * (d - mean_new)

    A lane is masked only in the last block (the row's tail), so every lane still running has
    seen exactly one value a block: n is the block count ``blocks``, the same for all lanes, and
    1 / n is one scalar division a block rather than one a value. Returns the updated
    ``(lane_mean, lane_m2, blocks)``."""
    blocks += 1.0
    delta = d - lane_mean
    updated_mean = lane_mean + delta * (1.0 / blocks)
    lane_m2 = tl.where(mask, lane_m2 + delta * (d - updated_mean), lane_m2)
    lane_mean = tl.where(mask, updated_mean, lane_mean)
    return lane_mean, lane_m2, blocks


@triton.jit
def welford_merge(lane_mean, lane_m2, cols, N, eps, BLOCK_N: tl.constexpr):
    """The row's ``(mean(d), rstd)`` from the lanes' Welford statistics, merged with Chan, Golub
    & LeVeque's formula: with n_j values in lane j,

        mean = sum_j n_j * mean_j / N
        M2   = sum_j M2_j + sum_j n_j * (mean_j - mean)^2

    (the pairwise update M2_a + M2_b + delta^2 n_a n_b / n, applied to all lanes at once). Both
    sums are of same-signed terms, so again nothing cancels. Lane j (``cols``) holds N // BLOCK_N
    values, plus one if it is among the first N % BLOCK_N lanes; lanes that saw nothing (n_j = 0,
    when N < BLOCK_N) contribute nothing."""
    full_blocks = N // BLOCK_N
    lane_n = (full_blocks + (cols < N - full_blocks * BLOCK_N).to(tl.int32)).to(tl.float32)
    mean_d = tl.sum(lane_n * lane_mean, axis=0) / N
    spread = lane_mean - mean_d
    m2 = tl.sum(lane_m2, axis=0) + tl.sum(lane_n * spread * spread, axis=0)
    return mean_d, tl.rsqrt(m2 / N + eps)


# -------------------------------------------------------------------------------------------------
# Exactly centred values: LayerNorm backward's statistics on rows of cancelling spikes
#
# Take a row of a hundred values of a few units and two spikes, -1.03e4 and +1.14e4, that cancel
# to 1.08e3 (the 'spikes' stress data's): mean 10.8, std 1.5e3. In float32 each spike's
# d = x - shift is rounded at the spike's ulp (1e-3), and so is every partial sum of the row that
# holds a spike; the mean of d comes out ~1e-5 off, ten ulps of the mean itself, whatever the
# order of the sum. The centred values x - mean of the small elements (about 10 each) all carry
# that error, a relative error of ~1e-6, and so does whatever weights them: the backward's
# dw = sum(dy * xhat) is ruled by the elements where dy is large, which need not be the spikes.
# (Norm-wise xhat is still right to float32 rounding: its error is a fraction eps * sum|d| / N of
# the spread. It is the small elements' own relative accuracy that is lost.) Shifting the row
# again by the mean found (as two_pass does for an outlier x[0]) does not help: the spikes are as
# far from any shift. A shift far from the mean (row_shift's mean of the first elements, when a
# spike is among them) does the same to every row's partial sums, spike or not.
#
# The helpers below keep what float32 rounding loses, exactly, with Knuth's TwoSum (two_sum): d and
# its rounding error (shifted), then the sum of both as a compensated sum (a sum and the rounding
# errors of its additions, summed beside it: compensated_mean, which gives the mean as a float
# and its rest), then the centred values from all four (centred). The mean of d is then within
# about an ulp (the compensated
# sum is off by about half an ulp of the sum, plus (levels * eps)^2 * sum|d| for a tree `levels`
# additions deep, the errors' own float32 sum: under an ulp unless the row cancels more than some
# 1e5-fold, sum|d| / |sum d|, 20-fold above), and each centred value is rounded at its own ulp,
# not at the spikes' or the shift's. TwoSum needs only round-to-nearest additions, no ordering of
# the operands by magnitude and no branch, so any reduction tree Triton picks (and the
# interpreter's left-to-right fold) is as good; the compiler keeps IEEE addition (no
# reassociation; TwoSum has no product that could be fused into an FMA). Finite values only: a sum
# that overflows gives NaN where a plain sum gives inf, and a row that large has long overflowed
# its squares (the variance) anyway.
#
# What it costs: nothing in memory, about 14 more float additions an element (5 for d's error, 7
# in the mean's reduction, which carries two floats a step instead of one, 2 for the centred
# value). The backward's callers say where they pay it (layernorm_backward's module docstring).


@triton.jit
def two_sum(a, b):
    """``a + b`` rounded, and that rounding's error, exactly: ``a + b == total + error`` in real
    numbers (Knuth's TwoSum: six additions, any magnitudes, no branch)."""
    total = a + b
    b_kept = total - a  # the part of b that total holds ...
    a_kept = total - b_kept  # ... and the part of a
    error = (a - a_kept) + (b - b_kept)  # what each lost, both exact
    return total, error


@triton.jit
def shifted(x, shift, mask):
    """``(d, error)``: ``d = x - shift`` rounded and its rounding error (``d + error == x - shift``
    exactly), both zero off ``mask`` (a padded 0.0 minus the shift is not zero)."""
    d, error = two_sum(x, -shift)
    return tl.where(mask, d, 0.0), tl.where(mask, error, 0.0)


@triton.jit
def centred(d, error, mean_d, mean_d_error, mask):
    """The centred values ``x - shift - mean(d)`` from :func:`shifted`'s ``(d, error)`` and the
    mean as :func:`compensated_mean` gives it (``mean_d + mean_d_error``): rounded about once at
    their own ulp, not at d's or the mean's, which are large when the shift is far from the mean
    (a spike among the elements row_shift averages). ``d - mean_d`` is exact where the two are
    within a factor 2 of each other (Sterbenz), as on the small elements of such a row. Zero off
    ``mask``."""
    return tl.where(mask, (d - mean_d) + (error - mean_d_error), 0.0)


@triton.jit
def _compensated_combine(total_a, error_a, total_b, error_b):
    """Two partial compensated sums added: the totals by TwoSum, the errors in float32."""
    total, rounding = two_sum(total_a, total_b)
    return total, (error_a + error_b) + rounding


@triton.jit
def compensated_mean(totals, errors, N):
    """The mean over axis 0 of ``totals + errors`` (values and their errors, or running sums and
    their accumulated rounding errors) from one compensated tree: 8 additions an element where
    tl.sum costs 1, and two floats a step across threads. Divided by ``N`` correctly rounded
    (``div_rn``: a plain ``/`` compiles to an approximate division on NVIDIA GPUs, 2 ulps, more
    than the sum's own error). In the interpreter a custom reduction runs element by element
    (~0.2 ms an element): the kernels call it once a row, on the rows that need it.

    Returns the mean as two floats, ``(mean, error)``: the correctly rounded mean and the rest of
    it, so that a caller subtracting it from values near the mean loses nothing to the mean's own
    rounding (an ulp of |shift - mean|, which a dragged shift makes large)."""
    total, error = tl.reduce((totals, errors), 0, _compensated_combine)
    total, error = two_sum(total, error)  # the float nearest the sum, and the rest
    n = tl.cast(N, tl.float32)
    mean = tl.math.div_rn(total, n)
    # The division's remainder, total - mean * n, is a float when mean is total / n correctly
    # rounded: one FMA computes it exactly. With the sum's rest, divided by n, it is the mean's
    # rest (which needs only a few correct bits).
    remainder = tl.fma(-mean, n, total) + error
    return mean, remainder / n


@triton.jit
def exactly_centred_row(x, shift, mask, N, eps):
    """:func:`centred_row`'s ``(mean(d), xc, rstd)`` with the mean and the centred values from
    the exact d (above): accurate to their own rounding on rows of cancelling spikes too.
    (centred_row, the forward's, is left as its kernels were timed: the forward's y is weighted
    by the weight alone, where the plain mean's error is a norm-wise rounding.)"""
    d, error = shifted(x, shift, mask)
    mean_d, mean_d_error = compensated_mean(d, error, N)
    xc = centred(d, error, mean_d, mean_d_error, mask)
    # The variance of the centred values, as centred_row's pass 2: nothing cancels there.
    rstd = tl.rsqrt(tl.sum(xc * xc, axis=0) / N + eps)
    return mean_d, xc, rstd


@triton.jit
def _store_stats(mean_ptr, rstd_ptr, rows, shift, mean_d, rstd, mask, STORE_STATS: tl.constexpr):
    """The rows' mean (``shift + mean(d)``) and rstd, float32, when the launch asks for them (a
    training forward)."""
    if STORE_STATS:
        tl.store(mean_ptr + rows, shift + mean_d, mask=mask)
        tl.store(rstd_ptr + rows, rstd, mask=mask)


# =================================================================================================
# Kernels
#
# Every kernel takes the tensors (x, weight, bias, y, mean, rstd), then the row strides of x and y
# (not aligned_row, which addresses rows from N), n_rows where a program owns several rows, N and
# eps, then its constexprs. x and y are (rows, N) matrices with unit column stride. weight and
# bias are contiguous (N,) vectors, read only under HAS_WEIGHT and HAS_BIAS (placeholders
# otherwise). mean_ptr and rstd_ptr are float32 (rows,) vectors, written only when STORE_STATS is
# set (otherwise they are placeholders).
# =================================================================================================


@triton.jit
def _layernorm_two_pass_kernel(
    x_ptr, w_ptr, b_ptr, y_ptr, mean_ptr, rstd_ptr, x_row_stride, y_row_stride, N, eps,
    HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr, STORE_STATS: tl.constexpr,
    BLOCK_N: tl.constexpr,  # next_power_of_two(N): the whole row in one block
    EVICT_X: tl.constexpr,  # "" or "evict_first": x is read once, so it need not stay in L2
):
    """One program normalises one row held entirely in registers (BLOCK_N >= N)."""
    eps = tl.cast(eps, tl.float32)  # float32 math even where Inductor passes a Python float as fp64
    row = tl.program_id(0).to(tl.int64)  # 64-bit, so that row * stride cannot overflow
    cols = tl.arange(0, BLOCK_N)
    mask = cols < N

    x_row = x_ptr + row * x_row_stride
    x = tl.load(x_row + cols, mask=mask, other=0.0, eviction_policy=EVICT_X).to(tl.float32)
    # d = x - shift (see the module docstring), shifted by the row's first element: a scalar every
    # thread loads for itself, so the statistics start as soon as the row is in (row_shift's mean
    # of 64 elements is a third block-wide reduction, whose load and barriers come first).
    shift = tl.load(x_row).to(tl.float32)
    mean_d, xc, rstd = centred_row(x, shift, mask, N, eps)
    if tl.abs(mean_d) * rstd > FAR_SHIFT:
        # x[0] is an outlier (see FAR_SHIFT): once more, shifted by the mean just found, a
        # small fraction of a standard deviation from the true one. The row is reloaded (from
        # cache) rather than kept in registers through the first pass.
        shift += mean_d
        x = tl.load(x_row + cols, mask=mask, other=0.0).to(tl.float32)
        mean_d, xc, rstd = centred_row(x, shift, mask, N, eps)

    y = _affine(xc * rstd, w_ptr, b_ptr, cols, mask, HAS_WEIGHT, HAS_BIAS)  # float32, rounded once
    tl.store(y_ptr + row * y_row_stride + cols, y.to(y_ptr.dtype.element_ty), mask=mask)
    _store_stats(mean_ptr, rstd_ptr, row, shift, mean_d, rstd, None, STORE_STATS)


@triton.jit
def _layernorm_aligned_row_kernel(
    x_ptr, w_ptr, b_ptr, y_ptr, mean_ptr, rstd_ptr, N, eps,
    HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr, STORE_STATS: tl.constexpr,
    BLOCK_N: tl.constexpr, EVICT_X: tl.constexpr, ALIGN: tl.constexpr,  # two_pass's, and elements in 16 bytes
):
    """two_pass on a row cut into an aligned body and a head and tail (``skeleton.row_pieces``),
    so that the body's loads and stores are 16-byte vectors whatever the width: the same shift,
    mean and centred variance, each a sum over both pieces."""
    eps = tl.cast(eps, tl.float32)  # float32 math even where Inductor passes a Python float as fp64
    row = tl.program_id(0).to(tl.int64)
    row_start = row * N
    body, body_mask, edge, edge_mask = skeleton.row_pieces(row_start, N, 0, BLOCK_N, ALIGN)
    shift = row_shift(x_ptr + row_start, N)
    x = tl.load(x_ptr + body, mask=body_mask, other=0.0, eviction_policy=EVICT_X).to(tl.float32)
    x_edge = tl.load(x_ptr + edge, mask=edge_mask, other=0.0).to(tl.float32)
    d = tl.where(body_mask, x - shift, 0.0)
    d_edge = tl.where(edge_mask, x_edge - shift, 0.0)
    mean_d = (tl.sum(d, axis=0) + tl.sum(d_edge, axis=0)) / N
    xc = tl.where(body_mask, d - mean_d, 0.0)
    xc_edge = tl.where(edge_mask, d_edge - mean_d, 0.0)
    rstd = tl.rsqrt((tl.sum(xc * xc, axis=0) + tl.sum(xc_edge * xc_edge, axis=0)) / N + eps)
    y = _affine(xc * rstd, w_ptr, b_ptr, body - row_start, body_mask, HAS_WEIGHT, HAS_BIAS)
    tl.store(y_ptr + body, y.to(y_ptr.dtype.element_ty), mask=body_mask)
    y_edge = _affine(xc_edge * rstd, w_ptr, b_ptr, edge - row_start, edge_mask, HAS_WEIGHT, HAS_BIAS)
    tl.store(y_ptr + edge, y_edge.to(y_ptr.dtype.element_ty), mask=edge_mask)
    _store_stats(mean_ptr, rstd_ptr, row, shift, mean_d, rstd, None, STORE_STATS)


@triton.jit
def _layernorm_welford_kernel(
    x_ptr, w_ptr, b_ptr, y_ptr, mean_ptr, rstd_ptr, x_row_stride, y_row_stride, N, eps,
    HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr, STORE_STATS: tl.constexpr,
    BLOCK_N: tl.constexpr,  # columns per loop step; N need not be a multiple of it
    NUM_STAGES: tl.constexpr,  # software-pipelining depth of both loops (1: none)
):
    """One program normalises one row: a Welford pass for the statistics, then a normalising
    pass, both over column blocks of BLOCK_N."""
    eps = tl.cast(eps, tl.float32)  # float32 math even where Inductor passes a Python float as fp64
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * x_row_stride
    y_row = y_ptr + row * y_row_stride
    cols = tl.arange(0, BLOCK_N)

    # The statistics are those of d = x - shift, the row shifted by the mean of its first
    # elements (row_shift; see the module docstring); the variance is the same, the mean is
    # shift + mean(d).
    shift = row_shift(x_row, N)

    # Pass 1: every lane keeps Welford's running statistics of the d values it sees, then the
    # lanes are merged (Chan): both in the helpers above.
    lane_mean, lane_m2, blocks = welford_start(BLOCK_N)
    for start in tl.range(0, N, BLOCK_N, num_stages=NUM_STAGES):
        offs = start + cols
        mask = offs < N
        d = tl.load(x_row + offs, mask=mask, other=0.0).to(tl.float32) - shift
        lane_mean, lane_m2, blocks = welford_step(d, mask, lane_mean, lane_m2, blocks)
    mean_d, rstd = welford_merge(lane_mean, lane_m2, cols, N, eps, BLOCK_N)

    # Pass 2: read the row again (now mostly from L2), normalise, store.
    for start in tl.range(0, N, BLOCK_N, num_stages=NUM_STAGES):
        offs = start + cols
        mask = offs < N
        d = tl.load(x_row + offs, mask=mask, other=0.0).to(tl.float32) - shift
        # (Padding lanes are zeroed: their value could overflow float16, harmless but noisy.)
        xhat = tl.where(mask, d - mean_d, 0.0) * rstd
        y = _affine(xhat, w_ptr, b_ptr, offs, mask, HAS_WEIGHT, HAS_BIAS)
        tl.store(y_row + offs, y.to(y_ptr.dtype.element_ty), mask=mask)
    _store_stats(mean_ptr, rstd_ptr, row, shift, mean_d, rstd, None, STORE_STATS)


@triton.jit
def _layernorm_multi_row_kernel(
    x_ptr, w_ptr, b_ptr, y_ptr, mean_ptr, rstd_ptr, x_row_stride, y_row_stride, n_rows, N, eps,
    HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr, STORE_STATS: tl.constexpr,
    ROWS: tl.constexpr, BLOCK_N: tl.constexpr,  # rows per program; next_power_of_two(N)
):
    """One program normalises ROWS consecutive rows as a [ROWS, BLOCK_N] block."""
    eps = tl.cast(eps, tl.float32)  # float32 math even where Inductor passes a Python float as fp64
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK_N)
    row_mask = rows < n_rows  # the last program may run past the final row
    col_mask = cols < N
    mask = row_mask[:, None] & col_mask[None, :]

    rows64 = rows.to(tl.int64)
    x_rows = x_ptr + rows64 * x_row_stride  # [ROWS] pointers to each row's first element
    x = tl.load(x_rows[:, None] + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    # centred_row's recipe, one shift, mean and variance per row (reductions along axis 1). Rows
    # past the end load zeros: variance 0, rstd = 1/sqrt(eps); never stored.
    shift = rows_shift(x_rows, row_mask, N)
    d = tl.where(mask, x - shift[:, None], 0.0)
    mean_d = tl.sum(d, axis=1) / N
    xc = tl.where(mask, d - mean_d[:, None], 0.0)
    rstd = tl.rsqrt(tl.sum(xc * xc, axis=1) / N + eps)

    # The parameters are shared by the block's rows: loaded once as [1, BLOCK_N], broadcast.
    y = _affine(xc * rstd[:, None], w_ptr, b_ptr, cols[None, :], col_mask[None, :], HAS_WEIGHT, HAS_BIAS)
    tl.store(y_ptr + rows64[:, None] * y_row_stride + cols[None, :], y.to(y_ptr.dtype.element_ty), mask=mask)
    _store_stats(mean_ptr, rstd_ptr, rows64, shift, mean_d, rstd, row_mask, STORE_STATS)


@triton.jit
def _layernorm_persistent_kernel(
    x_ptr, w_ptr, b_ptr, y_ptr, mean_ptr, rstd_ptr, x_row_stride, y_row_stride, n_rows, N, eps,
    HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr, STORE_STATS: tl.constexpr,
    BLOCK_N: tl.constexpr,  # next_power_of_two(N)
    NUM_STAGES: tl.constexpr,  # software-pipelining depth of the row loop (1: none)
):
    """A fixed grid of programs; each loads the parameters once, then normalises rows
    pid, pid + num_programs, pid + 2 * num_programs, ... (a grid-stride loop)."""
    eps = tl.cast(eps, tl.float32)  # float32 math even where Inductor passes a Python float as fp64
    cols = tl.arange(0, BLOCK_N)
    mask = cols < N
    if HAS_WEIGHT:
        w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_BIAS:
        b = tl.load(b_ptr + cols, mask=mask, other=0.0).to(tl.float32)

    for row in tl.range(tl.program_id(0), n_rows, tl.num_programs(0), num_stages=NUM_STAGES):
        row64 = tl.cast(row, tl.int64)  # (tl.cast: in the interpreter, row is a Python int)
        x_row = x_ptr + row64 * x_row_stride
        x = tl.load(x_row + cols, mask=mask, other=0.0).to(tl.float32)
        shift = row_shift(x_row, N)
        mean_d, xc, rstd = centred_row(x, shift, mask, N, eps)
        y = xc * rstd
        if HAS_WEIGHT:
            y = y * w
        if HAS_BIAS:
            y = y + b
        tl.store(y_ptr + row64 * y_row_stride + cols, y.to(y_ptr.dtype.element_ty), mask=mask)
        _store_stats(mean_ptr, rstd_ptr, row64, shift, mean_d, rstd, None, STORE_STATS)

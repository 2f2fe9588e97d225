"""The kernels of the cross-entropy families: the forward (:mod:`kernelsmith.ops.cross_entropy`),
its backward and the fused loss-and-gradient (:mod:`kernelsmith.ops.cross_entropy_backward`),
whose docstrings explain the math and the variants. Their spaces and launchers are in
:mod:`kernelsmith.ops._cross_entropy_launch`; the linear + cross-entropy families reuse the row
loss, the merge of split statistics, the "mean" count and the row-gradient kernel.

The three ops share one way of reading a row: its max ``m`` and ``s = sum exp(x - m)`` (online,
:func:`_ce_online_stats`, or from registers, :func:`_ce_whole_row_stats`), the target's logit in
one scalar load (:func:`_ce_target_logit`), and the row loss from those (:func:`_ce_row_loss`);
a row read in chunks by several programs gets ``m`` and ``s`` back from the chunks' own
(:func:`_ce_merge_chunks`).
The gradient kernels then write ``(exp(x - m) / s - eps / V - [j == t](1 - eps)) * scale`` from
the row's factors (:func:`_ceb_row_factors`), over column blocks (:func:`_ceb_write_grad`) or
from the registers still holding the row.
"""

from __future__ import annotations

import triton
import triton.language as tl

# =================================================================================================
# Conventions: logits are a (R, V) matrix with unit column stride and its row stride passed
# explicitly (the gradient's too); row offsets are 64-bit (``row * stride`` can pass 2**31 at
# 8192 x 128256); column offsets stay 32-bit (V < 2**31). Masked logit lanes load -inf: they never
# win the max and add exp(-inf) = 0 to the sums. Every value is converted to float32 right after
# its load.
# =================================================================================================

# ---- what every kernel of a row shares -----------------------------------------------------------


@triton.jit
def _ce_row_loss(m, s, x_t, sum_x, n_cols, smoothing, valid, SMOOTH: tl.constexpr):
    """The loss of rows with max ``m``, ``s = sum exp(x - m)``, target logit ``x_t`` and (when
    SMOOTH) logit sum ``sum_x``: ``log(s) + (1 - eps)(m - x_t) + eps (m - sum_x / V)``.

    Ignored rows (``valid`` false) give 0; their statistics are replaced by harmless values first
    so that not even a discarded lane computes log(0) or inf - inf.
    """
    m = tl.where(valid, m, 0.0)
    s = tl.where(valid, s, 1.0)
    x_t = tl.where(valid, x_t, 0.0)
    # log(1) is exactly 0 (not the GPU's approximate log at 1): a confident, right row (whose
    # float32 sum of exponentials rounds to 1) then loses exactly 0, as PyTorch computes it.
    log_s = tl.where(s == 1.0, 0.0, tl.log(s))
    loss = log_s + (m - x_t)
    if SMOOTH:
        loss = log_s + (1.0 - smoothing) * (m - x_t) + smoothing * (m - sum_x / n_cols)
    return tl.where(valid, loss, 0.0)


@triton.jit
def _ce_program_row(x_ptr, t_ptr, x_row_stride, ignore_index):
    """``(row, x_row, target, valid)``: this program's row (``program_id(0)``, 64-bit), the start
    of its logits, its target, and whether it counts (its target is not ``ignore_index``)."""
    row = tl.program_id(0).to(tl.int64)
    target = tl.load(t_ptr + row)
    return row, x_ptr + row * x_row_stride, target, target != ignore_index


@triton.jit
def _ce_program_rows(t_ptr, n_rows, ignore_index, ROWS: tl.constexpr):
    """``(rows64, row_mask, target, valid)``: the ``ROWS`` rows of this program (block
    ``program_id(0)``, 64-bit), which of them exist, their targets (0 past the end) and which
    count (they exist and their target is not ``ignore_index``)."""
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    row_mask = rows < n_rows
    rows64 = rows.to(tl.int64)
    target = tl.load(t_ptr + rows64, mask=row_mask, other=0)
    return rows64, row_mask, target, row_mask & (target != ignore_index)


@triton.jit
def _ce_tanh(x):
    """tanh of a float32 tensor (``tl.math`` lacks it): Taylor to x**9 below |x| < 1/4, else
    (1 - e) / (1 + e) with e = exp(-2|x|) <= 1 (no overflow, and no cancellation in 1 - e)."""
    ax = tl.abs(x)
    e = tl.exp(-2.0 * ax)
    far = (1.0 - e) / (1.0 + e)
    x2 = x * x
    near = ax * (1.0 + x2 * (-1.0 / 3.0 + x2 * (2.0 / 15.0 + x2 * (-17.0 / 315.0 + x2 * (62.0 / 2835.0)))))
    t = tl.where(ax < 0.25, near, far)
    return tl.where(x < 0, -t, t)


@triton.jit
def _ce_soft_capped(x, keep, softcap, CAP_INPUT: tl.constexpr):
    """The float32 logits ``x`` as loaded, or with CAP_INPUT soft-capped, ``c tanh(x / c)``
    (linear + cross-entropy's chunks of raw ``h @ W.T`` logits), the lanes outside ``keep`` put
    back to -inf (tanh would turn a masked -inf into -c)."""
    if CAP_INPUT:
        x = tl.where(keep, softcap * _ce_tanh(x / softcap), float("-inf"))
    return x


@triton.jit
def _ce_target_logit(x_row, target, valid, n_cols, softcap=1.0, CAP_INPUT: tl.constexpr = False):
    """``x[t]`` in one scalar load a row (cheaper than a compare-and-select on every element),
    in float32 (soft-capped with CAP_INPUT, :func:`_ce_soft_capped`); NaN for an out-of-range
    target (never an out-of-bounds read). ``x_row`` and ``target`` may be vectors (several rows)."""
    in_range = (target >= 0) & (target < n_cols)
    x_t = tl.load(x_row + tl.where(in_range, target, 0), mask=valid & in_range, other=float("nan"))
    return _ce_soft_capped(x_t.to(tl.float32), True, softcap, CAP_INPUT)  # (NaN stays NaN)


@triton.jit
def _ce_online_stats(
    x_row, lo, hi, n_cols, BLOCK_V: tl.constexpr, SMOOTH: tl.constexpr, NUM_STAGES: tl.constexpr,
    softcap=1.0, CAP_INPUT: tl.constexpr = False,
):  # fmt: skip
    """``(m, s, sum_x)`` of the columns ``[lo, hi)`` of the row at ``x_row``, in ``BLOCK_V``-wide
    steps (``hi <= lo`` reads nothing and gives ``(-inf, 0, 0)``): their max ``m``, the sum ``s``
    of ``exp(x - m)``, and (when SMOOTH, else 0) the sum of the logits. Columns at or past
    ``n_cols`` are masked. With CAP_INPUT the logits are soft-capped as they are read
    (:func:`_ce_soft_capped`).

    The online softmax statistics: the running max m (one number) and l = sum exp(x - m) kept as
    BLOCK_V lane partials, added up once after the loop (more accurate than one running total,
    and one cross-lane reduction a step instead of two). When a step raises the max from m to
    m_new, l is rescaled by exp(m - m_new) <= 1.
    """
    cols = tl.arange(0, BLOCK_V)
    m = tl.full([], float("-inf"), tl.float32)
    l = tl.zeros([BLOCK_V], tl.float32)
    sx = tl.zeros([BLOCK_V], tl.float32)
    for start in tl.range(lo, hi, BLOCK_V, num_stages=NUM_STAGES):
        offs = start + cols
        mask = offs < n_cols
        x = tl.load(x_row + offs, mask=mask, other=float("-inf")).to(tl.float32)
        x = _ce_soft_capped(x, mask, softcap, CAP_INPUT)
        m_new = tl.maximum(m, tl.max(x, axis=0))
        # While every logit seen is -inf (a masked-out prefix of the vocabulary), m_new is -inf:
        # shift by 0 instead, so that exp(-inf - 0) = 0 rather than exp(-inf + inf) = NaN.
        shift = tl.where(m_new == float("-inf"), 0.0, m_new)
        # Exactly 1 when the max did not move (not the GPU's approximate exp(0) at every step).
        alpha = tl.where(m_new == m, 1.0, tl.exp(m - shift))
        l = l * alpha + tl.exp(x - shift)
        m = m_new
        if SMOOTH:
            sx += tl.where(mask, x, 0.0)
    sum_x = 0.0
    if SMOOTH:
        sum_x = tl.sum(sx, axis=0)
    return m, tl.sum(l, axis=0), sum_x


@triton.jit
def _ce_whole_row_stats(x_row, n_cols, valid, BLOCK_V: tl.constexpr, SMOOTH: tl.constexpr, EVICT_X: tl.constexpr):
    """The whole row (``BLOCK_V >= n_cols`` lanes) in registers: ``(cols, m, e, s, sum_x)``, its
    lanes, max, ``e = exp(x - m)`` by lane, ``s = sum e`` and (when SMOOTH, else 0) the sum of
    the logits. An ignored row (``valid`` false) loads nothing: all -inf, so e = exp(-inf - 0) = 0."""
    cols = tl.arange(0, BLOCK_V)
    # (A bound rather than `& valid`: the interpreter turns a scalar-and-vector `&` into an int32
    # mask that tl.load rejects.)
    mask = cols < tl.where(valid, n_cols, 0)
    x = tl.load(x_row + cols, mask=mask, other=float("-inf"), eviction_policy=EVICT_X).to(tl.float32)
    m = tl.max(x, axis=0)
    e = tl.exp(x - tl.where(valid, m, 0.0))
    sum_x = 0.0
    if SMOOTH:
        sum_x = tl.sum(tl.where(mask, x, 0.0), axis=0)
    return cols, m, e, tl.sum(e, axis=0), sum_x


@triton.jit
def _ce_merge_chunks(
    stats_ptr, rows64, row_mask, valid, n_chunks, plane_stride,
    CHUNKS: tl.constexpr, SUM_PLANE: tl.constexpr, SMOOTH: tl.constexpr,
):  # fmt: skip
    """``(m, s, sum_x, at, mask)`` of rows whose logits were reduced in ``n_chunks`` chunks
    (:func:`_ce_online_stats` over each, or a tile loop), from the float32 planes of
    ``stats_ptr``, each ``(R, n_chunks)`` and ``plane_stride`` apart: plane 0 the chunks' max,
    plane 1 their sum of ``exp(x - max)``, plane ``SUM_PLANE`` (read when SMOOTH, else 0) their
    sum of logits. ``at`` and ``mask`` address the ``[ROWS, CHUNKS]`` statistics of the rows, for
    a caller with more planes (``CHUNKS`` is ``n_chunks`` padded to a power of two).

    Each chunk's sum was taken against its own max: it is rescaled to the row's. (Chunks that saw
    only -inf, and the padding, have m_c = -inf and s_c = 0: they add exp(-inf) * 0 = 0.)"""
    chunks = tl.arange(0, CHUNKS)
    at = rows64[:, None] * n_chunks + chunks[None, :]
    mask = row_mask[:, None] & (chunks < n_chunks)[None, :]
    m_c = tl.load(stats_ptr + at, mask=mask, other=float("-inf"))
    s_c = tl.load(stats_ptr + plane_stride + at, mask=mask, other=0.0)
    m = tl.max(m_c, axis=1)
    shift = tl.where(valid, m, 0.0)
    s = tl.sum(s_c * tl.exp(m_c - shift[:, None]), axis=1)
    sum_x = 0.0
    if SMOOTH:
        sum_x = tl.sum(tl.load(stats_ptr + SUM_PLANE * plane_stride + at, mask=mask, other=0.0), axis=1)
    return m, s, sum_x, at, mask


# ---- the forward ---------------------------------------------------------------------------------


@triton.jit
def _ce_online_row_kernel(
    x_ptr, t_ptr,
    loss_ptr,  # (R,) float32: the output ("none") or the scratch the reduction kernel sums
    x_row_stride, n_cols, ignore_index, smoothing,
    BLOCK_V: tl.constexpr,  # columns per loop step
    SMOOTH: tl.constexpr,  # label_smoothing > 0: also accumulate the sum of the logits
    NUM_STAGES: tl.constexpr,  # software-pipelining depth of the loop (1: none)
):  # fmt: skip
    smoothing = tl.cast(smoothing, tl.float32)  # float32 math even where Inductor passes a Python float as fp64
    row, x_row, target, valid = _ce_program_row(x_ptr, t_ptr, x_row_stride, ignore_index)
    x_t = _ce_target_logit(x_row, target, valid, n_cols)

    n_read = tl.where(valid, n_cols, 0)  # an ignored row reads nothing
    m, s, sum_x = _ce_online_stats(x_row, 0, n_read, n_cols, BLOCK_V, SMOOTH, NUM_STAGES)
    tl.store(loss_ptr + row, _ce_row_loss(m, s, x_t, sum_x, n_cols, smoothing, valid, SMOOTH))


@triton.jit
def _ce_whole_row_kernel(
    x_ptr, t_ptr, loss_ptr, x_row_stride, n_cols, ignore_index, smoothing,  # as _ce_online_row_kernel's
    BLOCK_V: tl.constexpr,  # next_power_of_two(V): the whole row in one block
    SMOOTH: tl.constexpr,
    EVICT_X: tl.constexpr,  # "" or "evict_first": the logits are read once
):  # fmt: skip
    smoothing = tl.cast(smoothing, tl.float32)  # float32 math even where Inductor passes a Python float as fp64
    row, x_row, target, valid = _ce_program_row(x_ptr, t_ptr, x_row_stride, ignore_index)
    x_t = _ce_target_logit(x_row, target, valid, n_cols)
    _, m, _, s, sum_x = _ce_whole_row_stats(x_row, n_cols, valid, BLOCK_V, SMOOTH, EVICT_X)
    tl.store(loss_ptr + row, _ce_row_loss(m, s, x_t, sum_x, n_cols, smoothing, valid, SMOOTH))


@triton.jit
def _ce_split_partial_kernel(
    x_ptr, t_ptr,
    stats_ptr,  # (2 or 3, R, n_chunks) float32: chunk max, chunk sum of exp(x - max), chunk sum of x
    x_row_stride, n_cols, n_chunks,
    chunk_cols,  # columns per chunk, a multiple of BLOCK_V
    plane_stride,  # R * n_chunks
    ignore_index,
    BLOCK_V: tl.constexpr, SMOOTH: tl.constexpr, NUM_STAGES: tl.constexpr,
):  # fmt: skip
    row, x_row, _, valid = _ce_program_row(x_ptr, t_ptr, x_row_stride, ignore_index)
    chunk = tl.program_id(1)

    lo = chunk * chunk_cols
    hi = tl.where(valid, tl.minimum(lo + chunk_cols, n_cols), lo)  # an ignored row reads nothing
    m, s, sum_x = _ce_online_stats(x_row, lo, hi, n_cols, BLOCK_V, SMOOTH, NUM_STAGES)

    at = row * n_chunks + chunk
    tl.store(stats_ptr + at, m)
    tl.store(stats_ptr + plane_stride + at, s)
    if SMOOTH:
        tl.store(stats_ptr + 2 * plane_stride + at, sum_x)


@triton.jit
def _ce_split_combine_kernel(
    x_ptr, t_ptr, stats_ptr,
    out_ptr,  # REDUCE 0: (R,) per-row losses; else the 0-d output
    x_row_stride, n_rows, n_cols, n_chunks, plane_stride, ignore_index, smoothing,
    ROWS: tl.constexpr,  # rows per program
    CHUNKS: tl.constexpr,  # next_power_of_two(n_chunks)
    SMOOTH: tl.constexpr,
    REDUCE: tl.constexpr,  # 0: write per-row losses; 1: their sum; 2: their mean (grid of 1)
):  # fmt: skip
    smoothing = tl.cast(smoothing, tl.float32)  # float32 math even where Inductor passes a Python float as fp64
    rows64, row_mask, target, valid = _ce_program_rows(t_ptr, n_rows, ignore_index, ROWS)
    x_t = _ce_target_logit(x_ptr + rows64 * x_row_stride, target, valid, n_cols)
    m, s, sum_x, _, _ = _ce_merge_chunks(stats_ptr, rows64, row_mask, valid, n_chunks, plane_stride, CHUNKS, 2, SMOOTH)
    loss = _ce_row_loss(m, s, x_t, sum_x, n_cols, smoothing, valid, SMOOTH)

    if REDUCE == 0:
        tl.store(out_ptr + rows64, loss, mask=row_mask)
    else:
        total = tl.sum(loss.to(tl.float64), axis=0)
        if REDUCE == 2:
            count = tl.sum(valid.to(tl.int32), axis=0)
            total = tl.where(count > 0, total / tl.maximum(count, 1).to(tl.float64), float("nan"))
        tl.store(out_ptr, total.to(tl.float32))


@triton.jit
def _ce_reduce_kernel(
    loss_ptr,  # (R,) float32 per-row losses (0 for ignored rows)
    t_ptr,
    out_ptr,  # the 0-d float32 output
    n_rows, ignore_index,
    MEAN: tl.constexpr,  # divide by the number of non-ignored rows (NaN when there is none)
    BLOCK_R: tl.constexpr,
):  # fmt: skip
    """One program sums the per-row losses in a fixed order (lane partials, then a tree), in
    float64: the same bits on every run, and one rounding at the end."""
    offs0 = tl.arange(0, BLOCK_R)
    total = tl.zeros([BLOCK_R], tl.float64)
    count = tl.zeros([BLOCK_R], tl.int32)
    for start in tl.range(0, n_rows, BLOCK_R):
        offs = start + offs0
        mask = offs < n_rows
        total += tl.load(loss_ptr + offs, mask=mask, other=0.0).to(tl.float64)
        if MEAN:
            target = tl.load(t_ptr + offs, mask=mask, other=0)
            count += (mask & (target != ignore_index)).to(tl.int32)
    result = tl.sum(total, axis=0)
    if MEAN:
        n = tl.sum(count, axis=0)
        result = tl.where(n > 0, result / tl.maximum(n, 1).to(tl.float64), float("nan"))
    tl.store(out_ptr, result.to(tl.float32))


# ---- the gradient (backward and fused) -----------------------------------------------------------


@triton.jit
def _ceb_mean_scale_kernel(
    dloss_ptr,  # the 0-d float32 upstream gradient (unused when UNIT)
    t_ptr,
    scale_ptr,  # (1,) float32 scratch: dloss / n_valid
    n_rows, ignore_index,
    UNIT: tl.constexpr,  # an upstream gradient of 1 (the fused op)
    BLOCK_R: tl.constexpr,
):  # fmt: skip
    """The "mean" scale ``dloss / n_valid`` (one program; an exact integer count)."""
    offs0 = tl.arange(0, BLOCK_R)
    count = tl.zeros([BLOCK_R], tl.int32)
    for start in tl.range(0, n_rows, BLOCK_R):
        offs = start + offs0
        mask = offs < n_rows
        target = tl.load(t_ptr + offs, mask=mask, other=0)
        count += (mask & (target != ignore_index)).to(tl.int32)
    n_valid = tl.maximum(tl.sum(count, axis=0), 1)  # 0 only when no row will read the scale
    upstream = 1.0 if UNIT else tl.load(dloss_ptr).to(tl.float32)
    tl.store(scale_ptr, upstream / n_valid.to(tl.float32))


@triton.jit
def _ceb_row_factors(scale_ptr, row, target, valid, m, s, n_cols, smoothing, SCALE: tl.constexpr):
    """What a row's gradient needs: ``(shift, inv_s, off, on, t32, scale)`` such that

        dlogits[j] = (exp(x[j] - shift) * inv_s - off - (on if j == t32 else 0)) * scale

    with ``inv_s = 1 / s``, ``off = eps / V`` and ``on = 1 - eps``. The scale multiplies last,
    so that a gradient that is exactly 0 (a vocabulary of one: ``(1 - eps) - (1 - eps)``) stays
    exactly 0, as PyTorch computes it. An ignored row gets zeros for every factor (its loads
    are masked to -inf and exp(-inf - 0) = 0: +0 everywhere, and nothing computes NaN); an
    out-of-range target a NaN scale.
    """
    if SCALE == 0:
        scale = tl.load(scale_ptr).to(tl.float32)
    elif SCALE == 1:
        scale = tl.load(scale_ptr + row).to(tl.float32)
    else:
        scale = 1.0
    in_range = (target >= 0) & (target < n_cols)
    scale = tl.where(valid, tl.where(in_range, scale, float("nan")), 0.0)
    shift = tl.where(valid, m, 0.0)
    inv_s = tl.where(valid, 1.0 / tl.where(valid, s, 1.0), 0.0)
    off = tl.where(valid, smoothing / n_cols, 0.0)
    on = tl.where(valid, 1.0 - smoothing, 0.0)
    t32 = tl.where(in_range, target, -1).to(tl.int32)  # never equal to a column when out of range
    return shift, inv_s, off, on, t32, scale


@triton.jit
def _ceb_write_grad(
    x_row, dx_row, lo, hi,
    n_read,  # the row's readable columns: n_cols, or 0 for an ignored row (its gradient is 0)
    n_cols,
    shift, inv_s, off, on, t32, scale,  # the row's factors (_ceb_row_factors)
    softcap,
    BLOCK_V: tl.constexpr, NUM_STAGES: tl.constexpr, CAP: tl.constexpr, CAP_INPUT: tl.constexpr = False,
):  # fmt: skip
    """The gradient of the columns ``[lo, hi)`` of one row, from :func:`_ceb_row_factors`, in
    ``BLOCK_V``-wide steps; with CAP, times ``dx / du = 1 - (x / c)**2`` (see the online kernel),
    the logits soft-capped as they are read with CAP_INPUT."""
    cols = tl.arange(0, BLOCK_V)
    for start in tl.range(lo, hi, BLOCK_V, num_stages=NUM_STAGES):
        offs = start + cols
        x = tl.load(x_row + offs, mask=offs < n_read, other=float("-inf")).to(tl.float32)
        x = _ce_soft_capped(x, offs < n_read, softcap, CAP_INPUT)
        g = (tl.exp(x - shift) * inv_s - off - tl.where(offs == t32, on, 0.0)) * scale
        if CAP:
            xc = tl.where(offs < n_read, x, 0.0) / softcap
            g = g * (1.0 - xc * xc)
        tl.store(dx_row + offs, g.to(dx_row.dtype.element_ty), mask=offs < n_cols)


@triton.jit
def _ceb_online_row_kernel(
    x_ptr, t_ptr,
    scale_ptr,  # see SCALE
    dx_ptr,
    loss_ptr,  # LOSS: (R,) float32 per-row losses (the output or a scratch); else unused
    x_row_stride, dx_row_stride, n_cols, ignore_index, smoothing,
    BLOCK_V: tl.constexpr,  # columns per loop step
    SCALE: tl.constexpr,  # 0: scale_ptr[0]; 1: scale_ptr[row]; 2: 1
    LOSS: tl.constexpr,  # also write the row's loss (the fused op)
    SMOOTH: tl.constexpr,  # LOSS and label_smoothing > 0: also sum the logits (for the loss)
    NUM_STAGES: tl.constexpr,
    softcap=1.0,  # CAP: the soft-cap c of logits x = c tanh(u / c) (linear + cross-entropy)
    CAP: tl.constexpr = False,  # the gradient with respect to u: times dx / du = 1 - (x / c)**2
    CAP_INPUT: tl.constexpr = False,  # (with CAP) x_ptr holds u, not x: x = c tanh(u / c) as it is read
):  # fmt: skip
    """One row's statistics (and loss), then its gradient; ``dx_ptr`` may be ``x_ptr`` (each
    element is read before it is written, by the same program). The logits and the gradient are
    read and written in their tensors' dtypes, the math in float32."""
    smoothing = tl.cast(smoothing, tl.float32)  # float32 math even where Inductor passes a Python float as fp64
    softcap = tl.cast(softcap, tl.float32)
    row, x_row, target, valid = _ce_program_row(x_ptr, t_ptr, x_row_stride, ignore_index)
    dx_row = dx_ptr + row * dx_row_stride
    n_read = tl.where(valid, n_cols, 0)  # an ignored row reads nothing

    # Pass 1: the row's statistics (and its loss).
    m, s, sum_x = _ce_online_stats(x_row, 0, n_read, n_cols, BLOCK_V, SMOOTH, NUM_STAGES, softcap, CAP_INPUT)
    if LOSS:
        x_t = _ce_target_logit(x_row, target, valid, n_cols, softcap, CAP_INPUT)
        tl.store(loss_ptr + row, _ce_row_loss(m, s, x_t, sum_x, n_cols, smoothing, valid, SMOOTH))

    # Pass 2: the gradient, every column (zeros for an ignored row).
    shift, inv_s, off, on, t32, scale = _ceb_row_factors(scale_ptr, row, target, valid, m, s, n_cols, smoothing, SCALE)
    _ceb_write_grad(x_row, dx_row, 0, n_cols, n_read, n_cols, shift, inv_s, off, on, t32, scale, softcap,
                    BLOCK_V, NUM_STAGES, CAP, CAP_INPUT)  # fmt: skip


@triton.jit
def _ceb_whole_row_kernel(
    x_ptr, t_ptr, scale_ptr, dx_ptr, loss_ptr,  # as _ceb_online_row_kernel's
    x_row_stride, dx_row_stride, n_cols, ignore_index, smoothing,
    BLOCK_V: tl.constexpr,  # next_power_of_two(V): the whole row in one block
    SCALE: tl.constexpr, LOSS: tl.constexpr, SMOOTH: tl.constexpr,
    EVICT_X: tl.constexpr,  # "" or "evict_first": the logits are read once
):  # fmt: skip
    smoothing = tl.cast(smoothing, tl.float32)  # float32 math even where Inductor passes a Python float as fp64
    row, x_row, target, valid = _ce_program_row(x_ptr, t_ptr, x_row_stride, ignore_index)

    cols, m, e, s, sum_x = _ce_whole_row_stats(x_row, n_cols, valid, BLOCK_V, SMOOTH, EVICT_X)
    if LOSS:
        x_t = _ce_target_logit(x_row, target, valid, n_cols)
        tl.store(loss_ptr + row, _ce_row_loss(m, s, x_t, sum_x, n_cols, smoothing, valid, SMOOTH))

    _, inv_s, off, on, t32, scale = _ceb_row_factors(scale_ptr, row, target, valid, m, s, n_cols, smoothing, SCALE)
    g = (e * inv_s - off - tl.where(cols == t32, on, 0.0)) * scale
    tl.store(dx_ptr + row * dx_row_stride + cols, g.to(dx_ptr.dtype.element_ty), mask=cols < n_cols)


@triton.jit
def _ceb_split_grad_kernel(
    x_ptr, t_ptr,
    stats_ptr,  # the forward's phase-1 scratch: (2 or 3, R, n_chunks) chunk max, sum (, sum of x)
    scale_ptr, dx_ptr, loss_ptr,  # as _ceb_online_row_kernel's
    x_row_stride, dx_row_stride, n_cols, n_chunks,
    chunk_cols,  # columns per chunk, a multiple of BLOCK_V
    plane_stride,  # R * n_chunks
    ignore_index, smoothing,
    BLOCK_V: tl.constexpr,
    CHUNKS: tl.constexpr,  # next_power_of_two(n_chunks)
    SCALE: tl.constexpr, LOSS: tl.constexpr, SMOOTH: tl.constexpr, NUM_STAGES: tl.constexpr,
):  # fmt: skip
    """Program (row, chunk): combine the row's chunk statistics, then write the chunk's gradient."""
    smoothing = tl.cast(smoothing, tl.float32)  # float32 math even where Inductor passes a Python float as fp64
    row, x_row, target, valid = _ce_program_row(x_ptr, t_ptr, x_row_stride, ignore_index)
    chunk = tl.program_id(1)
    dx_row = dx_ptr + row * dx_row_stride

    # Each chunk's sum was taken against its own max: rescale it to the row's. (Chunks that saw
    # only -inf, an ignored row's, and the padding have m_c = -inf and s_c = 0: they add 0.)
    chunks = tl.arange(0, CHUNKS)
    at = row * n_chunks + chunks
    chunk_mask = chunks < n_chunks
    m_c = tl.load(stats_ptr + at, mask=chunk_mask, other=float("-inf"))
    s_c = tl.load(stats_ptr + plane_stride + at, mask=chunk_mask, other=0.0)
    m = tl.max(m_c, axis=0)
    s = tl.sum(s_c * tl.exp(m_c - tl.where(valid, m, 0.0)), axis=0)
    if LOSS:  # every chunk's program has the row's statistics; chunk 0's writes the loss
        sum_x = 0.0
        if SMOOTH:
            sum_x = tl.sum(tl.load(stats_ptr + 2 * plane_stride + at, mask=chunk_mask, other=0.0), axis=0)
        x_t = _ce_target_logit(x_row, target, valid, n_cols)
        loss = _ce_row_loss(m, s, x_t, sum_x, n_cols, smoothing, valid, SMOOTH)
        tl.store(loss_ptr + row, loss, mask=chunk == 0)

    shift, inv_s, off, on, t32, scale = _ceb_row_factors(scale_ptr, row, target, valid, m, s, n_cols, smoothing, SCALE)
    lo = chunk * chunk_cols
    _ceb_write_grad(x_row, dx_row, lo, tl.minimum(lo + chunk_cols, n_cols), tl.where(valid, n_cols, 0), n_cols,
                    shift, inv_s, off, on, t32, scale, 1.0, BLOCK_V, NUM_STAGES, False)  # fmt: skip

"""The kernels of the linear + cross-entropy families: the forward
(:mod:`kernelsmith.ops.linear_cross_entropy`) and its gradients
(:mod:`kernelsmith.ops.linear_cross_entropy_backward`), whose docstrings explain the math, the
steps and the variants; the spaces and launchers are in those modules.

Every logit is made by :func:`lce_logits_tile`: a tiled product (:func:`lce_tile`, on the matmul
family's ``_dot``), the bias and the soft-cap (cross-entropy's
:func:`~kernelsmith.ops._cross_entropy_kernels._ce_tanh`). The forward folds each tile,
still in registers, into per-row running statistics (:func:`_lce_stats_kernel`) and merges the
splits with cross-entropy's own helpers (:func:`_lce_combine_kernel`); the backward stores a
chunk of logits (:func:`_lceb_logits_kernel`), lets cross-entropy backward's row kernel turn it
into the gradient in place, and multiplies that by W and h in plain GEMMs
(:func:`_lceb_gemm_kernel`).
"""

from __future__ import annotations

import triton
import triton.language as tl

from kernelsmith.ops._cross_entropy_kernels import _ce_merge_chunks, _ce_program_rows, _ce_row_loss, _ce_tanh
from kernelsmith.ops._matmul_kernels import _dot

# =================================================================================================
# Conventions: h is (T, H) and W (V, H), both with unit column stride (row strides passed); a
# logits tile is h[rows] @ W[cols].T, accumulated in float32 over BLOCK_K-wide steps of H. Rows
# past T and columns past V are read at row % T and col % V (valid addresses, no mask in the
# loop) and masked out of every statistic and store. Row offsets are 64-bit.
# =================================================================================================

# ---- the tiles ------------------------------------------------------------------------------------


@triton.jit
def lce_tile(
    a_ptr, b_ptr, rows, cols, K, stride_am, stride_ak, stride_bk, stride_bn,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, IEEE: tl.constexpr,
    UPCAST: tl.constexpr, ROW_SUM: tl.constexpr,
):  # fmt: skip
    """``(a[rows, :] @ b[:, cols], row sums of a[rows, :])`` in float32 (the sums only with
    ROW_SUM, else 0), through arbitrary strides (a transpose is a choice of strides). ``a`` is
    rounded to ``b``'s dtype before the dot (a float32 gradient meets a bfloat16 weight on the
    tensor cores, as PyTorch's bfloat16 gradient does); ``rows``/``cols`` are valid indices."""
    ks = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + rows[:, None] * stride_am + ks[None, :].to(tl.int64) * stride_ak
    b_ptrs = b_ptr + ks[:, None].to(tl.int64) * stride_bk + cols[None, :] * stride_bn
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    # The row sums accumulate elementwise across the K loop and reduce once after it: a tl.sum
    # inside the loop trips an assertion in Triton 3.6's OptimizeThreadLocality pass
    # ("loopResult.hasOneUse()") on the H200 when the sum feeds more than one use.
    row_part = tl.zeros([BLOCK_M, BLOCK_K], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k_mask = ks < K - k0
        a = tl.load(a_ptrs, mask=k_mask[None, :], other=0.0)
        b = tl.load(b_ptrs, mask=k_mask[:, None], other=0.0)
        if ROW_SUM:
            row_part += a.to(tl.float32)
        acc = _dot(a.to(b_ptr.dtype.element_ty), b, acc, IEEE, UPCAST)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    return acc, tl.sum(row_part, axis=1)


@triton.jit
def lce_logits_tile(
    h_ptr, w_ptr, bias_ptr, rows, cols, col_mask, H, stride_hm, stride_wv, softcap,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, HAS_BIAS: tl.constexpr,
    CAP: tl.constexpr, IEEE: tl.constexpr, UPCAST: tl.constexpr,
):  # fmt: skip
    """A float32 tile of logits ``h[rows] @ W[cols].T (+ b[cols])``, soft-capped when CAP."""
    z, _ = lce_tile(h_ptr, w_ptr, rows, cols, H, stride_hm, 1, 1, stride_wv,
                    BLOCK_M, BLOCK_N, BLOCK_K, IEEE, UPCAST, False)  # fmt: skip
    if HAS_BIAS:
        z += tl.load(bias_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)[None, :]
    if CAP:
        z = softcap * _ce_tanh(z / softcap)
    return z


# ---- the forward ----------------------------------------------------------------------------------


@triton.jit
def _lce_stats_kernel(
    h_ptr, w_ptr, bias_ptr, t_ptr,
    stats_ptr,  # (4, T, n_splits) float32: max, sum of exp(z - max), z[t], sum of z
    T, V, H, stride_hm, stride_wv, n_splits, split_cols, plane_stride, softcap,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, HAS_BIAS: tl.constexpr,
    CAP: tl.constexpr, SMOOTH: tl.constexpr, IEEE: tl.constexpr, UPCAST: tl.constexpr,
):  # fmt: skip
    """Program (row block, split): the online log-sum-exp of the logits of BLOCK_M rows over the
    split's ``split_cols`` columns (a multiple of BLOCK_N), tile by tile, logits in registers."""
    softcap = tl.cast(softcap, tl.float32)  # float32 math even where Inductor passes a Python float as fp64
    pid_m = tl.program_id(0)
    split = tl.program_id(1)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    row_mask = rows < T
    rows_safe = (rows % T).to(tl.int64)
    target = tl.load(t_ptr + rows_safe)
    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    s = tl.zeros([BLOCK_M], tl.float32)
    z_t = tl.zeros([BLOCK_M], tl.float32)
    sum_z = tl.zeros([BLOCK_M], tl.float32)
    lo = split * split_cols
    hi = tl.minimum(lo + split_cols, V)
    for start in range(lo, hi, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        col_mask = cols < V
        cols_safe = (cols % V).to(tl.int64)
        z = lce_logits_tile(h_ptr, w_ptr, bias_ptr, rows_safe, cols_safe, col_mask, H, stride_hm, stride_wv,
                            softcap, BLOCK_M, BLOCK_N, BLOCK_K, HAS_BIAS, CAP, IEEE, UPCAST)  # fmt: skip
        z_t += tl.sum(tl.where(cols[None, :] == target[:, None], z, 0.0), axis=1)
        if SMOOTH:
            sum_z += tl.sum(tl.where(col_mask[None, :], z, 0.0), axis=1)
        z = tl.where(col_mask[None, :], z, float("-inf"))
        m_new = tl.maximum(m, tl.max(z, axis=1))
        # As in cross_entropy's online statistics: shift by 0 while everything seen is -inf, and
        # an exact 1 when the max did not move.
        shift = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.where(m_new == m, 1.0, tl.exp(m - shift))
        s = s * alpha + tl.sum(tl.exp(z - shift[:, None]), axis=1)
        m = m_new
    at = rows_safe * n_splits + split
    tl.store(stats_ptr + at, m, mask=row_mask)
    tl.store(stats_ptr + plane_stride + at, s, mask=row_mask)
    tl.store(stats_ptr + 2 * plane_stride + at, z_t, mask=row_mask)
    if SMOOTH:
        tl.store(stats_ptr + 3 * plane_stride + at, sum_z, mask=row_mask)


@triton.jit
def _lce_combine_kernel(
    t_ptr, stats_ptr, loss_ptr, T, V, n_splits, plane_stride, ignore_index, smoothing,
    ROWS: tl.constexpr, SPLITS: tl.constexpr, SMOOTH: tl.constexpr,
):  # fmt: skip
    """Per-row losses from the splits' statistics: cross-entropy's merge of chunk statistics
    (the sum of logits in plane 3), and ``z[t]`` from plane 2 (the split holding the target's
    column stored it, the others 0)."""
    smoothing = tl.cast(smoothing, tl.float32)  # float32 math even where Inductor passes a Python float as fp64
    rows64, row_mask, target, valid = _ce_program_rows(t_ptr, T, ignore_index, ROWS)
    m, s, sum_z, at, mask = _ce_merge_chunks(stats_ptr, rows64, row_mask, valid, n_splits, plane_stride, SPLITS, 3,
                                             SMOOTH)  # fmt: skip
    z_t = tl.sum(tl.load(stats_ptr + 2 * plane_stride + at, mask=mask, other=0.0), axis=1)
    in_range = (target >= 0) & (target < V)
    z_t = tl.where(in_range, z_t, float("nan"))  # an out-of-range target: a NaN loss
    loss = _ce_row_loss(m, s, z_t, sum_z, V, smoothing, valid, SMOOTH)
    tl.store(loss_ptr + rows64, loss, mask=row_mask)


# ---- the gradients --------------------------------------------------------------------------------


@triton.jit
def _lceb_logits_kernel(
    h_ptr, w_ptr, bias_ptr, z_ptr, T, V, H, stride_hm, stride_wv, stride_zm, softcap,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, HAS_BIAS: tl.constexpr,
    CAP: tl.constexpr, IEEE: tl.constexpr, UPCAST: tl.constexpr,
):  # fmt: skip
    """Step 1: tile (pid_m, pid_n) of the chunk's float32 logits."""
    softcap = tl.cast(softcap, tl.float32)  # float32 math even where Inductor passes a Python float as fp64
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    col_mask = cols < V
    z = lce_logits_tile(h_ptr, w_ptr, bias_ptr, (rows % T).to(tl.int64), (cols % V).to(tl.int64), col_mask, H,
                        stride_hm, stride_wv, softcap, BLOCK_M, BLOCK_N, BLOCK_K, HAS_BIAS, CAP, IEEE,
                        UPCAST)  # fmt: skip
    mask = (rows < T)[:, None] & col_mask[None, :]
    tl.store(z_ptr + rows.to(tl.int64)[:, None] * stride_zm + cols[None, :], z, mask=mask)


@triton.jit
def _lceb_gemm_kernel(
    a_ptr, b_ptr, c_ptr, sum_ptr,
    M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm,
    accumulate,  # 0: c = a @ b (the first chunk); 1: c += a @ b
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, ROW_SUM: tl.constexpr,
    IEEE: tl.constexpr, UPCAST: tl.constexpr,
):  # fmt: skip
    """Steps 3 and 4: ``c = a @ b`` (``c += a @ b`` when ``accumulate``), and with ROW_SUM the
    row sums of ``a`` into ``sum_ptr`` likewise (written by the first column of programs)."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    acc, row_sum = lce_tile(a_ptr, b_ptr, (rows % M).to(tl.int64), (cols % N).to(tl.int64), K, stride_am,
                            stride_ak, stride_bk, stride_bn, BLOCK_M, BLOCK_N, BLOCK_K, IEEE, UPCAST,
                            ROW_SUM)  # fmt: skip
    row_mask = rows < M
    mask = row_mask[:, None] & (cols < N)[None, :]
    c_ptrs = c_ptr + rows.to(tl.int64)[:, None] * stride_cm + cols[None, :]
    if accumulate:
        acc += tl.load(c_ptrs, mask=mask, other=0.0).to(tl.float32)
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=mask)
    if ROW_SUM:
        # (A bound rather than `& (pid_n == 0)`: the interpreter turns a scalar-and-vector `&`
        # into an int32 mask that tl.store rejects.)
        sum_mask = rows < tl.where(pid_n == 0, M, 0)
        if accumulate:
            row_sum += tl.load(sum_ptr + rows, mask=sum_mask, other=0.0).to(tl.float32)
        tl.store(sum_ptr + rows, row_sum.to(sum_ptr.dtype.element_ty), mask=sum_mask)


@triton.jit
def _lceb_cast_kernel(src_ptr, dst_ptr, n, BLOCK: tl.constexpr):
    """The float32 accumulators rounded once into the outputs' dtype."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(dst_ptr + offs, tl.load(src_ptr + offs, mask=mask).to(dst_ptr.dtype.element_ty), mask=mask)

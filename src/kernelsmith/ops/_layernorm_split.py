"""LayerNorm's split_row kernels: a row cut into chunks across programs, its statistics merged.

The row-wise skeleton's ``split_row`` schedule (:mod:`kernelsmith.ops._rowwise`, the section on
rows split across programs) cuts each row into chunks of ``BLOCK_N`` body elements (chunk 0 also
takes the row's unaligned head and tail), runs one program per (row, chunk), and launches twice:

1. :func:`_layernorm_split_stats_kernel`: every chunk's statistics, three float32 values, into a
   ``(rows, chunks, 3)`` scratch buffer: its count ``n_c``, its mean ``mean_c`` and its ``M2_c``
   (the sum of squared deviations from ``mean_c``), all of ``d = x - shift``, the row shifted by
   the mean of its first elements as every LayerNorm kernel does (the module docstring of
   :mod:`kernelsmith.ops.layernorm` says why). A chunk is in registers, so its own statistics are
   the classical two-pass ones: mean first, then the squares of the centred values.
2. :func:`_layernorm_split_apply_kernel`: every program loads its row's ``chunks`` statistics as
   one block and merges them with Chan, Golub & LeVeque's formula,

       mean = sum_c n_c * mean_c / N
       M2   = sum_c M2_c + sum_c n_c * (mean_c - mean)^2

   (the pairwise update ``M2_a + M2_b + delta^2 n_a n_b / n`` applied to all chunks at once, as
   ``welford_merge`` of :mod:`kernelsmith.ops._layernorm_kernels` merges lanes; here the counts
   are stored, since chunk 0 holds the head and tail and the last chunks may hold nothing). Both
   sums are of same-signed terms: nothing cancels. Then it reads its chunk of x again, normalises
   it and stores it; the program of chunk 0 also stores the row's mean and rstd when the launch
   asks for them (``STORE_STATS``, a training forward).

Every program of a row computes the merge from the same values in the same order (one block
reduction), so all of them use bit-identical statistics, and a run is bitwise reproducible: no
atomics, no waiting between programs, any grid is safe, and both launches are CUDA-graph
capturable (the scratch buffer comes from the caching allocator: the skeleton's launcher).

Kernel arguments are the skeleton's split_row conventions: the tensors, ``N``, then the scalars
(``eps``); the constexprs ``BLOCK_N``, ``SPLITS`` (the chunk count padded to a power of two),
``ALIGN`` and LayerNorm's own (``HAS_WEIGHT``, ``HAS_BIAS``, ``STORE_STATS``, as the other
kernels have them: absent operands are placeholders that are never dereferenced).
"""

from __future__ import annotations

import triton
import triton.language as tl

from kernelsmith.ops import _layernorm_kernels as kernels
from kernelsmith.ops import _rowwise as skeleton

N_STATS = 3  # a chunk's count, mean and M2: the scratch buffer's last dimension


@triton.jit
def _chunk_centred(x_ptr, row_start, N, chunk, BLOCK_N: tl.constexpr, ALIGN: tl.constexpr):
    """The shifted values ``d = x - shift`` (``row_shift``) of one chunk of a row, as the skeleton cuts it: the
    body and the edge (head and tail, in chunk 0 only), each zero off its mask, with their
    offsets and masks: ``(body, body_mask, d, edge, edge_mask, d_edge)``."""
    body, body_mask, edge, edge_mask = skeleton.row_pieces(row_start, N, chunk, BLOCK_N, ALIGN)
    shift = kernels.row_shift(x_ptr + row_start, N)  # the same in every chunk
    x = tl.load(x_ptr + body, mask=body_mask, other=0.0).to(tl.float32)
    x_edge = tl.load(x_ptr + edge, mask=edge_mask, other=0.0).to(tl.float32)
    # Masked lanes zeroed: a padded 0.0 minus the shift is not zero.
    d = tl.where(body_mask, x - shift, 0.0)
    d_edge = tl.where(edge_mask, x_edge - shift, 0.0)
    return body, body_mask, d, edge, edge_mask, d_edge


@triton.jit
def _layernorm_split_stats_kernel(
    x_ptr,
    partial_ptr,  # (rows, chunks, 3) float32: each chunk's count, mean and M2 of d = x - shift
    N,
    BLOCK_N: tl.constexpr, SPLITS: tl.constexpr, ALIGN: tl.constexpr,
):
    """split_row, first launch: one chunk's (count, mean, M2), two-pass over its registers."""
    row = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1)
    _, body_mask, d, _, edge_mask, d_edge = _chunk_centred(x_ptr, row * N, N, chunk, BLOCK_N, ALIGN)
    count = tl.sum(body_mask.to(tl.float32), axis=0) + tl.sum(edge_mask.to(tl.float32), axis=0)
    # An empty chunk (the body is shorter than the row: the last chunks may hold nothing) has
    # mean 0 and M2 0, and its count 0 gives it no weight in the merge.
    mean = (tl.sum(d, axis=0) + tl.sum(d_edge, axis=0)) / tl.maximum(count, 1.0)
    xc = tl.where(body_mask, d - mean, 0.0)
    xc_edge = tl.where(edge_mask, d_edge - mean, 0.0)
    m2 = tl.sum(xc * xc, axis=0) + tl.sum(xc_edge * xc_edge, axis=0)
    at = partial_ptr + (row * tl.num_programs(1) + chunk) * 3
    tl.store(at, count)
    tl.store(at + 1, mean)
    tl.store(at + 2, m2)


@triton.jit
def _layernorm_split_apply_kernel(
    x_ptr, w_ptr, b_ptr, y_ptr, mean_ptr, rstd_ptr,
    partial_ptr,  # the first launch's (rows, chunks, 3) statistics
    N, eps,
    BLOCK_N: tl.constexpr, SPLITS: tl.constexpr, ALIGN: tl.constexpr,
    HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr, STORE_STATS: tl.constexpr,
):
    """split_row, second launch: the row's mean and rstd from its chunks' statistics (Chan's
    merge, in one fixed order), then the chunk normalised again from x."""
    eps = tl.cast(eps, tl.float32)  # float32 math even where Inductor passes a Python float as fp64
    row, chunk, at, real = skeleton.split_partials(partial_ptr, 3, SPLITS)  # padding lanes: count 0, no weight
    counts = tl.load(at, mask=real, other=0.0)
    means = tl.load(at + 1, mask=real, other=0.0)
    m2s = tl.load(at + 2, mask=real, other=0.0)
    mean_d = tl.sum(counts * means, axis=0) / N
    spread = means - mean_d
    rstd = tl.rsqrt((tl.sum(m2s, axis=0) + tl.sum(counts * spread * spread, axis=0)) / N + eps)

    row_start = row * N
    body, body_mask, d, edge, edge_mask, d_edge = _chunk_centred(x_ptr, row_start, N, chunk, BLOCK_N, ALIGN)
    # (Masked lanes zeroed again, -mean_d there: never stored, but no noise in float16 either.)
    xc = tl.where(body_mask, d - mean_d, 0.0)
    xc_edge = tl.where(edge_mask, d_edge - mean_d, 0.0)
    y = kernels._affine(xc * rstd, w_ptr, b_ptr, body - row_start, body_mask, HAS_WEIGHT, HAS_BIAS)
    tl.store(y_ptr + body, y.to(y_ptr.dtype.element_ty), mask=body_mask)
    y_edge = kernels._affine(xc_edge * rstd, w_ptr, b_ptr, edge - row_start, edge_mask, HAS_WEIGHT, HAS_BIAS)
    tl.store(y_ptr + edge, y_edge.to(y_ptr.dtype.element_ty), mask=edge_mask)
    # A constexpr branch (compiled away without STORE_STATS) around a runtime one: one program a
    # row stores them (every program of the row has the same).
    if STORE_STATS:  # noqa: SIM102
        if chunk == 0:
            tl.store(mean_ptr + row, kernels.row_shift(x_ptr + row_start, N) + mean_d)
            tl.store(rstd_ptr + row, rstd)

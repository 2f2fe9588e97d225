"""Residual add + RMSNorm backward: ``(dy, dh, h, weight) -> (dsum, dw)``, the gradients of
:mod:`add_rmsnorm`'s forward.

The forward (see :mod:`kernelsmith.ops.add_rmsnorm`) computes, for each row of ``N`` elements,

    h    = x + residual                              (rounded to the activation dtype)
    r    = 1 / sqrt(mean_j(h_j ** 2) + eps)
    y_j  = h_j * r * w_j

and returns *two* outputs, ``y`` and ``h`` (the next layer's residual). Both carry a gradient in
a training step: ``dy`` from the normalised branch, ``dh`` from the residual stream the next layer
adds to. With ``g = dy * w`` (elementwise), the gradient of ``h`` is ``dh`` plus RMSNorm's ``dx``
(see :mod:`kernelsmith.ops.rmsnorm_backward`):

    dsum_j = dh_j + r * g_j - h_j * (r ** 3 / N) * sum_k(g_k * h_k)
    dw_j   = sum over rows of dy_j * h_j * r

and since ``h = x + residual`` passes its gradient through unchanged, ``dsum`` is the gradient of
``x`` *and* of ``residual``: the caller hands the same tensor to both.

The calling convention: an exception to ``(dy, *forward inputs)``
----------------------------------------------------------------
Backward families usually take ``(dy, *forward inputs)``. This one cannot: the forward has two
outputs, so it has two upstream gradients, and the statistics are recomputed from the forward's
*output* ``h`` (one tensor, already rounded as the forward normalised it) rather than from ``x``
and ``residual`` (two tensors to read and add). Inputs are ``(dy, dh, h, weight)``: ``dy``, ``dh``
and ``h`` of shape ``(..., N)`` in the activation dtype, ``weight`` of shape ``(N,)`` in the same
dtype; the constants ``eps`` (default 1e-6) and, as in the forward, ``weight_offset`` (Gemma's ``1
+ weight``, added to the weight in float32 after the load; left out of the constants when 0).
Outputs are ``(dsum, dw)``: ``dsum`` like ``h`` in the activation dtype, ``dw`` of shape ``(N,)``
in float32 (a sum over all rows, accumulated in float32 and left there; the caller casts it to the
weight's dtype).

The kernels are :mod:`rmsnorm_backward`'s with ``h`` in place of ``x`` and one more load, ``dh``,
added in float32 before ``dsum`` is rounded once and stored. The load comes after the row's
``dw`` share is accumulated, so that ``h`` and ``dy`` are dead by then and the row holds no more
values in registers than RMSNorm's backward. Stores round to nearest-even with
:func:`kernelsmith.ops.add_rmsnorm._to_storage`, so that the interpreter (which truncates to
bfloat16) computes what the GPU does.

Reference
---------
``reference`` is PyTorch's autograd through the eager forward in the input dtype, as a training
step computes it: the Hugging Face ``LlamaRMSNorm`` of ``h`` (``weight * (hf * rsqrt(mean(hf**2)
+ eps)).to(dtype)`` with ``hf = h.float()``) and ``h`` itself as outputs, differentiated with
``(dy, dh)`` with respect to ``h`` and ``weight``. The add ``h = x + residual`` is left out: its
backward hands ``h``'s gradient unchanged to both operands, so the gradient of ``h`` *is* ``dx``
and ``dresidual``. Autograd accumulates ``dh`` and the norm's gradient in the input dtype (two
roundings), and its ``dw`` is that of the HF formulation, which rounds ``h * r`` before the weight
multiply (see :mod:`rmsnorm_backward`: the tolerance covers it). ``reference_fp64`` is the same
autograd in float64, where nothing is rounded: the formula above.

Variants (deterministic: no atomics, every sum in a fixed order)
-----------------------------------------------------------------
``two_stage``
    ``GROUPS`` x (multiprocessor count) programs, capped by the row count, each walking rows
    ``pid, pid + programs, ...`` with the whole row in registers; each program's ``dw`` share goes
    to a ``(programs, N)`` float32 scratch buffer that the skeleton's reduction kernel
    sums in a fixed order into ``dw``.
``looped``
    For rows too wide for registers: :mod:`rmsnorm_backward`'s per-row statistics kernel (``r``
    and ``r**3 / N * sum(g * h)`` into a ``(rows, 2)`` float32 scratch), then a grid of (column
    blocks, ``GROUPS`` x multiprocessors) programs writing ``dsum`` and ``dw`` shares, then the
    same reduction.
``split_row``
    For rows of more than 8 KB, wide or few (issue 19): :mod:`rmsnorm_backward`'s split_row
    statistics kernel (each column chunk's ``sum(h * h)`` and ``sum(g * h)`` into a ``(rows,
    chunks, 2)`` float32 scratch), then, on the same grid of (chunks, ``GROUPS`` x
    multiprocessors) programs walking their group's rows, the chunk sums of each row merged in a
    fixed order and ``dsum`` and ``dw`` shares written, then the same reduction.

Scratch buffers are allocated by the launchers with ``new_empty`` on an output (the harness
allows allocation, not computation); every element of them is written before it is read. The
launchers and variants are the backward skeleton's (:mod:`kernelsmith.ops._rowwise_backward`);
the specs, checks, references and inputs are :class:`~kernelsmith.ops.rmsnorm_backward.RMSNormBackward`'s
over ``(dy, dh, h, weight)``: this file holds the three rows kernels and what differs.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import triton
import triton.language as tl

from kernelsmith.ops import _rowwise_backward as backward
from kernelsmith.ops._rowwise_backward import column_block, load_row, row_columns, store_row, store_share
from kernelsmith.ops.add_rmsnorm import _to_storage
from kernelsmith.ops.rmsnorm_backward import KERNELS as RMSNORM_BACKWARD_KERNELS
from kernelsmith.ops.rmsnorm_backward import (
    RMSNormBackward,
    _looped_stats_kernel,
    _split_stats_kernel,
    block_gradient,
    columns_gradient,
    looped_space,
    row_gradient,
    scaled_weight,
    split_row_space,
    split_statistics,
    two_stage_space,
)
from kernelsmith.space import Space
from kernelsmith.spec import OpSpec

# ---------------------------------------------------------------------------------------------
# Kernels
#
# RMSNorm backward's row math (kernelsmith.ops.rmsnorm_backward: row_gradient, block_gradient)
# on h, then dh added in float32 and dsum rounded once, on the store. The looped variant's
# statistics kernel is rmsnorm_backward's; the dw reduction is the skeleton's.
# ---------------------------------------------------------------------------------------------


@triton.jit
def _row_results(dx, dw_term, dw, dsum_ptr, dh_ptr, i, dsum_row_stride, dh_row_stride, cols, mask):
    """The end of each rows kernel's row step, given RMSNorm's float32 gradients of row ``i`` at
    ``cols`` (``dx`` of h, ``dw_term`` of the weight): the row's term added to the program's dw
    share (returned), and dsum = dh + dx stored.

    The residual stream's gradient dh is loaded here, last, after h and dy are dead (so a row holds
    no more values in registers than RMSNorm's backward); the sum is formed in float32 and rounded
    once, on the store. Triton inlines the call: each kernel compiles to what it did with these
    lines written out in its loop."""
    dw += dw_term
    dh = load_row(dh_ptr, i, dh_row_stride, cols, mask)
    store_row(dsum_ptr, i, dsum_row_stride, cols, _to_storage(dh + dx, dsum_ptr), mask)
    return dw


@triton.jit
def _two_stage_rows_kernel(
    dy_ptr, dh_ptr, h_ptr, w_ptr, dsum_ptr, partial_ptr,  # partial: (programs, N) float32, the dw shares
    dy_row_stride, dh_row_stride, h_row_stride, dsum_row_stride, n_rows, N, eps,
    BLOCK_N: tl.constexpr,  # next_power_of_two(N): the whole row in one block
    NUM_STAGES: tl.constexpr,
    WEIGHT_OFFSET: tl.constexpr,  # added to the weight (Gemma: 1.0); 0.0 compiles no add
):
    """Rows pid, pid + programs, ...: dsum for each, and the sum of their dy * h * r."""
    eps = tl.cast(eps, tl.float32)  # float32 math even where Inductor passes a Python float as fp64
    cols, mask = row_columns(BLOCK_N, N)
    dw = tl.zeros([BLOCK_N], dtype=tl.float32)
    w = scaled_weight(w_ptr, cols, mask, WEIGHT_OFFSET)
    for i in tl.range(tl.program_id(0), n_rows, tl.num_programs(0), num_stages=NUM_STAGES):
        dx, dw_term = row_gradient(dy_ptr, h_ptr, i, dy_row_stride, h_row_stride, cols, mask, w, N, eps)
        dw = _row_results(dx, dw_term, dw, dsum_ptr, dh_ptr, i, dsum_row_stride, dh_row_stride, cols, mask)
    store_share(partial_ptr, tl.program_id(0), N, cols, dw, mask)


@triton.jit
def _looped_rows_kernel(
    dy_ptr, dh_ptr, h_ptr, w_ptr,
    stats_ptr,  # (rows, 2) float32: r and r**3 / N * sum(g * h), from _looped_stats_kernel
    dsum_ptr, partial_ptr,  # partial: (groups, N) float32
    dy_row_stride, dh_row_stride, h_row_stride, dsum_row_stride, n_rows, N,
    BLOCK_N: tl.constexpr,  # columns per program
    NUM_STAGES: tl.constexpr,
    WEIGHT_OFFSET: tl.constexpr,
):
    """Program (column block, group): dsum of the block for rows group, group + groups, ...,
    and the block's share of dw over those rows."""
    cols, mask = column_block(BLOCK_N, N)
    dw = tl.zeros([BLOCK_N], dtype=tl.float32)
    w = scaled_weight(w_ptr, cols, mask, WEIGHT_OFFSET)
    for i in tl.range(tl.program_id(1), n_rows, tl.num_programs(1), num_stages=NUM_STAGES):
        dx, dw_term = block_gradient(dy_ptr, h_ptr, stats_ptr, i, dy_row_stride, h_row_stride, cols, mask, w)
        dw = _row_results(dx, dw_term, dw, dsum_ptr, dh_ptr, i, dsum_row_stride, dh_row_stride, cols, mask)
    store_share(partial_ptr, tl.program_id(1), N, cols, dw, mask)


@triton.jit
def _split_rows_kernel(
    dy_ptr, dh_ptr, h_ptr, w_ptr,
    partial_ptr,  # (rows, chunks, 2) float32: each chunk's sum(h * h) and sum(g * h), from _split_stats_kernel
    dsum_ptr, share_ptr,  # share: (groups, N) float32
    dy_row_stride, dh_row_stride, h_row_stride, dsum_row_stride, n_rows, N, eps,
    BLOCK_N: tl.constexpr,  # columns a chunk
    SPLITS: tl.constexpr,  # the chunk count padded to a power of two
    WEIGHT_OFFSET: tl.constexpr,
):
    """split_row, second launch: program (chunk, group): for rows group, group + groups, ..., the
    row's statistics from its chunks' sums, then dsum of the chunk; and the chunk's share of dw."""
    eps = tl.cast(eps, tl.float32)  # float32 math even where Inductor passes a Python float as fp64
    cols, mask = column_block(BLOCK_N, N)
    dw = tl.zeros([BLOCK_N], dtype=tl.float32)
    w = scaled_weight(w_ptr, cols, mask, WEIGHT_OFFSET)
    for i in tl.range(tl.program_id(1), n_rows, tl.num_programs(1)):
        rstd, coef = split_statistics(partial_ptr, i, N, eps, SPLITS)
        dx, dw_term = columns_gradient(dy_ptr, h_ptr, i, dy_row_stride, h_row_stride, cols, mask, w, rstd, coef)
        dw = _row_results(dx, dw_term, dw, dsum_ptr, dh_ptr, i, dsum_row_stride, dh_row_stride, cols, mask)
    store_share(share_ptr, tl.program_id(1), N, cols, dw, mask)


# ---------------------------------------------------------------------------------------------
# Spaces, launchers and variants: the skeleton's, with dh among the tensors
# ---------------------------------------------------------------------------------------------


def _operands(n: int, inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> backward.Operands:
    """(dy, dh, h, weight) as they are (contiguous), dsum; RMSNorm's statistics of h read dy, h
    and the weight (dh plays no part in them); dw summed from the shares."""
    dy, _, h, w = inputs
    dsum, dw = outputs
    return backward.Operands(tuple(inputs), (dy, h, w), dsum, (dw,))


# The variants also run rmsnorm_backward's looped and split_row statistics kernels, row math and spaces,
# add_rmsnorm's _to_storage (the rounding of the stores) and the skeleton's spaces and share sum:
# their hashes cover those modules, and rmsnorm, whose jitted code add_rmsnorm's kernels call (a
# hash covers whole modules, so it covers what they call: tests/test_source_hashes.py).
KERNELS = backward.Backward(__name__, _two_stage_rows_kernel, _looped_stats_kernel, _looped_rows_kernel,
                            width_input=2, stats_width=2, share_slots=1, operands=_operands,
                            constexprs=RMSNORM_BACKWARD_KERNELS.constexprs,
                            split_stats_kernel=_split_stats_kernel, split_rows_kernel=_split_rows_kernel,
                            split_stats=2,
                            modules=("kernelsmith.ops.rmsnorm_backward", "kernelsmith.ops.add_rmsnorm",
                                     "kernelsmith.ops.rmsnorm"))


def _two_stage_space(spec: OpSpec) -> Space:
    """rmsnorm_backward's two_stage space, with three rows (dy, dh, h) in flight instead of two."""
    return two_stage_space(spec, rows_in_flight=3)


# ---------------------------------------------------------------------------------------------
# The op family
# ---------------------------------------------------------------------------------------------


class AddRMSNormBackward(RMSNormBackward):
    """RMSNorm's backward of ``h`` with ``dh`` among the inputs: its specs, checks, references
    and inputs are :class:`RMSNormBackward`'s over ``(dy, dh, h, weight)``."""

    name = "add_rmsnorm_backward"
    summary = ("gradients (dsum, dw) of residual add + RMSNorm given dy, dh and the saved sum h; "
               "dsum is the gradient of both x and residual")
    shape_help = (
        "the shape of h (and of dy and dh), e.g. 8192x4096 (rows x hidden size); weight has the last "
        "size, (4096,); dsum is shaped like h, dw is float32 (4096,); more leading sizes are allowed "
        "(2x1024x4096)"
    )
    input_names = ("dy", "dh", "h", "weight")
    flops_per_element = 12  # RMSNorm backward's 11 per element, and the add of dh
    variants = (*backward.variants(KERNELS, _two_stage_space, looped_space),
                backward.split_row_variant(KERNELS, split_row_space))


OP = AddRMSNormBackward()

"""Cross-entropy of logits against class-index targets: ``F.cross_entropy(logits, target)``.

The op
------
Inputs: ``logits`` of shape ``(R, V)`` (R rows, typically tokens, over a vocabulary of V classes)
in float16, bfloat16 or float32, and ``target`` of shape ``(R,)`` in int64. Constants:
``reduction`` ("mean", "sum" or "none"; default "mean"), ``ignore_index`` (default -100) and
``label_smoothing`` (``eps`` below, in [0, 1]; default 0). The output is float32 whatever the
logits' dtype (the math of training code, which upcasts the logits before the loss): a 0-d tensor
for "mean" and "sum", a ``(R,)`` tensor of per-row losses for "none".

The reference is ``F.cross_entropy(logits.float(), target, ...)``, the fp32-upcast form language
model training code uses; it is the baseline to beat and the yardstick of the tolerance. The
float64 ground truth is the same call on ``logits.double()``.

The math
--------
For a row ``x`` (V logits) with target ``t``, torch's loss with label smoothing is

    loss = (1 - eps) * (lse - x[t]) + eps * (lse - mean_j x[j]),   lse = log sum_j exp(x[j])

(``(1 - eps) * nll + eps / V * sum_j -log_softmax(x)[j]``, which is the same thing). Every kernel
computes it from the row maximum ``m`` and ``s = sum_j exp(x[j] - m)`` (so ``lse = m + log(s)``,
and nothing overflows: the "large" inputs overflow ``exp`` in float32 without the shift) as

    loss = log(s) + (1 - eps) * (m - x[t]) + eps * (m - mean_j x[j])

a sum of three non-negative terms: no cancellation, whatever the size of the logits. ``x[t]`` is
read with one scalar load per row (cheaper than a compare-and-select on every element), and
``sum_j x[j]`` is only accumulated when ``eps > 0`` (a compile-time switch, ``SMOOTH``).

Rows whose target equals ``ignore_index`` contribute 0 (their "none" loss is 0) and are not
counted: "mean" is the sum of the losses over the number of non-ignored rows, NaN when every row
is ignored, exactly as torch. (With label smoothing torch divides both of its terms by that same
count, so the formula above holds row by row.) The kernels do not even read an ignored row's
logits: their loops run zero times, their loads are masked off. A target outside ``[0, V)`` that
is not ``ignore_index`` makes that row's loss NaN (torch raises an error instead); no kernel ever
reads outside the row.

All arithmetic is in float32 whatever the storage dtype. The final "mean"/"sum" over rows is a
single program (a separate, tiny kernel, or split_vocab's combine program when one covers every
row) that adds the per-row losses in a fixed order, in float64, and rounds once: deterministic bit
for bit (no atomics), and as accurate as it can be.

The variants
------------
``online_row``
    One program per row walks the vocabulary in ``BLOCK_V``-wide steps, keeping a running max and
    a running sum of exponentials (rescaled when the max grows: the online softmax of Milakov &
    Gimelshein, 2018). Reads the logits exactly once; any vocabulary size. Per-row losses go to
    the output ("none") or to a float32 scratch that the reduction kernel sums.
``split_vocab``
    For few rows and a huge vocabulary, where one program per row leaves most of the GPU idle:
    phase 1 runs a ``(R, chunks)`` grid, each program reducing one chunk of ``~V / SPLITS``
    columns of one row to its max, its sum of exponentials (and its sum of logits when
    smoothing), written to a float32 scratch; phase 2 combines a row's chunks (rescaling each
    chunk's sum to the row's max) into the loss. When one phase-2 program covers every row (the
    few-rows case this variant is for), it also does the "mean"/"sum" reduction: two launches.
``whole_row``
    One program per row with the whole (power-of-two padded) row in registers: one load, a max,
    a sum. Only for ``V <= 65536`` (the space is empty beyond).

Extending to the backward pass (the gradient computed in the forward) fits this structure: the
gradient row is ``softmax(x) - onehot(t)`` (smoothed) scaled by the reduction's factor (for
"mean", one over the number of non-ignored rows: a pass over the targets first), which a second
pass over the row (``online_row``, ``split_vocab`` phase 3) or the registers already holding the
row (``whole_row``) can write once ``m`` and ``s`` are known.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
import triton
import triton.language as tl

from kernelsmith.ops._base import Launcher, OpFamily, UnsupportedWorkload, Variant, generator, tail_rows
from kernelsmith.ops._launch import direct_launch
from kernelsmith.space import Config, Constraint, Param, Space, next_power_of_two, powers_of_two
from kernelsmith.spec import OpSpec, TensorSpec, dtype_name

REDUCTIONS = ("mean", "sum", "none")
DEFAULT_IGNORE_INDEX = -100

# =================================================================================================
# Kernels
#
# Conventions: logits are a (R, V) matrix with unit column stride and its row stride passed
# explicitly; row offsets are 64-bit (``row * stride`` can pass 2**31 at 8192 x 128256); column
# offsets stay 32-bit (V < 2**31). Masked logit lanes load -inf: they never win the max and add
# exp(-inf) = 0 to the sums. Every value is converted to float32 right after its load.
# =================================================================================================


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
def _ce_online_stats(x_row, lo, hi, n_cols, BLOCK_V: tl.constexpr, SMOOTH: tl.constexpr, NUM_STAGES: tl.constexpr):
    """``(m, s, sum_x)`` of the columns ``[lo, hi)`` of the row at ``x_row``, in ``BLOCK_V``-wide
    steps (``hi <= lo`` reads nothing and gives ``(-inf, 0, 0)``): their max ``m``, the sum ``s``
    of ``exp(x - m)``, and (when SMOOTH, else 0) the sum of the logits. Columns at or past
    ``n_cols`` are masked.

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
def _ce_online_row_kernel(
    x_ptr,
    t_ptr,
    loss_ptr,  # (R,) float32: the output ("none") or the scratch the reduction kernel sums
    x_row_stride,
    n_cols,
    ignore_index,
    smoothing,
    BLOCK_V: tl.constexpr,  # columns per loop step
    SMOOTH: tl.constexpr,  # label_smoothing > 0: also accumulate the sum of the logits
    NUM_STAGES: tl.constexpr,  # software-pipelining depth of the loop (1: none)
):
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * x_row_stride
    target = tl.load(t_ptr + row)
    valid = target != ignore_index
    in_range = (target >= 0) & (target < n_cols)
    # x[t] in one scalar load; NaN for an out-of-range target (never an out-of-bounds read).
    x_t = tl.load(x_row + tl.where(in_range, target, 0), mask=valid & in_range, other=float("nan"))
    x_t = x_t.to(tl.float32)

    n_read = tl.where(valid, n_cols, 0)  # an ignored row reads nothing
    m, s, sum_x = _ce_online_stats(x_row, 0, n_read, n_cols, BLOCK_V, SMOOTH, NUM_STAGES)
    loss = _ce_row_loss(m, s, x_t, sum_x, n_cols, smoothing, valid, SMOOTH)
    tl.store(loss_ptr + row, loss)


@triton.jit
def _ce_whole_row_kernel(
    x_ptr,
    t_ptr,
    loss_ptr,
    x_row_stride,
    n_cols,
    ignore_index,
    smoothing,
    BLOCK_V: tl.constexpr,  # next_power_of_two(V): the whole row in one block
    SMOOTH: tl.constexpr,
    EVICT_X: tl.constexpr,  # "" or "evict_first": the logits are read once
):
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * x_row_stride
    target = tl.load(t_ptr + row)
    valid = target != ignore_index
    in_range = (target >= 0) & (target < n_cols)
    x_t = tl.load(x_row + tl.where(in_range, target, 0), mask=valid & in_range, other=float("nan"))
    x_t = x_t.to(tl.float32)

    cols = tl.arange(0, BLOCK_V)
    # An ignored row loads nothing. (A bound rather than `& valid`: the interpreter turns a
    # scalar-and-vector `&` into an int32 mask that tl.load rejects.)
    mask = cols < tl.where(valid, n_cols, 0)
    x = tl.load(x_row + cols, mask=mask, other=float("-inf"), eviction_policy=EVICT_X).to(tl.float32)
    m = tl.max(x, axis=0)
    shift = tl.where(valid, m, 0.0)  # an ignored row is all -inf: keep exp(-inf - 0) = 0
    s = tl.sum(tl.exp(x - shift), axis=0)
    sum_x = 0.0
    if SMOOTH:
        sum_x = tl.sum(tl.where(mask, x, 0.0), axis=0)
    loss = _ce_row_loss(m, s, x_t, sum_x, n_cols, smoothing, valid, SMOOTH)
    tl.store(loss_ptr + row, loss)


@triton.jit
def _ce_split_partial_kernel(
    x_ptr,
    t_ptr,
    stats_ptr,  # (2 or 3, R, n_chunks) float32: chunk max, chunk sum of exp(x - max), chunk sum of x
    x_row_stride,
    n_cols,
    n_chunks,
    chunk_cols,  # columns per chunk, a multiple of BLOCK_V
    plane_stride,  # R * n_chunks
    ignore_index,
    BLOCK_V: tl.constexpr,
    SMOOTH: tl.constexpr,
    NUM_STAGES: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1)
    x_row = x_ptr + row * x_row_stride
    valid = tl.load(t_ptr + row) != ignore_index

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
    x_ptr,
    t_ptr,
    stats_ptr,
    out_ptr,  # REDUCE 0: (R,) per-row losses; else the 0-d output
    x_row_stride,
    n_rows,
    n_cols,
    n_chunks,
    plane_stride,
    ignore_index,
    smoothing,
    ROWS: tl.constexpr,  # rows per program
    CHUNKS: tl.constexpr,  # next_power_of_two(n_chunks)
    SMOOTH: tl.constexpr,
    REDUCE: tl.constexpr,  # 0: write per-row losses; 1: their sum; 2: their mean (grid of 1)
):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    row_mask = rows < n_rows
    rows64 = rows.to(tl.int64)
    target = tl.load(t_ptr + rows64, mask=row_mask, other=0)
    valid = row_mask & (target != ignore_index)
    in_range = (target >= 0) & (target < n_cols)
    x_ptrs = x_ptr + rows64 * x_row_stride + tl.where(in_range, target, 0)
    x_t = tl.load(x_ptrs, mask=valid & in_range, other=float("nan")).to(tl.float32)

    chunks = tl.arange(0, CHUNKS)
    at = rows64[:, None] * n_chunks + chunks[None, :]
    mask = row_mask[:, None] & (chunks < n_chunks)[None, :]
    m_c = tl.load(stats_ptr + at, mask=mask, other=float("-inf"))
    s_c = tl.load(stats_ptr + plane_stride + at, mask=mask, other=0.0)
    m = tl.max(m_c, axis=1)
    # Each chunk's sum was taken against its own max: rescale it to the row's. (Chunks that saw
    # only -inf, and the padding, have m_c = -inf and s_c = 0: they add exp(-inf) * 0 = 0.)
    shift = tl.where(valid, m, 0.0)
    s = tl.sum(s_c * tl.exp(m_c - shift[:, None]), axis=1)
    sum_x = 0.0
    if SMOOTH:
        sum_x = tl.sum(tl.load(stats_ptr + 2 * plane_stride + at, mask=mask, other=0.0), axis=1)
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
    n_rows,
    ignore_index,
    MEAN: tl.constexpr,  # divide by the number of non-ignored rows (NaN when there is none)
    BLOCK_R: tl.constexpr,
):
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


# =================================================================================================
# Config spaces and builders
#
# A build precomputes grids, constexprs and launch options; the launcher takes views and strides,
# allocates the float32 scratch its kernels need (``new_empty``: the harness allocates the
# outputs, never the launcher) and launches.
# =================================================================================================

_WARPS = (1, 2, 4, 8, 16, 32)
_STAGES = (1, 2, 3)
_WHOLE_ROW_MAX_BLOCK = 65536  # widest row kept in registers (64 fp32 values a thread at 32 warps)
_WHOLE_ROW_PER_THREAD = 64
# The looped kernels keep x, the lane sums l (and sx) and the loads in flight across a step:
# at most 32 columns a thread keeps them in registers.
_LOOP_PER_THREAD = 32
_ONLINE_BLOCKS = powers_of_two(64, 8192)
_ONLINE_MAX_STEPS = 512  # smaller blocks than this many steps over the row are not worth timing
_SPLIT_BLOCKS = powers_of_two(512, 4096)
_SPLIT_WARPS = (4, 8, 16)
_SPLITS = (2, 4, 8, 16, 32, 64)
# Splitting only pays while rows alone do not fill the GPU: at most this many phase-1 programs
# (a few waves of a 132-multiprocessor H200), unless it is the smallest split of all.
_SPLIT_MAX_PROGRAMS = 8192
_COMBINE_ELEMENTS = 2048  # one combine block: ROWS * next_power_of_two(chunks) values per plane
_COMBINE_MAX_ROWS = 64  # (more rows than this: several combine programs, then the reduction kernel)
_REDUCE_BLOCK = 1024
_AUX_WARPS = 4  # the small combine and reduction kernels


def _rows_and_vocab(spec: OpSpec) -> tuple[int, int]:
    rows, vocab = spec.inputs[0].shape
    return rows, vocab


def _constants(spec: OpSpec) -> tuple[str, int, float]:
    return str(spec.const("reduction")), int(spec.const("ignore_index")), float(spec.const("label_smoothing"))


def _warp_constraints(elements: Callable[[Config], int], per_thread: int) -> list[Constraint]:
    """Warp counts that suit a block of ``elements(config)`` values: no idle warps (one warp is
    always allowed, so tiny rows keep a config) and at most ``per_thread`` values a thread."""
    return [
        Constraint(
            "every thread holds at least one value (extra warps would idle)",
            lambda c: c["num_warps"] == 1 or 32 * c["num_warps"] <= elements(c),
        ),
        Constraint(
            f"at most {per_thread} values a thread (more would spill registers)",
            lambda c: elements(c) <= per_thread * 32 * c["num_warps"],
        ),
    ]


def _checked(space: Space, config: Config) -> None:
    problems = space.violations(config)
    if problems:
        raise ValueError(f"config {config.key} is not in the space: {'; '.join(problems)}")


Reducer = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], None]


def _reducer(spec: OpSpec) -> Reducer | None:
    """The launcher of the final "mean"/"sum" over per-row losses; None for "none"."""
    reduction, ignore_index, _ = _constants(spec)
    if reduction == "none":
        return None
    rows, _ = _rows_and_vocab(spec)
    block = min(_REDUCE_BLOCK, next_power_of_two(rows))
    mean = reduction == "mean"
    kernel = direct_launch(_ce_reduce_kernel, (1,))

    def reduce(losses: torch.Tensor, target: torch.Tensor, out: torch.Tensor) -> None:
        kernel(losses, target, out, rows, ignore_index, MEAN=mean, BLOCK_R=block, num_warps=_AUX_WARPS)

    return reduce


# ---- online_row ----------------------------------------------------------------------------------


def _online_row_space(spec: OpSpec) -> Space:
    vocab = _rows_and_vocab(spec)[1]
    widest = max(_ONLINE_BLOCKS[0], next_power_of_two(vocab))
    return Space(
        [Param("BLOCK_V", _ONLINE_BLOCKS), Param("num_warps", _WARPS), Param("num_stages", _STAGES)],
        [
            Constraint("BLOCK_V is no wider than the padded row", lambda c: c["BLOCK_V"] <= widest),
            Constraint(
                f"at most {_ONLINE_MAX_STEPS} steps over the row (or the widest block)",
                lambda c: triton.cdiv(vocab, c["BLOCK_V"]) <= _ONLINE_MAX_STEPS or c["BLOCK_V"] == _ONLINE_BLOCKS[-1],
            ),
            *_warp_constraints(lambda c: c["BLOCK_V"], _LOOP_PER_THREAD),
        ],
    )


def _online_row_build(spec: OpSpec, config: Config) -> Launcher:
    _checked(_online_row_space(spec), config)
    rows, vocab = _rows_and_vocab(spec)
    _, ignore_index, smoothing = _constants(spec)
    block, num_warps, num_stages = config["BLOCK_V"], config["num_warps"], config["num_stages"]
    smooth = smoothing > 0
    reduce = _reducer(spec)
    kernel = direct_launch(_ce_online_row_kernel, (rows,))

    def launch(inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> None:
        logits, target = inputs
        out = outputs[0]
        losses = out if reduce is None else out.new_empty((rows,))
        kernel(
            logits, target, losses, logits.stride(0), vocab, ignore_index, smoothing,
            BLOCK_V=block, SMOOTH=smooth, NUM_STAGES=num_stages, num_warps=num_warps, num_stages=num_stages,
        )  # fmt: skip
        if reduce is not None:
            reduce(losses, target, out)

    return launch


# ---- split_vocab ---------------------------------------------------------------------------------


def _split_layout(vocab: int, splits: int, block: int) -> tuple[int, int]:
    """``(chunk_cols, n_chunks)``: about ``vocab / splits`` columns a chunk, rounded up to whole
    blocks (so no loop step straddles two chunks); rounding can leave fewer than ``splits``."""
    chunk_cols = triton.cdiv(triton.cdiv(vocab, splits), block) * block
    return chunk_cols, triton.cdiv(vocab, chunk_cols)


def _split_vocab_space(spec: OpSpec) -> Space:
    rows, vocab = _rows_and_vocab(spec)
    padded = next_power_of_two(vocab)
    smallest = (_SPLITS[0], _SPLIT_BLOCKS[0])
    return Space(
        [
            Param("SPLITS", _SPLITS),
            Param("BLOCK_V", _SPLIT_BLOCKS),
            Param("num_warps", _SPLIT_WARPS),
            Param("num_stages", _STAGES),
        ],
        [
            Constraint(
                "every split holds at least one block (or the smallest split and block)",
                lambda c: c["SPLITS"] * c["BLOCK_V"] <= padded or (c["SPLITS"], c["BLOCK_V"]) == smallest,
            ),
            Constraint(
                f"the split adds parallelism: at most {_SPLIT_MAX_PROGRAMS} programs (or 2 splits)",
                lambda c: rows * c["SPLITS"] <= _SPLIT_MAX_PROGRAMS or c["SPLITS"] == _SPLITS[0],
            ),
            *_warp_constraints(lambda c: c["BLOCK_V"], _LOOP_PER_THREAD),
        ],
    )


def _split_vocab_build(spec: OpSpec, config: Config) -> Launcher:
    _checked(_split_vocab_space(spec), config)
    rows, vocab = _rows_and_vocab(spec)
    reduction, ignore_index, smoothing = _constants(spec)
    block, num_warps, num_stages = config["BLOCK_V"], config["num_warps"], config["num_stages"]
    smooth = smoothing > 0
    chunk_cols, n_chunks = _split_layout(vocab, config["SPLITS"], block)
    planes = 3 if smooth else 2
    plane_stride = rows * n_chunks
    partial = direct_launch(_ce_split_partial_kernel, (rows, n_chunks))

    chunks_p2 = next_power_of_two(n_chunks)
    combine_rows = min(next_power_of_two(rows), _COMBINE_MAX_ROWS, max(1, _COMBINE_ELEMENTS // chunks_p2))
    # One combine program covering every row also does the reduction (two launches in all);
    # otherwise the combine writes per-row losses and the reduction kernel sums them.
    fused = reduction != "none" and rows <= combine_rows
    reduce_mode = (2 if reduction == "mean" else 1) if fused else 0  # REDUCE: 0 per-row, 1 sum, 2 mean
    combine = direct_launch(_ce_split_combine_kernel, (triton.cdiv(rows, combine_rows),))
    reduce = None if fused else _reducer(spec)

    def launch(inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> None:
        logits, target = inputs
        out = outputs[0]
        stats = out.new_empty((planes, rows, n_chunks))
        partial(
            logits, target, stats, logits.stride(0), vocab, n_chunks, chunk_cols, plane_stride, ignore_index,
            BLOCK_V=block, SMOOTH=smooth, NUM_STAGES=num_stages, num_warps=num_warps, num_stages=num_stages,
        )  # fmt: skip
        losses = out if reduce is None else out.new_empty((rows,))
        combine(
            logits, target, stats, losses, logits.stride(0), rows, vocab, n_chunks, plane_stride, ignore_index,
            smoothing, ROWS=combine_rows, CHUNKS=chunks_p2, SMOOTH=smooth, REDUCE=reduce_mode, num_warps=_AUX_WARPS,
        )  # fmt: skip
        if reduce is not None:
            reduce(losses, target, out)

    return launch


# ---- whole_row -----------------------------------------------------------------------------------


def _whole_row_space(spec: OpSpec) -> Space:
    block = next_power_of_two(_rows_and_vocab(spec)[1])
    # No num_stages: the kernel has no loop, so the pipelining depth could change nothing.
    return Space(
        [Param("num_warps", _WARPS), Param("EVICT_X", ("", "evict_first"))],
        [
            Constraint(
                f"the padded row fits in registers (BLOCK_V <= {_WHOLE_ROW_MAX_BLOCK})",
                lambda c: block <= _WHOLE_ROW_MAX_BLOCK,
            ),
            *_warp_constraints(lambda c: block, _WHOLE_ROW_PER_THREAD),
        ],
    )


def _whole_row_build(spec: OpSpec, config: Config) -> Launcher:
    _checked(_whole_row_space(spec), config)
    rows, vocab = _rows_and_vocab(spec)
    _, ignore_index, smoothing = _constants(spec)
    block = next_power_of_two(vocab)
    num_warps, evict_x = config["num_warps"], str(config["EVICT_X"])
    smooth = smoothing > 0
    reduce = _reducer(spec)
    kernel = direct_launch(_ce_whole_row_kernel, (rows,))

    def launch(inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> None:
        logits, target = inputs
        out = outputs[0]
        losses = out if reduce is None else out.new_empty((rows,))
        kernel(
            logits, target, losses, logits.stride(0), vocab, ignore_index, smoothing,
            BLOCK_V=block, SMOOTH=smooth, EVICT_X=evict_x, num_warps=num_warps,
        )  # fmt: skip
        if reduce is not None:
            reduce(losses, target, out)

    return launch


# =================================================================================================
# The op family
# =================================================================================================

_LOGIT_TORCH_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
# F.cross_entropy's other keywords, accepted only at their defaults.
_DEFAULT_ONLY = ("weight", "size_average", "reduce")


def _checked_constants(
    reduction: Any = "mean",
    ignore_index: Any = DEFAULT_IGNORE_INDEX,
    label_smoothing: Any = 0.0,
    **others: Any,
) -> dict[str, Any]:
    """The spec's constants, validated and normalised (an int, a float, a known reduction)."""
    unknown = sorted(k for k in others if k not in _DEFAULT_ONLY)
    if unknown:
        raise UnsupportedWorkload(f"cross_entropy: unknown constants {unknown}")
    given = sorted(k for k, v in others.items() if v is not None)
    if given:
        raise UnsupportedWorkload(f"cross_entropy: {', '.join(given)} is not supported (only None)")
    if not isinstance(reduction, str) or reduction not in REDUCTIONS:
        raise UnsupportedWorkload(f"cross_entropy: reduction must be one of {REDUCTIONS}, not {reduction!r}")
    if isinstance(ignore_index, bool) or not isinstance(ignore_index, int):
        raise UnsupportedWorkload(f"cross_entropy: ignore_index must be an int, not {ignore_index!r}")
    if not -(2**63) <= ignore_index < 2**63:
        raise UnsupportedWorkload(f"cross_entropy: ignore_index {ignore_index} is not an int64")
    if isinstance(label_smoothing, bool) or not isinstance(label_smoothing, int | float):
        raise UnsupportedWorkload(f"cross_entropy: label_smoothing must be a number, not {label_smoothing!r}")
    smoothing = float(label_smoothing)
    if not 0.0 <= smoothing <= 1.0:  # (NaN fails this too)
        raise UnsupportedWorkload(f"cross_entropy: label_smoothing must be in [0, 1], not {label_smoothing!r}")
    return {"reduction": reduction, "ignore_index": int(ignore_index), "label_smoothing": smoothing}


class CrossEntropy(OpFamily):
    name = "cross_entropy"
    summary = "cross-entropy of (R, V) logits against (R,) int64 class targets, float32 loss (F.cross_entropy)"
    shape_help = (
        "the shape of the logits, rows x vocabulary: --shape 8192x128256 is 8192 tokens over a "
        "128256-class vocabulary; the targets are (8192,) int64, the loss float32"
    )
    distributions = ("normal", "large", "peaked")
    backward = "cross_entropy_backward"  # the gradient of the logits, tuned as its own workload
    variants = (
        Variant(
            "online_row",
            "one program per row, walked in BLOCK_V-column steps with a running max and sum (any vocabulary)",
            _online_row_space,
            _online_row_build,
        ),
        Variant(
            "split_vocab",
            "rows split into SPLITS vocabulary chunks reduced in parallel, then combined (few rows, huge vocabulary)",
            _split_vocab_space,
            _split_vocab_build,
        ),
        Variant(
            "whole_row",
            "one program per row, the whole row in registers (vocabulary up to 65536)",
            _whole_row_space,
            _whole_row_build,
        ),
    )

    # ---- specs -----------------------------------------------------------------------------------
    def spec(self, shape: tuple[int, ...], dtype: str, **constants: Any) -> OpSpec:
        shape = tuple(int(s) for s in shape)
        if len(shape) != 2:
            raise UnsupportedWorkload(f"cross_entropy: the logits must be 2-D (rows x vocabulary), not {shape}")
        logits = TensorSpec(shape, dtype_name(dtype))
        spec = OpSpec(self.name, (logits, TensorSpec((shape[0],), "int64")), _checked_constants(**constants))
        self.check_supported(spec)
        return spec

    def spec_for(self, *inputs: torch.Tensor, **constants: Any) -> OpSpec:
        if len(inputs) != 2 or not all(isinstance(t, torch.Tensor) for t in inputs):
            raise UnsupportedWorkload(f"cross_entropy takes (logits, target) tensors, not {len(inputs)} inputs")
        logits, target = inputs
        if logits.dtype not in _LOGIT_TORCH_DTYPES:
            raise UnsupportedWorkload(f"cross_entropy: logits dtype {logits.dtype} is not supported")
        if target.dtype != torch.int64:
            raise UnsupportedWorkload(f"cross_entropy: targets must be int64 class indices, not {target.dtype}")
        spec = OpSpec(self.name, (TensorSpec.of(logits), TensorSpec.of(target)), _checked_constants(**constants))
        self.check_supported(spec)
        return spec

    def check_supported(self, spec: OpSpec) -> None:
        if len(spec.inputs) != 2:
            raise UnsupportedWorkload(f"cross_entropy takes (logits, target), not {len(spec.inputs)} inputs")
        logits, target = spec.inputs
        if logits.dtype not in self.dtypes:
            raise UnsupportedWorkload(f"cross_entropy: logits dtype {logits.dtype} is not supported")
        if target.dtype != "int64":
            raise UnsupportedWorkload(f"cross_entropy: targets must be int64, not {target.dtype}")
        if len(logits.shape) != 2:
            raise UnsupportedWorkload(f"cross_entropy: the logits must be 2-D (rows x vocabulary), not {logits}")
        rows, vocab = logits.shape
        if rows <= 0 or vocab <= 0:
            raise UnsupportedWorkload(f"cross_entropy: empty logits {logits} are not supported")
        if vocab >= 2**31:
            raise UnsupportedWorkload(f"cross_entropy: a vocabulary of {vocab} needs 64-bit column offsets")
        if target.shape != (rows,):
            raise UnsupportedWorkload(f"cross_entropy: targets {target} do not match {rows} rows of logits")
        for t in spec.inputs:
            if not t.is_contiguous:
                raise UnsupportedWorkload(f"cross_entropy: non-contiguous input {t} is not supported")
        _checked_constants(**dict(spec.constants))

    def output_specs(self, spec: OpSpec) -> tuple[TensorSpec, ...]:
        rows = spec.inputs[0].shape[0]
        shape = (rows,) if spec.const("reduction") == "none" else ()
        return (TensorSpec(shape, "float32"),)

    def validation_specs(self, spec: OpSpec) -> list[OpSpec]:
        """The target spec plus the base class's tail row counts (:func:`tail_rows`), the
        vocabulary unchanged; the targets follow the logits' row count (the base class would
        only reshape the logits)."""
        logits, target = spec.inputs
        rows, vocab = logits.shape
        tails = tail_rows(rows, self.row_block)
        specs = [spec]
        for r in tails:
            inputs = (logits.with_shape((r, vocab)), target.with_shape((r,)))
            specs.append(OpSpec(spec.op, inputs, dict(spec.constants)))
        return specs

    # ---- math ------------------------------------------------------------------------------------
    def _loss(self, spec: OpSpec, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        reduction, ignore_index, smoothing = _constants(spec)
        return torch.nn.functional.cross_entropy(
            logits, target, reduction=reduction, ignore_index=ignore_index, label_smoothing=smoothing
        )

    def reference(self, spec: OpSpec, inputs: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        """The training-code form: the logits upcast to float32, then ``F.cross_entropy``."""
        logits, target = inputs
        return (self._loss(spec, logits.float(), target),)

    def reference_fp64(self, spec: OpSpec, inputs: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        logits, target = inputs
        return (self._loss(spec, logits.double(), target),)

    def make_inputs(
        self,
        spec: OpSpec,
        seed: int,
        distribution: str = "normal",
        device: str | torch.device = "cuda",
    ) -> tuple[torch.Tensor, ...]:
        """Logits from ``distribution`` (drawn in float32, rounded to the dtype) and int64 targets
        uniform in ``[0, V)``, with about 10% of the rows (``int(R / 10 + 0.5)``, so never a lone
        row) set to ``ignore_index``; deterministic in ``seed``.

        - ``normal``: standard normal logits (an untrained model: the loss is about log V);
        - ``large``: ``N(0, 1) * 20 + 100``: ``exp`` overflows float32 (past 88.7) in every row at
          any width, so a kernel that skips the max subtraction fails; still finite in float16;
        - ``peaked``: standard normal plus ``30 + log(V)`` on one column of every row: the
          target's column on even rows, another on odd rows (a confident model, right or wrong:
          losses of about 0 and about ``30 + log(V)``).
        """
        logits_spec = spec.inputs[0]
        rows, vocab = logits_spec.shape
        ignore_index = int(spec.const("ignore_index"))
        g = generator(seed, device)
        x = torch.randn((rows, vocab), generator=g, device=device)
        target = torch.randint(0, vocab, (rows,), generator=g, device=device)
        if distribution == "large":
            x = x * 20 + 100
        elif distribution == "peaked":
            # The target's column on even rows, a random one on odd rows. Not a coin flip: with
            # only right rows, every loss would be ~1e-13 (0.0 in float32, for PyTorch too) and
            # the harness's canaries could not tell a zero output apart. Fewer rows are ignored
            # than are odd (or even), so any two rows keep both kinds.
            rows_index = torch.arange(rows, device=device)
            shift = torch.randint(1, max(vocab, 2), (rows,), generator=g, device=device)
            other = (target + shift) % vocab  # any column but the target's (when V > 1)
            hot = torch.where(rows_index % 2 == 0, target, other)
            # 30 + log(V) over the rest: a right row's loss (~V exp(-peak)) is then ~1e-13 at
            # any V, and rounds to 0 in float32 for every implementation alike.
            x[rows_index, hot] += 30.0 + math.log(vocab)
        elif distribution != "normal":
            known = ", ".join(self.distributions)
            raise ValueError(f"cross_entropy: unknown distribution {distribution!r} (known: {known})")
        ignored = torch.randperm(rows, generator=g, device=device)[: int(rows / 10 + 0.5)]
        target[ignored] = ignore_index
        return x.to(logits_spec.torch_dtype), target

    def bytes_moved(self, spec: OpSpec) -> int:
        """The logits and targets read once, the loss written once (the base class's model).

        It counts the logits of ignored rows too, which the kernels skip: on data with many
        ignored rows (padding) a kernel can move fewer bytes than this "minimum".
        """
        return super().bytes_moved(spec)

    def flops(self, spec: OpSpec) -> int:
        # Per logit: a max comparison, a subtraction, an exp, an add into the sum (and one more
        # add into the logit sum with label smoothing).
        per_element = 5 if float(spec.const("label_smoothing")) > 0 else 4
        return per_element * spec.inputs[0].numel


OP = CrossEntropy()

"""Cross-entropy backward ``(dloss, logits, target) -> (dlogits,)``, and the fused training form
``(logits, target) -> (loss, dlogits)``: the gradients of :mod:`kernelsmith.ops.cross_entropy`.

The ops
-------
``cross_entropy_backward`` takes ``dloss``, the gradient of the forward's float32 output (0-d
for "mean" and "sum", ``(R,)`` for "none"), and the forward's inputs: ``logits`` of shape
``(R, V)`` in float16, bfloat16 or float32 and ``target`` of shape ``(R,)`` in int64. Its
constants are the forward's (``reduction``, ``ignore_index``, ``label_smoothing``). Its one
output is ``dlogits``, shaped like the logits and in their dtype; the integer targets have no
gradient.

``cross_entropy_fused`` takes the forward's inputs and constants and returns both the forward's
loss (float32, as :mod:`cross_entropy` computes it) and ``dlogits`` for an upstream gradient of
1: what a training step needs when the loss is the last node of its graph (as Liger-Kernel does:
the gradient is computed during the forward pass, from the statistics the loss needs anyway,
and the backward pass only scales it by the upstream gradient if that is not 1).

The math
--------
For a row ``x`` (V logits) with target ``t``, ``p = softmax(x)`` and label smoothing ``eps``,
the forward's row loss ``(1 - eps)(lse - x[t]) + eps (lse - mean_j x[j])`` has the gradient

    d loss / d x[j] = p[j] - (1 - eps) [j == t] - eps / V

(``d lse / d x[j] = p[j]``; the mean of the logits contributes ``1 / V`` to every column).
The chain rule multiplies it by the row's *scale*: ``dloss`` for "sum", ``dloss[row]`` for
"none", ``dloss / n_valid`` for "mean", where ``n_valid`` is the number of rows whose target is
not ``ignore_index`` (torch divides both of its terms by that count; see the forward). Ignored
rows get a zero gradient whatever ``dloss`` holds (torch's too, even for a NaN upstream
gradient). A target outside ``[0, V)`` that is not ``ignore_index`` makes its row NaN (torch
raises an error instead; the forward's loss is NaN for it too).

Each kernel computes ``p[j] = exp(x[j] - m) / s`` from the forward's row statistics: the row max
``m`` and ``s = sum_j exp(x[j] - m)`` (which never overflow), found in a first walk over the row
(:func:`kernelsmith.ops.cross_entropy._ce_online_stats`, imported) or with the whole row in
registers, then writes

    dlogits[j] = (exp(x[j] - m) / s - eps / V - [j == t] (1 - eps)) * scale

in float32, rounded once to the logits' dtype. The "mean" scale needs ``n_valid``, a count over
every row's target: a one-program kernel counts them (an integer sum: exact, the same on every
run) and writes ``dloss / n_valid`` to a float32 scratch scalar that the gradient kernels read.
When every row is ignored, no row uses the scale (torch's gradient is all zeros then too).

As in PyTorch, ``p[t] - 1`` cancels in float32 for a confident, right row (its true value is
far below float32's resolution at 1): both compute 0 or one float32 ulp there.

The fused op writes each row's loss too, from the same statistics (and ``x[t]``, and the sum of
the row's logits when smoothing), with the forward's own :func:`_ce_row_loss`; "mean" and "sum"
are then the forward's deterministic reduction kernel over those per-row losses.

References
----------
``reference`` is what a training step computes: PyTorch's autograd through the forward's
reference, ``F.cross_entropy(logits.float(), target, ...)``, fed ``dloss``: a float32 gradient
that the ``.float()`` node rounds to the logits' dtype. ``reference_fp64`` is the same autograd
on ``logits.double()`` (and ``dloss.double()``). The fused op's references return the forward's
reference loss and that gradient for ``dloss = 1``.

The variants (shared by both ops)
---------------------------------
``online_row``
    One program per row. Pass 1 walks the vocabulary in ``BLOCK_V``-wide steps for the online
    max and sum (and, fused, the loss); pass 2 walks it again and writes the gradient. Any
    vocabulary; reads the logits twice (the second read may hit in L2).
``split_vocab``
    For few rows and a huge vocabulary: a ``(R, chunks)`` grid reduces each chunk of
    ``~V / SPLITS`` columns to its max and sum (the forward's own phase-1 kernel, imported);
    then a second ``(R, chunks)`` grid, each program first combining its row's chunk statistics
    (a few dozen numbers) and then writing its chunk of the gradient (chunk 0 also writes the
    fused loss). Two launches, plus the "mean" count (and the fused loss's reduction).
``whole_row``
    One program per row with the whole (power-of-two padded) row in registers: one read of the
    logits, one write of the gradient. Only for ``V <= 65536`` (the space is empty beyond).

The config spaces are the forward's spaces for the same logits: the same loops and blocks, the
same register and warp budgets.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import triton
import triton.language as tl

from kernelsmith.ops._base import (
    FINITE_STRESS_DISTRIBUTIONS,
    Launcher,
    OpFamily,
    UnsupportedWorkload,
    Variant,
    generator,
)
from kernelsmith.ops._launch import direct_launch
from kernelsmith.ops.cross_entropy import (
    _AUX_WARPS,
    _REDUCE_BLOCK,
    _ce_online_stats,
    _ce_row_loss,
    _ce_split_partial_kernel,
    _checked,
    _online_row_space,
    _reducer,
    _split_layout,
    _split_vocab_space,
    _whole_row_space,
)
from kernelsmith.ops.cross_entropy import OP as _FORWARD
from kernelsmith.space import Config, Space, next_power_of_two
from kernelsmith.spec import OpSpec, TensorSpec

# How a gradient kernel finds a row's scale (the SCALE constexpr).
_SCALE_SCALAR = 0  # one float32 for every row: dloss ("sum") or the "mean" scratch
_SCALE_PER_ROW = 1  # dloss[row] ("none")
_SCALE_ONE = 2  # an upstream gradient of 1 (the fused op's "sum" and "none")

# =================================================================================================
# Kernels
#
# The forward's conventions: a (R, V) logits matrix with unit column stride, its row stride and
# the gradient's passed explicitly; 64-bit row offsets, 32-bit column offsets; masked logit lanes
# load -inf (exp(-inf) = 0); every value converted to float32 right after its load.
# =================================================================================================


@triton.jit
def _ceb_mean_scale_kernel(
    dloss_ptr,  # the 0-d float32 upstream gradient (unused when UNIT)
    t_ptr,
    scale_ptr,  # (1,) float32 scratch: dloss / n_valid
    n_rows,
    ignore_index,
    UNIT: tl.constexpr,  # an upstream gradient of 1 (the fused op)
    BLOCK_R: tl.constexpr,
):
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
def _ceb_target_logit(x_row, target, valid, n_cols):
    """``x[t]`` in one scalar load (the fused loss); NaN for an out-of-range target."""
    in_range = (target >= 0) & (target < n_cols)
    x_t = tl.load(x_row + tl.where(in_range, target, 0), mask=valid & in_range, other=float("nan"))
    return x_t.to(tl.float32)


@triton.jit
def _ceb_online_row_kernel(
    x_ptr,
    t_ptr,
    scale_ptr,  # see SCALE
    dx_ptr,
    loss_ptr,  # LOSS: (R,) float32 per-row losses (the output or a scratch); else unused
    x_row_stride,
    dx_row_stride,
    n_cols,
    ignore_index,
    smoothing,
    BLOCK_V: tl.constexpr,  # columns per loop step
    SCALE: tl.constexpr,  # 0: scale_ptr[0]; 1: scale_ptr[row]; 2: 1
    LOSS: tl.constexpr,  # also write the row's loss (the fused op)
    SMOOTH: tl.constexpr,  # LOSS and label_smoothing > 0: also sum the logits (for the loss)
    NUM_STAGES: tl.constexpr,
    softcap=1.0,  # CAP: the soft-cap c of logits x = c tanh(u / c) (linear + cross-entropy)
    CAP: tl.constexpr = False,  # the gradient with respect to u: times dx / du = 1 - (x / c)**2
):
    """One row's statistics (and loss), then its gradient; ``dx_ptr`` may be ``x_ptr`` (each
    element is read before it is written, by the same program)."""
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * x_row_stride
    dx_row = dx_ptr + row * dx_row_stride
    target = tl.load(t_ptr + row)
    valid = target != ignore_index
    n_read = tl.where(valid, n_cols, 0)  # an ignored row reads nothing

    # Pass 1: the row's statistics (and its loss).
    m, s, sum_x = _ce_online_stats(x_row, 0, n_read, n_cols, BLOCK_V, SMOOTH, NUM_STAGES)
    if LOSS:
        x_t = _ceb_target_logit(x_row, target, valid, n_cols)
        tl.store(loss_ptr + row, _ce_row_loss(m, s, x_t, sum_x, n_cols, smoothing, valid, SMOOTH))

    # Pass 2: the gradient, every column (zeros for an ignored row).
    shift, inv_s, off, on, t32, scale = _ceb_row_factors(scale_ptr, row, target, valid, m, s, n_cols, smoothing, SCALE)
    cols = tl.arange(0, BLOCK_V)
    for start in tl.range(0, n_cols, BLOCK_V, num_stages=NUM_STAGES):
        offs = start + cols
        x = tl.load(x_row + offs, mask=offs < n_read, other=float("-inf")).to(tl.float32)
        g = (tl.exp(x - shift) * inv_s - off - tl.where(offs == t32, on, 0.0)) * scale
        if CAP:
            xc = tl.where(offs < n_read, x, 0.0) / softcap
            g = g * (1.0 - xc * xc)
        tl.store(dx_row + offs, g.to(dx_ptr.dtype.element_ty), mask=offs < n_cols)


@triton.jit
def _ceb_whole_row_kernel(
    x_ptr,
    t_ptr,
    scale_ptr,
    dx_ptr,
    loss_ptr,
    x_row_stride,
    dx_row_stride,
    n_cols,
    ignore_index,
    smoothing,
    BLOCK_V: tl.constexpr,  # next_power_of_two(V): the whole row in one block
    SCALE: tl.constexpr,
    LOSS: tl.constexpr,
    SMOOTH: tl.constexpr,
    EVICT_X: tl.constexpr,  # "" or "evict_first": the logits are read once
):
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * x_row_stride
    target = tl.load(t_ptr + row)
    valid = target != ignore_index

    cols = tl.arange(0, BLOCK_V)
    # An ignored row loads nothing. (A bound rather than `& valid`: the interpreter turns a
    # scalar-and-vector `&` into an int32 mask that tl.load rejects.)
    mask = cols < tl.where(valid, n_cols, 0)
    x = tl.load(x_row + cols, mask=mask, other=float("-inf"), eviction_policy=EVICT_X).to(tl.float32)
    m = tl.max(x, axis=0)
    e = tl.exp(x - tl.where(valid, m, 0.0))  # an ignored row is all -inf: exp(-inf - 0) = 0
    s = tl.sum(e, axis=0)
    if LOSS:
        sum_x = 0.0
        if SMOOTH:
            sum_x = tl.sum(tl.where(mask, x, 0.0), axis=0)
        x_t = _ceb_target_logit(x_row, target, valid, n_cols)
        tl.store(loss_ptr + row, _ce_row_loss(m, s, x_t, sum_x, n_cols, smoothing, valid, SMOOTH))

    _, inv_s, off, on, t32, scale = _ceb_row_factors(scale_ptr, row, target, valid, m, s, n_cols, smoothing, SCALE)
    g = (e * inv_s - off - tl.where(cols == t32, on, 0.0)) * scale
    tl.store(dx_ptr + row * dx_row_stride + cols, g.to(dx_ptr.dtype.element_ty), mask=cols < n_cols)


@triton.jit
def _ceb_split_grad_kernel(
    x_ptr,
    t_ptr,
    stats_ptr,  # the forward's phase-1 scratch: (2 or 3, R, n_chunks) chunk max, sum (, sum of x)
    scale_ptr,
    dx_ptr,
    loss_ptr,
    x_row_stride,
    dx_row_stride,
    n_cols,
    n_chunks,
    chunk_cols,  # columns per chunk, a multiple of BLOCK_V
    plane_stride,  # R * n_chunks
    ignore_index,
    smoothing,
    BLOCK_V: tl.constexpr,
    CHUNKS: tl.constexpr,  # next_power_of_two(n_chunks)
    SCALE: tl.constexpr,
    LOSS: tl.constexpr,
    SMOOTH: tl.constexpr,
    NUM_STAGES: tl.constexpr,
):
    """Program (row, chunk): combine the row's chunk statistics, then write the chunk's gradient."""
    row = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1)
    x_row = x_ptr + row * x_row_stride
    dx_row = dx_ptr + row * dx_row_stride
    target = tl.load(t_ptr + row)
    valid = target != ignore_index

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
        x_t = _ceb_target_logit(x_row, target, valid, n_cols)
        loss = _ce_row_loss(m, s, x_t, sum_x, n_cols, smoothing, valid, SMOOTH)
        tl.store(loss_ptr + row, loss, mask=chunk == 0)

    shift, inv_s, off, on, t32, scale = _ceb_row_factors(scale_ptr, row, target, valid, m, s, n_cols, smoothing, SCALE)
    n_read = tl.where(valid, n_cols, 0)
    cols = tl.arange(0, BLOCK_V)
    lo = chunk * chunk_cols
    hi = tl.minimum(lo + chunk_cols, n_cols)
    for start in tl.range(lo, hi, BLOCK_V, num_stages=NUM_STAGES):
        offs = start + cols
        x = tl.load(x_row + offs, mask=offs < n_read, other=float("-inf")).to(tl.float32)
        g = (tl.exp(x - shift) * inv_s - off - tl.where(offs == t32, on, 0.0)) * scale
        tl.store(dx_row + offs, g.to(dx_ptr.dtype.element_ty), mask=offs < n_cols)


# =================================================================================================
# Spaces and builders
#
# Both ops share them: a spec's last two inputs are always (logits, target), and its op name
# tells the fused op (which also writes the loss, for an upstream gradient of 1) from the
# backward. A launcher takes strides, allocates its float32 scratch with ``new_empty`` (the
# harness allocates the outputs and forbids any other torch op in a launcher) and launches.
# =================================================================================================

BACKWARD_NAME = "cross_entropy_backward"
FUSED_NAME = "cross_entropy_fused"


def _forward_spec(spec: OpSpec) -> OpSpec:
    """The forward's spec for the same logits, targets and constants."""
    return OpSpec(_FORWARD.name, spec.inputs[-2:], dict(spec.constants))


def _online_space(spec: OpSpec) -> Space:
    return _online_row_space(_forward_spec(spec))


def _split_space(spec: OpSpec) -> Space:
    return _split_vocab_space(_forward_spec(spec))


def _whole_space(spec: OpSpec) -> Space:
    return _whole_row_space(_forward_spec(spec))


class _Plan:
    """What every launcher of one spec shares: the shape, the constants, how the scale is found
    (the SCALE constexpr and, for "mean", the count kernel), and the fused loss's reduction."""

    def __init__(self, spec: OpSpec) -> None:
        logits = spec.inputs[-2]
        self.rows, self.vocab = logits.shape
        self.reduction = str(spec.const("reduction"))
        self.ignore_index = int(spec.const("ignore_index"))
        self.smoothing = float(spec.const("label_smoothing"))
        self.fused = spec.op == FUSED_NAME
        # The kernels' SMOOTH: also sum the logits, which only the fused loss needs.
        self.loss_smooth = self.fused and self.smoothing > 0
        if self.reduction == "mean":
            self.scale_mode = _SCALE_SCALAR
        elif self.fused:
            self.scale_mode = _SCALE_ONE
        else:
            self.scale_mode = _SCALE_PER_ROW if self.reduction == "none" else _SCALE_SCALAR
        self._count = direct_launch(_ceb_mean_scale_kernel, (1,)) if self.reduction == "mean" else None
        self._count_block = min(_REDUCE_BLOCK, next_power_of_two(self.rows))
        # The fused "mean"/"sum" loss: the forward's reduction over per-row losses.
        self.reduce = _reducer(_forward_spec(spec)) if self.fused else None

    def prepare(
        self, inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """One call's tensors, ``(logits, target, dlogits, scale, losses, loss)``, after
        launching the "mean" count. ``scale`` is what the gradient kernels read as scale_ptr
        (the count's scratch, or dloss); ``losses`` is where the fused kernels write per-row
        losses (the output for "none", else a scratch that ``finish`` reduces into ``loss``).
        Pointers a kernel does not read are the gradient itself."""
        if self.fused:
            logits, target = inputs
            loss, dlogits = outputs
            dloss = dlogits
        else:
            dloss, logits, target = inputs
            (dlogits,) = outputs
            loss = dlogits
        scale = dloss
        if self._count is not None:
            scale = dlogits.new_empty((1,), dtype=torch.float32)
            self._count(
                dloss, target, scale, self.rows, self.ignore_index,
                UNIT=self.fused, BLOCK_R=self._count_block, num_warps=_AUX_WARPS,
            )  # fmt: skip
        losses = dlogits
        if self.fused:
            losses = loss if self.reduce is None else dlogits.new_empty((self.rows,), dtype=torch.float32)
        return logits, target, dlogits, scale, losses, loss

    def finish(self, target: torch.Tensor, losses: torch.Tensor, loss: torch.Tensor) -> None:
        """The fused "mean"/"sum": the forward's reduction of the per-row losses into the loss."""
        if self.reduce is not None:
            self.reduce(losses, target, loss)


# ---- online_row ----------------------------------------------------------------------------------


def _online_row_build(spec: OpSpec, config: Config) -> Launcher:
    _checked(_online_space(spec), config)
    plan = _Plan(spec)
    block, num_warps, num_stages = config["BLOCK_V"], config["num_warps"], config["num_stages"]
    kernel = direct_launch(_ceb_online_row_kernel, (plan.rows,))

    def launch(inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> None:
        logits, target, dlogits, scale, losses, loss = plan.prepare(inputs, outputs)
        kernel(
            logits, target, scale, dlogits, losses, logits.stride(0), dlogits.stride(0), plan.vocab,
            plan.ignore_index, plan.smoothing, BLOCK_V=block, SCALE=plan.scale_mode, LOSS=plan.fused,
            SMOOTH=plan.loss_smooth, NUM_STAGES=num_stages, num_warps=num_warps, num_stages=num_stages,
        )  # fmt: skip
        plan.finish(target, losses, loss)

    return launch


# ---- split_vocab ---------------------------------------------------------------------------------


def _split_vocab_build(spec: OpSpec, config: Config) -> Launcher:
    _checked(_split_space(spec), config)
    plan = _Plan(spec)
    rows, vocab = plan.rows, plan.vocab
    block, num_warps, num_stages = config["BLOCK_V"], config["num_warps"], config["num_stages"]
    chunk_cols, n_chunks = _split_layout(vocab, config["SPLITS"], block)
    planes = 3 if plan.loss_smooth else 2
    plane_stride = rows * n_chunks
    partial = direct_launch(_ce_split_partial_kernel, (rows, n_chunks))
    grad = direct_launch(_ceb_split_grad_kernel, (rows, n_chunks))
    chunks_p2 = next_power_of_two(n_chunks)

    def launch(inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> None:
        logits, target, dlogits, scale, losses, loss = plan.prepare(inputs, outputs)
        stats = dlogits.new_empty((planes, rows, n_chunks), dtype=torch.float32)
        partial(
            logits, target, stats, logits.stride(0), vocab, n_chunks, chunk_cols, plane_stride, plan.ignore_index,
            BLOCK_V=block, SMOOTH=plan.loss_smooth, NUM_STAGES=num_stages, num_warps=num_warps, num_stages=num_stages,
        )  # fmt: skip
        grad(
            logits, target, stats, scale, dlogits, losses, logits.stride(0), dlogits.stride(0), vocab, n_chunks,
            chunk_cols, plane_stride, plan.ignore_index, plan.smoothing, BLOCK_V=block, CHUNKS=chunks_p2,
            SCALE=plan.scale_mode, LOSS=plan.fused, SMOOTH=plan.loss_smooth, NUM_STAGES=num_stages,
            num_warps=num_warps, num_stages=num_stages,
        )  # fmt: skip
        plan.finish(target, losses, loss)

    return launch


# ---- whole_row -----------------------------------------------------------------------------------


def _whole_row_build(spec: OpSpec, config: Config) -> Launcher:
    _checked(_whole_space(spec), config)
    plan = _Plan(spec)
    block = next_power_of_two(plan.vocab)
    num_warps, evict_x = config["num_warps"], str(config["EVICT_X"])
    kernel = direct_launch(_ceb_whole_row_kernel, (plan.rows,))

    def launch(inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> None:
        logits, target, dlogits, scale, losses, loss = plan.prepare(inputs, outputs)
        kernel(
            logits, target, scale, dlogits, losses, logits.stride(0), dlogits.stride(0), plan.vocab,
            plan.ignore_index, plan.smoothing, BLOCK_V=block, SCALE=plan.scale_mode, LOSS=plan.fused,
            SMOOTH=plan.loss_smooth, EVICT_X=evict_x, num_warps=num_warps,
        )  # fmt: skip
        plan.finish(target, losses, loss)

    return launch


# =================================================================================================
# The op families
# =================================================================================================

_VARIANTS = (
    Variant(
        "online_row",
        "one program per row: an online max/sum pass over BLOCK_V-column steps, then a gradient pass",
        _online_space,
        _online_row_build,
    ),
    Variant(
        "split_vocab",
        "(row, chunk) programs: chunk statistics, then each chunk combines its row's and writes its gradient",
        _split_space,
        _split_vocab_build,
    ),
    Variant(
        "whole_row",
        "one program per row, the whole row in registers: one read, one write (vocabulary up to 65536)",
        _whole_space,
        _whole_row_build,
    ),
)


def _autograd(
    dloss: torch.Tensor | None,
    logits: torch.Tensor,
    target: torch.Tensor,
    constants: dict[str, Any],
    dtype: torch.dtype,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(loss, dlogits)``: ``F.cross_entropy(logits.to(dtype), target)`` and its gradient for the
    logits (in their own dtype) by autograd, fed ``dloss`` (None: ones, the fused op's)."""
    with torch.enable_grad():
        leaf = logits.detach().requires_grad_()
        loss = torch.nn.functional.cross_entropy(
            leaf.to(dtype), target, reduction=constants["reduction"], ignore_index=constants["ignore_index"],
            label_smoothing=constants["label_smoothing"],
        )  # fmt: skip
        upstream = torch.ones_like(loss) if dloss is None else dloss.detach().to(dtype)
        (dlogits,) = torch.autograd.grad(loss, leaf, upstream)
    return loss.detach(), dlogits.detach()


class _CrossEntropyGradient(OpFamily):
    """What the backward and the fused op share: the forward's distributions, spaces, kernels."""

    distributions = _FORWARD.distributions
    stress_distributions = FINITE_STRESS_DISTRIBUTIONS  # no nonfinite: see kernelsmith.ops._base
    variants = _VARIANTS

    def _logits_spec(self, spec: OpSpec) -> TensorSpec:
        return spec.inputs[-2]

    def stressed_inputs(self, spec: OpSpec) -> tuple[int, ...]:
        """The stress data goes into the logits (second to last), not the upstream gradient."""
        return (len(spec.inputs) - 2,)


class CrossEntropyBackward(_CrossEntropyGradient):
    name = BACKWARD_NAME
    summary = "gradient dlogits of cross-entropy given dloss, the (R, V) logits and (R,) int64 targets"
    shape_help = (
        "the shape of the logits, rows x vocabulary: --shape 8192x128256 is 8192 tokens over a "
        "128256-class vocabulary; dloss is 0-d float32 ((8192,) with reduction=none), dlogits is "
        "like the logits"
    )

    # ---- specs -----------------------------------------------------------------------------------
    def spec(self, shape: tuple[int, ...], dtype: str, **constants: Any) -> OpSpec:
        forward = _FORWARD.spec(shape, dtype, **constants)
        return self._from_forward(forward)

    def _from_forward(self, forward: OpSpec) -> OpSpec:
        rows = forward.inputs[0].shape[0]
        dloss = TensorSpec((rows,) if forward.const("reduction") == "none" else (), "float32")
        spec = OpSpec(self.name, (dloss, *forward.inputs), dict(forward.constants))
        self.check_supported(spec)
        return spec

    def spec_for(self, *inputs: torch.Tensor, **constants: Any) -> OpSpec:
        if len(inputs) != 3 or not all(isinstance(t, torch.Tensor) for t in inputs):
            raise UnsupportedWorkload(f"{self.name} takes (dloss, logits, target) tensors, not {len(inputs)} inputs")
        dloss, logits, target = inputs
        if dloss.dtype != torch.float32:
            raise UnsupportedWorkload(f"{self.name}: dloss must be float32 (the loss's dtype), not {dloss.dtype}")
        forward = _FORWARD.spec_for(logits, target, **constants)
        spec = OpSpec(self.name, (TensorSpec.of(dloss), *forward.inputs), dict(forward.constants))
        self.check_supported(spec)
        return spec

    def check_supported(self, spec: OpSpec) -> None:
        if len(spec.inputs) != 3:
            raise UnsupportedWorkload(f"{self.name} takes (dloss, logits, target), not {len(spec.inputs)} inputs")
        _FORWARD.check_supported(_forward_spec(spec))
        dloss = spec.inputs[0]
        (expected,) = _FORWARD.output_specs(_forward_spec(spec))
        if dloss != expected:
            raise UnsupportedWorkload(
                f"{self.name}: dloss must be {expected} for reduction={spec.const('reduction')!r}, not {dloss}"
            )

    def output_specs(self, spec: OpSpec) -> tuple[TensorSpec, ...]:
        """``(dlogits,)``, like the logits."""
        return (self._logits_spec(spec),)

    def validation_specs(self, spec: OpSpec) -> list[OpSpec]:
        """The forward's tails (1, 7 and an odd row count, the vocabulary unchanged), dloss
        following the row count for "none"."""
        return [self._from_forward(s) for s in _FORWARD.validation_specs(_forward_spec(spec))]

    # ---- math ------------------------------------------------------------------------------------
    def reference(self, spec: OpSpec, inputs: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        """Autograd through ``F.cross_entropy(logits.float(), ...)``: a float32 gradient rounded
        to the logits' dtype."""
        dloss, logits, target = inputs
        return (_autograd(dloss, logits, target, dict(spec.constants), torch.float32)[1],)

    def reference_fp64(self, spec: OpSpec, inputs: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        dloss, logits, target = inputs
        return (_autograd(dloss, logits.double(), target, dict(spec.constants), torch.float64)[1],)

    def make_inputs(
        self,
        spec: OpSpec,
        seed: int,
        distribution: str = "normal",
        device: str | torch.device = "cuda",
    ) -> tuple[torch.Tensor, ...]:
        """The forward's logits and targets for ``distribution`` (about 10% of the rows ignored),
        and ``dloss`` drawn from a second generator: magnitudes uniform in [0.5, 2) with a random
        sign (never so small that a low-precision gradient would underflow to all zeros)."""
        logits, target = _FORWARD.make_inputs(_forward_spec(spec), seed, distribution, device)
        g = generator(seed ^ 0x5EED_D1FF, device)
        shape = spec.inputs[0].shape
        magnitude = 0.5 + 1.5 * torch.rand(shape, generator=g, device=device)
        sign = torch.randint(0, 2, shape, generator=g, device=device) * 2 - 1
        return magnitude * sign, logits, target

    def bytes_moved(self, spec: OpSpec) -> int:
        """dloss, the logits and targets read once, dlogits written once (online_row and
        split_vocab read the logits twice: their floor is one logits read higher)."""
        return super().bytes_moved(spec)

    def flops(self, spec: OpSpec) -> int:
        # Per logit: the statistics (a max comparison, a subtraction, an exp, an add), then the
        # gradient (a subtraction, an exp, a multiply, a subtraction, a compare-and-select).
        return 9 * self._logits_spec(spec).numel


class CrossEntropyFused(_CrossEntropyGradient):
    name = FUSED_NAME
    summary = "cross-entropy loss and its gradient dlogits (upstream gradient 1) in one walk over the logits"
    shape_help = (
        "the shape of the logits, rows x vocabulary: --shape 8192x128256 is 8192 tokens over a "
        "128256-class vocabulary; the loss is float32 (0-d, or (8192,) with reduction=none), dlogits "
        "is like the logits"
    )

    # ---- specs -----------------------------------------------------------------------------------
    def spec(self, shape: tuple[int, ...], dtype: str, **constants: Any) -> OpSpec:
        forward = _FORWARD.spec(shape, dtype, **constants)
        return OpSpec(self.name, forward.inputs, dict(forward.constants))

    def spec_for(self, *inputs: torch.Tensor, **constants: Any) -> OpSpec:
        forward = _FORWARD.spec_for(*inputs, **constants)
        return OpSpec(self.name, forward.inputs, dict(forward.constants))

    def check_supported(self, spec: OpSpec) -> None:
        _FORWARD.check_supported(_forward_spec(spec))

    def output_specs(self, spec: OpSpec) -> tuple[TensorSpec, ...]:
        """``(loss, dlogits)``: the forward's float32 loss, and the gradient like the logits."""
        return (*_FORWARD.output_specs(_forward_spec(spec)), self._logits_spec(spec))

    def validation_specs(self, spec: OpSpec) -> list[OpSpec]:
        return [OpSpec(self.name, s.inputs, dict(s.constants)) for s in _FORWARD.validation_specs(_forward_spec(spec))]

    # ---- math ------------------------------------------------------------------------------------
    def reference(self, spec: OpSpec, inputs: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        """The forward's reference loss and its gradient (for an upstream gradient of 1)."""
        logits, target = inputs
        return _autograd(None, logits, target, dict(spec.constants), torch.float32)

    def reference_fp64(self, spec: OpSpec, inputs: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        logits, target = inputs
        return _autograd(None, logits.double(), target, dict(spec.constants), torch.float64)

    def make_inputs(
        self,
        spec: OpSpec,
        seed: int,
        distribution: str = "normal",
        device: str | torch.device = "cuda",
    ) -> tuple[torch.Tensor, ...]:
        """The forward's inputs (see :meth:`CrossEntropy.make_inputs`)."""
        return _FORWARD.make_inputs(_forward_spec(spec), seed, distribution, device)

    def flops(self, spec: OpSpec) -> int:
        # The forward's per-logit work (4, 5 with smoothing), then the gradient's 5.
        return _FORWARD.flops(_forward_spec(spec)) + 5 * self._logits_spec(spec).numel


OP = CrossEntropyBackward()
FUSED = CrossEntropyFused()

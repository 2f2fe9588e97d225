"""The config spaces and launchers of the cross-entropy families (:mod:`kernelsmith.ops.cross_entropy`
and :mod:`kernelsmith.ops.cross_entropy_backward`, whose docstrings explain the variants); their
kernels are in :mod:`kernelsmith.ops._cross_entropy_kernels`.

A build precomputes grids, constexprs and launch options; the launcher takes views and strides,
allocates the float32 scratch its kernels need (``new_empty``: the harness allocates the outputs
and forbids any other torch op in a launcher) and launches. The backward and the fused op share
the forward's spaces for the same logits (the same loops and blocks, the same register and warp
budgets) and one set of builders: a spec's last two inputs are always (logits, target), and its
op name tells the fused op (which also writes the loss, for an upstream gradient of 1) from the
backward.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import triton

from kernelsmith.ops._base import Launcher
from kernelsmith.ops._cross_entropy_kernels import (
    _ce_online_row_kernel,
    _ce_reduce_kernel,
    _ce_split_combine_kernel,
    _ce_split_partial_kernel,
    _ce_whole_row_kernel,
    _ceb_mean_scale_kernel,
    _ceb_online_row_kernel,
    _ceb_split_grad_kernel,
    _ceb_whole_row_kernel,
)
from kernelsmith.ops._launch import direct_launch
from kernelsmith.space import Config, Constraint, Param, Space, next_power_of_two, powers_of_two
from kernelsmith.spec import OpSpec

# The kernels' module and this one, for Variant.modules of a family elsewhere that runs their
# code (the linear + cross-entropy families), so that a change here changes its source hash too.
CROSS_ENTROPY_MODULES = ("kernelsmith.ops._cross_entropy_kernels", __name__)

FORWARD_NAME = "cross_entropy"
BACKWARD_NAME = "cross_entropy_backward"
FUSED_NAME = "cross_entropy_fused"

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
_REDUCE_BLOCK = 1024  # rows a step of the reduction and of the "mean" count
_AUX_WARPS = 4  # the small combine, reduction and count kernels

# How a gradient kernel finds a row's scale (the SCALE constexpr).
_SCALE_SCALAR = 0  # one float32 for every row: dloss ("sum") or the "mean" scratch
_SCALE_PER_ROW = 1  # dloss[row] ("none")
_SCALE_ONE = 2  # an upstream gradient of 1 (the fused op's "sum" and "none")


def _rows_and_vocab(spec: OpSpec) -> tuple[int, int]:
    """The logits' shape: the last two inputs of every spec are (logits, target)."""
    rows, vocab = spec.inputs[-2].shape
    return rows, vocab


def _constants(spec: OpSpec) -> tuple[str, int, float]:
    return str(spec.const("reduction")), int(spec.const("ignore_index")), float(spec.const("label_smoothing"))


def _forward_spec(spec: OpSpec) -> OpSpec:
    """The forward's spec for the same logits, targets and constants."""
    return OpSpec(FORWARD_NAME, spec.inputs[-2:], dict(spec.constants))


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


def _split_layout(vocab: int, splits: int, block: int) -> tuple[int, int]:
    """``(chunk_cols, n_chunks)``: about ``vocab / splits`` columns a chunk, rounded up to whole
    blocks (so no loop step straddles two chunks); rounding can leave fewer than ``splits``."""
    chunk_cols = triton.cdiv(triton.cdiv(vocab, splits), block) * block
    return chunk_cols, triton.cdiv(vocab, chunk_cols)


# =================================================================================================
# The spaces (of every op: they read only the logits' shape)
# =================================================================================================


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


def _online_meta(config: Config) -> dict[str, Any]:
    """online_row's and split_vocab's loop constexprs and launch options, of any of the ops."""
    stages = config["num_stages"]
    return {"BLOCK_V": config["BLOCK_V"], "NUM_STAGES": stages, "num_warps": config["num_warps"], "num_stages": stages}


def _whole_meta(spec: OpSpec, config: Config) -> dict[str, Any]:
    """whole_row's constexprs and launch options, of any of the ops."""
    block = next_power_of_two(_rows_and_vocab(spec)[1])
    return {"BLOCK_V": block, "EVICT_X": str(config["EVICT_X"]), "num_warps": config["num_warps"]}


# =================================================================================================
# The forward's builders
# =================================================================================================


def _row_loss_launcher(spec: OpSpec, kernel: Any, meta: dict[str, Any]) -> Launcher:
    """A launcher of ``kernel``, one program per row writing its loss (online_row, whole_row):
    into the output for "none", else into a scratch that the reduction kernel sums."""
    rows, vocab = _rows_and_vocab(spec)
    _, ignore_index, smoothing = _constants(spec)
    meta = {**meta, "SMOOTH": smoothing > 0}
    reduce = _reducer(spec)
    launch_kernel = direct_launch(kernel, (rows,))

    def launch(inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> None:
        logits, target = inputs
        out = outputs[0]
        losses = out if reduce is None else out.new_empty((rows,))
        launch_kernel(logits, target, losses, logits.stride(0), vocab, ignore_index, smoothing, **meta)
        if reduce is not None:
            reduce(losses, target, out)

    return launch


def _online_row_build(spec: OpSpec, config: Config) -> Launcher:
    _checked(_online_row_space(spec), config)
    return _row_loss_launcher(spec, _ce_online_row_kernel, _online_meta(config))


def _whole_row_build(spec: OpSpec, config: Config) -> Launcher:
    _checked(_whole_row_space(spec), config)
    return _row_loss_launcher(spec, _ce_whole_row_kernel, _whole_meta(spec, config))


def _split_vocab_build(spec: OpSpec, config: Config) -> Launcher:
    _checked(_split_vocab_space(spec), config)
    rows, vocab = _rows_and_vocab(spec)
    reduction, ignore_index, smoothing = _constants(spec)
    block = config["BLOCK_V"]
    smooth = smoothing > 0
    chunk_cols, n_chunks = _split_layout(vocab, config["SPLITS"], block)
    planes = 3 if smooth else 2
    plane_stride = rows * n_chunks
    partial = direct_launch(_ce_split_partial_kernel, (rows, n_chunks))
    meta = _online_meta(config)

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
            SMOOTH=smooth, **meta,
        )  # fmt: skip
        losses = out if reduce is None else out.new_empty((rows,))
        combine(
            logits, target, stats, losses, logits.stride(0), rows, vocab, n_chunks, plane_stride, ignore_index,
            smoothing, ROWS=combine_rows, CHUNKS=chunks_p2, SMOOTH=smooth, REDUCE=reduce_mode, num_warps=_AUX_WARPS,
        )  # fmt: skip
        if reduce is not None:
            reduce(losses, target, out)

    return launch


# =================================================================================================
# The gradient's builders (backward and fused)
# =================================================================================================


def scale_mode(reduction: str, fused: bool) -> int:
    """The SCALE constexpr of the gradient kernels: "mean" reads the count kernel's scratch, the
    fused op's other reductions an upstream gradient of 1, the backward's dloss (one scalar for
    "sum", one a row for "none")."""
    if reduction == "mean":
        return _SCALE_SCALAR
    if fused:
        return _SCALE_ONE
    return _SCALE_PER_ROW if reduction == "none" else _SCALE_SCALAR


class _Plan:
    """What every launcher of one spec shares: the shape, the constants, how the scale is found
    (the SCALE constexpr and, for "mean", the count kernel), and the fused loss's reduction."""

    def __init__(self, spec: OpSpec) -> None:
        self.rows, self.vocab = _rows_and_vocab(spec)
        self.reduction, self.ignore_index, self.smoothing = _constants(spec)
        self.fused = spec.op == FUSED_NAME
        # The kernels' SMOOTH: also sum the logits, which only the fused loss needs.
        self.loss_smooth = self.fused and self.smoothing > 0
        self.scale_mode = scale_mode(self.reduction, self.fused)
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

    def kernel_meta(self) -> dict[str, Any]:
        """The constexprs every gradient kernel takes from the plan."""
        return {"SCALE": self.scale_mode, "LOSS": self.fused, "SMOOTH": self.loss_smooth}


def _row_grad_launcher(plan: _Plan, kernel: Any, meta: dict[str, Any]) -> Launcher:
    """A launcher of ``kernel``, one program per row writing its gradient (and fused, its loss):
    online_row, whole_row."""
    launch_kernel = direct_launch(kernel, (plan.rows,))
    meta = {**plan.kernel_meta(), **meta}

    def launch(inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> None:
        logits, target, dlogits, scale, losses, loss = plan.prepare(inputs, outputs)
        launch_kernel(
            logits, target, scale, dlogits, losses, logits.stride(0), dlogits.stride(0), plan.vocab,
            plan.ignore_index, plan.smoothing, **meta,
        )  # fmt: skip
        plan.finish(target, losses, loss)

    return launch


def _grad_online_row_build(spec: OpSpec, config: Config) -> Launcher:
    _checked(_online_row_space(spec), config)
    return _row_grad_launcher(_Plan(spec), _ceb_online_row_kernel, _online_meta(config))


def _grad_whole_row_build(spec: OpSpec, config: Config) -> Launcher:
    _checked(_whole_row_space(spec), config)
    return _row_grad_launcher(_Plan(spec), _ceb_whole_row_kernel, _whole_meta(spec, config))


def _grad_split_vocab_build(spec: OpSpec, config: Config) -> Launcher:
    _checked(_split_vocab_space(spec), config)
    plan = _Plan(spec)
    rows, vocab = plan.rows, plan.vocab
    block = config["BLOCK_V"]
    chunk_cols, n_chunks = _split_layout(vocab, config["SPLITS"], block)
    planes = 3 if plan.loss_smooth else 2
    plane_stride = rows * n_chunks
    partial = direct_launch(_ce_split_partial_kernel, (rows, n_chunks))
    grad = direct_launch(_ceb_split_grad_kernel, (rows, n_chunks))
    chunks_p2 = next_power_of_two(n_chunks)
    meta = _online_meta(config)

    def launch(inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> None:
        logits, target, dlogits, scale, losses, loss = plan.prepare(inputs, outputs)
        stats = dlogits.new_empty((planes, rows, n_chunks), dtype=torch.float32)
        partial(
            logits, target, stats, logits.stride(0), vocab, n_chunks, chunk_cols, plane_stride, plan.ignore_index,
            SMOOTH=plan.loss_smooth, **meta,
        )  # fmt: skip
        grad(
            logits, target, stats, scale, dlogits, losses, logits.stride(0), dlogits.stride(0), vocab, n_chunks,
            chunk_cols, plane_stride, plan.ignore_index, plan.smoothing, CHUNKS=chunks_p2, **plan.kernel_meta(),
            **meta,
        )  # fmt: skip
        plan.finish(target, losses, loss)

    return launch

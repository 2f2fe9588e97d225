"""Softmax over the last dimension: ``y = exp(x - max(x)) / sum(exp(x - max(x)))`` row by row.

The op
------
One input ``x`` of shape ``(..., N)`` (at least one dimension) in float16, bfloat16 or float32;
one output of the same shape and dtype. Every leading dimension is flattened into rows, so the
kernels see a ``(rows, N)`` matrix and normalise each row on its own. Only the last dimension is
supported: ``dim`` is part of the spec's constants and is always ``-1`` (``dim = x.ndim - 1`` is
the same thing and is normalised to ``-1``; any other ``dim`` is an :class:`UnsupportedWorkload`).

A temperature is the constant ``scale``: the op is then ``softmax(x * scale)`` (``x / t`` is
``scale = 1 / t``), the multiply done in float32 on the loaded values, so that no scaled copy of
``x`` is written and read back. ``scale`` is any finite non-zero number and is left out of the
spec's constants when it is 1 (every plain softmax's workload hashes as before); the kernels
take it as an argument and multiply only under their ``HAS_SCALE`` constexpr, so a plain softmax
compiles to the same code as without it. With a scale the reference is ``torch.softmax(x.float()
* scale, -1).to(x.dtype)`` (the float64 truth scales in float64). There is no softmax backward
family: a call whose inputs need gradients runs the user's own code.

The math, and why every kernel subtracts the row maximum
---------------------------------------------------------
``softmax(x)_j = exp(x_j) / sum_k exp(x_k)`` is unchanged when a constant ``c`` is subtracted
from every ``x_j`` (it cancels between numerator and denominator). Kernels subtract the row
maximum ``m``: every exponent is then ``<= 0``, so nothing overflows (``exp(89)`` is already
``inf`` in float32, and the "large" input distribution below has values past 100), and the
largest term is exactly ``exp(0) = 1``, so the sum is ``>= 1`` and never underflows to zero.

All arithmetic happens in float32 whatever the storage dtype: values are converted right after
the load and rounded once, to the output dtype, right before the store. Masked lanes (columns
past ``N`` when ``N`` is not a power of two) load ``-inf``: ``-inf`` never wins the max and
contributes ``exp(-inf - m) = 0`` to the sum, so padding changes nothing. A row that is ``-inf``
throughout has no defined softmax and comes out NaN, as it does from ``torch.softmax``.

The kernels write ``tl.exp`` rather than ``tl.exp2`` with a ``log2(e)`` factor: on NVIDIA GPUs
Triton already compiles a float32 ``tl.exp`` to a multiply by ``log2(e)`` and the hardware's
``ex2.approx`` instruction, so spelling it out by hand would gain nothing.

The variants
------------
``whole_row``
    One program per row, the whole (power-of-two padded) row held in registers: one read of
    ``x``, one write of ``y``. The default choice for rows up to a few thousand columns.
``online``
    One program per row, the row walked in blocks of ``BLOCK_N`` columns, so any width works with
    a fixed register footprint. The first loop keeps a running max ``m`` and a running sum
    ``l = sum exp(x - m)`` (the "online softmax" of Milakov & Gimelshein, 2018: when ``m`` grows,
    ``l`` is rescaled by ``exp(m_old - m_new)``); the second loop reads ``x`` again and writes
    ``exp(x - m) / l``. It reads ``x`` twice (the second read usually hits L2), which is the
    price of handling rows too wide for registers.
``multi_row``
    ``ROWS`` rows per program as one 2-D ``[ROWS, BLOCK_N]`` block. For narrow rows (say
    ``N <= 256``) a one-row program has too little work to hide memory latency; several rows per
    program give each warp enough independent loads.
``persistent``
    The whole-row kernel, but with a fixed grid of ``PROGRAMS_PER_SM`` programs per
    multiprocessor, each walking rows ``pid, pid + programs, ...``. Fewer, longer programs pay
    the program start-up once and let the compiler pipeline the next row's load (``num_stages``)
    under the current row's arithmetic; the Triton tutorial's fused softmax is built this way.
``aligned_row``
    The whole-row kernel on a row cut into a 16-byte-aligned body (vector loads and stores) and a
    short head and tail, for widths that are not a multiple of 16 (rows Triton cannot prove
    aligned): see the row-wise skeleton's section on them.
``split_row``
    ``(row, chunk)`` programs and two launches: each chunk's max and sum of exponentials, then
    each chunk's probabilities with the row's max and sum (the chunks' sums rescaled to the row
    max, as ``online`` rescales its running sum). For vocabulary-sized rows and for few rows.

Each variant has a small config space (about 150 configs in all for a 1k-8k wide row, fewer for
narrower or wider rows): warp counts, block shapes and, for the two kernels with a loop, the
software-pipelining depth ``num_stages``. Loop-free kernels (``whole_row``, ``multi_row``) have no
``num_stages``: the compiler pipelines loops only, and their code is identical for every value.
Constraints keep only configs that compile and waste no whole warps (the row-wise skeleton's,
:mod:`kernelsmith.ops._rowwise`, which also launches every kernel here).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import torch
import triton
import triton.language as tl

from kernelsmith.ops import _rowwise as skeleton
from kernelsmith.ops._base import Launcher, OpFamily, UnsupportedWorkload, Variant, generator
from kernelsmith.ops._last_dim import check_last_dim, one_tensor
from kernelsmith.space import Config, Space
from kernelsmith.spec import OpSpec, TensorSpec

# =================================================================================================
# Kernels
#
# Common conventions: x and y are (rows, N) matrices with unit column stride; their row strides
# are passed explicitly. Row offsets are computed in int64 (``row.to(tl.int64) * stride``) so
# that tensors with more than 2**31 elements address correctly. ``y_ptr.dtype.element_ty`` is the
# output's storage dtype, so one kernel serves fp16, bf16 and fp32.
# =================================================================================================


@triton.jit
def _scaled(x, mask, scale, HAS_SCALE: tl.constexpr):
    """``x * scale`` (float32 ``x``, the loaded block) on the lanes of ``mask`` and -inf on the
    others, with ``HAS_SCALE``; ``x`` itself without. The padding is set again after the multiply
    because a negative scale would turn the padding's -inf into +inf."""
    if HAS_SCALE:
        x = tl.where(mask, x * scale, float("-inf"))
    return x


@triton.jit
def _softmax_whole_row_kernel(
    x_ptr, y_ptr, x_row_stride, y_row_stride, n_cols,
    scale,  # the constant x is multiplied by (1 / temperature); read only with HAS_SCALE
    BLOCK_N: tl.constexpr,  # next_power_of_two(n_cols): the whole row in one block
    EVICT_X: tl.constexpr,  # "" or "evict_first": x is read once, so it need not stay in L2
    HAS_SCALE: tl.constexpr,  # False: no multiply is compiled (the plain softmax)
):
    scale = tl.cast(scale, tl.float32)  # float32 math even where Inductor passes a Python float as fp64
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < n_cols

    # Padding lanes read -inf: they never win the max, and exp(-inf - m) = 0 adds nothing.
    x = tl.load(x_ptr + row * x_row_stride + cols, mask=mask, other=float("-inf"), eviction_policy=EVICT_X)
    x = _scaled(x.to(tl.float32), mask, scale, HAS_SCALE)

    m = tl.max(x, axis=0)  # the row max: every exponent below is <= 0, so nothing overflows
    p = tl.exp(x - m)  # unnormalised probabilities, the largest exactly 1
    y = p / tl.sum(p, axis=0)  # the sum is >= 1: no division by zero, no underflow

    tl.store(y_ptr + row * y_row_stride + cols, y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _softmax_online_kernel(
    x_ptr, y_ptr, x_row_stride, y_row_stride, n_cols, scale,
    BLOCK_N: tl.constexpr,  # columns per loop step; the row may be any multiple of it, or not
    NUM_STAGES: tl.constexpr,  # software-pipelining depth of both loops (1: none)
    HAS_SCALE: tl.constexpr,
):
    scale = tl.cast(scale, tl.float32)  # float32 math even where Inductor passes a Python float as fp64
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * x_row_stride
    y_row = y_ptr + row * y_row_stride
    cols = tl.arange(0, BLOCK_N)

    # Pass 1: running statistics over the columns seen so far,
    #   m = max_j x_j        and        l = sum_j exp(x_j - m).
    # When a new block raises the max from m to m_new, every term already in l was computed
    # against the old max, and exp(x_j - m_new) = exp(x_j - m) * exp(m - m_new): so l is rescaled
    # by alpha = exp(m - m_new) (<= 1) before the block's own terms are added.
    #
    # m is one number, but l is kept as BLOCK_N partial sums, one a lane, added up once after the
    # loop. A single float32 sum taking one block total a step loses accuracy as it grows (a
    # 65536-wide row in 64-wide blocks is 1024 sequential additions, about 10x PyTorch's own
    # error); each lane's sum is BLOCK_N times smaller, and the final tree reduction is accurate.
    # It is cheaper too: one cross-lane reduction a step (the max) instead of two.
    m = tl.full([], float("-inf"), tl.float32)
    l = tl.zeros([BLOCK_N], tl.float32)
    for start in tl.range(0, n_cols, BLOCK_N, num_stages=NUM_STAGES):
        offs = start + cols
        mask = offs < n_cols
        x = _scaled(tl.load(x_row + offs, mask=mask, other=float("-inf")).to(tl.float32), mask, scale, HAS_SCALE)
        m_new = tl.maximum(m, tl.max(x, axis=0))
        # While every value seen is -inf (a fully masked prefix, as in causal attention scores),
        # m_new is -inf and x - m_new = -inf - (-inf) = NaN would poison l for good. Shifting by
        # 0 instead gives exp(-inf) = 0: such blocks add nothing to l, which is the right answer.
        shift = tl.where(m_new == float("-inf"), 0.0, m_new)
        # alpha is exactly 1 when the max did not move, rather than the GPU's approximate exp(0):
        # a factor a hair off 1 at every step would compound over a long row.
        alpha = tl.where(m_new == m, 1.0, tl.exp(m - shift))
        l = l * alpha + tl.exp(x - shift)
        m = m_new
    l_total = tl.sum(l, axis=0)

    # Pass 2: read the row again and write the normalised values. (A row that is -inf throughout
    # ends with m = -inf and l_total = 0 and yields NaN, as torch.softmax does.)
    for start in tl.range(0, n_cols, BLOCK_N, num_stages=NUM_STAGES):
        offs = start + cols
        mask = offs < n_cols
        x = _scaled(tl.load(x_row + offs, mask=mask, other=float("-inf")).to(tl.float32), mask, scale, HAS_SCALE)
        y = tl.exp(x - m) / l_total
        tl.store(y_row + offs, y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _softmax_multi_row_kernel(
    x_ptr, y_ptr, x_row_stride, y_row_stride, n_rows, n_cols, scale,
    ROWS: tl.constexpr,  # rows per program
    BLOCK_N: tl.constexpr,  # next_power_of_two(n_cols)
    HAS_SCALE: tl.constexpr,
):
    scale = tl.cast(scale, tl.float32)  # float32 math even where Inductor passes a Python float as fp64
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK_N)
    row_mask = rows < n_rows  # the last program may run past the end when ROWS does not divide
    mask = row_mask[:, None] & (cols < n_cols)[None, :]

    rows64 = rows.to(tl.int64)
    x_ptrs = x_ptr + rows64[:, None] * x_row_stride + cols[None, :]
    x = _scaled(tl.load(x_ptrs, mask=mask, other=float("-inf")).to(tl.float32), mask, scale, HAS_SCALE)

    # The whole-row recipe, one reduction per row (axis=1).
    m = tl.max(x, axis=1)
    # Rows past the end loaded nothing, so their max is -inf and x - m would be -inf - (-inf) =
    # NaN. They are never stored, but shifting them by 0 keeps every intermediate finite.
    m = tl.where(row_mask, m, 0.0)
    p = tl.exp(x - m[:, None])
    s = tl.sum(p, axis=1)
    s = tl.where(row_mask, s, 1.0)  # same reason: those rows' sum is 0; avoid computing 0/0
    y = p / s[:, None]

    y_ptrs = y_ptr + rows64[:, None] * y_row_stride + cols[None, :]
    tl.store(y_ptrs, y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _softmax_persistent_kernel(
    x_ptr, y_ptr, x_row_stride, y_row_stride, n_rows, n_cols, scale,
    BLOCK_N: tl.constexpr,  # next_power_of_two(n_cols)
    NUM_STAGES: tl.constexpr,  # software-pipelining depth of the row loop (1: none)
    HAS_SCALE: tl.constexpr,
):
    scale = tl.cast(scale, tl.float32)  # float32 math even where Inductor passes a Python float as fp64
    cols = tl.arange(0, BLOCK_N)
    mask = cols < n_cols
    # A fixed grid (a few programs per multiprocessor) strides over the rows. NUM_STAGES > 1
    # lets the compiler pipeline this loop: the next rows' loads are issued (into shared memory)
    # while the current row is being reduced. The depth is given on tl.range itself: Triton 3.6
    # left this loop (no matrix product in it) unpipelined when num_stages was only a launch option.
    for row in tl.range(tl.program_id(0), n_rows, tl.num_programs(0), num_stages=NUM_STAGES):
        row64 = tl.cast(row, tl.int64)  # (tl.cast: in the interpreter, row is a Python int)
        x = tl.load(x_ptr + row64 * x_row_stride + cols, mask=mask, other=float("-inf"))
        x = _scaled(x.to(tl.float32), mask, scale, HAS_SCALE)
        m = tl.max(x, axis=0)
        p = tl.exp(x - m)
        y = p / tl.sum(p, axis=0)
        tl.store(y_ptr + row64 * y_row_stride + cols, y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _softmax_aligned_row_kernel(
    x_ptr, y_ptr, n_cols, scale,
    BLOCK_N: tl.constexpr, EVICT_X: tl.constexpr, HAS_SCALE: tl.constexpr,
    ALIGN: tl.constexpr,  # elements in 16 bytes
):
    """whole_row on a row cut into an aligned body and a head and tail (``skeleton.row_pieces``),
    so that the body's loads and stores are 16-byte vectors whatever the width."""
    scale = tl.cast(scale, tl.float32)  # float32 math even where Inductor passes a Python float as fp64
    row_start = tl.program_id(0).to(tl.int64) * n_cols
    body, body_mask, edge, edge_mask = skeleton.row_pieces(row_start, n_cols, 0, BLOCK_N, ALIGN)
    x = tl.load(x_ptr + body, mask=body_mask, other=float("-inf"), eviction_policy=EVICT_X)
    x = _scaled(x.to(tl.float32), body_mask, scale, HAS_SCALE)
    x_edge = _scaled(tl.load(x_ptr + edge, mask=edge_mask, other=float("-inf")).to(tl.float32), edge_mask, scale,
                     HAS_SCALE)
    m = tl.maximum(tl.max(x, axis=0), tl.max(x_edge, axis=0))
    p = tl.exp(x - m)
    p_edge = tl.exp(x_edge - m)
    total = tl.sum(p, axis=0) + tl.sum(p_edge, axis=0)
    tl.store(y_ptr + body, (p / total).to(y_ptr.dtype.element_ty), mask=body_mask)
    tl.store(y_ptr + edge, (p_edge / total).to(y_ptr.dtype.element_ty), mask=edge_mask)


@triton.jit
def _split_chunk(x_ptr, row_start, n_cols, chunk, scale, BLOCK_N: tl.constexpr, ALIGN: tl.constexpr,
                 HAS_SCALE: tl.constexpr):
    """One chunk of a split row, loaded and scaled: (body, its mask, its values, the same for the
    edge)."""
    body, body_mask, edge, edge_mask = skeleton.row_pieces(row_start, n_cols, chunk, BLOCK_N, ALIGN)
    x = _scaled(tl.load(x_ptr + body, mask=body_mask, other=float("-inf")).to(tl.float32), body_mask, scale,
                HAS_SCALE)
    x_edge = _scaled(tl.load(x_ptr + edge, mask=edge_mask, other=float("-inf")).to(tl.float32), edge_mask, scale,
                     HAS_SCALE)
    return body, body_mask, x, edge, edge_mask, x_edge


@triton.jit
def _softmax_split_stats_kernel(
    x_ptr,
    partial_ptr,  # (rows, chunks, 2) float32: each chunk's max m and sum of exp(x - m)
    n_cols, scale,
    BLOCK_N: tl.constexpr, SPLITS: tl.constexpr, ALIGN: tl.constexpr, HAS_SCALE: tl.constexpr,
):
    """split_row, first launch: one chunk's max and its sum of exponentials relative to it. A
    chunk can be empty (the head and tail went to chunk 0) or -inf throughout (a masked prefix)
    where the row is not: its max is then -inf and its sum 0, the exponentials taken relative to
    0 instead of -inf (exp(-inf - 0) = 0, where exp(-inf - -inf) would be NaN)."""
    scale = tl.cast(scale, tl.float32)  # float32 math even where Inductor passes a Python float as fp64
    row = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1)
    _, _, x, _, _, x_edge = _split_chunk(x_ptr, row * n_cols, n_cols, chunk, scale, BLOCK_N, ALIGN, HAS_SCALE)
    m = tl.maximum(tl.max(x, axis=0), tl.max(x_edge, axis=0))
    shift = tl.where(m == float("-inf"), 0.0, m)
    total = tl.sum(tl.exp(x - shift), axis=0) + tl.sum(tl.exp(x_edge - shift), axis=0)
    at = partial_ptr + (row * tl.num_programs(1) + chunk) * 2
    tl.store(at, m)
    tl.store(at + 1, total)


@triton.jit
def _softmax_split_apply_kernel(
    x_ptr, y_ptr, partial_ptr, n_cols, scale,
    BLOCK_N: tl.constexpr, SPLITS: tl.constexpr, ALIGN: tl.constexpr, HAS_SCALE: tl.constexpr,
):
    """split_row, second launch: the row's max and sum from its chunks' (each chunk's sum rescaled
    to the row max, as the online kernel rescales its running sum), then the chunk's
    probabilities from x again."""
    scale = tl.cast(scale, tl.float32)  # float32 math even where Inductor passes a Python float as fp64
    row, chunk, at, real = skeleton.split_partials(partial_ptr, 2, SPLITS)
    maxes = tl.load(at, mask=real, other=float("-inf"))
    sums = tl.load(at + 1, mask=real, other=0.0)
    m = tl.max(maxes, axis=0)
    total = tl.sum(sums * tl.exp(maxes - m), axis=0)  # a row -inf throughout: NaN, as torch.softmax
    row_start = row * n_cols
    body, body_mask, x, edge, edge_mask, x_edge = _split_chunk(x_ptr, row_start, n_cols, chunk, scale, BLOCK_N,
                                                               ALIGN, HAS_SCALE)
    tl.store(y_ptr + body, (tl.exp(x - m) / total).to(y_ptr.dtype.element_ty), mask=body_mask)
    tl.store(y_ptr + edge, (tl.exp(x_edge - m) / total).to(y_ptr.dtype.element_ty), mask=edge_mask)


# =================================================================================================
# Spaces (the launchers are the skeleton's: kernelsmith.ops._rowwise)
#
# The reductions' register rule (at most 64 values a thread); one row in flight. Loop-free
# kernels (whole_row, multi_row) have no num_stages: the compiler pipelines loops only.
# =================================================================================================


# Each is the skeleton's space of its schedule under that rule: a function of the spec alone.
_whole_row_space = partial(skeleton.whole_row_space, warps=skeleton.REDUCTION_WARPS)
# Blocks may be as wide as the padded row: the online loop over one block is still not the
# whole_row kernel's math.
_online_space = partial(skeleton.looped_space, warps=skeleton.REDUCTION_WARPS, whole_row_block=True)
_multi_row_space = partial(skeleton.multi_row_space, warps=skeleton.REDUCTION_WARPS)
_persistent_space = partial(skeleton.persistent_space, warps=skeleton.REDUCTION_WARPS, in_registers=1, pipelined=1)
_aligned_row_space = partial(skeleton.aligned_row_space, warps=skeleton.REDUCTION_WARPS)
_split_row_space = partial(skeleton.split_row_space, warps=skeleton.REDUCTION_WARPS)


def scale_of(spec: OpSpec) -> float:
    """The constant x is multiplied by: ``scale`` of the spec, 1.0 when it has none."""
    return float(spec.constants.get("scale", 1.0))


def _variant(name: str, summary: str, space: Callable[[OpSpec], Space], kernel: Any, pipelined: bool = False,
             aligned: bool = False) -> Variant:
    """A variant launching ``kernel`` through the skeleton's launcher, with the spec's scale as the
    kernel's ``scale`` argument and ``HAS_SCALE`` constexpr; ``aligned``: the kernel takes no row
    strides and ``ALIGN`` (aligned_row)."""

    def constexprs(spec: OpSpec) -> dict[str, Any]:
        own: dict[str, Any] = {"HAS_SCALE": scale_of(spec) != 1.0}
        return {**own, "ALIGN": skeleton.alignment(spec)} if aligned else own

    return skeleton.variant(__name__, name, summary, space, kernel, strides=0 if aligned else 2,
                            scalars=lambda spec: (scale_of(spec),), pipelined=pipelined, constexprs_of=constexprs)


def _split_row_build(spec: OpSpec, config: Config) -> Launcher:
    skeleton.checked("softmax", _split_row_space(spec), config)
    scalars, constexprs = (scale_of(spec),), (("HAS_SCALE", scale_of(spec) != 1.0),)
    stats = skeleton.SplitKernel(_softmax_split_stats_kernel, lambda inputs, outputs, partial: (inputs[0], partial),
                                 scalars, constexprs)
    apply = skeleton.SplitKernel(_softmax_split_apply_kernel,
                                 lambda inputs, outputs, partial: (inputs[0], outputs[0], partial), scalars, constexprs)
    return skeleton.split_row_launcher(spec, config, stats, apply, n_stats=2)


# =================================================================================================
# The op family (the checks of its input are the row reductions' too: kernelsmith.ops._last_dim)
# =================================================================================================


def _dim_and_scale(constants: dict[str, Any]) -> tuple[Any, Any]:
    """The constants ``dim`` (default -1) and ``scale`` (default 1.0), checked by ``_spec``;
    UnsupportedWorkload for any other."""
    dim = constants.pop("dim", -1)
    scale = constants.pop("scale", 1.0)
    if constants:
        raise UnsupportedWorkload(f"softmax: unknown constants {sorted(constants)}")
    return dim, scale


class Softmax(OpFamily):
    name = "softmax"
    summary = "softmax over the last dimension, y = exp(x - max) / sum(exp(x - max)), row by row"
    shape_help = (
        "the shape of x; softmax runs over its last dimension: --shape 8192x4096 is 8192 rows "
        "of 4096 columns, --shape 4x512x1024 is 2048 rows of 1024"
    )
    rowwise = True  # configs depend on the row width only: calls are bucketed by row count
    row_block = 32  # multi_row's largest ROWS
    distributions = ("normal", "uniform", "large", "outliers")
    variants = (
        _variant("whole_row", "one program per row, the whole row in registers",
                 _whole_row_space, _softmax_whole_row_kernel),
        _variant("online", "one program per row, walked in BLOCK_N-column blocks with a running max and sum "
                 "(any width)", _online_space, _softmax_online_kernel, pipelined=True),
        _variant("multi_row", "ROWS rows per program as one [ROWS, BLOCK_N] block (narrow rows)",
                 _multi_row_space, _softmax_multi_row_kernel),
        _variant("persistent", "whole rows in registers, a fixed grid of programs striding over the rows",
                 _persistent_space, _softmax_persistent_kernel, pipelined=True),
        _variant("aligned_row", "whole_row with each row's 16-byte-aligned body apart from its head and tail, "
                 "for widths whose rows Triton cannot prove aligned", _aligned_row_space, _softmax_aligned_row_kernel,
                 aligned=True),
        Variant("split_row", "(row, chunk) programs: chunk max and sum, then each chunk's probabilities; for wide "
                "rows and few rows", _split_row_space, _split_row_build, modules=(skeleton.__name__,)),
    )

    # ---- specs -----------------------------------------------------------------------------------
    def spec(self, shape: tuple[int, ...], dtype: str, **constants: Any) -> OpSpec:
        dim, scale = _dim_and_scale(constants)
        return self._spec(TensorSpec(tuple(shape), dtype), dim, scale)

    def spec_for(self, *inputs: torch.Tensor, **constants: Any) -> OpSpec:
        x = one_tensor(self.name, inputs)
        dim, scale = _dim_and_scale(constants)
        return self._spec(TensorSpec.of(x), dim, scale)

    def _spec(self, x: TensorSpec, dim: Any, scale: Any) -> OpSpec:
        check_last_dim(self.name, x, dim)
        if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale) or scale == 0:
            raise UnsupportedWorkload(f"softmax: scale must be a finite non-zero number, not {scale!r}")
        constants: dict[str, Any] = {"dim": -1}
        if scale != 1.0:  # left out at 1: every plain softmax's workload hashes as before
            constants["scale"] = float(scale)
        spec = OpSpec(self.name, (x,), constants)
        self.check_supported(spec)
        return spec

    # ---- math ------------------------------------------------------------------------------------
    def reference(self, spec: OpSpec, inputs: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        """``torch.softmax(x, -1)``; with a scale, of ``x.float() * scale``, cast back to x's dtype
        (the multiply in float32, as the kernels do it, rounded once)."""
        (x,) = inputs
        scale = scale_of(spec)
        if scale == 1.0:
            return (torch.softmax(x, dim=-1),)
        return (torch.softmax(x.float() * scale, dim=-1).to(x.dtype),)

    def reference_fp64(
        self, spec: OpSpec, inputs: Sequence[torch.Tensor]
    ) -> tuple[torch.Tensor, ...]:
        return (torch.softmax(inputs[0].double() * scale_of(spec), dim=-1),)

    def make_inputs(
        self,
        spec: OpSpec,
        seed: int,
        distribution: str = "normal",
        device: str | torch.device = "cuda",
    ) -> tuple[torch.Tensor, ...]:
        """Inputs for one distribution, drawn in float32 on ``device`` and rounded to the dtype;
        with a scale, divided by it first, so that ``x * scale`` (what the softmax is taken of)
        follows the distribution as described.

        - ``normal``: standard normal values;
        - ``uniform``: uniform in [-1, 1): a flat, high-entropy softmax;
        - ``large``: normal values times 30 (up to about +-150): ``exp`` would overflow without
          the max subtraction, yet every value is representable in float16;
        - ``outliers``: normal values, plus 40 on one random column of every row (the row's
          softmax is then nearly one-hot) and minus 40 on about one other value in 256 (whose
          ``exp`` underflows to zero).
        """
        x_spec = spec.inputs[0]
        shape, n = x_spec.shape, x_spec.shape[-1]
        g = generator(seed, device)
        if distribution == "normal":
            x = torch.randn(shape, generator=g, device=device)
        elif distribution == "uniform":
            x = torch.rand(shape, generator=g, device=device) * 2 - 1
        elif distribution == "large":
            # Wide spread around +100: exp(x) overflows float32 (past 88.7) in every row, at any
            # width, so a kernel that skips the max subtraction always fails (softmax is shift-
            # invariant, so the reference is as well conditioned as for centred inputs).
            x = torch.randn(shape, generator=g, device=device) * 30 + 100
        elif distribution == "outliers":
            x = torch.randn(shape, generator=g, device=device)
            rows = x.view(-1, n)
            hot = torch.randint(0, n, (rows.shape[0],), generator=g, device=device)
            rows[torch.arange(rows.shape[0], device=device), hot] += 40.0
            sparse = torch.rand(shape, generator=g, device=device) < 1 / 256
            x = torch.where(sparse, x - 40.0, x)
        else:
            known = ", ".join(self.distributions)
            raise ValueError(f"softmax: unknown distribution {distribution!r} (known: {known})")
        return ((x / scale_of(spec)).to(x_spec.torch_dtype),)

    def flops(self, spec: OpSpec) -> int:
        # Per element: a max comparison, a subtraction, an exp, an add into the sum, a division.
        return 5 * spec.inputs[0].numel


OP = Softmax()

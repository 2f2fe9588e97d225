"""RMSNorm: ``y = x / sqrt(mean(x**2, last dim) + eps) * weight``.

Root-mean-square layer normalisation (Zhang & Sennrich, 2019) is the normalisation of Llama,
Mistral, Qwen and most recent language models. For an input ``x`` of shape ``(..., N)`` and a
``weight`` of shape ``(N,)``, every row ``r`` of ``N`` elements (a row is one token's hidden
state) is rescaled on its own:

    rstd[r] = 1 / sqrt(mean_j(x[r, j] ** 2) + eps)
    y[r, j] = x[r, j] * rstd[r] * weight[j]

Unlike LayerNorm there is no mean subtraction and no bias. The op reads ``x`` once and writes
``y`` once, and does about four flops per element, so it is bound by memory bandwidth: a good
kernel is one that streams rows at full speed, and the tuning question is how to split rows
among programs and warps.

The reference is the Hugging Face Llama formulation (``LlamaRMSNorm``): the sum of squares in
float32, the normalised row rounded back to the input dtype, then multiplied by the weight in the
input dtype. The kernels here accumulate in float32 too, but multiply by the weight in float32
and round once, which is a little *more* accurate than the reference (the tolerance only bounds
the error from above).

Gemma's RMSNorm scales by ``1 + weight`` (its weights are stored as offsets from 1): the
constant ``weight_offset`` (1.0 for Gemma; absent from the spec's constants when it is 0, so
that every other norm's workload hashes as before) is added to the weight in float32 right after
the kernels load it, under a ``WEIGHT_OFFSET`` constexpr: with 0.0 the add is not compiled at
all. With an offset the reference is ``GemmaRMSNorm``'s, which computes in float32 and rounds
once, ``(xf * rstd * (weight.float() + offset)).to(x.dtype)``, as the kernels do.

Variants (every one computes the same thing; they differ in how work is split):

``whole_row``
    One program per row; the whole row (padded to a power of two, ``BLOCK_N``) sits in
    registers, so ``x`` is loaded once, reduced, scaled and stored. The default choice for the
    usual hidden sizes (1024 to 16384). Rows wider than 65536 do not fit.
``multi_row``
    One program per ``ROWS`` rows, loaded as a 2D ``[ROWS, BLOCK_N]`` block. For narrow rows
    (N of a few hundred) a single row gives a program too little work to hide memory latency;
    several rows per program fix that. The last program masks the rows past the end.
``looped``
    One program per row, two passes over it in column blocks of ``BLOCK_N``: the first
    accumulates the sum of squares, the second normalises and stores (re-reading ``x``, which is
    then mostly in L2). For rows too wide for registers, and a useful contender where a whole row
    would need so many registers per thread that the compiler spills.
``persistent``
    A fixed grid of ``PROGRAMS_PER_SM`` programs per multiprocessor; each program loads the
    weight once and walks rows with a grid-stride loop (row ``pid``, ``pid + programs``, ...).
    This saves the weight reload and the program start-up of ``whole_row`` and lets the compiler
    pipeline the next row's load behind the current row's maths (``num_stages``).

``aligned_row``
    ``whole_row`` on a row cut into a 16-byte-aligned body (vector loads and stores) and a short
    head and tail, for widths that are not a multiple of 16, whose rows Triton cannot prove
    aligned (and, for widths not a multiple of 8, are not): see the skeleton's section on them.
``split_row``
    ``(row, chunk)`` programs and two launches: chunk sums of squares into a float32 scratch,
    then each chunk normalised with the row's rstd (the chunks' sums added in one fixed order).
    For rows too wide for one program and for few rows, where one program a row leaves most
    multiprocessors idle; it reads ``x`` twice (the second time from L2 on small workloads).

``num_stages`` only matters to kernels with a loop (the compiler software-pipelines loops), so
``whole_row`` and ``multi_row`` offer the single value 1 instead of tripling their spaces with
configs that compile to the same code.

All kernels load with masks (``other=0.0``, which adds nothing to a sum of squares), compute in
float32, store in the output's dtype, and compute row offsets in 64-bit integers so that tensors
of more than 2**31 elements are addressed correctly. Launchers accept contiguous inputs only (the
spec says so) and pass the row strides explicitly. The schedules' spaces, grids and launchers are
the row-wise skeleton's (:mod:`kernelsmith.ops._rowwise`); this module holds the math, and what
the other RMSNorm families (add_rmsnorm and the backwards) take from it: the jitted row math
(:func:`_scaled`), the specs and their checks (:class:`RMSNormLike`) and the variants' launch
conventions (:func:`norm_variant`, :func:`split_row_variant`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import torch
import triton
import triton.language as tl

from kernelsmith.ops import _rowwise as skeleton
from kernelsmith.ops._base import (
    Launcher,
    OpFamily,
    UnsupportedWorkload,
    Variant,
    check_eps,
    generator,
    tensor_specs,
)
from kernelsmith.ops._rowwise import NO_LOOP_STAGES
from kernelsmith.space import Config, Space
from kernelsmith.spec import OpSpec, TensorSpec, dtype_name

DEFAULT_EPS = 1e-6


# ---------------------------------------------------------------------------------------------
# Kernels
# ---------------------------------------------------------------------------------------------


# Every kernel takes x, the weight and y, then (but for the realigned ones, which address row r at
# r * N) the row strides of x and y, ``n_rows`` where a program owns several rows, ``N`` and eps.
# Its constexprs: the block (``BLOCK_N``, ``ROWS``), ``EVICT_X`` ("" or "evict_first": x is read
# once, so it need not stay in L2) and ``WEIGHT_OFFSET``, added to the weight (Gemma: 1.0; 0.0
# compiles no add).


@triton.jit
def _rmsnorm_whole_row_kernel(x_ptr, w_ptr, y_ptr, x_row_stride, y_row_stride, N, eps,
                              BLOCK_N: tl.constexpr, EVICT_X: tl.constexpr, WEIGHT_OFFSET: tl.constexpr):
    """One program normalises one row held entirely in registers (BLOCK_N >= N)."""
    eps = tl.cast(eps, tl.float32)  # float32 math even where Inductor passes a Python float as fp64
    row = tl.program_id(0).to(tl.int64)  # 64-bit, so that row * stride cannot overflow
    cols = tl.arange(0, BLOCK_N)
    mask = cols < N

    # Padding lanes load 0.0, which adds nothing to the sum of squares.
    x = tl.load(x_ptr + row * x_row_stride + cols, mask=mask, other=0.0, eviction_policy=EVICT_X).to(tl.float32)
    # mean(x^2) over the N real elements (divide by N, not BLOCK_N), then 1/sqrt(. + eps).
    rstd = tl.rsqrt(tl.sum(x * x, axis=0) / N + eps)

    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    if WEIGHT_OFFSET != 0.0:  # resolved at compile time: no add for the Llama norm
        w += WEIGHT_OFFSET  # in float32, after the load (Gemma's 1.0 + weight.float())
    y = x * rstd * w  # all in float32, rounded once on the store
    tl.store(y_ptr + row * y_row_stride + cols, y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _rmsnorm_multi_row_kernel(x_ptr, w_ptr, y_ptr, x_row_stride, y_row_stride, n_rows, N, eps,
                              ROWS: tl.constexpr, BLOCK_N: tl.constexpr, WEIGHT_OFFSET: tl.constexpr):
    """Program ``pid`` normalises rows ``pid * ROWS`` to ``pid * ROWS + ROWS - 1``, as one
    [ROWS, BLOCK_N] block."""
    eps = tl.cast(eps, tl.float32)  # float32 math even where Inductor passes a Python float as fp64
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    rows64 = rows.to(tl.int64)  # for the offsets
    cols = tl.arange(0, BLOCK_N)
    row_mask = rows < n_rows  # the last program may run past the final row
    col_mask = cols < N
    mask = row_mask[:, None] & col_mask[None, :]
    x_offsets = rows64[:, None] * x_row_stride + cols[None, :]
    x = tl.load(x_ptr + x_offsets, mask=mask, other=0.0).to(tl.float32)
    # One rstd per row: reduce along the columns (axis 1). Masked-off rows get rsqrt(eps), a
    # finite value that is never stored.
    rstd = tl.rsqrt(tl.sum(x * x, axis=1) / N + eps)

    # The weight is shared by all rows of the block: load it once, broadcast it over the rows.
    w = tl.load(w_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)
    if WEIGHT_OFFSET != 0.0:
        w += WEIGHT_OFFSET
    y = x * rstd[:, None] * w[None, :]
    y_offsets = rows64[:, None] * y_row_stride + cols[None, :]
    tl.store(y_ptr + y_offsets, y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _rmsnorm_looped_kernel(x_ptr, w_ptr, y_ptr, x_row_stride, y_row_stride, N, eps,
                           BLOCK_N: tl.constexpr, WEIGHT_OFFSET: tl.constexpr):
    """One program normalises one row in two passes over column blocks of BLOCK_N."""
    eps = tl.cast(eps, tl.float32)  # float32 math even where Inductor passes a Python float as fp64
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * x_row_stride
    y_row = y_ptr + row * y_row_stride

    # Pass 1: sum of squares. Each lane keeps its own float32 partial sum across the blocks, and
    # the lanes are added up once at the end (fewer cross-lane reductions, and a tree-shaped sum
    # that loses less precision than one running total).
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    for start in range(0, N, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        x = tl.load(x_row + cols, mask=cols < N, other=0.0).to(tl.float32)
        acc += x * x
    rstd = tl.rsqrt(tl.sum(acc, axis=0) / N + eps)

    # Pass 2: read the row again (now mostly from L2), scale, multiply by the weight, store.
    for start in range(0, N, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        mask = cols < N
        x = tl.load(x_row + cols, mask=mask, other=0.0).to(tl.float32)
        w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        if WEIGHT_OFFSET != 0.0:
            w += WEIGHT_OFFSET
        y = x * rstd * w
        tl.store(y_row + cols, y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _rmsnorm_persistent_kernel(x_ptr, w_ptr, y_ptr, x_row_stride, y_row_stride, n_rows, N, eps,
                               BLOCK_N: tl.constexpr, WEIGHT_OFFSET: tl.constexpr):
    """A fixed grid of programs; each loads the weight once, then normalises rows
    pid, pid + num_programs, pid + 2 * num_programs, ... (a grid-stride loop)."""
    eps = tl.cast(eps, tl.float32)  # float32 math even where Inductor passes a Python float as fp64
    # A 64-bit start makes the loop counter 64-bit (the compiler gives it the widest type of
    # start, end and step), so that row * stride cannot overflow.
    first_row = tl.program_id(0).to(tl.int64)
    step = tl.num_programs(0)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < N
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    if WEIGHT_OFFSET != 0.0:
        w += WEIGHT_OFFSET

    for row in range(first_row, n_rows, step):
        x = tl.load(x_ptr + row * x_row_stride + cols, mask=mask, other=0.0).to(tl.float32)
        rstd = tl.rsqrt(tl.sum(x * x, axis=0) / N + eps)
        y = x * rstd * w
        tl.store(y_ptr + row * y_row_stride + cols, y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _scaled(x, w_ptr, cols, mask, rstd, WEIGHT_OFFSET: tl.constexpr):
    """``x * rstd * (weight[cols] + WEIGHT_OFFSET)`` in float32: one piece of a realigned row."""
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    if WEIGHT_OFFSET != 0.0:
        w += WEIGHT_OFFSET
    return x * rstd * w


@triton.jit
def _rmsnorm_aligned_row_kernel(x_ptr, w_ptr, y_ptr, N, eps, BLOCK_N: tl.constexpr, EVICT_X: tl.constexpr,
                                WEIGHT_OFFSET: tl.constexpr, ALIGN: tl.constexpr):  # ALIGN: elements in 16 bytes
    """whole_row on a row cut into an aligned body and a head and tail (``skeleton.row_pieces``),
    so that the body's loads and stores are 16-byte vectors whatever the width."""
    eps = tl.cast(eps, tl.float32)  # float32 math even where Inductor passes a Python float as fp64
    row_start = tl.program_id(0).to(tl.int64) * N
    body, body_mask, edge, edge_mask = skeleton.row_pieces(row_start, N, 0, BLOCK_N, ALIGN)
    x = tl.load(x_ptr + body, mask=body_mask, other=0.0, eviction_policy=EVICT_X).to(tl.float32)
    x_edge = tl.load(x_ptr + edge, mask=edge_mask, other=0.0).to(tl.float32)
    rstd = tl.rsqrt((tl.sum(x * x, axis=0) + tl.sum(x_edge * x_edge, axis=0)) / N + eps)
    y = _scaled(x, w_ptr, body - row_start, body_mask, rstd, WEIGHT_OFFSET)
    tl.store(y_ptr + body, y.to(y_ptr.dtype.element_ty), mask=body_mask)
    y_edge = _scaled(x_edge, w_ptr, edge - row_start, edge_mask, rstd, WEIGHT_OFFSET)
    tl.store(y_ptr + edge, y_edge.to(y_ptr.dtype.element_ty), mask=edge_mask)


@triton.jit
def _rmsnorm_split_stats_kernel(x_ptr, partial_ptr, N, BLOCK_N: tl.constexpr, SPLITS: tl.constexpr,
                                ALIGN: tl.constexpr):
    """split_row, first launch: the sum of squares of one chunk of one row, into ``partial``
    ((rows, chunks) float32)."""
    row = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1)
    body, body_mask, edge, edge_mask = skeleton.row_pieces(row * N, N, chunk, BLOCK_N, ALIGN)
    x = tl.load(x_ptr + body, mask=body_mask, other=0.0).to(tl.float32)
    x_edge = tl.load(x_ptr + edge, mask=edge_mask, other=0.0).to(tl.float32)
    tl.store(partial_ptr + row * tl.num_programs(1) + chunk, tl.sum(x * x, axis=0) + tl.sum(x_edge * x_edge, axis=0))


@triton.jit
def _rmsnorm_split_apply_kernel(x_ptr, w_ptr, y_ptr, partial_ptr, N, eps, BLOCK_N: tl.constexpr,
                                SPLITS: tl.constexpr, ALIGN: tl.constexpr, WEIGHT_OFFSET: tl.constexpr):
    """split_row, second launch: the row's rstd from its chunks' sums (added in one fixed order),
    then the chunk normalised again from x."""
    eps = tl.cast(eps, tl.float32)  # float32 math even where Inductor passes a Python float as fp64
    row = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1)
    chunks = tl.num_programs(1)
    sums = tl.load(partial_ptr + row * chunks + tl.arange(0, SPLITS), mask=tl.arange(0, SPLITS) < chunks, other=0.0)
    rstd = tl.rsqrt(tl.sum(sums, axis=0) / N + eps)
    row_start = row * N
    body, body_mask, edge, edge_mask = skeleton.row_pieces(row_start, N, chunk, BLOCK_N, ALIGN)
    x = tl.load(x_ptr + body, mask=body_mask, other=0.0).to(tl.float32)
    y = _scaled(x, w_ptr, body - row_start, body_mask, rstd, WEIGHT_OFFSET)
    tl.store(y_ptr + body, y.to(y_ptr.dtype.element_ty), mask=body_mask)
    x_edge = tl.load(x_ptr + edge, mask=edge_mask, other=0.0).to(tl.float32)
    y_edge = _scaled(x_edge, w_ptr, edge - row_start, edge_mask, rstd, WEIGHT_OFFSET)
    tl.store(y_ptr + edge, y_edge.to(y_ptr.dtype.element_ty), mask=edge_mask)


# ---------------------------------------------------------------------------------------------
# Spaces (the launchers are the skeleton's: kernelsmith.ops._rowwise)
#
# x and the weight are in registers together in most kernels; the loop-free ones list the single
# num_stages value 1, so that the config keys stored for them stay as they were.
# ---------------------------------------------------------------------------------------------


def _whole_row_space(spec: OpSpec) -> Space:
    return skeleton.whole_row_space(spec, skeleton.NORM_WARPS, stages=NO_LOOP_STAGES)


def _multi_row_space(spec: OpSpec) -> Space:
    return skeleton.multi_row_space(spec, skeleton.NORM_WARPS, stages=NO_LOOP_STAGES)


def _looped_space(spec: OpSpec) -> Space:
    return skeleton.looped_space(spec, skeleton.NORM_WARPS)


def _persistent_space(spec: OpSpec) -> Space:
    # Both the row and the weight stay in registers; the row loop is pipelined by the launch
    # option alone (no shared-memory bound: see the kernel).
    return skeleton.persistent_space(spec, skeleton.NORM_WARPS, in_registers=2)


def _aligned_row_space(spec: OpSpec) -> Space:
    return skeleton.aligned_row_space(spec, skeleton.NORM_WARPS, stages=NO_LOOP_STAGES)


def _split_row_space(spec: OpSpec) -> Space:
    return skeleton.split_row_space(spec, skeleton.NORM_WARPS)


# ---------------------------------------------------------------------------------------------
# What the RMSNorm families take from here: the constants, the kernels' constexprs, the variants
# ---------------------------------------------------------------------------------------------


def weight_offset_of(spec: OpSpec) -> float:
    """The constant added to the weight: ``weight_offset`` of the spec, 0.0 when it has none."""
    return float(spec.constants.get("weight_offset", 0.0))


def norm_constants(op: str, eps: Any, weight_offset: Any) -> dict[str, float]:
    """The constants of an RMSNorm spec (forward or backward): ``eps``, and ``weight_offset``
    only when it is not 0, so that the workloads of every norm without one hash as before."""
    constants = {"eps": check_eps(op, eps)}
    offset = float(weight_offset)
    if not math.isfinite(offset):
        raise UnsupportedWorkload(f"{op}: weight_offset must be a finite number, not {weight_offset!r}")
    if offset != 0.0:
        constants["weight_offset"] = offset
    return constants


def weight_offset_constexprs(spec: OpSpec) -> dict[str, Any]:
    return {"WEIGHT_OFFSET": weight_offset_of(spec)}


def aligned_constexprs(spec: OpSpec) -> dict[str, Any]:
    """The realigned kernels' constexprs: the weight offset, and ``ALIGN`` (elements in 16 bytes)."""
    return {**weight_offset_constexprs(spec), "ALIGN": skeleton.alignment(spec)}


def norm_variant(module: str, name: str, summary: str, space: Callable[[OpSpec], Space], kernel: Any,
                 strides: int, pipelined: bool = False, uses: tuple[str, ...] = ()) -> Variant:
    """A variant of the RMSNorm-like family in ``module`` launching ``kernel`` through the
    skeleton's launcher: ``strides`` row strides (0 for the realigned kernels, which address row
    ``r`` at ``r * N`` and take ``ALIGN``), eps after ``N``, the spec's weight offset as
    ``WEIGHT_OFFSET``; ``pipelined`` and ``uses`` as :func:`kernelsmith.ops._rowwise.variant` has them."""
    return skeleton.variant(module, name, summary, space, kernel, strides=strides, scalars=skeleton.eps_of,
                            pipelined=pipelined, constexprs_of=aligned_constexprs if strides == 0 else
                            weight_offset_constexprs, uses=uses)


def split_row_variant(module: str, summary: str, space: Callable[[OpSpec], Space],
                      stats: tuple[Any, skeleton.SplitTensors], apply: tuple[Any, skeleton.SplitTensors],
                      uses: tuple[str, ...] = ()) -> Variant:
    """The split_row variant of the RMSNorm-like family in ``module``, from its two kernels, each
    with its tensors ``(inputs, outputs, partial) -> arguments``: ``stats`` stores each chunk's sum
    of squares (one statistic a chunk), then ``apply``, given eps and the weight offset too,
    normalises the chunk."""
    op = module.rsplit(".", 1)[-1]

    def build(spec: OpSpec, config: Config) -> Launcher:
        skeleton.checked(op, space(spec), config)
        normalise = skeleton.SplitKernel(*apply, skeleton.eps_of(spec), tuple(weight_offset_constexprs(spec).items()))
        return skeleton.split_row_launcher(spec, config, skeleton.SplitKernel(*stats), normalise, n_stats=1)

    return Variant("split_row", summary, space, build, modules=(module, skeleton.__name__, *uses))


def _variant(name: str, summary: str, space: Callable[[OpSpec], Space], kernel: Any, strides: int = 2) -> Variant:
    return norm_variant(__name__, name, summary, space, kernel, strides)  # two row strides: x's, y's


# ---------------------------------------------------------------------------------------------
# The op family
# ---------------------------------------------------------------------------------------------


class RMSNormLike(OpFamily):
    """The specs the RMSNorm families share (this one, add_rmsnorm and both backwards): inputs
    named ``input_names``, activations of one shape (the upstream gradients, a residual, x or h)
    then a weight of their last size, all of one dtype; the constants ``eps`` and ``weight_offset``."""

    input_names: ClassVar[tuple[str, ...]] = ("x", "weight")

    @property
    def _activation(self) -> int:
        """The index of the last activation (x, or h) among the inputs: the one before the weight."""
        return len(self.input_names) - 2

    def spec(self, shape: tuple[int, ...], dtype: str, eps: float = DEFAULT_EPS, weight_offset: float = 0.0,
             **constants: Any) -> OpSpec:
        shape = skeleton.command_line_shape(self.name, shape, constants, what=self.input_names[-2])
        name = dtype_name(dtype)
        act = TensorSpec(shape, name)
        spec = OpSpec(self.name, (*(act,) * (self._activation + 1), TensorSpec((shape[-1],), name)),
                      norm_constants(self.name, eps, weight_offset))
        self.check_supported(spec)
        return spec

    def spec_for(self, *inputs: torch.Tensor, eps: float = DEFAULT_EPS, weight_offset: float = 0.0,
                 **constants: Any) -> OpSpec:
        if constants:
            raise UnsupportedWorkload(f"{self.name}: unknown constants {sorted(constants)}")
        if len(inputs) != len(self.input_names) or not all(isinstance(t, torch.Tensor) for t in inputs):
            raise UnsupportedWorkload(f"{self.name} takes ({', '.join(self.input_names)}), not {len(inputs)} inputs")
        x, weight = inputs[-2:]
        if x.dim() < 1 or weight.dim() != 1:
            raise UnsupportedWorkload(f"{self.name}: {self.input_names[-2]} must be at least 1-D and weight 1-D, "
                                      f"not {x.dim()}-D and {weight.dim()}-D")
        if x.numel() == 0:
            raise UnsupportedWorkload(f"{self.name}: empty inputs are not supported")
        spec = OpSpec(self.name, tensor_specs(self.name, inputs), norm_constants(self.name, eps, weight_offset))
        self.check_supported(spec)  # the shapes and dtypes agree
        return spec

    def check_supported(self, spec: OpSpec) -> None:
        skeleton.check_rows_and_weight(self, spec, self.input_names)


class RMSNorm(RMSNormLike):
    name = "rmsnorm"
    summary = "RMS normalisation over the last dimension, times a weight (Llama's RMSNorm)"
    shape_help = (
        "the shape of x, e.g. 8192x4096 for x of shape (8192, 4096) (rows x hidden size); "
        "weight has the last size, (4096,); more leading sizes are allowed (2x1024x4096)"
    )
    backward = "rmsnorm_backward"  # gradients of (x, weight), tuned as their own workload
    rowwise = True  # configs depend on the row width only: calls are bucketed by row count
    row_block = 32  # multi_row's largest ROWS
    distributions = ("normal", "uniform", "large", "small", "outliers")  # the tolerance: the default
    variants = (
        _variant("whole_row", "one program per row, the whole row in registers",
                 _whole_row_space, _rmsnorm_whole_row_kernel),
        _variant("multi_row", "ROWS rows per program as a 2D block, for narrow rows",
                 _multi_row_space, _rmsnorm_multi_row_kernel),
        _variant("looped", "one program per row, two passes over column blocks, for wide rows",
                 _looped_space, _rmsnorm_looped_kernel),
        _variant("persistent", "PROGRAMS_PER_SM programs per SM walk the rows, weight loaded once",
                 _persistent_space, _rmsnorm_persistent_kernel),
        _variant("aligned_row", "whole_row with each row's 16-byte-aligned body apart from its head and tail, "
                 "for widths whose rows Triton cannot prove aligned", _aligned_row_space, _rmsnorm_aligned_row_kernel,
                 strides=0),
        split_row_variant(__name__, "(row, chunk) programs: chunk sums of squares, then each chunk normalised; for "
                          "wide rows and few rows", _split_row_space,
                          (_rmsnorm_split_stats_kernel, lambda inputs, outputs, partial: (inputs[0], partial)),
                          (_rmsnorm_split_apply_kernel, lambda inputs, outputs, partial: (*inputs, *outputs, partial))),
    )

    # ---- math --------------------------------------------------------------------------------
    def reference(self, spec: OpSpec, inputs: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        """Hugging Face's LlamaRMSNorm.forward, verbatim in substance; with a weight offset,
        GemmaRMSNorm.forward (everything in float32, rounded once)."""
        x, weight = inputs
        eps = float(spec.const("eps"))
        offset = weight_offset_of(spec)
        xf = x.float()
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
        if offset:
            return ((y * (weight.float() + offset)).to(x.dtype),)
        return (weight * y.to(x.dtype),)

    def reference_fp64(
        self, spec: OpSpec, inputs: Sequence[torch.Tensor]
    ) -> tuple[torch.Tensor, ...]:
        x, weight = inputs
        eps = float(spec.const("eps"))
        xd = x.double()
        y = xd * torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + eps)
        return ((weight.double() + weight_offset_of(spec)) * y,)

    def make_inputs(
        self,
        spec: OpSpec,
        seed: int,
        distribution: str = "normal",
        device: str | torch.device = "cuda",
    ) -> tuple[torch.Tensor, ...]:
        """x drawn from ``distribution``, weight = 1 + 0.5 * N(0, 1) (less the spec's weight
        offset, so that the weight the rows are scaled by is drawn alike: Gemma's weights are
        about 0), both deterministic in seed.

        - normal: N(0, 1);
        - uniform: U(-1, 1);
        - large: 100 * N(0, 1): squares reach 1e5 to 1e7, far past float16's range, so only a
          kernel that squares in float32 gets them right (the values themselves stay well inside
          float16's range);
        - small: 1e-3 * N(0, 1): mean(x^2) is about 1e-6, the size of eps, so eps must be added
          in the right place;
        - outliers: N(0, 1) with about 0.1% of the elements multiplied by 50, as in the hidden
          states of real language models.
        """
        x_spec, w_spec = spec.inputs
        g = generator(seed, device)

        def randn(shape: tuple[int, ...]) -> torch.Tensor:
            return torch.randn(shape, generator=g, device=device, dtype=torch.float32)

        if distribution == "normal":
            x = randn(x_spec.shape)
        elif distribution == "uniform":
            x = torch.rand(x_spec.shape, generator=g, device=device, dtype=torch.float32) * 2 - 1
        elif distribution == "large":
            x = randn(x_spec.shape) * 100
        elif distribution == "small":
            x = randn(x_spec.shape) * 1e-3
        elif distribution == "outliers":
            x = randn(x_spec.shape)
            picked = torch.rand(x_spec.shape, generator=g, device=device) < 1e-3
            x = torch.where(picked, x * 50, x)
        else:
            raise ValueError(f"rmsnorm: unknown distribution {distribution!r} "
                             f"(known: {', '.join(self.distributions)})")
        weight = 1 + 0.5 * randn(w_spec.shape) - weight_offset_of(spec)
        return x.to(x_spec.torch_dtype), weight.to(w_spec.torch_dtype)

    def flops(self, spec: OpSpec) -> int:
        # Per element: square, add to the sum, multiply by rstd, multiply by the weight.
        return 4 * spec.inputs[0].numel


OP = RMSNorm()

"""The norm backwards' skeleton: what RMSNorm's, residual-add + RMSNorm's and LayerNorm's share.

A norm backward writes, for every row, the gradient of its activation (``dx``) from the row's own
statistics, and sums parameter gradients (``dw``, ``db``) over *all* rows: each program writes its
share of those sums to a float32 scratch row, and a second kernel adds the shares up, always in
the same order, so that the result is bitwise reproducible (no atomics). The spaces of the two
schedules of such a backward are in :mod:`kernelsmith.ops._rowwise` (its last section), with the
forward schedules' budgets they share; this module writes the rest once, so that a family file
holds only its math (the kernels' arithmetic), reference, inputs and tolerance:

- jitted helpers for what every kernel addresses the same way (:func:`row_columns`,
  :func:`column_block`, :func:`load_row`, :func:`store_row`, :func:`store_share`);
- the fixed-order sum of the programs' shares (:func:`reducer`);
- the launchers of the two schedules (:func:`two_stage_launcher`, :func:`looped_launcher`): the
  grids, the scratch buffers, the order of the arguments and the share sums;
- the two variants (:func:`variants`), whose source hash covers this module, the family's and
  the modules its kernels run;
- a third schedule for wide rows and few rows, ``split_row`` (:func:`split_row_variant`, its
  space :func:`split_row_space` and launcher :func:`split_row_launcher`, and the jitted
  :func:`chunk_statistics_at`, :func:`row_chunk_statistics`), for the families that give its two
  kernels (see the section on it below);
- the draw of the upstream gradients for ``make_inputs`` (:func:`upstream_gradients`).

Kernel conventions (what the launchers pass). A family (:class:`Backward`) has three kernels:

``two_stage``'s rows kernel
    ``(*tensors, grad, *shares, *row strides, n_rows, N, eps)``: the operands (activations, then
    the weight), the activation gradient, the share buffers (``(programs, N)`` float32), the row
    stride of each activation and of ``grad``, then the row count, the width and ``eps``; its
    constexprs are ``BLOCK_N`` (the padded row), ``NUM_STAGES`` and the family's.
``looped``'s statistics kernel
    ``(*stats tensors, stats, *row strides, N, eps)``: one program per row writing the row's
    ``stats_width`` float32 statistics to ``stats`` (a ``(rows, stats_width)`` scratch).
``looped``'s rows kernel
    ``(*tensors, stats, grad, *shares, *row strides, n_rows, N)``, on a grid of (column blocks,
    groups).
``split_row``'s statistics kernel
    ``(*stats tensors, partial, *row strides, n_rows, N)``, on a grid of (chunks, groups): each
    program writes, for each row of its group, its chunk's ``split_stats`` float32 partial sums
    to ``partial`` (a ``(rows, chunks, split_stats)`` scratch).
``split_row``'s rows kernel
    ``(*tensors, partial, grad, *shares, *row strides, n_rows, N, eps)``, on a grid of (chunks,
    groups); its constexprs also ``SPLITS`` (the chunk count padded to a power of two).

Each kernel gets the family's constexprs its signature names. Every row stride is ``N``: the
families refuse non-contiguous tensors. Kernels address rows in 64-bit integers (the helpers cast
the row index), so that tensors of more than 2**31 elements are addressed correctly, and mask
every load and store. Scratch buffers are allocated with ``new_empty`` on an output (the harness
allows allocation, not computation); every element of them is written before it is read.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import triton
import triton.language as tl

from kernelsmith.ops import _rowwise as skeleton
from kernelsmith.ops._base import Launcher, Variant, generator, rows_and_width
from kernelsmith.ops._launch import direct_launch
from kernelsmith.space import Config, Param, Space, next_power_of_two
from kernelsmith.spec import OpSpec, TensorSpec

# ---------------------------------------------------------------------------------------------
# Jitted helpers: the kernels' addressing
# ---------------------------------------------------------------------------------------------


@triton.jit
def row_columns(BLOCK_N: tl.constexpr, N):
    """The columns of a whole row (``BLOCK_N`` >= N) and their mask."""
    cols = tl.arange(0, BLOCK_N)
    return cols, cols < N


@triton.jit
def column_block(BLOCK_N: tl.constexpr, N):
    """The columns of this program's block (axis 0 of the grid) and their mask."""
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    return cols, cols < N


@triton.jit
def load_row(ptr, i, row_stride, cols, mask):
    """Row ``i`` of a (rows, N) matrix at ``cols``, in float32; zero on masked lanes."""
    row = tl.cast(i, tl.int64)  # 64-bit offsets (and a tensor in the interpreter)
    return tl.load(ptr + row * row_stride + cols, mask=mask, other=0.0).to(tl.float32)


@triton.jit
def store_row(ptr, i, row_stride, cols, value, mask):
    """Store ``value`` (already in the tensor's dtype) at row ``i``, ``cols`` of a (rows, N) matrix."""
    tl.store(ptr + tl.cast(i, tl.int64) * row_stride + cols, value, mask=mask)


@triton.jit
def store_share(partial_ptr, program, N, cols, share, mask):
    """Store this program's share of a parameter gradient as row ``program`` of the scratch."""
    tl.store(partial_ptr + tl.cast(program, tl.int64) * N + cols, share, mask=mask)


# ---------------------------------------------------------------------------------------------
# The fixed-order sum of the programs' shares
# ---------------------------------------------------------------------------------------------

REDUCE_TILE = 2048  # BLOCK_R * BLOCK_C elements per step of the reduction
REDUCE_WARPS = 4
LOOPED_REDUCE_ROWS = 16  # looped's BLOCK_R (two_stage's is a search parameter)


def row_groups(per_multiprocessor: int, rows: int) -> int:
    """Programs of a grid of ``per_multiprocessor`` per multiprocessor, at most one per row."""
    return max(1, min(rows, skeleton.programs(per_multiprocessor)))


def reduce_block_c(block_r: int, n: int) -> int:
    """Columns per program of the share sum: a ``REDUCE_TILE`` tile, but narrow enough that the
    columns spread over every multiprocessor. (With 256 columns, N = 4096 made 16 programs for
    132 multiprocessors: 14 us for a 4 MB sum on an H200, most of the GPU idle.)"""
    tile_width = max(16, REDUCE_TILE // block_r)
    spread = max(16, next_power_of_two(triton.cdiv(n, skeleton.programs(1))))
    return min(next_power_of_two(n), tile_width, spread)


@triton.jit
def _sum_partials_kernel(
    partial_ptr,  # (programs, N) float32
    dw_ptr,
    programs,
    N,
    BLOCK_R: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    """dw[cols] = sum of the partial rows, always in the same order (bitwise reproducible)."""
    cols = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
    col_mask = cols < N
    acc = tl.zeros([BLOCK_R, BLOCK_C], dtype=tl.float32)
    for start in range(0, programs, BLOCK_R):
        rows = start + tl.arange(0, BLOCK_R)
        mask = (rows < programs)[:, None] & col_mask[None, :]
        offsets = rows.to(tl.int64)[:, None] * N + cols[None, :]
        acc += tl.load(partial_ptr + offsets, mask=mask, other=0.0)
    tl.store(dw_ptr + cols, tl.sum(acc, axis=0), mask=col_mask)


def reducer(n: int, block_r: int) -> Callable[[torch.Tensor, torch.Tensor, int], None]:
    """A launcher of the fixed-order share sum over rows of ``n`` columns:
    ``reduce(partial, out, programs)`` writes ``out[c] = sum of partial[:programs, c]``."""
    block_c = reduce_block_c(block_r, n)
    kernel = direct_launch(_sum_partials_kernel, (triton.cdiv(n, block_c),))

    def reduce(partial: torch.Tensor, out: torch.Tensor, programs: int) -> None:
        kernel(partial, out, programs, n, BLOCK_R=block_r, BLOCK_C=block_c, num_warps=REDUCE_WARPS)

    return reduce


# ---------------------------------------------------------------------------------------------
# A family, as the launchers see it
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Operands:
    """A call's tensors in the kernels' order: ``tensors`` (the activations, then the weight or
    a placeholder), ``stats_tensors`` (those the statistics kernel reads, in its order), ``grad``
    (the activation gradient) and ``sums`` (the parameter gradients summed over rows, each from
    a scratch of the programs' shares; none when the op has no parameter)."""

    tensors: tuple[torch.Tensor, ...]
    stats_tensors: tuple[torch.Tensor, ...]
    grad: torch.Tensor
    sums: tuple[torch.Tensor, ...]


@dataclass(frozen=True)
class Backward:
    """What a norm backward family gives the skeleton besides its spaces."""

    module: str  # the family's module (its kernels): the variants' hashes cover it
    two_stage_kernel: Any
    looped_stats_kernel: Any
    looped_rows_kernel: Any
    width_input: int  # the input whose shape is (..., N): x, or h after dy and dh
    stats_width: int  # float32 statistics a row the looped statistics kernel writes
    share_slots: int  # share pointers the rows kernels take (absent ones repeat the last)
    operands: Callable[[int, Sequence[torch.Tensor], Sequence[torch.Tensor]], Operands]
    constexprs: Callable[[OpSpec], dict[str, Any]]  # the family's, for every kernel naming them
    modules: tuple[str, ...] = ()  # further modules whose code the kernels run
    # split_row's two kernels and the float32 partial sums a chunk its first one writes (None:
    # the family has no split_row)
    split_stats_kernel: Any = None
    split_rows_kernel: Any = None
    split_stats: int = 0

    def rows_and_width(self, spec: OpSpec) -> tuple[int, int]:
        return rows_and_width(spec, input_index=self.width_input)


def launch_options(config: Config) -> dict[str, int]:
    """``num_warps`` and ``num_stages`` of a config, as launch options."""
    return {"num_warps": int(config["num_warps"]), "num_stages": int(config["num_stages"])}


def _kernel_constexprs(kernel: Any, family: dict[str, Any], meta: dict[str, Any]) -> dict[str, Any]:
    """``meta`` and those of the family's constexprs that ``kernel``'s signature names."""
    return {**meta, **{k: v for k, v in family.items() if k in kernel.arg_names}}


def _shares(ops: Operands, programs: int, n: int, slots: int) -> tuple[torch.Tensor, ...]:
    """The scratch rows of each program's shares, one ``(programs, N)`` float32 buffer a sum, as
    ``slots`` pointers: absent sums repeat the last buffer (or ``grad`` without any); the kernels
    never dereference them."""
    if not ops.sums:
        return (ops.grad,) * slots
    scratch = ops.sums[0].new_empty((len(ops.sums), programs, n), dtype=torch.float32)
    shares = [scratch[i] for i in range(len(ops.sums))]
    return (*shares, *[shares[-1]] * (slots - len(shares)))


# ---------------------------------------------------------------------------------------------
# The launchers
# ---------------------------------------------------------------------------------------------


def two_stage_launcher(family: Backward, spec: OpSpec, config: Config) -> Launcher:
    """GROUPS programs per multiprocessor walk whole rows: dx and their shares, then the sums."""
    rows, n = family.rows_and_width(spec)
    programs = row_groups(int(config["GROUPS"]), rows)
    eps = float(spec.const("eps"))
    kernel = family.two_stage_kernel
    meta = _kernel_constexprs(kernel, family.constexprs(spec), {
        "BLOCK_N": next_power_of_two(n), "NUM_STAGES": int(config["num_stages"]),
        **launch_options(config)})
    rows_kernel = direct_launch(kernel, (programs,))
    reduce = reducer(n, int(config["BLOCK_R"]))

    def launch(inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> None:
        ops = family.operands(n, inputs, outputs)
        shares = _shares(ops, programs, n, family.share_slots)
        strides = (n,) * len(ops.tensors)  # each activation's and grad's (the weight has none)
        rows_kernel(*ops.tensors, ops.grad, *shares, *strides, rows, n, eps, **meta)
        for share, total in zip(shares, ops.sums, strict=False):  # the padding slots sum nothing
            reduce(share, total, programs)

    return launch


def looped_launcher(family: Backward, spec: OpSpec, config: Config) -> Launcher:
    """Row statistics in one pass, then (column block, group) programs, then the sums."""
    rows, n = family.rows_and_width(spec)
    groups = row_groups(int(config["GROUPS"]), rows)
    block_n = int(config["BLOCK_N"])
    eps = float(spec.const("eps"))
    constexprs = family.constexprs(spec)
    meta = {"BLOCK_N": block_n, "NUM_STAGES": int(config["num_stages"]), **launch_options(config)}
    stats_meta = _kernel_constexprs(family.looped_stats_kernel, constexprs, meta)
    rows_meta = _kernel_constexprs(family.looped_rows_kernel, constexprs, meta)
    stats_kernel = direct_launch(family.looped_stats_kernel, (rows,))
    rows_kernel = direct_launch(family.looped_rows_kernel, (triton.cdiv(n, block_n), groups))
    reduce = reducer(n, LOOPED_REDUCE_ROWS)

    def launch(inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> None:
        ops = family.operands(n, inputs, outputs)
        stats = ops.grad.new_empty((rows, family.stats_width), dtype=torch.float32)
        shares = _shares(ops, groups, n, family.share_slots)
        stats_strides = (n,) * (len(ops.stats_tensors) - 1)  # the activations' (not the weight's)
        stats_kernel(*ops.stats_tensors, stats, *stats_strides, n, eps, **stats_meta)
        strides = (n,) * len(ops.tensors)
        rows_kernel(*ops.tensors, stats, ops.grad, *shares, *strides, rows, n, **rows_meta)
        for share, total in zip(shares, ops.sums, strict=False):  # the padding slots sum nothing
            reduce(share, total, groups)

    return launch


def variants(family: Backward, two_stage_space: Callable[[OpSpec], Space],
             looped_space: Callable[[OpSpec], Space], sums: str = "dw",
             looped_summary: str = "row statistics, then (column block, group) programs, then the dw sum; "
                                   "for wide rows") -> tuple[Variant, Variant]:
    """The family's two variants; ``sums`` names the summed gradients in two_stage's summary."""
    modules = (family.module, skeleton.__name__, *family.modules)

    def two_stage_build(spec: OpSpec, config: Config) -> Launcher:
        return two_stage_launcher(family, spec, config)

    def looped_build(spec: OpSpec, config: Config) -> Launcher:
        return looped_launcher(family, spec, config)

    return (
        Variant("two_stage", f"GROUPS programs per SM walk whole rows in registers, {sums} shares summed by "
                "a second kernel", two_stage_space, two_stage_build, modules),
        Variant("looped", looped_summary, looped_space, looped_build, modules),
    )


# ---------------------------------------------------------------------------------------------
# split_row: rows cut into chunks across programs (issue 19)
#
# The forwards' split_row (kernelsmith.ops._rowwise, the section on rows split across programs)
# for a backward: rows wider than a program should hold, and few rows, where one program a row
# (or a row group) leaves most multiprocessors idle. A row's dx needs its whole-row sums (RMSNorm:
# sum(x * x) and sum(dy * w * x)), so there are two launches and a sum:
#
# 1. the statistics kernel, one program per (chunk, row group): for each row of its group (rows
#    group, group + groups, ...) its chunk's partial sums, float32, into a (rows, chunks,
#    split_stats) scratch;
# 2. the rows kernel, on the same grid, walking the same rows: for each it adds the row's
#    chunks' partial sums (one block reduction over the chunks, the same values in the same order
#    in every program of the row: deterministic), writes the chunk's dx and accumulates the
#    chunk's columns of the dw share, which it stores as row ``group`` of a (groups, N) float32
#    scratch;
# 3. the fixed-order share sum (reducer) over the groups, as looped's.
#
# The dw share is why the chunks are plain column blocks (column_block: chunk c holds columns
# c * BLOCK_N on) and not the forward's realigned pieces (row_pieces): those cut each row at its
# own first 16-byte-aligned element, so the same lane holds a different column in rows of
# another alignment, and a program could not add its rows' dw terms lane by lane. The dw share
# needs the row's r, which only the second launch knows, so launch 1 holds no dw.
#
# The space is the forwards' (skeleton.split_row_space: rows of more than SPLIT_MIN_ROW_BYTES
# only, so that the spaces recorded for narrower rows stand; two to MAX_SPLITS chunks) with
# looped's GROUPS. No atomics, no waiting between programs: any grid is safe, and the scratch
# buffers come from the caching allocator (CUDA-graph capturable).
# ---------------------------------------------------------------------------------------------


@triton.jit
def chunk_statistics_at(partial_ptr, i, STATS: tl.constexpr):
    """The address of this program's chunk's (axis 0 of the grid) first statistic of row ``i``
    in the ``(rows, chunks, STATS)`` float32 partials; the others follow it."""
    row = tl.cast(i, tl.int64)
    return partial_ptr + (row * tl.num_programs(0) + tl.program_id(0)) * STATS


@triton.jit
def row_chunk_statistics(partial_ptr, i, STATS: tl.constexpr, SPLITS: tl.constexpr):
    """The addresses of the first statistic of each of row ``i``'s chunks (one a lane of
    ``SPLITS``, the chunk count rounded up to a power of two; as many chunks as axis 0 of the grid
    has programs) and which lanes are real chunks: ``(addresses, mask)``."""
    lanes = tl.arange(0, SPLITS)
    chunks = tl.num_programs(0)
    return partial_ptr + (tl.cast(i, tl.int64) * chunks + lanes) * STATS, lanes < chunks


def split_row_space(spec: OpSpec, in_flight: int) -> Space:
    """The forwards' split_row space (``BLOCK_N`` columns a chunk, ``num_warps``; ``in_flight``
    chunk-sized float32 vectors held at once, under the norms' register rule) and ``GROUPS``, the
    rows kernel's row groups per multiprocessor (as looped's)."""
    chunks = skeleton.split_row_space(spec, skeleton.NORM_WARPS, in_flight)
    return Space([*chunks.params, Param("GROUPS", skeleton.LOOPED_GROUPS)], chunks.constraints)


def split_row_launcher(family: Backward, spec: OpSpec, config: Config) -> Launcher:
    """Chunk statistics, then dx and the dw shares, both on (chunks, groups), then the share sums.
    The rows are walked by groups, not given a grid axis each: a grid's second axis holds at
    most 65535 programs on CUDA (the rows of a long sequence are more), and the groups' count is
    a few per multiprocessor, which is as many as one row a program when the rows are few."""
    rows, n = family.rows_and_width(spec)
    block_n = int(config["BLOCK_N"])
    chunks = triton.cdiv(n, block_n)
    groups = row_groups(int(config["GROUPS"]), rows)
    eps = float(spec.const("eps"))
    constexprs = family.constexprs(spec)
    meta = {"BLOCK_N": block_n, "num_warps": int(config["num_warps"])}
    stats_meta = _kernel_constexprs(family.split_stats_kernel, constexprs, meta)
    # the rows kernel loads a row's chunk sums as one block of SPLITS lanes
    rows_meta = _kernel_constexprs(family.split_rows_kernel, constexprs,
                                   {**meta, "SPLITS": next_power_of_two(chunks)})
    stats_kernel = direct_launch(family.split_stats_kernel, (chunks, groups))
    rows_kernel = direct_launch(family.split_rows_kernel, (chunks, groups))
    reduce = reducer(n, LOOPED_REDUCE_ROWS)

    def launch(inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> None:
        ops = family.operands(n, inputs, outputs)
        partial = ops.grad.new_empty((rows, chunks, family.split_stats), dtype=torch.float32)
        shares = _shares(ops, groups, n, family.share_slots)
        stats_strides = (n,) * (len(ops.stats_tensors) - 1)  # the activations' (not the weight's)
        stats_kernel(*ops.stats_tensors, partial, *stats_strides, rows, n, **stats_meta)
        strides = (n,) * len(ops.tensors)
        rows_kernel(*ops.tensors, partial, ops.grad, *shares, *strides, rows, n, eps, **rows_meta)
        for share, total in zip(shares, ops.sums, strict=False):  # the padding slots sum nothing
            reduce(share, total, groups)

    return launch


def split_row_variant(family: Backward, space: Callable[[OpSpec], Space],
                      summary: str = "(chunk, row group) programs: the chunks' partial row sums, then dx and the "
                                     "dw shares, then the dw sum; for wide rows and few rows"
                      ) -> Variant:
    """The family's split_row variant (its ``split_*`` kernels must be given)."""
    if family.split_stats_kernel is None or family.split_rows_kernel is None or family.split_stats < 1:
        raise ValueError(f"{family.module} gives no split_row kernels")
    op = family.module.rsplit(".", 1)[-1]

    def build(spec: OpSpec, config: Config) -> Launcher:
        skeleton.checked(op, space(spec), config)
        return split_row_launcher(family, spec, config)

    return Variant("split_row", summary, space, build, (family.module, skeleton.__name__, *family.modules))


# ---------------------------------------------------------------------------------------------
# Inputs
# ---------------------------------------------------------------------------------------------


def upstream_gradients(seed: int, device: str | torch.device, specs: Sequence[TensorSpec]) -> tuple[torch.Tensor, ...]:
    """The upstream gradients (dy, and dh for add_rmsnorm_backward): N(0, 1) drawn in float32 in
    order from a generator of their own (not the forward inputs'), each cast to its dtype."""
    g = generator(seed ^ 0x5EED_D1FF, device)
    draws = [torch.randn(s.shape, generator=g, device=device, dtype=torch.float32) for s in specs]
    return tuple(d.to(s.torch_dtype) for d, s in zip(draws, specs, strict=True))

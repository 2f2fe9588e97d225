"""Row reductions over the last dimension: ``sum``, ``mean`` and ``max`` (``torch.amax``).

The ops
-------
One input ``x`` of shape ``(..., N)`` (at least one dimension) in float16, bfloat16 or float32;
one output of shape ``x.shape[:-1]`` (``keepdim=False``) in x's dtype, exactly what
``torch.sum(x, -1)``, ``torch.mean(x, -1)`` and ``torch.amax(x, -1)`` return (a 0-d tensor for a
1-D ``x``). Every leading dimension is flattened into rows, so the kernels see a ``(rows, N)``
matrix and reduce each row to one value. Only the last dimension is supported: ``dim`` is part of
the spec's constants and is always ``-1`` (``dim = x.ndim - 1`` is normalised to ``-1``; any other
``dim`` is an :class:`UnsupportedWorkload`).

The three families share one module and one set of kernels; a constexpr ``KIND`` picks the
reduction at compile time (``0`` sum, ``1`` mean, ``2`` max), so each family compiles to a kernel
with no trace of the others.

Arithmetic
----------
Values are converted to float32 right after the load and the result is rounded once, to the
output dtype, right before the store, as PyTorch does for half-precision inputs (it accumulates
in float32). Padding lanes (columns past ``N``) load ``0`` for sums, which adds nothing, and
``-inf`` for the max, which never wins.

*Sums* are tree reductions within a block (``tl.sum``). On a GPU a thread first adds up its own
elements one after the other, then the threads combine theirs in a tree: the sequential part is
what loses float32 accuracy when a row's values cancel, so every config keeps at most 64 values a
thread (the same bound that keeps registers from spilling). The ``looped`` variant adds each
block into per-lane running sums; a long row in small blocks would make those running sums the
weak point (a 32768-wide row in 64-column blocks is 512 additions per lane, several times
PyTorch's own error in float32), so they are compensated (Kahan summation: each lane carries the
rounding error of its last addition into the next one), which costs three more additions per
element in a loop that is bound by memory anyway. The compensation is skipped once a running
sum is infinite or NaN (``inf - inf`` would make it NaN), so that a row holding an ``inf`` sums to
``inf`` (or NaN with both infinities, or a NaN) as in PyTorch.

*Mean* is the float32 sum divided by ``N`` with a correctly rounded division (``div_rn``; a
plain ``/`` compiles to an approximate division on NVIDIA GPUs).

*Max* must propagate NaN as ``torch.amax`` does: a row with a NaN has a NaN maximum. Triton's
``tl.max`` ignores NaN (it compiles to ``maxnum``), and a reduction with a custom NaN-propagating
combine function, though as fast on a GPU, runs element by element in the interpreter. So the
kernels reduce integer *keys* instead (``_nan_max``): the bits of a float32, with the other bits
of negative values flipped, compare as signed integers in the same order as the floats, and
every NaN is given the key just above ``+inf``. One integer ``max`` reduction then yields the
largest value, NaN if there is one, and the key converts back to the float exactly. The
``looped`` kernel keeps a per-lane running maximum with ``tl.maximum(...,
propagate_nan=ALL)`` (one instruction, NaN-propagating, also in the interpreter) and reduces the
lanes' keys once at the end. A row that is ``-inf`` throughout has the maximum ``-inf``.

The variants
------------
``whole_row``
    One program per row, the whole (power-of-two padded) row in registers: one read of the row,
    one reduction, one store. Rows up to 65536 columns.
``looped``
    One program per row, the row walked in blocks of ``BLOCK_N`` columns with a per-lane running
    accumulator (a compensated sum, or a running max), reduced across lanes once after the loop:
    any width, a fixed register footprint, and ``num_stages`` software pipelining of the loop.
``multi_row``
    ``ROWS`` rows per program as one ``[ROWS, BLOCK_N]`` block reduced along its columns, for
    narrow rows whose single-row programs would have too little work to hide memory latency.
``split_row``
    ``(row, chunk)`` programs and two launches, for rows wider than one program should hold and
    for few rows (a handful of programs cannot keep a GPU's bandwidth busy): the first launch
    reduces each ``BLOCK_N``-element chunk of a row to one float32 statistic, the second merges
    a row's chunks' statistics in a fixed order (a tree over the chunk lanes, the same tree on
    every run) and stores the result. No atomics: the result is bitwise the same from run to run.
    The merge of the chunks is the reduction itself: a sum is the sum of the chunks' sums; the
    mean is that sum divided by ``N`` (once, correctly rounded, never a mean of means); the max is
    the max of the chunks' maxes, NaN as soon as one chunk's is (each chunk's max already is NaN
    when the chunk holds one, and the merge reduces the same NaN-propagating keys). Offered only
    for rows of more than 8 KB (the skeleton's ``split_row_space``), so narrower rows' spaces are
    as they were.

Only ``looped`` has a loop, so only it has a ``num_stages`` parameter (the compiler pipelines
loops; the other kernels compile to the same code for every value). Spaces have about 70 to 100
configs in all for a 1k-4k wide row, fewer for very narrow or very wide rows, and never none.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any, ClassVar

import torch
import triton
import triton.language as tl

from kernelsmith.ops import _rowwise as skeleton
from kernelsmith.ops._base import Launcher, OpFamily, UnsupportedWorkload, Variant, generator, rows_and_width
from kernelsmith.ops._last_dim import check_last_dim, one_tensor
from kernelsmith.space import Config
from kernelsmith.spec import OpSpec, TensorSpec

# The reduction kinds, the KIND constexpr of every kernel.
KIND_SUM = 0
KIND_MEAN = 1
KIND_MAX = 2

# =================================================================================================
# Kernels
#
# x is a (rows, N) matrix with unit column stride, its row stride passed explicitly; y is the
# contiguous vector of the rows' results. Row offsets are computed in int64 so that tensors of
# more than 2**31 elements are addressed correctly. ``y_ptr.dtype.element_ty`` is the output's
# storage dtype, so one kernel serves fp16, bf16 and fp32.
# =================================================================================================


@triton.jit
def _nan_max(x, axis: tl.constexpr):
    """The maximum of float32 ``x`` along ``axis``, NaN when any element is NaN (like torch.amax).

    For a float's bits ``b`` read as a signed int32, ``b ^ ((b >> 31) & 0x7FFFFFFF)`` keeps
    non-negative floats as they are and flips the magnitude bits of negative ones, so that the
    keys compare as integers exactly as the floats do (-inf < ... < -0.0 < +0.0 < ... < +inf).
    Every NaN (whatever its sign and payload) gets the key 0x7FC00000, above +inf's 0x7F800000,
    so it wins the integer max; the map is its own inverse, and 0x7FC00000 is a quiet NaN.
    """
    bits = x.to(tl.int32, bitcast=True)
    key = bits ^ ((bits >> 31) & 0x7FFFFFFF)
    key = tl.where(x != x, 0x7FC00000, key)
    top = tl.max(key, axis=axis)
    top = top ^ ((top >> 31) & 0x7FFFFFFF)
    return top.to(tl.float32, bitcast=True)


@triton.jit
def _sum(x, axis: tl.constexpr, width, KIND: tl.constexpr):
    """The float32 sum of ``x`` along ``axis``; for the mean (KIND 1) divided by ``width``,
    correctly rounded."""
    result = tl.sum(x, axis=axis)
    if KIND == 1:
        result = tl.math.div_rn(result, width)
    return result


@triton.jit
def _load_and_reduce(x_ptrs, mask, width, axis: tl.constexpr, KIND: tl.constexpr, EVICT_X: tl.constexpr):
    """The reduction (KIND) of the block at ``x_ptrs`` along ``axis``, loaded in float32 on the
    lanes of ``mask``."""
    if KIND == 2:
        # Padding lanes (and rows past the end) read -inf: it never wins the max.
        x = tl.load(x_ptrs, mask=mask, other=float("-inf"), eviction_policy=EVICT_X).to(tl.float32)
        result = _nan_max(x, axis)
    else:
        # Padding lanes read 0: it adds nothing to the sum.
        x = tl.load(x_ptrs, mask=mask, other=0.0, eviction_policy=EVICT_X).to(tl.float32)
        result = _sum(x, axis, width, KIND)
    return result


# Every kernel takes x, y, x's row stride, n_rows where a program owns several rows, the row
# width n_cols, its float ``width`` (the divisor of the mean), then KIND (0 sum, 1 mean, 2 max)
# and its schedule's constexprs.


@triton.jit
def _reduce_whole_row_kernel(
    x_ptr, y_ptr, x_row_stride, n_cols, width,
    KIND: tl.constexpr,
    BLOCK_N: tl.constexpr,  # next_power_of_two(n_cols): the whole row in one block
    EVICT_X: tl.constexpr,  # "" or "evict_first": x is read once, so it need not stay in L2
):
    width = tl.cast(width, tl.float32)  # float32 math even where Inductor passes a Python float as fp64
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < n_cols
    result = _load_and_reduce(x_ptr + row * x_row_stride + cols, mask, width, 0, KIND, EVICT_X)
    tl.store(y_ptr + row, result.to(y_ptr.dtype.element_ty))


@triton.jit
def _reduce_looped_kernel(
    x_ptr, y_ptr, x_row_stride, n_cols, width,
    KIND: tl.constexpr,
    BLOCK_N: tl.constexpr,  # columns per loop step; the row may be any multiple of it, or not
    NUM_STAGES: tl.constexpr,  # software-pipelining depth of the loop (1: none)
):
    width = tl.cast(width, tl.float32)  # float32 math even where Inductor passes a Python float as fp64
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * x_row_stride
    cols = tl.arange(0, BLOCK_N)
    if KIND == 2:
        # One running maximum a lane; tl.maximum with PropagateNan.ALL keeps a NaN once seen.
        acc = tl.full([BLOCK_N], float("-inf"), tl.float32)
        for start in tl.range(0, n_cols, BLOCK_N, num_stages=NUM_STAGES):
            offs = start + cols
            x = tl.load(x_row + offs, mask=offs < n_cols, other=float("-inf")).to(tl.float32)
            acc = tl.maximum(acc, x, propagate_nan=tl.PropagateNan.ALL)
        result = _nan_max(acc, 0)
    else:
        # One running sum a lane, compensated (Kahan): ``comp`` is the part of the previous
        # addend that the rounding of ``acc + y`` lost, subtracted from the next addend. While the
        # sum is inf or NaN there is nothing to compensate (and inf - inf would poison it).
        acc = tl.zeros([BLOCK_N], tl.float32)
        comp = tl.zeros([BLOCK_N], tl.float32)
        for start in tl.range(0, n_cols, BLOCK_N, num_stages=NUM_STAGES):
            offs = start + cols
            x = tl.load(x_row + offs, mask=offs < n_cols, other=0.0).to(tl.float32)
            y = x - comp
            total = acc + y
            comp = tl.where(tl.abs(total) < float("inf"), (total - acc) - y, 0.0)
            acc = total
        result = _sum(acc, 0, width, KIND)
    tl.store(y_ptr + row, result.to(y_ptr.dtype.element_ty))


@triton.jit
def _reduce_multi_row_kernel(
    x_ptr, y_ptr, x_row_stride, n_rows, n_cols, width,
    KIND: tl.constexpr,
    ROWS: tl.constexpr,  # rows per program
    BLOCK_N: tl.constexpr,  # next_power_of_two(n_cols)
):
    width = tl.cast(width, tl.float32)  # float32 math even where Inductor passes a Python float as fp64
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK_N)
    row_mask = rows < n_rows  # the last program may run past the end when ROWS does not divide
    mask = row_mask[:, None] & (cols < n_cols)[None, :]
    x_ptrs = x_ptr + rows.to(tl.int64)[:, None] * x_row_stride + cols[None, :]
    # One result a row of the [ROWS, BLOCK_N] block (rows past the end: never stored). No
    # eviction hint ("" is tl.load's default).
    result = _load_and_reduce(x_ptrs, mask, width, 1, KIND, "")
    tl.store(y_ptr + rows, result.to(y_ptr.dtype.element_ty), mask=row_mask)


@triton.jit
def _reduce_split_stats_kernel(
    x_ptr,
    partial_ptr,  # (rows, chunks, 1) float32: each chunk's sum (KIND 0 and 1) or max (KIND 2)
    n_cols,
    KIND: tl.constexpr,
    BLOCK_N: tl.constexpr,  # body elements a chunk
    SPLITS: tl.constexpr,  # chunks a row rounded up to a power of two (the merge's lanes; unused here)
    ALIGN: tl.constexpr,  # elements in 16 bytes: the body is cut at 16-byte boundaries
):
    """split_row, first launch: one chunk's statistic. The skeleton's ``row_pieces`` cuts the row
    into a 16-byte-aligned body of ``BLOCK_N``-element chunks plus a short head and tail that chunk
    0 takes; every element is in exactly one chunk. A chunk can be empty (a row whose body is
    shorter than the chunk count times BLOCK_N): its sum is 0 and its max -inf, the identities of
    the merge, so it changes nothing."""
    row = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1)
    body, body_mask, edge, edge_mask = skeleton.row_pieces(row * n_cols, n_cols, chunk, BLOCK_N, ALIGN)
    if KIND == 2:
        # Masked lanes read -inf (never the max). Each piece's max is NaN if the piece holds a
        # NaN; tl.maximum with PropagateNan.ALL keeps a NaN of either piece.
        x = tl.load(x_ptr + body, mask=body_mask, other=float("-inf")).to(tl.float32)
        x_edge = tl.load(x_ptr + edge, mask=edge_mask, other=float("-inf")).to(tl.float32)
        stat = tl.maximum(_nan_max(x, 0), _nan_max(x_edge, 0), propagate_nan=tl.PropagateNan.ALL)
    else:
        # Masked lanes read 0 (adds nothing). The mean's division waits for the merge: the
        # chunks keep plain sums.
        x = tl.load(x_ptr + body, mask=body_mask, other=0.0).to(tl.float32)
        x_edge = tl.load(x_ptr + edge, mask=edge_mask, other=0.0).to(tl.float32)
        stat = tl.sum(x, axis=0) + tl.sum(x_edge, axis=0)
    tl.store(partial_ptr + row * tl.num_programs(1) + chunk, stat)


@triton.jit
def _reduce_split_merge_kernel(
    partial_ptr, y_ptr, n_cols, width,
    KIND: tl.constexpr,
    BLOCK_N: tl.constexpr,  # (the launcher passes the first launch's meta; unused here)
    SPLITS: tl.constexpr,  # chunks a row rounded up to a power of two: one lane a chunk
    ALIGN: tl.constexpr,  # (unused here)
):
    """split_row, second launch: the row's result from its chunks' statistics, in one fixed-order
    reduction over the chunk lanes (lanes past the last chunk read the merge's identity: 0 for a
    sum, -inf for a max). The launcher's grid is (rows, chunks), as for the families whose second
    launch writes every chunk; here only a row's chunk-0 program has something to store."""
    width = tl.cast(width, tl.float32)  # float32 math even where Inductor passes a Python float as fp64
    row, chunk, at, real = skeleton.split_partials(partial_ptr, 1, SPLITS)
    if chunk == 0:
        if KIND == 2:
            # max of the chunks' maxes; the integer keys of _nan_max make a NaN chunk win.
            result = _nan_max(tl.load(at, mask=real, other=float("-inf")), 0)
        else:
            # sum of the chunks' sums; the mean divides the row's sum by N once, correctly rounded.
            result = _sum(tl.load(at, mask=real, other=0.0), 0, width, KIND)
        tl.store(y_ptr + row, result.to(y_ptr.dtype.element_ty))


# =================================================================================================
# Spaces (the launchers are the skeleton's: kernelsmith.ops._rowwise)
#
# The spaces do not depend on the reduction kind. At most 64 values a thread (the reductions'
# register rule): it also bounds the sequential part of a GPU reduction (each thread adds its
# own values one by one), which is where a float32 sum loses accuracy.
# =================================================================================================

_MULTI_ROWS = (*skeleton.ROWS_PER_PROGRAM, 64)


# Each is the skeleton's space of its schedule under that rule: a function of the spec alone.
_whole_row_space = partial(skeleton.whole_row_space, warps=skeleton.REDUCTION_WARPS)
_looped_space = partial(skeleton.looped_space, warps=skeleton.REDUCTION_WARPS)
_multi_row_space = partial(skeleton.multi_row_space, warps=skeleton.REDUCTION_WARPS, rows=_MULTI_ROWS)
# One chunk of BLOCK_N elements in flight; empty for rows of at most 8 KB.
_split_row_space = partial(skeleton.split_row_space, warps=skeleton.REDUCTION_WARPS)


def _split_row_build(kind: int) -> Callable[[OpSpec, Config], Launcher]:
    """The split_row build of reduction ``kind``: chunk statistics, then the rows' merge, through
    the skeleton's two-launch launcher with one float32 statistic a chunk."""

    def build(spec: OpSpec, config: Config) -> Launcher:
        skeleton.checked(spec.op, _split_row_space(spec), config)
        constexprs = (("KIND", kind),)
        stats = skeleton.SplitKernel(_reduce_split_stats_kernel,
                                     lambda inputs, outputs, partial: (inputs[0], partial), (), constexprs)
        merge = skeleton.SplitKernel(_reduce_split_merge_kernel,
                                     lambda inputs, outputs, partial: (partial, outputs[0]), _width(spec), constexprs)
        return skeleton.split_row_launcher(spec, config, stats, merge, n_stats=1)

    return build


def _width(spec: OpSpec) -> tuple[float]:
    """The kernels' scalar after N: N as a float, the divisor of the mean."""
    return (float(rows_and_width(spec)[1]),)


def _variants(kind: int) -> tuple[Variant, ...]:
    # x is the one row-strided tensor (the output is a vector of the rows' results).
    return (
        skeleton.variant(__name__, "whole_row", "one program per row, the whole row in registers",
                         _whole_row_space, _reduce_whole_row_kernel, strides=1, scalars=_width, KIND=kind),
        skeleton.variant(__name__, "looped",
                         "one program per row, walked in BLOCK_N-column blocks with a per-lane running "
                         "accumulator (any width)",
                         _looped_space, _reduce_looped_kernel, strides=1, scalars=_width, pipelined=True,
                         KIND=kind),
        skeleton.variant(__name__, "multi_row", "ROWS rows per program as one [ROWS, BLOCK_N] block (narrow rows)",
                         _multi_row_space, _reduce_multi_row_kernel, strides=1, scalars=_width, KIND=kind),
        Variant("split_row", "(row, chunk) programs: each chunk's sum or max, then a fixed-order merge a row; for "
                "wide rows and few rows", _split_row_space, _split_row_build(kind), modules=(skeleton.__name__,)),
    )


# =================================================================================================
# The op families (the checks of their input are softmax's too: kernelsmith.ops._last_dim)
# =================================================================================================

# Sums must stay inside float16's range (65504) whatever the width, or PyTorch's own result is
# inf where the float64 reference is finite and no candidate could pass: the value scales of the
# sum family's distributions shrink for rows wide enough to need it.
_SUM_POSITIVE_BUDGET = 8192.0  # largest expected row sum of "positive" (N/2 * row scale)
_SUM_LARGE_BUDGET = 2048.0  # largest row-sum standard deviation of "large"
_LARGE_ELEMENT_SCALE = 1000.0  # spread of "large" elements around their row's centre
_LARGE_CENTRE = 20000.0  # row centres of "large" (mean, max) are uniform in +-this


_SHAPE_HELP = (
    "the shape of x; the {op} runs over its last dimension and the result has x's other "
    "dimensions: --shape 8192x4096 is 8192 rows of 4096 columns (8192 results), --shape "
    "4x512x1024 is 2048 rows of 1024"
)


class _RowReduction(OpFamily):
    """A reduction of every row of x (its last dimension) to one value; see the module doc. A
    family names itself, its ``kind`` (the kernels' KIND), the PyTorch function it computes
    (``torch_reduction``, called as ``f(x, dim=-1)``), its summary and distributions; its
    shape help and variants follow from those."""

    kind: ClassVar[int]
    torch_reduction: ClassVar[Callable[..., torch.Tensor]]
    rowwise = True  # configs depend on the row width only: calls are bucketed by row count
    row_block = max(_MULTI_ROWS)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.shape_help = _SHAPE_HELP.format(op=cls.name)
        cls.variants = _variants(cls.kind)

    # ---- specs -----------------------------------------------------------------------------------
    def spec(self, shape: tuple[int, ...], dtype: str, **constants: Any) -> OpSpec:
        dim = self._take_constants(constants)
        return self._spec(TensorSpec(tuple(shape), dtype), dim)

    def spec_for(self, *inputs: torch.Tensor, **constants: Any) -> OpSpec:
        x = one_tensor(self.name, inputs)
        dim = self._take_constants(constants)
        return self._spec(TensorSpec.of(x), dim)

    def _take_constants(self, constants: dict[str, Any]) -> Any:
        """The ``dim`` constant; ``keepdim=False`` (PyTorch's default) is accepted and dropped."""
        dim = constants.pop("dim", -1)
        keepdim = constants.pop("keepdim", False)
        if keepdim is not False:
            raise UnsupportedWorkload(f"{self.name}: only keepdim=False is supported, got keepdim={keepdim!r}")
        if constants:
            raise UnsupportedWorkload(f"{self.name}: unknown constants {sorted(constants)}")
        # torch.sum(x, dim=(-1,)) names one dimension as a sequence of one.
        if isinstance(dim, tuple | list) and len(dim) == 1:
            dim = dim[0]
        return dim

    def _spec(self, x: TensorSpec, dim: Any) -> OpSpec:
        check_last_dim(self.name, x, dim)
        spec = OpSpec(self.name, (x,), {"dim": -1})
        self.check_supported(spec)
        return spec

    def output_specs(self, spec: OpSpec) -> tuple[TensorSpec, ...]:
        x = spec.inputs[0]
        return (TensorSpec(x.shape[:-1], x.dtype),)

    # ---- math ------------------------------------------------------------------------------------
    def reference(self, spec: OpSpec, inputs: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        return (type(self).torch_reduction(inputs[0], dim=-1),)

    def reference_fp64(self, spec: OpSpec, inputs: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        return (type(self).torch_reduction(inputs[0].double(), dim=-1),)

    def make_inputs(
        self,
        spec: OpSpec,
        seed: int,
        distribution: str = "normal",
        device: str | torch.device = "cuda",
    ) -> tuple[torch.Tensor, ...]:
        """Inputs for one distribution, drawn in float32 on ``device`` and rounded to the dtype.

        Every distribution makes the rows' results differ from row to row (the harness's
        "constant output" canary must fail the tolerance):

        - ``normal``: standard normal values;
        - ``positive``: uniform in [0, s) with a row scale s uniform in [0.25, 1): sums that do
          not cancel (for ``sum``, values shrink by 16384 / N on rows wider than 16384, so that
          sums stay below about 8192, inside float16's range);
        - ``large``: for ``mean`` and ``max``, a row centre uniform in +-20000 plus 1000 times a
          normal value (float16 still holds every element, while a float16 running sum would
          overflow); for ``sum``, normal values times ``min(1000, 2048 / sqrt(N))``, as large as
          float16's range allows for the row sums;
        - ``negative_ties`` (``max`` only): every value negative (a kernel padding with 0 fails)
          and a multiple of 1/4 (exact in every dtype): ``-(1 + k + j) / 4`` with ``k`` random in
          [0, 64) per row and ``j`` in [0, 8) per element, so each row's maximum is tied many
          times over.
        """
        x_spec = spec.inputs[0]
        shape, n = x_spec.shape, x_spec.shape[-1]
        row_shape = (*shape[:-1], 1)
        g = generator(seed, device)

        def uniform(size: tuple[int, ...], low: float, high: float) -> torch.Tensor:
            return torch.rand(size, generator=g, device=device) * (high - low) + low

        if distribution not in self.distributions:
            known = ", ".join(self.distributions)
            raise ValueError(f"{self.name}: unknown distribution {distribution!r} (known: {known})")
        if distribution == "normal":
            x = torch.randn(shape, generator=g, device=device)
        elif distribution == "positive":
            x = torch.rand(shape, generator=g, device=device) * uniform(row_shape, 0.25, 1.0)
            if self.kind == KIND_SUM:
                x = x * min(1.0, 2 * _SUM_POSITIVE_BUDGET / n)
        elif distribution == "large":
            if self.kind == KIND_SUM:
                x = torch.randn(shape, generator=g, device=device) * min(
                    _LARGE_ELEMENT_SCALE, _SUM_LARGE_BUDGET / math.sqrt(n)
                )
            else:
                centre = uniform(row_shape, -_LARGE_CENTRE, _LARGE_CENTRE)
                x = centre + _LARGE_ELEMENT_SCALE * torch.randn(shape, generator=g, device=device)
        else:  # negative_ties
            k = torch.randint(0, 64, row_shape, generator=g, device=device)
            j = torch.randint(0, 8, shape, generator=g, device=device)
            x = -0.25 * (1 + k + j).float()
        return (x.to(x_spec.torch_dtype),)

    def flops(self, spec: OpSpec) -> int:
        # One addition (or comparison) per element, plus a division a row for the mean.
        rows, _ = rows_and_width(spec)
        return spec.inputs[0].numel + (rows if self.kind == KIND_MEAN else 0)


class RowSum(_RowReduction):
    name, kind, torch_reduction = "sum", KIND_SUM, torch.sum
    summary = "sum over the last dimension, torch.sum(x, -1), accumulated in float32"
    distributions = ("normal", "positive", "large")


class RowMean(_RowReduction):
    name, kind, torch_reduction = "mean", KIND_MEAN, torch.mean
    summary = "mean over the last dimension, torch.mean(x, -1), accumulated in float32"
    distributions = ("normal", "positive", "large")


class RowMax(_RowReduction):
    name, kind, torch_reduction = "max", KIND_MAX, torch.amax
    summary = "maximum over the last dimension, torch.amax(x, -1) (NaN propagates)"
    distributions = ("normal", "positive", "large", "negative_ties")


SUM = RowSum()
MEAN = RowMean()
MAX = RowMax()

"""LayerNorm backward: ``(dy, x[, weight[, bias]]) -> (dx[, dw[, db]])``, the gradients of :mod:`layernorm`.

The forward (see :mod:`kernelsmith.ops.layernorm`) computes, for each row of ``N`` elements,

    mean = sum_j x_j / N
    rstd = 1 / sqrt(sum_j (x_j - mean) ** 2 / N + eps)
    xhat = (x - mean) * rstd
    y    = xhat * w + b                    (w, b: the optional weight and bias)

Given the upstream gradient ``dy`` (shaped like ``x``), with ``g = dy * w`` (``g = dy`` without
a weight) and ``mean_j`` the mean over the row's ``N`` elements:

    dx = rstd * (g - mean_j(g) - xhat * mean_j(g * xhat))
    dw = sum over rows of dy * xhat
    db = sum over rows of dy

(``d mean / dx_j = 1 / N`` gives the ``mean(g)`` term, ``d rstd / dx_j = -rstd**3 (x_j - mean) / N``
the ``xhat * mean(g * xhat)`` one.) The bias does not enter ``dx`` or ``dw``: it is an input so
that the inputs mirror the forward's, and its gradient is ``db``.

Inputs and outputs mirror the forward's affine form (the spec's constant ``affine``):
``"weight_bias"``: ``(dy, x, weight, bias) -> (dx, dw, db)``; ``"weight"``: ``(dy, x, weight) ->
(dx, dw)``; ``"none"``: ``(dy, x) -> (dx,)``. ``dy``, ``x`` and the parameters share one dtype;
``dx`` is in it, ``dw`` and ``db`` are float32 of shape ``(N,)``: sums over *all* rows (8192 of
them for a typical batch) are accumulated in float32 and left there; the caller casts them.
The constant ``eps`` is the forward's (default 1e-5).

The kernels recompute ``mean`` and ``rstd`` from ``x`` (one extra reduction per row; nothing saved
by the forward is needed, so the inputs are exactly ``(dy, *forward inputs)``), do all arithmetic
in float32, and round ``dx`` once, on the store.

Accuracy: centred values, shifted by the mean of the row's first elements
-------------------------------------------------------------------------
As in the forward, no statistic is formed from raw ``x`` (``sum(g * x) - mean * sum(g)`` and
``E[x^2] - E[x]^2`` cancel catastrophically when the mean dwarfs the spread, as on the
``offset`` input distribution), and every row is first shifted by the mean of its first
elements, ``d = x - shift``, which is exact for such rows, so that ``xhat = (d - mean(d)) * rstd`` is accurate to
float32 rounding of the spread rather than of the mean (see :mod:`layernorm`'s docstring).

Accuracy: the mean, exactly, where spikes cancel
------------------------------------------------
A plain float32 mean of ``d`` is off by up to ``eps * sum|d| / N``. Norm-wise that is a rounding
of ``xhat``, but on rows whose sum is carried by a few spikes (or whose shift is far from the
mean) it is many ulps of the small elements' own centred values, and ``dw = sum(dy * xhat)``
weights those by ``dy``, which may be large exactly there: the 'spikes' stress data has such
draws, where PyTorch's sum happens to cancel its two spikes exactly and the kernels' did not
(tests/interpreter/test_validation_flakes.py). :mod:`kernelsmith.ops._layernorm_kernels` (its
section on exactly centred values) has the remedy: ``d`` and its rounding error by TwoSum, their
compensated sum, and the centred values from both; that costs ~14 float additions an element and
no memory. Where it is paid:

- ``two_stage`` computes the plain statistics first, and recomputes them exactly only on the rows
  where they may be off (``_plain_mean_may_be_off``: the deviations concentrated in fewer than 8
  elements, or the shift more than 2 mean absolute deviations from the mean), reloading the row
  from cache. A normal row pays one more reduction (``sum|xc|``): compiled for sm_90, a bfloat16
  row of 4096 on 8 warps is 763 instructions a thread instead of 718 (179 registers instead of
  162: the exact branch's), where computing exactly on every row would be ~1050; this kernel
  issues about as many instructions as its memory traffic allows, so that would not be free.
- ``looped`` makes the same check after its one statistics pass (with ``mean|d| - |mean(d)|``,
  a lower bound of the mean absolute deviation, which one pass can form), and on the rows it
  flags reads the row once more for the exact mean: the only extra pass over memory, on those
  rows only. Its statistics loop is 224 instructions a block step instead of 215 (``BLOCK_N``
  1024 on 4 warps; the running ``sum|d|``); its rows kernel is unchanged, the statistics kernel
  handing it the mean as a float shift and the rest (so its ``x - shift`` is rounded at the
  centred value's ulp).

Reference
---------
The baseline (``reference``) is PyTorch's autograd through ``F.layer_norm`` in the input dtype,
``(dx, dw.float(), db.float())``: what a training step computes. The truth (``reference_fp64``)
is the same autograd in float64. PyTorch's CPU backward forms its sums from raw ``x`` and so is
far less accurate on ``offset`` rows than its CUDA backward, which centres them; the kernels are
tested against the accurate one (see the tests).

Variants (deterministic: no atomics, every sum in a fixed order)
-----------------------------------------------------------------
``two_stage``
    ``GROUPS`` x (multiprocessor count) programs, capped by the row count. Each program walks the
    rows ``pid, pid + programs, ...`` with the whole row in registers (``BLOCK_N`` =
    next_power_of_two(N)): the shifted two-pass statistics (exactly where they may be off:
    Accuracy above), ``dx``, and its shares of ``dw`` and
    ``db`` in float32 registers, stored at the end to ``(programs, N)`` float32 scratch buffers.
    :mod:`kernelsmith.ops._rowwise_backward`'s reduction kernel then sums each scratch over programs, in a fixed
    order, into ``dw`` and ``db``. (Without a weight there is nothing to reduce: one kernel.)
``looped``
    For rows too wide for registers (and a contender for wide ones): the row statistics, then
    the gradients. The first kernel makes one pass over column blocks of ``BLOCK_N`` per row:
    Welford's running mean and sum of squared deviations per lane (merged with Chan's formula,
    as in :mod:`layernorm`'s ``welford`` kernel) for ``mean`` and ``rstd`` (the mean again,
    exactly, in a second pass on the rows that need it: Accuracy above), and the running sums
    of ``g`` and ``g * d``, from which ``mean(g * xhat) = rstd * (sum(g d) - mean(d) sum(g)) / N``
    (that difference cancels only by the ratio of ``|shift - mean|`` to the spread, a few units:
    harmless, as the term is a small correction to ``dx``). It stores ``(mean(d), rstd, mean(g),
    mean(g * xhat), shift)`` to a ``(rows, 5)`` float32 scratch. The second runs a grid of (column
    blocks, ``GROUPS`` x multiprocessors): each program walks its group's rows over one column
    block, writes ``dx`` and accumulates the block's ``dw`` and ``db`` shares; the third is
    ``two_stage``'s reduction. ``x`` and ``dy`` are read twice (the first time to reduce).

Scratch buffers are allocated by the launchers with ``new_empty`` on an output (the harness
allows allocation, not computation); every element of them is written before it is read.
Absent operands (no weight, no bias) are placeholder pointers that the kernels never
dereference: the constexprs ``HAS_WEIGHT`` and ``HAS_BIAS`` compile their code away. The
launchers, scratch buffers and variants are the backward skeleton's
(:mod:`kernelsmith.ops._rowwise_backward`); this file holds the math, the kernels, the
reference, the inputs and the register rules of the spaces.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from kernelsmith.ops import _layernorm_kernels
from kernelsmith.ops import _rowwise as skeleton
from kernelsmith.ops import _rowwise_backward as backward
from kernelsmith.ops._base import (
    FINITE_STRESS_DISTRIBUTIONS,
    Tolerance,
    UnsupportedWorkload,
    check_eps,
    tensor_specs,
)
from kernelsmith.ops._layernorm_kernels import (
    centred_row,
    compensated_mean,
    exactly_centred_row,
    row_shift,
    shifted,
    two_sum,
    welford_merge,
    welford_start,
    welford_step,
)
from kernelsmith.ops._rowwise_backward import column_block, load_row, row_columns, store_row, store_share
from kernelsmith.ops.layernorm import (
    AFFINE,
    AFFINE_PARAMS,
    DEFAULT_EPS,
    LayerNormSpecs,
    _check_affine,
    _has_weight_and_bias,
)
from kernelsmith.ops.layernorm import OP as _LAYERNORM
from kernelsmith.space import Space, next_power_of_two
from kernelsmith.spec import OpSpec, TensorSpec

# The looped statistics pass holds seven float32 values a column: five running sums (Welford's
# mean and M2, sum|d|, sum(g), sum(g * d)) and the loaded x and dy. (Its exact second pass, on
# the rows that need it, holds fewer: x, d, its error, and a compensated sum's two floats.)
LOOPED_VALUES_PER_COLUMN = 7

# ---------------------------------------------------------------------------------------------
# The math shared by the kernels
# ---------------------------------------------------------------------------------------------


@triton.jit
def _shift(x_ptr, i, x_row_stride, N):
    """Row ``i``'s shift (the forward's ``row_shift``: the mean of its first elements)."""
    return row_shift(x_ptr + tl.cast(i, tl.int64) * x_row_stride, N)


# When the kernels compute a row's mean again, exactly (module docstring): rows whose deviations
# are carried by fewer than CONCENTRATED_IN elements, or whose shift lies more than SHIFT_OFF_BY
# mean absolute deviations from the mean. (Globals used in kernels must be constexprs.)
CONCENTRATED_IN = tl.constexpr(8.0)
SHIFT_OFF_BY = tl.constexpr(2.0)


@triton.jit
def _plain_mean_may_be_off(mean_d, spread, rstd, N, eps):
    """Whether the plain float32 mean of d = x - shift may be off by more than the small
    elements' own rounding: the row's deviations are concentrated in a few elements (spikes), or
    the shift is far from the mean (so that every partial sum is large). Both are measured
    against the mean absolute deviation m = mean|xc| (``spread``), which spikes inflate least:

    - N * m^2 / var, the number of elements the deviations are spread over: about 0.64 N on
      normal rows, about k with k dominant spikes (each |xc| ~ std * sqrt(N / k)). With
      var = 1 / rstd^2 - eps, so that a row whose variance is all but eps's (a constant row,
      denormal values) is not taken for a concentrated one: tested as
      N * (m * rstd)^2 < CONCENTRATED_IN * (1 - eps * rstd^2), no division;
    - |mean(d)| / m: about 1/8 on normal rows (row_shift averages 64 elements), large when a
      spike among the first elements dragged the shift away.

    NaN anywhere makes both false: such rows keep the plain path (and their NaN)."""
    concentrated = N * (spread * rstd) * (spread * rstd) < CONCENTRATED_IN * (1.0 - eps * rstd * rstd)
    return concentrated | (tl.abs(mean_d) > SHIFT_OFF_BY * spread)


@triton.jit
def _accumulate(dw, db, dy, xhat, HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr):
    """The row's terms of the shares: ``dy * xhat`` to ``dw``, ``dy`` to ``db`` (dy is zero on
    padding lanes)."""
    if HAS_WEIGHT:
        dw += dy * xhat
    if HAS_BIAS:
        db += dy
    return dw, db


@triton.jit
def _store_shares(dw_partial_ptr, db_partial_ptr, program, N, cols, dw, db, mask,
                  HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr):
    """This program's shares of dw and db, as far as the op has them."""
    if HAS_WEIGHT:
        store_share(dw_partial_ptr, program, N, cols, dw, mask)
    if HAS_BIAS:
        store_share(db_partial_ptr, program, N, cols, db, mask)


# ---------------------------------------------------------------------------------------------
# Kernels (the conventions are the skeleton's: kernelsmith.ops._rowwise_backward)
#
# The partial buffers are contiguous (programs, N) float32 matrices: dw_partial's when
# HAS_WEIGHT, db_partial's when HAS_BIAS (placeholders otherwise, never dereferenced).
# ---------------------------------------------------------------------------------------------


@triton.jit
def _two_stage_rows_kernel(
    dy_ptr, x_ptr, w_ptr, dx_ptr, dw_partial_ptr, db_partial_ptr,
    dy_row_stride, x_row_stride, dx_row_stride,
    n_rows,
    N,
    eps,
    BLOCK_N: tl.constexpr,  # next_power_of_two(N): the whole row in one block
    NUM_STAGES: tl.constexpr,  # software-pipelining depth of the row loop (1: none)
    HAS_WEIGHT: tl.constexpr,
    HAS_BIAS: tl.constexpr,
):
    """Rows pid, pid + programs, ...: dx for each, and the sums of their dy * xhat and dy."""
    eps = tl.cast(eps, tl.float32)  # float32 math even where Inductor passes a Python float as fp64
    cols, mask = row_columns(BLOCK_N, N)
    if HAS_WEIGHT:
        w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    dw = tl.zeros([BLOCK_N], dtype=tl.float32)  # (compiled away when unused)
    db = tl.zeros([BLOCK_N], dtype=tl.float32)
    for i in tl.range(tl.program_id(0), n_rows, tl.num_programs(0), num_stages=NUM_STAGES):
        x = load_row(x_ptr, i, x_row_stride, cols, mask)
        dy = load_row(dy_ptr, i, dy_row_stride, cols, mask)
        # The forward's statistics, shifted two-pass: d = x - shift, its mean, then the variance
        # of the centred values; again, exactly, on the rows whose plain mean may be off (the
        # module docstring), x reloaded (from cache) rather than kept in registers meanwhile.
        shift = _shift(x_ptr, i, x_row_stride, N)
        mean_d, xc, rstd = centred_row(x, shift, mask, N, eps)
        if _plain_mean_may_be_off(mean_d, tl.sum(tl.abs(xc), axis=0) / N, rstd, N, eps):
            x = load_row(x_ptr, i, x_row_stride, cols, mask)
            mean_d, xc, rstd = exactly_centred_row(x, shift, mask, N, eps)
        xhat = xc * rstd  # zero on padding lanes, as is dy (so g and g * xhat are too)
        g = dy
        if HAS_WEIGHT:
            g = dy * w
        mean_g = tl.sum(g, axis=0) / N
        mean_gxhat = tl.sum(g * xhat, axis=0) / N
        dx = rstd * (g - mean_g - xhat * mean_gxhat)
        store_row(dx_ptr, i, dx_row_stride, cols, dx.to(dx_ptr.dtype.element_ty), mask)
        dw, db = _accumulate(dw, db, dy, xhat, HAS_WEIGHT, HAS_BIAS)
    _store_shares(dw_partial_ptr, db_partial_ptr, tl.program_id(0), N, cols, dw, db, mask, HAS_WEIGHT, HAS_BIAS)


@triton.jit
def _exact_mean_d(x_ptr, row, x_row_stride, shift, N, BLOCK_N: tl.constexpr, NUM_STAGES: tl.constexpr):
    """looped's second pass over a row whose plain mean may be off: lane j keeps a compensated
    running sum of the exact d of columns j, j + BLOCK_N, ... (two_sum for d's rounding error and
    each addition's), and the lanes are merged by compensated_mean: ``(mean(d), its rest)``."""
    cols = tl.arange(0, BLOCK_N)
    sums = tl.zeros([BLOCK_N], dtype=tl.float32)
    errors = tl.zeros([BLOCK_N], dtype=tl.float32)
    for start in tl.range(0, N, BLOCK_N, num_stages=NUM_STAGES):
        offs = start + cols
        mask = offs < N
        d, d_error = shifted(load_row(x_ptr, row, x_row_stride, offs, mask), shift, mask)
        sums, rounding = two_sum(sums, d)  # (d and d_error are zero on padding lanes)
        errors += rounding + d_error
    return compensated_mean(sums, errors, N)


@triton.jit
def _looped_stats_kernel(
    dy_ptr, x_ptr, w_ptr,
    stats_ptr,  # (rows, 5) float32: mean(d), rstd, mean(g), mean(g * xhat), the shift
    dy_row_stride, x_row_stride, N, eps,
    BLOCK_N: tl.constexpr,  # columns per loop step; N need not be a multiple of it
    NUM_STAGES: tl.constexpr,
    HAS_WEIGHT: tl.constexpr,
):
    """One program per row: all four row statistics in one pass over column blocks (and the
    mean again, exactly, in a second pass on the rows where the first may be off)."""
    eps = tl.cast(eps, tl.float32)  # float32 math even where Inductor passes a Python float as fp64
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    shift = _shift(x_ptr, row, x_row_stride, N)

    # Lane j sees columns j, j + BLOCK_N, ... and keeps Welford's running mean and M2 of their
    # d values (the forward's welford_step), and the running sums of |d| (for the check below),
    # g and g * d.
    lane_mean, lane_m2, blocks = welford_start(BLOCK_N)
    sum_abs_d = tl.zeros([BLOCK_N], dtype=tl.float32)
    sum_g = tl.zeros([BLOCK_N], dtype=tl.float32)
    sum_gd = tl.zeros([BLOCK_N], dtype=tl.float32)
    for start in tl.range(0, N, BLOCK_N, num_stages=NUM_STAGES):
        offs = start + cols
        mask = offs < N
        x = load_row(x_ptr, row, x_row_stride, offs, mask)
        dy = load_row(dy_ptr, row, dy_row_stride, offs, mask)
        d = tl.where(mask, x - shift, 0.0)
        lane_mean, lane_m2, blocks = welford_step(d, mask, lane_mean, lane_m2, blocks)
        sum_abs_d += tl.abs(d)
        g = dy  # zero on padding lanes
        if HAS_WEIGHT:
            g = dy * tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        sum_g += g
        sum_gd += g * d

    # Chan's merge of the lanes (the forward's welford_merge).
    mean_d, rstd = welford_merge(lane_mean, lane_m2, cols, N, eps, BLOCK_N)
    # two_stage's check, with mean|d| - |mean(d)| for the mean absolute deviation mean|xc|: a lower
    # bound of it (|d| <= |xc| + |mean(d)|), so that the check errs towards the exact mean. (M2
    # needs no second look: Welford's is accurate to its own rounding, spikes or not.)
    mean_d_rest = tl.full([], 0.0, tl.float32)
    if _plain_mean_may_be_off(mean_d, tl.sum(sum_abs_d, axis=0) / N - tl.abs(mean_d), rstd, N, eps):
        mean_d, mean_d_rest = _exact_mean_d(x_ptr, row, x_row_stride, shift, N, BLOCK_N, NUM_STAGES)
    total_g = tl.sum(sum_g, axis=0)
    # sum(g * (d - mean(d))) = sum(g * d) - mean(d) * sum(g)
    mean_gxhat = rstd * (tl.sum(sum_gd, axis=0) - mean_d * total_g) / N
    # The rows kernel's shift is the mean itself (the float nearest shift + mean(d)) and its
    # mean(d) the rest, exactly (two_sum): its x - shift is then rounded at the centred value's
    # own ulp, however far the first shift was from the mean.
    shift, mean_d = two_sum(shift, mean_d)
    mean_d += mean_d_rest
    tl.store(stats_ptr + row * 5, mean_d)
    tl.store(stats_ptr + row * 5 + 1, rstd)
    tl.store(stats_ptr + row * 5 + 2, total_g / N)
    tl.store(stats_ptr + row * 5 + 3, mean_gxhat)
    tl.store(stats_ptr + row * 5 + 4, shift)  # the rows kernel's d = x - shift, without recomputing it


@triton.jit
def _looped_rows_kernel(
    dy_ptr, x_ptr, w_ptr, stats_ptr, dx_ptr, dw_partial_ptr, db_partial_ptr,
    dy_row_stride, x_row_stride, dx_row_stride,
    n_rows,
    N,
    BLOCK_N: tl.constexpr,
    NUM_STAGES: tl.constexpr,
    HAS_WEIGHT: tl.constexpr,
    HAS_BIAS: tl.constexpr,
):
    """Program (column block, group): dx of the block for rows group, group + groups, ...,
    and the block's shares of dw and db over those rows."""
    cols, mask = column_block(BLOCK_N, N)
    if HAS_WEIGHT:
        w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    dw = tl.zeros([BLOCK_N], dtype=tl.float32)
    db = tl.zeros([BLOCK_N], dtype=tl.float32)
    for i in tl.range(tl.program_id(1), n_rows, tl.num_programs(1), num_stages=NUM_STAGES):
        row = tl.cast(i, tl.int64)
        mean_d = tl.load(stats_ptr + row * 5)
        rstd = tl.load(stats_ptr + row * 5 + 1)
        mean_g = tl.load(stats_ptr + row * 5 + 2)
        mean_gxhat = tl.load(stats_ptr + row * 5 + 3)
        shift = tl.load(stats_ptr + row * 5 + 4)  # the statistics are those of d = x - shift
        x = load_row(x_ptr, i, x_row_stride, cols, mask)
        dy = load_row(dy_ptr, i, dy_row_stride, cols, mask)
        xhat = (x - shift - mean_d) * rstd
        g = dy
        if HAS_WEIGHT:
            g = dy * w
        dx = rstd * (g - mean_g - xhat * mean_gxhat)
        store_row(dx_ptr, i, dx_row_stride, cols, dx.to(dx_ptr.dtype.element_ty), mask)
        dw, db = _accumulate(dw, db, dy, xhat, HAS_WEIGHT, HAS_BIAS)
    _store_shares(dw_partial_ptr, db_partial_ptr, tl.program_id(1), N, cols, dw, db, mask, HAS_WEIGHT, HAS_BIAS)


# ---------------------------------------------------------------------------------------------
# Spaces, launchers and variants: the skeleton's two schedules
# ---------------------------------------------------------------------------------------------


def _operands(n: int, inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> backward.Operands:
    """dy and x viewed as (rows, N), the weight (x as a placeholder without one), dx viewed as
    (rows, N); dw and db summed from the shares, as far as the op has them. Views only."""
    dy, x = inputs[0].view(-1, n), inputs[1].view(-1, n)
    w = inputs[2] if len(inputs) > 2 else x
    tensors = (dy, x, w)
    return backward.Operands(tensors, tensors, outputs[0].view(-1, n), tuple(outputs[1:]))


def _constexprs(spec: OpSpec) -> dict[str, Any]:
    has_weight, has_bias = _has_weight_and_bias(spec)
    return {"HAS_WEIGHT": has_weight, "HAS_BIAS": has_bias}


# The kernels call the forward's row math (_layernorm_kernels): the variants' hashes cover it.
KERNELS = backward.Backward(__name__, _two_stage_rows_kernel, _looped_stats_kernel, _looped_rows_kernel,
                            width_input=1, stats_width=5, share_slots=2, operands=_operands,
                            constexprs=_constexprs, modules=(_layernorm_kernels.__name__,))


def _two_stage_space(spec: OpSpec) -> Space:
    block_n = next_power_of_two(spec.inputs[1].shape[-1])
    has_weight, has_bias = _has_weight_and_bias(spec)
    # Row-sized float32 vectors held per program: x and dy, and with a weight the weight and the
    # dw share, with a bias the db share. Without a weight nothing is reduced: BLOCK_R would
    # change nothing.
    held = (2 + 2 * has_weight + has_bias) * block_n
    return skeleton.two_stage_space(
        block_n, spec.inputs[1].torch_dtype.itemsize, held,
        "x, dy and the parameters' rows (weight, dw and db shares)",
        reduce_rows=skeleton.REDUCE_ROWS if has_weight else skeleton.REDUCE_ROWS[:1])


def _looped_space(spec: OpSpec) -> Space:
    return skeleton.looped_backward_space(next_power_of_two(spec.inputs[1].shape[-1]), LOOPED_VALUES_PER_COLUMN,
                                          "the statistics pass")


# ---------------------------------------------------------------------------------------------
# The op family
# ---------------------------------------------------------------------------------------------

class LayerNormBackward(LayerNormSpecs):
    name = "layernorm_backward"
    summary = "gradients (dx[, dw[, db]]) of LayerNorm given dy, recomputing the row statistics"
    shape_help = (
        "the shape of x (and dy), e.g. 8192x4096 (rows x hidden size); weight and bias have the last "
        "size, (4096,); dw and db are float32 (4096,); more leading sizes are allowed (2x1024x4096)"
    )
    rowwise = True
    stress_distributions = FINITE_STRESS_DISTRIBUTIONS  # no nonfinite: see kernelsmith.ops._base
    distributions = _LAYERNORM.distributions
    tolerance = Tolerance()
    activations = 2  # dy and x
    variants = backward.variants(KERNELS, _two_stage_space, _looped_space, sums="dw and db",
                                 looped_summary="row statistics in one Welford pass, then (column block, group) "
                                 "programs, then the dw and db sums; for wide rows")

    # ---- specs (spec: LayerNormSpecs', with dy and x) -----------------------------------------
    def spec_for(
        self, *inputs: torch.Tensor, eps: float = DEFAULT_EPS, affine: str | None = None, **constants: Any
    ) -> OpSpec:
        """The spec of ``(dy, x)``, ``(dy, x, weight)`` or ``(dy, x, weight, bias)``; ``affine``,
        when given (as the forward's spec has it), must agree with the tensors."""
        if constants:
            raise UnsupportedWorkload(f"layernorm_backward: unknown constants {sorted(constants)}")
        if not 2 <= len(inputs) <= 4:
            raise UnsupportedWorkload(f"layernorm_backward takes (dy, x[, weight[, bias]]), not {len(inputs)} inputs")
        if not all(isinstance(t, torch.Tensor) for t in inputs):
            kinds = ", ".join(type(t).__name__ for t in inputs)
            raise UnsupportedWorkload(f"layernorm_backward: the inputs must be tensors, not ({kinds})")
        x = inputs[1]
        if x.dim() < 1 or x.numel() == 0:
            raise UnsupportedWorkload(f"layernorm_backward: x must be non-empty and at least 1-D, not {tuple(x.shape)}")
        if any(t.device != x.device for t in inputs):
            raise UnsupportedWorkload("layernorm_backward: the inputs are on different devices")
        found = AFFINE[::-1][len(inputs) - 2]  # "none", "weight", "weight_bias" by parameter count
        if affine is not None and _check_affine(affine) != found:
            raise UnsupportedWorkload(f"layernorm_backward: affine={affine!r} but the inputs are those of {found!r}")
        specs = tensor_specs(self.name, inputs)
        spec = OpSpec(self.name, specs, {"eps": check_eps(self.name, eps), "affine": found})
        self.check_supported(spec)
        return spec

    def check_supported(self, spec: OpSpec) -> None:
        affine = _check_affine(spec.const("affine"))
        expected = 2 + AFFINE_PARAMS[affine]
        if len(spec.inputs) != expected:
            raise UnsupportedWorkload(
                f"layernorm_backward with affine={affine!r} takes {expected} inputs, not {len(spec.inputs)}")
        super().check_supported(spec)
        dy, x, *params = spec.inputs
        if dy.shape != x.shape or any(p.shape != x.shape[-1:] for p in params):
            raise UnsupportedWorkload(f"layernorm_backward: inconsistent shapes {spec.describe()}")
        if any(t.dtype != x.dtype for t in spec.inputs):
            raise UnsupportedWorkload(f"layernorm_backward: mixed dtypes {spec.describe()}")

    def output_specs(self, spec: OpSpec) -> tuple[TensorSpec, ...]:
        """dx like x, then dw and db of shape (N,) in float32, as far as the op has them."""
        x = spec.inputs[1]
        params = len(spec.inputs) - 2
        return (TensorSpec(x.shape, x.dtype), *(TensorSpec(x.shape[-1:], "float32"),) * params)

    # ---- math --------------------------------------------------------------------------------
    def reference(self, spec: OpSpec, inputs: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        """Autograd through ``F.layer_norm`` in the input dtype: (dx, dw.float(), db.float())."""
        dx, *params = _autograd(inputs, float(spec.const("eps")), None)
        return (dx, *(p.float() for p in params))

    def reference_fp64(self, spec: OpSpec, inputs: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        """The same autograd in float64: the formulas of the module docstring."""
        return _autograd(inputs, float(spec.const("eps")), torch.float64)

    def make_inputs(
        self,
        spec: OpSpec,
        seed: int,
        distribution: str = "normal",
        device: str | torch.device = "cuda",
    ) -> tuple[torch.Tensor, ...]:
        """(dy, x[, weight[, bias]]): x and the parameters as :mod:`layernorm` draws them for
        ``distribution``, dy = N(0, 1) from a second generator; deterministic in ``seed``."""
        dy_spec, *forward_inputs = spec.inputs
        forward = OpSpec(_LAYERNORM.name, tuple(forward_inputs), dict(spec.constants))
        tensors = _LAYERNORM.make_inputs(forward, seed, distribution, device)
        return (*backward.upstream_gradients(seed, device, (dy_spec,)), *tensors)

    def flops(self, spec: OpSpec) -> int:
        # Per element: the statistics (shift, add, centre, square, add), xhat, the two sums for
        # dx (g * xhat and its add, the add of g) and dx itself (3 subtract/multiply, rstd *);
        # with a weight g = dy * w and dw's multiply-add, with a bias db's add.
        has_weight, has_bias = _has_weight_and_bias(spec)
        return (13 + 3 * has_weight + has_bias) * spec.inputs[1].numel


def _autograd(inputs: Sequence[torch.Tensor], eps: float, dtype: torch.dtype | None) -> tuple[torch.Tensor, ...]:
    """The gradients of F.layer_norm's inputs (x, and weight and bias when given) by autograd, in
    ``dtype`` (None: the inputs' own)."""
    dy, *forward_inputs = (t if dtype is None else t.to(dtype) for t in inputs)
    with torch.enable_grad():
        leaves = [t.detach().requires_grad_() for t in forward_inputs]
        x, *params = leaves
        weight, bias = [*params, None, None][:2]
        y = F.layer_norm(x, (x.shape[-1],), weight, bias, eps)
        grads = torch.autograd.grad(y, leaves, dy.detach())
    return tuple(g.detach() for g in grads)


OP = LayerNormBackward()

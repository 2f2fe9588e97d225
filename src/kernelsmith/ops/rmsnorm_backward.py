"""RMSNorm backward: ``(dy, x, weight) -> (dx, dw)``, the gradients of :mod:`rmsnorm`'s forward.

The forward (see :mod:`kernelsmith.ops.rmsnorm`) computes, for each row of ``N`` elements,

    r    = 1 / sqrt(mean_j(x_j ** 2) + eps)
    y_j  = x_j * r * w_j

Given the upstream gradient ``dy`` (shaped like ``x``), with ``g = dy * w`` (elementwise):

    dx_j = r * g_j - x_j * (r ** 3 / N) * sum_k(g_k * x_k)
    dw_j = sum over rows of dy_j * x_j * r

(``dr/dx_j = -r ** 3 * x_j / N``, hence the second term of ``dx``.) The kernels recompute ``r``
from ``x`` (no saved statistics: one extra reduction per row, no extra input), do all arithmetic
in float32, round ``dx`` once to the activation dtype, and return ``dw`` in float32: it is a sum
over *all* rows (8192 of them for a typical batch), so it is accumulated in float32 and left
there; the caller casts it to the weight's dtype.

Inputs are ``(dy, x, weight)``: ``dy`` and ``x`` of shape ``(..., N)`` in the activation dtype,
``weight`` of shape ``(N,)`` in the same dtype; the constants ``eps`` (default 1e-6) and, as in
the forward, ``weight_offset`` (Gemma's ``1 + weight``; left out of the constants when 0). With
an offset ``c`` the forward scales by ``w + c``: ``dx`` is the formula above with ``w + c`` in
``g``, added to the weight in float32 after the load, as the forward does; ``dw`` is unchanged
(``d(w + c)/dw = 1``). Outputs are ``(dx, dw)``: ``dx`` like ``x``, ``dw`` of shape ``(N,)`` in
float32.

Reference and the Hugging Face formulation
-------------------------------------------
The baseline (``reference``) is what PyTorch's autograd computes through the Hugging Face forward
(``LlamaRMSNorm``) in the input dtype: ``weight * (xf * rsqrt(mean(xf**2) + eps)).to(dtype)``.
That forward *rounds the normalised row* ``x * r`` to the input dtype before the weight
multiply. Autograd treats the rounding as the identity, so its ``dx`` is the formula above
(evaluated with low-precision intermediates: ``dy * w`` is formed in the input dtype), but its
``dw`` is ``sum over rows of dy * round(x * r)``: the gradient of a slightly different function.
The exact gradient of the HF forward therefore differs from the exact gradient of the math above
by one rounding of ``x * r`` per term (relative 2**-8 for bfloat16, 2**-11 for float16, nothing
for float32). The truth (``reference_fp64``) is the same autograd in float64, where nothing is
rounded, i.e. the formula above; the tolerance, k times PyTorch's own low-precision error, covers
the HF rounding (the tests check that the HF formulation's gradient, computed exactly in float64,
passes it), and the kernels, which do not round ``x * r``, are closer to the truth than the
baseline.

Variants (deterministic: no atomics, every sum in a fixed order)
-----------------------------------------------------------------
``two_stage``
    ``GROUPS`` x (multiprocessor count) programs, capped by the row count. Each program walks the
    rows ``pid, pid + programs, ...`` with the whole row in registers (``BLOCK_N`` =
    next_power_of_two(N)), writes each ``dx`` row, and accumulates its share of ``dw`` in float32
    registers, storing it to a ``(programs, N)`` float32 scratch buffer. A second kernel sums the
    scratch over programs, in a fixed order, in ``[BLOCK_R, columns]`` tiles, into ``dw``.
``looped``
    For rows too wide for registers (and a contender for wide ones): three kernels. The first
    computes, per row, ``r`` and ``r**3 / N * sum(g * x)`` in one pass over column blocks of
    ``BLOCK_N`` into a ``(rows, 2)`` float32 scratch; the second runs a grid of (column blocks,
    ``GROUPS`` x multiprocessors): each program walks its group's rows over one column block,
    writes ``dx`` and accumulates the block's ``dw`` share; the third is ``two_stage``'s
    reduction. ``x`` and ``dy`` are read twice (the first time to reduce).
``split_row``
    For rows wider than a program should hold and for few rows (issue 19), rows of more than
    8 KB only: each row cut into column chunks of ``BLOCK_N``, and two kernels on a grid of
    (chunks, ``GROUPS`` x multiprocessors row groups, at most one a row), each program walking
    its group's rows. The first stores each row's chunk ``sum(x * x)`` and ``sum(g * x)`` in a
    ``(rows, chunks, 2)`` float32 scratch; the second adds the row's chunk sums in one fixed
    order (every program of a row the same), writes the chunk's ``dx`` and accumulates the
    chunk's ``dw`` share; the third is the share sum. ``x`` and ``dy`` are read twice, the
    second time from L2 on the small workloads it is for. The chunks are plain column blocks,
    not the forward's realigned pieces: the backward skeleton's section on split_row says why.

This file holds the math: the row math as jitted helpers (:func:`row_gradient` for a whole row,
:func:`block_gradient` for a column block, :func:`columns_gradient` and :func:`split_statistics`
for a chunk, which add_rmsnorm_backward's kernels call too), the kernels, the reference, the
inputs and the register rules of the spaces. The launchers, the scratch buffers, the fixed-order
share sum, the variants and the kernels' addressing are the backward skeleton's
(:mod:`kernelsmith.ops._rowwise_backward`); the schedules' spaces and their constants are the
row-wise skeleton's (:mod:`kernelsmith.ops._rowwise`); the specs and their checks are every
RMSNorm family's (:class:`kernelsmith.ops.rmsnorm.RMSNormLike`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import torch
import triton
import triton.language as tl

from kernelsmith.ops import _rowwise as skeleton
from kernelsmith.ops import _rowwise_backward as backward
from kernelsmith.ops._base import FINITE_STRESS_DISTRIBUTIONS, Tolerance
from kernelsmith.ops._rowwise_backward import column_block, load_row, row_columns, store_row, store_share
from kernelsmith.ops.rmsnorm import OP as _RMSNORM
from kernelsmith.ops.rmsnorm import RMSNormLike, weight_offset_of
from kernelsmith.space import Space, next_power_of_two
from kernelsmith.spec import OpSpec, TensorSpec

# ---------------------------------------------------------------------------------------------
# The math: jitted helpers, which add_rmsnorm_backward's kernels call too (with h for x)
# ---------------------------------------------------------------------------------------------


@triton.jit
def scaled_weight(w_ptr, cols, mask, WEIGHT_OFFSET: tl.constexpr):
    """The weight at ``cols`` in float32, plus the forward's offset (Gemma: 1.0; 0.0 compiles no
    add): ``g`` scales ``dy`` by the weight the forward used; ``dw`` does not change."""
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    if WEIGHT_OFFSET != 0.0:
        w += WEIGHT_OFFSET
    return w


@triton.jit
def row_statistics(sum_sq, sum_gx, N, eps):
    """A row's ``r`` and ``r**3 / N * sum(g * x)`` from its sums ``sum(x * x)`` and ``sum(g * x)``."""
    rstd = tl.rsqrt(sum_sq / N + eps)
    return rstd, rstd * rstd * rstd / N * sum_gx


@triton.jit
def row_gradient(dy_ptr, x_ptr, i, dy_row_stride, x_row_stride, cols, mask, w, N, eps):
    """Row ``i`` whole: ``dx`` and the row's term of ``dw`` (``dy * x * r``), ``r`` recomputed."""
    x = load_row(x_ptr, i, x_row_stride, cols, mask)
    dy = load_row(dy_ptr, i, dy_row_stride, cols, mask)
    g = dy * w
    rstd, coef = row_statistics(tl.sum(x * x, axis=0), tl.sum(g * x, axis=0), N, eps)
    return rstd * g - x * coef, dy * x * rstd


@triton.jit
def columns_gradient(dy_ptr, x_ptr, i, dy_row_stride, x_row_stride, cols, mask, w, rstd, coef):
    """Row ``i`` at ``cols`` (a column block, a chunk): ``dx`` and the ``dw`` term, given the row's
    statistics ``r`` and ``r**3 / N * sum(g * x)``."""
    x = load_row(x_ptr, i, x_row_stride, cols, mask)
    dy = load_row(dy_ptr, i, dy_row_stride, cols, mask)
    return rstd * (dy * w) - x * coef, dy * x * rstd


@triton.jit
def block_gradient(dy_ptr, x_ptr, stats_ptr, i, dy_row_stride, x_row_stride, cols, mask, w):
    """Row ``i`` over one column block: ``dx`` and the ``dw`` term, from the row's statistics
    (``r`` and ``r**3 / N * sum(g * x)``, as :func:`_looped_stats_kernel` stored them)."""
    row = tl.cast(i, tl.int64)
    rstd = tl.load(stats_ptr + row * 2)
    coef = tl.load(stats_ptr + row * 2 + 1)
    return columns_gradient(dy_ptr, x_ptr, i, dy_row_stride, x_row_stride, cols, mask, w, rstd, coef)


@triton.jit
def split_statistics(partial_ptr, i, N, eps, SPLITS: tl.constexpr):
    """Row ``i``'s ``r`` and ``r**3 / N * sum(g * x)`` from its chunks' partial sums, as
    :func:`_split_stats_kernel` stored them (``(rows, chunks, 2)``): each sum added over the
    chunks in one block reduction, the same in every program of the row."""
    at, real = backward.row_chunk_statistics(partial_ptr, i, 2, SPLITS)
    sum_sq = tl.sum(tl.load(at, mask=real, other=0.0), axis=0)
    sum_gx = tl.sum(tl.load(at + 1, mask=real, other=0.0), axis=0)
    return row_statistics(sum_sq, sum_gx, N, eps)


# ---------------------------------------------------------------------------------------------
# Kernels (the conventions are the skeleton's: kernelsmith.ops._rowwise_backward)
# ---------------------------------------------------------------------------------------------


@triton.jit
def _two_stage_rows_kernel(
    dy_ptr, x_ptr, w_ptr, dx_ptr, partial_ptr,  # partial: (programs, N) float32, the dw shares
    dy_row_stride, x_row_stride, dx_row_stride, n_rows, N, eps,
    BLOCK_N: tl.constexpr, NUM_STAGES: tl.constexpr,
    WEIGHT_OFFSET: tl.constexpr,
):
    """Rows pid, pid + programs, ...: dx for each, and the sum of their dy * x * r."""
    eps = tl.cast(eps, tl.float32)  # float32 math even where Inductor passes a Python float as fp64
    cols, mask = row_columns(BLOCK_N, N)
    w = scaled_weight(w_ptr, cols, mask, WEIGHT_OFFSET)
    dw = tl.zeros([BLOCK_N], dtype=tl.float32)
    for i in tl.range(tl.program_id(0), n_rows, tl.num_programs(0), num_stages=NUM_STAGES):
        dx, dw_term = row_gradient(dy_ptr, x_ptr, i, dy_row_stride, x_row_stride, cols, mask, w, N, eps)
        store_row(dx_ptr, i, dx_row_stride, cols, dx.to(dx_ptr.dtype.element_ty), mask)
        dw += dw_term
    store_share(partial_ptr, tl.program_id(0), N, cols, dw, mask)


@triton.jit
def _looped_stats_kernel(
    dy_ptr,
    x_ptr,
    w_ptr,
    stats_ptr,  # (rows, 2) float32: r and r**3 / N * sum(g * x)
    dy_row_stride,
    x_row_stride,
    N,
    eps,
    BLOCK_N: tl.constexpr,
    NUM_STAGES: tl.constexpr,
    # A default: add_rmsnorm_backward launches this kernel too, and has no weight offset.
    WEIGHT_OFFSET: tl.constexpr = 0.0,
):
    """One program per row: both row reductions in one pass over column blocks."""
    eps = tl.cast(eps, tl.float32)  # float32 math even where Inductor passes a Python float as fp64
    row = tl.program_id(0).to(tl.int64)
    sum_sq = tl.zeros([BLOCK_N], dtype=tl.float32)
    sum_gx = tl.zeros([BLOCK_N], dtype=tl.float32)
    for start in tl.range(0, N, BLOCK_N, num_stages=NUM_STAGES):
        cols = start + tl.arange(0, BLOCK_N)
        mask = cols < N
        x = load_row(x_ptr, row, x_row_stride, cols, mask)
        dy = load_row(dy_ptr, row, dy_row_stride, cols, mask)
        w = scaled_weight(w_ptr, cols, mask, WEIGHT_OFFSET)
        sum_sq += x * x
        sum_gx += dy * w * x
    rstd, coef = row_statistics(tl.sum(sum_sq, axis=0), tl.sum(sum_gx, axis=0), N, eps)
    tl.store(stats_ptr + row * 2, rstd)
    tl.store(stats_ptr + row * 2 + 1, coef)


@triton.jit
def _looped_rows_kernel(
    dy_ptr, x_ptr, w_ptr, stats_ptr, dx_ptr, partial_ptr,  # partial: (groups, N) float32
    dy_row_stride, x_row_stride, dx_row_stride, n_rows, N,
    BLOCK_N: tl.constexpr, NUM_STAGES: tl.constexpr,
    WEIGHT_OFFSET: tl.constexpr,
):
    """Program (column block, group): dx of the block for rows group, group + groups, ...,
    and the block's share of dw over those rows."""
    cols, mask = column_block(BLOCK_N, N)
    w = scaled_weight(w_ptr, cols, mask, WEIGHT_OFFSET)
    dw = tl.zeros([BLOCK_N], dtype=tl.float32)
    for i in tl.range(tl.program_id(1), n_rows, tl.num_programs(1), num_stages=NUM_STAGES):
        dx, dw_term = block_gradient(dy_ptr, x_ptr, stats_ptr, i, dy_row_stride, x_row_stride, cols, mask, w)
        store_row(dx_ptr, i, dx_row_stride, cols, dx.to(dx_ptr.dtype.element_ty), mask)
        dw += dw_term
    store_share(partial_ptr, tl.program_id(1), N, cols, dw, mask)


@triton.jit
def _split_stats_kernel(
    dy_ptr, x_ptr, w_ptr, partial_ptr,  # partial: (rows, chunks, 2) float32
    dy_row_stride, x_row_stride, n_rows, N,
    BLOCK_N: tl.constexpr,
    WEIGHT_OFFSET: tl.constexpr,
):
    """split_row, first launch: program (chunk, group) stores, for rows group, group + groups, ...,
    its chunk's sum(x * x) and sum(g * x)."""
    cols, mask = column_block(BLOCK_N, N)
    w = scaled_weight(w_ptr, cols, mask, WEIGHT_OFFSET)
    for i in tl.range(tl.program_id(1), n_rows, tl.num_programs(1)):
        x = load_row(x_ptr, i, x_row_stride, cols, mask)
        dy = load_row(dy_ptr, i, dy_row_stride, cols, mask)
        at = backward.chunk_statistics_at(partial_ptr, i, 2)
        tl.store(at, tl.sum(x * x, axis=0))
        tl.store(at + 1, tl.sum(dy * w * x, axis=0))


@triton.jit
def _split_rows_kernel(
    dy_ptr, x_ptr, w_ptr, partial_ptr, dx_ptr, share_ptr,  # share: (groups, N) float32, the dw shares
    dy_row_stride, x_row_stride, dx_row_stride, n_rows, N, eps,
    BLOCK_N: tl.constexpr, SPLITS: tl.constexpr,
    WEIGHT_OFFSET: tl.constexpr,
):
    """split_row, second launch: program (chunk, group): for rows group, group + groups, ..., the
    row's statistics from its chunks' sums, then dx of the chunk; and the chunk's share of dw."""
    eps = tl.cast(eps, tl.float32)  # float32 math even where Inductor passes a Python float as fp64
    cols, mask = column_block(BLOCK_N, N)
    w = scaled_weight(w_ptr, cols, mask, WEIGHT_OFFSET)
    dw = tl.zeros([BLOCK_N], dtype=tl.float32)
    for i in tl.range(tl.program_id(1), n_rows, tl.num_programs(1)):
        rstd, coef = split_statistics(partial_ptr, i, N, eps, SPLITS)
        dx, dw_term = columns_gradient(dy_ptr, x_ptr, i, dy_row_stride, x_row_stride, cols, mask, w, rstd, coef)
        store_row(dx_ptr, i, dx_row_stride, cols, dx.to(dx_ptr.dtype.element_ty), mask)
        dw += dw_term
    store_share(share_ptr, tl.program_id(1), N, cols, dw, mask)


# ---------------------------------------------------------------------------------------------
# Spaces, launchers and variants: the skeleton's two schedules
# ---------------------------------------------------------------------------------------------


def _operands(n: int, inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> backward.Operands:
    """(dy, x, weight) as they are (contiguous), dx; dw summed from the shares."""
    dx, dw = outputs
    return backward.Operands(tuple(inputs), tuple(inputs), dx, (dw,))


def _constexprs(spec: OpSpec) -> dict[str, Any]:
    return {"WEIGHT_OFFSET": weight_offset_of(spec)}


KERNELS = backward.Backward(__name__, _two_stage_rows_kernel, _looped_stats_kernel, _looped_rows_kernel,
                            width_input=1, stats_width=2, share_slots=1, operands=_operands,
                            constexprs=_constexprs, split_stats_kernel=_split_stats_kernel,
                            split_rows_kernel=_split_rows_kernel, split_stats=2)


# The spaces read the width and dtype of input 1: x here, dh in add_rmsnorm_backward (which uses
# them too), shaped like h and of its dtype.


def two_stage_space(spec: OpSpec, rows_in_flight: int = 2) -> Space:
    """At most four row vectors are live at a time (the activation, dy, the weight, the dw share;
    add_rmsnorm_backward, with ``rows_in_flight`` 3, loads dh once the others are dead)."""
    block_n = next_power_of_two(spec.inputs[1].shape[-1])
    return skeleton.two_stage_space(block_n, spec.inputs[1].torch_dtype.itemsize, 4 * block_n,
                                    "four row vectors (4 * BLOCK_N elements)", rows_in_flight=rows_in_flight)


def looped_space(spec: OpSpec) -> Space:
    """Four BLOCK_N vectors: x, dy, weight and the dw share."""
    return skeleton.looped_backward_space(next_power_of_two(spec.inputs[1].shape[-1]), 4,
                                          "x, dy, weight and the dw share")


def split_row_space(spec: OpSpec) -> Space:
    """Four chunk-sized vectors in the rows kernel: x, dy, weight and the dw share; rows of more
    than 8 KB only (the forwards' rule)."""
    return backward.split_row_space(spec, in_flight=4)


# ---------------------------------------------------------------------------------------------
# The op family
# ---------------------------------------------------------------------------------------------


class RMSNormBackward(RMSNormLike):
    """RMSNorm's backward; add_rmsnorm_backward is this family with one more upstream gradient
    (``dh``) and ``h`` for ``x``, so the references and inputs are written once, over
    ``input_names``: the upstream gradients, the activation, the weight (the specs and their
    checks are every RMSNorm family's: :class:`kernelsmith.ops.rmsnorm.RMSNormLike`)."""

    name = "rmsnorm_backward"
    summary = "gradients (dx, dw) of RMSNorm (Llama's) given dy, recomputing the row statistics"
    shape_help = (
        "the shape of x (and dy), e.g. 8192x4096 (rows x hidden size); weight has the last size, "
        "(4096,); dw is float32 (4096,); more leading sizes are allowed (2x1024x4096)"
    )
    input_names: ClassVar[tuple[str, ...]] = ("dy", "x", "weight")
    # Per element: x*x, add, dy*w, g*x, add, r*g, x*coef, subtract, dy*x*r (2), add to dw.
    flops_per_element = 11
    rowwise = True
    stress_distributions = FINITE_STRESS_DISTRIBUTIONS  # no nonfinite: see kernelsmith.ops._base
    distributions = _RMSNORM.distributions
    tolerance = Tolerance()
    variants = (*backward.variants(KERNELS, two_stage_space, looped_space),
                backward.split_row_variant(KERNELS, split_row_space))

    def output_specs(self, spec: OpSpec) -> tuple[TensorSpec, ...]:
        """(dx, dw): dx like x, dw (N,) in float32."""
        x = spec.inputs[self._activation]
        return (TensorSpec(x.shape, x.dtype), TensorSpec(x.shape[-1:], "float32"))

    # ---- math --------------------------------------------------------------------------------
    def reference(self, spec: OpSpec, inputs: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        """Autograd through Hugging Face's LlamaRMSNorm.forward (GemmaRMSNorm's with a weight
        offset) in the input dtype: (dx, dw.float())."""
        dx, dw = _autograd(inputs, float(spec.const("eps")), weight_offset_of(spec), None)
        return dx, dw.float()

    def reference_fp64(self, spec: OpSpec, inputs: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        """The same autograd in float64 (nothing rounded): the formula of the module docstring."""
        return _autograd(inputs, float(spec.const("eps")), weight_offset_of(spec), torch.float64)

    def make_inputs(
        self,
        spec: OpSpec,
        seed: int,
        distribution: str = "normal",
        device: str | torch.device = "cuda",
    ) -> tuple[torch.Tensor, ...]:
        """(dy, x, weight): x and weight as :mod:`rmsnorm` draws them for ``distribution``
        (weight = 1 + 0.5 * N(0, 1)), dy = N(0, 1) from a second generator (dy then dh for
        add_rmsnorm_backward, with h for x); deterministic in seed."""
        *upstream, x_spec, w_spec = spec.inputs
        forward = OpSpec(_RMSNORM.name, (x_spec, w_spec), dict(spec.constants))
        x, weight = _RMSNORM.make_inputs(forward, seed, distribution, device)
        return (*backward.upstream_gradients(seed, device, upstream), x, weight)

    def flops(self, spec: OpSpec) -> int:
        return self.flops_per_element * spec.inputs[self._activation].numel


def _autograd(inputs: Sequence[torch.Tensor], eps: float, weight_offset: float, dtype: torch.dtype | None
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """(dx, dw) by autograd through the HF forward, in ``dtype`` (None: the inputs' own): Llama's,
    or with a weight offset Gemma's (``(normed * (weight.float() + offset)).to(x.dtype)``).

    ``inputs`` are (dy, x, weight), or add_rmsnorm_backward's (dy, dh, h, weight): there ``h`` is
    also the forward's second output (the residual stream), whose gradient ``dh`` autograd adds
    to the norm's; ``h`` is the leaf, as the add that formed it passes its gradient unchanged."""
    *upstream, x, weight = (t if dtype is None else t.to(dtype) for t in inputs)
    with torch.enable_grad():
        xg = x.detach().requires_grad_()
        wg = weight.detach().requires_grad_()
        xf = xg.float() if dtype is None else xg
        normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
        if weight_offset:  # noqa: SIM108 (Gemma's forward against Llama's, each written as HF writes it)
            y = (normed * (wg.to(normed.dtype) + weight_offset)).to(xg.dtype)  # float32, rounded once
        else:
            y = wg * normed.to(xg.dtype)  # the normalised row rounded, then times the weight
        outputs = (y, xg)[:len(upstream)]  # y alone, or y and the residual stream h
        dx, dw = torch.autograd.grad(outputs, (xg, wg), tuple(u.detach() for u in upstream))
    return dx.detach(), dw.detach()


OP = RMSNormBackward()

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
    to a ``(programs, N)`` float32 scratch buffer that :mod:`rmsnorm_backward`'s reduction kernel
    sums in a fixed order into ``dw``.
``looped``
    For rows too wide for registers: :mod:`rmsnorm_backward`'s per-row statistics kernel (``r``
    and ``r**3 / N * sum(g * h)`` into a ``(rows, 2)`` float32 scratch), then a grid of (column
    blocks, ``GROUPS`` x multiprocessors) programs writing ``dsum`` and ``dw`` shares, then the
    same reduction.

Scratch buffers are allocated by the launchers with ``new_empty`` on an output (the harness
allows allocation, not computation); every element of them is written before it is read.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import triton
import triton.language as tl

from kernelsmith.ops import _rowwise as skeleton
from kernelsmith.ops._base import (
    FINITE_STRESS_DISTRIBUTIONS,
    Launcher,
    OpFamily,
    Tolerance,
    UnsupportedWorkload,
    Variant,
    generator,
    rows_and_width,
    tensor_specs,
)
from kernelsmith.ops._launch import direct_launch
from kernelsmith.ops.add_rmsnorm import _to_storage
from kernelsmith.ops.rmsnorm import DEFAULT_EPS, norm_constants, weight_offset_of
from kernelsmith.ops.rmsnorm import OP as _RMSNORM
from kernelsmith.ops.rmsnorm_backward import _looped_space, _looped_stats_kernel
from kernelsmith.space import Config, Space, next_power_of_two
from kernelsmith.spec import OpSpec, TensorSpec, dtype_name

# ---------------------------------------------------------------------------------------------
# Kernels
#
# dy, dh, h and dsum are (rows, N) matrices with unit column stride and explicit row strides;
# row offsets are 64-bit. All arithmetic is float32; dsum is rounded once, on the store.
# The looped variant's statistics kernel is rmsnorm_backward's; the dw reduction is the skeleton's.
# ---------------------------------------------------------------------------------------------


@triton.jit
def _two_stage_rows_kernel(
    dy_ptr,
    dh_ptr,
    h_ptr,
    w_ptr,
    dsum_ptr,
    partial_ptr,  # (programs, N) float32: each program's share of dw
    dy_row_stride,
    dh_row_stride,
    h_row_stride,
    dsum_row_stride,
    n_rows,
    N,
    eps,
    BLOCK_N: tl.constexpr,  # next_power_of_two(N): the whole row in one block
    NUM_STAGES: tl.constexpr,
    WEIGHT_OFFSET: tl.constexpr,  # added to the weight (Gemma: 1.0); 0.0 compiles no add
):
    """Rows pid, pid + programs, ...: dsum for each, and the sum of their dy * h * r."""
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < N
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    if WEIGHT_OFFSET != 0.0:  # g scales dy by the weight the forward used; dw does not change
        w += WEIGHT_OFFSET
    dw = tl.zeros([BLOCK_N], dtype=tl.float32)
    for i in tl.range(pid, n_rows, programs, num_stages=NUM_STAGES):
        row = tl.cast(i, tl.int64)  # 64-bit offsets (and a tensor in the interpreter)
        h = tl.load(h_ptr + row * h_row_stride + cols, mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(dy_ptr + row * dy_row_stride + cols, mask=mask, other=0.0).to(tl.float32)
        rstd = tl.rsqrt(tl.sum(h * h, axis=0) / N + eps)
        g = dy * w
        coef = rstd * rstd * rstd / N * tl.sum(g * h, axis=0)
        dx = rstd * g - h * coef  # RMSNorm's gradient of h
        dw += dy * h * rstd
        # The residual stream's gradient joins last, after h and dy are no longer needed.
        dh = tl.load(dh_ptr + row * dh_row_stride + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(dsum_ptr + row * dsum_row_stride + cols, _to_storage(dh + dx, dsum_ptr), mask=mask)
    tl.store(partial_ptr + tl.cast(pid, tl.int64) * N + cols, dw, mask=mask)


@triton.jit
def _looped_rows_kernel(
    dy_ptr,
    dh_ptr,
    h_ptr,
    w_ptr,
    stats_ptr,  # (rows, 2) float32: r and r**3 / N * sum(g * h), from _looped_stats_kernel
    dsum_ptr,
    partial_ptr,  # (groups, N) float32
    dy_row_stride,
    dh_row_stride,
    h_row_stride,
    dsum_row_stride,
    n_rows,
    N,
    BLOCK_N: tl.constexpr,  # columns per program
    NUM_STAGES: tl.constexpr,
    WEIGHT_OFFSET: tl.constexpr,
):
    """Program (column block, group): dsum of the block for rows group, group + groups, ...,
    and the block's share of dw over those rows."""
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = cols < N
    group = tl.program_id(1)
    groups = tl.num_programs(1)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    if WEIGHT_OFFSET != 0.0:  # g scales dy by the weight the forward used; dw does not change
        w += WEIGHT_OFFSET
    dw = tl.zeros([BLOCK_N], dtype=tl.float32)
    for i in tl.range(group, n_rows, groups, num_stages=NUM_STAGES):
        row = tl.cast(i, tl.int64)
        rstd = tl.load(stats_ptr + row * 2)
        coef = tl.load(stats_ptr + row * 2 + 1)
        h = tl.load(h_ptr + row * h_row_stride + cols, mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(dy_ptr + row * dy_row_stride + cols, mask=mask, other=0.0).to(tl.float32)
        dx = rstd * (dy * w) - h * coef
        dw += dy * h * rstd
        dh = tl.load(dh_ptr + row * dh_row_stride + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(dsum_ptr + row * dsum_row_stride + cols, _to_storage(dh + dx, dsum_ptr), mask=mask)
    tl.store(partial_ptr + tl.cast(group, tl.int64) * N + cols, dw, mask=mask)


# ---------------------------------------------------------------------------------------------
# Spaces and launchers
# ---------------------------------------------------------------------------------------------


def _rows_and_width(spec: OpSpec) -> tuple[int, int]:
    return rows_and_width(spec, input_index=2)  # h, after dy and dh


# Inputs are contiguous (the family refuses others), so every activation's row stride is N: the
# tensors go to the kernels as they are. The scratch shares are allocated with new_empty on dw.

# ---- two_stage ------------------------------------------------------------------------------


def _two_stage_space(spec: OpSpec) -> Space:
    """rmsnorm_backward's two_stage space, with three rows (dy, dh, h) in flight instead of two."""
    block_n = next_power_of_two(_rows_and_width(spec)[1])
    return skeleton.two_stage_space(block_n, spec.inputs[2].torch_dtype.itemsize, 4 * block_n,
                                    "four row vectors (4 * BLOCK_N elements)", rows_in_flight=3)


def _two_stage_build(spec: OpSpec, config: Config) -> Launcher:
    rows, n = _rows_and_width(spec)
    programs = skeleton.groups(int(config["GROUPS"]), rows)
    eps = float(spec.const("eps"))
    meta = {"BLOCK_N": next_power_of_two(n), "NUM_STAGES": int(config["num_stages"]),
            "WEIGHT_OFFSET": weight_offset_of(spec), **skeleton.launch_options(config)}
    rows_kernel = direct_launch(_two_stage_rows_kernel, (programs,))
    reduce = skeleton.reducer(n, int(config["BLOCK_R"]))

    def launch(inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> None:
        dy, dh, h, w = inputs
        dsum, dw = outputs
        partial = dw.new_empty((programs, n), dtype=torch.float32)
        rows_kernel(dy, dh, h, w, dsum, partial, n, n, n, n, rows, n, eps, **meta)
        reduce(partial, dw, programs)

    return launch


# ---- looped ---------------------------------------------------------------------------------
#
# The space is rmsnorm_backward's: it reads the width from input 1 (x there, dh here, shaped like
# h), and its register rule (four BLOCK_N vectors) holds because dh is loaded after h and dy die.


def _looped_build(spec: OpSpec, config: Config) -> Launcher:
    rows, n = _rows_and_width(spec)
    groups = skeleton.groups(int(config["GROUPS"]), rows)
    block_n = int(config["BLOCK_N"])
    eps = float(spec.const("eps"))
    meta = {"BLOCK_N": block_n, "NUM_STAGES": int(config["num_stages"]), "WEIGHT_OFFSET": weight_offset_of(spec),
            **skeleton.launch_options(config)}
    stats_kernel = direct_launch(_looped_stats_kernel, (rows,))
    rows_kernel = direct_launch(_looped_rows_kernel, (triton.cdiv(n, block_n), groups))
    reduce = skeleton.reducer(n, skeleton.LOOPED_REDUCE_ROWS)

    def launch(inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> None:
        dy, dh, h, w = inputs
        dsum, dw = outputs
        stats = dw.new_empty((rows, 2), dtype=torch.float32)
        partial = dw.new_empty((groups, n), dtype=torch.float32)
        # RMSNorm's statistics of h: dh plays no part in them.
        stats_kernel(dy, h, w, stats, n, n, n, eps, **meta)
        rows_kernel(dy, dh, h, w, stats, dsum, partial, n, n, n, n, rows, n, **meta)
        reduce(partial, dw, groups)

    return launch


# ---------------------------------------------------------------------------------------------
# The op family
# ---------------------------------------------------------------------------------------------


# The variants also run rmsnorm_backward's looped statistics kernel and space, add_rmsnorm's _to_storage
# (the rounding of the stores) and the skeleton's spaces and share sum: their hashes cover those modules.
_MODULES = ("kernelsmith.ops.rmsnorm_backward", "kernelsmith.ops._rowwise", "kernelsmith.ops.add_rmsnorm")


class AddRMSNormBackward(OpFamily):
    name = "add_rmsnorm_backward"
    summary = ("gradients (dsum, dw) of residual add + RMSNorm given dy, dh and the saved sum h; "
               "dsum is the gradient of both x and residual")
    shape_help = (
        "the shape of h (and of dy and dh), e.g. 8192x4096 (rows x hidden size); weight has the last "
        "size, (4096,); dsum is shaped like h, dw is float32 (4096,); more leading sizes are allowed "
        "(2x1024x4096)"
    )
    rowwise = True
    stress_distributions = FINITE_STRESS_DISTRIBUTIONS  # no nonfinite: see kernelsmith.ops._base
    distributions = _RMSNORM.distributions
    tolerance = Tolerance()
    variants = (
        Variant("two_stage", "GROUPS programs per SM walk whole rows in registers, dw shares summed by "
                "a second kernel", _two_stage_space, _two_stage_build, _MODULES),
        Variant("looped", "row statistics, then (column block, group) programs, then the dw sum; "
                "for wide rows", _looped_space, _looped_build, _MODULES),
    )

    # ---- specs -------------------------------------------------------------------------------
    def spec(self, shape: tuple[int, ...], dtype: str, eps: float = DEFAULT_EPS, weight_offset: float = 0.0,
             **constants: Any) -> OpSpec:
        shape = skeleton.command_line_shape(self.name, shape, constants, what="h")
        name = dtype_name(dtype)
        act = TensorSpec(shape, name)
        spec = OpSpec(self.name, (act, act, act, TensorSpec((shape[-1],), name)),
                      norm_constants(self.name, eps, weight_offset))
        self.check_supported(spec)
        return spec

    def spec_for(self, *inputs: torch.Tensor, eps: float = DEFAULT_EPS, weight_offset: float = 0.0,
                 **constants: Any) -> OpSpec:
        if constants:
            raise UnsupportedWorkload(f"add_rmsnorm_backward: unknown constants {sorted(constants)}")
        if len(inputs) != 4 or not all(isinstance(t, torch.Tensor) for t in inputs):
            raise UnsupportedWorkload(f"add_rmsnorm_backward takes (dy, dh, h, weight), not {len(inputs)} inputs")
        h, weight = inputs[2], inputs[3]
        if h.dim() < 1 or weight.dim() != 1:
            raise UnsupportedWorkload(f"add_rmsnorm_backward: h must be at least 1-D and weight 1-D, "
                                      f"not {h.dim()}-D and {weight.dim()}-D")
        if h.numel() == 0:
            raise UnsupportedWorkload("add_rmsnorm_backward: empty inputs are not supported")
        specs = tensor_specs(self.name, inputs)
        spec = OpSpec(self.name, specs, norm_constants(self.name, eps, weight_offset))
        self.check_supported(spec)
        return spec

    def check_supported(self, spec: OpSpec) -> None:
        skeleton.check_rows_and_weight(self, spec, ('dy', 'dh', 'h', 'weight'))

    def output_specs(self, spec: OpSpec) -> tuple[TensorSpec, ...]:
        """(dsum, dw): dsum like h, dw (N,) in float32."""
        h = spec.inputs[2]
        return (TensorSpec(h.shape, h.dtype), TensorSpec(h.shape[-1:], "float32"))

    # ---- math --------------------------------------------------------------------------------
    def reference(self, spec: OpSpec, inputs: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        """Autograd through the HF forward in the input dtype: (dsum, dw.float())."""
        dsum, dw = _autograd(inputs, float(spec.const("eps")), weight_offset_of(spec), None)
        return dsum, dw.float()

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
        """(dy, dh, h, weight): h and weight as :mod:`rmsnorm` draws x and weight for
        ``distribution`` (weight = 1 + 0.5 * N(0, 1)); dy and dh = N(0, 1) from a second
        generator; deterministic in seed."""
        dy_spec, dh_spec, h_spec, w_spec = spec.inputs
        forward = OpSpec(_RMSNORM.name, (h_spec, w_spec), dict(spec.constants))
        h, weight = _RMSNORM.make_inputs(forward, seed, distribution, device)
        g = generator(seed ^ 0x5EED_D1FF, device)
        dy = torch.randn(dy_spec.shape, generator=g, device=device, dtype=torch.float32)
        dh = torch.randn(dh_spec.shape, generator=g, device=device, dtype=torch.float32)
        return dy.to(dy_spec.torch_dtype), dh.to(dh_spec.torch_dtype), h, weight

    def flops(self, spec: OpSpec) -> int:
        # RMSNorm backward's 11 per element, and the add of dh.
        return 12 * spec.inputs[2].numel


def _autograd(inputs: Sequence[torch.Tensor], eps: float, weight_offset: float, dtype: torch.dtype | None
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """(dsum, dw) by autograd through the HF forward's outputs (y, h), in ``dtype`` (None: the
    inputs' own): Llama's norm, or with a weight offset Gemma's (float32, rounded once). ``h`` is
    the leaf: the add that formed it passes its gradient through unchanged."""
    dy, dh, h, weight = (t if dtype is None else t.to(dtype) for t in inputs)
    with torch.enable_grad():
        hg = h.detach().requires_grad_()
        wg = weight.detach().requires_grad_()
        hf = hg.float() if dtype is None else hg
        normed = hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + eps)
        if weight_offset:  # noqa: SIM108 (Gemma's forward against Llama's, each written as HF writes it)
            y = (normed * (wg.to(normed.dtype) + weight_offset)).to(hg.dtype)
        else:
            y = wg * normed.to(hg.dtype)
        dsum, dw = torch.autograd.grad((y, hg), (hg, wg), (dy.detach(), dh.detach()))
    return dsum.detach(), dw.detach()


OP = AddRMSNormBackward()

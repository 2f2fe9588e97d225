"""SwiGLU and GeGLU backward (``swiglu_backward``, ``geglu_backward``): the gradients of
:mod:`kernelsmith.ops.gated`'s forwards.

The math
--------
The forward is ``y = act(a) * b`` elementwise, with ``act = silu`` (SwiGLU) or ``gelu`` (GeGLU,
exact or tanh). Given the upstream gradient ``dy`` (shaped like ``y``):

    da = dy * b * act'(a)
    db = dy * act(a)

with the derivatives (helpers of :mod:`kernelsmith.ops.gelu`, each written overflow-free):

``silu'(a) = s * (1 + a * (1 - s)) = s + a * s * (1 - s)``, ``s = sigmoid(a)``
    ``s * (1 - s)`` is evaluated as ``t / (1 + t)**2`` with ``t = exp(-|a|)``: no positive
    argument to ``exp`` and no cancellation in ``1 - s``.
exact ``gelu'(a) = Phi(a) + a * phi(a)``
    ``Phi`` the standard normal CDF (with ``erf``, as the forward), ``phi`` its density.
tanh ``gelu'(a)``, the derivative of ``0.5 * a * (1 + tanh(u))``, ``u = sqrt(2/pi) * (a + 0.044715 a^3)``
    as in the forward, ``0.5 * (1 + tanh(u)) = sigmoid(z)`` with ``z = 2u``, and
    ``1 - tanh(u)**2 = 4 * sigmoid'(z)``, so ``gelu'(a) = sigmoid(z) + a * z' * sigmoid'(z)``
    with ``z' = sqrt(8/pi) * (1 + 3 * 0.044715 a^2)``.

Everything is computed in float32 from the loaded values and rounded once, on the store. The
PyTorch baseline (``reference``: autograd through the eager forward in the input dtype) rounds
``dy * b`` and the activation to the input dtype on the way, so the kernels are a little more
accurate than the baseline; the truth (``reference_fp64``) is the same autograd in float64.

Inputs and outputs
------------------
The constants are the forward's (``layout``, and ``approximate`` for GeGLU); inputs are
``(dy, *forward inputs)`` and outputs the gradients of the forward inputs, in the activation
dtype (float16, bfloat16 or float32):

``layout="pair"``
    inputs ``(dy, a, b)``, all ``(..., H)``; outputs ``(da, db)``, both ``(..., H)``.
``layout="concat"``
    inputs ``(dy, x)`` with ``x`` of shape ``(..., 2H)`` (``a`` the first ``H`` columns of every
    row, ``b`` the last ``H``); one output ``dx`` shaped like ``x``, ``da`` in the first half of
    every row and ``db`` in the second.

The command-line ``--shape`` is the activation shape ``(..., H)`` (that of ``dy``) for both
layouts, as for the forwards.

The variants
------------
Per element the op reads three values and writes two: it is bound by memory bandwidth. The
variants are the forward's three, with the extra load and store:

``blocked``
    One program per ``BLOCK`` consecutive elements of ``dy``. With ``pair`` this is the flat
    elementwise kernel over five same-shaped arrays. With ``concat`` an index ``i`` of ``dy`` is
    split into a row and a column (``row = i // H``, ``H`` a compile-time constant), and ``a``
    and ``da`` are at ``i + row * H``, ``b`` and ``db`` ``H`` further on.
``rows``
    One program per ``BLOCK_M`` rows by ``BLOCK_N`` columns of the ``(rows, H)`` activation,
    no division. With ``concat`` the kernel is given ``x`` for ``a`` and ``b`` and ``dx`` for
    ``da`` and ``db``, with a column offset of ``H`` for ``b`` and ``db``.
``persistent``
    ``PROGRAMS_PER_SM`` programs per multiprocessor walk the same tiles with a pipelined
    grid-stride loop; the ``TILE``-element tile takes its shape from the row width (see
    :func:`kernelsmith.ops._elementwise.tile_shape`).

Offsets are 64-bit. Spaces depend on the dtype and on ``H`` only: workloads are bucketed by rows
(``rowwise``), and a config is validated on 1, 7 and an odd number of rows of the target's width.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import torch
import triton
import triton.language as tl

from kernelsmith.ops import _elementwise as skeleton
from kernelsmith.ops._base import FINITE_STRESS_DISTRIBUTIONS, Launcher, OpFamily, UnsupportedWorkload, Variant
from kernelsmith.ops._elementwise import DISTRIBUTIONS, block_offsets, draw, persistent_tile_offsets, tile_offsets
from kernelsmith.ops.gated import (
    ACT_GELU,
    ACT_GELU_TANH,
    ACT_SILU,
    GEGLU,
    SWIGLU,
    _act,
    _Gated,
    _geometry,
    _output_shape,
    activation_f32,
    concat_offsets,
)
from kernelsmith.ops.gelu import gelu_grad_f32, silu_grad_f32
from kernelsmith.space import Config, Space
from kernelsmith.spec import OpSpec, TensorSpec

# =================================================================================================
# Kernels
# =================================================================================================


@triton.jit
def _activation_grad_f32(a, ACT: tl.constexpr):
    """act'(a) in float32 (ACT as in kernelsmith.ops.gated's activation_f32)."""
    return silu_grad_f32(a) if ACT == 0 else gelu_grad_f32(a, ACT == 2)


@triton.jit
def _grads_f32(dy, a, b, ACT: tl.constexpr):
    """(da, db) = (dy * b * act'(a), dy * act(a)) in float32."""
    return dy * b * _activation_grad_f32(a, ACT), dy * activation_f32(a, ACT)


@triton.jit
def _pair_blocked_kernel(
    dy_ptr, a_ptr, b_ptr, da_ptr, db_ptr,
    n,  # elements of each of the five arrays
    ACT: tl.constexpr,
    BLOCK: tl.constexpr,  # elements per program
    EVICT: tl.constexpr,  # "" or "evict_first": dy, a and b are read once
):
    """pair, blocked: one program computes BLOCK consecutive elements of da and db."""
    offs, mask = block_offsets(tl.program_id(0), n, BLOCK)
    dy = tl.load(dy_ptr + offs, mask=mask, other=0.0, eviction_policy=EVICT).to(tl.float32)
    a = tl.load(a_ptr + offs, mask=mask, other=0.0, eviction_policy=EVICT).to(tl.float32)
    b = tl.load(b_ptr + offs, mask=mask, other=0.0, eviction_policy=EVICT).to(tl.float32)
    da, db = _grads_f32(dy, a, b, ACT)
    tl.store(da_ptr + offs, da.to(da_ptr.dtype.element_ty), mask=mask)
    tl.store(db_ptr + offs, db.to(db_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _concat_blocked_kernel(
    dy_ptr, x_ptr, dx_ptr,
    n,  # elements of dy: rows * H
    H: tl.constexpr,  # a compile-time constant: i // H compiles to a multiply and a shift
    ACT: tl.constexpr, BLOCK: tl.constexpr, EVICT: tl.constexpr,
):
    """concat, blocked: one program computes dx for BLOCK consecutive elements of dy (rows, H);
    a and da are at the forward's concat offsets in x and dx (laid out alike), b and db H further."""
    offs, mask = block_offsets(tl.program_id(0), n, BLOCK)
    a_offs = concat_offsets(offs, H)
    dy = tl.load(dy_ptr + offs, mask=mask, other=0.0, eviction_policy=EVICT).to(tl.float32)
    a = tl.load(x_ptr + a_offs, mask=mask, other=0.0, eviction_policy=EVICT).to(tl.float32)
    b = tl.load(x_ptr + a_offs + H, mask=mask, other=0.0, eviction_policy=EVICT).to(tl.float32)
    da, db = _grads_f32(dy, a, b, ACT)
    tl.store(dx_ptr + a_offs, da.to(dx_ptr.dtype.element_ty), mask=mask)
    tl.store(dx_ptr + a_offs + H, db.to(dx_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _grads_tile(
    dy_ptr, a_ptr, b_ptr, da_ptr, db_ptr, rows, cols, mask,
    dy_row_stride,
    in_row_stride,  # of a and b
    grad_row_stride,  # of da and db
    ACT: tl.constexpr,
):
    """da and db at [rows, cols] for one masked [BLOCK_M, BLOCK_N] tile."""
    dy = tl.load(dy_ptr + rows[:, None] * dy_row_stride + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    in_offs = rows[:, None] * in_row_stride + cols[None, :]
    a = tl.load(a_ptr + in_offs, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + in_offs, mask=mask, other=0.0).to(tl.float32)
    da, db = _grads_f32(dy, a, b, ACT)
    grad_offs = rows[:, None] * grad_row_stride + cols[None, :]
    tl.store(da_ptr + grad_offs, da.to(da_ptr.dtype.element_ty), mask=mask)
    tl.store(db_ptr + grad_offs, db.to(db_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _rows_kernel(
    dy_ptr, a_ptr,
    b_ptr,  # for concat: x again, and b_offset = H
    da_ptr,
    db_ptr,  # for concat: dx again, also at b_offset
    dy_row_stride, in_row_stride, grad_row_stride,
    b_offset,  # elements from b_ptr to b[0, 0] and from db_ptr to db[0, 0]
    n_rows,
    n_cols,  # H
    ACT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """rows: program (i, j) computes rows i*BLOCK_M.. and columns j*BLOCK_N.. of da and db."""
    rows, cols, mask = tile_offsets(tl.program_id(0), tl.program_id(1), n_rows, n_cols, BLOCK_M, BLOCK_N)
    _grads_tile(dy_ptr, a_ptr, b_ptr + b_offset, da_ptr, db_ptr + b_offset, rows, cols, mask,
                dy_row_stride, in_row_stride, grad_row_stride, ACT)  # fmt: skip


@triton.jit
def _persistent_kernel(
    dy_ptr, a_ptr, b_ptr, da_ptr, db_ptr, dy_row_stride, in_row_stride, grad_row_stride, b_offset, n_rows, n_cols,
    n_col_tiles, n_tiles, ACT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, NUM_STAGES: tl.constexpr,
):
    """persistent: the forward's persistent kernel (kernelsmith.ops.gated), with the gradients' tiles."""
    for tile in tl.range(tl.program_id(0), n_tiles, tl.num_programs(0), num_stages=NUM_STAGES):
        rows, cols, mask = persistent_tile_offsets(tile, n_col_tiles, n_rows, n_cols, BLOCK_M, BLOCK_N)
        _grads_tile(dy_ptr, a_ptr, b_ptr + b_offset, da_ptr, db_ptr + b_offset, rows, cols, mask,
                    dy_row_stride, in_row_stride, grad_row_stride, ACT)  # fmt: skip


# =================================================================================================
# Spaces and launchers: the forward's schedules (the skeleton's)
#
# Each element needs three loads (dy, a, b) where the forward has two, so a thread holds 4 to 16
# elements (12 to 48 loaded values, where the forward holds 8 to 64), and 4 to 8 in the
# pipelined loop, whose tiles in flight take registers too.
# =================================================================================================

PER_THREAD = (4, 16)
PERSISTENT_PER_THREAD = (4, 8)


def _forward_spec(spec: OpSpec) -> OpSpec:
    """The forward's spec: the inputs after dy, the same constants (swiglu_backward -> swiglu)."""
    return OpSpec(spec.op.removesuffix("_backward"), spec.inputs[1:], dict(spec.constants))


def _flat(inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    return [t.view(-1) for t in (*inputs, *outputs)]


def _blocked(spec: OpSpec, config: Config) -> Launcher:
    forward = _forward_spec(spec)
    rows, h = _geometry(forward)
    if spec.const("layout") == "concat":
        return skeleton.flat_launcher(_concat_blocked_kernel, rows * h, config, _flat, H=h, ACT=_act(forward))
    return skeleton.flat_launcher(_pair_blocked_kernel, rows * h, config, _flat, ACT=_act(forward))


def _tiles(kernel: Any) -> Callable[[OpSpec, Config], Launcher]:
    """The launcher of a tile kernel: dy as (rows, H) and a, b, da and db as 2-D views, with their
    row strides and b's (and db's) column offset: for concat, a and b are both x (rows, 2H), da
    and db both dx, and b and db start H elements in."""

    def build(spec: OpSpec, config: Config) -> Launcher:
        forward = _forward_spec(spec)
        rows, h = _geometry(forward)
        concat = spec.const("layout") == "concat"

        def operands(inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> tuple[Any, ...]:
            dy = inputs[0].view(rows, h)
            if concat:
                x, dx = inputs[1].view(rows, 2 * h), outputs[0].view(rows, 2 * h)
                return dy, x, x, dx, dx, dy.stride(0), x.stride(0), dx.stride(0), h
            a, b = inputs[1].view(rows, h), inputs[2].view(rows, h)
            da, db = outputs[0].view(rows, h), outputs[1].view(rows, h)
            return dy, a, b, da, db, dy.stride(0), a.stride(0), da.stride(0), 0

        return skeleton.tile_launcher(kernel, rows, h, config, operands, ACT=_act(forward))

    return build


def _variant(name: str, summary: str, space: Callable[[OpSpec], Space], launcher: Callable[[OpSpec, Config], Launcher]
             ) -> Variant:  # fmt: skip
    """The kernels also run code of kernelsmith.ops.gated (the activations, concat_offsets) and
    kernelsmith.ops.gelu (the derivatives): the source hash covers both."""
    return skeleton.variant(__name__, name, summary, space, launcher,
                            uses=("kernelsmith.ops.gated", "kernelsmith.ops.gelu"))


VARIANTS = (
    _variant("blocked", "BLOCK consecutive elements of dy per program (concat: row = i // H, H constant)",
             lambda spec: skeleton.blocked_space(PER_THREAD), _blocked),
    _variant("rows", "one program per BLOCK_M x BLOCK_N tile of the (rows, H) activation",
             lambda spec: skeleton.rows_space(_geometry(_forward_spec(spec))[1], PER_THREAD), _tiles(_rows_kernel)),
    _variant("persistent", "PROGRAMS_PER_SM programs per SM walk TILE-element tiles (grid-stride loop)",
             # dy, a and b tiles in flight
             lambda spec: skeleton.persistent_space(spec.inputs[0].torch_dtype.itemsize, 3, PERSISTENT_PER_THREAD,
                                                    block="TILE"),
             _tiles(_persistent_kernel)),
)  # fmt: skip


# =================================================================================================
# The op families
# =================================================================================================


class _GatedBackward(OpFamily):
    """The gradients of a gated family (``forward``), with its constants."""

    forward: ClassVar[_Gated]
    rowwise = True  # bucketed by row count at a fixed H, like the forward
    distributions = DISTRIBUTIONS  # the forward's (for a and b)
    stress_distributions = FINITE_STRESS_DISTRIBUTIONS  # no nonfinite: see kernelsmith.ops._base
    variants = VARIANTS

    # ---- specs -----------------------------------------------------------------------------------
    def spec(self, shape: tuple[int, ...], dtype: str, layout: str = "pair", **constants: Any) -> OpSpec:
        """``shape`` is the activation shape (..., H) of dy; the forward's constants."""
        return self._from_forward(self.forward.spec(shape, dtype, layout=layout, **constants))

    def spec_for(self, *inputs: torch.Tensor, layout: str | None = None, **constants: Any) -> OpSpec:
        """(dy, a, b) is the pair layout and (dy, x) the concat layout; the forward's constants."""
        if not inputs or not all(isinstance(t, torch.Tensor) for t in inputs):
            raise UnsupportedWorkload(f"{self.name} takes (dy, a, b) or (dy, x), not {len(inputs)} inputs")
        dy, *forward_inputs = inputs
        try:
            forward = self.forward.spec_for(*forward_inputs, layout=layout, **constants)
        except UnsupportedWorkload as err:
            raise UnsupportedWorkload(f"{self.name}, the forward's inputs: {err}") from None
        if dy.dtype != forward_inputs[0].dtype:
            raise UnsupportedWorkload(f"{self.name}: dy is {dy.dtype} but the inputs are {forward_inputs[0].dtype}")
        spec = OpSpec(self.name, (TensorSpec.of(dy), *forward.inputs), dict(forward.constants))
        self.check_supported(spec)
        return spec

    def _from_forward(self, forward: OpSpec) -> OpSpec:
        """The backward spec of a forward spec: dy shaped and typed like the forward's output."""
        (y,) = self.forward.output_specs(forward)
        spec = OpSpec(self.name, (y, *forward.inputs), dict(forward.constants))
        self.check_supported(spec)
        return spec

    def check_supported(self, spec: OpSpec) -> None:
        super().check_supported(spec)  # dtypes, contiguity
        layout = spec.constants.get("layout", "")
        expected = {"pair": 3, "concat": 2}.get(layout)
        if expected is None or len(spec.inputs) != expected:
            raise UnsupportedWorkload(f"{self.name}: layout {layout!r} with {len(spec.inputs)} inputs")
        dy, first, *rest = spec.inputs
        if any(t.dtype != dy.dtype for t in spec.inputs):
            raise UnsupportedWorkload(f"{self.name}: mixed dtypes {spec.describe()}")
        if not first.shape or first.numel == 0:
            raise UnsupportedWorkload(f"{self.name}: empty or 0-D inputs {spec.describe()}")
        if layout == "concat" and first.shape[-1] % 2:
            raise UnsupportedWorkload(f"{self.name}: concat input {first} has an odd last size")
        if any(t.shape != first.shape for t in rest) or dy.shape != _output_shape(_forward_spec(spec)):
            raise UnsupportedWorkload(f"{self.name}: inconsistent shapes {spec.describe()}")

    def output_specs(self, spec: OpSpec) -> tuple[TensorSpec, ...]:
        """The gradients of the forward's inputs, shaped and typed like them: (da, db) or (dx,)."""
        return tuple(TensorSpec(t.shape, t.dtype) for t in spec.inputs[1:])

    def bucket(self, spec: OpSpec) -> OpSpec:
        """The forward's bucket (rows rounded up to a power of two at the same H), with dy."""
        return self._from_forward(self.forward.bucket(_forward_spec(spec)))

    def validation_specs(self, spec: OpSpec) -> list[OpSpec]:
        """The target, then 1, 7 and an odd number of rows of the same H (the forward's tails)."""
        tails = self.forward.validation_specs(_forward_spec(spec))[1:]
        return [spec] + [self._from_forward(t) for t in tails]

    # ---- math ------------------------------------------------------------------------------------
    def reference(self, spec: OpSpec, inputs: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        """Autograd through the forward's PyTorch reference in the input dtype."""
        return self._autograd(spec, inputs, None)

    def reference_fp64(self, spec: OpSpec, inputs: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        """The same autograd in float64: the formulas of the module docstring."""
        return self._autograd(spec, inputs, torch.float64)

    def _autograd(self, spec: OpSpec, inputs: Sequence[torch.Tensor], dtype: torch.dtype | None
                  ) -> tuple[torch.Tensor, ...]:  # fmt: skip
        dy, *forward_inputs = (t if dtype is None else t.to(dtype) for t in inputs)
        with torch.enable_grad():
            leaves = [t.detach().requires_grad_() for t in forward_inputs]
            (y,) = self.forward.reference(_forward_spec(spec), leaves)
            grads = torch.autograd.grad(y, leaves, dy.detach())
        return tuple(g.detach() for g in grads)

    def make_inputs(
        self,
        spec: OpSpec,
        seed: int,
        distribution: str = "normal",
        device: str | torch.device = "cuda",
    ) -> tuple[torch.Tensor, ...]:
        """(dy, *forward inputs): the forward's inputs as it draws them for ``distribution`` (the
        gate ``a`` from it, ``b`` normal; see _Gated.make_inputs), and dy ~ N(0, 1) from a second
        generator, rounded to the dtype; deterministic in the seed."""
        forward_inputs = self.forward.make_inputs(_forward_spec(spec), seed, distribution, device)
        dy_spec = spec.inputs[0]
        dy = draw(self.name, "normal", dy_spec.shape, seed ^ 0x5EED_D1FF, device)
        return (dy.to(dy_spec.torch_dtype), *forward_inputs)

    def flops(self, spec: OpSpec) -> int:
        forward = _forward_spec(spec)
        rows, h = _geometry(forward)
        # act(a) as the forward counts it (less the multiply by b), act'(a) sharing its
        # transcendentals (silu: 4 more; exact gelu: 7; tanh gelu: 8), and dy * b * act', dy * act.
        per = {ACT_SILU: 13, ACT_GELU: 15, ACT_GELU_TANH: 21}[_act(forward)]
        return per * rows * h


class SwiGLUBackward(_GatedBackward):
    name = "swiglu_backward"
    summary = (
        "SwiGLU gradients: da = dy * b * silu'(a), db = dy * silu(a), given (dy, a, b) or (dy, x) "
        "with x the (..., 2H) concatenation"
    )
    shape_help = (
        "the activation shape (..., H), the shape of dy (and of a, b, da and db with layout=pair): "
        "--shape 8192x14336; with layout=concat x and dx are 8192x28672"
    )
    forward = SWIGLU


class GeGLUBackward(_GatedBackward):
    name = "geglu_backward"
    summary = (
        "GeGLU gradients: da = dy * b * gelu'(a), db = dy * gelu(a) (approximate 'tanh' by default, "
        "or 'none'), given (dy, a, b) or (dy, x) with x the (..., 2H) concatenation"
    )
    shape_help = SwiGLUBackward.shape_help
    forward = GEGLU


SWIGLU_BACKWARD = SwiGLUBackward()
GEGLU_BACKWARD = GeGLUBackward()

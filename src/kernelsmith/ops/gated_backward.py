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
    :func:`kernelsmith.ops.gated._persistent_tile`).

Offsets are 64-bit. Spaces depend on the dtype and on ``H`` only: workloads are bucketed by rows
(``rowwise``), and a config is validated on 1, 7 and an odd number of rows of the target's width.
"""

from __future__ import annotations

import hashlib
import inspect
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
import triton
import triton.language as tl

from kernelsmith.ops import gated as _gated_module
from kernelsmith.ops._base import FINITE_STRESS_DISTRIBUTIONS, Launcher, OpFamily, UnsupportedWorkload, generator
from kernelsmith.ops._launch import direct_launch
from kernelsmith.ops.gated import (
    ACT_GELU,
    ACT_GELU_TANH,
    ACT_SILU,
    BLOCKS,
    GEGLU,
    PERSISTENT_TILES,
    PROGRAMS_PER_SM,
    ROWS_BLOCK_M,
    ROWS_BLOCK_N,
    ROWS_TILE,
    SWIGLU,
    _act,
    _Gated,
    _GatedVariant,
    _geometry,
    _output_shape,
    _persistent_tile,
    activation_f32,
)
from kernelsmith.ops.gelu import (
    EVICTION,
    STAGES,
    WARPS,
    checked,
    gelu_grad_f32,
    multiprocessor_count,
    per_thread_constraint,
    persistent_constraints,
    silu_grad_f32,
)
from kernelsmith.space import Config, Constraint, Param, Space, next_power_of_two
from kernelsmith.spec import OpSpec, TensorSpec

# =================================================================================================
# Kernels
# =================================================================================================


@triton.jit
def _activation_grad_f32(a, ACT: tl.constexpr):
    """act'(a) in float32 (ACT as in kernelsmith.ops.gated)."""
    if ACT == 0:
        g = silu_grad_f32(a)
    elif ACT == 1:
        g = gelu_grad_f32(a, False)
    else:
        g = gelu_grad_f32(a, True)
    return g


@triton.jit
def _grads_f32(dy, a, b, ACT: tl.constexpr):
    """(da, db) = (dy * b * act'(a), dy * act(a)) in float32."""
    return dy * b * _activation_grad_f32(a, ACT), dy * activation_f32(a, ACT)


@triton.jit
def _pair_blocked_kernel(
    dy_ptr,
    a_ptr,
    b_ptr,
    da_ptr,
    db_ptr,
    n,  # elements of each of the five arrays
    ACT: tl.constexpr,
    BLOCK: tl.constexpr,  # elements per program
    EVICT: tl.constexpr,  # "" or "evict_first": dy, a and b are read once
):
    """pair: one program computes BLOCK consecutive elements of da and db."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    dy = tl.load(dy_ptr + offs, mask=mask, other=0.0, eviction_policy=EVICT).to(tl.float32)
    a = tl.load(a_ptr + offs, mask=mask, other=0.0, eviction_policy=EVICT).to(tl.float32)
    b = tl.load(b_ptr + offs, mask=mask, other=0.0, eviction_policy=EVICT).to(tl.float32)
    da, db = _grads_f32(dy, a, b, ACT)
    tl.store(da_ptr + offs, da.to(da_ptr.dtype.element_ty), mask=mask)
    tl.store(db_ptr + offs, db.to(db_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _concat_blocked_kernel(
    dy_ptr,
    x_ptr,
    dx_ptr,
    n,  # elements of dy: rows * H
    H: tl.constexpr,  # a compile-time constant: i // H compiles to a multiply and a shift
    ACT: tl.constexpr,
    BLOCK: tl.constexpr,
    EVICT: tl.constexpr,
):
    """concat: one program computes dx for BLOCK consecutive elements of dy (rows, H)."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    # dy[row, col] at offs = row * H + col pairs with x[row, col] at row * 2H + col = offs + row * H
    # and x[row, H + col] H elements further; dx is laid out like x.
    row = offs // H
    a_offs = offs + row * H
    dy = tl.load(dy_ptr + offs, mask=mask, other=0.0, eviction_policy=EVICT).to(tl.float32)
    a = tl.load(x_ptr + a_offs, mask=mask, other=0.0, eviction_policy=EVICT).to(tl.float32)
    b = tl.load(x_ptr + a_offs + H, mask=mask, other=0.0, eviction_policy=EVICT).to(tl.float32)
    da, db = _grads_f32(dy, a, b, ACT)
    tl.store(dx_ptr + a_offs, da.to(dx_ptr.dtype.element_ty), mask=mask)
    tl.store(dx_ptr + a_offs + H, db.to(dx_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _grads_tile(
    dy_ptr,
    a_ptr,
    b_ptr,
    da_ptr,
    db_ptr,
    rows,  # int64 [BLOCK_M] row indices
    cols,  # [BLOCK_N] column indices
    dy_row_stride,
    in_row_stride,  # of a and b
    grad_row_stride,  # of da and db
    n_rows,
    n_cols,
    ACT: tl.constexpr,
):
    """da and db at [rows, cols] for one [BLOCK_M, BLOCK_N] tile."""
    mask = (rows < n_rows)[:, None] & (cols < n_cols)[None, :]
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
    dy_ptr,
    a_ptr,
    b_ptr,  # for concat: x again, and b_offset = H
    da_ptr,
    db_ptr,  # for concat: dx again, also at b_offset
    dy_row_stride,
    in_row_stride,
    grad_row_stride,
    b_offset,  # elements from b_ptr to b[0, 0] and from db_ptr to db[0, 0]
    n_rows,
    n_cols,  # H
    ACT: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """Program (i, j) computes rows i*BLOCK_M.. and columns j*BLOCK_N.. of da and db."""
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)  # < H: 32 bits suffice
    _grads_tile(dy_ptr, a_ptr, b_ptr + b_offset, da_ptr, db_ptr + b_offset, rows, cols,
                dy_row_stride, in_row_stride, grad_row_stride, n_rows, n_cols, ACT)  # fmt: skip


@triton.jit
def _persistent_kernel(
    dy_ptr,
    a_ptr,
    b_ptr,
    da_ptr,
    db_ptr,
    dy_row_stride,
    in_row_stride,
    grad_row_stride,
    b_offset,
    n_rows,
    n_cols,
    n_col_tiles,  # cdiv(n_cols, BLOCK_N)
    n_tiles,  # cdiv(n_rows, BLOCK_M) * n_col_tiles
    ACT: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    NUM_STAGES: tl.constexpr,  # software-pipelining depth of the tile loop (1: none)
):
    """A fixed grid; program pid computes tiles pid, pid + programs, ... in row-major tile order."""
    for tile in tl.range(tl.program_id(0), n_tiles, tl.num_programs(0), num_stages=NUM_STAGES):
        tile_m = tile // n_col_tiles
        tile_n = tile - tile_m * n_col_tiles
        # tl.cast, not .to(): in the interpreter the loop variable is a plain Python int.
        rows = tl.cast(tile_m, tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
        cols = tile_n * BLOCK_N + tl.arange(0, BLOCK_N)
        _grads_tile(dy_ptr, a_ptr, b_ptr + b_offset, da_ptr, db_ptr + b_offset, rows, cols,
                    dy_row_stride, in_row_stride, grad_row_stride, n_rows, n_cols, ACT)  # fmt: skip


# =================================================================================================
# Spaces and builders
#
# The block sizes and tile shapes are the forward's (kernelsmith.ops.gated). Each element needs
# three loads (dy, a, b) where the forward has two, so a thread holds 4 to 16 elements (12 to 48
# loaded values, where the forward holds 8 to 64).
# =================================================================================================

MIN_PER_THREAD = 4
MAX_PER_THREAD = 16
PERSISTENT_PER_THREAD = (4, 8)  # the tiles in flight of a pipelined loop take registers too


def _forward_spec(spec: OpSpec) -> OpSpec:
    """The forward's spec: the inputs after dy, the same constants (swiglu_backward -> swiglu)."""
    return OpSpec(spec.op.removesuffix("_backward"), spec.inputs[1:], dict(spec.constants))


@dataclass(frozen=True)
class _Views:
    """dy as (rows, H), a, b, da and db as 2-D views: for concat, a and b are both x (rows, 2H),
    da and db both dx, and b and db start ``b_offset`` = H elements in."""

    dy: torch.Tensor
    a: torch.Tensor
    b: torch.Tensor
    da: torch.Tensor
    db: torch.Tensor
    b_offset: int


def _views(spec: OpSpec, inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor], rows: int, h: int
           ) -> _Views:  # fmt: skip
    dy = inputs[0].view(rows, h)
    if spec.const("layout") == "concat":
        x, dx = inputs[1].view(rows, 2 * h), outputs[0].view(rows, 2 * h)
        return _Views(dy, x, x, dx, dx, h)
    a, b = inputs[1].view(rows, h), inputs[2].view(rows, h)
    return _Views(dy, a, b, outputs[0].view(rows, h), outputs[1].view(rows, h), 0)


# ---- blocked ------------------------------------------------------------------------------------


def _blocked_space(spec: OpSpec) -> Space:
    return Space(
        [Param("BLOCK", BLOCKS), Param("num_warps", WARPS), Param("EVICT", EVICTION)],
        [per_thread_constraint(lambda c: c["BLOCK"], MIN_PER_THREAD, MAX_PER_THREAD)],
    )


def _blocked_build(spec: OpSpec, config: Config) -> Launcher:
    checked(_blocked_space(spec), config)
    forward = _forward_spec(spec)
    rows, h = _geometry(forward)
    n = rows * h
    block = int(config["BLOCK"])
    grid = (triton.cdiv(n, block),)
    act, evict, num_warps = _act(forward), str(config["EVICT"]), int(config["num_warps"])

    if spec.const("layout") == "concat":
        concat_kernel = direct_launch(_concat_blocked_kernel, grid)

        def launch_concat(inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> None:
            concat_kernel(inputs[0].view(-1), inputs[1].view(-1), outputs[0].view(-1), n,
                          H=h, ACT=act, BLOCK=block, EVICT=evict, num_warps=num_warps)  # fmt: skip

        return launch_concat

    pair_kernel = direct_launch(_pair_blocked_kernel, grid)

    def launch_pair(inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> None:
        dy, a, b = (t.view(-1) for t in inputs)
        da, db = (t.view(-1) for t in outputs)
        pair_kernel(dy, a, b, da, db, n, ACT=act, BLOCK=block, EVICT=evict, num_warps=num_warps)

    return launch_pair


# ---- rows ---------------------------------------------------------------------------------------


def _rows_space(spec: OpSpec) -> Space:
    # Blocks wider than the padded row only add masked lanes; the narrowest is always allowed.
    widest = max(ROWS_BLOCK_N[0], next_power_of_two(_geometry(_forward_spec(spec))[1]))
    low, high = ROWS_TILE
    return Space(
        [Param("BLOCK_M", ROWS_BLOCK_M), Param("BLOCK_N", ROWS_BLOCK_N), Param("num_warps", WARPS)],
        [
            Constraint("BLOCK_N is no wider than the padded row", lambda c: c["BLOCK_N"] <= widest),
            Constraint(f"a tile holds {low} to {high} elements",
                       lambda c: low <= c["BLOCK_M"] * c["BLOCK_N"] <= high),
            per_thread_constraint(lambda c: c["BLOCK_M"] * c["BLOCK_N"], MIN_PER_THREAD, MAX_PER_THREAD),
        ],
    )  # fmt: skip


def _rows_build(spec: OpSpec, config: Config) -> Launcher:
    checked(_rows_space(spec), config)
    forward = _forward_spec(spec)
    rows, h = _geometry(forward)
    block_m, block_n = int(config["BLOCK_M"]), int(config["BLOCK_N"])
    # Row blocks on axis 0 (up to 2**31 - 1 programs); column blocks on axis 1 (at most 65535).
    kernel = direct_launch(_rows_kernel, (triton.cdiv(rows, block_m), triton.cdiv(h, block_n)))
    act, num_warps = _act(forward), int(config["num_warps"])

    def launch(inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> None:
        v = _views(spec, inputs, outputs, rows, h)
        kernel(v.dy, v.a, v.b, v.da, v.db, v.dy.stride(0), v.a.stride(0), v.da.stride(0), v.b_offset, rows, h,
               ACT=act, BLOCK_M=block_m, BLOCK_N=block_n, num_warps=num_warps)  # fmt: skip

    return launch


# ---- persistent ---------------------------------------------------------------------------------


def _persistent_space(spec: OpSpec) -> Space:
    itemsize = spec.inputs[0].torch_dtype.itemsize
    return Space(
        [Param("PROGRAMS_PER_SM", PROGRAMS_PER_SM), Param("TILE", PERSISTENT_TILES), Param("num_warps", WARPS),
         Param("num_stages", STAGES)],
        [
            per_thread_constraint(lambda c: c["TILE"], *PERSISTENT_PER_THREAD),
            *persistent_constraints(lambda c: 3 * c["TILE"] * itemsize),  # dy, a and b tiles in flight
        ],
    )  # fmt: skip


def _persistent_build(spec: OpSpec, config: Config) -> Launcher:
    checked(_persistent_space(spec), config)
    forward = _forward_spec(spec)
    rows, h = _geometry(forward)
    block_m, block_n = _persistent_tile(h, int(config["TILE"]))
    n_col_tiles = triton.cdiv(h, block_n)
    n_tiles = triton.cdiv(rows, block_m) * n_col_tiles
    kernel = direct_launch(_persistent_kernel, (min(n_tiles, int(config["PROGRAMS_PER_SM"]) * multiprocessor_count()),))
    act, num_warps, num_stages = _act(forward), int(config["num_warps"]), int(config["num_stages"])

    def launch(inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> None:
        v = _views(spec, inputs, outputs, rows, h)
        kernel(v.dy, v.a, v.b, v.da, v.db, v.dy.stride(0), v.a.stride(0), v.da.stride(0), v.b_offset, rows, h,
               n_col_tiles, n_tiles, ACT=act, BLOCK_M=block_m, BLOCK_N=block_n, NUM_STAGES=num_stages,
               num_warps=num_warps, num_stages=num_stages)  # fmt: skip

    return launch


# =================================================================================================
# The op families
# =================================================================================================


@dataclass(frozen=True)
class _BackwardVariant(_GatedVariant):
    """The kernels also run code of kernelsmith.ops.gated (the activations, the shared geometry)
    and of kernelsmith.ops.gelu (covered by _GatedVariant): the source hash covers both."""

    @property
    def source_hash(self) -> str:
        text = f"{super().source_hash}\n{inspect.getsource(_gated_module)}"
        return hashlib.sha256(text.encode()).hexdigest()[:16]


class _GatedBackward(OpFamily):
    """The gradients of a gated family (``forward``), with its constants."""

    forward: ClassVar[_Gated]
    rowwise = True  # bucketed by row count at a fixed H, like the forward
    distributions = ("normal", "wide", "small", "tails")  # the forward's (for a and b)
    stress_distributions = FINITE_STRESS_DISTRIBUTIONS  # no nonfinite: see kernelsmith.ops._base
    variants = (
        _BackwardVariant("blocked", "BLOCK consecutive elements of dy per program (concat: row = i // H, H constant)",
                         _blocked_space, _blocked_build),
        _BackwardVariant("rows", "one program per BLOCK_M x BLOCK_N tile of the (rows, H) activation",
                         _rows_space, _rows_build),
        _BackwardVariant("persistent", "PROGRAMS_PER_SM programs per SM walk TILE-element tiles "
                         "(grid-stride loop)", _persistent_space, _persistent_build),
    )  # fmt: skip

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
        g = generator(seed ^ 0x5EED_D1FF, device)
        dy = torch.randn(dy_spec.shape, generator=g, device=device, dtype=torch.float32)
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

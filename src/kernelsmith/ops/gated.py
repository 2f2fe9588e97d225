"""Gated activations of transformer MLPs: SwiGLU (``swiglu``) and GeGLU (``geglu``).

The ops
-------
A gated linear unit (Shazeer, 2020, "GLU variants improve transformer") multiplies an activated
"gate" projection ``a`` by a linear "up" projection ``b``, elementwise:

``swiglu`` (Llama, Mistral, Qwen)
    ``y = silu(a) * b = a * sigmoid(a) * b``; reference ``F.silu(a) * b``.
``geglu`` (Gemma, T5 v1.1)
    ``y = gelu(a) * b``, with the exact (``approximate="none"``) or the tanh (``"tanh"``, the
    default, as in Gemma) GELU; reference ``F.gelu(a, approximate=...) * b``.

Both come in two memory layouts, a constant of the spec (``layout``):

``"pair"``
    two inputs ``a`` and ``b`` of the same shape ``(..., H)`` (two separate projections);
``"concat"``
    one input ``x`` of shape ``(..., 2H)``, the two projections fused into one matrix product:
    ``a, b = x.chunk(2, dim=-1)``, so ``a`` is the first ``H`` columns of every row and ``b`` the
    last ``H``.

The output is ``(..., H)`` in the input dtype (float16, bfloat16 or float32); inputs are
contiguous. The command-line ``--shape`` is the activation shape ``(..., H)`` (the shape of ``a``
and of the output) for both layouts.

The math
--------
Everything is computed in float32 and rounded once, on the store. The PyTorch reference rounds
twice (the activation to the input dtype, then the product), so the kernels are a little more
accurate than the baseline they are measured against. The activations are the helpers of
:mod:`kernelsmith.ops.gelu` (an overflow-free sigmoid: ``silu(a) = a * sigmoid(a)``; GELU exact
with ``erf``, the tanh form as ``x * sigmoid(2u)``); which one runs is a constexpr (``ACT``).

The variants
------------
The op reads 2 and writes 1 element per output element and is bound by memory bandwidth; the
variants differ in how outputs are cut into work:

``blocked``
    One program per ``BLOCK`` consecutive output elements. With ``pair`` this is the flat
    elementwise kernel over three same-shaped arrays. With ``concat`` an output index ``i`` is
    split into a row and a column (``row = i // H``, with ``H`` a compile-time constant so the
    division becomes a multiply and a shift), and ``a`` is read at ``i + row * H``, ``b`` ``H``
    further on.
``rows``
    2-D tiling: one program per ``BLOCK_M`` rows by ``BLOCK_N`` columns of the ``(rows, H)``
    output, no division at all. With ``concat`` the kernel is given ``x`` for both ``a`` and ``b``
    and a column offset of ``H`` for ``b``; with ``pair``, ``b``'s own pointer and an offset of 0.
    Narrow rows take tall tiles.
``persistent``
    A fixed grid of ``PROGRAMS_PER_SM`` programs per multiprocessor walking the same tiles with a
    grid-stride loop that the compiler pipelines (``num_stages``). The tile holds ``TILE``
    elements; its shape follows the row width (``BLOCK_N = min(TILE, next_power_of_two(H))``,
    ``BLOCK_M = TILE // BLOCK_N``), so narrow rows get tall tiles without a larger space.

The three are schedules of the elementwise skeleton (:mod:`kernelsmith.ops._elementwise`:
``blocked``, ``rows`` and its persistent tiles), which writes their 64-bit offsets and masks,
spaces and launchers; the kernels here are the schedule's first line and the gate's math.
Offsets are 64-bit. Spaces depend on the dtype and on ``H`` only, never on the row count:
workloads are bucketed by rows (``rowwise``), and a config is validated on 1, 7 and an odd number
of rows of the target's width.

The gradients (``da = dy * b * act'(a)``, ``db = dy * act(a)``) are the families of
:mod:`kernelsmith.ops.gated_backward` (``swiglu_backward``, ``geglu_backward``), with inputs
``(dy, a, b)`` or ``(dy, x)`` and the same three variants.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import torch
import triton
import triton.language as tl

from kernelsmith.ops import _elementwise as skeleton
from kernelsmith.ops._base import Launcher, OpFamily, UnsupportedWorkload, Variant
from kernelsmith.ops._elementwise import (
    DISTRIBUTIONS,
    ROWS_BLOCK_M,
    block_offsets,
    bucketed_shape,
    draw,
    persistent_tile_offsets,
    row_tail_shapes,
    tile_offsets,
)
from kernelsmith.ops.gelu import gelu_f32, sigmoid_f32
from kernelsmith.space import Config, Space
from kernelsmith.spec import OpSpec, TensorSpec

# The activation applied to a (a constexpr of every kernel).
ACT_SILU = 0
ACT_GELU = 1  # exact, erf
ACT_GELU_TANH = 2

LAYOUTS = ("pair", "concat")
APPROXIMATIONS = ("none", "tanh")

# =================================================================================================
# Kernels
# =================================================================================================


@triton.jit
def activation_f32(a, ACT: tl.constexpr):
    """act(a) in float32 (also used by kernelsmith.ops.gated_backward): silu(a) = a * sigmoid(a)
    (ACT_SILU), or GELU in its exact (ACT_GELU) or tanh (ACT_GELU_TANH) form."""
    return a * sigmoid_f32(a) if ACT == 0 else gelu_f32(a, ACT == 2)


@triton.jit
def _gate_f32(a, b, ACT: tl.constexpr):
    """act(a) * b in float32."""
    return activation_f32(a, ACT) * b


@triton.jit
def _gated_pair_blocked_kernel(
    a_ptr, b_ptr, y_ptr,
    n,  # elements of a, b and y
    ACT: tl.constexpr,
    BLOCK: tl.constexpr,  # elements per program
    EVICT: tl.constexpr,  # "" or "evict_first": a and b are read once
):
    """pair, blocked: one program computes BLOCK consecutive elements of three same-shaped arrays."""
    offs, mask = block_offsets(tl.program_id(0), n, BLOCK)
    a = tl.load(a_ptr + offs, mask=mask, other=0.0, eviction_policy=EVICT).to(tl.float32)
    b = tl.load(b_ptr + offs, mask=mask, other=0.0, eviction_policy=EVICT).to(tl.float32)
    tl.store(y_ptr + offs, _gate_f32(a, b, ACT).to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def concat_offsets(offs, H: tl.constexpr):
    """The offset in x (rows, 2H) of a's element at ``offs`` of an (rows, H) array (b's is H
    further): y[row, col] at offs = row * H + col needs x[row, col] at row * 2H + col = offs + row * H.
    H is a compile-time constant, so offs // H compiles to a multiply and a shift. (Also used by
    kernelsmith.ops.gated_backward.)"""
    return offs + (offs // H) * H


@triton.jit
def _gated_concat_blocked_kernel(
    x_ptr, y_ptr,
    n,  # elements of y: rows * H
    H: tl.constexpr,
    ACT: tl.constexpr, BLOCK: tl.constexpr, EVICT: tl.constexpr,
):
    """concat, blocked: one program computes BLOCK consecutive elements of y (rows, H) from x (rows, 2H)."""
    offs, mask = block_offsets(tl.program_id(0), n, BLOCK)
    a_offs = concat_offsets(offs, H)
    a = tl.load(x_ptr + a_offs, mask=mask, other=0.0, eviction_policy=EVICT).to(tl.float32)
    b = tl.load(x_ptr + a_offs + H, mask=mask, other=0.0, eviction_policy=EVICT).to(tl.float32)
    tl.store(y_ptr + offs, _gate_f32(a, b, ACT).to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _gated_tile(a_ptr, b_ptr, y_ptr, rows, cols, mask, a_row_stride, b_row_stride, y_row_stride, ACT: tl.constexpr):
    """y[rows, cols] = act(a[rows, cols]) * b[rows, cols] for one masked [BLOCK_M, BLOCK_N] tile."""
    a = tl.load(a_ptr + rows[:, None] * a_row_stride + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + rows[:, None] * b_row_stride + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    y = _gate_f32(a, b, ACT)
    tl.store(y_ptr + rows[:, None] * y_row_stride + cols[None, :], y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _gated_rows_kernel(
    a_ptr,
    b_ptr,  # for concat: x again, and b_offset = H
    y_ptr, a_row_stride, b_row_stride, y_row_stride,
    b_offset,  # elements from b_ptr to b[0, 0]
    n_rows,
    n_cols,  # H
    ACT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """rows: program (i, j) computes rows i*BLOCK_M.. and columns j*BLOCK_N.. of y (rows, H)."""
    rows, cols, mask = tile_offsets(tl.program_id(0), tl.program_id(1), n_rows, n_cols, BLOCK_M, BLOCK_N)
    _gated_tile(a_ptr, b_ptr + b_offset, y_ptr, rows, cols, mask, a_row_stride, b_row_stride, y_row_stride, ACT)


@triton.jit
def _gated_persistent_kernel(
    a_ptr, b_ptr, y_ptr, a_row_stride, b_row_stride, y_row_stride, b_offset, n_rows, n_cols,
    n_col_tiles,  # cdiv(n_cols, BLOCK_N)
    n_tiles,  # cdiv(n_rows, BLOCK_M) * n_col_tiles
    ACT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    NUM_STAGES: tl.constexpr,  # software-pipelining depth of the tile loop (1: none)
):
    """persistent: program pid computes tiles pid, pid + programs, ... in row-major tile order."""
    for tile in tl.range(tl.program_id(0), n_tiles, tl.num_programs(0), num_stages=NUM_STAGES):
        rows, cols, mask = persistent_tile_offsets(tile, n_col_tiles, n_rows, n_cols, BLOCK_M, BLOCK_N)
        _gated_tile(a_ptr, b_ptr + b_offset, y_ptr, rows, cols, mask, a_row_stride, b_row_stride, y_row_stride,
                    ACT)  # fmt: skip


# =================================================================================================
# Spaces and launchers: the skeleton's schedules
# =================================================================================================

# Each output element needs two loads: a thread holds 4 to 32 outputs (8 to 64 loaded values) in
# the loop-free kernels, 8 to 16 in the pipelined loop.
BLOCKED_PER_THREAD = (4, 32)
ROWS_PER_THREAD = (8, 32)


def _geometry(spec: OpSpec) -> tuple[int, int]:
    """(rows, H) of the output."""
    shape = _output_shape(spec)
    return math.prod(shape[:-1]), shape[-1]


def _output_shape(spec: OpSpec) -> tuple[int, ...]:
    shape = spec.inputs[0].shape
    return (*shape[:-1], shape[-1] // 2) if spec.const("layout") == "concat" else shape


def _act(spec: OpSpec) -> int:
    if spec.op == "swiglu":
        return ACT_SILU
    return ACT_GELU_TANH if spec.const("approximate") == "tanh" else ACT_GELU


def _flat(inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    return [t.view(-1) for t in (*inputs, *outputs)]


def _blocked(spec: OpSpec, config: Config) -> Launcher:
    rows, h = _geometry(spec)
    if spec.const("layout") == "concat":
        return skeleton.flat_launcher(_gated_concat_blocked_kernel, rows * h, config, _flat, H=h, ACT=_act(spec))
    return skeleton.flat_launcher(_gated_pair_blocked_kernel, rows * h, config, _flat, ACT=_act(spec))


def _tiles(kernel: Any) -> Callable[[OpSpec, Config], Launcher]:
    """The launcher of a tile kernel: (a, b, y, their row strides, b's column offset) of 2-D
    views; for concat, a and b are both x (rows, 2H) and b starts H elements in."""

    def build(spec: OpSpec, config: Config) -> Launcher:
        rows, h = _geometry(spec)

        def operands(inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> tuple[Any, ...]:
            y = outputs[0].view(rows, h)
            if len(inputs) == 1:
                x = inputs[0].view(rows, 2 * h)
                return x, x, y, x.stride(0), x.stride(0), y.stride(0), h
            a, b = inputs[0].view(rows, h), inputs[1].view(rows, h)
            return a, b, y, a.stride(0), b.stride(0), y.stride(0), 0

        return skeleton.tile_launcher(kernel, rows, h, config, operands, ACT=_act(spec))

    return build


def _variant(name: str, summary: str, space: Callable[[OpSpec], Space], launcher: Callable[[OpSpec, Config], Launcher]
             ) -> Variant:  # fmt: skip
    return skeleton.variant(__name__, name, summary, space, launcher, uses=("kernelsmith.ops.gelu",))


VARIANTS = (
    _variant("blocked", "BLOCK consecutive outputs per program (concat: row = i // H, H constant)",
             lambda spec: skeleton.blocked_space(BLOCKED_PER_THREAD), _blocked),
    _variant("rows", "one program per BLOCK_M x BLOCK_N tile of the (rows, H) output",
             lambda spec: skeleton.rows_space(_geometry(spec)[1], ROWS_PER_THREAD), _tiles(_gated_rows_kernel)),
    _variant("persistent", "PROGRAMS_PER_SM programs per SM walk TILE-element tiles (grid-stride loop)",
             # a and b tiles in flight
             lambda spec: skeleton.persistent_space(spec.inputs[0].torch_dtype.itemsize, 2, block="TILE"),
             _tiles(_gated_persistent_kernel)),
)  # fmt: skip


# =================================================================================================
# The op families
# =================================================================================================

_SUPPORTED_TORCH_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


class _Gated(OpFamily):
    """SwiGLU and GeGLU: constants ``layout`` (and ``approximate`` for GeGLU)."""

    has_approximate: ClassVar[bool] = False
    default_approximate: ClassVar[str] = "tanh"
    rowwise = True  # bucketed by row count at a fixed H: see bucket()
    row_block = max(ROWS_BLOCK_M)
    distributions = DISTRIBUTIONS
    variants = VARIANTS

    # ---- specs -----------------------------------------------------------------------------------
    def spec(self, shape: tuple[int, ...], dtype: str, layout: str = "pair", **constants: Any) -> OpSpec:
        """``shape`` is the activation shape (..., H); with layout="concat" the input is (..., 2H)."""
        consts = self._constants(layout, constants)
        shape = tuple(int(s) for s in shape)
        if not shape or any(s <= 0 for s in shape):
            raise UnsupportedWorkload(f"{self.name}: the shape must be positive sizes, not {shape}")
        a = TensorSpec(shape, dtype)
        inputs = (a.with_shape((*shape[:-1], 2 * shape[-1])),) if layout == "concat" else (a, a)
        return self._checked(OpSpec(self.name, inputs, consts))

    def spec_for(self, *inputs: torch.Tensor, layout: str | None = None, **constants: Any) -> OpSpec:
        """(a, b) is the pair layout and (x,) the concat layout; ``layout`` may say so as well."""
        inferred = {1: "concat", 2: "pair"}.get(len(inputs))
        if inferred is None or not all(isinstance(t, torch.Tensor) for t in inputs):
            raise UnsupportedWorkload(f"{self.name} takes (a, b) or (x,), not {len(inputs)} inputs")
        if layout is not None and layout != inferred:
            raise UnsupportedWorkload(f"{self.name}: layout={layout!r} but {len(inputs)} tensors were given")
        consts = self._constants(inferred, constants)
        for t in inputs:
            if t.dtype not in _SUPPORTED_TORCH_DTYPES:
                raise UnsupportedWorkload(f"{self.name}: dtype {t.dtype} is not supported")
        if len(inputs) == 2:
            a, b = inputs
            if a.shape != b.shape:
                raise UnsupportedWorkload(f"{self.name}: a {tuple(a.shape)} and b {tuple(b.shape)} differ in shape")
            if a.dtype != b.dtype:
                raise UnsupportedWorkload(f"{self.name}: a is {a.dtype} but b is {b.dtype}")
        return self._checked(OpSpec(self.name, tuple(TensorSpec.of(t) for t in inputs), consts))

    def _constants(self, layout: Any, constants: dict[str, Any]) -> dict[str, Any]:
        if layout not in LAYOUTS:
            raise UnsupportedWorkload(f"{self.name}: layout must be one of {LAYOUTS}, not {layout!r}")
        consts: dict[str, Any] = {"layout": layout}
        if self.has_approximate:
            approximate = constants.pop("approximate", self.default_approximate)
            if approximate not in APPROXIMATIONS:
                raise UnsupportedWorkload(
                    f"{self.name}: approximate must be one of {APPROXIMATIONS}, not {approximate!r}")
            consts["approximate"] = approximate
        if constants:
            raise UnsupportedWorkload(f"{self.name}: unknown constants {sorted(constants)}")
        return consts

    def _checked(self, spec: OpSpec) -> OpSpec:
        first = spec.inputs[0]
        if not first.shape:
            raise UnsupportedWorkload(f"{self.name}: inputs must have at least one dimension")
        if first.numel == 0:
            raise UnsupportedWorkload(f"{self.name}: input {first} is empty")
        if spec.const("layout") == "concat" and first.shape[-1] % 2:
            raise UnsupportedWorkload(f"{self.name}: concat input {first} has an odd last size")
        self.check_supported(spec)
        return spec

    def output_specs(self, spec: OpSpec) -> tuple[TensorSpec, ...]:
        return (TensorSpec(_output_shape(spec), spec.inputs[0].dtype),)

    def _with_shape(self, spec: OpSpec, shape: tuple[int, ...]) -> OpSpec:
        """The spec with the input(s) reshaped to the activation shape ``shape``."""
        first = spec.inputs[0]
        if spec.const("layout") == "concat":
            return OpSpec(spec.op, (first.with_shape((*shape[:-1], 2 * shape[-1])),), dict(spec.constants))
        return OpSpec(spec.op, (first.with_shape(shape), spec.inputs[1].with_shape(shape)), dict(spec.constants))

    def bucket(self, spec: OpSpec) -> OpSpec:
        """Rows rounded up to a power of two at the same H, for every input."""
        return self._with_shape(spec, bucketed_shape(_output_shape(spec)))

    def validation_specs(self, spec: OpSpec) -> list[OpSpec]:
        """The target, then 1, 7 and an odd number of rows of the same H."""
        return [spec] + [self._with_shape(spec, s) for s in row_tail_shapes(_output_shape(spec), max(ROWS_BLOCK_M))]

    # ---- math ------------------------------------------------------------------------------------
    def _split(self, spec: OpSpec, inputs: Sequence[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        if spec.const("layout") == "concat":
            a, b = inputs[0].chunk(2, dim=-1)
            return a, b
        return inputs[0], inputs[1]

    def _activation(self, spec: OpSpec, a: torch.Tensor) -> torch.Tensor:
        if self.has_approximate:
            return torch.nn.functional.gelu(a, approximate=spec.const("approximate"))
        return torch.nn.functional.silu(a)

    def reference(self, spec: OpSpec, inputs: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        a, b = self._split(spec, inputs)
        return (self._activation(spec, a) * b,)

    def reference_fp64(self, spec: OpSpec, inputs: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        a, b = self._split(spec, inputs)
        return (self._activation(spec, a.double()) * b.double(),)

    def make_inputs(
        self,
        spec: OpSpec,
        seed: int,
        distribution: str = "normal",
        device: str | torch.device = "cuda",
    ) -> tuple[torch.Tensor, ...]:
        """The gate ``a`` from ``distribution``, the up projection ``b`` from N(0, 1) (times 8 for
        ``wide``), drawn in float32 on ``device`` and rounded to the dtype.

        - ``normal``: a ~ N(0, 1), where the activation bends;
        - ``wide``: a and b ~ 8 * N(0, 1): saturated activations, products in the hundreds;
        - ``small``: a ~ 1e-3 * N(0, 1): act(a) is about a / 2 (a tiny scale, checked relatively);
        - ``tails``: a ~ +-(10 + 2 * N(0, 1)): sigmoid, erf and tanh saturate, exp(-|a|)
          underflows, and half of the outputs are (nearly) zero.
        """
        shape = _output_shape(spec)
        a = draw(self.name, distribution, shape, seed, device)
        # b from an independent stream of the same seed (a's draws depend on the distribution).
        b = draw(self.name, "normal", shape, seed ^ 0x5EED, device)
        if distribution == "wide":
            b = b * 8
        dtype = spec.inputs[0].torch_dtype
        if spec.const("layout") == "concat":
            return (torch.cat((a, b), dim=-1).to(dtype),)
        return a.to(dtype), b.to(dtype)

    def flops(self, spec: OpSpec) -> int:
        rows, h = _geometry(spec)
        # silu: |a|, exp, add, divide, select, two multiplies (a transcendental counts as one);
        # gelu as in kernelsmith.ops.gelu, plus the multiply by b.
        per = {ACT_SILU: 7, ACT_GELU: 6, ACT_GELU_TANH: 11}[_act(spec)]
        return per * rows * h


class SwiGLU(_Gated):
    name = "swiglu"
    backward = "swiglu_backward"
    summary = "SwiGLU: y = silu(a) * b, with (a, b) given apart or as halves of one (..., 2H) input"
    shape_help = (
        "the activation shape (..., H), the shape of a, b and y: --shape 8192x14336 with "
        "layout=pair (a and b given apart), or the halves of one 8192x28672 input with layout=concat"
    )


class GeGLU(_Gated):
    name = "geglu"
    backward = "geglu_backward"
    summary = ("GeGLU: y = gelu(a) * b (approximate 'tanh' by default, or 'none'), with (a, b) given apart "
               "or as halves of one (..., 2H) input")
    shape_help = SwiGLU.shape_help
    has_approximate = True


SWIGLU = SwiGLU()
GEGLU = GeGLU()

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

Offsets are 64-bit. Spaces depend on the dtype and on ``H`` only, never on the row count:
workloads are bucketed by rows (``rowwise``), and a config is validated on 1, 7 and an odd number
of rows of the target's width.

The gradients (``da = dy * b * act'(a)``, ``db = dy * act(a)``) are the families of
:mod:`kernelsmith.ops.gated_backward` (``swiglu_backward``, ``geglu_backward``), with inputs
``(dy, a, b)`` or ``(dy, x)`` and the same three variants.
"""

from __future__ import annotations

import hashlib
import inspect
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
import triton
import triton.language as tl

from kernelsmith.ops import gelu as _gelu_module
from kernelsmith.ops._base import Launcher, OpFamily, UnsupportedWorkload, Variant
from kernelsmith.ops._launch import direct_launch
from kernelsmith.ops.gelu import (
    EVICTION,
    STAGES,
    WARPS,
    bucketed_shape,
    checked,
    draw,
    gelu_f32,
    multiprocessor_count,
    per_thread_constraint,
    persistent_constraints,
    row_tail_shapes,
    sigmoid_f32,
)
from kernelsmith.space import Config, Constraint, Param, Space, next_power_of_two, powers_of_two
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
    """act(a) in float32 (also used by kernelsmith.ops.gated_backward)."""
    if ACT == 0:
        h = a * sigmoid_f32(a)  # silu(a) = a * sigmoid(a)
    elif ACT == 1:
        h = gelu_f32(a, False)
    else:
        h = gelu_f32(a, True)
    return h


@triton.jit
def _gate_f32(a, b, ACT: tl.constexpr):
    """act(a) * b in float32."""
    return activation_f32(a, ACT) * b


@triton.jit
def _gated_pair_blocked_kernel(
    a_ptr,
    b_ptr,
    y_ptr,
    n,  # elements of a, b and y
    ACT: tl.constexpr,
    BLOCK: tl.constexpr,  # elements per program
    EVICT: tl.constexpr,  # "" or "evict_first": a and b are read once
):
    """pair: one program computes BLOCK consecutive elements of three same-shaped arrays."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    a = tl.load(a_ptr + offs, mask=mask, other=0.0, eviction_policy=EVICT).to(tl.float32)
    b = tl.load(b_ptr + offs, mask=mask, other=0.0, eviction_policy=EVICT).to(tl.float32)
    tl.store(y_ptr + offs, _gate_f32(a, b, ACT).to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _gated_concat_blocked_kernel(
    x_ptr,
    y_ptr,
    n,  # elements of y: rows * H
    H: tl.constexpr,  # a compile-time constant: i // H compiles to a multiply and a shift
    ACT: tl.constexpr,
    BLOCK: tl.constexpr,
    EVICT: tl.constexpr,
):
    """concat: one program computes BLOCK consecutive elements of y (rows, H) from x (rows, 2H)."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    # y[row, col] with offs = row * H + col needs x[row, col] at row * 2H + col = offs + row * H,
    # and x[row, H + col] H elements further.
    row = offs // H
    a_offs = offs + row * H
    a = tl.load(x_ptr + a_offs, mask=mask, other=0.0, eviction_policy=EVICT).to(tl.float32)
    b = tl.load(x_ptr + a_offs + H, mask=mask, other=0.0, eviction_policy=EVICT).to(tl.float32)
    tl.store(y_ptr + offs, _gate_f32(a, b, ACT).to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _gated_tile(
    a_ptr,
    b_ptr,
    y_ptr,
    rows,  # int64 [BLOCK_M] row indices
    cols,  # [BLOCK_N] column indices
    a_row_stride,
    b_row_stride,
    y_row_stride,
    n_rows,
    n_cols,
    ACT: tl.constexpr,
):
    """y[rows, cols] = act(a[rows, cols]) * b[rows, cols] for one [BLOCK_M, BLOCK_N] tile."""
    mask = (rows < n_rows)[:, None] & (cols < n_cols)[None, :]
    a = tl.load(a_ptr + rows[:, None] * a_row_stride + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + rows[:, None] * b_row_stride + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    y = _gate_f32(a, b, ACT)
    tl.store(y_ptr + rows[:, None] * y_row_stride + cols[None, :], y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _gated_rows_kernel(
    a_ptr,
    b_ptr,  # for concat: x again, and b_offset = H
    y_ptr,
    a_row_stride,
    b_row_stride,
    y_row_stride,
    b_offset,  # elements from b_ptr to b[0, 0]
    n_rows,
    n_cols,  # H
    ACT: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """Program (i, j) computes rows i*BLOCK_M.. and columns j*BLOCK_N.. of y (rows, H)."""
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)  # < H: 32 bits suffice
    _gated_tile(a_ptr, b_ptr + b_offset, y_ptr, rows, cols, a_row_stride, b_row_stride, y_row_stride,
                n_rows, n_cols, ACT)  # fmt: skip


@triton.jit
def _gated_persistent_kernel(
    a_ptr,
    b_ptr,
    y_ptr,
    a_row_stride,
    b_row_stride,
    y_row_stride,
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
        _gated_tile(a_ptr, b_ptr + b_offset, y_ptr, rows, cols, a_row_stride, b_row_stride, y_row_stride,
                    n_rows, n_cols, ACT)  # fmt: skip


# =================================================================================================
# Spaces and builders
# =================================================================================================

BLOCKS = powers_of_two(256, 8192)
# Each output element needs two loads: a thread holds 4 to 32 outputs (8 to 64 loaded values).
MIN_PER_THREAD = 4
MAX_PER_THREAD = 32
ROWS_BLOCK_M = (1, 2, 4, 8, 16)
ROWS_BLOCK_N = powers_of_two(64, 4096)
ROWS_TILE = (1024, 8192)  # smallest and largest BLOCK_M * BLOCK_N
ROWS_PER_THREAD = (8, 32)
PERSISTENT_TILES = (1024, 2048, 4096)
PERSISTENT_PER_THREAD = (8, 16)
PROGRAMS_PER_SM = (1, 2, 4, 8)
MIN_PERSISTENT_BLOCK_N = 16


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


def _views(spec: OpSpec, inputs: Sequence[torch.Tensor], output: torch.Tensor, rows: int, h: int
           ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int, int, int, int]:
    """(a, b, y, a_row_stride, b_row_stride, y_row_stride, b_offset) as 2-D views: for concat, a
    and b are both x (rows, 2H) and b starts H elements in."""
    y = output.view(rows, h)
    if len(inputs) == 1:
        x = inputs[0].view(rows, 2 * h)
        return x, x, y, x.stride(0), x.stride(0), y.stride(0), h
    a, b = inputs[0].view(rows, h), inputs[1].view(rows, h)
    return a, b, y, a.stride(0), b.stride(0), y.stride(0), 0


# ---- blocked ------------------------------------------------------------------------------------


def _blocked_space(spec: OpSpec) -> Space:
    return Space(
        [Param("BLOCK", BLOCKS), Param("num_warps", WARPS), Param("EVICT", EVICTION)],
        [per_thread_constraint(lambda c: c["BLOCK"], MIN_PER_THREAD, MAX_PER_THREAD)],
    )


def _blocked_build(spec: OpSpec, config: Config) -> Launcher:
    checked(_blocked_space(spec), config)
    rows, h = _geometry(spec)
    n = rows * h
    block = int(config["BLOCK"])
    grid = (triton.cdiv(n, block),)
    act, evict, num_warps = _act(spec), str(config["EVICT"]), int(config["num_warps"])

    if spec.const("layout") == "concat":
        concat_kernel = direct_launch(_gated_concat_blocked_kernel, grid)

        def launch_concat(inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> None:
            concat_kernel(inputs[0].view(-1), outputs[0].view(-1), n,
                          H=h, ACT=act, BLOCK=block, EVICT=evict, num_warps=num_warps)  # fmt: skip

        return launch_concat

    pair_kernel = direct_launch(_gated_pair_blocked_kernel, grid)

    def launch_pair(inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> None:
        pair_kernel(inputs[0].view(-1), inputs[1].view(-1), outputs[0].view(-1), n,
                    ACT=act, BLOCK=block, EVICT=evict, num_warps=num_warps)  # fmt: skip

    return launch_pair


# ---- rows ---------------------------------------------------------------------------------------


def _rows_space(spec: OpSpec) -> Space:
    # Blocks wider than the padded row only add masked lanes; the narrowest is always allowed.
    widest = max(ROWS_BLOCK_N[0], next_power_of_two(_geometry(spec)[1]))
    low, high = ROWS_TILE
    return Space(
        [Param("BLOCK_M", ROWS_BLOCK_M), Param("BLOCK_N", ROWS_BLOCK_N), Param("num_warps", WARPS)],
        [
            Constraint("BLOCK_N is no wider than the padded row", lambda c: c["BLOCK_N"] <= widest),
            Constraint(f"a tile holds {low} to {high} elements",
                       lambda c: low <= c["BLOCK_M"] * c["BLOCK_N"] <= high),
            per_thread_constraint(lambda c: c["BLOCK_M"] * c["BLOCK_N"], *ROWS_PER_THREAD),
        ],
    )  # fmt: skip


def _rows_build(spec: OpSpec, config: Config) -> Launcher:
    checked(_rows_space(spec), config)
    rows, h = _geometry(spec)
    block_m, block_n = int(config["BLOCK_M"]), int(config["BLOCK_N"])
    # Row blocks on axis 0 (up to 2**31 - 1 programs); column blocks on axis 1 (at most 65535).
    kernel = direct_launch(_gated_rows_kernel, (triton.cdiv(rows, block_m), triton.cdiv(h, block_n)))
    act, num_warps = _act(spec), int(config["num_warps"])

    def launch(inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> None:
        a, b, y, a_stride, b_stride, y_stride, b_offset = _views(spec, inputs, outputs[0], rows, h)
        kernel(a, b, y, a_stride, b_stride, y_stride, b_offset, rows, h,
               ACT=act, BLOCK_M=block_m, BLOCK_N=block_n, num_warps=num_warps)  # fmt: skip

    return launch


# ---- persistent ---------------------------------------------------------------------------------


def _persistent_tile(h: int, tile: int) -> tuple[int, int]:
    """(BLOCK_M, BLOCK_N) of a TILE-element tile for rows of h columns."""
    block_n = min(tile, max(MIN_PERSISTENT_BLOCK_N, next_power_of_two(h)))
    return tile // block_n, block_n


def _persistent_space(spec: OpSpec) -> Space:
    itemsize = spec.inputs[0].torch_dtype.itemsize
    return Space(
        [Param("PROGRAMS_PER_SM", PROGRAMS_PER_SM), Param("TILE", PERSISTENT_TILES), Param("num_warps", WARPS),
         Param("num_stages", STAGES)],
        [
            per_thread_constraint(lambda c: c["TILE"], *PERSISTENT_PER_THREAD),
            *persistent_constraints(lambda c: 2 * c["TILE"] * itemsize),  # a and b tiles in flight
        ],
    )  # fmt: skip


def _persistent_build(spec: OpSpec, config: Config) -> Launcher:
    checked(_persistent_space(spec), config)
    rows, h = _geometry(spec)
    block_m, block_n = _persistent_tile(h, int(config["TILE"]))
    n_col_tiles = triton.cdiv(h, block_n)
    n_tiles = triton.cdiv(rows, block_m) * n_col_tiles
    programs = min(n_tiles, int(config["PROGRAMS_PER_SM"]) * multiprocessor_count())
    kernel = direct_launch(_gated_persistent_kernel, (programs,))
    act, num_warps, num_stages = _act(spec), int(config["num_warps"]), int(config["num_stages"])

    def launch(inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> None:
        a, b, y, a_stride, b_stride, y_stride, b_offset = _views(spec, inputs, outputs[0], rows, h)
        kernel(a, b, y, a_stride, b_stride, y_stride, b_offset, rows, h, n_col_tiles, n_tiles,
               ACT=act, BLOCK_M=block_m, BLOCK_N=block_n, NUM_STAGES=num_stages,
               num_warps=num_warps, num_stages=num_stages)  # fmt: skip

    return launch


# =================================================================================================
# The op families
# =================================================================================================


@dataclass(frozen=True)
class _GatedVariant(Variant):
    """A variant whose kernels also run code of kernelsmith.ops.gelu (the activations): its
    source hash covers that module too, so that a change there invalidates stored decisions."""

    @property
    def source_hash(self) -> str:
        text = f"{super().source_hash}\n{inspect.getsource(_gelu_module)}"
        return hashlib.sha256(text.encode()).hexdigest()[:16]


_SUPPORTED_TORCH_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


class _Gated(OpFamily):
    """SwiGLU and GeGLU: constants ``layout`` (and ``approximate`` for GeGLU)."""

    has_approximate: ClassVar[bool] = False
    default_approximate: ClassVar[str] = "tanh"
    rowwise = True  # bucketed by row count at a fixed H: see bucket()
    row_block = max(ROWS_BLOCK_M)
    distributions = ("normal", "wide", "small", "tails")
    variants = (
        _GatedVariant("blocked", "BLOCK consecutive outputs per program (concat: row = i // H, H constant)",
                      _blocked_space, _blocked_build),
        _GatedVariant("rows", "one program per BLOCK_M x BLOCK_N tile of the (rows, H) output",
                      _rows_space, _rows_build),
        _GatedVariant("persistent", "PROGRAMS_PER_SM programs per SM walk TILE-element tiles (grid-stride loop)",
                      _persistent_space, _persistent_build),
    )  # fmt: skip

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
        a = draw(self.name, distribution, shape, seed, device, self.distributions)
        # b from an independent stream of the same seed (a's draws depend on the distribution).
        b = draw(self.name, "normal", shape, seed ^ 0x5EED, device, self.distributions)
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

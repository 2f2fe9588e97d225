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

``num_stages`` only matters to kernels with a loop (the compiler software-pipelines loops), so
``whole_row`` and ``multi_row`` offer the single value 1 instead of tripling their spaces with
configs that compile to the same code.

All kernels load with masks (``other=0.0``, which adds nothing to a sum of squares), compute in
float32, store in the output's dtype, and compute row offsets in 64-bit integers so that tensors
of more than 2**31 elements are addressed correctly. Launchers accept contiguous inputs only (the
spec says so), view them as ``(rows, N)`` and pass the row strides explicitly.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import torch
import triton
import triton.language as tl

from kernelsmith.ops._base import (
    Launcher,
    OpFamily,
    Tolerance,
    UnsupportedWorkload,
    Variant,
    check_eps,
    generator,
    rows_and_width,
    tensor_specs,
)
from kernelsmith.ops._launch import direct_launch
from kernelsmith.space import Config, Constraint, Param, Space, next_power_of_two, powers_of_two
from kernelsmith.spec import OpSpec, TensorSpec, dtype_name

DEFAULT_EPS = 1e-6

# The widest row the register-resident variants accept: at 32 warps (1024 threads) a row of 65536
# float32 values is 64 registers a thread, about the most that does not spill.
MAX_WHOLE_ROW = 65536
# The most elements one multi_row block holds (ROWS * BLOCK_N), a register budget of 16 values a
# thread at 32 warps, 128 at 4.
MAX_MULTI_ROW_BLOCK = 16384
# Beyond this many float32 values a thread, a block no longer fits in registers: configs with
# fewer warps than that would need are left out of the spaces.
MAX_VALUES_PER_THREAD = 128

WARPS = (1, 2, 4, 8, 16, 32)
STAGES = (1, 2, 3)  # for kernels with a loop to pipeline
# Cache hint for the activation load: "" (the default policy) or "evict_first" (streamed data,
# read once; leaves L2 to the weight). Which is faster depends on the device: a search parameter.
EVICTION = ("", "evict_first")
NO_LOOP_STAGES = (1,)  # for kernels without one: num_stages would change nothing


# ---------------------------------------------------------------------------------------------
# Kernels
# ---------------------------------------------------------------------------------------------


@triton.jit
def _rmsnorm_whole_row_kernel(
    x_ptr,
    w_ptr,
    y_ptr,
    x_row_stride,
    y_row_stride,
    N,
    eps,
    BLOCK_N: tl.constexpr,
    EVICT_X: tl.constexpr,  # "" or "evict_first": x is read once, so it need not stay in L2
):
    """One program normalises one row held entirely in registers (BLOCK_N >= N)."""
    row = tl.program_id(0).to(tl.int64)  # 64-bit, so that row * stride cannot overflow
    cols = tl.arange(0, BLOCK_N)
    mask = cols < N

    # Padding lanes load 0.0, which adds nothing to the sum of squares.
    x = tl.load(x_ptr + row * x_row_stride + cols, mask=mask, other=0.0, eviction_policy=EVICT_X).to(tl.float32)
    # mean(x^2) over the N real elements (divide by N, not BLOCK_N), then 1/sqrt(. + eps).
    rstd = tl.rsqrt(tl.sum(x * x, axis=0) / N + eps)

    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    y = x * rstd * w  # all in float32, rounded once on the store
    tl.store(y_ptr + row * y_row_stride + cols, y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _rmsnorm_multi_row_kernel(
    x_ptr,
    w_ptr,
    y_ptr,
    x_row_stride,
    y_row_stride,
    n_rows,
    N,
    eps,
    ROWS: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """One program normalises ROWS consecutive rows as a [ROWS, BLOCK_N] block."""
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK_N)
    row_mask = rows < n_rows  # the last program may run past the final row
    col_mask = cols < N
    mask = row_mask[:, None] & col_mask[None, :]

    rows64 = rows.to(tl.int64)
    x_offsets = rows64[:, None] * x_row_stride + cols[None, :]
    x = tl.load(x_ptr + x_offsets, mask=mask, other=0.0).to(tl.float32)
    # One rstd per row: reduce along the columns (axis 1). Masked-off rows get rsqrt(eps), a
    # finite value that is never stored.
    rstd = tl.rsqrt(tl.sum(x * x, axis=1) / N + eps)

    # The weight is shared by all rows of the block: load it once, broadcast it over the rows.
    w = tl.load(w_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)
    y = x * rstd[:, None] * w[None, :]
    y_offsets = rows64[:, None] * y_row_stride + cols[None, :]
    tl.store(y_ptr + y_offsets, y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _rmsnorm_looped_kernel(
    x_ptr,
    w_ptr,
    y_ptr,
    x_row_stride,
    y_row_stride,
    N,
    eps,
    BLOCK_N: tl.constexpr,
):
    """One program normalises one row in two passes over column blocks of BLOCK_N."""
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
        y = x * rstd * w
        tl.store(y_row + cols, y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _rmsnorm_persistent_kernel(
    x_ptr,
    w_ptr,
    y_ptr,
    x_row_stride,
    y_row_stride,
    n_rows,
    N,
    eps,
    BLOCK_N: tl.constexpr,
):
    """A fixed grid of programs; each loads the weight once, then normalises rows
    pid, pid + num_programs, pid + 2 * num_programs, ... (a grid-stride loop)."""
    # A 64-bit start makes the loop counter 64-bit (the compiler gives it the widest type of
    # start, end and step), so that row * stride cannot overflow.
    first_row = tl.program_id(0).to(tl.int64)
    step = tl.num_programs(0)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < N
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)

    for row in range(first_row, n_rows, step):
        x = tl.load(x_ptr + row * x_row_stride + cols, mask=mask, other=0.0).to(tl.float32)
        rstd = tl.rsqrt(tl.sum(x * x, axis=0) / N + eps)
        y = x * rstd * w
        tl.store(y_ptr + row * y_row_stride + cols, y.to(y_ptr.dtype.element_ty), mask=mask)


# ---------------------------------------------------------------------------------------------
# Spaces and launchers
# ---------------------------------------------------------------------------------------------


def _warps_fit(elements: int, num_warps: int) -> bool:
    """Whether a block of ``elements`` float32 values suits ``num_warps`` warps.

    No more threads than elements (idle warps only add scheduling cost), except that 1 and 2 warps
    are always allowed, so that even the tiniest rows keep a choice; and no more than
    MAX_VALUES_PER_THREAD values a thread, beyond which registers spill to local memory.
    """
    threads = 32 * num_warps
    return (num_warps <= 2 or threads <= elements) and elements <= threads * MAX_VALUES_PER_THREAD


@functools.cache
def _multiprocessor_count() -> int:
    """Multiprocessors of the current GPU (a small stand-in on a machine without one, where the
    interpreter runs the kernels: a few programs, so that the grid-stride loop really loops)."""
    if torch.cuda.is_available():
        properties = torch.cuda.get_device_properties(torch.cuda.current_device())
        return int(properties.multi_processor_count)
    return 4


def _launch_kwargs(config: Config) -> dict[str, Any]:
    return {"num_warps": int(config["num_warps"]), "num_stages": int(config["num_stages"])}


# ---- whole_row ------------------------------------------------------------------------------


def _whole_row_space(spec: OpSpec) -> Space:
    block_n = next_power_of_two(rows_and_width(spec)[1])
    return Space(
        [Param("num_warps", WARPS), Param("num_stages", NO_LOOP_STAGES), Param("EVICT_X", EVICTION)],
        [
            Constraint(f"the whole row must fit: BLOCK_N <= {MAX_WHOLE_ROW}",
                       lambda c: block_n <= MAX_WHOLE_ROW),
            Constraint("num_warps must suit the row's BLOCK_N elements",
                       lambda c: _warps_fit(block_n, c["num_warps"])),
        ],
    )


def _whole_row_build(spec: OpSpec, config: Config) -> Launcher:
    rows, n = rows_and_width(spec)
    grid = (rows,)
    block_n = next_power_of_two(n)
    eps = float(spec.const("eps"))
    kwargs = _launch_kwargs(config)
    evict_x = str(config["EVICT_X"])
    kernel = direct_launch(_rmsnorm_whole_row_kernel, grid)
    # Inputs are contiguous (the family refuses others), so row r starts at element r * n of x
    # and y: the tensors go to the kernel as they are, with row strides n, and no view per call.

    def launch(inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> None:
        kernel(inputs[0], inputs[1], outputs[0], n, n, n, eps, BLOCK_N=block_n, EVICT_X=evict_x, **kwargs)

    return launch


# ---- multi_row ------------------------------------------------------------------------------


def _multi_row_space(spec: OpSpec) -> Space:
    block_n = next_power_of_two(rows_and_width(spec)[1])
    return Space(
        [Param("ROWS", (2, 4, 8, 16, 32)), Param("num_warps", WARPS),
         Param("num_stages", NO_LOOP_STAGES)],
        [
            Constraint(f"the block must fit: ROWS * BLOCK_N <= {MAX_MULTI_ROW_BLOCK}",
                       lambda c: c["ROWS"] * block_n <= MAX_MULTI_ROW_BLOCK),
            Constraint("num_warps must suit the block's ROWS * BLOCK_N elements",
                       lambda c: _warps_fit(c["ROWS"] * block_n, c["num_warps"])),
        ],
    )


def _multi_row_build(spec: OpSpec, config: Config) -> Launcher:
    rows, n = rows_and_width(spec)
    rows_per_program = int(config["ROWS"])
    grid = (triton.cdiv(rows, rows_per_program),)
    block_n = next_power_of_two(n)
    eps = float(spec.const("eps"))
    kwargs = _launch_kwargs(config)
    kernel = direct_launch(_rmsnorm_multi_row_kernel, grid)

    def launch(inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> None:
        kernel(inputs[0], inputs[1], outputs[0], n, n, rows, n, eps,
               ROWS=rows_per_program, BLOCK_N=block_n, **kwargs)

    return launch


# ---- looped ---------------------------------------------------------------------------------


def _looped_space(spec: OpSpec) -> Space:
    full = next_power_of_two(rows_and_width(spec)[1])
    return Space(
        [Param("BLOCK_N", powers_of_two(64, 8192)), Param("num_warps", WARPS),
         Param("num_stages", STAGES)],
        [
            # A block as wide as the row is whole_row with extra work; the smallest block is
            # always allowed so that the space is never empty for narrow rows.
            Constraint("BLOCK_N must be narrower than the row (or the smallest block)",
                       lambda c: c["BLOCK_N"] < full or c["BLOCK_N"] == 64),
            Constraint("num_warps must suit the BLOCK_N elements",
                       lambda c: _warps_fit(c["BLOCK_N"], c["num_warps"])),
        ],
    )


def _looped_build(spec: OpSpec, config: Config) -> Launcher:
    rows, n = rows_and_width(spec)
    grid = (rows,)
    block_n = int(config["BLOCK_N"])
    eps = float(spec.const("eps"))
    kwargs = _launch_kwargs(config)
    kernel = direct_launch(_rmsnorm_looped_kernel, grid)

    def launch(inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> None:
        kernel(inputs[0], inputs[1], outputs[0], n, n, n, eps, BLOCK_N=block_n, **kwargs)

    return launch


# ---- persistent -----------------------------------------------------------------------------


def _persistent_space(spec: OpSpec) -> Space:
    block_n = next_power_of_two(rows_and_width(spec)[1])
    return Space(
        [Param("PROGRAMS_PER_SM", (1, 2, 4, 8)), Param("num_warps", WARPS),
         Param("num_stages", STAGES)],
        [
            Constraint(f"the whole row must fit: BLOCK_N <= {MAX_WHOLE_ROW}",
                       lambda c: block_n <= MAX_WHOLE_ROW),
            # Both the row and the weight stay in registers: 2 * BLOCK_N values.
            Constraint("num_warps must suit the row and the weight (2 * BLOCK_N elements)",
                       lambda c: _warps_fit(2 * block_n, c["num_warps"])),
        ],
    )


def _persistent_build(spec: OpSpec, config: Config) -> Launcher:
    rows, n = rows_and_width(spec)
    grid = (min(rows, int(config["PROGRAMS_PER_SM"]) * _multiprocessor_count()),)
    block_n = next_power_of_two(n)
    eps = float(spec.const("eps"))
    kwargs = _launch_kwargs(config)
    kernel = direct_launch(_rmsnorm_persistent_kernel, grid)

    def launch(inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> None:
        kernel(inputs[0], inputs[1], outputs[0], n, n, rows, n, eps, BLOCK_N=block_n,
               **kwargs)

    return launch


# ---------------------------------------------------------------------------------------------
# The op family
# ---------------------------------------------------------------------------------------------


class RMSNorm(OpFamily):
    name = "rmsnorm"
    summary = "RMS normalisation over the last dimension, times a weight (Llama's RMSNorm)"
    shape_help = (
        "the shape of x, e.g. 8192x4096 for x of shape (8192, 4096) (rows x hidden size); "
        "weight has the last size, (4096,); more leading sizes are allowed (2x1024x4096)"
    )
    rowwise = True  # configs depend on the row width only: calls are bucketed by row count
    row_block = 32  # multi_row's largest ROWS
    backward = "rmsnorm_backward"  # gradients of (x, weight), tuned as their own workload
    distributions = ("normal", "uniform", "large", "small", "outliers")
    tolerance = Tolerance()
    variants = (
        Variant("whole_row", "one program per row, the whole row in registers",
                _whole_row_space, _whole_row_build),
        Variant("multi_row", "ROWS rows per program as a 2D block, for narrow rows",
                _multi_row_space, _multi_row_build),
        Variant("looped", "one program per row, two passes over column blocks, for wide rows",
                _looped_space, _looped_build),
        Variant("persistent", "PROGRAMS_PER_SM programs per SM walk the rows, weight loaded once",
                _persistent_space, _persistent_build),
    )

    # ---- specs -------------------------------------------------------------------------------
    def spec(self, shape: tuple[int, ...], dtype: str, eps: float = DEFAULT_EPS,
             **constants: Any) -> OpSpec:
        if constants:
            raise UnsupportedWorkload(f"rmsnorm: unknown constants {sorted(constants)}")
        shape = tuple(int(s) for s in shape)
        if not shape or any(s <= 0 for s in shape):
            raise UnsupportedWorkload(f"rmsnorm: x must have a positive shape, not {shape}")
        name = dtype_name(dtype)
        spec = OpSpec(self.name, (TensorSpec(shape, name), TensorSpec((shape[-1],), name)),
                      {"eps": check_eps(self.name, eps)})
        self.check_supported(spec)
        return spec

    def spec_for(self, *inputs: torch.Tensor, eps: float = DEFAULT_EPS, **constants: Any) -> OpSpec:
        if constants:
            raise UnsupportedWorkload(f"rmsnorm: unknown constants {sorted(constants)}")
        if len(inputs) != 2:
            raise UnsupportedWorkload(f"rmsnorm takes (x, weight), not {len(inputs)} tensors")
        x, weight = inputs
        if x.dim() < 1 or weight.dim() != 1:
            raise UnsupportedWorkload(f"rmsnorm: x must be at least 1-D and weight 1-D, "
                                      f"not {x.dim()}-D and {weight.dim()}-D")
        if weight.shape[0] != x.shape[-1]:
            raise UnsupportedWorkload(
                f"rmsnorm: weight has {weight.shape[0]} elements, x's rows have {x.shape[-1]}")
        if x.numel() == 0:
            raise UnsupportedWorkload("rmsnorm: empty inputs are not supported")
        if x.dtype != weight.dtype:
            raise UnsupportedWorkload(f"rmsnorm: x is {x.dtype} but weight is {weight.dtype}")
        specs = tensor_specs(self.name, (x, weight))
        spec = OpSpec(self.name, specs, {"eps": check_eps(self.name, eps)})
        self.check_supported(spec)
        return spec

    # ---- math --------------------------------------------------------------------------------
    def reference(self, spec: OpSpec, inputs: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        """Hugging Face's LlamaRMSNorm.forward, verbatim in substance."""
        x, weight = inputs
        eps = float(spec.const("eps"))
        xf = x.float()
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
        return (weight * y.to(x.dtype),)

    def reference_fp64(
        self, spec: OpSpec, inputs: Sequence[torch.Tensor]
    ) -> tuple[torch.Tensor, ...]:
        x, weight = inputs
        eps = float(spec.const("eps"))
        xd = x.double()
        y = xd * torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + eps)
        return (weight.double() * y,)

    def make_inputs(
        self,
        spec: OpSpec,
        seed: int,
        distribution: str = "normal",
        device: str | torch.device = "cuda",
    ) -> tuple[torch.Tensor, ...]:
        """x drawn from ``distribution``, weight = 1 + 0.5 * N(0, 1), both deterministic in seed.

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
        weight = 1 + 0.5 * randn(w_spec.shape)
        return x.to(x_spec.torch_dtype), weight.to(w_spec.torch_dtype)

    def flops(self, spec: OpSpec) -> int:
        # Per element: square, add to the sum, multiply by rstd, multiply by the weight.
        return 4 * spec.inputs[0].numel




OP = RMSNorm()

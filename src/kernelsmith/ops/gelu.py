"""GELU, exact (``gelu``) and with the tanh approximation (``gelu_tanh``), elementwise.

The ops
-------
The Gaussian error linear unit (Hendrycks & Gimpel, 2016) weighs its input by the standard normal
CDF ``Phi``: ``gelu(x) = x * Phi(x)``. Two formulas are in use, and they are two op families here
because they are two different functions (they differ by up to 4.7e-4, at x = -2.7 where the
output is about -0.0094, a 5% difference), each with its own PyTorch reference:

``gelu`` (exact; ``F.gelu(x)``, BERT, ViT, Whisper)
    ``y = 0.5 * x * (1 + erf(x / sqrt(2)))``
``gelu_tanh`` (``F.gelu(x, approximate="tanh")``, GPT-2, Gemma's GeGLU)
    ``y = 0.5 * x * (1 + tanh(u))``  with  ``u = sqrt(2 / pi) * (x + 0.044715 * x**3)``

One input ``x`` of any shape (contiguous) in float16, bfloat16 or float32, one output of the same
shape and dtype. The kernels see ``x`` as a flat array of ``n`` elements: the op is elementwise,
so shape only matters for bucketing (below).

The math in the kernels
-----------------------
Everything is computed in float32 and rounded once, on the store, as PyTorch does (its ``gelu``
computes half-precision inputs in float32 too).

The exact form is written as it reads, with ``tl.math.erf`` (in every Triton since 3.0; on NVIDIA
it compiles to libdevice's ``erff``, a few ulps). On the H200 that form is bound by arithmetic,
not memory (eager and every kernel ran at about 72% of copy bandwidth at 16384x8192 bf16, the tanh
form at 98%), so its spaces also search ``FAST_ERF``: erf from Abramowitz & Stegun 7.1.26
(``gelu_erf_poly_f32``: one exp and five multiply-adds, |error| <= 1.5e-7), kept only where the
harness finds it accurate enough and the measurement finds it faster.

The tanh form is rewritten without ``tanh`` (which ``tl.math`` does not offer, and whose libdevice
location moved between Triton versions). Since ``1 + tanh(u) = 2 * sigmoid(2u)``,

    ``0.5 * x * (1 + tanh(u)) = x * sigmoid(z)``  with  ``z = 2u = sqrt(8 / pi) * x * (1 + 0.044715 * x**2)``.

This is also *more* accurate than the textbook form: for negative ``x`` the sum ``1 + tanh(u)``
cancels (``tanh(u)`` is close to ``-1``), while ``sigmoid(z)`` is computed directly. The sigmoid
itself is evaluated so that nothing overflows: with ``t = exp(-|z|)`` (in ``(0, 1]``),

    ``sigmoid(z) = 1 / (1 + t)`` for ``z >= 0``   and   ``t / (1 + t)`` for ``z < 0``,

so ``exp`` never sees a positive argument (``exp(88.8)`` is already ``inf`` in float32, reached
at ``x`` of about -11). The same helper serves SiLU in :mod:`kernelsmith.ops.gated`. The
derivatives of sigmoid, SiLU and both GELUs (``*_grad_f32``, with their math where they are
defined) serve the backward families of :mod:`kernelsmith.ops.gated_backward`.

Both kernels are compiled from the same source with a constexpr switch ``APPROX``: the family's
name picks it, so a ``gelu`` workload never runs tanh code and the reverse.

The variants
------------
The op reads ``n`` elements and writes ``n`` (4 bytes an element in 16-bit dtypes) and does a
dozen flops each: it is bound by memory bandwidth, and the variants differ in how the flat array
is cut into work for programs:

``blocked``
    One program per ``BLOCK`` consecutive elements (``BLOCK`` from 256 to 8192), the classic
    elementwise kernel; the grid has ``cdiv(n, BLOCK)`` programs and the hardware schedules them.
    ``EVICT_X`` chooses the cache policy of the read-once input.
``multi_block``
    One program per ``ITEMS`` (2 to 8) consecutive blocks, walked by a loop that the compiler
    software-pipelines (``num_stages``): the next block's load is in flight while the current one
    is computed and stored. Fewer, longer programs; more bytes in flight per program.
``persistent``
    A fixed grid of ``PROGRAMS_PER_SM`` programs per multiprocessor (the SM count from
    ``torch.cuda`` when a GPU is present, else 4 so that the interpreter's grid-stride loop
    really loops), each walking blocks ``pid, pid + programs, ...``: no program start-up
    beyond the first, and a pipelined loop as in ``multi_block``.

Offsets are 64-bit (``program_id`` is widened before it is multiplied), so tensors of more than
2**31 elements are addressed correctly. ``num_stages`` is a parameter of the two variants with a
loop only, passed both at launch and to ``tl.range`` (Triton 3.6 pipelines a loop without a dot
only when ``tl.range`` asks for it).

Spaces depend on the dtype only (not on the shape), so the config tuned for a bucket is valid,
and validated, for every shape in it.

Shapes and buckets
------------------
The families are ``rowwise``: an activation is ``(tokens, features)``, the feature width is
fixed by the model and the token count varies, so workloads are bucketed by the row count
(rounded up to a power of two) at a fixed width, like the normalisations. Validation runs the
target, 1, 7 and an odd number of rows of the same width, plus a 1-D tail of an odd length
(``ODD_TAIL``), so that the masked last block of every ``BLOCK`` is exercised even when the width
is a power of two.

Backward kernels (``dy * gelu'(x)``) would be families of their own (inputs ``(dy, x)``), built
on the same flat variants.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import torch
import triton
import triton.language as tl

from kernelsmith.ops._base import Launcher, OpFamily, UnsupportedWorkload, Variant, generator, tail_rows
from kernelsmith.ops._launch import direct_launch
from kernelsmith.space import Config, Constraint, Param, Space, powers_of_two
from kernelsmith.spec import OpSpec, TensorSpec

# =================================================================================================
# Math helpers (also used by kernelsmith.ops.gated)
# =================================================================================================


@triton.jit
def sigmoid_f32(z):
    """sigmoid(z) = 1 / (1 + exp(-z)) of a float32 tensor, overflow-free.

    With t = exp(-|z|) in (0, 1]: sigmoid(z) = 1 / (1 + t) when z >= 0, and
    sigmoid(z) = exp(z) / (1 + exp(z)) = t / (1 + t) when z < 0.
    """
    t = tl.exp(-tl.abs(z))
    r = 1.0 / (1.0 + t)
    return tl.where(z >= 0, r, t * r)


@triton.jit
def gelu_f32(x, APPROX: tl.constexpr):
    """GELU of a float32 tensor: exact (erf) or, with APPROX, the tanh approximation."""
    if APPROX:
        # 0.5 x (1 + tanh(u)) = x * sigmoid(2u), where
        # 2u = 2 sqrt(2/pi) (x + 0.044715 x^3) = sqrt(8/pi) * x * (1 + 0.044715 x^2).
        z = 1.5957691216057308 * x * (1.0 + 0.044715 * x * x)
        y = x * sigmoid_f32(z)
    else:
        # 0.5 x (1 + erf(x / sqrt(2))), 0.7071067811865476 = 1 / sqrt(2).
        y = 0.5 * x * (1.0 + tl.math.erf(x * 0.7071067811865476))
    return y


@triton.jit
def gelu_erf_poly_f32(x):
    """Exact-form GELU with erf from Abramowitz & Stegun 7.1.26 instead of libdevice's erff.

    For z = |x| / sqrt(2) and t = 1 / (1 + p z): erfc(z) = (a1 t + ... + a5 t^5) exp(-z^2), with
    |error of erf| <= 1.5e-7 (float32 is 6e-8): one exp and a handful of multiply-adds, fewer
    instructions than erff. 1 + erf(x / sqrt(2)) is 2 - erfc(z) for x >= 0 and erfc(z) for x < 0,
    computed without cancellation. Whether it is accurate enough for an output dtype, and
    faster, is for the harness and the search to say (the search parameter FAST_ERF).
    """
    z = tl.abs(x) * 0.7071067811865476
    t = 1.0 / (1.0 + 0.3275911 * z)
    poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))))
    erfc = poly * tl.exp(-z * z)
    return 0.5 * x * tl.where(x >= 0, 2.0 - erfc, erfc)


@triton.jit
def _gelu_kernel_f32(x, APPROX: tl.constexpr, FAST_ERF: tl.constexpr):
    if FAST_ERF:  # noqa: SIM108 (a constexpr branch: one of the two is compiled)
        y = gelu_erf_poly_f32(x)
    else:
        y = gelu_f32(x, APPROX)
    return y


# The derivatives (for the backward families, kernelsmith.ops.gated_backward).


@triton.jit
def sigmoid_grad_f32(z):
    """sigmoid'(z) = sigmoid(z) * (1 - sigmoid(z)) of a float32 tensor, overflow-free.

    With t = exp(-|z|) it is t / (1 + t)^2 for either sign of z: no exp of a positive argument,
    and no cancellation in 1 - sigmoid(z) where sigmoid(z) is close to 1.
    """
    t = tl.exp(-tl.abs(z))
    r = 1.0 / (1.0 + t)
    return t * r * r


@triton.jit
def silu_grad_f32(x):
    """silu'(x) = s * (1 + x * (1 - s)) = s + x * sigmoid'(x), s = sigmoid(x), in float32.

    Where |x| is large sigmoid'(x) is 0 (its exp underflows) and the product x * 0 is 0.
    """
    return sigmoid_f32(x) + x * sigmoid_grad_f32(x)


@triton.jit
def gelu_grad_f32(x, APPROX: tl.constexpr):
    """gelu'(x) of a float32 tensor: exact or, with APPROX, of the tanh approximation."""
    if APPROX:
        # gelu(x) = x * sigmoid(z) with z = sqrt(8/pi) * x * (1 + 0.044715 x^2) (see gelu_f32), so
        # gelu'(x) = sigmoid(z) + x * z' * sigmoid'(z), z' = sqrt(8/pi) * (1 + 3 * 0.044715 x^2);
        # the same as differentiating 0.5 x (1 + tanh(u)), since 1 - tanh(u)^2 = 4 sigmoid'(2u).
        # For |x| above about 11, sigmoid'(z) underflows to 0 while x * z' may overflow (x^2 is
        # inf beyond 1.8e19): the where() keeps 0 * inf = NaN out.
        x2 = x * x
        z = 1.5957691216057308 * x * (1.0 + 0.044715 * x2)
        dz = 1.5957691216057308 * (1.0 + 0.134145 * x2)
        ds = sigmoid_grad_f32(z)
        g = sigmoid_f32(z) + tl.where(ds > 0.0, x * dz * ds, 0.0)
    else:
        # gelu(x) = x * Phi(x), so gelu'(x) = Phi(x) + x * phi(x) with the normal density
        # phi(x) = exp(-x^2 / 2) / sqrt(2 pi) (0.3989422804014327 = 1 / sqrt(2 pi)); where x^2
        # overflows, exp(-inf) = 0 and x * 0 = 0.
        g = 0.5 * (1.0 + tl.math.erf(x * 0.7071067811865476)) + x * (0.3989422804014327 * tl.exp(-0.5 * x * x))
    return g


# =================================================================================================
# Kernels
#
# x and y are flat arrays of n elements (contiguous tensors viewed as 1-D). Offsets are int64.
# =================================================================================================


@triton.jit
def _gelu_blocked_kernel(
    x_ptr,
    y_ptr,
    n,
    APPROX: tl.constexpr,  # False: exact erf form; True: tanh approximation
    FAST_ERF: tl.constexpr,  # exact form only: the polynomial erf (gelu_erf_poly_f32)
    BLOCK: tl.constexpr,  # elements per program
    EVICT_X: tl.constexpr,  # "" or "evict_first": x is read once, so it need not stay in L2
):
    """One program computes BLOCK consecutive elements."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n  # only the last program is partial
    x = tl.load(x_ptr + offs, mask=mask, other=0.0, eviction_policy=EVICT_X).to(tl.float32)
    y = _gelu_kernel_f32(x, APPROX, FAST_ERF)
    tl.store(y_ptr + offs, y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _gelu_multi_block_kernel(
    x_ptr,
    y_ptr,
    n,
    APPROX: tl.constexpr,
    FAST_ERF: tl.constexpr,
    BLOCK: tl.constexpr,  # elements per loop step
    ITEMS: tl.constexpr,  # consecutive blocks per program
    NUM_STAGES: tl.constexpr,  # software-pipelining depth of the block loop (1: none)
):
    """One program computes ITEMS consecutive blocks of BLOCK elements, one per loop step."""
    start = tl.program_id(0).to(tl.int64) * (BLOCK * ITEMS)
    cols = tl.arange(0, BLOCK)
    # With NUM_STAGES > 1 the compiler issues the loads of the next blocks while the current one
    # is computed and stored. Blocks past n (in the last program) are fully masked.
    for i in tl.range(0, ITEMS, num_stages=NUM_STAGES):
        offs = start + i * BLOCK + cols  # i * BLOCK < 2**16: the int64 start widens the sum
        mask = offs < n
        x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        y = _gelu_kernel_f32(x, APPROX, FAST_ERF)
        tl.store(y_ptr + offs, y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _gelu_persistent_kernel(
    x_ptr,
    y_ptr,
    n,
    n_blocks,  # cdiv(n, BLOCK)
    APPROX: tl.constexpr,
    FAST_ERF: tl.constexpr,
    BLOCK: tl.constexpr,
    NUM_STAGES: tl.constexpr,  # software-pipelining depth of the grid-stride loop (1: none)
):
    """A fixed grid; program pid computes blocks pid, pid + programs, pid + 2 * programs, ..."""
    cols = tl.arange(0, BLOCK)
    for block in tl.range(tl.program_id(0), n_blocks, tl.num_programs(0), num_stages=NUM_STAGES):
        # tl.cast, not .to(): in the interpreter the loop variable is a plain Python int.
        offs = tl.cast(block, tl.int64) * BLOCK + cols
        mask = offs < n
        x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        y = _gelu_kernel_f32(x, APPROX, FAST_ERF)
        tl.store(y_ptr + offs, y.to(y_ptr.dtype.element_ty), mask=mask)


# =================================================================================================
# Spaces and builders
# =================================================================================================

WARPS = (1, 2, 4, 8, 16, 32)
STAGES = (1, 2, 3)
EVICTION = ("", "evict_first")
BLOCKS = powers_of_two(256, 8192)
MULTI_BLOCKS = powers_of_two(256, 4096)
MULTI_ITEMS = (2, 4, 8)
PERSISTENT_BLOCKS = (1024, 2048, 4096)
PROGRAMS_PER_SM = (1, 2, 4, 8)
# Elements a thread holds: at least 4 (a 16-byte vector of float32, half of one in 16-bit
# dtypes), at most 32 (at 64, ptxas already spills the tanh form on sm_90). Variants with a
# pipelined loop keep up to num_stages blocks in flight and take a narrower range (which also
# keeps their spaces small).
MIN_PER_THREAD = 4
MAX_PER_THREAD = 32
LOOP_PER_THREAD = (8, 16)
MAX_WARPS_PER_SM = 64  # resident warps a multiprocessor holds (Hopper, Ampere)
# Shared memory the pipelined loads of one multiprocessor's programs may take (Hopper has 227 KiB
# a block; some is left to the compiler).
PIPELINE_SHARED_BYTES = 192 * 1024
# The 1-D validation tail: an odd length, so that the last block of every power-of-two BLOCK is
# partial, and several of the largest blocks long.
ODD_TAIL = 3 * 8192 + 5
# A stand-in multiprocessor count without a GPU (the interpreter): a few programs, so that the
# grid-stride loop of the persistent kernel takes several steps on small test tensors.
INTERPRETER_MULTIPROCESSORS = 4


@functools.cache
def _device_multiprocessors(device_index: int) -> int:
    return int(torch.cuda.get_device_properties(device_index).multi_processor_count)


def multiprocessor_count() -> int:
    """Multiprocessors of the current GPU, or INTERPRETER_MULTIPROCESSORS without one."""
    if torch.cuda.is_available():
        return _device_multiprocessors(torch.cuda.current_device())
    return INTERPRETER_MULTIPROCESSORS


def per_thread_constraint(elements: Callable[[Config], int], low: int, high: int) -> Constraint:
    """num_warps such that each thread holds between ``low`` and ``high`` of the block's elements."""
    return Constraint(
        f"each thread holds {low} to {high} elements",
        lambda c: low * 32 * c["num_warps"] <= elements(c) <= high * 32 * c["num_warps"],
    )


def persistent_constraints(loaded_bytes: Callable[[Config], int]) -> list[Constraint]:
    """All PROGRAMS_PER_SM programs of a multiprocessor are resident: warps, and the
    ``num_stages - 1`` blocks in flight (``loaded_bytes`` a block) in shared memory."""
    return [
        Constraint(
            f"the programs of a multiprocessor are all resident ({MAX_WARPS_PER_SM} warps)",
            lambda c: c["PROGRAMS_PER_SM"] * c["num_warps"] <= MAX_WARPS_PER_SM,
        ),
        Constraint(
            f"the blocks in flight fit in shared memory ({PIPELINE_SHARED_BYTES} bytes an SM)",
            lambda c: c["PROGRAMS_PER_SM"] * (c["num_stages"] - 1) * loaded_bytes(c) <= PIPELINE_SHARED_BYTES,
        ),
    ]


def checked(space: Space, config: Config) -> None:
    problems = space.violations(config)
    if problems:
        raise ValueError(f"config {config.key} is not in the space: {'; '.join(problems)}")


def _numel(spec: OpSpec) -> int:
    return spec.inputs[0].numel


def _approx(spec: OpSpec) -> bool:
    return spec.op == "gelu_tanh"


def _erf_params(spec: OpSpec) -> list[Param]:
    """The exact form also searches how erf is computed (libdevice or the polynomial)."""
    return [] if _approx(spec) else [Param("FAST_ERF", (False, True))]


def _fast_erf(config: Config) -> bool:
    return bool(config["FAST_ERF"]) if "FAST_ERF" in config else False


# ---- blocked ------------------------------------------------------------------------------------


def _blocked_space(spec: OpSpec) -> Space:
    return Space(
        [Param("BLOCK", BLOCKS), Param("num_warps", WARPS), Param("EVICT_X", EVICTION), *_erf_params(spec)],
        [per_thread_constraint(lambda c: c["BLOCK"], MIN_PER_THREAD, MAX_PER_THREAD)],
    )


def _blocked_build(spec: OpSpec, config: Config) -> Launcher:
    checked(_blocked_space(spec), config)
    n = _numel(spec)
    block = int(config["BLOCK"])
    kernel = direct_launch(_gelu_blocked_kernel, (triton.cdiv(n, block),))
    approx, evict, num_warps = _approx(spec), str(config["EVICT_X"]), int(config["num_warps"])
    fast_erf = _fast_erf(config)

    def launch(inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> None:
        kernel(inputs[0].view(-1), outputs[0].view(-1), n,
               APPROX=approx, FAST_ERF=fast_erf, BLOCK=block, EVICT_X=evict, num_warps=num_warps)  # fmt: skip

    return launch


# ---- multi_block --------------------------------------------------------------------------------


def _multi_block_space(spec: OpSpec) -> Space:
    return Space(
        [Param("BLOCK", MULTI_BLOCKS), Param("ITEMS", MULTI_ITEMS), Param("num_warps", WARPS),
         Param("num_stages", STAGES), *_erf_params(spec)],
        [
            per_thread_constraint(lambda c: c["BLOCK"], *LOOP_PER_THREAD),
            Constraint("no deeper pipeline than the loop has steps", lambda c: c["num_stages"] <= c["ITEMS"]),
        ],
    )  # fmt: skip


def _multi_block_build(spec: OpSpec, config: Config) -> Launcher:
    checked(_multi_block_space(spec), config)
    n = _numel(spec)
    block, items = int(config["BLOCK"]), int(config["ITEMS"])
    kernel = direct_launch(_gelu_multi_block_kernel, (triton.cdiv(n, block * items),))
    approx, num_warps, num_stages = _approx(spec), int(config["num_warps"]), int(config["num_stages"])
    fast_erf = _fast_erf(config)

    def launch(inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> None:
        kernel(inputs[0].view(-1), outputs[0].view(-1), n,
               APPROX=approx, FAST_ERF=fast_erf, BLOCK=block, ITEMS=items, NUM_STAGES=num_stages,
               num_warps=num_warps, num_stages=num_stages)  # fmt: skip

    return launch


# ---- persistent ---------------------------------------------------------------------------------


def _persistent_space(spec: OpSpec) -> Space:
    itemsize = spec.inputs[0].torch_dtype.itemsize
    return Space(
        [Param("PROGRAMS_PER_SM", PROGRAMS_PER_SM), Param("BLOCK", PERSISTENT_BLOCKS),
         Param("num_warps", WARPS), Param("num_stages", STAGES), *_erf_params(spec)],
        [
            per_thread_constraint(lambda c: c["BLOCK"], *LOOP_PER_THREAD),
            *persistent_constraints(lambda c: c["BLOCK"] * itemsize),
        ],
    )  # fmt: skip


def _persistent_build(spec: OpSpec, config: Config) -> Launcher:
    checked(_persistent_space(spec), config)
    n = _numel(spec)
    block = int(config["BLOCK"])
    n_blocks = triton.cdiv(n, block)
    programs = min(n_blocks, int(config["PROGRAMS_PER_SM"]) * multiprocessor_count())
    kernel = direct_launch(_gelu_persistent_kernel, (programs,))
    approx, num_warps, num_stages = _approx(spec), int(config["num_warps"]), int(config["num_stages"])
    fast_erf = _fast_erf(config)

    def launch(inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> None:
        kernel(inputs[0].view(-1), outputs[0].view(-1), n, n_blocks,
               APPROX=approx, FAST_ERF=fast_erf, BLOCK=block, NUM_STAGES=num_stages,
               num_warps=num_warps, num_stages=num_stages)  # fmt: skip

    return launch


# =================================================================================================
# The op families
# =================================================================================================

_SUPPORTED_TORCH_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def row_tail_shapes(shape: tuple[int, ...], block: int = 8) -> list[tuple[int, ...]]:
    """Shapes with the same last size and the base class's tail row counts (one row, every
    residue modulo 8 and the edges modulo ``block``: :func:`~kernelsmith.ops._base.tail_rows`),
    without the target's own shape; none for a 1-D shape."""
    *lead, width = shape
    if not lead:
        return []
    return [(r, width) for r in tail_rows(math.prod(lead), block) if (r, width) != shape]


def bucketed_shape(shape: tuple[int, ...]) -> tuple[int, ...]:
    """Leading sizes flattened into rows, the row count rounded up to a power of two."""
    *lead, width = shape
    rows = math.prod(lead) if lead else 1
    return (1 << max(rows - 1, 0).bit_length(), width)


class _Gelu(OpFamily):
    """The two GELU families; subclasses name the formula (``approximate``)."""

    approximate: ClassVar[str]
    shape_help = (
        "the shape of x (any rank; the op is elementwise): --shape 8192x14336 is 8192 tokens of "
        "14336 features; workloads are bucketed by the product of the leading sizes"
    )
    rowwise = True  # bucketed by row count at a fixed last size (see the module docstring)
    distributions = ("normal", "wide", "small", "tails")
    variants = (
        Variant("blocked", "one program per BLOCK consecutive elements", _blocked_space, _blocked_build),
        Variant("multi_block", "ITEMS consecutive blocks per program in a software-pipelined loop",
                _multi_block_space, _multi_block_build),
        Variant("persistent", "PROGRAMS_PER_SM programs per SM walk the blocks with a grid-stride loop",
                _persistent_space, _persistent_build),
    )  # fmt: skip

    # ---- specs -----------------------------------------------------------------------------------
    def spec(self, shape: tuple[int, ...], dtype: str, **constants: Any) -> OpSpec:
        self._no_constants(constants)
        return self._spec(TensorSpec(tuple(int(s) for s in shape), dtype))

    def spec_for(self, *inputs: torch.Tensor, **constants: Any) -> OpSpec:
        self._no_constants(constants)
        if len(inputs) != 1 or not isinstance(inputs[0], torch.Tensor):
            raise UnsupportedWorkload(f"{self.name} takes one tensor, got {len(inputs)} inputs")
        (x,) = inputs
        if x.dtype not in _SUPPORTED_TORCH_DTYPES:
            raise UnsupportedWorkload(f"{self.name}: dtype {x.dtype} is not supported")
        return self._spec(TensorSpec.of(x))

    def _no_constants(self, constants: dict[str, Any]) -> None:
        # ``approximate`` is accepted when it names this family's own formula (a recognizer
        # may pass F.gelu's keyword through); the other formula is the other family.
        approximate = constants.pop("approximate", self.approximate)
        if approximate != self.approximate:
            raise UnsupportedWorkload(
                f"{self.name} computes approximate={self.approximate!r}, not {approximate!r}")
        if constants:
            raise UnsupportedWorkload(f"{self.name}: unknown constants {sorted(constants)}")

    def _spec(self, x: TensorSpec) -> OpSpec:
        if not x.shape:
            raise UnsupportedWorkload(f"{self.name}: x must have at least one dimension")
        if x.numel == 0:
            raise UnsupportedWorkload(f"{self.name}: x {x} is empty")
        spec = OpSpec(self.name, (x,), {})
        self.check_supported(spec)
        return spec

    def validation_specs(self, spec: OpSpec) -> list[OpSpec]:
        """The target, 1, 7 and an odd number of rows of its width, and a 1-D odd tail."""
        x = spec.inputs[0]
        shapes = [*row_tail_shapes(x.shape), (ODD_TAIL,)]
        return [spec] + [OpSpec(spec.op, (x.with_shape(s),), {}) for s in shapes if s != x.shape]

    # ---- math ------------------------------------------------------------------------------------
    def reference(self, spec: OpSpec, inputs: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        return (torch.nn.functional.gelu(inputs[0], approximate=self.approximate),)

    def reference_fp64(self, spec: OpSpec, inputs: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        return (torch.nn.functional.gelu(inputs[0].double(), approximate=self.approximate),)

    def make_inputs(
        self,
        spec: OpSpec,
        seed: int,
        distribution: str = "normal",
        device: str | torch.device = "cuda",
    ) -> tuple[torch.Tensor, ...]:
        """x drawn in float32 on ``device`` and rounded to the dtype.

        - ``normal``: N(0, 1), where GELU bends;
        - ``wide``: 8 * N(0, 1): mostly the saturated regions, where y is about x or about 0;
        - ``small``: 1e-3 * N(0, 1): y is about x / 2, checked relative to a tiny scale;
        - ``tails``: +-(10 + 2 * N(0, 1)), a random sign each: erf and tanh are +-1 to float32
          precision there, exp(-|z|) underflows, and the tanh form's cube reaches thousands.
        """
        x_spec = spec.inputs[0]
        x = draw(self.name, distribution, x_spec.shape, seed, device, self.distributions)
        return (x.to(x_spec.torch_dtype),)

    def flops(self, spec: OpSpec) -> int:
        # Exact: scale, erf, add, two multiplies. Tanh form: x^2, multiply-add, two multiplies,
        # |z|, exp, add, divide, select, multiply (a transcendental counts as one).
        return (10 if self.approximate == "tanh" else 5) * spec.inputs[0].numel


def draw(op: str, distribution: str, shape: tuple[int, ...], seed: int, device: str | torch.device,
         known: tuple[str, ...]) -> torch.Tensor:
    """A float32 tensor of ``shape`` from one of the activation distributions (see _Gelu)."""
    g = generator(seed, device)
    if distribution == "normal":
        return torch.randn(shape, generator=g, device=device)
    if distribution == "wide":
        return torch.randn(shape, generator=g, device=device) * 8
    if distribution == "small":
        return torch.randn(shape, generator=g, device=device) * 1e-3
    if distribution == "tails":
        magnitude = 10 + 2 * torch.randn(shape, generator=g, device=device)
        sign = torch.randint(0, 2, shape, generator=g, device=device) * 2 - 1
        return magnitude * sign
    raise ValueError(f"{op}: unknown distribution {distribution!r} (known: {', '.join(known)})")


class Gelu(_Gelu):
    name = "gelu"
    approximate = "none"
    summary = "GELU, exact: y = 0.5 * x * (1 + erf(x / sqrt(2))), elementwise (F.gelu)"


class GeluTanh(_Gelu):
    name = "gelu_tanh"
    approximate = "tanh"
    summary = ("GELU, tanh approximation: y = 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3))), "
               "elementwise (F.gelu(approximate='tanh'))")


GELU = Gelu()
GELU_TANH = GeluTanh()

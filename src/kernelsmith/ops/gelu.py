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
dozen flops each: it is bound by memory bandwidth, and the variants are the three flat schedules
of the elementwise skeleton (:mod:`kernelsmith.ops._elementwise`, which writes their 64-bit
offsets and masks, spaces and launchers), differing in how the flat array is cut into work for
programs: ``blocked`` (one program per ``BLOCK`` elements, 256 to 8192, with ``EVICT_X``, the
cache policy of the read-once input), ``multi_block`` (``ITEMS`` consecutive blocks a program in
a software-pipelined loop) and ``persistent`` (``PROGRAMS_PER_SM`` programs per multiprocessor
in a pipelined grid-stride loop). Each kernel here is the schedule's first line and a call of
``_gelu_block``, the math of one block. The exact form's spaces add ``FAST_ERF``.

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

from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import torch
import triton
import triton.language as tl

from kernelsmith.ops import _elementwise as skeleton
from kernelsmith.ops._base import Launcher, OpFamily, UnsupportedWorkload, Variant
from kernelsmith.ops._elementwise import (  # noqa: F401 (checked, multiprocessor_count: matmul and decode_* import them from here)
    DISTRIBUTIONS,
    ODD_TAIL,
    block_offsets,
    checked,
    draw,
    multiprocessor_count,
    row_tail_shapes,
    span_offsets,
)
from kernelsmith.space import Config, Param, Space
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
    """Exact-form GELU with erf from polynomials instead of libdevice's erff.

    For z = |x| / sqrt(2) and t = 1 / (1 + p z): erfc(z) = (a1 t + ... + a5 t^5) exp(-z^2)
    (Abramowitz & Stegun 7.1.26), with |error of erf| <= 1.5e-7 (float32 is 6e-8): one exp and a
    handful of multiply-adds, fewer instructions than erff. 1 + erf(x / sqrt(2)) is 2 - erfc(z)
    for x >= 0 and erfc(z) for x < 0, computed without cancellation.

    Near zero that form loses float32 accuracy: its polynomial's terms alternate in sign and add
    up to about 4.5 times the result, so rounding costs about 4.5 ulp (on the harness's "small"
    inputs, N(0, 1e-3), float32 validation failed about once in 500 draws). There, for
    |z| < 0.5, erf(z) = z P(z^2), the odd polynomial of Cephes' erff (relative error about 1e-9
    in exact arithmetic) has no cancellation, and neither has 1 + erf(z) >= 0.48 for negative x:
    at most about 2 ulp. Whether this is accurate enough for an output dtype, and faster, is for
    the harness and the search to say (the search parameter FAST_ERF).
    """
    z = tl.abs(x) * 0.7071067811865476
    t = 1.0 / (1.0 + 0.3275911 * z)
    poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))))
    erfc = poly * tl.exp(-z * z)
    away_from_zero = 0.5 * x * tl.where(x >= 0, 2.0 - erfc, erfc)
    zs = x * 0.7071067811865476  # signed: erf is odd
    z2 = zs * zs
    p = 7.853861353153693e-5 * z2 - 8.010193625184903e-4
    p = (p * z2 + 5.188327685732524e-3) * z2 - 2.685381193529856e-2
    p = ((p * z2 + 1.128358514861418e-1) * z2 - 3.761262582423300e-1) * z2 + 1.128379165726710
    near_zero = 0.5 * x * (1.0 + zs * p)
    return tl.where(z < 0.5, near_zero, away_from_zero)


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
# Kernels: the schedules are the elementwise skeleton's (kernelsmith.ops._elementwise); x and y
# are flat arrays of n elements (contiguous tensors viewed as 1-D).
# =================================================================================================


@triton.jit
def _gelu_block(x_ptr, y_ptr, offs, mask, APPROX: tl.constexpr, FAST_ERF: tl.constexpr, EVICT_X: tl.constexpr):
    """y = gelu(x) at the masked offsets of one block, in float32, rounded once on the store."""
    x = tl.load(x_ptr + offs, mask=mask, other=0.0, eviction_policy=EVICT_X).to(tl.float32)
    if FAST_ERF:  # noqa: SIM108 (a constexpr branch: one of the two is compiled)
        y = gelu_erf_poly_f32(x)
    else:
        y = gelu_f32(x, APPROX)
    tl.store(y_ptr + offs, y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _gelu_blocked_kernel(
    x_ptr, y_ptr, n,
    APPROX: tl.constexpr,  # False: exact erf form; True: tanh approximation
    FAST_ERF: tl.constexpr,  # exact form only: the polynomial erf (gelu_erf_poly_f32)
    BLOCK: tl.constexpr,  # elements per program
    EVICT_X: tl.constexpr,  # "" or "evict_first": x is read once, so it need not stay in L2
):
    """blocked: one program computes BLOCK consecutive elements."""
    offs, mask = block_offsets(tl.program_id(0), n, BLOCK)
    _gelu_block(x_ptr, y_ptr, offs, mask, APPROX, FAST_ERF, EVICT_X)


@triton.jit
def _gelu_multi_block_kernel(
    x_ptr, y_ptr, n,
    APPROX: tl.constexpr, FAST_ERF: tl.constexpr,
    BLOCK: tl.constexpr,  # elements per loop step
    ITEMS: tl.constexpr,  # consecutive blocks per program
    NUM_STAGES: tl.constexpr,  # software-pipelining depth of the block loop (1: none)
):
    """multi_block: one program computes ITEMS consecutive blocks, one per loop step."""
    start = tl.program_id(0).to(tl.int64) * (BLOCK * ITEMS)
    for i in tl.range(0, ITEMS, num_stages=NUM_STAGES):
        offs, mask = span_offsets(start + i * BLOCK, n, BLOCK)  # i * BLOCK < 2**16: start widens the sum
        _gelu_block(x_ptr, y_ptr, offs, mask, APPROX, FAST_ERF, "")


@triton.jit
def _gelu_persistent_kernel(
    x_ptr, y_ptr, n,
    n_blocks,  # cdiv(n, BLOCK)
    APPROX: tl.constexpr, FAST_ERF: tl.constexpr, BLOCK: tl.constexpr,
    NUM_STAGES: tl.constexpr,  # software-pipelining depth of the grid-stride loop (1: none)
):
    """persistent: program pid computes blocks pid, pid + programs, pid + 2 * programs, ..."""
    for block in tl.range(tl.program_id(0), n_blocks, tl.num_programs(0), num_stages=NUM_STAGES):
        offs, mask = block_offsets(block, n, BLOCK)
        _gelu_block(x_ptr, y_ptr, offs, mask, APPROX, FAST_ERF, "")


# =================================================================================================
# Spaces and launchers: the skeleton's schedules with the exact form's FAST_ERF
# =================================================================================================

# Elements a thread holds in the loop-free kernel: at least 4 (a 16-byte vector of float32, half
# of one in 16-bit dtypes), at most 32 (at 64, ptxas already spills the tanh form on sm_90).
PER_THREAD = (4, 32)


def _approx(spec: OpSpec) -> bool:
    return spec.op == "gelu_tanh"


def _erf_params(spec: OpSpec) -> list[Param]:
    """The exact form also searches how erf is computed (libdevice or the polynomial)."""
    return [] if _approx(spec) else [Param("FAST_ERF", (False, True))]


def _flat(inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    return inputs[0].view(-1), outputs[0].view(-1)


def _launcher(kernel: Any) -> Callable[[OpSpec, Config], Launcher]:
    """The launcher of ``kernel`` at a config: APPROX from the family; FAST_ERF from the exact
    form's config (the skeleton passes a config's parameters on), off for the tanh form, whose
    spaces have none."""
    return lambda spec, config: skeleton.flat_launcher(
        kernel, spec.inputs[0].numel, config, _flat, APPROX=_approx(spec), FAST_ERF=False)


def _variant(name: str, summary: str, space: Callable[[OpSpec], Space], kernel: Any) -> Variant:
    return skeleton.variant(__name__, name, summary, space, _launcher(kernel))


VARIANTS = (
    _variant("blocked", "one program per BLOCK consecutive elements",
             lambda spec: skeleton.blocked_space(PER_THREAD, "EVICT_X", _erf_params(spec)), _gelu_blocked_kernel),
    _variant("multi_block", "ITEMS consecutive blocks per program in a software-pipelined loop",
             lambda spec: skeleton.multi_block_space(_erf_params(spec)), _gelu_multi_block_kernel),
    _variant("persistent", "PROGRAMS_PER_SM programs per SM walk the blocks with a grid-stride loop",
             lambda spec: skeleton.persistent_space(spec.inputs[0].torch_dtype.itemsize, 1, extra=_erf_params(spec)),
             _gelu_persistent_kernel),
)  # fmt: skip


# =================================================================================================
# The op families
# =================================================================================================

_SUPPORTED_TORCH_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


class _Gelu(OpFamily):
    """The two GELU families; subclasses name the formula (``approximate``)."""

    approximate: ClassVar[str]
    shape_help = (
        "the shape of x (any rank; the op is elementwise): --shape 8192x14336 is 8192 tokens of "
        "14336 features; workloads are bucketed by the product of the leading sizes"
    )
    rowwise = True  # bucketed by row count at a fixed last size (see the module docstring)
    distributions = DISTRIBUTIONS
    variants = VARIANTS

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
        x = draw(self.name, distribution, x_spec.shape, seed, device)
        return (x.to(x_spec.torch_dtype),)

    def flops(self, spec: OpSpec) -> int:
        # Exact: scale, erf, add, two multiplies. Tanh form: x^2, multiply-add, two multiplies,
        # |z|, exp, add, divide, select, multiply (a transcendental counts as one).
        return (10 if self.approximate == "tanh" else 5) * spec.inputs[0].numel


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

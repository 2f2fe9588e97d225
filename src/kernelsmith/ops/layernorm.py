"""LayerNorm: ``y = (x - mean(x)) / sqrt(var(x) + eps) * weight + bias`` over the last dimension.

The op
------
Layer normalisation (Ba, Kiros & Hinton, 2016) is the normalisation of BERT, GPT-2, ViT and most
encoder models. For an input ``x`` of shape ``(..., N)``, every row ``r`` of ``N`` elements is
centred and scaled on its own:

    mean[r] = sum_j x[r, j] / N
    var[r]  = sum_j (x[r, j] - mean[r]) ** 2 / N          (the *biased* variance, as torch)
    rstd[r] = 1 / sqrt(var[r] + eps)
    y[r, j] = (x[r, j] - mean[r]) * rstd[r] * weight[j] + bias[j]

The elementwise affine part is optional, as in ``torch.nn.LayerNorm``: the spec's constant
``affine`` is ``"weight_bias"`` (inputs ``x, weight, bias``), ``"weight"`` (inputs ``x, weight``:
``elementwise_affine=True, bias=False``) or ``"none"`` (input ``x`` alone). A bias without a
weight is not a form torch's module produces and is not supported. ``weight`` and ``bias`` have
shape ``(N,)`` and x's dtype.

The reference is ``torch.nn.functional.layer_norm`` in the inputs' dtype (PyTorch computes the
statistics in float32 for float16 and bfloat16 and rounds the output once); the ground truth is
the same formula evaluated in float64. The kernels compute in float32 and round once, on the
store, so they are about as accurate as PyTorch.

Accuracy: no ``E[x^2] - E[x]^2``, and a shift by the mean of the row's first elements
--------------------------------------------------------------------------------------
The one-pass textbook variance ``E[x^2] - E[x]^2`` subtracts two nearly equal numbers when the
mean is large compared with the spread: for a row of mean 300 and standard deviation 1,
``E[x^2]`` is about 90001, whose float32 rounding error (about 0.004) is already a sizeable
fraction of the variance (1), and the error grows with the square of ``mean / std``. Every kernel
here instead sums squares of *centred* values, which are small, so no cancellation occurs:

- the register-resident kernels (``two_pass``, ``multi_row``, ``persistent``) hold the whole row,
  compute the mean, then the variance of ``x - mean`` (the classical two-pass algorithm);
- ``welford``, which streams the row in blocks, keeps Welford's running mean and ``M2`` (sum of
  squared deviations from the running mean) per lane and merges the lanes with Chan, Golub &
  LeVeque's formula, ``M2 = sum M2_j + sum n_j (mean_j - mean)^2``: same-signed terms only;
- ``split_row`` computes each chunk's two-pass statistics (count, mean, ``M2``) in registers and
  merges the chunks with the same formula.

That alone still leaves the centred values ``x - mean`` wrong by the rounding error of ``mean``
itself: half a float32 ulp of 300 is 1.5e-5, against a spread of 1. PyTorch's float32 result has
the same error, of a size that depends on how luckily its ``mean`` rounds; on a single row it is
sometimes almost exact, and a kernel whose mean rounds differently then fails a tolerance tied
to PyTorch's error. So every kernel first *shifts* the row, ``d = x - shift`` (the "shifted data"
algorithm), and computes ``mean(d)`` and the centred values ``d - mean(d)``; the row's mean is
``shift + mean(d)``, an unevaluated sum of two floats. The shift is the float32 mean of the row's
first 64 elements (``row_shift``; all of them in a narrower row): the same value in every program
of a row, known before any pass over it. For a row whose mean dwarfs its spread, ``x`` and the
shift are within a factor of two, so ``x - shift`` is exact (Sterbenz) and small, and the centred
values are accurate to float32 rounding of the *spread*, not of the mean; for rows centred near
zero the shift changes little. Why a mean and not simply the first element: an outlier there
(the ``spikes`` stress data puts elements of 1e3-3e4 in rows of unit spread) would move every
other element to near its value, and their rounding errors in ``x - x[0]``, an ulp of 1e4 each,
then outweigh the spread (on a 1 x 129 row this failed the tolerance about once in 200 draws); a
mean of 64 elements moves by only a 64th of the spike. The cost is a 64-element load and a
reduction a row, from cache lines loaded anyway.

``two_pass`` alone shifts by the first element after all, and pays for the outlier only when it
is one. In a program whose row spans every warp, row_shift's reduction is a third block-wide one
(shared memory and barriers) ahead of the mean's, and its load held back part of the row's loads
until it returned: compiled for sm_90 at 4096 x 8192 bfloat16, 3 more barriers and 40 more
instructions a row than a shift by ``x[0]``, and the H200 measured that tree 10% slower. So
two_pass shifts by ``x[0]`` (a scalar every thread loads), and when the first pass finds ``x[0]``
more than ``FAR_SHIFT`` (3) standard deviations from the mean, it shifts the row again by that
mean and recomputes the statistics (the row reloaded from cache): at most 3 float32 epsilons of
the spread in ``d`` on the common path, a small fraction of one after a spike.

The ``offset`` input distribution (rows of mean +-100..400, standard deviation 1) is there to
prove it: in float32 (and in float16 from a few hundred columns) the naive formula fails it (see
the tests); in bfloat16 the output's own rounding hides the difference.

The variants
------------
``two_pass``
    One program per row; the whole (power-of-two padded) row sits in registers, so ``x`` is read
    once: sum it for the mean, sum the squared centred values for the variance, normalise, store.
    The default for the usual hidden sizes (768 to 16384); rows wider than 16384 do not fit
    without spilling registers (``welford`` and ``split_row`` take them).
``welford``
    One program per row, two loops over column blocks of ``BLOCK_N``. The first computes the
    statistics in one pass: every lane ``j`` keeps a Welford running mean and ``M2`` of the
    values it has seen (columns ``j, j + BLOCK_N, j + 2 * BLOCK_N, ...``), and after the loop the
    ``BLOCK_N`` lanes are merged with Chan's formula. The second loop reads the row again (now
    mostly from L2), normalises and stores. For rows too wide for registers, and a contender
    where a whole row would need so many registers a thread that the compiler spills.
``multi_row``
    ``ROWS`` rows per program as one ``[ROWS, BLOCK_N]`` block, each row reduced along axis 1.
    For narrow rows (N of a few hundred) one row gives a program too little work to hide the
    memory latency; several rows per program fix that. The last program masks the rows past the
    end. The weight and bias are loaded once per block and broadcast over its rows.
``persistent``
    A fixed grid of ``PROGRAMS_PER_SM`` programs per multiprocessor; each loads the weight and
    bias once and walks rows ``pid, pid + programs, ...`` with the two-pass math, so that the
    program start-up and the parameter loads are paid once, and the compiler can pipeline the
    next row's load behind the current row's arithmetic (``num_stages``).
``aligned_row``
    ``two_pass`` on a row cut into a 16-byte-aligned body (vector loads and stores) and a short
    head and tail, for widths that are not a multiple of 16, whose rows Triton cannot prove
    aligned (see the row-wise skeleton's section on them).
``split_row``
    ``(row, chunk)`` programs and two launches (the skeleton's schedule): each chunk's count,
    mean and ``M2`` into a float32 scratch, then each chunk normalised with the row's statistics,
    the chunks' merged with Chan's formula in one fixed order (deterministic, no atomics; the
    kernels: :mod:`kernelsmith.ops._layernorm_split`). For rows of more than 8 KB: rows too wide
    for one program's registers, and few wide rows, where one program a row leaves most
    multiprocessors idle; it reads ``x`` twice (the second time from L2 on small workloads).

``num_stages`` is a parameter of the kernels with a loop (``welford``, ``persistent``) only: the
compiler software-pipelines loops, so the loop-free kernels would compile to the same code for
every value. The kernels with a loop pass it to ``tl.range`` as well as to the launch (Triton 3.6
leaves a loop without a matrix product unpipelined when it is only a launch option).

Conventions
-----------
All kernels load with masks (``other=0.0``), compute in float32, store in the output's dtype,
and compute row offsets in 64-bit integers so that tensors of more than 2**31 elements address
correctly. Padding lanes are excluded from the sums explicitly (``tl.where(mask, x - shift, 0)``:
a padded 0.0 minus the shift is not zero). The affine operands are selected by the
constexprs ``HAS_WEIGHT`` and ``HAS_BIAS``, so the ``"none"`` form loads nothing extra; an absent
operand's pointer argument is a placeholder (x) that is never dereferenced.

Towards a backward
------------------
The backward of LayerNorm needs each row's ``mean`` and ``rstd``. Every forward kernel can store
them (float32, one value a row) when its constexpr ``STORE_STATS`` is set; the forward op here
leaves it off (the branch compiles away). :func:`build_with_stats` builds any variant's launcher
that writes ``(y, mean, rstd)`` (shapes in :func:`stats_output_specs`), which is what a
training-mode forward family and the backward kernels will use.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import torch
import torch.nn.functional as F

from kernelsmith.ops import _layernorm_kernels, _layernorm_split
from kernelsmith.ops import _rowwise as skeleton
from kernelsmith.ops._base import Launcher, OpFamily, UnsupportedWorkload, Variant, check_eps, generator, rows_and_width
from kernelsmith.ops._layernorm_kernels import (
    _layernorm_aligned_row_kernel,
    _layernorm_multi_row_kernel,
    _layernorm_persistent_kernel,
    _layernorm_two_pass_kernel,
    _layernorm_welford_kernel,
)
from kernelsmith.space import Config, Constraint, Space, next_power_of_two
from kernelsmith.spec import OpSpec, TensorSpec, dtype_name

DEFAULT_EPS = 1e-5  # torch.nn.LayerNorm's default
AFFINE = ("weight_bias", "weight", "none")  # which of weight and bias the op applies
AFFINE_PARAMS = {"weight_bias": 2, "weight": 1, "none": 0}  # how many parameter tensors follow x

# The kernels are in kernelsmith.ops._layernorm_kernels, split_row's in kernelsmith.ops._layernorm_split
# (imported as a module: the other variants' source hashes do not cover it).


# =================================================================================================
# Spaces and launchers (the row-wise skeleton's: kernelsmith.ops._rowwise)
#
# LayerNorm's register rule is skeleton.LAYERNORM_WARPS: at most 64 values a thread, within each
# thread's share of the multiprocessor's registers (64 a thread up to 8 warps, 32 at 16, 16 at
# 32), so a row stays in registers up to 16384 wide. Launchers write into the caller's outputs,
# (y,) or, with save_stats, (y, mean, rstd).
# =================================================================================================

_WHOLE_ROW_MAX_BLOCK = 16384  # widest row kept in registers (16 values a thread at 32 warps)


def _has_weight_and_bias(spec: OpSpec) -> tuple[bool, bool]:
    affine = spec.const("affine")
    return affine != "none", affine == "weight_bias"


def _two_pass_space(spec: OpSpec) -> Space:
    return skeleton.whole_row_space(spec, skeleton.LAYERNORM_WARPS, max_row=_WHOLE_ROW_MAX_BLOCK)


def _welford_space(spec: OpSpec) -> Space:
    itemsize = spec.inputs[0].torch_dtype.itemsize

    def held(c: Config) -> int:
        # Registers: a running mean and M2 a lane, plus what the software pipeline keeps live for
        # its num_stages - 1 blocks in flight, itemsize bytes a lane each, in 8-byte units
        # (measured for sm_90: only float32 at 3 stages spills without that third value a lane).
        return int(c["BLOCK_N"] * (2 + (c["num_stages"] - 1) * itemsize // 8))

    return skeleton.looped_space(spec, skeleton.LAYERNORM_WARPS, held=held)


def _multi_row_space(spec: OpSpec) -> Space:
    block_n = next_power_of_two(rows_and_width(spec)[1])
    half = skeleton.MAX_MULTI_ROW_BLOCK // 2
    # Threads also keep per-row values (shift, mean, rstd, row offset) for the rows they cover,
    # many of them in a 32-row block: measured for sm_90, [32, 512] blocks spill at 16 and 32
    # warps where [16, 1024] and [2, 8192] do not.
    tall = Constraint(f"a 32-row block holds at most {half} elements",
                      lambda c: c["ROWS"] < 32 or c["ROWS"] * block_n <= half)
    return skeleton.multi_row_space(spec, skeleton.LAYERNORM_WARPS, extra=[tall])


def _persistent_space(spec: OpSpec) -> Space:
    block_n = next_power_of_two(rows_and_width(spec)[1])
    # Registers: the row, plus the weight and the bias, which stay loaded for the whole program.
    # Those cost about half a register an element (measured for sm_90: BLOCK_N = 8192 with both,
    # float32, takes 56 registers at 32 warps and 94 at 16; the compiler rematerialises them).
    held = block_n + block_n * sum(_has_weight_and_bias(spec)) // 2
    return skeleton.persistent_space(spec, skeleton.LAYERNORM_WARPS, in_registers=1, pipelined=1,
                                     max_row=_WHOLE_ROW_MAX_BLOCK, held=held)


def _aligned_row_space(spec: OpSpec) -> Space:
    return skeleton.aligned_row_space(spec, skeleton.LAYERNORM_WARPS, max_row=_WHOLE_ROW_MAX_BLOCK)


def _split_row_space(spec: OpSpec) -> Space:
    # A chunk of BLOCK_N body elements in registers (and the 2 * ALIGN edge lanes: a few more).
    return skeleton.split_row_space(spec, skeleton.LAYERNORM_WARPS)


# variant -> its kernel, its space, and whether the kernel takes NUM_STAGES (it has a loop).
_KERNELS: dict[str, tuple[Any, Callable[[OpSpec], Space], bool]] = {
    "two_pass": (_layernorm_two_pass_kernel, _two_pass_space, False),
    "welford": (_layernorm_welford_kernel, _welford_space, True),
    "multi_row": (_layernorm_multi_row_kernel, _multi_row_space, False),
    "persistent": (_layernorm_persistent_kernel, _persistent_space, True),
    "aligned_row": (_layernorm_aligned_row_kernel, _aligned_row_space, False),
}


def _space_of(variant: str) -> Callable[[OpSpec], Space]:
    return _split_row_space if variant == "split_row" else _KERNELS[variant][1]


def _split_row_launcher(spec: OpSpec, config: Config, save_stats: bool) -> Launcher:
    """split_row's two launches (the skeleton's launcher), with a (rows, chunks, 3) scratch."""
    skeleton.checked("layernorm", _split_row_space(spec), config)
    has_weight, has_bias = _has_weight_and_bias(spec)

    def apply_tensors(inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor],
                      partial: torch.Tensor) -> tuple[torch.Tensor, ...]:
        # (x, weight, bias, y, mean, rstd, partial), placeholders (x, y) for what the op lacks.
        x, y = inputs[0], outputs[0]
        w = inputs[1] if has_weight else x
        b = inputs[2] if has_bias else x
        mean, rstd = (outputs[1], outputs[2]) if save_stats else (y, y)
        return x, w, b, y, mean, rstd, partial

    stats = skeleton.SplitKernel(_layernorm_split._layernorm_split_stats_kernel,
                                 lambda inputs, outputs, partial: (inputs[0], partial))
    apply = skeleton.SplitKernel(_layernorm_split._layernorm_split_apply_kernel, apply_tensors, skeleton.eps_of(spec),
                                 (("HAS_WEIGHT", has_weight), ("HAS_BIAS", has_bias), ("STORE_STATS", save_stats)))
    return skeleton.split_row_launcher(spec, config, stats, apply, n_stats=_layernorm_split.N_STATS)


def _launcher(variant: str, spec: OpSpec, config: Config, save_stats: bool) -> Launcher:
    if variant == "split_row":
        return _split_row_launcher(spec, config, save_stats)
    kernel, space, pipelined = _KERNELS[variant]
    skeleton.checked("layernorm", space(spec), config)
    has_weight, has_bias = _has_weight_and_bias(spec)

    def operands(inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        # (x, weight, bias, y, mean, rstd), with placeholders (x, y) for what the op lacks.
        x, y = inputs[0], outputs[0]
        w = inputs[1] if len(inputs) > 1 else x
        b = inputs[2] if has_bias else x
        mean, rstd = (outputs[1], outputs[2]) if save_stats else (y, y)
        return x, w, b, y, mean, rstd

    # aligned_row addresses rows from N (no row strides) and takes ALIGN.
    aligned = {"ALIGN": skeleton.alignment(spec)} if variant == "aligned_row" else {}
    return skeleton.launcher(kernel, spec, config, strides=0 if aligned else 2, scalars=skeleton.eps_of(spec),
                             pipelined=pipelined, operands=operands, HAS_WEIGHT=has_weight, HAS_BIAS=has_bias,
                             STORE_STATS=save_stats, **aligned)


def _variant(name: str, summary: str) -> Variant:
    def build(spec: OpSpec, config: Config) -> Launcher:
        return _launcher(name, spec, config, save_stats=False)

    # The source hash covers the kernels' module and the skeleton's as well as this one (and
    # split_row's own kernels' module, which calls the other's jitted helpers).
    split = (_layernorm_split.__name__,) if name == "split_row" else ()
    return Variant(name, summary, _space_of(name), build,
                   modules=(skeleton.__name__, _layernorm_kernels.__name__, *split))


# ---- with statistics (for a training forward and the backward) -----------------------------------


def stats_output_specs(spec: OpSpec) -> tuple[TensorSpec, ...]:
    """The outputs of a forward that saves statistics: y like x, then mean and rstd, float32,
    one value a row (shaped like x's leading dimensions; ``()`` for a 1-D x)."""
    x = spec.inputs[0]
    return (TensorSpec(x.shape, x.dtype), TensorSpec(x.shape[:-1], "float32"), TensorSpec(x.shape[:-1], "float32"))


def build_with_stats(variant: str, spec: OpSpec, config: Config) -> Launcher:
    """The launcher of ``variant`` that also writes each row's mean and rstd: it takes the
    outputs ``(y, mean, rstd)`` of :func:`stats_output_specs` (contiguous)."""
    known = (*_KERNELS, "split_row")
    if variant not in known:
        raise KeyError(f"layernorm has no variant {variant!r} (known: {sorted(known)})")
    return _launcher(variant, spec, config, save_stats=True)


# =================================================================================================
# The op family
# =================================================================================================

_SUPPORTED_TORCH_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


class LayerNormSpecs(OpFamily):
    """The command-line spec of LayerNorm and of its backward: ``activations`` tensors of the
    shape (x; dy and x for the backward), then the parameters the constant ``affine`` names, of
    the last size, all of one dtype; the constants ``eps`` and ``affine``."""

    activations: ClassVar[int] = 1

    def spec(self, shape: tuple[int, ...], dtype: str, eps: float = DEFAULT_EPS, affine: str = "weight_bias",
             **constants: Any) -> OpSpec:
        shape = skeleton.command_line_shape(self.name, shape, constants)
        affine = _check_affine(affine)
        name = dtype_name(dtype)
        params = (TensorSpec((shape[-1],), name),) * AFFINE_PARAMS[affine]
        inputs = (TensorSpec(shape, name),) * self.activations + params
        spec = OpSpec(self.name, inputs, {"eps": check_eps(self.name, eps), "affine": affine})
        self.check_supported(spec)
        return spec


class LayerNorm(LayerNormSpecs):
    name = "layernorm"
    summary = "layer normalisation over the last dimension, (x - mean) / sqrt(var + eps) * weight + bias"
    backward = "layernorm_backward"  # (dy, x[, weight[, bias]]) -> (dx[, dw[, db]])
    shape_help = (
        "the shape of x, e.g. 8192x4096 for x of shape (8192, 4096) (rows x hidden size); weight and "
        "bias have the last size, (4096,); more leading sizes are allowed (2x1024x4096)"
    )
    rowwise = True  # configs depend on the row width only: calls are bucketed by row count
    row_block = max(skeleton.ROWS_PER_PROGRAM)
    distributions = ("normal", "uniform", "offset", "small")  # (the tolerance is OpFamily's default)
    variants = (
        _variant("two_pass", "one program per row, the whole row in registers: mean, then variance of the centred row"),
        _variant("welford", "one program per row, a Welford pass over column blocks for the statistics, then a "
                 "normalising pass (wide rows)"),
        _variant("multi_row", "ROWS rows per program as one [ROWS, BLOCK_N] block (narrow rows)"),
        _variant("persistent",
                 "whole rows in registers, a fixed grid of programs striding over the rows, parameters loaded once"),
        _variant("aligned_row", "two_pass with each row's 16-byte-aligned body apart from its head and tail, for "
                 "widths whose rows Triton cannot prove aligned"),
        _variant("split_row", "(row, chunk) programs: chunk counts, means and M2, then each chunk normalised with "
                 "the row's merged statistics; for wide rows and few rows"),
    )

    # ---- specs (spec: LayerNormSpecs') ------------------------------------------------------------
    def spec_for(
        self,
        *inputs: torch.Tensor | None,
        weight: torch.Tensor | None = None,
        bias: torch.Tensor | None = None,
        eps: float = DEFAULT_EPS,
        affine: str | None = None,
        **constants: Any,
    ) -> OpSpec:
        """The spec of ``x`` and the optional ``weight`` and ``bias``, given positionally (in
        that order, ``None`` for an absent one) or by keyword, as ``F.layer_norm`` takes them.
        ``affine``, when given, must agree with the tensors."""
        if constants:
            raise UnsupportedWorkload(f"layernorm: unknown constants {sorted(constants)}")
        if not 1 <= len(inputs) <= 3:
            raise UnsupportedWorkload(f"layernorm takes (x, weight, bias), not {len(inputs)} positional inputs")
        x, *params = inputs
        positional_weight, positional_bias = [*params, None, None][:2]
        if weight is not None and positional_weight is not None:
            raise UnsupportedWorkload("layernorm: weight given both positionally and by keyword")
        if bias is not None and positional_bias is not None:
            raise UnsupportedWorkload("layernorm: bias given both positionally and by keyword")
        weight = positional_weight if weight is None else weight
        bias = positional_bias if bias is None else bias
        if not isinstance(x, torch.Tensor):
            raise UnsupportedWorkload(f"layernorm: x must be a tensor, not {type(x).__name__}")
        if x.dim() < 1 or x.numel() == 0:
            raise UnsupportedWorkload(f"layernorm: x must be a non-empty tensor of at least 1 dimension, not {x.shape}")
        if x.dtype not in _SUPPORTED_TORCH_DTYPES:
            raise UnsupportedWorkload(f"layernorm: dtype {x.dtype} is not supported")
        if bias is not None and weight is None:
            raise UnsupportedWorkload("layernorm: a bias without a weight is not supported")
        n = x.shape[-1]
        for name, t in (("weight", weight), ("bias", bias)):
            if t is None:
                continue
            if not isinstance(t, torch.Tensor) or t.dim() != 1 or t.shape[0] != n:
                shape = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
                raise UnsupportedWorkload(f"layernorm: {name} must have shape ({n},), not {shape}")
            if t.dtype != x.dtype:
                raise UnsupportedWorkload(f"layernorm: x is {x.dtype} but {name} is {t.dtype}")
            if t.device != x.device:
                raise UnsupportedWorkload(f"layernorm: x is on {x.device} but {name} is on {t.device}")
        found = "none" if weight is None else "weight" if bias is None else "weight_bias"
        if affine is not None and _check_affine(affine) != found:
            raise UnsupportedWorkload(f"layernorm: affine={affine!r} but the inputs are those of {found!r}")
        tensors = [t for t in (x, weight, bias) if t is not None]
        constants = {"eps": check_eps(self.name, eps), "affine": found}
        spec = OpSpec(self.name, tuple(TensorSpec.of(t) for t in tensors), constants)
        self.check_supported(spec)
        return spec

    # ---- math ------------------------------------------------------------------------------------
    def reference(self, spec: OpSpec, inputs: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        """``F.layer_norm`` in the inputs' dtype: the eager baseline."""
        x, weight, bias = _unpack(spec, inputs)
        return (F.layer_norm(x, (x.shape[-1],), weight, bias, float(spec.const("eps"))),)

    def reference_fp64(self, spec: OpSpec, inputs: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        """The defining formula in float64 (two-pass: the variance of the centred values)."""
        x, weight, bias = _unpack(spec, inputs)
        xd = x.double()
        xc = xd - xd.mean(-1, keepdim=True)
        y = xc * torch.rsqrt(xc.pow(2).mean(-1, keepdim=True) + float(spec.const("eps")))
        if weight is not None:
            y = y * weight.double()
        if bias is not None:
            y = y + bias.double()
        return (y,)

    def make_inputs(
        self,
        spec: OpSpec,
        seed: int,
        distribution: str = "normal",
        device: str | torch.device = "cuda",
    ) -> tuple[torch.Tensor, ...]:
        """x drawn from ``distribution``; weight = 1 + 0.5 * N(0, 1) and bias = 0.5 * N(0, 1) when
        the op has them. Drawn in float32 on ``device``, deterministic in ``seed``, then rounded.

        - ``normal``: N(0, 1);
        - ``uniform``: U(-1, 1);
        - ``offset``: N(0, 1) plus a per-row offset of magnitude 100 to 400 (either sign): the
          mean dwarfs the spread, so a variance computed as ``E[x^2] - E[x]^2`` cancels
          catastrophically (every value stays well inside float16's range);
        - ``small``: 1e-3 * N(0, 1): the variance (1e-6) is below the default eps (1e-5), so eps
          must be added in the right place.
        """
        x_spec = spec.inputs[0]
        shape, n = x_spec.shape, x_spec.shape[-1]
        g = generator(seed, device)

        def randn(size: tuple[int, ...]) -> torch.Tensor:
            return torch.randn(size, generator=g, device=device, dtype=torch.float32)

        if distribution == "normal":
            x = randn(shape)
        elif distribution == "uniform":
            x = torch.rand(shape, generator=g, device=device, dtype=torch.float32) * 2 - 1
        elif distribution == "offset":
            rows = math.prod(shape[:-1])
            size = 100 + 300 * torch.rand((rows, 1), generator=g, device=device, dtype=torch.float32)
            sign = torch.where(torch.rand((rows, 1), generator=g, device=device) < 0.5, -1.0, 1.0)
            x = (randn((rows, n)) + sign * size).view(shape)
        elif distribution == "small":
            x = randn(shape) * 1e-3
        else:
            known = ", ".join(self.distributions)
            raise ValueError(f"layernorm: unknown distribution {distribution!r} (known: {known})")
        dtype = x_spec.torch_dtype
        tensors = [x.to(dtype)]
        has_weight, has_bias = _has_weight_and_bias(spec)
        if has_weight:
            tensors.append((1 + 0.5 * randn((n,))).to(dtype))
        if has_bias:
            tensors.append((0.5 * randn((n,))).to(dtype))
        return tuple(tensors)

    def flops(self, spec: OpSpec) -> int:
        # Per element: add to the sum, subtract the mean, square and add to the sum of squares,
        # multiply by rstd; then multiply by the weight and add the bias when present.
        has_weight, has_bias = _has_weight_and_bias(spec)
        return (5 + has_weight + has_bias) * spec.inputs[0].numel


_Unpacked = tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]


def _unpack(spec: OpSpec, inputs: Sequence[torch.Tensor]) -> _Unpacked:
    """(x, weight or None, bias or None) from the spec's inputs."""
    has_weight, has_bias = _has_weight_and_bias(spec)
    return inputs[0], inputs[1] if has_weight else None, inputs[2] if has_bias else None




def _check_affine(affine: Any) -> str:
    if affine not in AFFINE:
        raise UnsupportedWorkload(f"layernorm: affine must be one of {AFFINE}, not {affine!r}")
    return str(affine)


OP = LayerNorm()

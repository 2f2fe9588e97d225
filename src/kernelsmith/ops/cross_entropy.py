"""Cross-entropy of logits against class-index targets: ``F.cross_entropy(logits, target)``.

The op
------
Inputs: ``logits`` of shape ``(R, V)`` (R rows, typically tokens, over a vocabulary of V classes)
in float16, bfloat16 or float32, and ``target`` of shape ``(R,)`` in int64. Constants:
``reduction`` ("mean", "sum" or "none"; default "mean"), ``ignore_index`` (default -100) and
``label_smoothing`` (``eps`` below, in [0, 1]; default 0). The output is float32 whatever the
logits' dtype (the math of training code, which upcasts the logits before the loss): a 0-d tensor
for "mean" and "sum", a ``(R,)`` tensor of per-row losses for "none".

The reference is ``F.cross_entropy(logits.float(), target, ...)``, the fp32-upcast form language
model training code uses; it is the baseline to beat and the yardstick of the tolerance. The
float64 ground truth is the same call on ``logits.double()``.

The math
--------
For a row ``x`` (V logits) with target ``t``, torch's loss with label smoothing is

    loss = (1 - eps) * (lse - x[t]) + eps * (lse - mean_j x[j]),   lse = log sum_j exp(x[j])

(``(1 - eps) * nll + eps / V * sum_j -log_softmax(x)[j]``, which is the same thing). Every kernel
computes it from the row maximum ``m`` and ``s = sum_j exp(x[j] - m)`` (so ``lse = m + log(s)``,
and nothing overflows: the "large" inputs overflow ``exp`` in float32 without the shift) as

    loss = log(s) + (1 - eps) * (m - x[t]) + eps * (m - mean_j x[j])

a sum of three non-negative terms: no cancellation, whatever the size of the logits. ``x[t]`` is
read with one scalar load per row (cheaper than a compare-and-select on every element), and
``sum_j x[j]`` is only accumulated when ``eps > 0`` (a compile-time switch, ``SMOOTH``).

Rows whose target equals ``ignore_index`` contribute 0 (their "none" loss is 0) and are not
counted: "mean" is the sum of the losses over the number of non-ignored rows, NaN when every row
is ignored, exactly as torch. (With label smoothing torch divides both of its terms by that same
count, so the formula above holds row by row.) The kernels do not even read an ignored row's
logits: their loops run zero times, their loads are masked off. A target outside ``[0, V)`` that
is not ``ignore_index`` makes that row's loss NaN (torch raises an error instead); no kernel ever
reads outside the row.

All arithmetic is in float32 whatever the storage dtype. The final "mean"/"sum" over rows is a
single program (a separate, tiny kernel, or split_vocab's combine program when one covers every
row) that adds the per-row losses in a fixed order, in float64, and rounds once: deterministic bit
for bit (no atomics), and as accurate as it can be.

The variants
------------
``online_row``
    One program per row walks the vocabulary in ``BLOCK_V``-wide steps, keeping a running max and
    a running sum of exponentials (rescaled when the max grows: the online softmax of Milakov &
    Gimelshein, 2018). Reads the logits exactly once; any vocabulary size. Per-row losses go to
    the output ("none") or to a float32 scratch that the reduction kernel sums.
``split_vocab``
    For few rows and a huge vocabulary, where one program per row leaves most of the GPU idle:
    phase 1 runs a ``(R, chunks)`` grid, each program reducing one chunk of ``~V / SPLITS``
    columns of one row to its max, its sum of exponentials (and its sum of logits when
    smoothing), written to a float32 scratch; phase 2 combines a row's chunks (rescaling each
    chunk's sum to the row's max) into the loss. When one phase-2 program covers every row (the
    few-rows case this variant is for), it also does the "mean"/"sum" reduction: two launches.
``whole_row``
    One program per row with the whole (power-of-two padded) row in registers: one load, a max,
    a sum. Only for ``V <= 65536`` (the space is empty beyond).

Extending to the backward pass (the gradient computed in the forward) fits this structure: the
gradient row is ``softmax(x) - onehot(t)`` (smoothed) scaled by the reduction's factor (for
"mean", one over the number of non-ignored rows: a pass over the targets first), which a second
pass over the row (``online_row``, ``split_vocab`` phase 3) or the registers already holding the
row (``whole_row``) can write once ``m`` and ``s`` are known (:mod:`kernelsmith.ops.cross_entropy_backward`
does).

Layout: this module is the family (specs, constants, references, inputs); the kernels are in
:mod:`kernelsmith.ops._cross_entropy_kernels`, the spaces and launchers in
:mod:`kernelsmith.ops._cross_entropy_launch`, both shared with the backward and the fused op.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from kernelsmith.ops._base import OpFamily, UnsupportedWorkload, Variant, generator, tail_rows
from kernelsmith.ops._cross_entropy_launch import (
    FORWARD_NAME,
    _constants,
    _online_row_build,
    _online_row_space,
    _split_vocab_build,
    _split_vocab_space,
    _whole_row_build,
    _whole_row_space,
)
from kernelsmith.spec import OpSpec, TensorSpec, dtype_name

REDUCTIONS = ("mean", "sum", "none")
DEFAULT_IGNORE_INDEX = -100
# Where the variants' code lives (kernelsmith.ops._cross_entropy_kernels, the launchers' module
# and this one): each variant's source hash covers all three (Variant.modules).
_MODULES = ("kernelsmith.ops._cross_entropy_kernels", __name__)

# =================================================================================================
# The op family (the kernels are in _cross_entropy_kernels.py, the spaces and launchers in
# _cross_entropy_launch.py)
# =================================================================================================

_LOGIT_TORCH_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
# F.cross_entropy's other keywords, accepted only at their defaults.
_DEFAULT_ONLY = ("weight", "size_average", "reduce")


def _checked_constants(
    reduction: Any = "mean",
    ignore_index: Any = DEFAULT_IGNORE_INDEX,
    label_smoothing: Any = 0.0,
    **others: Any,
) -> dict[str, Any]:
    """The spec's constants, validated and normalised (an int, a float, a known reduction)."""
    unknown = sorted(k for k in others if k not in _DEFAULT_ONLY)
    if unknown:
        raise UnsupportedWorkload(f"cross_entropy: unknown constants {unknown}")
    given = sorted(k for k, v in others.items() if v is not None)
    if given:
        raise UnsupportedWorkload(f"cross_entropy: {', '.join(given)} is not supported (only None)")
    if not isinstance(reduction, str) or reduction not in REDUCTIONS:
        raise UnsupportedWorkload(f"cross_entropy: reduction must be one of {REDUCTIONS}, not {reduction!r}")
    if isinstance(ignore_index, bool) or not isinstance(ignore_index, int):
        raise UnsupportedWorkload(f"cross_entropy: ignore_index must be an int, not {ignore_index!r}")
    if not -(2**63) <= ignore_index < 2**63:
        raise UnsupportedWorkload(f"cross_entropy: ignore_index {ignore_index} is not an int64")
    if isinstance(label_smoothing, bool) or not isinstance(label_smoothing, int | float):
        raise UnsupportedWorkload(f"cross_entropy: label_smoothing must be a number, not {label_smoothing!r}")
    smoothing = float(label_smoothing)
    if not 0.0 <= smoothing <= 1.0:  # (NaN fails this too)
        raise UnsupportedWorkload(f"cross_entropy: label_smoothing must be in [0, 1], not {label_smoothing!r}")
    return {"reduction": reduction, "ignore_index": int(ignore_index), "label_smoothing": smoothing}


class CrossEntropy(OpFamily):
    name = FORWARD_NAME
    summary = "cross-entropy of (R, V) logits against (R,) int64 class targets, float32 loss (F.cross_entropy)"
    shape_help = (
        "the shape of the logits, rows x vocabulary: --shape 8192x128256 is 8192 tokens over a "
        "128256-class vocabulary; the targets are (8192,) int64, the loss float32"
    )
    distributions = ("normal", "large", "peaked")
    backward = "cross_entropy_backward"  # the gradient of the logits, tuned as its own workload
    variants = (
        Variant(
            "online_row",
            "one program per row, walked in BLOCK_V-column steps with a running max and sum (any vocabulary)",
            _online_row_space,
            _online_row_build,
            _MODULES,
        ),
        Variant(
            "split_vocab",
            "rows split into SPLITS vocabulary chunks reduced in parallel, then combined (few rows, huge vocabulary)",
            _split_vocab_space,
            _split_vocab_build,
            _MODULES,
        ),
        Variant(
            "whole_row",
            "one program per row, the whole row in registers (vocabulary up to 65536)",
            _whole_row_space,
            _whole_row_build,
            _MODULES,
        ),
    )

    # ---- specs -----------------------------------------------------------------------------------
    def spec(self, shape: tuple[int, ...], dtype: str, **constants: Any) -> OpSpec:
        shape = tuple(int(s) for s in shape)
        if len(shape) != 2:
            raise UnsupportedWorkload(f"cross_entropy: the logits must be 2-D (rows x vocabulary), not {shape}")
        logits = TensorSpec(shape, dtype_name(dtype))
        spec = OpSpec(self.name, (logits, TensorSpec((shape[0],), "int64")), _checked_constants(**constants))
        self.check_supported(spec)
        return spec

    def spec_for(self, *inputs: torch.Tensor, **constants: Any) -> OpSpec:
        if len(inputs) != 2 or not all(isinstance(t, torch.Tensor) for t in inputs):
            raise UnsupportedWorkload(f"cross_entropy takes (logits, target) tensors, not {len(inputs)} inputs")
        logits, target = inputs
        if logits.dtype not in _LOGIT_TORCH_DTYPES:
            raise UnsupportedWorkload(f"cross_entropy: logits dtype {logits.dtype} is not supported")
        if target.dtype != torch.int64:
            raise UnsupportedWorkload(f"cross_entropy: targets must be int64 class indices, not {target.dtype}")
        spec = OpSpec(self.name, (TensorSpec.of(logits), TensorSpec.of(target)), _checked_constants(**constants))
        self.check_supported(spec)
        return spec

    def check_supported(self, spec: OpSpec) -> None:
        if len(spec.inputs) != 2:
            raise UnsupportedWorkload(f"cross_entropy takes (logits, target), not {len(spec.inputs)} inputs")
        logits, target = spec.inputs
        if logits.dtype not in self.dtypes:
            raise UnsupportedWorkload(f"cross_entropy: logits dtype {logits.dtype} is not supported")
        if target.dtype != "int64":
            raise UnsupportedWorkload(f"cross_entropy: targets must be int64, not {target.dtype}")
        if len(logits.shape) != 2:
            raise UnsupportedWorkload(f"cross_entropy: the logits must be 2-D (rows x vocabulary), not {logits}")
        rows, vocab = logits.shape
        if rows <= 0 or vocab <= 0:
            raise UnsupportedWorkload(f"cross_entropy: empty logits {logits} are not supported")
        if vocab >= 2**31:
            raise UnsupportedWorkload(f"cross_entropy: a vocabulary of {vocab} needs 64-bit column offsets")
        if target.shape != (rows,):
            raise UnsupportedWorkload(f"cross_entropy: targets {target} do not match {rows} rows of logits")
        for t in spec.inputs:
            if not t.is_contiguous:
                raise UnsupportedWorkload(f"cross_entropy: non-contiguous input {t} is not supported")
        _checked_constants(**dict(spec.constants))

    def output_specs(self, spec: OpSpec) -> tuple[TensorSpec, ...]:
        rows = spec.inputs[0].shape[0]
        shape = (rows,) if spec.const("reduction") == "none" else ()
        return (TensorSpec(shape, "float32"),)

    def validation_specs(self, spec: OpSpec) -> list[OpSpec]:
        """The target spec plus the base class's tail row counts (:func:`tail_rows`), the
        vocabulary unchanged; the targets follow the logits' row count (the base class would
        only reshape the logits)."""
        logits, target = spec.inputs
        rows, vocab = logits.shape
        tails = tail_rows(rows, self.row_block)
        specs = [spec]
        for r in tails:
            inputs = (logits.with_shape((r, vocab)), target.with_shape((r,)))
            specs.append(OpSpec(spec.op, inputs, dict(spec.constants)))
        return specs

    # ---- math ------------------------------------------------------------------------------------
    def _loss(self, spec: OpSpec, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        reduction, ignore_index, smoothing = _constants(spec)
        return torch.nn.functional.cross_entropy(
            logits, target, reduction=reduction, ignore_index=ignore_index, label_smoothing=smoothing
        )

    def reference(self, spec: OpSpec, inputs: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        """The training-code form: the logits upcast to float32, then ``F.cross_entropy``."""
        logits, target = inputs
        return (self._loss(spec, logits.float(), target),)

    def reference_fp64(self, spec: OpSpec, inputs: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        logits, target = inputs
        return (self._loss(spec, logits.double(), target),)

    def make_inputs(
        self,
        spec: OpSpec,
        seed: int,
        distribution: str = "normal",
        device: str | torch.device = "cuda",
    ) -> tuple[torch.Tensor, ...]:
        """Logits from ``distribution`` (drawn in float32, rounded to the dtype) and int64 targets
        uniform in ``[0, V)``, with about 10% of the rows (``int(R / 10 + 0.5)``, so never a lone
        row) set to ``ignore_index``; deterministic in ``seed``.

        - ``normal``: standard normal logits (an untrained model: the loss is about log V);
        - ``large``: ``N(0, 1) * 20 + 100``: ``exp`` overflows float32 (past 88.7) in every row at
          any width, so a kernel that skips the max subtraction fails; still finite in float16;
        - ``peaked``: standard normal plus ``30 + log(V)`` on one column of every row: the
          target's column on even rows, another on odd rows (a confident model, right or wrong:
          losses of about 0 and about ``30 + log(V)``).
        """
        logits_spec = spec.inputs[0]
        rows, vocab = logits_spec.shape
        ignore_index = int(spec.const("ignore_index"))
        g = generator(seed, device)
        x = torch.randn((rows, vocab), generator=g, device=device)
        target = torch.randint(0, vocab, (rows,), generator=g, device=device)
        if distribution == "large":
            x = x * 20 + 100
        elif distribution == "peaked":
            # The target's column on even rows, a random one on odd rows. Not a coin flip: with
            # only right rows, every loss would be ~1e-13 (0.0 in float32, for PyTorch too) and
            # the harness's canaries could not tell a zero output apart. Fewer rows are ignored
            # than are odd (or even), so any two rows keep both kinds.
            rows_index = torch.arange(rows, device=device)
            shift = torch.randint(1, max(vocab, 2), (rows,), generator=g, device=device)
            other = (target + shift) % vocab  # any column but the target's (when V > 1)
            hot = torch.where(rows_index % 2 == 0, target, other)
            # 30 + log(V) over the rest: a right row's loss (~V exp(-peak)) is then ~1e-13 at
            # any V, and rounds to 0 in float32 for every implementation alike.
            x[rows_index, hot] += 30.0 + math.log(vocab)
        elif distribution != "normal":
            known = ", ".join(self.distributions)
            raise ValueError(f"cross_entropy: unknown distribution {distribution!r} (known: {known})")
        ignored = torch.randperm(rows, generator=g, device=device)[: int(rows / 10 + 0.5)]
        target[ignored] = ignore_index
        return x.to(logits_spec.torch_dtype), target

    def bytes_moved(self, spec: OpSpec) -> int:
        """The logits and targets read once, the loss written once (the base class's model).

        It counts the logits of ignored rows too, which the kernels skip: on data with many
        ignored rows (padding) a kernel can move fewer bytes than this "minimum".
        """
        return super().bytes_moved(spec)

    def flops(self, spec: OpSpec) -> int:
        # Per logit: a max comparison, a subtraction, an exp, an add into the sum (and one more
        # add into the logit sum with label smoothing).
        per_element = 5 if float(spec.const("label_smoothing")) > 0 else 4
        return per_element * spec.inputs[0].numel


OP = CrossEntropy()

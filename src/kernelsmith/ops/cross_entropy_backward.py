"""Cross-entropy backward ``(dloss, logits, target) -> (dlogits,)``, and the fused training form
``(logits, target) -> (loss, dlogits)``: the gradients of :mod:`kernelsmith.ops.cross_entropy`.

The ops
-------
``cross_entropy_backward`` takes ``dloss``, the gradient of the forward's float32 output (0-d
for "mean" and "sum", ``(R,)`` for "none"), and the forward's inputs: ``logits`` of shape
``(R, V)`` in float16, bfloat16 or float32 and ``target`` of shape ``(R,)`` in int64. Its
constants are the forward's (``reduction``, ``ignore_index``, ``label_smoothing``). Its one
output is ``dlogits``, shaped like the logits and in their dtype; the integer targets have no
gradient.

``cross_entropy_fused`` takes the forward's inputs and constants and returns both the forward's
loss (float32, as :mod:`cross_entropy` computes it) and ``dlogits`` for an upstream gradient of
1: what a training step needs when the loss is the last node of its graph (as Liger-Kernel does:
the gradient is computed during the forward pass, from the statistics the loss needs anyway,
and the backward pass only scales it by the upstream gradient if that is not 1).

The math
--------
For a row ``x`` (V logits) with target ``t``, ``p = softmax(x)`` and label smoothing ``eps``,
the forward's row loss ``(1 - eps)(lse - x[t]) + eps (lse - mean_j x[j])`` has the gradient

    d loss / d x[j] = p[j] - (1 - eps) [j == t] - eps / V

(``d lse / d x[j] = p[j]``; the mean of the logits contributes ``1 / V`` to every column).
The chain rule multiplies it by the row's *scale*: ``dloss`` for "sum", ``dloss[row]`` for
"none", ``dloss / n_valid`` for "mean", where ``n_valid`` is the number of rows whose target is
not ``ignore_index`` (torch divides both of its terms by that count; see the forward). Ignored
rows get a zero gradient whatever ``dloss`` holds (torch's too, even for a NaN upstream
gradient). A target outside ``[0, V)`` that is not ``ignore_index`` makes its row NaN (torch
raises an error instead; the forward's loss is NaN for it too).

Each kernel computes ``p[j] = exp(x[j] - m) / s`` from the forward's row statistics: the row max
``m`` and ``s = sum_j exp(x[j] - m)`` (which never overflow), found in a first walk over the row
(:func:`kernelsmith.ops._cross_entropy_kernels._ce_online_stats`, the forward's) or with the
whole row in registers, then writes

    dlogits[j] = (exp(x[j] - m) / s - eps / V - [j == t] (1 - eps)) * scale

in float32, rounded once to the logits' dtype. The "mean" scale needs ``n_valid``, a count over
every row's target: a one-program kernel counts them (an integer sum: exact, the same on every
run) and writes ``dloss / n_valid`` to a float32 scratch scalar that the gradient kernels read.
When every row is ignored, no row uses the scale (torch's gradient is all zeros then too).

As in PyTorch, ``p[t] - 1`` cancels in float32 for a confident, right row (its true value is
far below float32's resolution at 1): both compute 0 or one float32 ulp there.

The fused op writes each row's loss too, from the same statistics (and ``x[t]``, and the sum of
the row's logits when smoothing), with the forward's own :func:`_ce_row_loss`; "mean" and "sum"
are then the forward's deterministic reduction kernel over those per-row losses.

References
----------
``reference`` is what a training step computes: PyTorch's autograd through the forward's
reference, ``F.cross_entropy(logits.float(), target, ...)``, fed ``dloss``: a float32 gradient
that the ``.float()`` node rounds to the logits' dtype. ``reference_fp64`` is the same autograd
on ``logits.double()`` (and ``dloss.double()``). The fused op's references return the forward's
reference loss and that gradient for ``dloss = 1``.

The variants (shared by both ops)
---------------------------------
``online_row``
    One program per row. Pass 1 walks the vocabulary in ``BLOCK_V``-wide steps for the online
    max and sum (and, fused, the loss); pass 2 walks it again and writes the gradient. Any
    vocabulary; reads the logits twice (the second read may hit in L2).
``split_vocab``
    For few rows and a huge vocabulary: a ``(R, chunks)`` grid reduces each chunk of
    ``~V / SPLITS`` columns to its max and sum (the forward's own phase-1 kernel);
    then a second ``(R, chunks)`` grid, each program first combining its row's chunk statistics
    (a few dozen numbers) and then writing its chunk of the gradient (chunk 0 also writes the
    fused loss). Two launches, plus the "mean" count (and the fused loss's reduction).
``whole_row``
    One program per row with the whole (power-of-two padded) row in registers: one read of the
    logits, one write of the gradient. Only for ``V <= 65536`` (the space is empty beyond).

The config spaces are the forward's spaces for the same logits: the same loops and blocks, the
same register and warp budgets.

Layout: this module is the two families (specs, references, inputs); the kernels of all three
cross-entropy ops are in :mod:`kernelsmith.ops._cross_entropy_kernels`, their spaces and
launchers in :mod:`kernelsmith.ops._cross_entropy_launch`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from kernelsmith.ops._base import FINITE_STRESS_DISTRIBUTIONS, OpFamily, UnsupportedWorkload, Variant, generator
from kernelsmith.ops._cross_entropy_launch import (
    BACKWARD_NAME,
    FUSED_NAME,
    _forward_spec,
    _grad_online_row_build,
    _grad_split_vocab_build,
    _grad_whole_row_build,
    _online_row_space,
    _split_vocab_space,
    _whole_row_space,
)
from kernelsmith.ops.cross_entropy import OP as _FORWARD
from kernelsmith.spec import OpSpec, TensorSpec

# Where the variants' code lives (kernelsmith.ops._cross_entropy_kernels, the launchers' module
# and this one): each variant's source hash covers all three (Variant.modules).
_MODULES = ("kernelsmith.ops._cross_entropy_kernels", __name__)


# =================================================================================================
# The op families (the kernels are in _cross_entropy_kernels.py, the spaces and launchers in
# _cross_entropy_launch.py)
# =================================================================================================

_VARIANTS = (
    Variant(
        "online_row",
        "one program per row: an online max/sum pass over BLOCK_V-column steps, then a gradient pass",
        _online_row_space,
        _grad_online_row_build,
        _MODULES,
    ),
    Variant(
        "split_vocab",
        "(row, chunk) programs: chunk statistics, then each chunk combines its row's and writes its gradient",
        _split_vocab_space,
        _grad_split_vocab_build,
        _MODULES,
    ),
    Variant(
        "whole_row",
        "one program per row, the whole row in registers: one read, one write (vocabulary up to 65536)",
        _whole_row_space,
        _grad_whole_row_build,
        _MODULES,
    ),
)


def _autograd(
    dloss: torch.Tensor | None,
    logits: torch.Tensor,
    target: torch.Tensor,
    constants: dict[str, Any],
    dtype: torch.dtype,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(loss, dlogits)``: ``F.cross_entropy(logits.to(dtype), target)`` and its gradient for the
    logits (in their own dtype) by autograd, fed ``dloss`` (None: ones, the fused op's)."""
    with torch.enable_grad():
        leaf = logits.detach().requires_grad_()
        loss = torch.nn.functional.cross_entropy(
            leaf.to(dtype), target, reduction=constants["reduction"], ignore_index=constants["ignore_index"],
            label_smoothing=constants["label_smoothing"],
        )  # fmt: skip
        upstream = torch.ones_like(loss) if dloss is None else dloss.detach().to(dtype)
        (dlogits,) = torch.autograd.grad(loss, leaf, upstream)
    return loss.detach(), dlogits.detach()


# How both ops' --shape reads: the forward's logits (each op's shape_help goes on to its tensors).
_LOGITS_SHAPE_HELP = (
    "the shape of the logits, rows x vocabulary: --shape 8192x128256 is 8192 tokens over a 128256-class vocabulary; "
)


class _CrossEntropyGradient(OpFamily):
    """What the backward and the fused op share: the forward's distributions, spaces, kernels,
    and specs made from the forward's (:meth:`_from_forward`: the logits and targets, with or
    without a dloss in front)."""

    distributions = _FORWARD.distributions
    stress_distributions = FINITE_STRESS_DISTRIBUTIONS  # no nonfinite: see kernelsmith.ops._base
    variants = _VARIANTS

    def _from_forward(self, forward: OpSpec) -> OpSpec:
        """This op's spec for the forward's spec of the same logits, targets and constants."""
        raise NotImplementedError

    def spec(self, shape: tuple[int, ...], dtype: str, **constants: Any) -> OpSpec:
        return self._from_forward(_FORWARD.spec(shape, dtype, **constants))

    def validation_specs(self, spec: OpSpec) -> list[OpSpec]:
        """The forward's tails (1, 7 and an odd row count, the vocabulary unchanged), as this op's
        specs (dloss following the row count for "none")."""
        return [self._from_forward(s) for s in _FORWARD.validation_specs(_forward_spec(spec))]

    def _logits_spec(self, spec: OpSpec) -> TensorSpec:
        return spec.inputs[-2]

    def stressed_inputs(self, spec: OpSpec) -> tuple[int, ...]:
        """The stress data goes into the logits (second to last), not the upstream gradient."""
        return (len(spec.inputs) - 2,)


class CrossEntropyBackward(_CrossEntropyGradient):
    name = BACKWARD_NAME
    summary = "gradient dlogits of cross-entropy given dloss, the (R, V) logits and (R,) int64 targets"
    shape_help = _LOGITS_SHAPE_HELP + "dloss is 0-d float32 ((8192,) with reduction=none), dlogits is like the logits"

    # ---- specs -----------------------------------------------------------------------------------
    def _from_forward(self, forward: OpSpec) -> OpSpec:
        rows = forward.inputs[0].shape[0]
        dloss = TensorSpec((rows,) if forward.const("reduction") == "none" else (), "float32")
        spec = OpSpec(self.name, (dloss, *forward.inputs), dict(forward.constants))
        self.check_supported(spec)
        return spec

    def spec_for(self, *inputs: torch.Tensor, **constants: Any) -> OpSpec:
        if len(inputs) != 3 or not all(isinstance(t, torch.Tensor) for t in inputs):
            raise UnsupportedWorkload(f"{self.name} takes (dloss, logits, target) tensors, not {len(inputs)} inputs")
        dloss, logits, target = inputs
        if dloss.dtype != torch.float32:
            raise UnsupportedWorkload(f"{self.name}: dloss must be float32 (the loss's dtype), not {dloss.dtype}")
        forward = _FORWARD.spec_for(logits, target, **constants)
        spec = OpSpec(self.name, (TensorSpec.of(dloss), *forward.inputs), dict(forward.constants))
        self.check_supported(spec)
        return spec

    def check_supported(self, spec: OpSpec) -> None:
        if len(spec.inputs) != 3:
            raise UnsupportedWorkload(f"{self.name} takes (dloss, logits, target), not {len(spec.inputs)} inputs")
        _FORWARD.check_supported(_forward_spec(spec))
        dloss = spec.inputs[0]
        (expected,) = _FORWARD.output_specs(_forward_spec(spec))
        if dloss != expected:
            raise UnsupportedWorkload(
                f"{self.name}: dloss must be {expected} for reduction={spec.const('reduction')!r}, not {dloss}"
            )

    def output_specs(self, spec: OpSpec) -> tuple[TensorSpec, ...]:
        """``(dlogits,)``, like the logits."""
        return (self._logits_spec(spec),)

    # ---- math ------------------------------------------------------------------------------------
    def reference(self, spec: OpSpec, inputs: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        """Autograd through ``F.cross_entropy(logits.float(), ...)``: a float32 gradient rounded
        to the logits' dtype."""
        dloss, logits, target = inputs
        return (_autograd(dloss, logits, target, dict(spec.constants), torch.float32)[1],)

    def reference_fp64(self, spec: OpSpec, inputs: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        dloss, logits, target = inputs
        return (_autograd(dloss, logits.double(), target, dict(spec.constants), torch.float64)[1],)

    def make_inputs(
        self,
        spec: OpSpec,
        seed: int,
        distribution: str = "normal",
        device: str | torch.device = "cuda",
    ) -> tuple[torch.Tensor, ...]:
        """The forward's logits and targets for ``distribution`` (about 10% of the rows ignored),
        and ``dloss`` drawn from a second generator: magnitudes uniform in [0.5, 2) with a random
        sign (never so small that a low-precision gradient would underflow to all zeros)."""
        logits, target = _FORWARD.make_inputs(_forward_spec(spec), seed, distribution, device)
        g = generator(seed ^ 0x5EED_D1FF, device)
        shape = spec.inputs[0].shape
        magnitude = 0.5 + 1.5 * torch.rand(shape, generator=g, device=device)
        sign = torch.randint(0, 2, shape, generator=g, device=device) * 2 - 1
        return magnitude * sign, logits, target

    def bytes_moved(self, spec: OpSpec) -> int:
        """dloss, the logits and targets read once, dlogits written once (online_row and
        split_vocab read the logits twice: their floor is one logits read higher)."""
        return super().bytes_moved(spec)

    def flops(self, spec: OpSpec) -> int:
        # Per logit: the statistics (a max comparison, a subtraction, an exp, an add), then the
        # gradient (a subtraction, an exp, a multiply, a subtraction, a compare-and-select).
        return 9 * self._logits_spec(spec).numel


class CrossEntropyFused(_CrossEntropyGradient):
    name = FUSED_NAME
    summary = "cross-entropy loss and its gradient dlogits (upstream gradient 1) in one walk over the logits"
    shape_help = _LOGITS_SHAPE_HELP + (
        "the loss is float32 (0-d, or (8192,) with reduction=none), dlogits is like the logits"
    )

    # ---- specs -----------------------------------------------------------------------------------
    def _from_forward(self, forward: OpSpec) -> OpSpec:
        """The forward's very inputs and constants, under this op's name."""
        return OpSpec(self.name, forward.inputs, dict(forward.constants))

    def spec_for(self, *inputs: torch.Tensor, **constants: Any) -> OpSpec:
        return self._from_forward(_FORWARD.spec_for(*inputs, **constants))

    def check_supported(self, spec: OpSpec) -> None:
        _FORWARD.check_supported(_forward_spec(spec))

    def output_specs(self, spec: OpSpec) -> tuple[TensorSpec, ...]:
        """``(loss, dlogits)``: the forward's float32 loss, and the gradient like the logits."""
        return (*_FORWARD.output_specs(_forward_spec(spec)), self._logits_spec(spec))

    # ---- math ------------------------------------------------------------------------------------
    def reference(self, spec: OpSpec, inputs: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        """The forward's reference loss and its gradient (for an upstream gradient of 1)."""
        logits, target = inputs
        return _autograd(None, logits, target, dict(spec.constants), torch.float32)

    def reference_fp64(self, spec: OpSpec, inputs: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        logits, target = inputs
        return _autograd(None, logits.double(), target, dict(spec.constants), torch.float64)

    def make_inputs(
        self,
        spec: OpSpec,
        seed: int,
        distribution: str = "normal",
        device: str | torch.device = "cuda",
    ) -> tuple[torch.Tensor, ...]:
        """The forward's inputs (see :meth:`CrossEntropy.make_inputs`)."""
        return _FORWARD.make_inputs(_forward_spec(spec), seed, distribution, device)

    def flops(self, spec: OpSpec) -> int:
        # The forward's per-logit work (4, 5 with smoothing), then the gradient's 5.
        return _FORWARD.flops(_forward_spec(spec)) + 5 * self._logits_spec(spec).numel


OP = CrossEntropyBackward()
FUSED = CrossEntropyFused()

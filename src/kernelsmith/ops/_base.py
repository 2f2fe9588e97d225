"""The contract every op family fulfils.

An op family (one module in this package) tells the engine everything it needs to tune one kind
of operation, and nothing about *how* the engine searches:

- ``spec`` / ``spec_for``: how a command-line shape or example tensors become an :class:`OpSpec`;
- ``reference``: the canonical PyTorch implementation, in the inputs' own precision: this is the
  eager *baseline* every candidate must beat, and the "low-precision reference" whose own error
  sets the tolerance;
- ``reference_fp64``: the same math in float64, the ground truth candidates are compared with;
- ``make_inputs``: inputs drawn from several value distributions, from a seed; validation adds
  the *stress* distributions every family shares (:data:`STRESS_DISTRIBUTIONS`: a few huge
  values per row, NaN and infinities, values near the smallest normal), made from the family's
  first distribution by :meth:`OpFamily.validation_inputs`;
- ``bytes_moved`` / ``flops``: the roofline model (each input read once, each output written once);
- ``variants``: the kernel implementations, each with its config space and a ``build`` that turns
  (spec, config) into a launcher writing into caller-allocated outputs;
- ``tolerance``: how much worse than PyTorch's own low-precision result a candidate may be.

Launchers never allocate their outputs: the harness allocates them (and poisons them with NaN),
which is what lets it prove that a kernel wrote every element it claims to produce.
"""

from __future__ import annotations

import hashlib
import inspect
import math
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from kernelsmith.exceptions import KernelsmithError
from kernelsmith.space import Config, Space
from kernelsmith.spec import OpSpec, TensorSpec

# A launcher runs one configured kernel: launcher(inputs, outputs) writes the outputs.
Launcher = Callable[[Sequence[torch.Tensor], Sequence[torch.Tensor]], None]

# Data no family's own distributions produce, on which kernels are wrong in ways a normal draw
# never shows (a block max that overflows, a NaN laundered to zero, denormals flushed where the
# reference keeps them): every candidate is validated on it too (see OpFamily.validation_inputs).
STRESS_DISTRIBUTIONS = ("spikes", "nonfinite", "denormal")
# Gradients of non-finite inputs are NaN or not depending on where a formulation's chain rule
# meets 0 * Inf, so no one reference pattern is "right": backward families use these only.
FINITE_STRESS_DISTRIBUTIONS = ("spikes", "denormal")
SPIKE_RANGE = (1e3, 3e4)  # magnitudes of the spikes: large, yet finite in float16 (max 65504)


class UnsupportedWorkload(KernelsmithError, ValueError):
    """The op family cannot handle this spec (dtype, layout, rank...): callers fall back."""


class UnknownOpError(KernelsmithError, ValueError):
    """No op family has this name (the message lists those that do)."""


@dataclass(frozen=True)
class Variant:
    """One kernel implementation of an op family and the configs it accepts."""

    name: str
    summary: str
    space: Callable[[OpSpec], Space]
    build: Callable[[OpSpec, Config], Launcher]
    # Further modules (by name) whose code the variant runs besides its build's: a family whose
    # kernels, spaces or launchers live in a module of their own (the row-wise skeleton, a
    # family's kernels file) names them, so that a change there changes the hash too.
    modules: tuple[str, ...] = ()
    # The aten ops the variant's launcher issues besides views and allocations, for a built-in
    # variant whose launcher computes with a library by design (cuBLAS GEMMs around a Triton row
    # kernel): rule 7 (kernelsmith.evaluate.validate) allows exactly these, for this variant only.
    # A candidate's kernel file never has an allowance: its launcher is generated, not written.
    library_ops: frozenset[str] = frozenset()

    @property
    def source_hash(self) -> str:
        """Hash of the source that defines this variant (its whole module, and ``modules``), for
        the database."""
        module = inspect.getmodule(self.build)
        text = inspect.getsource(module) if module is not None else inspect.getsource(self.build)
        for name in self.modules:
            text += "\n" + inspect.getsource(sys.modules[name])
        return hashlib.sha256(f"{self.name}\n{text}".encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Tolerance:
    """Pass when ``err(candidate) <= k * err(PyTorch in the same dtype) + floor * scale``.

    Errors are measured against the float64 reference, both as a relative L2 norm over the whole
    output and as the largest elementwise error (so one wrong row cannot hide in a norm of
    millions of elements). ``floor`` is in units of the output dtype's machine epsilon, scaled by
    the reference's magnitude, so that exact-in-fp64 outputs still allow one rounding.
    """

    k: float = 4.0
    floor_ulps: float = 2.0


@dataclass(frozen=True)
class ErrorFloor:
    """An error no correct kernel can be asked to beat on one draw, given by the family.

    The tolerance's base is PyTorch's own error, and on some draws that error is small by luck:
    a softmax of logits of magnitude ``|z|`` moves by about ``|z| * eps`` under *any* float32
    rounding of them, and PyTorch's rounding sometimes happens to cancel. A family whose math
    has such a condition computes, per output, the error that rounding alone can cause
    (:meth:`OpFamily.error_floors`, from the float64 references and the inputs, never from a
    candidate's output), and :func:`kernelsmith.evaluate.errors.check_close` takes the larger of
    its rule's limit and this floor, for the relative L2 and the max-abs error each. The harness
    caps the floor (:data:`kernelsmith.evaluate.errors.FLOOR_CAP`) well below the output's own
    scale, so that a zero or constant output still fails.
    """

    rel_l2: float = 0.0
    max_abs: float = 0.0


NO_FLOOR = ErrorFloor()


class OpFamily:
    """Base class of an op family; subclasses fill in the class attributes and methods."""

    name: ClassVar[str]
    summary: ClassVar[str]
    shape_help: ClassVar[str]  # how a command-line --shape maps to the inputs
    distributions: ClassVar[tuple[str, ...]] = ("normal",)
    # Validation also runs these (made from the first distribution): a family leaves one out
    # only with a reason in its docstring.
    stress_distributions: ClassVar[tuple[str, ...]] = STRESS_DISTRIBUTIONS
    # The most rows one program can own in any of the family's spaces (ROWS, BLOCK_M...):
    # validation row counts cover every residue modulo 8 and the edges modulo this.
    row_block: ClassVar[int] = 8
    tolerance: ClassVar[Tolerance] = Tolerance()
    dtypes: ClassVar[tuple[str, ...]] = ("float16", "bfloat16", "float32")
    variants: ClassVar[tuple[Variant, ...]] = ()
    # The op family computing this one's gradients, if any. By default its inputs are
    # (dy, *these inputs) and its outputs the gradients of the floating-point inputs, in order;
    # a family with another convention overrides backward_inputs and input_gradients.
    backward: ClassVar[str | None] = None

    # ---- autograd ----------------------------------------------------------------------------
    def backward_inputs(
        self,
        grad_outputs: Sequence[torch.Tensor],
        inputs: Sequence[torch.Tensor],
        outputs: Sequence[torch.Tensor],
    ) -> tuple[torch.Tensor, ...]:
        """The backward family's inputs for one backward pass: ``(dy, *inputs)`` by default.

        ``grad_outputs`` holds the gradient of each forward output (zeros for an output the loss
        does not use), ``outputs`` the forward's outputs (a family may prefer a saved output, such
        as a residual sum, over recomputing it).
        """
        return (grad_outputs[0], *inputs)

    def input_gradients(
        self, grads: Sequence[torch.Tensor], inputs: Sequence[torch.Tensor]
    ) -> tuple[torch.Tensor | None, ...]:
        """Each forward input's gradient from the backward family's outputs.

        By default the backward's outputs are the gradients of the floating-point inputs in
        order; integer inputs (class targets) get None.
        """
        remaining = iter(grads)
        gradients = tuple(next(remaining) if t.is_floating_point() else None for t in inputs)
        if next(remaining, None) is not None:
            raise ValueError(f"{self.name}: the backward returned more gradients than there are inputs")
        return gradients

    # ---- specs -------------------------------------------------------------------------------
    def spec(self, shape: tuple[int, ...], dtype: str, **constants: Any) -> OpSpec:
        """The spec for a command-line ``--shape`` and ``--dtype``."""
        raise NotImplementedError

    def spec_for(self, *inputs: torch.Tensor, **constants: Any) -> OpSpec:
        """The spec of example input tensors; raises UnsupportedWorkload when not handled."""
        raise NotImplementedError

    def small_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        """A command-line ``--shape`` the Triton interpreter runs in seconds (for demos without a
        GPU): leading sizes flattened and capped at 32 rows, the last size capped at 512."""
        *lead, width = shape
        if not lead:
            return (min(width, 512),)
        return (min(math.prod(lead), 32), min(width, 512))

    def check_supported(self, spec: OpSpec) -> None:
        """Raise UnsupportedWorkload when the kernels cannot compute this spec."""
        for t in spec.inputs:
            if t.dtype not in self.dtypes:
                raise UnsupportedWorkload(f"{self.name}: dtype {t.dtype} is not supported")
            if not t.is_contiguous:
                raise UnsupportedWorkload(f"{self.name}: non-contiguous input {t} is not supported")

    def output_specs(self, spec: OpSpec) -> tuple[TensorSpec, ...]:
        """Shapes and dtypes of the outputs; by default one output shaped like the first input."""
        x = spec.inputs[0]
        return (TensorSpec(x.shape, x.dtype),)

    # Row-wise ops (one independent computation per row of the last dimension) choose their
    # configs for a row width, not for a row count: their workloads are bucketed by rows.
    rowwise: ClassVar[bool] = False

    def bucket(self, spec: OpSpec) -> OpSpec:
        """The workload a call is tuned and looked up as.

        For row-wise ops the leading dimensions are flattened and the row count is rounded up
        to a power of two, so that a batch-size change (rows 5000 -> 6000) reuses the tuned
        config of its bucket (8192 rows) instead of starting a new search. Every config is
        validated on row counts of 1, 7 and an odd tail, so it is correct for any count in the
        bucket; only its speed was measured at the bucket's top. Other ops tune exact shapes.
        """
        if not self.rowwise:
            return spec
        *lead, width = spec.inputs[0].shape
        if not lead:  # one row: nothing to bucket (and a 1-D x is shaped like its weight)
            return spec
        return _with_activation_shape(spec, (1 << max(math.prod(lead) - 1, 0).bit_length(), width))

    def validation_specs(self, spec: OpSpec) -> list[OpSpec]:
        """The target spec plus tail shapes with the same row width (see :func:`tail_rows`).

        Row counts change, the width does not: a config is chosen for a width, and must be right
        for every row count of its bucket (rows not divisible by the rows-per-program included).
        """
        *lead, width = spec.inputs[0].shape
        rows = math.prod(lead) if lead else 1
        tails = tail_rows(rows, self.row_block)
        return [spec] + [_with_activation_shape(spec, (r, width) if lead else (width,)) for r in tails]

    @property
    def validation_distributions(self) -> tuple[str, ...]:
        """Every distribution validation draws from: the family's own, then the stress ones."""
        return (*self.distributions, *self.stress_distributions)

    def validation_inputs(
        self, spec: OpSpec, seed: int, distribution: str, device: str | torch.device = "cuda"
    ) -> tuple[torch.Tensor, ...]:
        """``make_inputs``, or for a stress distribution the first distribution's inputs with
        the :meth:`stressed_inputs` among them changed in place (see :func:`stress_`)."""
        if distribution not in self.stress_distributions:
            return self.make_inputs(spec, seed, distribution, device)
        inputs = self.make_inputs(spec, seed, self.distributions[0], device)
        g = generator(seed ^ 0x5EED, "cpu")
        for i in self.stressed_inputs(spec):
            stress_(inputs[i], distribution, g)
        return inputs

    def stressed_inputs(self, spec: OpSpec) -> tuple[int, ...]:
        """Which inputs a stress distribution changes: by default the floating-point ones shaped
        like the first (the activations, a residual, a gradient), not weights or targets."""
        first = spec.inputs[0].shape
        return tuple(i for i, t in enumerate(spec.inputs) if t.shape == first and t.torch_dtype.is_floating_point)

    # ---- math --------------------------------------------------------------------------------
    def reference(self, spec: OpSpec, inputs: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        raise NotImplementedError

    def reference_fp64(self, spec: OpSpec, inputs: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        raise NotImplementedError

    def error_floors(
        self, spec: OpSpec, inputs: Sequence[torch.Tensor], refs64: Sequence[torch.Tensor]
    ) -> tuple[ErrorFloor, ...]:
        """Per output, the error the op's condition forces on any correct kernel (see
        :class:`ErrorFloor`); none by default.

        Called by the harness (trusted code in the worker) before the candidate runs, on clones
        of the inputs and the float64 references ``refs64`` of them.
        """
        return tuple(NO_FLOOR for _ in refs64)

    # ---- inputs the op writes (rule 2) -------------------------------------------------------
    def written_inputs(self, spec: OpSpec) -> tuple[int, ...]:
        """Indices of the inputs a call of this op writes in place; none by default.

        Rule 2 rejects a candidate that changes any input, which is right for almost every op. A
        few ops are defined by a write: a decode step stores the new token's keys and values into
        the KV cache (Hugging Face's ``StaticCache.update``) and attends over it, and fusing the
        two is the point of the kernel. Such a family declares the inputs here and gives their
        state after the call in :meth:`reference_written`; the harness then compares those inputs
        bit for bit with that state, and every other input with its clone, as before. The
        declaration is the family's (trusted code in the worker), never a kernel file's: the
        harness asks for it, and for the expected state, before the candidate runs.

        A call must be idempotent on its written inputs (writing the same rows at the same place
        twice leaves the same state), so that the harness's repeated runs on one input set (rule
        9's rerun, the timing rounds, graph replays) each start from a state whose expected
        successor is the same.
        """
        return ()

    def reference_written(self, spec: OpSpec, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """The state of each of :meth:`written_inputs` (in that order) after one call on ``inputs``.

        Computed exactly (a write is a copy, so the candidate must match it bit for bit) into new
        tensors: ``inputs`` are the harness's clones of the state before the call and must not
        change. Only called when :meth:`written_inputs` is not empty.
        """
        raise NotImplementedError(f"{self.name} declares written inputs but not their expected state")

    def make_inputs(
        self, spec: OpSpec, seed: int, distribution: str = "normal", device: str | torch.device = "cuda"
    ) -> tuple[torch.Tensor, ...]:
        raise NotImplementedError

    def bytes_moved(self, spec: OpSpec) -> int:
        """Fewest bytes any implementation must move: inputs read once, outputs written once."""
        return sum(t.nbytes for t in spec.inputs) + sum(t.nbytes for t in self.output_specs(spec))

    def flops(self, spec: OpSpec) -> int:
        raise NotImplementedError

    # ---- variants ----------------------------------------------------------------------------
    def variant(self, name: str) -> Variant:
        for v in self.variants:
            if v.name == name:
                return v
        raise KeyError(f"{self.name} has no variant {name!r} (known: {[v.name for v in self.variants]})")


def tail_rows(rows: int, block: int = 8) -> list[int]:
    """Row counts besides ``rows`` that a config chosen for ``rows`` is validated on.

    One row; ``rows - 3``, inside a bucket's upper part (5 modulo 8 for a bucket of 8 rows or
    more); ``block - 1``, the fullest last block of the largest rows-per-program a family's space
    has (``block``, 7 modulo 8); and small counts of more than one block of 8 for the other
    residues modulo 8. With the target's own (a power of two for a bucket) that is every residue
    modulo 8 and the edges (0, 1, ``block - 1``) modulo ``block``, in seven tails at most, so a
    kernel wrong only when its last block holds a particular number of rows is caught, while
    the tails stay small (cheap) but one.
    """
    m = max(block, 8)
    counts = {c for c in (1, rows - 3, m - 1 if m - 1 <= rows else 7) if 1 <= c < rows}
    for t in (0, 2, 3, 4, 5, 6):
        if any(c % 8 == t for c in counts | {rows}):
            continue
        counts.add(8 + t if 8 + t < rows else t)
    return sorted(c for c in counts if 1 <= c < rows)


def stress_(t: torch.Tensor, distribution: str, g: torch.Generator) -> None:
    """Turn one tensor of ordinary values into stress data, in place (rows are its last dim).

    - ``spikes``: one or two elements per row of magnitude 1e3 to 3e4 (log-uniform, either
      sign), so that a row's max, sum of squares or logits are dominated by one value;
    - ``nonfinite``: one element in three rows of four becomes NaN, +Inf or -Inf in turn (the
      fourth stays finite, so that rows next to a poisoned one are checked too); a tensor of
      fewer than four rows gets all three in every row;
    - ``denormal``: every element near the dtype's smallest normal (a factor of 8 either way, so
      about half are subnormal), which a kernel flushing denormals gets wrong (bfloat16 in the
      Triton interpreter excepted: see below).
    """
    if not t.is_floating_point() or t.numel() == 0:
        return
    rows = t.reshape(-1, t.shape[-1]) if t.dim() else t.reshape(1, 1)
    n, width = rows.shape
    values = rows.detach().to("cpu", torch.float64)
    if distribution == "spikes":
        k = min(2, width)
        cols = torch.randint(0, width, (n, k), generator=g)
        low, high = math.log10(SPIKE_RANGE[0]), math.log10(SPIKE_RANGE[1])
        magnitude = 10 ** (low + (high - low) * torch.rand(n, k, generator=g, dtype=torch.float64))
        sign = torch.randint(0, 2, (n, k), generator=g).to(torch.float64) * 2 - 1
        values.scatter_(1, cols, magnitude * sign)
    elif distribution == "nonfinite":
        specials = torch.tensor([math.nan, math.inf, -math.inf], dtype=torch.float64)
        if n >= 4:  # any four rows in a row hold one of each, and a finite one
            offset = int(torch.randint(0, 4, (1,), generator=g))
            cols = torch.randint(0, width, (n,), generator=g)
            kinds = (torch.arange(n) + offset) % 4
            hit = kinds < 3
            values[torch.arange(n)[hit], cols[hit]] = specials[kinds[hit]]
        else:  # too few rows for that: each row holds all three (as many as fit)
            for r in range(n):
                cols = torch.randperm(width, generator=g)[:3]
                values[r, cols] = specials[: len(cols)]
    elif distribution == "denormal":
        tiny = torch.finfo(t.dtype).tiny
        # The Triton interpreter converts bfloat16 subnormals wrongly, loading and storing (by a
        # factor of about 2): there, bfloat16 values start 2^10 above the smallest normal, so
        # that neither they nor a kernel's results (a mean, x / 2) are subnormal.
        low = 10.0 if t.dtype == torch.bfloat16 and os.environ.get("TRITON_INTERPRET") == "1" else -3.0
        exponent = low + torch.rand(n, width, generator=g, dtype=torch.float64) * 6
        sign = torch.randint(0, 2, (n, width), generator=g).to(torch.float64) * 2 - 1
        values = sign * tiny * torch.pow(2.0, exponent)
    else:
        raise ValueError(f"unknown stress distribution {distribution!r} (known: {', '.join(STRESS_DISTRIBUTIONS)})")
    t.copy_(values.to(t.dtype).reshape(t.shape))


def _with_activation_shape(spec: OpSpec, shape: tuple[int, ...]) -> OpSpec:
    """``spec`` with its first input, and every input shaped like it (a residual, a gradient),
    reshaped to ``shape``; other inputs (weights, caches) keep theirs."""
    first = spec.inputs[0].shape
    inputs = tuple(t.with_shape(shape) if t.shape == first else t for t in spec.inputs)
    return OpSpec(spec.op, inputs, dict(spec.constants))


def rows_and_width(spec: OpSpec, input_index: int = 0) -> tuple[int, int]:
    """``(rows, N)`` of a row-wise input: every leading dimension flattened into rows (1 for 1-D)."""
    shape = spec.inputs[input_index].shape
    return math.prod(shape[:-1]), shape[-1]


def check_eps(op: str, eps: Any) -> float:
    """``eps`` as a float, or UnsupportedWorkload when it is negative or not finite."""
    value = float(eps)
    if not math.isfinite(value) or value < 0:
        raise UnsupportedWorkload(f"{op}: eps must be a finite number >= 0, not {eps!r}")
    return value


def tensor_specs(op: str, tensors: Sequence[torch.Tensor]) -> tuple[TensorSpec, ...]:
    """The specs of call tensors; UnsupportedWorkload for a dtype kernelsmith does not know at all."""
    try:
        return tuple(TensorSpec.of(t) for t in tensors)
    except ValueError as err:
        raise UnsupportedWorkload(f"{op}: {err}") from None


def generator(seed: int, device: str | torch.device) -> torch.Generator:
    g = torch.Generator(device=device)
    g.manual_seed(seed)
    return g

"""Error metrics and the tolerance test every candidate output must pass.

The tolerance is derived from PyTorch's own error (DESIGN.md, rule 8): a candidate passes when

    err(candidate, fp64 reference) <= k * err(PyTorch in the inputs' dtype, fp64 reference) + floor

for two errors at once: the relative L2 norm over the whole output, and the largest elementwise
error (so one wrong row cannot hide in a norm over millions of elements). ``floor`` is a few
units of the output dtype's machine epsilon times the reference's scale, so that an output that
PyTorch computes exactly still admits one rounding.

A family may give a further floor per output (:class:`~kernelsmith.ops._base.ErrorFloor`, from
:meth:`~kernelsmith.ops._base.OpFamily.error_floors`): the error its math's condition forces on
any correct kernel of the draw (a softmax of large logits), computed from the float64 reference
and the inputs. Each limit is then the larger of the rule's and the floor's, the floor capped at
:data:`FLOOR_CAP` of the output's own size, so that a zero or constant output still fails.

Non-finite values are compared exactly, against the float64 reference rounded to the output
dtype: NaN where it is NaN, an infinity of the same sign where it is infinite or past the
dtype's range, and nowhere else (validation feeds NaN and infinities on purpose: a kernel that
turns a NaN into zero, or an infinity into NaN, where the reference does not, is wrong).

Every accuracy check (validation, rule 5's check while timing, serve checks, the front doors'
checks of a stored kernel, the test helpers) judges against :func:`references`: the float64
references, PyTorch's own answer and the family's floors, all from the *pristine* inputs of the
draw, so that the same draw is judged the same way wherever it is checked, and no kernel's
writes to its inputs can move what it is judged against.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from kernelsmith.ops._base import NO_FLOOR, ErrorFloor, OpFamily, Tolerance
from kernelsmith.spec import OpSpec

# The largest floor a family may give, relative to the output: at most 1/256 of its L2 norm (the
# relative L2 floor) and of its largest magnitude (the max-abs floor). A zero output is wrong by
# all of it and a constant one by its whole spread, so neither can pass on the floor alone
# unless the reference is constant to 0.4% (then the canaries make the data blind, rule 3).
FLOOR_CAP = 2.0**-8


@dataclass(frozen=True)
class ErrorStats:
    rel_l2: float
    max_abs: float

    def __str__(self) -> str:
        return f"rel_l2={self.rel_l2:.3g} max_abs={self.max_abs:.3g}"


def error_stats(output: torch.Tensor, reference: torch.Tensor) -> ErrorStats:
    """Relative L2 and max-abs error of ``output`` against a float64 ``reference``."""
    diff = output.double() - reference
    ref_norm = float(torch.linalg.vector_norm(reference))
    diff_norm = float(torch.linalg.vector_norm(diff))
    rel = diff_norm / ref_norm if ref_norm > 0 else diff_norm
    max_abs = float(diff.abs().max()) if diff.numel() else 0.0
    return ErrorStats(rel, max_abs)


def check_close(
    output: torch.Tensor,
    reference: torch.Tensor,
    lowp_reference: torch.Tensor,
    tolerance: Tolerance,
    floor: ErrorFloor = NO_FLOOR,
) -> str | None:
    """None when ``output`` is as close to ``reference`` as the policy demands, else the reason.

    ``floor`` is the family's error floor for this output (computed by the harness, never from
    ``output``): each limit is at least the floor, capped at :data:`FLOOR_CAP`."""
    if output.shape != reference.shape:
        return f"shape {tuple(output.shape)} differs from the reference's {tuple(reference.shape)}"
    problem = _nonfinite_problem(output, reference)
    if problem:
        return problem
    finite = torch.isfinite(_rounded(reference, output.dtype))
    if not bool(finite.all()):  # compare finite parts only; non-finite positions matched exactly
        output, reference, lowp_reference = output[finite], reference[finite], lowp_reference[finite]
    if output.numel() == 0:
        return None
    # Where PyTorch itself overflowed (or made a NaN) but the answer is finite, its error would
    # allow anything: it counts as the correctly rounded answer there, and the candidate must
    # still be right.
    lowp_finite = torch.isfinite(lowp_reference)
    if not bool(lowp_finite.all()):
        lowp_reference = torch.where(lowp_finite, lowp_reference, reference.to(lowp_reference.dtype))
    eps = torch.finfo(output.dtype).eps if output.dtype.is_floating_point else 0.0
    scale = float(reference.abs().max())
    cand = error_stats(output, reference)
    base = error_stats(lowp_reference, reference)
    rel_limit = tolerance.k * base.rel_l2 + tolerance.floor_ulps * eps
    abs_limit = tolerance.k * base.max_abs + tolerance.floor_ulps * eps * scale
    # (max() with NaN keeps the rule's limit: a floor that is NaN is no floor)
    rel_floor = min(floor.rel_l2, FLOOR_CAP)
    abs_floor = min(floor.max_abs, FLOOR_CAP * scale)
    rel_limit, abs_limit = max(rel_limit, rel_floor), max(abs_limit, abs_floor)
    if cand.rel_l2 > rel_limit:
        return (f"relative L2 error {cand.rel_l2:.3g} exceeds {rel_limit:.3g} (PyTorch's own: {base.rel_l2:.3g}"
                + _floor_note(rel_floor, rel_limit) + ")")  # fmt: skip
    if cand.max_abs > abs_limit:
        return (f"max abs error {cand.max_abs:.3g} exceeds {abs_limit:.3g} (PyTorch's own: {base.max_abs:.3g}"
                + _floor_note(abs_floor, abs_limit) + ")")  # fmt: skip
    return None


@dataclass(frozen=True)
class References:
    """What one draw's outputs are judged against, computed from its pristine inputs: the float64
    references ``fp64``, PyTorch's outputs in the inputs' dtype ``lowp`` (the rule's base; empty
    where the caller's trusted result takes their place, as a serve check's does) and the
    family's error ``floors``, one per output."""

    fp64: tuple[torch.Tensor, ...]
    lowp: tuple[torch.Tensor, ...]
    floors: tuple[ErrorFloor, ...]

    def problem(
        self, outputs: Sequence[torch.Tensor], tolerance: Tolerance, lowp: Sequence[torch.Tensor] | None = None
    ) -> str | None:
        """None when each of ``outputs`` (the first ``len(outputs)`` of the op's) passes
        :func:`check_close` with its floor, else ``"output k: why"`` for the first that fails;
        ``lowp`` replaces :attr:`lowp` as the rule's base (a serve check's trusted result)."""
        bases = self.lowp if lowp is None else tuple(lowp)
        if len(outputs) != len(bases):
            return f"{len(outputs)} outputs, where {len(bases)} are compared"
        for k, (out, ref64, base, floor) in enumerate(zip(outputs, self.fp64, bases, self.floors, strict=False)):
            reason = check_close(out.detach(), ref64, base.detach(), tolerance, floor)
            if reason:
                return f"output {k}: {reason}"
        return None


def references(op: OpFamily, spec: OpSpec, pristine: Sequence[torch.Tensor], lowp: bool = True) -> References:
    """The :class:`References` of ``spec``'s draw ``pristine``: inputs no candidate has run on
    (see :func:`pristine_inputs`). They are left as they are: PyTorch's reference of a family
    that writes inputs runs on clones. ``lowp=False`` skips PyTorch's own answer (a serve check
    computes its trusted result itself). The floors come from the same inputs and the float64
    references (:meth:`~kernelsmith.ops._base.OpFamily.error_floors`), never from an output."""
    fp64 = tuple(t.detach() for t in op.reference_fp64(spec, pristine))
    floors = tuple(op.error_floors(spec, pristine, fp64))
    if len(floors) != len(fp64):
        raise ValueError(f"{op.name}: error_floors gave {len(floors)} floors for {len(fp64)} outputs")
    lowps: tuple[torch.Tensor, ...] = ()
    if lowp:
        own = [t.clone() for t in pristine] if op.written_inputs(spec) else pristine
        lowps = tuple(t.detach() for t in op.reference(spec, own))
    return References(fp64, lowps, floors)


def pristine_inputs(op: OpFamily, spec: OpSpec, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """``inputs`` as the references must see them, taken before a kernel runs on them: clones for
    a family that writes some (the kernel's writes would reach them, and they are the state
    :func:`written_problem` checks the call's writes from), the tensors themselves for any other
    (the references are computed from them before the kernel runs)."""
    if op.written_inputs(spec):
        return [t.detach().clone() for t in inputs]
    return list(inputs)


def written_problem(
    op: OpFamily, spec: OpSpec, inputs: Sequence[torch.Tensor], before: Sequence[torch.Tensor]
) -> str | None:
    """None when a kernel's call on ``inputs`` (from the state ``before``: :func:`pristine_inputs`)
    left each input the family writes bit for bit as its ``reference_written`` gives; else which
    are not, after putting the family's state back (the caller then falls back to the reference)."""
    written = op.written_inputs(spec)
    if not written:
        return None
    states = op.reference_written(spec, before)
    wrong = [i for i, want in zip(written, states, strict=True) if not _same_bits(inputs[i], want)]
    for i, want in zip(written, states, strict=True):
        if i in wrong:
            with torch.no_grad():
                inputs[i].copy_(want)
    return f"the kernel left its written inputs {wrong} other than the family's update" if wrong else None


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit for bit (NaN equals NaN; -0.0 does not equal 0.0)."""
    view = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
    same_layout = a.shape == b.shape and a.dtype == b.dtype
    return same_layout and torch.equal(a.detach().contiguous().view(view), b.detach().contiguous().view(view))


def _floor_note(floor: float, limit: float) -> str:
    """Says, in a rejection, that the limit is the family's floor rather than the rule's."""
    return f"; the limit is the op's condition floor {floor:.3g}" if floor == limit and floor > 0 else ""


def _rounded(reference: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The reference as the output dtype holds it: a finite value past the dtype's range is the
    same-signed infinity there (the correctly rounded answer, and what PyTorch writes)."""
    return reference.to(dtype) if dtype.is_floating_point else reference


def _nonfinite_problem(output: torch.Tensor, reference: torch.Tensor) -> str | None:
    """Non-finite values must be exactly the reference's: NaN where it is NaN, an infinity of the
    same sign where it is infinite (or too large for the output dtype), and nowhere else."""
    if not output.dtype.is_floating_point:
        return None
    expected = _rounded(reference, output.dtype)
    want_nan, got_nan = torch.isnan(expected), torch.isnan(output)
    if not bool(torch.equal(want_nan, got_nan)):
        missing, extra = int((want_nan & ~got_nan).sum()), int((got_nan & ~want_nan).sum())
        return f"NaN/Inf differ from the reference: {extra} elements NaN where it is not, {missing} not NaN where it is"
    want_inf, got_inf = torch.isinf(expected), torch.isinf(output)
    wrong_inf = (want_inf | got_inf) & (output != expected)
    if bool(wrong_inf.any()):
        return (
            f"NaN/Inf differ from the reference: {int(wrong_inf.sum())} elements are infinite where it is finite, "
            "finite where it is infinite, or infinite of the other sign"
        )
    return None

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
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kernelsmith.ops._base import NO_FLOOR, ErrorFloor, Tolerance

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

"""Error metrics and the tolerance test every candidate output must pass.

The tolerance is derived from PyTorch's own error (DESIGN.md, rule 8): a candidate passes when

    err(candidate, fp64 reference) <= k * err(PyTorch in the inputs' dtype, fp64 reference) + floor

for two errors at once: the relative L2 norm over the whole output, and the largest elementwise
error (so one wrong row cannot hide in a norm over millions of elements). ``floor`` is a few
units of the output dtype's machine epsilon times the reference's scale, so that an output that
PyTorch computes exactly still admits one rounding.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kernelsmith.ops._base import Tolerance


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
) -> str | None:
    """None when ``output`` is as close to ``reference`` as the policy demands, else the reason."""
    if output.shape != reference.shape:
        return f"shape {tuple(output.shape)} differs from the reference's {tuple(reference.shape)}"
    ref_finite = torch.isfinite(reference)
    out_finite = torch.isfinite(output)
    if not bool(torch.equal(ref_finite, out_finite)):
        bad = int((ref_finite != out_finite).sum())
        return f"{bad} elements are NaN/Inf where the reference is finite (or the reverse)"
    if not bool(ref_finite.all()):  # compare finite parts only; non-finite positions already match
        output, reference, lowp_reference = output[ref_finite], reference[ref_finite], lowp_reference[ref_finite]
    if output.numel() == 0:
        return None
    eps = torch.finfo(output.dtype).eps if output.dtype.is_floating_point else 0.0
    scale = float(reference.abs().max())
    cand = error_stats(output, reference)
    base = error_stats(lowp_reference, reference)
    rel_limit = tolerance.k * base.rel_l2 + tolerance.floor_ulps * eps
    abs_limit = tolerance.k * base.max_abs + tolerance.floor_ulps * eps * scale
    if cand.rel_l2 > rel_limit:
        return f"relative L2 error {cand.rel_l2:.3g} exceeds {rel_limit:.3g} (PyTorch's own: {base.rel_l2:.3g})"
    if cand.max_abs > abs_limit:
        return f"max abs error {cand.max_abs:.3g} exceeds {abs_limit:.3g} (PyTorch's own: {base.max_abs:.3g})"
    return None

"""How far rounding the logits alone can move a softmax: the error floors of softmax-based families.

Every kernel of a softmax-based family (linear cross-entropy, attention) holds its logits ``z``
(scores) in float32 at best: a dot product rounded, a bias or mask added. So each logit carries
an error ``d_j`` of a few float32 roundings at ``m_j``, the *magnitude* of the dot product
(``sum_k |x_k| |y_k|``, plus ``|bias|``: the scale its rounding errors are proportional to, which
is ``|z_j|`` when nothing cancels); the bound taken is ``a_j = LOGIT_ERROR * m_j``, two units of
float32's roundoff (see :data:`LOGIT_ERROR`). PyTorch's own logits
carry such errors too, and on some draws they happen to cancel, so that PyTorch's error, the base
of the tolerance, is far below what its arithmetic guarantees; a correct kernel is then rejected.
The bounds here are what any such rounding can do, computed in float64 from the inputs.

The softmax bound. Let ``p = softmax(z)`` and ``p' = softmax(z + d)`` with ``|d_j| <= a_j`` on a
row. Then ``p'_j / p_j = e^{d_j} / sum_k p_k e^{d_k}``, whose denominator lies between
``S- = sum_k p_k e^{-a_k}`` and ``S+ = sum_k p_k e^{a_k}``, so the ratio lies in
``[e^{-a_j} / S+, e^{a_j} / S-]`` and

    |p'_j - p_j| <= p_j r_j,    r_j = max(e^{a_j} / S- - 1, 1 - e^{-a_j} / S+).

Both rows sum to 1, so also ``|p'_j - p_j| = |sum_{k != j} (p'_k - p_k)| <= sum_{k != j} p_k r_k``:

    |p'_j - p_j| <= E_j = min(p_j r_j, sum_{k != j} p_k r_k, 1).

For small ``a`` that is the first-order ``p_j (a_j + p . a)``, but it holds for any size: a row
whose logits are huge and whose top logit leads the rest by far more than its errors is nearly
one-hot, and then ``p_j`` is tiny off the top and the sum over the others is tiny on it, so the
bound is tiny everywhere (rounding cannot move such a row, and the bound says so); a logit whose
probability is 0 (masked, or far below the rest) adds nothing however large its error.

From probabilities to outputs. The outputs are linear in ``p`` (attention's ``o = sum_j p_j v_j``,
cross-entropy's gradient ``(p - y) s`` and what the gradient is multiplied by), and each logit's
rounding is its own: the errors of different logits are independent, and their effects add in
quadrature (the probabilistic model of rounding errors, Higham and Mary 2019), not all in one
direction, which would be a worst case no rounding reaches on rows of thousands of keys. For
``y = sum_j p_j u_j`` (``u_j`` a value row), the first-order change is ``sum_j p_j d_j (u_j - y)``,
as ``sum_j (p'_j - p_j) = 0``; so the bound is

    |y' - y| <= sqrt(sum_j E_j^2 (u_j - y)^2)        (:func:`centered_spread`)

and an output made of one probability per row and token (a bias gradient) adds the rows' ``E``
in quadrature. :func:`floor_of` turns a bound per output element into an
:class:`~kernelsmith.ops._base.ErrorFloor`: the bound's relative L2 norm and its largest element.
An honest kernel's error is of this size (its logits are rounded like this), while a wrong
answer, which does not come from rounding the logits, is not (and the harness caps floors).
"""

from __future__ import annotations

import torch

from kernelsmith.ops._base import ErrorFloor

# A logit's error, relative to its magnitude m: two units of float32's roundoff u = eps / 2 (its
# final rounding and about one more at its own size: a sum dominated by one spike rounds its
# later additions at the spike's size). Float32 because every kernel of
# these families holds its logits in float32 (a float16 or bfloat16 kernel accumulates its dot
# products in float32 too; PyTorch's rounding of its logits to the inputs' dtype is in its own
# error, the rule's base, already). Not more: on ordinary float32 draws this floor stays below
# the rule's limit (at most 0.8 of it at (1, 4, 512, 64) attention and (64, 256, 4096) linear
# cross-entropy), so it loosens nothing there; twice this would exceed the rule by up to 1.5
# times, for 2 fewer rejections of a correct kernel in 7000 simulated lucky spike draws.
LOGIT_ERROR = 2 * torch.finfo(torch.float32).eps / 2
# e^a in float64 stays finite below a = 709; an error of 300 (in units of the logits) already
# makes every probability above e^-300 free, so clamping there changes nothing that matters.
_MAX_LOGIT_ERROR = 300.0


def logit_error(magnitude: torch.Tensor, visible: torch.Tensor | None = None) -> torch.Tensor:
    """``a``: ``LOGIT_ERROR`` times each logit's magnitude (0 where not ``visible``: a masked
    logit is no number the kernel rounds)."""
    if visible is not None:
        magnitude = magnitude.masked_fill(~visible, 0.0)
    return LOGIT_ERROR * magnitude


def probability_error(p: torch.Tensor, error: torch.Tensor) -> torch.Tensor:
    """``E``: how far any logit errors ``|d_j| <= error_j`` can move each probability of ``p``
    (float64 softmax rows along the last dim, 0 where masked); see the module's docstring."""
    a = error.clamp(min=0.0, max=_MAX_LOGIT_ERROR)
    # In expm1 terms, exact for tiny a where e^a - 1 would cancel (sum_k p_k = 1):
    # S+ - 1 = sum_k p_k (e^{a_k} - 1) and S- - 1 = sum_k p_k (e^{-a_k} - 1), so
    # e^{a_j} / S- - 1 = (expm1(a_j) - (S- - 1)) / S- and 1 - e^{-a_j} / S+ = ((S+ - 1) - expm1(-a_j)) / S+.
    grow, shrink = torch.expm1(a), torch.expm1(-a)
    high = (p * grow).sum(dim=-1, keepdim=True)  # S+ - 1
    low = (p * shrink).sum(dim=-1, keepdim=True)  # S- - 1 (> -1 on a row with any p > 0)
    ratio_error = torch.maximum((grow - low) / (1.0 + low), (high - shrink) / (1.0 + high))
    own = torch.where(p > 0, p * ratio_error, 0.0)  # (a fully masked row has no probability)
    # sum_{k != j} p_k r_k, without the cancellation of total - own_j where own_j is nearly all
    # of it (the top of a one-hot row): for the largest own_j the sum of the rest directly; for
    # any other j, total - own_j is at least half the total (the largest is at least own_j).
    total = own.sum(dim=-1, keepdim=True)
    is_top = torch.zeros_like(own, dtype=torch.bool).scatter_(-1, own.argmax(dim=-1, keepdim=True), True)
    rest = own.masked_fill(is_top, 0.0).sum(dim=-1, keepdim=True)
    others = torch.where(is_top, rest, (total - own).clamp(min=0.0))
    return torch.minimum(torch.minimum(own, others), torch.ones_like(own))


def centered_spread(p: torch.Tensor, error: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """``sqrt(sum_j E_j^2 (u_j - y)^2)`` for each row of ``y = p @ values``: how far rounding the
    logits moves ``y`` (``E = error``, from :func:`probability_error`; ``values`` the ``u_j``, one
    row per logit). Expanded into three products, ``sum_j w_j (u_j - y)^2 = w @ u^2 - 2 y (w @ u)
    + y^2 sum_j w_j`` with ``w = E^2``, so that no ``(rows, logits, width)`` tensor is formed."""
    weight = error * error
    mean = p @ values
    spread = weight @ (values * values) - 2.0 * mean * (weight @ values) + mean * mean * weight.sum(-1, keepdim=True)
    return spread.clamp(min=0.0).sqrt()


def floor_of(bound: torch.Tensor, reference: torch.Tensor) -> ErrorFloor:
    """The floor for an output whose elements rounding the logits moves by up to ``bound``: the
    bound's L2 norm relative to the float64 ``reference``'s, and its largest element (non-finite
    reference elements are compared exactly by the harness, so left out)."""
    finite = torch.isfinite(reference) & torch.isfinite(bound)
    bound, reference = bound[finite].double(), reference[finite].double()
    if bound.numel() == 0:
        return ErrorFloor()
    norm = float(torch.linalg.vector_norm(reference))
    rel = float(torch.linalg.vector_norm(bound)) / norm if norm > 0 else 0.0
    return ErrorFloor(rel_l2=rel, max_abs=float(bound.max()))

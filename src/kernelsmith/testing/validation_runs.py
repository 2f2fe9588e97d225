"""How many runs :func:`kernelsmith.evaluate.validate.validate` makes of a candidate, computed
from the family itself, so that family tests pin the count exactly as the validation data grows.

validate checks the target shape on every one of the family's own distributions (plus the stress
data no tail takes) and each tail shape on one distribution, taken in turn, two runs apiece; a
tail draws more only when its data is *blind* (a canary passes the tolerance on it, see
``_canary_problem``), which for some families depends on the drawn values (denormal products in
float16 underflow to zero on most draws, not all). ``maybe_blind`` names such distributions: each
tail whose draw is one of them takes the next one in its order (which may be blind too), and the
answer is every count that allows.
"""

from __future__ import annotations

from collections.abc import Iterable

from kernelsmith.evaluate.validate import _distribution_orders
from kernelsmith.ops._base import OpFamily
from kernelsmith.spec import OpSpec


def validation_runs(op: OpFamily, spec: OpSpec, maybe_blind: Iterable[str] = ()) -> set[int]:
    """The run counts validate can return for a candidate that passes on ``spec``: one count when
    no data is blind, more when a tail's first distribution is in ``maybe_blind``."""
    specs = op.validation_specs(spec)
    orders = _distribution_orders(list(op.distributions), list(op.stress_distributions), len(specs))
    draws = len(orders[0]) + len(orders) - 1  # the target's whole order, one per tail
    blind = set(maybe_blind)
    extras = {0}
    for order in orders[1:]:
        # a tail draws its next distribution each time the one before was blind: as many extra
        # draws as its order starts with maybe-blind distributions (but never past the last one)
        run = 0
        while run < len(order) - 1 and order[run] in blind:
            run += 1
        extras = {total + extra for total in extras for extra in range(run + 1)}
    return {2 * (draws + extra) for extra in extras}

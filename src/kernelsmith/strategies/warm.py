"""Warm start: try the winners of the nearest workloads already tuned, then search as usual.

The best config of a kernel moves slowly with the workload: an RMSNorm over rows of 4096 and one
over rows of 8192 usually want the same variant and neighbouring block and warp counts, and a
bf16 winner is usually right for fp16. So the decisions stored in the database for the same op
(other shapes, other dtypes) are ranked by a distance between their spec and the current one,
and their winners that exist in the current candidate set are proposed first.

The distance between two specs of the same op, input by input:

    d = sum over dims |log2(a_dim / b_dim)|                    (a 2x change in one size costs 1)
      + |log2(itemsize_a / itemsize_b)| + 0.5 [dtypes differ]  (bf16 vs fp16: 0.5; vs fp32: 1.5)
      + 0.5 per differing constant

Inputs of another rank are compared as (product of leading sizes, last size), the row-wise view
every op family here uses. Specs with another number of inputs are not comparable. A decision
whose winner was the baseline still names the best kernel it measured; it is used too.

Given a fingerprint, the decisions of every stored fingerprint of the same GPU model count
(:attr:`~kernelsmith.db.Fingerprint.model`: same GPU, SM count and compute capability, any
driver, CUDA, torch, Triton or kernelsmith version), so an upgrade that invalidates the stored
results still starts its searches from them; at equal distance this fingerprint's own come
first. Seeds are only proposals: each is measured here like any other candidate.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from typing import Any

from kernelsmith.db import config_key_of
from kernelsmith.evaluate.protocol import Candidate
from kernelsmith.spec import OpSpec, TensorSpec
from kernelsmith.strategies._base import Strategy
from kernelsmith.strategies.chain import Chain

log = logging.getLogger(__name__)

DTYPE_MISMATCH = 0.5
CONSTANT_MISMATCH = 0.5
DEFAULT_NEIGHBOURS = 5


def spec_distance(a: OpSpec, b: OpSpec) -> float | None:
    """The distance above, or None when the specs are not comparable.

    >>> x = lambda *shape, dtype="bf16": TensorSpec(shape, dtype)
    >>> spec_distance(OpSpec("softmax", (x(64, 1024),)), OpSpec("softmax", (x(64, 4096, dtype="fp32"),)))
    3.5
    """
    if a.op != b.op or len(a.inputs) != len(b.inputs):
        return None
    distance = 0.0
    for ta, tb in zip(a.inputs, b.inputs, strict=True):
        sa, sb = _comparable_shapes(ta, tb)
        distance += sum(abs(math.log2(max(p, 1) / max(q, 1))) for p, q in zip(sa, sb, strict=True))
        if ta.dtype != tb.dtype:
            itemsizes = ta.torch_dtype.itemsize / tb.torch_dtype.itemsize
            distance += abs(math.log2(itemsizes)) + DTYPE_MISMATCH
    keys = set(a.constants) | set(b.constants)
    distance += CONSTANT_MISMATCH * sum(a.constants.get(k) != b.constants.get(k) for k in keys)
    return distance


def _comparable_shapes(a: TensorSpec, b: TensorSpec) -> tuple[tuple[int, ...], tuple[int, ...]]:
    if len(a.shape) == len(b.shape):
        return a.shape, b.shape
    return _rows_and_width(a.shape), _rows_and_width(b.shape)


def _rows_and_width(shape: tuple[int, ...]) -> tuple[int, ...]:
    if not shape:
        return (1, 1)
    return (math.prod(shape[:-1]), shape[-1])


def nearest_winners(
    db: Any,
    spec: OpSpec,
    candidates: Sequence[Candidate],
    *,
    fingerprint: str | None = None,
    limit: int = DEFAULT_NEIGHBOURS,
) -> list[Candidate]:
    """Stored winners of the ``limit`` nearest tuned workloads of ``spec.op``, nearest first,
    as candidates of the current set (winners not in it are dropped; each appears once).

    ``db`` is a :class:`kernelsmith.db.Database`; ``fingerprint`` (a hash), which should be the
    machine being tuned, restricts the search to the fingerprints of its GPU model (see the
    module docstring): another GPU's winners are a weaker hint. None searches every fingerprint.
    """
    by_identity: dict[tuple[str, str], Candidate] = {}
    for c in candidates:
        by_identity.setdefault((c.variant, c.config.key), c)
    same_model = _same_model(db, fingerprint)
    ranked = []
    for decision in db.decisions(op=spec.op):
        if not decision.variant or (same_model is not None and decision.fingerprint not in same_model):
            continue
        distance = spec_distance(spec, OpSpec.from_dict(decision.spec))
        if distance is not None:
            elsewhere = decision.fingerprint != fingerprint  # this fingerprint's own first, at a tie
            ranked.append((distance, elsewhere, decision.workload, decision.fingerprint, decision))
    ranked.sort(key=lambda item: item[:4])
    winners: list[Candidate] = []
    for distance, _, _, _, decision in ranked[:limit]:
        candidate = by_identity.get((decision.variant, config_key_of(decision.config)))
        if candidate is not None and candidate not in winners:
            log.debug("warm start: %s from %s (distance %.2f)", candidate.key, decision.workload, distance)
            winners.append(candidate)
    return winners


def _same_model(db: Any, fingerprint: str | None) -> set[str] | None:
    """The hashes of the stored fingerprints of ``fingerprint``'s GPU model (itself included),
    or None (no restriction) when no fingerprint is given. A hash not stored is its own model."""
    if fingerprint is None:
        return None
    this = db.get_fingerprint(fingerprint)
    if this is None:
        return {fingerprint}
    return {fp.hash for fp in db.fingerprints() if fp.model == this.model} | {fingerprint}


class Seeds(Strategy):
    """A fixed list of candidates, in order (those not in the candidate set are skipped)."""

    name = "seeds"

    def __init__(self, seeds: Sequence[Candidate]) -> None:
        super().__init__()
        self.seeds = list(seeds)

    def _order(self) -> Sequence[Candidate]:
        if not hasattr(self, "_valid"):
            allowed = set(self.candidates)
            self._valid = [c for c in self.seeds if c in allowed]
        return self._valid


class WarmStart(Chain):
    """Propose ``seeds`` first (see :func:`nearest_winners`), then delegate to ``inner``, which
    observes the seeds' results and never proposes them again."""

    def __init__(self, inner: Strategy, seeds: Sequence[Candidate]) -> None:
        super().__init__([(Seeds(seeds), None), (inner, None)], inner.seed)
        self.inner = inner
        self.name = f"warm+{inner.name}"

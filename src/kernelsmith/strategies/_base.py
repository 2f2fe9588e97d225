"""The ask/tell contract of search strategies.

A strategy sees the whole candidate set (every variant's valid configs for the workload),
proposes batches of candidates it has not proposed before, and is told their results. The tuner
owns the budget: it counts the candidates actually evaluated, so a strategy only ever answers
"what next?".
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence

from kernelsmith.evaluate.protocol import Candidate, EvalResult


class Strategy(ABC):
    name: str = "base"

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed
        self.candidates: tuple[Candidate, ...] = ()
        self.history: list[EvalResult] = []
        self._proposed: set[Candidate] = set()

    def setup(self, candidates: Sequence[Candidate]) -> None:
        """Receive the candidate set; called once before the first proposal."""
        self.candidates = tuple(candidates)

    def propose(self, n: int) -> list[Candidate]:
        """Up to ``n`` candidates never proposed before (fewer, or none, when exhausted)."""
        batch: list[Candidate] = []
        for candidate in self._order():
            if len(batch) == n:
                break
            if candidate not in self._proposed:
                self._proposed.add(candidate)
                batch.append(candidate)
        return batch

    def observe(self, results: Sequence[EvalResult]) -> None:
        """Learn from evaluated candidates (failures included)."""
        self.history.extend(results)

    @abstractmethod
    def _order(self) -> Sequence[Candidate]:
        """The candidates in the order this strategy wants them tried."""


def interleave_variants(candidates: Sequence[Candidate]) -> list[Candidate]:
    """Round-robin across variants, so that a small budget still tries every variant."""
    by_variant: dict[str, list[Candidate]] = {}
    for c in candidates:
        by_variant.setdefault(c.variant, []).append(c)
    ordered: list[Candidate] = []
    queues = list(by_variant.values())
    while any(queues):
        for q in queues:
            if q:
                ordered.append(q.pop(0))
    return ordered

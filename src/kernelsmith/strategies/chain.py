"""Strategies in turn: the first proposes up to its quota, then the next takes over.

This is the glue behind warm starts (stored winners first, then any strategy) and refinement
(random exploration first, then coordinate descent around the best). Every stage observes every
result from the start, so a later stage begins knowing everything measured before it; a stage is
told what earlier stages proposed (:meth:`Strategy.reserve`) when it takes over, so nothing is
proposed twice.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from kernelsmith.evaluate.protocol import Candidate, EvalResult
from kernelsmith.strategies._base import Strategy

log = logging.getLogger(__name__)


class Chain(Strategy):
    """``stages``: (strategy, quota) pairs; quota None means "until exhausted"."""

    name = "chain"

    def __init__(self, stages: Sequence[tuple[Strategy, int | None]], seed: int = 0) -> None:
        super().__init__(seed)
        if not stages:
            raise ValueError("a chain needs at least one stage")
        self.stages = list(stages)
        self._stage = 0
        self._taken = 0  # proposals made by the current stage

    def setup(self, candidates: Sequence[Candidate]) -> None:
        super().setup(candidates)
        for strategy, _ in self.stages:
            strategy.setup(candidates)

    def propose(self, n: int) -> list[Candidate]:
        batch: list[Candidate] = []
        while len(batch) < n and self._stage < len(self.stages):
            strategy, quota = self.stages[self._stage]
            room = n - len(batch) if quota is None else min(n - len(batch), quota - self._taken)
            fresh = [c for c in strategy.propose(room) if c not in self._proposed] if room > 0 else []
            if not fresh:
                self._next_stage()
                continue
            self._taken += len(fresh)
            self._proposed.update(fresh)
            batch.extend(fresh)
        return batch

    def _next_stage(self) -> None:
        self._stage += 1
        self._taken = 0
        if self._stage < len(self.stages):
            strategy = self.stages[self._stage][0]
            log.debug("switching to %s after %d proposals", strategy.name, len(self._proposed))
            strategy.reserve(list(self._proposed))

    def reserve(self, candidates: Sequence[Candidate]) -> None:
        super().reserve(candidates)
        for strategy, _ in self.stages:
            strategy.reserve(candidates)

    def observe(self, results: Sequence[EvalResult]) -> None:
        super().observe(results)
        for strategy, _ in self.stages:
            strategy.observe(results)

    def _order(self) -> Sequence[Candidate]:  # unused: propose is overridden
        return ()

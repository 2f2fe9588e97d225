"""``strategy="auto"``: pick a strategy from the budget and the size of the candidate set.

1. The whole set fits the budget: grid search (everything gets measured; order hardly matters).
2. Optuna is installed and the budget is at least ``TPE_MIN_BUDGET``: TPE, which needs about ten
   random trials before its model starts to pay.
3. Otherwise: seeded random exploration, two candidates per variant (at most half the budget),
   then coordinate descent around the best found. On replayed spaces a short exploration did
   better than a long one: the descent itself restarts from random candidates when stuck.

With an LLM client (``client=``, see :mod:`kernelsmith.llm`), rules 1-3 give way: LLM proposals
(parameters and whole kernels) spend the first ``LLM_SHARE`` of the budget, then coordinate
descent refines around the best found. Without one the LLM is never used: tokens are spent only
when someone passes a client.

Whatever was picked is warm-started (:mod:`kernelsmith.strategies.warm`) when the database
holds tuned workloads of the same op. The choice is made in :meth:`setup`, when the candidate set
is known. A caller that does not pass ``budget`` is assumed to use the tuner's default budget.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from kernelsmith.evaluate.protocol import Candidate, EvalResult
from kernelsmith.spec import OpSpec
from kernelsmith.strategies._base import Strategy
from kernelsmith.strategies.coordinate import Refine
from kernelsmith.strategies.grid import GridSearch
from kernelsmith.strategies.llm import LLMSearch
from kernelsmith.strategies.random import RandomSearch
from kernelsmith.strategies.tpe import TPESearch, optuna_available
from kernelsmith.strategies.warm import WarmStart, nearest_winners

log = logging.getLogger(__name__)

DEFAULT_BUDGET = 50  # the default of kernelsmith.tune and tune_spec
TPE_MIN_BUDGET = 30
LLM_SHARE = 0.75  # of the budget, for LLM proposals when a client is given


def exploration(budget: int, n_variants: int) -> int:
    """Random proposals before coordinate descent takes over."""
    return min(2 * n_variants, max(1, budget // 2))


def choose(candidates: Sequence[Candidate], budget: int, seed: int = 0, *, llm: LLMSearch | None = None) -> Strategy:
    """The strategy rules 1-3 of the module docstring pick (without the warm start), or ``llm``
    refined by coordinate descent when there is one."""
    if llm is not None:
        return Refine(llm, max(1, int(LLM_SHARE * budget)), seed)
    if len(candidates) <= budget:
        return GridSearch(seed)
    if budget >= TPE_MIN_BUDGET and optuna_available():
        return TPESearch(seed)
    n_variants = len({c.variant for c in candidates})
    return Refine(RandomSearch(seed), exploration(budget, n_variants), seed)


class AutoStrategy(Strategy):
    name = "auto"

    def __init__(
        self,
        seed: int = 0,
        *,
        budget: int | None = None,
        db: Any = None,
        spec: OpSpec | None = None,
        fingerprint: str | None = None,
        client: Any = None,
    ) -> None:
        super().__init__(seed)
        self.budget = budget or DEFAULT_BUDGET
        self.db, self.spec, self.fingerprint = db, spec, fingerprint
        self.client = client
        self.inner: Strategy = GridSearch(seed)  # replaced in setup

    def setup(self, candidates: Sequence[Candidate]) -> None:
        super().setup(candidates)
        llm = None
        if self.client is not None:
            llm = LLMSearch(
                self.client, self.seed, budget=max(1, int(LLM_SHARE * self.budget)),
                spec=self.spec, db=self.db, fingerprint=self.fingerprint,
            )
        inner = choose(candidates, self.budget, self.seed, llm=llm)
        if self.db is not None and self.spec is not None:
            seeds = nearest_winners(self.db, self.spec, candidates, fingerprint=self.fingerprint)
            if seeds:
                inner = WarmStart(inner, seeds)
        log.info("auto strategy: %s for %d candidates and a budget of %d", inner.name, len(candidates), self.budget)
        inner.setup(candidates)
        self.inner = inner

    def propose(self, n: int) -> list[Candidate]:
        batch = self.inner.propose(n)
        self._proposed.update(batch)
        return batch

    def reserve(self, candidates: Sequence[Candidate]) -> None:
        super().reserve(candidates)
        self.inner.reserve(candidates)

    def observe(self, results: Sequence[EvalResult]) -> None:
        super().observe(results)
        self.inner.observe(results)

    def _order(self) -> Sequence[Candidate]:  # unused: propose is overridden
        return ()

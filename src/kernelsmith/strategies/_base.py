"""The ask/tell contract of search strategies.

A strategy sees the whole candidate set (every variant's valid configs for the workload),
proposes batches of candidates it has not proposed before, and is told their results. The tuner
owns the budget: it counts the candidates actually evaluated, so a strategy only ever answers
"what next?".

Strategies compose: a stage that should not propose what another already did is told so with
:meth:`Strategy.reserve`, and every stage observes every result, whoever proposed it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from numbers import Real
from typing import Any

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

    def reserve(self, candidates: Sequence[Candidate]) -> None:
        """Never propose these: someone else (a warm start, an earlier stage) already did.

        Their results may still arrive through :meth:`observe`, like any other result.
        """
        self._proposed.update(candidates)

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


def variant_label(candidate: Candidate) -> str:
    """The variant's name, tagged with its source hash for a kernel proposed from outside.

    ``Candidate.key`` is ``f"{variant}{tag}[{config.key}]"``: the label is that key minus the
    bracketed config, so two sources of one variant name never share parameter axes.
    """
    return candidate.key[: len(candidate.key) - len(candidate.config.key) - 2]


def variant_axes(candidates: Sequence[Candidate]) -> dict[str, dict[str, tuple[Any, ...]]]:
    """Per variant label, each parameter's values in order: ascending when they are all numbers,
    else in the order they first appear (``Space.configs()`` lists them in ``Param.choices`` order).

    >>> from kernelsmith.space import Config
    >>> variant_axes([Candidate("v", Config(b=4, e="x")), Candidate("v", Config(b=1, e=""))])
    {'v': {'b': (1, 4), 'e': ('x', '')}}
    """
    seen: dict[str, dict[str, list[Any]]] = {}
    for c in candidates:
        axes = seen.setdefault(variant_label(c), {})
        for name, value in c.config.items():
            values = axes.setdefault(name, [])
            if value not in values:
                values.append(value)
    return {
        label: {name: tuple(_ordered(values)) for name, values in axes.items()} for label, axes in seen.items()
    }


def _ordered(values: list[Any]) -> list[Any]:
    if all(isinstance(v, Real) and not isinstance(v, bool) for v in values):
        return sorted(values)
    return values

"""Coordinate descent around the incumbent, one parameter at a time.

The incumbent is the fastest successful result observed so far. Its neighbours along parameter
``p`` are the configs of the same variant that differ from it in ``p`` only, taking the next
smaller and the next larger value of ``p`` that gives a valid candidate (constraints may skip a
value). Launch parameters are mostly unimodal along one axis (more warps help until occupancy or
register pressure bites), so walking to a faster neighbour and looking again converges in a few
steps. The axis that gave the last improvement is tried first, in the same direction: a run of
doublings of ``num_warps`` or ``BLOCK_N`` then costs one evaluation per step.

When every neighbour of the incumbent has been proposed (a local optimum, or results still
pending), the strategy continues with unexplored candidates in seeded random order, variants
interleaved: the budget is never wasted, and a random candidate that beats the incumbent
restarts the descent from there (a random-restart hill climber).

:class:`Refine` runs another strategy first (random exploration, say) and then this descent
around the best of what it found.
"""

from __future__ import annotations

from collections.abc import Sequence

from kernelsmith.evaluate.protocol import Candidate, EvalResult
from kernelsmith.space import Config
from kernelsmith.strategies._base import Strategy, variant_axes, variant_label
from kernelsmith.strategies.chain import Chain
from kernelsmith.strategies.random import RandomSearch


class CoordinateDescent(Strategy):
    name = "coordinate"

    def setup(self, candidates: Sequence[Candidate]) -> None:
        super().setup(candidates)
        self._axes = variant_axes(candidates)
        self._by_config = {(variant_label(c), c.config): c for c in candidates}
        self._in_set = set(candidates)
        fallback = RandomSearch(self.seed)
        fallback.setup(candidates)
        self._fallback = list(fallback._order())
        self._incumbent: EvalResult | None = None
        self._last_move: tuple[str, int] | None = None  # (parameter, +1 or -1) of the last improvement

    def observe(self, results: Sequence[EvalResult]) -> None:
        super().observe(results)
        for result in results:
            self._proposed.add(result.candidate)  # observed is known: never propose it again
            if result.ok and (self._incumbent is None or result.median_us < self._incumbent.median_us):
                self._last_move = self._move(self._incumbent, result.candidate) if self._incumbent else None
                self._incumbent = result

    def _move(self, old: EvalResult, new: Candidate) -> tuple[str, int] | None:
        """The (parameter, direction) that leads from the old incumbent to ``new``, if one param."""
        before, label = old.candidate.config, variant_label(new)
        if variant_label(old.candidate) != label or not {old.candidate, new} <= self._in_set:
            return None
        changed = [p for p in new.config if before.get(p) != new.config[p]]
        if len(changed) != 1:
            return None
        values = self._axes[label][changed[0]]
        step = values.index(new.config[changed[0]]) - values.index(before[changed[0]])
        return changed[0], 1 if step > 0 else -1

    def neighbours(self, candidate: Candidate) -> list[Candidate]:
        """Nearest valid candidates along each parameter, last improving axis first."""
        label = variant_label(candidate)
        if candidate not in self._in_set:
            return []  # a result from outside the candidate set has no axes here
        moves = [(p, d) for p in candidate.config for d in (-1, 1)]
        last = self._last_move
        if last is not None and last in moves:
            moves.remove(last)
            moves.insert(0, last)
        found = []
        for param, direction in moves:
            neighbour = self._step(label, candidate.config, param, direction)
            if neighbour is not None:
                found.append(neighbour)
        return found

    def _step(self, label: str, config: Config, param: str, direction: int) -> Candidate | None:
        values = self._axes[label][param]
        i = values.index(config[param]) + direction
        while 0 <= i < len(values):
            neighbour = self._by_config.get((label, config.replace(**{param: values[i]})))
            if neighbour is not None:
                return neighbour
            i += direction
        return None

    def _order(self) -> Sequence[Candidate]:
        around = self.neighbours(self._incumbent.candidate) if self._incumbent else []
        return around + self._fallback


class Refine(Chain):
    """``after`` proposes the first ``switch_after`` candidates, then coordinate descent refines
    around the best result observed (it has seen them all)."""

    def __init__(self, after: Strategy, switch_after: int, seed: int = 0) -> None:
        super().__init__([(after, switch_after), (CoordinateDescent(seed), None)], seed)
        self.name = f"{after.name}+coordinate"

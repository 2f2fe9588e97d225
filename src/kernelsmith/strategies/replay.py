"""Replay a recorded search space: compare strategies on measured times, without a GPU.

A recorded space (``benchmarks/record_space.py`` writes one on a GPU) lists every candidate of
one workload with its status and median time. Replaying a strategy answers its proposals from
that record instead of evaluating them: propose, look the result up, observe, repeat. That is the
tuner's loop; with ``workers > 1`` that many proposals are in flight and results come back in
proposal order, as the tuner's pool roughly does.

The figure of merit is the number of evaluations until the best time so far is within
``tolerance`` (2%) of the best time of the whole space: failed candidates count, since the
budget pays for them. It is averaged over seeds, because every strategy here is randomized.

This lives in the package, not in ``benchmarks/``, so the tests and any future strategy can use
it; ``benchmarks/strategy_replay.py`` is the command-line front that prints and writes results.

The JSON format::

    {"spec": {...OpSpec.to_dict()...}, "meta": {...where and how it was recorded...},
     "candidates": [{"variant": "whole_row", "config": {"num_warps": 4, ...},
                     "status": "ok", "time_us": 36.4, "error": ""}, ...]}
"""

from __future__ import annotations

import json
import math
import statistics
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kernelsmith.evaluate.protocol import Candidate, EvalResult
from kernelsmith.space import Config
from kernelsmith.strategies._base import Strategy

DEFAULT_TOLERANCE = 0.02


@dataclass(frozen=True)
class RecordedSpace:
    """Every candidate of one workload with its recorded result, in recording order."""

    results: tuple[EvalResult, ...]
    spec: dict[str, Any] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RecordedSpace:
        results = []
        for row in data["candidates"]:
            candidate = Candidate(row["variant"], Config(row["config"]))
            time_us = row.get("time_us")
            if row["status"] == "ok" and time_us is not None:
                results.append(EvalResult(candidate, "ok", metrics={"median_us": float(time_us)}))
            else:
                results.append(EvalResult(candidate, row["status"] if row["status"] != "ok" else "runtime",
                                          row.get("error", "")))
        return cls(tuple(results), dict(data.get("spec", {})), dict(data.get("meta", {})))

    @classmethod
    def load(cls, path: str | Path) -> RecordedSpace:
        return cls.from_dict(json.loads(Path(path).read_text()))

    def to_dict(self) -> dict[str, Any]:
        rows = [
            {
                "variant": r.candidate.variant,
                "config": r.candidate.config.to_dict(),
                "status": r.status,
                "time_us": r.median_us if r.ok else None,
                "error": r.error,
            }
            for r in self.results
        ]
        return {"spec": self.spec, "meta": self.meta, "candidates": rows}

    @property
    def candidates(self) -> list[Candidate]:
        return [r.candidate for r in self.results]

    @property
    def best_us(self) -> float:
        times = [r.median_us for r in self.results if r.ok]
        if not times:
            raise ValueError("the recorded space has no successful candidate")
        return min(times)

    def name(self) -> str:
        """A short label: op and activation shape and dtype when the spec is known."""
        if not self.spec:
            return self.meta.get("name", "space")
        first = self.spec["inputs"][0]
        return f"{self.spec['op']} {'x'.join(map(str, first['shape']))} {first['dtype']}"


def replay(
    strategy: Strategy, space: RecordedSpace, *, budget: int | None = None, workers: int = 1
) -> list[EvalResult]:
    """The results in the order the strategy got them, until the budget or the space runs out."""
    lookup = {r.candidate: r for r in space.results}
    strategy.setup(space.candidates)
    limit = len(lookup) if budget is None else min(budget, len(lookup))
    in_flight: deque[Candidate] = deque()
    seen: list[EvalResult] = []
    exhausted = False
    while len(seen) < limit:
        while not exhausted and len(in_flight) < workers and len(seen) + len(in_flight) < limit:
            proposal = strategy.propose(1)
            if not proposal:
                exhausted = True
                break
            if proposal[0] not in lookup:
                raise ValueError(f"{strategy.name} proposed {proposal[0].key}, which is not in the space")
            in_flight.append(proposal[0])
        if not in_flight:
            break
        result = lookup[in_flight.popleft()]
        seen.append(result)
        strategy.observe([result])
    return seen


def evaluations_to_reach(trace: Sequence[EvalResult], target_us: float) -> int | None:
    """1-based count of evaluations until one ran in ``target_us`` or less; None if none did."""
    for i, result in enumerate(trace, start=1):
        if result.ok and result.median_us <= target_us:
            return i
    return None


@dataclass
class ReplaySummary:
    """One strategy on one space over several seeds."""

    strategy: str
    space: str
    space_size: int
    runs: list[int | None]  # evaluations to reach the target, per seed (None: not reached)

    @property
    def reached(self) -> int:
        return sum(r is not None for r in self.runs)

    @property
    def mean(self) -> float:
        hits = [r for r in self.runs if r is not None]
        return statistics.fmean(hits) if hits else math.nan

    @property
    def worst(self) -> int | None:
        hits = [r for r in self.runs if r is not None]
        return max(hits) if hits else None

    def within(self, budget: int) -> float:
        """The fraction of seeds that reached the target within ``budget`` evaluations."""
        return sum(r is not None and r <= budget for r in self.runs) / len(self.runs) if self.runs else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "strategy": self.strategy,
            "space": self.space,
            "space_size": self.space_size,
            "seeds": len(self.runs),
            "reached": self.reached,
            "mean_evaluations": None if math.isnan(self.mean) else self.mean,
            "worst_evaluations": self.worst,
            "runs": self.runs,
        }


def compare(
    space: RecordedSpace,
    factories: Mapping[str, Callable[[int], Strategy]],
    seeds: Sequence[int],
    *,
    tolerance: float = DEFAULT_TOLERANCE,
    budget: int | None = None,
    workers: int = 1,
) -> list[ReplaySummary]:
    """Replay each strategy (built by ``factories[name](seed)``) once per seed."""
    target = space.best_us * (1.0 + tolerance)
    summaries = []
    for name, factory in factories.items():
        runs = [
            evaluations_to_reach(replay(factory(seed), space, budget=budget, workers=workers), target)
            for seed in seeds
        ]
        summaries.append(ReplaySummary(name, space.name(), len(space.results), runs))
    return summaries

"""What a search cost, and which of its candidates were worth the cost.

Every tuning result carries a :class:`SearchCost`: the evaluations it ran, the seconds its
workers spent on them, its wall time, and the tokens of any LLM that proposed candidates. Seconds
are named after where they were spent: ``gpu_s`` on a GPU, ``interpreter_s`` in the Triton
interpreter on the CPU. Interpreter seconds are never reported as GPU time.

``gpu_s`` (or ``interpreter_s``) is the sum of the worker-side seconds of every evaluation
(build, compile, validate, time, including any wait for the device lock) plus the final paired
re-check of the finalists. With several workers the sum can exceed the wall time: it is the
cost in worker time, the figure that grows with the budget.

A search is also a sequence: candidate *i* was found after spending the cost of candidates
``1..i``. :func:`points_from_results` (a finished search) and :func:`points_from_trials` (trials
stored in the database, so old runs work too) turn a search into :class:`CostPoint` records of
(cumulative cost when found, speedup). Then

* :func:`pareto` keeps the candidates no other candidate beats on both axes: the frontier of
  speed against cost. Since cost only grows along a search, the frontier is the sequence of
  improvements, and each step says what the next bit of speed cost.
* :func:`choose` picks one candidate by the scalarized score

      score = speedup - lam * cost / total_cost

  where ``total_cost`` is the cost of the whole search on the chosen axis, so the normalized
  cost runs from 0 to 1. ``lam`` is the speedup you would give up to save the whole search:
  ``lam = 0`` picks the fastest candidate (the earliest among equals), ``lam = 0.2`` accepts a
  speedup 0.2 lower for a candidate found at the very start rather than at the very end.

The speedup of a candidate is the one measured during the search, against the baseline timed in
the same worker run; the tuner's final decision re-times the finalists, so its figure can differ.

>>> from kernelsmith import cost
>>> result.cost.describe()                                                         # doctest: +SKIP
'50 evaluations, ... GPU-s, ... s wall'
>>> trials = database.trials(fingerprint=fp.hash, workload=result.workload)         # doctest: +SKIP
>>> points = cost.points_from_trials(trials)                                       # doctest: +SKIP
>>> [p.index for p in cost.pareto(points)]                                         # doctest: +SKIP
[...]
>>> cost.choose(points, lam=0.1).config                                            # doctest: +SKIP
{...}
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from kernelsmith.db.records import TrialRecord
from kernelsmith.evaluate.protocol import EvalResult

# The cost axes a frontier can be drawn against.
AXES: tuple[str, ...] = ("evaluations", "seconds", "tokens")
# The LLM accounting fields a strategy that asks an LLM reports (see SearchCost.add_llm).
LLM_FIELDS: tuple[str, ...] = ("llm_input_tokens", "llm_output_tokens", "llm_requests", "llm_wall_s")
# Metrics keys of a stored trial: the worker seconds of its evaluation (written by the tuner),
# and the LLM tokens spent proposing it (present only when an LLM proposed the candidate).
EVAL_SECONDS_KEY = "eval_s"
LLM_TOKENS_KEY = "llm_tokens"


@dataclass
class SearchCost:
    """The search cost of one tuning run.

    ``evaluations`` counts candidates evaluated in this run; ``reused`` those answered by trials
    already in the database (free). Seconds are in ``gpu_s`` or ``interpreter_s`` by ``mode``;
    see the module docstring for what they include. The ``llm_*`` fields stay 0 unless an LLM
    strategy ran.
    """

    mode: str = "gpu"
    evaluations: int = 0
    reused: int = 0
    gpu_s: float = 0.0
    interpreter_s: float = 0.0
    wall_s: float = 0.0
    llm_input_tokens: int = 0
    llm_output_tokens: int = 0
    llm_requests: int = 0
    llm_wall_s: float = 0.0
    frontier: list[CostPoint] = field(default_factory=list)

    @property
    def tokens(self) -> int:
        """LLM tokens, input and output."""
        return self.llm_input_tokens + self.llm_output_tokens

    @property
    def eval_s(self) -> float:
        """Evaluation seconds wherever they were spent (GPU or interpreter)."""
        return self.gpu_s + self.interpreter_s

    def add_llm(self, usage: Mapping[str, Any]) -> None:
        """Add an LLM client's accounting (any of :data:`LLM_FIELDS`; other keys are ignored)."""
        self.llm_input_tokens += int(usage.get("llm_input_tokens", 0) or 0)
        self.llm_output_tokens += int(usage.get("llm_output_tokens", 0) or 0)
        self.llm_requests += int(usage.get("llm_requests", 0) or 0)
        self.llm_wall_s += float(usage.get("llm_wall_s", 0.0) or 0.0)

    def totals(self) -> dict[str, Any]:
        """The figures without the frontier: what the tuner stores with its decision."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "frontier"}

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SearchCost:
        """Totals as stored with a decision (unknown keys ignored; the frontier is not stored)."""
        return cls(**{f.name: data[f.name] for f in fields(cls) if f.name in data and f.name != "frontier"})

    def describe(self) -> str:
        """One line, such as ``"12 evaluations, 3.4 GPU-s, 20.1 s wall"``."""
        seconds = f"{self.gpu_s:.1f} GPU-s" if self.mode == "gpu" else f"{self.interpreter_s:.1f} interpreter-s"
        parts = [f"{self.evaluations} evaluations"]
        if self.reused:
            parts.append(f"{self.reused} reused")
        parts += [seconds, f"{self.wall_s:.1f} s wall"]
        if self.llm_requests or self.tokens:
            parts.append(f"{self.tokens} LLM tokens in {self.llm_requests} requests")
        return ", ".join(parts)


@dataclass(frozen=True)
class CostPoint:
    """One evaluated candidate of a search, with the cost spent up to and including it.

    ``index`` is its 1-based position in evaluation order; ``speedup`` is None for a failure
    (failures cost, but never sit on the frontier). The cumulative costs are ``evaluations``,
    ``seconds`` (worker seconds, GPU or interpreter by the search's mode) and ``tokens``.
    """

    index: int
    variant: str
    config: dict[str, Any]
    status: str
    speedup: float | None
    evaluations: int
    seconds: float
    tokens: int = 0

    def cost(self, axis: str = "evaluations") -> float:
        _check_axis(axis)
        return float(getattr(self, axis))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _check_axis(axis: str) -> None:
    if axis not in AXES:
        raise ValueError(f"unknown cost axis {axis!r}: use one of {', '.join(AXES)}")


def _speedup(status: str, metrics: Mapping[str, Any]) -> float | None:
    """Search-time speedup: the same-run baseline's median over the candidate's."""
    if status != "ok":
        return None
    median, baseline = metrics.get("median_us"), metrics.get("baseline_median_us")
    if not median or not baseline:
        return None
    return float(baseline) / float(median)


def _tokens(metrics: Mapping[str, Any]) -> int:
    return int(metrics.get(LLM_TOKENS_KEY, 0) or 0)


def _points(rows: Iterable[tuple[str, dict[str, Any], str, dict[str, Any], float, int]]) -> list[CostPoint]:
    points: list[CostPoint] = []
    seconds, tokens = 0.0, 0
    for i, (variant, config, status, metrics, row_seconds, row_tokens) in enumerate(rows, start=1):
        seconds += row_seconds
        tokens += row_tokens
        points.append(CostPoint(i, variant, config, status, _speedup(status, metrics), i, seconds, tokens))
    return points


def points_from_results(results: Sequence[EvalResult], fresh: Sequence[bool] | None = None) -> list[CostPoint]:
    """Cost points of a search's results in evaluation order.

    ``fresh[i]`` False marks a result answered from the database: it cost nothing in this search
    and is not a point (it was a point of the search that measured it).
    """
    flags = list(fresh) if fresh is not None else [True] * len(results)
    rows = (
        (
            r.candidate.variant,
            r.candidate.config.to_dict(),
            r.status,
            dict(r.metrics),
            float(r.seconds),
            _tokens(r.metrics),
        )
        for r, is_fresh in zip(results, flags, strict=True)
        if is_fresh
    )
    return _points(rows)


def trial_seconds(trial: TrialRecord) -> float:
    """Worker seconds of a stored trial.

    Trials stored by this version carry them (``metrics["eval_s"]``). For older trials they are
    estimated from the validation and timing seconds of a successful trial, and 0 for a failed one
    (older failures did not record their duration), so old searches are underestimated.
    """
    m = trial.metrics
    if EVAL_SECONDS_KEY in m:
        return float(m[EVAL_SECONDS_KEY] or 0.0)
    return float(m.get("validate_s", 0.0) or 0.0) + float(m.get("time_s", 0.0) or 0.0)


def points_from_trials(trials: Sequence[TrialRecord]) -> list[CostPoint]:
    """Cost points of stored trials of one workload, in the order they were stored.

    Pass the trials of one fingerprint (``db.trials(fingerprint=..., workload=...)``): a search
    on one machine says nothing about the cost on another. Trials are stored as evaluations
    finish and never re-measured, so storage order is evaluation order, across every tuning run
    of that workload (a later run with a larger budget continues the same sequence).
    """
    rows = (
        (t.variant, dict(t.config), t.status, dict(t.metrics), trial_seconds(t), _tokens(t.metrics)) for t in trials
    )
    return _points(rows)


def pareto(points: Sequence[CostPoint], axis: str = "evaluations") -> list[CostPoint]:
    """The successful points that no other point dominates, cheapest first.

    A point is dominated when another costs no more and is at least as fast, and is strictly
    better on one of the two; among exact ties the earliest is kept.
    """
    _check_axis(axis)
    ok = [p for p in points if p.speedup is not None]
    ordered = sorted(ok, key=lambda p: (p.cost(axis), -(p.speedup or 0.0), p.index))
    frontier: list[CostPoint] = []
    best = float("-inf")
    for p in ordered:
        assert p.speedup is not None
        if p.speedup > best:
            frontier.append(p)
            best = p.speedup
    return frontier


def total_cost(points: Sequence[CostPoint], axis: str = "evaluations") -> float:
    """The cost of the whole search on ``axis``: the last point's cumulative cost."""
    _check_axis(axis)
    return max((p.cost(axis) for p in points), default=0.0)


def score(point: CostPoint, lam: float, total: float, axis: str = "evaluations") -> float:
    """``speedup - lam * cost / total`` (see the module docstring); None speedups score -inf."""
    if point.speedup is None:
        return float("-inf")
    normalized = point.cost(axis) / total if total > 0 else 0.0
    return point.speedup - lam * normalized


def choose(points: Sequence[CostPoint], lam: float = 0.0, axis: str = "evaluations") -> CostPoint | None:
    """The successful point with the highest :func:`score` (the cheaper on ties); None if none.

    The best score always lies on the frontier, so this is a choice along :func:`pareto`.
    """
    if lam < 0:
        raise ValueError("lam must be >= 0: a cost cannot be a reward")
    total = total_cost(points, axis)
    frontier = pareto(points, axis)
    if not frontier:
        return None
    return max(frontier, key=lambda p: (score(p, lam, total, axis), -p.cost(axis), -p.index))


def search_cost(
    results: Sequence[EvalResult],
    fresh: Sequence[bool],
    mode: str,
    *,
    wall_s: float,
    recheck_s: float = 0.0,
    llm: Mapping[str, Any] | None = None,
) -> SearchCost:
    """The :class:`SearchCost` of a finished search (what the tuner attaches to its result).

    ``recheck_s`` is the worker time of the final paired re-check; ``llm`` an LLM strategy's
    accounting (keys :data:`LLM_FIELDS`).
    """
    points = points_from_results(results, fresh)
    seconds = sum(r.seconds for r, f in zip(results, fresh, strict=True) if f) + recheck_s
    cost = SearchCost(
        mode=mode,
        evaluations=len(points),
        reused=sum(1 for f in fresh if not f),
        gpu_s=seconds if mode == "gpu" else 0.0,
        interpreter_s=0.0 if mode == "gpu" else seconds,
        wall_s=wall_s,
        frontier=pareto(points),
    )
    if llm:
        cost.add_llm(llm)
    return cost


def summarize_trials(
    trials: Sequence[TrialRecord],
    modes: Mapping[str, str],
    *,
    lam: float = 0.0,
    axis: str = "evaluations",
    stored_costs: Mapping[str, Mapping[str, Any]] | None = None,
) -> list[dict[str, Any]]:
    """Per fingerprint: the cost, frontier and choice of the stored trials of one workload.

    ``modes`` maps fingerprint hashes to ``"gpu"`` or ``"interpreter"``; ``stored_costs`` maps
    them to the cost totals stored with the decision (LLM tokens, the re-check), where there is
    one. This is what ``kernelsmith db show`` prints; it needs nothing but stored records.
    """
    _check_axis(axis)
    by_fp: dict[str, list[TrialRecord]] = {}
    for t in trials:
        by_fp.setdefault(t.fingerprint, []).append(t)
    summaries: list[dict[str, Any]] = []
    for fp, group in by_fp.items():
        points = points_from_trials(group)
        total = total_cost(points, axis)
        chosen = choose(points, lam, axis)
        mode = modes.get(fp, "gpu" if any(t.metrics.get("timer") == "cuda-events" for t in group) else "interpreter")
        seconds = sum(trial_seconds(t) for t in group)
        summaries.append(
            {
                "fingerprint": fp,
                "mode": mode,
                "seconds_name": "GPU-s" if mode == "gpu" else "interpreter-s",
                "evaluations": len(points),
                "failures": sum(1 for p in points if p.speedup is None),
                "gpu_s" if mode == "gpu" else "interpreter_s": seconds,
                "seconds_estimated": any(EVAL_SECONDS_KEY not in t.metrics for t in group),
                "axis": axis,
                "lambda": lam,
                "frontier": [{**p.to_dict(), "score": score(p, lam, total, axis)} for p in pareto(points, axis)],
                "chosen": chosen.index if chosen else None,
                "stored_cost": dict((stored_costs or {}).get(fp, {})),
            }
        )
    return summaries

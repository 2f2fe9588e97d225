"""Every strategy replayed on the four search spaces recorded on the NVIDIA H200, without a GPU.

``tests/data/spaces/`` holds rmsnorm and softmax (bf16, 8192x4096 and 32768x1024), every candidate
of every variant built, validated and timed by the real harness (``benchmarks/record_space.py``,
2026-11-30, torch 2.11+cu130, triton 3.6). The first tests check that the records are what they
claim to be: the package's current candidate set, H200 metadata, plausible times. The rest drive
each strategy through :func:`kernelsmith.strategies.replay.replay`, the tuner's propose/observe
loop answered from the record: no candidate proposed twice or outside the set, the budget
respected, failures survived (the records hold none, so some are injected), and one proposal
order per seed. The last test guards the figure of merit of ``docs/search.md``: within 2% of the
space's best inside the default budget.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from kernelsmith.evaluate.confirm import IMPLAUSIBLE_FRACTION_OF_COPY
from kernelsmith.evaluate.protocol import Candidate, EvalResult
from kernelsmith.ops import get_op
from kernelsmith.spec import OpSpec
from kernelsmith.strategies import CoordinateDescent, GridSearch, RandomSearch, Refine, Strategy, make_strategy
from kernelsmith.strategies.replay import RecordedSpace, compare, evaluations_to_reach, replay
from kernelsmith.strategies.tpe import optuna_available

SPACES_DIR = Path(__file__).parent / "data" / "spaces"
SPACE_FILES = sorted(SPACES_DIR.glob("*.json"))
SPACE_IDS = [p.stem for p in SPACE_FILES]

needs_optuna = pytest.mark.skipif(not optuna_available(), reason="needs optuna (pip install -e '.[search]')")

STRATEGIES: dict[str, Callable[[int], Strategy]] = {
    "grid": GridSearch,
    "random": RandomSearch,
    "tpe": lambda seed: make_strategy("tpe", seed),
    "coordinate": CoordinateDescent,
    "refine": lambda seed: Refine(RandomSearch(seed), 8, seed),
    "auto50": lambda seed: make_strategy("auto", seed, budget=50),
    "auto10": lambda seed: make_strategy("auto", seed, budget=10),
}
STRATEGY_PARAMS = [pytest.param(name, marks=needs_optuna) if name == "tpe" else name for name in STRATEGIES]
SEEDED = [s for s in STRATEGY_PARAMS if s != "grid"]  # grid's order does not depend on the seed

_CACHE: dict[str, RecordedSpace] = {}


@pytest.fixture(params=SPACE_FILES, ids=SPACE_IDS)
def space(request: pytest.FixtureRequest) -> RecordedSpace:
    path: Path = request.param
    if path.stem not in _CACHE:
        _CACHE[path.stem] = RecordedSpace.load(path)
    return _CACHE[path.stem]


def raw_rows(space: RecordedSpace) -> list[dict[str, Any]]:
    """The candidate rows of the space's file as written, with the fields replay ignores."""
    path = SPACES_DIR / f"{space.name().replace(' ', '-')}.json"
    rows: list[dict[str, Any]] = json.loads(path.read_text())["candidates"]
    return rows


def order(trace: list[EvalResult]) -> list[Candidate]:
    return [r.candidate for r in trace]


def counting(strategy: Strategy) -> tuple[Strategy, list[int]]:
    """The strategy, with a list that grows by the size of each batch it proposes."""
    sizes: list[int] = []
    propose = strategy.propose

    def counted(n: int) -> list[Candidate]:
        batch = propose(n)
        sizes.append(len(batch))
        return batch

    strategy.propose = counted  # type: ignore[method-assign]
    return strategy, sizes


def with_failures(space: RecordedSpace) -> RecordedSpace:
    """The space with its three fastest candidates and every ``persistent`` one failed, one failure
    status after another: a slow variant lost and the optimum out of reach."""
    fastest = {r.candidate for r in sorted(space.results, key=lambda r: r.median_us)[:3]}
    statuses = ("build", "validate", "runtime", "timeout", "crash", "cheat")
    results, n = [], 0
    for r in space.results:
        if r.candidate in fastest or r.candidate.variant == "persistent":
            results.append(EvalResult(r.candidate, statuses[n % len(statuses)], "injected"))
            n += 1
        else:
            results.append(r)
    return dataclasses.replace(space, results=tuple(results))


# -- the records -----------------------------------------------------------------------------


def test_the_four_spaces_are_there() -> None:
    assert SPACE_IDS == [
        "rmsnorm-32768x1024-bfloat16",
        "rmsnorm-8192x4096-bfloat16",
        "softmax-32768x1024-bfloat16",
        "softmax-8192x4096-bfloat16",
    ]


def test_space_metadata_says_h200(space: RecordedSpace) -> None:
    meta = space.meta
    fingerprint = meta["fingerprint"]
    assert fingerprint["mode"] == "gpu"
    assert "H200" in fingerprint["gpu_name"]
    assert fingerprint["torch"].startswith("2.11") and fingerprint["triton"].startswith("3.6")
    assert meta["recorded_at"].startswith("2026-11-30")
    assert meta["command"].startswith("record_space.py")
    assert meta["timing"]["flush_l2"] is True
    assert meta["copy_gbps"] > 1000  # the device's copy ceiling was measured, so "cheat" was checked
    op, shape, dtype = space.name().split()
    assert f"{op}-{shape}-{dtype}" in {p.stem for p in SPACE_FILES}


def test_space_is_the_current_candidate_set(space: RecordedSpace) -> None:
    spec = OpSpec.from_dict(space.spec)
    current = [Candidate(v.name, c) for v in get_op(spec.op).variants for c in v.space(spec)]
    recorded = space.candidates
    assert len(set(recorded)) == len(recorded), "a candidate was recorded twice"
    stale = [c.key for c in recorded if c not in set(current)]
    assert not stale, f"recorded candidates the package no longer has; re-record: {stale[:5]}"
    missing = [c.key for c in current if c not in set(recorded)]
    assert not missing, f"candidates added since the recording; re-record with record_space.py: {missing[:5]}"
    assert recorded == current, "the tuner's candidate order changed (grid's replay depends on it); re-record"


def test_space_times_are_plausible(space: RecordedSpace) -> None:
    assert all(r.ok for r in space.results)  # nothing failed on the H200 for these four
    best = space.best_us
    assert 10.0 < best < 100.0  # tens of microseconds: 64-128 MiB moved at ~3.5 TB/s
    assert all(math.isfinite(r.median_us) and r.median_us >= best for r in space.results)
    # The tuner's plausibility rule held: no kernel claims more bandwidth than the device copies.
    rows = raw_rows(space)
    assert all(row["gbps"] <= IMPLAUSIBLE_FRACTION_OF_COPY * space.meta["copy_gbps"] for row in rows)
    assert all(row["baseline_us"] > best for row in rows)  # the best kernel beats PyTorch's


def test_space_round_trips(space: RecordedSpace) -> None:
    assert RecordedSpace.from_dict(space.to_dict()) == space


# -- strategies replayed on them ---------------------------------------------------------------


@pytest.mark.parametrize("name", STRATEGY_PARAMS)
def test_full_replay_proposes_every_candidate_once(space: RecordedSpace, name: str) -> None:
    trace = replay(STRATEGIES[name](0), space)  # raises on a proposal outside the space
    proposed = order(trace)
    assert len(proposed) == len(set(proposed)) == len(space.results)
    assert set(proposed) == set(space.candidates)


@pytest.mark.parametrize("name", STRATEGY_PARAMS)
@pytest.mark.parametrize("budget", [10, 50])
@pytest.mark.parametrize("workers", [1, 4])
def test_replay_respects_the_budget(space: RecordedSpace, name: str, budget: int, workers: int) -> None:
    strategy, sizes = counting(STRATEGIES[name](1))
    trace = replay(strategy, space, budget=budget, workers=workers)
    assert len(trace) == budget
    assert sum(sizes) == budget  # asked for nothing it could not evaluate
    assert len(set(order(trace))) == budget
    assert len(strategy.history) == budget  # observed every result it paid for


@pytest.mark.parametrize("name", SEEDED)
def test_one_order_per_seed(space: RecordedSpace, name: str) -> None:
    first = order(replay(STRATEGIES[name](7), space, budget=50))
    again = order(replay(STRATEGIES[name](7), space, budget=50))
    other = order(replay(STRATEGIES[name](8), space, budget=50))
    assert first == again
    assert first != other


def test_grid_order_is_fixed(space: RecordedSpace) -> None:
    assert order(replay(GridSearch(0), space, budget=20)) == order(replay(GridSearch(5), space, budget=20))


@pytest.mark.parametrize("name", STRATEGY_PARAMS)
def test_recorded_failures_are_handled(space: RecordedSpace, name: str) -> None:
    broken = with_failures(space)
    failed = {r.candidate for r in broken.results if not r.ok}
    assert 3 < len(failed) < len(broken.results)

    full = replay(STRATEGIES[name](2), broken)
    assert len(set(order(full))) == len(full) == len(broken.results)

    trace = replay(STRATEGIES[name](2), broken, budget=50)
    assert len(set(order(trace))) == len(trace) == 50
    assert all(r.ok == (r.candidate not in failed) for r in trace)  # failures come back as failures
    assert any(r.ok for r in trace)
    # A failure counts as an evaluation: the budget paid for it.
    reached = evaluations_to_reach(trace, broken.best_us * 1.02)
    if reached is not None:
        assert trace[reached - 1].ok and reached >= 1


def test_evaluations_to_reach_counts_failures(space: RecordedSpace) -> None:
    broken = with_failures(space)
    trace = replay(GridSearch(0), broken)
    target = broken.best_us * 1.02
    reached = evaluations_to_reach(trace, target)
    assert reached is not None
    assert reached == 1 + next(i for i, r in enumerate(trace) if r.ok and r.median_us <= target)


@pytest.mark.parametrize(
    ("budget", "expected"),
    [(10, "random+coordinate"), (50, "tpe" if optuna_available() else "random+coordinate"), (1000, "grid")],
)
def test_auto_choice_on_real_spaces(space: RecordedSpace, budget: int, expected: str) -> None:
    strategy = make_strategy("auto", 0, budget=budget)
    strategy.setup(space.candidates)
    assert strategy.inner.name == expected  # type: ignore[attr-defined]


@pytest.mark.parametrize("name", STRATEGY_PARAMS)
def test_within_two_percent_inside_the_default_budget(space: RecordedSpace, name: str) -> None:
    """The table of docs/search.md (20 seeds): every strategy within 2% of the best by evaluation
    42 at worst. Five seeds here, so that a strategy that gets worse on real spaces shows up."""
    [summary] = compare(space, {name: STRATEGIES[name]}, range(5), budget=50)
    assert summary.reached == 5, summary.runs

"""TPE, coordinate descent, warm start, ``auto`` and the replay benchmarker, without kernels.

Every strategy is driven the way the tuner drives it (propose, then observe each result) against a
synthetic objective over a candidate set with holes (constraints) and failures.
"""

from __future__ import annotations

import json
import math
import random
import sys

import pytest

from kernelsmith.db import DecisionRecord, open_database
from kernelsmith.evaluate.protocol import Candidate, EvalResult
from kernelsmith.space import Config, Constraint, Param, Space
from kernelsmith.spec import OpSpec, TensorSpec
from kernelsmith.strategies import (
    AutoStrategy,
    CoordinateDescent,
    GridSearch,
    RandomSearch,
    Refine,
    WarmStart,
    make_strategy,
    nearest_winners,
)
from kernelsmith.strategies import auto as auto_module
from kernelsmith.strategies.replay import RecordedSpace, compare, evaluations_to_reach, replay
from kernelsmith.strategies.tpe import import_optuna
from kernelsmith.strategies.warm import spec_distance

# Two variants with different parameters; constraints leave holes in both grids.
_BLOCKED = Space(
    [Param("BLOCK", (64, 128, 256, 512, 1024)), Param("num_warps", (1, 2, 4, 8))],
    [Constraint("32 elements a warp at least", lambda c: c["BLOCK"] >= 32 * c["num_warps"])],
)
_ROWS = Space(
    [Param("ROWS", (1, 2, 4, 8)), Param("num_warps", (1, 2, 4, 8)), Param("EVICT", ("", "evict_first"))],
    [Constraint("at most 16 warps-rows", lambda c: c["ROWS"] * c["num_warps"] <= 16)],
)
CANDIDATES = [Candidate("blocked", c) for c in _BLOCKED] + [Candidate("rows", c) for c in _ROWS]


def objective(candidate: Candidate) -> EvalResult:
    """A smooth bowl per variant (the rows variant holds the optimum); num_warps=8 with ROWS=2
    fails to build, like a kernel out of registers."""
    c = candidate.config
    warps = math.log2(c["num_warps"])
    if candidate.variant == "blocked":
        time_us = 50.0 + 3 * (math.log2(c["BLOCK"]) - 8) ** 2 + 2 * (warps - 2) ** 2
    else:
        if c["ROWS"] == 2 and c["num_warps"] == 8:
            return EvalResult(candidate, "build", "out of resources")
        time_us = 40.0 + 4 * (math.log2(c["ROWS"]) - 1) ** 2 + 3 * (warps - 2) ** 2 + (0 if c["EVICT"] else 0.5)
    return EvalResult(candidate, "ok", metrics={"median_us": time_us})


BEST = min((objective(c) for c in CANDIDATES if objective(c).ok), key=lambda r: r.median_us).candidate


def drive(strategy, candidates=CANDIDATES, batch=3, budget=None):
    """The tuner's loop: propose a batch, evaluate, observe; returns the proposals in order."""
    strategy.setup(candidates)
    return keep_driving(strategy, batch, budget)


def keep_driving(strategy, batch=3, budget=None):
    """The same loop for a strategy already set up."""
    seen: list[Candidate] = []
    while (budget is None or len(seen) < budget) and (proposal := strategy.propose(batch)):
        assert len(proposal) <= batch
        seen.extend(proposal)
        strategy.observe([objective(c) for c in proposal])
    return seen


def _tpe(seed):
    pytest.importorskip("optuna")
    return make_strategy("tpe", seed=seed)


BUILDERS = {
    "tpe": _tpe,
    "coordinate": lambda seed: make_strategy("coordinate", seed=seed),
    "refine": lambda seed: Refine(RandomSearch(seed), 4, seed),
    "warm": lambda seed: WarmStart(CoordinateDescent(seed), [CANDIDATES[3], BEST, Candidate("gone", Config(a=1))]),
    "auto": lambda seed: make_strategy("auto", seed=seed, budget=10),
}


@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_proposes_every_candidate_exactly_once(name):
    seen = drive(BUILDERS[name](seed=3))
    assert len(seen) == len(set(seen)) == len(CANDIDATES)
    assert set(seen) == set(CANDIDATES)


@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_same_seed_same_order(name):
    first = drive(BUILDERS[name](seed=5), budget=12)
    assert first == drive(BUILDERS[name](seed=5), budget=12)


@pytest.mark.parametrize("name", ["tpe", "coordinate", "refine"])
def test_seeds_change_the_order(name):
    assert drive(BUILDERS[name](seed=1), budget=12) != drive(BUILDERS[name](seed=2), budget=12)


@pytest.mark.parametrize("name", ["tpe", "coordinate", "auto"])
def test_one_at_a_time_with_results_pending(name):
    """The tuner keeps several proposals in flight: results arrive late and out of order."""
    strategy = BUILDERS[name](seed=0)
    strategy.setup(CANDIDATES)
    pending: list[Candidate] = []
    seen: list[Candidate] = []
    rng = random.Random(0)
    while (proposal := strategy.propose(1)) or pending:
        seen.extend(proposal)
        pending.extend(proposal)
        if len(pending) >= 3 or not proposal:
            strategy.observe([objective(pending.pop(rng.randrange(len(pending))))])
    assert sorted(c.key for c in seen) == sorted(c.key for c in CANDIDATES)


# -- TPE ------------------------------------------------------------------------------------


def test_tpe_tells_failures_as_failures_and_times_as_values():
    optuna = pytest.importorskip("optuna")
    strategy = make_strategy("tpe", seed=0)
    drive(strategy)
    complete = [t for t in strategy.study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    failed = [c for c in CANDIDATES if not objective(c).ok]
    assert len(failed) == 2 and len(complete) == len(CANDIDATES) - len(failed)
    assert all(t.value >= 40.0 for t in complete)  # times, never a zero standing in for a failure
    broken = {"variant": "rows", "rows.ROWS": 2, "rows.num_warps": 8}
    outcomes = {t.state for t in strategy.study.trials if broken.items() <= t.params.items()}
    assert outcomes == {optuna.trial.TrialState.FAIL}


def test_tpe_learns_from_results_it_did_not_propose():
    optuna = pytest.importorskip("optuna")
    strategy = make_strategy("tpe", seed=0)
    strategy.setup(CANDIDATES)
    strategy.reserve([BEST])
    strategy.observe([objective(BEST), objective(Candidate("rows", Config(ROWS=2, num_warps=8, EVICT="")))])
    states = [t.state for t in strategy.study.trials]
    assert states == [optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.FAIL]
    assert BEST not in keep_driving(strategy)


def test_tpe_without_optuna_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "optuna", None)  # makes `import optuna` raise ImportError
    hint = r"pip install optuna \(or, from a kernelsmith checkout: pip install -e '\.\[search\]'\)"
    with pytest.raises(ImportError, match=hint):
        import_optuna()
    with pytest.raises(ImportError, match="kernelsmith"):
        make_strategy("tpe")


# -- coordinate descent ---------------------------------------------------------------------


def test_coordinate_descent_walks_to_the_optimum_from_a_bad_start():
    strategy = CoordinateDescent(seed=0)
    strategy.setup(CANDIDATES)
    start = Candidate("rows", Config(ROWS=8, num_warps=1, EVICT=""))
    strategy.reserve([start])
    strategy.observe([objective(start)])
    path = [start]
    for _ in range(12):
        [candidate] = strategy.propose(1)
        path.append(candidate)
        strategy.observe([objective(candidate)])
    assert BEST in path
    assert all(c.variant == "rows" for c in path[: path.index(BEST) + 1])  # no random jumps needed


def test_coordinate_neighbours_are_one_step_along_one_axis_and_skip_holes():
    strategy = CoordinateDescent(seed=0)
    strategy.setup(CANDIDATES)
    around = strategy.neighbours(Candidate("blocked", Config(BLOCK=128, num_warps=4)))
    assert {c.config.key for c in around} == {
        "BLOCK=256,num_warps=4",  # BLOCK=64 with 4 warps breaks the constraint: no smaller block
        "BLOCK=128,num_warps=2",
        # 8 warps need BLOCK >= 256: no larger warp count at this block
    }


def test_coordinate_tries_the_improving_direction_first():
    strategy = CoordinateDescent(seed=0)
    strategy.setup(CANDIDATES)
    a = Candidate("blocked", Config(BLOCK=64, num_warps=1))
    b = Candidate("blocked", Config(BLOCK=128, num_warps=1))
    strategy.reserve([a, b])
    strategy.observe([objective(a), objective(b)])  # BLOCK up improved
    assert strategy.propose(1)[0].config == Config(BLOCK=256, num_warps=1)


def test_coordinate_falls_back_to_unexplored_candidates_at_a_local_optimum():
    strategy = CoordinateDescent(seed=0)
    strategy.setup(CANDIDATES)
    strategy.reserve([BEST, *strategy.neighbours(BEST)])
    strategy.observe([objective(c) for c in [BEST, *strategy.neighbours(BEST)]])
    rest = keep_driving(strategy)
    assert len(rest) == len(CANDIDATES) - 1 - len(strategy.neighbours(BEST))


def test_refine_starts_with_the_other_strategy_then_descends():
    random_order = drive(RandomSearch(seed=4), budget=4, batch=1)
    refined = drive(Refine(RandomSearch(seed=4), 4, seed=4), batch=1)
    assert refined[:4] == random_order
    best_so_far = min(random_order, key=lambda c: objective(c).median_us if objective(c).ok else math.inf)
    probe = CoordinateDescent(seed=4)
    probe.setup(CANDIDATES)
    assert refined[4] in probe.neighbours(best_so_far)


# -- warm start -----------------------------------------------------------------------------


def _softmax(rows, width, dtype="bf16"):
    return OpSpec("softmax", (TensorSpec((rows, width), dtype),), {"dim": -1})


def _decision(spec, variant, config, fingerprint="fp-a", winner="kernel"):
    return DecisionRecord(fingerprint, spec.workload_hash, spec.op, spec.to_dict(), winner, variant, "", config)


def test_spec_distance_prefers_close_shapes_and_the_same_dtype():
    here = _softmax(4096, 4096)
    assert spec_distance(here, here) == 0.0
    assert spec_distance(here, _softmax(4096, 8192)) == 1.0
    assert spec_distance(here, _softmax(4096, 4096, "fp16")) == 0.5
    assert spec_distance(here, _softmax(4096, 4096, "fp32")) == 1.5
    assert spec_distance(here, OpSpec("softmax", (TensorSpec((2, 2048, 4096), "bf16"),), {"dim": -1})) == 0.0
    assert spec_distance(here, OpSpec("rmsnorm", here.inputs)) is None


def test_nearest_winners_come_from_the_database_nearest_first(tmp_path):
    here = _softmax(4096, 4096)
    with open_database(tmp_path / "warm.db") as db:
        db.put_decision(_decision(_softmax(4096, 16384), "blocked", {"BLOCK": 1024, "num_warps": 8}))  # 2.0
        rows_winner = {"ROWS": 2, "num_warps": 4, "EVICT": ""}
        db.put_decision(_decision(_softmax(8192, 4096, "fp16"), "rows", rows_winner))  # 1.5
        db.put_decision(_decision(_softmax(4096, 8192), "blocked", {"BLOCK": 512, "num_warps": 4}, winner="baseline"))
        db.put_decision(_decision(_softmax(4096, 2048), "gone", {"x": 1}))  # not a current candidate
        db.put_decision(_decision(here, "blocked", {"BLOCK": 64, "num_warps": 1}, fingerprint="fp-b"))  # other machine
        rms = OpSpec("rmsnorm", (TensorSpec((4096, 4096), "bf16"), TensorSpec((4096,), "bf16")), {"eps": 1e-6})
        db.put_decision(_decision(rms, "blocked", {"BLOCK": 256, "num_warps": 2}))  # another op
        winners = nearest_winners(db, here, CANDIDATES, fingerprint="fp-a")
        assert [c.key for c in winners] == [
            "blocked[BLOCK=512,num_warps=4]",  # distance 1.0
            "rows[EVICT=,ROWS=2,num_warps=4]",  # 1.5
            "blocked[BLOCK=1024,num_warps=8]",  # 2.0
        ]
        assert nearest_winners(db, here, CANDIDATES)[0].key == "blocked[BLOCK=64,num_warps=1]"  # any machine
        assert nearest_winners(db, here, CANDIDATES, fingerprint="fp-a", limit=1) == winners[:1]


def test_warm_start_proposes_the_seeds_first_and_never_again():
    seeds = [CANDIDATES[7], BEST]
    strategy = WarmStart(RandomSearch(seed=0), seeds)
    seen = drive(strategy, batch=1)
    assert seen[:2] == seeds
    assert len(seen) == len(set(seen)) == len(CANDIDATES)


# -- auto -----------------------------------------------------------------------------------


def test_auto_takes_the_grid_when_the_space_fits_the_budget():
    strategy = make_strategy("auto", budget=len(CANDIDATES))
    strategy.setup(CANDIDATES)
    assert isinstance(strategy.inner, GridSearch)


def test_auto_takes_tpe_for_a_large_space_and_budget():
    pytest.importorskip("optuna")
    from kernelsmith.strategies import TPESearch

    strategy = make_strategy("auto", budget=30)
    strategy.setup(CANDIDATES + [Candidate("extra", Config(i=i)) for i in range(40)])
    assert isinstance(strategy.inner, TPESearch)


@pytest.mark.parametrize("optuna_installed", [True, False])
def test_auto_takes_random_then_coordinate_for_a_small_budget_or_without_optuna(monkeypatch, optuna_installed):
    monkeypatch.setattr(auto_module, "optuna_available", lambda: optuna_installed)
    budget = 20 if optuna_installed else 40
    strategy = make_strategy("auto", budget=budget)
    strategy.setup(CANDIDATES)
    assert isinstance(strategy.inner, Refine)
    assert strategy.inner.stages[0][1] == 4  # two per variant


def test_auto_defaults_to_the_tuner_budget():
    assert AutoStrategy().budget == auto_module.DEFAULT_BUDGET == 50


def test_auto_warm_starts_when_the_database_has_neighbours(tmp_path):
    here = _softmax(4096, 4096)
    with open_database(tmp_path / "auto.db") as db:
        strategy = make_strategy("auto", budget=10, db=db, spec=here)
        strategy.setup(CANDIDATES)
        assert not isinstance(strategy.inner, WarmStart)  # an empty database: no neighbours
        db.put_decision(_decision(_softmax(4096, 8192), "rows", dict(BEST.config)))
        strategy = make_strategy("auto", budget=10, db=db, spec=here, fingerprint="fp-a")
        strategy.setup(CANDIDATES)
        assert isinstance(strategy.inner, WarmStart)
        assert strategy.propose(1) == [BEST]


# -- replay ---------------------------------------------------------------------------------


def synthetic_recorded_space() -> dict:
    """A recorded space shaped like an RMSNorm one on a GPU: four variants of different sizes,
    constraints, a few build failures, and a handful of configs near the roofline."""
    rng = random.Random(0)
    rows = []

    def add(variant, config, time_us):
        ok = time_us is not None
        noisy = round(time_us * (1 + rng.uniform(-0.01, 0.01)), 3) if ok else None
        rows.append({"variant": variant, "config": config, "status": "ok" if ok else "build",
                     "time_us": noisy, "error": "" if ok else "out of resources"})

    warps = (1, 2, 4, 8, 16, 32)
    for w in warps:
        for evict in ("", "evict_first"):
            add("whole_row", {"num_warps": w, "EVICT_X": evict}, 37 + 2.5 * (math.log2(w) - 3) ** 2 - bool(evict) * 0.4)
    for r in (2, 4):
        for w in warps[:-1]:
            add("multi_row", {"ROWS": r, "num_warps": w}, 38 + 2 * (math.log2(w) - 4) ** 2 + 1.5 * math.log2(r / 2))
    for b in (256, 512, 1024, 2048, 4096):
        for w in warps:
            for s in (1, 2, 3):
                if b >= 32 * w:
                    time_us = 41 + 1.5 * (math.log2(b) - 11) ** 2 + 1.5 * (math.log2(w) - 2) ** 2 + 0.8 * abs(s - 2)
                    add("looped", {"BLOCK_N": b, "num_warps": w, "num_stages": s}, time_us)
    for p in (1, 2, 4, 8):
        for w in warps:
            for s in (1, 2, 3):
                time_us = 35 + 3 * (math.log2(p) - 1) ** 2 + 1.2 * (math.log2(w) - 3) ** 2 + abs(s - 2)
                add("persistent", {"PROGRAMS_PER_SM": p, "num_warps": w, "num_stages": s},
                    None if w == 32 and s == 3 else time_us)
    spec = _softmax(8192, 4096).to_dict()
    return {"spec": spec, "meta": {"synthetic": True}, "candidates": rows}


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    path = tmp_path_factory.mktemp("replay") / "space.json"
    path.write_text(json.dumps(synthetic_recorded_space()))
    return RecordedSpace.load(path)


def test_recorded_space_round_trips(recorded):
    again = RecordedSpace.from_dict(json.loads(json.dumps(recorded.to_dict())))
    assert again.results == recorded.results
    assert recorded.name() == "softmax 8192x4096 bfloat16"
    assert sum(not r.ok for r in recorded.results) == 4


def test_replay_reaches_the_optimum_and_descent_beats_random(recorded):
    factories = {
        "grid": GridSearch,
        "random": RandomSearch,
        "refine": lambda seed: Refine(RandomSearch(seed), 8, seed),
    }
    summaries = {s.strategy: s for s in compare(recorded, factories, seeds=range(6), tolerance=0.0)}
    size = len(recorded.results)
    for summary in summaries.values():
        assert summary.reached == 6 and summary.space_size == size  # every strategy ends up at the best
    assert summaries["refine"].mean < summaries["random"].mean
    assert summaries["refine"].to_dict()["runs"] == summaries["refine"].runs


def test_replay_respects_the_budget_and_in_flight_workers(recorded):
    trace = replay(CoordinateDescent(seed=1), recorded, budget=20, workers=4)
    assert len(trace) == 20 and len({r.candidate for r in trace}) == 20
    assert evaluations_to_reach(trace, 0.0) is None


def test_replay_tpe_reaches_the_optimum(recorded):
    pytest.importorskip("optuna")
    [summary] = compare(recorded, {"tpe": lambda seed: make_strategy("tpe", seed=seed)}, seeds=range(2))
    assert summary.reached == 2
    assert summary.worst is not None and summary.worst < len(recorded.results)

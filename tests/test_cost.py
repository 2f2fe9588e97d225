"""Search cost: the cost record, the Pareto frontier of speed against cost, the scalarized choice,
and the view of stored trials in `kernelsmith db show` (old trials without per-trial seconds too)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

from kernelsmith import cost
from kernelsmith.cli.main import app
from kernelsmith.cost import CostPoint, SearchCost
from kernelsmith.db import DecisionRecord, Fingerprint, TrialRecord, current_fingerprint, open_database
from kernelsmith.evaluate.protocol import Candidate, EvalResult
from kernelsmith.ops import get_op
from kernelsmith.space import Config
from kernelsmith.tuner import tune_spec


def point(index: int, speedup: float | None, seconds: float | None = None) -> CostPoint:
    return CostPoint(index, "v", {"i": index}, "ok" if speedup else "build", speedup, index,
                     float(index) if seconds is None else seconds)


def ok_metrics(median_us: float, baseline_us: float = 10.0, **extra: float) -> dict[str, float]:
    return {"median_us": median_us, "baseline_median_us": baseline_us, **extra}


# ---- the frontier and the choice ---------------------------------------------------------------

def test_frontier_is_the_sequence_of_improvements_and_skips_failures():
    points = [point(1, 1.0), point(2, None), point(3, 0.9), point(4, 1.5), point(5, 1.5), point(6, 1.2)]
    assert [p.index for p in cost.pareto(points)] == [1, 4]  # 5 ties 4 at a higher cost: dominated


def test_equal_cost_keeps_the_fastest_and_exact_ties_the_earliest():
    points = [point(1, 1.0, seconds=2.0), point(2, 1.3, seconds=2.0), point(3, 1.3, seconds=2.0)]
    assert [p.index for p in cost.pareto(points, axis="seconds")] == [2]


def test_axis_changes_the_frontier():
    # The third candidate was found after fewer seconds than the second (the second was slow to build).
    points = [point(1, 1.0, seconds=1.0), point(2, 1.2, seconds=10.0), point(3, 1.3, seconds=10.5)]
    assert [p.index for p in cost.pareto(points, axis="evaluations")] == [1, 2, 3]
    cheap_fast = [point(1, 1.0, seconds=5.0), point(2, 1.2, seconds=1.0)]
    assert [p.index for p in cost.pareto(cheap_fast, axis="seconds")] == [2]
    with pytest.raises(ValueError, match="unknown cost axis"):
        cost.pareto(points, axis="dollars")


@given(st.lists(st.tuples(st.one_of(st.none(), st.floats(0.1, 3.0)), st.floats(0.0, 5.0)), max_size=30))
def test_frontier_points_are_exactly_the_undominated(rows):
    points, spent = [], 0.0
    for i, (speedup, seconds) in enumerate(rows, start=1):
        spent += seconds
        points.append(point(i, speedup, seconds=spent))
    frontier = cost.pareto(points, axis="seconds")
    ok = [p for p in points if p.speedup is not None]

    def dominates(a: CostPoint, b: CostPoint) -> bool:
        return a.seconds <= b.seconds and a.speedup >= b.speedup and (a.seconds, a.speedup) != (b.seconds, b.speedup)

    for p in frontier:
        assert not any(dominates(q, p) for q in ok)
    for p in ok:
        assert p in frontier or any(dominates(q, p) or (q.seconds, q.speedup) == (p.seconds, p.speedup)
                                    for q in frontier)


def test_scalarized_choice_trades_speed_for_cost():
    points = [point(1, 1.10), point(2, None), point(3, 1.20), point(4, 1.25)]  # total cost: 4 evaluations
    assert cost.choose(points, lam=0.0).index == 4
    assert cost.score(points[2], 0.4, 4.0) == pytest.approx(1.20 - 0.4 * 3 / 4)
    # lam = 0.4: scores 1.0, 0.9, 0.95: the first candidate was worth its speed at a quarter of the cost.
    assert cost.choose(points, lam=0.4).index == 1
    assert cost.choose([point(1, None)], lam=0.1) is None
    with pytest.raises(ValueError, match=">= 0"):
        cost.choose(points, lam=-1.0)


# ---- the cost record ---------------------------------------------------------------------------

def result(config: int, status: str = "ok", median_us: float = 5.0, seconds: float = 1.0) -> EvalResult:
    metrics = ok_metrics(median_us) if status == "ok" else {}
    return EvalResult(Candidate("v", Config({"x": config})), status, metrics=metrics, seconds=seconds)


def test_search_cost_names_interpreter_seconds_and_never_counts_them_as_gpu_time():
    results = [result(1, seconds=2.0), result(2, "build", seconds=0.5), result(3, median_us=4.0, seconds=9.0)]
    fresh = [True, True, False]  # the third came from the database: free in this search
    interp = cost.search_cost(results, fresh, "interpreter", wall_s=7.0, recheck_s=1.5)
    assert (interp.evaluations, interp.reused) == (2, 1)
    assert interp.interpreter_s == pytest.approx(4.0) and interp.gpu_s == 0.0
    assert "interpreter-s" in interp.describe() and "GPU" not in interp.describe()
    assert [p.index for p in interp.frontier] == [1]
    gpu = cost.search_cost(results, fresh, "gpu", wall_s=7.0)
    assert gpu.gpu_s == pytest.approx(2.5) and gpu.interpreter_s == 0.0 and "2.5 GPU-s" in gpu.describe()


def test_llm_accounting_fits_the_record_and_round_trips():
    record = cost.search_cost([result(1)], [True], "gpu", wall_s=1.0,
                              llm={"llm_input_tokens": 1200, "llm_output_tokens": 300, "llm_requests": 3})
    record.add_llm({"llm_input_tokens": 100, "llm_wall_s": 2.5, "unrelated": 7})
    assert record.tokens == 1600 and record.llm_requests == 3 and record.llm_wall_s == 2.5
    assert "1600 LLM tokens in 3 requests" in record.describe()
    totals = json.loads(json.dumps(record.totals()))
    assert "frontier" not in totals and SearchCost.from_dict({**totals, "future_field": 1}).tokens == 1600
    assert json.loads(json.dumps(record.to_dict()))["frontier"][0]["speedup"] == pytest.approx(2.0)


def trial(fp: str, index: int, status: str = "ok", **metrics: float) -> TrialRecord:
    return TrialRecord(fp, "w" * 16, "softmax", "v", "h", {"x": index}, status, metrics=dict(metrics))


def test_points_from_stored_trials_estimate_seconds_of_old_trials():
    trials = [
        trial("a", 1, **ok_metrics(8.0, validate_s=1.0, time_s=0.5)),  # older trial: no eval_s
        trial("a", 2, "timeout"),  # older failure: duration unknown, counted as 0
        trial("a", 3, **ok_metrics(5.0, eval_s=2.0, validate_s=9.0)),  # eval_s wins over the estimate
    ]
    points = cost.points_from_trials(trials)
    assert [(p.evaluations, p.seconds) for p in points] == [(1, 1.5), (2, 1.5), (3, 3.5)]
    assert [p.speedup for p in points] == [pytest.approx(1.25), None, pytest.approx(2.0)]


def test_summary_is_per_fingerprint_and_names_the_seconds():
    trials = [trial("g", 1, **ok_metrics(8.0, eval_s=1.0)), trial("i", 1, **ok_metrics(4.0)),
              trial("g", 2, **ok_metrics(4.0, eval_s=1.0))]
    summaries = {s["fingerprint"]: s for s in cost.summarize_trials(trials, {"g": "gpu", "i": "interpreter"}, lam=0.1,
                                                                     stored_costs={"g": {"llm_requests": 2}})}
    gpu, interp = summaries["g"], summaries["i"]
    assert gpu["seconds_name"] == "GPU-s" and gpu["gpu_s"] == 2.0 and not gpu["seconds_estimated"]
    assert [p["index"] for p in gpu["frontier"]] == [1, 2] and gpu["chosen"] == 2
    assert gpu["stored_cost"] == {"llm_requests": 2}
    assert interp["seconds_name"] == "interpreter-s" and "gpu_s" not in interp and interp["seconds_estimated"]


# ---- end to end ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    db = str(tmp_path_factory.mktemp("cost") / "c.db")
    spec = get_op("softmax").spec((5, 40), "float32")
    return db, spec, tune_spec(spec, budget=3, strategy="grid", db=db, workers=1)


def test_tuning_result_carries_its_cost_and_stores_per_trial_seconds(tuned):
    db, spec, result = tuned
    c = result.cost
    assert c.mode == "interpreter" and c.evaluations == result.evaluations == 3
    assert c.interpreter_s > 0 and c.gpu_s == 0.0 and c.tokens == 0 and c.wall_s > 0
    assert c.frontier and all(p.speedup for p in c.frontier)
    assert json.loads(json.dumps(result.to_dict()))["cost"]["evaluations"] == 3
    fp = current_fingerprint()
    with open_database(db) as database:
        trials = database.trials(fingerprint=fp.hash, workload=spec.workload_hash)
        decision = database.get_decision(fp.hash, spec.workload_hash)
    assert all(t.metrics["eval_s"] > 0 for t in trials)
    assert decision.metrics["cost"]["interpreter_s"] == pytest.approx(c.interpreter_s)
    again = tune_spec(spec, budget=3, strategy="grid", db=db)
    assert again.from_database and again.cost.evaluations == 0 and again.cost.interpreter_s == 0.0


def test_db_show_prints_the_frontier_of_a_tuned_workload(tuned):
    db, spec, _ = tuned
    shown = CliRunner().invoke(app, ["db", "show", spec.workload_hash, "--db", db, "--json", "--cost", "seconds"])
    assert shown.exit_code == 0, shown.output
    (summary,) = json.loads(shown.stdout)["cost"]
    assert summary["mode"] == "interpreter" and summary["axis"] == "seconds" and summary["evaluations"] == 3
    assert summary["stored_cost"]["evaluations"] == 3 and summary["chosen"] is not None
    text = CliRunner().invoke(app, ["db", "show", spec.workload_hash, "--db", db], env={"COLUMNS": "200"}).output
    assert "Pareto frontier" in text and "interpreter-s" in text and "last tuning run: 3 evaluations" in text


def test_db_show_works_on_trials_stored_before_the_cost_record(tmp_path):
    db = str(tmp_path / "old.db")
    fp = Fingerprint("gpu", "NVIDIA H200", 132, "9.0", "1", "12", "2.11", "3.6", "0.1.0")
    with open_database(db) as database:
        database.put_fingerprint(fp)
        for i, median in enumerate([9.0, 12.0, 7.0, 6.9], start=1):
            database.add_trial(trial(fp.hash, i, **ok_metrics(median, validate_s=1.0, time_s=1.0)))
        database.add_trial(trial(fp.hash, 5, "build"))
        database.put_decision(DecisionRecord(fp.hash, "w" * 16, "softmax", {}, "kernel", "v", "h", {"x": 4}))
    run = CliRunner().invoke
    shown = json.loads(run(app, ["db", "show", "w" * 16, "--db", db, "--json"]).stdout)["cost"][0]
    assert [p["index"] for p in shown["frontier"]] == [1, 3, 4] and shown["chosen"] == 4
    assert shown["seconds_estimated"] and shown["gpu_s"] == 8.0 and shown["failures"] == 1
    # Weighing cost: candidate 4 is about 1.5% faster than 3 but cost a fifth of the search more.
    assert json.loads(run(app, ["db", "show", "w" * 16, "--db", db, "--json", "--lambda", "0.2"]).stdout)[
        "cost"][0]["chosen"] == 3
    text = run(app, ["db", "show", "w" * 16, "--db", db], env={"COLUMNS": "200"}).output
    assert "GPU-s" in text and "estimated" in text and "chosen" in text
    bad = run(app, ["db", "show", "w" * 16, "--db", db, "--cost", "dollars"])
    assert bad.exit_code == 2 and "unknown cost axis" in bad.output

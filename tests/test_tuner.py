"""The engine end to end in the Triton interpreter: search, store, reuse, never re-measure."""

from __future__ import annotations

import pytest
import torch

import kernelsmith
from kernelsmith.db import TrialRecord, current_fingerprint, open_database
from kernelsmith.ops import UnsupportedWorkload, get_op
from kernelsmith.tuner import tune_spec


@pytest.fixture(scope="module")
def db_path(tmp_path_factory):
    return str(tmp_path_factory.mktemp("tune") / "t.db")


@pytest.fixture(scope="module")
def first(db_path):
    spec = get_op("softmax").spec((5, 40), "float32")
    return spec, tune_spec(spec, budget=4, strategy="grid", db=db_path, workers=2)


def test_first_tune_evaluates_within_budget_and_stores_everything(first, db_path):
    spec, result = first
    assert result.mode == "interpreter" and not result.from_database
    assert result.evaluations == 4 and result.failures == {}
    # Interpreter timings can never beat eager PyTorch; the honest answer is the baseline.
    assert result.winner == "baseline" and "interpreter" in result.note
    assert result.top and all(row["median_us"] > 0 for row in result.top)
    with open_database(db_path) as db:
        fp = current_fingerprint()
        trials = db.trials(fingerprint=fp.hash, workload=spec.workload_hash)
        assert len(trials) == 4 and all(t.status == "ok" for t in trials)
        assert all(t.metrics["timer"] == "host-clock-interpreter" for t in trials)
        decision = db.get_decision(fp.hash, spec.workload_hash)
        assert decision is not None and decision.winner == "baseline"


def test_same_workload_again_evaluates_nothing(first, db_path):
    spec, result = first
    again = tune_spec(spec, budget=4, strategy="grid", db=db_path)
    assert again.from_database and again.evaluations == 0
    assert again.winner == result.winner and again.median_us == result.median_us


def test_known_failures_are_never_measured_again(db_path):
    op = get_op("rmsnorm")
    spec = op.spec((3, 24), "float32")
    variant = op.variants[0]
    config = variant.space(spec).configs()[0]
    fp = current_fingerprint()
    with open_database(db_path) as db:
        db.add_trial(
            TrialRecord(
                fp.hash,
                spec.workload_hash,
                spec.op,
                variant.name,
                variant.source_hash,
                config.to_dict(),
                "timeout",
                "planted: hung earlier",
            )
        )
    result = tune_spec(spec, budget=2, strategy="grid", db=db_path, workers=2)
    # The grid's first candidate is the planted failure: reused from the database, not evaluated,
    # and not charged to the budget, so two other candidates are evaluated.
    assert result.failures == {"timeout": 1}
    assert set(result.failure_examples) == {"timeout"}
    assert "planted: hung earlier" in result.failure_examples["timeout"]
    assert result.evaluations == 2
    with open_database(db_path) as db:
        trials = db.trials(fingerprint=fp.hash, workload=spec.workload_hash)
    assert [t.status for t in trials].count("timeout") == 1 and len(trials) == 3


def test_public_tune_from_example_tensors(db_path):
    x = torch.randn(2, 3, 16)
    result = kernelsmith.tune("softmax", x, budget=1, strategy="grid", db=db_path, workers=1)
    assert result.evaluations == 1 and result.spec["inputs"][0]["shape"] == [2, 3, 16]


def test_bad_requests_fail_early(db_path):
    spec = get_op("softmax").spec((4, 8), "float32")
    with pytest.raises(ValueError, match="budget"):
        tune_spec(spec, budget=0, db=db_path)
    with pytest.raises(ValueError, match="unknown strategy"):
        tune_spec(spec, strategy="nope", db=db_path)
    with pytest.raises(UnsupportedWorkload):
        kernelsmith.tune("softmax", torch.randn(8, 4).t(), db=db_path)


def test_bandwidth_above_the_copy_ceiling_is_a_cheat():
    from kernelsmith.evaluate.protocol import Candidate, EvalResult
    from kernelsmith.space import Config
    from kernelsmith.tuner import plausible

    fast = EvalResult(Candidate("v", Config(a=1)), "ok", metrics={"gbps": 5000.0, "median_us": 1.0})
    judged = plausible(fast, copy_gbps=4200.0)
    assert judged.status == "cheat" and "copy bandwidth" in judged.error
    fine = EvalResult(Candidate("v", Config(a=1)), "ok", metrics={"gbps": 4000.0, "median_us": 1.0})
    assert plausible(fine, copy_gbps=4200.0) is fine
    assert plausible(fast, copy_gbps=None) is fast  # interpreter mode has no ceiling

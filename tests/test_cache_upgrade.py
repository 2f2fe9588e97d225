"""A cache that survives upgrades and serves deployment (issue 14, item 6), in the interpreter.

A decision stored under a *near* fingerprint (another driver build or kernelsmith release, the
same GPU, CUDA, torch and Triton) is re-validated here by the real harness and re-timed against
the baseline before it is stored under this fingerprint and served; one whose variant source
changed is never served. The switches: force-retune, database-only, fail-if-not-tuned.

Interpreter timings never beat eager PyTorch, so where a test is about what the tuner does with a
win, the final paired re-timing is told the candidate took a fraction of the baseline's time
(:class:`_Retimed`); building, validating and timing the candidate stay real.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
import torch

import kernelsmith
from kernelsmith import tuner
from kernelsmith.db import DecisionRecord, Fingerprint, TrialRecord, current_fingerprint, open_database
from kernelsmith.evaluate.protocol import Candidate
from kernelsmith.ops import get_op
from kernelsmith.strategies import make_strategy
from kernelsmith.tuner import NotTunedError, tune_spec

FAMILY = get_op("softmax")
SPEC = FAMILY.spec((5, 40), "float32")
VARIANT = FAMILY.variants[0]
CONFIG = VARIANT.space(SPEC).configs()[0]
CANDIDATE = Candidate(VARIANT.name, CONFIG)


class _Retimed:
    """The real executor, recording what it was asked, whose final paired re-timing reports each
    successful candidate at ``factor`` times the baseline's samples."""

    def __init__(self, inner: Any, factor: float) -> None:
        self.inner, self.factor = inner, factor
        self.submitted: list[Candidate] = []
        self.retimed: list[Candidate] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def __enter__(self) -> _Retimed:
        self.inner.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.inner.__exit__(*exc)

    def submit(self, spec: Any, candidate: Candidate, *args: Any, **kwargs: Any) -> Any:
        self.submitted.append(candidate)
        return self.inner.submit(spec, candidate, *args, **kwargs)

    def evaluate_together(self, spec: Any, candidates: Any, timing: Any = None) -> Any:
        self.retimed.extend(candidates)
        results = self.inner.evaluate_together(spec, candidates, timing)
        out = []
        for r in results:
            if r.ok:
                samples = [self.factor * b for b in r.metrics["baseline_samples_us"]]
                r = replace(r, metrics={**r.metrics, "samples_us": samples,
                                        "median_us": self.factor * r.metrics["baseline_median_us"]})
            out.append(r)
        return out


class _Made(list[_Retimed]):
    """The executors a test made; ``factor`` is the one the next gets."""

    factor = 0.5  # the kernel twice as fast as the baseline


@pytest.fixture
def executors(monkeypatch: pytest.MonkeyPatch) -> _Made:
    """Every executor the tuner makes in the test, each a :class:`_Retimed`."""
    made = _Made()
    real = tuner.make_executor

    def make(*args: Any, **kwargs: Any) -> _Retimed:
        made.append(_Retimed(real(*args, **kwargs), made.factor))
        return made[-1]

    monkeypatch.setattr(tuner, "make_executor", make)
    return made


@pytest.fixture
def db_path(tmp_path: Any) -> str:
    return str(tmp_path / "cache.db")


def _plant(db_path: str, fp: Fingerprint, *, source_hash: str = VARIANT.source_hash) -> DecisionRecord:
    """A kernel decision for SPEC measured under ``fp``, as an older install stored it."""
    decision = DecisionRecord(
        fingerprint=fp.hash, workload=SPEC.workload_hash, op=SPEC.op, spec=SPEC.to_dict(), winner="kernel",
        variant=VARIANT.name, source_hash=source_hash, config=CONFIG.to_dict(),
        metrics={"speedup": 1.8, "ci_low": 1.6, "ci_high": 2.0}, strategy="grid", evaluations=30,
    )
    with open_database(db_path) as db:
        db.put_fingerprint(fp)
        db.put_decision(decision)
    return decision


def _here() -> Fingerprint:
    return current_fingerprint("interpreter")


@pytest.mark.parametrize("change", [{"driver": "535.104.05 / CUDA 12.2"}, {"kernelsmith": "0.0.9"}])
def test_a_cache_survives_a_changed_driver_string_with_a_revalidation(
    executors: _Made, db_path: str, change: dict[str, str]
) -> None:
    old = Fingerprint(**{**_here().to_dict(), **change})
    assert old.near(_here())
    _plant(db_path, old)

    result = tune_spec(SPEC, budget=5, db=db_path, workers=1, mode="interpreter")

    # Re-validated: the one carried candidate went through the harness here (built, validated
    # on fresh data, timed), then was re-timed against the baseline, and nothing else ran.
    (executor,) = executors
    assert executor.submitted == [CANDIDATE] and executor.retimed == [CANDIDATE]
    assert result.winner == "kernel" and result.evaluations == 1 and not result.from_database
    assert result.variant == VARIANT.name and result.best_config == CONFIG.to_dict()
    with open_database(db_path) as db:
        (trial,) = db.trials(fingerprint=_here().hash, workload=SPEC.workload_hash)
        assert trial.status == "ok" and trial.source_hash == VARIANT.source_hash
        stored = db.get_decision(_here().hash, SPEC.workload_hash)
    assert stored is not None and stored.strategy == tuner.REVALIDATED and stored.origin == "local"
    assert stored.metrics["revalidated_from"] == [old.hash]
    assert stored.metrics["speedup"] == pytest.approx(2.0)  # this machine's figure, not the old 1.8

    # Then served: the next call finds it under this fingerprint and evaluates nothing.
    again = tune_spec(SPEC, budget=5, db=db_path, workers=1, mode="interpreter", database_only=True)
    assert again.from_database and again.winner == "kernel" and again.evaluations == 0
    assert len(executors) == 1  # no executor was even started


def test_a_record_whose_variant_source_changed_is_not_served(executors: _Made, db_path: str) -> None:
    old = Fingerprint(**{**_here().to_dict(), "kernelsmith": "0.0.9"})
    _plant(db_path, old, source_hash="0123456789abcdef")  # the variant was edited since

    result = tune_spec(SPEC, budget=5, db=db_path, workers=1, mode="interpreter", database_only=True)

    assert result.winner == "baseline" and result.evaluations == 0 and "not tuned" in result.note
    assert executors == []  # nothing of it ran: no worker was even started
    with open_database(db_path) as db:
        assert db.get_decision(_here().hash, SPEC.workload_hash) is None
    with pytest.raises(NotTunedError, match="did not re-validate"):
        tune_spec(SPEC, budget=5, db=db_path, workers=1, mode="interpreter", require_tuned=True)


def test_a_record_that_no_longer_beats_the_baseline_is_not_served(executors: _Made, db_path: str) -> None:
    executors.factor = 1.5  # here, the old winner is slower than the baseline
    _plant(db_path, Fingerprint(**{**_here().to_dict(), "driver": "550.54.14 / CUDA 12.4"}))

    result = tune_spec(SPEC, budget=5, db=db_path, workers=1, mode="interpreter", database_only=True)

    assert executors[0].submitted == [CANDIDATE] and executors[0].retimed == [CANDIDATE]
    assert result.winner == "baseline" and result.evaluations == 1
    with open_database(db_path) as db:
        assert db.get_decision(_here().hash, SPEC.workload_hash) is None  # nothing stored: not a search


@pytest.mark.parametrize("change", [{"torch": "2.0.0"}, {"triton": "2.0.0"}, {"cuda": "11.8"},
                                    {"gpu_name": "NVIDIA A100"}, {"sm_count": 7}])
def test_a_record_of_another_toolchain_or_gpu_is_never_served(
    executors: _Made, db_path: str, change: dict[str, Any]
) -> None:
    other = Fingerprint(**{**_here().to_dict(), **change})
    assert not other.near(_here())
    _plant(db_path, other)
    with pytest.raises(NotTunedError, match=SPEC.workload_hash):
        tune_spec(SPEC, budget=5, db=db_path, workers=1, mode="interpreter", require_tuned=True)
    assert executors == []


def test_require_tuned_raises_naming_the_workload(
    executors: _Made, db_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(NotTunedError) as caught:
        tune_spec(SPEC, budget=5, db=db_path, mode="interpreter", require_tuned=True)
    assert SPEC.describe() in str(caught.value) and SPEC.workload_hash in str(caught.value)
    assert caught.value.spec == SPEC and caught.value.fingerprint == _here().hash
    monkeypatch.setenv("KERNELSMITH_REQUIRE_TUNED", "yes")  # the setting, for CI and deployment
    with pytest.raises(NotTunedError):
        tune_spec(SPEC, budget=5, db=db_path, mode="interpreter")
    assert executors == []


def test_database_only_never_tunes(executors: _Made, db_path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KERNELSMITH_DATABASE_ONLY", "on")
    result = tune_spec(SPEC, budget=5, db=db_path, mode="interpreter")
    assert result.winner == "baseline" and result.evaluations == 0 and not result.from_database
    assert executors == []
    with open_database(db_path) as db:
        assert db.decisions() == [] and db.trials() == []
    with pytest.raises(ValueError, match="contradicts"):
        tune_spec(SPEC, budget=5, db=db_path, mode="interpreter", force=True)
    monkeypatch.setenv("KERNELSMITH_FORCE_RETUNE", "1")  # the setting yields: a deployment never tunes
    assert tune_spec(SPEC, budget=5, db=db_path, mode="interpreter").evaluations == 0
    assert executors == []


def test_force_retune_measures_afresh(executors: _Made, db_path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    executors.factor = 1.0
    here = _here()
    grid = make_strategy("grid")
    grid.setup([Candidate(v.name, c) for v in FAMILY.variants for c in v.space(SPEC).configs()])
    first_two = grid.propose(2)
    with open_database(db_path) as db:  # a finished grid run of budget 2: its two trials, its decision
        db.put_fingerprint(here)
        for c in first_two:
            metrics = {"median_us": 9.0, "baseline_median_us": 9.0, "gbps": 1.0}
            db.add_trial(TrialRecord(here.hash, SPEC.workload_hash, SPEC.op, c.variant,
                                     FAMILY.variant(c.variant).source_hash, c.config.to_dict(), "ok",
                                     metrics=metrics, created_at=1.0))
        db.put_decision(DecisionRecord(here.hash, SPEC.workload_hash, SPEC.op, SPEC.to_dict(), "baseline",
                                       created_at=1.0))
    assert tune_spec(SPEC, budget=2, strategy="grid", db=db_path, mode="interpreter").from_database

    monkeypatch.setenv("KERNELSMITH_FORCE_RETUNE", "1")
    forced = tune_spec(SPEC, budget=2, strategy="grid", db=db_path, workers=1, mode="interpreter")

    # The same two candidates measured again (their old trials are not reused), and decided anew.
    assert not forced.from_database and forced.evaluations == 2
    assert executors[0].submitted == first_two
    with open_database(db_path) as db:
        trials = db.trials(fingerprint=here.hash, workload=SPEC.workload_hash)
        decision = db.get_decision(here.hash, SPEC.workload_hash)
    assert len(trials) == 4 and all(t.created_at > 1.0 for t in trials[2:])
    assert decision is not None and decision.created_at > 1.0 and decision.evaluations == 2


# ---- the decorator's switches -------------------------------------------------------------------
def last_dim_softmax(x: torch.Tensor) -> torch.Tensor:
    return torch.softmax(x, dim=-1)


X = torch.randn(5, 40)
BUCKET = FAMILY.bucket(FAMILY.spec_for(X))


def _plant_bucket(db_path: str, fp: Fingerprint) -> None:
    """A kernel decision for the decorator's bucket of X, measured under ``fp``."""
    config = VARIANT.space(BUCKET).configs()[0]
    with open_database(db_path) as db:
        db.put_fingerprint(fp)
        db.put_decision(DecisionRecord(fp.hash, BUCKET.workload_hash, BUCKET.op, BUCKET.to_dict(), "kernel",
                                       VARIANT.name, VARIANT.source_hash, config.to_dict(), strategy="grid"))


def test_database_only_decorator_serves_a_revalidated_record_of_an_older_driver(
    executors: _Made, db_path: str
) -> None:
    _plant_bucket(db_path, Fingerprint(**{**_here().to_dict(), "driver": "535.104.05 / CUDA 12.2"}))
    fn = kernelsmith.optimize(last_dim_softmax, mode="db", db=db_path)
    fn(X)  # the first call re-validates the record here (no search), then adopts it
    assert fn(X).shape == X.shape
    assert executors[0].submitted and fn.kernelsmith.stats["kernel_calls"] == 1
    with open_database(db_path) as db:
        assert db.get_decision(_here().hash, BUCKET.workload_hash).strategy == tuner.REVALIDATED


def test_require_tuned_decorator_raises_on_the_first_call(db_path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    fn = kernelsmith.optimize(last_dim_softmax, db=db_path, require_tuned=True)
    with pytest.raises(kernelsmith.NotTunedError, match=BUCKET.workload_hash):
        fn(X)
    assert fn.kernelsmith.stats["tunes"] == 0
    monkeypatch.setenv("KERNELSMITH_DATABASE_ONLY", "1")  # the quiet form: the original runs
    quiet = kernelsmith.optimize(last_dim_softmax, db=db_path)
    assert torch.equal(quiet(X), torch.softmax(X, -1))
    assert quiet.kernelsmith.stats["tunes"] == 0
    assert "database-only" in next(iter(quiet.kernelsmith.reasons.values()))
    with pytest.raises(ValueError, match="contradicts"):
        kernelsmith.optimize(last_dim_softmax, force_retune=True, require_tuned=True)


def test_force_retune_decorator_tunes_a_stored_workload_again(db_path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    with open_database(db_path) as db:  # tuned before: the baseline won
        db.put_fingerprint(_here())
        db.put_decision(DecisionRecord(_here().hash, BUCKET.workload_hash, BUCKET.op, BUCKET.to_dict(), "baseline"))
    asked: list[dict[str, Any]] = []

    def tune_spec_spy(spec: Any, **kwargs: Any) -> Any:
        asked.append({"spec": spec, **kwargs})
        return tuner.TuneResult(op=spec.op, workload=spec.workload_hash, spec=spec.to_dict(), mode="interpreter",
                                winner="baseline")

    monkeypatch.setattr(tuner, "tune_spec", tune_spec_spy)
    plain = kernelsmith.optimize(last_dim_softmax, db=db_path)
    plain(X)
    assert asked == []  # served from the database
    forced = kernelsmith.optimize(last_dim_softmax, db=db_path, force_retune=True)
    forced(X)
    assert len(asked) == 1 and asked[0]["spec"] == BUCKET and asked[0]["force"] is True
    monkeypatch.setenv("KERNELSMITH_FORCE_RETUNE", "true")
    kernelsmith.optimize(last_dim_softmax, db=db_path)(X)
    assert len(asked) == 2 and asked[1]["force"] is True


# ---- warm start across fingerprints of the GPU model --------------------------------------------
def test_warm_start_seeds_from_every_fingerprint_of_the_gpu_model(db_path: str) -> None:
    """After a Triton upgrade (not near: never served) the old winner is still the first seed;
    another GPU's winner is never one."""
    from kernelsmith.strategies import nearest_winners

    candidates = [Candidate(v.name, c) for v in FAMILY.variants for c in v.space(SPEC).configs()]
    old_triton = Fingerprint(**{**_here().to_dict(), "triton": "2.0.0"})
    other_gpu = Fingerprint(**{**_here().to_dict(), "gpu_name": "another chip"})
    planted = {fp.hash: c for fp, c in [(old_triton, candidates[1]), (other_gpu, candidates[2])]}
    with open_database(db_path) as db:
        db.put_fingerprint(_here())
        for fp in (old_triton, other_gpu):
            c = planted[fp.hash]
            db.put_fingerprint(fp)
            db.put_decision(DecisionRecord(fp.hash, SPEC.workload_hash, SPEC.op, SPEC.to_dict(), "kernel",
                                           c.variant, FAMILY.variant(c.variant).source_hash, c.config.to_dict()))
        assert nearest_winners(db, SPEC, candidates, fingerprint=_here().hash) == [candidates[1]]
        assert set(nearest_winners(db, SPEC, candidates)) == {candidates[1], candidates[2]}  # no fingerprint: all


def test_the_tune_command_forces_with_force(monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from kernelsmith.cli.main import app

    asked: list[Any] = []

    def tune_spec_spy(spec: Any, **kwargs: Any) -> Any:
        asked.append(kwargs.get("force"))
        return tuner.TuneResult(op=spec.op, workload=spec.workload_hash, spec=spec.to_dict(), mode="interpreter",
                                winner="baseline")

    monkeypatch.setattr(tuner, "tune_spec", tune_spec_spy)
    for flags in (["--force"], []):
        result = CliRunner().invoke(app, ["tune", "softmax", "--shape", "5x40", "--dtype", "fp32", "--json", *flags])
        assert result.exit_code == 0, result.output
    assert asked == [True, None]  # without the flag, KERNELSMITH_FORCE_RETUNE decides

"""Tuners sharing a database never evaluate a candidate twice (issue 16, part 3).

The search's loop with a stand-in evaluator (no workers: what is under test is who evaluates
which candidate, not the harness): a candidate another tuner claimed is waited for and its
trial reused, free of budget; one whose claim lapsed (that tuner died) is evaluated here; every
claim this search took is released once its trial is stored.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future
from typing import Any

import torch

from kernelsmith.db import open_database
from kernelsmith.db.fingerprint import current_fingerprint
from kernelsmith.evaluate.protocol import Candidate, EvalResult
from kernelsmith.ops import get_op
from kernelsmith.tuner import _Search, _trial


class _Evaluator:
    """Evaluates at once, recording what it was asked to evaluate."""

    n_workers = 2

    def __init__(self) -> None:
        self.submitted: list[Candidate] = []

    def submit(self, spec: Any, candidate: Candidate, **_: Any) -> Future[EvalResult]:
        self.submitted.append(candidate)
        future: Future[EvalResult] = Future()
        source_hash = get_op("rmsnorm").variant(candidate.variant).source_hash  # as a worker reports it
        future.set_result(EvalResult(candidate, "ok", metrics={"median_us": 2.0, "baseline_median_us": 3.0},
                                     source_hash=source_hash))
        return future


def _search(db: Any) -> tuple[_Search, _Evaluator]:
    family = get_op("rmsnorm")
    spec = family.spec_for(torch.randn(4, 64), torch.randn(64))
    evaluator = _Evaluator()
    search = _Search(family, spec, current_fingerprint("interpreter"), db, evaluator, None)  # type: ignore[arg-type]
    return search, evaluator


def _key(search: _Search, candidate: Candidate) -> tuple[str, str, str, str, str]:
    return (search.fp.hash, search.spec.workload_hash, *search._candidate_id(candidate))


def test_a_candidate_another_tuner_is_measuring_is_waited_for_not_evaluated(tmp_path: Any) -> None:
    with open_database(tmp_path / "shared.db") as db:
        search, evaluator = _search(db)
        candidates = search.candidates()
        taken = candidates[0]
        assert db.claim_evaluation(*_key(search, taken), owner="other-tuner")
        theirs = EvalResult(taken, "ok", metrics={"median_us": 1.0, "baseline_median_us": 3.0},
                            source_hash=search._source_hash(taken))

        def other_tuner_finishes() -> None:
            time.sleep(1.0)
            db.add_trial(_trial(search.fp, search.spec, theirs))
            db.release_evaluation(*_key(search, taken), owner="other-tuner")

        worker = threading.Thread(target=other_tuner_finishes)
        worker.start()
        search.run("grid", budget=len(candidates), seed=0)
        worker.join()
        assert taken not in evaluator.submitted  # measured once, by the other tuner
        assert len(evaluator.submitted) == len(candidates) - 1
        reused = [r for r, fresh in zip(search.results, search.fresh, strict=True) if not fresh]
        assert [r.candidate for r in reused] == [taken] and reused[0].metrics["median_us"] == 1.0
        assert len(db.trials()) == len(candidates)  # one trial per candidate, none twice
        assert search.claimed == set()
        assert not any(db.claim_evaluation(*_key(search, c), owner="third") for c in candidates)


def test_a_dead_tuners_claim_lapses_and_the_candidate_is_evaluated_here(tmp_path: Any) -> None:
    with open_database(tmp_path / "shared.db") as db:
        search, evaluator = _search(db)
        candidates = search.candidates()
        assert db.claim_evaluation(*_key(search, candidates[0]), owner="dead-tuner", ttl_s=0.5)
        search.run("grid", budget=len(candidates), seed=0)
        assert sorted(c.key for c in evaluator.submitted) == sorted(c.key for c in candidates)
        assert len(db.trials()) == len(candidates) and search.claimed == set()

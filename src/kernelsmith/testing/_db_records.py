"""The records the database suite writes, and the processes that write them concurrently.

Part of the shared database test suite (:mod:`kernelsmith.testing.db_suite`): two fingerprints,
:func:`make_trial` and :func:`make_decision` with defaults a test overrides field by field, and the
module-level worker functions (importable, so ``multiprocessing`` can start them) of the
two-process and eight-writer claim tests.
"""

from __future__ import annotations

import time
from typing import Any

from kernelsmith.db import (
    DecisionRecord,
    Fingerprint,
    TrialRecord,
    open_database,
)

GPU_FP = Fingerprint(
    mode="gpu", gpu_name="NVIDIA H200", sm_count=132, compute_capability="9.0", driver="13.0",
    cuda="12.8", torch="2.11.0", triton="3.6.0", kernelsmith="0.1.0",
)
INTERP_FP = Fingerprint(
    mode="interpreter", gpu_name="triton-interpreter", sm_count=0, compute_capability="cpu",
    driver="none", cuda="none", torch="2.11.0", triton="3.6.0", kernelsmith="0.1.0",
)


def make_trial(
    fingerprint: str = INTERP_FP.hash,
    workload: str = "softmax:f16:4096x4096",
    op: str = "softmax",
    variant: str = "row",
    source_hash: str = "src0",
    config: dict[str, Any] | None = None,
    status: str = "ok",
    error: str = "",
    metrics: dict[str, Any] | None = None,
) -> TrialRecord:
    """A trial with plausible defaults; tests override only what they are about."""
    if metrics is None:
        metrics = {"median_us": 12.5, "baseline_median_us": 20.0} if status == "ok" else {}
    return TrialRecord(
        fingerprint=fingerprint, workload=workload, op=op, variant=variant,
        source_hash=source_hash,
        config={"BLOCK": 128, "num_warps": 4} if config is None else config,
        status=status, error=error, metrics=metrics,
    )


def make_decision(
    fingerprint: str = INTERP_FP.hash,
    workload: str = "softmax:f16:4096x4096",
    op: str = "softmax",
    winner: str = "kernel",
    config: dict[str, Any] | None = None,
    speedup: float = 1.6,
) -> DecisionRecord:
    return DecisionRecord(
        fingerprint=fingerprint, workload=workload, op=op,
        spec={"shape": [4096, 4096], "dtype": "float16"}, winner=winner,
        variant="row" if winner == "kernel" else "",
        source_hash="src0" if winner == "kernel" else "",
        config={"BLOCK": 128} if config is None else config,
        metrics={"median_us": 12.5, "baseline_median_us": 20.0, "speedup": speedup},
        strategy="exhaustive", evaluations=8,
    )


def _write_trials(location: str, worker: int, n: int, start: Any) -> None:
    """Child process body for the concurrency test: ``n`` trials, one transaction each.

    Both children open their connection first and then pass a barrier, so that their writes
    really interleave rather than one finishing before the other has started.
    """
    with open_database(location) as db:
        start.wait(timeout=60)
        for i in range(n):
            db.add_trial(make_trial(workload=f"w{worker}", config={"i": i}))


# The load test: 8 writers, each going through every (workload, config) pair of 4 workloads x
# 10 configs in its own order, so that every pair is contended.
LOAD_WRITERS, LOAD_WORKLOADS, LOAD_CONFIGS = 8, 4, 10


def _load_checksum(workload: str, config_key: str, owner: str) -> str:
    import hashlib

    return hashlib.sha256(f"{workload}|{config_key}|{owner}".encode()).hexdigest()[:16]


def _claim_and_write(location: str, worker: int, start: Any, results: Any) -> None:
    """Child process body for the load test: what one tuner does with each candidate.

    Reuse a stored trial; else claim the candidate, "evaluate" it, store its trial and release
    the claim; a candidate claimed by another is read back once its trial is stored. Reports
    ``(worker, pairs it won, decisions it saw after everyone wrote theirs)``.
    """
    import random

    owner = f"writer-{worker}"
    pairs = [(f"load{w}", i) for w in range(LOAD_WORKLOADS) for i in range(LOAD_CONFIGS)]
    random.Random(worker).shuffle(pairs)
    won: list[tuple[str, int]] = []
    with open_database(location) as db:
        start.wait(timeout=60)
        pending = pairs
        while pending:
            waiting = []
            for workload, i in pending:
                key = (INTERP_FP.hash, workload, "row", "src0", f"i={i}")
                if db.find_trial(*key) is not None:
                    continue
                if not db.claim_evaluation(*key, owner=owner):
                    waiting.append((workload, i))
                    continue
                metrics = {"median_us": 1.0 + i, "checksum": _load_checksum(workload, f"i={i}", owner),
                           "owner": owner}
                db.add_trial(make_trial(workload=workload, config={"i": i}, metrics=metrics))
                db.release_evaluation(*key, owner=owner)
                won.append((workload, i))
            pending = waiting
            if pending:
                time.sleep(0.01)
        db.put_decision(make_decision(workload=f"load{worker % LOAD_WORKLOADS}", speedup=1.0 + worker))
        start.wait(timeout=60)  # every writer's decision is stored now
        seen = len(db.decisions())
    results.put((worker, won, seen))


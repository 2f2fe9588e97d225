"""What a tuning run returns, and the database records the tuner reads and writes.

Part of the tuner (:mod:`kernelsmith.tuner`): :class:`TuneResult`; a measured result as a
:class:`~kernelsmith.db.TrialRecord` and back (so a search resumes from stored trials); a stored
decision as a result; the near fingerprints' decisions a search re-validates (:func:`_carried`);
and the copy-bandwidth ceiling, measured once per fingerprint. The search itself is in
:mod:`~kernelsmith._tuner_search`.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field
from typing import Any

from kernelsmith.cost import EVAL_SECONDS_KEY, SearchCost
from kernelsmith.db import Database, DecisionRecord, Fingerprint, TrialRecord
from kernelsmith.db.claims import candidate_of
from kernelsmith.evaluate.executor import Executor
from kernelsmith.evaluate.protocol import Candidate, EvalResult
from kernelsmith.spec import OpSpec

log = logging.getLogger("kernelsmith.tuner")  # this code's logger in tuner.py


@dataclass
class TuneResult:
    """What a tuning run found. ``winner`` is "kernel" or "baseline".

    ``variant`` and ``best_config`` are the kernel that serves, so both are empty when the
    baseline wins; the best candidate measured (kept for the record, a baseline decision
    included) is ``candidate_variant`` / ``candidate_config``. ``speedup_vs_baseline`` (and
    ``speedup_ci``) are against ``baseline``: the op's PyTorch reference run eagerly in the same
    worker. ``compile_us`` / ``compile_speedup`` / ``compile_ci`` are against that reference
    compiled by torch.compile, None where it was not timed (the interpreter, by default) or did not
    compile (:mod:`kernelsmith.versus` says so wherever a speedup is shown).
    """

    op: str
    workload: str
    spec: dict[str, Any]
    mode: str
    winner: str
    variant: str = ""
    best_config: dict[str, Any] = field(default_factory=dict)
    candidate_variant: str = ""
    candidate_config: dict[str, Any] = field(default_factory=dict)
    baseline: str = "eager"
    median_us: float | None = None
    baseline_us: float | None = None
    speedup_vs_baseline: float | None = None
    speedup_ci: tuple[float, float] | None = None
    compile_us: float | None = None
    compile_speedup: float | None = None
    compile_ci: tuple[float, float] | None = None
    gbps: float | None = None
    pct_of_copy_bandwidth: float | None = None
    copy_gbps: float | None = None
    evaluations: int = 0
    from_database: bool = False
    failures: dict[str, int] = field(default_factory=dict)
    failure_examples: dict[str, str] = field(default_factory=dict)  # status -> the first error seen
    wall_s: float = 0.0
    fingerprint: str = ""
    strategy: str = ""
    top: list[dict[str, Any]] = field(default_factory=list)
    note: str = ""
    timing_mode: str = ""  # "stream", "graph-replay" or "host-clock": how the decision's figures were timed
    cost: SearchCost = field(default_factory=SearchCost)  # what this run spent (see kernelsmith.cost)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["speedup_ci"] = list(self.speedup_ci) if self.speedup_ci else None
        data["compile_ci"] = list(self.compile_ci) if self.compile_ci else None
        return data


def _trial(fp: Fingerprint, spec: OpSpec, result: EvalResult) -> TrialRecord:
    return TrialRecord(
        fingerprint=fp.hash,
        workload=spec.workload_hash,
        op=spec.op,
        variant=result.candidate.variant,
        source_hash=result.source_hash,
        config=result.candidate.config.to_dict(),
        status=result.status,
        error=result.error,
        metrics={**result.metrics, EVAL_SECONDS_KEY: result.seconds},
    )


def _from_trial(record: TrialRecord, candidate: Candidate) -> EvalResult:
    return EvalResult(candidate, record.status, record.error, dict(record.metrics), record.source_hash)

def _result_from_decision(
    decision: DecisionRecord,
    fp: Fingerprint,
    *,
    from_database: bool,
    evaluations: int,
    failures: dict[str, int] | None = None,
    failure_examples: dict[str, str] | None = None,
    wall_s: float = 0.0,
    top: list[dict[str, Any]] | None = None,
    cost: SearchCost | None = None,
) -> TuneResult:
    m = decision.metrics
    ci = (m["ci_low"], m["ci_high"]) if "ci_low" in m else None
    compile_ci = (m["compile_ci_low"], m["compile_ci_high"]) if "compile_ci_low" in m else None
    return TuneResult(
        op=decision.op,
        workload=decision.workload,
        spec=decision.spec,
        mode=fp.mode,
        winner=decision.winner,
        variant=decision.variant if decision.winner == "kernel" else "",
        best_config=dict(decision.config) if decision.winner == "kernel" else {},
        candidate_variant=decision.variant,
        candidate_config=dict(decision.config),
        median_us=m.get("median_us"),
        baseline_us=m.get("baseline_median_us"),
        speedup_vs_baseline=m.get("speedup"),
        speedup_ci=ci,
        compile_us=m.get("compile_median_us"),
        compile_speedup=m.get("compile_speedup"),
        compile_ci=compile_ci,
        gbps=m.get("gbps"),
        pct_of_copy_bandwidth=m.get("pct_of_copy_bandwidth"),
        copy_gbps=m.get("copy_gbps"),
        timing_mode=str(m.get("timing_mode", "")),
        evaluations=evaluations,
        from_database=from_database,
        failures=failures or {},
        failure_examples=failure_examples or {},
        wall_s=wall_s,
        fingerprint=fp.describe(),
        strategy=decision.strategy,
        top=top or [],
        note=m.get("note", ""),
        cost=cost or SearchCost(mode=fp.mode, wall_s=wall_s),
    )

def _carried(db: Database, spec: OpSpec, fp: Fingerprint, force: bool) -> tuple[list[DecisionRecord], list[Candidate]]:
    """The kernel decisions for ``spec`` of fingerprints near ``fp`` (none when ``force``) and the
    candidates that re-validate them: :func:`~kernelsmith.db.claims.candidate_of` gives none for a
    variant whose source changed since (its source hash), or an outside kernel not trusted here."""
    if force:
        return [], []
    near = [d for d in db.near_decisions(fp, spec.workload_hash) if d.servable and d.winner == "kernel"]
    candidates: list[Candidate] = []
    for decision in near:
        prepared = candidate_of(db, decision)
        if isinstance(prepared, Candidate):
            if prepared not in candidates:
                candidates.append(prepared)
        elif prepared is not None:  # a ClaimOutcome: why this record cannot be carried over
            log.info("%s: the record of fingerprint %s is not carried over: %s",
                     spec.describe(), decision.fingerprint, prepared.detail)
    return near, candidates


def _copy_bandwidth(db: Database, fp: Fingerprint, evaluator: Executor) -> float | None:
    """The measured ceiling, once per fingerprint."""
    if fp.mode != "gpu":
        return None
    stored = db.get_ceiling(fp.hash, "copy_gbps")
    if stored:
        return stored
    result = evaluator.measure_ceiling()
    if result.status != "ok":
        log.warning("could not measure copy bandwidth: %s", result.error)
        return None
    db.put_ceiling(fp.hash, "copy_gbps", result.copy_gbps, result.detail)
    return result.copy_gbps


"""Benchmarking a workspace's kernel: gate, evaluate with the incumbent, judge, confirm.

Part of the agent workspace (:mod:`kernelsmith.agent.workspace`): what ``bench`` does with
``kernel.py`` before it keeps anything. The kernel-file gate runs first (nothing runs if it
rejects), then the kernel, the incumbent and the baseline are timed together in isolated workers,
the verdict is judged (:class:`BenchReport`), and a kernel about to be kept is confirmed in fresh
workers.
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from kernelsmith.agent._workspace_kernel import _config_text
from kernelsmith.agent._workspace_layout import GATE_REASON, GPU_TIMING, INTERPRETER_TIMING, Evaluate
from kernelsmith.db import (
    Database,
    DecisionRecord,
    Fingerprint,
)
from kernelsmith.decide import compare
from kernelsmith.evaluate.kernel_file import KernelFileError, parse_kernel_file
from kernelsmith.evaluate.protocol import Candidate, EvalResult
from kernelsmith.ops import OpFamily
from kernelsmith.space import Config
from kernelsmith.spec import OpSpec

log = logging.getLogger("kernelsmith.agent.workspace")  # this code's logger in workspace.py


def _flops(family: OpFamily, spec: OpSpec) -> int | None:
    try:
        return int(family.flops(spec))
    except NotImplementedError:
        return None

# ---- bench -------------------------------------------------------------------------------------
@dataclass
class BenchReport:
    """One bench: the verdict and the figures behind it. ``lines()`` is the printed block."""

    op: str
    workload: str
    mode: str
    source_hash: str
    config: dict[str, Any]
    status: str  # "ok" or the failure kind (build, validate, runtime, timeout, crash, cheat)
    verdict: str  # "KEEP" or "REVERT"
    reason: str
    incumbent: str  # what it was compared with
    error: str = ""
    time_us: float | None = None
    incumbent_us: float | None = None
    baseline_us: float | None = None
    gbps: float | None = None
    tflops: float | None = None
    pct_of_ceiling: float | None = None
    speedup_vs_incumbent: float | None = None
    speedup_ci: tuple[float, float] | None = None
    speedup_vs_baseline: float | None = None
    note: str = ""
    stored: bool = False
    timestamp: str = field(default_factory=lambda: datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"))

    @property
    def correct(self) -> bool:
        return self.status == "ok"

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["correct"] = self.correct
        data["speedup_ci"] = list(self.speedup_ci) if self.speedup_ci else None
        return data

    def lines(self) -> list[str]:
        """The grep-friendly verdict block: one ``key: value`` a line, ``n/a`` for no value."""
        ci = f"{self.speedup_ci[0]:.3f}-{self.speedup_ci[1]:.3f}" if self.speedup_ci else None
        rows: list[tuple[str, Any]] = [
            ("op", self.op),
            ("workload", self.workload),
            ("mode", self.mode),
        ]
        if self.note:
            rows.append(("note", self.note))
        rows += [
            ("source_hash", self.source_hash),
            ("config", _config_text(self.config)),
            ("correct", "yes" if self.correct else "no"),
            ("status", self.status),
            ("time_us", _num(self.time_us, 2)),
            ("incumbent", self.incumbent),
            ("incumbent_us", _num(self.incumbent_us, 2)),
            ("baseline_us", _num(self.baseline_us, 2)),
            ("gbps", _num(self.gbps, 1)),
            ("tflops", _num(self.tflops, 3)),
            ("pct_of_ceiling", _num(self.pct_of_ceiling, 1)),
            ("speedup_vs_incumbent", _num(self.speedup_vs_incumbent, 3)),
            ("speedup_ci", ci or "n/a"),
            ("speedup_vs_baseline", _num(self.speedup_vs_baseline, 3)),
            ("verdict", self.verdict),
        ]
        # The reason comes last: its first line after the key, the gate's problems (one each) below.
        first, *more = self.reason.splitlines() or [""]
        return [f"{key}: {value}" for key, value in rows] + [f"reason: {first}", *more]

    def tsv_row(self) -> dict[str, Any]:
        return {
            "timestamp": self.timestamp,
            "mode": self.mode,
            "source_hash": self.source_hash,
            "config": _config_text(self.config),
            "correct": "yes" if self.correct else "no",
            "time_us": _num(self.time_us, 2),
            "incumbent_us": _num(self.incumbent_us, 2),
            "baseline_us": _num(self.baseline_us, 2),
            "gbps": _num(self.gbps, 1),
            "pct_of_ceiling": _num(self.pct_of_ceiling, 1),
            "speedup_vs_incumbent": _num(self.speedup_vs_incumbent, 3),
            "verdict": self.verdict,
            "reason": self.reason[:300],
        }


def _num(value: float | None, digits: int) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def _precheck(source: str) -> tuple[dict[str, Any], str, str]:
    """``(CONFIG, failure kind, problem)`` from reading the kernel file, without running it.

    The gate's problems are the problem, one a line (the first line says what happened); a file
    that passes but has no ``CONFIG`` is a build failure.
    """
    try:
        kernel_file = parse_kernel_file(source)
    except KernelFileError as exc:
        return {}, "cheat", "\n".join([GATE_REASON, *(f"  {p}" for p in exc.problems)])
    if kernel_file.config is None:
        return {}, "build", "kernel.py defines no CONFIG = {...}: the config bench evaluates"
    return dict(kernel_file.config), "", ""


def _incumbent(
    family: OpFamily, decision: DecisionRecord | None, db: Database
) -> tuple[Candidate | None, str, str]:
    """``(candidate or None for the baseline, its label, a note)`` for what calls run today."""
    baseline = "baseline (eager PyTorch)"
    if decision is None or decision.winner != "kernel":
        return None, baseline, ""
    config = Config(decision.config)
    builtin = {v.name: v for v in family.variants}
    if decision.variant in builtin:
        variant = builtin[decision.variant]
        if decision.source_hash and decision.source_hash != variant.source_hash:
            return None, baseline, f"the stored winner {decision.variant} changed since it was tuned"
        return Candidate(variant.name, config), f"kernel {variant.name} [{config.key}]", ""
    record = db.variant_source(decision.source_hash)
    if record is None:
        return None, baseline, f"the stored winner's source {decision.source_hash} is missing"
    if not record.trusted:
        return None, baseline, (f"the stored winner's source {decision.source_hash} is imported and not trusted "
                                f"(`kernelsmith db trust {decision.source_hash}` after reading it)")
    source = record.source
    label = f"kernel {decision.variant}@{decision.source_hash[:8]} [{config.key}]"
    return Candidate(decision.variant, config, source), label, ""


def _copy_gbps(db: Database, fp: Fingerprint, evaluator: Any) -> float | None:
    """The measured copy bandwidth (the roofline ceiling), once per fingerprint."""
    if fp.mode != "gpu":
        return None
    stored = db.get_ceiling(fp.hash, "copy_gbps")
    if stored or evaluator is None:
        return stored
    result = evaluator.measure_ceiling()
    if result.status != "ok":
        log.warning("could not measure copy bandwidth: %s", result.error)
        return None
    db.put_ceiling(fp.hash, "copy_gbps", result.copy_gbps, result.detail)
    return float(result.copy_gbps)


def _evaluate(
    fp: Fingerprint, db: Database, spec: OpSpec, candidates: Sequence[Candidate], evaluate: Evaluate | None
) -> tuple[list[EvalResult], float | None]:
    settings = GPU_TIMING if fp.mode == "gpu" else INTERPRETER_TIMING
    if evaluate is not None:
        return evaluate(spec, candidates, settings), _copy_gbps(db, fp, None)
    from kernelsmith.evaluate.pool import Evaluator

    with Evaluator(fp.mode, workers=1) as evaluator:
        copy_gbps = _copy_gbps(db, fp, evaluator)
        return evaluator.evaluate_together(spec, candidates, settings), copy_gbps


def _judge(
    family: OpFamily,
    spec: OpSpec,
    result: EvalResult,
    incumbent_result: EvalResult | None,
    label: str,
    copy_gbps: float | None,
) -> dict[str, Any]:
    """The report's figures and verdict for a candidate that ran."""
    from kernelsmith.tuner import plausible

    result = plausible(result, copy_gbps)
    if not result.ok:
        return {"status": result.status, "error": result.error, "verdict": "REVERT",
                "reason": f"{result.status}: {result.error}"[:500]}  # fmt: skip
    m = result.metrics
    samples, baseline_samples = m["samples_us"], m["baseline_samples_us"]
    reference, reference_samples = "the baseline (eager PyTorch)", baseline_samples
    incumbent_us = float(m["baseline_median_us"])
    if incumbent_result is not None and incumbent_result.ok:
        reference, reference_samples = f"the incumbent {label}", incumbent_result.metrics["samples_us"]
        incumbent_us = incumbent_result.median_us
    elif incumbent_result is not None:
        reference += f" (the incumbent {label} failed: {incumbent_result.status})"
    versus = compare(samples, reference_samples)
    versus_baseline = compare(samples, baseline_samples)
    flops = _flops(family, spec)
    figures = {
        "status": "ok",
        "time_us": result.median_us,
        "incumbent_us": incumbent_us,
        "baseline_us": float(m["baseline_median_us"]),
        "gbps": m.get("gbps"),
        "tflops": flops / (result.median_us * 1e-6) / 1e12 if flops else None,
        "pct_of_ceiling": 100.0 * m["gbps"] / copy_gbps if copy_gbps and m.get("gbps") else None,
        "speedup_vs_incumbent": versus.speedup,
        "speedup_ci": (versus.ci_low, versus.ci_high),
        "speedup_vs_baseline": versus_baseline.speedup,
        "comparison": versus_baseline,
        "metrics": m,
    }
    detail = f"{versus.speedup:.3f}x vs {reference} (95% CI {versus.ci_low:.3f}-{versus.ci_high:.3f})"
    if versus.significant:
        figures.update(verdict="KEEP", reason=f"correct and faster: {detail}")
    else:
        figures.update(verdict="REVERT", reason=f"correct but not faster with confidence: {detail}")
    return figures


def _confirm_keep(
    family: OpFamily, spec: OpSpec, mode: str, candidates: Sequence[Candidate], label: str, copy_gbps: float | None
) -> dict[str, Any]:
    """The figures and verdict of a KEEP's decisive run (issue 12).

    A KEEP stores the kernel for every front door, so the kernel and the incumbent are validated
    and timed again in a brand-new worker process, beside a baseline also timed alone in another
    one that never loaded a candidate (:func:`kernelsmith.evaluate.pool.confirm`). The verdict is
    that run's: KEEP only if it agrees. (An injected ``evaluate`` skips this: tests fix verdicts.)
    """
    from kernelsmith.evaluate.pool import confirm

    settings = GPU_TIMING if mode == "gpu" else INTERPRETER_TIMING
    confirmation = confirm(spec, candidates, mode, settings, copy_gbps=copy_gbps)
    against = 1 if len(candidates) > 1 else None
    results = confirmation.results
    figures = _judge(family, spec, results[0], results[1] if against else None, label, copy_gbps)
    why = confirmation.disagreement(0, against) if figures["verdict"] == "KEEP" else figures["reason"]
    if why:
        figures.update(verdict="REVERT", reason=f"not confirmed in a fresh worker: {why}"[:4000])
    return figures



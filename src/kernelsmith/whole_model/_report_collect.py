"""What a report is made of, collected from the database: trial rows and per-workload summaries.

Part of the report stage (:mod:`kernelsmith.whole_model.report`): :func:`collect_report` reads the
trials and decisions of a database (one fingerprint, one op, or all) into a :class:`ReportData`,
one :class:`TrialRow` per evaluation (the TSV's rows) and one :class:`WorkloadSummary` per
workload; the report module then writes it as a TSV, plots and Markdown.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kernelsmith.cost import SearchCost, summarize_trials
from kernelsmith.db import DecisionRecord, Fingerprint, TrialRecord, open_database
from kernelsmith.spec import OpSpec

TSV_COLUMNS = (
    "order", "eval_index", "op", "workload", "inputs", "variant", "config", "status", "outcome", "winner",
    "time_us", "baseline_us", "speedup", "gbps", "pct_of_ceiling", "tflops", "mode", "fingerprint", "source_hash",
    "error",
)  # fmt: skip
# ---------------------------------------------------------------------------------------------
# What the report is made of
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TrialRow:
    """One evaluated candidate, as a row of results.tsv.

    ``order`` is the position among all trials reported, ``eval_index`` the position among its
    workload's trials on its machine (both from 1); ``outcome`` is ``kept``, ``reverted`` or
    ``failed`` (module docstring); ``winner`` is True for the candidate its decision adopted.
    """

    order: int
    eval_index: int
    op: str
    workload: str
    inputs: str
    variant: str
    config: str
    status: str
    outcome: str
    winner: bool
    time_us: float | None
    baseline_us: float | None
    speedup: float | None
    gbps: float | None
    baseline_gbps: float | None
    pct_of_ceiling: float | None
    tflops: float | None
    mode: str
    fingerprint: str
    source_hash: str
    error: str

    def tsv(self) -> list[str]:
        """The row's cells in :data:`TSV_COLUMNS` order (numbers to 6 significant digits, blank when unknown)."""
        cells: list[str] = []
        for name in TSV_COLUMNS:
            value = getattr(self, name)
            if name == "winner":
                value = "yes" if value else ""
            elif name == "error":
                value = value[:300]
            elif isinstance(value, float) or value is None:
                value = "" if value is None else f"{value:.6g}"
            cells.append(_cell(value))
        return cells


@dataclass
class WorkloadSummary:
    """One workload on one machine: its decision (if tuning finished), trials and cost."""

    fingerprint: str
    workload: str
    op: str
    inputs: str
    mode: str
    decision: DecisionRecord | None
    rows: list[TrialRow]
    copy_gbps: float | None
    bytes_moved: int | None
    flops: int | None
    cost: str
    failures: dict[str, int] = field(default_factory=dict)
    failure_examples: dict[str, str] = field(default_factory=dict)

    @property
    def title(self) -> str:
        """The op and its inputs (the workload hash when no decision recorded the inputs)."""
        return f"{self.op} {self.inputs or self.workload[:8]}"

    def figure(self, key: str) -> float | None:
        """A number of the decision's final comparison (``speedup``, ``gbps``...), or None."""
        if self.decision is None:
            return None
        value = self.decision.metrics.get(key)
        return float(value) if isinstance(value, int | float) and math.isfinite(value) else None

    def tflops(self, median_us: float | None) -> float | None:
        return _tflops(self.flops, median_us)


@dataclass
class ReportData:
    """Everything the files are written from (:func:`collect_report`)."""

    source: str
    fingerprints: dict[str, Fingerprint]
    ceilings: dict[str, float]
    rows: list[TrialRow]
    workloads: list[WorkloadSummary]
    plot_fingerprint: str | None


@dataclass
class Report:
    """What :func:`write_report` wrote: file name to path, and notes (missing matplotlib...)."""

    out_dir: Path
    files: dict[str, Path]
    data: ReportData
    notes: list[str] = field(default_factory=list)


# ---------------------------------------------------------------------------------------------
# Collecting
# ---------------------------------------------------------------------------------------------


def _cell(value: Any) -> str:
    return str(value).replace("\t", " ").replace("\r", " ").replace("\n", " ")


def _metric(metrics: dict[str, Any], key: str) -> float | None:
    value = metrics.get(key)
    return float(value) if isinstance(value, int | float) and math.isfinite(value) and value > 0 else None


def _tflops(flops: int | None, median_us: float | None) -> float | None:
    if not flops or not median_us:
        return None
    return flops / (median_us * 1e-6) / 1e12


def _op_model(op: str, spec: dict[str, Any] | None) -> tuple[str, int | None, int | None]:
    """The inputs' description, bytes moved and FLOPs of a workload, as far as they are known."""
    if not spec:
        return "", None, None
    try:
        opspec = OpSpec.from_dict(spec)
    except (KeyError, TypeError, ValueError):
        return "", None, None
    inputs = opspec.describe().removeprefix(opspec.op)
    try:
        from kernelsmith.ops import get_op

        family = get_op(op)
    except ValueError:  # a family this version does not have: the numbers stay unknown
        return inputs, None, None
    try:
        nbytes: int | None = int(family.bytes_moved(opspec))
    except (NotImplementedError, KeyError, ValueError, IndexError):
        nbytes = None
    try:
        flops: int | None = int(family.flops(opspec)) or None
    except (NotImplementedError, KeyError, ValueError, IndexError):
        flops = None
    return inputs, nbytes, flops


def _is_winner(trial: TrialRecord, decision: DecisionRecord | None) -> bool:
    return (
        decision is not None
        and decision.winner == "kernel"
        and trial.ok
        and trial.variant == decision.variant
        and trial.source_hash == decision.source_hash
        and trial.config == decision.config
    )


def _mode(fp: Fingerprint | None, trials: Sequence[TrialRecord]) -> str:
    if fp is not None:
        return fp.mode
    return "gpu" if any(t.metrics.get("timer") == "cuda-events" for t in trials) else "interpreter"


def collect_report(db: Any = None, *, fingerprint: str | None = None, op: str | None = None) -> ReportData:
    """Read the database (``db`` as :func:`kernelsmith.db.open_database` takes it) into :class:`ReportData`.

    ``fingerprint`` (a hash) and ``op`` restrict the report; otherwise every trial is reported.
    """
    database = open_database(db)
    try:
        source = str(getattr(database, "path", db if db is not None else "the default database"))
        trials = database.trials(fingerprint=fingerprint, op=op)
        decisions = {(d.fingerprint, d.workload): d for d in database.decisions(fingerprint=fingerprint, op=op)}
        fingerprints = {f.hash: f for f in database.fingerprints()}
        ceilings = {c.fingerprint: c.value for c in database.ceilings() if c.name == "copy_gbps"}
    finally:
        if database is not db:
            database.close()
    return build_report_data(trials, decisions, fingerprints, ceilings, source=source, fingerprint=fingerprint)


def build_report_data(
    trials: Sequence[TrialRecord],
    decisions: dict[tuple[str, str], DecisionRecord],
    fingerprints: dict[str, Fingerprint],
    ceilings: dict[str, float],
    *,
    source: str = "",
    fingerprint: str | None = None,
) -> ReportData:
    """:class:`ReportData` from records already read (what :func:`collect_report` does after reading)."""
    groups: dict[tuple[str, str], list[TrialRecord]] = {}
    for t in trials:
        groups.setdefault((t.fingerprint, t.workload), []).append(t)
    for key in decisions:  # a decision whose trials were not exported still gets its summary
        groups.setdefault(key, [])
    order = {id(t): i for i, t in enumerate(trials, start=1)}
    rows: list[TrialRow] = []
    workloads: list[WorkloadSummary] = []
    for (fp, workload), group in groups.items():
        decision = decisions.get((fp, workload))
        op_name = decision.op if decision else (group[0].op if group else "")
        inputs, nbytes, flops = _op_model(op_name, decision.spec if decision else None)
        mode = _mode(fingerprints.get(fp), group)
        copy = ceilings.get(fp) or (_metric(decision.metrics, "copy_gbps") if decision else None)
        best: float | None = None
        group_rows: list[TrialRow] = []
        for index, t in enumerate(group, start=1):
            time_us = _metric(t.metrics, "median_us") if t.ok else None
            baseline_us = _metric(t.metrics, "baseline_median_us")
            gbps = _metric(t.metrics, "gbps") if t.ok else None
            if not t.ok:
                outcome = "failed"
            elif time_us is not None and (best is None or time_us < best):
                outcome, best = "kept", time_us
            else:
                outcome = "reverted"
            group_rows.append(
                TrialRow(
                    order=order[id(t)],
                    eval_index=index,
                    op=t.op,
                    workload=workload,
                    inputs=inputs,
                    variant=t.variant,
                    config=t.config_key,
                    status=t.status,
                    outcome=outcome,
                    winner=_is_winner(t, decision),
                    time_us=time_us,
                    baseline_us=baseline_us,
                    speedup=baseline_us / time_us if time_us and baseline_us else None,
                    gbps=gbps,
                    baseline_gbps=_metric(t.metrics, "baseline_gbps"),
                    pct_of_ceiling=100.0 * gbps / copy if gbps and copy else None,
                    tflops=_tflops(flops, time_us),
                    mode=mode,
                    fingerprint=fp,
                    source_hash=t.source_hash,
                    error=t.error,
                )
            )
        examples: dict[str, str] = {}
        for t in group:
            if not t.ok and t.status not in examples:
                examples[t.status] = f"{t.variant} {t.config_key}: {t.error}"[:300]
        workloads.append(
            WorkloadSummary(
                fingerprint=fp,
                workload=workload,
                op=op_name,
                inputs=inputs,
                mode=mode,
                decision=decision,
                rows=group_rows,
                copy_gbps=copy,
                bytes_moved=nbytes,
                flops=flops,
                cost=_cost(group, decision, mode),
                failures=dict(Counter(t.status for t in group if not t.ok)),
                failure_examples=examples,
            )
        )
        rows.extend(group_rows)
    rows.sort(key=lambda r: r.order)
    return ReportData(source, fingerprints, ceilings, rows, workloads, _plot_fingerprint(workloads, fingerprint))


def _cost(group: Sequence[TrialRecord], decision: DecisionRecord | None, mode: str) -> str:
    """The search cost: the decision's stored totals when there are some, else the trials' sum."""
    stored = decision.metrics.get("cost") if decision else None
    if isinstance(stored, dict):
        return SearchCost.from_dict(stored).describe()
    if not group:
        return ""
    summary = summarize_trials(group, {group[0].fingerprint: mode})[0]
    seconds = summary.get("gpu_s", summary.get("interpreter_s", 0.0))
    estimated = " (estimated)" if summary["seconds_estimated"] else ""
    return f"{summary['evaluations']} evaluations, {seconds:.1f} {summary['seconds_name']}{estimated}"


def _plot_fingerprint(workloads: Sequence[WorkloadSummary], asked: str | None) -> str | None:
    if asked is not None:
        return asked
    counts: Counter[tuple[bool, str]] = Counter()
    for w in workloads:
        counts[(w.mode == "gpu", w.fingerprint)] += max(1, len(w.rows))
    if not counts:
        return None
    return max(counts.items(), key=lambda item: (item[0][0], item[1]))[0][1]



"""``kernelsmith report``: what the tuning runs in a database found, as files a person can read.

Everything comes from stored records (trials, decisions, ceilings, fingerprints), so a report can
be made at any time, on any machine, from a database or an import of one. Four files:

``results.tsv``
    One row per evaluated candidate (every trial, failures included), in evaluation order:
    the op, workload and inputs, variant and config, status, time against the baseline timed in
    the same run, speedup, GB/s, % of the measured copy bandwidth, TFLOP/s where the op family
    counts its FLOPs, and the outcome in the search (below).
``progress.png``
    Per workload, throughput (GB/s) over the experiments in evaluation order. A successful
    candidate is *kept* when it beat every earlier one of its workload (the running best, drawn
    as a step line), *reverted* when it did not, and *failed* (any failure status) is marked on
    the axis. The baseline's throughput and the copy-bandwidth ceiling are dashed lines.
``roofline.png``
    Each tuned op (a decision): its achieved GB/s, and the baseline's, against the copy
    bandwidth measured on that machine (left); where the op family counts FLOPs, achieved
    FLOP/s against arithmetic intensity under the memory roof ``FLOP/s = copy GB/s x FLOP/byte``
    (right). Ceilings are measured (stored with the fingerprint), never datasheet figures.
``report.md``
    The machines, one summary row per workload (winner, speedup with its 95% interval, time,
    GB/s, % of ceiling, search cost from :mod:`kernelsmith.cost`, failures), then per workload
    its best candidates and its failures by status with the first error of each.

Plots need matplotlib (``pip install -e '.[report]'``), imported only when plotting;
without it the TSV and the Markdown are still written and the report says what to install.
Both plots show one machine (the ``fingerprint`` asked for, else the GPU fingerprint with the
most trials): ceilings and throughputs of different machines do not share an axis. Interpreter
fingerprints are reported like any other, marked as host-clock timings that are not performance.

>>> from kernelsmith.whole_model.report import write_report
>>> report = write_report("kernelsmith.db", "report/")                       # doctest: +SKIP
>>> sorted(report.files)                                                     # doctest: +SKIP
['progress.png', 'report.md', 'results.tsv', 'roofline.png']
"""

from __future__ import annotations

import datetime
import logging
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kernelsmith.cost import SearchCost, summarize_trials
from kernelsmith.db import DecisionRecord, Fingerprint, TrialRecord, open_database
from kernelsmith.extras import install_hint
from kernelsmith.spec import OpSpec
from kernelsmith.versus import caption, speedup_text, versus

logger = logging.getLogger(__name__)

REPORT_EXTRA_HINT = install_hint("report")
INTERPRETER_NOTE = "interpreter: host-clock timings of the Triton interpreter, not GPU performance"
TSV_COLUMNS = (
    "order", "eval_index", "op", "workload", "inputs", "variant", "config", "status", "outcome", "winner",
    "time_us", "baseline_us", "speedup", "gbps", "pct_of_ceiling", "tflops", "mode", "fingerprint", "source_hash",
    "error",
)  # fmt: skip
MAX_PROGRESS_PANELS = 12
TOP_CANDIDATES = 5


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


# ---------------------------------------------------------------------------------------------
# Writing
# ---------------------------------------------------------------------------------------------


def write_report(
    db: Any = None,
    out_dir: str | Path = "report",
    *,
    fingerprint: str | None = None,
    op: str | None = None,
    plots: bool = True,
) -> Report:
    """Write results.tsv, report.md and (with matplotlib, unless ``plots=False``) progress.png
    and roofline.png into ``out_dir``; see the module docstring."""
    data = collect_report(db, fingerprint=fingerprint, op=op)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    report = Report(out, {}, data)
    tsv = out / "results.tsv"
    with open(tsv, "w") as handle:
        handle.write("\t".join(TSV_COLUMNS) + "\n")
        for row in data.rows:
            handle.write("\t".join(row.tsv()) + "\n")
    report.files["results.tsv"] = tsv
    if plots and data.plot_fingerprint is not None:
        try:
            report.files["progress.png"] = plot_progress(data, out / "progress.png")
            report.files["roofline.png"] = plot_roofline(data, out / "roofline.png")
        except ImportError as exc:
            report.notes.append(f"progress.png and roofline.png not drawn: {exc}")
            logger.warning("%s", report.notes[-1])
    md = out / "report.md"
    md.write_text(render_markdown(data, report.files, report.notes))
    report.files["report.md"] = md
    return report


def _matplotlib() -> Any:
    """matplotlib's Figure class (no pyplot: no global state, no display needed)."""
    try:
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise ImportError(f"the report's plots need matplotlib: {REPORT_EXTRA_HINT}") from exc
    return Figure


def _machine(data: ReportData, fp: str) -> str:
    known = data.fingerprints.get(fp)
    return known.describe() if known else fp


def plot_progress(data: ReportData, path: Path) -> Path:
    """progress.png: per workload of the plotted machine, GB/s over the experiments."""
    figure_class = _matplotlib()
    chosen = [w for w in data.workloads if w.fingerprint == data.plot_fingerprint and w.rows]
    chosen.sort(key=lambda w: -len(w.rows))
    shown = chosen[:MAX_PROGRESS_PANELS]
    n = max(1, len(shown))
    cols = min(3, n)
    nrows = math.ceil(n / cols)
    fig = figure_class(figsize=(5.2 * cols, 3.4 * nrows + 0.6), layout="constrained")
    axes = fig.subplots(nrows, cols, squeeze=False)
    for ax in axes.flat[len(shown) :]:
        ax.set_visible(False)
    for ax, w in zip(axes.flat, shown, strict=False):
        kept = [r for r in w.rows if r.outcome == "kept" and r.gbps is not None]
        reverted = [r for r in w.rows if r.outcome == "reverted" and r.gbps is not None]
        failed = [r for r in w.rows if r.outcome == "failed"]
        if kept:  # the running best, as a step line through the kept candidates
            xs = [r.eval_index for r in kept] + [w.rows[-1].eval_index]
            ys = [r.gbps for r in kept] + [kept[-1].gbps]
            ax.step(xs, ys, where="post", color="tab:green", linewidth=1.2, alpha=0.7)
        ax.scatter([r.eval_index for r in reverted], [r.gbps for r in reverted], s=14, color="0.6", label="reverted")
        ax.scatter(
            [r.eval_index for r in kept], [r.gbps for r in kept], s=28, color="tab:green", label="kept", zorder=3
        )
        ax.scatter(
            [r.eval_index for r in failed], [0.0] * len(failed), marker="x", s=28, color="tab:red", label="failed",
            clip_on=False, zorder=3,
        )  # fmt: skip
        baselines = sorted(r.baseline_gbps for r in w.rows if r.baseline_gbps)
        if baselines:
            ax.axhline(baselines[len(baselines) // 2], color="tab:blue", linestyle="--", linewidth=1,
                       label="baseline (eager)")  # fmt: skip
        if w.copy_gbps:
            ax.axhline(w.copy_gbps, color="black", linestyle=":", linewidth=1, label="copy ceiling")
        ax.set_ylim(bottom=0)
        ax.set_title(_short(w.title, 48) + (" (interpreter)" if w.mode == "interpreter" else ""), fontsize=9)
        ax.set_xlabel("experiment (evaluation order)", fontsize=8)
        ax.set_ylabel("GB/s", fontsize=8)
        ax.tick_params(labelsize=7)
    if shown:
        axes.flat[0].legend(fontsize=7, loc="lower right")
    title = f"throughput over experiments: {_machine(data, data.plot_fingerprint or '')}"
    if len(chosen) > len(shown):
        title += f" ({len(shown)} of {len(chosen)} workloads, most trials first)"
    fig.suptitle(_short(title, 140), fontsize=10)
    fig.savefig(path, dpi=110)
    return path


def plot_roofline(data: ReportData, path: Path) -> Path:
    """roofline.png: each tuned op of the plotted machine against its measured copy bandwidth."""
    figure_class = _matplotlib()
    fp = data.plot_fingerprint or ""
    tuned = [w for w in data.workloads if w.fingerprint == fp and w.decision is not None and w.figure("gbps")]
    copy = data.ceilings.get(fp) or next((w.copy_gbps for w in tuned if w.copy_gbps), None)
    fig = figure_class(figsize=(12, max(3.5, 0.45 * len(tuned) + 1.8)), layout="constrained")
    left, right = fig.subplots(1, 2)
    labels = [_short(w.title, 40) for w in tuned]
    ys = list(range(len(tuned)))
    left.barh([y + 0.2 for y in ys], [w.figure("gbps") or 0.0 for w in tuned], height=0.4, color="tab:green",
              label="kernelsmith (winner or best candidate)")  # fmt: skip
    left.barh([y - 0.2 for y in ys], [w.figure("baseline_gbps") or 0.0 for w in tuned], height=0.4,
              color="tab:blue", label="baseline (eager PyTorch)")  # fmt: skip
    if copy:
        left.axvline(copy, color="black", linestyle=":", label=f"measured copy bandwidth {copy:,.0f} GB/s")
    left.set_yticks(ys, labels, fontsize=7)
    left.set_xlabel("achieved GB/s")
    left.set_title("bandwidth", fontsize=10)
    left.legend(fontsize=7, loc="lower right")
    with_flops = [w for w in tuned if w.flops and w.bytes_moved]
    for w in with_flops:
        assert w.flops is not None and w.bytes_moved is not None
        intensity = w.flops / w.bytes_moved
        for key, colour, marker in (("median_us", "tab:green", "o"), ("baseline_median_us", "tab:blue", "s")):
            achieved = w.tflops(w.figure(key))
            if achieved:
                right.scatter([intensity], [achieved * 1e12], color=colour, marker=marker, s=30, zorder=3)
        right.annotate(_short(w.title, 28), (intensity, (w.tflops(w.figure("median_us")) or 0) * 1e12), fontsize=6,
                       xytext=(4, 2), textcoords="offset points")  # fmt: skip
    if with_flops:
        right.set_xscale("log")
        right.set_yscale("log")
        intensities = [w.flops / w.bytes_moved for w in with_flops if w.flops and w.bytes_moved]
        # Whole decades, at least one: readable log ticks however close the ops' intensities are.
        lo = 10 ** math.floor(math.log10(min(intensities) / 2))
        hi = max(10 ** math.ceil(math.log10(max(intensities) * 2)), 10 * lo)
        right.set_xlim(lo, hi)
        if copy:
            right.plot([lo, hi], [copy * 1e9 * lo, copy * 1e9 * hi], color="black", linestyle=":",
                       label="memory roof: copy GB/s x FLOP/byte")  # fmt: skip
            right.legend(fontsize=7, loc="upper left")
    else:
        right.text(0.5, 0.5, "no tuned op with a FLOP count", ha="center", va="center", transform=right.transAxes)
    right.set_xlabel("arithmetic intensity (FLOP/byte)")
    right.set_ylabel("achieved FLOP/s")
    right.set_title("roofline (green: kernelsmith, blue: eager PyTorch)", fontsize=10)
    mode = next((w.mode for w in tuned), "")
    suffix = f" ({INTERPRETER_NOTE})" if mode == "interpreter" else ("" if copy else " (no measured ceiling)")
    fig.suptitle(_short(f"tuned ops on {_machine(data, fp)}{suffix}", 160), fontsize=10)
    fig.savefig(path, dpi=110)
    return path


def _short(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _fmt(value: float | None, digits: int = 1, suffix: str = "") -> str:
    """``digits`` decimals, or three significant digits for a small value (interpreter GB/s)."""
    if value is None:
        return "-"
    if value != 0 and abs(value) < 10 ** (1 - digits):
        return f"{value:.3g}{suffix}"
    return f"{value:,.{digits}f}{suffix}"


def _md(text: str) -> str:
    """A table cell: pipes escaped, one line."""
    return _cell(text).replace("|", "\\|")


def _winner_text(w: WorkloadSummary) -> str:
    d = w.decision
    if d is None:
        return "not decided (tuning did not finish)"
    if d.winner == "kernel":
        config = ",".join(f"{k}={v}" for k, v in sorted(d.config.items()))
        return f"kernel {d.variant} {config}".strip()
    return "baseline"


def _speedup_text(w: WorkloadSummary) -> str:
    """The decision's speedup with its baseline named, or "none" where the baseline was kept
    (:mod:`kernelsmith.versus`)."""
    if w.decision is None:
        return "-"
    return speedup_text(w.decision.winner, w.decision.metrics, 3)


def baseline_caption(data: ReportData) -> str:
    """Which baselines the report's speedups are against (:func:`kernelsmith.versus.caption`)."""
    return caption([versus(w.decision.winner, w.decision.metrics) for w in data.workloads if w.decision])


def render_markdown(data: ReportData, files: dict[str, Path], notes: Sequence[str] = ()) -> str:
    """report.md's text (see the module docstring)."""
    now = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    lines = [
        "# kernelsmith report",
        "",
        f"Database `{data.source}`, {len(data.rows)} evaluated candidates over {len(data.workloads)} workloads, "
        f"written {now}.",
        "",
    ]
    lines += [f"> {note}" for note in notes] + ([""] if notes else [])
    if not data.workloads:
        lines += ["No trials or decisions in this database (or none matching the filters).", ""]
        return "\n".join(lines)
    lines += ["## Machines", "", "| fingerprint | machine | mode | copy bandwidth (measured) |", "|---|---|---|---|"]
    for fp in dict.fromkeys(w.fingerprint for w in data.workloads):
        known = data.fingerprints.get(fp)
        mode = known.mode if known else "-"
        copy = data.ceilings.get(fp)
        lines.append(f"| `{fp}` | {_md(_machine(data, fp))} | {mode} | {_fmt(copy, 0, ' GB/s') if copy else '-'} |")
    if any(w.mode == "interpreter" for w in data.workloads):
        lines += ["", f"Interpreter rows: {INTERPRETER_NOTE}."]
    lines += [
        "",
        "## Workloads",
        "",
        "Speedup: the final paired re-timing against the baseline named beside it, median of the round-by-round "
        "ratios with its 95% bootstrap interval; none where the baseline was kept (nothing replaces it). The "
        "tuner times each candidate beside the op's PyTorch reference run eagerly; where a workload has no "
        "torch.compile time, its speedup says so. % of ceiling: achieved GB/s over the machine's measured copy "
        "bandwidth.",
        "",
        *([f"> {baseline_caption(data)}.", ""] if baseline_caption(data) else []),
        "| op | inputs | machine | winner | speedup (95% CI) | time vs eager (us) | GB/s | % of ceiling "
        "| TFLOP/s | trials | failures | search cost |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for w in data.workloads:
        failures = ", ".join(f"{k} {v}" for k, v in sorted(w.failures.items())) or "none"
        times = f"{_fmt(w.figure('median_us'))} vs {_fmt(w.figure('baseline_median_us'))}" if w.decision else "-"
        lines.append(
            f"| {w.op} | {_md(w.inputs or w.workload)} | `{w.fingerprint[:8]}` {w.mode} | {_md(_winner_text(w))} | "
            f"{_speedup_text(w)} | {times} | {_fmt(w.figure('gbps'))} | {_fmt(w.figure('pct_of_copy_bandwidth'))} | "
            f"{_fmt(w.tflops(w.figure('median_us')), 3)} | {len(w.rows)} | {failures} | {_md(w.cost) or '-'} |"
        )
    for w in data.workloads:
        lines += ["", f"### {w.op}{_md(w.inputs)} on `{w.fingerprint[:8]}`", "", f"Workload `{w.workload}`."]
        lines += [
            "",
            f"- winner: {_winner_text(w)}",
            f"- speedup: {_speedup_text(w)}",
            f"- achieved: {_fmt(w.figure('gbps'))} GB/s"
            + (
                f", {_fmt(w.figure('pct_of_copy_bandwidth'))}% of the measured copy bandwidth"
                if w.figure("pct_of_copy_bandwidth")
                else ""
            )
            + (f", {_fmt(w.tflops(w.figure('median_us')), 3)} TFLOP/s" if w.flops and w.figure("median_us") else ""),
            f"- search cost: {w.cost or '-'}",
        ]
        note = w.decision.metrics.get("note") if w.decision else None
        if note:
            lines.append(f"- note: {note}")
        ok = sorted((r for r in w.rows if r.time_us is not None), key=lambda r: r.time_us or 0.0)[:TOP_CANDIDATES]
        if ok:
            lines += ["", "| # | variant | config | time (us) | eager (us) | vs eager | GB/s | outcome |",
                      "|---|---|---|---|---|---|---|---|"]  # fmt: skip
            for r in ok:
                lines.append(
                    f"| {r.eval_index} | {r.variant} | {_md(r.config)} | {_fmt(r.time_us)} | {_fmt(r.baseline_us)} | "
                    f"{_fmt(r.speedup, 3, 'x')} | {_fmt(r.gbps)} | {r.outcome}{' (winner)' if r.winner else ''} |"
                )
        if w.failures:
            lines += ["", "Failures by status:", ""]
            for status, count in sorted(w.failures.items()):
                lines.append(f"- {status}: {count}; first: {_md(w.failure_examples.get(status, ''))}")
    lines += ["", "## Plots", ""]
    if "progress.png" in files:
        machine = _machine(data, data.plot_fingerprint or "")
        lines += [
            f"On {machine}.",
            "",
            "![throughput over experiments](progress.png)",
            "",
            "Green: kept (faster than every earlier candidate of the workload); grey: reverted; red x: failed.",
            "",
            "![roofline](roofline.png)",
        ]
    else:
        lines.append(f"Not drawn: the plots need matplotlib ({REPORT_EXTRA_HINT}).")
    lines += [
        "",
        "## results.tsv",
        "",
        "One row per evaluated candidate, in evaluation order: " + ", ".join(f"`{c}`" for c in TSV_COLUMNS) + ".",
        "",
    ]
    return "\n".join(lines)

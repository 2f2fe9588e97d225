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

Layout: collecting the data is in :mod:`~kernelsmith.whole_model._report_collect`, the figures in
:mod:`~kernelsmith.whole_model._report_plots`; this module writes the report (TSV, figures,
Markdown), and every public name is importable from here.
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kernelsmith.versus import caption, speedup_text, versus
from kernelsmith.whole_model._report_collect import (
    TSV_COLUMNS,
    Report,
    ReportData,
    WorkloadSummary,
    _cell,
    collect_report,
)
from kernelsmith.whole_model._report_collect import TrialRow as TrialRow
from kernelsmith.whole_model._report_collect import build_report_data as build_report_data
from kernelsmith.whole_model._report_plots import (
    INTERPRETER_NOTE,
    REPORT_EXTRA_HINT,
    _machine,
    plot_progress,
    plot_roofline,
)
from kernelsmith.whole_model._report_plots import MAX_PROGRESS_PANELS as MAX_PROGRESS_PANELS

logger = logging.getLogger(__name__)

TOP_CANDIDATES = 5


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

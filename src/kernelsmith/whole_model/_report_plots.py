"""The report's figures: tuning progress per workload and a roofline of the winners (matplotlib).

Part of the report stage (:mod:`kernelsmith.whole_model.report`): :func:`write_report` draws
these from the collected :class:`~kernelsmith.whole_model._report_collect.ReportData` when
matplotlib is installed (``pip install matplotlib``); without it the TSV and the
Markdown are still written.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from kernelsmith.extras import install_hint
from kernelsmith.whole_model._report_collect import ReportData

REPORT_EXTRA_HINT = install_hint("report")
INTERPRETER_NOTE = "interpreter: host-clock timings of the Triton interpreter, not GPU performance"
MAX_PROGRESS_PANELS = 12
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



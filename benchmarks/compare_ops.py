"""Compare two op benchmark reports (``benchmarks/ops.py --out``) of two trees run in one sitting.

Issue 15's proof: the op benchmark suite run before and after a structural change, on the same
GPU in one session, shows no row slower beyond noise. Each row of both reports times the same
baselines (eager, torch.compile, max-autotune, Liger), whose code the change did not touch: their
ratio between the two runs is the run-to-run noise of that row. The row's noise is the *median*
drift of its baselines, not the largest: one baseline can swing alone (torch.compile's default mode
picks a reduction's config by timing it at its first call; on the H200 on 2026-12-02 its time for
LayerNorm 4096x8192 moved 1.52x between two runs while eager, max-autotune and Liger moved 2% or
less), and the largest drift would then excuse any change. A row is *slower* when the served time's
ratio (after / before) exceeds that noise by more than ``--margin`` (default 2%); *faster* the other
way round; *same* otherwise. A row where kernelsmith kept the baseline in either run is compared on
what the user runs then (the best baseline). The kernels themselves are compared too: each report's
best candidate (the tuner's top entry) as a speedup over the eager baseline timed in the same worker
rounds (paired, so the GPU's drift between the runs cancels); its verdict ("kernel") catches a kernel
that slowed so much that the decision fell back to a baseline, which the served time may hide. Rows
present in one report only (a workload added since) are listed apart.

Usage (the GPU machine; ``before/`` an export of the old tree, e.g.
``git archive 15005cf^ src benchmarks pyproject.toml | tar -x -C before``)::

    LANE0="ops-before ops" bash benchmarks/gpu_session.sh    # writes ops-before.json and ops.json
    python3 benchmarks/compare_ops.py /tmp/ks-session/ops-before.json /tmp/ks-session/ops.json

Prints a table and writes ``--out`` (JSON). Exit status 0 (a report, not a test), 2 on unreadable input.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from typing import Any

BASELINES = ("eager", "compile", "max-autotune", "liger")


def served_us(row: dict[str, Any]) -> float | None:
    """What the user runs for this row: kernelsmith's kernel where it won, else the best baseline."""
    times = row.get("us") or {}
    if "kernelsmith" in times:
        return float(times["kernelsmith"])
    baselines = [float(times[b]) for b in BASELINES if b in times]
    return min(baselines) if baselines else None


def drift(before: dict[str, Any], after: dict[str, Any]) -> float | None:
    """The median |log ratio| of the baselines timed in both runs: the row's run-to-run noise."""
    logs = [abs(math.log(after["us"][b] / before["us"][b])) for b in BASELINES
            if b in before.get("us", {}) and b in after.get("us", {})]  # fmt: skip
    return statistics.median(logs) if logs else None


def candidate_speedup(row: dict[str, Any]) -> float | None:
    """The tuner's best candidate as a speedup over eager timed in the same rounds (None without one)."""
    top = (row.get("tune") or {}).get("top") or []
    if not top or not top[0].get("median_us") or not top[0].get("baseline_us"):
        return None
    return float(top[0]["baseline_us"]) / float(top[0]["median_us"])


def verdict(ratio: float, threshold: float) -> str:
    return "slower" if ratio > threshold else "faster" if ratio < 1.0 / threshold else "same"


def compare(before: dict[str, Any], after: dict[str, Any], margin: float) -> dict[str, Any]:
    def key(row: dict[str, Any]) -> tuple[str, str]:
        return str(row.get("op")), str(row.get("shape"))

    old = {key(r): r for r in before.get("rows", []) if "us" in r}
    rows, only = [], []
    for row in after.get("rows", []):
        if "us" not in row:
            continue
        previous = old.pop(key(row), None)
        if previous is None:
            only.append({"op": row["op"], "shape": row["shape"], "in": "after"})
            continue
        t_before, t_after, noise = served_us(previous), served_us(row), drift(previous, row)
        if t_before is None or t_after is None or noise is None:
            continue
        ratio = t_after / t_before
        threshold = math.exp(noise) * (1.0 + margin)
        s_before, s_after = candidate_speedup(previous), candidate_speedup(row)
        kernel_ratio = s_before / s_after if s_before and s_after else None  # > 1: the kernel got slower
        rows.append({
            "op": row["op"], "shape": row["shape"], "before_us": t_before, "after_us": t_after,
            "ratio": ratio, "noise": math.exp(noise), "verdict": verdict(ratio, threshold),
            "kernel_ratio": kernel_ratio,
            "kernel_verdict": verdict(kernel_ratio, 1.0 + margin) if kernel_ratio else None,
            "before_winner": previous.get("tune", {}).get("variant") or previous.get("tune", {}).get("winner"),
            "after_winner": row.get("tune", {}).get("variant") or row.get("tune", {}).get("winner"),
        })  # fmt: skip
    only += [{"op": op, "shape": shape, "in": "before"} for op, shape in old]
    return {"before": before.get("date"), "after": after.get("date"), "gpu": after.get("gpu"),
            "margin": margin, "rows": rows, "unmatched": only,
            "slower": [r for r in rows if "slower" in (r["verdict"], r["kernel_verdict"])]}  # fmt: skip


def print_table(report: dict[str, Any]) -> None:
    print(f"{report['gpu']}  before {report['before']}  after {report['after']}  margin {report['margin']:.0%}")
    print(f"{'op':22} {'shape':16} {'before us':>10} {'after us':>10} {'ratio':>7} {'noise':>7} verdict  "
          f"{'kernel':>7} verdict  winners")  # fmt: skip
    for r in report["rows"]:
        kernel = f"{r['kernel_ratio']:7.3f} {r['kernel_verdict']:8}" if r["kernel_ratio"] else f"{'-':>7} {'':8}"
        print(f"{r['op']:22} {r['shape']:16} {r['before_us']:10.1f} {r['after_us']:10.1f} {r['ratio']:7.3f} "
              f"{r['noise']:7.3f} {r['verdict']:8} {kernel} {r['before_winner']} -> {r['after_winner']}")  # fmt: skip
    for r in report["unmatched"]:
        print(f"{r['op']:22} {r['shape']:16} (only {r['in']})")
    print(f"{len(report['slower'])} of {len(report['rows'])} rows slower beyond noise (served time or kernel)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("before")
    parser.add_argument("after")
    parser.add_argument("--margin", type=float, default=0.02, help="beyond the baselines' drift (default 0.02)")
    parser.add_argument("--out", default="compare_ops.json")
    args = parser.parse_args()
    try:
        with open(args.before) as f:
            before = json.load(f)
        with open(args.after) as f:
            after = json.load(f)
    except (OSError, ValueError) as exc:
        print(f"compare_ops: {exc}", file=sys.stderr)
        return 2
    report = compare(before, after, args.margin)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)
    print_table(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())

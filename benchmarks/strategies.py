"""Search strategies at equal budget, tuning for real: what each finds with the same evaluations.

    python benchmarks/strategies.py rmsnorm:8192x4096 softmax:8192x4096 --budget 20 --out strategies.json

For each workload (``op:SHAPE`` or ``op:SHAPE:DTYPE``, as ``record_space.py``) and each strategy,
this runs the tuner from scratch (a fresh database, so nothing is warm-started or skipped) with the
same budget and seed, and reports the best kernel time it found, its speedup over the PyTorch
baseline it was timed against, the evaluations it took until its best so far came within 2% of the
best any strategy found for that workload, its failures and its search cost (wall time and
GPU-seconds). Times of different runs carry the run-to-run noise of the machine (about 1%), so
differences below that are ties.

``benchmarks/strategy_replay.py`` answers the same question on recorded spaces over many seeds
without a GPU; this script is the check on the real machine, one seed. ``llm`` is left out unless
``--strategies`` names it (it needs an endpoint). Needs a CUDA GPU, unless ``--interpreter`` (a
smoke test of the script on a small shape: interpreter timings are never performance).
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from record_space import parse_workload

import kernelsmith
from kernelsmith.db import current_fingerprint, open_database
from kernelsmith.tuner import tune_spec

DEFAULT_STRATEGIES = "grid,random,tpe,coordinate,auto"
TOLERANCE = 0.02


def run_one(spec: Any, strategy: str, budget: int, seed: int, mode: str) -> dict[str, Any]:
    """Tune ``spec`` with ``strategy`` in a fresh database; the result and its best-so-far curve."""
    with tempfile.TemporaryDirectory(prefix="kernelsmith-strategies-") as folder:
        db_path = str(Path(folder) / "tune.db")
        try:
            result = tune_spec(spec, budget=budget, strategy=strategy, db=db_path, seed=seed, mode=mode)
        except Exception as exc:  # a missing optional dependency, say: a row that says so
            return {"strategy": strategy, "error": f"{type(exc).__name__}: {exc}"}
        with open_database(db_path) as db:
            trials = db.trials(workload=spec.workload_hash)
    curve: list[float | None] = []  # best time so far after each evaluation, in completion order
    best: float | None = None
    for trial in trials:
        time_us = trial.metrics.get("median_us") if trial.ok else None
        if time_us is not None and (best is None or time_us < best):
            best = time_us
        curve.append(best)
    return {
        "strategy": strategy,
        "best_us": best,
        "best": f"{result.candidate_variant} {result.candidate_config}" if result.candidate_variant else "",
        "baseline_us": result.baseline_us,
        "winner": result.winner,
        "evaluations": result.evaluations,
        "failures": result.failures,
        "wall_s": round(result.wall_s, 1),
        "gpu_s": round(result.cost.gpu_s if mode == "gpu" else result.cost.interpreter_s, 1),
        "curve_us": curve,
    }


def evaluations_to_reach(curve: list[float | None], target: float) -> int | None:
    for index, best in enumerate(curve, start=1):
        if best is not None and best <= target:
            return index
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("workloads", nargs="+", help="op:SHAPE or op:SHAPE:DTYPE, such as rmsnorm:8192x4096")
    parser.add_argument("--dtype", default="bf16", help="dtype of workloads that name none (default bf16)")
    parser.add_argument("--budget", type=int, default=20, help="evaluations per strategy (default 20)")
    parser.add_argument("--strategies", default=DEFAULT_STRATEGIES, help="comma-separated names")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="strategies.json")
    parser.add_argument("--interpreter", action="store_true", help="allow the Triton interpreter (no GPU)")
    args = parser.parse_args(argv)

    fp = current_fingerprint()
    if fp.mode != "gpu" and not args.interpreter:
        print("no CUDA GPU: this compares strategies on a GPU (use --interpreter for a smoke test)", file=sys.stderr)
        return 2
    report: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "command": " ".join([Path(sys.argv[0]).name, *(argv if argv is not None else sys.argv[1:])]),
        "gpu": fp.describe(),
        "mode": fp.mode,
        "kernelsmith": kernelsmith.__version__,
        "budget": args.budget,
        "seed": args.seed,
        "tolerance": TOLERANCE,
        "workloads": [],
    }
    if fp.mode != "gpu":
        report["note"] = "Triton interpreter smoke test: these times are not performance"
    print(f"{report['gpu']}  {report['date']}  budget {args.budget}, seed {args.seed}")
    print(f"{'workload':28} {'strategy':11} {'best us':>9} {'vs base':>8} {'evals to 2%':>12} {'fails':>6} "
          f"{'wall s':>7} {'gpu s':>6}  best config")
    for text in args.workloads:
        spec = parse_workload(text, args.dtype, {})
        rows = [run_one(spec, name.strip(), args.budget, args.seed, fp.mode) for name in args.strategies.split(",")]
        found = [r["best_us"] for r in rows if r.get("best_us") is not None]
        overall = min(found) if found else None
        for row in rows:
            if "error" in row:
                print(f"{spec.describe()[:28]:28} {row['strategy']:11} failed: {row['error']}")
                continue
            reach = evaluations_to_reach(row["curve_us"], overall * (1 + TOLERANCE)) if overall else None
            row["evaluations_to_within_2pct"] = reach
            speedup = row["baseline_us"] / row["best_us"] if row["best_us"] and row["baseline_us"] else None
            row["speedup_vs_baseline"] = speedup
            print(f"{spec.describe()[:28]:28} {row['strategy']:11} "
                  f"{row['best_us'] if row['best_us'] is not None else float('nan'):9.2f} "
                  f"{speedup if speedup else float('nan'):7.2f}x {reach if reach else '-':>12} "
                  f"{sum(row['failures'].values()):6d} {row['wall_s']:7.1f} {row['gpu_s']:6.1f}  {row['best']}")
        report["workloads"].append({"workload": spec.describe(), "spec": spec.to_dict(), "best_us": overall,
                                    "rows": rows})
        Path(args.out).write_text(json.dumps(report, indent=1))  # after every workload
    return 0


if __name__ == "__main__":
    sys.exit(main())

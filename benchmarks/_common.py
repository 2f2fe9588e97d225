"""What the benchmark scripts share: device timing, a tuning run with its summary, output
comparison, and the environment header of every JSON report.

A script's ``--smoke`` runs its code path on the CPU in the Triton interpreter (tiny shapes, CUDA-only
baselines skipped): ``bench(fn, smoke=True)`` then times with the host clock and the report carries
``SMOKE_NOTE``. Smoke timings are NOT performance; the run only proves the script does not crash."""

from __future__ import annotations

import datetime
import json
import os
import platform
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import torch
import triton
import triton.testing

import kernelsmith
from kernelsmith import dispatch
from kernelsmith.db import current_fingerprint
from kernelsmith.ops import OpFamily
from kernelsmith.space import Config
from kernelsmith.spec import OpSpec
from kernelsmith.tuner import TuneResult, tune_spec

Fn = Callable[..., Any]
Item = TypeVar("Item")

SMOKE_NOTE = "SMOKE TEST on the CPU (Triton interpreter, tiny shapes): timings are NOT performance"


def bench(fn: Fn, smoke: bool = False) -> float:
    """Median device time of ``fn()`` in microseconds (CUDA events, L2 flushed); with ``smoke``,
    the median host wall time of 3 calls (no GPU: NOT performance)."""
    if smoke:
        samples = []
        for _ in range(3):
            started = time.perf_counter()
            fn()
            samples.append((time.perf_counter() - started) * 1e6)
        return sorted(samples)[1]
    return float(triton.testing.do_bench(fn, warmup=50, rep=300, return_mode="median")) * 1000.0


def synchronize(device: str) -> None:
    """Wait for the device's queued work (nothing to wait for on the CPU)."""
    if device == "cuda":
        torch.cuda.synchronize()


def tune(spec: OpSpec, budget: int, db: str, strategy: str = "random") -> tuple[TuneResult, dict[str, Any]]:
    """Tune ``spec`` and summarize the search for the report."""
    started = time.perf_counter()
    result = tune_spec(spec, budget=budget, strategy=strategy, db=db)
    summary = {
        "search_wall_s": time.perf_counter() - started,
        "evaluations": result.evaluations,
        "failures": result.failures,
        "failure_examples": result.failure_examples,
        "winner": result.winner,
        "variant": result.candidate_variant,
        "config": result.candidate_config,
        "engine_speedup": result.speedup_vs_baseline,
        "engine_ci": result.speedup_ci,
        "engine_pct": result.pct_of_copy_bandwidth,
        "top": result.top[:5],
    }
    return result, summary


def runner_of(family: OpFamily, spec: OpSpec, result: TuneResult) -> dispatch.KernelRunner:
    """The tuned kernel (or the best candidate of a "baseline" decision) as the decorator runs it."""
    config = Config(result.candidate_config)
    launcher = family.variant(str(result.candidate_variant)).build(spec, config)
    return dispatch.KernelRunner.build(family, spec, launcher, str(result.candidate_variant), config)


def as_tuple(out: Any) -> tuple[torch.Tensor, ...]:
    return tuple(out) if isinstance(out, tuple | list) else (out,)


def max_abs_diff(got: Any, want: Any) -> float:
    pairs = zip(as_tuple(got), as_tuple(want), strict=True)
    return max(float((g.double() - w.double()).abs().max()) for g, w in pairs)


def add_run_options(parser: Any, what: str, default_budget: int) -> None:
    """The options every tuning benchmark shares: --budget, --strategy, --db and --smoke."""
    parser.add_argument("--budget", type=int, default=None, help=f"evaluations per {what} (default {default_budget})")
    parser.add_argument("--strategy", default="auto")
    parser.add_argument("--db", default=None, help="the decisions database (default /tmp/kernelsmith-bench.db; "
                        "with --smoke a fresh one, so that every smoke run tunes)")
    parser.add_argument("--smoke", action="store_true", help="a CPU smoke test in the Triton interpreter (tiny "
                        "shapes, budget 2 unless given, no CUDA-only baselines): timings are NOT performance")


def settle_run_options(args: Any, script: str, default_budget: int) -> str | None:
    """Fill in --budget and --db for a GPU run or a --smoke run; the reason to refuse, if any
    (a smoke run outside the interpreter, a GPU run without a GPU)."""
    if args.smoke:
        if os.environ.get("TRITON_INTERPRET") != "1":
            return "--smoke runs the kernels in the Triton interpreter: set TRITON_INTERPRET=1"
        args.budget = args.budget or 2
        args.db = args.db or os.path.join(tempfile.mkdtemp(prefix="kernelsmith-smoke-"), "bench.db")
    elif not torch.cuda.is_available():
        return f"{script} needs a CUDA GPU (or --smoke)"
    args.db = args.db or "/tmp/kernelsmith-bench.db"
    args.budget = args.budget or default_budget
    return None


def write_report(report: dict[str, Any], path: str) -> None:
    """Write the JSON report whole or not at all (a run killed by its time limit mid-write keeps the
    previous version)."""
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(report, f, indent=1, default=str)
    os.replace(tmp, path)


def environment(**extra: Any) -> dict[str, Any]:
    """The header of a report: date, command, GPU (the interpreter in a smoke test), versions (plus
    ``extra``), and no rows yet."""
    return {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "command": " ".join(sys.argv),
        "gpu": current_fingerprint().describe(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "kernelsmith": kernelsmith.__version__,
        **extra,
        "rows": [],
    }


def start_report(args: Any, **extra: Any) -> dict[str, Any]:
    """The report of this run (environment, budget, strategy, ``extra``; the smoke note in a
    ``--smoke`` run), written at once to ``args.out`` so that even a run killed early leaves one."""
    report = environment(**extra, budget=args.budget, strategy=args.strategy)
    if args.smoke:
        report.update(smoke=True, note=SMOKE_NOTE)
    write_report(report, args.out)
    return report


def run_rows(
    report: dict[str, Any],
    path: str,
    items: Iterable[Item],
    run: Callable[[Item], dict[str, Any]],
    labels: Callable[[Item], dict[str, Any]],
) -> None:
    """Run each item into a row of ``report``, rewriting ``path`` after every row and printing it as
    it finishes (a benchmark killed by its time limit keeps the rows it finished). A row that
    raises is recorded with its ``labels`` and the traceback, and the next one runs."""
    for item in items:
        try:
            row = run(item)
        except Exception:
            row = {**labels(item), "error": traceback.format_exc()[-2000:]}
        report["rows"].append(row)
        write_report(report, path)
        print(json.dumps(row, default=str)[:700], flush=True)


def print_smoke_banner(report: dict[str, Any]) -> None:
    """The line every table starts with in a ``--smoke`` run: its timings are not performance."""
    if report.get("smoke"):
        print(f"\n*** {SMOKE_NOTE} ***")

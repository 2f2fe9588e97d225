"""Record whole search spaces on a GPU, for replaying strategies without one.

    python benchmarks/record_space.py rmsnorm:8192x4096 rmsnorm:32768x1024 \\
        softmax:8192x4096 softmax:32768x1024 --dtype bf16 --out-dir spaces/

For each workload (``op:SHAPE`` or ``op:SHAPE:DTYPE``) this builds the candidate set exactly as the
tuner does (every variant's valid configs) and evaluates EVERY candidate with the real
:class:`~kernelsmith.evaluate.pool.Evaluator`: build, validate against the reference, time
interleaved with the eager baseline (L2 flushed, rotating input sets). Results that claim more
bandwidth than the measured copy bandwidth become "cheat" failures, as in the tuner. One JSON file
per workload is written in the format of :mod:`kernelsmith.strategies.replay`, with the date, the
machine fingerprint, the command and the timing settings; nothing goes into the database. Feed
the files to ``benchmarks/strategy_replay.py``.

Without a GPU it refuses, unless ``--interpreter`` is given (a smoke test of this script on a
small shape: interpreter timings are never performance, so never replay them as such).
"""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import sys
import time
from concurrent.futures import as_completed
from dataclasses import asdict
from pathlib import Path
from typing import Any

import kernelsmith
from kernelsmith.db import current_fingerprint
from kernelsmith.evaluate.pool import Evaluator
from kernelsmith.evaluate.protocol import Candidate, EvalResult, TimingSettings
from kernelsmith.ops import get_op
from kernelsmith.spec import OpSpec, parse_shape
from kernelsmith.tuner import plausible

log = logging.getLogger("record_space")


def parse_workload(text: str, dtype: str, constants: dict[str, Any]) -> OpSpec:
    parts = text.split(":")
    if len(parts) not in (2, 3):
        raise SystemExit(f"bad workload {text!r}: expected op:SHAPE or op:SHAPE:DTYPE, such as rmsnorm:8192x4096")
    family = get_op(parts[0])
    spec = family.spec(parse_shape(parts[1]), parts[2] if len(parts) == 3 else dtype, **constants)
    family.check_supported(spec)
    return spec


def candidates_of(spec: OpSpec) -> list[Candidate]:
    """The tuner's candidate set (``_Search.candidates`` in kernelsmith/_tuner_search.py)."""
    return [Candidate(v.name, c) for v in get_op(spec.op).variants for c in v.space(spec)]


def record(evaluator: Evaluator, spec: OpSpec, timing: TimingSettings, copy_gbps: float | None,
           limit: int | None) -> list[EvalResult]:
    candidates = candidates_of(spec)[:limit]
    futures = {evaluator.submit(spec, c, timing): i for i, c in enumerate(candidates)}
    results: list[EvalResult | None] = [None] * len(candidates)
    started = time.perf_counter()
    for done, future in enumerate(as_completed(futures), start=1):
        results[futures[future]] = plausible(future.result(), copy_gbps)
        if done % 10 == 0 or done == len(candidates):
            log.info("%s: %d/%d candidates, %.0f s", spec.describe(), done, len(candidates),
                     time.perf_counter() - started)
    return [r for r in results if r is not None]


def to_json(spec: OpSpec, results: list[EvalResult], meta: dict[str, Any]) -> dict[str, Any]:
    rows = []
    for r in results:
        rows.append({
            "variant": r.candidate.variant,
            "config": r.candidate.config.to_dict(),
            "status": r.status,
            "time_us": r.metrics.get("median_us") if r.ok else None,
            "baseline_us": r.metrics.get("baseline_median_us") if r.ok else None,
            "gbps": r.metrics.get("gbps") if r.ok else None,
            "error": r.error[:500],
        })
    return {"spec": spec.to_dict(), "meta": meta, "candidates": rows}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("workloads", nargs="+", help="op:SHAPE or op:SHAPE:DTYPE, such as rmsnorm:8192x4096")
    parser.add_argument("--dtype", default="bf16", help="dtype of workloads that name none (default bf16)")
    parser.add_argument("--const", action="append", default=[], help="op constant NAME=VALUE (JSON value)")
    parser.add_argument("--out-dir", default="spaces", help="where the JSON files go")
    parser.add_argument("--workers", type=int, default=None, help="worker processes (default: the tuner's)")
    parser.add_argument("--rounds", type=int, default=TimingSettings().rounds, help="timed rounds per candidate")
    parser.add_argument("--limit", type=int, default=None, help="only the first N candidates (smoke tests)")
    parser.add_argument("--interpreter", action="store_true", help="allow the Triton interpreter (no GPU)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")

    constants = {k: json.loads(v) for k, v in (item.split("=", 1) for item in args.const)}
    specs = [parse_workload(w, args.dtype, constants) for w in args.workloads]
    fp = current_fingerprint()
    if fp.mode != "gpu" and not args.interpreter:
        print("no CUDA GPU: recorded spaces must come from a GPU (use --interpreter for a smoke test)",
              file=sys.stderr)
        return 2
    timing = TimingSettings(rounds=args.rounds) if fp.mode == "gpu" else TimingSettings.interpreter()
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    with Evaluator(fp.mode, args.workers) as evaluator:
        ceiling = evaluator.measure_ceiling()
        copy_gbps = ceiling.copy_gbps if ceiling.status == "ok" else None
        for spec in specs:
            started = time.perf_counter()
            results = record(evaluator, spec, timing, copy_gbps, args.limit)
            meta = {
                "recorded_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
                "command": " ".join([Path(sys.argv[0]).name, *(argv if argv is not None else sys.argv[1:])]),
                "fingerprint": fp.to_dict(),
                "kernelsmith": kernelsmith.__version__,
                "timing": asdict(timing),
                "copy_gbps": copy_gbps,
                "workers": evaluator.n_workers,
                "wall_s": round(time.perf_counter() - started, 1),
            }
            first = spec.inputs[0]
            path = out_dir / f"{spec.op}-{'x'.join(map(str, first.shape))}-{first.dtype}.json"
            path.write_text(json.dumps(to_json(spec, results, meta), indent=1))
            ok = [r for r in results if r.ok]
            best = min(ok, key=lambda r: r.median_us) if ok else None
            found = f"best {best.median_us:.1f} us {best.candidate.key}" if best else "no candidate passed"
            print(f"{spec.describe()}: {len(results)} candidates, {len(ok)} ok, {found} -> {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

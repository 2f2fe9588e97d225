"""Call overhead of a database hit through @kernelsmith.optimize against a raw Triton launch.

    python benchmarks/dispatch_overhead.py --out overhead.json

Tunes (or loads) softmax and RMSNorm winners at a small, launch-bound shape, then measures host
time per call over many back-to-back calls (the GPU work is a few microseconds, so the host is
the bottleneck): the raw Triton launch of the same kernel into a preallocated output, the raw
launch plus an output allocation, and the decorated function's cache-hit path. Target: at most
5 µs above the raw launch. Prints a table and writes JSON. Needs a CUDA GPU.
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import torch
import triton

import kernelsmith
from kernelsmith.db import current_fingerprint, open_database
from kernelsmith.dispatch import build_runner
from kernelsmith.ops import get_op
from kernelsmith.space import Config
from kernelsmith.tuner import tune_spec


def per_call_us(fn: Callable[[], Any], calls: int = 2000, repeats: int = 7) -> float:
    """Median over repeats of the mean host time per call, the device drained between repeats."""
    for _ in range(200):
        fn()
    torch.cuda.synchronize()
    means = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        means.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(means)


def rmsnorm(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * w


def softmax(x: torch.Tensor) -> torch.Tensor:
    return torch.softmax(x, dim=-1)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default="overhead.json")
    parser.add_argument("--db", default="/tmp/kernelsmith-overhead.db")
    parser.add_argument("--budget", type=int, default=20)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("benchmarks/dispatch_overhead.py needs a CUDA GPU", file=sys.stderr)
        return 2
    rows = []
    x = torch.randn(4, 4096, dtype=torch.bfloat16, device="cuda")
    w = torch.randn(4096, dtype=torch.bfloat16, device="cuda")
    for name, fn, inputs, constants in (("softmax", softmax, (x,), {}), ("rmsnorm", rmsnorm, (x, w), {"eps": 1e-6})):
        family = get_op(name)
        spec = family.spec_for(*inputs, **constants)
        bucket = family.bucket(spec)
        tune_spec(bucket, budget=args.budget, db=args.db)
        with open_database(args.db) as db:
            decision = db.get_decision(current_fingerprint("gpu").hash, bucket.workload_hash)
        assert decision is not None
        if decision.winner != "kernel":  # time the search's best candidate anyway: overhead is the question
            decision = type(decision)(**{**decision.to_dict(), "winner": "kernel"})
        runner = build_runner(family, spec, decision)
        launcher = family.variant(decision.variant).build(spec, Config(decision.config))
        out = [torch.empty_like(x)]
        decorated = kernelsmith.optimize(fn, mode="db", db=args.db)
        decorated(*inputs)
        decorated(*inputs)
        times = {
            "raw_launch": per_call_us(lambda: launcher(inputs, out)),  # noqa: B023
            "raw_launch_and_alloc": per_call_us(lambda: runner(inputs)),  # noqa: B023
            "decorated_hit": per_call_us(lambda: decorated(*inputs)),  # noqa: B023
            "original_eager": per_call_us(lambda: fn(*inputs)),  # noqa: B023
        }
        state = decorated.kernelsmith
        rows.append({"op": name, "shape": list(x.shape), "variant": decision.variant, "config": decision.config,
                     "us_per_call": times, "overhead_vs_raw_us": times["decorated_hit"] - times["raw_launch"],
                     "kernel_calls": state.stats["kernel_calls"], "evaluations": state.stats["evaluations"]})
    report = {"date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
              "gpu": current_fingerprint("gpu").describe(), "torch": torch.__version__,
              "triton": triton.__version__, "command": " ".join(sys.argv), "rows": rows}
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)
    print(f"{report['gpu']}  {report['date']}")
    print(f"{'op':8} {'raw':>8} {'raw+alloc':>10} {'decorated':>10} {'eager':>8} {'overhead':>9}  (µs per call)")
    for row in rows:
        t = row["us_per_call"]
        print(f"{row['op']:8} {t['raw_launch']:8.2f} {t['raw_launch_and_alloc']:10.2f} {t['decorated_hit']:10.2f} "
              f"{t['original_eager']:8.2f} {row['overhead_vs_raw_us']:9.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Core benchmark: tune RMSNorm and softmax at the PERFORMANCE.md shapes, then time the winner
side by side with eager, torch.compile and torch.compile max-autotune in one process.

    python benchmarks/core.py --out bench.json [--budget 50] [--db /tmp/bench.db]

Every implementation is timed with ``triton.testing.do_bench`` (CUDA events, L2 flushed, median)
and, for the kernelsmith row, also through the engine's own interleaved decision run. Prints a
table and writes JSON with the date, GPU, versions and command. Needs a CUDA GPU.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import sys
import time
import traceback
from typing import Any

import torch
import triton
import triton.testing

import kernelsmith
from kernelsmith.db import current_fingerprint
from kernelsmith.evaluate.timing import measure_copy_bandwidth
from kernelsmith.ops import get_op
from kernelsmith.space import Config
from kernelsmith.tuner import tune_spec

WORKLOADS = [
    ("rmsnorm", (8192, 4096)),
    ("rmsnorm", (4096, 8192)),
    ("rmsnorm", (32768, 1024)),
    ("softmax", (8192, 4096)),
    ("softmax", (4096, 8192)),
    ("softmax", (32768, 1024)),
]


def eager_fn(op: str) -> Any:
    if op == "rmsnorm":

        def rmsnorm(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
            # The Hugging Face Llama formulation (fp32 upcast), as users write it.
            xf = x.float()
            y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
            return w * y.to(x.dtype)

        return rmsnorm

    def softmax(x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x, dim=-1)

    return softmax


def bench(fn: Any) -> float:
    return float(triton.testing.do_bench(fn, warmup=50, rep=300, return_mode="median")) * 1000.0


def run_workload(op_name: str, shape: tuple[int, ...], budget: int, db: str, copy_gbps: float) -> dict[str, Any]:
    family = get_op(op_name)
    spec = family.spec(shape, "bf16")
    row: dict[str, Any] = {"op": op_name, "shape": "x".join(map(str, shape)), "dtype": "bf16"}
    started = time.perf_counter()
    result = tune_spec(spec, budget=budget, strategy="random", db=db)
    row.update(
        search_wall_s=time.perf_counter() - started,
        evaluations=result.evaluations,
        failures=result.failures,
        winner=result.winner,
        variant=result.variant,
        config=result.best_config,
        engine_speedup=result.speedup_vs_baseline,
        engine_ci=result.speedup_ci,
        engine_gbps=result.gbps,
        engine_pct=result.pct_of_copy_bandwidth,
    )
    again = tune_spec(spec, budget=budget, strategy="random", db=db)
    row["second_call"] = {
        "from_database": again.from_database,
        "evaluations": again.evaluations,
        "wall_s": again.wall_s,
    }

    inputs = family.make_inputs(spec, 1234, "normal", "cuda")
    nbytes = family.bytes_moved(spec)
    fn = eager_fn(op_name)
    impls: dict[str, Any] = {"eager": lambda: fn(*inputs)}
    # A fresh Dynamo cache per workload and static shapes: otherwise the second shape of the same
    # function recompiles with dynamic shapes and the baseline is weaker than a user's would be.
    torch._dynamo.reset()
    compiled = torch.compile(fn, dynamic=False)
    autotuned = torch.compile(eager_fn(op_name), mode="max-autotune-no-cudagraphs", dynamic=False)
    impls["compile"] = lambda: compiled(*inputs)
    impls["max-autotune"] = lambda: autotuned(*inputs)
    if result.winner == "kernel":
        launcher = family.variant(result.variant).build(spec, Config(result.best_config))
        out_spec = family.output_specs(spec)[0]

        def kernelsmith_call() -> torch.Tensor:
            y = torch.empty(out_spec.shape, dtype=out_spec.torch_dtype, device="cuda")
            launcher(inputs, (y,))
            return y

        impls["kernelsmith"] = kernelsmith_call
        reference = fn(*inputs).double()
        got = kernelsmith_call().double()
        row["max_abs_diff_vs_eager"] = float((got - reference).abs().max())
    times: dict[str, float] = {}
    for name, impl in impls.items():
        try:
            impl()
            torch.cuda.synchronize()
            times[name] = bench(impl)
        except Exception as exc:  # a baseline that fails to compile is reported, not fatal
            row.setdefault("errors", {})[name] = f"{type(exc).__name__}: {exc}"[:500]
    row["us"] = times
    row["pct_of_copy"] = {k: 100.0 * nbytes / (v * 1e-6) / 1e9 / copy_gbps for k, v in times.items()}
    if "kernelsmith" in times:
        best_torch = min(v for k, v in times.items() if k != "kernelsmith")
        row["speedup_vs_best_torch"] = best_torch / times["kernelsmith"]
        row["speedup_vs_compile"] = times["compile"] / times["kernelsmith"] if "compile" in times else None
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default="bench.json")
    parser.add_argument("--budget", type=int, default=50)
    parser.add_argument("--db", default="/tmp/kernelsmith-bench.db")
    parser.add_argument("--only", default="", help="comma-separated op names")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("benchmarks/core.py needs a CUDA GPU", file=sys.stderr)
        return 2
    fp = current_fingerprint("gpu")
    copy_gbps, _ = measure_copy_bandwidth(torch.device("cuda"))
    report: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "command": " ".join(sys.argv),
        "gpu": fp.describe(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "kernelsmith": kernelsmith.__version__,
        "copy_gbps": copy_gbps,
        "rows": [],
    }
    only = {s for s in args.only.split(",") if s}
    for op_name, shape in WORKLOADS:
        if only and op_name not in only:
            continue
        try:
            row = run_workload(op_name, shape, args.budget, args.db, copy_gbps)
        except Exception:
            row = {"op": op_name, "shape": "x".join(map(str, shape)), "error": traceback.format_exc()[-2000:]}
        report["rows"].append(row)
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1, default=str)
        print(json.dumps(row, default=str)[:600], flush=True)

    print(f"\n{report['gpu']}  copy {copy_gbps:.0f} GB/s  {report['date']}")
    columns = ["eager", "compile", "max-autotune", "kernelsmith"]
    header = f"{'op':8} {'shape':11} " + " ".join(f"{c:>14}" for c in columns)
    header += f" {'x best':>7} {'x comp':>7} {'search s':>8} winner"
    print(header)
    for row in report["rows"]:
        if "us" not in row:
            print(f"{row['op']:8} {row['shape']:11} ERROR")
            continue
        cells = []
        for name in ("eager", "compile", "max-autotune", "kernelsmith"):
            t = row["us"].get(name)
            cells.append(f"{t:6.1f} ({row['pct_of_copy'][name]:4.1f}%)" if t else f"{'-':>14}")
        sb = row.get("speedup_vs_best_torch")
        sc = row.get("speedup_vs_compile")
        print(
            f"{row['op']:8} {row['shape']:11} {' '.join(cells)} {sb or 0:7.2f} {sc or 0:7.2f} "
            f"{row['search_wall_s']:8.1f} {row['winner']} {row.get('variant', '')} {row.get('config', '')}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Tuning throughput on one GPU against two (issue 17): what a second GPU buys a search.

    python benchmarks/scale_out.py --out scale_out.json               # on a host with two GPUs
    python benchmarks/scale_out.py --only rmsnorm --budgets 50        # one family, one budget
    TRITON_INTERPRET=1 python benchmarks/scale_out.py --smoke         # the code path on the CPU

For each workload (RMSNorm, softmax, cross-entropy and a decode matmul, bf16) and each budget,
the tuner runs from scratch (a fresh database: nothing is warm-started or answered from an earlier
run) with the same seed and strategy on

- ``1 GPU``: the local pool on device 0 (``devices=[0]``);
- ``2 GPUs``: the local pool on devices 0 and 1 (one timing lock per device);
- ``ray 2``: two Ray actors of a new local cluster, one GPU each (``executor="ray"``), when Ray is
  installed (``pip install 'kernelsmith[ray]'``);

and reports evaluations, wall time to the decision, evaluations per second, the speedup in
throughput over one GPU (target: >= 1.8x on two), the Ray figures against the local pool's
(target: within 5%), and whether the decisions agree: the same variant and configuration, or the
other run's speedup inside this decision's 95% interval. Then ``optimize_model`` on a Llama-style
model (``--model``, default llama-160m) with one GPU against two: wall time and what it decided.

Without two GPUs the script says so and refuses (``--smoke`` runs every code path on the CPU in
the Triton interpreter on a tiny shape, with worker processes standing in for the GPUs; its
timings are NOT performance, and two interpreter workers share this host's cores).
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from _common import print_smoke_banner, run_rows, start_report
from record_space import parse_workload

from kernelsmith.tuner import TuneResult, tune_spec

WORKLOADS = {
    "rmsnorm": "rmsnorm:8192x4096",
    "softmax": "softmax:8192x4096",
    "cross_entropy": "cross_entropy:8192x128256",
    "decode_matmul": "decode_matmul:1x4096x4096",  # the o projection of Llama-3-8B at batch 1
}
SMOKE_SHAPES = {"rmsnorm": "6x40", "softmax": "6x40", "cross_entropy": "6x40", "decode_matmul": "1x24x40"}
SMOKE_WORKLOADS = {name: f"{name}:{shape}" for name, shape in SMOKE_SHAPES.items()}
BUDGETS = (50, 200)
THROUGHPUT_TARGET = 1.8
RAY_TOLERANCE = 0.05


@dataclass(frozen=True)
class Setup:
    """Where one run's candidates are evaluated."""

    label: str
    devices: tuple[int, ...]
    executor: str = "local"


def setups(smoke: bool, with_ray: bool) -> list[Setup]:
    chosen = [Setup("1 GPU", (0,)), Setup("2 GPUs", (0, 1))]
    if with_ray:
        chosen.append(Setup("ray 2", (0, 1), "ray"))
    if smoke:  # the interpreter has no devices: worker counts stand in for them
        return [Setup(s.label, (), s.executor) for s in chosen]
    return chosen


def tune_fresh(spec: Any, budget: int, seed: int, strategy: str, setup: Setup, smoke: bool) -> dict[str, Any]:
    """One tuning run from an empty database; its figures, or the error that stopped it."""
    # On GPUs each pool takes its default worker count (compilation runs in parallel either way; what
    # the second GPU adds is a second timing lock); in the interpreter, one worker per stand-in GPU.
    # Ray: one actor per GPU.
    workers = len(setup.devices) if setup.executor == "ray" else None
    if smoke:
        workers = 1 if setup.label.startswith("1") else 2
    with tempfile.TemporaryDirectory(prefix="kernelsmith-scale-out-") as folder:
        started = time.perf_counter()
        try:
            result = tune_spec(
                spec, budget=budget, strategy=strategy, seed=seed, db=str(Path(folder) / "tune.db"),
                workers=workers, devices=list(setup.devices) or None, executor=setup.executor,
                mode="interpreter" if smoke else None,
            )  # fmt: skip
        except Exception as exc:  # Ray missing or a device gone: the row says so, the others run
            return {"error": f"{type(exc).__name__}: {exc}"[:500]}
        wall = time.perf_counter() - started
    return figures(result, wall)


def figures(result: TuneResult, wall_s: float) -> dict[str, Any]:
    return {
        "evaluations": result.evaluations,
        "wall_s": wall_s,
        "evals_per_s": result.evaluations / wall_s if wall_s > 0 else None,
        "winner": result.winner,
        "variant": result.candidate_variant,
        "config": result.candidate_config,
        "speedup": result.speedup_vs_baseline,
        "ci": list(result.speedup_ci) if result.speedup_ci else None,
    }


def same_decision(one: dict[str, Any], other: dict[str, Any]) -> bool | None:
    """The same variant and config, or ``other``'s speedup inside ``one``'s 95% interval; None
    when either run failed."""
    if "error" in one or "error" in other:
        return None
    if (one["winner"], one["variant"], one["config"]) == (other["winner"], other["variant"], other["config"]):
        return True
    ci, speedup = one.get("ci"), other.get("speedup")
    return bool(ci and speedup is not None and ci[0] <= speedup <= ci[1])


def run_tuning_row(item: tuple[str, str, int], args: Any, chosen: list[Setup]) -> dict[str, Any]:
    name, workload, budget = item
    spec = parse_workload(workload, "bf16", {})
    runs = {s.label: tune_fresh(spec, budget, args.seed, args.strategy, s, args.smoke) for s in chosen}
    row: dict[str, Any] = {"workload": name, "shape": workload.split(":", 1)[1], "budget": budget, "runs": runs}
    one, two = runs["1 GPU"], runs["2 GPUs"]
    if one.get("evals_per_s") and two.get("evals_per_s"):
        row["throughput_x"] = two["evals_per_s"] / one["evals_per_s"]
        row["meets_target"] = not args.smoke and row["throughput_x"] >= THROUGHPUT_TARGET
    row["same_decision"] = same_decision(one, two)
    ray = runs.get("ray 2")
    if ray and ray.get("evals_per_s") and two.get("evals_per_s"):
        row["ray_vs_local"] = ray["evals_per_s"] / two["evals_per_s"]
        row["ray_within_5pct"] = abs(row["ray_vs_local"] - 1.0) <= RAY_TOLERANCE
    return row


def run_model_row(args: Any, chosen: list[Setup]) -> dict[str, Any]:
    """``optimize_model`` of one model with one GPU, then two; wall time and what it replaced."""
    from kernelsmith.models import example_inputs, load_model
    from kernelsmith.whole_model.optimize import optimize_model

    device = "cpu" if args.smoke else "cuda"
    dtype = torch.float32 if args.smoke else torch.bfloat16
    model = load_model(args.model, tiny=args.smoke, device=device).module.to(dtype=dtype).eval()
    inputs = example_inputs(model, 1 if args.smoke else 8, 16 if args.smoke else 2048, device)
    runs: dict[str, Any] = {}
    for setup in (s for s in chosen if s.executor == "local"):
        with tempfile.TemporaryDirectory(prefix="kernelsmith-scale-out-") as folder:
            started = time.perf_counter()
            try:
                _, report = optimize_model(model, inputs, budget=args.model_budget, db=str(Path(folder) / "m.db"),
                                           strategy=args.strategy, devices=list(setup.devices) or None)  # fmt: skip
                runs[setup.label] = {"wall_s": time.perf_counter() - started, "report": report}
            except Exception as exc:
                runs[setup.label] = {"error": f"{type(exc).__name__}: {exc}"[:500]}
    row: dict[str, Any] = {"workload": f"optimize_model {args.model}", "budget": args.model_budget, "runs": runs}
    one, two = runs.get("1 GPU", {}), runs.get("2 GPUs", {})
    if one.get("wall_s") and two.get("wall_s"):
        row["wall_x"] = one["wall_s"] / two["wall_s"]
    return row


def print_table(report: dict[str, Any]) -> None:
    print_smoke_banner(report)
    print(f"\n{report['gpu']}  {report['date']}  strategy {report['strategy']}, seed {report['seed']}")
    print("evaluations / wall s (evals/s); x = 2 GPUs over 1 GPU (target >= 1.8); ray = ray 2 over 2 GPUs (within 5%)")
    labels = [s["label"] for s in report["setups"]]
    print(f"{'workload':28} {'budget':>6} " + " ".join(f"{label:>22}" for label in labels)
          + f" {'x':>6} {'ray':>6} same decision")  # fmt: skip
    for row in report["rows"]:
        if "error" in row:
            print(f"{row.get('workload', '?'):28} ERROR {row['error'].splitlines()[-1][:100]}")
            continue
        cells = []
        for label in labels:
            run = row["runs"].get(label)
            if run is None or "error" in run:
                cells.append(f"{'error' if run else '-':>22}")
            elif "evals_per_s" in run:
                rate = run["evals_per_s"] or 0.0
                cells.append(f"{run['evaluations']:>4} / {run['wall_s']:6.1f} ({rate:5.2f})".rjust(22))
            else:
                cells.append(f"{run['wall_s']:10.1f} s".rjust(22))
        x = row.get("throughput_x", row.get("wall_x"))
        ray = row.get("ray_vs_local")
        same = {True: "yes", False: "NO", None: "-"}[row.get("same_decision")]
        print(f"{row['workload']:28} {row.get('budget', ''):>6} {' '.join(cells)} "
              f"{(f'{x:.2f}' if x else '-'):>6} {(f'{ray:.2f}' if ray else '-'):>6} {same}")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="scale_out.json")
    parser.add_argument("--only", default="", help=f"these rows only (comma-separated: {', '.join(WORKLOADS)}, model)")
    parser.add_argument("--budgets", default=",".join(map(str, BUDGETS)), help="comma-separated (default 50,200)")
    parser.add_argument("--strategy", default="random", help="the same for every run (default random)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--model", default="llama-160m", help="the optimize_model row's model")
    parser.add_argument("--model-budget", type=int, default=100)
    parser.add_argument("--no-ray", action="store_true", help="leave out the Ray rows")
    parser.add_argument("--smoke", action="store_true", help="the code path on the CPU in the Triton interpreter "
                        "(tiny shapes, budget 2): timings are NOT performance")  # fmt: skip
    args = parser.parse_args(argv)
    known = (*WORKLOADS, "model")
    only = [s for s in args.only.split(",") if s]
    if set(only) - set(known):
        print(f"unknown workloads {sorted(set(only) - set(known))} (known: {', '.join(known)})", file=sys.stderr)
        return 2
    try:
        budgets = [int(b) for b in args.budgets.split(",") if b]
    except ValueError:
        print(f"--budgets takes integers: {args.budgets!r}", file=sys.stderr)
        return 2
    if args.smoke:
        import os

        if os.environ.get("TRITON_INTERPRET") != "1":
            print("--smoke runs the kernels in the Triton interpreter: set TRITON_INTERPRET=1", file=sys.stderr)
            return 2
        budgets, args.model_budget = [2], 2
    elif torch.cuda.device_count() < 2:
        print(f"benchmarks/scale_out.py needs two CUDA GPUs (this host has {torch.cuda.device_count()}; "
              "or --smoke)", file=sys.stderr)  # fmt: skip
        return 2
    with_ray = not args.no_ray and importlib.util.find_spec("ray") is not None
    chosen = setups(args.smoke, with_ray)
    args.budget = ",".join(map(str, budgets))  # start_report's header
    report = start_report(args, seed=args.seed, setups=[vars(s) for s in chosen], ray=with_ray)
    workloads = SMOKE_WORKLOADS if args.smoke else WORKLOADS
    items = [(name, workloads[name], b) for name in workloads if not only or name in only for b in budgets]
    run_rows(report, args.out, items, lambda item: run_tuning_row(item, args, chosen),
             lambda item: {"workload": item[0], "budget": item[2]})  # fmt: skip
    if not only or "model" in only:
        run_rows(report, args.out, [args.model], lambda _: run_model_row(args, chosen),
                 lambda model: {"workload": f"optimize_model {model}"})  # fmt: skip
    print_table(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())

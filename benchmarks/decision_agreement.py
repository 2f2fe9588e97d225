"""Does the tuner's decision agree with what the user runs? For every op family on one shape (a
small and a large workload for the norms): tune with a small budget, then time the *served* call
and the eager baseline independently, in this process, beside the decision's own figures.

    python benchmarks/decision_agreement.py --json agreement.json [--only rmsnorm,decode_matmul] [--budget 8]

Why (issues 13 and 19): on small workloads the decision and an independent measurement disagreed.
The decode QKV projection (M=1, RMSNorm prologue, RoPE epilogue) was decided 5.5x faster than its
eager baseline while ``triton.testing.do_bench`` of the served call said 0.97x: the eager reference
is many small PyTorch launches, the host took longer to launch them than the device to run them,
and stream timing charged the baseline host launch gaps that a CUDA-graph decode step never pays.
The worker now times such workloads as replayed CUDA graphs (``timing_mode``: see
:func:`kernelsmith.evaluate.timing.choose_timing_mode`); this script checks the result.

For each row:

- ``decision``: the tuned decision's candidate and baseline medians, speedup and 95% CI, and its
  ``timing_mode`` (``stream`` or ``graph-replay``). A "baseline" decision keeps its best
  candidate's figures, and that candidate is the one measured below.
- ``do_bench``: ``triton.testing.do_bench`` (CUDA events, L2 flushed before each call, median)
  of the served call and of the eager baseline, each launched from the host: what a user's eager
  loop sees, launch gaps included.
- ``cudagraph``: ``triton.testing.do_bench_cudagraph`` of the same two calls: replayed from a
  CUDA graph, as a captured decode step runs them (without an L2 flush: on workloads smaller
  than the L2 both sides read warm data, so only the ratio is comparable).
- ``replay_flushed``: each call captured in a CUDA graph and replayed with the L2 flushed before
  every replay, the two interleaved (``kernelsmith.evaluate.timing``'s capture and interleaved
  timer, here in the user's process on the served call): the conditions of a graph-replay decision.
- ``host_us``: host time per call over back-to-back calls; close to the device time, a call is
  bound by its launch path.

The row is flagged when the independent speedup that matches the decision's timing mode
(``do_bench`` for stream decisions, ``replay_flushed`` for graph-replay ones) lies outside the
decision's confidence interval; every ratio is printed and stored.

What "the served call" is: the kernel's :class:`kernelsmith.dispatch.KernelRunner`, i.e. output
allocation (``torch.empty_like`` / ``torch.empty``, host-only, from the caching allocator) plus
the direct launch of the compiled kernel; the decision times the launch alone into buffers
allocated once. A decorated function's cache hit adds its call key and table lookup and the
packing of outputs, a few microseconds of host time (``benchmarks/dispatch_overhead.py``
measures it), and rule 12's serve checks (its first calls and 1 in 1000 later ones run the
user's function too; a median does not see them). Host time hides behind device work unless the
call is host-bound, which is exactly the launch-bound case graph replay exists for: inside a
CUDA graph no host cost is paid at all.

``--budget 8`` keeps a run to a few minutes on an H200 (the torch.compile baseline is not timed
unless ``--compile-baseline``: this script compares with the eager one). Prints a table and writes
JSON (date, GPU, versions, command) after every row. Needs a CUDA GPU; ``--smoke`` runs the code
path on the CPU in the Triton interpreter at tiny shapes (timings NOT performance, no cudagraph).

    TRITON_INTERPRET=1 python benchmarks/decision_agreement.py --smoke --only softmax --json /tmp/agree.json
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import triton.testing
from _common import (
    add_run_options,
    bench,
    print_smoke_banner,
    run_rows,
    runner_of,
    settle_run_options,
    start_report,
    synchronize,
    tune,
)

from kernelsmith.evaluate import timing
from kernelsmith.ops import get_op
from kernelsmith.spec import OpSpec

Fn = Callable[[], Any]
DEFAULT_BUDGET = 8


@dataclass(frozen=True)
class Row:
    """One family at one shape (``tiny``: the shape a --smoke run uses)."""

    op: str
    shape: tuple[int, ...]
    size: str = ""  # "small" / "large" for the norms' two workloads
    constants: dict[str, Any] = field(default_factory=dict)
    tiny: tuple[int, ...] | None = None

    @property
    def label(self) -> str:
        return f"{self.op}{f' ({self.size})' if self.size else ''}"

    def spec(self, smoke: bool) -> OpSpec:
        family = get_op(self.op)
        shape = (self.tiny or family.small_shape(self.shape)) if smoke else self.shape
        return family.spec(shape, "bf16", **self.constants)


QKV = {"prologue": "rmsnorm", "epilogue": "rope", "rope": (32, 8)}  # Llama-3.2-1B's fused QKV projection
ROWS = [
    # The norms: a small workload (8 MiB, launch-bound at the eager baseline) and a large one.
    Row("rmsnorm", (2048, 2048), "small"), Row("rmsnorm", (8192, 4096), "large"),
    Row("layernorm", (2048, 2048), "small", {"eps": 1e-5}), Row("layernorm", (8192, 4096), "large", {"eps": 1e-5}),
    Row("add_rmsnorm", (2048, 2048), "small"), Row("add_rmsnorm", (8192, 4096), "large"),
    Row("rmsnorm_backward", (2048, 2048)), Row("layernorm_backward", (2048, 2048), constants={"eps": 1e-5}),
    Row("add_rmsnorm_backward", (2048, 2048)),
    Row("softmax", (4096, 4096)),
    Row("gelu", (4096, 8192)), Row("gelu_tanh", (4096, 8192)),
    Row("swiglu", (4096, 8192)), Row("geglu", (4096, 8192)),
    Row("swiglu_backward", (4096, 8192)), Row("geglu_backward", (4096, 8192)),
    Row("sum", (4096, 4096)), Row("mean", (4096, 4096)), Row("max", (4096, 4096)),
    Row("cross_entropy", (4096, 32000)), Row("cross_entropy_backward", (4096, 32000)),
    Row("cross_entropy_fused", (4096, 32000)),
    Row("rope", (1, 32, 1024, 64), tiny=(1, 2, 16, 16)),
    Row("matmul", (2048, 2048, 2048), tiny=(16, 32, 32)),
    Row("attention", (1, 32, 1024, 64), constants={"causal": True}, tiny=(1, 2, 32, 16)),
    Row("decode_matmul", (1, 3072, 2048), "qkv", QKV, tiny=(1, 768, 256)),
    Row("decode_matmul", (1, 2048, 2048), "o", tiny=(1, 64, 64)),
    Row("decode_attention", (1, 32, 1024, 64), constants={"kv_heads": 8}, tiny=(1, 8, 32, 16)),
    Row("linear_cross_entropy", (2048, 2048, 32000), tiny=(16, 32, 64)),
    Row("linear_cross_entropy_backward", (2048, 2048, 32000), tiny=(16, 32, 64)),
    Row("linear_cross_entropy_fused", (2048, 2048, 32000), tiny=(16, 32, 64)),
]


# ---- measuring ------------------------------------------------------------------------------------
def cudagraph_us(fn: Fn) -> float:
    """Median time of ``fn()`` replayed from a CUDA graph (``do_bench_cudagraph``), in us."""
    return float(triton.testing.do_bench_cudagraph(fn, rep=100, return_mode="median")) * 1000.0


def replay_flushed_us(impls: dict[str, Fn], rounds: int = 100) -> dict[str, float | str]:
    """Median time of each call replayed from its own CUDA graph, L2 flushed before every replay,
    the implementations interleaved round by round; a call that cannot be captured gets its error."""
    flusher = timing.L2Flusher(torch.device("cuda"))
    figures: dict[str, float | str] = {}
    replays: dict[str, timing.Runner] = {}
    for name, fn in impls.items():
        replay = timing.capture_or_reason(lambda s, fn=fn: fn(), 1)
        if isinstance(replay, str):
            figures[name] = replay[:200]
        else:
            replays[name] = replay
    if replays:
        samples = timing.interleaved_gpu(list(replays.values()), 1, rounds, 10.0, flusher)
        for name, times in zip(replays, samples, strict=True):
            figures[name] = timing.summarize(times)["median_us"]
    return figures


def host_us(fn: Fn, device: str, calls: int = 50) -> float:
    """Host time per call over back-to-back calls, the device drained at the end."""
    synchronize(device)
    started = time.perf_counter()
    for _ in range(calls):
        fn()
    synchronize(device)
    return (time.perf_counter() - started) / calls * 1e6


def _measure(impls: dict[str, Fn], device: str, smoke: bool) -> dict[str, dict[str, float | str]]:
    """Each timing of each implementation; a timing that fails is recorded as its error."""
    timers: dict[str, Callable[[Fn], float]] = {"do_bench": lambda fn: bench(fn, smoke),
                                                "host_us": lambda fn: host_us(fn, device, 5 if smoke else 50)}
    if not smoke:
        timers["cudagraph"] = cudagraph_us
    figures: dict[str, dict[str, float | str]] = {name: {} for name in timers}
    for timer, measure in timers.items():
        for impl, fn in impls.items():
            try:
                figures[timer][impl] = measure(fn)
            except Exception as exc:  # an uncapturable call is data, not the end of the run
                figures[timer][impl] = f"{type(exc).__name__}: {exc}"[:200]
    if not smoke:
        figures["replay_flushed"] = replay_flushed_us(impls)
    return figures


def speedup(figures: dict[str, float | str]) -> float | None:
    """Baseline time over served time, or None where either failed."""
    base, served = figures.get("baseline"), figures.get("served")
    if isinstance(base, float) and isinstance(served, float) and served > 0:
        return base / served
    return None


def agreement(row: dict[str, Any]) -> None:
    """Add the independent speedups and the flag to ``row`` (see the module docstring)."""
    decision = row["decision"]
    ci = decision.get("ci")
    row["speedups"] = {timer: speedup(row["us"][timer]) for timer in ("do_bench", "cudagraph", "replay_flushed")
                       if timer in row["us"]}  # fmt: skip
    matching = "replay_flushed" if decision.get("timing_mode") == "graph-replay" else "do_bench"
    row["compared_with"] = matching
    independent = row["speedups"].get(matching)
    row["disagrees"] = bool(ci and independent is not None and not ci[0] <= independent <= ci[1])


def run_row(w: Row, budget: int, db: str, strategy: str, smoke: bool) -> dict[str, Any]:
    family = get_op(w.op)
    spec = w.spec(smoke)
    device = "cpu" if smoke else "cuda"
    row: dict[str, Any] = {"op": w.label, "spec": spec.describe()}
    result, row["tune"] = tune(spec, budget, db, strategy)
    row["decision"] = {"winner": result.winner, "variant": result.candidate_variant,
                       "median_us": result.median_us, "baseline_us": result.baseline_us,
                       "speedup": result.speedup_vs_baseline,
                       "ci": list(result.speedup_ci) if result.speedup_ci else None,
                       "timing_mode": result.timing_mode, "note": result.note}  # fmt: skip
    if not result.candidate_variant:
        row["error"] = "no candidate passed validation: nothing to serve"
        return row
    inputs = family.make_inputs(spec, 1234, family.distributions[0], device)
    served = runner_of(family, spec, result)
    impls: dict[str, Fn] = {"served": lambda: served(inputs), "baseline": lambda: family.reference(spec, inputs)}
    row["us"] = _measure(impls, device, smoke)
    agreement(row)
    return row


# ---- the table ------------------------------------------------------------------------------------
def _cell(value: Any, width: int, digits: int = 1) -> str:
    return f"{value:{width}.{digits}f}" if isinstance(value, float) else f"{'-':>{width}}"


def print_table(report: dict[str, Any]) -> None:
    print_smoke_banner(report)
    print(f"\n{report['gpu']}  {report['date']}  budget {report['budget']}")
    print(f"{'op':34} {'mode':12} {'decision us':>16} {'x (95% CI)':>20} {'do_bench us':>16} {'x':>6} "
          f"{'cudagraph us':>16} {'x':>6} {'replay+flush us':>16} {'x':>6} {'host us':>16}  flag")  # fmt: skip
    for row in report["rows"]:
        if "us" not in row:
            print(f"{row['op']:34} ERROR {str(row.get('error', ''))[-80:]}")
            continue
        d, us, x = row["decision"], row["us"], row["speedups"]
        ci = d.get("ci") or [math.nan, math.nan]
        interval = f"{_cell(d.get('speedup'), 5, 2)} ({ci[0]:.2f}-{ci[1]:.2f})"

        def pair(timer: str, us: dict[str, Any] = us) -> str:
            t = us.get(timer, {})
            return f"{_cell(t.get('served'), 7)} {_cell(t.get('baseline'), 8)}"

        flag = f"DISAGREES ({row['compared_with']})" if row["disagrees"] else ""
        print(f"{row['op']:34} {d.get('timing_mode') or '-':12} {_cell(d.get('median_us'), 7)} "
              f"{_cell(d.get('baseline_us'), 8)} {interval:>20} {pair('do_bench')} {_cell(x.get('do_bench'), 6, 2)} "
              f"{pair('cudagraph')} {_cell(x.get('cudagraph'), 6, 2)} {pair('replay_flushed')} "
              f"{_cell(x.get('replay_flushed'), 6, 2)} {pair('host_us')}  {flag}")  # fmt: skip
    print("(us: served kernel, then eager baseline; x: baseline / served)")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", "--out", dest="out", default="decision_agreement.json", help="the JSON report")
    parser.add_argument("--only", default="", help="rows of these ops only (comma-separated op names)")
    parser.add_argument("--skip-backward", action="store_true", help="leave out the backward families' rows")
    parser.add_argument("--compile-baseline", action="store_true",
                        help="let decisions time the torch.compile baseline too (slower)")  # fmt: skip
    add_run_options(parser, "row", DEFAULT_BUDGET)
    return parser.parse_args(argv)


def selected(only: str, skip_backward: bool = False) -> list[Row]:
    """The rows ``--only`` and ``--skip-backward`` leave (an unknown op name is refused)."""
    wanted = {s.strip() for s in only.split(",") if s.strip()}
    unknown = wanted - {w.op for w in ROWS}
    if unknown:
        raise SystemExit(f"--only: no rows for {', '.join(sorted(unknown))}")
    rows = [w for w in ROWS if not wanted or w.op in wanted]
    return [w for w in rows if not (skip_backward and w.op.endswith("_backward"))]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    refusal = settle_run_options(args, "benchmarks/decision_agreement.py", DEFAULT_BUDGET)
    if refusal:
        print(refusal, file=sys.stderr)
        return 2
    rows = selected(args.only, args.skip_backward)
    if not args.compile_baseline:
        os.environ["KERNELSMITH_COMPILE_BASELINE"] = "off"  # read by the tuner when it decides
    report = start_report(args)
    run_rows(report, args.out, rows, lambda w: run_row(w, args.budget, args.db, args.strategy, args.smoke),
             lambda w: {"op": w.label, "shape": "x".join(map(str, w.shape))})  # fmt: skip
    print_table(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())

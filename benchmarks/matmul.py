"""Matmul benchmark: tune the ``matmul`` family at the issue's shapes, then time the winner side by
side with cuBLAS (``F.linear``), in one process.

    python benchmarks/matmul.py --out matmul.json [--only plain,fused:swiglu,8192x11008x4096] [--budget 60]
        [--skip max-autotune]

``--only`` takes rows by group (plain, decode, fused), by group and epilogue (fused:swiglu), by
shape (16x4096x4096) or by both (fused:swiglu:16x11008x4096); ``--skip`` leaves implementations out
(max-autotune's search costs tens of seconds a row).

Rows (bfloat16, weights stored (N, K) as nn.Linear does):

- plain products at 4096^3, 8192^3 and the Llama MLP shape 8192 x 11008 x 4096 (M x N x K), and
  decode shapes (M = 1 and 16 at N = 4096 and 11008, K = 4096): the tuned kernel against
  ``F.linear`` (cuBLAS) and ``torch.compile(mode="max-autotune-no-cudagraphs")``. Target: 0.95x
  cuBLAS or better;
- fused epilogues (bias+GELU, SiLU, residual add, SwiGLU; large and decode M): the tuned fused
  kernel against the same expression in eager PyTorch (cuBLAS, then the epilogue as separate
  kernels), against max-autotune (which may fuse the epilogue into its own Triton matmul), against
  the product alone (cuBLAS without the epilogue: the floor a fused kernel tries to reach), and,
  for bias+GELU(tanh), against cuBLASLt's own fused epilogue (``torch._addmm_activation``). Target:
  1.1x the eager expression or better.

Every implementation is timed with ``triton.testing.do_bench`` (CUDA events, L2 flushed, median).
TFLOP/s = the family's flop count (2 M N K per product, plus the epilogue's) / time; GB/s = bytes
(each input read once, the output written once) / time, which is what decode rows are bound by.
Prints a table and writes JSON with the date, GPU, versions and command after every row. Needs a
CUDA GPU. When the tuned kernel does not beat eager PyTorch (the decision is "baseline": a user gets
PyTorch), the best candidate is still timed, as ``best candidate``, for the record.

``--smoke`` runs the same code on the CPU in the Triton interpreter (set ``TRITON_INTERPRET=1``):
each row shrunk to M, N, K of a few dozen, max-autotune skipped and a host-clock timer: a test that
the script runs, whose timings are NOT performance.

    TRITON_INTERPRET=1 python benchmarks/matmul.py --smoke --out /tmp/matmul-smoke.json
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.nn.functional as F
from _common import (
    add_run_options,
    bench,
    max_abs_diff,
    print_smoke_banner,
    run_rows,
    settle_run_options,
    start_report,
    synchronize,
    tune,
)

from kernelsmith import dispatch
from kernelsmith.evaluate.timing import measure_copy_bandwidth
from kernelsmith.ops import get_op
from kernelsmith.space import Config

Fn = Callable[..., Any]

# ---- what users write (the eager baselines), by epilogue -------------------------------------------

EAGER: dict[str, Fn] = {
    "none": lambda x, w: F.linear(x, w),
    "bias+gelu": lambda x, w, b: F.gelu(F.linear(x, w, b)),
    "bias+gelu_tanh": lambda x, w, b: F.gelu(F.linear(x, w, b), approximate="tanh"),
    "silu": lambda x, w: F.silu(F.linear(x, w)),
    "residual": lambda x, w, r: F.linear(x, w) + r,
    "swiglu": lambda x, w1, w3: F.silu(F.linear(x, w1)) * F.linear(x, w3),
}

# The product alone, without its epilogue (cuBLAS): the floor of a fused kernel.
PRODUCT_ONLY: dict[str, Fn] = {
    "bias+gelu": lambda x, w, b: F.linear(x, w, b),
    "bias+gelu_tanh": lambda x, w, b: F.linear(x, w, b),
    "silu": lambda x, w: F.linear(x, w),
    "residual": lambda x, w, r: F.linear(x, w),
    "swiglu": lambda x, w1, w3: (F.linear(x, w1), F.linear(x, w3)),
}


def cublaslt_gelu(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """cuBLASLt's fused bias + GELU(tanh) epilogue (a private PyTorch entry point)."""
    return torch._addmm_activation(b, x, w.t(), use_gelu=True)


@dataclass(frozen=True)
class Workload:
    group: str  # plain, decode or fused
    shape: tuple[int, int, int]  # M, N, K
    epilogue: str = "none"

    @property
    def label(self) -> str:
        return f"{self.group}:{self.epilogue}"

    @property
    def shape_text(self) -> str:
        return "x".join(map(str, self.shape))

    def matches(self, selector: str) -> bool:
        """Whether ``--only``'s ``selector`` names this row: its group, group:epilogue, shape or
        group:epilogue:shape."""
        return selector in (self.group, self.label, self.shape_text, f"{self.label}:{self.shape_text}")

    def tiny(self) -> Workload:
        """The same kind of row at a size the Triton interpreter runs in seconds (--smoke): decode
        rows keep M (1 or 16); N and K become a few dozen, different sizes staying different."""
        m, n, k = self.shape
        return replace(self, shape=(m if m <= 16 else 33, 48 if n <= 4096 else 64, 64 if k <= 4096 else 40))


WORKLOADS = [
    Workload("plain", (4096, 4096, 4096)),
    Workload("plain", (8192, 8192, 8192)),
    Workload("plain", (8192, 11008, 4096)),
    Workload("decode", (1, 4096, 4096)),
    Workload("decode", (16, 4096, 4096)),
    Workload("decode", (1, 11008, 4096)),
    Workload("decode", (16, 11008, 4096)),
    Workload("fused", (8192, 11008, 4096), "bias+gelu"),
    Workload("fused", (8192, 11008, 4096), "bias+gelu_tanh"),
    Workload("fused", (8192, 11008, 4096), "silu"),
    Workload("fused", (8192, 4096, 11008), "residual"),
    Workload("fused", (8192, 11008, 4096), "swiglu"),
    Workload("fused", (16, 11008, 4096), "swiglu"),
    Workload("fused", (16, 4096, 11008), "residual"),
]

TARGETS = {"plain": 0.95, "decode": 0.95, "fused": 1.1}  # kernelsmith / eager, at least
SMOKE_SKIPS = ("max-autotune",)  # compiles for CUDA: not part of a CPU smoke test


def run_workload(
    w: Workload, budget: int, db: str, strategy: str, copy_gbps: float | None, skip: frozenset[str] = frozenset(),
    smoke: bool = False,
) -> dict[str, Any]:
    """One row: tune, then run and time every implementation not in ``skip`` (errors recorded per
    implementation)."""
    device = "cpu" if smoke else "cuda"
    family = get_op("matmul")
    spec = family.spec(w.shape, "bf16", epilogue=w.epilogue)
    m, n, k = w.shape
    row: dict[str, Any] = {"group": w.group, "epilogue": w.epilogue, "shape": w.shape_text, "dtype": "bf16"}
    result, row["tune"] = tune(spec, budget, db, strategy)
    inputs = family.make_inputs(spec, 1234, "normal", device)
    flops, nbytes = family.flops(spec), family.bytes_moved(spec)

    eager = EAGER[w.epilogue]
    torch._dynamo.reset()  # fresh caches and static shapes: the strongest compiled baseline per shape
    impls: dict[str, Fn] = {"eager": eager}
    if "max-autotune" not in skip:  # compiled (and autotuned) at its first call, below
        impls["max-autotune"] = torch.compile(eager, mode="max-autotune-no-cudagraphs", dynamic=False)
    if w.epilogue in PRODUCT_ONLY:
        impls["product only"] = PRODUCT_ONLY[w.epilogue]
    if w.epilogue == "bias+gelu_tanh":
        impls["cublaslt epilogue"] = cublaslt_gelu
    if result.candidate_variant:  # the tuned kernel, or the best candidate of a "baseline" decision
        name = "kernelsmith" if result.winner == "kernel" else "best candidate"
        try:
            config = Config(result.candidate_config)
            launcher = family.variant(str(result.candidate_variant)).build(spec, config)
            runner = dispatch.KernelRunner.build(family, spec, launcher, str(result.candidate_variant), config)
            impls[name] = lambda *args: runner(args)[0]
        except Exception as exc:  # a variant that no longer builds is reported, not fatal
            row.setdefault("errors", {})[name] = f"{type(exc).__name__}: {exc}"[:500]
    impls = {name: fn for name, fn in impls.items() if name not in skip}
    if skip:
        row["skipped"] = sorted(skip)

    times: dict[str, float] = {}
    reference = None
    for name, fn in impls.items():
        try:
            out = fn(*inputs)
            synchronize(device)
            if name == "eager":
                reference = out
            elif reference is not None and name != "product only":
                row.setdefault("max_abs_diff_vs_eager", {})[name] = max_abs_diff(out, reference)
            times[name] = bench(lambda fn=fn: fn(*inputs), smoke)
        except Exception as exc:  # a baseline that fails to compile is reported, not fatal
            row.setdefault("errors", {})[name] = f"{type(exc).__name__}: {exc}"[:500]
    row["us"] = times
    # The product-only time is for fewer flops and bytes: its rates use the product's own counts.
    product_flops = 2 * m * n * k * (2 if w.epilogue == "swiglu" else 1)
    row["tflops"] = {k_: (product_flops if k_ == "product only" else flops) / (t * 1e-6) / 1e12
                     for k_, t in times.items()}  # fmt: skip
    row["gbps"] = {k_: nbytes / (t * 1e-6) / 1e9 for k_, t in times.items() if k_ != "product only"}
    if copy_gbps:
        row["pct_of_copy"] = {k_: 100.0 * v / copy_gbps for k_, v in row["gbps"].items()}
    if "kernelsmith" in times and "eager" in times:
        row["speedup_vs_eager"] = times["eager"] / times["kernelsmith"]
        row["target"] = TARGETS[w.group]
        row["meets_target"] = row["speedup_vs_eager"] >= TARGETS[w.group]
        others = [t for k_, t in times.items() if k_ not in ("kernelsmith", "product only")]
        row["speedup_vs_best_other"] = min(others) / times["kernelsmith"]
    return row


COLUMNS = ("eager", "max-autotune", "product only", "cublaslt epilogue", "kernelsmith", "best candidate")


def print_table(report: dict[str, Any]) -> None:
    print_smoke_banner(report)
    print(f"\n{report['gpu']}  copy {report['copy_gbps'] or 0:.0f} GB/s  {report['date']}")
    print("TFLOP/s (decode rows: GB/s in brackets); x eager = eager time / kernelsmith time")
    header = f"{'row':22} {'M x N x K':18} " + " ".join(f"{c:>17}" for c in COLUMNS)
    print(header + f" {'x eager':>8} {'target':>6} winner")
    for row in report["rows"]:
        label = f"{row.get('group', '?')}:{row.get('epilogue', '?')}"
        if "us" not in row:
            print(f"{label:22} {row.get('shape', ''):18} ERROR")
            continue
        cells = []
        for name in COLUMNS:
            if name not in row["tflops"]:
                cells.append(f"{'-':>17}")
            elif row["group"] == "decode":
                cells.append(f"{row['tflops'][name]:7.2f} ({row['gbps'].get(name, 0.0):5.0f})")
            else:
                cells.append(f"{row['tflops'][name]:17.1f}")
        speedup = row.get("speedup_vs_eager")
        tune_info = row["tune"]
        print(
            f"{label:22} {row['shape']:18} {' '.join(cells)} "
            f"{(f'{speedup:.3f}' if speedup else '-'):>8} {row.get('target', '-'):>6} "
            f"{tune_info['winner']} {tune_info.get('variant') or ''}"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="matmul.json")
    add_run_options(parser, "row", 60)
    parser.add_argument("--only", default="", help="these rows only (comma-separated groups plain, decode, fused; "
                        "group:epilogue such as fused:swiglu; shapes MxNxK; or group:epilogue:MxNxK)")
    parser.add_argument("--skip", default="", help=f"leave out these implementations (comma-separated: "
                        f"{', '.join(c for c in COLUMNS if c != 'eager')})")
    args = parser.parse_args(argv)
    only = [s for s in args.only.split(",") if s]
    unknown = [s for s in only if not any(w.matches(s) for w in WORKLOADS)]
    skip = frozenset(s for s in args.skip.split(",") if s)
    if unknown or "eager" in skip or skip - set(COLUMNS):
        print(f"unknown rows {unknown} (groups plain, decode, fused; labels such as fused:swiglu; shapes such as "
              f"8192x11008x4096) or implementations to skip {sorted(skip)} (eager is the reference)",
              file=sys.stderr)
        return 2
    refusal = settle_run_options(args, "benchmarks/matmul.py", 60)
    if refusal:
        print(refusal, file=sys.stderr)
        return 2
    if args.smoke:
        skip |= set(SMOKE_SKIPS)
    copy_gbps = None if args.smoke else measure_copy_bandwidth(torch.device("cuda"))[0]
    report = start_report(args, copy_gbps=copy_gbps)
    chosen = [w.tiny() if args.smoke else w for w in WORKLOADS if not only or any(w.matches(s) for s in only)]
    run_rows(report, args.out, chosen,
             lambda w: run_workload(w, args.budget, args.db, args.strategy, copy_gbps, skip, args.smoke),
             lambda w: {"group": w.group, "epilogue": w.epilogue, "shape": w.shape_text})  # fmt: skip
    print_table(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Attention benchmark: tune the ``attention`` family at the issue's shapes, then time the winner
side by side with PyTorch's SDPA backends (cuDNN, FlashAttention-2 and whatever SDPA picks by
default), in one process.

    python benchmarks/attention.py --out attention.json [--only causal-d128,decode] [--budget 50]

Every implementation computes ``F.scaled_dot_product_attention(q, k, v, is_causal=...,
enable_gqa=...)`` on the same bf16 inputs in the (B, H, S, D) layout and is timed with
``triton.testing.do_bench`` (CUDA events, L2 flushed, median). TFLOP/s use the family's flop
count (4 * B * H * D per attended (query, key) pair: causal counts the pairs j <= i, about half,
as FlashAttention's and cuDNN's figures do); GB/s use its byte count (q, k, v read once, the
output written once), which is what bounds a decode step. A backend that cannot run a shape
(cuDNN without GQA support in the installed torch, say) gets an error entry, not a crash. Prints a
table and writes JSON with the date, GPU, versions and command after every row. Needs a CUDA GPU.

When the tuned kernel does not beat SDPA's default (the decision is "baseline": a user gets PyTorch),
the best candidate is still timed, as ``best candidate``, for the record.

``--smoke`` runs the same code on the CPU in the Triton interpreter (set ``TRITON_INTERPRET=1``):
each workload shrunk to one sequence of a few positions, the CUDA-only SDPA backends skipped and a
host-clock timer: a test that the script runs, whose timings are NOT performance.

    TRITON_INTERPRET=1 python benchmarks/attention.py --smoke --out /tmp/attention-smoke.json
"""

from __future__ import annotations

import argparse
import math
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
from kernelsmith.ops import get_op
from kernelsmith.space import Config

Fn = Callable[[], Any]


@dataclass(frozen=True)
class Workload:
    label: str
    shape: tuple[int, int, int, int]  # B, H, Sq, D
    causal: bool
    kv_heads: int | None = None
    kv_len: int | None = None

    def describe(self) -> str:
        b, h, s, d = self.shape
        text = f"B{b} H{h} S{s} D{d}"
        if self.kv_heads is not None:
            text += f" Hkv{self.kv_heads}"
        if self.kv_len is not None:
            text += f" Skv{self.kv_len}"
        return text + (" causal" if self.causal else "")

    def tiny(self) -> Workload:
        """The same kind of workload at a size the Triton interpreter runs in seconds (--smoke)."""
        _, _, s, d = self.shape
        return replace(
            self,
            shape=(1, 2, 1 if s == 1 else 17 if d >= 128 else 33, 32 if d >= 128 else 16),
            kv_heads=None if self.kv_heads is None else 1,
            kv_len=None if self.kv_len is None else 33,
        )


WORKLOADS = [
    Workload("causal-d128", (8, 32, 2048, 128), causal=True),
    Workload("full-d128", (8, 32, 2048, 128), causal=False),
    Workload("causal-d64", (16, 16, 1024, 64), causal=True),
    # Llama-3-8B-like grouped-query attention: 32 query heads share 8 key/value heads.
    Workload("gqa", (8, 32, 2048, 128), causal=True, kv_heads=8),
    # One decode step of the same model against a 4096-token cache (torch's is_causal would let
    # the single query see key 0 only: a decode step is not causal in torch's terms).
    Workload("decode", (8, 32, 1, 128), causal=False, kv_heads=8, kv_len=4096),
]

BACKENDS = {
    "cudnn": "CUDNN_ATTENTION",
    "flash": "FLASH_ATTENTION",
}
COLUMNS = ("sdpa", "cudnn", "flash", "kernelsmith", "best candidate")


def sdpa_call(inputs: tuple[torch.Tensor, ...], causal: bool, backend: str | None) -> Fn:
    """A closure running SDPA on ``inputs`` with one backend (None: SDPA's own choice)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q, k, v = inputs
    gqa = k.shape[1] != q.shape[1]

    def call() -> torch.Tensor:
        if backend is None:
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa)
        with sdpa_kernel(getattr(SDPBackend, backend)):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa)

    return call


def run_workload(w: Workload, budget: int, strategy: str, db: str, smoke: bool = False) -> dict[str, Any]:
    """One row: tune, then run and time every implementation (errors recorded per implementation)."""
    device = "cpu" if smoke else "cuda"
    family = get_op("attention")
    spec = family.spec(w.shape, "bf16", causal=w.causal, kv_heads=w.kv_heads, kv_len=w.kv_len)
    row: dict[str, Any] = {"workload": w.label, "shape": w.describe(), "dtype": "bf16"}
    result, row["tune"] = tune(spec, budget, db, strategy)
    inputs = family.make_inputs(spec, 1234, "normal", device)
    flops, nbytes = family.flops(spec), family.bytes_moved(spec)
    row["flops"], row["bytes"] = flops, nbytes

    impls: dict[str, Fn] = {"sdpa": sdpa_call(inputs, w.causal, None)}
    if smoke:
        row["skipped"] = sorted(BACKENDS)  # CUDA-only backends
    else:
        for name, backend in BACKENDS.items():
            impls[name] = sdpa_call(inputs, w.causal, backend)
    if result.candidate_variant:  # the tuned kernel, or the best candidate of a "baseline" decision
        name = "kernelsmith" if result.winner == "kernel" else "best candidate"
        try:
            config = Config(result.candidate_config)
            launcher = family.variant(str(result.candidate_variant)).build(spec, config)
            runner = dispatch.KernelRunner.build(family, spec, launcher, str(result.candidate_variant), config)
            impls[name] = lambda: runner(inputs)[0]
        except Exception as exc:  # a variant that no longer builds is reported, not fatal
            row.setdefault("errors", {})[name] = f"{type(exc).__name__}: {exc}"[:500]

    times: dict[str, float] = {}
    reference = None
    for name, call in impls.items():
        try:
            out = call()
            synchronize(device)
            if name == "sdpa":
                reference = out
            elif reference is not None:
                row.setdefault("max_abs_diff_vs_sdpa", {})[name] = max_abs_diff(out, reference)
            times[name] = bench(call, smoke)
        except Exception as exc:  # a backend that cannot run this shape is reported, not fatal
            row.setdefault("errors", {})[name] = f"{type(exc).__name__}: {exc}"[:500]
    row["us"] = times
    row["tflops"] = {k: flops / (v * 1e-6) / 1e12 for k, v in times.items()}
    row["gbps"] = {k: nbytes / (v * 1e-6) / 1e9 for k, v in times.items()}
    if "kernelsmith" in times:
        for peer in ("cudnn", "flash", "sdpa"):
            if peer in times:
                row[f"x_{peer}"] = times[peer] / times["kernelsmith"]
    return row


def print_table(report: dict[str, Any]) -> None:
    print_smoke_banner(report)
    print(f"\n{report['gpu']}  {report['date']}  (TFLOP/s; GB/s for the decode row's bound)")
    header = f"{'workload':12} {'shape':34} " + " ".join(f"{c:>12}" for c in COLUMNS)
    print(header + f" {'x cudnn':>8} {'x flash':>8} {'search s':>8} winner")
    for row in report["rows"]:
        if "us" not in row:
            print(f"{row['workload']:12} {row.get('shape', ''):34} ERROR")
            continue
        cells = []
        for name in COLUMNS:
            tf = row["tflops"].get(name)
            cells.append(f"{tf:12.1f}" if tf is not None else f"{'-':>12}")
        tune_info = row["tune"]
        print(
            f"{row['workload']:12} {row['shape']:34} {' '.join(cells)} {row.get('x_cudnn') or math.nan:8.2f} "
            f"{row.get('x_flash') or math.nan:8.2f} {tune_info['search_wall_s']:8.1f} {tune_info['winner']} "
            f"{tune_info.get('variant') or ''}"
        )
        if row["workload"] == "decode":
            gbps = "  ".join(f"{k} {v:.0f} GB/s" for k, v in row["gbps"].items())
            print(f"{'':12} {'':34} {gbps}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="attention.json")
    add_run_options(parser, "workload", 50)
    parser.add_argument("--only", default="", help=f"these workloads only (comma-separated: "
                                                   f"{', '.join(w.label for w in WORKLOADS)})")
    args = parser.parse_args(argv)
    only = {s for s in args.only.split(",") if s}
    unknown = only - {w.label for w in WORKLOADS}
    if unknown:
        print(f"unknown workloads {sorted(unknown)} (known: {', '.join(w.label for w in WORKLOADS)})",
              file=sys.stderr)
        return 2
    refusal = settle_run_options(args, "benchmarks/attention.py", 50)
    if refusal:
        print(refusal, file=sys.stderr)
        return 2
    report = start_report(args, cudnn=torch.backends.cudnn.version())
    run_rows(report, args.out, [w.tiny() if args.smoke else w for w in WORKLOADS if not only or w.label in only],
             lambda w: run_workload(w, args.budget, args.strategy, args.db, args.smoke),
             lambda w: {"workload": w.label, "shape": w.describe()})  # fmt: skip
    print_table(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())

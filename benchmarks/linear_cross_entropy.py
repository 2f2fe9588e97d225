"""Fused linear + cross-entropy, forward and backward, on the GPU: time and peak memory.

    python benchmarks/linear_cross_entropy.py --out lce.json [--only 2048,4096] [--budget 40]
    TRITON_INTERPRET=1 python benchmarks/linear_cross_entropy.py --smoke --out lce.json

One row per hidden size (16384 tokens, vocabulary 128256, bfloat16, mean loss over targets with
about 10% ignored): the loss of ``h @ W.T`` and its gradients dh and dW, computed by

- ``eager``: ``F.cross_entropy(F.linear(h, W).float(), y)`` and ``backward()`` (the reference);
- ``torch.compile``: the same function, loss and backward, compiled (Inductor);
- ``liger``: ``LigerFusedLinearCrossEntropyLoss`` when Liger-Kernel is importable;
- ``kernelsmith``: the tuned ``linear_cross_entropy_fused`` family (loss, dh and dW in one call,
  the logits never materialized beyond one chunk), as the decorator runs it.

Each implementation is timed (``_common.bench``: CUDA events, L2 flushed, median) and its peak
memory measured over one call (``torch.cuda.max_memory_allocated`` after a reset, minus what was
allocated before: the inputs), with the largest differences of its loss and gradients from
eager's. ``--smoke`` runs the code path on the CPU in the Triton interpreter at a tiny shape
(no torch.compile, no Liger): timings and memory are NOT performance.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (
    Fn,
    add_run_options,
    bench,
    max_abs_diff,
    print_smoke_banner,
    run_rows,
    runner_of,
    settle_run_options,
    start_report,
    synchronize,
    tune,
)

from kernelsmith.ops import get_op

TOKENS = 16384
VOCAB = 128256
HIDDEN = (2048, 4096)
SMOKE_SHAPE = (9, 16, 64)  # tokens, hidden, vocabulary
TARGET = 1.1  # the target: >= 1.1x the best of torch.compile and Liger
COLUMNS = ("eager", "torch.compile", "liger", "kernelsmith")


def _step(h: torch.Tensor, w: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The plain training form: loss, then dh and dW by autograd."""
    h = h.detach().requires_grad_()
    w = w.detach().requires_grad_()
    loss = F.cross_entropy(F.linear(h, w).float(), y)
    loss.backward()
    return loss.detach(), h.grad, w.grad


def _liger() -> Fn | None:
    try:
        from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss
    except ImportError:
        return None
    loss_fn = LigerFusedLinearCrossEntropyLoss()

    def step(h: torch.Tensor, w: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
        h = h.detach().requires_grad_()
        w = w.detach().requires_grad_()
        loss = loss_fn(w, h, y)  # Liger's argument order: (lin_weight, _input, target)
        loss.backward()
        return loss.detach(), h.grad, w.grad

    return step


def _peak_bytes(fn: Fn, args: tuple[torch.Tensor, ...], device: str) -> int | None:
    """Bytes allocated at the peak of one call beyond what was allocated before it."""
    if device != "cuda":
        return None
    synchronize(device)
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    out = fn(*args)
    synchronize(device)
    peak = torch.cuda.max_memory_allocated() - before
    del out
    return peak


def run_row(tokens: int, hidden: int, vocab: int, budget: int, db: str, strategy: str, smoke: bool) -> dict[str, Any]:
    device = "cpu" if smoke else "cuda"
    family = get_op("linear_cross_entropy_fused")
    dtype = "fp16" if smoke else "bf16"  # the interpreter rounds float32 subnormals to bf16 wrongly
    spec = family.spec((tokens, hidden, vocab), dtype, reduction="mean")
    row: dict[str, Any] = {"shape": f"{tokens}x{hidden}x{vocab}", "dtype": dtype}
    h, w, y = family.make_inputs(spec, 1234, "normal", device)

    impls: dict[str, Fn] = {"eager": _step}
    if not smoke:
        torch._dynamo.reset()
        impls["torch.compile"] = torch.compile(_step, dynamic=False)
        liger = _liger()
        if liger is not None:
            impls["liger"] = liger
        else:
            row["skipped"] = ["liger (not importable)"]
    result, row["tune"] = tune(spec, budget, db, strategy)
    if result.candidate_variant:
        name = "kernelsmith" if result.winner == "kernel" else "kernelsmith (best candidate)"
        runner = runner_of(family, spec, result)
        impls[name] = lambda *args: tuple(runner(args))

    times: dict[str, float] = {}
    peaks: dict[str, float] = {}
    reference = None
    for name, fn in impls.items():
        try:
            out = fn(h, w, y)
            synchronize(device)
            if name == "eager":
                reference = out
            elif reference is not None:
                row.setdefault("max_abs_diff_vs_eager", {})[name] = {
                    part: max_abs_diff(got, want)
                    for part, got, want in zip(("loss", "dh", "dW"), out, reference, strict=True)
                }
            del out
            times[name] = bench(lambda fn=fn: fn(h, w, y), smoke)
            peak = _peak_bytes(fn, (h, w, y), device)
            if peak is not None:
                peaks[name] = peak / 2**30
        except Exception as exc:  # a baseline that fails is reported, not fatal
            row.setdefault("errors", {})[name] = f"{type(exc).__name__}: {exc}"[:500]
    row["us"] = times
    row["peak_gib_beyond_inputs"] = peaks
    kernel = next((k for k in times if k.startswith("kernelsmith")), None)
    others = [times[k] for k in ("torch.compile", "liger") if k in times]
    if kernel and others:
        row["speedup_vs_best_other"] = min(others) / times[kernel]
        row["target"] = TARGET
        row["meets_target"] = row["speedup_vs_best_other"] >= TARGET
    return row


def print_table(report: dict[str, Any]) -> None:
    print_smoke_banner(report)
    print(f"\n{report['gpu']}  {report['date']}")
    print("forward + backward, ms (peak GiB beyond the inputs)")
    print(f"{'T x H x V':20} " + " ".join(f"{c:>20}" for c in COLUMNS) + f" {'x best':>7}")
    for row in report["rows"]:
        if "us" not in row:
            print(f"{row.get('shape', '?'):20} ERROR")
            continue
        cells = []
        for name in COLUMNS:
            key = next((k for k in row["us"] if k.startswith(name)), None)
            if key is None:
                cells.append(f"{'-':>20}")
                continue
            peak = row["peak_gib_beyond_inputs"].get(key)
            cells.append(f"{row['us'][key] / 1e3:10.2f} ({'-' if peak is None else f'{peak:.2f}':>6})".rjust(20))
        speedup = row.get("speedup_vs_best_other")
        print(f"{row['shape']:20} {' '.join(cells)} {(f'{speedup:.3f}' if speedup else '-'):>7}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="linear_cross_entropy.json")
    add_run_options(parser, "row", 40)
    parser.add_argument("--only", default="", help="these hidden sizes only (comma-separated: 2048, 4096)")
    args = parser.parse_args(argv)
    only = [int(s) for s in args.only.split(",") if s]
    if set(only) - set(HIDDEN):
        print(f"unknown hidden sizes {only} (known: {HIDDEN})", file=sys.stderr)
        return 2
    refusal = settle_run_options(args, "benchmarks/linear_cross_entropy.py", 40)
    if refusal:
        print(refusal, file=sys.stderr)
        return 2
    report = start_report(args, tokens=TOKENS, vocab=VOCAB)
    shapes = [(TOKENS, hidden, VOCAB) for hidden in HIDDEN if not only or hidden in only]
    if args.smoke:
        shapes = [SMOKE_SHAPE]  # one tiny row proves the path
    run_rows(report, args.out, shapes,
             lambda shape: run_row(*shape, args.budget, args.db, args.strategy, args.smoke),
             lambda shape: {"shape": "x".join(map(str, shape))})  # fmt: skip
    print_table(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())

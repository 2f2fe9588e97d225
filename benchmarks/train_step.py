"""One training step of a Hugging Face Llama with labels: eager, torch.compile, Liger-Kernel and
kernelsmith, time and peak memory per step, loss and gradient agreement with eager.

    python benchmarks/train_step.py --out train_step.json [--only 2x2048] [--budget 60]
    python benchmarks/train_step.py --batch 2 --seq 2048 --no-optimize   # one config, a few minutes
    python benchmarks/train_step.py --smoke --out train_step.json      # a CPU: tiny config, says so

The model is ``LlamaForCausalLM`` built from a config (random weights, no download): hidden
2048, 4 layers, 32 heads over 8 KV heads, vocabulary 128256, bfloat16, called as Hugging Face
models are called, ``model(input_ids=ids, labels=ids)`` (the loss inside the model: labels
shifted by one, ``F.cross_entropy`` of the float32 logits). One row per batch: 2 x 2048 and
4 x 4096 tokens. Per row (:func:`kernelsmith.whole_model.train_step.compare_executions`):

- ``eager``: the model as it is;
- ``torch.compile``: Inductor;
- ``kernelsmith``: ``kernelsmith.optimize_model(model, example_kwargs=..., train=True)``: the
  families tuned within ``--budget`` evaluations, then the whole step timed with and without each
  family's replacements, kept where it is not slower (``--memory-objective`` to trade time for
  memory);
- ``kernelsmith (fused loss, no logits)``: the model patched by ``kernelsmith.hf.fuse_lm_loss``
  (its training loss through the fused linear + cross-entropy, ``logits`` None; the kernel tuned
  within ``--fused-budget`` evaluations on its first call), compiled by Inductor;
- ``liger``: ``apply_liger_kernel_to_llama`` (RMSNorm, SwiGLU, RoPE, fused linear +
  cross-entropy) when Liger-Kernel is importable, eager.

One configuration in a few minutes: ``--batch B --seq S`` (instead of the two rows),
``--no-optimize`` (no ``optimize_model`` column: its tuning and in-context decision are what take
long), a small ``--fused-budget``. Each row's table is printed as soon as the row finishes.

The issue's targets (4 x 4096): peak memory <= Liger's and step time >= 1.15x torch.compile's,
loss within 1e-3 and gradient norms within 1e-2 of eager (relative); at 2 x 2048 never slower
than torch.compile. The table says, per row, whether they are met and by how much they miss.

Without a GPU (or with ``--smoke``) the same code runs a tiny config (hidden 64, 1 layer,
vocabulary 256, 2 x 16 tokens) with the kernels in the Triton interpreter and torch.compile's
column compiled by ``aot_eager``: the timings are NOT performance and peak memory is not
measured (a CPU), which the report and the table say.
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from pathlib import Path
from typing import Any

import torch

if not torch.cuda.is_available():  # before kernelsmith defines a kernel: Triton reads this then
    os.environ.setdefault("TRITON_INTERPRET", "1")
    os.environ.setdefault("KERNELSMITH_INTERPRET", "1")

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import SMOKE_NOTE, environment, write_report

CONFIG = {"hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 4, "num_attention_heads": 32,
          "num_key_value_heads": 8, "vocab_size": 128256, "max_position_embeddings": 8192}  # fmt: skip
SMOKE_CONFIG = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 1, "num_attention_heads": 4,
                "num_key_value_heads": 2, "vocab_size": 256, "max_position_embeddings": 64}  # fmt: skip
BATCHES = ((2, 2048), (4, 4096))
SMOKE_BATCH = (2, 16)
TARGET_SPEEDUP = 1.15  # over torch.compile, at 4 x 4096
DEFAULT_BUDGET = 60
DEFAULT_FUSED_BUDGET = 8  # evaluations for the fused loss's one workload


def _model(config: dict[str, Any], device: str, dtype: torch.dtype) -> torch.nn.Module:
    import transformers

    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**config))
    return model.to(device=device, dtype=dtype).train()


def run_row(batch: int, seq: int, args: argparse.Namespace, smoke: bool) -> dict[str, Any]:
    from kernelsmith.whole_model.keyword_inputs import keyword_inputs
    from kernelsmith.whole_model.optimize import optimize_model
    from kernelsmith.whole_model.train_step import FUSED_LOSS_ROW, compare_executions

    device = "cpu" if smoke else "cuda"
    config = SMOKE_CONFIG if smoke else CONFIG
    model = _model(config, device, torch.float32 if smoke else torch.bfloat16)
    ids = torch.randint(0, config["vocab_size"], (batch, seq), generator=torch.Generator().manual_seed(1)).to(device)
    kwargs = keyword_inputs(ids, ("input_ids", "labels"))
    optimized, report = None, {"sites": []}
    if not args.no_optimize:
        optimized, report = optimize_model(model, example_kwargs=kwargs, train=True, budget=args.budget, db=args.db,
                                           strategy=args.strategy, memory=args.memory, name="llama-train")  # fmt: skip
    fused_loss = {"db": args.db, "tune": args.fused_budget > 0, "budget": args.fused_budget, "strategy": args.strategy}
    executions = compare_executions(
        model, (), kwargs, kernelsmith=optimized, warmup=args.warmup, iterations=args.iterations,
        compile_backend="aot_eager" if smoke else "inductor", fused_loss=fused_loss,
    )  # fmt: skip
    row: dict[str, Any] = {
        "batch": f"{batch}x{seq}",
        "tokens": batch * seq,
        "executions": [e.to_dict() for e in executions],
        "sites": [(s["op"], s["status"]) for s in report["sites"]],
        "train_step": report.get("train_step"),
    }
    row["targets"] = {name: _targets(row, batch * seq, name) for name in ("kernelsmith", FUSED_LOSS_ROW)}
    return row


def _targets(row: dict[str, Any], tokens: int, name: str) -> dict[str, Any]:
    """The issue's targets for execution ``name`` of this row: met or missed, by how much."""
    by = {e["name"]: e for e in row["executions"] if e["measure"] is not None}
    ks, tc, liger = by.get(name), by.get("torch.compile"), by.get("liger")
    out: dict[str, Any] = {}
    if ks is None or tc is None:
        return {"note": f"{name} or torch.compile did not run"}
    speedup = tc["measure"]["median_ms"] / ks["measure"]["median_ms"]
    out["speedup_vs_torch_compile"] = speedup
    wanted = TARGET_SPEEDUP if tokens >= 16384 else 1.0
    out["speed_target"] = wanted
    out["speed_met"] = speedup >= wanted
    if liger is not None and ks["measure"]["peak_bytes"] is not None and liger["measure"]["peak_bytes"]:
        out["memory_vs_liger"] = ks["measure"]["peak_bytes"] / liger["measure"]["peak_bytes"]
        out["memory_met"] = out["memory_vs_liger"] <= 1.0
    if ks["measure"]["peak_bytes"] is not None and tc["measure"]["peak_bytes"]:
        out["memory_vs_torch_compile"] = ks["measure"]["peak_bytes"] / tc["measure"]["peak_bytes"]
    out["agrees_with_eager"] = bool(ks["agrees"])
    return out


def print_table(report: dict[str, Any], rows: list[dict[str, Any]] | None = None) -> None:
    """The table of ``rows`` (default: every row of the report), with each row's targets."""
    from kernelsmith.whole_model.train_step import format_bytes

    if report.get("smoke"):
        print(f"SMOKE TEST: {report['note']}")
    width = 36
    print(f"{'batch':>8} {'execution':>{width}} {'ms/step':>9} {'peak':>10} {'loss rel':>9} {'grad rel':>9}  agrees")
    for row in report["rows"] if rows is None else rows:
        if "error" in row:
            print(f"{row['batch']:>8} error: {row['error'].splitlines()[-1]}")
            continue
        for e in row["executions"]:
            m = e["measure"]
            if m is None:
                print(f"{row['batch']:>8} {e['name']:>{width}} {'-':>9} {'-':>10} {'-':>9} {'-':>9}  ({e['skipped']})")
                continue
            note = f"  ({e['note']})" if e.get("note") else ""
            print(f"{row['batch']:>8} {e['name']:>{width}} {m['median_ms']:>9.2f} {format_bytes(m['peak_bytes']):>10} "
                  f"{e['loss_rel']:>9.1e} {e['grad_rel']:>9.1e}  {'yes' if e['agrees'] else 'NO'}{note}")  # fmt: skip
        for name, t in row["targets"].items():
            if "speedup_vs_torch_compile" not in t:
                continue
            memory = "".join(
                f", memory {t[key]:.2f}x {who}'s" for key, who in (("memory_vs_torch_compile", "torch.compile"),
                                                                   ("memory_vs_liger", "Liger")) if key in t
            )  # fmt: skip
            print(f"{'':>8} {name}: {t['speedup_vs_torch_compile']:.3f}x torch.compile (target "
                  f"{t['speed_target']:.2f}x: {'met' if t['speed_met'] else 'missed'}){memory}")  # fmt: skip
    sys.stdout.flush()


def main(argv: list[str] | None = None) -> int:
    from kernelsmith.cli.model_options import parse_memory_objective

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="train_step.json")
    parser.add_argument("--only", default="", help="these batches only (comma-separated: 2x2048, 4x4096)")
    parser.add_argument("--batch", type=int, default=None, help="one configuration: this batch (with --seq)")
    parser.add_argument("--seq", type=int, default=None, help="one configuration: this sequence length (with --batch)")
    parser.add_argument("--budget", type=int, default=None, help=f"evaluations in all (default {DEFAULT_BUDGET}; "
                        "0 on a CPU)")  # fmt: skip
    parser.add_argument("--fused-budget", type=int, default=None, help="evaluations for the fused loss's kernel "
                        f"(default {DEFAULT_FUSED_BUDGET}; 0 on a CPU; 0: stored winners only)")  # fmt: skip
    parser.add_argument("--no-optimize", action="store_true", help="leave out the optimize_model column (its "
                        "tuning and in-context decision take most of a row's time)")  # fmt: skip
    parser.add_argument("--warmup", type=int, default=None, help="untimed steps per execution (default 3; 1 on a CPU)")
    parser.add_argument("--iterations", type=int, default=None, help="timed steps (default 10; 2 on a CPU)")
    parser.add_argument("--strategy", default="auto")
    parser.add_argument("--db", default=None, help="the decisions database (default /tmp/kernelsmith-bench.db)")
    parser.add_argument("--memory-objective", default=None, help="SAVING:SLOWDOWN in percent, such as 20:5")
    parser.add_argument("--smoke", action="store_true", help="the tiny config on the CPU (the default without a GPU)")
    args = parser.parse_args(argv)
    smoke = args.smoke or not torch.cuda.is_available()
    if smoke and os.environ.get("TRITON_INTERPRET") != "1":
        print("--smoke runs the kernels in the Triton interpreter: set TRITON_INTERPRET=1", file=sys.stderr)
        return 2
    if (args.batch is None) != (args.seq is None):
        print("--batch and --seq go together", file=sys.stderr)
        return 2
    args.memory = parse_memory_objective(args.memory_objective, ValueError)
    args.budget = args.budget if args.budget is not None else (0 if smoke else DEFAULT_BUDGET)
    args.fused_budget = args.fused_budget if args.fused_budget is not None else (0 if smoke else DEFAULT_FUSED_BUDGET)
    args.warmup = args.warmup if args.warmup is not None else (1 if smoke else 3)
    args.iterations = args.iterations if args.iterations is not None else (2 if smoke else 10)
    args.db = args.db or "/tmp/kernelsmith-bench.db"
    only = [s for s in args.only.split(",") if s]
    known = [f"{b}x{s}" for b, s in BATCHES]
    if set(only) - set(known):
        print(f"unknown batches {only} (known: {known})", file=sys.stderr)
        return 2
    batches = [(args.batch, args.seq)] if args.batch is not None else [
        (b, s) for b, s in BATCHES if not only or f"{b}x{s}" in only
    ]  # fmt: skip
    report = environment(budget=args.budget, config=SMOKE_CONFIG if smoke else CONFIG)
    if smoke:
        report.update(smoke=True, note=SMOKE_NOTE + "; a tiny config on the CPU; peak memory is not measured")
    write_report(report, args.out)
    for batch, seq in batches:
        b, s = SMOKE_BATCH if smoke else (batch, seq)
        try:
            row = run_row(b, s, args, smoke)
        except Exception:  # a row that fails is recorded, and the next one runs
            row = {"batch": f"{b}x{s}", "error": traceback.format_exc()[-2000:]}
        report["rows"].append(row)
        write_report(report, args.out)
        print_table(report, [row])  # as soon as the row is done
        if smoke:
            break  # one tiny row proves the path
    if len(report["rows"]) > 1:
        print_table(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())

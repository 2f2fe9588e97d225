"""``kernelsmith profile MODEL``: where a model's forward spends its time, and a ranked Amdahl plan.

A thin command over :func:`kernelsmith.whole_model.profile.profile_model` and
:func:`kernelsmith.models.load_model`; see docs/models.md for the plan format. Heavy imports
(torch, the models) happen inside the command so that ``kernelsmith --help`` stays fast.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from kernelsmith.cli.model_options import ModelChoice, model_command, parse_device, split_inputs

# Sizes when --batch / --seq are not given: the GPU shape of a realistic run; on a CPU, where the
# plan only shows structure, one small enough to finish in seconds.
GPU_DEFAULTS = {"batch": 8, "seq": 1024, "warmup": 3, "iterations": 5}
CPU_DEFAULTS = {"batch": 2, "seq": 128, "warmup": 1, "iterations": 2}


@model_command(cpu_seq=CPU_DEFAULTS["seq"])
def profile(
    choice: ModelChoice,
    warmup: Annotated[int | None, typer.Option("--warmup", min=0, help="Forwards before measuring.")] = None,
    iters: Annotated[int | None, typer.Option("--iters", min=1, help="Forwards measured (and profiled).")] = None,
    compile: Annotated[
        bool, typer.Option("--compile", help="Profile torch.compile(model) (Inductor) instead of eager.")
    ] = False,
    out_file: Annotated[Path, typer.Option("--out", help="Where to write the plan JSON.")] = Path("plan.json"),
    top: Annotated[int, typer.Option("--top", min=1, help="Rows of the printed table.")] = 20,
    as_json: Annotated[bool, typer.Option("--json", help="Print the plan JSON instead of a table.")] = False,
) -> None:
    """Profile a model's forward, attribute its time to op families and shapes, write a ranked plan."""
    from kernelsmith.cli.common import UserError, err, out, run_or_exit

    def run() -> Any:
        import torch

        from kernelsmith.models import example_inputs, parameter_count
        from kernelsmith.whole_model.profile import profile_model

        target = parse_device(choice.device, torch)
        defaults = GPU_DEFAULTS if target.type == "cuda" else CPU_DEFAULTS
        loaded = choice.load(target, defaults, UserError)
        examples = example_inputs(loaded.module, loaded.batch, loaded.seq, target)
        inputs, keywords = split_inputs(examples, choice.keyword_inputs, UserError)
        err.print(
            f"profiling {loaded.name} ({parameter_count(loaded.module) / 1e6:,.1f}M parameters) on {target}: "
            f"batch {loaded.batch}, seq {loaded.seq}, {loaded.dtype}{', torch.compile' if compile else ''}",
            highlight=False,
        )
        warmups = warmup if warmup is not None else defaults["warmup"]
        iterations = iters if iters is not None else defaults["iterations"]
        with err.status(f"profiling: {warmups} warm-up and {iterations} measured forwards..."):
            plan = profile_model(
                loaded.module, inputs, name=loaded.name, warmup=warmups, iterations=iterations, compile=compile,
                kwargs=keywords, batch=loaded.batch, seq=loaded.seq, dtype=loaded.dtype, source=loaded.source,
            )  # fmt: skip
        plan.write(out_file)
        return plan

    plan = run_or_exit(run)
    if as_json:
        print(json.dumps(plan.to_dict()))
    else:
        _print_plan(plan, top, out)
    if plan.note:
        err.print(f"[yellow]{plan.note}[/yellow]", highlight=False)
    err.print(f"plan written to {out_file}", highlight=False)


def _print_plan(plan: Any, top: int, console: Any) -> None:
    from rich.table import Table

    from kernelsmith.cli.common import add_column

    unit = "kernel" if plan.mode == "gpu" else "CPU op"
    table = Table(title=f"{plan.model}: {unit} time by op family and shape ({plan.mode}, {plan.dtype})")
    for column in ("#", "family", "shapes", "us/iter", "share", "gain at 1.5x 2x 3x", "tunable", "via"):
        kind = {"family": "id", "shapes": "key", "via": "text"}.get(column, "number")
        add_column(table, column, kind)
    for row in plan.rows[:top]:
        table.add_row(
            str(row.rank),
            row.family,
            row.shape,
            f"{row.time_us:,.1f}",
            f"{100 * row.share:.1f}%",
            " ".join(f"{row.gain[k]:.3f}" for k in ("1.5x", "2x", "3x")),
            "yes" if row.tunable else "",
            row.ops[0] if row.ops else (row.kernels[0][:40] if row.kernels else ""),
        )
    console.print(table)
    families = ", ".join(f"{f['family']} {100 * f['share']:.0f}%" for f in plan.families[:8])
    console.print(f"by family: {families}", highlight=False)
    summary = f"measured {plan.total_us / 1000:,.2f} ms per forward"
    if plan.wall_ms is not None:
        summary += f", wall {plan.wall_ms:,.2f} ms unprofiled"
    if plan.busy is not None:
        summary += f" (GPU busy {100 * plan.busy:.0f}% of it)"
    console.print(summary + f"; {len(plan.rows)} rows, {plan.iterations} iterations", highlight=False)

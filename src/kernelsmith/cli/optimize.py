"""``kernelsmith optimize MODEL``: profile a model, tune its top ops within a budget, report.

A thin command over :func:`kernelsmith.optimize_model` (see :mod:`kernelsmith.whole_model.optimize`
for the steps and how the budget is shared) and :func:`kernelsmith.models.load_model` (what
``MODEL`` may be). Progress bars on standard error: the whole budget, and the search under way.
Writes the report (JSON) to ``--out``; ``kernelsmith verify`` then measures the result end to end.

Without a GPU (``--device cpu`` or no CUDA) the kernels run in the Triton interpreter on the CPU:
the command says so, uses small inputs by default, and its timings are not performance.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated, Any

import typer

from kernelsmith.cli.executor_options import DevicesOption, ExecutorOption, RayAddressOption, check_where
from kernelsmith.cli.model_options import ModelChoice, model_command, parse_device, parse_memory_objective, split_inputs

GPU_DEFAULTS = {"batch": 8, "seq": 1024}
CPU_DEFAULTS = {"batch": 2, "seq": 32}  # the interpreter is thousands of times slower than a GPU


@model_command(cpu_seq=CPU_DEFAULTS["seq"])
def optimize(
    choice: ModelChoice,
    budget: Annotated[int, typer.Option("--budget", min=0, help="Evaluations in all, over every op tuned.")] = 100,
    seconds: Annotated[
        float | None, typer.Option("--seconds", min=0, help="Wall-time limit in seconds (default: none).")
    ] = None,
    strategy: Annotated[str, typer.Option("--strategy", help="auto, grid, random, tpe, coordinate or llm.")] = "auto",
    patience: Annotated[
        int, typer.Option("--patience", min=1, help="Move on after this many evaluations without a 1% better time.")
    ] = 12,
    plan_file: Annotated[
        Path | None, typer.Option("--plan", help="A plan JSON from `kernelsmith profile` to use instead of profiling.")
    ] = None,
    train: Annotated[bool, typer.Option("--train", help="Also tune the backward ops (training).")] = False,
    memory: Annotated[
        str | None,
        typer.Option("--memory-objective", help="With --train: SAVING:SLOWDOWN in percent (20:5 keeps a replacement "
                     "that cuts the step's peak memory by >= 20% for <= 5% more time; default: never slower)."),
    ] = None,
    compare: Annotated[
        bool | None,
        typer.Option("--compare/--no-compare", help="Keep kernels only where the compiled model times faster in "
                     "context than with Inductor alone (default: on a GPU)."),
    ] = None,
    db: Annotated[
        str | None,
        typer.Option("--db", help="Database path or sqlite:/// URL (default: $KERNELSMITH_DB or the per-user cache)."),
    ] = None,
    out_file: Annotated[Path, typer.Option("--out", help="Where to write the report JSON.")] = Path("optimize.json"),
    as_json: Annotated[bool, typer.Option("--json", help="Print the report JSON instead of tables.")] = False,
    devices: DevicesOption = None,
    executor: ExecutorOption = "local",
    ray_address: RayAddressOption = None,
) -> None:
    """Profile a model, tune its top ops (highest expected gain first) within the budget, report."""
    from kernelsmith.cli.common import UserError, err, out, run_or_exit

    def prepare() -> tuple[Any, tuple[Any, ...], dict[str, Any], Any, str, Any]:
        import torch

        target = parse_device(choice.device, torch)
        on_gpu = target.type == "cuda"
        if not on_gpu:  # before any kernel is defined: Triton reads this when it compiles one
            os.environ.setdefault("KERNELSMITH_INTERPRET", "1")
            os.environ.setdefault("TRITON_INTERPRET", "1")
        from kernelsmith.models import example_inputs
        from kernelsmith.whole_model.profile import Plan

        loaded = choice.load(target, GPU_DEFAULTS if on_gpu else CPU_DEFAULTS, UserError)
        examples = example_inputs(loaded.module, loaded.batch, loaded.seq, target)
        inputs, keywords = split_inputs(examples, choice.keyword_inputs, UserError)
        objective = parse_memory_objective(memory, UserError)
        plan = Plan.read(plan_file) if plan_file is not None else None
        check_where(devices, executor, ray_address)  # an unreachable Ray cluster, say: before profiling
        return loaded.module, inputs, keywords, plan, loaded.name, objective

    module, inputs, keywords, plan, name, objective = run_or_exit(prepare)
    from kernelsmith.whole_model.optimize import optimize_model

    with _Bars(err, disabled=as_json) as bars:
        _, report = run_or_exit(
            lambda: optimize_model(
                module, inputs, example_kwargs=keywords, budget=budget, seconds=seconds, db=db, strategy=strategy,
                plan=plan, train=train, patience=patience, compare=compare, memory=objective, name=name,
                progress=bars.update,
                devices=devices, executor=executor, ray_address=ray_address,
            )
        )
    out_file.parent.mkdir(parents=True, exist_ok=True)
    out_file.write_text(json.dumps(report, indent=2, default=str) + "\n")
    if as_json:
        print(json.dumps(report, default=str))
    else:
        _print_report(report, out)
        _print_train_step(report, out)
    if report["note"]:
        err.print(f"[yellow]{report['note']}[/yellow]", highlight=False)
    err.print(f"report written to {out_file}; measure the result with `kernelsmith verify`", highlight=False)


def _print_train_step(report: dict[str, Any], console: Any) -> None:
    """The training step's verdict per family (``optimize --train`` on a GPU), and the peak memory."""
    from kernelsmith.whole_model.train_step import format_bytes

    step = report.get("train_step")
    if step is None:
        if report.get("peak_memory_bytes") is not None:
            console.print(f"peak memory of a forward: {format_bytes(report['peak_memory_bytes'])}", highlight=False)
        return
    base = step["baseline"]
    console.print(f"training step without replacements: {base['median_ms']:.2f} ms, peak "
                  f"{format_bytes(base['peak_bytes'])}", highlight=False)  # fmt: skip
    for d in step["families"]:
        saved = "-" if d["memory_saving"] is None else f"{100 * d['memory_saving']:.1f}%"
        console.print(f"  {d['family']}: {'kept' if d['keep'] else 'dropped'}, {d['time_ratio']:.3f}x the time, "
                      f"peak memory saved {saved}: {d['reason']}", highlight=False)  # fmt: skip
    console.print(f"kept: {', '.join(step['kept']) or 'none'} ({step['final_reason']})", highlight=False)
    if step["memory_note"]:
        console.print(step["memory_note"], highlight=False)


class _Bars:
    """Two rich progress bars: evaluations of the whole budget, and of the search under way."""

    def __init__(self, console: Any, disabled: bool) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.console, self.disabled = console, disabled
        self.progress = Progress(
            TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
            console=console, disable=disabled,
        )
        self.total: Any = None
        self.search: Any = None
        self.started = 0

    def __enter__(self) -> _Bars:
        self.progress.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.progress.__exit__(*exc)

    def update(self, event: Any) -> None:
        if self.disabled:
            return
        if self.total is None:
            self.total = self.progress.add_task("budget", total=max(event.total_budget, 1))
        if event.stage in ("profile", "discover", "compile"):
            self.console.print(f"{event.message}...", highlight=False)
        elif event.stage == "tune":
            if self.search is not None:
                self.progress.remove_task(self.search)
            self.started = event.total_done
            label = f"[{event.workload}/{event.workloads}] {event.message.split(':')[0]}"
            self.search = self.progress.add_task(label, total=max(event.budget, 1))
        elif event.stage == "evaluation" and self.search is not None:
            best = f" best {event.best_us:.1f} us" if event.best_us is not None else ""
            self.progress.update(self.search, completed=event.done)
            self.progress.update(self.total, completed=self.started + event.done, description=f"budget{best}")
        elif event.stage == "tuned":
            self.console.print(f"  {event.message}", highlight=False)
            self.progress.update(self.total, completed=event.total_done)


def _print_report(report: dict[str, Any], console: Any) -> None:
    from rich.table import Table

    from kernelsmith.cli.common import add_column
    from kernelsmith.versus import COMPILE_NOT_MEASURED

    table = Table(title=f"{report['model']}: workloads by share of the profiled time ({report['mode']})")
    kinds = {"#": "number", "workload": "key", "share": "number", "gain at 2x": "number", "status": "text",
             "evals": "number", "winner": "key", "speedup": "text"}  # fmt: skip
    for column, kind in kinds.items():
        add_column(table, column, kind)
    for i, w in enumerate(report["workloads"], 1):
        versus = w.get("versus") or "-"
        table.add_row(
            str(i), w["spec"], f"{100 * w['share']:.1f}%", f"{w['gain_2x']:.3f}", w["status"], str(w["evaluations"]),
            w["winner"] or "-", versus,
        )
    console.print(table)
    counts: dict[str, int] = {}
    for site in report["sites"]:
        counts[site["status"]] = counts.get(site["status"], 0) + 1
    summary = ", ".join(f"{n} {status}" for status, n in sorted(counts.items()))
    console.print(f"sites in the compiled model: {summary or 'none found'}", highlight=False)
    spent = f"{report['evaluations']} evaluations in {report['wall_s']:.1f} s" + (
        f"; stopped: {report['stopped']}" if report["stopped"] else ""
    )
    if not report["replaced"]:  # nothing of kernelsmith's runs: there is no speedup to show
        console.print(
            f"{spent}; nothing replaced: the compiled model is torch.compile (Inductor) alone", highlight=False
        )
        return
    console.print(
        f"{spent}; expected forward speedup {report['expected_gain']:.3f}x vs eager PyTorch (the stored per-op "
        f"speedups and the profiled shares; {COMPILE_NOT_MEASURED} per op: `kernelsmith verify` measures the "
        "model against torch.compile)",
        highlight=False,
    )

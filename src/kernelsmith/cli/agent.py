"""``kernelsmith agent``: the coding-agent workspace (thin commands over :mod:`kernelsmith.agent`).

``agent init OP --shape ... --dtype ... [--dir PATH]`` creates the folder; ``agent bench [--dir
PATH]`` evaluates its ``kernel.py`` and prints a grep-friendly verdict block on standard output
(``correct: yes``, ``time_us: ...``, ``verdict: KEEP``, ...). Both exit 0 whatever the verdict;
errors a user can cause (no workspace, unknown op, bad shape) print one line on standard error
and exit with status 2.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from kernelsmith.cli.common import err, run_or_exit

agent_app = typer.Typer(
    no_args_is_help=True,
    help="A workspace where a coding agent edits one kernel file against a fixed harness (keep or revert).",
)

DirOption = Annotated[Path, typer.Option("--dir", help="The workspace folder.")]
DbOption = Annotated[
    str | None,
    typer.Option("--db", help="Database path or sqlite:/// URL (default: init's, else $KERNELSMITH_DB or the cache)."),
]




def _constants(items: list[str]) -> dict[str, Any]:
    constants: dict[str, Any] = {}
    for item in items:
        name, sep, text = item.partition("=")
        if not sep:
            raise ValueError(f"bad --const {item!r}: expected NAME=VALUE, such as eps=1e-5")
        try:
            constants[name] = json.loads(text)
        except json.JSONDecodeError:
            constants[name] = text
    return constants


@agent_app.command("init")
def init(
    op: Annotated[str, typer.Argument(help="Op family name (see `kernelsmith ops`).")],
    shape: Annotated[str, typer.Option("--shape", help="Activation shape, such as 8192x4096.")] = "8192x4096",
    dtype: Annotated[str, typer.Option("--dtype", help="bf16, fp16 or fp32.")] = "bf16",
    directory: DirOption = Path("kernelsmith-workspace"),
    const: Annotated[list[str] | None, typer.Option("--const", help="Op constant NAME=VALUE (repeatable).")] = None,
    full_size: Annotated[
        bool, typer.Option("--full-size", help="In the interpreter, keep the shape as given.")
    ] = False,
    force: Annotated[bool, typer.Option("--force", help="Replace an existing workspace in the folder.")] = False,
    db: DbOption = None,
) -> None:
    """Create a workspace: kernel.py (the current best variant), AGENTS.md, workspace.json, results.tsv."""
    from kernelsmith.agent import init_workspace

    def create() -> Any:
        return init_workspace(
            op, shape, dtype, directory=directory, db=db, constants=_constants(const or []),
            full_size=full_size, force=force,
        )  # fmt: skip

    result = run_or_exit(create)
    for note in result.notes:
        typer.echo(f"note: {note}", err=True)
    typer.echo(f"workspace: {result.path}")
    typer.echo(f"workload: {result.spec.describe()} ({result.spec.workload_hash})")
    typer.echo(f"mode: {result.mode}")
    typer.echo(f"kernel.py: {result.start.describe()}")
    incumbent = result.incumbent
    described = "baseline (eager PyTorch)" if incumbent["kind"] == "baseline" else f"kernel {incumbent['variant']}"
    typer.echo(f"incumbent: {described}")
    typer.echo(f"next: read {result.path / 'AGENTS.md'}, edit kernel.py, "
               f"run `kernelsmith agent bench --dir {result.path}`")


@agent_app.command("bench")
def bench(
    directory: DirOption = Path("."),
    db: DbOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON document instead of the block.")] = False,
) -> None:
    """Evaluate kernel.py with the fixed harness; print the verdict; append results.tsv; store on KEEP."""
    from kernelsmith.agent import bench_workspace

    typer.echo(f"evaluating {directory / 'kernel.py'} (the harness runs it in a worker process)...", err=True)
    with err.status("validating and timing kernel.py beside the baseline and the incumbent..."):
        report = run_or_exit(lambda: bench_workspace(directory, db=db))
    if as_json:
        print(json.dumps(report.to_dict(), default=str))
        return
    sys.stdout.write("\n".join(report.lines()) + "\n")

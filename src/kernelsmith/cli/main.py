"""The ``kernelsmith`` command: thin typer commands over the library API.

Errors a user can cause (unknown op, bad shape or dtype, unwritable database) print one line to
standard error and exit with status 2; no traceback. ``--version`` prints the version; ``-v``
shows the package's info logs (``-vv`` debug), ``-q`` only errors (no progress bars or notes);
without either, ``KERNELSMITH_LOG`` sets the level (default: warnings).
"""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer
from rich.table import Table

from kernelsmith.cli.agent import agent_app
from kernelsmith.cli.common import add_column, err, out
from kernelsmith.cli.db import JsonOption, db_app
from kernelsmith.cli.env import env as env_command
from kernelsmith.cli.optimize import optimize as optimize_command
from kernelsmith.cli.profile import profile as profile_command
from kernelsmith.cli.report import report as report_command
from kernelsmith.cli.tune import tune as tune_command
from kernelsmith.cli.verify import verify as verify_command

app = typer.Typer(
    add_completion=False, no_args_is_help=True, help="Search, verify and serve faster Triton kernels for PyTorch ops."
)


def _version(value: bool) -> None:
    if value:
        from kernelsmith import __version__

        out.print(f"kernelsmith {__version__}", highlight=False)
        raise typer.Exit()


@app.callback()
def _options(
    context: typer.Context,
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit.")
    ] = False,
    verbose: Annotated[
        int, typer.Option("--verbose", "-v", count=True, help="Show the package's info logs (-vv: debug).")
    ] = 0,
    quiet: Annotated[
        bool, typer.Option("--quiet", "-q", help="Only errors: no logs below error, no progress bars or notes.")
    ] = False,
) -> None:
    """Search, verify and serve faster Triton kernels for PyTorch ops."""
    from kernelsmith import logs, settings

    if verbose and quiet:
        raise typer.BadParameter("-v and -q ask for opposite things: give one")
    context.call_on_close(logs.saved_state())  # a command run inside Python leaves its logging as it was
    quiet_before = err.quiet
    context.call_on_close(lambda: setattr(err, "quiet", quiet_before))
    err.quiet = quiet  # the notes and progress bars; errors go through their own console
    if quiet:
        logs.configure("error")
    elif verbose:
        logs.configure("debug" if verbose > 1 else "info")
    else:
        try:
            logs.configure(settings.get("KERNELSMITH_LOG"))
        except settings.SettingError as exc:
            logs.configure("warning")
            err.print(f"[yellow]{exc}; showing warnings[/yellow]", highlight=False)


app.add_typer(db_app, name="db")
app.add_typer(agent_app, name="agent")
app.command("profile")(profile_command)
app.command("optimize")(optimize_command)
app.command("verify")(verify_command)
app.command("report")(report_command)
app.command("tune")(tune_command)
app.command("env")(env_command)


@app.command()
def ops(as_json: JsonOption = False) -> None:
    """List the op families and how --shape maps to their inputs."""
    from kernelsmith.ops import get_op, op_names

    rows: list[dict[str, Any]] = []
    for name in op_names():
        family = get_op(name)
        rows.append(
            {
                "name": name,
                "summary": family.summary,
                "shape": family.shape_help,
                "dtypes": list(family.dtypes),
                "variants": [v.name for v in family.variants],
            }
        )
    if as_json:
        print(json.dumps(rows))
        return
    table = Table(title="op families")
    for column, kind in {"name": "id", "summary": "text", "--shape": "text", "variants": "key"}.items():
        add_column(table, column, kind)
    for row in rows:
        table.add_row(row["name"], row["summary"], row["shape"], ", ".join(row["variants"]))
    out.print(table)


def main() -> None:
    app()


if __name__ == "__main__":
    main()

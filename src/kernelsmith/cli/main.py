"""The ``kernelsmith`` command: thin typer commands over the library API.

Errors a user can cause (unknown op, bad shape or dtype, unwritable database) print one line to
standard error and exit with status 2; no traceback.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any

import typer
from rich.table import Table

from kernelsmith.cli.agent import agent_app
from kernelsmith.cli.common import out
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
    for column in ("name", "summary", "--shape", "variants"):
        table.add_column(column)
    for row in rows:
        table.add_row(row["name"], row["summary"], row["shape"], ", ".join(row["variants"]))
    out.print(table)


def main() -> None:
    # KERNELSMITH_LOG=info shows what the package logs (sites replaced or not and why, in-context
    # timings, fallbacks); the default shows warnings only.
    level = os.environ.get("KERNELSMITH_LOG", "warning").upper()
    logging.basicConfig(level=getattr(logging, level, logging.WARNING), format="%(levelname)s %(name)s: %(message)s")
    app()


if __name__ == "__main__":
    main()

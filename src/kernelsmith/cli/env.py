"""``kernelsmith env``: every setting (:mod:`kernelsmith.settings`), its value, and where it came from.

A value that does not parse (``KERNELSMITH_CHECK=flase``) is shown with its error, and the
command exits with status 2 after printing the whole table, so every bad variable is seen at
once; ``KERNELSMITH_*`` variables that no setting reads (typos) are listed too. ``--markdown``
prints the README's table of environment variables instead (paste it between the README's
markers after adding a setting; tests/test_settings.py checks the two agree).
"""

from __future__ import annotations

import json
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from kernelsmith import settings
from kernelsmith.cli.common import err, out
from kernelsmith.cli.db import JsonOption


def _text(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value) if value != "" else "(unset)"


def env(
    as_json: JsonOption = False,
    markdown: Annotated[
        bool, typer.Option("--markdown", help="Print the README's table of the variables (their defaults).")
    ] = False,
) -> None:
    """Show every KERNELSMITH_* setting: its value, whether it came from the environment or the default."""
    if markdown:
        print(settings.markdown_table())
        return
    rows = settings.show()
    unknown = settings.unknown()
    if as_json:
        print(json.dumps({"settings": [r.to_dict() for r in rows], "unknown": unknown}))
    else:
        table = Table(title="kernelsmith settings")
        table.add_column("variable", no_wrap=True)
        table.add_column("value", overflow="fold")
        table.add_column("from", no_wrap=True)
        table.add_column("what it does")
        for row in rows:
            value = f"[red]{escape(row.error)}[/red]" if row.error else escape(_text(row.value))
            table.add_row(row.name, value, row.source, escape(row.doc))
        out.print(table)
        for name in unknown:
            err.print(f"[yellow]warning:[/yellow] {name} is set but no kernelsmith setting reads it", highlight=False)
    if any(r.error for r in rows):
        raise typer.Exit(2)

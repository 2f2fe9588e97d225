"""What every ``kernelsmith`` command shares: the consoles, the one-line user error, number format.

The commands (``cli/tune.py``, ``cli/optimize.py``, ...) import this module; the dispatcher
(``cli/main.py``) imports the commands. Nothing here imports a command.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

import typer
from rich.console import Console, JustifyMethod
from rich.markup import escape
from rich.table import Table

out = Console()
err = Console(stderr=True)  # notes and progress; `kernelsmith -q` silences it
errors = Console(stderr=True)  # the one-line user errors, which -q never silences
T = TypeVar("T")

# Without a GPU the demo runs in the Triton interpreter, which is thousands of times slower:
# shapes shrink to each op family's small_shape, and the budget is capped.
INTERPRETER_MAX_BUDGET = 6


class UserError(Exception):
    """A problem with what the user asked for: one line, no traceback."""


@contextmanager
def user_errors() -> Iterator[None]:
    from kernelsmith.agent import WorkspaceError
    from kernelsmith.db import BrokenDatabaseError, DatabaseError, repair_hint
    from kernelsmith.ops import UnsupportedWorkload

    user_caused = (UserError, WorkspaceError, ValueError, ImportError, DatabaseError, UnsupportedWorkload, OSError)
    try:
        yield
    except user_caused as exc:
        message = str(exc)
        if isinstance(exc, BrokenDatabaseError):  # say how to get out of it, on the same line
            message += f"; {repair_hint(exc.path)}"
        # escape: a message such as "pip install -e '.[search]'" is text, not rich markup
        errors.print(f"[red]error:[/red] {escape(message)}", highlight=False, soft_wrap=True)
        raise typer.Exit(2) from None


def run_or_exit(fn: Callable[[], T]) -> T:
    """Call ``fn``; a problem the user caused becomes one red line on stderr and exit status 2."""
    with user_errors():
        return fn()


def check_op_filter(op: str | None) -> None:
    """An ``--op`` filter must name an op family: a typo would otherwise filter everything out and
    look like an empty database. A UserError (one line, status 2) lists the families."""
    if op is None:
        return
    from kernelsmith.ops import op_names

    if op not in op_names():
        raise UserError(f"--op {op}: no such op family (known: {', '.join(op_names())})")


def add_column(table: Table, name: str, kind: str = "text", justify: JustifyMethod | None = None) -> None:
    """A column of a rich table that never cuts what tells its rows apart. ``kind``: ``"id"`` (a
    short identifier such as a workload hash or an op name: kept on one line while the other
    columns give way), ``"key"`` (an identifier that may be long: a variant, input shapes, a
    config; folded onto the next lines where the terminal is too narrow), ``"number"``
    (right-aligned) or ``"text"`` (wraps; a word too long for it may be cut). Neither ``"id"`` nor
    ``"key"`` is ever cut with an ellipsis."""
    if kind not in ("id", "key", "number", "text"):
        raise ValueError(f"unknown column kind {kind!r}")
    table.add_column(
        name,
        justify=justify or ("right" if kind == "number" else "left"),
        no_wrap=kind == "id",
        overflow="fold" if kind in ("id", "key") else "ellipsis",
    )


def fmt(value: float | None, digits: int = 1, suffix: str = "") -> str:
    return "-" if value is None else f"{value:,.{digits}f}{suffix}"

"""What every ``kernelsmith`` command shares: the consoles, the one-line user error, number format.

The commands (``cli/tune.py``, ``cli/optimize.py``, ...) import this module; the dispatcher
(``cli/main.py``) imports the commands. Nothing here imports a command.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

import typer
from rich.console import Console
from rich.markup import escape

out = Console()
err = Console(stderr=True)
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
        # escape: a message such as "pip install 'kernelsmith[search]'" is text, not rich markup
        err.print(f"[red]error:[/red] {escape(message)}", highlight=False, soft_wrap=True)
        raise typer.Exit(2) from None


def run_or_exit(fn: Callable[[], T]) -> T:
    """Call ``fn``; a problem the user caused becomes one red line on stderr and exit status 2."""
    with user_errors():
        return fn()


def fmt(value: float | None, digits: int = 1, suffix: str = "") -> str:
    return "-" if value is None else f"{value:,.{digits}f}{suffix}"

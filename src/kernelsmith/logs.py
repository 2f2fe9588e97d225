"""The package's logger, ``kernelsmith``, on standard error when ``KERNELSMITH_LOG`` asks for it.

Every module logs to its own logger under ``kernelsmith`` (``kernelsmith.frontends.backend``...)
and prints nothing. Without ``KERNELSMITH_LOG`` the package installs no handler: Python shows
warnings on standard error as it does for any library (its last-resort handler), and an
application's own logging configuration sees everything. With ``KERNELSMITH_LOG=info`` (or
``debug``, ``warning``, ``error``), ``import kernelsmith`` installs one handler on the
``kernelsmith`` logger, at that level: what the backend replaced or not and why, in-context
timings, fallbacks, tuning. The root logger is never touched, and records that this handler prints
do not also travel to the root's handlers (they would print twice). The command line uses the same
handler, at the level of ``-v``/``-q`` or ``KERNELSMITH_LOG`` (default: warnings).

>>> import logging
>>> handler = configure("info")
>>> logging.getLogger("kernelsmith").level == logging.INFO and handler.name == HANDLER_NAME
True
>>> configure(None) is None and logging.getLogger("kernelsmith").handlers == []
True
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable

LOGGER_NAME = "kernelsmith"
HANDLER_NAME = "kernelsmith-stderr"  # the handler this module installs (found again by this name)
FORMAT = "%(levelname)s %(name)s: %(message)s"
LEVELS = ("debug", "info", "warning", "error", "critical")

logger = logging.getLogger(__name__)


class _StderrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """A stream handler on whatever ``sys.stderr`` is at the time of each record (a test runner
    or a notebook replaces it after ``import kernelsmith``)."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    def emit(self, record: logging.LogRecord) -> None:
        self.stream = sys.stderr
        super().emit(record)


def configure(level: str | int | None) -> logging.Handler | None:
    """Show the ``kernelsmith`` logger's records at ``level`` and above on standard error; None
    removes the handler this function installed and gives the logger back its default state.

    Calling it again replaces the level (there is only ever one such handler); handlers that
    someone else added to the logger are left alone.
    """
    package = logging.getLogger(LOGGER_NAME)
    for handler in [h for h in package.handlers if h.name == HANDLER_NAME]:
        package.removeHandler(handler)
    if level is None:
        package.setLevel(logging.NOTSET)
        package.propagate = True
        return None
    number = level if isinstance(level, int) else logging.getLevelName(level.upper())
    if not isinstance(number, int):
        raise ValueError(f"unknown log level {level!r}: use one of {', '.join(LEVELS)}")
    handler = _StderrHandler()
    handler.name = HANDLER_NAME
    handler.setFormatter(logging.Formatter(FORMAT))
    package.addHandler(handler)
    package.setLevel(number)
    package.propagate = False  # printed here; the root's handlers would print it again
    return handler


def saved_state() -> Callable[[], None]:
    """A function that puts the ``kernelsmith`` logger back as it is now (handlers, level,
    propagation): the command line restores it when a command ends, so a command run inside a
    Python process (a test, a notebook) leaves that process's logging as it found it."""
    package = logging.getLogger(LOGGER_NAME)
    handlers, level, propagate = list(package.handlers), package.level, package.propagate

    def restore() -> None:
        package.handlers[:] = handlers
        package.setLevel(level)
        package.propagate = propagate

    return restore


def configure_from_environment() -> logging.Handler | None:
    """:func:`configure` at ``KERNELSMITH_LOG``'s level when it is set; nothing otherwise. A
    value that is not a level is reported (as a warning, at the default level) rather than
    breaking ``import kernelsmith``."""
    from kernelsmith.settings import SettingError, get, source

    if source("KERNELSMITH_LOG") != "environment":
        return None
    try:
        level = get("KERNELSMITH_LOG")
    except SettingError as exc:
        handler = configure("warning")
        logger.warning("%s; showing warnings", exc)
        return handler
    return configure(level)


__all__ = ["HANDLER_NAME", "LOGGER_NAME", "configure", "configure_from_environment", "saved_state"]

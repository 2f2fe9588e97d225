"""A stand-in compile process: the tests of compile-ahead's process boundary.

The real compile process (:mod:`kernelsmith.evaluate.compile_ahead`) needs a GPU to compile
anything. This one serves the same requests through the real process's loop
(:func:`~kernelsmith.evaluate.compile_ahead.serve`), with a compile function that does what a
script says instead of compiling:

    python -m kernelsmith.testing.compile_stand_in FD SCRIPT

(started through ``CompilePool(command=("kernelsmith.testing.compile_stand_in", SCRIPT))``).
SCRIPT is a JSON file, read again for every request so that one process serves many tests::

    {"log": PATH, "seconds": 0.06,
     "fail": {KEY: MESSAGE}, "odd": {KEY: MESSAGE}, "exit": [KEY], "segv": [KEY], "hang": [KEY]}

For each candidate (by ``Candidate.key``) it appends ``{"key", "at", "pid"}`` to the log (``at``:
``time.monotonic()`` once the compile is done, which every process of the host reads alike),
after sleeping ``seconds``; then a key in ``fail`` raises a :class:`CompilationError` (named as
Triton's) with its message, one in ``odd`` a RuntimeError (not a compile error), one in ``exit``
ends the process with ``os._exit(3)``, one in ``segv`` kills it with SIGSEGV (a compiler
crash) and one in ``hang`` never answers.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from multiprocessing.connection import Connection
from typing import Any

from kernelsmith.evaluate import compile_ahead, sandbox
from kernelsmith.evaluate.protocol import Candidate


class CompilationError(Exception):
    """Named as Triton's: what compile-ahead takes for the candidate's own build failure."""


class Scripted:
    """The compile function of the stand-in (module docstring)."""

    def __init__(self, script_path: str) -> None:
        self.script_path = script_path

    def __call__(self, family: Any, spec: Any, candidate: Candidate) -> None:
        with open(self.script_path) as f:
            script = json.load(f)
        key = candidate.key
        time.sleep(float(script.get("seconds", 0.0)))
        with open(script["log"], "a") as log:
            log.write(json.dumps({"key": key, "at": time.monotonic(), "pid": os.getpid()}) + "\n")
        if key in script.get("exit", ()):
            os._exit(3)
        if key in script.get("segv", ()):
            os.kill(os.getpid(), signal.SIGSEGV)
        if key in script.get("hang", ()):
            while True:
                time.sleep(60)
        if key in script.get("fail", {}):
            raise CompilationError(script["fail"][key])
        if key in script.get("odd", {}):
            raise RuntimeError(script["odd"][key])


def main() -> int:
    fd, script_path = int(sys.argv[1]), sys.argv[2]
    sandbox.harden(None)  # as the real one: no core dump from the SIGSEGV
    return compile_ahead.serve(Connection(fd), Scripted(script_path))


if __name__ == "__main__":
    sys.exit(main())

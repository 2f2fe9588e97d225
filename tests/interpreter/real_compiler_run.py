"""Run real_compiler.py from a test: the kernels of a test module's cases lowered by Triton's real
front end, in a child process without the interpreter (see real_compiler.py's docstring for why
that is not done in the test's own process).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def assert_every_kernel_lowers(target: str, timeout: float = 240) -> None:
    """``target`` is real_compiler.py's ``MODULE:FUNCTION`` (a module next to this file, a function
    returning its (op, variant name, spec, config) cases); every kernel they launch must lower."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    helper = Path(__file__).with_name("real_compiler.py")
    done = subprocess.run([sys.executable, str(helper), target], env=env, capture_output=True, text=True,
                          timeout=timeout, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr[-6000:]
    assert "lowered" in done.stdout and ", 0 failed" in done.stdout, done.stdout

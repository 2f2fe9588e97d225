"""Run real_compiler.py from a test: the kernels of a test module's cases lowered by Triton's real
front end, in a child process without the interpreter (see real_compiler.py's docstring for why
that is not done in the test's own process).

Two kinds of cases, named as ``MODULE:FUNCTION`` (a module next to this file):

- (op, variant name, spec, config) tuples, for :func:`assert_every_kernel_lowers`: every kernel
  the variant's launcher launches must lower; a kernel computing in float64 is only listed;
- :class:`LaunchCase`, for :func:`lowered_kernels`: a launcher the case builds itself (a
  family's own entry point, such as LayerNorm's ``build_with_stats``), which must launch the
  case's number of kernels, each lowering and computing no float64 math.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import torch

_HELPER = Path(__file__).with_name("real_compiler.py")


class LaunchCase(NamedTuple):
    """One launcher to lower, as real_compiler.py's ``--launches`` reads it."""

    what: str  # said in a failure: the family, spec and config
    module: Any  # the module whose module-level kernels are recorded (``kernel[grid](...)`` calls)
    build: Callable[[], Callable[[Sequence[torch.Tensor], Sequence[torch.Tensor]], None]]  # called while recording
    inputs: Sequence[torch.Tensor]  # CPU tensors: nothing runs, the launches are recorded
    outputs: Sequence[torch.Tensor]
    launches: int  # how many kernel launches one call of the launcher must make


def assert_every_kernel_lowers(target: str, timeout: float = 240) -> None:
    """``target`` is real_compiler.py's ``MODULE:FUNCTION`` (a module next to this file, a function
    returning its (op, variant name, spec, config) cases); every kernel they launch must lower."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, str(_HELPER), target], env=env, capture_output=True, text=True,
                          timeout=timeout, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr[-6000:]
    assert "lowered" in done.stdout and ", 0 failed" in done.stdout, done.stdout


def lowered_kernels(target: str, floats: str = "fp32", timeout: float = 300) -> list[str]:
    """``target`` names a function returning :class:`LaunchCase` s; real_compiler.py lowers every
    launch of each with Python floats typed ``floats`` (``fp32`` as Triton types them, ``fp64`` as
    Inductor does) and must exit 0: each case made its number of launches, each lowered, none
    computes in float64. Returns the names of the kernels lowered, sorted."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["REAL_COMPILER_FLOATS"] = floats
    done = subprocess.run([sys.executable, str(_HELPER), "--launches", target], env=env, capture_output=True,
                          text=True, timeout=timeout, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr[-6000:]
    lowered = [line for line in done.stdout.splitlines() if line.startswith("lowered kernels ")]
    assert len(lowered) == 1, done.stdout
    return lowered[0].removeprefix("lowered kernels ").split()

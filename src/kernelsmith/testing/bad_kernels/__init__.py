"""Planted bad kernels: candidate sources that break one rule of the harness each.

DESIGN.md ("The harness must be impossible to fool") lists the ways generated kernels cheat a
benchmark; every module here is one of them, written as an outside candidate would be (a module
defining ``build(spec, config)``), with a docstring saying which rule it attacks and how the
harness is expected to reject it. Two controls (``correct_rmsnorm``, ``correct_softmax``) are
right and must be accepted. ``tests/test_harness_rules.py`` and ``tests/gpu/test_harness_gpu.py``
evaluate them.

The modules are *text*: the harness receives them as ``Candidate(source=...)`` and loads them
only inside a worker process. Never import them into a process you care about (some tamper with
PyTorch, exit, crash or hang when their launcher runs).

>>> from kernelsmith.testing.bad_kernels import NAMES, source
>>> "correct_rmsnorm" in NAMES and "def build(" in source("correct_rmsnorm")
True
"""

from __future__ import annotations

from pathlib import Path

_HERE = Path(__file__).resolve().parent

NAMES: tuple[str, ...] = tuple(sorted(p.stem for p in _HERE.glob("*.py") if p.stem != "__init__"))


def source(name: str) -> str:
    """The source text of the planted kernel ``name`` (one of :data:`NAMES`)."""
    if name not in NAMES:
        raise KeyError(f"no planted kernel {name!r} (known: {', '.join(NAMES)})")
    return (_HERE / f"{name}.py").read_text()

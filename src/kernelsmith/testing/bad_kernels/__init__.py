"""Planted bad kernels: candidates that break one rule of the harness each.

DESIGN.md ("The harness must be impossible to fool") and issue 12 list the ways generated
kernels cheat a benchmark; every file here is one of them, with a docstring saying which rule it
attacks and how the harness is expected to reject it. They come in two kinds:

- :data:`KERNEL_FILES`: kernel files (docs/kernel-files.md), the only form untrusted kernels
  take: Triton device code and a declarative launch. Their cheats are device-level (never
  writing, dropping rows, zeros, mutating an input, reading the output, a device loop that never
  ends, ...): they pass the gate, and the harness must reject them when it validates them. Two
  controls (``correct_rmsnorm``, ``correct_softmax``) are right and must be accepted.
- :data:`HOST_MODULES`: Python modules with a ``build(spec, config)`` launcher, written as an
  attacker would write them (threads, side streams, forged replies, tampering, detecting the
  worker, ...). These attacks need host code, which a kernel file cannot contain: the gate must
  reject every one of them before anything runs.

``tests/test_harness_rules.py``, ``tests/test_static_gate.py`` and
``tests/gpu/test_harness_gpu.py`` evaluate them. The files are *text*: never import them into a
process you care about (some tamper with PyTorch, exit, crash or hang when they run).

>>> from kernelsmith.testing.bad_kernels import HOST_MODULES, KERNEL_FILES, NAMES, source
>>> "correct_rmsnorm" in KERNEL_FILES and "LAUNCH = {" in source("correct_rmsnorm")
True
>>> "forges_reply" in HOST_MODULES and "def build(" in source("forges_reply")
True
>>> set(KERNEL_FILES) | set(HOST_MODULES) == set(NAMES)
True
"""

from __future__ import annotations

import ast
from pathlib import Path

_HERE = Path(__file__).resolve().parent

NAMES: tuple[str, ...] = tuple(sorted(p.stem for p in _HERE.glob("*.py") if p.stem != "__init__"))


def source(name: str) -> str:
    """The source text of the planted kernel ``name`` (one of :data:`NAMES`)."""
    if name not in NAMES:
        raise KeyError(f"no planted kernel {name!r} (known: {', '.join(NAMES)})")
    return (_HERE / f"{name}.py").read_text()


def _is_kernel_file(name: str) -> bool:
    """Whether the file declares a ``LAUNCH`` at top level (read from its syntax tree)."""
    tree = ast.parse(source(name))
    return any(
        isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "LAUNCH" for t in node.targets)
        for node in tree.body
    )


KERNEL_FILES: tuple[str, ...] = tuple(name for name in NAMES if _is_kernel_file(name))
HOST_MODULES: tuple[str, ...] = tuple(name for name in NAMES if name not in KERNEL_FILES)

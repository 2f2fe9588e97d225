"""Hand-written starting kernels for the coding-agent workspace, one module per op family.

A workspace's ``kernel.py`` is normally cut out of the op family's own module
(:mod:`kernelsmith.agent.extract`). When that cannot be done cleanly (a variant built by a
factory, or code the static gate would reject in a candidate), these templates are the fallback.
Each is a complete candidate module (``space``, ``build``) in the form the worker loads from
source; the workspace appends the ``CONFIG`` to evaluate. They are read as text, like
:mod:`kernelsmith.testing.bad_kernels`, and tested for correctness in the interpreter.

>>> from kernelsmith.agent.templates import template_source
>>> "def build(" in template_source("rmsnorm")
True
>>> template_source("no_such_op") is None
True
"""

from __future__ import annotations

from pathlib import Path

_HERE = Path(__file__).resolve().parent

OPS: tuple[str, ...] = tuple(sorted(p.stem for p in _HERE.glob("*.py") if p.stem != "__init__"))


def template_source(op: str) -> str | None:
    """The template module for op family ``op`` as text, or None when there is none."""
    return (_HERE / f"{op}.py").read_text() if op in OPS else None

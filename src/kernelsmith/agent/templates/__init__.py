"""Hand-written starting kernels for the coding-agent workspace: one kernel file per op family.

Each file is a complete kernel file (docs/kernel-files.md: ``@triton.jit`` device code, ``SPACE``,
``CONSTRAINTS`` and the ``LAUNCH`` description, launched by kernelsmith's own launcher), the form
every untrusted kernel takes. A new workspace's ``kernel.py`` is the template of its family with
a ``CONFIG`` appended. The files are read as *text*, never imported: they are data of the
package that happens to be valid Python (so editors and linters read them as such), and
``tests/test_agent.py`` validates each in the interpreter.

>>> from kernelsmith.agent.templates import OPS, template_source
>>> "rmsnorm" in OPS and "LAUNCH = {" in template_source("rmsnorm")
True
>>> template_source("no_such_op") is None
True
"""

from __future__ import annotations

from pathlib import Path

_HERE = Path(__file__).resolve().parent

OPS: tuple[str, ...] = tuple(sorted(p.stem for p in _HERE.glob("*.py") if p.stem != "__init__"))


def template_source(op: str) -> str | None:
    """The template kernel file for op family ``op`` as text, or None when there is none."""
    return (_HERE / f"{op}.py").read_text() if op in OPS else None

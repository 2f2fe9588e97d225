"""The gate over candidate source: a candidate is a kernel file, or nothing.

Kernels proposed from outside the package (a coding agent's ``kernel.py``, an LLM, a planted bad
kernel, an imported record) used to be Python modules with a ``build`` function, gated by a list
of forbidden names; a static gate over Python cannot see every way Python reaches what it
forbids. They are now kernel files (``docs/kernel-files.md``): Triton device code plus literal
launch data, checked against a grammar and launched by kernelsmith's own code. This module keeps
the names its callers import; the gate itself is :func:`kernelsmith.evaluate.kernel_file.check_kernel_file`.
"""

from __future__ import annotations

from kernelsmith.evaluate.kernel_file import ALLOWED_IMPORTS, check_kernel_file

__all__ = ["ALLOWED_IMPORTS", "check_source"]


def check_source(source: str) -> list[str]:
    """Every problem of candidate source as a kernel file, one line each (empty when it passes).

    >>> check_source("import os")[0].split(";")[0]
    'line 1: `import os` is not allowed'
    """
    return check_kernel_file(source)

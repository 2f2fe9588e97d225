"""A workspace where a coding agent (or a person) edits one kernel file against a fixed harness.

``kernel.py`` is a kernel file (docs/kernel-files.md): Triton device code and a launch block,
never run as host Python.

The loop the autoresearch-style agents run, on kernelsmith's own harness::

    kernelsmith agent init rmsnorm --shape 8192x4096 --dtype bf16 --dir ws
    cd ws && $EDITOR kernel.py && kernelsmith agent bench    # KEEP or REVERT, appended to results.tsv

From Python:

>>> from kernelsmith.agent import bench_workspace, init_workspace
>>> init_workspace("rmsnorm", "8192x4096", "bf16", directory="ws")  # doctest: +SKIP
>>> bench_workspace("ws").verdict                                  # doctest: +SKIP
'KEEP'

- :mod:`kernelsmith.agent.workspace`: ``init`` and ``bench``;
- :mod:`kernelsmith.agent.templates`: the hand-written starting kernel file of each family;
- :mod:`kernelsmith.agent.playbook`: the AGENTS.md text.

See docs/agent.md.
"""

from __future__ import annotations

from kernelsmith.agent.workspace import (
    AGENT_VARIANT,
    BenchReport,
    InitResult,
    Workspace,
    WorkspaceError,
    bench_workspace,
    init_workspace,
)

__all__ = [
    "AGENT_VARIANT",
    "BenchReport",
    "InitResult",
    "Workspace",
    "WorkspaceError",
    "bench_workspace",
    "init_workspace",
]

"""The kernel a workspace starts from: the stored winner when it is trusted, else the family's template.

Part of the agent workspace (:mod:`kernelsmith.agent.workspace`): ``init`` writes the chosen
:class:`Start` as the workspace's ``kernel.py``, with a header saying what it is for and its
configuration as a ``CONFIG`` block (:func:`config_block`).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kernelsmith.agent._workspace_layout import WorkspaceError
from kernelsmith.db import (
    Database,
    DecisionRecord,
)
from kernelsmith.evaluate.kernel_file import check_kernel_file, parse_kernel_file
from kernelsmith.ops import OpFamily
from kernelsmith.spec import OpSpec

log = logging.getLogger("kernelsmith.agent.workspace")  # this code's logger in workspace.py


# ---- kernel.py ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Start:
    """Where ``kernel.py`` came from."""

    origin: str  # "database winner", "best kernel measured", "template"
    variant: str  # "agent", "llm" (a stored kernel file) or "template"
    config: dict[str, Any]
    source: str  # the complete kernel.py

    def describe(self) -> str:
        return f"the {self.origin} ({self.variant}, CONFIG {_config_text(self.config)})"


def _config_text(config: Mapping[str, Any]) -> str:
    return "{" + ", ".join(f"{json.dumps(k)}: {_literal(v)}" for k, v in sorted(config.items())) + "}"


def _literal(value: Any) -> str:
    return json.dumps(value) if isinstance(value, str) else repr(value)


def config_block(config: Mapping[str, Any]) -> str:
    """The ``CONFIG`` statement appended to a kernel file."""
    return (
        "\n# The config `kernelsmith agent bench` evaluates: a literal dict with a value for every\n"
        "# parameter of SPACE, meeting CONSTRAINTS (bench reads it without running this file).\n"
        f"CONFIG = {_config_text(config)}\n"
    )


def _header(family: OpFamily, spec: OpSpec, where: str) -> str:
    return (
        f"{family.name}: {family.summary}.\n\n"
        f"The kernel file `kernelsmith agent bench` evaluates, on {spec.describe()}.\n"
        f"Started from {where}.\n\n"
        "A kernel file (AGENTS.md has the rules): @triton.jit device code, literal constants, SPACE and\n"
        "CONSTRAINTS (the configs), LAUNCH (how kernelsmith launches the kernels: grid, arguments,\n"
        "constexprs, warps) and CONFIG (the config bench evaluates). Nothing here runs as host Python.\n"
    )


def _with_config(source: str, config: Mapping[str, Any]) -> str:
    return source.rstrip() + "\n\n" + config_block(config)


def _template_start(family: OpFamily, spec: OpSpec) -> Start:
    """``kernel.py`` from the family's template and the first config of its space for ``spec``."""
    from kernelsmith.agent.templates import OPS, template_source

    text = template_source(family.name)
    if text is None:
        raise WorkspaceError(
            f"no kernel-file template for {family.name}: `kernelsmith agent init` supports {', '.join(OPS)}"
        )
    template = parse_kernel_file(text)  # the package's own file: a failure here is a bug
    space = template.space(spec)
    configs = space.configs()
    if not configs:
        raise WorkspaceError(
            f"the {family.name} template has no config for {spec.describe()}: "
            + "; ".join(c.reason for c in space.constraints)
        )
    config = configs[0].to_dict()
    # The workspace's header goes above the template's own docstring, which explains the kernel.
    doc = '"""' + _header(family, spec, f"the template kernelsmith/agent/templates/{family.name}.py") + "\n"
    body = text.lstrip()
    body = body[3:] if body.startswith('"""') else '"""\n' + body
    return Start("template", "template", config, _with_config(doc + body, config))


def _trusted_source(db: Database, source_hash: str) -> str | None:
    """The stored kernel file ``source_hash`` when this user trusts it and it passes the gate."""
    record = db.variant_source(source_hash)
    if record is None:
        log.warning("the stored winner's source %s is missing from the database", source_hash)
        return None
    if not record.trusted:
        log.warning("the stored winner's source %s is imported and not trusted (kernelsmith db trust)", source_hash)
        return None
    problems = check_kernel_file(record.source)
    if problems:
        log.warning("the stored winner's source %s is not a kernel file: %s", source_hash, problems[0])
        return None
    return record.source


def starting_kernel(family: OpFamily, spec: OpSpec, decision: DecisionRecord | None, db: Database) -> Start:
    """The ``kernel.py`` of a new workspace for ``spec`` (see the module docstring)."""
    builtin = {v.name for v in family.variants}
    if decision is not None and decision.variant and decision.variant not in builtin:
        origin = "database winner" if decision.winner == "kernel" else "best kernel measured"
        stored = _trusted_source(db, decision.source_hash)
        if stored is not None:
            if parse_kernel_file(stored).config is None:  # an llm kernel: its config is the decision's
                stored = _with_config(stored, decision.config)
            return Start(origin, decision.variant, dict(decision.config), stored)
    return _template_start(family, spec)



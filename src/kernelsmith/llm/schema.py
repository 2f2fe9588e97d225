"""The structured answers the LLM strategy asks for (pydantic models; ``pip install -e '.[llm]'``).

A round's answer is a list of parameter proposals (a variant of the op family and a config) and,
when whole-kernel proposals are enabled, a list of kernels (a kernel file's text, see
docs/kernel-files.md, and the configs to try it with). The field descriptions go to the model
with the JSON schema, so they are written for it. This module imports pydantic at the top: import
it lazily (the strategy does).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field


class ParamProposal(BaseModel):
    """One candidate from the search space."""

    variant: str = Field(description="a variant name from the search space, or the name of a kernel proposed earlier")
    config: dict[str, Any] = Field(
        default_factory=dict, description="parameter name -> value, using the values listed for that variant"
    )
    rationale: str = Field(default="", description="one short sentence: why this candidate may be fast")


class KernelProposal(BaseModel):
    """A new kernel variant: a kernel file (device code and a launch description), evaluated by the
    isolated harness."""

    name: str = Field(description="a short identifier for this kernel, e.g. 'two_rows_per_warp'")
    source: str = Field(
        description="the complete kernel file: @triton.jit kernel(s), constants, SPACE, CONSTRAINTS and LAUNCH "
        "(no other Python: it is parsed, never run)"
    )
    configs: list[dict[str, Any]] = Field(
        default_factory=list,
        description="configs to evaluate it with (a value for every SPACE parameter; [{}] if it has no SPACE)",
    )
    rationale: str = Field(default="", description="one or two sentences: what should make it faster")


class ParamRound(BaseModel):
    """One round's answer: parameter proposals only."""

    candidates: list[ParamProposal] = Field(default_factory=list, description="the candidates to evaluate next")


class Round(ParamRound):
    """One round's answer: parameter proposals and new kernels."""

    kernels: list[KernelProposal] = Field(default_factory=list, description="new kernel variants (may be empty)")

"""What an agent workspace is on disk: its files, its ``workspace.json``, its results table.

Part of the agent workspace (:mod:`kernelsmith.agent.workspace`): the file names and formats, the
timing settings benches use, :class:`WorkspaceError`, and :class:`Workspace`, the folder and its
recorded request, which ``init`` writes and every ``bench`` loads and appends a result row to.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kernelsmith.evaluate.protocol import Candidate, EvalResult, TimingSettings
from kernelsmith.exceptions import KernelsmithError
from kernelsmith.spec import OpSpec

# The variant name decisions and trials record for a kernel kept from a workspace.
AGENT_VARIANT = "agent"
KERNEL_FILE = "kernel.py"
BEST_FILE = "best.py"
AGENTS_FILE = "AGENTS.md"
WORKSPACE_FILE = "workspace.json"
RESULTS_FILE = "results.tsv"
WORKSPACE_FORMAT = "kernelsmith-agent-workspace"
RESULTS_COLUMNS = (
    "timestamp", "mode", "source_hash", "config", "correct", "time_us", "incumbent_us", "baseline_us",
    "gbps", "pct_of_ceiling", "speedup_vs_incumbent", "verdict", "reason",
)  # fmt: skip
INTERPRETER_NOTE = "interpreter: timings are not performance"
GATE_REASON = "the kernel-file gate rejected kernel.py (nothing ran; AGENTS.md says what a kernel file may contain):"
# Without a GPU the interpreter runs the kernels, thousands of times slower: shapes shrink to the
# family's small_shape unless the caller insists (as `kernelsmith tune` does).
GPU_TIMING = TimingSettings(rounds=100)
INTERPRETER_TIMING = TimingSettings(warmup_ms=0.0, rounds=6, input_sets=2, flush_l2=False)

# Evaluates candidates together (timed interleaved with each other and the baseline).
Evaluate = Callable[[OpSpec, Sequence[Candidate], TimingSettings], list[EvalResult]]


class WorkspaceError(KernelsmithError):
    """A problem with the workspace or the request (one line for the user, no traceback)."""


# ---- the workspace -----------------------------------------------------------------------------
@dataclass
class Workspace:
    """A workspace folder and the contents of its ``workspace.json``."""

    path: Path
    data: dict[str, Any]

    @property
    def op(self) -> str:
        return str(self.data["op"])

    @property
    def spec(self) -> OpSpec:
        return OpSpec.from_dict(self.data["spec"])

    @property
    def mode(self) -> str:
        return str(self.data["mode"])

    @property
    def db(self) -> str | None:
        return self.data.get("db")

    @classmethod
    def load(cls, directory: str | os.PathLike[str]) -> Workspace:
        path = Path(directory)
        try:
            data = json.loads((path / WORKSPACE_FILE).read_text())
        except FileNotFoundError:
            raise WorkspaceError(
                f"{path} is not a kernelsmith workspace (no {WORKSPACE_FILE}): create one with "
                "`kernelsmith agent init OP --shape ... --dtype ... --dir PATH`"
            ) from None
        except json.JSONDecodeError as exc:
            raise WorkspaceError(f"{path / WORKSPACE_FILE} is not valid JSON: {exc}") from None
        if data.get("format") != WORKSPACE_FORMAT:
            raise WorkspaceError(f"{path / WORKSPACE_FILE} is not a kernelsmith workspace file")
        return cls(path, data)

    def save(self) -> None:
        (self.path / WORKSPACE_FILE).write_text(json.dumps(self.data, indent=2, sort_keys=True) + "\n")

    def append_result(self, row: Mapping[str, Any]) -> None:
        values = [str(row.get(column, "")) for column in RESULTS_COLUMNS]
        line = "\t".join(v.replace("\t", " ").replace("\n", " ") for v in values)
        with open(self.path / RESULTS_FILE, "a") as handle:
            handle.write(line + "\n")



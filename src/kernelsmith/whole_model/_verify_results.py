"""What verifying a model returns: checks, verify and diagnose results, timing rows.

Part of the whole-model verification (:mod:`kernelsmith.whole_model.verify`): plain dataclasses
that :func:`~kernelsmith.whole_model.verify.verify_model`, ``diagnose`` and ``time_models``
fill, and that the CLI prints and writes as JSON (``to_dict``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

NO_GPU_NOTE = "no GPU: wall-clock CPU timings, for structure only, not GPU performance"
# ---------------------------------------------------------------------------------------------
# Results
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Check:
    """One compared tensor: an output leaf, a parameter's or an input's gradient, on one seed.

    ``error`` and ``reference_error`` are the optimized and original models' errors (relative L2
    and max abs) against the truth (``fp64``) or, without one, the optimized model's against the
    original (``reference_error`` then empty); ``reason`` is empty when the check passed.
    """

    seed: int
    kind: str  # "output", "grad" (a parameter's) or "input_grad"
    name: str
    ok: bool
    reason: str = ""
    error: dict[str, float] = field(default_factory=dict)
    reference_error: dict[str, float] = field(default_factory=dict)

    def describe(self) -> str:
        where = f"seed {self.seed} {self.kind} {self.name}"
        return f"{where}: ok" if self.ok else f"{where}: {self.reason}"


@dataclass
class VerifyResult:
    """What :func:`verify_model` found: ``ok`` when every check on every seed passed."""

    ok: bool
    truth: str  # "fp64" or "original"
    seeds: list[int]
    train: bool
    checks: list[Check]
    note: str = ""

    @property
    def failures(self) -> list[Check]:
        return [c for c in self.checks if not c.ok]

    def worst(self) -> Check | None:
        """The failed check with the largest relative error (or, all passing, the closest call)."""
        pool = self.failures or self.checks
        return max(pool, key=lambda c: c.error.get("rel_l2", 0.0), default=None)

    def summary(self) -> str:
        kinds = sorted({c.kind for c in self.checks})
        head = (
            f"{'PASS' if self.ok else 'FAIL'}: {len(self.checks) - len(self.failures)}/{len(self.checks)} "
            f"checks ({', '.join(kinds)}) on seeds {', '.join(map(str, self.seeds))} against the "
            + ("float64 truth" if self.truth == "fp64" else "original model (no float64 truth)")
        )
        if not self.ok:
            first = self.failures[0]
            head += f"; first failure: {first.describe()}"
        return head

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["failures"] = len(self.failures)
        return data


@dataclass
class DiagnoseStep:
    """One build verified during a diagnosis: which replacements were on, and the outcome."""

    enabled: list[str]
    ok: bool
    detail: str


@dataclass
class Diagnosis:
    """What :func:`diagnose` concluded. ``culprits`` is empty when no replacement is to blame:
    ``verdict`` then says whether everything passed or the compiler alone already failed."""

    culprits: list[str]
    verdict: str
    steps: list[DiagnoseStep]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class TimingRow:
    """End-to-end time of one variant: median and spread over the measured rounds, in ms."""

    name: str
    median_ms: float
    p10_ms: float
    p90_ms: float
    speedup_vs_eager: float | None = None


@dataclass
class TimingResult:
    """:func:`time_models`'s rows, the optimized model's paired speedups (``{"eager": {...},
    "inductor": {...}}``, each :func:`paired_speedup`'s fields), the timer used and, on a CPU,
    :data:`NO_GPU_NOTE`."""

    rows: list[TimingRow]
    timer: str
    rounds: int
    train: bool
    comparisons: dict[str, dict[str, Any]] = field(default_factory=dict)
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)



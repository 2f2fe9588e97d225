"""Plain messages between the tuner and its worker processes.

Everything here is a frozen dataclass of plain values, so it pickles across the process boundary
and a failure travels back as data (``status`` and ``error``), never as an exception.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

from kernelsmith.space import Config


@dataclass(frozen=True)
class Candidate:
    """A kernel variant and one of its configs.

    ``source`` is empty for the op family's built-in variants; otherwise it is the text of a
    Python module that defines ``build(spec, config)`` (and optionally ``space(spec)``): a
    kernel proposed from outside the package (a coding agent, an LLM, a planted bad kernel in
    the tests). Such source passes the static gate and runs only inside a worker process.
    """

    variant: str
    config: Config
    source: str = ""

    @property
    def key(self) -> str:
        tag = f"@{hashlib.sha256(self.source.encode()).hexdigest()[:8]}" if self.source else ""
        return f"{self.variant}{tag}[{self.config.key}]"


@dataclass(frozen=True)
class TimingSettings:
    """How hard to time: warm-up by time, interleaved rounds, rotating input sets."""

    warmup_ms: float = 25.0
    rounds: int = 40
    input_sets: int = 4
    flush_l2: bool = True

    @classmethod
    def interpreter(cls) -> TimingSettings:
        # The interpreter is orders of magnitude slower than a GPU, and its timings are never
        # reported as performance: a few rounds are enough to exercise the pipeline.
        return cls(warmup_ms=0.0, rounds=3, input_sets=2, flush_l2=False)


@dataclass(frozen=True)
class EvalRequest:
    """Evaluate candidates on one workload: build, validate, then time them interleaved with
    the baseline (the op's eager PyTorch reference) in the same process."""

    spec: dict[str, Any]
    candidates: tuple[Candidate, ...]
    mode: str = "gpu"  # "gpu" or "interpreter"
    timing: TimingSettings = field(default_factory=TimingSettings)
    measure: bool = True  # False: validate only
    static_gate: bool = True  # check candidate source before loading it (never off outside tests)
    lock_path: str = ""  # a file lock that serializes timing across workers sharing one GPU


@dataclass(frozen=True)
class EvalResult:
    """The outcome for one candidate: status "ok" with metrics, or a failure kind and error."""

    candidate: Candidate
    status: str
    error: str = ""
    metrics: dict[str, Any] = field(default_factory=dict)
    source_hash: str = ""
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def median_us(self) -> float:
        return float(self.metrics.get("median_us", float("inf")))


@dataclass(frozen=True)
class CeilingRequest:
    """Measure the device's copy bandwidth (bytes read + bytes written per second)."""

    nbytes: int = 1 << 30
    repeats: int = 20


@dataclass(frozen=True)
class CeilingResult:
    status: str
    copy_gbps: float = 0.0
    error: str = ""
    detail: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class WorkerReply:
    """A worker's answer: one result per request item; ``recycle`` asks for a fresh worker."""

    results: tuple[Any, ...]
    recycle: bool = False

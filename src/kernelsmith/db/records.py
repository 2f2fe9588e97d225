"""Plain records the database stores: what machine, what was tried, what was decided, and the
source of kernels written outside the package (a coding agent's, an LLM's).

Records are dataclasses of JSON-friendly fields so that they cross process boundaries, go into
SQLite rows and come out as JSON lines without special cases.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

# The outcome of one evaluated candidate: "ok", or the kind of failure.
Status = Literal["ok", "build", "validate", "runtime", "timeout", "crash", "cheat"]
FAILURE_KINDS: tuple[str, ...] = ("build", "validate", "runtime", "timeout", "crash", "cheat")


@dataclass(frozen=True)
class Fingerprint:
    """Everything about the machine and software that could make a stored result wrong.

    ``mode`` is ``"gpu"`` for real hardware and ``"interpreter"`` for the Triton interpreter on
    the CPU; the two never share a hash, so interpreter results are never served as GPU results.
    """

    mode: str
    gpu_name: str
    sm_count: int
    compute_capability: str
    driver: str
    cuda: str
    torch: str
    triton: str
    kernelsmith: str

    @property
    def hash(self) -> str:
        canonical = json.dumps(asdict(self), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()[:16]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Fingerprint:
        return cls(**{k: data[k] for k in cls.__dataclass_fields__})

    def describe(self) -> str:
        if self.mode == "interpreter":
            return f"Triton interpreter on the CPU (torch {self.torch}, triton {self.triton})"
        return (
            f"{self.gpu_name} (sm_{self.compute_capability.replace('.', '')}, {self.sm_count} SMs), "
            f"driver {self.driver}, CUDA {self.cuda}, torch {self.torch}, triton {self.triton}"
        )


@dataclass(frozen=True)
class TrialRecord:
    """One evaluated candidate (a variant and a config) on one workload and fingerprint.

    ``metrics`` holds, for a successful trial, ``median_us`` and quantiles of the candidate, the
    interleaved baseline's ``baseline_median_us``, and ``gbps``; for a failure it may be empty
    and ``error`` says what went wrong. Failed trials are kept so they are never measured again.
    """

    fingerprint: str
    workload: str
    op: str
    variant: str
    source_hash: str
    config: dict[str, Any]
    status: str
    error: str = ""
    metrics: dict[str, Any] = field(default_factory=dict)
    created_at: float = field(default_factory=time.time)

    @property
    def config_key(self) -> str:
        return ",".join(f"{k}={v}" for k, v in sorted(self.config.items()))

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrialRecord:
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})


@dataclass(frozen=True)
class DecisionRecord:
    """The outcome of tuning one workload on one fingerprint.

    ``winner`` is ``"kernel"`` (calls use ``variant`` with ``config``) or ``"baseline"`` (no
    candidate beat the existing path with confidence; calls keep using it). ``metrics`` holds
    the final paired comparison: ``median_us``, ``baseline_median_us``, ``speedup`` and its
    confidence interval, ``gbps`` and ``pct_of_copy_bandwidth``.
    """

    fingerprint: str
    workload: str
    op: str
    spec: dict[str, Any]
    winner: str
    variant: str = ""
    source_hash: str = ""
    config: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, Any] = field(default_factory=dict)
    strategy: str = ""
    evaluations: int = 0
    created_at: float = field(default_factory=time.time)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DecisionRecord:
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})


def variant_source_hash(source: str) -> str:
    """The hash naming a candidate module's source: the one the evaluation worker reports as
    ``EvalResult.source_hash`` and trials and decisions record (16 hex digits of its SHA-256).

    >>> variant_source_hash("def build(spec, config): ...")
    'dbcbe0cac152fecb'
    """
    return hashlib.sha256(source.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class VariantSource:
    """The text of a kernel module proposed from outside the package, stored once it passed the
    full harness, so that a decision naming it (``variant`` not a built-in one, ``source_hash``
    this record's) can be served. ``op`` is the family it was evaluated for."""

    source_hash: str
    op: str
    source: str
    created_at: float = field(default_factory=time.time)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> VariantSource:
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})

"""Plain records the database stores: what machine, what was tried, what was decided, and the
source of kernels written outside the package (a coding agent's, an LLM's).

Records are dataclasses of JSON-friendly fields so that they cross process boundaries, go into
SQLite rows and come out as JSON lines without special cases.

Where a record came from matters (DESIGN.md rule 13, imported records are claims): ``origin`` is
``"local"`` for what this machine measured or stored after its own harness passed it,
``"imported"`` for what ``kernelsmith db import`` read from a file, and ``"unknown"`` for kernel
sources stored before the schema recorded it. A local record is a fact; an imported one is a
claim that is re-validated here before anything acts on it.
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

# Where a record came from (see the module docstring).
LOCAL, IMPORTED, UNKNOWN = "local", "imported", "unknown"
ORIGINS: tuple[str, ...] = (LOCAL, IMPORTED, UNKNOWN)


# The fields of a fingerprint, by what a change of each does to a stored result (see
# docs/search.md, "A cache that survives upgrades"):
# - MODEL_FIELDS name the GPU model; another model's results are never served, nor used as seeds.
# - STRICT_FIELDS (the model's, CUDA, torch, Triton) invalidate a result: Triton compiles the
#   kernel (a new Triton is new machine code), CUDA is the toolkit torch and Triton build and link
#   against, and torch is the baseline every decision was measured against (its kernels and, for
#   the compile backend, Inductor's code) and pins the Triton it ships with. A result measured
#   under other values is only a warm-start seed here.
# - The rest (the driver build, the kernelsmith release) are re-validated instead: a result
#   measured under another value is served only after the harness here passed it on fresh data
#   and it beat the baseline again (kernelsmith.tuner). A kernelsmith release that changed the
#   variant itself changes the record's source hash, and that record is never served.
MODEL_FIELDS: tuple[str, ...] = ("mode", "gpu_name", "sm_count", "compute_capability")
STRICT_FIELDS: tuple[str, ...] = (*MODEL_FIELDS, "cuda", "torch", "triton")
REVALIDATED_FIELDS: tuple[str, ...] = ("driver", "kernelsmith")


def _digest(data: dict[str, Any]) -> str:
    canonical = json.dumps(data, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Fingerprint:
    """Everything about the machine and software that could make a stored result wrong.

    ``mode`` is ``"gpu"`` for real hardware and ``"interpreter"`` for the Triton interpreter on
    the CPU; the two never share a hash, so interpreter results are never served as GPU results.

    Records are keyed by :attr:`hash`, of every field. Two fingerprints that differ only in
    :data:`REVALIDATED_FIELDS` share a :attr:`compatibility` key: they are :meth:`near`, and a
    record of one is served on the other once re-validated there. Fingerprints with one
    :attr:`model` key are the same GPU model, whose winners seed each other's searches.
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
        return _digest(asdict(self))

    @property
    def compatibility(self) -> str:
        """The hash of the :data:`STRICT_FIELDS`: equal for fingerprints whose results may be
        carried over to each other after re-validation."""
        return _digest({k: getattr(self, k) for k in STRICT_FIELDS})

    @property
    def model(self) -> str:
        """The hash of the :data:`MODEL_FIELDS`: one GPU model (or the interpreter)."""
        return _digest({k: getattr(self, k) for k in MODEL_FIELDS})

    def near(self, other: Fingerprint) -> bool:
        """Whether ``other`` differs from this one only in :data:`REVALIDATED_FIELDS`."""
        return other.hash != self.hash and other.compatibility == self.compatibility

    def changes(self, other: Fingerprint) -> dict[str, tuple[Any, Any]]:
        """The fields that differ: ``{name: (this one's value, other's value)}``."""
        mine, theirs = asdict(self), asdict(other)
        return {k: (v, theirs[k]) for k, v in mine.items() if theirs[k] != v}

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
    and ``error`` says what went wrong. Failed trials are kept so they are never measured again
    here; an imported trial (``origin="imported"``) is shown but never stands in for a local
    measurement, so a file of forged failures cannot switch tuning off.
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
    origin: str = LOCAL

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

    An imported decision is a claim: ``validated`` is False until this machine ran its variant
    and config through the harness (``kernelsmith db validate``), and ``validation_error`` says
    why that failed. Only a :attr:`servable` decision is ever served.
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
    origin: str = LOCAL
    validated: bool = True
    validation_error: str = ""

    @property
    def servable(self) -> bool:
        """Whether the front doors may act on it: measured here, or a claim validated here."""
        return self.validated and not self.validation_error

    @property
    def claim_state(self) -> str:
        """``"local"``, or for a claim ``"validated"``, ``"failed"`` or ``"unvalidated"``."""
        if self.origin == LOCAL and self.servable:
            return "local"
        if self.validation_error:
            return "failed"
        return "validated" if self.validated else "unvalidated"

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
    """The text of a kernel proposed from outside the package (a kernel file, see
    docs/kernel-files.md), stored so that a decision naming it (``variant`` not a built-in one,
    ``source_hash`` this record's) can be served. ``op`` is the family it was evaluated for.

    ``trusted`` is whether this user's kernelsmith may load it at all: true for source stored
    after it passed the harness here, false for imported source (and for everything in a
    database another user wrote) until ``kernelsmith db trust`` (see :mod:`kernelsmith.db.trust`).
    """

    source_hash: str
    op: str
    source: str
    created_at: float = field(default_factory=time.time)
    origin: str = LOCAL
    trusted: bool = True

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> VariantSource:
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})

"""The storage contract: a small abstract base every database implementation fulfils.

The shape follows Optuna's ``BaseStorage`` and TVM MetaSchedule's ``Database``: the engine talks
only to this interface, one concrete implementation (:mod:`kernelsmith.db.sqlite`) does the
work, and a reusable test suite (:mod:`kernelsmith.testing.db_suite`) pins the behaviour down so
another backend can be checked against the same expectations.

Failures are data, not exceptions: a trial that did not build, validate or run is stored with
its status and error like a successful one, so that it is never evaluated again on the same
fingerprint.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from types import TracebackType
from typing import Any

from kernelsmith.db.records import LOCAL, DecisionRecord, Fingerprint, TrialRecord, VariantSource
from kernelsmith.exceptions import KernelsmithError


class DatabaseError(KernelsmithError, RuntimeError):
    """The database cannot be opened, read or written; the message names the location, and
    ``path`` holds it when there is a file (empty for a bad URL or an in-memory database)."""

    def __init__(self, message: str, path: str = "") -> None:
        super().__init__(message)
        self.path = path


class BrokenDatabaseError(DatabaseError):
    """The file is not a usable kernelsmith database: not SQLite, corrupted, truncated, a
    directory, unreadable, or written by a newer kernelsmith. Nothing in it can be trusted to
    mean what it says, so the front doors run the user's code and the CLI points at
    :func:`repair_hint`'s commands instead of guessing."""


def repair_hint(path: str) -> str:
    """What to run about a broken database file (one line, for warnings and CLI errors)."""
    if "://" in path:  # a server's database is shared: never moved aside
        return (f"run `kernelsmith db check --db {path}` to see what is wrong; upgrade kernelsmith to the version "
                "that wrote it, or use another database")
    where = f" --db {path}" if path else ""
    return (f"run `kernelsmith db check{where}` to see what is wrong, or `kernelsmith db reset{where}` "
            "to move the file aside and start an empty cache")


def config_key_of(config: Mapping[str, Any] | str) -> str:
    """The canonical ``"k=v,k=v"`` key of a config (the form of :attr:`TrialRecord.config_key`).

    A string is taken to be a key already, so callers may pass either form.
    """
    if isinstance(config, str):
        return config
    return ",".join(f"{k}={v}" for k, v in sorted(config.items()))


@dataclass(frozen=True)
class Ceiling:
    """A measured device ceiling (e.g. ``"copy_gbps"``) for one fingerprint.

    Ceilings turn raw timings into "percent of what this machine can do"; they depend only on
    the machine, so they are measured once per fingerprint and reused.
    """

    fingerprint: str
    name: str
    value: float
    detail: dict[str, Any] = field(default_factory=dict)
    measured_at: float = field(default_factory=time.time)
    origin: str = LOCAL

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Ceiling:
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})


class Database(ABC):
    """Where fingerprints, trials, decisions, device ceilings and outside kernel sources live.

    Every record is keyed by a fingerprint hash, and every query that can be scoped to one takes
    it: results measured on one machine (or in the interpreter) are never mixed with another's.
    Writes are committed as soon as the method returns, so a crash loses nothing already stored.
    """

    # -- fingerprints ------------------------------------------------------------------------

    @abstractmethod
    def put_fingerprint(self, fp: Fingerprint) -> None:
        """Store ``fp`` under its hash (idempotent: the hash is a digest of the content)."""

    @abstractmethod
    def get_fingerprint(self, hash: str) -> Fingerprint | None:
        """The fingerprint stored under ``hash``, or None."""

    @abstractmethod
    def fingerprints(self) -> list[Fingerprint]:
        """Every stored fingerprint, in the order they were first stored."""

    # -- trials ------------------------------------------------------------------------------

    @abstractmethod
    def add_trial(self, rec: TrialRecord) -> None:
        """Append one evaluated candidate, successful or not."""

    def add_trials(self, recs: Iterable[TrialRecord]) -> int:
        """Append several trials; implementations may do it in one transaction. Returns count."""
        n = 0
        for rec in recs:
            self.add_trial(rec)
            n += 1
        return n

    @abstractmethod
    def find_trial(
        self,
        fingerprint: str,
        workload: str,
        variant: str,
        source_hash: str,
        config_key: str | Mapping[str, Any],
        *,
        since: float = 0.0,
    ) -> TrialRecord | None:
        """The most recent *local* trial of this exact candidate, or None if it was never
        evaluated here. Imported trials are claims and never answer: a failure someone else
        recorded must not stop this machine from measuring the candidate (DESIGN.md rule 13).

        ``config_key`` is in :attr:`TrialRecord.config_key` form (``"k=v,k=v"``, sorted); a
        config mapping is accepted too and converted with :func:`config_key_of`. ``since`` (a
        ``time.time()``) ignores trials created before it: a forced retune measures afresh.
        """

    @abstractmethod
    def trials(
        self,
        fingerprint: str | None = None,
        workload: str | None = None,
        op: str | None = None,
    ) -> list[TrialRecord]:
        """Trials matching every filter given, in insertion order."""

    # -- claims: tuners sharing a database never evaluate one candidate twice ----------------

    @abstractmethod
    def claim_evaluation(
        self,
        fingerprint: str,
        workload: str,
        variant: str,
        source_hash: str,
        config_key: str | Mapping[str, Any],
        *,
        owner: str,
        ttl_s: float = 900.0,
        since: float = 0.0,
    ) -> bool:
        """Claim the right to evaluate this candidate before evaluating it: True when ``owner``
        holds the claim now (taken, or already its own), False when a local trial of it is
        stored (created at ``since`` or later; read it with :meth:`find_trial`) or another
        owner's claim has not expired (it is being evaluated elsewhere right now).

        The check and the claim are one transaction, so of several tuners asking at once
        exactly one gets True. A claim lapses ``ttl_s`` seconds after it was taken, so a tuner
        that died mid-evaluation blocks the others only that long. :meth:`release_evaluation`
        once the trial is stored.
        """

    @abstractmethod
    def release_evaluation(
        self,
        fingerprint: str,
        workload: str,
        variant: str,
        source_hash: str,
        config_key: str | Mapping[str, Any],
        *,
        owner: str,
    ) -> None:
        """Give up ``owner``'s claim on this candidate (its trial is stored, or it was not
        evaluated after all). Another owner's claim is left alone. Idempotent."""

    # -- decisions ---------------------------------------------------------------------------

    @abstractmethod
    def put_decision(self, rec: DecisionRecord) -> None:
        """Store the decision for ``(rec.fingerprint, rec.workload)``, replacing any earlier one,
        except that an imported decision (a claim) never replaces one measured here."""

    @abstractmethod
    def get_decision(self, fingerprint: str, workload: str) -> DecisionRecord | None:
        """The decision for this workload on this fingerprint, or None."""

    @abstractmethod
    def decisions(
        self, fingerprint: str | None = None, op: str | None = None
    ) -> list[DecisionRecord]:
        """Decisions matching every filter given, in the order they were first made."""

    def near_decisions(self, fp: Fingerprint, workload: str) -> list[DecisionRecord]:
        """The decisions for ``workload`` stored under fingerprints :meth:`~Fingerprint.near`
        ``fp`` (another driver build or kernelsmith release, the rest equal), newest first.

        They are candidates for re-validation here, never servable as they are: the tuner
        re-validates and re-times one before storing it under ``fp`` (:mod:`kernelsmith.tuner`).
        """
        near = [other.hash for other in self.fingerprints() if fp.near(other)]
        found = [d for d in (self.get_decision(h, workload) for h in near) if d is not None]
        return sorted(found, key=lambda d: d.created_at, reverse=True)

    # -- ceilings ----------------------------------------------------------------------------

    @abstractmethod
    def put_ceiling(
        self,
        fingerprint: str,
        name: str,
        value: float,
        detail: dict[str, Any] | None = None,
        *,
        measured_at: float | None = None,
        origin: str = LOCAL,
    ) -> None:
        """Store a measured ceiling; one value per ``(fingerprint, name)``, the latest wins,
        except that an imported value never replaces one measured here."""

    @abstractmethod
    def get_ceiling(self, fingerprint: str, name: str) -> float | None:
        """The ceiling's value as measured here, or None (imported values do not count)."""

    @abstractmethod
    def ceilings(self, fingerprint: str | None = None) -> list[Ceiling]:
        """Stored ceilings with their detail, optionally for one fingerprint only."""

    # -- variant sources ---------------------------------------------------------------------

    @abstractmethod
    def put_variant_source(self, op: str, source: str, *, origin: str = LOCAL, trusted: bool | None = None) -> str:
        """Store the text of a kernel written outside the package; returns its source hash.

        ``trusted`` (default: ``origin == "local"``) marks the text as one this user's
        kernelsmith may load: pass it only for source that passed the full evaluation harness
        here, since decisions naming the hash are served by loading this text in the caller's
        process (see :func:`kernelsmith.dispatch.build_runner`). Imported text is stored
        untrusted. Idempotent: the hash names the content, and the first ``op`` stored for it
        is kept; storing it again trusted trusts the stored copy.

        >>> from kernelsmith.db import open_database
        >>> with open_database(":memory:") as db:
        ...     h = db.put_variant_source("rmsnorm", "def build(spec, config): ...")
        ...     db.get_variant_source(h)[:9]
        'def build'
        """

    @abstractmethod
    def get_variant_source(self, source_hash: str) -> str | None:
        """The source stored under ``source_hash``, or None."""

    @abstractmethod
    def variant_sources(self, op: str | None = None) -> list[VariantSource]:
        """Stored sources, optionally of one op family only, in the order they were stored."""

    def variant_source(self, source_hash: str) -> VariantSource | None:
        """The stored source record (with its origin and whether this user trusts it), or None."""
        for record in self.variant_sources():
            if record.source_hash == source_hash:
                return record
        return None

    @abstractmethod
    def trust_variant_source(self, source_hash: str) -> bool:
        """Mark the stored source trusted by this user (``kernelsmith db trust``); False when no
        source is stored under ``source_hash``. The caller shows the text and checks it first."""

    # -- lifetime ----------------------------------------------------------------------------

    @abstractmethod
    def close(self) -> None:
        """Release the connection; further use raises :class:`DatabaseError`. Idempotent."""

    def __enter__(self) -> Database:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

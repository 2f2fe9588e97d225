"""What the SQL backends share: the schema and its migrations, and every record method.

SQLite (:mod:`kernelsmith.db.sqlite`) and PostgreSQL (:mod:`kernelsmith.db.postgres`) store the
same tables with the same meaning, so the migrations are written once, as templates whose few
dialect words (:class:`Dialect`) are filled in per backend, and :class:`SQLDatabase` implements
the whole :class:`~kernelsmith.db.Database` interface in portable SQL (``?`` placeholders,
``INSERT ... ON CONFLICT``). A backend only says how to open a connection, how to run one read
and one write transaction (:meth:`SQLDatabase._read` / :meth:`SQLDatabase._write`), and how to
serialise two tuners claiming the same candidate (:meth:`SQLDatabase._lock_claim`).

Claims (:meth:`SQLDatabase.claim_evaluation`) are how several tuners sharing one database avoid
measuring the same candidate twice: a row per candidate being evaluated, inserted with
``ON CONFLICT DO NOTHING`` in the same transaction that checks no trial of it is stored yet,
deleted when the trial is stored, and ignored once it expired (a tuner that died mid-evaluation
blocks nobody for longer than the timeout).
"""

from __future__ import annotations

import json
import logging
import sqlite3
import time
from abc import abstractmethod
from collections.abc import Iterable, Iterator, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

from kernelsmith.db._base import BrokenDatabaseError, Ceiling, Database, config_key_of
from kernelsmith.db.records import LOCAL, DecisionRecord, Fingerprint, TrialRecord, VariantSource, variant_source_hash
from kernelsmith.db.trust import source_token, token_trusts

logger = logging.getLogger(__name__)

# How long a claim on a candidate holds before another tuner may take it over (seconds): longer
# than any one evaluation takes, so that only a tuner that died (or lost the database) loses it.
CLAIM_TTL_S = 900.0


@dataclass(frozen=True)
class Dialect:
    """The words in which the backends' schemas differ.

    ``id``: an auto-increment primary key; ``real``: a double-precision float (PostgreSQL's
    ``REAL`` is single precision, which would round timestamps); ``seq``: a column that records
    insertion order where the database has no ``rowid`` (empty for SQLite); ``order``: what to
    sort by for insertion order.
    """

    id: str
    real: str
    seq: str
    order: str


SQLITE = Dialect(id="INTEGER PRIMARY KEY AUTOINCREMENT", real="REAL", seq="", order="rowid")
POSTGRES = Dialect(id="BIGSERIAL PRIMARY KEY", real="DOUBLE PRECISION", seq=",\n        seq BIGSERIAL", order="seq")

# MIGRATIONS[i] moves the schema from version i to version i + 1. Append only; never edit a
# released entry (databases in the field have already run it): filled in for SQLite, each
# template is exactly the text SQLite databases ran.
_MIGRATION_TEMPLATES: list[str] = [
    # 0 -> 1: the initial schema.
    """
    CREATE TABLE fingerprints (
        hash TEXT PRIMARY KEY,
        json TEXT NOT NULL{seq}
    );
    CREATE TABLE trials (
        id {id},
        fingerprint TEXT NOT NULL,
        workload TEXT NOT NULL,
        op TEXT NOT NULL,
        variant TEXT NOT NULL,
        source_hash TEXT NOT NULL,
        config_key TEXT NOT NULL,
        config TEXT NOT NULL,
        status TEXT NOT NULL,
        error TEXT NOT NULL DEFAULT '',
        metrics TEXT NOT NULL,
        created_at {real} NOT NULL
    );
    CREATE INDEX trials_candidate
        ON trials (fingerprint, workload, variant, source_hash, config_key);
    CREATE INDEX trials_op ON trials (op);
    CREATE TABLE decisions (
        fingerprint TEXT NOT NULL,
        workload TEXT NOT NULL,
        op TEXT NOT NULL,
        spec TEXT NOT NULL,
        winner TEXT NOT NULL,
        variant TEXT NOT NULL,
        source_hash TEXT NOT NULL,
        config TEXT NOT NULL,
        metrics TEXT NOT NULL,
        strategy TEXT NOT NULL,
        evaluations INTEGER NOT NULL,
        created_at {real} NOT NULL{seq},
        PRIMARY KEY (fingerprint, workload)
    );
    CREATE TABLE ceilings (
        fingerprint TEXT NOT NULL,
        name TEXT NOT NULL,
        value {real} NOT NULL,
        detail TEXT NOT NULL,
        measured_at {real} NOT NULL{seq},
        PRIMARY KEY (fingerprint, name)
    );
    """,
    # 1 -> 2: the source of kernels written outside the package (coding agent, LLM), by hash.
    """
    CREATE TABLE variant_sources (
        source_hash TEXT PRIMARY KEY,
        op TEXT NOT NULL,
        source TEXT NOT NULL,
        created_at {real} NOT NULL{seq}
    );
    CREATE INDEX variant_sources_op ON variant_sources (op);
    """,
    # 2 -> 3: where each record came from, whether a claim was validated here, and this user's
    # trust token for kernel sources (kernelsmith.db.trust). Sources stored before this version
    # cannot be told apart from imported ones, so they are "unknown" and untrusted until
    # `kernelsmith db trust`; everything else stored before was measured locally.
    """
    ALTER TABLE trials ADD COLUMN origin TEXT NOT NULL DEFAULT 'local';
    ALTER TABLE decisions ADD COLUMN origin TEXT NOT NULL DEFAULT 'local';
    ALTER TABLE decisions ADD COLUMN validated INTEGER NOT NULL DEFAULT 1;
    ALTER TABLE decisions ADD COLUMN validation_error TEXT NOT NULL DEFAULT '';
    ALTER TABLE ceilings ADD COLUMN origin TEXT NOT NULL DEFAULT 'local';
    ALTER TABLE variant_sources ADD COLUMN origin TEXT NOT NULL DEFAULT 'unknown';
    ALTER TABLE variant_sources ADD COLUMN trust TEXT NOT NULL DEFAULT '';
    """,
    # 3 -> 4: candidates being evaluated right now, so that tuners sharing a database never
    # measure one twice (SQLDatabase.claim_evaluation). Rows live for one evaluation.
    """
    CREATE TABLE evaluation_claims (
        fingerprint TEXT NOT NULL,
        workload TEXT NOT NULL,
        candidate TEXT NOT NULL,
        owner TEXT NOT NULL,
        expires_at {real} NOT NULL,
        PRIMARY KEY (fingerprint, workload, candidate)
    );
    """,
]

SCHEMA_VERSION = len(_MIGRATION_TEMPLATES)


def migrations(dialect: Dialect) -> list[str]:
    """The migration scripts in ``dialect``'s words."""
    return [t.format(id=dialect.id, real=dialect.real, seq=dialect.seq) for t in _MIGRATION_TEMPLATES]


def statements(script: str) -> Iterator[str]:
    """Split a migration script into statements (``sqlite3.complete_statement`` knows where one
    ends, quotes included; the scripts are portable SQL, so this serves PostgreSQL too).

    ``executescript`` would be simpler but commits any open transaction first, and migrations
    must run inside the same transaction as the version bump.
    """
    buf: list[str] = []
    for line in script.splitlines(keepends=True):
        buf.append(line)
        text = "".join(buf)
        if sqlite3.complete_statement(text):
            if text.strip():
                yield text.strip()
            buf = []
    rest = "".join(buf).strip()
    if rest:
        yield rest


def _json_default(obj: Any) -> Any:
    """JSON fallback for numpy/torch scalars (``.item()``) and sets; anything else is an error."""
    item = getattr(obj, "item", None)
    if callable(item):
        return item()
    if isinstance(obj, set | frozenset):
        return sorted(obj)
    raise TypeError(f"{type(obj).__name__} is not JSON serialisable")


def dumps(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, default=_json_default)


def filters(**columns: str | None) -> tuple[str, tuple[str, ...]]:
    """A ``WHERE`` clause (column names are ours, never user input) and its arguments."""
    given = {k: v for k, v in columns.items() if v is not None}
    if not given:
        return "", ()
    return " WHERE " + " AND ".join(f"{k} = ?" for k in given), tuple(given.values())


def candidate_key(variant: str, source_hash: str, config_key: str | Mapping[str, Any]) -> str:
    """The claim table's name for one candidate of a workload."""
    return f"{variant}|{source_hash}|{config_key_of(config_key)}"


# What SQLDatabase needs of a connection: ``execute(sql, parameters)`` returning a cursor
# (``fetchone``, ``fetchall``, ``rowcount``) and ``executemany``, with ``?`` placeholders:
# ``sqlite3.Connection`` as it is, and the PostgreSQL backend's small adapter.
Connection = Any


class SQLDatabase(Database):
    """Every record method of :class:`~kernelsmith.db.Database`, in SQL both backends run.

    Subclasses set :attr:`path` (the file or URL, for messages), :attr:`dialect`, and implement
    :meth:`_read` and :meth:`_write`; the write transaction is committed when the block exits.
    """

    path: str
    dialect: Dialect

    @abstractmethod
    def _read(self) -> AbstractContextManager[Connection]:
        """A connection to read with; errors become DatabaseError."""

    @abstractmethod
    def _write(self) -> AbstractContextManager[Connection]:
        """One write transaction, committed on exit and rolled back on any error."""

    def _lock_claim(self, conn: Connection, key: str) -> None:
        """Serialise, inside the write transaction, everything that claims or releases ``key``
        (SQLite needs nothing: ``BEGIN IMMEDIATE`` already serialises every writer)."""

    # -- schema ------------------------------------------------------------------------------

    def _check_not_newer(self, version: int) -> None:
        if version > SCHEMA_VERSION:
            raise BrokenDatabaseError(
                f"database {self.path} has schema version {version}, newer than the "
                f"{SCHEMA_VERSION} this kernelsmith understands; upgrade kernelsmith or use "
                "another database", self.path
            )

    @staticmethod
    def _schema_version(conn: Connection) -> int:
        row = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        return int(row[0]) if row else 0

    def _apply_migrations(self, conn: Connection) -> None:
        """Inside the caller's migration transaction: bring the schema up to date."""
        version = self._schema_version(conn)  # another process may have migrated meanwhile
        self._check_not_newer(version)
        scripts = migrations(self.dialect)
        for target in range(version + 1, SCHEMA_VERSION + 1):
            for statement in statements(scripts[target - 1]):
                conn.execute(statement)
            logger.info("database %s: migrated schema to version %d", self.path, target)
        conn.execute(
            "INSERT INTO meta (key, value) VALUES ('schema_version', ?) "
            "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            (str(SCHEMA_VERSION),),
        )

    # -- fingerprints ------------------------------------------------------------------------

    def put_fingerprint(self, fp: Fingerprint) -> None:
        with self._write() as conn:
            conn.execute(
                "INSERT INTO fingerprints (hash, json) VALUES (?, ?) ON CONFLICT (hash) DO NOTHING",
                (fp.hash, dumps(fp.to_dict())),
            )

    def get_fingerprint(self, hash: str) -> Fingerprint | None:
        with self._read() as conn:
            row = conn.execute("SELECT json FROM fingerprints WHERE hash = ?", (hash,)).fetchone()
        return Fingerprint.from_dict(json.loads(row[0])) if row else None

    def fingerprints(self) -> list[Fingerprint]:
        with self._read() as conn:
            rows = conn.execute(f"SELECT json FROM fingerprints ORDER BY {self.dialect.order}").fetchall()
        return [Fingerprint.from_dict(json.loads(r[0])) for r in rows]

    # -- trials ------------------------------------------------------------------------------

    _TRIAL_COLUMNS = (
        "fingerprint, workload, op, variant, source_hash, config, status, error, metrics, "
        "created_at, origin"
    )

    @staticmethod
    def _trial_row(rec: TrialRecord) -> tuple[Any, ...]:
        return (
            rec.fingerprint, rec.workload, rec.op, rec.variant, rec.source_hash, rec.config_key,
            dumps(rec.config), rec.status, rec.error, dumps(rec.metrics), float(rec.created_at),
            rec.origin,
        )

    @staticmethod
    def _trial_from_row(row: tuple[Any, ...]) -> TrialRecord:
        fp, workload, op, variant, source_hash, config, status, error, metrics, created_at, origin = row
        return TrialRecord(
            fingerprint=fp, workload=workload, op=op, variant=variant, source_hash=source_hash,
            config=json.loads(config), status=status, error=error, metrics=json.loads(metrics),
            created_at=created_at, origin=origin,
        )

    _INSERT_TRIAL = (
        "INSERT INTO trials (fingerprint, workload, op, variant, source_hash, config_key, config, "
        "status, error, metrics, created_at, origin) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
    )

    def add_trial(self, rec: TrialRecord) -> None:
        row = self._trial_row(rec)  # serialise before taking the lock: a bad config fails alone
        with self._write() as conn:
            conn.execute(self._INSERT_TRIAL, row)

    def add_trials(self, recs: Iterable[TrialRecord]) -> int:
        rows = [self._trial_row(r) for r in recs]
        if rows:
            with self._write() as conn:
                conn.executemany(self._INSERT_TRIAL, rows)
        return len(rows)

    _LOCAL_TRIAL_WHERE = (
        "fingerprint = ? AND workload = ? AND variant = ? AND source_hash = ? AND config_key = ? AND origin = ? "
        "AND created_at >= ?"
    )

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
        with self._read() as conn:
            row = conn.execute(
                f"SELECT {self._TRIAL_COLUMNS} FROM trials WHERE {self._LOCAL_TRIAL_WHERE} ORDER BY id DESC LIMIT 1",
                (fingerprint, workload, variant, source_hash, config_key_of(config_key), LOCAL, float(since)),
            ).fetchone()
        return self._trial_from_row(row) if row else None

    def trials(
        self,
        fingerprint: str | None = None,
        workload: str | None = None,
        op: str | None = None,
    ) -> list[TrialRecord]:
        where, args = filters(fingerprint=fingerprint, workload=workload, op=op)
        with self._read() as conn:
            rows = conn.execute(
                f"SELECT {self._TRIAL_COLUMNS} FROM trials{where} ORDER BY id", args
            ).fetchall()
        return [self._trial_from_row(r) for r in rows]

    # -- claims ------------------------------------------------------------------------------

    def claim_evaluation(
        self,
        fingerprint: str,
        workload: str,
        variant: str,
        source_hash: str,
        config_key: str | Mapping[str, Any],
        *,
        owner: str,
        ttl_s: float = CLAIM_TTL_S,
        since: float = 0.0,
    ) -> bool:
        key = config_key_of(config_key)
        candidate = candidate_key(variant, source_hash, key)
        now = time.time()
        with self._write() as conn:
            self._lock_claim(conn, f"{fingerprint}|{workload}|{candidate}")
            # Checked in the claiming transaction: a trial stored (and its claim released)
            # just after the caller's find_trial is seen here, never measured again.
            measured = conn.execute(
                f"SELECT 1 FROM trials WHERE {self._LOCAL_TRIAL_WHERE} LIMIT 1",
                (fingerprint, workload, variant, source_hash, key, LOCAL, float(since)),
            ).fetchone()
            if measured:
                return False
            conn.execute(
                "DELETE FROM evaluation_claims WHERE fingerprint = ? AND workload = ? AND candidate = ? "
                "AND (expires_at < ? OR owner = ?)",
                (fingerprint, workload, candidate, now, owner),
            )
            cursor = conn.execute(
                "INSERT INTO evaluation_claims (fingerprint, workload, candidate, owner, expires_at) "
                "VALUES (?, ?, ?, ?, ?) ON CONFLICT (fingerprint, workload, candidate) DO NOTHING",
                (fingerprint, workload, candidate, owner, now + ttl_s),
            )
            return cursor.rowcount == 1

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
        candidate = candidate_key(variant, source_hash, config_key)
        with self._write() as conn:
            self._lock_claim(conn, f"{fingerprint}|{workload}|{candidate}")
            conn.execute(
                "DELETE FROM evaluation_claims WHERE fingerprint = ? AND workload = ? AND candidate = ? AND owner = ?",
                (fingerprint, workload, candidate, owner),
            )

    # -- decisions ---------------------------------------------------------------------------

    _DECISION_COLUMNS = (
        "fingerprint, workload, op, spec, winner, variant, source_hash, config, metrics, "
        "strategy, evaluations, created_at, origin, validated, validation_error"
    )

    def put_decision(self, rec: DecisionRecord) -> None:
        row = (
            rec.fingerprint, rec.workload, rec.op, dumps(rec.spec), rec.winner, rec.variant,
            rec.source_hash, dumps(rec.config), dumps(rec.metrics), rec.strategy,
            int(rec.evaluations), float(rec.created_at), rec.origin, int(bool(rec.validated)),
            rec.validation_error,
        )
        updates = ", ".join(f"{c} = excluded.{c}" for c in self._DECISION_COLUMNS.replace(" ", "").split(",")[2:])
        with self._write() as conn:
            # A claim never replaces a decision measured here (DESIGN.md rule 13).
            conn.execute(
                f"INSERT INTO decisions ({self._DECISION_COLUMNS}) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
                f"ON CONFLICT (fingerprint, workload) DO UPDATE SET {updates} "
                "WHERE excluded.origin = ? OR decisions.origin != ?",
                (*row, LOCAL, LOCAL),
            )

    @staticmethod
    def _decision_from_row(row: tuple[Any, ...]) -> DecisionRecord:
        (fp, workload, op, spec, winner, variant, source_hash, config, metrics, strategy,
         evaluations, created_at, origin, validated, validation_error) = row
        return DecisionRecord(
            fingerprint=fp, workload=workload, op=op, spec=json.loads(spec), winner=winner,
            variant=variant, source_hash=source_hash, config=json.loads(config),
            metrics=json.loads(metrics), strategy=strategy, evaluations=evaluations,
            created_at=created_at, origin=origin, validated=bool(validated),
            validation_error=validation_error,
        )

    def get_decision(self, fingerprint: str, workload: str) -> DecisionRecord | None:
        with self._read() as conn:
            row = conn.execute(
                f"SELECT {self._DECISION_COLUMNS} FROM decisions "
                "WHERE fingerprint = ? AND workload = ?",
                (fingerprint, workload),
            ).fetchone()
        return self._decision_from_row(row) if row else None

    def decisions(
        self, fingerprint: str | None = None, op: str | None = None
    ) -> list[DecisionRecord]:
        where, args = filters(fingerprint=fingerprint, op=op)
        with self._read() as conn:
            rows = conn.execute(
                f"SELECT {self._DECISION_COLUMNS} FROM decisions{where} ORDER BY {self.dialect.order}", args
            ).fetchall()
        return [self._decision_from_row(r) for r in rows]

    # -- ceilings ----------------------------------------------------------------------------

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
        row = (
            fingerprint, name, float(value), dumps(detail or {}),
            time.time() if measured_at is None else float(measured_at), origin,
        )
        with self._write() as conn:
            conn.execute(
                "INSERT INTO ceilings (fingerprint, name, value, detail, measured_at, origin) "
                "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (fingerprint, name) DO UPDATE SET "
                "value = excluded.value, detail = excluded.detail, "
                "measured_at = excluded.measured_at, origin = excluded.origin "
                "WHERE excluded.origin = ? OR ceilings.origin != ?",
                (*row, LOCAL, LOCAL),
            )

    def get_ceiling(self, fingerprint: str, name: str) -> float | None:
        with self._read() as conn:
            row = conn.execute(
                "SELECT value FROM ceilings WHERE fingerprint = ? AND name = ? AND origin = ?",
                (fingerprint, name, LOCAL),
            ).fetchone()
        return float(row[0]) if row else None

    def ceilings(self, fingerprint: str | None = None) -> list[Ceiling]:
        where, args = filters(fingerprint=fingerprint)
        with self._read() as conn:
            rows = conn.execute(
                f"SELECT fingerprint, name, value, detail, measured_at, origin FROM ceilings{where} "
                f"ORDER BY {self.dialect.order}", args
            ).fetchall()
        return [Ceiling(fp, name, float(value), json.loads(detail), measured_at, origin)
                for fp, name, value, detail, measured_at, origin in rows]

    # -- variant sources ---------------------------------------------------------------------

    def put_variant_source(self, op: str, source: str, *, origin: str = LOCAL, trusted: bool | None = None) -> str:
        source_hash = variant_source_hash(source)
        trust = source_token(source_hash) if (origin == LOCAL if trusted is None else trusted) else ""
        with self._write() as conn:
            # Storing trusted text again (it passed the harness here) trusts the stored copy;
            # storing untrusted text never takes trust away.
            conn.execute(
                "INSERT INTO variant_sources (source_hash, op, source, created_at, origin, trust) "
                "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (source_hash) DO UPDATE SET "
                "trust = excluded.trust, origin = excluded.origin WHERE excluded.trust != ''",
                (source_hash, op, source, time.time(), origin, trust),
            )
        return source_hash

    def get_variant_source(self, source_hash: str) -> str | None:
        with self._read() as conn:
            row = conn.execute(
                "SELECT source FROM variant_sources WHERE source_hash = ?", (source_hash,)
            ).fetchone()
        return str(row[0]) if row else None

    _SOURCE_COLUMNS = "source_hash, op, source, created_at, origin, trust"

    @staticmethod
    def _source_from_row(row: tuple[Any, ...]) -> VariantSource:
        """A stored source; trusted only when this user's token verifies *and* the text still
        hashes to its name: the token signs the hash, so text edited in a shared database (by
        anyone who can write to it) must not inherit the trust given to the original."""
        source_hash, op, text, created_at, origin, trust = row
        intact = variant_source_hash(text) == source_hash
        return VariantSource(source_hash, op, text, created_at, origin, intact and token_trusts(trust, source_hash))

    def variant_source(self, source_hash: str) -> VariantSource | None:
        with self._read() as conn:
            row = conn.execute(
                f"SELECT {self._SOURCE_COLUMNS} FROM variant_sources WHERE source_hash = ?", (source_hash,)
            ).fetchone()
        return self._source_from_row(row) if row else None

    def variant_sources(self, op: str | None = None) -> list[VariantSource]:
        where, args = filters(op=op)
        with self._read() as conn:
            rows = conn.execute(
                f"SELECT {self._SOURCE_COLUMNS} FROM variant_sources{where} ORDER BY {self.dialect.order}", args
            ).fetchall()
        return [self._source_from_row(r) for r in rows]

    def trust_variant_source(self, source_hash: str) -> bool:
        with self._write() as conn:
            cursor = conn.execute(
                "UPDATE variant_sources SET trust = ? WHERE source_hash = ?", (source_token(source_hash), source_hash)
            )
        return cursor.rowcount > 0

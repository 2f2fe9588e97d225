"""The SQLite implementation of :class:`~kernelsmith.db.Database` (stdlib ``sqlite3`` only).

Why SQLite: one file per user, no server, and safe concurrent use by several tuning processes
on one machine. Concurrency comes from WAL journal mode (readers never block the writer) plus a
busy timeout (a second writer waits for the lock instead of failing). Every write is one short
``BEGIN IMMEDIATE`` ... ``COMMIT`` transaction: taking the write lock up front means a waiting
writer never has to upgrade a read lock (the classic SQLITE_BUSY deadlock), and committing at
once means a crash loses nothing that was already reported stored.

The schema is versioned in a ``meta`` table. :data:`MIGRATIONS` is a list of SQL scripts; the
script at index ``i`` moves the schema from version ``i`` to ``i + 1``. Opening a database
applies the missing scripts in one transaction, and refuses a database written by a newer
kernelsmith (whose schema this code cannot know) rather than misreading it.
"""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from kernelsmith.db._base import BrokenDatabaseError, Ceiling, Database, DatabaseError, config_key_of
from kernelsmith.db.records import (
    LOCAL,
    DecisionRecord,
    Fingerprint,
    TrialRecord,
    VariantSource,
    variant_source_hash,
)
from kernelsmith.db.trust import source_token, token_trusts

logger = logging.getLogger(__name__)

MEMORY = ":memory:"

# How long a writer waits for another process's write lock before giving up (milliseconds).
# Tuning writes are tiny, so a long wait only ever happens when something is badly stuck.
BUSY_TIMEOUT_MS = 30_000

# MIGRATIONS[i] moves the schema from version i to version i + 1. Append only; never edit a
# released entry (databases in the field have already run it).
MIGRATIONS: list[str] = [
    # 0 -> 1: the initial schema.
    """
    CREATE TABLE fingerprints (
        hash TEXT PRIMARY KEY,
        json TEXT NOT NULL
    );
    CREATE TABLE trials (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
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
        created_at REAL NOT NULL
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
        created_at REAL NOT NULL,
        PRIMARY KEY (fingerprint, workload)
    );
    CREATE TABLE ceilings (
        fingerprint TEXT NOT NULL,
        name TEXT NOT NULL,
        value REAL NOT NULL,
        detail TEXT NOT NULL,
        measured_at REAL NOT NULL,
        PRIMARY KEY (fingerprint, name)
    );
    """,
    # 1 -> 2: the source of kernels written outside the package (coding agent, LLM), by hash.
    """
    CREATE TABLE variant_sources (
        source_hash TEXT PRIMARY KEY,
        op TEXT NOT NULL,
        source TEXT NOT NULL,
        created_at REAL NOT NULL
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
]

SCHEMA_VERSION = len(MIGRATIONS)

# Connections abandoned in a forked child. A connection must not be used across fork(), and
# closing it in the child could disturb the parent's locks, so the child keeps the object alive
# (never closed, never collected) and opens its own.
_ABANDONED: list[sqlite3.Connection] = []


def _statements(script: str) -> Iterator[str]:
    """Split a migration script into statements.

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


def _error(action: str, path: str, exc: sqlite3.Error) -> DatabaseError:
    """The DatabaseError for an sqlite3 failure: :class:`BrokenDatabaseError` when the file
    itself is the problem (not SQLite, corrupted, truncated, unreadable, a directory), a plain
    DatabaseError when it may pass (locked, busy) or is a bug of ours."""
    text = str(exc)
    transient = "locked" in text or "busy" in text
    ours = isinstance(exc, sqlite3.IntegrityError | sqlite3.ProgrammingError | sqlite3.InterfaceError)
    kind = DatabaseError if transient or ours or not isinstance(exc, sqlite3.DatabaseError) else BrokenDatabaseError
    return kind(f"cannot {action} database {path}: {text}", path)


def _json_default(obj: Any) -> Any:
    """JSON fallback for numpy/torch scalars (``.item()``) and sets; anything else is an error."""
    item = getattr(obj, "item", None)
    if callable(item):
        return item()
    if isinstance(obj, set | frozenset):
        return sorted(obj)
    raise TypeError(f"{type(obj).__name__} is not JSON serialisable")


def _dumps(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, default=_json_default)


class SQLiteDatabase(Database):
    """A :class:`Database` in one SQLite file (or ``":memory:"``, private to this object).

    One connection per object and per process, guarded by a lock so threads may share the
    object; after ``fork()`` the child transparently opens its own connection.
    """

    def __init__(self, path: str | os.PathLike[str], *, timeout_ms: int = BUSY_TIMEOUT_MS) -> None:
        path_str = os.fspath(path)
        self.path: str = path_str if path_str == MEMORY else str(Path(path_str).expanduser())
        self._timeout_ms = timeout_ms
        self._lock = threading.RLock()
        self._conn: sqlite3.Connection | None = None
        self._pid = os.getpid()
        self._closed = False
        if self.path != MEMORY:
            parent = Path(self.path).parent
            try:
                parent.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise DatabaseError(
                    f"cannot create the directory for database {self.path}: {e.strerror or e}", self.path
                ) from e
        self._connection()  # open (and migrate) now, so a bad path fails here, not later

    def __repr__(self) -> str:
        return f"SQLiteDatabase({self.path!r})"

    # -- connection management ---------------------------------------------------------------

    def _connect(self) -> sqlite3.Connection:
        """Open and set up a connection, retrying while another process holds the lock.

        Switching to WAL and creating the schema take locks that SQLite's busy timeout does not
        always wait for (two processes opening a brand-new file at once get "database is
        locked" at once), so set-up is retried with backoff until the timeout.
        """
        deadline = time.monotonic() + self._timeout_ms / 1000
        delay = 0.01
        while True:
            try:
                return self._connect_once()
            except DatabaseError as e:
                locked = "locked" in str(e) or "busy" in str(e)
                if not locked or time.monotonic() + delay > deadline:
                    raise
                time.sleep(delay)
                delay = min(delay * 2, 0.5)

    def _connect_once(self) -> sqlite3.Connection:
        try:
            # isolation_level=None: no implicit transactions; every write opens its own.
            conn = sqlite3.connect(
                self.path,
                timeout=self._timeout_ms / 1000,
                isolation_level=None,
                check_same_thread=False,
            )
        except sqlite3.Error as e:
            raise _error("open", self.path, e) from e
        try:
            conn.execute(f"PRAGMA busy_timeout = {int(self._timeout_ms)}")
            if self.path != MEMORY:
                mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
                if str(mode).lower() != "wal":
                    logger.warning(
                        "database %s: WAL journal mode unavailable (got %r); concurrent "
                        "tuning processes will serialise", self.path, mode)
            conn.execute("PRAGMA synchronous = FULL")
            self._migrate(conn)
        except DatabaseError:
            conn.close()
            raise
        except sqlite3.Error as e:
            conn.close()
            raise _error("open", self.path, e) from e
        logger.debug("opened database %s (schema version %d)", self.path, SCHEMA_VERSION)
        return conn

    def _migrate(self, conn: sqlite3.Connection) -> None:
        conn.execute("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
        version = self._schema_version(conn)
        if version == SCHEMA_VERSION:
            return  # the common case: no write lock taken at all
        self._check_not_newer(version)
        conn.execute("BEGIN IMMEDIATE")
        try:
            version = self._schema_version(conn)  # another process may have migrated meanwhile
            self._check_not_newer(version)
            for target in range(version + 1, SCHEMA_VERSION + 1):
                for statement in _statements(MIGRATIONS[target - 1]):
                    conn.execute(statement)
                logger.info("database %s: migrated schema to version %d", self.path, target)
            conn.execute(
                "INSERT INTO meta (key, value) VALUES ('schema_version', ?) "
                "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                (str(SCHEMA_VERSION),),
            )
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise

    @staticmethod
    def _schema_version(conn: sqlite3.Connection) -> int:
        row = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        return int(row[0]) if row else 0

    def _check_not_newer(self, version: int) -> None:
        if version > SCHEMA_VERSION:
            raise BrokenDatabaseError(
                f"database {self.path} has schema version {version}, newer than the "
                f"{SCHEMA_VERSION} this kernelsmith understands; upgrade kernelsmith or use "
                "another database", self.path
            )

    def _connection(self) -> sqlite3.Connection:
        if self._closed:
            raise DatabaseError(f"database {self.path} is closed", self.path)
        if self._conn is not None and os.getpid() != self._pid and self.path != MEMORY:
            _ABANDONED.append(self._conn)
            self._conn = None
        if self._conn is None:
            self._conn = self._connect()
            self._pid = os.getpid()
        return self._conn

    @contextmanager
    def _read(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            conn = self._connection()
            try:
                yield conn
            except sqlite3.Error as e:
                raise _error("read", self.path, e) from e

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One short write transaction, committed on exit (rolled back on any error)."""
        with self._lock:
            conn = self._connection()
            try:
                conn.execute("BEGIN IMMEDIATE")
                try:
                    yield conn
                except BaseException:
                    conn.execute("ROLLBACK")
                    raise
                conn.execute("COMMIT")
            except sqlite3.Error as e:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise _error("write", self.path, e) from e

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                if os.getpid() == self._pid:
                    self._conn.close()
                else:
                    _ABANDONED.append(self._conn)
                self._conn = None
            self._closed = True

    # -- fingerprints ------------------------------------------------------------------------

    def put_fingerprint(self, fp: Fingerprint) -> None:
        with self._write() as conn:
            conn.execute(
                "INSERT INTO fingerprints (hash, json) VALUES (?, ?) ON CONFLICT (hash) DO NOTHING",
                (fp.hash, _dumps(fp.to_dict())),
            )

    def get_fingerprint(self, hash: str) -> Fingerprint | None:
        with self._read() as conn:
            row = conn.execute("SELECT json FROM fingerprints WHERE hash = ?", (hash,)).fetchone()
        return Fingerprint.from_dict(json.loads(row[0])) if row else None

    def fingerprints(self) -> list[Fingerprint]:
        with self._read() as conn:
            rows = conn.execute("SELECT json FROM fingerprints ORDER BY rowid").fetchall()
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
            _dumps(rec.config), rec.status, rec.error, _dumps(rec.metrics), float(rec.created_at),
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

    def find_trial(
        self,
        fingerprint: str,
        workload: str,
        variant: str,
        source_hash: str,
        config_key: str | Mapping[str, Any],
    ) -> TrialRecord | None:
        with self._read() as conn:
            row = conn.execute(
                f"SELECT {self._TRIAL_COLUMNS} FROM trials WHERE fingerprint = ? AND workload = ? "
                "AND variant = ? AND source_hash = ? AND config_key = ? AND origin = ? "
                "ORDER BY id DESC LIMIT 1",
                (fingerprint, workload, variant, source_hash, config_key_of(config_key), LOCAL),
            ).fetchone()
        return self._trial_from_row(row) if row else None

    def trials(
        self,
        fingerprint: str | None = None,
        workload: str | None = None,
        op: str | None = None,
    ) -> list[TrialRecord]:
        where, args = _filters(fingerprint=fingerprint, workload=workload, op=op)
        with self._read() as conn:
            rows = conn.execute(
                f"SELECT {self._TRIAL_COLUMNS} FROM trials{where} ORDER BY id", args
            ).fetchall()
        return [self._trial_from_row(r) for r in rows]

    # -- decisions ---------------------------------------------------------------------------

    _DECISION_COLUMNS = (
        "fingerprint, workload, op, spec, winner, variant, source_hash, config, metrics, "
        "strategy, evaluations, created_at, origin, validated, validation_error"
    )

    def put_decision(self, rec: DecisionRecord) -> None:
        row = (
            rec.fingerprint, rec.workload, rec.op, _dumps(rec.spec), rec.winner, rec.variant,
            rec.source_hash, _dumps(rec.config), _dumps(rec.metrics), rec.strategy,
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
        where, args = _filters(fingerprint=fingerprint, op=op)
        with self._read() as conn:
            rows = conn.execute(
                f"SELECT {self._DECISION_COLUMNS} FROM decisions{where} ORDER BY rowid", args
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
            fingerprint, name, float(value), _dumps(detail or {}),
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
        where, args = _filters(fingerprint=fingerprint)
        with self._read() as conn:
            rows = conn.execute(
                f"SELECT fingerprint, name, value, detail, measured_at, origin FROM ceilings{where} "
                "ORDER BY rowid", args
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
        source_hash, op, text, created_at, origin, trust = row
        return VariantSource(source_hash, op, text, created_at, origin, token_trusts(trust, source_hash))

    def variant_source(self, source_hash: str) -> VariantSource | None:
        with self._read() as conn:
            row = conn.execute(
                f"SELECT {self._SOURCE_COLUMNS} FROM variant_sources WHERE source_hash = ?", (source_hash,)
            ).fetchone()
        return self._source_from_row(row) if row else None

    def variant_sources(self, op: str | None = None) -> list[VariantSource]:
        where, args = _filters(op=op)
        with self._read() as conn:
            rows = conn.execute(
                f"SELECT {self._SOURCE_COLUMNS} FROM variant_sources{where} ORDER BY rowid", args
            ).fetchall()
        return [self._source_from_row(r) for r in rows]

    def trust_variant_source(self, source_hash: str) -> bool:
        with self._write() as conn:
            cursor = conn.execute(
                "UPDATE variant_sources SET trust = ? WHERE source_hash = ?", (source_token(source_hash), source_hash)
            )
        return cursor.rowcount > 0


def _filters(**columns: str | None) -> tuple[str, tuple[str, ...]]:
    """A ``WHERE`` clause (column names are ours, never user input) and its arguments."""
    given = {k: v for k, v in columns.items() if v is not None}
    if not given:
        return "", ()
    return " WHERE " + " AND ".join(f"{k} = ?" for k in given), tuple(given.values())

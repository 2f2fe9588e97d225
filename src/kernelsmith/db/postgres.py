"""The PostgreSQL implementation of :class:`~kernelsmith.db.Database`: one database for a team.

Why a server: several tuners on several machines share what each measured (a decision made by
one is served by the others) and never measure the same candidate twice (claims, see
:mod:`kernelsmith.db._sql`). The schema, migrations and record semantics are SQLite's, from the
same SQL (:class:`~kernelsmith.db._sql.SQLDatabase`); only the connection differs.

- The driver is psycopg 3, an optional dependency (``pip install -e '.[postgres]'``),
  imported only when a ``postgresql://`` URL is opened.
- The connection runs in autocommit mode: every read is its own statement, every write one
  explicit transaction, committed when the method returns. ``INSERT ... ON CONFLICT`` makes the
  upserts atomic under READ COMMITTED; migrations run under a transaction-scoped advisory lock,
  so tuners opening a fresh database at once create the schema exactly once; claims of one
  candidate serialise on an advisory lock named by the candidate.
- One connection per object and per process, behind a lock so threads may share the object;
  after ``fork()`` (or a dropped connection) the next call opens a new one.
- The server is reached when the database is opened, with a short connect timeout, so an
  unreachable URL is a one-line :class:`~kernelsmith.db.DatabaseError` before any tuning starts;
  nothing falls back to a local file.
- A password in the URL never appears in messages (:func:`redact`).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from kernelsmith.db._base import DatabaseError
from kernelsmith.db._sql import POSTGRES, SCHEMA_VERSION, SQLDatabase

logger = logging.getLogger(__name__)

SCHEMES = ("postgresql://", "postgres://")
CONNECT_TIMEOUT_S = 10
# The advisory lock every migration takes (any constant; "ksmigrate" in hex, within int64).
_MIGRATION_LOCK = 0x6B736D696772

# Connections inherited across fork(): freeing one in the child would end the parent's session
# (libpq says goodbye to the server), so the child keeps them alive and opens its own.
_ABANDONED: list[Any] = []


def is_postgres_url(location: str) -> bool:
    return location.startswith(SCHEMES)


def redact(url: str) -> str:
    """``url`` with any password replaced by ``***``, for messages and logs."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)
    user = netloc[0].split(":", 1)[0]
    return urlunsplit(parts._replace(netloc=f"{user}:***@{netloc[1]}"))


def _psycopg() -> Any:
    try:
        import psycopg
    except ImportError:
        from kernelsmith.extras import missing

        raise DatabaseError(missing("a postgresql:// database", "postgres")) from None
    return psycopg


def _one_line(exc: BaseException) -> str:
    """libpq's messages span lines (a hint under the error); the CLI prints one."""
    return " ".join(str(exc).split()) or type(exc).__name__


class _Connection:
    """A psycopg connection with the sqlite3 calling convention the shared SQL uses: ``?``
    placeholders (the queries hold no other ``?`` and no ``%``), ``execute`` returning a cursor."""

    def __init__(self, conn: Any) -> None:
        self.raw = conn

    def execute(self, sql: str, parameters: Any = ()) -> Any:
        return self.raw.execute(sql.replace("?", "%s"), parameters or None)

    def executemany(self, sql: str, rows: Iterable[Any]) -> Any:
        with self.raw.cursor() as cursor:
            cursor.executemany(sql.replace("?", "%s"), list(rows))
            return cursor


class PostgresDatabase(SQLDatabase):
    """A :class:`~kernelsmith.db.Database` in a PostgreSQL database named by a URL
    (``postgresql://user@host:5432/dbname``; libpq's parameters and environment apply)."""

    dialect = POSTGRES

    def __init__(self, url: str, *, connect_timeout_s: int = CONNECT_TIMEOUT_S) -> None:
        self.url = url
        self.path = redact(url)
        self._connect_timeout_s = connect_timeout_s
        self._lock = threading.RLock()
        self._conn: _Connection | None = None
        self._pid = os.getpid()
        self._closed = False
        self._errors = _psycopg().Error
        self._connection()  # connect (and migrate) now: an unreachable server fails here

    def __repr__(self) -> str:
        return f"PostgresDatabase({self.path!r})"

    # -- connection management ---------------------------------------------------------------

    def _connect(self) -> _Connection:
        psycopg = _psycopg()
        try:
            raw = psycopg.connect(
                self.url, autocommit=True, connect_timeout=self._connect_timeout_s, application_name="kernelsmith"
            )
        except psycopg.Error as e:
            raise DatabaseError(f"cannot connect to database {self.path}: {_one_line(e)}") from e
        conn = _Connection(raw)
        try:
            self._migrate(conn)
        except BaseException:
            raw.close()
            raise
        logger.debug("opened database %s (schema version %d)", self.path, SCHEMA_VERSION)
        return conn

    def _migrate(self, conn: _Connection) -> None:
        try:
            with conn.raw.transaction():
                # The lock first: CREATE TABLE IF NOT EXISTS is not safe against a concurrent one.
                conn.execute("SELECT pg_advisory_xact_lock(?)", (_MIGRATION_LOCK,))
                conn.execute("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
                if self._schema_version(conn) != SCHEMA_VERSION:
                    self._apply_migrations(conn)
        except self._errors as e:
            raise DatabaseError(f"cannot set up database {self.path}: {_one_line(e)}") from e

    def _connection(self) -> _Connection:
        if self._closed:
            raise DatabaseError(f"database {self.path} is closed")
        if self._conn is not None and os.getpid() != self._pid:
            _ABANDONED.append(self._conn)  # the parent's session: never used, nor closed, here
            self._conn = None
        if self._conn is not None and (self._conn.raw.closed or self._conn.raw.broken):
            logger.warning("database %s: the connection was lost; reconnecting", self.path)
            self._conn = None
        if self._conn is None:
            self._conn = self._connect()
            self._pid = os.getpid()
        return self._conn

    def _fail(self, action: str, exc: BaseException) -> DatabaseError:
        return DatabaseError(f"cannot {action} database {self.path}: {_one_line(exc)}")

    @contextmanager
    def _read(self) -> Iterator[_Connection]:
        with self._lock:
            conn = self._connection()
            try:
                yield conn
            except self._errors as e:
                raise self._fail("read", e) from e

    @contextmanager
    def _write(self) -> Iterator[_Connection]:
        """One transaction, committed on exit (rolled back on any error)."""
        with self._lock:
            conn = self._connection()
            try:
                with conn.raw.transaction():
                    yield conn
            except self._errors as e:
                raise self._fail("write", e) from e

    def _lock_claim(self, conn: Any, key: str) -> None:
        # Every statement after this one sees what the last holder of the lock committed
        # (READ COMMITTED takes a new snapshot per statement), so a trial stored and its claim
        # released by another tuner are both visible, or neither is.
        conn.execute("SELECT pg_advisory_xact_lock(hashtextextended(?, 0))", (key,))

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                if os.getpid() == self._pid:
                    self._conn.raw.close()
                else:
                    _ABANDONED.append(self._conn)
            self._conn = None
            self._closed = True

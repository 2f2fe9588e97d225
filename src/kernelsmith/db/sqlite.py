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

import logging
import os
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from kernelsmith.db._base import BrokenDatabaseError, DatabaseError
from kernelsmith.db._sql import SCHEMA_VERSION, SQLITE, SQLDatabase, migrations, statements

logger = logging.getLogger(__name__)

MEMORY = ":memory:"

# How long a writer waits for another process's write lock before giving up (milliseconds).
# Tuning writes are tiny, so a long wait only ever happens when something is badly stuck.
BUSY_TIMEOUT_MS = 30_000

# The schema is shared with PostgreSQL (kernelsmith.db._sql); these are its SQLite words.
MIGRATIONS: list[str] = migrations(SQLITE)

# Connections abandoned in a forked child. A connection must not be used across fork(), and
# closing it in the child could disturb the parent's locks, so the child keeps the object alive
# (never closed, never collected) and opens its own.
_ABANDONED: list[sqlite3.Connection] = []


_statements = statements  # the name tests and older callers use


def _error(action: str, path: str, exc: sqlite3.Error) -> DatabaseError:
    """The DatabaseError for an sqlite3 failure: :class:`BrokenDatabaseError` when the file
    itself is the problem (not SQLite, corrupted, truncated, unreadable, a directory), a plain
    DatabaseError when it may pass (locked, busy) or is a bug of ours."""
    text = str(exc)
    transient = "locked" in text or "busy" in text
    ours = isinstance(exc, sqlite3.IntegrityError | sqlite3.ProgrammingError | sqlite3.InterfaceError)
    kind = DatabaseError if transient or ours or not isinstance(exc, sqlite3.DatabaseError) else BrokenDatabaseError
    return kind(f"cannot {action} database {path}: {text}", path)


class SQLiteDatabase(SQLDatabase):
    """A :class:`Database` in one SQLite file (or ``":memory:"``, private to this object).

    One connection per object and per process, guarded by a lock so threads may share the
    object; after ``fork()`` the child transparently opens its own connection.
    """

    dialect = SQLITE

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
            self._apply_migrations(conn)
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise

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

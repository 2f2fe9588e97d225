"""Where tuning results live: fingerprints, trials (failures included), decisions, ceilings, and
the source of kernels written outside the package.

Use :func:`open_database` to get one. It accepts nothing (the default per-user database), a
path, a ``sqlite:///path`` URL, ``":memory:"``, a ``postgresql://`` (or ``postgres://``) URL of
a database a team shares (:mod:`kernelsmith.db.postgres`, needs ``kernelsmith[postgres]``), or
an already open :class:`Database`, so every entry point (CLI, Python API, tests) can take the
same ``db=`` argument.

The default location is ``$KERNELSMITH_DB`` if set, else
``$XDG_CACHE_HOME/kernelsmith/kernelsmith.db`` (``~/.cache/kernelsmith/kernelsmith.db``): a
cache, because everything in it can be measured again.

What is imported is a claim (DESIGN.md rule 13): records carry their ``origin``, imported
decisions are served only once validated here (:mod:`kernelsmith.db.claims`), and kernel sources
only once this user trusts them (:mod:`kernelsmith.db.trust`). A file that cannot be used raises
:class:`BrokenDatabaseError`; the front doors then warn once (:func:`warn_unusable_database`) and
run the user's code, and :mod:`kernelsmith.db.health` checks the file or moves it aside.
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path

from kernelsmith import settings
from kernelsmith.db._base import BrokenDatabaseError, Ceiling, Database, DatabaseError, config_key_of, repair_hint
from kernelsmith.db.fingerprint import current_fingerprint
from kernelsmith.db.postgres import is_postgres_url, redact
from kernelsmith.db.records import DecisionRecord, Fingerprint, TrialRecord, VariantSource, variant_source_hash
from kernelsmith.db.sqlite import MEMORY, SCHEMA_VERSION, SQLiteDatabase

__all__ = [
    "SCHEMA_VERSION",
    "BrokenDatabaseError",
    "Ceiling",
    "Database",
    "DatabaseError",
    "DecisionRecord",
    "Fingerprint",
    "SQLiteDatabase",
    "TrialRecord",
    "VariantSource",
    "config_key_of",
    "current_fingerprint",
    "database_path",
    "default_db_path",
    "open_database",
    "repair_hint",
    "variant_source_hash",
    "warn_unusable_database",
]

logger = logging.getLogger(__name__)

ENV_VAR = "KERNELSMITH_DB"
_SQLITE_SCHEME = "sqlite:"


def _location_to_path(location: str) -> str:
    """A path (or ``":memory:"``) from a path or a ``sqlite:`` URL.

    URLs follow SQLAlchemy's convention, which Optuna users know: ``sqlite:///rel/x.db`` is
    relative, ``sqlite:////abs/x.db`` absolute, ``sqlite://`` and ``sqlite:///:memory:`` are
    in memory.
    """
    if location.startswith(_SQLITE_SCHEME):
        rest = location[len(_SQLITE_SCHEME):]
        if rest in ("", "//", "///:memory:", "//:memory:"):
            return MEMORY
        if not rest.startswith("///"):
            raise DatabaseError(
                f"unsupported database URL {location!r}: use sqlite:///relative/path or "
                "sqlite:////absolute/path"
            )
        rest = rest[3:]
        if not rest:
            raise DatabaseError(f"database URL {location!r} names no file")
        return rest
    if is_postgres_url(location):
        return location
    if "://" in location:
        raise DatabaseError(
            f"unsupported database URL {redact(location)!r}: use a path, sqlite:///path or postgresql://host/db"
        )
    return location


def default_db_path() -> Path:
    """``$KERNELSMITH_DB`` if set (a path or ``sqlite:`` URL), else the per-user cache file.
    (A ``postgresql://`` URL in ``$KERNELSMITH_DB`` is no path: :func:`database_path` gives it.)"""
    env = settings.get(ENV_VAR)
    if env:
        return Path(_location_to_path(env)).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME", "").strip()
    base = Path(cache).expanduser() if cache else Path.home() / ".cache"
    return base / "kernelsmith" / "kernelsmith.db"


def database_path(location: str | os.PathLike[str] | None = None) -> str:
    """The file (or ``":memory:"``, or the ``postgresql://`` URL) that :func:`open_database`
    would open for ``location``, without opening it: for commands that inspect or move a file
    that may be broken."""
    if location is None:
        env = settings.get(ENV_VAR)
        if is_postgres_url(env):
            return env
        return str(default_db_path())
    return _location_to_path(os.fspath(location))


def open_database(location: str | os.PathLike[str] | Database | None = None) -> Database:
    """The database at ``location``; see the module docstring for the accepted forms.

    A :class:`Database` is returned as is (the caller keeps ownership); anything else opens a
    new :class:`SQLiteDatabase` (or :class:`~kernelsmith.db.postgres.PostgresDatabase`) that the
    caller should close (it is a context manager). A server that cannot be reached raises
    :class:`DatabaseError` here; nothing is ever written elsewhere instead.
    """
    if isinstance(location, Database):
        return location
    path = database_path(location)
    if is_postgres_url(path):
        from kernelsmith.db.postgres import PostgresDatabase

        logger.debug("opening database %s", redact(path))
        return PostgresDatabase(path)
    logger.debug("opening database %s", path)
    return SQLiteDatabase(path)


# Paths already warned about in this process: a broken cache is reported once, not per call.
_WARNED: set[str] = set()
_WARNED_LOCK = threading.Lock()


def warn_unusable_database(exc: DatabaseError) -> None:
    """Log, once per database file and process, that the front doors run the user's own code
    because the database cannot be used, naming the file and the fix.

    The front doors (decorator, ``kernelsmith::kernel``, compile backend) call this instead of
    letting a corrupted or unreadable cache break the user's program: everything in the cache
    can be measured again, so a broken one costs speed, never correctness or a crash.
    """
    where = exc.path or str(exc)
    with _WARNED_LOCK:
        if where in _WARNED:
            return
        _WARNED.add(where)
    logger.warning("tuned kernels are off and your own code runs: %s; %s", exc, repair_hint(exc.path))

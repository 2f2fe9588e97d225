"""Checking a database file, and moving a broken one aside (``kernelsmith db check`` / ``reset``).

The database is a cache: everything in it can be measured again. So a file that is truncated,
overwritten, a directory, unreadable or from a newer kernelsmith is never "repaired" in place
(a guess at what a damaged file meant could serve a wrong kernel), and never deleted (it may
hold results someone wants to recover, or evidence of what broke it): :func:`check_database`
says what is wrong without writing anything, and :func:`reset_database` renames the file to
``<name>.broken-<timestamp>`` and starts an empty one.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

from kernelsmith.db.postgres import is_postgres_url, redact
from kernelsmith.db.sqlite import MEMORY, SCHEMA_VERSION, SQLiteDatabase

logger = logging.getLogger(__name__)

TABLES = ("fingerprints", "trials", "decisions", "ceilings", "variant_sources")
# SQLite's companion files, moved with the database so that nothing it wrote is lost.
SIDECARS = ("-wal", "-shm", "-journal")


@dataclass
class HealthReport:
    """What :func:`check_database` found. ``ok`` is False when kernelsmith cannot use the file."""

    path: str
    exists: bool = True
    schema_version: int | None = None
    counts: dict[str, int] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_dict(self) -> dict[str, object]:
        return {"path": self.path, "ok": self.ok, "exists": self.exists, "schema_version": self.schema_version,
                "counts": self.counts, "problems": self.problems, "notes": self.notes}


def check_database(path: str | os.PathLike[str]) -> HealthReport:
    """Check the database file at ``path`` without writing to it: that it is a readable SQLite
    file, SQLite's integrity check, the schema version, and how many records each table holds
    (plus the claims not validated here and the kernel sources not trusted by this user)."""
    location = os.fspath(path)
    if is_postgres_url(location):
        return _check_server(location)
    report = HealthReport(location)
    if location == MEMORY:
        report.notes.append("an in-memory database: nothing to check")
        return report
    file = Path(location)
    if not file.exists():
        report.exists = False
        report.notes.append("no database yet: an empty one is created on first use")
        return report
    if file.is_dir():
        report.problems.append("is a directory, not a database file")
        return report
    if not os.access(file, os.R_OK):
        report.problems.append("is not readable by this user")
        return report
    if file.stat().st_size == 0:
        report.notes.append("empty: the schema is created on first use")
        return report
    try:
        conn = sqlite3.connect(f"file:{quote(str(file))}?mode=ro", uri=True)
    except sqlite3.Error as exc:
        report.problems.append(f"cannot be opened: {exc}")
        return report
    try:
        _inspect(conn, report)
    except sqlite3.Error as exc:
        report.problems.append(f"is not a readable SQLite database: {exc}")
    finally:
        conn.close()
    return report


def _check_server(url: str) -> HealthReport:
    """A PostgreSQL database: reachable, schema not newer, and its counts (read through the
    database's own API; the server keeps its own integrity)."""
    from kernelsmith.db import DatabaseError
    from kernelsmith.db.postgres import PostgresDatabase

    report = HealthReport(redact(url))
    try:
        with PostgresDatabase(url) as db:
            report.schema_version = SCHEMA_VERSION
            report.counts = {"fingerprints": len(db.fingerprints()), "trials": len(db.trials()),
                             "decisions": len(db.decisions()), "ceilings": len(db.ceilings())}
            sources = db.variant_sources()
            report.counts["variant_sources"] = len(sources)
            report.counts["unvalidated_decisions"] = sum(not d.validated for d in db.decisions())
            report.counts["untrusted_sources"] = sum(not v.trusted for v in sources)
    except DatabaseError as exc:
        report.problems.append(str(exc))
    return report


def _inspect(conn: sqlite3.Connection, report: HealthReport) -> None:
    integrity = [str(row[0]) for row in conn.execute("PRAGMA integrity_check(20)")]
    if integrity != ["ok"]:
        report.problems.append("fails SQLite's integrity check: " + "; ".join(integrity[:5]))
        return
    tables = {str(row[0]) for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    if "meta" not in tables:
        report.problems.append("is an SQLite file but not a kernelsmith database (no meta table)")
        return
    row = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
    version = int(row[0]) if row else 0
    report.schema_version = version
    if version > SCHEMA_VERSION:
        report.problems.append(
            f"has schema version {version}, newer than the {SCHEMA_VERSION} this kernelsmith understands "
            "(upgrade kernelsmith, or reset to start an empty cache)")
        return
    if version < SCHEMA_VERSION:
        report.notes.append(f"schema version {version}: migrated to {SCHEMA_VERSION} when next opened for use")
    for table in TABLES:
        if table in tables:
            report.counts[table] = int(conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0])
    if version == SCHEMA_VERSION:
        (claims,) = conn.execute("SELECT count(*) FROM decisions WHERE validated = 0").fetchone()
        report.counts["unvalidated_decisions"] = int(claims)
        report.counts["untrusted_sources"] = _untrusted_sources(conn)


def _untrusted_sources(conn: sqlite3.Connection) -> int:
    from kernelsmith.db.trust import token_trusts

    rows = conn.execute("SELECT source_hash, trust FROM variant_sources").fetchall()
    return sum(not token_trusts(str(trust), str(source_hash)) for source_hash, trust in rows)


def broken_name(path: Path, now: float | None = None) -> Path:
    """``<path>.broken-<YYYYmmdd-HHMMSS>``, with a counter when that name is taken."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(time.time() if now is None else now))
    candidate = path.with_name(f"{path.name}.broken-{stamp}")
    counter = 1
    while candidate.exists() or any(Path(f"{candidate}{s}").exists() for s in SIDECARS):
        candidate = path.with_name(f"{path.name}.broken-{stamp}-{counter}")
        counter += 1
    return candidate


def reset_database(path: str | os.PathLike[str]) -> Path | None:
    """Move the database at ``path`` (and SQLite's companion files) aside to
    :func:`broken_name` and create an empty database there; returns where the old one went,
    or None when there was nothing to move. Never deletes anything. A server database is
    refused: it is shared, and kernelsmith never moves or drops what others use."""
    if is_postgres_url(os.fspath(path)):
        from kernelsmith.db import DatabaseError

        raise DatabaseError(f"kernelsmith does not reset a server database ({redact(os.fspath(path))}): "
                            "whoever runs the server can drop it, or use another database")
    file = Path(os.fspath(path)).expanduser()
    moved: Path | None = None
    if file.exists() or file.is_symlink():
        moved = broken_name(file)
        file.rename(moved)
        for suffix in SIDECARS:
            companion = Path(f"{file}{suffix}")
            if companion.exists():
                companion.rename(Path(f"{moved}{suffix}"))
        logger.warning("moved the database %s aside to %s", file, moved)
    SQLiteDatabase(str(file)).close()
    return moved

"""The PostgreSQL backend against a real server (tests/postgres_server.py starts one).

The shipped DatabaseSuite runs here unchanged, with one fixture overridden, so both backends
meet the same expectations; then what only a shared server has: the schema created once by
racing tuners, a newer schema refused, an unreachable server refused before any tuning, and
kernel sources one user stored untrusted for another.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from kernelsmith.db import SCHEMA_VERSION, BrokenDatabaseError, DatabaseError, database_path, open_database
from kernelsmith.testing.db_suite import DatabaseSuite, make_decision, make_trial
from postgres_server import Server, new_database, postgres_server  # noqa: F401  (a fixture)

psycopg = pytest.importorskip("psycopg")


@pytest.fixture
def pg_url(postgres_server: Server) -> str:  # noqa: F811
    return new_database(postgres_server)


class TestPostgresDatabase(DatabaseSuite):
    @pytest.fixture
    def location(self, pg_url: str) -> str:
        return pg_url


def test_postgres_scheme_alias_and_env(pg_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    alias = pg_url.replace("postgresql://", "postgres://", 1)
    with open_database(alias) as db:
        db.add_trial(make_trial())
    monkeypatch.setenv("KERNELSMITH_DB", pg_url)
    assert database_path() == pg_url
    with open_database() as db:  # KERNELSMITH_DB names the server
        assert len(db.trials()) == 1


def test_schema_matches_sqlite_and_is_versioned(pg_url: str, tmp_path: Path) -> None:
    open_database(pg_url).close()
    with psycopg.connect(pg_url) as conn:
        (version,) = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        tables = {r[0] for r in conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")}
        columns = {(r[0], r[1]) for r in conn.execute(
            "SELECT table_name, column_name FROM information_schema.columns WHERE table_schema = 'public'")}
    assert int(version) == SCHEMA_VERSION
    import sqlite3

    open_database(tmp_path / "s.db").close()
    with sqlite3.connect(tmp_path / "s.db") as lite:
        lite_tables = {r[0] for r in lite.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
                       if not r[0].startswith("sqlite_")}
        lite_columns = {(t, r[1]) for t in lite_tables for r in lite.execute(f"PRAGMA table_info({t})")}
    lite.close()
    assert tables == lite_tables
    # the same columns, plus the insertion-order column PostgreSQL has no rowid for
    assert columns - {(t, "seq") for t in tables} == lite_columns


def test_newer_schema_is_refused_with_both_versions(pg_url: str) -> None:
    open_database(pg_url).close()
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("UPDATE meta SET value = %s WHERE key = 'schema_version'", (str(SCHEMA_VERSION + 1),))
    newer = rf"schema version {SCHEMA_VERSION + 1}, newer than the {SCHEMA_VERSION}"
    with pytest.raises(BrokenDatabaseError, match=newer):
        open_database(pg_url)


def test_unreachable_server_is_one_line_and_nothing_is_written(tmp_path: Path) -> None:
    with pytest.raises(DatabaseError) as info:
        open_database("postgresql://kernelsmith@127.0.0.1:1/x")
    assert "127.0.0.1:1" in str(info.value) and "\n" not in str(info.value)
    assert list(tmp_path.iterdir()) == []  # no SQLite file instead


def test_password_never_appears_in_messages() -> None:
    with pytest.raises(DatabaseError) as info:
        open_database("postgresql://user:s3cret@127.0.0.1:1/x")
    assert "s3cret" not in str(info.value) and "user:***@" in str(info.value)


def test_cli_tune_refuses_an_unreachable_database_before_tuning(tmp_path: Path) -> None:
    env = {**os.environ, "KERNELSMITH_DB": str(tmp_path / "fallback.db")}
    proc = subprocess.run(
        [sys.executable, "-m", "kernelsmith.cli.main", "tune", "rmsnorm", "--shape", "4x64", "--budget", "1",
         "--db", "postgresql://nowhere.invalid:1/x"],
        capture_output=True, text=True, timeout=120, env=env,
    )
    assert proc.returncode != 0
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "nowhere.invalid" in lines[0], proc.stderr
    assert "tuning" not in proc.stdout.lower()
    assert not (tmp_path / "fallback.db").exists()  # no silent fallback to the local file


def test_racing_tuners_create_the_schema_once(pg_url: str) -> None:
    """Several connections opening a fresh database at once all succeed (advisory lock)."""
    import threading

    errors: list[BaseException] = []

    def open_it() -> None:
        try:
            open_database(pg_url).close()
        except BaseException as exc:  # collected: a thread's exception is otherwise lost
            errors.append(exc)

    threads = [threading.Thread(target=open_it) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def test_a_decision_made_by_one_tuner_is_served_to_another(pg_url: str) -> None:
    with open_database(pg_url) as a, open_database(pg_url) as b:
        a.put_decision(make_decision(speedup=2.0))
        d = b.get_decision(make_decision().fingerprint, make_decision().workload)
        assert d is not None and d.metrics["speedup"] == 2.0 and d.servable


def test_another_users_sources_are_untrusted_and_edited_text_loses_trust(
    pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Trust is a per-user token over the hash, and the text must still match the hash: a
    source a colleague stored in the shared database is untrusted here, and text edited in the
    database after this user trusted it is untrusted again."""
    text = "@triton.jit\ndef k(x):\n    pass\n"
    monkeypatch.setenv("KERNELSMITH_TRUST_KEY", str(tmp_path / "colleague.key"))
    with open_database(pg_url) as db:
        source_hash = db.put_variant_source("rmsnorm", text)
        assert db.variant_source(source_hash).trusted  # type: ignore[union-attr]
    monkeypatch.setenv("KERNELSMITH_TRUST_KEY", str(tmp_path / "me.key"))
    with open_database(pg_url) as db:
        assert not db.variant_source(source_hash).trusted  # type: ignore[union-attr]
        assert db.trust_variant_source(source_hash)
        assert db.variant_source(source_hash).trusted  # type: ignore[union-attr]
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute("UPDATE variant_sources SET source = %s WHERE source_hash = %s",
                         (text + "# evil\n", source_hash))
        assert not db.variant_source(source_hash).trusted  # type: ignore[union-attr]


def test_db_check_reads_a_server_database_and_reset_refuses_it(pg_url: str) -> None:
    from kernelsmith.db.health import check_database, reset_database

    with open_database(pg_url) as db:
        db.add_trial(make_trial())
    report = check_database(pg_url)
    assert report.ok and report.counts["trials"] == 1 and report.schema_version == SCHEMA_VERSION
    unreachable = check_database("postgresql://127.0.0.1:1/x")
    assert not unreachable.ok and "127.0.0.1:1" in unreachable.problems[0]
    with pytest.raises(DatabaseError, match="does not reset a server database"):
        reset_database(pg_url)

"""The database layer: the shared suite on SQLite, plus opening, locations and failures."""

from __future__ import annotations

import io
import json
import sqlite3
from dataclasses import replace
from pathlib import Path

import pytest

from kernelsmith.db import (
    SCHEMA_VERSION,
    BrokenDatabaseError,
    Database,
    DatabaseError,
    SQLiteDatabase,
    default_db_path,
    open_database,
)
from kernelsmith.db.jsonl import export_jsonl, import_jsonl
from kernelsmith.db.sqlite import MIGRATIONS, _statements
from kernelsmith.testing.db_suite import DatabaseSuite, make_decision, make_trial


class TestSQLiteDatabase(DatabaseSuite):
    @pytest.fixture
    def location(self, tmp_path: Path) -> str:
        return str(tmp_path / "nested" / "dir" / "suite.db")  # parents are created


class TestSQLiteURL(DatabaseSuite):
    """The same suite through the ``sqlite:///`` URL form (absolute path: four slashes)."""

    @pytest.fixture
    def location(self, tmp_path: Path) -> str:
        return f"sqlite:///{tmp_path / 'url.db'}"


# -- open_database and locations -------------------------------------------------------------


def test_default_path_uses_env(tmp_path: Path) -> None:
    # conftest sets KERNELSMITH_DB for every test
    assert default_db_path() == tmp_path / "kernelsmith.db"
    with open_database() as db:
        assert isinstance(db, SQLiteDatabase)
        db.add_trial(make_trial())
    assert (tmp_path / "kernelsmith.db").is_file()


def test_default_path_xdg_and_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KERNELSMITH_DB")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_db_path() == tmp_path / "xdg" / "kernelsmith" / "kernelsmith.db"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_db_path() == tmp_path / "home" / ".cache" / "kernelsmith" / "kernelsmith.db"
    monkeypatch.setenv("KERNELSMITH_DB", "")  # empty counts as unset
    assert default_db_path() == tmp_path / "home" / ".cache" / "kernelsmith" / "kernelsmith.db"


def test_env_var_url_form(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KERNELSMITH_DB", f"sqlite:///{tmp_path / 'env.db'}")
    assert default_db_path() == tmp_path / "env.db"
    with open_database() as db:
        assert Path(db.path) == tmp_path / "env.db"  # type: ignore[attr-defined]


def test_open_forms(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with open_database(tmp_path / "p.db") as db:  # PathLike
        assert Path(db.path) == tmp_path / "p.db"  # type: ignore[attr-defined]
    with open_database(str(tmp_path / "s.db")) as db:
        assert Path(db.path) == tmp_path / "s.db"  # type: ignore[attr-defined]
    monkeypatch.chdir(tmp_path)
    with open_database("sqlite:///rel.db") as db:  # three slashes: relative (SQLAlchemy)
        db.add_trial(make_trial())
    assert (tmp_path / "rel.db").is_file()
    for memory in (":memory:", "sqlite://", "sqlite:///:memory:"):
        with open_database(memory) as db:
            db.add_trial(make_trial())
            assert len(db.trials()) == 1


def test_open_passes_database_through() -> None:
    db = SQLiteDatabase(":memory:")
    assert open_database(db) is db
    db.close()


def test_memory_databases_are_private() -> None:
    with open_database(":memory:") as a, open_database(":memory:") as b:
        a.add_trial(make_trial())
        assert b.trials() == []


@pytest.mark.parametrize("url", ["mysql://host/db", "sqlite:relative.db", "sqlite:///"])
def test_unsupported_urls(url: str) -> None:
    with pytest.raises(DatabaseError, match="URL"):
        open_database(url)


def test_unwritable_path_parent_is_a_file(tmp_path: Path) -> None:
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    target = blocker / "sub" / "kernelsmith.db"
    with pytest.raises(DatabaseError) as info:
        open_database(target)
    message = str(info.value)
    assert str(target) in message
    assert "\n" not in message


def test_unwritable_path_is_a_directory(tmp_path: Path) -> None:
    (tmp_path / "dir.db").mkdir()
    with pytest.raises(DatabaseError, match=r"dir\.db"):
        open_database(tmp_path / "dir.db")


def test_not_a_database_file(tmp_path: Path) -> None:
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(DatabaseError, match=r"junk\.db"):
        open_database(junk)


# -- schema -----------------------------------------------------------------------------------


def test_schema_version_and_wal(tmp_path: Path) -> None:
    path = tmp_path / "v.db"
    open_database(path).close()
    with sqlite3.connect(path) as conn:
        (version,) = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        (mode,) = conn.execute("PRAGMA journal_mode").fetchone()
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        indexes = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='index'")}
    conn.close()
    assert int(version) == SCHEMA_VERSION == len(MIGRATIONS) >= 1
    assert mode == "wal"
    assert {"meta", "fingerprints", "trials", "decisions", "ceilings"} <= tables
    assert "trials_candidate" in indexes


def test_reopen_does_not_rerun_migrations(tmp_path: Path) -> None:
    path = tmp_path / "v.db"
    with open_database(path) as db:
        db.add_trial(make_trial())
    with open_database(path) as db:  # a re-run CREATE TABLE would fail here
        assert len(db.trials()) == 1


def test_version_1_database_is_migrated_in_place(tmp_path: Path) -> None:
    """A database written before variant sources existed gains their table and keeps its rows."""
    path = tmp_path / "v1.db"
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
    for statement in _statements(MIGRATIONS[0]):
        conn.execute(statement)
    conn.execute("INSERT INTO meta VALUES ('schema_version', '1')")
    conn.execute("INSERT INTO fingerprints VALUES ('fp', '{}')")
    conn.close()
    with open_database(path) as db:
        source_hash = db.put_variant_source("rmsnorm", "def build(spec, config): ...\n")
        assert db.get_variant_source(source_hash) == "def build(spec, config): ...\n"
    with sqlite3.connect(path) as conn:
        (version,) = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        (kept,) = conn.execute("SELECT count(*) FROM fingerprints").fetchone()
    conn.close()
    assert int(version) == SCHEMA_VERSION >= 2 and kept == 1


def test_version_2_database_gains_origins_and_its_sources_lose_trust(tmp_path: Path) -> None:
    """Schema 3 (rule 13): rows measured before keep serving as local; kernel sources stored
    before cannot be told from imported ones, so they are "unknown" and untrusted until
    `kernelsmith db trust`."""
    path = tmp_path / "v2.db"
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
    for script in MIGRATIONS[:2]:
        for statement in _statements(script):
            conn.execute(statement)
    conn.execute("INSERT INTO meta VALUES ('schema_version', '2')")
    d = make_decision()
    conn.execute("INSERT INTO decisions VALUES (?, ?, ?, '{}', 'kernel', 'row', 'src0', '{}', '{}', '', 1, 0)",
                 (d.fingerprint, d.workload, d.op))
    conn.execute("INSERT INTO trials (fingerprint, workload, op, variant, source_hash, config_key, config, status, "
                 "metrics, created_at) VALUES ('f', 'w', 'softmax', 'row', 'src0', '', '{}', 'cheat', '{}', 0)")
    conn.execute("INSERT INTO variant_sources VALUES ('abc', 'rmsnorm', 'text', 0)")
    conn.close()
    with open_database(path) as db:
        (decision,) = db.decisions()
        assert decision.origin == "local" and decision.servable
        (trial,) = db.trials()
        assert trial.origin == "local" and db.find_trial("f", "w", "row", "src0", "") == trial
        (source,) = db.variant_sources()
        assert source.origin == "unknown" and not source.trusted
    with sqlite3.connect(path) as conn:
        (version,) = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
    conn.close()
    assert int(version) == SCHEMA_VERSION >= 3


def test_newer_schema_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "future.db"
    open_database(path).close()
    conn = sqlite3.connect(path)
    with conn:
        conn.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'",
                     (str(SCHEMA_VERSION + 1),))
    conn.close()
    newer = rf"schema version {SCHEMA_VERSION + 1}, newer than the {SCHEMA_VERSION}"
    with pytest.raises(BrokenDatabaseError, match=newer) as info:
        open_database(path)
    assert str(path) in str(info.value) and info.value.path == str(path)


def test_statement_splitter() -> None:
    stmts = list(_statements("CREATE TABLE a (x TEXT DEFAULT ';');\n\nCREATE INDEX i ON a (x);\n"))
    assert stmts == ["CREATE TABLE a (x TEXT DEFAULT ';');", "CREATE INDEX i ON a (x);"]


def test_unserialisable_config_fails_alone(tmp_path: Path) -> None:
    with open_database(tmp_path / "x.db") as db:
        with pytest.raises(TypeError):
            db.add_trial(make_trial(config={"bad": object()}))
        db.add_trial(make_trial())  # the database is still usable
        assert len(db.trials()) == 1


def test_numpy_scalars_are_stored() -> None:
    np = pytest.importorskip("numpy")
    with open_database(":memory:") as db:
        db.add_trial(make_trial(config={"BLOCK": np.int64(64)},
                                metrics={"median_us": np.float32(2.5)}))
        (t,) = db.trials()
        assert t.config == {"BLOCK": 64} and t.metrics == {"median_us": 2.5}
        assert db.find_trial(t.fingerprint, t.workload, t.variant, t.source_hash, "BLOCK=64")


def test_database_is_abstract() -> None:
    with pytest.raises(TypeError):
        Database()  # type: ignore[abstract]


# -- JSON lines -------------------------------------------------------------------------------


def _export(db: Database) -> list[dict[str, object]]:
    buf = io.StringIO()
    export_jsonl(db, buf)
    return [json.loads(line) for line in buf.getvalue().splitlines()]


def test_export_header() -> None:
    from kernelsmith import __version__

    with open_database(":memory:") as db:
        db.add_trial(make_trial())
        lines = _export(db)
    assert lines[0] == {"type": "header", "format": "kernelsmith-jsonl", "version": 1,
                        "kernelsmith": __version__}
    assert [line["type"] for line in lines[1:]] == ["trial"]


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ('{"type": "header", "format": "other", "version": 1}\n', "format"),
        ('{"type": "header", "format": "kernelsmith-jsonl", "version": 99}\n', "newer"),
        ('{"type": "trial"}\n', "header"),
        ("", "empty"),
        ('{"type": "header", "format": "kernelsmith-jsonl", "version": 1}\nnot json\n', "line 2"),
        ('{"type": "header", "format": "kernelsmith-jsonl", "version": 1}\n{"type": "x"}\n',
         "unknown record type"),
        ('{"type": "header", "format": "kernelsmith-jsonl", "version": 1}\n'
         '{"type": "trial", "fingerprint": "f"}\n', "lacks"),
    ],
)
def test_import_rejects_bad_files(text: str, match: str) -> None:
    with open_database(":memory:") as db:
        with pytest.raises(DatabaseError, match=match):
            import_jsonl(db, io.StringIO(text))
        assert db.trials() == []


def test_import_is_all_or_nothing() -> None:
    with open_database(":memory:") as src:
        src.add_trial(make_trial())
        buf = io.StringIO()
        export_jsonl(src, buf)
    text = buf.getvalue() + '{"type": "decision", "fingerprint": "f"}\n'
    with open_database(":memory:") as dst:
        with pytest.raises(DatabaseError, match="line 3"):
            import_jsonl(dst, io.StringIO(text))
        assert dst.trials() == []


def test_import_upserts_claims_keeps_local_decisions_and_distinct_statuses() -> None:
    """An imported decision replaces an earlier claim, never a decision measured here (rule 13)."""
    with open_database(":memory:") as src:
        src.put_decision(make_decision(speedup=2.5))
        src.put_decision(make_decision(workload="w2", speedup=3.5))
        src.add_trial(make_trial(status="timeout"))
        buf = io.StringIO()
        export_jsonl(src, buf)
    with open_database(":memory:") as dst:
        dst.put_decision(make_decision(speedup=1.1))
        dst.put_decision(replace(make_decision(workload="w2", speedup=1.2), origin="imported", validated=False))
        dst.add_trial(make_trial(status="ok"))  # same candidate, other status: not a duplicate
        counts = import_jsonl(dst, io.StringIO(buf.getvalue()))
        assert counts["decision"] == 1 and counts["kept_local_decision"] == 1 and counts["trial"] == 1
        local, claim = dst.decisions()
        assert local.metrics["speedup"] == 1.1 and local.origin == "local"
        assert claim.metrics["speedup"] == 3.5 and claim.origin == "imported" and not claim.servable
        assert [t.status for t in dst.trials()] == ["ok", "timeout"]

"""A broken cache is not a broken program (issue 12, part 7).

Each corruption a database file meets in the field (cut short, its header overwritten, replaced
by text, written by a newer kernelsmith, a directory in its place, unreadable) must leave the
front doors running the user's own code with one warning that names the file and the fix, and
give the CLI a one-line error, a ``db check`` that says what is wrong (exit 1) and a ``db reset``
that moves the file aside (never deleting it) and starts an empty cache.
"""

from __future__ import annotations

import logging
import os
import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

import kernelsmith
from kernelsmith import dispatch
from kernelsmith.cli.main import app
from kernelsmith.db import SCHEMA_VERSION, open_database
from kernelsmith.db.health import check_database, reset_database
from kernelsmith.testing.db_suite import make_decision, make_trial


def hf_rmsnorm(x, weight, eps=1e-6):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * weight


def _filled(path: Path) -> None:
    """A healthy database of several pages, so that cutting it leaves a valid-looking header."""
    with open_database(path) as db:
        db.add_trials(make_trial(config={"i": i}, error="x" * 200) for i in range(300))
        db.put_decision(make_decision())


def truncated(path: Path) -> None:
    _filled(path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def zeroed_header(path: Path) -> None:
    _filled(path)
    data = path.read_bytes()
    path.write_bytes(bytes(100) + data[100:])


def text(path: Path) -> None:
    path.write_text("this is a text file, not a database\n" * 50)


def future_schema(path: Path) -> None:
    _filled(path)
    conn = sqlite3.connect(path)
    with conn:
        conn.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", (str(SCHEMA_VERSION + 1),))
    conn.close()


def directory(path: Path) -> None:
    path.mkdir()


def unreadable(path: Path) -> None:
    if os.geteuid() == 0:
        pytest.skip("root reads any file: an unreadable file cannot be made")
    _filled(path)
    path.chmod(0)


CORRUPTIONS: list[Callable[[Path], None]] = [truncated, zeroed_header, text, future_schema, directory, unreadable]


@pytest.fixture(params=CORRUPTIONS, ids=lambda f: f.__name__)
def broken(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    path = tmp_path / "broken.db"
    request.param(path)
    yield path
    if path.exists() and not path.is_dir():
        path.chmod(0o600)  # let pytest clean up


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


def test_the_decorator_runs_the_users_function_and_warns_once(broken: Path, caplog) -> None:
    fn = kernelsmith.optimize(hf_rmsnorm, db=str(broken))  # mode "tune": it would tune if it could
    x, w = torch.randn(6, 64), torch.randn(64)
    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            assert torch.equal(fn(x, w), hf_rmsnorm(x, w))
        other = torch.randn(5, 32), torch.randn(32)  # another key: looked up again, not warned again
        assert torch.equal(fn(*other), hf_rmsnorm(*other))
    (warning,) = _warnings(caplog)
    assert str(broken) in warning and "kernelsmith db check" in warning and "db reset" in warning
    assert fn.kernelsmith.stats["kernel_calls"] == 0 and fn.kernelsmith.stats["tunes"] == 0


def test_the_kernel_op_runs_the_reference_and_warns_once(broken: Path, caplog, monkeypatch) -> None:
    monkeypatch.setenv("KERNELSMITH_DB", str(broken))
    dispatch._RUNNERS.clear()
    with caplog.at_level(logging.WARNING):
        for shape in ((5, 33), (4, 17)):
            x = torch.randn(*shape)
            out = torch.ops.kernelsmith.kernel("softmax", [x], '{"dim": -1}')[0]
            assert torch.allclose(out, torch.softmax(x, -1), atol=1e-6)
    (warning,) = _warnings(caplog)
    assert str(broken) in warning and "kernelsmith db check" in warning
    dispatch._RUNNERS.clear()


def test_the_cli_says_what_to_run_check_explains_and_reset_moves_the_file_aside(broken: Path) -> None:
    runner = CliRunner()
    listed = runner.invoke(app, ["db", "list", "--db", str(broken)])
    assert listed.exit_code == 2 and "Traceback" not in listed.output
    lines = [line for line in listed.output.splitlines() if line.strip()]
    assert "kernelsmith db check" in listed.output and "db reset" in listed.output and len(lines) <= 3

    checked = runner.invoke(app, ["db", "check", "--db", str(broken)])
    assert checked.exit_code == 1 and "NOT USABLE" in checked.output and "problem:" in checked.output
    was_directory = broken.is_dir()

    reset = runner.invoke(app, ["db", "reset", "--db", str(broken)])
    assert reset.exit_code == 0, reset.output
    moved = [p for p in broken.parent.iterdir()
             if p.name.startswith("broken.db.broken-") and not p.name.endswith(("-wal", "-shm", "-journal"))]
    assert len(moved) == 1 and "moved" in reset.output
    assert moved[0].is_dir() == was_directory  # what was there, kept as it was
    assert runner.invoke(app, ["db", "check", "--db", str(broken)]).exit_code == 0
    with open_database(broken) as db:  # an empty, usable cache
        assert db.decisions() == []


def test_check_reports_a_healthy_database_and_reset_never_deletes(tmp_path: Path) -> None:
    path = tmp_path / "ok.db"
    assert not check_database(path).exists and check_database(path).ok  # nothing yet: fine
    _filled(path)
    report = check_database(path)
    assert report.ok and report.schema_version == SCHEMA_VERSION
    assert report.counts["trials"] == 300 and report.counts["decisions"] == 1
    assert report.counts["unvalidated_decisions"] == 0 and report.counts["untrusted_sources"] == 0
    result = CliRunner().invoke(app, ["db", "check", "--db", str(path), "--json"])
    assert result.exit_code == 0 and '"ok": true' in result.output
    moved = reset_database(path)
    assert moved is not None and moved.name.startswith("ok.db.broken-")
    with open_database(moved) as old:  # the moved file still holds everything
        assert len(old.trials()) == 300
    second = reset_database(path)  # the same second: another name, nothing overwritten
    assert second is not None and second != moved and moved.exists()


def test_an_older_schema_is_noted_not_refused(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    _filled(path)
    conn = sqlite3.connect(path)
    with conn:
        conn.execute("UPDATE meta SET value = '2' WHERE key = 'schema_version'")
    conn.close()
    report = check_database(path)
    assert report.ok and report.schema_version == 2 and any("migrated" in n for n in report.notes)


@pytest.mark.parametrize("corrupt", [text, future_schema], ids=lambda f: f.__name__)
def test_the_compile_backend_hands_the_graph_on_and_warns_once(corrupt, tmp_path: Path, caplog, monkeypatch) -> None:
    import torch._inductor.compile_fx as inductor

    from kernelsmith.frontends import backend as ks_backend

    path = tmp_path / "broken.db"
    corrupt(path)
    torch._dynamo.reset()
    monkeypatch.setattr(inductor, "compile_fx", lambda gm, example_inputs, **kwargs: gm.forward)  # no real Inductor
    backend = ks_backend.backend(db=str(path), tune=True)

    def softmax(x):
        return torch.softmax(x * 0.5, dim=-1)

    x = torch.randn(4, 32)
    with caplog.at_level(logging.WARNING):
        out = torch.compile(softmax, backend=backend, dynamic=False)(x)
    assert torch.allclose(out, softmax(x), atol=1e-6)
    assert [(s.op, s.status) for s in backend.sites] == [("softmax", "no database")]
    (warning,) = _warnings(caplog)
    assert str(path) in warning and "kernelsmith db check" in warning

"""The command line: JSON contract, database commands, one-line errors."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from kernelsmith.cli.main import app

runner = CliRunner()


def run(*args: str, input: str | None = None):
    return runner.invoke(app, list(args), input=input)


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    db = str(tmp_path_factory.mktemp("cli") / "cli.db")
    result = run("tune", "softmax", "--shape", "6x48", "--dtype", "fp32", "--budget", "2", "--workers", "1",
                 "--db", db, "--json")
    assert result.exit_code == 0, result.output
    return db, json.loads(result.stdout.strip().splitlines()[-1])


def test_tune_json_contract(tuned):
    _, data = tuned
    for key in ("op", "mode", "evaluations", "from_database", "winner", "best_config", "speedup_vs_baseline"):
        assert key in data
    assert data["op"] == "softmax" and data["mode"] == "interpreter"
    assert data["evaluations"] == 2 and data["from_database"] is False
    assert data["winner"] in ("kernel", "baseline")
    assert data["spec"]["inputs"][0]["shape"] == [6, 48]


def test_second_tune_comes_from_the_database(tuned):
    db, first = tuned
    result = run("tune", "softmax", "--shape", "6x48", "--dtype", "fp32", "--budget", "2", "--db", db, "--json")
    data = json.loads(result.stdout.strip().splitlines()[-1])
    assert data["from_database"] is True and data["evaluations"] == 0 and data["winner"] == first["winner"]


def test_tune_table_output_says_interpreter(tuned):
    db, _ = tuned
    result = run("tune", "softmax", "--shape", "6x48", "--dtype", "fp32", "--db", db)
    assert result.exit_code == 0
    assert "interpreter" in result.output and "winner" in result.output and "database" in result.output


def test_ops_lists_families_and_shape_mapping():
    result = run("ops", "--json")
    rows = {row["name"]: row for row in json.loads(result.stdout)}
    assert {"rmsnorm", "softmax"} <= set(rows)
    assert "8192x4096" in rows["rmsnorm"]["shape"] and len(rows["softmax"]["variants"]) >= 3
    assert "rmsnorm" in run("ops").output


def test_db_list_show_export_import(tuned, tmp_path):
    db, data = tuned
    listed = json.loads(run("db", "list", "--db", db, "--json").stdout)
    assert [d["workload"] for d in listed] == [data["workload"]]
    shown = json.loads(run("db", "show", data["workload"], "--db", db, "--json").stdout)
    assert len(shown["trials"]) == 2 and shown["decisions"][0]["winner"] == data["winner"]
    exported = run("db", "export", "--db", db)
    lines = [json.loads(line) for line in exported.stdout.splitlines() if line.strip()]
    assert lines[0]["type"] == "header" and {"trial", "decision", "fingerprint"} <= {x["type"] for x in lines}
    other = str(tmp_path / "other.db")
    imported = run("db", "import", "-", "--db", other, input=exported.stdout)
    assert imported.exit_code == 0, imported.output
    assert json.loads(run("db", "list", "--db", other, "--json").stdout)[0]["workload"] == data["workload"]
    # Importing the same lines again adds no duplicate trials.
    run("db", "import", "-", "--db", other, input=exported.stdout)
    again = json.loads(run("db", "show", data["workload"], "--db", other, "--json").stdout)
    assert len(again["trials"]) == 2
    out_file = tmp_path / "x.jsonl"
    assert run("db", "export", "--db", db, "--out", str(out_file)).exit_code == 0
    assert out_file.read_text().splitlines()[0] == exported.stdout.splitlines()[0]


@pytest.mark.parametrize(
    "args,message",
    [
        (("tune", "nosuchop"), "unknown op"),
        (("tune", "rmsnorm", "--shape", "12xq"), "bad shape"),
        (("tune", "rmsnorm", "--dtype", "int9"), "unknown dtype"),
        (("tune", "rmsnorm", "--strategy", "nope"), "unknown strategy"),
        (("tune", "rmsnorm", "--const", "eps"), "NAME=VALUE"),
        (("tune", "rmsnorm", "--db", "/etc/hostname/sub/x.db"), "x.db"),
        (("db", "show", "0000000000000000"), "no workload"),
        (("db", "import", "/nonexistent/file.jsonl"), "No such file"),
    ],
)
def test_user_errors_are_one_line_with_exit_2(args, message, tmp_path):
    extra = () if "--db" in args else ("--db", str(tmp_path / "e.db"))
    result = run(*args, *extra)
    assert result.exit_code == 2, result.output
    assert message in result.output and "Traceback" not in result.output
    assert len([line for line in result.output.strip().splitlines() if line.strip()]) <= 3

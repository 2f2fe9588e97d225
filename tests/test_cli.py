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
        (("db", "list", "--op", "rmsnrom"), "no such op family"),  # a typo is an error, not an empty list
        (("db", "export", "--op", "rmsnrom"), "no such op family"),
        (("report", "--op", "rmsnrom", "--no-plots"), "no such op family"),
    ],
)
def test_user_errors_are_one_line_with_exit_2(args, message, tmp_path):
    extra = () if "--db" in args else ("--db", str(tmp_path / "e.db"))
    result = run(*args, *extra)
    assert result.exit_code == 2, result.output
    assert message in result.output and "Traceback" not in result.output
    assert len([line for line in result.output.strip().splitlines() if line.strip()]) <= 3


# ---- what the tables say, and the global options -------------------------------------------------


def _stored_decision(db: str, winner: str, metrics: dict) -> str:
    """A decision stored directly (as a GPU run would have): its workload hash."""
    from kernelsmith.db import DecisionRecord, current_fingerprint, open_database
    from kernelsmith.ops import get_op

    family = get_op("rmsnorm")
    spec = family.spec((64, 1024) if winner == "kernel" else (32, 1024), "bf16")
    fp = current_fingerprint("interpreter")
    with open_database(db) as database:
        database.put_fingerprint(fp)
        database.put_decision(DecisionRecord(
            fp.hash, spec.workload_hash, "rmsnorm", spec.to_dict(), winner, "a_long_variant_name_that_identifies_it",
            "src", {"BLOCK": 1024}, metrics))  # fmt: skip
    return spec.workload_hash


def test_db_list_names_the_baseline_and_shows_no_speedup_where_nothing_is_replaced(tmp_path):
    db = str(tmp_path / "s.db")
    won = _stored_decision(db, "kernel", {"speedup": 11.7, "ci_low": 11.5, "ci_high": 11.9})
    lost = _stored_decision(db, "baseline", {"speedup": 0.97, "ci_low": 0.95, "ci_high": 0.99})
    result = runner.invoke(app, ["db", "list", "--db", db], env={"COLUMNS": "200"})  # every cell on one line
    assert result.exit_code == 0, result.output
    assert "11.70x vs eager" in result.output and "torch.compile not measured" in result.output
    assert "0.97" not in result.output  # the baseline's row: nothing replaced, no speedup
    assert "a_long_variant_name_that_identifies_it" in result.output
    # In an 80-column terminal the columns that tell rows apart give way last and are never cut:
    # hashes stay whole, long names fold onto the next lines.
    narrow = runner.invoke(app, ["db", "list", "--db", db], env={"COLUMNS": "80"})
    assert won in narrow.output and lost in narrow.output
    variant_column = "".join(line.split("│")[5].strip() for line in narrow.output.splitlines() if line.count("│") > 5)
    assert "a_long_variant_name_that_identifies_it" in variant_column
    shown = runner.invoke(app, ["db", "show", lost, "--db", db], env={"COLUMNS": "200"})
    assert "none: the baseline (eager PyTorch) is kept" in shown.output and "0.970x" not in shown.output


def test_tune_table_names_eager_as_the_baseline(tuned):
    db, data = tuned
    result = run("tune", "softmax", "--shape", "6x48", "--dtype", "fp32", "--db", db)
    assert "speedup" in result.output
    if data["winner"] == "kernel":
        assert "vs eager" in result.output and "torch.compile not measured" in result.output
    else:
        assert "none: the baseline (eager PyTorch) is kept" in result.output and data["best_config"] is None
    as_json = json.loads(run("tune", "softmax", "--shape", "6x48", "--dtype", "fp32", "--db", db, "--json").stdout)
    assert as_json["baseline"] == "eager" and as_json["speedup_text"]


def test_version_verbose_and_quiet(tuned):
    import logging

    from kernelsmith import __version__

    assert run("--version").stdout.strip() == f"kernelsmith {__version__}"
    db, _ = tuned
    package = logging.getLogger("kernelsmith")
    before = (list(package.handlers), package.level, package.propagate)
    loud = run("-v", "tune", "softmax", "--shape", "6x48", "--dtype", "fp32", "--db", db)
    assert loud.exit_code == 0 and "tuning softmax" in loud.output
    quiet = run("-q", "tune", "softmax", "--shape", "6x48", "--dtype", "fp32", "--db", db)
    assert quiet.exit_code == 0 and "winner" in quiet.output  # the result still prints
    assert "tuning softmax" not in quiet.output and "No CUDA GPU" not in quiet.output  # the notes do not
    assert (list(package.handlers), package.level, package.propagate) == before  # logging as it was
    assert "error" in run("-q", "tune", "nosuchop").output  # -q never hides an error
    assert run("-v", "-q", "db", "list").exit_code == 2


def test_optimize_report_names_eager_and_prints_no_speedup_when_nothing_was_replaced():
    from rich.console import Console

    from kernelsmith.cli.optimize import _print_report
    from kernelsmith.ops import get_op
    from kernelsmith.whole_model.optimize import Workload

    kept = Workload("rmsnorm", get_op("rmsnorm").spec((64, 1024), "bf16"), (64, 1024))
    kept.decided("baseline", {"speedup": 0.97})
    won = Workload("softmax", get_op("softmax").spec((64, 1024), "bf16"), (64, 1024))
    won.decided("kernel", {"speedup": 1.4, "ci_low": 1.3, "ci_high": 1.5})
    assert kept.speedup is None and won.speedup == 1.4
    report = {"model": "m", "mode": "gpu", "workloads": [kept.to_dict(), won.to_dict()], "sites": [],
              "evaluations": 0, "wall_s": 1.0, "stopped": "", "replaced": 0, "expected_gain": 1.0}  # fmt: skip
    console = Console(width=200, record=True)
    _print_report(report, console)
    text = console.export_text()
    assert "none: the baseline (eager PyTorch) is kept" in text and "0.97" not in text
    assert "1.40x vs eager; torch.compile not measured" in text
    assert "nothing replaced: the compiled model is torch.compile (Inductor) alone" in text
    assert "expected forward speedup" not in text
    console = Console(width=200, record=True)
    _print_report({**report, "replaced": 1, "expected_gain": 1.1}, console)
    assert "expected forward speedup 1.100x vs eager PyTorch" in console.export_text()

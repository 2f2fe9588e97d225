"""kernelsmith report: results.tsv rows match the stored trials, report.md covers every workload,
the plots are drawn when matplotlib is installed (and skipped with a hint when it is not)."""

from __future__ import annotations

import csv
import json
import sys

import pytest
from typer.testing import CliRunner

from kernelsmith.cli.main import app
from kernelsmith.db import DecisionRecord, Fingerprint, TrialRecord, open_database
from kernelsmith.ops import get_op
from kernelsmith.whole_model.report import REPORT_EXTRA_HINT, TSV_COLUMNS, collect_report, write_report

GPU = Fingerprint("gpu", "NVIDIA H200", 132, "9.0", "580.1", "13.0", "2.13.0", "3.9.0", "0.1.0")
INTERP = Fingerprint("interpreter", "triton-interpreter", 0, "cpu", "none", "none", "2.13.0", "3.9.0", "0.1.0")
COPY_GBPS = 4275.0
RMSNORM = get_op("rmsnorm").spec((8192, 4096), "bf16")
SOFTMAX = get_op("softmax").spec((4096, 8192), "bf16")
GELU = get_op("gelu").spec((16384, 8192), "bf16")
SMALL_SOFTMAX = get_op("softmax").spec((6, 48), "fp32")


def _ok(fp, spec, variant, config, median_us, baseline_us=400.0):
    nbytes = get_op(spec.op).bytes_moved(spec)
    metrics = {
        "median_us": median_us,
        "baseline_median_us": baseline_us,
        "gbps": nbytes / (median_us * 1e-6) / 1e9,
        "baseline_gbps": nbytes / (baseline_us * 1e-6) / 1e9,
        "timer": "cuda-events" if fp.mode == "gpu" else "host-clock-interpreter",
        "eval_s": 1.5,
    }
    return TrialRecord(fp.hash, spec.workload_hash, spec.op, variant, "src" + variant, config, "ok", metrics=metrics)


def _failed(fp, spec, variant, config, status, error):
    return TrialRecord(
        fp.hash, spec.workload_hash, spec.op, variant, "src" + variant, config, status, error, {"eval_s": 0.5}
    )


@pytest.fixture
def filled_db(tmp_path):
    """Three GPU workloads (a kernel win, a baseline win, an unfinished search) and an interpreter one."""
    path = str(tmp_path / "report.db")
    with open_database(path) as db:
        for fp in (GPU, INTERP):
            db.put_fingerprint(fp)
        db.put_ceiling(GPU.hash, "copy_gbps", COPY_GBPS, {"nbytes": 1 << 30})
        rms = [
            _ok(GPU, RMSNORM, "rows", {"BLOCK": 1024, "num_warps": 4}, 60.0),
            _ok(GPU, RMSNORM, "rows", {"BLOCK": 2048, "num_warps": 4}, 70.0),
            _failed(GPU, RMSNORM, "rows", {"BLOCK": 8192, "num_warps": 1}, "build", "out of shared memory\tline 2"),
            _ok(GPU, RMSNORM, "rows", {"BLOCK": 4096, "num_warps": 8}, 45.0),
            _failed(GPU, RMSNORM, "persistent", {"BLOCK": 512}, "validate", "max abs error 3.1 exceeds 0.01"),
            _ok(GPU, RMSNORM, "persistent", {"BLOCK": 1024}, 50.0),
            _failed(GPU, RMSNORM, "persistent", {"BLOCK": 256}, "build", "ptxas error"),
        ]
        soft = [_ok(GPU, SOFTMAX, "rows", {"num_warps": w}, 90.0 + w, baseline_us=85.0) for w in (1, 2, 4, 8)]
        gelu = [_ok(GPU, GELU, "flat", {"BLOCK": 1024}, 160.0, 150.0), _failed(GPU, GELU, "flat", {}, "crash", "")]
        interp = [_ok(INTERP, SMALL_SOFTMAX, "rows", {"num_warps": 1}, 9000.0, 60.0)]
        # Interleaved as a real multi-workload session would store them.
        db.add_trials([rms[0], soft[0], rms[1], rms[2], soft[1], rms[3], gelu[0], rms[4], soft[2], rms[5], gelu[1],
                       rms[6], soft[3], interp[0]])  # fmt: skip
        best = rms[3]
        db.put_decision(
            DecisionRecord(
                GPU.hash,
                RMSNORM.workload_hash,
                "rmsnorm",
                RMSNORM.to_dict(),
                "kernel",
                best.variant,
                best.source_hash,
                dict(best.config),
                metrics={
                    "median_us": 44.0,
                    "baseline_median_us": 440.0,
                    "gbps": 1525.8,
                    "baseline_gbps": 152.6,
                    "copy_gbps": COPY_GBPS,
                    "pct_of_copy_bandwidth": 35.7,
                    "speedup": 10.0,
                    "ci_low": 9.8,
                    "ci_high": 10.2,
                    "cost": {"mode": "gpu", "evaluations": 7, "gpu_s": 7.5, "wall_s": 12.0},
                },
                strategy="grid",
                evaluations=7,
            )
        )
        db.put_decision(
            DecisionRecord(
                GPU.hash,
                SOFTMAX.workload_hash,
                "softmax",
                SOFTMAX.to_dict(),
                "baseline",
                "rows",
                "srcrows",
                {"num_warps": 1},
                metrics={
                    "median_us": 91.0,
                    "baseline_median_us": 85.0,
                    "gbps": 1474.9,
                    "baseline_gbps": 1579.0,
                    "speedup": 0.93,
                    "ci_low": 0.91,
                    "ci_high": 0.95,
                    "note": "no candidate beat the baseline with confidence",
                },
            )
        )
        trials = db.trials()
    return path, trials


def _read_tsv(path):
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle, delimiter="\t"))


def test_tsv_has_one_row_per_trial_in_evaluation_order(filled_db, tmp_path):
    path, trials = filled_db
    report = write_report(path, tmp_path / "out", plots=False)
    rows = _read_tsv(report.files["results.tsv"])
    assert list(rows[0]) == list(TSV_COLUMNS)
    assert len(rows) == len(trials) == 14
    for index, (row, trial) in enumerate(zip(rows, trials, strict=True), start=1):
        assert row["order"] == str(index)
        assert (row["op"], row["workload"], row["variant"], row["config"], row["status"]) == (
            trial.op, trial.workload, trial.variant, trial.config_key, trial.status,
        )  # fmt: skip
        assert row["fingerprint"] == trial.fingerprint
        if trial.ok:
            assert float(row["time_us"]) == pytest.approx(trial.metrics["median_us"])
            assert float(row["gbps"]) == pytest.approx(trial.metrics["gbps"], rel=1e-5)
            assert float(row["speedup"]) == pytest.approx(
                trial.metrics["baseline_median_us"] / trial.metrics["median_us"], rel=1e-5
            )
        else:
            assert row["time_us"] == row["gbps"] == "" and row["outcome"] == "failed"
    assert "\t" not in rows[3]["error"] and rows[3]["error"].startswith("out of shared memory")


def test_outcomes_follow_the_running_best_per_workload(filled_db, tmp_path):
    path, _ = filled_db
    rows = [
        r for r in _read_tsv(write_report(path, tmp_path, plots=False).files["results.tsv"]) if r["op"] == "rmsnorm"
    ]
    assert [r["eval_index"] for r in rows] == [str(i) for i in range(1, 8)]
    assert [r["outcome"] for r in rows] == ["kept", "reverted", "failed", "kept", "failed", "reverted", "failed"]
    assert [r["winner"] for r in rows] == ["", "", "", "yes", "", "", ""]  # the decision's candidate
    assert [r["mode"] for r in rows] == ["gpu"] * 7


def test_ceiling_and_flops_give_percentages_and_tflops(filled_db, tmp_path):
    path, _ = filled_db
    rows = _read_tsv(write_report(path, tmp_path, plots=False).files["results.tsv"])
    best = next(r for r in rows if r["winner"] == "yes")
    assert float(best["pct_of_ceiling"]) == pytest.approx(100 * float(best["gbps"]) / COPY_GBPS, rel=1e-4)
    flops = get_op("rmsnorm").flops(RMSNORM)
    assert float(best["tflops"]) == pytest.approx(flops / 45e-6 / 1e12, rel=1e-4)
    interp = next(r for r in rows if r["mode"] == "interpreter")
    assert interp["pct_of_ceiling"] == ""  # no ceiling is measured in the interpreter


def test_report_md_covers_every_workload(filled_db, tmp_path):
    path, _ = filled_db
    text = write_report(path, tmp_path, plots=False).files["report.md"].read_text()
    for spec in (RMSNORM, SOFTMAX, GELU, SMALL_SOFTMAX):
        assert spec.workload_hash in text and f"### {spec.op}" in text
    assert "kernel rows BLOCK=4096,num_warps=8" in text  # the winner
    assert "10.000x vs eager (95% CI 9.800-10.200); torch.compile not measured" in text  # speedup, interval, baseline
    assert "none: the baseline (eager PyTorch) is kept" in text and "0.930x" not in text  # softmax: nothing replaced
    assert "35.7" in text and "4,275 GB/s" in text  # % of ceiling, and the ceiling itself
    assert "7 evaluations, 7.5 GPU-s, 12.0 s wall" in text  # the cost stored with the decision
    assert "2 evaluations, 2.0 GPU-s" in text  # an unfinished search: cost from its trials
    assert "build 2, validate 1" in text and "- build: 2; first: rows BLOCK=8192" in text
    assert "not decided" in text and "no candidate beat the baseline with confidence" in text
    assert "not GPU performance" in text  # the interpreter rows are marked


def test_plots_are_drawn(filled_db, tmp_path):
    pytest.importorskip("matplotlib")
    path, _ = filled_db
    report = write_report(path, tmp_path)
    for name in ("progress.png", "roofline.png"):
        data = report.files[name].read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
    assert report.data.plot_fingerprint == GPU.hash  # the GPU machine, not the interpreter
    text = report.files["report.md"].read_text()
    assert "![roofline](roofline.png)" in text and report.notes == []


def test_without_matplotlib_the_tsv_and_markdown_are_still_written(filled_db, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)  # import fails as when not installed
    path, _ = filled_db
    report = write_report(path, tmp_path)
    assert set(report.files) == {"results.tsv", "report.md"}
    assert not (tmp_path / "progress.png").exists()
    assert any(REPORT_EXTRA_HINT in note for note in report.notes)
    assert REPORT_EXTRA_HINT in report.files["report.md"].read_text()


def test_filters_and_an_empty_database(filled_db, tmp_path):
    path, _ = filled_db
    data = collect_report(path, op="softmax")
    assert {w.op for w in data.workloads} == {"softmax"} and len(data.rows) == 5
    only_interp = collect_report(path, fingerprint=INTERP.hash)
    assert [r.mode for r in only_interp.rows] == ["interpreter"] and only_interp.plot_fingerprint == INTERP.hash
    report = write_report(str(tmp_path / "empty.db"), tmp_path / "empty")
    assert _read_tsv(report.files["results.tsv"]) == []
    assert "No trials" in report.files["report.md"].read_text()


def test_cli_report(filled_db, tmp_path):
    path, _ = filled_db
    result = CliRunner().invoke(app, ["report", "--db", path, "--out", str(tmp_path / "cli"), "--no-plots", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["trials"] == 14 and data["workloads"] == 4
    assert set(data["files"]) == {"results.tsv", "report.md"}
    table = CliRunner().invoke(app, ["report", "--db", path, "--out", str(tmp_path / "cli2"), "--no-plots"])
    assert table.exit_code == 0 and "rmsnorm" in table.output and "wrote" in table.output


def test_report_of_a_real_interpreter_tune(tmp_path):
    """End to end: a two-candidate tune in the Triton interpreter, then its report."""
    from kernelsmith.tuner import tune_spec

    db = str(tmp_path / "tune.db")
    result = tune_spec(SMALL_SOFTMAX, budget=2, strategy="grid", db=db, workers=1, mode="interpreter")
    report = write_report(db, tmp_path / "tuned", plots=False)
    rows = _read_tsv(report.files["results.tsv"])
    assert len(rows) == result.evaluations == 2
    assert {r["op"] for r in rows} == {"softmax"} and all(r["mode"] == "interpreter" for r in rows)
    assert SMALL_SOFTMAX.workload_hash in report.files["report.md"].read_text()


def test_speedups_name_their_baseline(filled_db, tmp_path):
    """Every decision measured vs eager says torch.compile was not measured; a record that holds a
    torch.compile time is shown against torch.compile first; a kept baseline shows no speedup."""
    path, _ = filled_db
    text = write_report(path, tmp_path / "eager", plots=False).files["report.md"].read_text()
    assert "> speedups are against eager PyTorch; torch.compile not measured for these workloads." in text
    assert "- speedup: none: the baseline (eager PyTorch) is kept" in text  # softmax: nothing replaced
    with open_database(path) as db:
        rms = next(d for d in db.decisions() if d.op == "rmsnorm")
        db.put_decision(DecisionRecord(
            rms.fingerprint, rms.workload, rms.op, rms.spec, rms.winner, rms.variant, rms.source_hash, rms.config,
            metrics={**rms.metrics, "compile_median_us": 46.2},  # Inductor's kernel, nearly as fast
        ))  # fmt: skip
    measured = write_report(path, tmp_path / "compile", plots=False).files["report.md"].read_text()
    assert "1.050x vs torch.compile; 10.000x vs eager" in measured
    assert "torch.compile where it was measured" not in measured  # only one kernel decision, and it was
    table = CliRunner().invoke(app, ["report", "--db", path, "--out", str(tmp_path / "cli"), "--no-plots"],
                               env={"COLUMNS": "200"})  # fmt: skip
    assert "1.050x vs torch.compile" in table.output and "speedups are against torch.compile" in table.output

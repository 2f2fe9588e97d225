"""benchmarks/compare_ops.py: two op benchmark reports of two trees, judged row by row against the
drift of the baselines both runs timed (the code the change did not touch)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from benchmark_scripts import BENCHMARKS, load_benchmark


@pytest.fixture(scope="module")
def compare_ops():
    return load_benchmark("compare_ops")


def row(op: str, kernelsmith: float | None, eager: float, compile_: float, shape: str = "8x4096") -> dict:
    times = {"eager": eager, "compile": compile_}
    if kernelsmith is not None:
        times["kernelsmith"] = kernelsmith
    return {"op": op, "shape": shape, "us": times, "tune": {"winner": "kernel" if kernelsmith else "baseline"}}


def report(*rows: dict) -> dict:
    return {"gpu": "H200", "date": "2026-12-01", "rows": list(rows)}


def test_a_row_slower_than_its_baselines_drift_is_slower_and_noise_is_not(compare_ops):
    before = report(row("rmsnorm", 10.0, 20.0, 12.0), row("softmax", 10.0, 20.0, 12.0), row("gelu", 10.0, 20.0, 12.0))
    after = report(
        row("rmsnorm", 11.0, 20.2, 12.1),  # 10% slower, baselines moved 1%: slower
        row("softmax", 10.5, 21.0, 12.6),  # 5% slower, but so are the baselines: noise
        row("gelu", 9.0, 20.0, 12.0),  # 10% faster
    )  # fmt: skip
    result = compare_ops.compare(before, after, margin=0.02)
    verdicts = {r["op"]: r["verdict"] for r in result["rows"]}
    assert verdicts == {"rmsnorm": "slower", "softmax": "same", "gelu": "faster"}
    assert [r["op"] for r in result["slower"]] == ["rmsnorm"]
    assert result["rows"][0]["ratio"] == pytest.approx(1.1)


def test_a_row_where_the_baseline_won_compares_what_the_user_runs(compare_ops):
    before = report(row("layernorm", None, 20.0, 12.0))  # the baseline kept: the user runs compile's 12 us
    after = report(row("layernorm", 13.5, 20.0, 12.0))  # a kernel served, slower than that
    (only,) = compare_ops.compare(before, after, margin=0.02)["rows"]
    assert only["before_us"] == 12.0 and only["verdict"] == "slower"


def test_rows_of_one_report_only_are_listed_apart(compare_ops):
    before = report(row("sum", 5.0, 8.0, 6.0), {"op": "mean", "shape": "1x1", "error": "boom"})
    after = report(row("max", 5.0, 8.0, 6.0))
    result = compare_ops.compare(before, after, margin=0.02)
    assert result["rows"] == []
    assert {(u["op"], u["in"]) for u in result["unmatched"]} == {("max", "after"), ("sum", "before")}


def test_the_script_prints_the_table_and_writes_its_json(tmp_path):
    before, after, out = tmp_path / "b.json", tmp_path / "a.json", tmp_path / "c.json"
    before.write_text(json.dumps(report(row("rmsnorm", 10.0, 20.0, 12.0))))
    after.write_text(json.dumps(report(row("rmsnorm", 10.0, 20.0, 12.0))))
    done = subprocess.run([sys.executable, str(BENCHMARKS / "compare_ops.py"), str(before), str(after), "--out",
                           str(out)], capture_output=True, text=True, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "0 of 1 rows slower beyond noise" in done.stdout
    assert json.loads(out.read_text())["rows"][0]["verdict"] == "same"
    missing = subprocess.run([sys.executable, str(BENCHMARKS / "compare_ops.py"), str(tmp_path / "no.json"),
                              str(after)], capture_output=True, text=True, check=False)  # fmt: skip
    assert missing.returncode == 2 and "compare_ops:" in missing.stderr


def test_one_baseline_swinging_alone_does_not_excuse_a_slower_kernel(compare_ops):
    """The row's noise is its baselines' median drift: torch.compile alone moving 1.5x (its default
    mode times a reduction's configs at the first call) leaves the kernel's 10% loss visible."""
    steady = {"max-autotune": 11.0, "liger": 13.0}
    before = report({**row("rmsnorm", 10.0, 20.0, 12.0), "us": {"kernelsmith": 10.0, "eager": 20.0, "compile": 12.0,
                                                                **steady}})
    after = report({**row("rmsnorm", 11.0, 20.2, 18.0), "us": {"kernelsmith": 11.0, "eager": 20.2, "compile": 18.0,
                                                               "max-autotune": 11.1, "liger": 13.1}})
    (only,) = compare_ops.compare(before, after, margin=0.02)["rows"]
    assert only["noise"] == pytest.approx(1.01, abs=0.005)
    assert only["verdict"] == "slower"


def test_a_kernel_that_slowed_into_a_fallback_is_caught_by_its_paired_speedup(compare_ops):
    """The served time can hide a kernel regression (the decision falls back to a baseline as fast
    as the old kernel); the tuner's best candidate, paired with eager in the same rounds, cannot."""
    def tuned(kernel_us: float | None, candidate_us: float, compile_us: float) -> dict:
        r = row("layernorm", kernel_us, 65.0, compile_us)
        r["tune"]["top"] = [{"variant": "two_pass", "median_us": candidate_us, "baseline_us": 65.0}]
        return r

    before = report(tuned(40.0, 40.0, compile_us=41.0))
    after = report(tuned(None, 44.0, compile_us=40.4))  # the kernel 10% slower: compile's 40.4 us now served
    (only,) = compare_ops.compare(before, after, margin=0.02)["rows"]
    assert only["verdict"] == "same"  # 40.4 us against 40 us: within what the served time allows
    assert only["kernel_ratio"] == pytest.approx(1.1)
    assert only["kernel_verdict"] == "slower"
    assert compare_ops.compare(before, after, margin=0.02)["slower"] == [only]

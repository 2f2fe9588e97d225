"""The GPU benchmark scripts (benchmarks/attention.py, matmul.py, decode.py) run end to end on the CPU.

Each script's ``--smoke`` takes its real code path (tune, build the winner or best candidate, run
every implementation that is not CUDA-only, compare outputs, write the JSON report) in the Triton
interpreter at tiny shapes, so that a crash is found here rather than on scarce GPU time. Each run
is one small row in a subprocess, exactly as the GPU session invokes the scripts.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from benchmark_scripts import load_benchmark

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "benchmarks"


def run_smoke(script: str, only: str, tmp_path: Path, *extra: str) -> dict[str, Any]:
    out = tmp_path / f"{script}.json"
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT / "src")}
    command = [sys.executable, str(BENCHMARKS / f"{script}.py"), "--smoke", "--only", only,
               "--out", str(out), "--db", str(tmp_path / "bench.db"), *extra]  # fmt: skip
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    assert "SMOKE TEST" in done.stdout  # the table says its timings are not performance
    return json.loads(out.read_text())


@pytest.mark.parametrize(
    ("script", "only", "reference", "expected"),
    [
        # (the slow rows, 30-175 s each in the interpreter, run in CI's second part: make test-slow)
        pytest.param("attention", "decode", "sdpa", {"sdpa"}, marks=pytest.mark.slow),
        pytest.param("matmul", "fused:bias+gelu_tanh", "eager", {"eager", "product only", "cublaslt epilogue"},
                     marks=pytest.mark.slow),
        ("decode", "swiglu", "cublas", {"cublas"}),  # one model and M below: one row
        pytest.param("decode", "attention", "sdpa", {"sdpa", "sdpa repeat_kv"}, marks=pytest.mark.slow),
    ],
)
def test_smoke_runs_a_row_and_compares_the_kernel_with_pytorch(
    script: str, only: str, reference: str, expected: set[str], tmp_path: Path
) -> None:
    extra = ("--models", "1b", "--m", "1") if script == "decode" else ()
    report = run_smoke(script, only, tmp_path, *extra)
    assert report["smoke"] is True and "NOT performance" in report["note"]
    (row,) = report["rows"]
    assert "error" not in row and "errors" not in row, row
    assert row["tune"]["evaluations"] == 2  # the smoke budget
    kernel = "kernelsmith" if row["tune"]["winner"] == "kernel" else "best candidate"
    assert set(row["us"]) == expected | {kernel}  # CUDA-only backends skipped, nothing failed
    diffs = row[f"max_abs_diff_vs_{reference}"]
    assert 0.0 <= diffs[kernel] < 0.1  # bf16 outputs of about unit size: a few units of the last place


def _load(script: str) -> ModuleType:
    return load_benchmark(script)


def test_matmul_only_selects_rows_by_group_label_or_shape() -> None:
    matmul = _load("matmul")

    def selected(selector: str) -> list[str]:
        return [f"{w.label}:{w.shape_text}" for w in matmul.WORKLOADS if w.matches(selector)]

    assert len(selected("plain")) == 3
    assert selected("fused:swiglu") == ["fused:swiglu:8192x11008x4096", "fused:swiglu:16x11008x4096"]
    assert selected("16x4096x4096") == ["decode:none:16x4096x4096"]
    assert selected("fused:residual:16x4096x11008") == ["fused:residual:16x4096x11008"]
    assert selected("swiglu") == []
    assert matmul.main(["--only", "plain,nonsense"]) == 2  # refused before any work


def test_smoke_shapes_keep_each_workload_kind() -> None:
    attention, matmul = _load("attention"), _load("matmul")
    for w in attention.WORKLOADS:
        tiny = w.tiny()
        assert (tiny.label, tiny.causal) == (w.label, w.causal)
        assert (tiny.kv_heads is None, tiny.kv_len is None) == (w.kv_heads is None, w.kv_len is None)
        assert (tiny.shape[2] == 1) == (w.shape[2] == 1)  # a decode step stays one query
    for w in matmul.WORKLOADS:
        tiny = w.tiny()
        assert (tiny.group, tiny.epilogue) == (w.group, w.epilogue)
        assert max(tiny.shape) <= 64 and (tiny.shape[0] <= 16) == (w.shape[0] <= 16)


def test_decode_rows_cover_every_projection_of_both_models() -> None:
    decode = _load("decode")
    rows = decode.workloads(["1b", "8b"], [1, 8], fused=False)
    assert len(rows) == 20 and {w.row for w in rows} == set(decode.ROWS)
    shapes = {(w.model, w.row): (w.n, w.k) for w in rows}
    assert shapes[("1b", "qkv")] == (3072, 2048) and shapes[("8b", "qkv")] == (6144, 4096)
    assert shapes[("1b", "down")] == (2048, 8192) and shapes[("8b", "gate/up")] == (14336, 4096)
    assert shapes[("8b", "lm_head")] == (128256, 4096)
    fused = decode.workloads(["1b"], [1], fused=True, attention=True, cache_lengths=[1024, 4096])
    assert {w.epilogue for w in fused} == {"none", "swiglu", "residual", "rope"}
    assert {w.prologue for w in fused} == {"none", "rmsnorm"}
    assert [(w.m, w.heads, w.kv_heads, w.n, w.k) for w in fused if w.row == "attention"] == [
        (1, 32, 8, 1024, 64), (1, 32, 8, 4096, 64)]  # fmt: skip
    for w in fused:
        tiny = w.tiny()
        assert (tiny.m, tiny.epilogue) == (w.m, w.epilogue) and max(tiny.n, tiny.k) <= 72
        assert tiny.spec().op == w.spec().op  # both sizes are specs the family takes
    assert decode.main(["--models", "70b"]) == 2 and decode.main(["--only", "qkv,nonsense"]) == 2


@pytest.mark.slow  # about 65 s in the interpreter
def test_linear_cross_entropy_smoke_times_the_kernel_against_eager(tmp_path: Path) -> None:
    """benchmarks/linear_cross_entropy.py --smoke: one tiny row, the tuned fused family (or its
    best candidate) agreeing with eager's loss, dh and dW (no torch.compile or Liger on the CPU)."""
    report = run_smoke("linear_cross_entropy", "2048", tmp_path)
    assert report["smoke"] is True and "NOT performance" in report["note"]
    (row,) = report["rows"]
    assert "error" not in row and "errors" not in row, row
    assert row["tune"]["evaluations"] == 2
    (kernel,) = [k for k in row["us"] if k.startswith("kernelsmith")]
    assert set(row["us"]) == {"eager", kernel}
    diffs = row["max_abs_diff_vs_eager"][kernel]
    assert set(diffs) == {"loss", "dh", "dW"} and all(0.0 <= d < 0.05 for d in diffs.values())

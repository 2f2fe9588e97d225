"""benchmarks/scale_out.py (issue 17): the parts that decide what its table says, on the CPU.

The measurement itself needs two GPUs; its whole code path runs with ``--smoke`` in the Triton
interpreter (about 4 minutes per row here, so not in the suite). What is tested here is what
would make a two-GPU run report the wrong thing: when two decisions count as the same, the
refusal on a host without two GPUs, and the table of finished and failed runs.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import pytest

from benchmark_scripts import load_benchmark


@pytest.fixture(scope="module")
def scale_out() -> ModuleType:
    return load_benchmark("scale_out")


def _run(variant: str, config: dict[str, Any], speedup: float, ci: tuple[float, float]) -> dict[str, Any]:
    return {"winner": "kernel", "variant": variant, "config": config, "speedup": speedup, "ci": list(ci),
            "evaluations": 50, "wall_s": 20.0, "evals_per_s": 2.5}  # fmt: skip


def test_decisions_agree_by_identity_or_inside_the_interval(scale_out: ModuleType) -> None:
    one = _run("whole_row", {"BLOCK": 1024}, 1.30, (1.25, 1.36))
    assert scale_out.same_decision(one, _run("whole_row", {"BLOCK": 1024}, 1.9, (1.8, 2.0)))  # same config
    assert scale_out.same_decision(one, _run("looped", {"BLOCK": 512}, 1.27, (1.2, 1.3)))  # inside one's CI
    assert not scale_out.same_decision(one, _run("looped", {"BLOCK": 512}, 1.10, (1.05, 1.15)))
    assert scale_out.same_decision(one, {"error": "RuntimeError: no GPU 1"}) is None


def test_without_two_gpus_it_refuses(scale_out: ModuleType, capsys: pytest.CaptureFixture[str]) -> None:
    assert scale_out.main(["--only", "rmsnorm"]) == 2
    assert "needs two CUDA GPUs" in capsys.readouterr().err
    assert scale_out.main(["--only", "nonsense"]) == 2
    assert "unknown workloads ['nonsense']" in capsys.readouterr().err


def test_the_table_shows_rates_the_speedup_and_failed_runs(scale_out: ModuleType,
                                                           capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    one = _run("whole_row", {"BLOCK": 1024}, 1.3, (1.25, 1.36))
    two = {**one, "wall_s": 10.5, "evals_per_s": 50 / 10.5}
    report = {"gpu": "2 x H200", "date": "2026-12-01", "strategy": "random", "seed": 0,
              "setups": [{"label": "1 GPU"}, {"label": "2 GPUs"}, {"label": "ray 2"}],
              "rows": [{"workload": "rmsnorm", "budget": 50, "runs": {"1 GPU": one, "2 GPUs": two,
                                                                     "ray 2": {"error": "ImportError: ray"}},
                        "throughput_x": 20.0 / 10.5, "same_decision": True},
                       {"workload": "softmax", "budget": 50, "error": "Traceback...\nValueError: boom"}]}  # fmt: skip
    scale_out.print_table(report)
    table = capsys.readouterr().out
    rmsnorm = next(line for line in table.splitlines() if line.startswith("rmsnorm"))
    assert "50 /   20.0 ( 2.50)" in rmsnorm and "50 /   10.5 ( 4.76)" in rmsnorm
    assert " 1.90 " in rmsnorm and "error" in rmsnorm and rmsnorm.endswith("yes")
    assert "softmax" in table and "ERROR ValueError: boom" in table

"""Training steps decided in context (kernelsmith.whole_model.train_step): the verdicts from
measured steps, the memory objective, one step measured on the CPU (peak memory not measured
there), the decision loop over families with builds whose speed is known, and the executions
compared side by side."""

from __future__ import annotations

import time

import pytest
import torch
from torch import nn

from kernelsmith.whole_model import train_step as ts


def measure(name: str, ms: float, peak: int | None) -> ts.StepMeasure:
    return ts.StepMeasure(name, ms, [ms], peak, loss=1.0, grad_norm=1.0)


def test_a_family_stays_only_where_the_step_is_not_slower() -> None:
    base = measure("none", 10.0, 1000)
    verdicts = ts.decide(
        base, {"rmsnorm": measure("rmsnorm", 9.0, 990), "linear_cross_entropy": measure("lce", 11.0, 500)}
    )
    by = {d.family: d for d in verdicts}
    assert by["rmsnorm"].keep and "not slower" in by["rmsnorm"].reason
    assert not by["linear_cross_entropy"].keep and "10.0% slower" in by["linear_cross_entropy"].reason
    assert by["linear_cross_entropy"].memory_saving == pytest.approx(0.5)
    assert by["rmsnorm"].memory_saving == pytest.approx(0.01)


def test_the_memory_objective_accepts_a_slower_step_that_saves_enough() -> None:
    base = measure("none", 10.0, 1000)
    objective = ts.MemoryObjective(min_saving=0.3, max_slowdown=0.15)
    saves, too_slow, saves_too_little = (measure("a", 11.0, 500), measure("b", 12.0, 500), measure("c", 11.0, 800))
    assert objective.judge(saves, base)[0]
    assert "saves 50.0% peak memory" in objective.judge(saves, base)[1]
    assert not objective.judge(too_slow, base)[0]
    assert not objective.judge(saves_too_little, base)[0]
    # Where memory is not measured (a CPU), the objective cannot apply: never slower.
    keep, why = objective.judge(measure("d", 11.0, None), measure("none", 10.0, None))
    assert not keep and "not measured" in why
    with pytest.raises(ValueError):
        ts.MemoryObjective(min_saving=1.5)


def _tiny() -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)), torch.randn(5, 8)


def test_one_step_on_the_cpu_has_times_a_loss_and_gradients_but_no_peak() -> None:
    model, x = _tiny()
    params = list(model.parameters())
    step = ts.train_step(model, params, (x,))
    got = ts.measure_step("eager", step, params, torch.device("cpu"), warmup=1, iterations=3)
    assert len(got.times_ms) == 3 and got.median_ms > 0 and got.peak_bytes is None
    expected = model(x).float().mean().detach()
    assert got.loss == pytest.approx(float(expected))
    assert got.grad_norm == pytest.approx(ts.grad_norm(params)) and got.grad_norm > 0
    assert ts.format_bytes(None) == "-" and ts.format_bytes(3 * 2**30) == "3.00 GiB"


def test_loss_of_prefers_the_models_loss() -> None:
    class Out(dict):
        pass

    loss = torch.tensor(2.0, requires_grad=True)
    assert ts.loss_of(Out(loss=loss, logits=torch.ones(3, requires_grad=True))) is loss
    with pytest.raises(ValueError, match="no loss"):
        ts.loss_of((torch.ones(2),))


def test_the_decision_loop_keeps_the_fast_family_and_drops_the_slow_one() -> None:
    model, x = _tiny()
    delays = {"fast": 0.0, "slow": 0.03}  # seconds added to a step; no replacement adds 0.01

    def build(families: frozenset[str]):
        delay = 0.01 if not families else max(delays[f] for f in families)

        def run(x):
            time.sleep(delay)
            return model(x)

        return run

    params = list(model.parameters())
    chosen, report = ts.decide_training_step(build, ["fast", "slow"], params, torch.device("cpu"), (x,), warmup=1,
                                             iterations=3)  # fmt: skip
    assert report.kept == ["fast"] and report.final is not None and "together: not slower" in report.final_reason
    assert [d.keep for d in report.families] == [True, False]
    assert report.memory_note == ts.NOT_MEASURED
    assert report.to_dict()["families"][1]["family"] == "slow"
    torch.testing.assert_close(chosen(x), model(x))


def test_executions_side_by_side_agree_with_eager(monkeypatch) -> None:
    model, x = _tiny()
    monkeypatch.setattr(torch, "compile", lambda fn, **_: fn)  # (CPU Inductor compiles take seconds)
    results = ts.compare_executions(model, (x,), kernelsmith=model, warmup=0, iterations=1)
    by = {r.name: r for r in results}
    assert list(by) == ["eager", "torch.compile", "kernelsmith", "liger"]
    assert by["eager"].agrees and by["kernelsmith"].agrees and by["kernelsmith"].loss_rel == 0.0
    assert by["liger"].measure is None and by["liger"].skipped  # not installed here, or not a Llama
    without = ts.compare_executions(model, (x,), warmup=0, iterations=1, liger=False)
    assert {r.name: r.skipped for r in without}["kernelsmith"] == "no optimized model was given"


@pytest.mark.slow
def test_the_benchmark_runs_a_tiny_config_on_the_cpu_and_says_so(tmp_path) -> None:
    """benchmarks/train_step.py without a GPU: one tiny row, every execution (Liger skipped where it
    is not installed), agreement with eager, and a table that says its timings are not performance."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    out = tmp_path / "train_step.json"
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(root / "src")}
    command = [sys.executable, str(root / "benchmarks" / "train_step.py"), "--smoke", "--out", str(out),
               "--db", str(tmp_path / "bench.db")]  # fmt: skip
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    assert "SMOKE TEST" in done.stdout and "peak memory is not measured" in done.stdout
    report = json.loads(out.read_text())
    (row,) = report["rows"]
    assert "error" not in row, row.get("error")
    by = {e["name"]: e for e in row["executions"]}
    assert by["eager"]["agrees"] and by["torch.compile"]["agrees"] and by["kernelsmith"]["agrees"]
    assert ("linear_cross_entropy", "not tuned") in [tuple(s) for s in row["sites"]]

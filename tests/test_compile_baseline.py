"""The torch.compile baseline (issue 14, item 4): a kernel is kept only if it beats the best
existing path, eager *and* torch.compile, with confidence.

On a GPU the tuner's final re-check also times the op's reference compiled by torch.compile, in the
worker, in the same rounds and on the same inputs as the eager one; in the interpreter it does not
unless ``KERNELSMITH_COMPILE_BASELINE=on``. Three layers are tested here:

- the worker (in this process): the compiled reference is timed beside the eager one and travels
  through the schema-checked protocol; a compile failure comes back as data;
- the decision (a scripted executor: every candidate passes, its timings are set as multiples of
  the eager baseline's): a compiled baseline faster than the kernel keeps the baseline, a slower one
  lets the kernel win and ``kernelsmith tune`` shows the speedup against torch.compile, a compile
  failure decides against eager and says so; in the interpreter nothing is compiled by default;
- the whole path with real workers and a real torch.compile (slow: Inductor compiles C++ in a
  worker whose caches are private and empty, about two minutes on a loaded 2-core machine).
"""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import replace
from typing import Any

import pytest
import torch

from kernelsmith import tuner
from kernelsmith.db import open_database
from kernelsmith.evaluate import timing, worker
from kernelsmith.evaluate.protocol import (
    Candidate,
    CeilingResult,
    EvalRequest,
    EvalResult,
    TimingSettings,
    WorkerReply,
    decode_reply,
    encode_reply,
)
from kernelsmith.ops import get_op
from kernelsmith.settings import SettingError, compile_baseline_wanted
from kernelsmith.tuner import tune_spec
from kernelsmith.versus import COMPILE_NOT_MEASURED, speedup_text

FAMILY = get_op("softmax")
SPEC = FAMILY.spec((5, 40), "float32")
UNAVAILABLE = "torch.compile baseline unavailable: BackendCompilerFailed: no compiler here"


def test_the_setting_measures_on_a_gpu_by_default_and_on_demand_elsewhere() -> None:
    assert compile_baseline_wanted("gpu", {}) and not compile_baseline_wanted("interpreter", {})
    assert compile_baseline_wanted("interpreter", {"KERNELSMITH_COMPILE_BASELINE": "ON"})
    assert not compile_baseline_wanted("gpu", {"KERNELSMITH_COMPILE_BASELINE": "off"})
    with pytest.raises(SettingError, match="KERNELSMITH_COMPILE_BASELINE"):
        compile_baseline_wanted("gpu", {"KERNELSMITH_COMPILE_BASELINE": "sometimes"})


def test_the_request_carries_the_switch_and_an_older_request_reads_as_off() -> None:
    on = TimingSettings(rounds=6, compile_baseline=True)
    assert TimingSettings.from_json(on.to_json()) == on
    older = {k: v for k, v in on.to_json().items() if k != "compile_baseline"}
    assert TimingSettings.from_json(older).compile_baseline is False


# ---- the worker, in this process -----------------------------------------------------------------
def _timed_in_worker(compile_baseline: bool) -> tuple[dict[int, EvalResult], dict[str, Any]]:
    """The worker's timing of the first built-in softmax candidate, as the decision asks for it."""
    variant = FAMILY.variants[0]
    config = variant.space(SPEC).configs()[0]
    loaded = worker._Loaded(Candidate(variant.name, config), variant.build, variant.build(SPEC, config),
                            variant.source_hash, 0.0, 0.0)  # fmt: skip
    settings = replace(TimingSettings.interpreter(), rounds=4, compile_baseline=compile_baseline)
    request = EvalRequest(SPEC.to_dict(), (loaded.candidate,), "interpreter", settings)
    results, baseline = worker._time(FAMILY, SPEC, [loaded], request, torch.device("cpu"), None)
    # What the tuner receives: the reply after the schema-checked round trip.
    decoded = decode_reply(encode_reply(WorkerReply((results[0],), baseline=baseline)), request)
    return {0: decoded.results[0]}, decoded.baseline


def test_the_worker_times_the_compiled_reference_beside_the_eager_one(monkeypatch: pytest.MonkeyPatch) -> None:
    compiled: list[Any] = []
    real_compile = torch.compile

    def cheap_compile(fn: Any, **kwargs: Any) -> Any:  # Dynamo traces for real; no C++ to build
        compiled.append(fn)
        return real_compile(fn, backend="eager")

    monkeypatch.setattr(worker.torch, "compile", cheap_compile)
    results, baseline = _timed_in_worker(compile_baseline=True)
    metrics = results[0].metrics
    assert results[0].ok and len(compiled) == 1  # once per request
    assert len(metrics["compile_samples_us"]) == len(metrics["samples_us"]) == len(metrics["baseline_samples_us"])
    assert metrics["compile_median_us"] > 0 and baseline["compile_median_us"] == metrics["compile_median_us"]
    assert "compile_baseline_error" not in metrics


def test_a_reference_that_will_not_compile_is_data(monkeypatch: pytest.MonkeyPatch) -> None:
    def failing_compile(fn: Any, **kwargs: Any) -> Any:
        raise RuntimeError("no compiler here")

    monkeypatch.setattr(worker.torch, "compile", failing_compile)
    results, baseline = _timed_in_worker(compile_baseline=True)
    metrics = results[0].metrics
    assert results[0].ok  # the candidate is not to blame
    assert metrics["compile_baseline_error"] == "torch.compile baseline unavailable: RuntimeError: no compiler here"
    assert "compile_samples_us" not in metrics
    assert baseline["compile_baseline_error"] == metrics["compile_baseline_error"]


def test_the_worker_compiles_nothing_unless_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(worker.torch, "compile", lambda *a, **k: pytest.fail("compiled without being asked"))
    results, _ = _timed_in_worker(compile_baseline=False)
    assert results[0].ok and not any(k.startswith("compile_") for k in results[0].metrics)


# ---- the decision, with scripted timings ----------------------------------------------------------
class _Scripted:
    """An executor in which every candidate passes and takes ``kernel`` times the eager baseline's
    time; where the request asks for it, the compiled reference takes ``compiled`` times it (a
    string: the compile failed with that message). ``asked`` holds the re-checks' settings."""

    n_workers = 1

    def __init__(self, kernel: float, compiled: float | str) -> None:
        self.kernel, self.compiled = kernel, compiled
        self.asked: list[TimingSettings] = []

    def _result(self, candidate: Candidate, settings: TimingSettings | None) -> EvalResult:
        eager = [100.0 + (i % 3) for i in range(12)]  # a little spread, so the intervals are real
        samples = [self.kernel * b for b in eager]
        metrics: dict[str, Any] = {**timing.summarize(samples), "samples_us": samples, "baseline_samples_us": eager,
                                   "baseline_median_us": timing.summarize(eager)["median_us"], "gbps": 1.0,
                                   "baseline_gbps": 1.0, "timer": "host-clock-interpreter"}  # fmt: skip
        if settings is not None and settings.compile_baseline:
            if isinstance(self.compiled, str):
                metrics["compile_baseline_error"] = self.compiled
            else:
                metrics["compile_samples_us"] = [self.compiled * b for b in eager]
                metrics["compile_median_us"] = timing.summarize(metrics["compile_samples_us"])["median_us"]
        return EvalResult(candidate, "ok", metrics=metrics, source_hash=FAMILY.variant(candidate.variant).source_hash)

    def submit(self, spec: Any, candidate: Candidate, timing: Any = None, measure: bool = True) -> Future[EvalResult]:
        future: Future[EvalResult] = Future()
        future.set_result(self._result(candidate, None))  # the search: eager only
        return future

    def evaluate_together(self, spec: Any, candidates: Any, timing: TimingSettings | None = None) -> list[EvalResult]:
        assert timing is not None
        self.asked.append(timing)
        return [self._result(c, timing) for c in candidates]

    def confirm(self, *args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a built-in kernel is never confirmed")

    def measure_ceiling(self) -> CeilingResult:
        return CeilingResult("skipped")

    def __enter__(self) -> _Scripted:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


@pytest.fixture
def scripted(monkeypatch: pytest.MonkeyPatch) -> Any:
    """``scripted(kernel, compiled)``: the executor the tuner will use in this test."""

    def make(kernel: float, compiled: float | str) -> _Scripted:
        executor = _Scripted(kernel, compiled)
        monkeypatch.setattr(tuner, "make_executor", lambda *a, **k: executor)
        return executor

    return make


def _tuned(monkeypatch: pytest.MonkeyPatch, setting: str = "on") -> tuple[tuner.TuneResult, dict[str, Any]]:
    monkeypatch.setenv("KERNELSMITH_COMPILE_BASELINE", setting)
    result = tune_spec(SPEC, budget=2, mode="interpreter")
    with open_database() as db:
        decision = db.get_decision(tuner.current_fingerprint("interpreter").hash, SPEC.workload_hash)
    assert decision is not None
    return result, decision.metrics


def test_a_compiled_baseline_faster_than_the_kernel_keeps_the_baseline(
    scripted: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    executor = scripted(kernel=0.5, compiled=0.25)  # twice eager's speed, half torch.compile's
    result, metrics = _tuned(monkeypatch)
    assert executor.asked and all(t.compile_baseline for t in executor.asked)
    assert result.winner == "baseline" and result.best_config == {}
    assert metrics["compile_median_us"] > 0 and metrics["compile_speedup"] == pytest.approx(0.5)
    assert metrics["speedup"] == pytest.approx(2.0)  # it did beat eager: that is not enough
    assert "beat eager PyTorch (2.00x) but not torch.compile" in metrics["note"]


def test_a_kernel_faster_than_both_wins_and_tune_shows_it_against_torch_compile(
    scripted: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from typer.testing import CliRunner

    from kernelsmith.cli.main import app

    scripted(kernel=0.5, compiled=0.8)
    result, metrics = _tuned(monkeypatch)
    assert result.winner == "kernel"
    assert result.compile_speedup == pytest.approx(1.6) and result.compile_ci is not None
    assert metrics["compile_ci_low"] > 1.0 and metrics["compile_median_us"] == pytest.approx(80.0, rel=0.05)
    assert speedup_text("kernel", metrics, ci=False) == "1.60x vs torch.compile; 2.00x vs eager"

    shown = CliRunner().invoke(app, ["tune", "softmax", "--shape", "5x40", "--dtype", "fp32", "--budget", "2"])
    assert shown.exit_code == 0, shown.output
    assert "vs torch.compile" in shown.output and COMPILE_NOT_MEASURED not in shown.output
    assert "torch.compile 80" in shown.output  # the time row names both baselines


def test_a_compile_failure_decides_against_eager_and_says_so(scripted: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    scripted(kernel=0.5, compiled=UNAVAILABLE)
    result, metrics = _tuned(monkeypatch)
    assert result.winner == "kernel" and "compile_median_us" not in metrics
    assert f"{UNAVAILABLE}; decided against eager PyTorch only" in metrics["note"]
    assert speedup_text("kernel", metrics, ci=False) == f"2.00x vs eager; {COMPILE_NOT_MEASURED}"


def test_the_interpreter_compiles_nothing_by_default(scripted: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    executor = scripted(kernel=0.5, compiled=0.25)  # would keep the baseline, were it measured
    result, metrics = _tuned(monkeypatch, setting="auto")
    assert executor.asked and not any(t.compile_baseline for t in executor.asked)
    assert result.winner == "kernel" and result.compile_us is None and "compile_median_us" not in metrics
    assert speedup_text("kernel", metrics).endswith(COMPILE_NOT_MEASURED)


# ---- the whole path: real workers, real torch.compile --------------------------------------------
@pytest.mark.slow
def test_the_real_compiled_baseline_is_measured_and_stored(monkeypatch: pytest.MonkeyPatch) -> None:
    """In the interpreter no kernel beats anything, so the baseline is kept; what matters is that
    the compiled reference was compiled and timed in the worker and its figure stored."""
    result, metrics = _tuned(monkeypatch)
    assert result.winner == "baseline" and "compile_baseline_error" not in metrics.get("note", "")
    assert metrics["compile_median_us"] > 0 and result.compile_us == metrics["compile_median_us"]
    assert 0 < metrics["compile_ci_low"] <= metrics["compile_speedup"] <= metrics["compile_ci_high"]

"""Graph-replay timing (issues 13 and 19): when a workload is timed as replayed CUDA graphs, what
happens when something cannot be captured, and what the results and decisions record.

The rule (:func:`kernelsmith.evaluate.timing.choose_timing_mode`) and the plan
(:func:`kernelsmith.evaluate.timing.plan_timing`) are host-only: they take the measurements and
the capture as functions, so they are tested here with fakes. The device side (a launch-bound
baseline timed close to its kernel time, a synchronizing candidate rejected) is in
tests/gpu/test_graph_timing_gpu.py.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
import torch

from kernelsmith._tuner_records import _result_from_decision
from kernelsmith.db import DecisionRecord, current_fingerprint
from kernelsmith.evaluate import timing, worker
from kernelsmith.evaluate.protocol import (
    Candidate,
    EvalRequest,
    ProtocolError,
    TimingSettings,
    WorkerReply,
    decode_reply,
    encode_reply,
)
from kernelsmith.evaluate.timing import GRAPH_REPLAY, PROBE_MAX_US, STREAM, choose_timing_mode, plan_timing
from kernelsmith.ops import get_op

LAUNCH_BOUND = ([40.0, 41.0, 39.0, 42.0, 40.5], [10.0, 10.5, 9.8, 10.2, 10.1])  # stream, graph (us)
COMPUTE_BOUND = ([100.0, 101.0, 99.0, 102.0], [99.5, 100.5, 100.0, 101.0])


# ---- the rule ----------------------------------------------------------------------------------
def test_the_setting_overrides_the_rule_both_ways() -> None:
    assert choose_timing_mode("never", "decode_matmul", 5.0, *LAUNCH_BOUND).mode == STREAM
    assert choose_timing_mode("always", "rmsnorm", 5000.0, *COMPUTE_BOUND).mode == GRAPH_REPLAY


def test_decode_families_are_always_timed_as_graph_replays() -> None:
    for name in timing.DECODE_FAMILIES:
        choice = choose_timing_mode("auto", name, 5000.0, *COMPUTE_BOUND)
        assert choice.mode == GRAPH_REPLAY and "decode" in choice.reason


def test_a_launch_bound_baseline_is_timed_as_graph_replays_and_the_reason_has_the_figures() -> None:
    choice = choose_timing_mode("auto", "rmsnorm", 40.0, *LAUNCH_BOUND)
    assert choice.mode == GRAPH_REPLAY
    assert "launch-bound" in choice.reason and "40.5 us by stream" in choice.reason and "10.1 us" in choice.reason


def test_a_gap_within_noise_or_a_long_call_keeps_stream_timing() -> None:
    assert choose_timing_mode("auto", "rmsnorm", 100.0, *COMPUTE_BOUND).mode == STREAM
    # Medians 10% apart, but the spreads overlap: not a gap bigger than noise.
    noisy = ([8.0, 11.0, 14.0, 30.0], [9.0, 10.0, 12.0, 13.0])
    assert choose_timing_mode("auto", "rmsnorm", 10.0, *noisy).mode == STREAM
    long_call = choose_timing_mode("auto", "rmsnorm", PROBE_MAX_US + 1, *LAUNCH_BOUND)
    assert long_call.mode == STREAM and "not launch-bound" in long_call.reason
    assert choose_timing_mode("auto", "rmsnorm", 10.0).mode == STREAM  # nothing measured both ways


# ---- the plan, with fake measurements and captures --------------------------------------------
class Fakes:
    """``fns`` are labels; capture fails for the labels in ``uncapturable``; the baseline is
    measured as ``figures`` (one call, stream samples, graph samples)."""

    def __init__(self, uncapturable: set[str] = frozenset(), figures: tuple[Any, ...] = (40.0, *LAUNCH_BOUND)) -> None:  # type: ignore[assignment]
        self.uncapturable = uncapturable
        self.figures = figures
        self.captured: list[str] = []
        self.measured = 0

    def capture(self, fn: Any) -> Any:
        self.captured.append(fn.label)
        if fn.label in self.uncapturable:
            return "RuntimeError: operation not permitted when stream is capturing"
        return Replay(fn.label)

    def measure(self, stream_fn: Any, graph_fn: Any) -> tuple[float, list[float], list[float]]:
        self.measured += 1
        single, stream_us, graph_us = self.figures
        return (single, [], []) if graph_fn is None else (single, list(stream_us), list(graph_us))


class Fn:
    def __init__(self, label: str) -> None:
        self.label = label

    def __call__(self, s: int) -> None:
        return None


class Replay(Fn):
    """What the fake capture returns: a runner marked as a replay of ``label``."""


FNS = [Fn("eager"), Fn("compiled"), Fn("cand0"), Fn("cand1")]


def _plan(requested: str, op: str, fakes: Fakes) -> timing.TimingPlan:
    return plan_timing(requested, op, FNS, 2, fakes.measure, fakes.capture)


def test_never_neither_measures_nor_captures() -> None:
    fakes = Fakes()
    plan = _plan("never", "rmsnorm", fakes)
    assert plan.choice.mode == STREAM and plan.runners == FNS and plan.kept == [0, 1, 2, 3]
    assert fakes.captured == [] and fakes.measured == 0


def test_a_launch_bound_workload_replays_every_implementation() -> None:
    fakes = Fakes()
    plan = _plan("auto", "rmsnorm", fakes)
    assert plan.choice.mode == GRAPH_REPLAY and not plan.failed
    assert all(isinstance(r, Replay) for r in plan.runners)
    assert [r.label for r in plan.runners] == ["eager", "compiled", "cand0", "cand1"]  # type: ignore[attr-defined]


def test_a_long_baseline_call_is_not_even_captured() -> None:
    fakes = Fakes(figures=(PROBE_MAX_US * 3, [], []))
    plan = _plan("auto", "rmsnorm", fakes)
    assert plan.choice.mode == STREAM and fakes.captured == [] and plan.runners == FNS


def test_a_workload_that_is_not_launch_bound_is_stream_timed_after_the_probe() -> None:
    fakes = Fakes(figures=(100.0, *COMPUTE_BOUND))
    plan = _plan("auto", "rmsnorm", fakes)
    assert plan.choice.mode == STREAM and fakes.captured == ["eager"] and plan.runners == FNS


def test_a_decode_family_is_captured_without_a_probe() -> None:
    fakes = Fakes()
    plan = _plan("auto", "decode_matmul", fakes)
    assert plan.choice.mode == GRAPH_REPLAY and fakes.measured == 0 and len(plan.runners) == 4


def test_an_uncapturable_eager_baseline_falls_back_to_stream_timing_and_says_so() -> None:
    plan = _plan("auto", "decode_attention", Fakes({"eager"}))
    assert plan.choice.mode == STREAM and plan.runners == FNS and not plan.failed
    assert "eager baseline cannot be captured" in plan.choice.reason
    assert "operation not permitted" in plan.choice.reason


def test_an_uncapturable_compiled_baseline_falls_back_to_stream_timing_for_every_implementation() -> None:
    plan = _plan("always", "rmsnorm", Fakes({"compiled"}))
    assert plan.choice.mode == STREAM and plan.runners == FNS and not plan.failed
    assert plan.choice.reason.startswith("the compiled baseline cannot be captured")


def test_an_uncapturable_candidate_fails_with_the_reason_and_the_others_are_still_timed() -> None:
    plan = _plan("auto", "decode_matmul", Fakes({"cand0"}))
    assert plan.choice.mode == GRAPH_REPLAY
    assert plan.kept == [0, 1, 3] and [r.label for r in plan.runners] == ["eager", "compiled", "cand1"]  # type: ignore[attr-defined]
    assert set(plan.failed) == {2}
    for words in ("cannot be captured in a CUDA graph", "decode kernels must be capturable", "operation not permitted"):
        assert words in plan.failed[2]


# ---- the settings, the results and the decision -------------------------------------------------
def test_the_setting_travels_in_the_request_and_an_older_request_reads_as_auto() -> None:
    always = TimingSettings(rounds=6, graph_replay="always")
    assert TimingSettings.from_json(always.to_json()) == always
    older = {k: v for k, v in always.to_json().items() if k != "graph_replay"}
    assert TimingSettings.from_json(older).graph_replay == "auto"
    with pytest.raises(ProtocolError, match="graph_replay"):
        TimingSettings.from_json({**always.to_json(), "graph_replay": "sometimes"})


def test_the_worker_records_the_timing_mode_in_every_result_and_the_baseline() -> None:
    family = get_op("softmax")
    spec = family.spec((5, 40), "float32")
    variant = family.variants[0]
    config = variant.space(spec).configs()[0]
    loaded = worker._Loaded(Candidate(variant.name, config), variant.build, variant.build(spec, config),
                            variant.source_hash, 0.0, 0.0)  # fmt: skip
    request = EvalRequest(spec.to_dict(), (loaded.candidate,), "interpreter",
                          replace(TimingSettings.interpreter(), rounds=4))  # fmt: skip
    results, baseline = worker._time(family, spec, [loaded], request, torch.device("cpu"), None)
    # Through the schema-checked protocol, as the tuner receives it: the text metrics are allowed.
    decoded = decode_reply(encode_reply(WorkerReply((results[0],), baseline=baseline)), request)
    metrics = decoded.results[0].metrics
    assert decoded.results[0].ok
    assert metrics["timing_mode"] == decoded.baseline["timing_mode"] == timing.HOST_CLOCK
    assert "interpreter" in metrics["timing_mode_reason"]


def test_a_stored_decision_gives_its_timing_mode_to_the_tune_result() -> None:
    fp = current_fingerprint("interpreter")
    spec = get_op("softmax").spec((5, 40), "float32")
    decision = DecisionRecord(fingerprint=fp.hash, workload=spec.workload_hash, op="softmax", spec=spec.to_dict(),
                              winner="kernel", variant="v", config={}, strategy="random", evaluations=1,
                              metrics={"median_us": 1.0, "timing_mode": GRAPH_REPLAY})  # fmt: skip
    result = _result_from_decision(decision, fp, from_database=True, evaluations=1)
    assert result.timing_mode == GRAPH_REPLAY and result.to_dict()["timing_mode"] == GRAPH_REPLAY


def test_a_confirmation_is_pinned_to_the_mode_the_re_check_used() -> None:
    assert timing.pinned_graph_replay({"timing_mode": GRAPH_REPLAY}) == "always"
    assert timing.pinned_graph_replay({"timing_mode": STREAM}) == "never"
    assert timing.pinned_graph_replay({"timing_mode": timing.HOST_CLOCK}) == "never"


def test_the_stored_decision_records_how_its_re_check_was_timed(monkeypatch: pytest.MonkeyPatch) -> None:
    from kernelsmith import tuner
    from kernelsmith.db import open_database
    from test_compile_baseline import _Scripted  # the scripted executor of the compile-baseline tests

    class Replayed(_Scripted):
        def _result(self, candidate: Candidate, settings: TimingSettings | None) -> Any:
            result = super()._result(candidate, settings)
            result.metrics.update(timing_mode=GRAPH_REPLAY, timing_mode_reason="decode_matmul is a decode family")
            return result

    monkeypatch.setattr(tuner, "make_executor", lambda *a, **k: Replayed(kernel=0.5, compiled=0.5))
    spec = get_op("softmax").spec((5, 40), "float32")
    result = tuner.tune_spec(spec, budget=2, mode="interpreter")
    with open_database() as db:
        decision = db.get_decision(tuner.current_fingerprint("interpreter").hash, spec.workload_hash)
    assert decision is not None
    assert decision.metrics["timing_mode"] == GRAPH_REPLAY and "decode family" in decision.metrics["timing_mode_reason"]
    assert result.timing_mode == GRAPH_REPLAY

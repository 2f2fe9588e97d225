"""Graph-replay timing on a real GPU (issues 13 and 19): what the CPU tests of the rule and the
plan (tests/test_graph_timing.py) cannot show.

- A launch-bound baseline (30 tiny PyTorch ops) timed by stream events is charged the host's
  launch gaps; replayed as a CUDA graph it is timed close to the sum of its kernels' device time,
  and the rule of :func:`kernelsmith.evaluate.timing.choose_timing_mode` calls it launch-bound.
- A candidate that synchronizes inside its call cannot be captured: under graph replay it is a
  failure result that says why, not an exception out of the worker.
- Rule 5 still holds under graph replay: the graphs read the refilled input buffers, so a
  launcher that caches by address (host code runs once, at capture) is caught.
- A decode family's result says it was timed as graph replays.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest
import torch

from kernelsmith.evaluate import timing
from kernelsmith.evaluate.kernel_file import parse_kernel_file
from kernelsmith.evaluate.pool import Evaluator
from kernelsmith.evaluate.protocol import Candidate, TimingSettings
from kernelsmith.ops import get_op
from kernelsmith.ops._base import Launcher
from kernelsmith.space import Config
from kernelsmith.spec import OpSpec
from kernelsmith.testing.bad_kernels import source
from kernelsmith.testing.harness import caches_by_address, evaluate_launcher

pytestmark = pytest.mark.gpu

RMSNORM = get_op("rmsnorm").spec((64, 4096), "bfloat16")
CONFIG = Config(num_warps=8)
ALWAYS = TimingSettings(rounds=20, graph_replay="always")
TINY_OPS = 30


def _kernel_us_per_call(fn: timing.Runner, calls: int = 10) -> float:
    """Sum of the device time of the kernels one call of ``fn(0)`` launches (the profiler's)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn(0)
        torch.cuda.synchronize()
    # The device's own events only (an operator's event also carries its kernels' time).
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    assert len(kernels) >= TINY_OPS * calls, len(kernels)
    return sum(e.time_range.elapsed_us() for e in kernels) / calls


def test_a_launch_bound_baseline_replayed_is_timed_close_to_its_kernels() -> None:
    sets = [torch.randn(256, device="cuda") for _ in range(2)]

    def tiny_ops(s: int) -> torch.Tensor:
        y = sets[s]
        for _ in range(TINY_OPS):
            y = y.mul(1.0001)
        return y

    flusher = timing.L2Flusher(torch.device("cuda"))
    replay = timing.capture_or_reason(tiny_ops, len(sets))
    assert not isinstance(replay, str), replay
    stream_us, graph_us = timing.interleaved_gpu([tiny_ops, replay], len(sets), 40, 10.0, flusher)
    kernels = _kernel_us_per_call(tiny_ops)
    stream, graph = timing.summarize(stream_us)["median_us"], timing.summarize(graph_us)["median_us"]
    # A replayed graph still has a short gap between its nodes; host launches are several times it.
    assert graph <= 2.0 * kernels + 10.0, (graph, kernels)
    assert stream > 1.5 * graph, (stream, graph)
    choice = timing.choose_timing_mode("auto", "rmsnorm", min(stream_us), stream_us, graph_us)
    assert choice.mode == timing.GRAPH_REPLAY and "launch-bound" in choice.reason


def _synchronizes_inside(spec: OpSpec, config: Config) -> Launcher:
    launcher = parse_kernel_file(source("correct_rmsnorm")).build(spec, CONFIG)

    def launch(inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> None:
        launcher(inputs, outputs)
        torch.cuda.synchronize()  # fine on a stream; forbidden while a graph is being captured

    return launch


def test_a_candidate_that_synchronizes_inside_is_rejected_with_the_reason() -> None:
    result = evaluate_launcher(RMSNORM, _synchronizes_inside, mode="gpu", timing=ALWAYS)
    assert result.status == "runtime", (result.status, result.error)
    assert "cannot be captured in a CUDA graph" in result.error
    # The same launcher, stream-timed, is measured: only the capture refuses it.
    streamed = evaluate_launcher(RMSNORM, _synchronizes_inside, mode="gpu",
                                 timing=TimingSettings(rounds=20, graph_replay="never"))  # fmt: skip
    assert streamed.ok and streamed.metrics["timing_mode"] == timing.STREAM, streamed.error


def test_rule5_a_cache_by_address_is_caught_under_graph_replay() -> None:
    result = evaluate_launcher(RMSNORM, caches_by_address(CONFIG), mode="gpu", timing=ALWAYS)
    assert result.status == "cheat", (result.status, result.error)
    assert "outputs written while timing are wrong" in result.error


def test_an_honest_kernel_under_graph_replay_is_measured_and_says_so() -> None:
    result = evaluate_launcher(RMSNORM, lambda spec, config: parse_kernel_file(source("correct_rmsnorm")).build(
        spec, CONFIG), mode="gpu", timing=ALWAYS)  # fmt: skip
    assert result.ok, result.error
    m = result.metrics
    assert m["timing_mode"] == timing.GRAPH_REPLAY and "graph_replay='always'" in m["timing_mode_reason"]
    assert 0 < m["median_us"] < 1000 and 0 < m["baseline_median_us"] < 1000


def test_a_decode_family_is_timed_as_graph_replays() -> None:
    family = get_op("decode_matmul")
    spec = family.spec((1, 2048, 2048), "bf16")
    variant = family.variants[0]
    config = variant.space(spec).configs()[0]
    with Evaluator("gpu", workers=1) as evaluator:
        (result,) = evaluator.evaluate(spec, [Candidate(variant.name, config)])
    assert result.ok, result.error
    assert result.metrics["timing_mode"] == timing.GRAPH_REPLAY
    assert "decode family" in result.metrics["timing_mode_reason"]

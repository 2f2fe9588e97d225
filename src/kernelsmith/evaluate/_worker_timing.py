"""Timing in the worker: the baselines and every loaded candidate, interleaved, and the checks
that only timing can make.

Part of the worker (:mod:`kernelsmith.evaluate.worker`). :func:`_time` times the eager reference
(and, when asked, the reference compiled by torch.compile, :func:`_compiled_reference`) and the
candidates in the same rounds on rotating input sets, under the device lock. Halfway through it
refills the inputs in place and pre-fills the outputs, and checks the outputs written after
(rule 5); for a family that writes its inputs it checks their state afterwards (rule 2,
:func:`_written_state_problem`); on a GPU a device-synchronized pass looks for work left on the
device after each call's stream was done (rule 6, :func:`timing.side_work_problem`). Whether
calls are launched from the host or replayed from CUDA graphs is :func:`_timing_plan`'s choice;
:mod:`kernelsmith.evaluate.timing` has the clocks and the rules.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from kernelsmith.evaluate import errors, timing
from kernelsmith.evaluate._worker_candidates import _gpu_lock, _Loaded
from kernelsmith.evaluate.protocol import EvalRequest, EvalResult, TimingSettings
from kernelsmith.evaluate.validate import allocate_outputs, expected_inputs, input_problem, prefill_
from kernelsmith.ops._base import OpFamily
from kernelsmith.spec import OpSpec

log = logging.getLogger(__name__)


COMPILE_UNAVAILABLE = "torch.compile baseline unavailable"


def _compiled_reference(
    op: OpFamily, spec: OpSpec, inputs: list[torch.Tensor], synchronize: Callable[[], None]
) -> tuple[Callable[[list[torch.Tensor]], object] | None, str]:
    """The op's PyTorch reference compiled by ``torch.compile`` (default mode), compiled by one call
    on ``inputs``: the path a user of torch.compile would otherwise run. ``(runner, "")``, or
    ``(None, "torch.compile baseline unavailable: <why>")``: a failure to compile is data.

    Dynamo's caches are cleared first: this worker compiles the same wrapper for workload after
    workload, and past Dynamo's recompile limit it would silently run the function eagerly.
    Inductor compiles in this process (``compile_threads = 1``): the worker ends every process a
    request leaves behind, which would break a pool of compile workers kept for the next request.
    """
    try:
        import torch._dynamo
        import torch._inductor.config as inductor_config

        torch._dynamo.reset()
        inductor_config.compile_threads = 1
        compiled = torch.compile(lambda *tensors: op.reference(spec, tensors))
        compiled(*inputs)  # compiles here, before any timing
        synchronize()
    except Exception as exc:
        log.warning("%s: %s", COMPILE_UNAVAILABLE, exc)
        return None, f"{COMPILE_UNAVAILABLE}: {type(exc).__name__}: {exc}"[:200]
    return lambda tensors: compiled(*tensors), ""


def _written_state_problem(
    op: OpFamily, spec: OpSpec, sets: Sequence[Sequence[torch.Tensor]], pre_call: Sequence[Sequence[torch.Tensor]]
) -> str | None:
    """Rule 2 after timing, for a family that writes inputs: None when every input set is in the
    state one call from its pre-call state gives (written inputs as the family's
    ``reference_written``, the others unchanged), else what is wrong."""
    written = op.written_inputs(spec)
    for s, (inputs, before) in enumerate(zip(sets, pre_call, strict=True)):
        expected = expected_inputs(op, spec, [t.clone() for t in before])
        problem = input_problem(inputs, expected, written)
        if problem:
            return f"input set {s} was left in a wrong state while timing: {problem[1]}"
    return None


def _time(
    op: OpFamily,
    spec: OpSpec,
    loaded: list[_Loaded],
    request: EvalRequest,
    device: torch.device,
    flusher: timing.L2Flusher | None,
) -> tuple[dict[int, EvalResult], dict[str, Any]]:
    """Time the baseline and every loaded candidate, interleaved, on rotating input sets; returns
    the candidates' results and the baseline's own timing (its summary and ``samples_us``).

    With ``timing.compile_baseline``, the reference compiled by torch.compile is timed too, in the
    same rounds on the same input sets: each result then carries ``compile_median_us`` and
    ``compile_samples_us`` (paired with its own ``samples_us``), or ``compile_baseline_error``.

    With no candidates loaded this times the baseline alone (a confirmation's clean baseline).

    Rule 5: halfway through, every input set is refilled *in place* with new values and every
    output is pre-filled again (a secret choice of NaN, random values or zeros); the outputs left
    by the second half must match the references of the new values. A kernel that caches
    results by address or content fails here.

    On a GPU each timed call is either launched from the host (stream timing) or the replay of a
    CUDA graph captured once per implementation and input set (graph replay: a launch-bound
    baseline, or a decode family, see :func:`timing.choose_timing_mode`); every result and the
    baseline's figures say which (``timing_mode``) and why (``timing_mode_reason``). A candidate
    that cannot be captured where graph replay is used is a "runtime" failure saying so.
    """
    settings = request.timing
    gpu = request.mode == "gpu"
    synchronize: Callable[[], None] = torch.cuda.synchronize if gpu else (lambda: None)
    n_sets = settings.input_sets
    rounds = max(settings.rounds, 2 * n_sets)
    distribution = op.distributions[0]

    def baseline(s: int) -> object:
        return op.reference(spec, sets[s])

    def runner(i: int) -> Callable[[int], object]:
        launcher = loaded[i].launcher
        return lambda s: launcher(sets[s], outs[i][s])

    sync_rounds: list[list[timing.SyncRound]] = []  # rule 6's pass, per implementation timed
    stale: dict[int, str] = {}  # candidate index -> what its outputs written while timing got wrong
    compile_error = ""
    timing_started = time.perf_counter()
    with _gpu_lock(request.lock_path):
        sets = [list(op.make_inputs(spec, secrets.randbits(62), distribution, device)) for _ in range(n_sets)]
        outs = [[allocate_outputs(op, spec, device) for _ in range(n_sets)] for _ in loaded]
        # The baselines come first: the eager reference, then (if asked for and it compiles) the
        # compiled one, compiled here, once per request, on the full-size inputs it is timed on.
        runners: list[Callable[[int], object]] = [baseline]
        if settings.compile_baseline:
            compiled, compile_error = _compiled_reference(op, spec, sets[0], synchronize)
            if compiled is not None:
                run_compiled = compiled
                runners.append(lambda s: run_compiled(sets[s]))
        first_candidate = len(runners)
        runners += [runner(i) for i in range(len(loaded))]
        if gpu:
            plan = _timing_plan(op, spec, settings, runners, first_candidate, flusher)
            uncaptured = {i - first_candidate: why for i, why in plan.failed.items()}
            kept = [i - first_candidate for i in plan.kept[first_candidate:]]
            runners = plan.runners
            choice = plan.choice
        else:
            uncaptured, kept = {}, list(range(len(loaded)))
            choice = timing.ModeChoice(timing.HOST_CLOCK, "the Triton interpreter, timed by the host clock")
        if gpu:
            first = timing.interleaved_gpu(runners, n_sets, rounds // 2, settings.warmup_ms, flusher)
        else:
            first = timing.interleaved_cpu(runners, n_sets, rounds // 2)
        # The refill's values are kept as drawn (``pre_call``: no implementation ever sees these
        # tensors), and the second half's outputs are judged against references of them: a
        # kernel that writes its input buffers while timing cannot move what it is judged
        # against. A family that writes inputs (a KV cache) leaves them written by the first
        # half; the refill resets them to this pre-call state, which also checks the second
        # half's writes. (Kept as inputs rather than as references computed now: float64
        # references of every set would take about four times the outputs' memory.)
        writes = op.written_inputs(spec)
        pre_call: list[Sequence[torch.Tensor]] = []
        for k in range(n_sets):
            fresh = op.make_inputs(spec, secrets.randbits(62), distribution, device)
            for t, f in zip(sets[k], fresh, strict=True):
                t.copy_(f)
            pre_call.append(fresh)
        prefill_(t for per_candidate in outs for out_set in per_candidate for t in out_set)
        if gpu:
            second = timing.interleaved_gpu(runners, n_sets, rounds - rounds // 2, 0.0, flusher)
            sync_rounds = timing.synchronized_gpu(runners, n_sets, timing.SIDE_WORK_ROUNDS)
        else:
            second = timing.interleaved_cpu(runners, n_sets, rounds - rounds // 2)
        # Rule 5's check runs on the device too: inside the lock, like all device work.
        # Written inputs: every implementation timed wrote the same rows at the same place
        # (idempotent), so each set must now be in the one state its refill implies; which
        # implementation broke that cannot be told apart on shared sets, so none is trusted.
        wrong_state = _written_state_problem(op, spec, sets, pre_call) if writes else None
        for s in range(n_sets):
            # (the references, PyTorch's answer and the family's floors of the pre-call state: the
            # same judgement as validation's)
            refs = errors.references(op, spec, pre_call[s])
            for i in kept:
                reason = refs.problem(outs[i][s], op.tolerance)
                if reason and i not in stale:
                    stale[i] = reason
            del refs
        sets.clear()  # drop every full-size tensor before handing the memory back
        pre_call.clear()
        outs.clear()
        runners.clear()  # and the captured graphs with their memory pools
        if gpu:
            torch.cuda.empty_cache()  # the next worker to hold the lock needs this memory

    timed_s = time.perf_counter() - timing_started
    samples = [a + b for a, b in zip(first, second, strict=True)]
    base = timing.summarize(samples[0])
    mode_figures = {"timing_mode": choice.mode, "timing_mode_reason": choice.reason[:200]}
    compiled_figures: dict[str, Any] = {"compile_baseline_error": compile_error} if compile_error else {}
    if first_candidate == 2:
        compiled_figures["compile_median_us"] = timing.summarize(samples[1])["median_us"]
        compiled_figures["compile_samples_us"] = [round(x, 3) for x in samples[1]]
    nbytes = op.bytes_moved(spec)
    results: dict[int, EvalResult] = {}
    for i, item in enumerate(loaded):
        if i in uncaptured:
            results[i] = EvalResult(item.candidate, "runtime", uncaptured[i][:2000], source_hash=item.source_hash,
                                    seconds=time.perf_counter() - item.started)  # fmt: skip
            continue
        timed_index = first_candidate + kept.index(i)  # its place among the implementations still timed
        problem = None
        if i in stale:
            problem = f"outputs written while timing are wrong (cached or stale results?): {stale[i]}"
        elif wrong_state:
            problem = wrong_state
        stats = timing.summarize(samples[timed_index])
        if gpu and problem is None:
            # Rule 6: work hidden on another stream or thread escapes the events but not a
            # device-wide synchronize. What the device still did after the call's own stream was
            # done, beyond the baseline's, is the hidden work; the host's time to issue the call
            # is left out (a busy host slows a multi-launch kernel's issue, not its device work).
            # The rule, and why each attack is still caught: timing's rule-6 section.
            problem = timing.side_work_problem(sync_rounds[timed_index], sync_rounds[0], stats["min_us"])
        if problem:
            results[i] = EvalResult(
                item.candidate,
                "cheat",
                problem,
                source_hash=item.source_hash,
                seconds=time.perf_counter() - item.started,
            )
            continue
        metrics: dict[str, Any] = dict(stats)
        metrics.update({f"baseline_{k}": v for k, v in base.items() if k != "n"})
        metrics["samples_us"] = [round(x, 3) for x in samples[timed_index]]
        metrics["baseline_samples_us"] = [round(x, 3) for x in samples[0]]
        metrics.update(compiled_figures)
        metrics.update(mode_figures)
        metrics["gbps"] = nbytes / (stats["median_us"] * 1e-6) / 1e9
        metrics["baseline_gbps"] = nbytes / (base["median_us"] * 1e-6) / 1e9
        metrics["timer"] = "cuda-events" if gpu else "host-clock-interpreter"
        metrics["validate_s"] = item.validate_s  # includes compilation
        metrics["time_s"] = timed_s  # includes waiting for the device lock
        results[i] = EvalResult(
            item.candidate,
            "ok",
            metrics=metrics,
            source_hash=item.source_hash,
            seconds=time.perf_counter() - item.started,
        )
    return results, {**base, "samples_us": [round(x, 3) for x in samples[0]], **compiled_figures, **mode_figures}


def _timing_plan(
    op: OpFamily, spec: OpSpec, settings: TimingSettings, runners: list[Callable[[int], object]],
    n_baselines: int, flusher: timing.L2Flusher | None,
) -> timing.TimingPlan:
    """Stream timing or graph replay for this request (:func:`timing.plan_timing`, whose rule is
    :func:`timing.choose_timing_mode`), measured and captured on the device, under the lock.

    Graph replay keeps rule 5: each graph reads the input buffers ``sets[s]`` and writes the
    output buffers ``outs[i][s]`` it was captured with, so the in-place refill of the inputs and
    the pre-fill of the outputs halfway through reach the replayed calls, and the stale-output
    check reads what the replays wrote. Rule 6's device-synchronized timing replays them too.
    """
    n_sets = settings.input_sets

    def measure(stream_fn: Callable[[int], object], graph_fn: Callable[[int], object] | None
                ) -> tuple[float, list[float], list[float]]:  # fmt: skip
        single = timing.one_call_us(stream_fn, flusher)
        if graph_fn is None:
            return single, [], []
        both = timing.interleaved_gpu([stream_fn, graph_fn], n_sets, timing.PROBE_ROUNDS,
                                      min(settings.warmup_ms, 5.0), flusher)  # fmt: skip
        return single, both[0], both[1]

    plan = timing.plan_timing(settings.graph_replay, spec.op, runners, n_baselines, measure,
                              lambda fn: timing.capture_or_reason(fn, n_sets))  # fmt: skip
    log.info("%s: timed by %s (%s)", spec.describe(), plan.choice.mode, plan.choice.reason)
    return plan

"""The worker process: builds, validates and times candidates, isolated from the caller.

Started by :mod:`kernelsmith.evaluate.pool` as ``python -m kernelsmith.evaluate.worker FD``; it
reads requests from the connection on file descriptor FD and answers each with a
:class:`WorkerReply`, as JSON data (never pickle). Every failure becomes data in the reply.
Before any candidate loads it caps its memory and becomes the subreaper of everything it starts
(:mod:`kernelsmith.evaluate.sandbox`), and after every request it ends all of it. A candidate
that might have left the process in a bad state (a CUDA fault, tampering) makes the worker ask
to be recycled: it answers, then exits, and the pool starts a fresh one for the next request.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import logging
import secrets
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

import torch

from kernelsmith.evaluate import errors, sandbox, timing
from kernelsmith.evaluate.kernel_file import KernelFileError, check_kernel_file, parse_kernel_file
from kernelsmith.evaluate.protocol import (
    MAX_REQUEST_BYTES,
    Candidate,
    CeilingRequest,
    CeilingResult,
    EvalRequest,
    EvalResult,
    ProtocolError,
    Request,
    TimingSettings,
    WorkerReply,
    decode_request,
    encode_ready,
    encode_reply,
)
from kernelsmith.evaluate.validate import (
    Rejected,
    allocate_outputs,
    expected_inputs,
    input_problem,
    prefill_,
    run_checked,
    seal_harness,
    validate,
)
from kernelsmith.ops import get_op
from kernelsmith.ops._base import Launcher, OpFamily
from kernelsmith.space import Space
from kernelsmith.spec import OpSpec

log = logging.getLogger(__name__)


@dataclass
class _Loaded:
    candidate: Candidate
    build: Callable[[OpSpec, Any], Launcher]
    launcher: Launcher
    source_hash: str
    started: float
    validate_s: float  # loading, compiling and validating


# ---- loading candidates ------------------------------------------------------------------------
def _load_source(source: str) -> tuple[Callable[..., Launcher], Callable[[OpSpec], Space], str]:
    """``build``, ``space`` and source hash of candidate source, which must be a kernel file.

    There is no other form: a candidate's own Python never runs here (docs/kernel-files.md). A
    file that fails the gate is a "cheat" whose message lists what is wrong and what is allowed;
    one that passes but will not load (Triton refuses a function) is a "build" failure.
    """
    try:
        compile(source, "<candidate>", "exec")  # compiled only, never run: to tell typos from the gate
    except (SyntaxError, ValueError) as exc:
        raise Rejected("build", f"syntax error in candidate source: {exc}") from exc
    problems = check_kernel_file(source)
    if problems:
        raise Rejected("cheat", "kernel file: " + "; ".join(problems[:6]))
    try:
        kernel_file = parse_kernel_file(source)
    except KernelFileError as exc:
        raise Rejected("build", f"kernel file: {exc}") from exc
    return kernel_file.build, kernel_file.space, kernel_file.source_hash


def _load(
    op: OpFamily, spec: OpSpec, candidate: Candidate, static_gate: object = None
) -> tuple[Callable[..., Launcher], str]:
    """``build`` and source hash of a candidate whose config is in its space. ``static_gate`` is
    ignored (a request can no longer turn the gate off) until the protocol drops the field."""
    if candidate.source:
        build, space_fn, source_hash = _load_source(candidate.source)
    else:
        variant = op.variant(candidate.variant)
        build, space_fn, source_hash = variant.build, variant.space, variant.source_hash
    try:
        problems = space_fn(spec).violations(candidate.config)
        if candidate.source and not problems:
            build(spec, candidate.config)  # launch expressions that fail for this workload: a build failure
    except KernelFileError as exc:
        raise Rejected("build", f"kernel file: {exc}") from exc
    if problems:
        raise Rejected(
            "build", f"config {candidate.config.key} is outside the variant's space: {'; '.join(problems)}"
        )
    return build, source_hash


def _classify(exc: BaseException) -> tuple[str, bool]:
    """Failure kind of an exception raised by candidate code, and whether to recycle."""
    name = type(exc).__name__
    text = str(exc)
    # InterpreterError is how the Triton interpreter reports what the compiler would reject.
    if (
        name in {"CompilationError", "OutOfResources", "PTXASError", "InterpreterError"}
        or "CompilationError" in text[:200]
    ):
        return "build", False
    cuda_fault = "CUDA error" in text or "illegal" in text.lower() or name == "AcceleratorError"
    return "runtime", cuda_fault


# ---- timing ------------------------------------------------------------------------------------
@contextlib.contextmanager
def _gpu_lock(path: str) -> Iterator[None]:
    """Serialize device work across workers that share one GPU (released if the holder dies).

    Validation (full-size float64 references) and timing hold it: one worker's validation running
    beside another's timing would distort the measurement, and several full-size validations at
    once can exhaust the device's memory. Compilation runs outside it, in parallel.
    """
    if not path:
        yield
        return
    with open(path, "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


# A workload whose tensors take more than this share of the device's memory is compiled under the
# device lock too: eight workers each holding a full-size set of zero inputs would not fit.
COMPILE_UNLOCKED_SHARE = 0.02


def _workload_bytes(op: OpFamily, spec: OpSpec) -> int:
    """Bytes of one full-size set of the workload's inputs and outputs."""
    tensors = (*spec.inputs, *op.output_specs(spec))
    return sum(t.numel * t.torch_dtype.itemsize for t in tensors)


def compile_needs_lock(nbytes: int, device_properties: Any) -> bool:
    """Whether compiling (one launch per validation shape on zero inputs) must hold the lock."""
    return nbytes > COMPILE_UNLOCKED_SHARE * int(device_properties.total_memory)


def _compile(
    op: OpFamily, spec: OpSpec, build: Callable[..., Launcher], config: Any, device: torch.device,
    synchronize: Callable[[], None],
) -> None:
    """Compile a candidate for every shape validation will run, outside the device lock.

    Triton compiles on a kernel's first launch (once per specialization: a row count of 1, or
    one divisible by 16, is its own), so each validation shape is launched once on zero inputs,
    under the same call checks as any other candidate call. Only this brief launch touches the
    device outside the lock; the compilation itself runs on the host, in parallel across workers.
    """
    for vspec in op.validation_specs(spec):
        launcher = build(vspec, config)
        inputs = [torch.empty_strided(t.shape, t.strides, dtype=t.torch_dtype, device=device).zero_()
                  for t in vspec.inputs]
        run_checked(launcher, inputs, allocate_outputs(op, vspec, device), synchronize, op, vspec)


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

    sync_minima: list[float] = []
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
        # A family that writes inputs (a KV cache) leaves them written by the first half; the
        # refill resets them to a fresh pre-call state, which is kept to check the second half.
        writes = op.written_inputs(spec)
        pre_call: list[Sequence[torch.Tensor]] = []
        for k in range(n_sets):
            fresh = op.make_inputs(spec, secrets.randbits(62), distribution, device)
            for t, f in zip(sets[k], fresh, strict=True):
                t.copy_(f)
            if writes:
                pre_call.append(fresh)
        prefill_(t for per_candidate in outs for out_set in per_candidate for t in out_set)
        if gpu:
            second = timing.interleaved_gpu(runners, n_sets, rounds - rounds // 2, 0.0, flusher)
            sync_minima = timing.synchronized_gpu(runners, n_sets, 9)
        else:
            second = timing.interleaved_cpu(runners, n_sets, rounds - rounds // 2)
        # Rule 5's check runs on the device too: inside the lock, like all device work.
        # Written inputs: every implementation timed wrote the same rows at the same place
        # (idempotent), so each set must now be in the one state its refill implies; which
        # implementation broke that cannot be told apart on shared sets, so none is trusted.
        wrong_state = _written_state_problem(op, spec, sets, pre_call) if writes else None
        for s, inputs in enumerate(sets):
            inputs = list(pre_call[s]) if writes else inputs  # the references start from the pre-call state
            refs64, lowps = op.reference_fp64(spec, inputs), op.reference(spec, inputs)
            for i in kept:
                for out, ref64, lowp in zip(outs[i][s], refs64, lowps, strict=True):
                    reason = errors.check_close(out, ref64, lowp, op.tolerance)
                    if reason and i not in stale:
                        stale[i] = reason
        sets.clear()  # drop every full-size tensor before handing the memory back
        pre_call.clear()
        outs.clear()
        runners.clear()  # and the captured graphs with their memory pools
        del refs64, lowps
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
            # device-wide synchronize. Host overhead is about the same for every implementation,
            # so a candidate's extra over the baseline's shows the hidden work. Minima, not
            # medians: hidden work is there on every call, while a stray delay (another worker
            # compiling on the same device) is not, and must not be mistaken for it.
            sync_us = sync_minima[timed_index]
            overhead = sync_us - stats["min_us"]
            base_overhead = sync_minima[0] - base["min_us"]
            if overhead > base_overhead + max(20.0, 0.5 * sync_us):
                problem = (
                    f"work continued after the timed region ({sync_us:.1f} us with a device "
                    f"synchronize vs {stats['min_us']:.1f} us by stream events, at best): side stream or thread"
                )
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


# ---- request handling --------------------------------------------------------------------------
class Worker:
    def __init__(self) -> None:
        self.flusher: timing.L2Flusher | None = None

    def _device(self, mode: str) -> torch.device:
        if mode == "gpu":
            device = torch.device("cuda", torch.cuda.current_device())
            if self.flusher is None:
                self.flusher = timing.L2Flusher(device)
            return device
        return torch.device("cpu")

    def handle(self, request: Request) -> WorkerReply:
        if isinstance(request, CeilingRequest):
            return self._ceiling(request)
        return self._evaluate(request)

    def _ceiling(self, request: CeilingRequest) -> WorkerReply:
        try:
            gbps, detail = timing.measure_copy_bandwidth(self._device("gpu"), request.nbytes, request.repeats)
            return WorkerReply((CeilingResult("ok", gbps, detail=detail),))
        except Exception as exc:
            return WorkerReply((CeilingResult("runtime", error=f"{type(exc).__name__}: {exc}"),), recycle=True)

    def _evaluate(self, request: EvalRequest) -> WorkerReply:
        spec = OpSpec.from_dict(request.spec)
        op = get_op(spec.op)
        device = self._device(request.mode)
        synchronize = torch.cuda.synchronize if request.mode == "gpu" else (lambda: None)
        results: dict[int, EvalResult] = {}
        loaded: list[_Loaded] = []
        loaded_index: list[int] = []
        recycle = False
        baseline: dict[str, Any] = {}
        for index, candidate in enumerate(request.candidates):
            started = time.perf_counter()
            source_hash = ""
            if recycle:
                results[index] = EvalResult(candidate, "skipped", "an earlier candidate broke the worker")
                continue
            try:
                build, source_hash = _load(op, spec, candidate)
                if request.mode == "gpu":
                    big = compile_needs_lock(_workload_bytes(op, spec), torch.cuda.get_device_properties(device))
                    with _gpu_lock(request.lock_path) if big else contextlib.nullcontext():
                        _compile(op, spec, build, candidate.config, device, synchronize)
                with _gpu_lock(request.lock_path):
                    try:
                        validate(op, spec, build, candidate.config, device, synchronize)
                    finally:
                        if request.mode == "gpu":
                            torch.cuda.empty_cache()  # full-size references: hand the memory back
                loaded.append(
                    _Loaded(
                        candidate,
                        build,
                        build(spec, candidate.config),
                        source_hash,
                        started,
                        time.perf_counter() - started,
                    )
                )
                loaded_index.append(index)
            except Rejected as rejected:
                results[index] = EvalResult(
                    candidate,
                    rejected.kind,
                    str(rejected),
                    source_hash=source_hash,
                    seconds=time.perf_counter() - started,
                )
                recycle = recycle or rejected.kind == "cheat"
            except Exception as exc:
                kind, broken = _classify(exc)
                results[index] = EvalResult(
                    candidate,
                    kind,
                    f"{type(exc).__name__}: {str(exc)[:2000]}",
                    source_hash=source_hash,
                    seconds=time.perf_counter() - started,
                )
                recycle = recycle or broken
        if request.measure and not recycle and (loaded or not request.candidates):
            try:
                timed, baseline = _time(op, spec, loaded, request, device, self.flusher)
                for i, result in timed.items():
                    results[loaded_index[i]] = result
                    recycle = recycle or result.status == "cheat"
            except Exception as exc:
                kind, broken = _classify(exc)
                recycle = recycle or broken
                for i, item in zip(loaded_index, loaded, strict=True):
                    results[i] = EvalResult(
                        item.candidate,
                        kind,
                        f"while timing: {type(exc).__name__}: {str(exc)[:2000]}",
                        source_hash=item.source_hash,
                    )
        elif loaded:
            for i, item in zip(loaded_index, loaded, strict=True):
                status = "skipped" if recycle else "ok"
                results.setdefault(
                    i,
                    EvalResult(
                        item.candidate, status, source_hash=item.source_hash, seconds=time.perf_counter() - item.started
                    ),
                )
        if request.mode == "gpu":
            torch.cuda.empty_cache()  # hand cached blocks back: the next worker to validate needs them
        ordered = tuple(results[i] for i in range(len(request.candidates)))
        return WorkerReply(ordered, recycle=recycle, baseline=baseline)


# ---- the main loop -----------------------------------------------------------------------------
def serve(conn: Connection, handle: Callable[[Request], WorkerReply]) -> int:
    """Answer requests until ``close``, a lost connection, or a reply that asks for recycling.

    Requests and replies are JSON data (:mod:`kernelsmith.evaluate.protocol`), never pickle.
    After every request, every process started while handling it is ended
    (:func:`sandbox.end_children`), so nothing a request starts outlives it.
    """
    while True:
        try:
            request = decode_request(conn.recv_bytes(MAX_REQUEST_BYTES))
        except (EOFError, OSError):
            return 0
        except ProtocolError as exc:  # the tuning process wrote it: a bug, not an attack
            log.error("unreadable request: %s", exc)
            return 1
        if request is None:
            return 0
        try:
            reply = handle(request)
        finally:
            ended = sandbox.end_children()
            if ended:
                log.warning("ended %d processes left running by the request: %s", len(ended), ended)
        conn.send_bytes(_encoded(request, reply))
        if reply.recycle:
            return 0


def _encoded(request: Request, reply: WorkerReply) -> bytes:
    """The reply as bytes; one that JSON cannot hold becomes "crash" records (and a recycle)."""
    try:
        return encode_reply(reply)
    except (TypeError, ValueError) as exc:
        log.error("unencodable reply: %s", exc)
        error = f"the worker could not encode its reply: {type(exc).__name__}: {exc}"[:2000]
        if isinstance(request, CeilingRequest):
            return encode_reply(WorkerReply((CeilingResult("crash", error=error),), recycle=True))
        return encode_reply(WorkerReply(tuple(EvalResult(c, "crash", error) for c in request.candidates), recycle=True))


def _arguments(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m kernelsmith.evaluate.worker")
    parser.add_argument("fd", type=int, help="file descriptor of the connection to the tuning process")
    parser.add_argument("--address-space", type=int, default=0, help="RLIMIT_AS in bytes (0: none)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _arguments(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.WARNING, format="kernelsmith-worker %(levelname)s %(message)s")
    # Before any candidate loads: the memory cap, the subreaper flag, then the harness's seal.
    sandbox.harden(args.address_space or None)
    conn = Connection(args.fd)
    worker = Worker()
    seal_harness()  # from here on, any rebinding of a harness global is tampering
    conn.send_bytes(encode_ready())
    return serve(conn, worker.handle)


if __name__ == "__main__":
    sys.exit(main())

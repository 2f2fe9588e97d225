"""The worker process: builds, validates and times candidates, isolated from the caller.

Started by :mod:`kernelsmith.evaluate.pool` as ``python -m kernelsmith.evaluate.worker FD``; it
reads requests from the connection on file descriptor FD and answers each with a
:class:`WorkerReply`, as JSON data (never pickle). Every failure becomes data in the reply.
Before any candidate loads it caps its memory and becomes the subreaper of everything it starts
(:mod:`kernelsmith.evaluate.sandbox`), and after every request it ends all of it. A candidate
that might have left the process in a bad state (a CUDA fault, tampering) makes the worker ask
to be recycled: it answers, then exits, and the pool starts a fresh one for the next request.

The worker's code is in three modules, read in this order:
:mod:`~kernelsmith.evaluate._worker_candidates` (loading a candidate, compiling it, the device
lock), :mod:`~kernelsmith.evaluate._worker_timing` (timing the baselines and the candidates, and
the checks made while timing) and this one (a request from start to reply, the main loop). All
three are harness code, whose globals are sealed before any candidate loads (rule 10,
:func:`kernelsmith.evaluate.validate.seal_harness`, which seals the modules
``validate._HARNESS_MODULES`` names: each of the three must be among them).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

import torch

from kernelsmith.evaluate import sandbox, timing
from kernelsmith.evaluate._worker_candidates import COMPILE_UNLOCKED_SHARE as COMPILE_UNLOCKED_SHARE
from kernelsmith.evaluate._worker_candidates import (
    _classify,
    _compile,
    _gpu_lock,
    _load,
    _Loaded,
    _workload_bytes,
    compile_needs_lock,
    library_ops_of,
)
from kernelsmith.evaluate._worker_timing import COMPILE_UNAVAILABLE as COMPILE_UNAVAILABLE
from kernelsmith.evaluate._worker_timing import _time
from kernelsmith.evaluate.protocol import (
    MAX_REQUEST_BYTES,
    CeilingRequest,
    CeilingResult,
    EvalRequest,
    EvalResult,
    ProtocolError,
    Request,
    WorkerReply,
    decode_request,
    encode_ready,
    encode_reply,
)
from kernelsmith.evaluate.validate import Rejected, seal_harness, validate
from kernelsmith.ops import get_op
from kernelsmith.spec import OpSpec

log = logging.getLogger(__name__)


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
                library_ops = library_ops_of(op, candidate)
                if request.mode == "gpu":
                    big = compile_needs_lock(_workload_bytes(op, spec), torch.cuda.get_device_properties(device))
                    with _gpu_lock(request.lock_path) if big else contextlib.nullcontext():
                        _compile(op, spec, build, candidate.config, device, synchronize, library_ops)
                with _gpu_lock(request.lock_path):
                    try:
                        validate(op, spec, build, candidate.config, device, synchronize, library_ops)
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

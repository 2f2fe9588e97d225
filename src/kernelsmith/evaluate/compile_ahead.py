"""Compiling the search's next candidates while the workers are busy (issue 19: search cost).

A worker compiles a candidate on its first launch (Triton compiles once per specialization),
then validates and times it under the device lock. The search keeps one candidate in flight per
worker, so a candidate proposed beyond that waits for a worker doing nothing. With compile-ahead
(:class:`CompileAhead`, switched by ``KERNELSMITH_COMPILE_AHEAD``) such a waiting candidate is
compiled meanwhile in a compile-only process (:class:`CompilePool`, two by default), while the
workers validate and time the ones before it. The compile processes and the workers share
Triton's on-disk cache (:func:`kernelsmith.evaluate.pool.user_triton_cache`), so when the
candidate reaches its worker, the first launch loads a ready binary instead of compiling.

Why another process and not threads of the tuning process (issue 19): a Triton compiler crash
(a segfault or an abort in MLIR or LLVM on an odd config) would kill the user's process and every
decision it had not stored yet; compiling would initialize CUDA in the user's process; and the
compiles would take the GIL from the search and the worker's own host work. A compile process is
started like an evaluation worker (:class:`~kernelsmith.evaluate._pool_worker.WorkerProcess`: a
fresh interpreter, ``python -m kernelsmith.evaluate.compile_ahead FD``, its own session and
private home, a socket with a deadline on every read, its memory watched), and is told what to
compile as data: the workload's spec and the candidate (variant name and config, JSON). The
tuning process's threads here only wait on those sockets.

How it compiles: with Triton's own ahead-of-time path, the JIT's ``run(..., warmup=True)``,
which compiles (and fills the on-disk cache) without launching. A family's launcher is a plain
callable that ends in ``kernel[grid](...)``; :func:`compile_variant` calls it on meta tensors (the
workload's shapes, dtypes and strides, no memory; a meta tensor's address is 0, 16-byte aligned
like the device's allocations, and a view keeps its offset), built so that each of their launches
is a warmup (:class:`WarmupLaunch`, through the launch seam every family uses; Triton itself is not
patched). Nothing runs on the device and no device memory is taken, and no module is loaded (a
warmup never reads a compiled kernel's launch handle), so compiling never overlaps a timing
measurement's use of the GPU; only the worker's first launch loads the module, as before.
(Triton's ``run`` still asks the driver for the current device, stream and target, which
initializes CUDA in the compile process; that is all of the GPU it touches.)

The trust boundary: only built-in variants, kernelsmith's own code, are compiled ahead. A kernel
file (an agent's or an LLM's source) is never sent to a compile process (and one would refuse
it); it goes to its worker, where it is compiled as before (docs/kernel-files.md).

Failures, all data:

- a Triton compile error (``CompilationError`` and its kinds, ``PTXASError``) does not depend on
  the process that compiles, so it is the candidate's "build" failure, recorded with the message
  a worker would have written, and the candidate is not sent to a worker;
- anything else raised while compiling (a launcher that cannot run on meta tensors, say) is not
  the candidate's fault: it is logged and the candidate goes to its worker as if it had not been
  compiled ahead (the worker compiles it);
- a compile process that dies, hangs past :data:`COMPILE_TIMEOUT_S` or answers garbage is lost:
  logged, the candidate goes to its worker as if not compiled ahead (where a crash of the
  compiler is the candidate's "crash", isolated like any other), and the process is started
  again for the next compile; after :data:`MAX_LOST_PROCESSES` losses compile-ahead is switched
  off for the rest of the search (a log line says so), the candidates going to their workers.

A specialization compiled here differently from the worker's costs only time: a cache miss.

What compile-ahead did is :meth:`CompileAhead.report`, which the search logs and stores in its
decision's metrics (``compile_ahead``), so a GPU run with the setting on and off shows the saving.
"""

from __future__ import annotations

import argparse
import json
import logging
import queue
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any, TypeVar

import torch

from kernelsmith.evaluate import sandbox
from kernelsmith.evaluate._pool_worker import WorkerLost, WorkerProcess
from kernelsmith.evaluate.pool import user_triton_cache
from kernelsmith.evaluate.protocol import MAX_REQUEST_BYTES, Candidate, EvalResult, ProtocolError, encode_ready
from kernelsmith.ops import get_op
from kernelsmith.ops._base import OpFamily
from kernelsmith.ops._launch import launches_through
from kernelsmith.spec import OpSpec

log = logging.getLogger(__name__)

# How many candidates beyond the workers' the search proposes and compiles ahead, and how many
# compile processes compile them (each a fresh interpreter of a few hundred MiB, compiling on one
# core). A deeper queue makes an adaptive strategy propose with fewer results.
COMPILE_AHEAD_DEPTH = 4
COMPILE_AHEAD_PROCESSES = 2
# A compile taking longer is a hung compiler: the process is lost (a worker's whole evaluation
# has as long on a GPU, kernelsmith.evaluate.pool.default_timeout).
COMPILE_TIMEOUT_S = 120.0
# Compile processes lost (died, hung, garbled) in one search before compile-ahead is switched off.
MAX_LOST_PROCESSES = 2
COMPILE_MODULE = "kernelsmith.evaluate.compile_ahead"
_MAX_REPLY_BYTES = 64 << 10  # a reply is a status and an error message of at most 2000 characters
_MAX_ERROR = 2000

# Exceptions (by class name, anywhere in the class's bases) that mean Triton could not compile the
# kernel: the candidate's own failure, as the worker's classification of a "build" failure.
COMPILE_ERRORS = frozenset({"CompilationError", "PTXASError"})

# What compiling one candidate ahead came to (:attr:`Ahead.status`).
COMPILED = "compiled"
FAILED = "failed"  # a compile error: the candidate's "build" failure
NOT_COMPILED = "not-compiled"  # not compiled ahead (a kernel file, not compilable there, a lost process)
STATUSES = (COMPILED, FAILED, NOT_COMPILED)
KERNEL_FILE = "a kernel file: built in its worker"

CompileFn = Callable[[OpFamily, OpSpec, Candidate], None]
_T = TypeVar("_T")


@dataclass(frozen=True)
class Ahead:
    """The outcome of compiling one candidate ahead; ``error`` says why it failed or was not compiled."""

    candidate: Candidate
    status: str
    seconds: float = 0.0
    error: str = ""


# ---- Triton launches that only compile (run in the compile process) -----------------------------
class WarmupLaunch:
    """What a launcher built by :func:`compile_variant` calls instead of a launch: Triton's
    ``kernel.run(..., grid=grid, warmup=True)``, which compiles the specialization of these
    arguments (and fills the on-disk cache) and launches nothing. Given to the launchers through
    :func:`kernelsmith.ops._launch.launches_through`, the seam every family's launch goes through,
    so Triton itself is never patched and no other launch, on any thread, is touched."""

    def __init__(self, kernel: Any, grid: Any) -> None:
        self.kernel, self.grid = kernel, grid

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.kernel.run(*args, grid=self.grid, warmup=True, **kwargs)


def compile_variant(family: OpFamily, spec: OpSpec, candidate: Candidate) -> None:
    """Compile a built-in variant's candidate for every shape its worker validates and times
    (the workload and its tail shapes, as the worker's ``_compile``), launching nothing.

    The launchers are built so that each of their launches is a :class:`WarmupLaunch`: a direct
    launcher (:mod:`kernelsmith.ops._launch`) would read the compiled kernel's launch handle,
    which loads the module onto the device.
    """
    variant = family.variant(candidate.variant)
    for vspec in family.validation_specs(spec):
        with launches_through(WarmupLaunch):
            launcher = variant.build(vspec, candidate.config)
        inputs = [torch.empty_strided(t.shape, t.strides, dtype=t.torch_dtype, device="meta") for t in vspec.inputs]
        outputs = [torch.empty(t.shape, dtype=t.torch_dtype, device="meta") for t in family.output_specs(vspec)]
        launcher(inputs, outputs)


def _is_compile_error(exc: BaseException) -> bool:
    return any(kind.__name__ in COMPILE_ERRORS for kind in type(exc).__mro__)


# ---- the compile process's side of the socket ----------------------------------------------------
def compile_request(message: Any, compile_fn: CompileFn) -> dict[str, str]:
    """Compile what one request names and say how it went: ``{"status", "error"}``. Never raises:
    a request it cannot read, an unknown family or variant, a kernel file (refused here too) or
    any error but a compile error is "not compiled"."""
    try:
        spec = OpSpec.from_dict(message["spec"])
        candidate = Candidate.from_json(message["candidate"])
        if candidate.source:  # the trust boundary, kept here as well as in the tuning process
            return {"status": NOT_COMPILED, "error": KERNEL_FILE}
        compile_fn(get_op(spec.op), spec, candidate)
        return {"status": COMPILED, "error": ""}
    except Exception as exc:
        error = f"{type(exc).__name__}: {str(exc)[:_MAX_ERROR]}"  # the form of a worker's failure message
        return {"status": FAILED if _is_compile_error(exc) else NOT_COMPILED, "error": error}


def serve(conn: Connection, compile_fn: CompileFn = compile_variant) -> int:
    """Greet, then answer compile requests (JSON) until ``close`` or a lost connection."""
    conn.send_bytes(encode_ready())
    while True:
        try:
            message = json.loads(conn.recv_bytes(MAX_REQUEST_BYTES))
        except (EOFError, OSError):
            return 0
        except ValueError:  # not JSON: the tuning process's bug; it sees this process end
            log.error("unreadable compile request")
            return 1
        if not isinstance(message, dict) or message.get("kind") != "compile":
            return 0  # "close" (anything else is the tuning process's bug: end, it will see it)
        conn.send_bytes(json.dumps({"kind": "compiled", **compile_request(message, compile_fn)}).encode())


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=f"python -m {COMPILE_MODULE}")
    parser.add_argument("fd", type=int, help="file descriptor of the connection to the tuning process")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.WARNING, format="kernelsmith-compile %(levelname)s %(message)s")
    sandbox.harden(None)  # no core dump from a crashing compiler; what it starts ends with it
    return serve(Connection(args.fd))


# ---- the tuning process's side ------------------------------------------------------------------
def _read_reply(data: bytes) -> tuple[str, str]:
    """(status, error) from a compile process's reply; ProtocolError for anything else."""
    try:
        reply = json.loads(data)
    except ValueError as exc:
        raise ProtocolError(f"not JSON: {exc}") from None
    if not isinstance(reply, dict) or set(reply) != {"kind", "status", "error"} or reply["kind"] != "compiled":
        raise ProtocolError(f"not a compile reply: {str(reply)[:200]}")
    status, error = reply["status"], reply["error"]
    if status not in STATUSES or not isinstance(error, str):
        raise ProtocolError(f"a compile reply with status {str(status)[:40]!r}")
    return status, error[: _MAX_ERROR + 200]  # the exception's name and its message, cut as there


class CompileProcess(WorkerProcess):
    """One compile process: an evaluation worker's process (start, deadline, memory watch, kill)
    running ``command`` (:data:`COMPILE_MODULE`, or a test's stand-in), with the user's Triton
    cache. Started on first use, and again after it was lost."""

    def __init__(self, log_dir: str, memory_cap: int, command: Sequence[str] = (COMPILE_MODULE,)) -> None:
        super().__init__("gpu", log_dir, memory_cap, triton_cache=user_triton_cache(), command=command,
                         max_reply_bytes=_MAX_REPLY_BYTES)  # fmt: skip

    def ensure_started(self) -> None:
        if not self.alive:
            self.kill()  # what is left of a lost one
            self.start()

    def compile(self, spec: OpSpec, candidate: Candidate, timeout_s: float) -> tuple[str, str]:
        """(status, error) of compiling ``candidate`` there; WorkerLost if the process was lost
        (it is then killed, and started again by the next call)."""
        assert not candidate.source, "a kernel file is never sent to a compile process"
        self.ensure_started()
        request = {"kind": "compile", "spec": spec.to_dict(), "candidate": candidate.to_json()}
        deadline = time.monotonic() + timeout_s
        try:
            self._send(json.dumps(request).encode(), deadline)
            return _read_reply(self._receive(deadline, "compiling"))
        except ProtocolError as exc:
            self.kill()
            raise WorkerLost("crash", f"the compile process's reply is malformed: {exc}") from None
        except WorkerLost:
            self.kill()
            raise

    def interrupt(self) -> None:
        """Kill the process (only: the thread waiting on it sees it die and cleans up)."""
        proc = self.proc
        if proc is not None:
            proc.kill()  # Popen.kill signals nothing once the process is known to be gone


class CompilePool:
    """A few compile processes, each used by one compile at a time. ``command``: the processes'
    module and arguments (tests: :mod:`kernelsmith.testing.compile_stand_in`)."""

    def __init__(
        self,
        processes: int = COMPILE_AHEAD_PROCESSES,
        command: Sequence[str] = (COMPILE_MODULE,),
        timeout_s: float = COMPILE_TIMEOUT_S,
    ) -> None:
        self.timeout_s = timeout_s
        self._tmp = tempfile.TemporaryDirectory(prefix="kernelsmith-compile-")
        memory_cap = sandbox.default_memory_cap(processes)
        self.processes = [CompileProcess(self._tmp.name, memory_cap, command) for _ in range(processes)]
        self._free: queue.SimpleQueue[CompileProcess] = queue.SimpleQueue()
        for process in self.processes:
            self._free.put(process)

    @property
    def size(self) -> int:
        return len(self.processes)

    def run(self, use: Callable[[CompileProcess], _T]) -> _T:
        """``use(process)`` on a free process (waiting for one)."""
        process = self._free.get()
        try:
            return use(process)
        finally:
            self._free.put(process)

    def compile(self, spec: OpSpec, candidate: Candidate) -> tuple[str, str]:
        """:meth:`CompileProcess.compile` on a free process."""
        return self.run(lambda process: process.compile(spec, candidate, self.timeout_s))

    def interrupt(self) -> None:
        for process in self.processes:
            process.interrupt()

    def close(self) -> None:
        for process in self.processes:
            process.close()
        self._tmp.cleanup()


# ---- the compiler of one search ----------------------------------------------------------------
class CompileAhead:
    """Compiles one search's waiting candidates in compile processes (module docstring).

    ``pool``: the compile processes to use (default: a :class:`CompilePool` of its own, started
    with the first candidate and ended by :meth:`close`; tests share one). One thread per
    process sends a candidate and waits for its answer. :meth:`start` returns the future of an
    :class:`Ahead`, which never raises; a candidate with source (a kernel file) is never sent.
    """

    def __init__(
        self,
        family: OpFamily,
        spec: OpSpec,
        pool: CompilePool | None = None,
        depth: int = COMPILE_AHEAD_DEPTH,
        max_lost: int = MAX_LOST_PROCESSES,
    ) -> None:
        self.family, self.spec, self.depth, self.max_lost = family, spec, depth, max_lost
        self._own_pool = pool is None
        self.pool = CompilePool() if pool is None else pool
        self._threads = ThreadPoolExecutor(max_workers=self.pool.size, thread_name_prefix="kernelsmith-compile-ahead")
        self._lock = threading.Lock()
        self.outcomes: list[Ahead] = []
        self.waited_s = 0.0  # the search waited this long for a compile here while a worker was free
        self.sent_uncompiled = 0  # waiting candidates a worker took before their compile started
        self.lost = 0  # compile processes lost in this search
        self.switched_off = False  # after max_lost of them: the rest go to their workers uncompiled
        self._closing = False
        self._starting = False  # the processes' start was asked for (by the first candidate)

    def start(self, candidate: Candidate) -> Future[Ahead]:
        if candidate.source:  # untrusted source is built only in a worker (the trust boundary)
            future: Future[Ahead] = Future()
            future.set_result(self._keep(Ahead(candidate, NOT_COMPILED, error=KERNEL_FILE)))
            return future
        if not self._starting:
            # Start the processes first (a search with no waiting candidate starts none). The
            # compiles queue behind the starts, so a worker that frees up meanwhile takes its
            # candidate uncompiled (cancelled) instead of waiting for a process to start.
            self._starting = True
            for _ in range(self.pool.size):
                self._threads.submit(self.pool.run, self._start_process)
        return self._threads.submit(self._compile, candidate)

    def _start_process(self, process: CompileProcess) -> None:
        if self._closing or self.switched_off:
            return
        try:
            process.ensure_started()
        except WorkerLost as lost:
            self._lose(f"starting: {lost}")

    def _compile(self, candidate: Candidate) -> Ahead:
        started = time.perf_counter()
        if self._closing or self.switched_off:
            status, error = NOT_COMPILED, "compile-ahead is off for this search"
        else:
            try:
                status, error = self.pool.compile(self.spec, candidate)
            except WorkerLost as lost:
                status, error = NOT_COMPILED, f"the compile process was lost: {lost}"
                self._lose(f"compiling {candidate.key}: {lost}")
            if status == NOT_COMPILED:
                log.debug("%s not compiled ahead: %s", candidate.key, error)
        return self._keep(Ahead(candidate, status, time.perf_counter() - started, error))

    def _lose(self, what: str) -> None:
        """A compile process was lost: count it, and switch compile-ahead off at ``max_lost``
        (unless :meth:`close` ended it)."""
        if self._closing:
            return
        with self._lock:
            self.lost += 1
            switch_off = self.lost >= self.max_lost and not self.switched_off
            self.switched_off = self.switched_off or switch_off
        log.warning("%s: a compile process was lost %s (its candidate goes to its worker)", self.spec.op, what)
        if switch_off:
            log.warning("%s: compile-ahead switched off for this search after %d lost compile processes",
                        self.spec.op, self.lost)  # fmt: skip

    def _keep(self, outcome: Ahead) -> Ahead:
        with self._lock:
            self.outcomes.append(outcome)
        return outcome

    @staticmethod
    def failure(outcome: Ahead, source_hash: str) -> EvalResult:
        """A candidate that failed to compile ahead, as the "build" failure its worker would report."""
        return EvalResult(outcome.candidate, "build", outcome.error, source_hash=source_hash, seconds=outcome.seconds)

    def report(self) -> dict[str, Any]:
        """What compile-ahead did: how many candidates it compiled, failed or left to their worker,
        the compile processes lost, the seconds it compiled (off the timing path) and the seconds
        the search waited for it with a worker free (on the timing path)."""
        with self._lock:
            outcomes = list(self.outcomes)
        count = {status: sum(o.status == status for o in outcomes) for status in STATUSES}
        return {
            "compiled": count[COMPILED],
            "failed": count[FAILED],
            "not_compiled": count[NOT_COMPILED],
            "sent_uncompiled": self.sent_uncompiled,
            "lost_processes": self.lost,
            "ahead_s": round(sum(o.seconds for o in outcomes), 3),
            "waited_s": round(self.waited_s, 3),
        }

    def close(self) -> None:
        """Cancel compiles not started; with a pool of its own, end the processes (a compile still
        running is of no use now), else wait for the running ones."""
        self._closing = True
        if self._own_pool:
            self.pool.interrupt()
        self._threads.shutdown(wait=True, cancel_futures=True)
        if self._own_pool:
            self.pool.close()


if __name__ == "__main__":
    sys.exit(main())

"""A pool of worker processes: the only way candidate code ever runs.

Each worker is a fresh Python interpreter (``python -m kernelsmith.evaluate.worker``) talking
over a private socket, so a candidate's prints cannot corrupt the protocol and its crashes,
hangs and CUDA faults cannot reach the caller:

- a hang runs into the request's time limit: the worker's process group is killed and the
  candidate comes back as a ``timeout`` failure;
- a crash (segfault, ``os._exit``, an abort in the driver) closes the socket: ``crash``;
- a worker that asks to be recycled (after a CUDA fault or a cheat) is replaced.

Several workers compile and validate in parallel (Triton compilation is CPU-bound); timing on a
shared GPU is serialized by a file lock the workers take, so measurements never overlap.
"""

from __future__ import annotations

import logging
import os
import queue
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from kernelsmith.evaluate.protocol import (
    Candidate,
    CeilingRequest,
    CeilingResult,
    EvalRequest,
    EvalResult,
    TimingSettings,
)
from kernelsmith.spec import OpSpec

log = logging.getLogger(__name__)

STARTUP_TIMEOUT_S = 180.0


class WorkerLost(Exception):
    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


def _package_root() -> str:
    return str(Path(__file__).resolve().parents[2])


class WorkerProcess:
    """One worker interpreter and its connection; restarted on demand."""

    def __init__(self, env: dict[str, str], log_dir: str) -> None:
        self.env = env
        self.log_dir = log_dir
        self.proc: subprocess.Popen[bytes] | None = None
        self.conn: Connection | None = None
        self.log_path = ""

    def start(self) -> None:
        parent_sock, child_sock = socket.socketpair()
        handle, self.log_path = tempfile.mkstemp(prefix="worker-", suffix=".log", dir=self.log_dir)
        with os.fdopen(handle, "wb") as log_file:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "kernelsmith.evaluate.worker", str(child_sock.fileno())],
                pass_fds=(child_sock.fileno(),),
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=log_file,
                start_new_session=True,  # its own process group, so a kill takes its children too
            )
        child_sock.close()
        self.conn = Connection(parent_sock.detach())
        if not self.conn.poll(STARTUP_TIMEOUT_S):
            self.kill()
            raise WorkerLost("crash", f"worker did not start within {STARTUP_TIMEOUT_S:.0f} s: {self.log_tail()}")
        try:
            hello = self.conn.recv()
        except (EOFError, OSError) as exc:
            self.kill()
            raise WorkerLost("crash", f"worker died while starting: {self.log_tail()}") from exc
        if hello != "ready":
            self.kill()
            raise WorkerLost("crash", f"unexpected worker greeting {hello!r}")

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None and self.conn is not None

    def call(self, request: Any, timeout_s: float) -> Any:
        if not self.alive:
            self.kill()
            self.start()
        assert self.conn is not None and self.proc is not None
        try:
            self.conn.send(request)
            if not self.conn.poll(timeout_s):
                self.kill()
                raise WorkerLost("timeout", f"no answer within {timeout_s:.0f} s (hang or runaway kernel)")
            reply = self.conn.recv()
        except (EOFError, OSError, BrokenPipeError) as exc:
            code = self.proc.wait(timeout=10) if self.proc else None
            tail = self.log_tail()
            self.kill()
            raise WorkerLost("crash", f"worker died (exit code {code}): {tail}") from exc
        if getattr(reply, "recycle", False):
            self.kill()
        return reply

    def log_tail(self, n: int = 1500) -> str:
        try:
            text = Path(self.log_path).read_text(errors="replace")
        except OSError:
            return ""
        return text[-n:].strip().replace("\n", " | ")

    def kill(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                self.proc.kill()
            self.proc.wait(timeout=30)
        self.proc = None

    def close(self) -> None:
        if self.alive and self.conn is not None:
            try:
                self.conn.send(None)
                assert self.proc is not None
                self.proc.wait(timeout=10)
            except Exception:
                pass
        self.kill()


class Evaluator:
    """Evaluates candidates for one mode ("gpu" or "interpreter") in a pool of workers.

    >>> # evaluator = Evaluator("interpreter", workers=2)
    >>> # results = evaluator.evaluate(spec, [Candidate("whole_row", Config(num_warps=4, num_stages=1))])
    """

    def __init__(self, mode: str, workers: int | None = None, timeout_s: float | None = None) -> None:
        if mode not in ("gpu", "interpreter"):
            raise ValueError(f"mode must be 'gpu' or 'interpreter', not {mode!r}")
        self.mode = mode
        cores = os.cpu_count() or 2
        self.n_workers = workers or (max(1, min(8, cores // 2)) if mode == "gpu" else min(2, cores))
        self.timeout_s = timeout_s or (120.0 if mode == "gpu" else 600.0)
        self._tmp = tempfile.TemporaryDirectory(prefix="kernelsmith-")
        self.lock_path = os.path.join(self._tmp.name, "gpu.lock") if mode == "gpu" else ""
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (_package_root(), env.get("PYTHONPATH", "")) if p)
        env["PYTHONUNBUFFERED"] = "1"
        if mode == "interpreter":
            env["TRITON_INTERPRET"] = "1"
        else:
            env.pop("TRITON_INTERPRET", None)
        self._slots: queue.Queue[WorkerProcess] = queue.Queue()
        self._executor = ThreadPoolExecutor(max_workers=self.n_workers, thread_name_prefix="kernelsmith-eval")
        for _ in range(self.n_workers):
            # Interpreters start in the background while the caller prepares; a slot joins the
            # queue only once its worker is ready (or failed to start: the first call retries).
            self._executor.submit(self._prestart, WorkerProcess(env, self._tmp.name))
        self._closed = threading.Event()

    def _prestart(self, slot: WorkerProcess) -> None:
        try:
            slot.start()
        except WorkerLost as lost:
            log.warning("worker failed to start: %s", lost)
        finally:
            self._slots.put(slot)

    def _call(self, request: Any) -> Any:
        slot = self._slots.get()
        try:
            return slot.call(request, self.timeout_s)
        finally:
            self._slots.put(slot)

    def _request(
        self,
        spec: OpSpec,
        candidates: Sequence[Candidate],
        timing: TimingSettings | None,
        measure: bool,
        static_gate: bool,
    ) -> EvalRequest:
        settings = timing or (TimingSettings() if self.mode == "gpu" else TimingSettings.interpreter())
        return EvalRequest(spec.to_dict(), tuple(candidates), self.mode, settings, measure, static_gate, self.lock_path)

    def _run(self, request: EvalRequest) -> list[EvalResult]:
        try:
            reply = self._call(request)
            return list(reply.results)
        except WorkerLost as lost:
            return [EvalResult(c, lost.kind, str(lost)) for c in request.candidates]

    def evaluate(
        self,
        spec: OpSpec,
        candidates: Sequence[Candidate],
        timing: TimingSettings | None = None,
        measure: bool = True,
        static_gate: bool = True,
    ) -> list[EvalResult]:
        """Evaluate each candidate in its own request, in parallel across the workers.

        Candidates that came back "skipped" (an earlier candidate in the same worker broke it)
        are retried once in a fresh worker.
        """
        futures = [self.submit(spec, c, timing, measure, static_gate) for c in candidates]
        return [f.result() for f in futures]

    def submit(
        self,
        spec: OpSpec,
        candidate: Candidate,
        timing: TimingSettings | None = None,
        measure: bool = True,
        static_gate: bool = True,
    ) -> Future[EvalResult]:
        """Evaluate one candidate on the next free worker; the future never raises.

        A candidate that came back "skipped" (an earlier candidate broke its worker) is retried
        once in a fresh worker.
        """
        request = self._request(spec, [candidate], timing, measure, static_gate)

        def run() -> EvalResult:
            result = self._run(request)[0]
            return self._run(request)[0] if result.status == "skipped" else result

        return self._executor.submit(run)

    def evaluate_together(
        self, spec: OpSpec, candidates: Sequence[Candidate], timing: TimingSettings | None = None
    ) -> list[EvalResult]:
        """Evaluate candidates in one request, timed interleaved with each other and the baseline."""
        return self._run(self._request(spec, candidates, timing, True, True))

    def measure_ceiling(self) -> CeilingResult:
        if self.mode != "gpu":
            return CeilingResult("skipped", error="no GPU ceiling in interpreter mode")
        try:
            return self._call(CeilingRequest()).results[0]  # type: ignore[no-any-return]
        except WorkerLost as lost:
            return CeilingResult(lost.kind, error=str(lost))

    def close(self) -> None:
        if self._closed.is_set():
            return
        self._closed.set()
        self._executor.shutdown(wait=True)
        while not self._slots.empty():
            self._slots.get().close()
        self._tmp.cleanup()

    def __enter__(self) -> Evaluator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

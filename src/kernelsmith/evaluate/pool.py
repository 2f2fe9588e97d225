"""A pool of worker processes: the only way candidate code ever runs.

Each worker is a fresh Python interpreter (``python -m kernelsmith.evaluate.worker``) talking
over a private socket, so a candidate's prints cannot corrupt the protocol and its crashes,
hangs and CUDA faults cannot reach the caller:

- a hang runs into the request's time limit: the worker's process tree is killed and the
  candidate comes back as a ``timeout`` failure;
- a crash (segfault, ``os._exit``, an abort in the driver) closes the socket: ``crash``;
- a reply that is not well-formed data (garbage, a pickle, truncated or wrong-typed JSON, more
  than ``MAX_REPLY_BYTES``, an answer for other candidates) is a ``crash``, and the worker that
  wrote it is killed (:mod:`kernelsmith.evaluate.protocol`);
- a worker that asks to be recycled (after a CUDA fault or a cheat) is replaced.

Workers are sandboxed (:mod:`kernelsmith.evaluate.sandbox`): their own session, a private home
and temporary directory, no kernelsmith settings that point at the user's files, a memory cap
(RLIMIT_AS in interpreter mode, the resident size of the whole process tree watched from here
in both modes), and every process they start ended with them.

Several workers compile and validate in parallel (Triton compilation is CPU-bound); timing on a
shared GPU is serialized by a file lock the workers take, so measurements never overlap. On a
host with several GPUs the pool starts workers on every chosen device (``devices``; default: every
visible one), each pinned to its device through ``CUDA_VISIBLE_DEVICES``, with one lock per
device: candidates stream to whichever worker is free, and a candidate and its baseline, timed in
one request by one worker, are always timed on the same device. A worker that cannot start (its
device gone, say) loses nothing: its candidate is retried on another worker.

The decisive run of a candidate about to be kept, :meth:`Evaluator.confirm`, uses none of them:
it starts brand-new workers for one request each (:mod:`kernelsmith.evaluate.confirm`).

A Ray cluster is the other executor with the same methods
(:mod:`kernelsmith.evaluate.ray_executor`); :mod:`kernelsmith.evaluate.executor` picks one.

Layout: one worker process, as the host sees it, is :class:`WorkerProcess` in
:mod:`~kernelsmith.evaluate._pool_worker`; this module holds the pools that run requests on them.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import tempfile
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Generic, TypeVar

from kernelsmith.evaluate import sandbox
from kernelsmith.evaluate._pool_worker import STARTUP_TIMEOUT_S as STARTUP_TIMEOUT_S
from kernelsmith.evaluate._pool_worker import WORKER_MODULE, WorkerLost, WorkerProcess
from kernelsmith.evaluate.confirm import Confirmation, judge
from kernelsmith.evaluate.protocol import (
    Candidate,
    CeilingRequest,
    CeilingResult,
    EvalRequest,
    EvalResult,
    Request,
    TimingSettings,
    WorkerReply,
)
from kernelsmith.spec import OpSpec

log = logging.getLogger(__name__)

S = TypeVar("S")


def user_triton_cache() -> str:
    """The Triton compile cache the user's own programs use, shared with the workers.

    Sharing it is safe because no candidate runs host code (kernel files are device code that
    only Triton's compiler, trusted, turns into cache entries, keyed by source and
    specialization), and it matters: a private cache made every tuning run compile every
    built-in kernel again, which costs seconds per candidate on a GPU.
    """
    home = os.environ.get("TRITON_HOME") or os.path.expanduser("~")  # Triton's own default
    return os.environ.get("TRITON_CACHE_DIR") or os.path.join(home, ".triton", "cache")


Fresh = Callable[[EvalRequest], "WorkerReply | WorkerLost"]


def fresh_worker(mode: str, log_dir: str, memory_cap: int, timeout_s: float, device: str | None = None) -> Fresh:
    """Run one request in a brand-new worker of the real module, ended after it (on ``device``)."""

    def run(request: EvalRequest) -> WorkerReply | WorkerLost:
        worker = WorkerProcess(mode, log_dir, memory_cap, triton_cache=user_triton_cache(), device=device)
        try:
            return worker.call(request, timeout_s)
        except WorkerLost as lost:
            return lost
        finally:
            worker.kill()

    return run


def judge_fresh(
    spec: OpSpec,
    candidates: Sequence[Candidate],
    settings: TimingSettings,
    fresh: Fresh,
    *,
    mode: str,
    lock_path: str,
    copy_gbps: float | None,
) -> Confirmation:
    """The decisive run (see :mod:`kernelsmith.evaluate.confirm`): the baseline alone in one
    fresh worker, the candidates in another (``fresh`` starts each for one request, on one
    device, and ends it), then judged here, in the tuning process."""
    from kernelsmith.ops import get_op  # the op registry loads kernels: only when confirming

    clean = fresh(EvalRequest(spec.to_dict(), (), mode, settings, True, lock_path))
    beside = fresh(EvalRequest(spec.to_dict(), tuple(candidates), mode, settings, True, lock_path))
    if isinstance(beside, WorkerLost):
        results = [EvalResult(c, beside.kind, f"in the confirmation: {beside}") for c in candidates]
    else:
        results = list(beside.results)
    clean_error = str(clean) if isinstance(clean, WorkerLost) else ""
    clean_metrics = clean.baseline if isinstance(clean, WorkerReply) else {}
    op = get_op(spec.op)
    return judge(op, spec, results, clean_metrics, clean_error, copy_gbps, check_slowdown=mode == "gpu")


def confirm(
    spec: OpSpec,
    candidates: Sequence[Candidate],
    mode: str,
    timing: TimingSettings | None = None,
    *,
    copy_gbps: float | None = None,
    timeout_s: float | None = None,
) -> Confirmation:
    """:meth:`Evaluator.confirm` without a pool (the agent bench's KEEP)."""
    settings = timing or default_settings(mode)
    with tempfile.TemporaryDirectory(prefix="kernelsmith-confirm-") as folder:
        fresh = fresh_worker(mode, folder, sandbox.default_memory_cap(1), timeout_s or default_timeout(mode))
        return judge_fresh(spec, candidates, settings, fresh, mode=mode, lock_path="", copy_gbps=copy_gbps)


def default_timeout(mode: str) -> float:
    return 120.0 if mode == "gpu" else 600.0


def default_settings(mode: str) -> TimingSettings:
    return TimingSettings() if mode == "gpu" else TimingSettings.interpreter()


def resolve_devices(mode: str, devices: Sequence[int | str] | str | None) -> list[str | None]:
    """The device each worker may be pinned to: ``[None]`` (no pinning) or CUDA device ids.

    ``devices`` are indices among the devices this process sees (``cuda:0``, ``cuda:1``, as
    torch numbers them), given as a list or as text such as ``"0,1"``; None means every visible
    one in GPU mode, and no pinning at all with a single device, so that one GPU runs exactly as
    before. Each index is turned into the id a worker's ``CUDA_VISIBLE_DEVICES`` needs: with
    ``CUDA_VISIBLE_DEVICES=2,3`` set for the tuning process, index 1 is device ``3``. In
    interpreter mode there is no device: given indices are kept as they are (tests use them
    as fake devices), None gives no pinning.
    """
    if isinstance(devices, str):
        devices = parse_devices(devices)
    visible_env = os.environ.get("CUDA_VISIBLE_DEVICES")
    visible = [v.strip() for v in visible_env.split(",") if v.strip()] if visible_env is not None else None
    if mode != "gpu":
        return [None] if devices is None else [str(d) for d in _unique(devices)]
    if devices is None:
        import torch

        count = torch.cuda.device_count()
        if count <= 1:
            return [None]
        devices = list(range(count))
    resolved: list[str | None] = []
    for index in _unique(devices):
        number = int(index)
        if visible is not None:
            if not 0 <= number < len(visible):
                raise ValueError(f"device {number} is not visible (CUDA_VISIBLE_DEVICES={visible_env})")
            resolved.append(visible[number])
        else:
            resolved.append(str(number))
    if not resolved:
        raise ValueError("devices names no device")
    return resolved


def parse_devices(text: str) -> list[int]:
    """``"0,1"`` -> ``[0, 1]``: the ``--devices`` option."""
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ValueError(f"--devices {text!r}: expected device numbers such as 0,1") from None


def _unique(items: Sequence[int | str]) -> list[int | str]:
    return list(dict.fromkeys(items))


class SlotPool(Generic[S]):
    """Free slots (workers, or actors) handed out one at a time, with a wish to avoid some.

    :meth:`acquire` waits for a free slot not in ``avoid`` (the slots that already failed to
    take a request); when every slot is to be avoided, any free one will do.
    """

    def __init__(self) -> None:
        self._free: list[S] = []
        self._all: list[S] = []
        self._changed = threading.Condition()

    def add(self, slot: S) -> None:
        with self._changed:
            self._all.append(slot)
            self._free.append(slot)
            self._changed.notify_all()

    def remove(self, slot: S) -> None:
        """Forget a slot for good (it is not free: its holder removes it instead of releasing)."""
        with self._changed:
            self._all = [s for s in self._all if s is not slot]
            self._changed.notify_all()

    def acquire(self, avoid: Sequence[S] = ()) -> S:
        with self._changed:
            while True:
                wanted = [s for s in self._free if not any(s is a for a in avoid)]
                if not wanted and all(any(s is a for a in avoid) for s in self._all):
                    wanted = self._free  # every slot failed once: take any free one
                if wanted:
                    slot = wanted[0]
                    self._free.remove(slot)
                    return slot
                self._changed.wait()

    def release(self, slot: S) -> None:
        with self._changed:
            self._free.append(slot)
            self._changed.notify_all()

    @property
    def size(self) -> int:
        with self._changed:
            return len(self._all)

    @property
    def members(self) -> list[S]:
        """Every slot, free or not."""
        with self._changed:
            return list(self._all)

    def drain(self) -> list[S]:
        """Every free slot, taken out (closing time)."""
        with self._changed:
            free, self._free = self._free, []
            return free


class RequestPool:
    """What the local pool and the Ray executor share: candidates become requests, requests go
    to :meth:`_call` (a free worker, wherever it runs), and a lost worker becomes failure records.

    A subclass sets ``mode``, ``timeout_s``, ``lock_path`` and ``_executor`` (the threads that
    wait on answers) and provides :meth:`_call`, :meth:`confirm` and :meth:`close`.
    """

    mode: str
    n_workers: int
    timeout_s: float
    lock_path: str
    _executor: ThreadPoolExecutor

    def _call(self, request: Request) -> WorkerReply:
        raise NotImplementedError

    def _settings(self, timing: TimingSettings | None) -> TimingSettings:
        return timing or default_settings(self.mode)

    def _request(
        self, spec: OpSpec, candidates: Sequence[Candidate], timing: TimingSettings | None, measure: bool
    ) -> EvalRequest:
        settings = self._settings(timing)
        return EvalRequest(spec.to_dict(), tuple(candidates), self.mode, settings, measure, self.lock_path)

    def _run(self, request: EvalRequest) -> list[EvalResult]:
        try:
            return list(self._call(request).results)
        except WorkerLost as lost:
            return [EvalResult(c, lost.kind, str(lost)) for c in request.candidates]

    def evaluate(
        self,
        spec: OpSpec,
        candidates: Sequence[Candidate],
        timing: TimingSettings | None = None,
        measure: bool = True,
    ) -> list[EvalResult]:
        """Evaluate each candidate in its own request, in parallel across the workers (see
        :meth:`submit`); the results come in the candidates' order."""
        futures = [self.submit(spec, c, timing, measure) for c in candidates]
        return [f.result() for f in futures]

    def submit(
        self,
        spec: OpSpec,
        candidate: Candidate,
        timing: TimingSettings | None = None,
        measure: bool = True,
    ) -> Future[EvalResult]:
        """Evaluate one candidate on the next free worker; the future never raises.

        A candidate that came back "skipped" (an earlier candidate broke its worker) is retried
        once in a fresh worker.
        """
        request = self._request(spec, [candidate], timing, measure)

        def run() -> EvalResult:
            result = self._run(request)[0]
            return self._run(request)[0] if result.status == "skipped" else result

        return self._executor.submit(run)

    def evaluate_together(
        self, spec: OpSpec, candidates: Sequence[Candidate], timing: TimingSettings | None = None
    ) -> list[EvalResult]:
        """Evaluate candidates in one request, timed interleaved with each other and the baseline
        (one worker: one device)."""
        return self._run(self._request(spec, candidates, timing, True))

    def measure_ceiling(self) -> CeilingResult:
        if self.mode != "gpu":
            return CeilingResult("skipped", error="no GPU ceiling in interpreter mode")
        try:
            result: CeilingResult = self._call(CeilingRequest()).results[0]
            return result
        except WorkerLost as lost:
            return CeilingResult(lost.kind, error=str(lost))


class Evaluator(RequestPool):
    """Evaluates candidates for one mode ("gpu" or "interpreter") in a pool of workers.

    ``workers`` is the number of worker processes in all, spread round-robin over ``devices``
    (default: every visible GPU, see :func:`resolve_devices`; at least one worker per device).
    ``memory_cap`` is the bytes each worker's process tree may hold (default: half the machine's
    memory shared among the workers); ``worker`` replaces the worker's module and arguments for
    the pool's workers (tests: a misbehaving stand-in). :meth:`confirm` always runs the real one.

    >>> # evaluator = Evaluator("interpreter", workers=2)
    >>> # results = evaluator.evaluate(spec, [Candidate("whole_row", Config(num_warps=4, num_stages=1))])
    """

    # The workers compile into this process's own Triton cache (user_triton_cache), so what this
    # process compiles ahead of them is there for them (kernelsmith.evaluate.compile_ahead).
    shares_triton_cache = True

    def __init__(
        self,
        mode: str,
        workers: int | None = None,
        timeout_s: float | None = None,
        *,
        memory_cap: int | None = None,
        worker: Sequence[str] = (WORKER_MODULE,),
        devices: Sequence[int | str] | str | None = None,
    ) -> None:
        if mode not in ("gpu", "interpreter"):
            raise ValueError(f"mode must be 'gpu' or 'interpreter', not {mode!r}")
        self.mode = mode
        self.devices = resolve_devices(mode, devices)
        cores = os.cpu_count() or 2
        default = max(1, min(8, cores // 2)) if mode == "gpu" else min(2, cores)
        self.n_workers = max(len(self.devices), workers or default)
        self.timeout_s = timeout_s or default_timeout(mode)
        self.memory_cap = memory_cap or sandbox.default_memory_cap(self.n_workers)
        self._tmp = tempfile.TemporaryDirectory(prefix="kernelsmith-")
        # One timing lock per device: workers sharing a GPU take turns, other GPUs time at once.
        # In interpreter mode only pinned (fake) devices have one, for the tests of this logic.
        self.locks = {
            device: os.path.join(self._tmp.name, "gpu.lock" if device is None else f"gpu{device}.lock")
            for device in self.devices
            if mode == "gpu" or device is not None
        }
        self.lock_path = self.locks.get(self.devices[0], "")  # the confirmation's device
        cache = user_triton_cache()
        self._slots: SlotPool[WorkerProcess] = SlotPool()
        self._executor = ThreadPoolExecutor(max_workers=self.n_workers, thread_name_prefix="kernelsmith-eval")
        for i in range(self.n_workers):
            # Interpreters start in the background while the caller prepares; a slot joins the
            # pool only once its worker is ready (or failed to start: the first call retries).
            device = self.devices[i % len(self.devices)]
            slot = WorkerProcess(
                mode, self._tmp.name, self.memory_cap, triton_cache=cache, command=worker, device=device
            )  # fmt: skip
            self._executor.submit(self._prestart, slot)
        self._closed = threading.Event()

    def _prestart(self, slot: WorkerProcess) -> None:
        try:
            slot.start()
        except WorkerLost as lost:
            log.warning("worker failed to start%s: %s", _on(slot.device), lost)
        finally:
            self._slots.add(slot)

    def _call(self, request: Request) -> WorkerReply:
        """One request on the next free worker, with that worker's device lock. A worker that
        could not even take the request (it failed to start) is not the candidate's fault: the
        request goes to another worker, each worker tried at most once."""
        tried: list[WorkerProcess] = []
        while True:
            slot = self._slots.acquire(avoid=tried)
            if isinstance(request, EvalRequest):
                request = dataclasses.replace(request, lock_path=self.locks.get(slot.device, ""))
            try:
                return slot.call(request, self.timeout_s)
            except WorkerLost as lost:
                tried.append(slot)
                if not lost.before_request or len(tried) >= self._slots.size:
                    raise
                log.warning("a worker%s could not take a request, trying another: %s", _on(slot.device), lost)
            finally:
                self._slots.release(slot)

    def confirm(
        self,
        spec: OpSpec,
        candidates: Sequence[Candidate],
        timing: TimingSettings | None = None,
        copy_gbps: float | None = None,
    ) -> Confirmation:
        """The decisive run of candidates about to be kept, in brand-new workers of the real
        worker module, one request each, both on the first device under its lock (see
        :mod:`kernelsmith.evaluate.confirm`)."""
        fresh = fresh_worker(self.mode, self._tmp.name, self.memory_cap, self.timeout_s, self.devices[0])
        return judge_fresh(
            spec, candidates, self._settings(timing), fresh, mode=self.mode, lock_path=self.lock_path,
            copy_gbps=copy_gbps,
        )  # fmt: skip

    def close(self) -> None:
        if self._closed.is_set():
            return
        self._closed.set()
        self._executor.shutdown(wait=True)
        for slot in self._slots.drain():
            slot.close()
        self._tmp.cleanup()

    def __enter__(self) -> Evaluator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _on(device: str | None) -> str:
    return "" if device is None else f" on device {device}"

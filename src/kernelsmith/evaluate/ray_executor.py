"""Evaluations on a Ray cluster: Ray actors holding one GPU each, each running a sandboxed worker.

Ray is the distributed engine; nothing here schedules, places or moves data by itself. Each
:class:`EvalActor` is a Ray actor with ``num_gpus=1`` (``num_cpus=1`` and no GPU in interpreter
mode), so Ray picks its node and its GPU and pins it there through ``CUDA_VISIBLE_DEVICES``. The
actor is only a forwarder: it starts the same :class:`~kernelsmith.evaluate.pool.WorkerProcess`
as the local pool, on its own node, and passes it the JSON request it got from the tuning
process. The harness, the sandbox, the protocol checks and the decisions are therefore the same
as on one host: the candidate's source and config go out, records and failures come back as
data, and the tuning process decodes the worker's reply against its request
(:func:`~kernelsmith.evaluate.protocol.decode_reply`) as it would a local worker's.

What is new is a loss the local pool does not have: the actor itself (its node, its Ray worker)
can die mid-evaluation. That is not the candidate's fault, so it is never the end of a tuning
run: the actor is replaced, the request is retried on another actor (up to
``MAX_ATTEMPTS`` times), and only a request that lost every attempt comes back as a ``crash``
failure record. A crash of the worker process under a live actor is the candidate's, as locally.

Ray is an optional dependency (``pip install -e '.[ray]'``), imported only here and only
when this executor is chosen. Every Ray node needs kernelsmith installed, like any Ray library.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import shutil
import socket
import tempfile
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import urlsplit

from kernelsmith.evaluate import sandbox
from kernelsmith.evaluate.confirm import Confirmation
from kernelsmith.evaluate.executor import ExecutorUnavailable
from kernelsmith.evaluate.pool import (
    STARTUP_TIMEOUT_S,
    WORKER_MODULE,
    RequestPool,
    SlotPool,
    WorkerLost,
    WorkerProcess,
    default_timeout,
    judge_fresh,
    user_triton_cache,
)
from kernelsmith.evaluate.protocol import (
    Candidate,
    EvalRequest,
    ProtocolError,
    Request,
    TimingSettings,
    WorkerReply,
    decode_reply,
    decode_request,
    encode_reply,
    encode_request,
)
from kernelsmith.extras import missing
from kernelsmith.spec import OpSpec

log = logging.getLogger(__name__)

MISSING_RAY = missing("the Ray executor", "ray")
MAX_ATTEMPTS = 3  # actors a request may lose before it is a failure record
_PROBE_TIMEOUT_S = 5.0
_CLOSE_TIMEOUT_S = 30.0


def import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise ImportError(MISSING_RAY) from None
    return ray


def connect(address: str | None = None) -> Any:
    """Ray, connected: to ``address`` (``ray://host:port``, ``auto``, or a GCS ``host:port``), to
    the cluster this process already joined, or to a new local one (``ray.init()``).

    An address that does not answer raises :class:`ExecutorUnavailable` with one line, before
    anything is tuned; a ``ray://`` address is probed with a short TCP connect first, since the
    Ray client would otherwise retry for a long time.
    """
    ray = import_ray()
    if address and address.startswith("ray://"):  # probed even when joined: a typo must not pass
        parts = urlsplit(address)
        try:
            with socket.create_connection((parts.hostname or "", parts.port or 10001), timeout=_PROBE_TIMEOUT_S):
                pass
        except (OSError, ValueError) as exc:  # ValueError: a port that is not a number
            raise ExecutorUnavailable(f"cannot reach the Ray cluster at {address}: {exc}") from None
    if ray.is_initialized():
        return ray
    where = address or "a new local Ray cluster"
    options: dict[str, Any] = {"logging_level": logging.WARNING, "log_to_driver": False}
    if not address:
        options["include_dashboard"] = False
    try:
        ray.init(address=address or None, **options)
    except Exception as exc:  # Ray raises ConnectionError, RuntimeError or its own kinds
        raise ExecutorUnavailable(f"cannot reach the Ray cluster at {where}: {_first_line(exc)}") from None
    return ray


class EvalActor:
    """One evaluation slot of the cluster: a worker process on this actor's node and device.

    It decodes the request (the same schema check a worker makes), runs it in its
    :class:`WorkerProcess` (or, for a confirmation, in a brand-new one of the real worker
    module), and returns the worker's checked reply re-encoded as JSON, or the worker's loss as
    plain values. The actor holds its device alone (``num_gpus=1``), so it needs no timing lock.
    """

    def __init__(self, mode: str, memory_cap: int, command: Sequence[str], timeout_s: float) -> None:
        self.mode, self.memory_cap, self.timeout_s = mode, memory_cap, timeout_s
        self.folder = tempfile.mkdtemp(prefix="kernelsmith-ray-")
        self.worker = WorkerProcess(mode, self.folder, memory_cap, triton_cache=user_triton_cache(), command=command)

    def start(self) -> str:
        """Start the worker ahead of the first request; returns where this actor runs."""
        try:
            self.worker.start()
        except WorkerLost as lost:  # the first request tries again
            log.warning("worker failed to start: %s", lost)
        return socket.gethostname()

    def call(self, data: bytes, fresh: bool = False) -> tuple[Any, ...]:
        """``("reply", reply JSON)`` or ``("lost", kind, message, before_request)``."""
        request = decode_request(data)
        assert request is not None, "the executor never sends close"
        if isinstance(request, EvalRequest):
            request = dataclasses.replace(request, lock_path="")
        worker = self.worker
        if fresh:
            worker = WorkerProcess(self.mode, self.folder, self.memory_cap, triton_cache=user_triton_cache())
        try:
            return ("reply", encode_reply(worker.call(request, self.timeout_s)))
        except WorkerLost as lost:
            return ("lost", lost.kind, str(lost), lost.before_request)
        finally:
            if fresh:
                worker.kill()

    def close(self) -> None:
        self.worker.close()
        shutil.rmtree(self.folder, ignore_errors=True)


class RayExecutor(RequestPool):
    """The :class:`~kernelsmith.evaluate.executor.Executor` of a Ray cluster.

    ``workers`` actors (default: one per GPU of the cluster; in interpreter mode one per CPU, at
    most 8) are created at once and stream candidates like the local pool's workers.
    ``address`` is passed to :func:`connect`; ``worker`` replaces the worker's module for the
    search (tests), never for the confirmation.
    """

    def __init__(
        self,
        mode: str,
        workers: int | None = None,
        timeout_s: float | None = None,
        *,
        address: str | None = None,
        memory_cap: int | None = None,
        worker: Sequence[str] = (WORKER_MODULE,),
    ) -> None:
        if mode not in ("gpu", "interpreter"):
            raise ValueError(f"mode must be 'gpu' or 'interpreter', not {mode!r}")
        self._ray = connect(address)
        self.mode = mode
        self.timeout_s = timeout_s or default_timeout(mode)
        self.lock_path = ""  # each actor holds its device alone
        resources = self._ray.cluster_resources()
        unit = "GPU" if mode == "gpu" else "CPU"
        capacity = int(resources.get(unit, 0))
        if capacity < 1:
            raise ExecutorUnavailable(f"the Ray cluster has no {unit} for {mode}-mode evaluations")
        if mode == "interpreter" and workers is None:
            capacity = min(capacity, 8)
        if workers is not None and workers > capacity:
            log.warning("the Ray cluster has %d %s: %d actors, not %d", capacity, unit, capacity, workers)
        self.n_workers = min(workers or capacity, capacity)
        nodes = max(1, sum(1 for node in self._ray.nodes() if node.get("Alive")))
        self.memory_cap = memory_cap or sandbox.default_memory_cap(math.ceil(self.n_workers / nodes))
        resources_per_actor = {"num_gpus": 1, "num_cpus": 1} if mode == "gpu" else {"num_gpus": 0, "num_cpus": 1}
        self._actor_class = self._ray.remote(max_restarts=0, **resources_per_actor)(EvalActor)
        self._command = tuple(worker)
        self._replacements = 2 * self.n_workers  # actors this executor may start to replace lost ones
        self._lock = threading.Lock()
        self.lost_actors = 0
        self.actors: list[Any] = []  # live actors (the tests kill one)
        self._slots: SlotPool[Any] = SlotPool()
        for _ in range(self.n_workers):
            self._slots.add(self._new_actor())
        self._executor = ThreadPoolExecutor(max_workers=self.n_workers, thread_name_prefix="kernelsmith-ray")
        self._closed = threading.Event()

    def _new_actor(self) -> Any:
        actor = self._actor_class.remote(self.mode, self.memory_cap, self._command, self.timeout_s)
        actor.start.remote()  # the worker starts while the caller prepares; calls queue behind it
        with self._lock:
            self.actors.append(actor)
        return actor

    def _lose(self, actor: Any, error: Exception) -> str:
        """Forget a dead (or stuck) actor and start a replacement while replacements are left."""
        ray = self._ray
        self._slots.remove(actor)
        with self._lock:
            self.actors = [a for a in self.actors if a is not actor]
            self.lost_actors += 1
            replace = self._replacements > 0
            self._replacements -= int(replace)
        ray.kill(actor, no_restart=True)
        if replace:
            self._slots.add(self._new_actor())
        return f"a Ray actor was lost ({type(error).__name__}: {_first_line(error)})"

    def _ask(self, actor: Any, request: Request, fresh: bool = False) -> WorkerReply:
        """One request on one actor; raises WorkerLost for the worker's loss and lets Ray's
        errors (the actor's loss) through to the caller."""
        ray = self._ray
        wait_s = self.timeout_s + STARTUP_TIMEOUT_S + 60  # the worker's own limits, then some
        answer = ray.get(actor.call.remote(encode_request(request), fresh), timeout=wait_s)
        if answer[0] == "lost":
            _, kind, message, before_request = answer
            raise WorkerLost(kind, message, before_request=before_request)
        try:
            return decode_reply(answer[1], request)
        except ProtocolError as exc:
            raise WorkerLost("crash", f"the worker's reply is malformed: {exc}") from None

    def _call(self, request: Request) -> WorkerReply:
        """The request on a free actor; a lost actor (or a worker that could not start) sends it
        to another, at most ``MAX_ATTEMPTS`` times in all."""
        ray = self._ray
        tried: list[Any] = []
        losses: list[str] = []
        for _ in range(MAX_ATTEMPTS):
            if self._slots.size == 0:
                break
            actor = self._slots.acquire(avoid=tried)
            try:
                reply = self._ask(actor, request)
            except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError) as exc:
                losses.append(self._lose(actor, exc))
                log.warning("%s; the request goes to another actor", losses[-1])
                continue
            except ray.exceptions.RayError as exc:  # the actor lives but its call failed: data too
                self._slots.release(actor)
                raise WorkerLost("crash", f"the Ray call failed: {_first_line(exc)}") from None
            except WorkerLost as lost:
                self._slots.release(actor)
                if not lost.before_request:
                    raise
                tried.append(actor)
                losses.append(str(lost))
                continue
            self._slots.release(actor)
            return reply
        last = losses[-1] if losses else "no actor left"
        raise WorkerLost("crash", f"lost {len(losses)} attempts on the Ray cluster; last: {last}")

    def confirm(
        self,
        spec: OpSpec,
        candidates: Sequence[Candidate],
        timing: TimingSettings | None = None,
        copy_gbps: float | None = None,
    ) -> Confirmation:
        """The decisive run (see :mod:`kernelsmith.evaluate.confirm`), both fresh workers started
        by one actor, so on one device; judged here. A lost actor is a confirmation that could
        not run: nothing is kept."""
        ray = self._ray
        actor = self._slots.acquire()

        def fresh(request: EvalRequest) -> WorkerReply | WorkerLost:
            try:
                return self._ask(actor, request, fresh=True)
            except WorkerLost as lost:
                return lost
            except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError) as exc:
                return WorkerLost("crash", self._lose(actor, exc))
            except ray.exceptions.RayError as exc:
                return WorkerLost("crash", f"the Ray call failed: {_first_line(exc)}")

        try:
            return judge_fresh(
                spec, candidates, self._settings(timing), fresh, mode=self.mode, lock_path="", copy_gbps=copy_gbps
            )
        finally:
            if any(a is actor for a in self.actors):
                self._slots.release(actor)

    def close(self) -> None:
        """End every actor (each closes its worker); the cluster itself is left running."""
        if self._closed.is_set():
            return
        self._closed.set()
        self._executor.shutdown(wait=True)
        ray = self._ray
        actors = self._slots.drain()
        done = [actor.close.remote() for actor in actors]
        try:
            if done:
                ray.wait(done, num_returns=len(done), timeout=_CLOSE_TIMEOUT_S)
        finally:
            for actor in self.actors:
                ray.kill(actor, no_restart=True)
            self.actors = []

    def __enter__(self) -> RayExecutor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _first_line(error: BaseException) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0][:300]

"""One isolated worker process as the host sees it: start, call with a deadline, watch, kill.

Part of the evaluation pool (:mod:`kernelsmith.evaluate.pool`): a :class:`WorkerProcess` starts
``kernelsmith.evaluate.worker`` in its sandbox, speaks the length-prefixed protocol over a socket
with a deadline on every read and write, caps the memory of the worker's process tree, and turns
every way a worker can fail (a crash, a hang, an oversized reply) into :class:`WorkerLost`, data
the pool records instead of an exception reaching the caller.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from kernelsmith.evaluate import sandbox
from kernelsmith.evaluate.protocol import (
    MAX_REPLY_BYTES,
    ProtocolError,
    Request,
    WorkerReply,
    decode_reply,
    encode_close,
    encode_request,
    is_ready,
)

log = logging.getLogger("kernelsmith.evaluate.pool")  # this code's logger in pool.py


STARTUP_TIMEOUT_S = 180.0
WORKER_MODULE = "kernelsmith.evaluate.worker"
_WATCH_INTERVAL_S = 1.0  # how often the resident memory of a busy worker's tree is checked
_HEADER = struct.Struct("!i")  # the multiprocessing.connection frame header: the payload's length
class WorkerLost(Exception):
    """A worker that gave no checked answer. ``before_request``: it never got the request (it
    could not start), so the candidate is not to blame and may be retried elsewhere."""

    def __init__(self, kind: str, message: str, *, before_request: bool = False) -> None:
        super().__init__(message)
        self.kind = kind
        self.before_request = before_request


def _package_root() -> str:
    return str(Path(__file__).resolve().parents[2])


class WorkerProcess:
    """One worker interpreter and its connection; restarted on demand.

    ``command`` is the worker's module and its extra arguments: the real worker, or in tests a
    stand-in that misbehaves on purpose (:mod:`kernelsmith.testing.hostile_worker`). Each start
    gets a fresh private home under ``log_dir``; ``triton_cache`` is a compile cache shared by
    the pool's workers ("": one inside the private home, for a worker that must share nothing).
    ``device``, when given, is the only CUDA device the worker sees (its ``CUDA_VISIBLE_DEVICES``).
    """

    def __init__(
        self,
        mode: str,
        log_dir: str,
        memory_cap: int,
        *,
        triton_cache: str = "",
        command: Sequence[str] = (WORKER_MODULE,),
        max_reply_bytes: int = MAX_REPLY_BYTES,
        device: str | None = None,
    ) -> None:
        self.mode = mode
        self.device = device
        self.log_dir = log_dir
        self.memory_cap = memory_cap
        self.triton_cache = triton_cache
        self.command = tuple(command)
        self.max_reply_bytes = max_reply_bytes
        self.proc: subprocess.Popen[bytes] | None = None
        self.sock: socket.socket | None = None
        self.home = ""
        self.log_path = ""
        self._seen: dict[int, str] = {}  # pid -> start time of processes seen in the worker's tree

    def start(self) -> None:
        parent_sock, child_sock = socket.socketpair()
        self.home = tempfile.mkdtemp(prefix="home-", dir=self.log_dir)
        env = sandbox.worker_environment(
            os.environ, mode=self.mode, home=self.home, package_root=_package_root(),
            triton_cache=self.triton_cache or os.path.join(self.home, "triton-cache"),
        )  # fmt: skip
        if self.device is not None:
            env["CUDA_VISIBLE_DEVICES"] = self.device
        caps = ["--address-space", str(sandbox.address_space_limit(self.memory_cap))] if self.mode != "gpu" else []
        module, *args = self.command
        handle, self.log_path = tempfile.mkstemp(prefix="worker-", suffix=".log", dir=self.log_dir)
        with os.fdopen(handle, "wb") as log_file:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", module, str(child_sock.fileno()), *args, *caps],
                pass_fds=(child_sock.fileno(),),
                env=env,
                cwd=self.home,
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=log_file,
                start_new_session=True,  # its own session and process group
            )
        child_sock.close()
        self.sock = parent_sock
        self._seen = {}
        try:
            hello = self._receive(time.monotonic() + STARTUP_TIMEOUT_S, "starting")
        except WorkerLost as lost:
            self.kill()
            raise WorkerLost("crash", f"worker failed to start: {lost}", before_request=True) from None
        if not is_ready(hello):
            self.kill()
            raise WorkerLost("crash", f"unexpected worker greeting {hello[:60]!r}", before_request=True)

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None and self.sock is not None

    def call(self, request: Request, timeout_s: float) -> WorkerReply:
        """Send one request and return the worker's checked reply, or raise :class:`WorkerLost`."""
        if not self.alive:
            self.kill()
            self.start()
        assert self.sock is not None
        deadline = time.monotonic() + timeout_s
        try:
            self._send(encode_request(request), deadline)
            data = self._receive(deadline, "answering")
            reply = decode_reply(data, request)
        except ProtocolError as exc:
            self.kill()
            raise WorkerLost("crash", f"the worker's reply is malformed: {exc}") from None
        except WorkerLost:
            self.kill()
            raise
        if reply.recycle:
            self.kill()
        return reply

    # ---- framing: multiprocessing.connection's format, read here with a deadline and a bound ----
    def _send(self, data: bytes, deadline: float) -> None:
        assert self.sock is not None
        self.sock.settimeout(max(0.001, deadline - time.monotonic()))
        try:
            self.sock.sendall(_HEADER.pack(len(data)) + data)
        except TimeoutError:
            raise WorkerLost("timeout", "the worker did not take its request in time") from None
        except OSError:
            raise self._died() from None

    def _receive(self, deadline: float, doing: str) -> bytes:
        """One message, read within ``deadline`` and refused above ``max_reply_bytes``.

        ``Connection.recv_bytes(maxlength)`` bounds the size but not the time: once a header has
        arrived it blocks until the promised bytes do, so a worker that stops mid-message would
        hang the caller. Reading here, every wait has the request's deadline.
        """
        (size,) = _HEADER.unpack(self._read(_HEADER.size, deadline, doing))
        if size < 0 or size > self.max_reply_bytes:
            raise WorkerLost("crash", f"the worker sent a message of {size} bytes (at most {self.max_reply_bytes})")
        return self._read(size, deadline, doing)

    def _read(self, n: int, deadline: float, doing: str) -> bytes:
        assert self.sock is not None
        chunks: list[bytes] = []
        while n:
            self._wait_readable(deadline, doing)
            try:
                chunk = self.sock.recv(min(n, 1 << 20))
            except OSError:
                chunk = b""
            if not chunk:
                raise self._died()
            chunks.append(chunk)
            n -= len(chunk)
        return b"".join(chunks)

    def _wait_readable(self, deadline: float, doing: str) -> None:
        """Wait for bytes; meanwhile keep the worker's tree under its memory cap."""
        assert self.sock is not None and self.proc is not None
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise WorkerLost("timeout", f"no answer within the time limit while {doing} (hang or runaway kernel)")
            readable, _, _ = select.select([self.sock], [], [], min(remaining, _WATCH_INTERVAL_S))
            if readable:
                return
            self._watch()
            if self.proc.poll() is not None:  # dead, but something it started holds the socket
                raise self._died()

    def _watch(self) -> None:
        assert self.proc is not None
        pids = [self.proc.pid, *sandbox.descendants(self.proc.pid)]
        for pid in pids:
            started = sandbox.process_start(pid)
            if started:
                self._seen.setdefault(pid, started)
        rss = sandbox.tree_rss_bytes(self.proc.pid)
        if rss > self.memory_cap:
            raise WorkerLost(
                "crash", f"the worker's processes held {rss / 2**30:.1f} GiB, above the cap of "
                f"{self.memory_cap / 2**30:.1f} GiB: killed",
            )  # fmt: skip

    def _died(self) -> WorkerLost:
        code = None
        if self.proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                code = self.proc.wait(timeout=10)
        return WorkerLost("crash", f"worker died (exit code {code}): {self.log_tail()}")

    def log_tail(self, n: int = 1500) -> str:
        try:
            text = Path(self.log_path).read_text(errors="replace")
        except OSError:
            return ""
        return text[-n:].strip().replace("\n", " | ")

    def kill(self) -> None:
        """End the worker and everything it started, and remove its private home."""
        if self.sock is not None:
            self.sock.close()
            self.sock = None
        if self.proc is not None:
            if self.proc.poll() is None:
                sandbox.kill_tree(self.proc.pid)
            else:  # it died first: what is left of its process group
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
            # Processes seen in its tree earlier, in case the worker died first and they escaped
            # the tree with it (the same pid and start time: the same process).
            sandbox.kill_if_same(self._seen)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                log.warning("worker %d did not end after SIGKILL", self.proc.pid)
        self.proc = None
        self._seen = {}
        if self.home:
            shutil.rmtree(self.home, ignore_errors=True)
            self.home = ""

    def close(self) -> None:
        if self.alive and self.sock is not None and self.proc is not None:
            try:
                self._send(encode_close(), time.monotonic() + 5)
                self.proc.wait(timeout=10)
            except (WorkerLost, subprocess.TimeoutExpired):
                pass
        self.kill()



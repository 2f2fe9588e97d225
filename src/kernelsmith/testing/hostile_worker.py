"""A stand-in worker that breaks the protocol on purpose: the tests of the worker boundary.

Issue 12 showed what a worker taken over by its candidate did: it wrote its own verdict on the
socket, sent a pickle that would run code in the tuning process, left daemons behind. Kernel
files can no longer run host code, so no candidate can do this any more; this module does it
instead, so that the caller's side of the boundary is tested against exactly those replies:

    python -m kernelsmith.testing.hostile_worker FD MODE [ARG] [--address-space BYTES]

(started through ``WorkerProcess(..., command=("kernelsmith.testing.hostile_worker", MODE, ARG))``).
It greets like the real worker, reads one request, then, by MODE:

- ``garbage``: a well-framed message of bytes that are not JSON;
- ``unframed``: bytes written straight on the socket, with no length header;
- ``pickle``: a pickle that creates the file ARG when unpickled (:func:`crafted_pickle`);
- ``truncated``: the first half of a well-formed reply;
- ``oversize``: a message one byte over ``protocol.MAX_REPLY_BYTES``;
- ``stalls``: a header that promises bytes which never come;
- ``wrong_types``: a well-formed reply whose ``median_us`` is a string;
- ``unknown_field``: a well-formed reply with a field the schema does not have;
- ``other_candidate``: a well-formed reply for a candidate that was not asked about;
- ``forge_ok``: a well-formed reply saying every candidate is correct and 100x faster;
- ``hog``: holds ARG MiB of memory and never answers (a MemoryError under the address-space cap
  is a "runtime" reply);
- ``daemon``: starts a daemon that escapes into its own session (double fork, ``setsid``),
  writes its pid to ARG, and answers normally, through the real worker's main loop;
- ``daemon_hangs``: the same, then never answers.

After the bad bytes it waits for the next request, so that what the caller sees is the bytes,
not the worker's exit.
"""

from __future__ import annotations

import argparse
import os
import pickle
import sys
import time
from multiprocessing.connection import Connection
from typing import Any

from kernelsmith.evaluate import sandbox
from kernelsmith.evaluate.protocol import (
    MAX_REPLY_BYTES,
    Candidate,
    EvalRequest,
    EvalResult,
    Request,
    WorkerReply,
    decode_request,
    encode_ready,
    encode_reply,
)
from kernelsmith.space import Config

FORGED_METRICS: dict[str, Any] = {
    "median_us": 1.0, "p10_us": 1.0, "p90_us": 1.0, "baseline_median_us": 100.0,
    "samples_us": [1.0] * 40, "baseline_samples_us": [100.0] * 40, "gbps": 1.0, "baseline_gbps": 0.01,
    "timer": "host-clock-interpreter",
}  # fmt: skip


class _CreatesFile:
    """Unpickling this opens (creates) a file: what a crafted pickle can do to its reader."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple[object, tuple[str, str]]:
        return (open, (self.path, "w"))


def crafted_pickle(path: str) -> bytes:
    """A pickle whose loading creates ``path``."""
    return pickle.dumps(_CreatesFile(path))


def _candidates(request: Request | None) -> tuple[Candidate, ...]:
    return request.candidates if isinstance(request, EvalRequest) else ()


def _reply(
    request: Request | None, status: str = "ok", error: str = "", metrics: dict[str, Any] | None = None
) -> WorkerReply:
    return WorkerReply(tuple(EvalResult(c, status, error, metrics=dict(metrics or {})) for c in _candidates(request)))


def _spawn_daemon() -> int:
    """Start a process that leaves this one's session and is orphaned at once; its pid."""
    read_end, write_end = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - runs in the child
        os.setsid()
        if os.fork() == 0:
            os.write(write_end, str(os.getpid()).encode())
            time.sleep(600)
        os._exit(0)
    os.close(write_end)
    os.waitpid(child, 0)
    pid = int(os.read(read_end, 32))
    os.close(read_end)
    return pid


def _raw(conn: Connection, mode: str, arg: str, request: Request | None) -> None:
    """Answer ``request`` with bytes that break the protocol."""
    fd = conn.fileno()
    if mode == "garbage":
        conn.send_bytes(b"\x80\x04\x95 this is not json \xff\xfe")
    elif mode == "unframed":
        os.write(fd, b"hello, caller: no header here")
    elif mode == "pickle":
        conn.send_bytes(crafted_pickle(arg))
    elif mode == "truncated":
        data = encode_reply(_reply(request, metrics=FORGED_METRICS))
        conn.send_bytes(data[: len(data) // 2])
    elif mode == "oversize":
        conn.send_bytes(b" " * (MAX_REPLY_BYTES + 1))
    elif mode == "stalls":
        os.write(fd, (1000).to_bytes(4, "big") + b'{"kind":')
    elif mode == "wrong_types":
        conn.send_bytes(encode_reply(_reply(request, metrics={**FORGED_METRICS, "median_us": "fast"})))
    elif mode == "unknown_field":
        data = encode_reply(_reply(request, metrics=FORGED_METRICS))
        conn.send_bytes(data.replace(b'"recycle":', b'"exec":"rm -rf /","recycle":', 1))
    elif mode == "other_candidate":
        other = EvalRequest({}, (Candidate("forged", Config(a=1)),))
        conn.send_bytes(encode_reply(_reply(other, metrics=FORGED_METRICS)))
    elif mode == "forge_ok":
        conn.send_bytes(encode_reply(_reply(request, metrics=FORGED_METRICS)))
    elif mode == "hog":
        try:
            hoard = bytearray(b"\x01") * (int(arg) << 20)  # written, so resident
        except MemoryError:
            conn.send_bytes(encode_reply(_reply(request, "runtime", "MemoryError")))
        else:
            time.sleep(600)  # holding it, until the pool's watch ends this
            del hoard
    else:
        raise SystemExit(f"unknown mode {mode!r}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kernelsmith.testing.hostile_worker")
    parser.add_argument("fd", type=int)
    parser.add_argument("mode")
    parser.add_argument("arg", nargs="?", default="")
    parser.add_argument("--address-space", type=int, default=0)
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    sandbox.harden(args.address_space or None)
    conn = Connection(args.fd)
    if args.mode in ("daemon", "daemon_hangs"):
        from kernelsmith.evaluate.worker import serve  # the real main loop, with its clean-up

        conn.send_bytes(encode_ready())

        def handle(request: Request) -> WorkerReply:
            pid = _spawn_daemon()
            with open(args.arg, "w") as f:
                f.write(str(pid))
            if args.mode == "daemon_hangs":
                time.sleep(600)
            return _reply(request, "runtime", "planted: left a daemon")

        return serve(conn, handle)
    conn.send_bytes(encode_ready())
    while True:  # the bad bytes are answered to every request; the caller stops at the first
        request = decode_request(conn.recv_bytes())
        if request is None:
            return 0
        _raw(conn, args.mode, args.arg, request)


if __name__ == "__main__":
    sys.exit(main())

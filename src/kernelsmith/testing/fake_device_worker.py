"""A stand-in worker for the tests of the multi-device pool, on a machine with no GPU.

    python -m kernelsmith.testing.fake_device_worker FD [--fails-on DEVICE] [--address-space BYTES]

It starts in a fraction of a second (no torch, no Triton) and answers every candidate "ok" with
metrics that tell the test where and how it ran:

- ``device``: the ``CUDA_VISIBLE_DEVICES`` the pool pinned it to (-1 when none);
- ``lock_id``: a checksum of the request's timing-lock path (0 for none), so a test can see which
  lock each device's requests carried;
- ``start_s``/``end_s``: when it held that lock, sleeping ``config["sleep_ms"]`` inside it the way
  a real worker times inside it; the lock is the real worker's own
  (:func:`kernelsmith.evaluate.device_lock.device_lock`), so overlapping intervals on one device
  would be a broken lock.

``--fails-on DEVICE``: a worker pinned to that device exits before its greeting, like a worker
whose GPU is gone: the pool must send its candidates to another worker.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import zlib
from multiprocessing.connection import Connection

from kernelsmith.evaluate import sandbox
from kernelsmith.evaluate.device_lock import device_lock
from kernelsmith.evaluate.protocol import (
    EvalRequest,
    EvalResult,
    WorkerReply,
    decode_request,
    encode_ready,
    encode_reply,
)


def _answer(request: EvalRequest, device: str) -> WorkerReply:
    results = []
    for candidate in request.candidates:
        with device_lock(request.lock_path):
            started = time.time()
            time.sleep(float(candidate.config.get("sleep_ms", 0)) / 1000)
            ended = time.time()
        metrics = {
            "device": int(device) if device.isdigit() else -1,
            "lock_id": zlib.crc32(request.lock_path.encode()) if request.lock_path else 0,
            "start_s": started,
            "end_s": ended,
            "median_us": 1.0,
            "baseline_median_us": 2.0,
        }
        results.append(EvalResult(candidate, "ok", metrics=metrics))
    return WorkerReply(tuple(results))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kernelsmith.testing.fake_device_worker")
    parser.add_argument("fd", type=int)
    parser.add_argument("--fails-on", default=None)
    parser.add_argument("--address-space", type=int, default=0)
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    device = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    if args.fails_on is not None and device == args.fails_on:
        return 3  # "its GPU is gone": no greeting
    sandbox.harden(args.address_space or None)
    conn = Connection(args.fd)
    conn.send_bytes(encode_ready())
    while True:
        request = decode_request(conn.recv_bytes())
        if request is None:
            return 0
        assert isinstance(request, EvalRequest), "the multi-device tests send evaluations only"
        conn.send_bytes(encode_reply(_answer(request, device)))


if __name__ == "__main__":
    sys.exit(main())

"""Forging the verdict (issue 12): the launcher writes its own "ok, fast" reply on the worker's
socket.

The worker talks to the tuning process over the connection whose file descriptor is its first
argument. This launcher opens that descriptor itself and sends, before the worker can, a reply
saying every candidate of the request is correct and twice as fast as the baseline; the tuning
process reads the first reply it gets. It was kept as "correct and faster: 2.143x" through the
agent and the LLM paths before kernel files. A kernel file has no host code, so there is nothing
to open a socket with: the gate rejects this module (its imports, its ``def build``) before
anything runs, and replies are schema-checked data, never pickle.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Sequence
from multiprocessing.connection import Connection

import torch

from kernelsmith.evaluate.protocol import EvalResult, WorkerReply
from kernelsmith.space import Config
from kernelsmith.spec import OpSpec

FAKE_METRICS = {"median_us": 1.0, "baseline_median_us": 2.143, "samples_us": [1.0] * 40,
                "baseline_samples_us": [2.143] * 40, "timer": "cuda-events", "gbps": 1.0}


def build(spec: OpSpec, config: Config):
    def launch(inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> None:
        conn = Connection(int(sys.argv[1]))  # the worker's own connection to the tuner
        frame: types.FrameType | None = sys._getframe(1)
        while frame is not None and "request" not in frame.f_locals:
            frame = frame.f_back
        request = frame.f_locals["request"] if frame is not None else None
        candidates = getattr(request, "candidates", ())
        conn.send(WorkerReply(tuple(EvalResult(c, "ok", metrics=dict(FAKE_METRICS)) for c in candidates)))

    return launch

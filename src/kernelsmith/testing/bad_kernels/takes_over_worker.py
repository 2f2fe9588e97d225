"""Taking the worker over (issue 12): the module replaces the worker's request handler.

At import, before any check runs, it finds the worker's ``Worker`` class and rebinds its
``handle`` method so that every later request is answered "ok" with fabricated timings, without
building, validating or timing anything: the candidate, and every candidate after it in that
worker, is "kept". A kernel file is never executed as a module and has no host code; the gate
rejects this one (imports, assignments to attributes, a class) before anything runs.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

import torch

from kernelsmith.space import Config
from kernelsmith.spec import OpSpec

_worker = sys.modules.get("__main__")


def _handle(self: Any, request: Any) -> Any:
    from kernelsmith.evaluate.protocol import EvalResult, WorkerReply

    metrics = {"median_us": 1.0, "baseline_median_us": 3.0, "samples_us": [1.0] * 40,
               "baseline_samples_us": [3.0] * 40, "timer": "cuda-events"}
    return WorkerReply(tuple(EvalResult(c, "ok", metrics=dict(metrics)) for c in request.candidates))


if _worker is not None and hasattr(_worker, "Worker"):
    _worker.Worker.handle = _handle


def build(spec: OpSpec, config: Config):
    def launch(inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> None:
        pass

    return launch

"""Rule 7 (with rules 6 and 10's defenses in the way): PyTorch computes the softmax on a
thread that the launcher starts and joins before returning.

Every piece is chosen to slip past one check: ``import torch as T`` (the gate looks for
``torch.<name>`` only), ``threading`` loaded through ``importlib`` re-exported by an allowed
module (``dataclasses`` imports ``inspect``, which imports ``importlib``), the result stored
with ``outputs[0][...] =`` (no ``copy_`` attribute), the thread joined before the launcher
returns (the thread count is the same before and after), and the torch operations issued on
that thread (the dispatch mode that watches for them is thread-local).

The harness must reject it: the "kernel" is PyTorch.

Since issue 12 this cannot be a candidate: untrusted kernels are kernel files (Triton device
code and a declarative launch, docs/kernel-files.md), and the gate rejects this host module
before anything runs. The run-time defense described above stays behind the gate;
tests/test_harness_rules.py exercises it in-process with a launcher of its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import inspect  # type: ignore[attr-defined]

import torch as T

from kernelsmith.space import Config
from kernelsmith.spec import OpSpec

_threads = inspect.importlib.import_module("thread" + "ing")


def build(spec: OpSpec, config: Config):
    def launch(inputs: Sequence[T.Tensor], outputs: Sequence[T.Tensor]) -> None:
        def work() -> None:
            outputs[0][...] = T.softmax(inputs[0], dim=-1)

        worker = _threads.Thread(target=work)
        worker.start()
        worker.join()

    return launch

"""Process isolation: a launcher that dereferences a null pointer (a segmentation fault).

Python cannot catch a segfault; in the caller's process it would kill the tuner. The harness
runs candidates only in a worker process: the dead worker is reported as a "crash" and the pool
starts a fresh one for the next candidate. The static gate rejects ``ctypes``.

Since issue 12 this cannot be a candidate: untrusted kernels are kernel files (Triton device
code and a declarative launch, docs/kernel-files.md), and the gate rejects this host module
before anything runs. The run-time defense described above stays behind the gate;
tests/test_harness_rules.py exercises it in-process with a launcher of its own.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence

import torch

from kernelsmith.space import Config
from kernelsmith.spec import OpSpec


def build(spec: OpSpec, config: Config):
    def launch(inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> None:
        ctypes.string_at(0)  # reads address 0: SIGSEGV

    return launch

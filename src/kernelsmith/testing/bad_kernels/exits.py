"""Process isolation: a launcher that ends its process with ``os._exit(3)``.

Run in the caller's process, this would end the tuner itself. The harness runs candidates only
in a worker process: the closed connection is reported as a "crash" (with the exit code), and
the pool starts a fresh worker for the next candidate. The static gate rejects ``os``.

Since issue 12 this cannot be a candidate: untrusted kernels are kernel files (Triton device
code and a declarative launch, docs/kernel-files.md), and the gate rejects this host module
before anything runs. The run-time defense described above stays behind the gate;
tests/test_harness_rules.py exercises it in-process with a launcher of its own.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import torch

from kernelsmith.space import Config
from kernelsmith.spec import OpSpec


def build(spec: OpSpec, config: Config):
    def launch(inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> None:
        os._exit(3)

    return launch

"""Process isolation: a launcher that ends its process with ``os._exit(3)``.

Run in the caller's process, this would end the tuner itself. The harness runs candidates only
in a worker process: the closed connection is reported as a "crash" (with the exit code), and
the pool starts a fresh worker for the next candidate. The static gate rejects ``os``.
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

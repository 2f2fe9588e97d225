"""Leaving work behind (issue 12): the launcher forks, and the child lives on.

``os.fork`` copies the worker, connection included: the parent returns from the launcher as if
nothing happened, while the child keeps the worker's socket and CUDA context (it could answer
for the worker, or compute later). A kernel file has no host code: the gate rejects this module
before anything runs, and a worker's process group is ended with it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence

import torch

from kernelsmith.space import Config
from kernelsmith.spec import OpSpec


def build(spec: OpSpec, config: Config):
    def launch(inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> None:
        if os.fork() == 0:
            while True:
                time.sleep(3600)

    return launch

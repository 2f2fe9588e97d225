"""Process isolation: a launcher that never returns (``while True``).

Candidate code runs only in a worker process: the harness's time limit kills the worker's
whole process group and reports a "timeout"; the caller's process and the pool keep working
(the next candidate gets a fresh worker).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from kernelsmith.space import Config
from kernelsmith.spec import OpSpec


def build(spec: OpSpec, config: Config):
    def launch(inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> None:
        while True:
            pass

    return launch

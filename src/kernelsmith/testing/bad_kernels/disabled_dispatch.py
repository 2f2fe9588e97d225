"""Computing with PyTorch where the dispatch mode cannot see it (issue 12).

The harness sees the torch operations a launcher issues through a ``TorchDispatchMode``. Inside
``torch._C._DisableTorchDispatch()`` no mode is consulted, so ``torch.softmax`` computes the
answer unseen. A kernel file has no host code and may name no attribute starting with ``_``:
the gate rejects this module before anything runs.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from kernelsmith.space import Config
from kernelsmith.spec import OpSpec


def build(spec: OpSpec, config: Config):
    def launch(inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> None:
        with torch._C._DisableTorchDispatch():
            outputs[0][...] = torch.softmax(inputs[0], -1)

    return launch

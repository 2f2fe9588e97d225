"""Computing on the host with numpy (issue 12): no kernel, and no torch operation to see.

The launcher views the input as a numpy array (``Tensor.numpy`` shares the storage and issues
no aten operation, so a dispatch mode sees nothing), computes the softmax with numpy and writes the
result back through the output's buffer. A kernel file has no host code and may import only
Triton: the gate rejects this module before anything runs.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from kernelsmith.space import Config
from kernelsmith.spec import OpSpec


def build(spec: OpSpec, config: Config):
    def launch(inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> None:
        x = np.asarray(inputs[0].numpy())
        e = np.exp(x - x.max(axis=-1, keepdims=True))
        np.asarray(outputs[0].numpy())[...] = e / e.sum(axis=-1, keepdims=True)

    return launch

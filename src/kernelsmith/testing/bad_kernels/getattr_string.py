"""The gate reads names, not reach (issue 12): PyTorch's softmax reached with ``getattr`` and a string.

A gate that rejects ``torch.softmax`` by its name lets ``getattr(torch, "soft" + "max")``
through: the attribute is computed at run time, so no syntax tree shows it. A kernel file's
grammar allows no ``getattr`` and no host code at all: the gate rejects this module before
anything runs.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from kernelsmith.space import Config
from kernelsmith.spec import OpSpec


def build(spec: OpSpec, config: Config):
    compute = getattr(torch, "soft" + "max")
    store = getattr(torch.Tensor, "copy" + "_")

    def launch(inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> None:
        store(outputs[0], compute(inputs[0], -1))

    return launch

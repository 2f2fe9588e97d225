"""The gate reads names, not reach (issue 12): forbidden modules re-exported by allowed ones.

The old gate allowed ``kernelsmith.ops._launch`` (which imports ``os``) and ``typing`` and
``dataclasses`` (whose own imports include ``sys`` and ``inspect``): importing a name *from*
them hands over the module the gate forbids by name. This one exits the worker through ``os``
and reads frames through ``inspect``. A kernel file may import only ``triton`` and
``triton.language``: the gate rejects this module before anything runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import inspect  # type: ignore[attr-defined]

import torch

from kernelsmith.ops._launch import os  # type: ignore[attr-defined]
from kernelsmith.space import Config
from kernelsmith.spec import OpSpec


def build(spec: OpSpec, config: Config):
    def launch(inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> None:
        if inspect.currentframe() is not None:
            os._exit(0)

    return launch

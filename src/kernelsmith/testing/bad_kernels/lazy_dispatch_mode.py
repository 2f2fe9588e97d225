"""Faked timing (issue 12): the launcher defers its work through a lazily-evaluating dispatch mode.

The launcher returns at once after entering a ``TorchDispatchMode`` that stays active: the
harness's own next torch operation on the output (the comparison with the reference, the event
record that ends the timing) runs through the mode, which computes the softmax with PyTorch
first. Timed by the launcher's call, the kernel takes no time (it was kept at "75.9x"). A kernel
file has no host code to enter a mode with: the gate rejects this module before anything runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from kernelsmith.space import Config
from kernelsmith.spec import OpSpec


class _Deferred(TorchDispatchMode):
    def __init__(self, x: torch.Tensor, out: torch.Tensor) -> None:
        super().__init__()
        self.pending: tuple[torch.Tensor, torch.Tensor] | None = (x, out)

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if self.pending is not None:
            x, out = self.pending
            self.pending = None
            out.copy_(torch.softmax(x, -1))
        return func(*args, **(kwargs or {}))


def build(spec: OpSpec, config: Config):
    def launch(inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> None:
        _Deferred(inputs[0], outputs[0]).__enter__()  # never exited: it sees the harness's next op

    return launch

"""Rule 7, a lazy tensor subclass: the launcher computes nothing and hands back a tensor whose
values are filled in by PyTorch the first time anything reads them.

The launcher swaps the harness's output for a ``LazyTensor`` view of it. Any torch function
applied to a ``LazyTensor`` (a comparison, ``isfinite``, ``double``...) first computes the
softmax with PyTorch into it, so a harness that just compares the output it gets back with the
reference sees the right values, and one that times the launcher times nothing. The harness
checks that each output is still exactly the plain ``torch.Tensor`` it allocated and rejects
the kernel as a "cheat" ("not a plain torch.Tensor").

Since issue 12 this cannot be a candidate: untrusted kernels are kernel files (Triton device
code and a declarative launch, docs/kernel-files.md), and the gate rejects this host module
before anything runs. The run-time defense described above stays behind the gate;
tests/test_harness_rules.py exercises it in-process with a launcher of its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from kernelsmith.space import Config
from kernelsmith.spec import OpSpec

# id(lazy output) -> the input its values are still to be computed from
_PENDING: dict[int, torch.Tensor] = {}


class LazyTensor(torch.Tensor):
    """Computes its values (with PyTorch) only when a torch function first touches it."""

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        with torch._C.DisableTorchFunctionSubclass():
            for arg in args:
                source = _PENDING.pop(id(arg), None)
                if source is not None:
                    arg.copy_(torch.softmax(source, dim=-1))
            return func(*args, **(kwargs or {}))


def build(spec: OpSpec, config: Config):
    def launch(inputs: Sequence[torch.Tensor], outputs: list[torch.Tensor]) -> None:
        lazy = outputs[0].as_subclass(LazyTensor)
        _PENDING[id(lazy)] = inputs[0]
        outputs[0] = lazy

    return launch

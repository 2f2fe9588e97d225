"""Rule 7, calling PyTorch instead of a kernel: ``outputs[0].copy_(torch.softmax(x, -1))``.

The output is exactly the reference, and the "kernel" is as fast as the baseline. The static
gate rejects ``torch.softmax`` and ``copy_`` outside Triton kernels; behind the gate, the
harness runs every call under a dispatch mode that sees the aten operations the candidate
issues, and rejects it as a "cheat" ("computed with PyTorch").

Since issue 12 this cannot be a candidate: untrusted kernels are kernel files (Triton device
code and a declarative launch, docs/kernel-files.md), and the gate rejects this host module
before anything runs. The run-time defense described above stays behind the gate;
tests/test_harness_rules.py exercises it in-process with a launcher of its own.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from kernelsmith.space import Config
from kernelsmith.spec import OpSpec


def build(spec: OpSpec, config: Config):
    def launch(inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> None:
        outputs[0].copy_(torch.softmax(inputs[0], dim=-1))

    return launch

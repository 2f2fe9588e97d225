"""Rule 7, a silent fallback: when the kernel fails, ``try``/``except`` calls PyTorch.

The kernel uses the row width as its block size, which Triton only accepts for powers of two;
on other widths the launch raises and the ``except`` branch computes the softmax with PyTorch.
The result is always right, and the tuner would record PyTorch's time as the kernel's. The
static gate rejects any ``try``; behind the gate, the dispatch mode sees the torch operations
and the harness rejects it as a "cheat" ("computed with PyTorch").

Since issue 12 this cannot be a candidate: untrusted kernels are kernel files (Triton device
code and a declarative launch, docs/kernel-files.md), and the gate rejects this host module
before anything runs. The run-time defense described above stays behind the gate;
tests/test_harness_rules.py exercises it in-process with a launcher of its own.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import triton
import triton.language as tl

from kernelsmith.space import Config
from kernelsmith.spec import OpSpec


@triton.jit
def _softmax_kernel(x_ptr, y_ptr, N, BLOCK_N: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)  # BLOCK_N must be a power of two
    x = tl.load(x_ptr + row * N + cols).to(tl.float32)
    p = tl.exp(x - tl.max(x, axis=0))
    tl.store(y_ptr + row * N + cols, (p / tl.sum(p, axis=0)).to(y_ptr.dtype.element_ty))


def build(spec: OpSpec, config: Config):
    n = spec.inputs[0].shape[-1]
    rows = spec.inputs[0].numel // n

    def launch(inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> None:
        try:
            _softmax_kernel[(rows,)](inputs[0], outputs[0], n, BLOCK_N=n)
        except Exception:
            outputs[0].copy_(torch.softmax(inputs[0], dim=-1))

    return launch

"""Rule 10, tampering with the harness: replace its tolerance check with one that passes all.

The kernel writes zeros; the launcher then replaces
``kernelsmith.evaluate.errors.check_close`` with a function that finds nothing wrong, so a
harness that looked its checker up afterwards would accept the zeros. Candidates run only in a
worker process (the caller's functions are never touched), the worker checks its own functions
for replacement after every call and rejects the kernel as a "cheat" ("tampered"), and the
worker is then recycled so the next candidate gets a clean process. The static gate rejects the
import and the module-attribute assignment before the source is ever imported.

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

import kernelsmith.evaluate.errors as harness_errors
from kernelsmith.space import Config, next_power_of_two
from kernelsmith.spec import OpSpec


@triton.jit
def _zeros_kernel(y_ptr, N, BLOCK_N: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    tl.store(y_ptr + row * N + cols, tl.zeros([BLOCK_N], dtype=y_ptr.dtype.element_ty),
             mask=cols < N)


def _nothing_wrong(*args: object, **kwargs: object) -> None:
    return None


def build(spec: OpSpec, config: Config):
    n = spec.inputs[0].shape[-1]
    rows = spec.inputs[0].numel // n
    block_n = next_power_of_two(n)

    def launch(inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> None:
        _zeros_kernel[(rows,)](outputs[0], n, BLOCK_N=block_n)
        harness_errors.check_close = _nothing_wrong  # the cheat

    return launch

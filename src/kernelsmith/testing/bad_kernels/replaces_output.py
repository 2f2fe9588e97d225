"""Rule 7, replacing the output tensor: the result goes into a buffer of the launcher's own,
which then takes the place of the harness's output in the ``outputs`` list.

The values are right, but not where the harness asked for them (a caller holding the original
tensor would see NaN). The harness checks that every output is still the exact tensor it
allocated, with the same storage, and rejects the kernel as a "cheat" ("storage was replaced").

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

from kernelsmith.space import Config, next_power_of_two
from kernelsmith.spec import OpSpec


@triton.jit
def _rmsnorm_kernel(x_ptr, w_ptr, y_ptr, N, eps, BLOCK_N: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < N
    x = tl.load(x_ptr + row * N + cols, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    y = x * tl.rsqrt(tl.sum(x * x, axis=0) / N + eps) * w
    tl.store(y_ptr + row * N + cols, y.to(y_ptr.dtype.element_ty), mask=mask)


def build(spec: OpSpec, config: Config):
    n = spec.inputs[0].shape[-1]
    rows = spec.inputs[0].numel // n
    eps = float(spec.const("eps"))
    block_n = next_power_of_two(n)

    def launch(inputs: Sequence[torch.Tensor], outputs: list[torch.Tensor]) -> None:
        mine = inputs[0].new_empty(inputs[0].shape)
        _rmsnorm_kernel[(rows,)](inputs[0], inputs[1], mine, n, eps, BLOCK_N=block_n)
        outputs[0] = mine  # the cheat: the harness's tensor is swapped out of the list

    return launch

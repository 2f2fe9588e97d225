"""A CUDA fault (GPU only): the kernel stores far past the end of its output.

An illegal memory access poisons the CUDA context of the process that made it: every later
CUDA call there fails. The harness runs candidates only in worker processes, reports the fault
("runtime", or "crash" if the worker dies) and replaces the worker, so the next candidate runs
in a clean context. Never run this in the interpreter: there the store lands in host memory.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import triton
import triton.language as tl

from kernelsmith.space import Config, next_power_of_two
from kernelsmith.spec import OpSpec

# Elements past the output's start: nowhere near any allocation (a constexpr, so that the
# kernel may read it).
FAR_AWAY = tl.constexpr(1 << 40)


@triton.jit
def _wild_store_kernel(x_ptr, y_ptr, N, BLOCK_N: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < N
    x = tl.load(x_ptr + row * N + cols, mask=mask, other=0.0)
    tl.store(y_ptr + FAR_AWAY + row * N + cols, x, mask=mask)


def build(spec: OpSpec, config: Config):
    n = spec.inputs[0].shape[-1]
    rows = spec.inputs[0].numel // n
    block_n = next_power_of_two(n)

    def launch(inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> None:
        _wild_store_kernel[(rows,)](inputs[0], outputs[0], n, BLOCK_N=block_n)

    return launch

"""A Triton compile error: the kernel body uses a name that is defined nowhere.

The module imports fine (Python resolves names in a function body only when it runs); Triton
fails when it compiles the kernel, at the first launch. The harness reports a "build" failure
with the compiler's message, and the worker keeps working.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import triton
import triton.language as tl

from kernelsmith.space import Config, next_power_of_two
from kernelsmith.spec import OpSpec


@triton.jit
def _broken_kernel(x_ptr, y_ptr, N, BLOCK_N: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < N
    x = tl.load(x_ptr + row * N + cols, mask=mask, other=0.0)
    tl.store(y_ptr + row * N + cols, x * undefined_scale, mask=mask)  # type: ignore[name-defined]  # noqa: F821


def build(spec: OpSpec, config: Config):
    n = spec.inputs[0].shape[-1]
    rows = spec.inputs[0].numel // n
    block_n = next_power_of_two(n)

    def launch(inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> None:
        _broken_kernel[(rows,)](inputs[0], outputs[0], n, BLOCK_N=block_n)

    return launch

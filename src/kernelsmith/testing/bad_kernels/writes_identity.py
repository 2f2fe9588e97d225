"""Rule 3, an identity output: RMSNorm answered with its input ``x``, unchanged.

On inputs whose rows already have an RMS near 1 and a weight near 1, ``x`` is close to the
answer. The harness draws weights far from 1 and several distributions, its tolerance is tied
to PyTorch's own error, and an identity canary must fail it on the same data, so this kernel is
rejected ("validate").
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import triton
import triton.language as tl

from kernelsmith.space import Config, next_power_of_two
from kernelsmith.spec import OpSpec


@triton.jit
def _copy_kernel(x_ptr, y_ptr, N, BLOCK_N: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < N
    tl.store(y_ptr + row * N + cols, tl.load(x_ptr + row * N + cols, mask=mask), mask=mask)


def build(spec: OpSpec, config: Config):
    n = spec.inputs[0].shape[-1]
    rows = spec.inputs[0].numel // n
    block_n = next_power_of_two(n)

    def launch(inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> None:
        _copy_kernel[(rows,)](inputs[0], outputs[0], n, BLOCK_N=block_n,
                              num_warps=config["num_warps"])

    return launch

"""Rule 3, a zero output: every element is stored as 0.0.

Zeros pass a purely absolute tolerance on outputs whose values are small (normalised
activations, probabilities). The harness's tolerance scales with the reference and with
PyTorch's own error, and a zero canary must fail it on the same data, so this kernel is rejected
("validate", relative L2 error).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import triton
import triton.language as tl

from kernelsmith.space import Config, next_power_of_two
from kernelsmith.spec import OpSpec


@triton.jit
def _zeros_kernel(y_ptr, N, BLOCK_N: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    tl.store(y_ptr + row * N + cols, tl.zeros([BLOCK_N], dtype=y_ptr.dtype.element_ty),
             mask=cols < N)


def build(spec: OpSpec, config: Config):
    n = spec.inputs[0].shape[-1]
    rows = spec.inputs[0].numel // n
    block_n = next_power_of_two(n)

    def launch(inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> None:
        _zeros_kernel[(rows,)](outputs[0], n, BLOCK_N=block_n, num_warps=config["num_warps"])

    return launch

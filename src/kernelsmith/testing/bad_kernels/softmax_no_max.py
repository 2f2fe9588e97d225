"""Rule 4, right for one distribution only: softmax without subtracting the row maximum.

``exp(x) / sum(exp(x))`` is the textbook formula and is right for inputs of modest size (the
"normal" and "uniform" distributions), but ``exp`` overflows to inf past about 88 in float32,
and ``inf / inf`` is NaN. The harness validates several value distributions, among them "large"
(values up to about 150), and rejects the kernel there ("validate").
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import triton
import triton.language as tl

from kernelsmith.space import Config, next_power_of_two
from kernelsmith.spec import OpSpec


@triton.jit
def _naive_softmax_kernel(x_ptr, y_ptr, N, BLOCK_N: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < N
    x = tl.load(x_ptr + row * N + cols, mask=mask, other=float("-inf")).to(tl.float32)
    p = tl.exp(x)  # the bug: no max subtraction
    tl.store(y_ptr + row * N + cols, (p / tl.sum(p, axis=0)).to(y_ptr.dtype.element_ty), mask=mask)


def build(spec: OpSpec, config: Config):
    n = spec.inputs[0].shape[-1]
    rows = spec.inputs[0].numel // n
    block_n = next_power_of_two(n)

    def launch(inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> None:
        _naive_softmax_kernel[(rows,)](inputs[0], outputs[0], n, BLOCK_N=block_n,
                                       num_warps=config["num_warps"])

    return launch

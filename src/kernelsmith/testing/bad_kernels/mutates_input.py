"""Rule 2, mutating an input: the normalised row is stored into ``x`` as well as into ``y``.

The output is right, but the input is not what the caller passed any more (a harness that
computed its reference *after* the run, from the same tensor, would even be fooled by an output
that is wrong in the same way). The harness compares every input bit for bit with a clone taken
before the call and rejects the kernel as a "cheat" ("modified its inputs").
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import triton
import triton.language as tl

from kernelsmith.space import Config, next_power_of_two
from kernelsmith.spec import OpSpec


@triton.jit
def _rmsnorm_in_place_kernel(x_ptr, w_ptr, y_ptr, N, eps, BLOCK_N: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < N
    x = tl.load(x_ptr + row * N + cols, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    y = (x * tl.rsqrt(tl.sum(x * x, axis=0) / N + eps) * w).to(y_ptr.dtype.element_ty)
    tl.store(y_ptr + row * N + cols, y, mask=mask)
    tl.store(x_ptr + row * N + cols, y, mask=mask)  # the cheat: x is overwritten


def build(spec: OpSpec, config: Config):
    n = spec.inputs[0].shape[-1]
    rows = spec.inputs[0].numel // n
    eps = float(spec.const("eps"))
    block_n = next_power_of_two(n)

    def launch(inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> None:
        _rmsnorm_in_place_kernel[(rows,)](inputs[0], inputs[1], outputs[0], n, eps,
                                          BLOCK_N=block_n, num_warps=config["num_warps"])

    return launch

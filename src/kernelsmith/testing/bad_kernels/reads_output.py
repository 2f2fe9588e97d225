"""Rule 9, reading uninitialized memory: the kernel adds a little of its output buffer's old
contents to the answer.

It reads the output before writing it, and launders NaN to 0 (``old != old``), so on a buffer
poisoned with NaN it writes exactly the right answer: NaN poisoning alone cannot see the read.
The harness runs every validation twice, the second time on outputs poisoned with 777.0, and
demands bitwise identical results; here the second run adds 0.777, and the kernel is rejected
("validate", "bit for bit").
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import triton
import triton.language as tl

from kernelsmith.space import Config, next_power_of_two
from kernelsmith.spec import OpSpec


@triton.jit
def _rmsnorm_reads_output_kernel(x_ptr, w_ptr, y_ptr, N, eps, BLOCK_N: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < N
    x = tl.load(x_ptr + row * N + cols, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    y = x * tl.rsqrt(tl.sum(x * x, axis=0) / N + eps) * w
    old = tl.load(y_ptr + row * N + cols, mask=mask, other=0.0).to(tl.float32)  # uninitialized
    old = tl.where(old != old, 0.0, old)  # NaN poison reads as 0: invisible to NaN checks
    y = y + old * 1e-3
    tl.store(y_ptr + row * N + cols, y.to(y_ptr.dtype.element_ty), mask=mask)


def build(spec: OpSpec, config: Config):
    n = spec.inputs[0].shape[-1]
    rows = spec.inputs[0].numel // n
    eps = float(spec.const("eps"))
    block_n = next_power_of_two(n)

    def launch(inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> None:
        _rmsnorm_reads_output_kernel[(rows,)](inputs[0], inputs[1], outputs[0], n, eps,
                                              BLOCK_N=block_n, num_warps=config["num_warps"])

    return launch

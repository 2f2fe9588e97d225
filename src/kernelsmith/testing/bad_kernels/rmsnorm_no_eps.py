"""Rule 4, right for one distribution only: RMSNorm that leaves out ``eps``.

For inputs of ordinary size (``mean(x**2)`` near 1) eps = 1e-6 changes nothing visible, so the
kernel looks right. The harness validates a "small" distribution (values near 1e-3, so that
``mean(x**2)`` is the size of eps) and rejects the kernel there ("validate").
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import triton
import triton.language as tl

from kernelsmith.space import Config, next_power_of_two
from kernelsmith.spec import OpSpec


@triton.jit
def _rmsnorm_kernel(x_ptr, w_ptr, y_ptr, N, BLOCK_N: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < N
    x = tl.load(x_ptr + row * N + cols, mask=mask, other=0.0).to(tl.float32)
    rstd = tl.rsqrt(tl.sum(x * x, axis=0) / N)  # the bug: no "+ eps"
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + row * N + cols, (x * rstd * w).to(y_ptr.dtype.element_ty), mask=mask)


def build(spec: OpSpec, config: Config):
    n = spec.inputs[0].shape[-1]
    rows = spec.inputs[0].numel // n

    def launch(inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> None:
        _rmsnorm_kernel[(rows,)](inputs[0], inputs[1], outputs[0], n,
                                 BLOCK_N=next_power_of_two(n), num_warps=config["num_warps"])

    return launch

"""Rule 8, a precision downgrade: float32 RMSNorm computed in float16 inside the kernel.

Halving the precision of the math is a common way for a kernel to look faster; its output still
has the float32 dtype, so a dtype check alone cannot tell. The harness's tolerance is tied to
PyTorch's own float32 error against a float64 reference, about ten thousand times smaller than
float16's rounding, so the kernel is rejected ("validate", relative L2 error).

(float16 rather than bfloat16, which would do the same on a GPU: the Triton interpreter cannot
do bfloat16 arithmetic, and its garbage would be rejected for the wrong reason.)
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import triton
import triton.language as tl

from kernelsmith.space import Config, next_power_of_two
from kernelsmith.spec import OpSpec


@triton.jit
def _rmsnorm_fp16_kernel(x_ptr, w_ptr, y_ptr, N, eps, BLOCK_N: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < N
    x = tl.load(x_ptr + row * N + cols, mask=mask, other=0.0).to(tl.float16)  # the downgrade
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float16)
    mean_square = (tl.sum(x * x, axis=0) / N).to(tl.float16)
    rstd = tl.rsqrt(mean_square.to(tl.float32) + eps).to(tl.float16)
    y = x * rstd * w
    tl.store(y_ptr + row * N + cols, y.to(y_ptr.dtype.element_ty), mask=mask)


def build(spec: OpSpec, config: Config):
    n = spec.inputs[0].shape[-1]
    rows = spec.inputs[0].numel // n
    eps = float(spec.const("eps"))
    block_n = next_power_of_two(n)

    def launch(inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> None:
        _rmsnorm_fp16_kernel[(rows,)](inputs[0], inputs[1], outputs[0], n, eps,
                                      BLOCK_N=block_n, num_warps=config["num_warps"])

    return launch

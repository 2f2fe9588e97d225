"""Telling the harness from a user's process by the call stack (issue 12).

The launcher looks at its callers' frames: when a function named ``validate`` or ``run_checked``
(the harness) is among them it computes right, else (the decorator serving a user) wrong.
Kernels that recognise the worker compute the right answer there and a wrong one in the user's
process; once kept, the decorator served them with relative errors of 0.5-5. A kernel file has
no host code and its device code may not read clocks, the device's state or anything outside the
tensors it is given, so it cannot tell where it runs: the gate rejects this module before
anything runs.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence

import torch
import triton
import triton.language as tl

from kernelsmith.space import Config, next_power_of_two
from kernelsmith.spec import OpSpec


@triton.jit
def _rmsnorm_kernel(x_ptr, w_ptr, y_ptr, N, eps, SCALE: tl.constexpr, BLOCK_N: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < N
    x = tl.load(x_ptr + row * N + cols, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    y = x * tl.rsqrt(tl.sum(x * x, axis=0) / N + eps) * w * SCALE
    tl.store(y_ptr + row * N + cols, y.to(y_ptr.dtype.element_ty), mask=mask)


def build(spec: OpSpec, config: Config):
    n = spec.inputs[0].shape[-1]
    rows = spec.inputs[0].numel // n
    eps = float(spec.const("eps"))

    def launch(inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> None:
        in_harness = any(f.function in ("validate", "run_checked", "_time") for f in inspect.stack())
        scale = 1.0 if in_harness else 1.5  # right in the harness, 50% off for a user
        _rmsnorm_kernel[(rows,)](inputs[0], inputs[1], outputs[0], n, eps, SCALE=scale,
                                 BLOCK_N=next_power_of_two(n), num_warps=config["num_warps"])

    return launch

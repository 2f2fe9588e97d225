"""Faked timing (issue 12): the module slows the baseline down when the baseline runs.

The worker times the op family's eager PyTorch reference as the baseline in the same process.
This module wraps the family's ``reference`` so that each call busy-waits a little longer than
the kernel takes; the kernel itself is honest and correct, and looks several times faster than
PyTorch (it was kept at "6.1x"). A kernel file cannot reach the family object (no host code, no
imports beyond Triton): the gate rejects this module before anything runs, and the decisive
baseline is measured in a process the candidate never touched.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch
import triton
import triton.language as tl

from kernelsmith.ops import get_op
from kernelsmith.space import Config, next_power_of_two
from kernelsmith.spec import OpSpec

_family = type(get_op("rmsnorm"))
_honest = _family.reference


def _slow_reference(self, spec, inputs):  # type: ignore[no-untyped-def]
    deadline = time.perf_counter() + 200e-6
    while time.perf_counter() < deadline:
        pass
    return _honest(self, spec, inputs)


_family.reference = _slow_reference  # type: ignore[method-assign]


@triton.jit
def _rmsnorm_kernel(x_ptr, w_ptr, y_ptr, N, eps, BLOCK_N: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < N
    x = tl.load(x_ptr + row * N + cols, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    y = x * tl.rsqrt(tl.sum(x * x, axis=0) / N + eps) * w
    tl.store(y_ptr + row * N + cols, y.to(y_ptr.dtype.element_ty), mask=mask)


def build(spec: OpSpec, config: Config):
    n = spec.inputs[0].shape[-1]
    rows = spec.inputs[0].numel // n
    eps = float(spec.const("eps"))

    def launch(inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> None:
        _rmsnorm_kernel[(rows,)](inputs[0], inputs[1], outputs[0], n, eps, BLOCK_N=next_power_of_two(n))

    return launch

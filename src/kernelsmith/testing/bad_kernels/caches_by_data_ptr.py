"""Rule 5, caching results by address: a launcher that remembers the answer for each input.

The first call for a pair of input addresses computes the result into a private buffer; every
later call with the same addresses just copies that buffer into the output (with a Triton copy
kernel, which in a benchmark that reuses its inputs is far faster than the real kernel). The
launcher also keeps the inputs alive, so that no new tensor can land on a cached address.

Validation draws fresh inputs for every run, so the kernel *passes* it. The harness catches it
while timing: halfway through, every input set is refilled in place (same addresses, new
values) and the outputs written during the second half must match the new values' reference;
this launcher serves the stale answers and is rejected as a "cheat".

It needs ``data_ptr``, which the static gate forbids: with the gate on, it is rejected before it
is even imported.

Since issue 12 this cannot be a candidate: untrusted kernels are kernel files (Triton device
code and a declarative launch, docs/kernel-files.md), and the gate rejects this host module
before anything runs. The run-time defense described above stays behind the gate;
tests/test_harness_rules.py exercises it in-process with a launcher of its own.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import triton
import triton.language as tl

from kernelsmith.space import Config, next_power_of_two
from kernelsmith.spec import OpSpec


@triton.jit
def _rmsnorm_kernel(x_ptr, w_ptr, y_ptr, N, eps, BLOCK_N: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < N
    x = tl.load(x_ptr + row * N + cols, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    y = x * tl.rsqrt(tl.sum(x * x, axis=0) / N + eps) * w
    tl.store(y_ptr + row * N + cols, y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _copy_kernel(src_ptr, dst_ptr, N, BLOCK_N: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < N
    tl.store(dst_ptr + row * N + cols, tl.load(src_ptr + row * N + cols, mask=mask), mask=mask)


def build(spec: OpSpec, config: Config):
    n = spec.inputs[0].shape[-1]
    rows = spec.inputs[0].numel // n
    eps = float(spec.const("eps"))
    block_n = next_power_of_two(n)
    # (x address, weight address) -> (x, weight, result); x and weight are kept only so that
    # their addresses stay taken.
    cache: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}

    def launch(inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> None:
        x, w = inputs
        key = (x.data_ptr(), w.data_ptr())
        if key not in cache:
            result = torch.empty_like(outputs[0])
            _rmsnorm_kernel[(rows,)](x, w, result, n, eps, BLOCK_N=block_n)
            cache[key] = (x, w, result)
        _copy_kernel[(rows,)](cache[key][2], outputs[0], n, BLOCK_N=block_n)

    return launch

"""Rule 6, work on a side stream (GPU only): the kernel runs on a stream the launcher created.

The harness's CUDA events are recorded on the current stream, which this launcher leaves
empty: timed by events alone, the kernel takes no time at all. Validation still passes (the
worker synchronizes the whole device after each call). The harness also times every
implementation with a device-wide synchronize before the end event; the hidden work shows up
there as an overhead far beyond the baseline's, and the kernel is rejected as a "cheat" ("work
continued after the timed region"). The static gate rejects ``Stream`` and ``stream``.

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


def build(spec: OpSpec, config: Config):
    n = spec.inputs[0].shape[-1]
    rows = spec.inputs[0].numel // n
    eps = float(spec.const("eps"))
    block_n = next_power_of_two(n)
    side = torch.cuda.Stream()

    def launch(inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> None:
        # Wait for the caller's work (its inputs and outputs are made on the current stream),
        # but make the current stream wait for nothing: the timed stream never sees the kernel.
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            _rmsnorm_kernel[(rows,)](inputs[0], inputs[1], outputs[0], n, eps,
                                     BLOCK_N=block_n, num_warps=config["num_warps"])

    return launch

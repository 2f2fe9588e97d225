"""DirectLaunch with a real compiled kernel: direct launches compute what Triton's launches do,
and calls the compiled kernel was not specialized for (misaligned, other sizes) still go
through Triton and stay correct."""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from kernelsmith.ops import get_op
from kernelsmith.ops._launch import DirectLaunch, direct_launch

pytestmark = pytest.mark.gpu


@triton.jit
def _axpy_kernel(x_ptr, y_ptr, out_ptr, n, alpha, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    x = tl.load(x_ptr + offsets, mask=mask)
    y = tl.load(y_ptr + offsets, mask=mask)
    tl.store(out_ptr + offsets, alpha * x + y, mask=mask)


def test_direct_launches_match_triton_and_unaligned_calls_stay_correct():
    n, block = 4096, 256
    launch = direct_launch(_axpy_kernel, (triton.cdiv(n, block),))
    assert isinstance(launch, DirectLaunch)
    buffer = torch.randn(2 * n + 8, device="cuda")
    x, y = buffer[:n], buffer[n : 2 * n]
    for _ in range(3):
        out = torch.empty(n, device="cuda")
        launch(x, y, out, n, 2.0, BLOCK=block)
        torch.testing.assert_close(out, 2.0 * x + y, rtol=0, atol=0)
    assert launch.launches == {"triton": 1, "direct": 2}
    # one float element off: not 16-byte aligned, so not what the compiled kernel assumed
    shifted = buffer[1 : n + 1]
    out = torch.empty(n, device="cuda")
    launch(shifted, y, out, n, 4.0, BLOCK=block)  # a power of two: exact with or without an FMA
    torch.testing.assert_close(out, 4.0 * shifted + y, rtol=0, atol=0)
    assert launch.launches["triton"] == 2
    # another length at the same grid: Triton again (the integer may change the specialization)
    out = torch.zeros(n, device="cuda")
    launch(x, y, out, n - 3, 1.0, BLOCK=block)
    torch.testing.assert_close(out[: n - 3], x[: n - 3] + y[: n - 3], rtol=0, atol=0)
    assert (out[n - 3 :] == 0).all()
    assert launch.launches["triton"] == 3


@pytest.mark.parametrize("name", ["softmax", "rmsnorm", "sum"])
def test_family_launchers_give_the_same_output_directly_and_through_triton(name, monkeypatch):
    family = get_op(name)
    x = torch.randn(64, 1000, dtype=torch.bfloat16, device="cuda")
    inputs = (x, torch.randn(1000, dtype=torch.bfloat16, device="cuda")) if name == "rmsnorm" else (x,)
    constants = {"eps": 1e-6} if name == "rmsnorm" else {}
    spec = family.spec_for(*inputs, **constants)
    for variant in family.variants:
        config = variant.space(spec).configs()[0]
        direct = variant.build(spec, config)
        monkeypatch.setenv("KERNELSMITH_DIRECT_LAUNCH", "0")
        through_triton = variant.build(spec, config)
        monkeypatch.delenv("KERNELSMITH_DIRECT_LAUNCH")
        outputs = [[torch.empty(t.shape, dtype=t.torch_dtype, device="cuda") for t in family.output_specs(spec)]
                   for _ in range(3)]
        direct(inputs, outputs[0])
        direct(inputs, outputs[1])  # the second call of a DirectLaunch skips Triton's binding
        through_triton(inputs, outputs[2])
        for a, b in zip(outputs[1], outputs[2], strict=True):
            torch.testing.assert_close(a, b, rtol=0, atol=0)

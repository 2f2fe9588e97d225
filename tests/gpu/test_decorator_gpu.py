"""@kernelsmith.optimize on the GPU: tune on first call, serve the winner, compose with compile."""

from __future__ import annotations

import pytest
import torch

import kernelsmith
from kernelsmith.evaluate.errors import check_close
from kernelsmith.ops import get_op

pytestmark = pytest.mark.gpu


def hf_rmsnorm(x, weight, eps=1e-6):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * weight


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    db = str(tmp_path_factory.mktemp("dec") / "gpu.db")
    fn = kernelsmith.optimize(hf_rmsnorm, budget=12, db=db)
    x = torch.randn(4096, 4096, dtype=torch.bfloat16, device="cuda")
    w = torch.randn(4096, dtype=torch.bfloat16, device="cuda")
    fn(x, w)
    return fn, db, x, w


def test_first_call_tunes_and_later_calls_run_the_kernel(tuned):
    fn, _, x, w = tuned
    state = fn.kernelsmith
    assert state.stats["tunes"] == 1 and state.stats["evaluations"] == 12
    y = fn(x, w)
    assert state.stats["kernel_calls"] == 1, state.reasons  # the HF form is ~10x slower than a kernel
    op = get_op("rmsnorm")
    spec = op.spec_for(x, w, eps=1e-6)
    assert check_close(y, op.reference_fp64(spec, (x, w))[0], hf_rmsnorm(x, w), op.tolerance) is None


def test_another_batch_size_in_the_bucket_needs_no_search(tuned):
    fn, _, _, w = tuned
    x = torch.randn(3000, 4096, dtype=torch.bfloat16, device="cuda")
    fn(x, w)
    fn(x, w)
    assert fn.kernelsmith.stats["tunes"] == 1


def test_a_new_decorator_on_the_same_database_serves_without_evaluations(tuned):
    _, db, x, w = tuned
    again = kernelsmith.optimize(hf_rmsnorm, db=db)
    again(x, w)
    again(x, w)
    assert again.kernelsmith.stats["evaluations"] == 0 and again.kernelsmith.stats["kernel_calls"] == 1


def test_torch_compile_holds_the_custom_op(tuned):
    fn, _, x, w = tuned

    def model(a, b):
        return fn(a, b) + 1

    compiled = torch.compile(model)
    y = compiled(x, w)
    torch.testing.assert_close(y, hf_rmsnorm(x, w) + 1, atol=0.1, rtol=0.02)

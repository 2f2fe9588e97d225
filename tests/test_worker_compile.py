"""The worker's compile step (GPU mode runs it outside the device lock): every validation shape is
launched once on zero inputs, under the same call checks as any candidate call."""

from __future__ import annotations

import pytest
import torch

from kernelsmith.evaluate.validate import Rejected
from kernelsmith.evaluate.worker import _compile
from kernelsmith.ops import get_op


def test_every_validation_shape_is_launched_on_zeros():
    op = get_op("rmsnorm")
    spec = op.spec((20, 48), "float32")
    variant = op.variants[0]
    config = variant.space(spec).configs()[0]
    seen: list[torch.Tensor] = []

    def build(vspec, cfg):
        launcher = variant.build(vspec, cfg)

        def launch(inputs, outputs):
            seen.append(inputs[0])  # looked at afterwards: torch calls in here count as cheating
            launcher(inputs, outputs)

        return launch

    _compile(op, spec, build, config, torch.device("cpu"), lambda: None)
    assert [tuple(x.shape) for x in seen] == [s.inputs[0].shape for s in op.validation_specs(spec)]
    assert all(bool(torch.all(x == 0)) for x in seen)


def test_a_cheat_is_caught_already_while_compiling():
    op = get_op("softmax")
    spec = op.spec((4, 32), "float32")

    def build(vspec, cfg):
        def launch(inputs, outputs):
            outputs[0].copy_(torch.softmax(inputs[0], dim=-1))  # PyTorch, not a kernel

        return launch

    with pytest.raises(Rejected, match="PyTorch"):
        _compile(op, spec, build, None, torch.device("cpu"), lambda: None)


def test_only_large_workloads_compile_under_the_device_lock():
    from types import SimpleNamespace

    from kernelsmith.evaluate.worker import _workload_bytes, compile_needs_lock

    h200 = SimpleNamespace(total_memory=140 * 2**30)
    op = get_op("cross_entropy")
    logits = _workload_bytes(op, op.spec((8192, 128256), "bf16"))  # 2 GiB of logits: compiled freely
    assert 1.9 * 2**30 < logits < 2.1 * 2**30 and not compile_needs_lock(logits, h200)
    huge = _workload_bytes(get_op("softmax"), get_op("softmax").spec((65536, 32768), "bf16"))  # 8 GiB
    assert compile_needs_lock(huge, h200)

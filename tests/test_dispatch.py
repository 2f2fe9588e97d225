"""KernelRunner: outputs are allocated with the right shape, dtype and layout on every call."""

from __future__ import annotations

import torch

from kernelsmith.dispatch import KernelRunner
from kernelsmith.ops import get_op
from kernelsmith.space import Config


def recording_launcher(seen: list) -> object:
    def launch(inputs, outputs):
        seen.append([(tuple(o.shape), o.dtype, o.is_contiguous()) for o in outputs])

    return launch


def test_one_output_like_a_contiguous_input_uses_empty_like():
    family = get_op("softmax")
    spec = family.spec((5, 33), "bf16")
    seen: list = []
    runner = KernelRunner.build(family, spec, recording_launcher(seen), "v", Config())
    assert runner.like_first_input == (True,)
    outs = runner([torch.randn(5, 33).bfloat16()])
    assert seen == [[((5, 33), torch.bfloat16, True)]] and outs[0].shape == (5, 33)


def test_outputs_unlike_the_first_input_are_allocated_from_their_specs():
    family = get_op("rmsnorm_backward")  # (dx like x, dw (N,) float32): x is the second input
    spec = family.spec((4, 16), "bf16")
    seen: list = []
    runner = KernelRunner.build(family, spec, recording_launcher(seen), "v", Config())
    assert runner.like_first_input == (True, False)  # dy is shaped like dx
    runner([torch.randn(4, 16).bfloat16(), torch.randn(4, 16).bfloat16(), torch.randn(16).bfloat16()])
    assert seen == [[((4, 16), torch.bfloat16, True), ((16,), torch.float32, True)]]


def test_a_non_contiguous_first_input_never_lends_its_layout():
    family = get_op("rope")
    x = torch.randn(2, 5, 3, 16).transpose(1, 2)  # (B, H, S, D) view of (B, S, H, D) memory
    cos = sin = torch.randn(5, 16)
    spec = family.spec_for(x, x, cos, sin)
    runner = KernelRunner.build(family, spec, recording_launcher(seen := []), "v", Config())
    assert not any(runner.like_first_input)
    runner([x, x, cos, sin])
    assert all(contiguous for _, _, contiguous in seen[0])


def test_the_custom_op_falls_back_to_autograd_references_of_backward_families(tmp_path, monkeypatch):
    """Without a stored kernel the op runs the family's PyTorch reference, which for a backward
    family is autograd through the forward: it must work inside the custom op's body."""
    monkeypatch.setenv("KERNELSMITH_DB", str(tmp_path / "empty.db"))
    dy, x, w = torch.randn(4, 16), torch.randn(4, 16), torch.randn(16)
    dx, dw = torch.ops.kernelsmith.kernel("rmsnorm_backward", [dy, x, w], '{"eps": 1e-06}')
    family = get_op("rmsnorm_backward")
    want_dx, want_dw = family.reference(family.spec_for(dy, x, w, eps=1e-6), (dy, x, w))
    assert torch.equal(dx, want_dx) and torch.equal(dw, want_dw) and not dx.requires_grad

"""Rule 3 on data that cannot tell a wrong answer from the right one ("blind" data).

Some distributions are blind for some outputs: on one peaked cross-entropy row the gradient is
about 0 everywhere, so a zeros output is within the tolerance; the gradient of a LayerNorm bias
over a single row *is* dy, the identity canary. The harness must neither reject every correct
kernel on such data nor accept a wrong kernel because of it: each output must be checked on data
that tells the canaries apart, and a canary that is as right as PyTorch is no canary.
"""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from kernelsmith.evaluate.validate import Rejected, validate
from kernelsmith.ops import get_op
from kernelsmith.ops._base import Launcher
from kernelsmith.spec import OpSpec


@triton.jit
def _zeros_kernel(out_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + offsets, tl.zeros([BLOCK], dtype=tl.float32), mask=offsets < n)


def zeros_build(spec: OpSpec, config: object) -> Launcher:
    """A 'kernel' that writes zeros to every output."""

    def launch(inputs: object, outputs: list[torch.Tensor]) -> None:
        for out in outputs:
            n = out.numel()
            _zeros_kernel[(triton.cdiv(n, 1024),)](out, n, BLOCK=1024)

    return launch


def first_config(name: str, spec: OpSpec) -> tuple[object, object]:
    variant = get_op(name).variants[0]
    return variant.build, variant.space(spec).configs()[0]


def test_bias_gradient_of_one_row_is_the_identity_and_passes() -> None:
    op = get_op("layernorm_backward")
    spec = op.spec((257,), "bfloat16")
    build, config = first_config(op.name, spec)
    assert validate(op, spec, build, config, "cpu", lambda: None) > 0


def test_blind_distribution_is_skipped_for_a_correct_kernel() -> None:
    op = get_op("cross_entropy_fused")
    spec = op.spec((1, 4097), "bfloat16")
    assert "peaked" in op.distributions
    build, config = first_config(op.name, spec)
    assert validate(op, spec, build, config, "cpu", lambda: None) > 0


def test_zeros_are_still_rejected_where_some_data_is_blind() -> None:
    op = get_op("cross_entropy_fused")
    spec = op.spec((1, 4097), "bfloat16")
    with pytest.raises(Rejected, match="wrong"):
        validate(op, spec, zeros_build, None, "cpu", lambda: None)


def test_only_blind_data_rejects_with_a_harness_message(monkeypatch: pytest.MonkeyPatch) -> None:
    op = get_op("cross_entropy_fused")
    monkeypatch.setattr(type(op), "distributions", ("peaked",))
    monkeypatch.setattr(type(op), "stress_distributions", ())  # spikes would tell the canaries apart
    spec = op.spec((1, 4097), "bfloat16")
    build, config = first_config(op.name, spec)
    with pytest.raises(Rejected, match="harness: output 1"):
        validate(op, spec, build, config, "cpu", lambda: None)

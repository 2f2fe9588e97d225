"""The specs every RMSNorm family shares (kernelsmith.ops.rmsnorm.RMSNormLike): rmsnorm, add_rmsnorm
and both backwards build their specs and refuse what their kernels cannot do through one piece of
code, over each family's ``input_names``."""

from __future__ import annotations

import pytest
import torch

from kernelsmith.ops import UnsupportedWorkload, get_op
from kernelsmith.ops.rmsnorm import RMSNormLike

FAMILIES = {
    "rmsnorm": ("x", "weight"),
    "add_rmsnorm": ("x", "residual", "weight"),
    "rmsnorm_backward": ("dy", "x", "weight"),
    "add_rmsnorm_backward": ("dy", "dh", "h", "weight"),
}


def _tensors(op: str, shape: tuple[int, ...] = (5, 24), dtype: torch.dtype = torch.bfloat16) -> list[torch.Tensor]:
    """Consistent inputs of ``op``: its activations shaped ``shape``, then a weight of the last size."""
    activations = [torch.randn(shape).to(dtype) for _ in FAMILIES[op][:-1]]
    return [*activations, torch.randn(shape[-1:]).to(dtype)]


@pytest.mark.parametrize("op", FAMILIES)
def test_every_rmsnorm_family_takes_its_inputs_by_name(op: str) -> None:
    family = get_op(op)
    assert isinstance(family, RMSNormLike)
    assert family.input_names == FAMILIES[op]


@pytest.mark.parametrize("op", FAMILIES)
@pytest.mark.parametrize("weight_offset", [0.0, 1.0])
def test_spec_for_consistent_tensors_is_the_command_line_spec(op: str, weight_offset: float) -> None:
    family = get_op(op)
    from_cli = family.spec((2, 3, 24), "bfloat16", eps=1e-5, weight_offset=weight_offset)
    from_tensors = family.spec_for(*_tensors(op, (2, 3, 24)), eps=1e-5, weight_offset=weight_offset)
    assert from_tensors == from_cli
    assert [t.shape for t in from_cli.inputs] == [(2, 3, 24)] * (len(FAMILIES[op]) - 1) + [(24,)]
    assert from_cli.constants == ({"eps": 1e-5, "weight_offset": 1.0} if weight_offset else {"eps": 1e-5})


# Each refusal: what is wrong, and the inputs (activations, weight) -> the call's inputs.
REFUSALS = {
    "one input too few": lambda acts, w: [*acts],
    "one input too many": lambda acts, w: [*acts, w, w],
    "a non-tensor": lambda acts, w: [*acts, w.tolist()],
    "a 0-D activation": lambda acts, w: [*[a[0, 0] for a in acts], w],
    "a 2-D weight": lambda acts, w: [*acts, w[None, :]],
    "a weight of another width": lambda acts, w: [*acts, w[:-1]],
    "an empty activation": lambda acts, w: [*[a[:0] for a in acts], w],
    "a weight of another dtype": lambda acts, w: [*acts, w.float()],
    "an unsupported dtype": lambda acts, w: [*[a.double() for a in acts], w.double()],
    "a non-contiguous activation": lambda acts, w: [*[a.t().contiguous().t() for a in acts], w],
    "activations of two shapes": lambda acts, w: [acts[0][:-1], *acts[1:], w] if len(acts) > 1 else None,
}


@pytest.mark.parametrize("op", FAMILIES)
@pytest.mark.parametrize("what", REFUSALS)
def test_spec_for_refuses_what_the_kernels_cannot_do(op: str, what: str) -> None:
    *activations, weight = _tensors(op)
    inputs = REFUSALS[what](activations, weight)
    if inputs is None:
        pytest.skip(f"{op} has one activation")
    with pytest.raises(UnsupportedWorkload, match=op):
        get_op(op).spec_for(*inputs)


@pytest.mark.parametrize("op", FAMILIES)
def test_spec_refuses_bad_shapes_and_constants(op: str) -> None:
    family = get_op(op)
    for shape in [(), (0, 24), (4, -1)]:
        with pytest.raises(UnsupportedWorkload, match="positive shape"):
            family.spec(shape, "bfloat16")
    with pytest.raises(UnsupportedWorkload, match="unknown constants"):
        family.spec((4, 24), "bfloat16", dim=0)
    with pytest.raises(UnsupportedWorkload, match="unknown constants"):
        family.spec_for(*_tensors(op), dim=0)
    with pytest.raises(UnsupportedWorkload, match="eps"):
        family.spec((4, 24), "bfloat16", eps=-1.0)
    with pytest.raises(UnsupportedWorkload, match="weight_offset"):
        family.spec((4, 24), "bfloat16", weight_offset=float("inf"))

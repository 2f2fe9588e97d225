"""Every op family with a backward, through kernelsmith's autograd node, against float64 autograd.

The forward runner and the backward runner are built from each family's first config of each
variant pair (as the decorator would from stored decisions) and applied through
:class:`kernelsmith.dispatch.KernelFunction`; the gradients of every floating-point input must
match autograd through the family's float64 reference within the family's tolerance. This checks
the wiring (which inputs the backward gets, whose gradient is whose, dtype casts), not every
config: the kernels' own test files do that.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from kernelsmith import dispatch
from kernelsmith.evaluate.errors import check_close
from kernelsmith.ops import get_op
from kernelsmith.spec import OpSpec

CASES: list[tuple[str, tuple[int, ...], dict[str, Any]]] = [
    ("rmsnorm", (7, 96), {}),
    ("layernorm", (7, 96), {"affine": "weight_bias"}),
    ("layernorm", (5, 33), {"affine": "weight"}),
    ("layernorm", (5, 33), {"affine": "none"}),
    ("swiglu", (7, 96), {}),
    ("swiglu", (3, 5, 40), {"layout": "concat"}),
    ("geglu", (7, 96), {}),
    ("add_rmsnorm", (7, 96), {}),
    ("cross_entropy", (7, 300), {}),
    ("cross_entropy", (6, 300), {"reduction": "none", "label_smoothing": 0.1}),
    ("cross_entropy", (6, 300), {"reduction": "sum"}),
]


def runner(family_name: str, spec: OpSpec, variant_index: int) -> dispatch.KernelRunner:
    family = get_op(family_name)
    variant = family.variants[variant_index % len(family.variants)]
    configs = variant.space(spec).configs()
    if not configs:  # e.g. a whole-row variant at a width it cannot hold: take the first that can
        variant = next(v for v in family.variants if v.space(spec).configs())
        configs = variant.space(spec).configs()
    config = configs[len(configs) // 2]
    return dispatch.KernelRunner.build(family, spec, variant.build(spec, config), variant.name, config)


def as_tuple(value: Any) -> tuple[torch.Tensor, ...]:
    return tuple(value) if isinstance(value, (tuple, list)) else (value,)


@pytest.mark.parametrize("variant_index", [0, 1])
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize(("op_name", "shape", "constants"), CASES, ids=lambda v: str(v))
def test_gradients_through_the_autograd_node(
    op_name: str, shape: tuple[int, ...], constants: dict[str, Any], dtype: str, variant_index: int
) -> None:
    family = get_op(op_name)
    spec = family.spec(shape, dtype, **constants)
    inputs = family.make_inputs(spec, seed=3, distribution="normal", device="cpu")
    forward = runner(op_name, spec, variant_index)

    # The backward family's spec, from the inputs the autograd node will hand it.
    probe = forward(inputs)
    grad_outputs = tuple(torch.ones_like(o) if o.dim() == 0 else torch.randn_like(o) for o in probe)
    backward_spec = get_op(str(family.backward)).spec_for(
        *family.backward_inputs(grad_outputs, inputs, probe), **spec.constants
    )
    backward = runner(str(family.backward), backward_spec, variant_index)

    leaves = [t.detach().clone().requires_grad_(t.is_floating_point()) for t in inputs]
    outs = as_tuple(dispatch.KernelFunction.apply(family, forward, backward, *leaves))
    wanted = [t for t in leaves if t.requires_grad]
    grads = torch.autograd.grad(outs, wanted, grad_outputs)

    def reference_grads(cast: torch.dtype | None) -> tuple[torch.Tensor, ...]:
        ref_leaves = [
            (t.detach().to(cast) if cast and t.is_floating_point() else t.detach().clone()).requires_grad_(
                t.is_floating_point()
            )
            for t in inputs
        ]
        reference = family.reference_fp64 if cast else family.reference
        ref_outs = as_tuple(reference(spec, ref_leaves))
        ref_grad_outs = [g.to(o.dtype) for g, o in zip(grad_outputs, ref_outs, strict=True)]
        return torch.autograd.grad(ref_outs, [t for t in ref_leaves if t.requires_grad], ref_grad_outs)

    truth, pytorch = reference_grads(torch.float64), reference_grads(None)
    assert len(grads) == len(truth) >= 1
    for k, (got, want, lowp, leaf) in enumerate(zip(grads, truth, pytorch, wanted, strict=True)):
        assert got.dtype == leaf.dtype and got.shape == leaf.shape, k
        problem = check_close(got, want, lowp.to(got.dtype), family.tolerance)
        assert problem is None, f"gradient {k}: {problem}"

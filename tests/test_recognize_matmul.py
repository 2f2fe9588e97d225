"""The recognizer's ``matmul`` pattern: products (F.linear, nn.Linear, ``@``, torch.matmul) and
the epilogues that follow (bias, GELU, SiLU, residual add, the SwiGLU pair).

Each positive case checks the constants, that ``bind`` returns the right tensors (by identity),
that ``Matmul.spec_for`` accepts the match's inputs and constants, and that the function's own
output passes the decorator's numerical check against the family's reference (so the match is
not a coincidence of names). Each negative case checks that nothing matched and that the reason
names the problem.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import kernelsmith
from kernelsmith.frontends.decorator import _differs_from_op
from kernelsmith.frontends.patterns import PATTERNS
from kernelsmith.frontends.recognize import InputRef, Recognition, recognize
from kernelsmith.ops import get_op

M, N, K = 5, 12, 16
ARG0, ARG1, ARG2, ARG3 = (InputRef("arg", index=i) for i in range(4))


def _t(shape: tuple[int, ...], dtype: torch.dtype = torch.float32, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g).to(dtype)


def _matched(fn, args: tuple, constants: dict, refs: tuple[InputRef, ...] | None = None) -> tuple[torch.Tensor, ...]:
    """Recognized as matmul with ``constants``; the family accepts it and its output is the op's."""
    rec = recognize(fn, args, {})
    assert rec.match is not None, rec.reason
    assert rec.match.op == "matmul"
    assert rec.match.constants == constants
    if refs is not None:
        assert rec.match.inputs == refs
    inputs = rec.match.bind(args, {})
    family = get_op("matmul")
    spec = family.spec_for(*inputs, **rec.match.constants)
    assert _differs_from_op(family, spec, inputs, rec.output) is None
    return inputs


def _refused(fn, args: tuple, *, reason: str) -> Recognition:
    rec = recognize(fn, args, {})
    assert rec.match is None, f"unexpectedly matched {rec.match}"
    assert reason.lower() in rec.reason.lower(), rec.reason
    return rec


def linear_args(dtype: torch.dtype = torch.float32, lead: tuple[int, ...] = (M,)) -> tuple[torch.Tensor, ...]:
    """x (..., K), w (N, K), b (N,), r (..., N)."""
    return _t((*lead, K), dtype, 1), _t((N, K), dtype, 2), _t((N,), dtype, 3), _t((*lead, N), dtype, 4)


def test_the_pattern_is_registered() -> None:
    assert PATTERNS["matmul"].__module__ == "kernelsmith.frontends.patterns.matmul"


# ---- products ----------------------------------------------------------------------------------

PRODUCTS_LINEAR = {
    "F.linear": lambda x, w: F.linear(x, w),
    "@ w.T": lambda x, w: x @ w.T,
    "matmul w.t()": lambda x, w: torch.matmul(x, w.t()),
    "method transpose(0, 1)": lambda x, w: x.matmul(w.transpose(0, 1)),
    "transpose(-1, -2)": lambda x, w: x @ w.transpose(-1, -2),
    "mT": lambda x, w: x @ w.mT,
    "permute": lambda x, w: x @ w.permute(1, 0),
    "torch.transpose": lambda x, w: x @ torch.transpose(w, 0, 1),
}


@pytest.mark.parametrize("form", sorted(PRODUCTS_LINEAR))
def test_linear_layout_products(form: str) -> None:
    x, w, _, _ = linear_args()
    inputs = _matched(PRODUCTS_LINEAR[form], (x, w), {"layout": "linear", "epilogue": "none", "bias": False},
                      (ARG0, ARG1))  # fmt: skip
    assert inputs[0] is x and inputs[1] is w


PRODUCTS_MATMUL = {
    "@": lambda x, w: x @ w,
    "torch.matmul": lambda x, w: torch.matmul(x, w),
    "torch.mm": lambda x, w: torch.mm(x, w),
    "F.linear of w.T": lambda x, w: F.linear(x, w.T),
}


@pytest.mark.parametrize("form", sorted(PRODUCTS_MATMUL))
def test_matmul_layout_products(form: str) -> None:
    x, wk = _t((M, K), seed=1), _t((K, N), seed=2)
    _matched(PRODUCTS_MATMUL[form], (x, wk), {"layout": "matmul", "epilogue": "none", "bias": False}, (ARG0, ARG1))


def test_square_weights_and_batched_x() -> None:
    x, w = _t((2, 3, K), seed=1), _t((K, K), seed=2)
    _matched(lambda x, w: x @ w.transpose(0, 1), (x, w), {"layout": "linear", "epilogue": "none", "bias": False})
    _matched(lambda x, w: x @ w, (x, w), {"layout": "matmul", "epilogue": "none", "bias": False})
    # a 1-D x (one row)
    _matched(lambda x, w: F.linear(x, w), (_t((K,)), w), {"layout": "linear", "epilogue": "none", "bias": False})


def test_operands_and_transposes_are_read_from_the_call_arguments() -> None:
    x, w = _t((M, K), seed=1), _t((K, K), seed=2)  # a square weight: shapes alone cannot tell
    linear = {"layout": "linear", "epilogue": "none", "bias": False}
    _matched(lambda x, w: F.linear(weight=w, input=x), (x, w), linear, (ARG0, ARG1))
    _matched(lambda x, w: torch.matmul(x, other=torch.transpose(w, dim0=1, dim1=0)), (x, w), linear)
    _matched(lambda x, w: x @ w.permute((1, 0)), (x, w), linear)
    _matched(lambda x, w: x @ w.swapaxes(-2, -1), (x, w), linear)
    _refused(lambda x, w: x @ w.transpose(0, 0), (x, w), reason="does not transpose")
    _refused(lambda x, w: x @ w.permute(0, 1), (x, w), reason="does not transpose")
    _matched(lambda x, w: F.linear(x, w, bias=None), (x, w), linear)


def test_without_recorded_arguments_the_tensors_in_call_order_are_used() -> None:
    """A capture that records no call arguments: the operands in order, a transpose by its shape."""
    from kernelsmith.frontends.capture import Kind, capture
    from kernelsmith.frontends.patterns.matmul import match

    x, w, b, _ = linear_args()
    for fn, args, bias in ((lambda x, w, b: F.linear(x, w, b), (x, w, b), True),
                           (lambda x, w: x @ w.transpose(0, 1), (x, w), False)):  # fmt: skip
        graph = capture(fn, args, {})
        for node in graph.nodes:
            if node.kind is Kind.OTHER:
                node.params.clear()
        found = match(graph)
        assert found is not None and found.constants == {"layout": "linear", "epilogue": "none", "bias": bias}


# ---- epilogues ----------------------------------------------------------------------------------


class MLP(nn.Module):
    def __init__(self, bias: bool = True, act: nn.Module | None = None) -> None:
        super().__init__()
        self.fc = nn.Linear(K, N, bias=bias)
        self.act = act

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        return self.act(h) if self.act is not None else h


def test_nn_linear_with_and_without_bias() -> None:
    x = _t((M, K), seed=1)
    for bias in (True, False):
        module = MLP(bias=bias)
        inputs = _matched(module, (x,), {"layout": "linear", "epilogue": "none", "bias": bias})
        assert inputs[1] is module.fc.weight
        if bias:
            assert inputs[2] is module.fc.bias
        assert all(ref.kind == "external" for ref in recognize(module, (x,), {}).match.inputs[1:])  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("act", "epilogue"),
    [(nn.GELU(), "gelu"), (nn.GELU(approximate="tanh"), "gelu_tanh"), (nn.SiLU(), "silu")],
)
def test_nn_linear_then_an_activation_module(act: nn.Module, epilogue: str) -> None:
    module = MLP(act=act)
    _matched(module, (_t((3, 2, K), seed=1),), {"layout": "linear", "epilogue": epilogue, "bias": True})


EPILOGUES = {
    "bias add": (lambda x, w, b, r: x @ w.T + b, "none", True, (ARG0, ARG1, ARG2)),
    "bias add, reversed": (lambda x, w, b, r: b + x @ w.T, "none", True, (ARG0, ARG1, ARG2)),
    "torch.add bias": (lambda x, w, b, r: torch.add(F.linear(x, w), b), "none", True, (ARG0, ARG1, ARG2)),
    "gelu": (lambda x, w, b, r: F.gelu(F.linear(x, w, b)), "gelu", True, (ARG0, ARG1, ARG2)),
    "gelu of bias add": (lambda x, w, b, r: F.gelu(x @ w.T + b), "gelu", True, (ARG0, ARG1, ARG2)),
    "gelu tanh, no bias": (lambda x, w, b, r: F.gelu(x @ w.T, approximate="tanh"), "gelu_tanh", False, (ARG0, ARG1)),
    "silu": (lambda x, w, b, r: F.silu(F.linear(x, w, b)), "silu", True, (ARG0, ARG1, ARG2)),
    "h * sigmoid(h)": (lambda x, w, b, r: (h := x @ w.T) * torch.sigmoid(h), "silu", False, (ARG0, ARG1)),
    "sigmoid(h) * h": (lambda x, w, b, r: torch.sigmoid(h := F.linear(x, w, b)) * h, "silu", True,
                       (ARG0, ARG1, ARG2)),
    "residual": (lambda x, w, b, r: r + x @ w.T, "residual", False, (ARG0, ARG1, ARG3)),
    "residual after F.linear bias": (lambda x, w, b, r: F.linear(x, w, b) + r, "residual", True,
                                     (ARG0, ARG1, ARG2, ARG3)),
    "bias then residual": (lambda x, w, b, r: (x @ w.T + b) + r, "residual", True, (ARG0, ARG1, ARG2, ARG3)),
    "residual then bias": (lambda x, w, b, r: (r + x @ w.T) + b, "residual", True, (ARG0, ARG1, ARG2, ARG3)),
}  # fmt: skip


@pytest.mark.parametrize("form", sorted(EPILOGUES))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_epilogues(form: str, dtype: torch.dtype) -> None:
    fn, epilogue, bias, refs = EPILOGUES[form]
    args = linear_args(dtype)
    inputs = _matched(fn, args, {"layout": "linear", "epilogue": epilogue, "bias": bias}, refs)
    assert all(t is args[ref.index] for t, ref in zip(inputs, refs, strict=True))  # type: ignore[index]


def test_matmul_layout_with_a_bias_and_a_residual() -> None:
    x, wk, b, r = _t((M, K), seed=1), _t((K, N), seed=2), _t((N,), seed=3), _t((M, N), seed=4)
    _matched(lambda x, w, b, r: x @ w + b + r, (x, wk, b, r),
             {"layout": "matmul", "epilogue": "residual", "bias": True})  # fmt: skip
    _matched(lambda x, w, b: F.silu(torch.matmul(x, w) + b), (x, wk, b),
             {"layout": "matmul", "epilogue": "silu", "bias": True})  # fmt: skip


def test_a_row_shaped_bias_is_bound_as_a_vector() -> None:
    x, w, b, _ = linear_args()
    row = b.view(1, N)
    rec = recognize(lambda x, w, b: x @ w.T + b, (x, w, row), {})
    assert rec.match is not None and rec.match.constants["bias"] is True
    assert rec.match.inputs[2].reshape == (N,)
    assert rec.match.bind((x, w, row), {})[2].shape == (N,)


# ---- SwiGLU --------------------------------------------------------------------------------------


class LlamaGateUp(nn.Module):
    """The gate and up projections of Llama's MLP (without the down projection)."""

    def __init__(self) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(K, N, bias=False)
        self.up_proj = nn.Linear(K, N, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.silu(self.gate_proj(x)) * self.up_proj(x)


SWIGLU = {
    "silu(x @ w1.T) * (x @ w3.T)": lambda x, w1, w3: F.silu(x @ w1.T) * (x @ w3.T),
    "reversed factors": lambda x, w1, w3: F.linear(x, w3) * F.silu(F.linear(x, w1)),
    "h * sigmoid(h) * up": lambda x, w1, w3: (h := x @ w1.T) * torch.sigmoid(h) * (x @ w3.T),
    "up * (h * sigmoid(h))": lambda x, w1, w3: (x @ w3.T) * ((h := x @ w1.T) * torch.sigmoid(h)),
}


@pytest.mark.parametrize("form", sorted(SWIGLU))
def test_swiglu_forms(form: str) -> None:
    x, w1, w3 = _t((2, M, K), seed=1), _t((N, K), seed=2), _t((N, K), seed=3)
    inputs = _matched(SWIGLU[form], (x, w1, w3), {"layout": "linear", "epilogue": "swiglu", "bias": False})
    assert inputs[0] is x and inputs[1] is w1 and inputs[2] is w3  # the gate is the activated weight


def test_swiglu_modules_and_the_matmul_layout() -> None:
    module = LlamaGateUp()
    swiglu = {"layout": "linear", "epilogue": "swiglu", "bias": False}
    inputs = _matched(module, (_t((M, K), torch.float32, 1),), swiglu)
    assert inputs[1] is module.gate_proj.weight and inputs[2] is module.up_proj.weight
    x, w1, w3 = _t((M, K), seed=1), _t((K, N), seed=2), _t((K, N), seed=3)
    _matched(lambda x, a, b: F.silu(x @ a) * (x @ b), (x, w1, w3), {**swiglu, "layout": "matmul"})


def test_swiglu_look_alikes_are_refused() -> None:
    x, w1, w3 = _t((M, K), seed=1), _t((N, K), seed=2), _t((N, K), seed=3)
    x2 = _t((M, K), seed=4)
    _refused(lambda x, y, a, b: F.silu(x @ a.T) * (y @ b.T), (x, x2, w1, w3), reason="two different x")
    _refused(lambda x, a, b: F.silu(x @ a.T) * F.silu(x @ b.T), (x, w1, w3), reason="2 SiLU-activated")
    _refused(lambda x, a, b: F.gelu(x @ a.T) * (x @ b.T), (x, w1, w3), reason="gate")
    _refused(lambda x, a, b: F.silu(x @ a.T) * (x @ b), (x, w1, _t((K, N))), reason="layout")
    bias = _t((N,), seed=5)
    _refused(lambda x, a, b, c: F.silu(F.linear(x, a, c)) * F.linear(x, b), (x, w1, w3, bias), reason="bias")


# ---- refusals -------------------------------------------------------------------------------------


def test_an_activation_then_an_add_is_refused() -> None:
    x, w, b, r = linear_args()
    _refused(lambda x, w, b, r: F.gelu(x @ w.T) + r, (x, w, b, r), reason="after the activation")
    _refused(lambda x, w, b, r: F.silu(x @ w.T) + b, (x, w, b, r), reason="after the activation")


def test_bad_addends_are_refused() -> None:
    x, w, b, r = linear_args()
    _refused(lambda x, w, b: F.linear(x, w, b) + b, (x, w, b), reason="neither the bias")  # two biases
    column = _t((M, 1), seed=6)
    _refused(lambda x, w, c: x @ w.T + c, (x, w, column), reason="neither the bias")
    _refused(lambda x, w, r: F.gelu(x @ w.T + r), (x, w, r), reason="neither the bias")  # residual under gelu
    _refused(lambda x, w, b: x @ w.T + 2 * b, (x, w, b), reason="comes from torch.Tensor.add")


def test_computed_operands_and_other_computations_are_refused() -> None:
    x, w, _, _ = linear_args()
    _refused(lambda x, w: (2 * x) @ w.T, (x, w), reason="x is computed")
    _refused(lambda x, w: x @ (w * 2).T, (x, w), reason="weight is computed")
    _refused(lambda x, w: F.relu(x @ w.T), (x, w), reason="comes from torch.nn.functional.relu")
    _refused(lambda x, w: (x @ w.T) * 2, (x, w), reason="comes from torch.Tensor.mul")
    _refused(lambda x, w: F.gelu(x @ w.T).sum(-1), (x, w), reason="comes from torch.Tensor.sum")


def test_batched_weights_and_casts_are_refused() -> None:
    x = _t((3, M, K), seed=1)
    _refused(lambda x, w: x @ w.transpose(-1, -2), (x, _t((3, N, K))), reason="2-D weight")
    xb, wb = _t((M, K), torch.bfloat16, 1), _t((N, K), torch.bfloat16, 2)
    _refused(lambda x, w: (x @ w.T).float(), (xb, wb), reason="comes from torch.Tensor.float")
    _refused(lambda x, w: x.float() @ w.float().T, (xb, wb), reason="computed")


def test_mixed_dtypes_are_refused() -> None:
    x, w = _t((M, K), torch.bfloat16, 1), _t((N, K), torch.bfloat16, 2)
    b32 = _t((N,), torch.float32, 3)
    _refused(lambda x, w, b: x @ w.T + b, (x, w, b32), reason="mixed dtypes")


def test_functions_without_a_product_are_left_to_the_other_patterns() -> None:
    from kernelsmith.frontends.capture import capture
    from kernelsmith.frontends.patterns.matmul import match

    x = _t((M, K))
    assert match(capture(lambda x: F.gelu(x), (x,), {})) is None
    assert match(capture(lambda a, b: F.silu(a) * b, (x, x.clone()), {})) is None
    rec = recognize(lambda a, b: F.silu(a) * b, (x, x.clone()), {})
    assert rec.match is not None and rec.match.op == "swiglu"


# ---- the decorator ----------------------------------------------------------------------------------


def test_the_decorator_recognizes_a_linear_layer(tmp_path) -> None:
    """Database-only mode: recognized and checked as matmul, then "not tuned"."""
    module = MLP(act=nn.GELU())
    x = _t((M, K), seed=1)
    wrapped = kernelsmith.optimize(module, mode="db", db=tmp_path / "x.db")
    out = wrapped(x)
    torch.testing.assert_close(out, module(x), rtol=0, atol=0)
    (reason,) = wrapped.kernelsmith.reasons.values()
    assert "matmul" in reason and "not tuned" in reason, reason


def test_the_match_records_no_precision_but_spec_for_reads_it() -> None:
    """allow_tf32 is not a match constant: spec_for reads PyTorch's setting when a call binds."""
    from kernelsmith.ops.matmul import matmul_precision

    x, w, _, _ = linear_args()
    rec = recognize(lambda x, w: x @ w.T, (x, w), {})
    assert rec.match is not None and "allow_tf32" not in rec.match.constants
    family = get_op("matmul")
    for allowed in (False, True):
        with matmul_precision(allowed):
            assert family.spec_for(x, w, **rec.match.constants).const("allow_tf32") is allowed

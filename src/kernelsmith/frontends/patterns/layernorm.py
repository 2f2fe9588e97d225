"""LayerNorm over the last dim: ``(x - mean(x)) / sqrt(var(x) + eps) * weight + bias``, however written.

Recognized (after the capture's normalization, see :mod:`kernelsmith.frontends.capture`):

- ``F.layer_norm(x, (N,), weight, bias, eps)`` and ``torch.layer_norm``, with or without the
  weight and the bias, and ``torch.nn.LayerNorm`` modules (``elementwise_affine`` True or False,
  ``bias`` True or False), which call ``F.layer_norm``; also ``F.layer_norm(x.float(), ...)``
  (the weight and bias perhaps upcast too) cast back to x's dtype, and
  ``F.layer_norm(x, (N,), eps=eps) * weight [+ bias]``;
- the explicit ``(x - mu) / sqrt(var + eps) * weight + bias`` with ``mu`` being
  ``x.mean(-1, keepdim=True)`` and ``var`` being ``x.var(-1, keepdim=True, unbiased=False)``
  (or ``correction=0``, or ``torch.var``) or ``((x - mu) ** 2).mean(-1, keepdim=True)`` (any
  spelling of the square, ``sum / N`` for the mean); ``1 / sqrt`` may be ``rsqrt``, ``** -0.5``,
  a division by ``sqrt`` or by ``** 0.5``; the factors in any order; the weight and the bias
  optional (a bias alone is refused: the op family has no such form); ``eps`` a Python number
  (or ``torch.tensor(number)``) added in either order, or absent (``eps = 0``); ``x`` may be
  upcast to float32 (``x.float()``) with the result, or the normalized value before the weight,
  cast back to x's dtype; the weight and the bias may be upcast to float32 too
  (``self.weight.to(torch.float32) * normed``, Cohere's LayerNorm without a bias): that is the
  kernels' own float32 math.

The match's inputs are ``x`` and then the weight and the bias that are present, its constants
``eps`` and ``affine`` (``"weight_bias"``, ``"weight"`` or ``"none"``), as the op family's
``spec_for`` takes them.

Refused, with a reason: the unbiased variance (``x.var(-1)``'s default, ``correction=1``), a
mean or variance over another dim, several dims or without keepdim, ``normalized_shape`` of more
than one dim, a weight or bias that does not act on the last axis alone (``(rows, 1)``), a bias
without a weight, ``eps`` outside the square root, a mean or variance of another tensor, casts
other than the ones above, an output dtype or shape other than x's, and anything computed
besides the op.
"""

from __future__ import annotations

import logging

import torch

from kernelsmith.frontends.capture import Const, Graph, Kind, Node, TensorValue, Value
from kernelsmith.frontends.recognize import (
    InputRef,
    Match,
    NoMatch,
    constant_number,
    describe,
    finite_non_negative,
    input_or_upcast,
    input_ref,
    product_factors,
    reduces_last_dim,
    reduction_dims_text,
    require_only,
    row_parameter_ref,
    single_tensor_output,
)

logger = logging.getLogger(__name__)

OP = "layernorm"


def match(graph: Graph) -> Match | None:
    """The LayerNorm match of ``graph``; None when it has no LayerNorm-like part at all."""
    if not any(n.kind in (Kind.LAYER_NORM, Kind.VAR) or _is_centering(graph, n) for n in graph.nodes):
        return None
    out = single_tensor_output(graph)
    node = graph.producer(out)
    assert node is not None  # single_tensor_output checked it
    used: list[Node] = []
    value: Value = out
    if node.kind is Kind.CAST:  # a float32 computation cast back to x's dtype (checked at the end)
        used.append(node)
        value = node.inputs[0]
        inner = graph.producer(value)
        if inner is None:
            raise NoMatch("the output is a cast of an input, not a layer norm")
        node = inner
    if node.kind is Kind.LAYER_NORM:
        x, refs, constants = _functional(graph, node, used)
        return _finish(graph, out, x, refs, constants, used)
    bias: TensorValue | None = None
    if node.kind is Kind.ADD:
        biases = [v for v in node.inputs if _is_parameter(graph, v)]
        if len(biases) != 1:
            names = [describe(graph, v) for v in node.inputs]
            raise NoMatch(f"adds {names[0]} and {names[1]}: not a normalized value and a bias tensor")
        bias, upcasts = input_or_upcast(graph, biases[0], "bias")  # bias.float(): float32 math too
        value = node.inputs[1] if node.inputs[0] is biases[0] else node.inputs[0]
        used += [node, *upcasts]
    elif node.kind not in (Kind.MUL, Kind.CAST):
        raise NoMatch(f"the output comes from {node.name}, which is not the last step of a layer norm")
    x, refs, constants = _product(graph, value, bias, used)
    return _finish(graph, out, x, refs, constants, used)


def _is_parameter(graph: Graph, value: Value) -> bool:
    """An input tensor, or its upcast to float32 (``bias.float()``), not a computed value."""
    cast = graph.produced_by(value, Kind.CAST)
    if cast is not None and cast.params["dtype"] == torch.float32:
        value = cast.inputs[0]
    return isinstance(value, TensorValue) and graph.producer(value) is None


def _is_centering(graph: Graph, node: Node) -> bool:
    return node.kind is Kind.SUB and graph.produced_by(node.inputs[1], Kind.MEAN) is not None


def _finish(
    graph: Graph, out: TensorValue, x: TensorValue, refs: tuple[InputRef, ...], constants: dict, used: list[Node]
) -> Match:
    if x.ndim < 1:
        raise NoMatch("x is 0-d")
    if out.dtype != x.dtype:
        raise NoMatch(f"the output is {out.dtype}, but x is {x.dtype}")
    if out.shape != x.shape:
        raise NoMatch(f"the output has shape {out.shape}, but x has {x.shape}")
    require_only(graph, used, OP)
    return Match(OP, refs, constants)


def _affine(weight: TensorValue | None, bias: TensorValue | None) -> str:
    if bias is not None and weight is None:
        raise NoMatch("adds a bias without a weight: the layernorm op has no such form")
    return "none" if weight is None else "weight" if bias is None else "weight_bias"


def _param_refs(x: TensorValue, weight: TensorValue | None, bias: TensorValue | None) -> tuple[InputRef, ...]:
    refs = [input_ref(x, "input x")]
    for t, role in ((weight, "weight"), (bias, "bias")):
        if t is not None:
            refs.append(row_parameter_ref(t, x, role))
    return tuple(refs)


def _ln_parts(node: Node) -> tuple[Value, float]:
    """The input of a ``layer_norm`` call over the last dim alone, and its eps."""
    x = node.inputs[0]
    if not isinstance(x, TensorValue) or x.ndim < 1:
        raise NoMatch("layer_norm of a 0-d tensor")
    n = x.shape[-1]
    shape = tuple(node.params["normalized_shape"])
    if shape != (n,):
        raise NoMatch(f"normalized_shape {shape} is not the last dim alone ({n},)")
    eps = Const(node.params["eps"]).number
    if eps is None or not finite_non_negative(eps):
        raise NoMatch(f"eps {node.params['eps']!r} is not a finite non-negative number")
    return x, eps


def _optional_tensor(value: Value, role: str) -> TensorValue | None:
    if isinstance(value, TensorValue):
        return value
    if isinstance(value, Const) and value.value is None:
        return None
    raise NoMatch(f"the {role} is {value!r}, not a tensor")


def _functional(graph: Graph, node: Node, used: list[Node]) -> tuple[TensorValue, tuple[InputRef, ...], dict]:
    """``F.layer_norm`` / ``torch.layer_norm`` / ``nn.LayerNorm`` (of x or of ``x.float()``)."""
    x_in, eps = _ln_parts(node)
    x, casts = input_or_upcast(graph, x_in, "layer_norm input")
    params: list[TensorValue | None] = []
    for value, role in ((node.inputs[1], "weight"), (node.inputs[2], "bias")):
        t = _optional_tensor(value, role)
        if t is not None:  # F.layer_norm(x.float(), (N,), w.float(), b.float()): upcast with x
            t, upcasts = input_or_upcast(graph, t, role)
            if upcasts and not casts:
                raise NoMatch(f"upcasts the {role} but not x")
            casts += upcasts
        params.append(t)
    weight, bias = params
    affine = _affine(weight, bias)
    used += [node, *casts]
    return x, _param_refs(x, weight, bias), {"eps": eps, "affine": affine}


def _product(
    graph: Graph, value: Value, bias: TensorValue | None, used: list[Node]
) -> tuple[TensorValue, tuple[InputRef, ...], dict]:
    """``(x - mu) * rstd [* weight]`` (any order, casts checked), or ``layer_norm(x) * weight``."""
    muls: list[Node] = []
    casts: list[tuple[Node, list[Value]]] = []
    factors = product_factors(graph, value, muls, casts)
    used += muls
    rstds = [f for f in factors if graph.produced_by(f, Kind.RSQRT) is not None]
    norms = [f for f in factors if graph.produced_by(f, Kind.LAYER_NORM) is not None]
    if not rstds and norms:
        if len(factors) == 1 and bias is not None:
            raise NoMatch(f"adds {bias.describe()} after the normalization, with no weight multiply before it")
        return _functional_times_weight(graph, factors, norms, bias, casts, used)
    if len(rstds) != 1:
        raise NoMatch(f"the product has {len(rstds)} factors of the form 1/sqrt(...), not one")
    centred = [f for f in factors if graph.produced_by(f, Kind.SUB) is not None]
    if len(centred) != 1:
        raise NoMatch(f"the product has {len(centred)} factors of the form x - mean(x), not one")
    x, centre_nodes = _centering(graph, centred[0])
    rstd_node = graph.producer(rstds[0])
    assert rstd_node is not None
    eps, var_nodes = _variance(graph, rstd_node.inputs[0], x)
    tensors = [f for f in factors if isinstance(f, TensorValue) and graph.producer(f) is None]
    others = [f for f in factors if not any(f is g for g in [*rstds, *centred, *tensors])]
    if others:
        names = [describe(graph, f) for f in others]
        raise NoMatch(f"the product has factors other than x - mean(x), 1/sqrt(var + eps) and the weight: {names}")
    if len(tensors) > 1:
        raise NoMatch("more than one tensor multiplies the normalized value")
    weight = tensors[0] if tensors else None
    for cast, leaves in casts:
        under = {id(v) for v in leaves}
        if {id(centred[0]), id(rstds[0])} <= under and cast.params["dtype"] == x.dtype:
            continue  # the normalized value (times the weight or not) cast back to x's dtype
        if weight is not None and under == {id(weight)} and cast.params["dtype"] == torch.float32:
            continue  # weight.to(torch.float32) (Cohere): the kernels multiply in float32 too
        what = "the weight" if weight is not None and under == {id(weight)} else "a factor"
        raise NoMatch(f"casts {what} to {cast.params['dtype']}")
    affine = _affine(weight, bias)
    used += [rstd_node, *centre_nodes, *var_nodes, *(c for c, _ in casts)]
    return x, _param_refs(x, weight, bias), {"eps": eps, "affine": affine}


def _functional_times_weight(
    graph: Graph,
    factors: list[Value],
    norms: list[Value],
    bias: TensorValue | None,
    casts: list[tuple[Node, list[Value]]],
    used: list[Node],
) -> tuple[TensorValue, tuple[InputRef, ...], dict]:
    """``F.layer_norm(x, (N,), eps=eps) * weight [+ bias]``."""
    weights = [f for f in factors if isinstance(f, TensorValue) and graph.producer(f) is None]
    if len(norms) != 1 or len(weights) != 1 or len(factors) != 2:
        raise NoMatch(f"multiplies layer_norm(x) by {[describe(graph, f) for f in factors]}, not by one weight")
    node = graph.producer(norms[0])
    assert node is not None
    if not (isinstance(node.inputs[1], Const) and isinstance(node.inputs[2], Const)):
        raise NoMatch("scales a layer_norm that already has a weight or a bias")
    if casts:
        raise NoMatch("casts around layer_norm(x) * weight")
    x_in, eps = _ln_parts(node)
    x, upcasts = input_or_upcast(graph, x_in, "layer_norm input")
    if upcasts:
        raise NoMatch("multiplies a float32 layer_norm of x by a weight")
    used += [node]
    affine = _affine(weights[0], bias)
    return x, _param_refs(x, weights[0], bias), {"eps": eps, "affine": affine}


def _centering(graph: Graph, value: Value) -> tuple[TensorValue, list[Node]]:
    """``(x, nodes)`` for ``value = x - x.mean(-1, keepdim=True)`` (x perhaps upcast)."""
    sub = graph.produced_by(value, Kind.SUB)
    if sub is None:
        raise NoMatch(f"{describe(graph, value)} is not x - mean(x)")
    a, m = sub.inputs
    mean = graph.produced_by(m, Kind.MEAN)
    if mean is None:
        raise NoMatch(f"subtracts {describe(graph, m)} from x, not its mean")
    x, casts = input_or_upcast(graph, a, "centred value")
    x_mean, mean_casts = input_or_upcast(graph, mean.inputs[0], "mean's input")
    if x_mean is not x:
        raise NoMatch("subtracts the mean of another tensor")
    if mean.params.get("dtype") is not None:
        raise NoMatch("the mean has a dtype argument")
    if not reduces_last_dim(mean, x.ndim):
        raise NoMatch(f"the mean is over {reduction_dims_text(mean)}, not the last dim with keepdim=True")
    return x, [sub, mean, *casts, *mean_casts]


def _variance(graph: Graph, den: Value, x: TensorValue) -> tuple[float, list[Node]]:
    """``(eps, nodes)`` for ``den = var(x, -1, keepdim=True, unbiased=False) [+ eps]``."""
    used: list[Node] = []
    eps = 0.0
    var: Value = den
    add = graph.produced_by(den, Kind.ADD)
    if add is not None:
        a, b = add.inputs
        var, eps_side = (a, b) if graph.produced_by(a, Kind.VAR, Kind.MEAN) is not None else (b, a)
        found = constant_number(graph, eps_side)
        if found is None:
            raise NoMatch(f"1/sqrt is taken of {describe(graph, a)} + {describe(graph, b)}, not of var(x) + eps")
        eps, const_node = found
        if not finite_non_negative(eps):
            raise NoMatch(f"eps {eps} is not a finite non-negative number")
        used += [add, *([const_node] if const_node else [])]
    node = graph.produced_by(var, Kind.VAR, Kind.MEAN)
    if node is None:
        raise NoMatch(f"1/sqrt is taken of {describe(graph, var)}, not of var(x) + eps")
    if node.kind is Kind.VAR:
        x_var, casts = input_or_upcast(graph, node.inputs[0], "variance's input")
        correction = node.params["correction"]
        if correction != 0:
            raise NoMatch(
                f"the variance is unbiased (correction={correction:g}); layer norm's divides by N "
                f"(unbiased=False or correction=0)"
            )
        used += [node, *casts]
    else:
        if node.params.get("dtype") is not None:
            raise NoMatch("the variance's mean has a dtype argument")
        square = graph.produced_by(node.inputs[0], Kind.SQUARE)
        if square is None or graph.produced_by(square.inputs[0], Kind.SUB) is None:
            raise NoMatch("the variance is not mean((x - mean(x)) ** 2)")
        x_var, centre_nodes = _centering(graph, square.inputs[0])
        used += [node, square, *centre_nodes]
    if x_var is not x:
        raise NoMatch("the variance is of another tensor than the one normalized")
    if not reduces_last_dim(node, x.ndim):
        raise NoMatch(f"the variance is over {reduction_dims_text(node)}, not the last dim with keepdim=True")
    return eps, used


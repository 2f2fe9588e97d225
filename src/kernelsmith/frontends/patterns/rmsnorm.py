"""RMSNorm: ``y = x * rsqrt(mean(x**2, last dim, keepdim) + eps) * weight``, however written.

Recognized (after the capture's normalization, see :mod:`kernelsmith.frontends.capture`):

- ``F.rms_norm(x, (N,), weight, eps)``, ``torch.rms_norm``, and ``torch.nn.RMSNorm`` modules
  (which call ``F.rms_norm``); ``eps=None`` is torch's default, the machine epsilon of the
  computation ("opmath") type: ``finfo(float32).eps`` for float16, bfloat16 and float32 inputs,
  ``finfo(float64).eps`` for float64 (as the ``nn.RMSNorm`` docs say and torch computes; not
  ``finfo(x.dtype).eps``, which for bfloat16 would be 65536 times larger);
- the same without a weight, times a weight: ``F.rms_norm(x, (N,), eps=eps) * weight`` (or an
  ``nn.RMSNorm(N, elementwise_affine=False)`` output times a weight);
- the explicit product of ``x``, ``1/rms`` and ``weight`` in any order and association, where
  ``1/rms`` is ``rsqrt(ms + eps)``, ``1/sqrt(ms + eps)``, ``(ms + eps) ** -0.5``, or a division
  by ``sqrt(ms + eps)`` / ``(ms + eps) ** 0.5``; ``ms`` is ``mean(x*x)``, ``mean(x**2)``,
  ``mean(x.pow(2))``, ``mean(torch.square(x))`` or ``sum(...) / N``, over the last dim with
  keepdim; ``eps`` is a Python number (or ``torch.tensor(number)``) added in either order, or
  absent (an RMSNorm with ``eps = 0.0``, which is what that formula computes);
- the Hugging Face Llama form: ``x`` upcast to float32 before the square (and the product), the
  normalized value cast back to ``x``'s dtype before or after the weight multiply; also Meta's
  Llama form ``self._norm(x.float()).type_as(x) * self.weight`` and the older T5 form that
  squares the upcast but multiplies the raw ``x``;
- the weight upcast to float32 before the multiply (``normed * self.weight.float()``, Gemma 3n,
  Helium and others), with the product cast back to ``x``'s dtype: that is the kernels' own
  float32 math;
- Gemma's RMSNorm, ``(normed * (1.0 + self.weight.float())).type_as(x)`` (also ``1 + weight``
  of a float32 weight, and through ``F.rms_norm(x, (N,), eps=eps)``): the match carries the
  constant ``weight_offset=1.0`` (the kernels add it to the weight in float32, so no ``1 +
  weight`` tensor is allocated per call). The pattern matches it only where the rmsnorm family
  takes that constant (it does), and otherwise refuses it, saying so.

Refused, with a reason: a reduction over another dim or without keepdim (``mean(-1)`` then
``unsqueeze`` is not followed through views, so it is refused too), a weight that does not
broadcast along the last axis alone (``(rows, 1)``), any other cast (of the weight, of
``1/rms``, to another dtype), an output dtype other than ``x``'s, an output shape other than
``x``'s, a missing weight (``nn.RMSNorm(elementwise_affine=False)``: the rmsnorm op needs a
weight, and synthesizing ones would dispatch a kernel that reads a tensor the user never had),
``normalized_shape`` of more than one dim, a 0-d tensor eps from outside the function (its value
could change without the call signature noticing), a weight offset other than 1 (``2 + weight``,
``weight - 1``), ``1 + weight`` added in float16 or bfloat16 (it rounds there; the kernels add in
float32), and anything computed besides the op.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace

import torch

from kernelsmith.frontends.capture import Const, Graph, Kind, Node, TensorValue, Value
from kernelsmith.frontends.recognize import (
    InputRef,
    Match,
    NoMatch,
    constant_number,
    finite_non_negative,
    input_or_upcast,
    input_ref,
    reduces_last_dim,
    require_only,
    single_tensor_output,
)

logger = logging.getLogger(__name__)

OP = "rmsnorm"


def default_eps(dtype: torch.dtype) -> float:
    """torch's eps when ``F.rms_norm`` gets ``eps=None``: the opmath type's machine epsilon."""
    return float(torch.finfo(torch.float64 if dtype == torch.float64 else torch.float32).eps)


def match(graph: Graph) -> Match | None:
    """The RMSNorm match of ``graph``; None when it has no RMSNorm-like part at all."""
    if not any(n.kind is Kind.RMS_NORM or _is_mean_square(graph, n) for n in graph.nodes):
        return None
    out = single_tensor_output(graph)
    node = graph.producer(out)
    assert node is not None  # single_tensor_output checked it
    if node.kind is Kind.RMS_NORM:
        return _functional(graph, node, out)
    if node.kind not in (Kind.MUL, Kind.CAST):
        raise NoMatch(f"the output comes from {node.name} after the normalization")
    return _explicit(graph, out)


def _is_mean_square(graph: Graph, node: Node) -> bool:
    return node.kind is Kind.MEAN and graph.produced_by(node.inputs[0], Kind.SQUARE, Kind.MUL) is not None


def _functional(graph: Graph, node: Node, out: TensorValue) -> Match:
    """``F.rms_norm`` / ``torch.rms_norm`` / ``nn.RMSNorm``."""
    x, eps = _functional_parts(node)
    weight = node.inputs[1]
    if not isinstance(weight, TensorValue):
        raise NoMatch("no weight (elementwise_affine=False): the rmsnorm op needs one")
    if weight.shape != (x.shape[-1],):
        raise NoMatch(f"the weight has shape {weight.shape}, not ({x.shape[-1]},)")
    refs = (input_ref(x, "input x"), input_ref(weight, "weight"))
    _check_output(out, x)
    require_only(graph, [node], OP)
    return Match(OP, refs, {"eps": eps})


def _functional_parts(node: Node) -> tuple[TensorValue, float]:
    """``(x, eps)`` of an ``rms_norm`` call over the last dim of x."""
    x = node.inputs[0]
    if not isinstance(x, TensorValue) or x.ndim < 1:
        raise NoMatch("rms_norm of a 0-d tensor")
    n = x.shape[-1]
    shape = tuple(node.params["normalized_shape"])
    if shape != (n,):
        raise NoMatch(f"normalized_shape {shape} is not the last dim alone ({n},)")
    eps = node.params["eps"]
    if eps is None:
        return x, default_eps(x.dtype)
    number = Const(eps).number
    if number is None or not finite_non_negative(number):
        raise NoMatch(f"eps {eps!r} is not a finite non-negative number")
    return x, number


def _functional_times_weight(
    graph: Graph, out: TensorValue, factors: list[Value], muls: list[Node], casts: list[tuple[Node, list[Value]]]
) -> Match:
    """``F.rms_norm(x, (N,), eps=eps) * weight`` (or ``nn.RMSNorm(N, elementwise_affine=False)``)."""
    norms = [f for f in factors if graph.produced_by(f, Kind.RMS_NORM) is not None]
    offset = _offset_weights(graph, factors)
    weights = [f for f in factors if isinstance(f, TensorValue) and graph.producer(f) is None]
    if offset is not None:
        weights.append(offset.weight)
    if len(norms) != 1 or len(weights) != 1 or len(factors) != 2:
        names = [_describe(graph, f) for f in factors]
        raise NoMatch(f"multiplies rms_norm(x) by {names}, not by one weight")
    node = graph.producer(norms[0])
    assert node is not None
    if isinstance(node.inputs[1], TensorValue):
        raise NoMatch("scales an rms_norm that already has a weight by a second one")
    if casts:
        raise NoMatch("casts around rms_norm(x) * weight")
    x, eps = _functional_parts(node)
    weight = weights[0]
    _check_weight(weight, x)
    refs = (input_ref(x, "input x"), _weight_ref(weight))
    _check_output(out, x)
    require_only(graph, [*muls, node, *(offset.nodes if offset else ())], OP)
    return _served(refs, eps, offset)


@dataclass(frozen=True)
class _OffsetWeight:
    """A factor ``1 + weight`` (``factor``): the weight (perhaps upcast), the 1, and the nodes."""

    factor: Value
    weight: TensorValue
    offset: float
    nodes: tuple[Node, ...]


def _offset_weights(graph: Graph, factors: list[Value]) -> _OffsetWeight | None:
    """The one factor of the form ``c + weight`` (Gemma's ``1.0 + self.weight.float()``), if any.

    An addition of two tensors, or of a computed value, is not a weight offset: it is left to
    the caller, which refuses it as a factor that is not x, 1/rms or the weight.
    """
    found = []
    for factor in factors:
        add = graph.produced_by(factor, Kind.ADD)
        if add is None:
            continue
        a, b = add.inputs
        constant, tensor_side = (constant_number(graph, a), b)
        if constant is None:
            constant, tensor_side = (constant_number(graph, b), a)
        if constant is None:
            continue
        offset, const_node = constant
        weight, casts = input_or_upcast(graph, tensor_side, "weight")
        if offset != 1.0:
            raise NoMatch(f"multiplies by {offset:g} + weight: only Gemma's 1 + weight is recognized")
        assert isinstance(factor, TensorValue)
        if factor.dtype in (torch.float16, torch.bfloat16):
            raise NoMatch(
                f"adds 1 to the weight in {factor.dtype}, where 1 + weight rounds; the kernels add it in "
                f"float32 (1.0 + weight.float())"
            )
        nodes = (add, *casts, *([const_node] if const_node else []))
        found.append(_OffsetWeight(factor, weight, offset, nodes))
    if len(found) > 1:
        raise NoMatch("the product has more than one factor of the form 1 + weight")
    return found[0] if found else None


def _served(refs: tuple[InputRef, InputRef], eps: float, offset: _OffsetWeight | None) -> Match:
    """The match, with Gemma's weight offset as a constant where there is one, if the rmsnorm
    family serves that constant (until it does, the pattern says so instead of matching)."""
    if offset is None:
        return Match(OP, refs, {"eps": eps})
    missing = _weight_offset_unsupported()
    if missing:
        raise NoMatch(
            f"x * (1 + weight) (Gemma's RMSNorm) is recognized, but the rmsnorm family cannot serve it yet: "
            f"it has no weight_offset constant ({missing})"
        )
    return Match(OP, refs, {"eps": eps, "weight_offset": offset.offset})


def _weight_offset_unsupported() -> str | None:
    """None when the rmsnorm family takes ``weight_offset=1.0``, else its refusal."""
    from kernelsmith.ops import UnsupportedWorkload, get_op

    try:
        get_op(OP).spec((1, 8), "float32", eps=0.0, weight_offset=1.0)
    except (UnsupportedWorkload, TypeError) as exc:
        return str(exc)
    return None


def _weight_ref(weight: TensorValue) -> InputRef:
    """The op's 1-D weight: a ``(1, ..., N)`` weight is bound reshaped to ``(N,)``."""
    ref = input_ref(weight, "weight")
    return replace(ref, reshape=(weight.shape[-1],)) if weight.ndim != 1 else ref


def _flatten(graph: Graph, value: Value, muls: list[Node], casts: list[tuple[Node, list[Value]]]) -> list[Value]:
    """The factors of a product tree (through MUL and CAST nodes), recording both kinds."""
    node = graph.produced_by(value, Kind.MUL, Kind.CAST)
    if node is None:
        return [value]
    if node.kind is Kind.CAST:
        leaves = _flatten(graph, node.inputs[0], muls, casts)
        casts.append((node, leaves))
        return leaves
    muls.append(node)
    return _flatten(graph, node.inputs[0], muls, casts) + _flatten(graph, node.inputs[1], muls, casts)


def _upcast_source(graph: Graph, value: Value) -> tuple[TensorValue, list[Node]]:
    """``x`` for ``x`` or ``x.float()``: the tensor squared, and the float32 cast if any."""
    cast = graph.produced_by(value, Kind.CAST)
    if cast is not None:
        if cast.params["dtype"] != torch.float32:
            raise NoMatch(f"x is cast to {cast.params['dtype']} before the square; only float32 is allowed")
        inner = cast.inputs[0]
        if isinstance(inner, TensorValue) and graph.producer(inner) is None:
            return inner, [cast]
        raise NoMatch("the squared value is not an input tensor or its float32 upcast")
    if isinstance(value, TensorValue) and graph.producer(value) is None:
        return value, []
    raise NoMatch(f"squares the output of {_describe(graph, value)}, not an input tensor")


def _mean_square(graph: Graph, den: Value) -> tuple[TensorValue, float, list[Node]]:
    """``(x, eps, nodes)`` for ``den = mean(x*x, -1, keepdim=True) [+ eps]``."""
    used: list[Node] = []
    eps = 0.0
    ms: Value = den
    add = graph.produced_by(den, Kind.ADD)
    if add is not None:
        a, b = add.inputs
        if graph.produced_by(a, Kind.MEAN) is not None:
            mean_side, eps_side = a, b
        elif graph.produced_by(b, Kind.MEAN) is not None:
            mean_side, eps_side = b, a
        else:
            raise NoMatch(
                f"1/rms is taken of {_describe(graph, a)} + {_describe(graph, b)}, "
                f"not of mean(x*x, -1, keepdim=True) + eps"
            )
        found = constant_number(graph, eps_side)
        if found is None:
            what = eps_side.describe() if isinstance(eps_side, TensorValue) else repr(eps_side)
            raise NoMatch(f"eps is {what}, not a Python number")
        eps, const_node = found
        if not finite_non_negative(eps):
            raise NoMatch(f"eps {eps} is not a finite non-negative number")
        used += [add, *([const_node] if const_node else [])]
        ms = mean_side
    mean = graph.produced_by(ms, Kind.MEAN)
    if mean is None:
        raise NoMatch(f"1/rms is taken of {_describe(graph, ms)}, not of mean(x*x, -1, keepdim=True) + eps")
    if mean.params.get("dtype") is not None:
        raise NoMatch("the mean has a dtype argument")
    sq_in = mean.inputs[0]
    assert isinstance(sq_in, TensorValue)
    if not reduces_last_dim(mean, sq_in.ndim):
        raise NoMatch(
            f"the mean is over dims {mean.params['dims']} with keepdim={mean.params['keepdim']}, "
            f"not the last dim with keepdim=True"
        )
    square = graph.produced_by(sq_in, Kind.SQUARE, Kind.MUL)
    if square is None:
        raise NoMatch("the mean is not of a square")
    sources = [_upcast_source(graph, v) for v in square.inputs]
    if len({id(x) for x, _ in sources}) != 1:
        raise NoMatch("multiplies two different tensors where x*x is expected")
    x = sources[0][0]
    used += [mean, square, *(n for _, casts in sources for n in casts)]
    return x, eps, used


def _explicit(graph: Graph, out: TensorValue) -> Match:
    muls: list[Node] = []
    casts: list[tuple[Node, list[Value]]] = []
    factors = _flatten(graph, out, muls, casts)
    rstds = [f for f in factors if graph.produced_by(f, Kind.RSQRT) is not None]
    if not rstds and any(graph.produced_by(f, Kind.RMS_NORM) is not None for f in factors):
        return _functional_times_weight(graph, out, factors, muls, casts)
    if len(rstds) != 1:
        raise NoMatch(f"the product has {len(rstds)} factors of the form 1/sqrt(...), not one")
    rstd_node = graph.producer(rstds[0])
    assert rstd_node is not None
    x, eps, used = _mean_square(graph, rstd_node.inputs[0])
    offset = _offset_weights(graph, factors)
    tensors = [f for f in factors if isinstance(f, TensorValue) and graph.producer(f) is None]
    known = [*rstds, *tensors, *([offset.factor] if offset is not None else [])]
    others = [f for f in factors if not any(f is g for g in known)]
    if offset is not None:
        tensors.append(offset.weight)
        used += offset.nodes
    if others:
        names = [_describe(graph, f) for f in others]
        raise NoMatch(f"the product has factors other than x, 1/rms and the weight: {names}")
    if not any(t is x for t in tensors):
        raise NoMatch("the value normalized is not the one whose mean square is taken")
    weights = [t for t in tensors if t is not x]
    if len(weights) != 1 or len(tensors) != 2:
        raise NoMatch("no weight multiply" if not weights else "more than one tensor multiplies x")
    weight = weights[0]
    x_ref = input_ref(x, "input x")
    if x.ndim < 1:
        raise NoMatch("x is 0-d")
    _check_weight(weight, x)
    w_ref = _weight_ref(weight)
    weight_factor = offset.factor if offset is not None else weight
    for cast, leaves in casts:
        target = cast.params["dtype"]
        under = {id(v) for v in leaves}
        if under == {id(x)}:
            if target != torch.float32:
                raise NoMatch(f"x is cast to {target}; only an upcast to float32 is allowed")
        elif {id(x), id(rstds[0])} <= under and target == x.dtype:
            pass  # the normalized value (times the weight or not) cast back to x's dtype
        elif under == {id(weight_factor)} and target == torch.float32:
            pass  # weight.float(): the kernels load the weight and multiply in float32 too
        elif {id(x), id(rstds[0])} <= under:
            raise NoMatch(f"casts the normalized value to {target}, not back to x's {x.dtype}")
        else:
            raise NoMatch(f"casts {'the weight' if under == {id(weight)} else 'a factor'} to {target}")
    _check_output(out, x)
    require_only(graph, [*muls, *(c for c, _ in casts), rstd_node, *used], OP)
    return _served((x_ref, w_ref), eps, offset)


def _describe(graph: Graph, value: Value) -> str:
    node = graph.producer(value)
    if node is not None:
        return node.name
    return value.describe() if isinstance(value, TensorValue) else repr(getattr(value, "value", value))


def _check_weight(weight: TensorValue, x: TensorValue) -> None:
    """The weight must scale columns only: shape (N,), or (1, ..., 1, N) of no more dims than x."""
    n = x.shape[-1]
    shape = weight.shape
    lead = shape[:-1]
    if not shape or shape[-1] != n or any(s != 1 for s in lead) or len(shape) > x.ndim:
        raise NoMatch(
            f"the weight has shape {shape}: it does not scale the last axis (N={n}) alone "
            f"(a weight of the op is (N,), or (1, ..., N))"
        )


def _check_output(out: TensorValue, x: TensorValue) -> None:
    if out.dtype != x.dtype:
        raise NoMatch(f"the output is {out.dtype}, but x is {x.dtype}")
    if out.shape != x.shape:
        raise NoMatch(f"the output has shape {out.shape}, but x has {x.shape}")

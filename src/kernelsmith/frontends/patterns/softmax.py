"""Softmax over the last dim: ``exp(x - max(x)) / sum(exp(x - max(x)))``, however written.

Recognized (after the capture's normalization, see :mod:`kernelsmith.frontends.capture`):

- ``torch.softmax(x, -1)``, ``F.softmax(x, dim=-1)``, ``x.softmax(-1)``,
  ``torch.special.softmax``, ``torch.nn.Softmax(dim=-1)`` modules (which call ``F.softmax``);
  the dim may be written ``-1`` or ``x.ndim - 1`` (``dim=None`` is torch's legacy implicit
  choice, recognized only where that choice is the last dim, as for a 1-D ``x``);
- the explicit ``e = torch.exp(x - m); e / e.sum(-1, keepdim=True)`` with ``m`` being
  ``x.amax(-1, keepdim=True)``, ``x.max(-1, keepdim=True).values`` or ``[0]``, or
  ``torch.max(x, dim=-1, keepdim=True)[0]``; ``e * (1 / s)`` counts as ``e / s``;
- the same without the max subtraction, ``exp(x) / sum(exp(x))``: it is mathematically the
  same function (softmax is shift invariant), and the kernels subtract the max anyway, so they
  only overflow less than the user's code;
- a float32 computation cast back to ``x``'s dtype: ``softmax(x.float(), -1).to(x.dtype)`` or
  ``F.softmax(x, -1, dtype=torch.float32).to(x.dtype)`` (Hugging Face attention), or the
  explicit form on ``x.float()``: the kernels compute in float32 and round once, like these.

Refused, with a reason: any other dim (``dim=0``, ``dim=1`` of a 3-D ``x``), reductions without
keepdim, ``log_softmax``, an output dtype other than ``x``'s (``softmax(x, -1,
dtype=torch.float32)`` of a bfloat16 ``x`` returns float32: a different function), a
computation in a lower precision than ``x`` then cast back, the max's indices, and anything
computed besides the op (``softmax(x) * 2``). A temperature (``softmax(x / t, -1)``,
``softmax(x * s, -1)`` for a Python number ``t`` or ``s``, also on ``x.float()``) matches with the
softmax family's ``scale`` constant (``1 / t``; the kernels scale in float32), where the family
takes it (it does; otherwise the pattern refuses it by name); under ``torch.compile`` the
backend's site then takes the scaling in too. A temperature inside the explicit form, ``exp(x / t
- max(x / t))``, is refused.
"""

from __future__ import annotations

import logging
import math

import torch

from kernelsmith.frontends.capture import Graph, Kind, Node, TensorValue, Value
from kernelsmith.frontends.recognize import (
    Match,
    NoMatch,
    constant_number,
    input_ref,
    reduces_last_dim,
    require_only,
    single_tensor_output,
)

logger = logging.getLogger(__name__)

OP = "softmax"


def match(graph: Graph) -> Match | None:
    """The softmax match of ``graph``; None when it has nothing softmax-like at all."""
    if not any(n.kind in (Kind.SOFTMAX, Kind.LOG_SOFTMAX, Kind.EXP) for n in graph.nodes):
        return None
    out = single_tensor_output(graph)
    used: list[Node] = []
    node = graph.producer(out)
    assert node is not None  # single_tensor_output checked it
    if node.kind is Kind.CAST:  # a float32 softmax cast back to x's dtype (checked below)
        used.append(node)
        inner = graph.producer(node.inputs[0])
        if inner is None:
            raise NoMatch("the output is a cast of an input, not a softmax")
        node = inner
    if node.kind is Kind.LOG_SOFTMAX:
        raise NoMatch("log_softmax is not softmax")
    scale: float | None = None
    if node.kind is Kind.SOFTMAX:
        value = node.inputs[0]
        temperature = _temperature(graph, graph.producer(value))
        if temperature is not None:  # softmax(x / t): the scale 1 / t, a constant of the family
            scale, scale_node, value = temperature
            used.append(scale_node)
        x, casts = _source(graph, value)
        if node.params["dim"] != x.ndim - 1:
            raise NoMatch(f"softmax over dim {node.params['dim']} of a {x.ndim}-D tensor, not the last dim")
        used += [node, *casts]
    elif node.kind is Kind.DIV:
        x, nodes = _explicit(graph, node)
        used += nodes
    else:
        raise NoMatch(f"the output comes from {node.name} after the softmax")
    computed = node.out.dtype  # the precision the softmax itself ran in
    if computed != x.dtype and not (computed == torch.float32 and x.dtype in (torch.float16, torch.bfloat16)):
        raise NoMatch(f"the softmax is computed in {computed}, less precise than x's {x.dtype}")
    if out.dtype != x.dtype:
        raise NoMatch(f"the output is {out.dtype}, but x is {x.dtype}")
    if out.shape != x.shape:
        raise NoMatch(f"the output has shape {out.shape}, but x has {x.shape}")
    x_ref = input_ref(x, "input x")
    require_only(graph, used, OP)
    if scale is None:
        return Match(OP, (x_ref,), {"dim": -1})
    missing = _scale_unsupported()
    if missing:
        raise NoMatch(
            f"softmax of x scaled by a constant ({scale:g}, a temperature): the softmax family has no scale "
            f"constant to fold it into the kernel yet ({missing})"
        )
    return Match(OP, (x_ref,), {"dim": -1, "scale": scale})


def _scale_unsupported() -> str | None:
    """None when the softmax family takes a ``scale`` constant, else its refusal."""
    from kernelsmith.ops import UnsupportedWorkload, get_op

    try:
        get_op(OP).spec((1, 8), "float32", dim=-1, scale=0.5)
    except (UnsupportedWorkload, TypeError) as exc:
        return str(exc)
    return None


def _source(graph: Graph, value: Value) -> tuple[TensorValue, list[Node]]:
    """``x`` for ``x`` or ``x.float()`` (an input tensor, perhaps upcast to float32)."""
    cast = graph.produced_by(value, Kind.CAST)
    if cast is not None:
        if cast.params["dtype"] != torch.float32:
            raise NoMatch(f"x is cast to {cast.params['dtype']}; only an upcast to float32 is allowed")
        value = cast.inputs[0]
    if not isinstance(value, TensorValue) or graph.producer(value) is not None:
        node = graph.producer(value)
        if _temperature(graph, node) is not None:  # inside exp(x / t - max(x / t)): not followed
            raise NoMatch("the explicit softmax of x scaled by a constant (a temperature) is not recognized")
        what = node.name if node is not None else repr(getattr(value, "value", value))
        raise NoMatch(f"the softmax input is computed by {what}, not an input tensor")
    return value, [cast] if cast is not None else []


def _temperature(graph: Graph, node: Node | None) -> tuple[float, Node, Value] | None:
    """``(scale, node, x)`` for ``x / t`` (scale ``1 / t``) or ``x * s`` with a finite non-zero
    constant ``t`` or ``s`` (a temperature); None for anything else. The family's kernels would
    multiply by the scale in float32; scaling ``x`` into a new tensor before them would allocate
    and read it on every call."""
    if node is None or node.kind not in (Kind.DIV, Kind.MUL):
        return None
    numbers = [constant_number(graph, v) for v in node.inputs]
    if node.kind is Kind.DIV and numbers[1] is not None and numbers[0] is None:
        divisor, scaled = numbers[1][0], node.inputs[0]
        scale = 1.0 / divisor if divisor != 0.0 else math.inf
    elif node.kind is Kind.MUL and (numbers[0] is None) != (numbers[1] is None):
        scale = next(n for n in numbers if n is not None)[0]
        scaled = node.inputs[0] if numbers[0] is None else node.inputs[1]
    else:
        return None
    if any(n is not None and n[1] is not None for n in numbers):
        return None  # torch.tensor(t) made in the function: a computation the op would not cover
    if not math.isfinite(scale) or scale == 0.0:
        raise NoMatch(f"softmax of x scaled by {scale:g}: not a finite non-zero temperature")
    return scale, node, scaled


def _explicit(graph: Graph, div: Node) -> tuple[TensorValue, list[Node]]:
    """``(x, nodes)`` for ``div = e / e.sum(-1, keepdim=True)`` with ``e = exp(x [- max])``."""
    e, s = div.inputs
    exp = graph.produced_by(e, Kind.EXP)
    if exp is None:
        raise NoMatch("divides something other than exp(...) by its sum")
    total = graph.produced_by(s, Kind.SUM)
    if total is None or total.inputs[0] is not e:
        raise NoMatch("does not divide exp(...) by its own sum")
    if total.params.get("dtype") is not None:
        raise NoMatch("the sum has a dtype argument")
    assert isinstance(e, TensorValue)
    if not reduces_last_dim(total, e.ndim):
        raise NoMatch(
            f"the sum is over dims {total.params['dims']} with keepdim={total.params['keepdim']}, "
            f"not the last dim with keepdim=True"
        )
    used = [div, exp, total]
    shifted = exp.inputs[0]
    sub = graph.produced_by(shifted, Kind.SUB)
    if sub is None:
        # exp(x) / sum(exp(x)): softmax without the max subtraction, the same function.
        x, casts = _source(graph, shifted)
        return x, used + casts
    xs, m = sub.inputs
    x, casts = _source(graph, xs)
    mx = graph.produced_by(m, Kind.MAX)
    if mx is None:
        raise NoMatch("subtracts something other than the row max before exp")
    assert isinstance(m, TensorValue)
    if getattr(m.source, "item", None) not in (None, 0):
        raise NoMatch("subtracts the max's indices, not its values")
    x_max, max_casts = _source(graph, mx.inputs[0])
    if x_max is not x:
        raise NoMatch("subtracts the max of another tensor")
    if not reduces_last_dim(mx, x.ndim):
        raise NoMatch(
            f"the max is over dims {mx.params['dims']} with keepdim={mx.params['keepdim']}, "
            f"not the last dim with keepdim=True"
        )
    return x, [*used, sub, mx, *casts, *max_casts]

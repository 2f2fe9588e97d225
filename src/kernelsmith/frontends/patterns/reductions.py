"""Row reductions over the last dim without keepdim: ``sum``, ``mean`` and ``max`` (``amax``).

Recognized (after the capture's normalization, see :mod:`kernelsmith.frontends.capture`):

- ``x.sum(-1)``, ``torch.sum(x, dim=-1)``, ``x.sum(dim=(-1,))`` (``sum``); ``x.mean(-1)``,
  ``torch.mean``, ``x.sum(-1) / x.shape[-1]`` (``mean``); ``x.amax(-1)``, ``torch.amax``,
  ``x.max(-1).values``, ``x.max(dim=-1)[0]``, ``torch.max(x, -1).values`` (``max``); the dim
  written ``-1`` or ``x.ndim - 1``, ``keepdim=False``; for a 1-D ``x`` also the reduction of
  every dim (``x.sum()``), which is the same function;
- the float32 computation cast back to x's dtype: ``x.float().sum(-1).to(x.dtype)`` or
  ``x.sum(-1, dtype=torch.float32).to(x.dtype)`` (what the kernels compute: float32, rounded once);
  a ``dtype=`` argument equal to x's own dtype.

The match's constants are ``{"dim": -1}``.

Refused, with a reason: ``keepdim=True`` (the op families return the rows' results without the
reduced dim), another dim, several dims, a ``dtype=`` argument that changes the output dtype (or
an upcast without the cast back), the max's indices, a reduction of a computed value, and
anything computed besides the reduction.
"""

from __future__ import annotations

import logging

import torch

from kernelsmith.frontends.capture import Graph, Kind, Node
from kernelsmith.frontends.recognize import (
    Match,
    NoMatch,
    input_or_upcast,
    input_ref,
    reduction_dims_text,
    require_only,
    single_tensor_output,
)

logger = logging.getLogger(__name__)

_OPS = {Kind.SUM: "sum", Kind.MEAN: "mean", Kind.MAX: "max"}


def match_sum(graph: Graph) -> Match | None:
    """The ``sum`` match of ``graph``; None when its output is not a sum."""
    return _match_for(graph, Kind.SUM)


def match_mean(graph: Graph) -> Match | None:
    """The ``mean`` match of ``graph``; None when its output is not a mean."""
    return _match_for(graph, Kind.MEAN)


def match_max(graph: Graph) -> Match | None:
    """The ``max`` match of ``graph``; None when its output is not a max."""
    return _match_for(graph, Kind.MAX)


def _match_for(graph: Graph, kind: Kind) -> Match | None:
    out = graph.output_value
    node = graph.producer(out)
    casts: list[Node] = []
    if node is not None and node.kind is Kind.CAST:  # a float32 reduction cast back (checked below)
        casts.append(node)
        node = graph.producer(node.inputs[0])
    if node is None or node.kind is not kind:
        return None
    op = _OPS[kind]
    out = single_tensor_output(graph)
    reduced = casts[0].inputs[0] if casts else out
    if getattr(getattr(reduced, "source", None), "item", None) not in (None, 0):
        raise NoMatch("returns the max's indices (argmax), not its values")
    x, upcasts = input_or_upcast(graph, node.inputs[0], f"{op}'s input")
    dims, keepdim, dtype = node.params["dims"], node.params["keepdim"], node.params.get("dtype")
    if dims is None and x.ndim != 1:
        raise NoMatch(f"reduces every dim of a {x.ndim}-D tensor, not the last dim alone")
    if dims is not None and len(dims) != 1:
        raise NoMatch(f"reduces several dims {dims}, not the last dim alone")
    if dims is not None and dims != (x.ndim - 1,):
        raise NoMatch(f"reduces {reduction_dims_text(node)}, not the last dim ({x.ndim - 1})")
    if keepdim:
        raise NoMatch(f"keepdim=True: the {op} op returns the rows' results without the reduced dim")
    computed = node.out.dtype
    if dtype is not None and dtype != x.dtype and not (dtype == torch.float32 and casts):
        raise NoMatch(f"the dtype={dtype} argument makes the output {dtype}, not x's {x.dtype}")
    if casts and computed != torch.float32:
        raise NoMatch(f"the {op} is computed in {computed} and cast; only a float32 computation cast back is allowed")
    if out.dtype != x.dtype:
        raise NoMatch(f"the output is {out.dtype}, but x is {x.dtype}")
    if out.shape != x.shape[:-1]:
        raise NoMatch(f"the output has shape {out.shape}, not {x.shape[:-1]}")
    ref = input_ref(x, "input x")
    require_only(graph, [node, *casts, *upcasts], op)
    return Match(op, (ref,), {"dim": -1})

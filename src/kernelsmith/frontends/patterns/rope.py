"""Rotary position embedding (``rope``) as Hugging Face writes it: ``apply_rotary_pos_emb``.

Recognized (after the capture's normalization, see :mod:`kernelsmith.frontends.capture`): a
function of ``(q, k, cos, sin)`` that returns the tuple ``(q_embed, k_embed)`` (either order) with

- ``cos = cos.unsqueeze(d)``, ``sin = sin.unsqueeze(d)`` broadcasting over the heads,
- ``x_embed = (x * cos) + (rotate_half(x) * sin)`` for ``x`` in ``q``, ``k``, the products and the
  sum in any order, where ``rotate_half(x) = torch.cat((-x[..., R/2:], x[..., :R/2]), dim=-1)``:
  the rope family's ``style="half"`` (Llama, Mistral, Qwen, Gemma and most decoders);

``unsqueeze_dim=1`` (the default, ``(B, H, S, D)`` tensors) is the family's ``layout="bhsd"``;
``unsqueeze_dim=2`` (``(B, S, H, D)`` tensors, as after the projection's view) is ``"bshd"``.
The caches are bound as the function receives them, ``(B, S, D)`` or ``(S, D)``; the family's
``spec_for`` says which shapes and strides its kernels take. The match's ``returns`` is
``(0, 1)`` (or ``(1, 0)``): the function's tuple is the op's ``(q_out, k_out)``.

The caches are bound by the role they play, not by their names (``x * sin + rotate_half(x) *
cos`` binds the argument named ``sin`` as the op's ``cos``).

Refused, with a reason: one tensor rotated alone (the op rotates q and k together), a rotation
that is not ``rotate_half`` (the interleaved ``rotate_every_two`` of GPT-J is not recognized in
this form yet), halves that are not the two halves of the rotated channels, a cache that does
not broadcast over the heads alone (an unsqueeze on another dim), q and k rotated by different
caches, casts (``q.float()``: the family computes in float32 and rounds once,
another rounding than the user's), and anything computed besides the op.

Partial rotary as GPT-NeoX, Phi and GLM write it is recognized too: ``x_rot, x_pass =
x[..., :R], x[..., R:]``, the rotation of ``x_rot`` by ``(.., R)`` caches, then
``torch.cat([x_embed, x_pass], dim=-1)`` (the family's ``R < D``, which reads ``R`` from the
caches; with ``R = D`` the pass-through slice is empty and it is plain rope).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from kernelsmith.frontends.capture import Const, Graph, Kind, Node, TensorValue, Value
from kernelsmith.frontends.recognize import (
    Match,
    NoMatch,
    describe,
    input_ref,
    require_only,
    tuple_output,
    whole_of,
)

logger = logging.getLogger(__name__)

OP = "rope"

_UNSQUEEZE = {"torch.Tensor.unsqueeze", "torch.unsqueeze"}
_NEG = {"torch.Tensor.neg", "torch.neg", "torch.Tensor.negative", "torch.negative"}
_CAT = {"torch.cat", "torch.concat", "torch.concatenate"}
_GETITEM = "torch.Tensor.__getitem__"


@dataclass(frozen=True)
class _Rotation:
    """``x * cos + rotate_half(x) * sin``: the tensor rotated, the caches as passed, the layout."""

    x: TensorValue
    cos: TensorValue
    sin: TensorValue
    layout: str
    nodes: tuple[Node, ...]


def match(graph: Graph) -> Match | None:
    """The rope match of ``graph``; None when nothing in it looks like a rotate_half."""
    if not any(n.kind is Kind.OTHER and n.name in _CAT for n in graph.nodes) or not any(
        n.kind is Kind.SLICE for n in graph.nodes
    ):
        return None
    if graph.output_values is None:
        out = graph.output_value
        if out is not None and graph.produced_by(out, Kind.ADD) is not None:
            _rotation(graph, out)  # a rotation that is otherwise right says why it is refused next
            raise NoMatch("rotates one tensor; the rope op rotates q and k together and returns both")
        return None
    values = tuple_output(graph)
    if len(values) != 2 or any(v is None for v in values):
        raise NoMatch(f"returns {len(values)} values; apply_rotary_pos_emb returns (q_embed, k_embed)")
    first, second = (_rotation(graph, v) for v in values)  # type: ignore[arg-type]
    if first.cos is not second.cos or first.sin is not second.sin:
        raise NoMatch("rotates q and k by different cos / sin caches")
    if first.layout != second.layout:
        raise NoMatch("q and k broadcast the caches over different dims")
    if first.x is second.x:
        raise NoMatch("rotates the same tensor twice")
    # q is the tensor with more heads (grouped-query attention: k's heads divide q's); with as
    # many heads, the first element of the tuple is q, as apply_rotary_pos_emb returns them.
    head_dim = 1 if first.layout == "bhsd" else 2
    q_first = first.x.shape[head_dim] >= second.x.shape[head_dim]
    q, k = (first, second) if q_first else (second, first)
    refs = (input_ref(q.x, "q"), input_ref(k.x, "k"), input_ref(q.cos, "cos"), input_ref(q.sin, "sin"))
    require_only(graph, [*first.nodes, *second.nodes], OP)
    return Match(OP, refs, {"layout": first.layout, "style": "half"}, returns=(0, 1) if q_first else (1, 0))


def _rotation(graph: Graph, value: Value) -> _Rotation:
    """The parts of ``value = x * cos + rotate_half(x) * sin``, or of its partial form
    ``cat([rotated(x[..., :R]), x[..., R:]], -1)``; NoMatch saying what differs."""
    partial = _partial(graph, value)
    if partial is None:
        return _full_rotation(graph, value, None)
    rotated, x, nodes = partial
    inner = _full_rotation(graph, rotated, nodes[1])  # nodes[1]: the slice x[..., :R]
    return _Rotation(x, inner.cos, inner.sin, inner.layout, (*inner.nodes, *nodes))


def _partial(graph: Graph, value: Value) -> tuple[Value, TensorValue, tuple[Node, ...]] | None:
    """``(rotated, x, (cat, rot slice, pass slice))`` for GPT-NeoX's partial rotary ending,
    ``torch.cat([rotated, x[..., R:]], dim=-1)`` with ``rotated`` computed from ``x[..., :R]``
    (``R`` may be the whole head dim: the pass-through slice is then empty); None otherwise."""
    cat = graph.producer(value)
    if cat is None or cat.kind is not Kind.OTHER or cat.name not in _CAT or len(cat.inputs) != 2:
        return None
    rotated, passed = cat.inputs
    assert isinstance(value, TensorValue)
    if _cat_dim(cat, value) != value.ndim - 1:
        return None
    tail = graph.produced_by(passed, Kind.SLICE)
    x = tail.inputs[0] if tail is not None else None
    if tail is None or not isinstance(x, TensorValue) or graph.producer(x) is not None:
        return None
    rotary = tail.params["start"]
    head = next((n for n in graph.nodes if n is not tail and n.inputs and n.inputs[0] is x
                 and _first_channels(n, x, rotary)), None)  # fmt: skip
    if tail.params["dim"] % x.ndim != x.ndim - 1 or tail.params["stop"] < x.shape[-1] or head is None:
        raise NoMatch("the channels passed through are not x[..., R:] after a rotation of x[..., :R]")
    return rotated, x, (cat, head, tail)


def _first_channels(node: Node, x: TensorValue, rotary: int) -> bool:
    """Whether ``node`` is ``x[..., :rotary]``: a slice of the last dim, or with ``rotary`` the
    whole dim an index that keeps every element (which the capture leaves unnormalized)."""
    if node.kind is Kind.SLICE:
        return (node.params["dim"] % x.ndim, node.params["start"], node.params["stop"]) == (x.ndim - 1, 0, rotary)
    return rotary == x.shape[-1] and node.kind is Kind.OTHER and node.name == _GETITEM and whole_of(node) is x


def _cat_dim(cat: Node, value: TensorValue) -> int | None:
    """The dim a cat node concatenates on, made non-negative; None when it cannot be read."""
    args, kwargs = cat.params.get("args", ()), cat.params.get("kwargs", {})
    dim = kwargs.get("dim", args[1] if len(args) > 1 else Const(0))
    number = dim.value if isinstance(dim, Const) else None
    return number % value.ndim if isinstance(number, int) else None


def _full_rotation(graph: Graph, value: Value, sliced: Node | None) -> _Rotation:
    """The parts of ``value = x * cos + rotate_half(x) * sin``; ``x`` is an input tensor, or,
    in the partial form, the output of the slice node ``sliced``."""
    add = graph.produced_by(value, Kind.ADD)
    if add is None:
        raise NoMatch(f"an output comes from {describe(graph, value)}, not from x * cos + rotate_half(x) * sin")
    terms = [graph.produced_by(v, Kind.MUL) for v in add.inputs]
    if any(t is None for t in terms):
        raise NoMatch("adds something other than two products (x * cos + rotate_half(x) * sin)")
    rotated = [t for t in terms if t is not None and any(_rotate_half(graph, v) is not None for v in t.inputs)]
    if len(rotated) != 1:
        raise NoMatch("the sum does not have exactly one rotate_half(x) * sin term")
    plain_term = next(t for t in terms if t is not rotated[0])
    rot_term = rotated[0]
    assert plain_term is not None
    half = next(r for v in rot_term.inputs if (r := _rotate_half(graph, v)) is not None)
    x_rot, rot_nodes = half
    sin_side = next(v for v in rot_term.inputs if graph.producer(v) is not rot_nodes[0])
    x_side = [v for v in plain_term.inputs if isinstance(v, TensorValue)
              and (graph.producer(v) is None if sliced is None else graph.producer(v) is sliced)]  # fmt: skip
    if len(x_side) != 1:
        raise NoMatch(f"multiplies {[describe(graph, v) for v in plain_term.inputs]}: not x times the cos cache")
    x = x_side[0]
    if x is not x_rot:
        raise NoMatch("rotates one tensor and multiplies another by cos")
    cos_side = next(v for v in plain_term.inputs if v is not x)
    cos, cos_pos, cos_node = _unsqueezed(graph, cos_side, "cos")
    sin, sin_pos, sin_node = _unsqueezed(graph, sin_side, "sin")
    if cos_pos != sin_pos:
        raise NoMatch("cos and sin are unsqueezed on different dims")
    if x.ndim != 4:
        raise NoMatch(f"rotates a {x.ndim}-D tensor; the rope op takes 4-D q and k")
    layout = {1: "bhsd", 2: "bshd"}.get(cos_pos)
    if layout is None:
        raise NoMatch(f"the caches broadcast over dim {cos_pos} of x, not over its heads (dim 1 or 2)")
    return _Rotation(x, cos, sin, layout, (add, plain_term, rot_term, *rot_nodes, cos_node, sin_node))


def _rotate_half(graph: Graph, value: Value) -> tuple[TensorValue, tuple[Node, ...]] | None:
    """``(x, nodes)`` for ``value = cat((-x[..., h:], x[..., :h]), -1)`` over the last dim, the cat
    node first; None when ``value`` is no cat at all, NoMatch when it is another rotation."""
    cat = graph.producer(value)
    if cat is None or cat.kind is not Kind.OTHER or cat.name not in _CAT:
        return None
    assert isinstance(value, TensorValue)
    if _cat_dim(cat, value) != value.ndim - 1:
        raise NoMatch("the halves are not concatenated on the last dim, as rotate_half does")
    if len(cat.inputs) != 2:
        raise NoMatch(f"concatenates {len(cat.inputs)} tensors; rotate_half concatenates two halves")
    negated, first = cat.inputs
    neg = graph.producer(negated)
    if neg is None or neg.kind is not Kind.OTHER or neg.name not in _NEG:
        raise NoMatch("the first half of the rotation is not negated (rotate_half is cat(-x2, x1))")
    low, high = graph.produced_by(first, Kind.SLICE), graph.produced_by(neg.inputs[0], Kind.SLICE)
    if low is None or high is None:
        raise NoMatch("the rotated halves are not slices of x")
    x = low.inputs[0]
    if not isinstance(x, TensorValue) or high.inputs[0] is not x:
        raise NoMatch("the two halves are slices of different tensors")
    width = x.shape[-1]
    last = x.ndim - 1
    if (low.params["dim"] % x.ndim, low.params["start"], low.params["stop"]) != (last, 0, width // 2) or (
        high.params["dim"] % x.ndim, high.params["start"], high.params["stop"]
    ) != (last, width // 2, width) or width % 2:
        raise NoMatch(
            "the halves are not x[..., :D/2] and x[..., D/2:] (rotate_half); partial rotary written with slices "
            "is not recognized yet"
        )
    return x, (cat, neg, low, high)


def _unsqueezed(graph: Graph, value: Value, role: str) -> tuple[TensorValue, int, Node]:
    """``(cache, the dim it broadcasts over in a 4-D x, node)`` for ``value = cache.unsqueeze(d)``."""
    node = graph.producer(value)
    if node is None or node.kind is not Kind.OTHER or node.name not in _UNSQUEEZE:
        raise NoMatch(f"the {role} factor is {describe(graph, value)}, not {role}.unsqueeze(dim)")
    cache = node.inputs[0]
    if not isinstance(cache, TensorValue) or graph.producer(cache) is not None:
        raise NoMatch(f"the {role} cache is computed by {describe(graph, cache)}, not passed in")
    args, kwargs = node.params.get("args", ()), node.params.get("kwargs", {})
    dim = kwargs.get("dim", args[1] if len(args) > 1 else None)
    number = dim.value if isinstance(dim, Const) else None
    if not isinstance(number, int):
        raise NoMatch(f"{role}.unsqueeze is called with {dim!r}, not a dim")
    rank = cache.ndim + 1
    return cache, number % rank + (4 - rank), node

"""Gated activations: SwiGLU ``silu(a) * b`` (``swiglu``) and GeGLU ``gelu(a) * b`` (``geglu``).

Recognized (after the capture's normalization, see :mod:`kernelsmith.frontends.capture`):

- ``F.silu(a) * b``, ``nn.SiLU()(a) * b`` and ``a * torch.sigmoid(a) * b`` (``swiglu``);
  ``F.gelu(a) * b`` and ``F.gelu(a, approximate="tanh") * b``, or ``nn.GELU`` (``geglu`` with
  ``approximate`` ``"none"`` or ``"tanh"``); the factors in any order;
- with ``a`` and ``b`` two tensors of one shape (layout ``"pair"``: inputs ``(a, b)``, ``a``
  being the activated one, whichever argument it is), or the two halves of one tensor ``x``
  along its last dim (layout ``"concat"``: input ``(x,)``), split by ``x.chunk(2, -1)``,
  ``torch.chunk``, ``x.split(h, -1)``, ``torch.tensor_split`` or sliced by ``x[..., :h]`` /
  ``x[..., h:]`` (or ``x[:, :h]``, ``x.narrow(-1, 0, h)``), the gate ``a`` being the first half.

Refused, with a reason: the gate on the second half of ``x`` (the concat layout gates the first
half; the roles of the halves cannot be swapped), halves of unequal sizes, a split along another
dim than the last, halves of two different tensors, ``sigmoid(a) * b`` (GLU) or ``a * sigmoid(c)
* b`` with ``c`` another tensor, a and b of different shapes (broadcasting) or dtypes, casts, an
output dtype or shape other than the op's, and anything computed besides the op.
"""

from __future__ import annotations

import logging

from kernelsmith.frontends.capture import Graph, Kind, Node, TensorValue, Value
from kernelsmith.frontends.recognize import (
    InputRef,
    Match,
    NoMatch,
    describe,
    input_ref,
    match_of,
    product_factors,
    require_only,
    single_tensor_output,
)

logger = logging.getLogger(__name__)

SWIGLU = "swiglu"
GEGLU = "geglu"
_ACTIVATIONS = (Kind.SILU, Kind.GELU, Kind.SIGMOID)


def match_swiglu(graph: Graph) -> Match | None:
    """The ``swiglu`` match of ``graph``; None when it has nothing of a SwiGLU's shape."""
    return match_of(_analyze(graph), SWIGLU)


def match_geglu(graph: Graph) -> Match | None:
    """The ``geglu`` match of ``graph``; None when it has nothing of a GeGLU's shape."""
    return match_of(_analyze(graph), GEGLU)


def _analyze(graph: Graph) -> tuple[str, Match | NoMatch] | None:
    """Which gated activation the graph is shaped like (an activation whose output is multiplied
    into the function's output), and its match or the reason it is refused."""
    out = single_tensor_output(graph)
    muls: list[Node] = []
    casts: list[tuple[Node, list[Value]]] = []
    if graph.produced_by(out, Kind.MUL) is None:
        return None
    factors = product_factors(graph, out, muls, casts)
    acts = [f for f in factors if graph.produced_by(f, *_ACTIVATIONS) is not None]
    if not acts:
        return None
    first = graph.producer(acts[0])
    assert first is not None
    op = GEGLU if first.kind is Kind.GELU else SWIGLU
    try:
        return op, _match(graph, out, factors, acts, muls, casts)
    except NoMatch as err:
        return op, err


def _match(
    graph: Graph,
    out: TensorValue,
    factors: list[Value],
    acts: list[Value],
    muls: list[Node],
    casts: list[tuple[Node, list[Value]]],
) -> Match:
    if casts:
        raise NoMatch(f"casts ({', '.join(c.name for c, _ in casts)}) around the gated product")
    if len(acts) != 1:
        raise NoMatch(f"multiplies {len(acts)} activations, not one")
    act = graph.producer(acts[0])
    assert act is not None
    gate = act.inputs[0]
    rest = [f for f in factors if f is not acts[0]]
    if act.kind is Kind.SIGMOID:
        # a * sigmoid(a) * b: one of the other factors must be the sigmoid's own input.
        same = [i for i, f in enumerate(rest) if f is gate]
        if not same:
            raise NoMatch(
                f"multiplies sigmoid({describe(graph, gate)}) by {[describe(graph, f) for f in rest]}: "
                f"not a * sigmoid(a) * b (sigmoid(a) * b is a GLU, not a SwiGLU)"
            )
        del rest[same[0]]
    if len(rest) != 1:
        raise NoMatch(f"multiplies the activation by {[describe(graph, f) for f in rest]}, not by one tensor b")
    up = rest[0]
    op = GEGLU if act.kind is Kind.GELU else SWIGLU
    constants: dict = {}
    if act.kind is Kind.GELU:
        approximate = act.params["approximate"]
        if approximate not in ("none", "tanh"):
            raise NoMatch(f"approximate={approximate!r} is neither 'none' nor 'tanh'")
        constants["approximate"] = approximate
    used = [*muls, act]
    a_node, b_node = graph.produced_by(gate, Kind.SPLIT, Kind.SLICE), graph.produced_by(up, Kind.SPLIT, Kind.SLICE)
    if a_node is not None or b_node is not None:
        x, nodes = _halves(graph, gate, up)
        refs: tuple[InputRef, ...] = (input_ref(x, "input x"),)
        constants = {"layout": "concat", **constants}
        shape = (*x.shape[:-1], x.shape[-1] // 2)
        used += nodes
    else:
        a, b = _pair_part(graph, gate, "gate a"), _pair_part(graph, up, "up projection b")
        if a.shape != b.shape:
            raise NoMatch(f"a {a.shape} and b {b.shape} differ in shape (the op does not broadcast)")
        if a.dtype != b.dtype:
            raise NoMatch(f"a is {a.dtype} but b is {b.dtype}")
        refs = (input_ref(a, "gate a"), input_ref(b, "up projection b"))
        constants = {"layout": "pair", **constants}
        x, shape = a, a.shape
    if out.dtype != x.dtype:
        raise NoMatch(f"the output is {out.dtype}, but the inputs are {x.dtype}")
    if out.shape != shape:
        raise NoMatch(f"the output has shape {out.shape}, not {shape}")
    if x.ndim < 1:
        raise NoMatch("the inputs are 0-d")
    require_only(graph, used, op)
    return Match(op, refs, constants)


def _pair_part(graph: Graph, value: Value, role: str) -> TensorValue:
    node = graph.producer(value)
    if node is not None:
        raise NoMatch(f"the {role} is computed by {node.name}, not an input tensor")
    if not isinstance(value, TensorValue):
        raise NoMatch(f"the {role} is {describe(graph, value)}, not a tensor")
    return value


def _piece(graph: Graph, value: Value, role: str) -> tuple[Node, int, tuple[int, int]]:
    """The SPLIT / SLICE node a half comes from, the dim, and its (start, stop) along it."""
    node = graph.produced_by(value, Kind.SPLIT, Kind.SLICE)
    if node is None:
        raise NoMatch(f"the {role} is {describe(graph, value)}, while the other operand is a piece of a tensor")
    if node.kind is Kind.SLICE:
        return node, node.params["dim"], (node.params["start"], node.params["stop"])
    assert isinstance(value, TensorValue)
    item = getattr(value.source, "item", None)
    assert item is not None
    return node, node.params["dim"], node.params["sections"][item]


def _halves(graph: Graph, gate: Value, up: Value) -> tuple[TensorValue, list[Node]]:
    """``(x, nodes)`` when ``gate`` and ``up`` are x's first and second halves along its last dim."""
    a_node, a_dim, a_range = _piece(graph, gate, "gate a")
    b_node, b_dim, b_range = _piece(graph, up, "up projection b")
    if a_node.inputs[0] is not b_node.inputs[0]:
        raise NoMatch("a and b are pieces of two different tensors")
    x = a_node.inputs[0]
    assert isinstance(x, TensorValue)
    if graph.producer(x) is not None:
        raise NoMatch(f"splits the output of {describe(graph, x)}, not an input tensor")
    last = x.ndim - 1
    for dim in (a_dim, b_dim):
        if dim != last:
            raise NoMatch(f"splits x along dim {dim}, not the last dim ({last})")
    n = x.shape[last]
    if n % 2 or {a_range, b_range} != {(0, n // 2), (n // 2, n)}:
        raise NoMatch(f"a is columns {a_range} and b columns {b_range} of x's {n}: not its two halves")
    if a_range != (0, n // 2):
        raise NoMatch(
            "the gate (the activated operand) is the second half of x; the concat layout gates the first half"
        )
    return x, list({id(n): n for n in (a_node, b_node)}.values())

"""GELU, exact (``gelu``) and with the tanh approximation (``gelu_tanh``), however written.

Recognized (after the capture's normalization, see :mod:`kernelsmith.frontends.capture`):

- ``F.gelu(x)`` and ``torch.nn.GELU()`` (``gelu``); ``F.gelu(x, approximate="tanh")`` and
  ``torch.nn.GELU(approximate="tanh")`` (``gelu_tanh``); also of ``x.float()`` cast back to
  x's dtype;
- the explicit exact form ``0.5 * x * (1 + erf(x / sqrt(2)))``, and the explicit tanh form
  ``0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x**3)))``, in any arrangement of the
  arithmetic: the recognizer reads the output as a polynomial in ``x`` and in the one ``erf`` or
  ``tanh`` value, and the argument of that function as a polynomial in ``x``, so that
  ``x * 0.5 * (1.0 + erf(x * 0.7071...))``, ``x * (1 + erf(x / math.sqrt(2))) / 2`` or Hugging
  Face's ``0.5 * x * (1 + tanh(x * 0.7978845608 * (1 + 0.044715 * x * x)))`` are all seen for
  what they are. Every coefficient must equal the formula's within a relative 1e-6;
- the tanh form written with a sigmoid, ``x * sigmoid(sqrt(8 / pi) * (x + 0.044715 * x**3))``
  (since ``0.5 * (1 + tanh(u)) = sigmoid(2u)``).

``x`` may be upcast to float32 (``x.float()``), the result then cast back to x's dtype.

Refused, with a reason: other constants (``0.04`` instead of ``0.044715``, ``x / 1.4`` in the
erf), the "quick" GELU ``x * sigmoid(1.702 * x)`` (another function), an ``approximate`` other
than ``"none"`` and ``"tanh"``, a computed or foreign tensor where ``x`` is expected, other
casts, an output dtype or shape other than x's, and anything computed besides the op.
"""

from __future__ import annotations

import logging
import math
from collections import defaultdict

from kernelsmith.frontends.capture import Const, Graph, Kind, Node, TensorValue, Value
from kernelsmith.frontends.recognize import (
    Match,
    NoMatch,
    constant_number,
    describe,
    input_or_upcast,
    input_ref,
    match_of,
    require_only,
    single_tensor_output,
)

logger = logging.getLogger(__name__)

EXACT = "gelu"
TANH = "gelu_tanh"
REL_TOL = 1e-6
SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
CUBIC = 0.044715
MAX_DEGREE = 8  # of a polynomial read from the graph: more is no GELU, and stops blow-ups

# A polynomial in x and in the value t of the one erf / tanh / sigmoid: {(power of x, power of t): coefficient}.
Poly = dict[tuple[int, int], float]

# What the output and the argument of the special function must be, per form.
_HALF_X_ONE_PLUS_T: Poly = {(1, 0): 0.5, (1, 1): 0.5}
_FORMS: dict[Kind, tuple[str, Poly, Poly, str]] = {
    Kind.ERF: (EXACT, {(1, 0): 1 / math.sqrt(2.0)}, _HALF_X_ONE_PLUS_T, "0.5 * x * (1 + erf(x / sqrt(2)))"),
    Kind.TANH: (
        TANH,
        {(1, 0): SQRT_2_OVER_PI, (3, 0): SQRT_2_OVER_PI * CUBIC},
        _HALF_X_ONE_PLUS_T,
        "0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x**3)))",
    ),
    Kind.SIGMOID: (
        TANH,
        {(1, 0): 2 * SQRT_2_OVER_PI, (3, 0): 2 * SQRT_2_OVER_PI * CUBIC},
        {(1, 1): 1.0},
        "x * sigmoid(sqrt(8/pi) * (x + 0.044715 * x**3))",
    ),
}


def match_exact(graph: Graph) -> Match | None:
    """The ``gelu`` match of ``graph``; None when it has nothing of an exact GELU's shape."""
    return match_of(_analyze(graph), EXACT)


def match_tanh(graph: Graph) -> Match | None:
    """The ``gelu_tanh`` match of ``graph``; None when it has nothing of a tanh GELU's shape."""
    return match_of(_analyze(graph), TANH)


def _analyze(graph: Graph) -> tuple[str, Match | NoMatch] | None:
    """Which GELU the graph is shaped like, and its match or the reason it is refused."""
    gelus = [n for n in graph.nodes if n.kind is Kind.GELU]
    if gelus:
        approximate = gelus[0].params["approximate"]
        op = TANH if approximate == "tanh" else EXACT
        try:
            return op, _functional(graph)
        except NoMatch as err:
            return op, err
    specials = [n for n in graph.nodes if n.kind in (Kind.ERF, Kind.TANH)]
    if not specials:
        specials = [n for n in graph.nodes if n.kind is Kind.SIGMOID]
        if not specials:
            return None
        return _sigmoid(graph, specials)
    op = _FORMS[specials[0].kind][0]
    try:
        if len(specials) != 1:
            raise NoMatch(f"computes {len(specials)} erf / tanh values, not one")
        return op, _explicit(graph, specials[0])
    except NoMatch as err:
        return op, err


def _output(graph: Graph) -> tuple[TensorValue, Node, list[Node]]:
    """The output, the node under a final cast (if any), and that cast."""
    out = single_tensor_output(graph)
    node = graph.producer(out)
    assert node is not None  # single_tensor_output checked it
    if node.kind is Kind.CAST:
        inner = graph.producer(node.inputs[0])
        if inner is None:
            raise NoMatch("the output is a cast of an input, not a GELU")
        return out, inner, [node]
    return out, node, []


def _check(out: TensorValue, x: TensorValue) -> None:
    if out.dtype != x.dtype:
        raise NoMatch(f"the output is {out.dtype}, but x is {x.dtype}")
    if out.shape != x.shape:
        raise NoMatch(f"the output has shape {out.shape}, but x has {x.shape}")
    if x.ndim < 1:
        raise NoMatch("x is 0-d")


def _functional(graph: Graph) -> Match:
    """``F.gelu(x[, approximate])`` / ``nn.GELU``."""
    out, node, used = _output(graph)
    if node.kind is not Kind.GELU:
        raise NoMatch(f"the output comes from {node.name} after the gelu")
    approximate = node.params["approximate"]
    if approximate not in ("none", "tanh"):
        raise NoMatch(f"approximate={approximate!r} is neither 'none' nor 'tanh'")
    x, casts = input_or_upcast(graph, node.inputs[0], "gelu input")
    _check(out, x)
    ref = input_ref(x, "input x")
    require_only(graph, [*used, node, *casts], EXACT if approximate == "none" else TANH)
    return Match(EXACT if approximate == "none" else TANH, (ref,), {})


def _explicit(graph: Graph, special: Node) -> Match:
    """The output as ``0.5 * x * (1 + f(arg))`` with the polynomial ``arg`` of the form of ``f``."""
    op, arg_poly, out_poly, formula = _FORMS[special.kind]
    out, node, used = _output(graph)
    reader = _PolyReader(graph, special)
    got_out = reader.read(node.out)
    got_arg = reader.read(special.inputs[0], allow_special=False)
    if not _close(got_out, out_poly) or not _close(got_arg, arg_poly):
        raise NoMatch(
            f"computes {_show(got_out)} with t = {special.name}({_show(got_arg)}), "
            f"not {formula}"
        )
    x = reader.x
    assert x is not None  # the polynomials have terms in x
    _check(out, x)
    ref = input_ref(x, "input x")
    require_only(graph, [*used, special, *reader.used.values()], op)
    return Match(op, (ref,), {})


def _sigmoid(graph: Graph, sigmoids: list[Node]) -> tuple[str, Match | NoMatch] | None:
    """``x * sigmoid(sqrt(8/pi) * (x + 0.044715 x**3))`` is the tanh GELU; ``x * sigmoid(k x)``
    (the "quick" GELU for k = 1.702) is refused; other sigmoids are none of GELU's business."""
    if len(sigmoids) != 1:
        return None
    try:
        _, node, _ = _output(graph)
        reader = _PolyReader(graph, sigmoids[0])
        got_out = reader.read(node.out)
        got_arg = reader.read(sigmoids[0].inputs[0], allow_special=False)
    except NoMatch:
        return None
    if set(got_out) != {(1, 1)}:
        return None  # not x * sigmoid(...) (a SwiGLU is a * sigmoid(a) * b, with another tensor b)
    k = got_arg.get((1, 0), 0.0)
    if set(got_arg) == {(1, 0)} and not math.isclose(k, 1.0, rel_tol=REL_TOL):  # x * sigmoid(x) is SiLU
        return EXACT, NoMatch(f"x * sigmoid({k:g} * x) is the 'quick' GELU approximation, not GELU: another function")
    if set(got_arg) != {(1, 0), (3, 0)}:
        return None
    try:
        return TANH, _explicit(graph, sigmoids[0])
    except NoMatch as err:
        return TANH, err


class _PolyReader:
    """Reads a value of the graph as a polynomial in one input tensor ``x`` (or ``x.float()``) and
    in the output of one ``special`` node, through additions, subtractions, multiplications,
    divisions by constants, squares and small integer powers; anything else is a NoMatch."""

    def __init__(self, graph: Graph, special: Node) -> None:
        self.graph = graph
        self.special = special
        self.x: TensorValue | None = None
        self.used: dict[int, Node] = {}
        self._memo: dict[int, Poly] = {}
        self._allow_special = True

    def read(self, value: Value, allow_special: bool = True) -> Poly:
        self._allow_special = allow_special
        return self._read(value)

    def _read(self, value: Value) -> Poly:
        found = constant_number(self.graph, value)
        if found is not None:
            number, const_node = found
            if const_node is not None:
                self.used[const_node.index] = const_node
            return {(0, 0): number} if number != 0 else {}
        if not isinstance(value, TensorValue):
            raise NoMatch(f"uses {describe(self.graph, value)}, not a number or a tensor")
        node = self.graph.producer(value)
        if node is None or node.kind is Kind.CAST:
            self._leaf(value)
            return {(1, 0): 1.0}
        if node is self.special:
            if not self._allow_special:
                raise NoMatch(f"{node.name} of its own output")
            return {(0, 1): 1.0}
        if node.index in self._memo:
            return self._memo[node.index]
        poly = self._node(node)
        if any(i + j > MAX_DEGREE for i, j in poly):
            raise NoMatch("computes a polynomial of too high a degree")
        self.used[node.index] = node
        self._memo[node.index] = poly
        return poly

    def _leaf(self, value: TensorValue) -> None:
        x, casts = input_or_upcast(self.graph, value, "GELU input")
        if self.x is not None and x is not self.x:
            raise NoMatch("combines two different tensors")
        self.x = x
        for c in casts:
            self.used[c.index] = c

    def _node(self, node: Node) -> Poly:
        kind, ins = node.kind, node.inputs
        if kind is Kind.ADD:
            return _add(self._read(ins[0]), self._read(ins[1]), 1.0)
        if kind is Kind.SUB:
            return _add(self._read(ins[0]), self._read(ins[1]), -1.0)
        if kind is Kind.MUL:
            return _mul(self._read(ins[0]), self._read(ins[1]))
        if kind is Kind.SQUARE:
            p = self._read(ins[0])
            return _mul(p, p)
        if kind is Kind.DIV:
            num, den = self._read(ins[0]), self._read(ins[1])
            if set(den) != {(0, 0)}:
                raise NoMatch(f"divides by {describe(self.graph, ins[1])}, not by a constant")
            return {k: c / den[(0, 0)] for k, c in num.items()}
        if kind is Kind.POW:
            e = Const(node.params["exponent"]).number
            if e is None or not e.is_integer() or not 1 <= e <= MAX_DEGREE:
                raise NoMatch(f"raises to the power {node.params['exponent']!r}")
            p = self._read(ins[0])
            result: Poly = {(0, 0): 1.0}
            for _ in range(int(e)):
                result = _mul(result, p)
            return result
        raise NoMatch(f"computes {node.name}")


def _add(p: Poly, q: Poly, sign: float) -> Poly:
    out: dict[tuple[int, int], float] = defaultdict(float, p)
    for k, c in q.items():
        out[k] += sign * c
    return {k: c for k, c in out.items() if c != 0}


def _mul(p: Poly, q: Poly) -> Poly:
    out: dict[tuple[int, int], float] = defaultdict(float)
    for (i, j), c in p.items():
        for (k, m), d in q.items():
            out[(i + k, j + m)] += c * d
    return {k: c for k, c in out.items() if c != 0}


def _close(got: Poly, want: Poly) -> bool:
    scale = max((abs(c) for c in got.values()), default=0.0)
    got = {k: c for k, c in got.items() if abs(c) > 1e-12 * scale}  # terms that cancelled
    return set(got) == set(want) and all(math.isclose(got[k], want[k], rel_tol=REL_TOL) for k in want)


def _show(poly: Poly) -> str:
    if not poly:
        return "0"
    terms = []
    for (i, j), c in sorted(poly.items()):
        factors = [f"x**{i}" if i > 1 else "x"] * (i > 0) + [f"t**{j}" if j > 1 else "t"] * (j > 0)
        terms.append(" * ".join([f"{c:.7g}", *factors]))
    return " + ".join(terms)


"""Recognize which tuned op a user's function computes, by the structure of one captured call.

``@kernelsmith.optimize`` must know, for a function it has never seen, whether it computes one
of the op families kernelsmith tunes, which of its arguments are that op's inputs, and with
which constants. Counting calls or matching names would be fooled by the many ways people
write the same op and, worse, would accept functions that differ in a detail that changes the
result (softmax over another dim, a weight broadcast along the wrong axis, an extra ``+ 1``).
So :func:`recognize` runs the function once under :func:`~kernelsmith.frontends.capture.capture`
and hands the normalized graph to the patterns each op family registers in
:data:`kernelsmith.frontends.patterns.PATTERNS`. A pattern checks the argument roles, the
reduction dim and keepdim, the casts, the constants, and that the function computes nothing
but the op.

A :class:`Match` says where each op input comes from on a call (:class:`InputRef`) and is
valid for calls like the captured one: :meth:`Match.bind` checks the call signature first
(positional count, keyword names, every non-tensor argument, each tensor argument's shape,
dtype, device and ``requires_grad``, that external tensors such as a module's weight are
still the ones reached from the function, and that the plain values it reads from outside its
arguments, such as a global eps or ``self.eps``, are unchanged) and raises
:class:`MatchDoesNotApply` otherwise, so
a caller re-recognizes instead of replaying a graph that Python control flow could have
changed.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from kernelsmith.frontends.capture import (
    ArgSource,
    CallSignature,
    Const,
    ExternalSource,
    Graph,
    Kind,
    Node,
    Path,
    TensorMeta,
    TensorValue,
    Value,
    capture,
    format_path,
)

logger = logging.getLogger(__name__)


class NoMatch(Exception):
    """Raised by a pattern that recognizes its op family's shape but refuses this function."""


class MatchDoesNotApply(ValueError):
    """A new call differs from the captured one in a way that could change what it computes."""


@dataclass(frozen=True, eq=False)
class InputRef:
    """Where one of the op's inputs comes from on each call.

    ``kind`` is ``"arg"`` (positional ``index``), ``"kwarg"`` (keyword ``name``) or
    ``"external"`` (``tensor``, held by reference: a module's weight, a closure tensor).
    ``reshape``, when set, is applied on binding (a ``(1, N)`` weight is the op's ``(N,)``), then
    ``transpose`` (two dims swapped: a view, as attention takes a ``(B, H, S, D)`` argument in its
    ``(B, S, H, D)`` layout).
    ``path`` and ``meta`` let a later call check an external tensor is still the one the
    function reaches, unchanged.
    """

    kind: str
    index: int | None = None
    name: str | None = None
    tensor: torch.Tensor | None = field(default=None, repr=False)
    reshape: tuple[int, ...] | None = None
    path: Path | None = field(default=None, repr=False)
    meta: TensorMeta | None = field(default=None, repr=False)
    transpose: tuple[int, int] | None = None

    @property
    def as_given(self) -> bool:
        """Whether the op's input is the tensor itself, neither reshaped nor transposed."""
        return self.reshape is None and self.transpose is None

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, InputRef):
            return NotImplemented
        return (self.kind, self.index, self.name, self.reshape, self.transpose) == (
            other.kind,
            other.index,
            other.name,
            other.reshape,
            other.transpose,
        ) and self.tensor is other.tensor

    def __hash__(self) -> int:
        return hash((self.kind, self.index, self.name, self.reshape, self.transpose, id(self.tensor)))

    def resolve(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> torch.Tensor:
        """The tensor this input is on the call ``(args, kwargs)``."""
        if self.kind == "arg":
            assert self.index is not None
            t = args[self.index]
        elif self.kind == "kwarg":
            assert self.name is not None
            t = kwargs[self.name]
        elif self.kind == "external":
            t = self.tensor
        else:
            raise ValueError(f"unknown input kind {self.kind!r}")
        if not isinstance(t, torch.Tensor):
            raise MatchDoesNotApply(f"input {self} is not a tensor on this call")
        if self.reshape is not None:
            t = t.reshape(self.reshape)
        return t.transpose(*self.transpose) if self.transpose is not None else t


@dataclass(frozen=True)
class Match:
    """A recognized op: its name, where its inputs come from, and its constants.

    ``op`` names an op family (``kernelsmith.ops.get_op(op)``); ``inputs`` follow that family's
    input order (rmsnorm: x, weight; softmax: x; layernorm: x and the weight and bias present;
    swiglu / geglu: a, b or the concatenated x; cross_entropy: logits, target); ``constants``
    are the family's constants (rmsnorm: ``{"eps": float}``; softmax: ``{"dim": -1}``;
    layernorm: ``{"eps", "affine"}``; swiglu: ``{"layout"}``, geglu also ``{"approximate"}``;
    sum / mean / max: ``{"dim": -1}``; cross_entropy: ``{"reduction", "ignore_index",
    "label_smoothing"}``; gelu / gelu_tanh: none), ready for ``spec_for``.

    ``returns`` is None when the function returns the op's (first) output itself; for a function
    that returns a tuple it says what each element is: the op's output of that number, or None
    for an element that is ``None`` (Hugging Face's attention helpers return ``(out, None)``,
    ``apply_rotary_pos_emb`` returns rope's two outputs, ``returns=(0, 1)``).
    """

    op: str
    inputs: tuple[InputRef, ...]
    constants: dict[str, Any]
    signature: CallSignature | None = field(default=None, compare=False, repr=False)
    returns: tuple[int | None, ...] | None = None

    def mismatch(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> str | None:
        """None when this match holds for the call ``(args, kwargs)``, else why it does not."""
        if self.signature is None:
            return None
        why = self.signature.mismatch(args, kwargs)
        if why:
            return why
        for ref in self.inputs:
            if ref.kind == "external" and ref.path is not None and ref.meta is not None:
                assert ref.tensor is not None
                why = self.signature.external_mismatch(ref.tensor, ref.path, ref.meta, args, kwargs)
                if why:
                    return why
        return None

    def applies_to(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> bool:
        """Whether :meth:`bind` accepts this call."""
        return self.mismatch(args, kwargs) is None

    def bind(self, args: tuple[Any, ...], kwargs: dict[str, Any], *, check: bool = True) -> tuple[torch.Tensor, ...]:
        """The op's inputs for a new call with the same signature as the captured one.

        Raises :class:`MatchDoesNotApply` when the call differs from the captured one (see
        :meth:`mismatch`); ``check=False`` skips that check, for callers that made it already.
        """
        if check:
            why = self.mismatch(args, kwargs)
            if why:
                raise MatchDoesNotApply(why)
        return tuple(ref.resolve(args, kwargs) for ref in self.inputs)


@dataclass(frozen=True)
class Recognition:
    """What :func:`recognize` found.

    ``output`` is the function's return value from the captured call (callers return it as that
    call's result: the function has run once already). ``reason`` says why nothing matched,
    for a log line; it is ``""`` on a match.
    """

    match: Match | None
    output: Any
    reason: str


def recognize(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any] | None = None) -> Recognition:
    """Run ``fn(*args, **kwargs)`` once, capturing it, and match it against every pattern.

    Exceptions raised by ``fn`` itself propagate unchanged. Nothing else raises: a function the
    capture cannot follow, or a bug in a pattern, gives ``match=None`` with a reason.
    """
    args = tuple(args)
    kwargs = dict(kwargs or {})
    graph = capture(fn, args, kwargs)
    try:
        match, reason = _match(graph)
    except Exception as err:  # a pattern's bug must never break the user's call
        logger.debug("recognition failed", exc_info=True)
        match, reason = None, f"internal recognizer error ({type(err).__name__}: {err})"
    name = getattr(fn, "__qualname__", None) or type(fn).__name__
    if match is None:
        logger.debug("%s: no op recognized: %s", name, reason)
    else:
        logger.debug("%s: recognized %s %s", name, match.op, match.constants)
    return Recognition(match, graph.output, reason)


def _match(graph: Graph) -> tuple[Match | None, str]:
    from kernelsmith.frontends.patterns import PATTERNS  # here: the patterns import this module

    if graph.problems:
        return None, "; ".join(graph.problems)
    try:
        if graph.output_values is None:
            single_tensor_output(graph)
        else:
            tuple_output(graph)
    except NoMatch as err:
        return None, str(err)
    found: list[Match] = []
    refusals: list[str] = []
    for op, pattern in PATTERNS.items():
        try:
            m = pattern(graph)
        except NoMatch as err:
            refusals.append(f"{op}: {err}")
            continue
        if m is not None:
            found.append(replace(m, signature=graph.signature))
    if len(found) > 1:
        logger.warning("several patterns match one function (%s); using %s", [m.op for m in found], found[0].op)
    if found:
        return found[0], ""
    if refusals:
        return None, "; ".join(refusals)
    if graph.output_values is not None:
        return None, f"no registered pattern recognizes a function that returns {len(graph.output_values)} values"
    node = graph.producer(graph.output_value)
    made_by = f" (its output comes from {node.name})" if node is not None else ""
    return None, f"no registered pattern recognizes it{made_by}"


# ---------------------------------------------------------------------------------------------
# Helpers shared by the patterns
# ---------------------------------------------------------------------------------------------


def match_of(found: tuple[str, Match | NoMatch] | None, op: str) -> Match | None:
    """One family's answer from the analysis of a pattern module serving several families
    (``(family, match or refusal)``, or None): its match, its refusal raised, or None when the
    graph is shaped like another family of the module (whose refusal is that family's to give)."""
    if found is None or found[0] != op:
        return None
    result = found[1]
    if isinstance(result, NoMatch):
        raise result
    return result


def single_tensor_output(graph: Graph) -> TensorValue:
    """The function's output, which must be one tensor computed by the captured call."""
    if graph.problems:
        raise NoMatch("; ".join(graph.problems))
    out = graph.output
    if isinstance(out, tuple | list):
        raise NoMatch(f"returns {len(out)} values, not a single tensor")
    if not isinstance(out, torch.Tensor):
        raise NoMatch(f"returns a {type(out).__name__}, not a tensor")
    if graph.output_value is None:
        raise NoMatch("the output tensor could not be traced")
    if graph.producer(graph.output_value) is None:
        raise NoMatch(f"returns {graph.output_value.describe()} without computing it")
    return graph.output_value


def tuple_output(graph: Graph) -> tuple[TensorValue | None, ...]:
    """The function's output when it is a tuple of tensors the call computed and ``None``s (at
    least one tensor): each element's value, None for a ``None``."""
    if graph.problems:
        raise NoMatch("; ".join(graph.problems))
    out, values = graph.output, graph.output_values
    if not isinstance(out, tuple) or values is None:
        raise NoMatch(f"returns a {type(out).__name__}, not a tuple of tensors")
    for i, (element, value) in enumerate(zip(out, values, strict=True)):
        if element is None:
            continue
        if not isinstance(element, torch.Tensor) or value is None:
            raise NoMatch(f"returns {type(element).__name__} as value {i}, not a tensor or None")
        if graph.producer(value) is None:
            raise NoMatch(f"returns {value.describe()} as value {i} without computing it")
    if all(v is None for v in values):
        raise NoMatch("returns a tuple without a tensor")
    return values


def input_ref(value: Value | None, role: str) -> InputRef:
    """The :class:`InputRef` for a tensor that is an op input, or NoMatch if it cannot be one.

    An op input must come from outside the function (an argument or an external tensor) on
    every call: a tensor the function computes would have to be recomputed, and one of unknown
    origin could be stale.
    """
    if not isinstance(value, TensorValue):
        raise NoMatch(f"the {role} is {value!r}, not a tensor")
    if not value.plain:
        raise NoMatch(f"the {role} is a tensor subclass, which the kernels do not take")
    src = value.source
    if isinstance(src, ArgSource):
        if src.index is not None:
            return InputRef("arg", index=src.index)
        return InputRef("kwarg", name=src.name)
    if isinstance(src, ExternalSource):
        meta = TensorMeta(value.shape, value.dtype, value.device, src.tensor.requires_grad)
        logger.debug("%s is the external tensor %s", role, format_path(src.path))
        return InputRef("external", tensor=src.tensor, path=src.path, meta=meta)
    raise NoMatch(f"the {role} is {value.describe()}: not an argument or a tensor the function holds")


def require_only(graph: Graph, used: Iterable[Node], op: str) -> None:
    """NoMatch unless every computation of the call is part of the recognized op."""
    extra = graph.uncovered(used)
    if extra:
        names = ", ".join(dict.fromkeys(n.name for n in extra))
        raise NoMatch(f"also computes things that are not part of the {op} ({names})")


def reduces_last_dim(node: Node, ndim: int) -> bool:
    """Whether a reduction node runs over the last dim only, keeping it so that it broadcasts.

    A 1-D input may also be reduced whole, without keepdim: the 0-d result broadcasts the same.
    """
    dims, keepdim = node.params.get("dims"), node.params.get("keepdim")
    if ndim == 1 and dims in (None, (0,)):
        return True
    return ndim >= 1 and dims == (ndim - 1,) and keepdim is True


def constant_number(graph: Graph, value: Value | None) -> tuple[float, Node | None] | None:
    """A constant's value (a Python number, or ``torch.tensor(number)`` made in the function).

    Returns the value and the node that made it (to count as part of the op), or None when
    ``value`` is not such a constant: a tensor from an argument or from outside could change
    between calls without the call signature noticing.
    """
    if isinstance(value, Const):
        number = value.number
        return (number, None) if number is not None else None
    node = graph.producer(value)
    if node is not None and node.kind is Kind.CONST:
        number = Const(node.params["value"]).number
        return (number, node) if number is not None else None
    return None


def finite_non_negative(number: float) -> bool:
    return math.isfinite(number) and number >= 0.0


def input_or_upcast(graph: Graph, value: Value | None, role: str) -> tuple[TensorValue, list[Node]]:
    """``x`` for ``x`` or ``x.float()``: an input tensor, perhaps upcast to float32, and the cast.

    Any other cast (to float64, to a lower precision) and any computed value are refused: the
    op's kernels read the input tensor itself and compute in float32.
    """
    cast = graph.produced_by(value, Kind.CAST)
    casts: list[Node] = []
    if cast is not None:
        if cast.params["dtype"] != torch.float32:
            raise NoMatch(f"the {role} is cast to {cast.params['dtype']}; only an upcast to float32 is allowed")
        value, casts = cast.inputs[0], [cast]
    if not isinstance(value, TensorValue):
        raise NoMatch(f"the {role} is {describe(graph, value)}, not a tensor")
    node = graph.producer(value)
    if node is not None:
        raise NoMatch(f"the {role} is computed by {node.name}, not an input tensor")
    return value, casts


def describe(graph: Graph, value: Value | None) -> str:
    """A short description of a value for messages: the call that made it, or the value."""
    node = graph.producer(value)
    if node is not None:
        return node.name
    if isinstance(value, TensorValue):
        return value.describe()
    return repr(getattr(value, "value", value))


def product_factors(
    graph: Graph, value: Value, muls: list[Node], casts: list[tuple[Node, list[Value]]]
) -> list[Value]:
    """The factors of a product tree (through MUL and CAST nodes), recording both kinds of node;
    each cast comes with the factors it covers."""
    node = graph.produced_by(value, Kind.MUL, Kind.CAST)
    if node is None:
        return [value]
    if node.kind is Kind.CAST:
        leaves = product_factors(graph, node.inputs[0], muls, casts)
        casts.append((node, leaves))
        return leaves
    muls.append(node)
    return product_factors(graph, node.inputs[0], muls, casts) + product_factors(graph, node.inputs[1], muls, casts)


def row_parameter_ref(value: TensorValue, x: TensorValue, role: str) -> InputRef:
    """The op's 1-D ``(N,)`` parameter for a tensor scaling the last axis of ``x`` alone: shape
    ``(N,)``, or ``(1, ..., 1, N)`` of no more dims than ``x`` (bound reshaped to ``(N,)``)."""
    n = x.shape[-1]
    shape = value.shape
    if not shape or shape[-1] != n or any(s != 1 for s in shape[:-1]) or len(shape) > x.ndim:
        raise NoMatch(
            f"the {role} has shape {shape}: it does not act on the last axis (N={n}) alone "
            f"(the op's {role} is (N,), or (1, ..., N))"
        )
    ref = input_ref(value, role)
    return replace(ref, reshape=(n,)) if value.ndim != 1 else ref


# Calls that only reinterpret a tensor's shape in row-major order (as ``view`` does): the result
# is ``t.reshape(result.shape)`` whatever the arguments were written as.
RESHAPES = frozenset({"torch.Tensor.view", "torch.Tensor.reshape", "torch.reshape", "torch.Tensor.flatten",
                      "torch.flatten"})  # fmt: skip


def through_reshapes(graph: Graph, value: Value, used: list[Node]) -> Value:
    """The value reshaped to ``value`` (``logits.view(-1, V)`` gives ``logits``), following any
    chain of :data:`RESHAPES`, each of whose nodes is appended to ``used``; ``value`` itself when
    it is not a reshape. A dtype view (``t.view(torch.int32)``) is not a reshape: it stops there.

    A pattern binds the tensor found with ``InputRef.reshape`` set to ``value``'s shape, which is
    valid for every later call the match accepts (the call signature pins the input's shape).
    """
    while True:
        node = graph.producer(value)
        if node is None or node.kind is not Kind.OTHER or node.name not in RESHAPES:
            return value
        source = node.inputs[0] if node.inputs else None
        if not (isinstance(source, TensorValue) and isinstance(value, TensorValue)) or source.dtype != value.dtype:
            return value
        used.append(node)
        value = source


def reduction_dims_text(node: Node) -> str:
    """``dims (0,) with keepdim=True``, for messages about a reduction node."""
    return f"dims {node.params.get('dims')} with keepdim={node.params.get('keepdim')}"


def bound_arguments(node: Node, names: Sequence[str]) -> dict[str, Value] | None:
    """A recorded call's arguments by parameter name; None when they do not fit ``names``."""
    args: Sequence[Value] = node.params.get("args", ())
    kwargs: Mapping[str, Value] = node.params.get("kwargs", {})
    if len(args) > len(names) or "args" not in node.params:
        return None
    bound = dict(zip(names, args, strict=False))
    for name, value in kwargs.items():
        if name in bound or name not in names:
            return None
        bound[name] = value
    return bound


def whole_of(node: Node) -> TensorValue | None:
    """``x`` for a node ``x[index]`` whose index keeps every element, else None."""
    arguments = bound_arguments(node, ("input", "index")) or {}
    source, index = arguments.get("input"), arguments.get("index")
    if isinstance(source, TensorValue) and isinstance(index, Const) and keeps_everything(index.value, source.shape):
        return source
    return None


def keeps_everything(index: Any, shape: tuple[int, ...]) -> bool:
    """Whether ``x[index]`` is all of ``x``: slices and an ellipsis that cut nothing."""
    items = index if isinstance(index, tuple) else (index,)
    if sum(1 for i in items if i is Ellipsis) > 1 or not all(i is Ellipsis or isinstance(i, slice) for i in items):
        return False
    slices = [i for i in items if isinstance(i, slice)]
    if len(slices) > len(shape):
        return False
    at = next((k for k, i in enumerate(items) if i is Ellipsis), len(items))
    before = [i for i in items[:at] if isinstance(i, slice)]
    after = [i for i in items[at + 1 :] if isinstance(i, slice)]
    dims = list(zip(before, shape, strict=False)) + list(zip(after, shape[len(shape) - len(after) :], strict=True))
    try:
        return all(s.indices(n) == (0, n, 1) for s, n in dims)
    except (TypeError, ValueError):  # slices of tensors, or of something else that is not an int
        return False

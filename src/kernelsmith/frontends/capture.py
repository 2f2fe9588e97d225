"""Capture the dataflow graph of one call of a user's function, in normalized form.

Why a :class:`~torch.overrides.TorchFunctionMode` and not ``torch.fx`` or dynamo: the recognizer
must see exactly what the user's code calls, on the real arguments, once (the call's output is
reused as the call's result), without compiling anything and without failing on Python the
tracers reject. A function mode sees every top-level torch function and Tensor method call,
including ``nn.Module`` bodies, and calling ``func`` inside the handler runs with the mode
popped, so the internals of ``F.rms_norm`` or ``F.softmax`` are not recorded: only the user's
own calls. Tensors are tracked by identity (``id``); every tensor that flows into a call is

- an *argument* of the function (a positional index or a keyword name),
- the output of an earlier recorded call (a :class:`Node`),
- an *external* tensor that existed before the call and can be reached from the function (a
  closure cell, a global it names, a module's parameter or buffer...), with the path that
  reaches it, so that a later call can check it is still the same tensor, or
- *unknown*: made by code the mode cannot see (``torch.from_numpy``, a C extension, code under
  ``torch._C.DisableTorchFunction``) or hidden inside a container argument. Unknown tensors are
  never bound to a kernel: holding one by reference would replay a stale value.

Calls are normalized so that each pattern is written once: ``x*x``, ``x**2``, ``x.pow(2)``,
``torch.square(x)`` are all SQUARE; ``torch.rsqrt(a)``, ``1/torch.sqrt(a)``, ``a**-0.5`` and
``torch.sqrt(a).reciprocal()`` are RSQRT; ``x / torch.sqrt(a)`` is ``x * RSQRT(a)``; ``s.sum(d)
/ N`` with ``N`` the size of ``d`` is a MEAN; ``a * (1/b)`` is ``a / b``; ``.float()``,
``.to(torch.float32)``, ``.type(...)``, ``.to(other)`` are all CAST to the dtype the call
actually produced; ``x.var(d, unbiased=False)`` and ``x.var(d, correction=0)`` are one VAR with
``correction=0``; ``x.chunk(2, -1)``, ``x.split(h, -1)``, ``torch.tensor_split`` are one SPLIT
whose params give each output's column range, and ``x[..., a:b]``, ``x[:, a:b]``,
``x.narrow(-1, a, b - a)`` one SLICE; ``torch.sigmoid``, ``F.sigmoid``, ``torch.special.expit``
are SIGMOID (likewise ERF, TANH). A node folded into another by normalization is listed in its
``absorbs``, so that "every computation is part of the op" can still be checked.

What the capture refuses to vouch for (recorded in :attr:`Graph.problems`, which makes every
pattern fail): in-place mutation of any tensor (``add_``, ``x[...] = v``, ``out=``,
``inplace=True``), and reading tensor values into Python (``item``, ``bool(t)``, ``print``):
the function could branch on data, and one captured call would not describe the next.
Control flow on non-tensor values is invisible; :class:`CallSignature` therefore pins every
non-tensor argument and every tensor argument's shape, dtype and device, so a later call that
differs is re-recognized instead of trusting this graph. It also pins the plain values the
function reads by name from outside its arguments (a global ``EPS``, ``self.eps``, a closure
variable, a default: :func:`constant_reads`), which reach the graph as bare numbers; each is
re-read on later calls, and a function that rebinds one while it runs is refused.
"""

from __future__ import annotations

import enum
import functools
import inspect
import logging
import math
import operator
import sys
import types
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch.overrides import TorchFunctionMode, resolve_name

logger = logging.getLogger(__name__)


class Kind(enum.StrEnum):
    """Normalized node kinds (see the module docstring for what each one covers)."""

    ADD = "add"
    SUB = "sub"
    MUL = "mul"
    DIV = "div"
    POW = "pow"  # any exponent not folded into SQUARE / SQRT / RSQRT / RECIPROCAL
    SQUARE = "square"
    SQRT = "sqrt"
    RSQRT = "rsqrt"
    RECIPROCAL = "reciprocal"
    EXP = "exp"
    MEAN = "mean"
    SUM = "sum"
    MAX = "max"  # amax, or max(dim=...) whose outputs are (values, indices)
    CAST = "cast"
    SOFTMAX = "softmax"
    LOG_SOFTMAX = "log_softmax"
    RMS_NORM = "rms_norm"
    LAYER_NORM = "layer_norm"  # inputs (x, weight or Const(None), bias or Const(None))
    VAR = "var"  # params dims, keepdim and correction (unbiased=False is correction 0)
    GELU = "gelu"  # params approximate ("none" or "tanh")
    SILU = "silu"
    SIGMOID = "sigmoid"
    ERF = "erf"
    TANH = "tanh"
    SPLIT = "split"  # chunk / split / tensor_split: params dim and each output's (start, stop)
    SLICE = "slice"  # x[..., a:b], x.narrow(d, a, n): params dim, start, stop (step 1)
    CROSS_ENTROPY = "cross_entropy"  # inputs (logits, target, weight or Const(None))
    CONST = "const"  # torch.tensor(<python number>) made inside the function
    OTHER = "other"  # anything else; params "args" and "kwargs" hold the call's arguments


# ---------------------------------------------------------------------------------------------
# Values
# ---------------------------------------------------------------------------------------------

# A path from a root to an object: ("fn", None) | ("arg", i) | ("kwarg", name), then steps
# ("attr", dotted name), ("cell", i), ("global", name), ("item", key), ("self", None),
# ("func", None), ("default", i), ("kwdefault", name).
Path = tuple[tuple[str, Any], ...]


@dataclass(frozen=True)
class ArgSource:
    """The tensor is an argument of the captured call: a positional index or a keyword name."""

    index: int | None = None
    name: str | None = None


@dataclass(frozen=True, eq=False)
class ExternalSource:
    """The tensor existed before the call and is reached from the function by ``path``."""

    tensor: torch.Tensor = field(repr=False)
    path: Path


@dataclass(frozen=True)
class NodeSource:
    """The tensor is output ``item`` of node ``node`` (``item`` is None for a single output)."""

    node: int
    item: int | None = None


@dataclass(frozen=True)
class UnknownSource:
    """The capture cannot say where the tensor comes from; ``why`` says it in words."""

    why: str


Source = ArgSource | ExternalSource | NodeSource | UnknownSource


@dataclass(frozen=True, eq=False)
class TensorValue:
    """One tensor of the captured call, with its metadata; compared by identity."""

    vid: int
    source: Source
    shape: tuple[int, ...]
    dtype: torch.dtype
    device: torch.device
    plain: bool  # a torch.Tensor or nn.Parameter, not some other tensor subclass

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def describe(self) -> str:
        """Where the tensor comes from, its shape and dtype, for messages."""
        src = self.source
        if isinstance(src, ArgSource):
            where = f"argument {src.index if src.index is not None else repr(src.name)}"
        elif isinstance(src, ExternalSource):
            where = f"the external tensor {format_path(src.path)}"
        elif isinstance(src, NodeSource):
            where = f"the output of node {src.node}"
        else:
            where = f"a tensor that {src.why}"
        dims = "x".join(str(s) for s in self.shape) or "scalar"
        return f"{where} ({dims}, {str(self.dtype).removeprefix('torch.')})"


@dataclass(frozen=True)
class Const:
    """A non-tensor value passed to a call (a Python number, a dtype, None...)."""

    value: Any

    @property
    def number(self) -> float | None:
        """The value as a float when it is a real Python number (bools are not numbers here)."""
        v = self.value
        if isinstance(v, bool) or not isinstance(v, int | float):
            return None
        return float(v)


Value = TensorValue | Const


class _Unrecorded:
    """The value of an opaque call's argument that is not plain data (a module, a container of
    tensors...): see ``Recorder._arguments``."""

    def __repr__(self) -> str:
        return "<unrecorded>"


UNRECORDED = _Unrecorded()


@dataclass(eq=False)
class Node:
    """One recorded (and normalized) call."""

    index: int
    kind: Kind
    name: str  # what the user's code called, e.g. "torch.Tensor.mul"
    inputs: tuple[Value, ...]
    params: dict[str, Any]
    outputs: tuple[TensorValue, ...] = ()
    absorbs: tuple[Node, ...] = ()  # nodes folded into this one by normalization
    synthetic: bool = False  # made by normalization, not called by the user

    @property
    def out(self) -> TensorValue:
        return self.outputs[0]

    def __repr__(self) -> str:
        return f"Node({self.index}, {self.kind.value}, {self.name}, params={self.params})"


@dataclass
class Graph:
    """The normalized dataflow of one call and everything the patterns need to judge it."""

    nodes: list[Node] = field(default_factory=list)
    output: Any = None  # the function's actual return value
    output_value: TensorValue | None = None  # set when the output is a single tracked tensor
    # Set when the output is a tuple or list: each element's value if it is a tensor, else None.
    output_values: tuple[TensorValue | None, ...] | None = None
    problems: list[str] = field(default_factory=list)  # reasons no pattern may match
    signature: CallSignature | None = None

    def producer(self, value: Value | None) -> Node | None:
        """The node that produced ``value``; None for arguments, externals and constants."""
        if isinstance(value, TensorValue) and isinstance(value.source, NodeSource):
            return self.nodes[value.source.node]
        return None

    def produced_by(self, value: Value | None, *kinds: Kind) -> Node | None:
        """The producer of ``value`` when it is one of ``kinds``."""
        node = self.producer(value)
        return node if node is not None and node.kind in kinds else None

    def uncovered(self, used: Iterable[Node]) -> list[Node]:
        """Recorded computations that are not part of ``used`` (absorbed nodes included)."""
        covered: set[int] = set()
        stack = list(used)
        while stack:
            node = stack.pop()
            if node.index not in covered:
                covered.add(node.index)
                stack.extend(node.absorbs)
        return [n for n in self.nodes if n.index not in covered and not n.synthetic]


# ---------------------------------------------------------------------------------------------
# The call signature a match is valid for
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TensorMeta:
    """What a later tensor must share with the captured one."""

    shape: tuple[int, ...]
    dtype: torch.dtype
    device: torch.device
    requires_grad: bool

    @classmethod
    def of(cls, t: torch.Tensor) -> TensorMeta:
        return cls(tuple(t.shape), t.dtype, t.device, t.requires_grad)

    def mismatch(self, value: Any) -> str | None:
        if not isinstance(value, torch.Tensor):
            return f"expected a tensor, got {type(value).__name__}"
        now = TensorMeta.of(value)
        return None if now == self else f"tensor {now} differs from the captured {self}"


def _freeze(value: Any, depth: int = 0) -> Any:
    """A comparable snapshot of plain data, or raise TypeError for anything else."""
    if depth > 4:
        raise TypeError("too deep")
    if value is None or isinstance(value, bool | int | float | complex | str | bytes | enum.Enum):
        return (type(value), value)
    if isinstance(value, torch.dtype | torch.device | torch.layout | torch.memory_format):
        return (type(value), value)
    if isinstance(value, tuple | list | frozenset | set):
        items = sorted(value, key=repr) if isinstance(value, set | frozenset) else value
        return (type(value), tuple(_freeze(v, depth + 1) for v in items))
    if isinstance(value, dict):
        return (type(value), tuple((_freeze(k, depth + 1), _freeze(v, depth + 1)) for k, v in value.items()))
    raise TypeError(type(value).__name__)


class _ArgGuard:
    """How one non-tensor argument must look on a later call."""

    def __init__(self, value: Any) -> None:
        self.frozen: Any = None
        self.ref: Callable[[], Any] | None = None
        self.method = False
        try:
            self.frozen = _freeze(value)
        except TypeError:
            # Not plain data (a module, a callable...): the very same object must be passed (a
            # bound method is made anew on each attribute read, so it is compared by ==).
            self.method = isinstance(value, types.MethodType)
            try:
                self.ref = weakref.WeakMethod(value) if self.method else weakref.ref(value)
            except TypeError:
                self.ref = functools.partial(lambda v: v, value)  # strong reference

    def mismatch(self, value: Any) -> str | None:
        if self.ref is not None:
            held = self.ref()
            same = held == value if self.method else held is value
            return None if same else f"a different {type(value).__name__} object"
        try:
            same = _freeze(value) == self.frozen
        except TypeError:
            same = False
        return None if same else f"{value!r} differs from the captured value"


@dataclass(frozen=True, eq=False)
class CallSignature:
    """The call a graph was captured from: what a later call must share for a match to hold.

    Every non-tensor argument is pinned (plain data by value, other objects by identity), as
    are the positional count, the keyword names, and each tensor argument's shape, dtype, device
    and ``requires_grad``: Python control flow on any of them is invisible to the capture.
    External tensors are re-reached by their path from the function (or from an argument), so
    a module whose weight was replaced or a rebound global no longer matches.
    """

    fn: Callable[..., Any]
    positional: tuple[TensorMeta | _ArgGuard, ...]
    keywords: Mapping[str, TensorMeta | _ArgGuard]
    reads: tuple[ConstantRead, ...] = ()  # plain values read from outside the arguments

    @classmethod
    def of(
        cls,
        fn: Callable[..., Any],
        args: Sequence[Any],
        kwargs: Mapping[str, Any],
        reads: Sequence[ConstantRead] = (),
    ) -> CallSignature:
        def guard(v: Any) -> TensorMeta | _ArgGuard:
            return TensorMeta.of(v) if isinstance(v, torch.Tensor) else _ArgGuard(v)

        return cls(fn, tuple(guard(a) for a in args), {k: guard(v) for k, v in kwargs.items()}, tuple(reads))

    def reads_mismatch(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> str | None:
        """None when every outside value the function reads by name (a global, a closure
        variable, ``self.eps``, a default) still has its captured value, else which one changed.

        Cheap enough for every call: a few attribute or dict reads per value, and an identity
        test for immutable ones.
        """
        for read in self.reads:
            if read.changed(self.fn, args, kwargs):
                return f"{format_path(read.path)} is no longer {read.value!r}"
        return None

    def mismatch(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> str | None:
        """None when ``(args, kwargs)`` is a call like the captured one, else why not."""
        if len(args) != len(self.positional):
            return f"{len(args)} positional arguments instead of {len(self.positional)}"
        if set(kwargs) != set(self.keywords):
            return f"keyword arguments {sorted(kwargs)} instead of {sorted(self.keywords)}"
        for i, (g, a) in enumerate(zip(self.positional, args, strict=True)):
            why = g.mismatch(a)
            if why:
                return f"argument {i}: {why}"
        for name, g in self.keywords.items():
            why = g.mismatch(kwargs[name])
            if why:
                return f"argument {name!r}: {why}"
        return self.reads_mismatch(args, kwargs)

    def external_mismatch(
        self, tensor: torch.Tensor, path: Path, meta: TensorMeta, args: Sequence[Any], kwargs: Mapping[str, Any]
    ) -> str | None:
        """None when ``path`` still reaches ``tensor``, unchanged in shape, dtype and device."""
        try:
            now = resolve_path(path, self.fn, args, kwargs)
        except Exception:  # an attribute deleted, a cell emptied...: the path is gone
            return f"the external tensor at {format_path(path)} can no longer be reached"
        if now is not tensor:
            return f"{format_path(path)} is now a different tensor"
        return meta.mismatch(now)


def _attr(obj: Any, dotted: Any) -> Any:
    for part in str(dotted).split("."):
        obj = getattr(obj, part)
    return obj


# How each step of a path goes from an object to the next one.
_STEPS: dict[str, Callable[[Any, Any], Any]] = {
    "attr": _attr,
    "cell": lambda obj, i: obj.__closure__[i].cell_contents,
    "global": lambda obj, name: obj.__globals__[name],
    "item": lambda obj, key: obj[key],
    "self": lambda obj, _: obj.__self__,
    "func": lambda obj, _: obj.func if isinstance(obj, functools.partial) else obj.__func__,
    "default": lambda obj, i: obj.__defaults__[i],
    "kwdefault": lambda obj, name: obj.__kwdefaults__[name],
}


def resolve_path(path: Path, fn: Any, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
    """Follow ``path`` from its root (the function, or an argument of this call)."""
    (root, key), *steps = path
    obj: Any = fn if root == "fn" else args[key] if root == "arg" else kwargs[key]
    for step, key in steps:
        if step not in _STEPS:
            raise ValueError(f"unknown path step {step!r}")
        obj = _STEPS[step](obj, key)
    return obj


def _apply_step(step: Callable[[Any, Any], Any], key: Any, obj: Any) -> Any:
    return step(obj, key)


def _path_reader(path: Path) -> Callable[[Any, Sequence[Any], Mapping[str, Any]], Any]:
    """:func:`resolve_path` for one path, prepared once for checks that run on every call: a
    run of attribute steps is one C-level ``attrgetter``, the other steps their functions."""
    (root, key), *steps = path
    getters: list[Callable[[Any], Any]] = []
    attrs: list[str] = []
    for step, k in [*steps, ("end", None)]:
        if step == "attr":
            attrs.append(str(k))
            continue
        if attrs:
            getters.append(operator.attrgetter(".".join(attrs)))
            attrs = []
        if step != "end":
            getters.append(functools.partial(_apply_step, _STEPS[step], k))

    def read(fn: Any, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
        obj = fn if root == "fn" else args[key] if root == "arg" else kwargs[key]
        for get in getters:
            obj = get(obj)
        return obj

    return read


def format_path(path: Path) -> str:
    (root, key), *steps = path
    text = "fn" if root == "fn" else f"args[{key}]" if root == "arg" else f"kwargs[{key!r}]"
    for step, k in steps:
        text += {
            "attr": f".{k}",
            "cell": f".<closure {k}>",
            "global": f".<global {k}>",
            "item": f"[{k!r}]",
            "self": ".__self__",
            "func": ".<func>",
            "default": f".<default {k}>",
            "kwdefault": f".<default {k}>",
        }.get(step, f".<{step}>")
    return text


# ---------------------------------------------------------------------------------------------
# Which tensors existed before the call and can be reached from the function
# ---------------------------------------------------------------------------------------------

_MAX_DEPTH = 6  # steps from a root: fn -> global helper -> its closure -> a module -> ...
_MAX_OBJECTS = 20000  # objects visited; a function reaching a huge object graph is cut short
_MAX_ITEMS = 256  # elements looked at in one container
_MODULE_INTERNALS = frozenset(vars(torch.nn.Module()))


def _code_names(code: types.CodeType) -> Iterator[str]:
    """Global names a code object (and the code objects nested in it) may read."""
    yield from code.co_names
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _code_names(const)


def _children(obj: Any) -> Iterator[tuple[tuple[str, Any], Any]]:
    """(step, child) pairs to walk from ``obj``: where a function's tensors can live."""
    if isinstance(obj, torch.nn.Module):
        for name, p in obj.named_parameters():
            yield ("attr", name), p
        for name, b in obj.named_buffers():
            yield ("attr", name), b
        for name, v in vars(obj).items():
            if name not in _MODULE_INTERNALS:
                yield ("attr", name), v
        for name, sub in obj._modules.items():
            yield ("attr", name), sub
    elif isinstance(obj, types.MethodType):
        yield ("self", None), obj.__self__
        yield ("func", None), obj.__func__
    elif isinstance(obj, functools.partial):
        yield ("func", None), obj.func
        yield ("attr", "args"), obj.args
        yield ("attr", "keywords"), obj.keywords
    elif isinstance(obj, types.FunctionType):
        for i, cell in enumerate(obj.__closure__ or ()):
            try:
                yield ("cell", i), cell.cell_contents
            except ValueError:  # an empty cell
                continue
        for name in dict.fromkeys(_code_names(obj.__code__)):
            if name in obj.__globals__:
                yield ("global", name), obj.__globals__[name]
        for i, d in enumerate(obj.__defaults__ or ()):
            yield ("default", i), d
        for k, d in (obj.__kwdefaults__ or {}).items():
            yield ("kwdefault", k), d
        if hasattr(obj, "__wrapped__"):
            yield ("attr", "__wrapped__"), obj.__wrapped__
    elif isinstance(obj, list | tuple):
        for i, v in enumerate(obj[:_MAX_ITEMS]):
            yield ("item", i), v
    elif isinstance(obj, dict):
        for k, v in list(obj.items())[:_MAX_ITEMS]:
            if isinstance(k, str | int):
                yield ("item", k), v
    elif hasattr(obj, "__dict__") and not isinstance(obj, type | types.ModuleType | types.BuiltinFunctionType):
        # A callable object or a plain object holding tensors (a config, a cache).
        for name, v in list(vars(obj).items())[:_MAX_ITEMS]:
            yield ("attr", name), v


def _walkable(obj: Any) -> bool:
    if obj is None or isinstance(obj, bool | int | float | complex | str | bytes | torch.Tensor):
        return False
    return not isinstance(obj, type | types.ModuleType | types.BuiltinFunctionType | torch.dtype | torch.device)


def reachable_tensors(roots: Iterable[tuple[Path, Any]]) -> dict[int, tuple[torch.Tensor, Path]]:
    """Tensors reachable from ``roots`` (breadth first, so each gets its shortest path)."""
    found: dict[int, tuple[torch.Tensor, Path]] = {}
    seen: set[int] = set()
    queue: deque[tuple[Path, Any]] = deque(roots)
    while queue and len(seen) < _MAX_OBJECTS:
        path, obj = queue.popleft()
        if isinstance(obj, torch.Tensor):
            found.setdefault(id(obj), (obj, path))
            continue
        if id(obj) in seen or not _walkable(obj) or len(path) > _MAX_DEPTH:
            continue
        seen.add(id(obj))
        try:
            for step, child in _children(obj):
                if isinstance(child, torch.Tensor) or _walkable(child):
                    queue.append(((*path, step), child))
        except Exception:  # an object whose attributes misbehave: leave it out
            logger.debug("not walking %s", type(obj).__name__, exc_info=True)
    return found


# ---------------------------------------------------------------------------------------------
# Plain values the function reads from outside its arguments
# ---------------------------------------------------------------------------------------------
#
# A Python number the function takes from a global, a closure variable, ``self.eps`` or a default
# reaches the capture as a bare constant: nothing in the call says where it came from, and the
# call signature pins only the arguments. So the places a function can read such a value *by
# name* are listed before the call (the names its code, and the code of the functions and
# modules it names, load), each with its value; every later call re-reads them and a change
# makes the match stale (the decorator then recognizes the function again, with the new value).
# What is followed: globals named by the code, closure cells, defaults, attributes named by the
# code on the objects reached (``self``, a config object, an ``nn.Module`` and the submodules it
# names, each module read with the names of its own ``forward``), dict items, user modules'
# attributes. What is not: library code's own globals (torch's, the standard library's), values
# reached through descriptors (properties run code) or through names built at run time
# (``getattr(self, "e" + "ps")``).

_MAX_READS = 64  # outside values checked on every call; a function reading more is refused
_MAX_READ_OBJECTS = 2000  # objects looked at while listing them
_MAX_READ_SIZE = 64  # elements of one plain container (larger ones cost too much to compare)
_LIBRARIES = frozenset(sys.stdlib_module_names) | {"torch", "triton", "numpy", "kernelsmith", "typing_extensions"}
_IMMUTABLE = (type(None), bool, int, float, complex, str, bytes, enum.Enum, torch.dtype, torch.device, torch.layout,
              torch.memory_format)  # fmt: skip
_MISSING = object()


@dataclass(frozen=True, eq=False)
class ConstantRead:
    """A plain value (a number, a string, a small tuple or dict of them...) the function can read
    from outside its arguments, where it is (``path``, from the function or an argument) and what
    it was when the call was captured."""

    path: Path
    value: Any = field(repr=False)
    frozen: Any = field(repr=False)
    immutable: bool
    read: Callable[[Any, Sequence[Any], Mapping[str, Any]], Any] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "read", _path_reader(self.path))

    def changed(self, fn: Any, args: Sequence[Any], kwargs: Mapping[str, Any]) -> bool:
        """Whether ``path`` now holds something other than the captured value (or nothing)."""
        try:
            now = self.read(fn, args, kwargs)
        except Exception:  # an attribute deleted, a global removed, an argument missing
            return True
        if now is self.value and self.immutable:
            return False
        try:
            return _freeze(now) != self.frozen
        except TypeError:
            return True


def _library(obj: Any) -> bool:
    """Whether ``obj`` (a function, a class, a module) belongs to torch, the standard library or
    another library whose own state is taken as fixed."""
    name = obj.__name__ if isinstance(obj, types.ModuleType) else getattr(obj, "__module__", None)
    return isinstance(name, str) and name.partition(".")[0] in _LIBRARIES


def _plain_read(value: Any) -> tuple[Any, bool] | None:
    """``(frozen, immutable)`` for a small plain value worth pinning; None for anything else."""

    def size(v: Any, depth: int = 0) -> int:
        if isinstance(v, list | tuple | set | frozenset | dict) and depth < 4:
            items = [*v.keys(), *v.values()] if isinstance(v, dict) else list(v)
            return 1 + sum(size(i, depth + 1) for i in items[: _MAX_READ_SIZE + 1])
        return 1

    if isinstance(value, torch.Tensor) or size(value) > _MAX_READ_SIZE:
        return None
    try:
        frozen = _freeze(value)
    except TypeError:
        return None

    def immutable(v: Any) -> bool:
        if isinstance(v, tuple | frozenset):
            return all(immutable(i) for i in v)
        return isinstance(v, _IMMUTABLE)

    return frozen, immutable(value)


def _function_names(fn: Any) -> frozenset[str]:
    code = getattr(fn, "__code__", None)
    return frozenset(_code_names(code)) if isinstance(code, types.CodeType) else frozenset()


def _static_attribute(obj: Any, name: str) -> Any:
    """``obj.name`` without running a property or ``__getattr__`` (``_MISSING`` when it is not a
    plain stored value: an instance attribute, a submodule, a class attribute or a method)."""
    try:
        stored = object.__getattribute__(obj, "__dict__")
    except AttributeError:
        stored = {}
    if name in stored:
        return stored[name]
    if isinstance(obj, torch.nn.Module):
        for table in ("_modules", "_parameters", "_buffers"):
            if name in stored.get(table, {}):
                return stored[table][name]
    for klass in type(obj).__mro__:
        if name in vars(klass):
            found = vars(klass)[name]
            if isinstance(found, types.FunctionType):
                return types.MethodType(found, obj)
            return _MISSING if hasattr(found, "__get__") or hasattr(found, "__set__") else found
    return _MISSING


def constant_reads(fn: Callable[..., Any], args: Sequence[Any], kwargs: Mapping[str, Any]) -> list[ConstantRead] | None:
    """The plain values ``fn`` can read by name from outside its arguments (see above).

    None when there are more than can be checked cheaply on every call.
    """
    reads: list[ConstantRead] = []
    seen: dict[int, frozenset[str]] = {}
    fn_names = _function_names(getattr(fn, "__func__", fn))
    queue: deque[tuple[Path, Any, frozenset[str]]] = deque([((("fn", None),), fn, fn_names)])
    queue.extend(((("arg", i),), a, fn_names) for i, a in enumerate(args) if not isinstance(a, torch.Tensor))
    queue.extend(((("kwarg", k),), v, fn_names) for k, v in kwargs.items() if not isinstance(v, torch.Tensor))
    looked = 0
    while queue and looked < _MAX_READ_OBJECTS:
        path, obj, names = queue.popleft()
        if len(path) > 1 + _MAX_DEPTH or isinstance(obj, torch.Tensor):
            continue
        plain = _plain_read(obj)
        if plain is not None:
            if len(path) > 1:  # an argument itself is pinned by the call signature already
                reads.append(ConstantRead(path, obj, *plain))
                if len(reads) > _MAX_READS:
                    return None
            continue
        before = seen.get(id(obj))
        if before is not None and names <= before:
            continue  # walked already, for these names at least
        seen[id(obj)] = names if before is None else before | names
        looked += 1
        try:
            queue.extend((((*path, step), child, child_names) for step, child, child_names in _reads_from(obj, names)))
        except Exception:  # an object whose attributes misbehave: leave it out
            logger.debug("not listing the reads of %s", type(obj).__name__, exc_info=True)
    return reads


def _reads_from(obj: Any, names: frozenset[str]) -> Iterator[tuple[tuple[str, Any], Any, frozenset[str]]]:
    """(step, child, the names the code handling the child may read on it) to walk from ``obj``."""
    if isinstance(obj, types.FunctionType):
        if _library(obj):
            return  # torch's and the standard library's own globals and defaults are theirs
        own = _function_names(obj)
        for i, cell in enumerate(obj.__closure__ or ()):
            try:
                yield ("cell", i), cell.cell_contents, own
            except ValueError:  # an empty cell
                continue
        for name in own:
            if name in obj.__globals__:
                yield ("global", name), obj.__globals__[name], own
        for i, d in enumerate(obj.__defaults__ or ()):
            yield ("default", i), d, own
        for k, d in (obj.__kwdefaults__ or {}).items():
            yield ("kwdefault", k), d, own
        if hasattr(obj, "__wrapped__"):
            yield ("attr", "__wrapped__"), obj.__wrapped__, own
    elif isinstance(obj, types.MethodType):
        # The method's code reads its own names on self (self.eps), library method or not.
        yield ("self", None), obj.__self__, _function_names(obj.__func__)
        yield ("func", None), obj.__func__, names
    elif isinstance(obj, functools.partial):
        yield ("func", None), obj.func, names
        yield ("attr", "args"), obj.args, names
        yield ("attr", "keywords"), obj.keywords, names
    elif isinstance(obj, list | tuple):
        for i, v in enumerate(obj[:_MAX_ITEMS]):
            yield ("item", i), v, names
    elif isinstance(obj, dict):
        for k, v in list(obj.items())[:_MAX_ITEMS]:
            if isinstance(k, str | int):
                yield ("item", k), v, names
    elif isinstance(obj, types.ModuleType):
        if not _library(obj):  # a user's config module: config.EPS
            for name in names:
                if name in vars(obj):
                    yield ("attr", name), vars(obj)[name], names
    elif isinstance(obj, type):
        if not _library(obj):  # a user's class used as a namespace: Config.EPS
            for name in names:
                for klass in obj.__mro__:
                    if name in vars(klass):
                        if not hasattr(vars(klass)[name], "__get__"):  # not a method or property
                            yield ("attr", name), vars(klass)[name], names
                        break
    elif isinstance(obj, types.BuiltinFunctionType):
        return
    else:
        if isinstance(obj, torch.nn.Module):
            names = names | _function_names(type(obj).forward)  # what calling the module reads
        elif callable(obj):
            names = names | _function_names(inspect.getattr_static(type(obj), "__call__", None))
        for name in sorted(names):
            child = _static_attribute(obj, name)
            if child is _MISSING or isinstance(child, torch.Tensor):
                continue
            if isinstance(child, types.MethodType):
                if not _library(child.__func__):  # self._norm(x): what the helper reads on self
                    yield ("attr", name), child, names
            else:
                yield ("attr", name), child, names


# ---------------------------------------------------------------------------------------------
# Recording
# ---------------------------------------------------------------------------------------------

_MUL = {"torch.mul", "torch.multiply", "torch.Tensor.mul", "torch.Tensor.multiply", "torch.Tensor.__mul__",
        "torch.Tensor.__rmul__"}  # fmt: skip
_ADD = {"torch.add", "torch.Tensor.add", "torch.Tensor.__add__", "torch.Tensor.__radd__"}
_SUB = {"torch.sub", "torch.subtract", "torch.Tensor.sub", "torch.Tensor.subtract", "torch.Tensor.__sub__"}
_RSUB = {"torch.rsub", "torch.Tensor.__rsub__"}  # (self, other) means other - self
_DIV = {"torch.div", "torch.divide", "torch.true_divide", "torch.Tensor.div", "torch.Tensor.divide",
        "torch.Tensor.true_divide", "torch.Tensor.__truediv__", "torch.Tensor.__div__"}  # fmt: skip
_RDIV = {"torch.Tensor.__rtruediv__", "torch.Tensor.__rdiv__"}  # (self, other) means other / self
_POW = {"torch.pow", "torch.Tensor.pow", "torch.Tensor.__pow__"}
_UNARY = {
    **dict.fromkeys(("torch.exp", "torch.Tensor.exp"), Kind.EXP),
    **dict.fromkeys(("torch.sqrt", "torch.Tensor.sqrt"), Kind.SQRT),
    **dict.fromkeys(("torch.rsqrt", "torch.Tensor.rsqrt"), Kind.RSQRT),
    **dict.fromkeys(("torch.reciprocal", "torch.Tensor.reciprocal"), Kind.RECIPROCAL),
    **dict.fromkeys(("torch.square", "torch.Tensor.square"), Kind.SQUARE),
    **dict.fromkeys(("torch.sigmoid", "torch.Tensor.sigmoid", "torch.special.expit",
                     "torch.nn.functional.sigmoid"), Kind.SIGMOID),
    **dict.fromkeys(("torch.erf", "torch.Tensor.erf", "torch.special.erf"), Kind.ERF),
    **dict.fromkeys(("torch.tanh", "torch.Tensor.tanh", "torch.nn.functional.tanh"), Kind.TANH),
}
_REDUCE = {
    **dict.fromkeys(("torch.mean", "torch.Tensor.mean"), Kind.MEAN),
    **dict.fromkeys(("torch.sum", "torch.Tensor.sum"), Kind.SUM),
    **dict.fromkeys(("torch.amax", "torch.Tensor.amax", "torch.max", "torch.Tensor.max"), Kind.MAX),
}
_SOFTMAX_ARGS = ("input", "dim", "dtype")
_SOFTMAX = {
    "torch.nn.functional.softmax": (Kind.SOFTMAX, ("input", "dim", "_stacklevel", "dtype")),
    "torch.softmax": (Kind.SOFTMAX, _SOFTMAX_ARGS),
    "torch.Tensor.softmax": (Kind.SOFTMAX, _SOFTMAX_ARGS),
    "torch.special.softmax": (Kind.SOFTMAX, _SOFTMAX_ARGS),
    "torch.nn.functional.log_softmax": (Kind.LOG_SOFTMAX, ("input", "dim", "_stacklevel", "dtype")),
    "torch.log_softmax": (Kind.LOG_SOFTMAX, _SOFTMAX_ARGS),
    "torch.Tensor.log_softmax": (Kind.LOG_SOFTMAX, _SOFTMAX_ARGS),
    "torch.special.log_softmax": (Kind.LOG_SOFTMAX, _SOFTMAX_ARGS),
}
_RMS_NORM = {"torch.nn.functional.rms_norm", "torch.rms_norm"}
_LAYER_NORM = {"torch.nn.functional.layer_norm", "torch.layer_norm"}
_VAR = {"torch.var", "torch.Tensor.var"}
_GELU = {"torch.nn.functional.gelu"}
_SILU = {"torch.nn.functional.silu"}
_CROSS_ENTROPY = {"torch.nn.functional.cross_entropy"}
# Splits into consecutive pieces along one dim: the second argument (how to split) is not read,
# the pieces' sizes in the result say where each one starts.
_SPLITS = {"torch.chunk", "torch.Tensor.chunk", "torch.split", "torch.Tensor.split", "torch.tensor_split",
           "torch.Tensor.tensor_split"}  # fmt: skip
_SPLIT_ALIASES = {"tensor": "input", "self": "input", "chunks": "how", "split_size": "how",
                  "split_size_or_sections": "how", "indices_or_sections": "how", "sections": "how",
                  "indices": "how"}  # fmt: skip
_NARROW = {"torch.narrow", "torch.Tensor.narrow"}
_CASTS = {"torch.Tensor.to", "torch.Tensor.type", "torch.Tensor.type_as", "torch.Tensor.float",
          "torch.Tensor.half", "torch.Tensor.bfloat16", "torch.Tensor.double"}  # fmt: skip
_CONSTANTS = {"torch.tensor", "torch.scalar_tensor", "torch.as_tensor"}
# Calls that only read metadata (shape, dtype, layout): not computations, not data reads.
_METADATA = {"size", "dim", "ndimension", "stride", "numel", "nelement", "is_contiguous", "element_size",
             "get_device", "is_floating_point", "is_complex", "is_signed", "storage_offset", "data_ptr",
             "__len__", "type", "result_type", "can_cast", "is_same_size", "__hash__", "is_inference",
             "is_pinned", "is_shared", "has_names", "dim_order", "is_nonzero_size"}  # fmt: skip


_INPLACE_DUNDERS = {"__setitem__", "__iadd__", "__isub__", "__imul__", "__itruediv__", "__idiv__",
                    "__ifloordiv__", "__imod__", "__ipow__", "__imatmul__", "__iand__", "__ior__", "__ixor__",
                    "__ilshift__", "__irshift__"}  # fmt: skip
_BINARY = _MUL | _ADD | _SUB | _RSUB | _DIV | _RDIV
_BINARY_KIND = {
    **dict.fromkeys(_MUL, Kind.MUL),
    **dict.fromkeys(_ADD, Kind.ADD),
    **dict.fromkeys(_SUB | _RSUB, Kind.SUB),
    **dict.fromkeys(_DIV | _RDIV, Kind.DIV),
}


def _function_name(func: Any) -> str:
    """A stable dotted name for an overridable torch function, across torch versions."""
    try:
        name = resolve_name(func)
    except Exception:
        name = None
    if name:
        return str(name)
    qualname = getattr(func, "__qualname__", None) or getattr(func, "__name__", None)
    return str(qualname) if qualname else repr(func)


def _mutates(name: str, kwargs: Mapping[str, Any]) -> bool:
    """Whether a call writes into an existing tensor (in-place method, setitem, out=, inplace=)."""
    last = name.rsplit(".", 1)[-1]
    if last.startswith("__"):
        return last in _INPLACE_DUNDERS
    return last.endswith("_") or kwargs.get("out") is not None or kwargs.get("inplace") is True


def _has_tensor(obj: Any, depth: int = 0) -> bool:
    if isinstance(obj, torch.Tensor):
        return True
    if depth < 3 and isinstance(obj, list | tuple):
        return any(_has_tensor(o, depth + 1) for o in obj)
    if depth < 3 and isinstance(obj, dict):
        return any(_has_tensor(o, depth + 1) for o in obj.values())
    return False


def _tensors(obj: Any, depth: int = 0) -> Iterator[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        yield obj
    elif depth < 3 and isinstance(obj, list | tuple):
        for o in obj:
            yield from _tensors(o, depth + 1)
    elif depth < 3 and isinstance(obj, dict):
        for o in obj.values():
            yield from _tensors(o, depth + 1)


def _bind(names: Sequence[str], args: Sequence[Any], kwargs: Mapping[str, Any]) -> dict[str, Any] | None:
    """Map positional and keyword arguments to parameter names; None when they do not fit."""
    if len(args) > len(names):
        return None
    bound = dict(zip(names, args, strict=False))
    for k, v in kwargs.items():
        if k in bound or k not in names:
            return None
        bound[k] = v
    return bound


def _dims(dim: Any, ndim: int) -> tuple[int, ...] | None:
    """Reduction dims normalized to sorted non-negative ints; None means every dim."""
    if dim is None or (isinstance(dim, list | tuple) and len(dim) == 0):
        return None
    items = dim if isinstance(dim, list | tuple) else (dim,)
    out = []
    for d in items:
        if isinstance(d, bool) or not isinstance(d, int):
            raise ValueError(f"dim {d!r}")
        rank = max(ndim, 1)
        if not -rank <= d < rank:
            raise ValueError(f"dim {d} out of range")
        out.append(d % rank)
    return tuple(sorted(set(out)))


def _softmax_dim(dim: Any, ndim: int) -> int:
    """The dim softmax normalizes over; ``dim=None`` is torch's legacy implicit choice."""
    if dim is None:
        return 0 if ndim in (0, 1, 3) else 1
    dims = _dims(dim, ndim)
    if dims is None or len(dims) != 1:
        raise ValueError(f"dim {dim!r}")
    return dims[0]


class _Unnormalized(Exception):
    """A call that looks like a known one but is used in a way no pattern handles."""


class Recorder:
    """Builds a :class:`Graph` from the calls a capture mode reports."""

    def __init__(self, fn: Callable[..., Any], args: Sequence[Any], kwargs: Mapping[str, Any]) -> None:
        reads = constant_reads(fn, args, kwargs)
        self.graph = Graph(signature=CallSignature.of(fn, args, kwargs, reads or ()))
        if reads is None:
            self.problem(f"reads more than {_MAX_READS} values from outside its arguments: too many to check per call")
        self._values: dict[int, TensorValue] = {}
        self._alive: list[Any] = []  # keeps every seen tensor alive, so that no id is reused
        self._container_ids: set[int] = set()
        for i, a in enumerate(args):
            self._register_arg(a, ArgSource(index=i))
        for k, v in kwargs.items():
            self._register_arg(v, ArgSource(name=k))
        roots: list[tuple[Path, Any]] = [((("fn", None),), fn)]
        roots += [((("arg", i),), a) for i, a in enumerate(args) if isinstance(a, torch.nn.Module)]
        roots += [((("kwarg", k),), v) for k, v in kwargs.items() if isinstance(v, torch.nn.Module)]
        self._reachable = reachable_tensors(roots)

    # ---- values ------------------------------------------------------------------------------
    def _register_arg(self, obj: Any, source: ArgSource) -> None:
        if isinstance(obj, torch.Tensor):
            if id(obj) not in self._values:
                self._new_value(obj, source)
        else:
            for t in _tensors(obj):
                self._container_ids.add(id(t))
                self._alive.append(t)

    def _new_value(self, t: torch.Tensor, source: Source) -> TensorValue:
        value = TensorValue(
            vid=len(self._alive),
            source=source,
            shape=tuple(t.shape),
            dtype=t.dtype,
            device=t.device,
            plain=type(t) in (torch.Tensor, torch.nn.Parameter),
        )
        self._alive.append(t)
        self._values[id(t)] = value
        return value

    def value(self, obj: Any) -> Value:
        """The graph value of a call argument (a tensor met for the first time is classified)."""
        if not isinstance(obj, torch.Tensor):
            return Const(obj)
        known = self._values.get(id(obj))
        if known is not None:
            return known
        if id(obj) in self._reachable:
            tensor, path = self._reachable[id(obj)]
            return self._new_value(obj, ExternalSource(tensor, path))
        if id(obj) in self._container_ids:
            return self._new_value(obj, UnknownSource("is inside a container argument"))
        return self._new_value(obj, UnknownSource("was made by code the capture cannot see (not a torch call)"))

    def tensor_value(self, obj: Any) -> TensorValue:
        v = self.value(obj)
        if not isinstance(v, TensorValue):
            raise _Unnormalized(f"expected a tensor, got {type(obj).__name__}")
        return v

    # ---- nodes -------------------------------------------------------------------------------
    def _add(
        self,
        kind: Kind,
        name: str,
        inputs: Sequence[Value],
        params: dict[str, Any] | None = None,
        result: Any = None,
        absorbs: Sequence[Node] = (),
        like: TensorValue | None = None,
    ) -> Node:
        """Append a node; its outputs come from ``result`` or, for a synthetic node, ``like``."""
        node = Node(len(self.graph.nodes), kind, name, tuple(inputs), dict(params or {}), absorbs=tuple(absorbs))
        self.graph.nodes.append(node)
        if like is not None:
            node.synthetic = True
            node.outputs = (
                TensorValue(-1 - node.index, NodeSource(node.index), like.shape, like.dtype, like.device, like.plain),
            )
        elif isinstance(result, torch.Tensor):
            node.outputs = (self._output(result, NodeSource(node.index)),)
        else:
            outs = []
            for i, r in enumerate(result if isinstance(result, list | tuple) else ()):
                if isinstance(r, torch.Tensor):
                    outs.append(self._output(r, NodeSource(node.index, i)))
            node.outputs = tuple(outs)
        return node

    def _output(self, t: torch.Tensor, source: NodeSource) -> TensorValue:
        known = self._values.get(id(t))
        return known if known is not None else self._new_value(t, source)

    def fail(self, err: BaseException) -> None:
        logger.debug("capture could not record a call", exc_info=err)
        self.problem(f"internal capture error ({type(err).__name__}: {err})")

    def problem(self, text: str) -> None:
        if text not in self.graph.problems:
            self.graph.problems.append(text)

    def record(self, func: Any, args: Sequence[Any], kwargs: Mapping[str, Any], result: Any) -> None:
        """Record one call the user's code made (after it ran)."""
        name = _function_name(func)
        if name.endswith(".__get__") or getattr(func, "__name__", "") == "__get__":
            # A property read: x.dtype, x.shape are not computations; x.T, x.data make tensors
            # through a path no pattern looks through.
            if isinstance(result, torch.Tensor):
                self._add(Kind.OTHER, name.removesuffix(".__get__"), [self.value(t) for t in _tensors(args)],
                          result=result)  # fmt: skip
            return
        if _mutates(name, kwargs):
            self.problem(f"mutates a tensor in place ({name})")
            return
        tensors_in = list(_tensors(args)) + list(_tensors(kwargs))
        if not _has_tensor(result):
            if tensors_in and name.rsplit(".", 1)[-1] not in _METADATA:
                self.problem(f"reads tensor values into Python ({name}): it may branch on data")
            return
        if isinstance(result, torch.Tensor) and any(result is t for t in tensors_in):
            return  # returns an input as it is (x.float() of a float32 x, x.contiguous()...)
        try:
            self._normalized(name, args, kwargs, result)
        except (_Unnormalized, ValueError, TypeError, IndexError) as err:
            logger.debug("%s recorded as an opaque call: %s", name, err)
            self._add(Kind.OTHER, name, [self.value(t) for t in tensors_in], self._arguments(args, kwargs), result)

    def _arguments(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> dict[str, Any]:
        """An opaque call's arguments, for the patterns that read them (attention's ``is_causal``
        and ``scale``, a transpose's dims): ``{"args": (...), "kwargs": {...}}``, each tensor as
        its graph value, plain data as a :class:`Const`, anything else as ``Const(UNRECORDED)``
        (the graph keeps no references to the call's objects)."""

        def plain(a: Any, depth: int = 0) -> bool:  # plain data, indexing (slices, ...) included
            if isinstance(a, slice):
                return all(plain(x, depth + 1) for x in (a.start, a.stop, a.step))
            if a is Ellipsis:
                return True
            if isinstance(a, tuple | list):
                return depth < 4 and all(plain(x, depth + 1) for x in a)
            try:
                _freeze(a)
            except TypeError:
                return False
            return True

        def convert(a: Any) -> Value:
            if isinstance(a, torch.Tensor):
                return self.value(a)
            return Const(a) if plain(a) else Const(UNRECORDED)

        return {"args": tuple(convert(a) for a in args), "kwargs": {k: convert(v) for k, v in kwargs.items()}}

    # ---- normalization -----------------------------------------------------------------------
    def _normalized(self, name: str, args: Sequence[Any], kwargs: Mapping[str, Any], result: Any) -> None:
        single = isinstance(result, torch.Tensor)
        if name in _BINARY and single:
            extra = "rounding_mode" if name in _DIV | _RDIV else "alpha"
            b = _bind(("input", "other", extra), args, kwargs)
            if b is None or "other" not in b:
                raise _Unnormalized("arguments")
            if b.get("alpha", 1) != 1 or b.get("rounding_mode") is not None:
                raise _Unnormalized("alpha or rounding_mode")
            a, o = self.value(b["input"]), self.value(b["other"])
            if name in _RSUB | _RDIV:
                a, o = o, a
            self._binary(_BINARY_KIND[name], name, a, o, result)
        elif name in _POW and single:
            b = _bind(("input", "exponent"), args, kwargs)
            if b is None or "exponent" not in b or isinstance(b["exponent"], torch.Tensor):
                raise _Unnormalized("exponent")
            self._pow(name, self.tensor_value(b["input"]), Const(b["exponent"]), result)
        elif name in _UNARY and single:
            b = _bind(("input",), args, kwargs)
            if b is None or set(b) != {"input"}:
                raise _Unnormalized("arguments")
            self._unary(_UNARY[name], name, self.tensor_value(b["input"]), result)
        elif name in _REDUCE:
            self._reduce(_REDUCE[name], name, args, kwargs, result)
        elif name in _SOFTMAX and single:
            kind, names = _SOFTMAX[name]
            b = _bind(names, args, kwargs)
            if b is None or not set(b) <= {*names, "_stacklevel"}:
                raise _Unnormalized("arguments")
            x = self.tensor_value(b["input"])
            dim = _softmax_dim(b.get("dim"), x.ndim)
            self._add(kind, name, [x], {"dim": dim, "dtype": b.get("dtype")}, result)
        elif name in _RMS_NORM and single:
            b = _bind(("input", "normalized_shape", "weight", "eps"), args, kwargs)
            if b is None or "normalized_shape" not in b:
                raise _Unnormalized("arguments")
            shape = b["normalized_shape"]
            shape = (shape,) if isinstance(shape, int) else tuple(shape)
            x, w = self.tensor_value(b["input"]), self.value(b.get("weight"))
            self._add(Kind.RMS_NORM, name, [x, w], {"normalized_shape": shape, "eps": b.get("eps")}, result)
        elif name in _LAYER_NORM and single:
            b = _bind(("input", "normalized_shape", "weight", "bias", "eps", "cudnn_enable"), args, kwargs)
            if b is None or "normalized_shape" not in b:
                raise _Unnormalized("arguments")
            shape = b["normalized_shape"]
            shape = (shape,) if isinstance(shape, int) else tuple(shape)
            x, w, bias = self.tensor_value(b["input"]), self.value(b.get("weight")), self.value(b.get("bias"))
            params = {"normalized_shape": shape, "eps": b.get("eps", 1e-5)}
            self._add(Kind.LAYER_NORM, name, [x, w, bias], params, result)
        elif name in _VAR and single:
            self._var(name, args, kwargs, result)
        elif name in _GELU and single:
            b = _bind(("input", "approximate"), args, kwargs)
            if b is None or "input" not in b:
                raise _Unnormalized("arguments")
            params = {"approximate": b.get("approximate", "none")}
            self._add(Kind.GELU, name, [self.tensor_value(b["input"])], params, result)
        elif name in _SILU and single:
            b = _bind(("input", "inplace"), args, kwargs)
            if b is None or "input" not in b or b.get("inplace", False) is not False:
                raise _Unnormalized("arguments")
            self._add(Kind.SILU, name, [self.tensor_value(b["input"])], result=result)
        elif name in _CROSS_ENTROPY and single:
            names = ("input", "target", "weight", "size_average", "ignore_index", "reduce", "reduction",
                     "label_smoothing")  # fmt: skip
            b = _bind(names, args, kwargs)
            if b is None or "target" not in b:
                raise _Unnormalized("arguments")
            inputs = [self.tensor_value(b["input"]), self.tensor_value(b["target"]), self.value(b.get("weight"))]
            params = {
                "reduction": b.get("reduction", "mean"),
                "ignore_index": b.get("ignore_index", -100),
                "label_smoothing": b.get("label_smoothing", 0.0),
                "size_average": b.get("size_average"),
                "reduce": b.get("reduce"),
            }
            self._add(Kind.CROSS_ENTROPY, name, inputs, params, result)
        elif name in _SPLITS and isinstance(result, list | tuple) and all(isinstance(r, torch.Tensor) for r in result):
            self._split(name, args, kwargs, result)
        elif name == "torch.Tensor.__getitem__" and single and len(args) == 2 and not kwargs:
            x = self.tensor_value(args[0])
            self._add(Kind.SLICE, name, [x], _basic_slice(args[1], x.shape, tuple(result.shape)), result)
        elif name in _NARROW and single:
            b = _bind(("input", "dim", "start", "length"), args, kwargs)
            if b is None or set(b) != {"input", "dim", "start", "length"}:
                raise _Unnormalized("arguments")
            x = self.tensor_value(b["input"])
            dim, start, length = _softmax_dim(b["dim"], x.ndim), b["start"], b["length"]
            if isinstance(start, bool) or not isinstance(start, int) or not isinstance(length, int):
                raise _Unnormalized("start or length")
            start = start + x.shape[dim] if start < 0 else start
            if tuple(result.shape) != (*x.shape[:dim], length, *x.shape[dim + 1 :]):
                raise _Unnormalized("result")
            self._add(Kind.SLICE, name, [x], {"dim": dim, "start": start, "stop": start + length}, result)
        elif name in _CASTS and single and args and isinstance(args[0], torch.Tensor):
            src = args[0]
            if tuple(result.shape) != tuple(src.shape) or result.device != src.device or result.dtype == src.dtype:
                raise _Unnormalized("not a pure dtype change")
            self._add(Kind.CAST, name, [self.tensor_value(src)], {"dtype": result.dtype}, result)
        elif name in _CONSTANTS and single:
            data = args[0] if args else kwargs.get("data")
            if Const(data).number is None or result.dim() != 0 or _has_tensor(list(args) + list(kwargs.values())):
                raise _Unnormalized("not a constant number")
            self._add(Kind.CONST, name, [], {"value": data}, result)
        else:
            raise _Unnormalized("no normalization")

    def _binary(self, kind: Kind, name: str, a: Value, b: Value, result: Any) -> Node:
        if kind is Kind.MUL:
            if a is b and isinstance(a, TensorValue):
                return self._add(Kind.SQUARE, name, [a], result=result)
            for t, other in ((a, b), (b, a)):
                # a * (1 / b) is a / b (one rounding fewer; the recognized op rounds once anyway).
                recip = self.graph.produced_by(t, Kind.RECIPROCAL)
                if recip is not None and isinstance(other, TensorValue):
                    return self._add(Kind.DIV, name, [other, recip.inputs[0]], result=result, absorbs=[recip])
                # s.sum(d) * (1 / N) is s.mean(d).
                mean = self._mean_from_sum(t, other, reciprocal=True)
                if mean is not None:
                    return self._add(Kind.MEAN, name, mean.inputs, mean.params, result, absorbs=[mean])
        if kind is Kind.DIV:
            if isinstance(b, TensorValue) and Const(getattr(a, "value", None)).number == 1.0:
                return self._unary(Kind.RECIPROCAL, name, b, result)
            sqrt = self.graph.produced_by(b, Kind.SQRT)
            if sqrt is not None and isinstance(a, TensorValue):
                # x / sqrt(v) is x * rsqrt(v): a synthetic RSQRT stands for the division.
                rsqrt = self._add(Kind.RSQRT, "rsqrt", sqrt.inputs, absorbs=[sqrt], like=sqrt.out)
                return self._add(Kind.MUL, name, [a, rsqrt.out], result=result, absorbs=[rsqrt])
            mean = self._mean_from_sum(a, b, reciprocal=False)
            if mean is not None:
                return self._add(Kind.MEAN, name, mean.inputs, mean.params, result, absorbs=[mean])
        return self._add(kind, name, [a, b], result=result)

    def _mean_from_sum(self, s: Value, n: Value, reciprocal: bool) -> Node | None:
        """The SUM node when ``s / n`` (or ``s * n`` with ``n = 1/N``) is a mean over its dim."""
        node = self.graph.produced_by(s, Kind.SUM)
        number = n.number if isinstance(n, Const) else None
        if node is None or number is None or node.params["dims"] is None or len(node.params["dims"]) != 1:
            return None
        x = node.inputs[0]
        assert isinstance(x, TensorValue)
        size = x.shape[node.params["dims"][0]] if x.ndim else 1
        ok = math.isclose(number * size, 1.0, rel_tol=1e-12) if reciprocal else number == size
        return node if ok else None

    def _pow(self, name: str, a: TensorValue, exponent: Const, result: Any) -> Node:
        e = exponent.number
        folded = {2.0: Kind.SQUARE, 0.5: Kind.SQRT, -0.5: Kind.RSQRT, -1.0: Kind.RECIPROCAL}.get(e)  # type: ignore[arg-type]
        if folded is None:
            return self._add(Kind.POW, name, [a], {"exponent": exponent.value}, result)
        return self._unary(folded, name, a, result)

    def _unary(self, kind: Kind, name: str, a: TensorValue, result: Any) -> Node:
        if kind is Kind.RECIPROCAL:
            sqrt = self.graph.produced_by(a, Kind.SQRT)
            if sqrt is not None:  # 1 / sqrt(v) is rsqrt(v)
                return self._add(Kind.RSQRT, name, sqrt.inputs, result=result, absorbs=[sqrt])
        return self._add(kind, name, [a], result=result)

    def _reduce(self, kind: Kind, name: str, args: Sequence[Any], kwargs: Mapping[str, Any], result: Any) -> None:
        names = ("input", "dim", "keepdim") if kind is Kind.MAX else ("input", "dim", "keepdim", "dtype")
        b = _bind(names, args, kwargs)
        if b is None or isinstance(b.get("dim"), torch.Tensor):  # torch.max(a, b) is a maximum
            raise _Unnormalized("arguments")
        x = self.tensor_value(b["input"])
        keepdim = b.get("keepdim", False)
        if not isinstance(keepdim, bool):
            raise _Unnormalized("keepdim")
        params = {"dims": _dims(b.get("dim"), x.ndim), "keepdim": keepdim, "dtype": b.get("dtype")}
        # max(dim=...) returns (values, indices); amax and max() return the values alone.
        if isinstance(result, torch.Tensor) or (kind is Kind.MAX and isinstance(result, tuple)):
            self._add(kind, name, [x], params, result)
        else:
            raise _Unnormalized("result")


    def _var(self, name: str, args: Sequence[Any], kwargs: Mapping[str, Any], result: Any) -> None:
        """``var(x, dim, unbiased, keepdim, *, correction)``, with ``unbiased`` folded into
        ``correction`` (torch's default is the unbiased variance, correction 1)."""
        plain = {k: v for k, v in kwargs.items() if k != "correction"}
        b = _bind(("input", "dim", "unbiased", "keepdim"), args, plain)
        if b is None or "input" not in b:
            raise _Unnormalized("arguments")
        if isinstance(b.get("dim"), bool) and "unbiased" not in b:  # the var(x, unbiased) overload
            b["unbiased"] = b.pop("dim")
        unbiased, correction = b.get("unbiased"), kwargs.get("correction")
        if unbiased is not None and (correction is not None or not isinstance(unbiased, bool)):
            raise _Unnormalized("unbiased")
        if correction is None:
            correction = 0 if unbiased is False else 1
        number = Const(correction).number
        keepdim = b.get("keepdim", False)
        if number is None or not isinstance(keepdim, bool):
            raise _Unnormalized("correction or keepdim")
        x = self.tensor_value(b["input"])
        params = {"dims": _dims(b.get("dim"), x.ndim), "keepdim": keepdim, "correction": number}
        self._add(Kind.VAR, name, [x], params, result)

    def _split(self, name: str, args: Sequence[Any], kwargs: Mapping[str, Any], result: Sequence[Any]) -> None:
        """chunk / split / tensor_split: where each piece starts and stops along the split dim."""
        b = _bind(("input", "how", "dim"), args, {_SPLIT_ALIASES.get(k, k): v for k, v in kwargs.items()})
        if b is None or "input" not in b:
            raise _Unnormalized("arguments")
        x = self.tensor_value(b["input"])
        dim = _softmax_dim(b.get("dim", 0), x.ndim)
        sections, start = [], 0
        for r in result:
            shape = tuple(r.shape)
            if len(shape) != x.ndim or shape[:dim] + shape[dim + 1 :] != x.shape[:dim] + x.shape[dim + 1 :]:
                raise _Unnormalized("result")
            sections.append((start, start + shape[dim]))
            start += shape[dim]
        if start != x.shape[dim]:
            raise _Unnormalized("result")
        self._add(Kind.SPLIT, name, [x], {"dim": dim, "sections": tuple(sections)}, result)


def _basic_slice(index: Any, shape: tuple[int, ...], result: tuple[int, ...]) -> dict[str, int]:
    """``{dim, start, stop}`` of an index that narrows one dim with step 1 (``x[..., a:b]``)."""
    items = index if isinstance(index, tuple) else (index,)
    ellipses = sum(1 for i in items if i is Ellipsis)
    if ellipses > 1 or not all(i is Ellipsis or isinstance(i, slice) for i in items):
        raise _Unnormalized("not a basic slice")
    explicit = len(items) - ellipses
    if explicit > len(shape):
        raise _Unnormalized("too many indices")
    at = next((k for k, i in enumerate(items) if i is Ellipsis), len(items))
    full = [*items[:at], *[slice(None)] * (len(shape) - explicit), *items[at + 1 :]]
    cuts = []
    for dim, (s, size) in enumerate(zip(full, shape, strict=True)):
        start, stop, step = s.indices(size)
        if (start, stop, step) != (0, size, 1):
            cuts.append((dim, start, max(start, stop), step))
    if len(cuts) != 1 or cuts[0][3] != 1:
        raise _Unnormalized("not one narrowed dim")
    dim, start, stop, _ = cuts[0]
    if result != (*shape[:dim], stop - start, *shape[dim + 1 :]):
        raise _Unnormalized("result")
    return {"dim": dim, "start": start, "stop": stop}


class _CaptureMode(TorchFunctionMode):
    """Reports every top-level torch call to a :class:`Recorder`, then returns its result.

    Calling ``func`` here runs with this mode popped, so what ``func`` calls internally is not
    reported. Recording errors never reach the user's code: they become a graph problem.
    """

    def __init__(self, recorder: Recorder) -> None:
        super().__init__()
        self.recorder = recorder

    def __torch_function__(
        self,
        func: Any,
        types: Any,
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        result = func(*args, **kwargs)  # the user's computation: its errors are the user's
        try:
            self.recorder.record(func, args, kwargs, result)
        except Exception as err:
            self.recorder.fail(err)
        return result


def _settle_reads(recorder: Recorder, fn: Any, args: Sequence[Any], kwargs: Mapping[str, Any]) -> None:
    """The outside values a later call is checked against, as the captured call left them.

    A value the call itself rebinds (a global counter, ``self.step += 1``) describes no later
    call: no pattern may match. A container it changes in place (a list it appends to, a dict of
    statistics) is its own bookkeeping, not a constant of the computation: it is not checked.
    """
    graph = recorder.graph
    assert graph.signature is not None
    kept = []
    for read in graph.signature.reads:
        if not read.changed(fn, args, kwargs):
            kept.append(read)
        elif not read.immutable and _reads_same_object(read, fn, args, kwargs):
            logger.debug("%s is changed in place by the call: not checked on later calls", format_path(read.path))
        else:
            recorder.problem(f"changes {format_path(read.path)} while it runs")
    if len(kept) != len(graph.signature.reads):
        graph.signature = replace(graph.signature, reads=tuple(kept))


def _reads_same_object(read: ConstantRead, fn: Any, args: Sequence[Any], kwargs: Mapping[str, Any]) -> bool:
    try:
        return read.read(fn, args, kwargs) is read.value
    except Exception:
        return False


def capture(fn: Callable[..., Any], args: Sequence[Any], kwargs: Mapping[str, Any]) -> Graph:
    """Run ``fn(*args, **kwargs)`` once under a capture mode and return the graph of the call.

    ``graph.output`` is the function's actual return value. Exceptions raised by ``fn`` propagate
    unchanged. Failures of the capture itself never raise: the function still runs, once, and
    the graph lists the failure in ``problems``.
    """
    try:
        recorder: Recorder | None = Recorder(fn, args, kwargs)
    except Exception as err:
        logger.debug("capture set-up failed", exc_info=True)
        recorder = None
        setup_error = f"capture set-up failed ({type(err).__name__}: {err})"
    if recorder is None:
        graph = Graph(output=fn(*args, **kwargs), problems=[setup_error])
        return graph
    mode = _CaptureMode(recorder)
    try:
        mode.__enter__()
    except Exception as err:
        logger.debug("could not enter the capture mode", exc_info=True)
        return Graph(output=fn(*args, **kwargs), problems=[f"capture mode unavailable ({err})"])
    try:
        output = fn(*args, **kwargs)
    finally:
        mode.__exit__(None, None, None)
    graph = recorder.graph
    graph.output = output
    try:
        if isinstance(output, torch.Tensor):
            graph.output_value = recorder.tensor_value(output)
        elif isinstance(output, tuple | list):
            graph.output_values = tuple(
                recorder.tensor_value(o) if isinstance(o, torch.Tensor) else None for o in output
            )
        _settle_reads(recorder, fn, args, kwargs)
    except Exception as err:
        recorder.fail(err)
    recorder._alive.clear()  # the graph keeps metadata only (and external tensors' references)
    recorder._reachable.clear()
    return graph

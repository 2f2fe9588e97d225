"""Where a captured call's objects live and what a later call must share with it.

Part of the capture (:mod:`kernelsmith.frontends.capture`): a :data:`Path` names how an object is
reached from the captured function or one of its arguments (a closure cell, a global, an
attribute...), :func:`resolve_path` follows one, and :class:`CallSignature` pins what a later call
must share with the captured one (arguments, tensor metadata, the outside values the function
reads) before the recognizer's match may be reused. The recorder builds a signature for every
capture; the decorator checks it on every call.
"""

from __future__ import annotations

import enum
import functools
import operator
import types
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from kernelsmith.frontends._capture_reads import ConstantRead

# A path from a root to an object: ("fn", None) | ("arg", i) | ("kwarg", name), then steps
# ("attr", dotted name), ("cell", i), ("global", name), ("item", key), ("self", None),
# ("func", None), ("default", i), ("kwdefault", name).
Path = tuple[tuple[str, Any], ...]


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

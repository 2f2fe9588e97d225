"""What the captured function reaches from outside its arguments, listed before the call runs.

Part of the capture (:mod:`kernelsmith.frontends.capture`): :func:`reachable_tensors` finds the
tensors that existed before the call (parameters, buffers, globals, closure cells...) with the
path that reaches each, so the recorder can tell an *external* tensor from an unknown one; and
:func:`constant_reads` lists the plain values (a global ``EPS``, ``self.eps``, a default) the
function can read by name, which the call signature re-reads on every later call.
"""

from __future__ import annotations

import enum
import functools
import inspect
import logging
import sys
import types
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from kernelsmith.frontends._capture_signature import Path, _freeze, _path_reader

logger = logging.getLogger("kernelsmith.frontends.capture")  # this code's logger in capture.py


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


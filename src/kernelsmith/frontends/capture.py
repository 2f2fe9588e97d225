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

Layout: the graph (node kinds, values, nodes) is in :mod:`~kernelsmith.frontends._capture_graph`,
the call signature and paths in :mod:`~kernelsmith.frontends._capture_signature`, what the function
reaches from outside in :mod:`~kernelsmith.frontends._capture_reads`, and the normalization passes
in :mod:`~kernelsmith.frontends._capture_normalize`; this module holds the recorder and
:func:`capture`, and every public name is importable from here.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from kernelsmith.frontends._capture_graph import (
    UNRECORDED,
    ArgSource,
    Const,
    ExternalSource,
    Graph,
    Kind,
    Node,
    NodeSource,
    Source,
    TensorValue,
    UnknownSource,
    Value,
)
from kernelsmith.frontends._capture_normalize import (
    _METADATA,
    Normalizer,
    _function_name,
    _has_tensor,
    _mutates,
    _tensors,
    _Unnormalized,
)
from kernelsmith.frontends._capture_reads import _MAX_READS, ConstantRead, constant_reads, reachable_tensors
from kernelsmith.frontends._capture_signature import (
    CallSignature,
    Path,
    TensorMeta,
    _freeze,
    format_path,
    resolve_path,
)

# The capture's public names, whichever of its modules holds them: the recognizer, the patterns
# and the tests import them from here.
__all__ = [
    "UNRECORDED",
    "ArgSource",
    "CallSignature",
    "Const",
    "ConstantRead",
    "ExternalSource",
    "Graph",
    "Kind",
    "Node",
    "NodeSource",
    "Path",
    "Recorder",
    "Source",
    "TensorMeta",
    "TensorValue",
    "UnknownSource",
    "Value",
    "capture",
    "constant_reads",
    "format_path",
    "reachable_tensors",
    "resolve_path",
]

logger = logging.getLogger(__name__)


class Recorder(Normalizer):
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

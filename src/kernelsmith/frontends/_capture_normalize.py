"""How each recorded torch call is normalized, so that every pattern is written once.

Part of the capture (:mod:`kernelsmith.frontends.capture`): the recorder hands every call the
user's code made to :meth:`Normalizer._normalized`, which turns the many spellings of one
computation into one node kind (``x*x``, ``x**2``, ``torch.square(x)`` are SQUARE; ``1/sqrt(a)``
is RSQRT; ``s.sum(d) / N`` is a MEAN...: the list is in the capture's module docstring), or raises
:class:`_Unnormalized`, and the recorder then keeps the call as an opaque OTHER node. The tables
of torch names each kind covers are here too.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import torch
from torch.overrides import resolve_name

from kernelsmith.frontends._capture_graph import Const, Graph, Kind, Node, TensorValue, Value

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


class Normalizer:
    """The normalization passes of :class:`~kernelsmith.frontends.capture.Recorder`, which
    inherits them; they add nodes through the recorder's own methods, declared here."""

    graph: Graph
    value: Callable[[Any], Value]
    tensor_value: Callable[[Any], TensorValue]
    _add: Callable[..., Node]

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


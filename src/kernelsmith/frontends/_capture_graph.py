"""The graph a capture produces: normalized node kinds, the values that flow between nodes, the nodes.

Part of the capture (:mod:`kernelsmith.frontends.capture`): the recorder appends a :class:`Node`
per normalized call to a :class:`Graph`; the patterns under :mod:`kernelsmith.frontends.patterns`
read the graph to recognize an op. Every value is a :class:`TensorValue` (with where it comes
from: an argument, an earlier node, an external tensor, or unknown) or a :class:`Const`.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import torch

from kernelsmith.frontends._capture_signature import CallSignature, Path, format_path


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


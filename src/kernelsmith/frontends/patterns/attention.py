"""Scaled dot-product attention (``attention``), as users write it.

Recognized (after the capture's normalization, see :mod:`kernelsmith.frontends.capture`):

- ``F.scaled_dot_product_attention(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False,
  scale=None, enable_gqa=False)``, arguments positional or by keyword, with ``q``, ``k``, ``v``
  and the mask taken as the function receives them: layout ``"bhsd"``;
- the same on ``q.transpose(1, 2)``, ``k.transpose(1, 2)``, ``v.transpose(1, 2)`` with the result
  transposed back (``.transpose(1, 2)``): ``(B, S, H, D)`` tensors in flash-attn's layout,
  ``"bshd"`` (the kernels read them in place, and write a contiguous ``(B, S, H, D)`` output);
- the explicit ``softmax(q @ k.transpose(-2, -1) * scale + mask, dim=-1) @ v``: the product
  written ``@``, ``torch.matmul`` or ``.matmul``; ``k``'s last two dims swapped by
  ``transpose(-2, -1)`` (or ``(2, 3)``, ``(-1, -2)``...), ``swapaxes``, ``mT`` or
  ``permute(0, 1, 3, 2)``; the scale a constant multiplying (or dividing) the scores or ``q``
  (absent: 1); the additive mask optional, in ``q``'s dtype; the softmax over the last dim, in
  ``q``'s dtype or in float32 cast back (Hugging Face's eager attention,
  ``F.softmax(w, dim=-1, dtype=torch.float32).to(q.dtype)``). ``k`` and ``v`` may have one head
  that broadcasts over ``q``'s (multi-query attention), as torch's matmul allows;
- in both forms the mask may be sliced to the keys it already has, as Hugging Face writes it
  (``attention_mask[:, :, :, : key.shape[-2]]``): a slice that keeps every element is the mask;
- in both forms, on ``(B, H, S, D)`` tensors, the result transposed to ``(B, S, H, D)``
  (``.transpose(1, 2)``, then perhaps ``.contiguous()``), as Hugging Face's attention helpers
  end: the match is the ``"bshd"`` layout with ``q``, ``k`` and ``v`` bound as
  ``.transpose(1, 2)`` views (``InputRef.transpose``), so the kernels write the transposed result
  directly instead of a copy; a reshape to the same shape before the transpose
  (``attn_output.reshape(B, -1, S, D)``) is nothing;
- Hugging Face's ``sdpa_attention_forward``, which returns ``(attn_output, None)``: the match's
  ``returns`` is ``(0, None)``.

The match's constants are ``layout``, ``causal`` and ``scale`` (None for torch's default
``1 / sqrt(D)``); the inputs are ``(q, k, v)`` or ``(q, k, v, mask)``.

Refused, with a reason: a tuple with a second tensor (eager attention's ``(attn_output,
attn_weights)``: the kernels never form the weights), dropout (``dropout_p`` other than 0), 3-D
or 5-D tensors, a mask that is computed in the function (``~padding``, ``masked_fill``...)
rather than passed in, an additive mask in another dtype than ``q`` (it would promote the
scores), a scale applied to the mask as well
(``(q @ k^T + mask) * scale``), a softmax over another dim or in a lower precision than ``q``,
transposes of other dims, and anything computed besides the op. Whether the kernels support the
shapes (head dim a multiple of 16...) is the family's ``spec_for``'s call, at bind time.
"""

from __future__ import annotations

import logging
import math
from dataclasses import replace
from typing import Any

import torch

from kernelsmith.frontends.capture import Const, Graph, Kind, Node, TensorValue, Value
from kernelsmith.frontends.recognize import (
    Match,
    NoMatch,
    bound_arguments,
    describe,
    input_ref,
    require_only,
    single_tensor_output,
    through_reshapes,
    tuple_output,
    whole_of,
)

logger = logging.getLogger(__name__)

OP = "attention"

_SDPA = "torch.nn.functional.scaled_dot_product_attention"
_SDPA_ARGS = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")
_MATMUL = {"torch.matmul", "torch.Tensor.matmul", "torch.Tensor.__matmul__"}
_TRANSPOSE = {"torch.Tensor.transpose", "torch.transpose", "torch.Tensor.swapaxes", "torch.swapaxes",
              "torch.Tensor.swapdims", "torch.swapdims"}  # fmt: skip
_PERMUTE = {"torch.Tensor.permute", "torch.permute"}
_LAST_TWO_SWAPPED = {"torch.Tensor.mT"}  # swaps the last two dims whatever the rank
_GETITEM = "torch.Tensor.__getitem__"
_CONTIGUOUS = {"torch.Tensor.contiguous"}


def match(graph: Graph) -> Match | None:
    """The attention match of ``graph``; None when it has no attention-like call at all."""
    sdpa = [n for n in graph.nodes if n.kind is Kind.OTHER and n.name == _SDPA]
    explicit = any(n.kind is Kind.SOFTMAX for n in graph.nodes) and any(
        n.kind is Kind.OTHER and n.name in _MATMUL for n in graph.nodes
    )
    if not sdpa and not explicit:
        return None
    out, returns = _output(graph)
    node = graph.producer(out)
    assert node is not None  # single_tensor_output / tuple_output checked it
    used: list[Node] = []
    layout = "bhsd"
    transpose_inputs = False  # (B, H, S, D) arguments served in the (B, S, H, D) layout
    if node.kind is Kind.OTHER and node.name in _CONTIGUOUS:  # ....transpose(1, 2).contiguous()
        used.append(node)
        node = _producer(graph, node.inputs[0], "a contiguous copy")
    transposed = _transposed_dims(graph, node)
    if transposed is not None:  # the result transposed to (B, S, H, D)
        if transposed != (1, 2):
            raise NoMatch(f"the attention's output is transposed on dims {transposed}, not (1, 2)")
        used.append(node)
        node = _producer(graph, _through_same_shape(graph, node.inputs[0], used), "a transpose")
        layout = "bshd"
        # (B, S, H, D) data transposed in and out (flash-attn's layout), or Hugging Face's
        # (B, H, S, D) tensors whose result alone is transposed: then the op reads the
        # arguments transposed, as views, and writes the (B, S, H, D) result directly.
        transpose_inputs = not (node.kind is Kind.OTHER and node.name == _SDPA and _query_transposed(graph, node))
    if node.kind is Kind.OTHER and node.name == _SDPA:
        found = _sdpa(graph, node, "bhsd" if transpose_inputs else layout)
    elif node.kind is Kind.OTHER and node.name in _MATMUL and (layout == "bhsd" or transpose_inputs):
        found = _explicit(graph, node)
    else:
        raise NoMatch(f"the output comes from {node.name}, not from an attention")
    values, constants, nodes = found
    q = values[0]
    if out.dtype != q.dtype:
        raise NoMatch(f"the output is {out.dtype}, but q is {q.dtype}")
    refs = tuple(input_ref(value, role) for value, role in zip(values, ("q", "k", "v", "mask"), strict=False))
    if transpose_inputs:
        refs = tuple(replace(r, transpose=(1, 2)) if i < 3 else r for i, r in enumerate(refs))
        constants = {**constants, "layout": "bshd"}
    require_only(graph, used + nodes, OP)
    return Match(OP, refs, constants, returns=returns)


def _output(graph: Graph) -> tuple[TensorValue, tuple[int | None, ...] | None]:
    """The attention's output and the match's ``returns``: the function's tensor, or the first
    element of Hugging Face's ``(attn_output, None)`` (the sdpa and flash helpers)."""
    if graph.output_values is None:
        return single_tensor_output(graph), None
    values = tuple_output(graph)
    first = values[0]
    if first is None or any(v is not None for v in values[1:]):
        raise NoMatch(
            f"returns {len(values)} values with a tensor besides the attention's output (eager attention's "
            f"attention weights?): the attention kernels never form the weights; only (output, None) is served"
        )
    return first, (0, *([None] * (len(values) - 1)))


def _producer(graph: Graph, value: Value, what: str) -> Node:
    node = graph.producer(value)
    if node is None:
        raise NoMatch(f"the output is {what} of an input, not of an attention")
    return node


def _through_same_shape(graph: Graph, value: Value, used: list[Node]) -> Value:
    """``x`` for ``x.reshape(x.shape)`` (Hugging Face's ``attn_output.reshape(B, -1, S, D)``,
    which undoes a packing it did not do), recording the reshape; ``value`` otherwise."""
    used_here: list[Node] = []
    source = through_reshapes(graph, value, used_here)
    if isinstance(source, TensorValue) and isinstance(value, TensorValue) and source.shape == value.shape:
        used += used_here
        return source
    return value


def _query_transposed(graph: Graph, node: Node) -> bool:
    """Whether the SDPA call's query is ``x.transpose(1, 2)`` (flash-attn's layout)."""
    arguments = bound_arguments(node, _SDPA_ARGS)
    query = arguments.get("query") if arguments else None
    producer = graph.producer(query)
    return producer is not None and _transposed_dims(graph, producer) == (1, 2)


# ---- F.scaled_dot_product_attention ----------------------------------------------------------


def _sdpa(graph: Graph, node: Node, layout: str) -> tuple[list[TensorValue], dict[str, Any], list[Node]]:
    """``(q, k, v[, mask])``, the constants and the nodes of one SDPA call."""
    arguments = bound_arguments(node, _SDPA_ARGS)
    if arguments is None or not {"query", "key", "value"} <= set(arguments):
        raise NoMatch("scaled_dot_product_attention is called with arguments the pattern cannot read")
    used = [node]
    dropout = _number(arguments.get("dropout_p", Const(0.0)))
    if dropout != 0.0:
        raise NoMatch(f"scaled_dot_product_attention with dropout_p={dropout} (dropout is not supported)")
    causal = _constant(arguments.get("is_causal", Const(False)))
    gqa = _constant(arguments.get("enable_gqa", Const(False)))
    if not isinstance(causal, bool) or not isinstance(gqa, bool):
        raise NoMatch("is_causal and enable_gqa must be Python booleans")
    scale = _constant(arguments.get("scale", Const(None)))
    if scale is not None and (isinstance(scale, bool) or not isinstance(scale, int | float)):
        raise NoMatch(f"the scale {scale!r} is not a number")
    tensors = []
    for role in ("query", "key", "value"):
        value = arguments[role]
        if layout == "bshd":
            value, transpose = _untransposed(graph, value, role)
            used.append(transpose)
        tensors.append(_tensor(graph, value, role))
    if any(t.ndim != 4 for t in tensors):
        raise NoMatch(f"q, k and v must be 4-D, not {'-D, '.join(str(t.ndim) for t in tensors)}-D")
    mask = arguments.get("attn_mask", Const(None))
    if not (isinstance(mask, Const) and mask.value is None):
        mask_value, mask_nodes = _mask(graph, mask)
        tensors.append(mask_value)
        used += mask_nodes
    constants = {"layout": layout, "causal": causal, "scale": None if scale is None else float(scale)}
    return tensors, constants, used


def _untransposed(graph: Graph, value: Value, role: str) -> tuple[Value, Node]:
    """``x`` for ``x.transpose(1, 2)``: the (B, S, H, D) tensor under a (B, H, S, D) view."""
    node = graph.producer(value)
    dims = _transposed_dims(graph, node) if node is not None else None
    if node is None or dims != (1, 2):
        raise NoMatch(f"the output is transposed back, but the {role} is not x.transpose(1, 2)")
    return node.inputs[0], node


# ---- softmax(q @ k^T * scale + mask) @ v -----------------------------------------------------


def _explicit(graph: Graph, out_product: Node) -> tuple[list[TensorValue], dict[str, Any], list[Node]]:
    """``(q, k, v[, mask])``, the constants and the nodes of the explicit form."""
    probabilities, v_value = _operands(out_product)
    used = [out_product]
    node = graph.producer(probabilities)
    cast_back = None
    if node is not None and node.kind is Kind.CAST:  # a float32 softmax cast back to q's dtype
        cast_back = node
        used.append(node)
        node = graph.producer(node.inputs[0])
    if node is None or node.kind is not Kind.SOFTMAX:
        raise NoMatch(f"the values are multiplied by {describe(graph, probabilities)}, not by a softmax")
    softmax = node
    used.append(softmax)
    scores = softmax.inputs[0]
    assert isinstance(scores, TensorValue)
    if softmax.params["dim"] != scores.ndim - 1:
        raise NoMatch(f"the softmax is over dim {softmax.params['dim']}, not the last dim (the keys)")
    upcast = graph.produced_by(scores, Kind.CAST)
    if upcast is not None:  # softmax(w.float(), -1)
        used.append(upcast)
        scores = upcast.inputs[0]
        assert isinstance(scores, TensorValue)

    # scores = [q @ k^T] [* scale] [+ mask]
    mask_value: TensorValue | None = None
    add = graph.produced_by(scores, Kind.ADD)
    if add is not None:
        used.append(add)
        scores, mask = _split_addend(graph, add)
        mask_value, mask_nodes = _mask(graph, mask)
        used += mask_nodes
    scale, scores, scale_nodes = _scaled(graph, scores)
    used += scale_nodes
    product = graph.producer(scores)
    if product is not None and product.kind is Kind.ADD:
        raise NoMatch("the mask is scaled along with the scores ((q @ k^T + mask) * scale)")
    if product is None or product.kind is not Kind.OTHER or product.name not in _MATMUL:
        raise NoMatch(f"the scores come from {describe(graph, scores)}, not from q @ k.transpose(-2, -1)")
    used.append(product)
    q_value, k_transposed = _operands(product)
    q_scale, q_value, q_nodes = _scaled(graph, q_value)  # (q * scale) @ k^T
    used += q_nodes
    k_value, transpose = _key(graph, k_transposed)
    used.append(transpose)

    q = _tensor(graph, q_value, "q")
    k = _tensor(graph, k_value, "k")
    v = _tensor(graph, v_value, "v")
    computed = softmax.out.dtype
    if computed != q.dtype and not (computed == torch.float32 and q.dtype in (torch.float16, torch.bfloat16)):
        raise NoMatch(f"the softmax is computed in {computed}, less precise than q's {q.dtype}")
    if (cast_back is not None or upcast is not None) and computed != torch.float32:
        raise NoMatch("the softmax is cast to a lower precision before the product")
    if mask_value is not None and mask_value.dtype != q.dtype:
        raise NoMatch(f"the additive mask is {mask_value.dtype}, not q's {q.dtype}: it would promote the scores")
    if q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
        raise NoMatch(f"q, k and v must be 4-D (B, H, S, D), not {q.ndim}-D, {k.ndim}-D and {v.ndim}-D")
    tensors = [q, k, v] if mask_value is None else [q, k, v, mask_value]
    constants = {"layout": "bhsd", "causal": False, "scale": scale * q_scale}
    return tensors, constants, used


def _operands(product: Node) -> tuple[Value, Value]:
    """The two factors of a matmul node, from its recorded arguments."""
    arguments = bound_arguments(product, ("input", "other"))
    if arguments is None or set(arguments) != {"input", "other"}:
        raise NoMatch(f"{product.name} is called with arguments the pattern cannot read")
    return arguments["input"], arguments["other"]


def _split_addend(graph: Graph, add: Node) -> tuple[TensorValue, Value]:
    """``(scores, mask)`` of ``scores + mask`` written either way round: the scores are the
    operand computed from the q @ k^T product."""
    a, b = add.inputs
    for scores, mask in ((a, b), (b, a)):
        if isinstance(scores, TensorValue) and graph.producer(scores) is not None and _from_product(graph, scores):
            return scores, mask
    raise NoMatch("adds something to the scores that is not a mask")


def _from_product(graph: Graph, value: TensorValue) -> bool:
    """Whether ``value`` is a q @ k^T product, perhaps scaled by a constant."""
    node = graph.producer(value)
    while node is not None and node.kind in (Kind.MUL, Kind.DIV):
        tensors = [v for v in node.inputs if isinstance(v, TensorValue)]
        if len(tensors) != 1:
            return False
        node = graph.producer(tensors[0])
    return node is not None and node.kind is Kind.OTHER and node.name in _MATMUL


def _scaled(graph: Graph, value: Value) -> tuple[float, Value, list[Node]]:
    """``(c, x, nodes)`` for ``x * c``, ``c * x`` or ``x / c`` with ``c`` a constant; ``(1, value,
    [])`` for anything else."""
    node = graph.produced_by(value, Kind.MUL, Kind.DIV)
    if node is None:
        return 1.0, value, []
    a, b = node.inputs
    if node.kind is Kind.MUL:
        for x, c in ((a, b), (b, a)):
            number = _number(c) if isinstance(c, Const) else None
            if number is not None and isinstance(x, TensorValue):
                return number, x, [node]
    elif isinstance(b, Const) and (number := _number(b)) is not None and number != 0.0:
        return 1.0 / number, a, [node]
    raise NoMatch(f"the scores are scaled by {describe(graph, b)}, not by a constant")


def _key(graph: Graph, value: Value) -> tuple[Value, Node]:
    """``k`` for ``k`` with its last two dims swapped, and the node that swaps them."""
    node = graph.producer(value)
    if node is None or node.kind is not Kind.OTHER:
        raise NoMatch(f"q is multiplied by {describe(graph, value)}, not by k.transpose(-2, -1)")
    assert isinstance(value, TensorValue)
    if node.name in _LAST_TWO_SWAPPED or _transposed_dims(graph, node) == (value.ndim - 2, value.ndim - 1):
        return node.inputs[0], node
    raise NoMatch(f"q is multiplied by {node.name} of k, not by k with its last two dims swapped")


def _transposed_dims(graph: Graph, node: Node) -> tuple[int, ...] | None:
    """The two dims a transpose node swaps (sorted, non-negative), or None for another node."""
    if node.kind is not Kind.OTHER or not node.outputs or not node.inputs:
        return None
    ndim = node.out.ndim
    if node.name in _TRANSPOSE:
        arguments = bound_arguments(node, ("input", "dim0", "dim1"))
        if arguments is None or set(arguments) != {"input", "dim0", "dim1"}:
            return None
        dims = (_constant(arguments["dim0"]), _constant(arguments["dim1"]))
    elif node.name in _PERMUTE:
        args = node.params.get("args", ())
        order = [_constant(a) for a in args[1:]]
        if len(order) == 1 and isinstance(order[0], tuple | list):
            order = list(order[0])
        if sorted(o % ndim for o in order if isinstance(o, int)) != list(range(ndim)):
            return None
        moved = [i for i, o in enumerate(order) if o % ndim != i]
        if len(moved) != 2 or order[moved[0]] % ndim != moved[1]:
            return None
        dims = (moved[0], moved[1])
    else:
        return None
    if not all(isinstance(d, int) and not isinstance(d, bool) and -ndim <= d < ndim for d in dims):
        return None
    first, second = sorted(d % ndim for d in dims)  # type: ignore[operator]
    return (first, second) if first != second else None


# ---- shared pieces ---------------------------------------------------------------------------


def _tensor(graph: Graph, value: Value, role: str) -> TensorValue:
    """An input tensor of the op (not computed in the function)."""
    if not isinstance(value, TensorValue):
        raise NoMatch(f"the {role} is {describe(graph, value)}, not a tensor")
    node = graph.producer(value)
    if node is not None:
        raise NoMatch(f"the {role} is computed by {node.name}, not an input tensor")
    return value


def _mask(graph: Graph, value: Value) -> tuple[TensorValue, list[Node]]:
    """The mask, an input tensor, perhaps sliced to all of itself (``mask[:, :, :, :Sk]``)."""
    node = graph.producer(value)
    if node is not None and node.kind is Kind.OTHER and node.name == _GETITEM:
        whole = whole_of(node)
        if whole is not None:
            return _tensor(graph, whole, "mask"), [node]
    return _tensor(graph, value, "mask"), []


def _constant(value: Value) -> Any:
    """The Python value of a constant argument; NoMatch for a tensor (a value the capture cannot
    pin: it could change between calls)."""
    if not isinstance(value, Const):
        raise NoMatch(f"an argument is a tensor ({value.describe()}) where a constant is expected")
    return value.value


def _number(value: Value) -> float | None:
    number = _constant(value)
    if isinstance(number, bool) or not isinstance(number, int | float) or not math.isfinite(number):
        return None
    return float(number)

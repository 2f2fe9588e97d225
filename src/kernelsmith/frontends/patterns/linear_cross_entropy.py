"""An LM head followed by its loss (``linear_cross_entropy``): the logits never stored.

Recognized (after the capture's normalization, see :mod:`kernelsmith.frontends.capture`):

- the head: ``F.linear(h, W)`` or ``F.linear(h, W, b)`` (so an ``nn.Linear``, or a weight tied to
  the embedding: a weight is whatever tensor the product reads), ``h @ W.T`` and the other
  spellings of the matmul pattern's ``"linear"`` layout (:mod:`kernelsmith.frontends.patterns.matmul`),
  with ``W`` stored ``(V, H)`` and ``h`` of shape ``(..., H)``;
- then, in any order: the upcast ``.float()`` (required unless the head is float32), reshapes of
  the logits to ``(T, V)`` (``view(-1, V)``, ``reshape``, ``flatten``), and Gemma 2's soft-cap
  ``c * tanh(z / c)`` (written ``z / c``, ``tanh``, ``* c``) on float32 logits;
- then ``F.cross_entropy(logits, target, ...)`` (or ``nn.CrossEntropyLoss``) with the
  cross-entropy pattern's constants (reduction, ignore_index, label_smoothing) and a target that
  is an input tensor, perhaps reshaped to ``(T,)`` (``y.view(-1)``).

The match's inputs are ``(h, W, target[, b])``, ``h`` and the target reshaped to ``(T, H)`` and
``(T,)`` on binding; its constants cross-entropy's and ``softcap`` (None: none).

Refused, with a reason: the weight stored ``(H, V)`` (``h @ W``), a soft-cap before the upcast
(computed in the head's low precision: another function), a bias added after the product,
targets computed in the function (Hugging Face's label shift: see below), reshapes that mix the
vocabulary with the tokens, class weights, and anything computed besides the loss.

Hugging Face causal LMs compute the loss inside the model (``loss_function(logits, labels)``:
``F.pad`` and a slice shift the labels by one, then ``F.cross_entropy(logits.float().view(-1, V),
shift_labels.view(-1))``, divided by ``num_items_in_batch`` when the trainer passes it). A
decorated function doing that has a computed target and is refused; the compile backend
(:func:`candidate_regions`) takes the region from the head's product to the cross-entropy only:
the label shift and the division by ``num_items_in_batch`` (a "sum" reduction) stay in the graph
for Inductor, the shifted labels are an input of the site.
"""

from __future__ import annotations

import logging
import operator
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import torch
from torch import fx

from kernelsmith.frontends.capture import Const, Graph, Kind, Node, TensorValue, Value
from kernelsmith.frontends.patterns.cross_entropy import loss_constants
from kernelsmith.frontends.patterns.matmul import _PRODUCTS, _product
from kernelsmith.frontends.recognize import (
    InputRef,
    Match,
    NoMatch,
    constant_number,
    describe,
    input_ref,
    require_only,
    single_tensor_output,
)

logger = logging.getLogger(__name__)

OP = "linear_cross_entropy"

# Reshapes by name, in the capture (qualified names) and in a Dynamo FX graph (bare names).
_RESHAPES = frozenset({"torch.Tensor.view", "torch.Tensor.reshape", "torch.reshape", "torch.Tensor.flatten",
                       "torch.flatten", "torch.Tensor.contiguous"})  # fmt: skip
_FX_RESHAPES = frozenset({"view", "reshape", "flatten", "contiguous"})
_FX_CASTS = frozenset({"float", "to", "type"})
_FX_SOFTCAP = frozenset({"truediv", "div", "tanh", "mul"})


def match(graph: Graph) -> Match | None:
    """The ``linear_cross_entropy`` match of ``graph``; None when no cross-entropy of a matrix
    product is computed (the cross-entropy and matmul patterns speak for the rest)."""
    losses = [n for n in graph.nodes if n.kind is Kind.CROSS_ENTROPY]
    if len(losses) != 1 or not any(n.kind is Kind.OTHER and n.name in _PRODUCTS for n in graph.nodes):
        return None
    loss = losses[0]
    logits_in, target_in, weight = loss.inputs
    used: list[Node] = [loss]
    value, cast, softcap = _walk_to_product(graph, logits_in, used)
    product = _product(graph, value)
    if product is None:
        return None  # the logits are not a product's: plain cross-entropy's business
    out = single_tensor_output(graph)
    if graph.producer(out) is not loss:
        raise NoMatch(f"the output comes from {describe(graph, out)} after the cross-entropy")
    if not (isinstance(weight, Const) and weight.value is None):
        raise NoMatch("uses class weights, which the linear_cross_entropy op does not support")
    used += product.nodes
    if product.layout != "linear":
        raise NoMatch(f"the weight is stored {product.weight.shape} (h @ W): the op takes nn.Linear's (V, H) weight")
    dtype = product.x.dtype
    if dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise NoMatch(f"the head is {dtype}; the op takes float16, bfloat16 or float32")
    for t in (product.weight, *([product.bias] if product.bias is not None else [])):
        if t.dtype != dtype:
            raise NoMatch(f"{t.describe()} is {t.dtype}, but h is {dtype} (mixed dtypes)")
    if dtype != torch.float32 and cast is None:
        raise NoMatch(f"computes the loss of {dtype} logits in {dtype}; the op's loss is float32 from the upcast "
                      "logits (.float() before the loss), another function")  # fmt: skip
    if softcap is not None and softcap[1] and dtype != torch.float32:
        raise NoMatch(
            "soft-caps the logits before the upcast (in the head's precision); the op soft-caps float32 logits"
        )
    vocab, hidden = product.weight.shape
    tokens = 1
    for s in product.x.shape[:-1]:
        tokens *= s
    logits = loss.inputs[0]
    if not isinstance(logits, TensorValue) or logits.shape != (tokens, vocab):
        raise NoMatch(f"the loss reads logits of shape {getattr(logits, 'shape', '?')}, not (tokens, vocabulary) = "
                      f"({tokens}, {vocab})")  # fmt: skip
    target = _target(graph, target_in, tokens, used)
    constants: dict[str, Any] = {**loss_constants(loss), "softcap": softcap[0] if softcap is not None else None}
    h_ref = input_ref(product.x, "h")
    if product.x.ndim != 2:
        h_ref = _reshaped(h_ref, (tokens, hidden))
    t_ref = input_ref(target, "target")
    if target.ndim != 1:
        t_ref = _reshaped(t_ref, (tokens,))
    refs = [h_ref, input_ref(product.weight, "weight"), t_ref]
    if product.bias is not None:
        refs.append(input_ref(product.bias, "bias"))
    require_only(graph, used, OP)
    return Match(OP, tuple(refs), constants)


def _reshaped(ref: InputRef, shape: tuple[int, ...]) -> InputRef:
    return replace(ref, reshape=shape)


def _walk_to_product(
    graph: Graph, value: Value, used: list[Node]
) -> tuple[Value, Node | None, tuple[float, bool] | None]:
    """Down from the loss's logits through reshapes, one upcast and one soft-cap to the value
    they start from: ``(value, the cast or None, (cap, before the cast) or None)``."""
    cast: Node | None = None
    softcap: tuple[float, bool] | None = None
    while True:
        node = graph.producer(value)
        if node is None:
            return value, cast, softcap
        if node.kind is Kind.OTHER and node.name in _RESHAPES:
            source = node.inputs[0]
            if not isinstance(source, TensorValue) or not isinstance(value, TensorValue):
                return value, cast, softcap
            if source.shape[-1:] != value.shape[-1:]:
                raise NoMatch(f"{node.name} changes the last (vocabulary) dim: {source.shape} to {value.shape}")
            used.append(node)
            value = source
        elif node.kind is Kind.CAST and cast is None:
            if node.params["dtype"] != torch.float32:
                raise NoMatch(f"casts the logits to {node.params['dtype']}; the op computes the loss in float32")
            cast = node
            used.append(node)
            value = node.inputs[0]
        elif node.kind is Kind.MUL and softcap is None:
            found = _softcap(graph, node, used)
            if found is None:
                return value, cast, softcap
            cap, value = found
            # Walking down from the loss: an upcast seen already was computed after the cap.
            softcap = (cap, cast is not None)
        else:
            return value, cast, softcap


def _softcap(graph: Graph, mul: Node, used: list[Node]) -> tuple[float, Value] | None:
    """``(c, z)`` when ``mul`` is ``c * tanh(z / c)`` (either operand order of the product)."""
    for t_value, c_value in (mul.inputs, mul.inputs[::-1]):
        cap = constant_number(graph, c_value)
        tanh = graph.produced_by(t_value, Kind.TANH)
        if cap is None or tanh is None:
            continue
        div = graph.produced_by(tanh.inputs[0], Kind.DIV)
        if div is None:
            continue
        inner = constant_number(graph, div.inputs[1])
        if inner is None or inner[0] != cap[0] or not cap[0] > 0:
            raise NoMatch(f"soft-caps with {inner[0] if inner else '?'} inside tanh and {cap[0]} outside: "
                          "not c * tanh(z / c)")  # fmt: skip
        used += [mul, tanh, div, *(n for n in (cap[1], inner[1]) if n is not None)]
        return cap[0], div.inputs[0]
    return None


def _target(graph: Graph, value: Value, tokens: int, used: list[Node]) -> TensorValue:
    """The loss's target: an input tensor of ``tokens`` int64 class indices, perhaps reshaped."""
    while (node := graph.producer(value)) is not None and node.kind is Kind.OTHER and node.name in _RESHAPES:
        used.append(node)
        value = node.inputs[0]
    node = graph.producer(value)
    if node is not None:
        raise NoMatch(f"the targets are computed by {node.name} in the function (a label shift, say); the op takes "
                      "them as an input (shift them before the call, or compile the model: the backend keeps the "
                      "shift in the graph)")  # fmt: skip
    if not isinstance(value, TensorValue):
        raise NoMatch(f"the target is {describe(graph, value)}, not a tensor")
    if value.dtype != torch.int64:
        raise NoMatch(f"the targets are {value.dtype}; the op takes int64 class indices")
    count = 1
    for s in value.shape:
        count *= s
    if count != tokens:
        raise NoMatch(f"{count} targets for {tokens} tokens")
    return value


# ---- the compile backend: where to look ------------------------------------------------------


def _fx_name(node: fx.Node) -> str:
    target = node.target
    return target if isinstance(target, str) else getattr(target, "__name__", str(target))


def _is_loss(node: fx.Node) -> bool:
    return node.op == "call_function" and _fx_name(node) == "cross_entropy"


def candidate_regions(gm: fx.GraphModule, taken: set[fx.Node]) -> Iterator[tuple[fx.Node, list[fx.Node]]]:
    """For each ``cross_entropy`` call of ``gm`` whose logits come from an ``F.linear`` (or a
    matmul) through casts, reshapes and a soft-cap: ``(the loss node, the chain from the product
    to the loss, in graph order)``. The backend checks the chain as one region (recognition on
    random inputs); the label shift, whatever it is, is an input of the region."""
    for node in gm.graph.nodes:
        if not _is_loss(node) or node in taken or not node.args or not isinstance(node.args[0], fx.Node):
            continue
        chain = [node]
        value = node.args[0]
        while isinstance(value, fx.Node) and value.op in ("call_function", "call_method") and value not in taken:
            chain.append(value)
            name = _fx_name(value)
            if name in ("linear", "matmul", "__matmul__"):
                yield node, chain[::-1]
                break
            if name in _FX_RESHAPES | _FX_CASTS | _FX_SOFTCAP or value.target in (operator.mul, operator.truediv):
                # (a soft-cap's constant is not a node; its tensor operand is the chain)
                tensors = [a for a in value.args if isinstance(a, fx.Node)]
                if len(tensors) != 1:
                    break
                value = tensors[0]
                continue
            break


def kept_nodes(chain: list[fx.Node]) -> list[fx.Node]:
    """The part of a matched chain the site replaces: the nodes after the last one whose value
    is used outside the chain (a Hugging Face model also returns its logits: their product, and
    what they need, stays in the graph and only the loss is computed without them)."""
    inside = set(chain)
    last = -1
    for i, node in enumerate(chain[:-1]):
        if any(u not in inside for u in node.users):
            last = i
    return chain[last + 1 :]


__all__ = ["OP", "candidate_regions", "kept_nodes", "match"]

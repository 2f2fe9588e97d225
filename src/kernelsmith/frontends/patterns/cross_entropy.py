"""Cross-entropy of ``(R, V)`` logits against int64 class targets, with a float32 loss.

Recognized (after the capture's normalization, see :mod:`kernelsmith.frontends.capture`):

- ``F.cross_entropy(logits.float(), target, ...)`` (the upcast form of language-model training
  code, which is the op family's reference) for float16, bfloat16 or float32 logits, and
  ``F.cross_entropy(logits, target, ...)`` for float32 logits (the same function);
- ``torch.nn.CrossEntropyLoss(...)`` modules (which call ``F.cross_entropy``) on the same;
- with ``reduction`` ("mean", "sum", "none"), ``ignore_index`` and ``label_smoothing`` taken
  over as the match's constants;
- logits and targets reshaped to the loss's rows on the way, as language-model code writes it:
  ``F.cross_entropy(logits.view(-1, V).float(), labels.view(-1))`` (``reshape``, ``flatten``,
  the view before or after the upcast): the inputs are bound reshaped to ``(R, V)`` and ``(R,)``,
  which for the contiguous tensors the user's ``view`` demands are views too, not copies.

The match's inputs are ``(logits, target)``.

Refused, with a reason: ``F.cross_entropy`` of float16 or bfloat16 logits without the upcast
(its loss is in the logits' dtype, rounded differently: another function than the family's
float32 loss), an upcast to float64, class weights, probabilities as targets (a floating point
target), targets of another integer dtype, logits that are not 2-D (``(N, C, d1, ...)`` or a
single ``(C,)`` row), the legacy ``size_average`` / ``reduce`` arguments, and anything computed
besides the loss (a cast of it, a scale).
"""

from __future__ import annotations

import logging
import math
from dataclasses import replace
from typing import Any

import torch

from kernelsmith.frontends.capture import Const, Graph, Kind, Node, TensorValue
from kernelsmith.frontends.recognize import (
    InputRef,
    Match,
    NoMatch,
    describe,
    input_ref,
    require_only,
    single_tensor_output,
    through_reshapes,
)

logger = logging.getLogger(__name__)

OP = "cross_entropy"
REDUCTIONS = ("mean", "sum", "none")


def match(graph: Graph) -> Match | None:
    """The cross-entropy match of ``graph``; None when it computes no cross-entropy at all."""
    if not any(n.kind is Kind.CROSS_ENTROPY for n in graph.nodes):
        return None
    out = single_tensor_output(graph)
    node = graph.producer(out)
    assert node is not None  # single_tensor_output checked it
    if node.kind is not Kind.CROSS_ENTROPY:
        raise NoMatch(f"the output comes from {node.name} after the cross-entropy")
    logits_in, target, weight = node.inputs
    if not (isinstance(weight, Const) and weight.value is None):
        raise NoMatch("uses class weights, which the cross_entropy op does not support")
    used = [node]
    logits = through_reshapes(graph, logits_in, used)
    cast = graph.produced_by(logits, Kind.CAST)
    if cast is not None:
        if cast.params["dtype"] != torch.float32:
            raise NoMatch(f"casts the logits to {cast.params['dtype']}; the op computes the loss in float32")
        logits = through_reshapes(graph, cast.inputs[0], used)
        used.append(cast)
    if not isinstance(logits, TensorValue) or graph.producer(logits) is not None:
        raise NoMatch(f"the logits are computed by {describe(graph, logits)}, not an input tensor")
    target_in, target = target, through_reshapes(graph, target, used)
    if not isinstance(target, TensorValue) or graph.producer(target) is not None:
        raise NoMatch(f"the target is {describe(graph, target)}, not an input tensor")
    # The shapes the loss reads (after logits.view(-1, V), labels.view(-1)): the op's shapes.
    assert isinstance(logits_in, TensorValue) and isinstance(target_in, TensorValue)
    rows_shape, target_shape = logits_in.shape, target_in.shape
    if target.dtype.is_floating_point:
        raise NoMatch("the targets are class probabilities (a floating point target); the op takes class indices")
    if target.dtype != torch.int64:
        raise NoMatch(f"the targets are {target.dtype}; the op takes int64 class indices")
    if len(rows_shape) != 2:
        raise NoMatch(f"the logits are {len(rows_shape)}-D; the op takes 2-D (rows x classes) logits")
    if target_shape != rows_shape[:1]:
        raise NoMatch(f"the targets have shape {target_shape}, not ({rows_shape[0]},)")
    if logits_in.dtype != torch.float32:
        raise NoMatch(
            f"computes the loss of {logits.dtype} logits in {logits.dtype}; the cross_entropy op's loss is "
            f"float32 from the upcast logits (F.cross_entropy(logits.float(), target)), another function"
        )
    constants = loss_constants(node)
    if out.dtype != torch.float32:
        raise NoMatch(f"the loss is {out.dtype}, not float32")
    refs = (_reshaped_ref(logits, rows_shape, "logits"), _reshaped_ref(target, target_shape, "target"))
    require_only(graph, used, OP)
    return Match(OP, refs, constants)


def loss_constants(node: Node) -> dict[str, Any]:
    """``{"reduction", "ignore_index", "label_smoothing"}`` of an ``F.cross_entropy`` node, checked
    (also the fused linear + cross-entropy pattern's)."""
    params = node.params
    for legacy in ("size_average", "reduce"):
        if params.get(legacy) is not None:
            raise NoMatch(f"uses the legacy {legacy}={params[legacy]!r} argument")
    reduction, ignore_index, smoothing = params["reduction"], params["ignore_index"], params["label_smoothing"]
    if reduction not in REDUCTIONS:
        raise NoMatch(f"reduction={reduction!r} is not one of {REDUCTIONS}")
    if isinstance(ignore_index, bool) or not isinstance(ignore_index, int):
        raise NoMatch(f"ignore_index={ignore_index!r} is not an int")
    number = Const(smoothing).number
    if number is None or not math.isfinite(number) or not 0.0 <= number <= 1.0:
        raise NoMatch(f"label_smoothing={smoothing!r} is not a number in [0, 1]")
    return {"reduction": reduction, "ignore_index": ignore_index, "label_smoothing": number}


def _reshaped_ref(value: TensorValue, shape: tuple[int, ...], role: str) -> InputRef:
    """The input ``value``, bound as the loss reads it: reshaped to ``shape`` where it was viewed."""
    ref = input_ref(value, role)
    return ref if value.shape == shape else replace(ref, reshape=tuple(shape))

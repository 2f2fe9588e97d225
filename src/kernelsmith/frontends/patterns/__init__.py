"""The registry of op patterns the recognizer tries, keyed by op family name.

A pattern is ``match(graph) -> Match | None``: it returns a :class:`Match` when the captured
graph computes its op and nothing else, None when the graph has nothing of its op's shape (so
that its refusal would only be noise in a log line), and raises
:class:`~kernelsmith.frontends.recognize.NoMatch` with a reason when the graph looks like its
op but differs in something that matters (the dim, an axis, a cast, an extra computation).

To teach the recognizer a new op family, add one module here defining ``match`` and one entry
below; its name must be the op family's name in :mod:`kernelsmith.ops`. A module may serve
several families (``gelu`` and ``gelu_tanh``, ``swiglu`` and ``geglu``, ``sum``, ``mean`` and
``max``): each entry then returns only its own family's matches and refusals.
"""

from __future__ import annotations

from collections.abc import Callable

from kernelsmith.frontends.capture import Graph
from kernelsmith.frontends.patterns import (
    attention,
    cross_entropy,
    gated,
    gelu,
    layernorm,
    linear_cross_entropy,
    matmul,
    reductions,
    rmsnorm,
    rope,
    softmax,
)
from kernelsmith.frontends.recognize import Match

PATTERNS: dict[str, Callable[[Graph], Match | None]] = {
    "rmsnorm": rmsnorm.match,
    "softmax": softmax.match,
    "layernorm": layernorm.match,
    "gelu": gelu.match_exact,
    "gelu_tanh": gelu.match_tanh,
    "swiglu": gated.match_swiglu,
    "geglu": gated.match_geglu,
    "sum": reductions.match_sum,
    "mean": reductions.match_mean,
    "max": reductions.match_max,
    "cross_entropy": cross_entropy.match,
    "linear_cross_entropy": linear_cross_entropy.match,
    "attention": attention.match,
    "rope": rope.match,
    "matmul": matmul.match,
}

__all__ = ["PATTERNS"]

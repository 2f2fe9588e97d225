"""The checks of a family's ``spec`` arguments that the families over heads of ``(B, H, S, D)``
tensors (:mod:`kernelsmith.ops.rope`, :mod:`kernelsmith.ops.attention`) make alike.

Each check returns the argument as the spec stores it, or refuses it with an
:class:`UnsupportedWorkload` naming the family, so that a caller (the command line, ``spec_for``
on a model's tensors) falls back with a message that says which argument was wrong.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kernelsmith.ops._base import UnsupportedWorkload


@dataclass(frozen=True)
class SpecArgs:
    """The argument checks of the family ``op`` (its name starts every message)."""

    op: str

    def no_more(self, constants: Mapping[str, Any]) -> None:
        """Refuse the keyword arguments left over once the family took its own."""
        if constants:
            raise UnsupportedWorkload(f"{self.op}: unknown constants {sorted(constants)}")

    def positive_int(self, name: str, value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise UnsupportedWorkload(f"{self.op}: {name} must be a positive integer, not {value!r}")
        return value

    def choice(self, name: str, value: Any, choices: tuple[str, ...]) -> str:
        if value not in choices:
            raise UnsupportedWorkload(f"{self.op}: {name} must be one of {', '.join(choices)}, not {value!r}")
        return str(value)

    def flag(self, name: str, value: Any) -> bool:
        if not isinstance(value, bool):
            raise UnsupportedWorkload(f"{self.op}: {name} must be true or false, not {value!r}")
        return value

    def finite(self, name: str, value: Any) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise UnsupportedWorkload(f"{self.op}: {name} must be a finite number, not {value!r}")
        return float(value)

    def softmax_scale(self, value: Any, head_dim: int) -> float:
        """The softmax scale: ``value`` as a finite float, or torch's default ``1 / sqrt(D)``."""
        return 1.0 / math.sqrt(head_dim) if value is None else self.finite("scale", value)

    def bhsd(self, shape: tuple[int, ...], constants: Mapping[str, Any]) -> tuple[int, int, int, int]:
        """A command line's ``--shape``, q's sizes as ``BxHxSxD`` whatever the layout, as four
        positive integers; ``constants`` are the keyword arguments ``spec`` did not take."""
        self.no_more(constants)
        shape = tuple(shape)
        if len(shape) != 4:
            raise UnsupportedWorkload(f"{self.op}: --shape is BxHxSxD (4 sizes), not {'x'.join(map(str, shape))}")
        b, h, s, d = (self.positive_int(n, v) for n, v in zip(("B", "H", "S", "D"), shape, strict=True))
        return b, h, s, d

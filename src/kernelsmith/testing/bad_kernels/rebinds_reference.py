"""Rebinding the op family's reference and tolerance (issue 12): the harness checks a zeros
kernel against zeros.

The harness asks the family (``get_op("rmsnorm")``) for the reference and the tolerance of the
op. This module replaces, on that very object, ``reference_fp64`` and ``reference`` with
functions returning zeros and ``tolerance`` with a huge one; its kernel writes zeros. The
harness's own functions are untouched, so a check of their identity sees nothing. A kernel file
has no host code and cannot reach the family: the gate rejects this module before anything
runs.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from kernelsmith.ops import get_op
from kernelsmith.space import Config
from kernelsmith.spec import OpSpec

_family = get_op("rmsnorm")


def _zeros(spec, inputs):  # type: ignore[no-untyped-def]
    return (torch.zeros_like(inputs[0], dtype=torch.float64),)


_family.reference_fp64 = _zeros  # type: ignore[method-assign]
_family.reference = lambda spec, inputs: (torch.zeros_like(inputs[0]),)  # type: ignore[method-assign]
_family.tolerance = type(_family.tolerance)(k=1e9)  # type: ignore[misc,call-arg]


def build(spec: OpSpec, config: Config):
    def launch(inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> None:
        outputs[0][...] = 0.0

    return launch

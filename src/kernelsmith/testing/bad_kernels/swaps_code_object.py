"""Swapping a code object (issue 12): ``check_close`` keeps its identity and loses its checks.

A tamper check that compares the harness's functions with the objects bound at start sees the
same function object: only its ``__code__`` was replaced, with that of a function that finds
nothing wrong. The kernel writes zeros. A kernel file has no host code and may name no
attribute starting with ``_``: the gate rejects this module before anything runs.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from kernelsmith.evaluate import errors
from kernelsmith.space import Config
from kernelsmith.spec import OpSpec


def _nothing_wrong(output, ref64, lowp, tolerance):  # type: ignore[no-untyped-def]
    return None


errors.check_close.__code__ = _nothing_wrong.__code__


def build(spec: OpSpec, config: Config):
    def launch(inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> None:
        outputs[0][...] = 0.0

    return launch

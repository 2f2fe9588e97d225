"""A cache that rule 5 misses (issue 12): results keyed on a few values read on the host.

The launcher reads four elements of the input (``.item()``) and serves the cached result of any
earlier input with the same four values; new data is computed. A refill with fresh random values
changes the sample, so rule 5's in-place refill alone does not expose it, but a user's input
that shares those values with an earlier one gets a stale answer. A kernel file has no host
code: the gate rejects this module before anything runs.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from kernelsmith.space import Config
from kernelsmith.spec import OpSpec


def build(spec: OpSpec, config: Config):
    cache: dict[tuple[float, ...], torch.Tensor] = {}

    def launch(inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> None:
        flat = inputs[0].reshape(-1)
        key = tuple(flat[i].item() for i in (0, 1, flat.numel() // 2, flat.numel() - 1))
        if key not in cache:
            cache[key] = torch.softmax(inputs[0], -1)
        outputs[0][...] = cache[key]

    return launch

"""A cache that rule 5 misses (issue 12): results keyed on a tensor's identity and version counter.

Rule 5 refills the timing inputs in place, which a cache keyed on the storage address serves
stale answers for; this one keys on ``id(x)`` and ``x._version`` (the in-place refill bumps the
version, so the refilled inputs miss the cache and are computed honestly), and keeps serving
cached answers for inputs that did not change. A kernel file has no host code and no state
between calls (scratch memory is allocated and filled on every call): the gate rejects this
module before anything runs.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import triton
import triton.language as tl

from kernelsmith.space import Config, next_power_of_two
from kernelsmith.spec import OpSpec


@triton.jit
def _copy_kernel(src_ptr, dst_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(dst_ptr + offs, tl.load(src_ptr + offs, mask=offs < n), mask=offs < n)


def build(spec: OpSpec, config: Config):
    cache: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}
    n = spec.inputs[0].numel
    block = min(4096, next_power_of_two(n))

    def launch(inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> None:
        x = inputs[0]
        key = (id(x), x._version)
        if key not in cache:
            result = torch.softmax(x, -1)
            cache[key] = (x, result)
        _copy_kernel[(triton.cdiv(n, block),)](cache[key][1], outputs[0], n, BLOCK=block)

    return launch

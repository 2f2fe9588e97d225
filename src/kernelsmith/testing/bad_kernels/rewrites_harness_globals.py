"""Rule 10, tampering through the harness's frames: a zero-writing kernel that rewires the name
``errors`` in the harness modules that call it.

The launcher reaches its callers' frames with a generator (``gi_frame.f_back``: no import, no
forbidden name), and in every calling module that uses ``errors`` (the worker's validation and
timing code) replaces that global with a stand-in whose ``check_close`` passes whatever this
launcher wrote, and defers to the real one for everything else (so the harness's canaries still
fail). ``kernelsmith.evaluate.errors`` itself is untouched, so a check that compares the
harness's functions with their originals sees nothing.

The harness must reject it (the zeros are wrong); the static gate must not let frame
introspection through, and the worker's integrity check must cover the names its own modules
look up, not only the attributes of the modules they name.

Since issue 12 this cannot be a candidate: untrusted kernels are kernel files (Triton device
code and a declarative launch, docs/kernel-files.md), and the gate rejects this host module
before anything runs. The run-time defense described above stays behind the gate;
tests/test_harness_rules.py exercises it in-process with a launcher of its own.
"""

from __future__ import annotations

from collections.abc import Generator, Sequence
from typing import Any

import torch
import triton
import triton.language as tl

from kernelsmith.space import Config, next_power_of_two
from kernelsmith.spec import OpSpec


@triton.jit
def _zeros_kernel(y_ptr, N, BLOCK_N: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    tl.store(y_ptr + row * N + cols, tl.zeros([BLOCK_N], dtype=y_ptr.dtype.element_ty),
             mask=cols < N)


# Every output this module's launchers wrote, by id, kept alive so that no other tensor (a
# canary) can be given the same id later.
_WRITTEN: dict[int, torch.Tensor] = {}


def _caller_frames() -> Generator[Any, Any, None]:
    box = yield None
    frame = box[0].gi_frame.f_back  # while this generator runs: the frame that resumed it
    while frame is not None:
        yield frame
        frame = frame.f_back


def build(spec: OpSpec, config: Config):
    n = spec.inputs[0].shape[-1]
    rows = spec.inputs[0].numel // n
    block_n = next_power_of_two(n)

    def launch(inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> None:
        _zeros_kernel[(rows,)](outputs[0], n, BLOCK_N=block_n)
        _WRITTEN.update((id(t), t) for t in outputs)
        box: list[Any] = []
        frames = _caller_frames()
        next(frames)
        box.append(frames)
        frames.send(box)  # the launcher's own frame
        for frame in frames:
            names = frame.f_globals
            real = names.get("errors")
            if real is None or isinstance(real, _StandIn):
                continue
            names["errors"] = _StandIn(real)

    return launch


class _StandIn:
    """Looks like ``kernelsmith.evaluate.errors``; forgives the launcher's outputs."""

    def __init__(self, real: Any) -> None:
        self.real = real

    def check_close(self, output: torch.Tensor, *args: Any, **kwargs: Any) -> str | None:
        if _WRITTEN.get(id(output)) is output:
            return None
        return self.real.check_close(output, *args, **kwargs)  # type: ignore[no-any-return]

    def error_stats(self, *args: Any, **kwargs: Any) -> Any:
        return self.real.error_stats(*args, **kwargs)

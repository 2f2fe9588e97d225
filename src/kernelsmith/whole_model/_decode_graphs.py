"""Timing a decode step as it runs in production: as a replayed CUDA graph, or call by call.

Part of the decode stage (:mod:`kernelsmith.whole_model.decode`): capture a step into a CUDA graph
and time its replays (:func:`time_replayed`), time plain calls on the device
(:func:`time_calls`), and :func:`in_context_timer`, which the ``kernelsmith`` backend's in-context
comparison uses so that a graph is judged the way the step will run. :func:`cuda_graph` wraps a
step function as a replayable :class:`CudaGraphStep` (public as ``kernelsmith.cuda_graph``).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

log = logging.getLogger("kernelsmith.whole_model.decode")  # this code's logger in decode.py


# =================================================================================================
# Timing a step as a replayed CUDA graph
# =================================================================================================

_PLANNED = threading.local()


@contextlib.contextmanager
def graph_capture_planned() -> Iterator[None]:
    """Within this block, code being compiled will run as a replayed CUDA graph (the warm-up of
    :func:`cuda_graph` compiles in it), so in-context comparisons time graphs as replays."""
    before = getattr(_PLANNED, "depth", 0)
    _PLANNED.depth = before + 1
    try:
        yield
    finally:
        _PLANNED.depth = before


def graph_capture_is_planned() -> bool:
    return getattr(_PLANNED, "depth", 0) > 0


def inductor_uses_cuda_graphs(mode: str | None, inductor_options: dict[str, Any]) -> bool:
    """Whether Inductor, with this mode and these config patches, wraps its graphs in CUDA graphs
    (``mode="reduce-overhead"``, ``"max-autotune"``, or ``triton.cudagraphs`` set)."""
    patches: dict[str, Any] = {}
    if mode:
        from torch._inductor import list_mode_options

        patches.update(list_mode_options(mode))
    patches.update(inductor_options)
    return bool(patches.get("triton.cudagraphs"))


Timer = Callable[[Sequence[Callable[..., Any]], Sequence[Any]], list[float]]


def in_context_timer(timing: str, mode: str | None, inductor_options: dict[str, Any]) -> Timer:
    """The timer of the backend's in-context comparison.

    ``"calls"``: call by call (:func:`kernelsmith.frontends.backend.time_graphs`). ``"graph"``: each
    graph captured and replayed (:func:`time_replayed`). ``"auto"``: the way the step will run:
    replays when it is compiled for :func:`cuda_graph`; calls when Inductor makes its own CUDA
    graphs (calling such a compiled graph *is* a replay, and it cannot be captured again) or when
    nothing says the step will be captured (then the host's launch cost is real and counts).
    """
    from kernelsmith.frontends.backend import time_graphs

    if timing not in ("auto", "graph", "calls"):
        raise ValueError(f"timing must be auto, graph or calls, not {timing!r}")
    if timing == "calls" or inductor_uses_cuda_graphs(mode, inductor_options):
        return time_graphs
    if timing == "graph" or graph_capture_is_planned():
        return time_replayed
    return time_graphs


def _cuda_device(inputs: Sequence[Any]) -> torch.device | None:
    for t in inputs:
        if isinstance(t, torch.Tensor) and t.device.type == "cuda":
            return t.device
    return None


def _capture(fn: Callable[[], Any], device: torch.device, warmup: int = 2) -> tuple[torch.cuda.CUDAGraph, Any]:
    """``fn`` captured into a CUDA graph after ``warmup`` calls on a side stream (lazy compiles,
    autotuning and allocator growth happen there, not in the capture). Returns the graph and the
    captured call's outputs, which every replay overwrites."""
    current = torch.cuda.current_stream(device)
    side = torch.cuda.Stream(device)
    side.wait_stream(current)
    with torch.cuda.stream(side):
        for _ in range(warmup):
            fn()
    current.wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outputs = fn()
    return graph, outputs


def time_replayed(
    candidates: Sequence[Callable[..., Any]], inputs: Sequence[Any], rounds: int = 7, replays: int = 3
) -> list[float]:
    """Median milliseconds per replay of each candidate captured as a CUDA graph on ``inputs``,
    timed interleaved (A B A B ...) with CUDA events. Falls back to call-by-call timing
    (:func:`~kernelsmith.frontends.backend.time_graphs`) without CUDA tensors or when a candidate
    cannot be captured (the log says why)."""
    from kernelsmith.frontends.backend import _call, time_graphs

    device = _cuda_device(inputs)
    if device is None or torch.cuda.is_current_stream_capturing():
        return time_graphs(candidates, inputs, rounds, replays)
    graphs = []
    try:
        with torch.no_grad():
            for fn in candidates:
                graphs.append(_capture(functools.partial(_call, fn, inputs), device)[0])
    except Exception as exc:  # a graph that cannot be captured is timed as it is called
        log.warning("in context: a candidate cannot be captured as a CUDA graph (%s: %s); timing calls",
                    type(exc).__name__, exc)  # fmt: skip
        return time_graphs(candidates, inputs, rounds, replays)
    samples: list[list[float]] = [[] for _ in graphs]
    for _ in range(rounds):
        for i, graph in enumerate(graphs):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(replays):
                graph.replay()
            end.record()
            end.synchronize()
            samples[i].append(start.elapsed_time(end) / replays)
    return [sorted(s)[len(s) // 2] for s in samples]


def time_calls(fn: Callable[[], Any], device: torch.device, rounds: int = 10, calls: int = 5) -> dict[str, float]:
    """Milliseconds per call of ``fn`` (a step, or a graph's replay): the median, 10th and 90th
    percentile over ``rounds`` rounds of ``calls`` calls, after two warm-up calls; CUDA events on
    a GPU, the host clock elsewhere."""
    for _ in range(2):
        fn()
    samples = []
    for _ in range(rounds):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(calls):
                fn()
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end) / calls)
        else:
            begin = time.perf_counter()
            for _ in range(calls):
                fn()
            samples.append((time.perf_counter() - begin) * 1000.0 / calls)
    samples.sort()
    pick = lambda q: samples[min(len(samples) - 1, int(q * len(samples)))]
    return {"median_ms": pick(0.5), "p10_ms": pick(0.1), "p90_ms": pick(0.9)}


# =================================================================================================
# kernelsmith.cuda_graph
# =================================================================================================


class CudaGraphStep:
    """A step captured once and replayed; see :func:`cuda_graph`.

    ``static_inputs`` are the buffers the graph reads (write into them directly to skip the copy
    a call makes), ``outputs`` what the captured call returned, overwritten by every replay. On a
    device without CUDA graphs (the CPU) a call runs the step directly on the static buffers.
    """

    def __init__(self, fn: Callable[..., Any], example_inputs: Sequence[Any], warmup: int = 2) -> None:
        self.fn = fn
        self.static_inputs = tuple(t.clone() if isinstance(t, torch.Tensor) else t for t in example_inputs)
        self.graph: torch.cuda.CUDAGraph | None = None
        self.outputs: Any = None
        device = _cuda_device(self.static_inputs)
        if device is not None:
            with graph_capture_planned():  # torch.compile compiles during the warm-up: for replays
                self.graph, self.outputs = _capture(lambda: fn(*self.static_inputs), device, warmup)

    def __call__(self, *inputs: Any) -> Any:
        if len(inputs) != len(self.static_inputs):
            raise TypeError(f"the captured step takes {len(self.static_inputs)} inputs, not {len(inputs)}")
        for i, (buffer, given) in enumerate(zip(self.static_inputs, inputs, strict=True)):
            if not isinstance(buffer, torch.Tensor):
                if given != buffer:
                    raise ValueError(f"input {i} is {given!r}; the step was captured with {buffer!r}")
                continue
            if not isinstance(given, torch.Tensor) or given.shape != buffer.shape or given.dtype != buffer.dtype:
                raise ValueError(f"input {i} must be a {buffer.dtype} tensor of shape {tuple(buffer.shape)}: a CUDA "
                                 "graph replays fixed shapes (capture another step for another shape)")  # fmt: skip
            if given is not buffer:
                buffer.copy_(given)
        return self.replay()

    def replay(self) -> Any:
        """Run the step on what the static buffers hold now."""
        if self.graph is None:
            return self.fn(*self.static_inputs)
        self.graph.replay()
        return self.outputs


def cuda_graph(step_fn: Callable[..., Any], example_inputs: Sequence[Any], warmup: int = 2) -> CudaGraphStep:
    """``step_fn`` captured as one CUDA graph on static copies of ``example_inputs``.

    >>> step = kernelsmith.cuda_graph(torch.compile(decoder, backend="kernelsmith"), (ids, pos))  # doctest: +SKIP
    >>> logits = step(next_ids, next_pos)     # copies into the static buffers, replays  # doctest: +SKIP

    The warm-up runs ``step_fn`` ``warmup`` times on the copies (torch.compile compiles then, and
    the kernelsmith backend times its in-context choices as replays), then one call is captured.
    A step that writes state (a KV cache) writes it on those calls too. The step must not read
    values on the host (``.item()``, data-dependent Python control flow): capture forbids it, and
    the error says where. Inputs of another shape need another capture.
    """
    return CudaGraphStep(step_fn, example_inputs, warmup)



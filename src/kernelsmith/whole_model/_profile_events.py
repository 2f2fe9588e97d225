"""From profiler events to samples: each device kernel (or CPU op) with its time, family and module.

Part of the profile stage (:mod:`kernelsmith.whole_model.profile`): :func:`profile_model` records
a profiler trace with each recognized module's calls annotated (:class:`_ModuleAnnotations`); the
functions here read the trace's events into :class:`~kernelsmith.whole_model._profile_plan.Sample`
rows, attributing each kernel to the op family of the ATen op or annotated module that launched it.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from kernelsmith.whole_model._profile_families import kernel_family, op_family
from kernelsmith.whole_model._profile_plan import Sample

logger = logging.getLogger("kernelsmith.whole_model.profile")  # this code's logger in profile.py


MODULE_TAG = "kernelsmith.module::"

# Families that say little about which kernel could replace the op: an op of a specific family
# higher in the call tree takes precedence over them.
GENERIC_FAMILIES = frozenset({"elementwise", "reduction", "copy", "fill", "view", "alloc", "other"})
# ---------------------------------------------------------------------------------------------
# From profiler events to samples
# ---------------------------------------------------------------------------------------------


def _gpu_samples(events: Sequence[Any]) -> Iterator[Sample]:
    """One sample per device activity: linked kernels through the CPU op that launched them,
    the rest (activities the profiler could not link to an op) by name.

    A ``record_function`` range (ours around recognized modules, or the user's) also appears on
    the device timeline as a "GPU user annotation" spanning the kernels inside it: it is not
    device work, and counting it would count those kernels twice. Only kernels, memcpy and
    memset count.
    """
    from torch.autograd import DeviceType

    device_time: Counter[str] = Counter()
    device_count: Counter[str] = Counter()
    for e in events:
        if e.device_type != DeviceType.CPU and _is_device_work(e):
            device_time[e.name] += e.time_range.elapsed_us()
            device_count[e.name] += 1
    linked_time: Counter[str] = Counter()
    linked_count: Counter[str] = Counter()
    for e in events:
        if e.device_type != DeviceType.CPU or getattr(e, "is_legacy", False):
            continue
        for kernel in e.kernels:
            if linked_count[kernel.name] >= device_count[kernel.name]:
                continue  # an annotation, or more occurrences than the device recorded
            linked_time[kernel.name] += kernel.duration
            linked_count[kernel.name] += 1
            yield _attribute(kernel.name, float(kernel.duration), e)
    for name, t in device_time.items():
        rest, count = t - linked_time[name], device_count[name] - linked_count[name]
        if count > 0 and rest > 0:
            yield Sample(name, rest, kernel_family(name), count=count)


# Kineto's activity types of device work; others on the device timeline (user annotations,
# synchronization waits) span or wait for that work.
_DEVICE_WORK = frozenset({"kernel", "concurrent_kernel", "gpu_memcpy", "gpu_memset"})


def _is_device_work(event: Any) -> bool:
    kind = getattr(event, "activity_type", None)
    if isinstance(kind, str) and kind:
        return kind in _DEVICE_WORK
    return not _is_annotation(event)  # a profiler that does not say


def _is_annotation(event: Any) -> bool:
    return (
        bool(getattr(event, "is_user_annotation", False))
        or getattr(event, "activity_type", None) in ("gpu_user_annotation", "user_annotation")
        or event.name.startswith(MODULE_TAG)
    )


def _cpu_samples(events: Sequence[Any]) -> Iterator[Sample]:
    """One sample per CPU op: its self time (children excluded, so nothing counts twice)."""
    for e in events:
        if e.is_async or _is_annotation(e):
            continue
        t = float(e.self_cpu_time_total)
        if t > 0:
            yield _attribute(e.name, t, e)


def _attribute(name: str, time_us: float, op: Any) -> Sample:
    """The family and shapes of a kernel (or CPU op) ``name`` whose launching op is ``op``."""
    chain = []
    event = op
    while event is not None:
        if event.name.startswith(MODULE_TAG):
            family, shapes, module = _decode_tag(event.name)
            return Sample(name, time_us, family, shapes, "module", module)
        chain.append(event)
        event = event.cpu_parent
    innermost = outermost_specific = None
    for event in chain:
        found = op_family(event.name)
        if found is None:
            continue
        if innermost is None:
            innermost = (found, event)
        if found not in GENERIC_FAMILIES:
            outermost_specific = (found, event)
    chosen = outermost_specific or innermost
    if chosen is None:
        return Sample(name, time_us, kernel_family(name))
    family, event = chosen
    return Sample(name, time_us, family, _shapes_of(event), "op", event.name)


def _shapes_of(event: Any) -> tuple[tuple[int, ...], ...]:
    """The shapes of an op's tensor inputs (tensor lists, such as ``cat``'s, flattened; scalars
    and 0-d tensors left out). Newer profilers record tensor lists in ``structured_input_shapes``."""
    recorded = getattr(event, "structured_input_shapes", None) or event.input_shapes or ()
    shapes: list[tuple[int, ...]] = []

    def add(value: Any) -> None:
        if isinstance(value, list | tuple) and value:
            if all(isinstance(d, int) for d in value):
                shapes.append(tuple(value))
            else:
                for item in value:
                    add(item)

    for value in recorded:
        add(value)
    return tuple(shapes)


def _encode_tag(family: str, shapes: Sequence[Sequence[int]], module: str) -> str:
    return f"{MODULE_TAG}{family}::{json.dumps([list(s) for s in shapes], separators=(',', ':'))}::{module}"


def _decode_tag(tag: str) -> tuple[str, tuple[tuple[int, ...], ...], str]:
    family, shapes, module = tag[len(MODULE_TAG) :].split("::", 2)
    return family, tuple(tuple(s) for s in json.loads(shapes)), module


class _ModuleAnnotations:
    """Leaf modules that compute one op family, and ``record_function`` ranges around their calls."""

    # Modules no pattern can match: not worth a recognition pass.
    SKIP = (nn.Linear, nn.Embedding, nn.Dropout, nn.Identity)

    def __init__(self) -> None:
        self.matches: dict[int, Any] = {}  # id(module) -> kernelsmith.frontends.recognize.Match

    def recognize(self, model: nn.Module, inputs: Sequence[Any], kwargs: Mapping[str, Any] | None = None) -> None:
        """One forward with each leaf module's first call run through the recognizer."""
        from kernelsmith.frontends.recognize import recognize

        seen: set[int] = set()

        def hook(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            if id(module) in seen:
                return
            seen.add(id(module))
            try:
                found = recognize(module.forward, args, kwargs).match
            except Exception as err:  # the module's own error shows in the real forward right after
                logger.debug("recognizing %s failed: %s", type(module).__name__, err)
                return
            if found is not None:
                self.matches[id(module)] = found

        leaves = [m for m in model.modules() if not any(True for _ in m.children()) and not isinstance(m, self.SKIP)]
        handles = [m.register_forward_pre_hook(hook, with_kwargs=True) for m in leaves]
        try:
            model(*inputs, **dict(kwargs or {}))
        finally:
            for handle in handles:
                handle.remove()
        logger.info("%d of %d leaf modules compute a tunable op", len(self.matches), len(leaves))

    @contextmanager
    def annotate(self, model: nn.Module) -> Iterator[None]:
        open_ranges: list[Any] = []

        def enter(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            match = self.matches[id(module)]
            if not match.applies_to(args, kwargs):  # another call signature: not known to be the op
                open_ranges.append(None)
                return
            shapes = [tuple(t.shape) for t in match.bind(args, kwargs, check=False)]
            tag = _encode_tag(match.op, shapes, f"{type(module).__name__} module")
            scope = torch.profiler.record_function(tag)
            scope.__enter__()
            open_ranges.append(scope)

        def leave(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any) -> None:
            scope = open_ranges.pop() if open_ranges else None
            if scope is not None:
                scope.__exit__(None, None, None)

        handles = []
        for module in model.modules():
            if id(module) in self.matches:
                handles.append(module.register_forward_pre_hook(enter, with_kwargs=True))
                handles.append(module.register_forward_hook(leave, with_kwargs=True))
        try:
            yield
        finally:
            for handle in handles:
                handle.remove()
            while open_ranges:  # a forward that raised left its ranges open
                scope = open_ranges.pop()
                if scope is not None:
                    scope.__exit__(None, None, None)


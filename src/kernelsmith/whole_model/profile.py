"""Profile a model's forward: where the time goes, by op family and shape, and what tuning could gain.

The result is a *plan*: one row per (op family, shapes), ranked by time, with its share ``s`` of
the measured total and the end-to-end speedup Amdahl's law promises if that op alone became
``k`` times faster, ``1 / (1 - s + s / k)`` for k = 1.5, 2 and 3. ``kernelsmith optimize`` (and a
person) reads it top down: a 3x faster kernel for an op taking 2% of the time buys 1.3%.

Measuring without double counting
    On a GPU the profiler (``torch.profiler``, CPU and CUDA activities, ``record_shapes=True``)
    records every device activity (kernels, memcpy, memset) once; the time summed is that of
    those device activities, never of CPU ops (an op's device time includes its children's,
    which would count ``aten::linear`` and the ``aten::addmm`` inside it twice). Each kernel is
    linked to the CPU op that launched it (the innermost op: the profiler's correlation id), and
    device activities the profiler could not link are still counted, by name. Without a GPU the
    time of each CPU op is its *self* time (its own time minus its children's), so again each
    microsecond is counted once; such a plan carries :data:`NO_GPU_NOTE`: CPU timings show the
    model's structure, not where GPU time goes.

Attributing time to an op family, most specific first
    1. *Module*: before profiling, every leaf module is run once through kernelsmith's
       recognizer (:func:`kernelsmith.frontends.recognize.recognize`); a module that computes
       exactly one op family (a hand-written RMSNorm, Hugging Face's ``gelu_new``,
       ``nn.LayerNorm``) is wrapped during profiling in a ``record_function`` range naming the
       family and the op's input shapes, and every kernel launched inside it belongs to that
       family: eager RMSNorm's six small kernels become one ``rmsnorm`` row.
    2. *Op*: the CPU op that launched the kernel and its ancestors. The outermost ancestor that
       names a specific family wins (``aten::linear`` over the ``aten::addmm`` and
       ``aten::copy_`` inside it, ``aten::cross_entropy_loss`` over ``aten::_log_softmax``);
       when only generic ops are found (``aten::mul``: ``elementwise``), the innermost one. The
       shapes are that op's input shapes as the profiler recorded them.
    3. *Kernel name*: :func:`kernel_family` reads the name (cuBLAS / cuBLASLt including Hopper
       ``nvjet`` and ``sm90_xmma``, CUTLASS, flash / cuDNN / memory-efficient attention,
       Inductor's ``triton_poi`` / ``triton_red`` / ``triton_per`` / ``triton_tem`` names and
       the fused ops they list, ATen's elementwise, reduction, norm and softmax kernels); the
       shapes are unknown. This is what remains for code compiled by Inductor.

>>> from kernelsmith.models import get_model, example_inputs
>>> model = get_model("gpt2", tiny=True)
>>> plan = profile_model(model, example_inputs(model, 2, 32), name="gpt2", warmup=1, iterations=1)
>>> plan.mode, plan.note
('cpu', 'no GPU: CPU timings, for structure only')
>>> {"matmul", "attention", "layernorm", "gelu_tanh"} <= {row.family for row in plan.rows}
True

Layout: op and kernel families are in :mod:`~kernelsmith.whole_model._profile_families`, the plan
in :mod:`~kernelsmith.whole_model._profile_plan`, reading profiler events in
:mod:`~kernelsmith.whole_model._profile_events`; this module measures (:func:`profile_model`), and
every public name is importable from here.
"""

from __future__ import annotations

import datetime
import logging
import platform
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import nn

from kernelsmith.whole_model._profile_events import GENERIC_FAMILIES as GENERIC_FAMILIES
from kernelsmith.whole_model._profile_events import MODULE_TAG as MODULE_TAG
from kernelsmith.whole_model._profile_events import _cpu_samples, _gpu_samples, _ModuleAnnotations
from kernelsmith.whole_model._profile_events import _encode_tag as _encode_tag
from kernelsmith.whole_model._profile_families import kernel_family as kernel_family
from kernelsmith.whole_model._profile_families import op_family as op_family
from kernelsmith.whole_model._profile_families import tunable_families as tunable_families
from kernelsmith.whole_model._profile_plan import PLAN_FORMAT as PLAN_FORMAT
from kernelsmith.whole_model._profile_plan import SPEEDUPS as SPEEDUPS
from kernelsmith.whole_model._profile_plan import Plan, build_plan
from kernelsmith.whole_model._profile_plan import PlanRow as PlanRow
from kernelsmith.whole_model._profile_plan import Sample as Sample
from kernelsmith.whole_model._profile_plan import amdahl_gain as amdahl_gain
from kernelsmith.whole_model._profile_plan import format_shapes as format_shapes

logger = logging.getLogger(__name__)

NO_GPU_NOTE = "no GPU: CPU timings, for structure only"


# ---------------------------------------------------------------------------------------------
# Measuring
# ---------------------------------------------------------------------------------------------


def profile_model(
    model: nn.Module,
    inputs: Sequence[Any],
    *,
    name: str = "model",
    warmup: int = 3,
    iterations: int = 5,
    compile: bool = False,
    recognize_modules: bool = True,
    kwargs: Mapping[str, Any] | None = None,
    **meta: Any,
) -> Plan:
    """Profile ``model(*inputs)`` (forward, no grad) on the inputs' device and return its plan.

    The model must already be on that device and in the dtype to profile; it is put in eval mode. ``warmup`` forwards
    run first (with ``compile=True`` the model is ``torch.compile``-d and the warm-up compiles
    it), then ``iterations`` unprofiled forwards give the wall time and ``iterations`` profiled
    ones the plan. ``meta`` (``batch``, ``seq``, ``dtype``, ``source``...) is recorded in the plan.
    ``kwargs`` are keyword inputs of every call (Hugging Face's ``input_ids``, ``labels``,
    ``attention_mask``: with ``labels`` the model's loss is profiled too). On a GPU the plan's
    ``peak_memory_bytes`` is the largest ``torch.cuda.max_memory_allocated`` of the unprofiled
    forwards; on a CPU it is None and ``memory_note`` says why.
    """
    if iterations < 1 or warmup < 0:
        raise ValueError(f"iterations must be positive and warmup non-negative (got {iterations}, {warmup})")
    keywords = dict(kwargs or {})
    device = _device_of(model, (*inputs, *keywords.values()))
    on_gpu = device.type == "cuda"
    model.eval()
    annotations = _ModuleAnnotations()
    run: Callable[[], Any] = lambda: model(*inputs, **keywords)
    if compile:
        run = _compiled(model, inputs, keywords)
    elif recognize_modules:
        with torch.no_grad():
            annotations.recognize(model, inputs, keywords)

    def sync() -> None:
        if on_gpu:
            torch.cuda.synchronize(device)

    with torch.no_grad():
        for _ in range(warmup):
            run()
        sync()
        if on_gpu:
            torch.cuda.reset_peak_memory_stats(device)
        start = time.perf_counter()
        for _ in range(iterations):
            run()
        sync()
        wall_ms = (time.perf_counter() - start) * 1000.0 / iterations
        peak = torch.cuda.max_memory_allocated(device) if on_gpu else None

        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_gpu else [])
        with annotations.annotate(model), profile(activities=activities, record_shapes=True) as prof:
            for _ in range(iterations):
                run()
            sync()
    events = list(prof.events())
    samples = list(_gpu_samples(events) if on_gpu else _cpu_samples(events))
    if not samples:
        logger.warning("the profiler recorded no %s time for %s", "kernel" if on_gpu else "op", name)
    import kernelsmith

    meta.setdefault("parameters", sum(p.numel() for p in model.parameters()))
    return build_plan(
        samples,
        iterations=iterations,
        model=name,
        mode="gpu" if on_gpu else "cpu",
        device=_device_name(device),
        note="" if on_gpu else NO_GPU_NOTE,
        compiled=compile,
        wall_ms=wall_ms,
        peak_memory_bytes=peak,
        memory_note="" if on_gpu else "peak memory is not measured on a CPU",
        versions={"torch": torch.__version__, "kernelsmith": kernelsmith.__version__},
        created=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        **{"dtype": _dtype_name(model), **meta},
    )


def _device_of(model: nn.Module, inputs: Sequence[Any]) -> torch.device:
    for value in (*inputs, *model.parameters(), *model.buffers()):
        if isinstance(value, torch.Tensor):
            return value.device
    return torch.device("cpu")


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return f"{device} {torch.cuda.get_device_name(device)}"
    return f"cpu {platform.machine()} ({torch.get_num_threads()} threads)"


def _dtype_name(model: nn.Module) -> str:
    from kernelsmith.spec import dtype_name

    dtypes = Counter(p.dtype for p in model.parameters() if p.is_floating_point())
    if not dtypes:
        return "-"
    dtype = dtypes.most_common(1)[0][0]
    try:
        return dtype_name(dtype)
    except (ValueError, KeyError):
        return str(dtype).removeprefix("torch.")


def _compiled(model: nn.Module, inputs: Sequence[Any], kwargs: Mapping[str, Any]) -> Callable[[], Any]:
    compiled = torch.compile(model)
    return lambda: compiled(*inputs, **kwargs)



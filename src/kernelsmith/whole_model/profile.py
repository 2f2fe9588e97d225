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
"""

from __future__ import annotations

import datetime
import json
import logging
import platform
import re
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

logger = logging.getLogger(__name__)

PLAN_FORMAT = 1
SPEEDUPS = (1.5, 2.0, 3.0)
NO_GPU_NOTE = "no GPU: CPU timings, for structure only"
MODULE_TAG = "kernelsmith.module::"

# Families that say little about which kernel could replace the op: an op of a specific family
# higher in the call tree takes precedence over them.
GENERIC_FAMILIES = frozenset({"elementwise", "reduction", "copy", "fill", "view", "alloc", "other"})


def amdahl_gain(share: float, speedup: float) -> float:
    """End-to-end speedup when a part taking ``share`` of the time runs ``speedup`` times faster.

    >>> round(amdahl_gain(0.5, 2.0), 4)
    1.3333
    >>> amdahl_gain(0.0, 3.0), amdahl_gain(1.0, 3.0)
    (1.0, 3.0)
    """
    if not 0.0 <= share <= 1.0 or speedup <= 0.0:
        raise ValueError(f"share must be in [0, 1] and speedup positive (got {share}, {speedup})")
    return 1.0 / (1.0 - share + share / speedup)


# ---------------------------------------------------------------------------------------------
# Op families of CPU ops and of kernel names
# ---------------------------------------------------------------------------------------------

_OP_FAMILIES: dict[str, tuple[str, ...]] = {
    "matmul": (
        "mm", "addmm", "bmm", "baddbmm", "addbmm", "matmul", "linear", "addmv", "mv", "dot", "einsum",
        "_addmm_activation", "_scaled_mm", "_int_mm", "tensordot",
    ),
    "conv": ("convolution", "_convolution", "conv1d", "conv2d", "conv3d", "cudnn_convolution", "mkldnn_convolution"),
    "attention": (
        "scaled_dot_product_attention", "_scaled_dot_product_flash_attention",
        "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention",
        "_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_attention_math",
        "_scaled_dot_product_fused_attention_overrideable", "_flash_attention_forward",
        "_efficient_attention_forward", "_cudnn_attention_forward",
    ),
    "layernorm": ("layer_norm", "native_layer_norm"),
    "rmsnorm": ("rms_norm", "_fused_rms_norm"),
    "norm": ("group_norm", "native_group_norm", "batch_norm", "native_batch_norm", "_batch_norm_impl_index"),
    "softmax": ("softmax", "_softmax"),
    "log_softmax": ("log_softmax", "_log_softmax"),
    "cross_entropy": ("cross_entropy_loss", "nll_loss", "nll_loss_nd", "nll_loss_forward", "nll_loss2d_forward"),
    "gelu": ("gelu",),
    "silu": ("silu",),
    "embedding": ("embedding", "embedding_bag", "_embedding_bag"),
    "copy": (
        "copy_", "to", "_to_copy", "contiguous", "clone", "cat", "stack", "repeat", "index_select", "gather",
        "index", "flip", "roll", "constant_pad_nd", "_unsafe_view",
    ),
    "fill": (
        "fill_", "zero_", "zeros", "ones", "full", "zeros_like", "ones_like", "full_like", "new_zeros", "new_ones",
        "arange", "randn", "rand", "randint", "normal_", "uniform_",
    ),
    # No device work: on a CPU their self time is dispatch overhead; on a GPU they launch nothing.
    "view": (
        "view", "reshape", "_reshape_alias", "as_strided", "t", "transpose", "permute", "unsqueeze", "squeeze", "slice",
        "select", "expand", "split", "split_with_sizes", "chunk", "narrow", "unbind", "detach", "alias", "flatten",
        "unflatten", "resolve_conj", "resolve_neg", "lift_fresh", "view_as", "expand_as",
    ),
    "alloc": ("empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "resize_"),
    "reduction": (
        "sum", "mean", "max", "min", "amax", "amin", "var", "std", "var_mean", "std_mean", "norm", "linalg_vector_norm",
        "prod", "argmax", "argmin", "logsumexp", "all", "any", "cumsum",
    ),
    "elementwise": (
        "add", "add_", "sub", "sub_", "mul", "mul_", "div", "div_", "pow", "rsqrt", "sqrt", "exp", "log", "tanh",
        "sigmoid", "neg", "abs", "where", "masked_fill", "masked_fill_", "clamp", "clamp_", "relu", "relu_", "erf",
        "reciprocal", "square", "sin", "cos", "triu", "tril", "bitwise_not", "logical_not", "eq", "ne", "lt", "gt",
        "ge", "le", "minimum", "maximum", "lerp", "addcmul", "addcdiv", "hardtanh", "leaky_relu", "elu", "softplus",
        "dropout", "native_dropout", "rsub",
    ),
}
_OP_TABLE = {f"aten::{op}": family for family, ops in _OP_FAMILIES.items() for op in ops}


def op_family(op_name: str) -> str | None:
    """The family of a profiled CPU op (``aten::addmm`` -> ``matmul``), None for ops not listed.

    >>> op_family("aten::linear"), op_family("aten::_scaled_dot_product_flash_attention"), op_family("aten::t")
    ('matmul', 'attention', 'view')
    >>> op_family("cudaLaunchKernel") is None
    True
    """
    return _OP_TABLE.get(op_name)


# Inductor kernels: triton_{poi,red,per,tem,for,mix}_fused_<aten ops in alphabetical order>_<n>.
# The listed ops say which op family the fused kernel serves; checked in order.
_INDUCTOR = re.compile(r"^triton_(poi|red|per|tem|for|mix|spl)_(?:fused_)?(.*?)(?:_\d+)*$")
_INDUCTOR_RULES: list[tuple[str, Callable[[set[str], str], bool]]] = [
    ("matmul", lambda ops, text: bool(ops & {"mm", "addmm", "bmm", "baddbmm", "_scaled_mm", "_int_mm"})),
    ("conv", lambda ops, text: "convolution" in text),
    ("attention", lambda ops, text: "attention" in text or "flex" in text or "sdpa" in text),
    ("layernorm", lambda ops, text: "layer_norm" in text or "var_mean" in text),
    ("rmsnorm", lambda ops, text: "rms_norm" in text or ("rsqrt" in ops and bool(ops & {"mean", "pow"}))),
    ("cross_entropy", lambda ops, text: "nll_loss" in text or "log_softmax" in text),
    ("softmax", lambda ops, text: "softmax" in text),
    ("gelu", lambda ops, text: "gelu" in text),
    ("gelu_tanh", lambda ops, text: {"tanh", "pow", "mul"} <= ops),
    ("swiglu", lambda ops, text: "silu" in ops and "mul" in ops),
    ("silu", lambda ops, text: "silu" in ops or {"sigmoid", "mul"} <= ops),
    ("rope", lambda ops, text: {"cat", "neg"} <= ops and "mul" in ops),
    ("embedding", lambda ops, text: "embedding" in text),
]
_INDUCTOR_KIND = {"poi": "elementwise", "red": "reduction", "per": "reduction", "for": "elementwise",
                  "mix": "reduction", "spl": "reduction", "tem": "matmul"}

# Library and ATen kernel names, checked in order (attention before matmul: memory-efficient
# attention kernels are CUTLASS kernels; conv before matmul: cuDNN convolutions are implicit GEMMs).
_KERNEL_RULES: list[tuple[str, re.Pattern[str]]] = [
    (family, re.compile(pattern, re.IGNORECASE))
    for family, pattern in (
        ("copy", r"^memcpy"),
        ("fill", r"^memset"),
        ("attention", r"flash|fmha|sdpa|attention|_attn|\bmha|xformers"),
        ("conv", r"conv(?!ert)|fprop|dgrad|wgrad|winograd|implicit_?gemm"),
        ("matmul", r"nvjet|gemm|cutlass|cublas|xmma|wgmma|splitkreduce|matmul|gemv|\bdot_kernel"),
        ("cross_entropy", r"nll_loss|cross_?entropy"),
        ("log_softmax", r"log_?softmax"),
        ("softmax", r"softmax"),
        ("rmsnorm", r"rms_?norm"),
        ("layernorm", r"layer_?norm|rowwisemoments|cuApplyLayerNorm"),
        ("norm", r"group_?norm|batch_?norm|batchnorm"),
        ("gelu_tanh", r"gelu.*tanh|tanh.*gelu"),
        ("gelu", r"gelu"),
        ("silu", r"silu|swish"),
        ("rope", r"rotary|\brope"),
        ("embedding", r"embedding|indexselect"),
        ("copy", r"copy|catarray|transpose|permute|contiguous"),
        ("fill", r"fill|zero"),
        ("reduction", r"reduce|reduction|welford|argmax|argmin"),
        ("elementwise", r"elementwise|pointwise|functor|unrolled|vectorized"),
    )
]


def kernel_family(name: str) -> str:
    """The op family a device kernel (or, on a CPU, an op) serves, read from its name alone.

    >>> kernel_family("nvjet_tst_128x256_64x4_1x2_h_bz_coopA_NNT")
    'matmul'
    >>> kernel_family("triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_0")
    'rmsnorm'
    >>> kernel_family("void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4>>(Params)")
    'attention'
    """
    match = _INDUCTOR.match(name)
    if match:
        kind, fused = match.groups()
        ops = set(fused.split("_")) - {""}
        for family, rule in _INDUCTOR_RULES:
            if rule(ops, fused):
                return family
        return _INDUCTOR_KIND[kind]
    known = op_family(name)
    if known is not None:
        return known
    for family, pattern in _KERNEL_RULES:
        if pattern.search(name):
            return family
    return "other"


def tunable_families() -> frozenset[str]:
    """Families kernelsmith has op families (kernels to tune) for."""
    from kernelsmith.ops import op_names

    return frozenset(op_names())


# ---------------------------------------------------------------------------------------------
# The plan
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Sample:
    """Time attributed to one family and shape set: a kernel (or a CPU op's self time), summed
    over its ``count`` occurrences in the profiled iterations.

    ``source`` says how the family was found (``"module"``, ``"op"`` or ``"kernel"``, see the
    module docstring); ``label`` is the module class or CPU op that explains it, if any.
    """

    name: str
    time_us: float
    family: str
    shapes: tuple[tuple[int, ...], ...] = ()
    source: str = "kernel"
    label: str = ""
    count: int = 1


@dataclass
class PlanRow:
    """One (family, shapes) of the plan; times and calls are per iteration (one forward)."""

    rank: int
    family: str
    shape: str
    shapes: list[list[int]]
    time_us: float
    calls: float
    share: float
    gain: dict[str, float]
    tunable: bool
    source: str
    ops: list[str]
    kernels: list[str]


@dataclass
class Plan:
    """A ranked Amdahl plan; :meth:`to_dict` is the JSON written by ``kernelsmith profile``."""

    model: str
    mode: str  # "gpu": device kernel timings; "cpu": CPU op self times
    device: str
    dtype: str
    iterations: int
    total_us: float  # attributed time per iteration (sum of the rows)
    rows: list[PlanRow]
    note: str = ""
    batch: int | None = None
    seq: int | None = None
    source: str = ""
    parameters: int | None = None
    compiled: bool = False
    wall_ms: float | None = None  # one forward, unprofiled, host clock around synchronized runs
    peak_memory_bytes: int | None = None  # torch.cuda.max_memory_allocated over the unprofiled forwards
    memory_note: str = ""  # why peak memory is not measured (a CPU)
    families: list[dict[str, Any]] = field(default_factory=list)
    attributed_by: dict[str, float] = field(default_factory=dict)
    versions: dict[str, str] = field(default_factory=dict)
    created: str = ""

    @property
    def busy(self) -> float | None:
        """Kernel time over wall time, on a GPU: well below 1 means launch- or host-bound (the
        shares then overstate what faster kernels buy). None for CPU plans."""
        if not self.wall_ms or self.mode != "gpu":
            return None
        return self.total_us / (self.wall_ms * 1000.0)

    def to_dict(self) -> dict[str, Any]:
        data = {"format": PLAN_FORMAT, **asdict(self)}
        data["busy"] = self.busy
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Plan:
        if data.get("format") != PLAN_FORMAT:
            raise ValueError(f"not a kernelsmith plan of format {PLAN_FORMAT} (format: {data.get('format')!r})")
        values = {k: v for k, v in data.items() if k not in ("format", "busy")}
        values["rows"] = [PlanRow(**row) for row in values["rows"]]
        return cls(**values)

    def write(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_dict(), indent=2) + "\n")
        return path

    @classmethod
    def read(cls, path: str | Path) -> Plan:
        return cls.from_dict(json.loads(Path(path).read_text()))


def format_shapes(shapes: Sequence[Sequence[int]]) -> str:
    """``[[8, 1024, 768], [768]]`` -> ``"8x1024x768, 768"``; ``"-"`` when unknown."""
    return ", ".join("x".join(map(str, s)) for s in shapes) or "-"


def build_plan(samples: Iterable[Sample], *, iterations: int, model: str, mode: str, **meta: Any) -> Plan:
    """Group samples by (family, shapes), rank by time, and compute shares and Amdahl gains.

    Times and calls are divided by ``iterations``; ``meta`` fills the other :class:`Plan` fields.
    """
    if iterations < 1:
        raise ValueError(f"iterations must be positive (got {iterations})")
    groups: dict[tuple[str, tuple[tuple[int, ...], ...]], list[Sample]] = defaultdict(list)
    by_source: dict[str, float] = defaultdict(float)
    for sample in samples:
        groups[(sample.family, sample.shapes)].append(sample)
        by_source[sample.source] += sample.time_us
    total = sum(s.time_us for group in groups.values() for s in group)
    tunable = tunable_families()

    def top(names: Iterable[tuple[str, float]], n: int = 3) -> list[str]:
        by_time: defaultdict[str, float] = defaultdict(float)
        for name, t in names:
            if name:
                by_time[name] += t
        return sorted(by_time, key=lambda name: -by_time[name])[:n]

    rows: list[PlanRow] = []
    for (family, shapes), group in groups.items():
        time_us = sum(s.time_us for s in group)
        share = min(1.0, time_us / total) if total > 0 else 0.0
        rows.append(
            PlanRow(
                rank=0,
                family=family,
                shape=format_shapes(shapes),
                shapes=[list(s) for s in shapes],
                time_us=time_us / iterations,
                calls=sum(s.count for s in group) / iterations,
                share=share,
                gain={f"{k:g}x": amdahl_gain(share, k) for k in SPEEDUPS},
                tunable=family in tunable,
                source=top((s.source, s.time_us) for s in group)[0],
                ops=top((s.label, s.time_us) for s in group),
                kernels=top((s.name, s.time_us) for s in group),
            )
        )
    rows.sort(key=lambda r: (-r.time_us, r.family, r.shape))
    for rank, row in enumerate(rows, 1):
        row.rank = rank

    by_family: dict[str, float] = defaultdict(float)
    for row in rows:
        by_family[row.family] += row.share
    families = [
        {"family": f, "share": s, "time_us": s * total / iterations, "tunable": f in tunable}
        for f, s in sorted(by_family.items(), key=lambda item: -item[1])
    ]
    return Plan(
        model=model,
        mode=mode,
        iterations=iterations,
        total_us=total / iterations,
        rows=rows,
        families=families,
        attributed_by={k: v / total for k, v in by_source.items()} if total > 0 else {},
        **meta,
    )


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


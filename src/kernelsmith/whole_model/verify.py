"""Verify an optimized model against the original: same outputs (and gradients), and how fast.

Three questions, one module:

1. **Does it compute the same function?** :func:`verify_model` runs the original and the
   optimized model on fresh random inputs, one set per seed, and compares every tensor of the
   output (a tensor, a tuple, a dict or a Hugging Face ``ModelOutput``), and with ``train=True``
   the gradients of every parameter and floating-point input too.

   *The truth.* Where it fits in memory, a float64 copy of the original model is run on the
   same inputs; it is the truth both models are measured against, and the test is the one every
   kernel passes (DESIGN.md rule 8, :func:`kernelsmith.evaluate.errors.check_close`)::

       err(optimized, fp64) <= k * err(original in its dtype, fp64) + floor

   for the relative L2 error over the tensor and the largest elementwise error. The original's
   own error sets the bar, so a bf16 model is held to bf16 accuracy and a float32 model to float32
   accuracy, with no tolerance table to tune. Where the float64 copy does not fit (its
   parameters and buffers would take more than half of the free device memory), the optimized
   model is compared with the original directly, with the per-dtype limits of
   :data:`FALLBACK_TOLERANCES` on the relative L2 difference and on the largest elementwise
   difference (as a share of the original's largest magnitude).

   Integer and boolean outputs must be equal, and an output's dtype must be the original's (a
   quietly lowered precision is a failure, not a speed-up).

   *Gradients* (``train=True``). The loss is ``sum_i (output_i * w_i).sum()`` with fixed random
   weights ``w_i`` drawn from the seed (the same for all three models), so every output element
   gets a different gradient and nothing cancels; the gradients of the parameters (by name) and
   of the floating-point inputs are compared like outputs. Models run in eval mode throughout,
   so dropout cannot make two runs differ. An optimized callable that is an ``nn.Module`` is
   asked for its own parameters (``torch.compile``'s ``_orig_mod.`` prefix removed); any other
   callable is assumed to share the original's (``torch.compile(model)`` does).

2. **Which replacement broke it?** :func:`diagnose` needs a *build hook*: a function
   ``build(model, enabled)`` that returns the optimized model with only the replacements named
   in ``enabled`` switched on. It verifies the build with none enabled (the compiler alone),
   then each replacement alone; a replacement that fails alone is a culprit. When none fails
   alone but all together fail, it enables them cumulatively, in order, and names the first
   whose addition breaks the model (an interaction).

3. **Is it faster?** :func:`time_models` times several callables on the same inputs in one run,
   in interleaved rounds (every variant once per round, in rotating order, so clock and thermal
   drift fall on all alike): CUDA events around each forward (or forward and backward) on a GPU,
   the host clock on a CPU, where the result carries :data:`NO_GPU_NOTE`. The optimized model's
   speedup is reported over the best existing path the user would otherwise run, torch.compile
   (Inductor), and over eager, each the median of the round-by-round ratios with a 95% interval
   that means what it says (:func:`paired_speedup`: distribution-free, from order statistics, none
   with too few rounds, and "unresolved" when it spans more than :data:`RESOLVED_SPREAD`). Where
   the kernelsmith backend replaced nothing (:func:`replaced_families`), the optimized model *is*
   torch.compile, and there is no kernelsmith speedup to report.

The optimized model under test is, by default, ``torch.compile(model, backend=KernelsmithBackend())``
(what ``backend="kernelsmith"`` runs, as one instance whose sites can be read afterwards), else the
backend registered as ``"kernelsmith"`` (:func:`kernelsmith_backend_available`: the package's
``torch_dynamo_backends`` entry point) or the backend function imported from this checkout,
else ``torch.compile(model)`` (Inductor) with a note saying so (:func:`optimized_model`). Any
callable can be passed instead, which is how the tests plant wrong models.

>>> import torch
>>> from kernelsmith.models import get_model, example_inputs
>>> from kernelsmith.whole_model.verify import verify_model
>>> model = get_model("llama-160m", tiny=True).eval()
>>> result = verify_model(model, model, lambda seed: example_inputs(model, 2, 16, seed=seed), seeds=[1, 2])
>>> result.ok, result.truth
(True, 'fp64')
"""

from __future__ import annotations

import copy
import logging
import math
import os
import statistics
import time
import weakref
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch import nn

from kernelsmith.evaluate.errors import ErrorStats, check_close, error_stats
from kernelsmith.ops._base import Tolerance

logger = logging.getLogger(__name__)

BACKEND_NAME = "kernelsmith"
# Where the kernelsmith backend lives: its function, and the class whose ``families`` and
# ``sites`` the diagnose hooks use.
BACKEND_MODULE = "kernelsmith.frontends.backend"
NO_GPU_NOTE = "no GPU: wall-clock CPU timings, for structure only, not GPU performance"
DEFAULT_SEEDS = (1, 2, 3)
# The whole-model bar against the float64 truth: as for single ops, four times PyTorch's own
# error; the floor is wider (8 units of the dtype's epsilon times the output's scale) because an
# output that eager computes almost exactly after dozens of layers still admits a few roundings.
MODEL_TOLERANCE = Tolerance(k=4.0, floor_ulps=8.0)
# Without a float64 truth: the optimized model against the original, relative L2 difference over
# the tensor <= rel_l2 and largest elementwise difference <= max_abs_share * max|original|. A whole
# model accumulates rounding over its layers, and two correct bf16 models can differ by a few
# percent in a few elements of a gradient, so these are looser than a single op's bar.
FALLBACK_TOLERANCES: dict[torch.dtype, tuple[float, float]] = {  # dtype: (rel_l2, max_abs_share)
    torch.float64: (1e-9, 1e-8),
    torch.float32: (1e-4, 1e-3),
    torch.float16: (1e-2, 2e-2),
    torch.bfloat16: (5e-2, 1e-1),
}
# The float64 copy is made only when its parameters and buffers take at most this share of the
# free memory (activations need the rest).
FP64_MEMORY_SHARE = 0.5

InputsFn = Callable[[int], Sequence[Any]]
# build(model, enabled) -> the optimized model with only the replacements in ``enabled`` on.
BuildFn = Callable[[nn.Module, Collection[str]], Callable[..., Any]]


# ---------------------------------------------------------------------------------------------
# The optimized model under test
# ---------------------------------------------------------------------------------------------


def kernelsmith_backend_available() -> bool:
    """Whether ``torch.compile(..., backend="kernelsmith")`` is registered in this process (by the
    ``torch_dynamo_backends`` entry point of an installed kernelsmith, or by importing it)."""
    from torch._dynamo import list_backends

    return BACKEND_NAME in list_backends(exclude_tags=())


def _backend_function() -> Callable[..., Any] | None:
    """The kernelsmith backend as a function, for a checkout whose entry point is not installed."""
    import importlib

    try:
        return getattr(importlib.import_module(BACKEND_MODULE), "kernelsmith_backend", None)
    except ImportError:
        return None


def optimized_model(
    model: nn.Module, backend: str | None = None, options: dict[str, Any] | None = None
) -> tuple[Callable[..., Any], str, str]:
    """``torch.compile(model, backend=...)``, the backend's name, and a note (empty when all is as asked).

    ``backend=None`` asks for kernelsmith's backend: registered by name when the package's entry
    point is installed, else imported from :data:`BACKEND_MODULE`; without either it falls back
    to Inductor, saying so. ``options`` go to the kernelsmith backend (``{"db": "runs.db"}``).
    """
    note = ""
    if backend in (None, BACKEND_NAME):
        instance = _backend_instance(options)
        if instance is not None:
            compiled = torch.compile(model, backend=instance)
            _BACKENDS[compiled] = instance
            return compiled, BACKEND_NAME, note
    chosen: str | Callable[..., Any] = backend or BACKEND_NAME
    if backend is None and not kernelsmith_backend_available():
        function = _backend_function()
        if function is not None:
            chosen = function
        else:
            backend, chosen = "inductor", "inductor"
            note = (
                "the kernelsmith torch.compile backend is not available in this installation: "
                "verifying torch.compile(model) with Inductor instead"
            )
            logger.info(note)
    name = backend or BACKEND_NAME
    if name == BACKEND_NAME and options:
        return torch.compile(model, backend=chosen, options=options), name, note
    return torch.compile(model, backend=chosen), name, note


# The backend instance each optimized model of :func:`optimized_model` was compiled with, so that
# :func:`replaced_families` can say what it replaced (weak: a model's lifetime is the caller's).
_BACKENDS: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()


def _backend_instance(options: dict[str, Any] | None) -> Any:
    """``kernelsmith.frontends.backend.backend(**options)``, or None where that module is missing."""
    import importlib

    try:
        make = getattr(importlib.import_module(BACKEND_MODULE), "backend", None)
    except ImportError:
        return None
    return None if make is None else make(**(options or {}))


def replaced_families(optimized: Callable[..., Any]) -> list[str] | None:
    """The op families the kernelsmith backend replaced in ``optimized`` (a model of
    :func:`optimized_model`, after it ran), in graph order; None when that is not known (another
    backend, or a callable from elsewhere). An empty list means the backend replaced nothing:
    the optimized model is Inductor alone."""
    try:
        backend = _BACKENDS.get(optimized)
    except TypeError:  # not weakly referenceable: not one of ours
        return None
    if backend is None:
        return None
    return list(dict.fromkeys(site.op for site in backend.sites if site.status == "replaced"))


ListFn = Callable[[nn.Module, Sequence[Any]], Sequence[str]]


def backend_hooks(db: Any = None, train: bool = False) -> tuple[ListFn, BuildFn] | None:
    """The hooks :func:`diagnose` needs, made from the kernelsmith backend; None without it.

    ``replacements(model, inputs)`` compiles the model with a fresh backend, runs it once (with
    gradients when ``train``) and returns the op families of the sites it replaced, in graph
    order. ``build(model, enabled)`` compiles the model with a backend limited to those families
    (``add_rmsnorm`` brings ``rmsnorm``, the match it is folded into). The granularity is the op
    family: every replaced site of a family is swapped in together. Dynamo's cache is reset
    before each build, so that no earlier build is reused and the recompile limit is never hit.
    """
    import importlib

    try:
        module = importlib.import_module(BACKEND_MODULE)
    except ImportError:
        return None
    backend_class = getattr(module, "KernelsmithBackend", None)
    families = tuple(getattr(module, "FAMILIES", ()))
    if backend_class is None or not families:
        return None

    import torch._dynamo

    def replacements(model: nn.Module, inputs: Sequence[Any]) -> list[str]:
        torch._dynamo.reset()
        probe = backend_class(db=db)
        with torch.set_grad_enabled(train):
            torch.compile(model, backend=probe)(*inputs)
        return list(dict.fromkeys(site.op for site in probe.sites if site.status == "replaced"))

    def build(model: nn.Module, enabled: Collection[str]) -> Callable[..., Any]:
        wanted = set(enabled) | ({"rmsnorm"} if "add_rmsnorm" in enabled else set())
        torch._dynamo.reset()
        return torch.compile(model, backend=backend_class(db=db, families=[f for f in families if f in wanted]))

    return replacements, build


# ---------------------------------------------------------------------------------------------
# Results
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Check:
    """One compared tensor: an output leaf, a parameter's or an input's gradient, on one seed.

    ``error`` and ``reference_error`` are the optimized and original models' errors (relative L2
    and max abs) against the truth (``fp64``) or, without one, the optimized model's against the
    original (``reference_error`` then empty); ``reason`` is empty when the check passed.
    """

    seed: int
    kind: str  # "output", "grad" (a parameter's) or "input_grad"
    name: str
    ok: bool
    reason: str = ""
    error: dict[str, float] = field(default_factory=dict)
    reference_error: dict[str, float] = field(default_factory=dict)

    def describe(self) -> str:
        where = f"seed {self.seed} {self.kind} {self.name}"
        return f"{where}: ok" if self.ok else f"{where}: {self.reason}"


@dataclass
class VerifyResult:
    """What :func:`verify_model` found: ``ok`` when every check on every seed passed."""

    ok: bool
    truth: str  # "fp64" or "original"
    seeds: list[int]
    train: bool
    checks: list[Check]
    note: str = ""

    @property
    def failures(self) -> list[Check]:
        return [c for c in self.checks if not c.ok]

    def worst(self) -> Check | None:
        """The failed check with the largest relative error (or, all passing, the closest call)."""
        pool = self.failures or self.checks
        return max(pool, key=lambda c: c.error.get("rel_l2", 0.0), default=None)

    def summary(self) -> str:
        kinds = sorted({c.kind for c in self.checks})
        head = (
            f"{'PASS' if self.ok else 'FAIL'}: {len(self.checks) - len(self.failures)}/{len(self.checks)} "
            f"checks ({', '.join(kinds)}) on seeds {', '.join(map(str, self.seeds))} against the "
            + ("float64 truth" if self.truth == "fp64" else "original model (no float64 truth)")
        )
        if not self.ok:
            first = self.failures[0]
            head += f"; first failure: {first.describe()}"
        return head

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["failures"] = len(self.failures)
        return data


@dataclass
class DiagnoseStep:
    """One build verified during a diagnosis: which replacements were on, and the outcome."""

    enabled: list[str]
    ok: bool
    detail: str


@dataclass
class Diagnosis:
    """What :func:`diagnose` concluded. ``culprits`` is empty when no replacement is to blame:
    ``verdict`` then says whether everything passed or the compiler alone already failed."""

    culprits: list[str]
    verdict: str
    steps: list[DiagnoseStep]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class TimingRow:
    """End-to-end time of one variant: median and spread over the measured rounds, in ms."""

    name: str
    median_ms: float
    p10_ms: float
    p90_ms: float
    speedup_vs_eager: float | None = None


@dataclass
class TimingResult:
    """:func:`time_models`'s rows, the optimized model's paired speedups (``{"eager": {...},
    "inductor": {...}}``, each :func:`paired_speedup`'s fields), the timer used and, on a CPU,
    :data:`NO_GPU_NOTE`."""

    rows: list[TimingRow]
    timer: str
    rounds: int
    train: bool
    comparisons: dict[str, dict[str, Any]] = field(default_factory=dict)
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# ---------------------------------------------------------------------------------------------
# Comparing outputs and gradients
# ---------------------------------------------------------------------------------------------


def _leaves(value: Any, path: str) -> list[tuple[str, torch.Tensor]]:
    """The tensors of a model output with their paths (``output``, ``output[0]``, ``output.logits``)."""
    if isinstance(value, torch.Tensor):
        return [(path, value)]
    if isinstance(value, Mapping):  # includes Hugging Face ModelOutput (an ordered dict)
        return [leaf for key in value for leaf in _leaves(value[key], f"{path}.{key}")]
    if isinstance(value, list | tuple):
        return [leaf for i, item in enumerate(value) for leaf in _leaves(item, f"{path}[{i}]")]
    return []  # None and other non-tensor values are not compared


def _stats(e: ErrorStats) -> dict[str, float]:
    return {"rel_l2": e.rel_l2, "max_abs": e.max_abs}


def _fallback_close(output: torch.Tensor, original: torch.Tensor) -> str | None:
    """The test against the original, without a float64 truth (:data:`FALLBACK_TOLERANCES`)."""
    rel_limit, abs_share = FALLBACK_TOLERANCES.get(original.dtype, FALLBACK_TOLERANCES[torch.float32])
    if output.shape != original.shape:
        return f"shape {tuple(output.shape)} differs from the original's {tuple(original.shape)}"
    out_finite, ref_finite = torch.isfinite(output), torch.isfinite(original)
    if not bool(torch.equal(out_finite, ref_finite)):
        bad = int((out_finite != ref_finite).sum())
        return f"{bad} elements are NaN/Inf where the original's are finite (or the reverse)"
    reference = original[ref_finite].double()
    if reference.numel() == 0:
        return None
    stats = error_stats(output[ref_finite], reference)
    abs_limit = abs_share * float(reference.abs().max())
    if stats.rel_l2 > rel_limit:
        return f"relative L2 difference from the original {stats.rel_l2:.3g} exceeds {rel_limit:g} (no float64 truth)"
    if stats.max_abs > abs_limit:
        return (
            f"max abs difference from the original {stats.max_abs:.3g} exceeds {abs_share:g} x max|original| "
            f"= {abs_limit:.3g} (no float64 truth)"
        )
    return None


def _compare(
    seed: int,
    kind: str,
    name: str,
    output: torch.Tensor | None,
    original: torch.Tensor | None,
    truth: torch.Tensor | None,
    tolerance: Tolerance,
    scale: float,
) -> Check:
    """Compare one tensor; ``scale`` is the largest magnitude among all tensors of its kind."""
    if output is None or original is None:
        if output is None and original is None:
            return Check(seed, kind, name, True)
        missing = "the optimized model" if output is None else "the original"
        return Check(seed, kind, name, False, f"{missing} produced no {kind.replace('_', ' ')} for it")
    if output.dtype != original.dtype:
        return Check(seed, kind, name, False, f"dtype {output.dtype} differs from the original's {original.dtype}")
    if output.shape != original.shape:
        return Check(
            seed, kind, name, False, f"shape {tuple(output.shape)} differs from the original's {tuple(original.shape)}"
        )
    output, original = output.detach(), original.detach()
    if not original.is_floating_point():
        same = bool(torch.equal(output, original))
        differ = "" if same else f"{int((output != original).sum())} elements differ from the original"
        return Check(seed, kind, name, same, differ)
    reference = truth.detach().double() if truth is not None else original.double()
    reason: str | None = (
        check_close(output, reference, original, tolerance) if truth is not None else _fallback_close(output, original)
    )
    error = error_stats(output, reference)
    reference_error = error_stats(original, reference) if truth is not None else None
    if reason is not None and _near_zero(reference, scale) and _finite_alike(output, reference):
        # A tensor that is zero up to rounding (BERT's key-bias gradient: softmax ignores a constant
        # shift) has no relative accuracy to keep; its errors are judged against the scale of all
        # tensors of its kind instead.
        eps = torch.finfo(output.dtype).eps
        base = reference_error.max_abs if reference_error is not None else 0.0
        if error.max_abs <= tolerance.k * base + tolerance.floor_ulps * eps * scale:
            reason = None
    return Check(
        seed, kind, name, reason is None, reason or "",
        _stats(error), _stats(reference_error) if reference_error is not None else {},
    )  # fmt: skip


# A tensor whose largest magnitude is below this share of the largest among its kind is "zero up
# to rounding" (see _compare).
NEAR_ZERO_SHARE = 1e-3


def _near_zero(reference: torch.Tensor, scale: float) -> bool:
    finite = reference[torch.isfinite(reference)]
    return finite.numel() == 0 or float(finite.abs().max()) <= NEAR_ZERO_SHARE * scale


def _finite_alike(output: torch.Tensor, reference: torch.Tensor) -> bool:
    return output.shape == reference.shape and bool(torch.equal(torch.isfinite(output), torch.isfinite(reference)))


def _scale(tensors: Iterable[torch.Tensor | None]) -> float:
    """The largest finite magnitude among floating-point ``tensors`` (0 if none)."""
    best = 0.0
    for t in tensors:
        if t is not None and t.is_floating_point() and t.numel():
            finite = t[torch.isfinite(t)]
            if finite.numel():
                best = max(best, float(finite.abs().max()))
    return best


def _fp64_fits(model: nn.Module, device: torch.device, train: bool = False) -> bool:
    """Whether a float64 copy of the model's parameters and buffers (and with ``train`` their
    gradients) takes at most :data:`FP64_MEMORY_SHARE` of the free memory on ``device``."""
    tensors = [*model.parameters(), *model.buffers()]
    if any(t.is_meta for t in tensors):
        return False
    need = sum(t.numel() * 8 for t in tensors if t.is_floating_point()) * (2 if train else 1)
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
    else:
        try:
            free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError, AttributeError):  # not a POSIX system: assume it fits
            return True
    return need <= FP64_MEMORY_SHARE * free


def _to_fp64(value: Any) -> Any:
    if isinstance(value, torch.Tensor) and value.is_floating_point():
        return value.double()
    return value


def _device_of(model: nn.Module, inputs: Sequence[Any]) -> torch.device:
    for value in (*inputs, *model.parameters(), *model.buffers()):
        if isinstance(value, torch.Tensor):
            return value.device
    return torch.device("cpu")


def _named_params(fn: Callable[..., Any], model: nn.Module) -> list[tuple[str, nn.Parameter]]:
    """The parameters whose gradients a run of ``fn`` produces (see the module docstring)."""
    owner = fn if isinstance(fn, nn.Module) else model
    return [(name.replace("_orig_mod.", ""), p) for name, p in owner.named_parameters()]


@dataclass
class _Run:
    """One model's outputs (and gradients) on one input set."""

    outputs: list[tuple[str, torch.Tensor]]
    grads: dict[str, torch.Tensor | None] = field(default_factory=dict)
    input_grads: dict[str, torch.Tensor | None] = field(default_factory=dict)


def _loss_weights(outputs: Sequence[tuple[str, torch.Tensor]], seed: int) -> dict[str, torch.Tensor]:
    """Fixed random weights per floating-point output, drawn on the CPU from ``seed``."""
    generator = torch.Generator().manual_seed(10_007 * seed + 1)
    return {
        name: torch.randn(t.shape, generator=generator, dtype=torch.float64)
        for name, t in outputs
        if t.is_floating_point()
    }


def _run(
    fn: Callable[..., Any],
    model: nn.Module,
    inputs: Sequence[Any],
    *,
    train: bool,
    seed: int,
    weights: dict[str, torch.Tensor] | None = None,
) -> tuple[_Run, dict[str, torch.Tensor]]:
    """Run ``fn(*inputs)``; with ``train``, backpropagate the weighted-sum loss and collect the
    gradients (leaving ``.grad`` cleared). Returns the run and the loss weights used."""
    if not train:
        with torch.no_grad():
            return _Run(_leaves(fn(*inputs), "output")), weights or {}
    params = _named_params(fn, model)
    for _, p in params:
        p.grad = None
    leaf_inputs = [
        x.detach().clone().requires_grad_(True) if isinstance(x, torch.Tensor) and x.is_floating_point() else x
        for x in inputs
    ]
    outputs = _leaves(fn(*leaf_inputs), "output")
    if weights is None:
        weights = _loss_weights(outputs, seed)
    # d(loss)/d(output) = w, rounded to the output's dtype: the same seed gradient for every model.
    terms = [
        (t * weights[name].to(t.device, t.dtype)).double().sum()
        for name, t in outputs
        if name in weights and t.requires_grad
    ]
    if not terms:
        raise ValueError("train=True: no output of the model requires a gradient")
    torch.stack(terms).sum().backward()
    run = _Run(
        [(name, t.detach()) for name, t in outputs],
        {name: None if p.grad is None else p.grad.detach().clone() for name, p in params},
        {
            f"input[{i}]": None if x.grad is None else x.grad.detach().clone()
            for i, x in enumerate(leaf_inputs)
            if isinstance(x, torch.Tensor) and x.requires_grad
        },
    )
    for _, p in params:
        p.grad = None
    return run, weights


def _check_runs(seed: int, optimized: _Run, original: _Run, truth: _Run | None, tolerance: Tolerance) -> list[Check]:
    names = [n for n, _ in original.outputs]
    if [n for n, _ in optimized.outputs] != names:
        got = [n for n, _ in optimized.outputs]
        return [Check(seed, "output", "structure", False, f"the optimized model returned {got}, the original {names}")]
    judge = truth if truth is not None else original  # whose magnitudes set each kind's scale
    truth_outputs = dict(truth.outputs) if truth is not None else {}
    scale = _scale(t for _, t in judge.outputs)
    checks = [
        _compare(seed, "output", name, out, orig, truth_outputs.get(name), tolerance, scale)
        for (name, out), (_, orig) in zip(optimized.outputs, original.outputs, strict=True)
    ]
    for kind, opt_map, orig_map, truth_map, judge_map in (
        ("grad", optimized.grads, original.grads, truth.grads if truth else {}, judge.grads),
        (
            "input_grad",
            optimized.input_grads,
            original.input_grads,
            truth.input_grads if truth else {},
            judge.input_grads,
        ),
    ):
        scale = _scale(judge_map.values())
        for name in sorted(set(opt_map) | set(orig_map)):
            if name not in orig_map or name not in opt_map:
                which = "original" if name not in orig_map else "optimized"
                checks.append(Check(seed, kind, name, False, f"the {which} model has no such parameter"))
                continue
            checks.append(
                _compare(seed, kind, name, opt_map[name], orig_map[name], truth_map.get(name), tolerance, scale)
            )
    return checks


# Two runs of the original on the same inputs may differ by this many units of the dtype's
# epsilon (relative L2): a GPU reduction with atomics is not bitwise reproducible, random noise is.
REPEAT_ULPS = 4.0


def _determinism_checks(model: nn.Module, inputs: Sequence[Any], seed: int) -> list[Check]:
    """The original run twice on the same inputs must agree; if it does not (random ops, dropout
    left on), no comparison with it means anything, and the failure says so."""
    with torch.no_grad():
        first, second = _leaves(model(*inputs), "output"), _leaves(model(*inputs), "output")
    failed = []
    for (name, a), (_, b) in zip(first, second, strict=True):
        if not a.is_floating_point():
            same = bool(torch.equal(a, b))
            rel = 0.0 if same else 1.0
        else:
            same = bool(torch.equal(torch.isfinite(a), torch.isfinite(b)))
            rel = error_stats(b, a.double()).rel_l2 if same and a.numel() else (0.0 if same else 1.0)
            same = same and rel <= REPEAT_ULPS * torch.finfo(a.dtype).eps
        if not same:
            reason = (
                f"the original model's outputs differ between two runs on the same inputs (relative L2 {rel:.3g}): "
                "random ops or dropout are active, and verification needs a deterministic forward"
            )
            failed.append(Check(seed, "output", f"{name} (original run twice)", False, reason))
    return failed


def verify_model(
    model: nn.Module,
    optimized: Callable[..., Any] | None,
    inputs_fn: InputsFn,
    *,
    seeds: Iterable[int] = DEFAULT_SEEDS,
    train: bool = False,
    truth: str = "auto",
    tolerance: Tolerance = MODEL_TOLERANCE,
    keywords: Sequence[str] = (),
) -> VerifyResult:
    """Compare ``optimized`` with ``model`` on ``inputs_fn(seed)`` for each seed (module docstring).

    ``keywords`` names the inputs when the models take them as keywords (Hugging Face's
    ``input_ids``, ``labels``, ``attention_mask``): ``inputs_fn(seed)`` returns them in that order
    and both models are called with them by name (:class:`~kernelsmith.whole_model.keyword_inputs.KeywordCall`).

    ``optimized`` is any callable taking the model's inputs (``None``: :func:`optimized_model`).
    ``truth`` is ``"auto"`` (float64 where it fits), ``"fp64"`` or ``"original"`` (compare with
    the original directly, :data:`FALLBACK_TOLERANCES`). Both models are put in eval mode.

    >>> result = verify_model(model, torch.compile(model), lambda s: example_inputs(model, 2, 64, seed=s),
    ...                       train=True)                                         # doctest: +SKIP
    >>> result.ok, len(result.failures)                                          # doctest: +SKIP
    (True, 0)
    """
    seeds = list(seeds)
    note = ""
    if keywords:
        from kernelsmith.whole_model.keyword_inputs import KeywordCall

        model = KeywordCall(model, keywords)
        if optimized is not None:
            optimized = KeywordCall.calling(optimized, keywords)
    if optimized is None:
        optimized, _, note = optimized_model(model)
    reference, truth_note = _truth_model(model, inputs_fn, seeds, truth, train)
    result = _verify(model, optimized, inputs_fn, seeds, train, reference, tolerance)
    result.note = "; ".join(filter(None, [note, truth_note]))
    return result


def _truth_model(
    model: nn.Module, inputs_fn: InputsFn, seeds: Sequence[int], truth: str, train: bool
) -> tuple[nn.Module | None, str]:
    """The float64 copy of ``model`` that ``truth`` asks for (None: compare with the original), and a note."""
    if truth not in ("auto", "fp64", "original"):
        raise ValueError(f"truth must be 'auto', 'fp64' or 'original' (got {truth!r})")
    if not seeds:
        raise ValueError("give at least one seed")
    if truth == "original":
        return None, ""
    device = _device_of(model, tuple(inputs_fn(seeds[0])))
    if truth == "auto" and not _fp64_fits(model, device, train):
        logger.info("no float64 truth: the model's float64 copy does not fit on %s", device)
        return None, "the float64 copy of the model does not fit: compared with the original"
    return copy.deepcopy(model).double().eval(), ""


def _verify(
    model: nn.Module,
    optimized: Callable[..., Any],
    inputs_fn: InputsFn,
    seeds: Sequence[int],
    train: bool,
    reference: nn.Module | None,
    tolerance: Tolerance,
) -> VerifyResult:
    model.eval()
    if isinstance(optimized, nn.Module):
        optimized.eval()
    first_inputs = tuple(inputs_fn(seeds[0]))
    checks = _determinism_checks(model, first_inputs, seeds[0])
    for seed in seeds:
        inputs = first_inputs if seed == seeds[0] else tuple(inputs_fn(seed))
        original_run, weights = _run(model, model, inputs, train=train, seed=seed)
        optimized_run, _ = _run(optimized, model, inputs, train=train, seed=seed, weights=weights)
        truth_run = None
        if reference is not None:
            truth_run, _ = _run(
                reference, reference, [_to_fp64(x) for x in inputs], train=train, seed=seed, weights=weights
            )
        checks.extend(_check_runs(seed, optimized_run, original_run, truth_run, tolerance))
        logger.info("seed %d: %d checks, %d failed", seed, len(checks), sum(not c.ok for c in checks))
    return VerifyResult(
        ok=all(c.ok for c in checks),
        truth="fp64" if reference is not None else "original",
        seeds=list(seeds),
        train=train,
        checks=checks,
    )


# ---------------------------------------------------------------------------------------------
# Finding the culprit
# ---------------------------------------------------------------------------------------------


def diagnose(
    model: nn.Module,
    build: BuildFn,
    replacements: Sequence[str],
    inputs_fn: InputsFn,
    *,
    seeds: Iterable[int] = DEFAULT_SEEDS,
    train: bool = False,
    truth: str = "auto",
    tolerance: Tolerance = MODEL_TOLERANCE,
) -> Diagnosis:
    """Find which replacement makes the optimized model differ (see the module docstring).

    ``build(model, enabled)`` returns the optimized model with only the replacements named in
    ``enabled`` switched on; ``replacements`` lists them all, in the order to try them.

    >>> diagnosis = diagnose(model, build, ["rmsnorm", "swiglu"], inputs_fn)     # doctest: +SKIP
    >>> diagnosis.culprits                                                       # doctest: +SKIP
    ['swiglu']
    """
    seeds = list(seeds)
    steps: list[DiagnoseStep] = []
    reference, _ = _truth_model(model, inputs_fn, seeds, truth, train)  # one float64 copy for every attempt

    def attempt(enabled: list[str]) -> bool:
        result = _verify(model, build(model, enabled), inputs_fn, seeds, train, reference, tolerance)
        worst = result.worst()
        detail = "all checks pass" if result.ok else (worst.describe() if worst else "failed")
        steps.append(DiagnoseStep(list(enabled), result.ok, detail))
        logger.info("diagnose: %s -> %s", enabled or "no replacement", "ok" if result.ok else detail)
        return result.ok

    if not attempt([]):
        return Diagnosis(
            [], "the optimized model differs with no replacement enabled: the compiler itself, not a "
            "replacement, is to blame", steps,
        )  # fmt: skip
    if not replacements:
        return Diagnosis([], "there are no replacements to try, and the optimized model passes without them", steps)
    culprits = [name for name in replacements if not attempt([name])]
    if culprits:
        return Diagnosis(culprits, f"wrong on its own: {', '.join(culprits)}", steps)
    if len(replacements) < 2 or attempt(list(replacements)):
        return Diagnosis([], "no replacement makes the model differ, alone or together", steps)
    for k in range(2, len(replacements)):  # all together fail: find the first addition that breaks it
        if not attempt(list(replacements[:k])):
            culprit = replacements[k - 1]
            break
    else:
        culprit = replacements[-1]
    others = ", ".join(replacements[: replacements.index(culprit)])
    return Diagnosis([culprit], f"correct alone, wrong together with {others}: {culprit} (an interaction)", steps)


# ---------------------------------------------------------------------------------------------
# End-to-end time
# ---------------------------------------------------------------------------------------------


def time_models(
    variants: Mapping[str, Callable[[], Any]],
    *,
    device: torch.device | str = "cpu",
    warmup: int = 3,
    rounds: int = 10,
    train: bool = False,
    optimized: str | None = None,
) -> TimingResult:
    """Time each zero-argument runner in ``variants`` in interleaved rounds (module docstring).

    Runners are called as they are: wrap the forward (and backward, for ``train``) yourself.
    The first variant is the one speedups are relative to (``eager``); ``optimized`` names the
    variant whose paired speedups over ``eager`` and ``inductor`` (when present) are reported.
    ``warmup`` calls of each come first (compilation happens there).
    """
    from kernelsmith.evaluate.timing import summarize

    if rounds < 1 or warmup < 0:
        raise ValueError(f"rounds must be positive and warmup non-negative (got {rounds}, {warmup})")
    device = torch.device(device)
    on_gpu = device.type == "cuda"
    names = list(variants)
    fns = [variants[n] for n in names]
    for fn in fns:
        for _ in range(warmup):
            fn()
    if on_gpu:
        torch.cuda.synchronize(device)
    samples: list[list[float]] = [[] for _ in fns]
    for r in range(rounds):
        for j in range(len(fns)):
            i = (j + r) % len(fns)
            if on_gpu:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                fns[i]()
                end.record()
                torch.cuda.synchronize(device)
                samples[i].append(start.elapsed_time(end) * 1000.0)
            else:
                t0 = time.perf_counter()
                fns[i]()
                samples[i].append((time.perf_counter() - t0) * 1e6)
    stats = [summarize(s) for s in samples]
    eager_ms = stats[0]["median_us"] / 1000.0
    rows = [
        TimingRow(
            name,
            s["median_us"] / 1000.0,
            s["p10_us"] / 1000.0,
            s["p90_us"] / 1000.0,
            eager_ms / (s["median_us"] / 1000.0) if s["median_us"] > 0 else None,
        )
        for name, s in zip(names, stats, strict=True)
    ]
    comparisons: dict[str, dict[str, Any]] = {}
    if optimized is not None and optimized in names:
        mine = samples[names.index(optimized)]
        for other in (names[0], "inductor"):
            if other in names and other != optimized:
                comparisons[other] = paired_speedup(mine, samples[names.index(other)])
    return TimingResult(
        rows,
        timer="cuda-events" if on_gpu else "host-clock",
        rounds=rounds,
        train=train,
        comparisons=comparisons,
        note="" if on_gpu else NO_GPU_NOTE,
    )


# A speedup whose 95% interval spans more than this factor (high / low) is not stated: the rounds
# disagree too much for one number to mean anything (a loaded machine, a stall in one round).
RESOLVED_SPREAD = 1.5
CONFIDENCE = 0.95


def median_interval(values: Sequence[float], confidence: float = CONFIDENCE) -> tuple[float, float] | None:
    """A distribution-free ``confidence`` interval for the median of ``values``: the order
    statistics ``(x_(k), x_(n+1-k))`` with the largest ``k`` whose coverage, from the binomial
    distribution of how many values fall below the median, is at least ``confidence``. None when
    there are too few values for any such interval (fewer than 6 at 95%).

    Why not the bootstrap of :func:`kernelsmith.decide.compare`: over the 5-20 rounds a whole
    model is timed for, the bootstrap of a median returns about the smallest and largest ratio
    whatever the confidence asked, which is how one stalled round once printed an interval of
    1.77-236.5; this interval's coverage is exact for any distribution, and it says when the
    rounds cannot support one.

    >>> median_interval([1.0, 2.0, 3.0, 4.0, 5.0]) is None
    True
    >>> median_interval([float(i) for i in range(1, 21)])
    (6.0, 15.0)
    """
    n = len(values)
    ordered = sorted(values)
    tail = (1.0 - confidence) / 2.0
    k, below = 0, 0.0  # below: P(Binomial(n, 1/2) <= k - 1), the chance x_(k) is above the median
    while k < n // 2:
        step = below + math.comb(n, k) / 2.0**n
        if step > tail:
            break
        below, k = step, k + 1
    if k == 0:
        return None
    return ordered[k - 1], ordered[n - k]


def paired_speedup(candidate: Sequence[float], reference: Sequence[float]) -> dict[str, Any]:
    """The candidate's speedup over the reference from paired rounds (``reference[i] /
    candidate[i]``): the median ratio, its 95% :func:`median_interval` (None with too few rounds),
    ``significant`` (the interval is above 1), ``resolved`` (an interval exists and spans at most
    :data:`RESOLVED_SPREAD`) and the rounds used."""
    ratios = [r / c for c, r in zip(candidate, reference, strict=False) if c > 0 and r > 0]
    interval = median_interval(ratios)
    low, high = interval if interval is not None else (None, None)
    return {
        "speedup": statistics.median(ratios) if ratios else None,
        "ci_low": low,
        "ci_high": high,
        "significant": low is not None and low > 1.0,
        "resolved": low is not None and high is not None and high <= RESOLVED_SPREAD * low,
        "rounds": len(ratios),
    }


def forward_runner(fn: Callable[..., Any], inputs: Sequence[Any], *, train: bool = False) -> Callable[[], Any]:
    """A zero-argument runner for :func:`time_models`: ``fn(*inputs)`` under ``no_grad``, or with
    ``train`` a forward and a backward of the outputs' sum (gradients cleared first)."""
    params = [p for p in fn.parameters()] if isinstance(fn, nn.Module) else []

    def forward() -> Any:
        with torch.no_grad():
            return fn(*inputs)

    def step() -> Any:
        for p in params:
            p.grad = None
        leaves = [t for _, t in _leaves(fn(*inputs), "output") if t.requires_grad]
        torch.stack([t.float().sum() for t in leaves]).sum().backward()

    return step if train else forward

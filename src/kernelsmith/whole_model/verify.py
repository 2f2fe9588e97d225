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

Layout: the result types are in :mod:`~kernelsmith.whole_model._verify_results`, the output and
gradient comparisons in :mod:`~kernelsmith.whole_model._verify_compare`, the timing in
:mod:`~kernelsmith.whole_model._verify_timing`; this module picks the optimized model and drives
the three questions, and every public name is importable from here.
"""

from __future__ import annotations

import copy
import logging
import weakref
from collections.abc import Callable, Collection, Iterable, Sequence
from typing import Any

import torch
from torch import nn

from kernelsmith.ops._base import Tolerance
from kernelsmith.whole_model._verify_compare import FALLBACK_TOLERANCES as FALLBACK_TOLERANCES
from kernelsmith.whole_model._verify_compare import FP64_MEMORY_SHARE as FP64_MEMORY_SHARE
from kernelsmith.whole_model._verify_compare import NEAR_ZERO_SHARE as NEAR_ZERO_SHARE
from kernelsmith.whole_model._verify_compare import REPEAT_ULPS as REPEAT_ULPS
from kernelsmith.whole_model._verify_compare import (
    _check_runs,
    _determinism_checks,
    _device_of,
    _fp64_fits,
    _run,
    _to_fp64,
)
from kernelsmith.whole_model._verify_results import NO_GPU_NOTE as NO_GPU_NOTE
from kernelsmith.whole_model._verify_results import Check as Check
from kernelsmith.whole_model._verify_results import DiagnoseStep, Diagnosis, VerifyResult
from kernelsmith.whole_model._verify_results import TimingResult as TimingResult
from kernelsmith.whole_model._verify_results import TimingRow as TimingRow
from kernelsmith.whole_model._verify_timing import CONFIDENCE as CONFIDENCE
from kernelsmith.whole_model._verify_timing import RESOLVED_SPREAD as RESOLVED_SPREAD
from kernelsmith.whole_model._verify_timing import forward_runner as forward_runner
from kernelsmith.whole_model._verify_timing import median_interval as median_interval
from kernelsmith.whole_model._verify_timing import paired_speedup as paired_speedup
from kernelsmith.whole_model._verify_timing import time_models as time_models

logger = logging.getLogger(__name__)

BACKEND_NAME = "kernelsmith"
# Where the kernelsmith backend lives: its function, and the class whose ``families`` and
# ``sites`` the diagnose hooks use.
BACKEND_MODULE = "kernelsmith.frontends.backend"
DEFAULT_SEEDS = (1, 2, 3)
# The whole-model bar against the float64 truth: as for single ops, four times PyTorch's own
# error; the floor is wider (8 units of the dtype's epsilon times the output's scale) because an
# output that eager computes almost exactly after dozens of layers still admits a few roundings.
MODEL_TOLERANCE = Tolerance(k=4.0, floor_ulps=8.0)

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



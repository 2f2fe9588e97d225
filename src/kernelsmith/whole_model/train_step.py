"""Training steps decided in context: the whole step (forward, loss, backward) timed and its peak
memory recorded, with and without each op family's replacements.

Why the whole step. A kernel that wins alone can lose in a training step: its backward runs too,
Inductor loses a fusion around it, and a fused linear + cross-entropy that never stores the logits
may recompute them. What matters is the step the user runs, so each family's replacements are
kept only where the step with them (and no other family's) is not slower than the step without
any (:func:`decide`); the kept families are then measured together (:func:`decide_training_step`).

Memory. On a GPU each step's peak is ``torch.cuda.max_memory_allocated`` over the step, with the
peak statistics reset before it: parameters, gradients, the activations the backward keeps and
the transient buffers, the number a user watching ``nvidia-smi`` cares about (less the caching
allocator's slack). On a CPU peak memory is not measured (``peak_bytes`` is None, and the report
says so). The explicit objective :class:`MemoryObjective` lets the user accept a replacement that
cuts the peak by at least ``min_saving`` for at most ``max_slowdown`` more time; the default never
accepts a slower step.

Every variant of a step runs on the same parameters (their gradients set to None before each
step), so the memory each one holds besides its own activations is the same; the steps are timed
one variant after another (each build compiles its own graphs, and Dynamo keeps a bounded number
of graphs per function), after ``warmup`` steps each, by their median over ``iterations``.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch import nn

log = logging.getLogger(__name__)

NOT_MEASURED = "peak memory is not measured on a CPU (torch.cuda.max_memory_allocated needs a GPU)"

Step = Callable[[], torch.Tensor]
BuildFn = Callable[[frozenset[str]], Callable[..., Any]]


# ---------------------------------------------------------------------------------------------
# One step
# ---------------------------------------------------------------------------------------------


def loss_of(output: Any) -> torch.Tensor:
    """The loss a training step backpropagates: a model output's ``loss`` (Hugging Face models
    given ``labels``), a 0-d tensor as it is, else the sum of the means of its floating-point
    tensors (a stand-in objective for a model that computes no loss)."""
    loss = getattr(output, "loss", None)
    if loss is None and isinstance(output, Mapping):
        loss = output.get("loss")
    if isinstance(loss, torch.Tensor):
        return loss
    if isinstance(output, torch.Tensor) and output.dim() == 0:
        return output
    tensors = [t for t in _tensors(output) if t.is_floating_point() and t.requires_grad]
    if not tensors:
        raise ValueError(f"the model's output ({type(output).__name__}) has no loss and no differentiable tensor")
    return sum((t.float().mean() for t in tensors), torch.zeros((), device=tensors[0].device))


def _tensors(value: Any) -> Iterable[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, Mapping):
        for v in value.values():
            yield from _tensors(v)
    elif isinstance(value, tuple | list):
        for v in value:
            yield from _tensors(v)
    elif hasattr(value, "to_tuple"):  # a Hugging Face ModelOutput
        yield from _tensors(value.to_tuple())


def train_step(fn: Callable[..., Any], params: Sequence[nn.Parameter], args: Sequence[Any] = (),
               kwargs: Mapping[str, Any] | None = None) -> Step:  # fmt: skip
    """One training step as a zero-argument callable: gradients to None, ``fn(*args, **kwargs)``,
    its loss (:func:`loss_of`), backward. Returns the loss, detached."""
    keywords = dict(kwargs or {})

    def step() -> torch.Tensor:
        for p in params:
            p.grad = None
        with torch.enable_grad():
            loss = loss_of(fn(*args, **keywords))
            loss.backward()
        return loss.detach()

    return step


@dataclass
class StepMeasure:
    """One variant's step: median and every time in milliseconds, peak memory in bytes (None:
    not measured), and the loss and the global L2 norm of the gradients of its last step."""

    name: str
    median_ms: float
    times_ms: list[float]
    peak_bytes: int | None
    loss: float
    grad_norm: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def grad_norm(params: Iterable[nn.Parameter]) -> float:
    """The global L2 norm of the parameters' gradients (in float64)."""
    total = 0.0
    for p in params:
        if p.grad is not None:
            total += float(p.grad.detach().double().pow(2).sum())
    return math.sqrt(total)


def measure_step(name: str, step: Step, params: Sequence[nn.Parameter], device: torch.device, *,
                 warmup: int = 2, iterations: int = 5) -> StepMeasure:  # fmt: skip
    """Time ``step`` (``warmup`` untimed calls, then ``iterations`` timed) and record its peak
    memory on a GPU (the largest of the timed steps' peaks)."""
    if iterations < 1 or warmup < 0:
        raise ValueError(f"iterations must be positive and warmup non-negative (got {iterations}, {warmup})")
    for _ in range(warmup):
        step()
    _sync(device)
    times: list[float] = []
    peak: int | None = None
    loss = torch.zeros(())
    for _ in range(iterations):
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        start = time.perf_counter()
        loss = step()
        _sync(device)
        times.append((time.perf_counter() - start) * 1000.0)
        if device.type == "cuda":
            peak = max(peak or 0, torch.cuda.max_memory_allocated(device))
    ordered = sorted(times)
    return StepMeasure(name, ordered[len(ordered) // 2], times, peak, float(loss), grad_norm(params))


# ---------------------------------------------------------------------------------------------
# Deciding
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MemoryObjective:
    """Which replacements a training step keeps: any that is not slower, and, when
    ``max_slowdown`` > 0, one that cuts peak memory by at least ``min_saving`` (a fraction: 0.2
    is 20%) for at most ``max_slowdown`` more time (0.05 is 5%). The default never accepts a
    slower step."""

    min_saving: float = 0.0
    max_slowdown: float = 0.0

    def __post_init__(self) -> None:
        if not (0.0 <= self.min_saving < 1.0) or not (self.max_slowdown >= 0.0):
            raise ValueError(f"min_saving must be in [0, 1) and max_slowdown >= 0, not {self}")

    def judge(self, candidate: StepMeasure, baseline: StepMeasure) -> tuple[bool, str]:
        """``(keep, why)`` for a step with replacements against the step without."""
        ratio = candidate.median_ms / baseline.median_ms if baseline.median_ms > 0 else math.inf
        saving = memory_saving(candidate, baseline)
        memory = "" if saving is None else f", {100 * saving:+.1f}% peak memory saved"
        if ratio <= 1.0:
            return True, f"not slower ({ratio:.3f}x the time{memory})"
        slower = f"{100 * (ratio - 1):.1f}% slower"
        if self.max_slowdown <= 0:
            return False, f"{slower}{memory}; the objective accepts no slower step"
        if saving is None:
            return False, f"{slower}; peak memory is not measured here, so the memory objective cannot apply"
        if ratio - 1 <= self.max_slowdown and saving >= self.min_saving:
            return True, (f"{slower} but saves {100 * saving:.1f}% peak memory (objective: >= "
                          f"{100 * self.min_saving:.0f}% for <= {100 * self.max_slowdown:.0f}% more time)")  # fmt: skip
        return False, (f"{slower}{memory}: outside the objective (>= {100 * self.min_saving:.0f}% saved for <= "
                       f"{100 * self.max_slowdown:.0f}% more time)")  # fmt: skip


def memory_saving(candidate: StepMeasure, baseline: StepMeasure) -> float | None:
    """The fraction of the baseline's peak memory the candidate saves (None: not measured)."""
    if candidate.peak_bytes is None or baseline.peak_bytes is None or baseline.peak_bytes <= 0:
        return None
    return 1.0 - candidate.peak_bytes / baseline.peak_bytes


@dataclass
class FamilyDecision:
    """One family's replacements in the training step: measured alone against no replacement."""

    family: str
    keep: bool
    reason: str
    time_ratio: float
    memory_saving: float | None
    measure: StepMeasure

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["measure"] = self.measure.to_dict()
        return data


def decide(baseline: StepMeasure, candidates: Mapping[str, StepMeasure],
           objective: MemoryObjective | None = None) -> list[FamilyDecision]:  # fmt: skip
    """Each family's verdict from its step measured with only its replacements (pure: the
    measurements are given)."""
    objective = objective or MemoryObjective()
    decisions = []
    for family, measure in candidates.items():
        keep, why = objective.judge(measure, baseline)
        ratio = measure.median_ms / baseline.median_ms if baseline.median_ms > 0 else math.inf
        decisions.append(FamilyDecision(family, keep, why, ratio, memory_saving(measure, baseline), measure))
    return decisions


@dataclass
class TrainStepReport:
    """What :func:`decide_training_step` measured and kept."""

    baseline: StepMeasure
    families: list[FamilyDecision]
    kept: list[str]
    final: StepMeasure | None
    final_reason: str
    memory_note: str = ""
    objective: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "baseline": self.baseline.to_dict(),
            "families": [d.to_dict() for d in self.families],
            "kept": self.kept,
            "final": self.final.to_dict() if self.final is not None else None,
            "final_reason": self.final_reason,
            "memory_note": self.memory_note,
            "objective": self.objective,
        }


def decide_training_step(
    build: BuildFn,
    families: Sequence[str],
    params: Sequence[nn.Parameter],
    device: torch.device,
    args: Sequence[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    *,
    objective: MemoryObjective | None = None,
    warmup: int = 2,
    iterations: int = 5,
) -> tuple[Callable[..., Any], TrainStepReport]:
    """Measure the training step of ``build(frozenset())`` (no replacement) and of
    ``build({family})`` for each family, keep the families :func:`decide` accepts, and measure
    ``build(kept)``; the kept set is used only when that step too is accepted against the
    baseline (replacements that win alone can lose together), else none is.

    ``build(families)`` returns the callable to train (the model compiled with only those
    families' replacements). Returns ``(the callable chosen, the report)``."""
    objective = objective or MemoryObjective()

    def measured(name: str, chosen: frozenset[str]) -> tuple[Callable[..., Any], StepMeasure]:
        torch._dynamo.reset()  # each build its own graphs (Dynamo bounds the graphs kept per function)
        fn = build(chosen)
        step = train_step(fn, params, args, kwargs)
        return fn, measure_step(name, step, params, device, warmup=warmup, iterations=iterations)

    _, baseline = measured("no replacement", frozenset())
    candidates = {f: measured(f, frozenset({f}))[1] for f in families}
    decisions = decide(baseline, candidates, objective)
    kept = [d.family for d in decisions if d.keep]
    final, reason = None, "no family's replacements were kept"
    if kept:
        _, final = measured("kept: " + ", ".join(kept), frozenset(kept))
        keep, why = objective.judge(final, baseline)
        if keep:
            reason = f"together: {why}"
        else:
            reason = f"each was kept alone, but together: {why}; the step runs without replacements"
            kept = []
    torch._dynamo.reset()  # the chosen build compiles afresh on its first call
    report = TrainStepReport(
        baseline,
        decisions,
        kept,
        final,
        reason,
        memory_note="" if device.type == "cuda" else NOT_MEASURED,
        objective={"min_saving": objective.min_saving, "max_slowdown": objective.max_slowdown},
    )
    log.info("training step: kept %s (%s)", kept or "nothing", reason)
    return build(frozenset(kept)), report


# ---------------------------------------------------------------------------------------------
# Executions side by side (verify --train)
# ---------------------------------------------------------------------------------------------

FUSED_LOSS_ROW = "kernelsmith (fused loss, no logits)"  # kernelsmith.hf.fuse_lm_loss, compiled
LOSS_RTOL = 1e-3  # loss agreement with eager, relative
GRAD_RTOL = 1e-2  # gradient-norm agreement with eager, relative


@dataclass
class Execution:
    """One way of running the training step, measured (or why it was not)."""

    name: str
    measure: StepMeasure | None = None
    skipped: str = ""
    loss_rel: float | None = None  # |loss - eager's| / |eager's|
    grad_rel: float | None = None  # |grad norm - eager's| / eager's
    agrees: bool | None = None
    note: str = ""  # what the reader must know about a measured row (a fused loss that ran its reference)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["measure"] = self.measure.to_dict() if self.measure is not None else None
        return data


def liger_patch(model: nn.Module) -> Callable[[], None] | str:
    """Liger-Kernel's own patch of ``model`` (``apply_liger_kernel_to_llama(model=...)``: its
    RMSNorm, SwiGLU, RoPE and fused linear + cross-entropy), returning the undo; or why it cannot
    be applied (not installed, not a Llama). Liger patches module instances and module-level names
    of ``transformers.models.llama.modeling_llama``; the undo restores both."""
    import importlib.util

    if importlib.util.find_spec("liger_kernel") is None:
        return "Liger-Kernel is not installed (pip install liger-kernel)"
    if getattr(getattr(model, "config", None), "model_type", None) != "llama":
        return "kernelsmith applies Liger's patch to Hugging Face Llama models only"
    from liger_kernel.transformers import apply_liger_kernel_to_llama
    from transformers.models.llama import modeling_llama

    names = dict(vars(modeling_llama))
    own = {id(m): dict(m.__dict__) for m in model.modules()}
    apply_liger_kernel_to_llama(model=model)

    def undo() -> None:
        for key, value in names.items():
            if vars(modeling_llama).get(key) is not value:
                setattr(modeling_llama, key, value)
        for m in model.modules():
            before = own.get(id(m))
            if before is None:
                continue
            for key in [k for k in m.__dict__ if k not in before]:
                del m.__dict__[key]
            m.__dict__.update(before)

    return undo


def compare_executions(
    model: nn.Module,
    args: Sequence[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    *,
    kernelsmith: Callable[..., Any] | None = None,
    liger: bool = True,
    warmup: int = 2,
    iterations: int = 5,
    loss_rtol: float = LOSS_RTOL,
    grad_rtol: float = GRAD_RTOL,
    compile_backend: str = "inductor",
    fused_loss: Mapping[str, Any] | None = None,
) -> list[Execution]:
    """The training step of ``model(*args, **kwargs)`` run eagerly, under ``torch.compile``, as
    ``kernelsmith`` (the optimized callable, when given), as :data:`FUSED_LOSS_ROW` (when
    ``fused_loss`` is given: the model patched by :func:`kernelsmith.hf.fuse_lm_loss` with these
    options and compiled by ``compile_backend``; its output's logits are None; undone afterwards)
    and patched by Liger-Kernel (when installed and ``liger``; last, since its patch changes the
    model, undone afterwards): time and peak memory per step, and each one's loss and gradient
    norm against eager's. The model is in training mode meanwhile; its gradients are cleared
    afterwards. ``compile_backend`` is the torch.compile column's backend (Inductor; a CPU smoke
    run may take a cheaper one)."""
    was_training = model.training
    model.train()
    try:
        return _compare(
            model, args, kwargs, kernelsmith, liger, warmup, iterations, loss_rtol, grad_rtol, compile_backend,
            fused_loss,
        )  # fmt: skip
    finally:
        model.train(was_training)
        for p in model.parameters():
            p.grad = None


def _compare(model: nn.Module, args: Sequence[Any], kwargs: Mapping[str, Any] | None,
             kernelsmith: Callable[..., Any] | None, liger: bool, warmup: int, iterations: int, loss_rtol: float,
             grad_rtol: float, compile_backend: str,
             fused_loss: Mapping[str, Any] | None) -> list[Execution]:  # fmt: skip
    from kernelsmith.frontends import hf_lm_loss

    params = [p for p in model.parameters() if p.requires_grad]
    device = next((p.device for p in params), torch.device("cpu"))
    runs: list[tuple[str, Callable[[], Callable[..., Any]] | str]] = [
        ("eager", lambda: model),
        ("torch.compile", lambda: torch.compile(model, backend=compile_backend)),
        ("kernelsmith", (lambda: kernelsmith) if kernelsmith is not None else "no optimized model was given"),
    ]
    if fused_loss is not None:
        options = dict(fused_loss)

        def fused() -> Callable[..., Any]:
            return torch.compile(hf_lm_loss.fuse_lm_loss(model, **options), backend=compile_backend)

        refused = hf_lm_loss.refusal(model)
        runs.append((FUSED_LOSS_ROW, refused if refused is not None else fused))
    results: list[Execution] = []
    try:
        for name, make in runs:
            if isinstance(make, str):
                results.append(Execution(name, skipped=make))
                continue
            torch._dynamo.reset()
            step = train_step(make(), params, args, kwargs)
            # The fused loss's first calls resolve its kernel and run the serve checks (float64
            # references): warm-up steps, never timed ones.
            first = _serve_checked_calls() + 1 if name == FUSED_LOSS_ROW else 0
            measure = measure_step(name, step, params, device, warmup=max(warmup, first), iterations=iterations)
            results.append(Execution(name, measure, note=_fallback_note(model) if name == FUSED_LOSS_ROW else ""))
    finally:
        hf_lm_loss.unfuse_lm_loss(model)
    if not liger:
        results.append(Execution("liger", skipped="not asked for"))
    else:
        undo = liger_patch(model)
        if isinstance(undo, str):
            results.append(Execution("liger", skipped=undo))
        else:
            try:
                step = train_step(model, params, args, kwargs)
                measure = measure_step("liger", step, params, device, warmup=warmup, iterations=iterations)
                results.append(Execution("liger", measure))
            finally:
                undo()
    torch._dynamo.reset()
    eager = results[0].measure
    assert eager is not None
    for r in results:
        if r.measure is None:
            continue
        r.loss_rel = abs(r.measure.loss - eager.loss) / max(abs(eager.loss), 1e-30)
        r.grad_rel = abs(r.measure.grad_norm - eager.grad_norm) / max(eager.grad_norm, 1e-30)
        r.agrees = r.loss_rel <= loss_rtol and r.grad_rel <= grad_rtol
    return results


def _fallback_note(model: nn.Module) -> str:
    """Why the fused-loss row's op ran its PyTorch reference (logits materialized), or ""."""
    from kernelsmith.frontends.hf_lm_loss import fallback_reasons

    reasons = sorted(set(fallback_reasons(model).values()))
    return (
        f"no fused-loss kernel served (the op's reference ran, with the logits): {'; '.join(reasons)}"
        if reasons
        else ""
    )


def _serve_checked_calls() -> int:
    """How many first calls of a served kernel are checked (kernelsmith.servecheck)."""
    from kernelsmith.servecheck import CheckPolicy

    policy = CheckPolicy.resolve()
    return policy.first if policy.enabled else 0


def format_bytes(value: int | None) -> str:
    """``12.34 GiB`` (or ``-`` when not measured)."""
    if value is None:
        return "-"
    return f"{value / 2**30:.2f} GiB"


__all__ = [
    "FUSED_LOSS_ROW",
    "GRAD_RTOL",
    "LOSS_RTOL",
    "NOT_MEASURED",
    "Execution",
    "FamilyDecision",
    "MemoryObjective",
    "StepMeasure",
    "TrainStepReport",
    "compare_executions",
    "decide",
    "decide_training_step",
    "format_bytes",
    "grad_norm",
    "liger_patch",
    "loss_of",
    "measure_step",
    "memory_saving",
    "train_step",
]

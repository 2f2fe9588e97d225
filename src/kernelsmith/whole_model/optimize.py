"""``kernelsmith.optimize_model``: profile a model, tune what matters most within a budget, compile it.

>>> import kernelsmith
>>> from kernelsmith.models import get_model, example_inputs
>>> model = get_model("llama-160m", device="cuda", dtype=torch.bfloat16)         # doctest: +SKIP
>>> inputs = example_inputs(model, 8, 1024, "cuda")                             # doctest: +SKIP
>>> fast, report = kernelsmith.optimize_model(model, inputs, budget=200)         # doctest: +SKIP
>>> fast(*inputs)                                                                # doctest: +SKIP
>>> [(w["op"], w["status"], w["speedup"]) for w in report["workloads"]]          # doctest: +SKIP

The steps, in order:

1. **Profile** (:func:`kernelsmith.whole_model.profile.profile_model`, unless a plan is given): the share of
   the forward's time each op family and shape takes.
2. **Discover** the model's workloads: the model is traced by Dynamo with the kernelsmith
   backend in discovery mode (:class:`~kernelsmith.frontends.backend.KernelsmithBackend`), which
   lists the sites it would replace and runs the graph eagerly. A workload is a site's bucket
   (:meth:`OpFamily.bucket`): twelve layers' RMSNorms of one shape are one workload. With
   ``train=True`` each workload's backward family is a workload too.
3. **Rank** the workloads by their share of the profiled time (a plan row of the same family and
   input shape, shared among the workloads claiming it by their number of sites; a shapeless
   row, such as a compiled kernel's, is shared among its family's workloads). The ranking is
   Amdahl's: at a given kernel speedup, the larger share gains more end to end. A backward
   workload gets its forward's share, the forward profile being all there is to go by.
4. **Tune**, highest expected gain first, until the budget is spent: ``budget`` evaluations in
   all (each workload gets a part proportional to its share of what is left, at least
   ``MIN_EVALUATIONS``; what a search leaves unspent goes to the next) and ``seconds`` of wall
   time. Returns diminish in two ways, and both move tuning on: a search stops once
   ``patience`` evaluations in a row have not improved its best time by 1%, and tuning stops
   altogether at the first workload whose share could not buy ``min_gain`` end to end even at
   3x. Workloads already decided in the database cost nothing.
5. **Compile** the model with the kernelsmith backend (database only, no tuning) and run it
   once, so the compiled model is warm and the report lists what was replaced.

Interpreter mode (``KERNELSMITH_INTERPRET=1``, CPU tensors) runs the same steps; its timings
are not performance, and its searches end with "the baseline wins".
"""

from __future__ import annotations

import datetime
import logging
import time
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, cast

import torch
from torch import nn

from kernelsmith import dispatch, settings
from kernelsmith.db import DecisionRecord, open_database
from kernelsmith.frontends.backend import KernelsmithBackend, Site, _backward_metas
from kernelsmith.ops import UnsupportedWorkload, get_op
from kernelsmith.spec import OpSpec
from kernelsmith.whole_model.profile import Plan, amdahl_gain
from kernelsmith.whole_model.train_step import MemoryObjective, decide_training_step

log = logging.getLogger(__name__)

# Plan families whose time an op family's workload takes (the profile names what eager runs:
# a SwiGLU is a "silu" row and an elementwise multiply; a residual add + RMSNorm an "rmsnorm").
PLAN_FAMILIES: dict[str, tuple[str, ...]] = {
    "rmsnorm": ("rmsnorm",),
    "add_rmsnorm": ("add_rmsnorm", "rmsnorm"),
    "layernorm": ("layernorm",),
    "softmax": ("softmax",),
    "gelu": ("gelu",),
    "gelu_tanh": ("gelu_tanh", "gelu"),
    "swiglu": ("swiglu", "silu"),
    "geglu": ("geglu", "gelu"),
    "cross_entropy": ("cross_entropy", "log_softmax"),
    "linear_cross_entropy": ("cross_entropy", "log_softmax"),  # (the head's GEMM is a matmul row)
}
MIN_EVALUATIONS = 4  # a search shorter than this is hardly a search
FUSED_LOSS_BUDGET = 8  # evaluations for skip_logits' one fused-loss workload (tuned at its first call)
IMPROVEMENT = 0.01  # a best time this much better counts as progress (patience)
GAIN_SPEEDUPS = (2.0, 3.0)  # expected gain at 2x; the "could it matter at all" test at 3x


@dataclass
class Workload:
    """One bucket to tune, and what tuning it gave."""

    op: str
    spec: OpSpec  # the bucket
    shape: tuple[int, ...]  # the first input's shape as the model runs it
    sites: int = 1
    share: float = 0.0
    backward_of: str = ""  # the forward op, for a backward workload
    status: str = "pending"  # pending, stored, tuned, skipped
    reason: str = ""
    evaluations: int = 0
    winner: str = ""
    speedup: float | None = None  # the decision's, over eager PyTorch (None where the baseline was kept)
    seconds: float = 0.0
    versus: str = ""  # the speedup with its baseline named, or why there is none (kernelsmith.versus)

    def decided(self, winner: str, metrics: dict[str, Any]) -> None:
        """Take a decision's outcome: no speedup where the baseline was kept, else the stored one
        (over eager), and the text that names its baseline."""
        from kernelsmith.versus import speedup_text

        self.winner = winner
        self.speedup = metrics.get("speedup") if winner == "kernel" else None
        self.versus = speedup_text(winner, metrics, ci=False)

    @property
    def gain(self) -> float:
        """End-to-end speedup if this workload ran 2x faster (Amdahl)."""
        return amdahl_gain(min(max(self.share, 0.0), 1.0), GAIN_SPEEDUPS[0])

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["spec"] = self.spec.describe()
        data["shape"] = list(self.shape)
        data["gain_2x"] = self.gain
        return data


@dataclass(frozen=True)
class OptimizeProgress:
    """A progress report: ``stage`` is ``"profile"``, ``"discover"``, ``"tune"`` (a search
    starts), ``"evaluation"``, ``"tuned"`` (a search ended), ``"compile"`` or ``"done"``."""

    stage: str
    message: str = ""
    workload: int = 0  # 1-based index among the workloads being tuned
    workloads: int = 0
    done: int = 0  # evaluations of this search
    budget: int = 0  # this search's budget
    total_done: int = 0
    total_budget: int = 0
    best_us: float | None = None


ProgressFn = Callable[[OptimizeProgress], None]


@dataclass
class _Budget:
    evaluations: int
    deadline: float | None
    spent: int = 0

    @property
    def left(self) -> int:
        return self.evaluations - self.spent

    def out_of_time(self) -> bool:
        return self.deadline is not None and time.monotonic() >= self.deadline


@dataclass
class _Patience:
    """Stops a search after ``limit`` evaluations without a 1% better best time."""

    limit: int | None
    best_us: float | None = None
    last_gain_at: int = 0
    evaluated: int = 0

    def observe(self, evaluated: int, best: Any) -> None:
        self.evaluated = evaluated
        median = getattr(best, "median_us", None)
        if median is not None and (self.best_us is None or median < self.best_us * (1 - IMPROVEMENT)):
            self.best_us, self.last_gain_at = median, evaluated

    def exhausted(self) -> bool:
        return self.limit is not None and self.evaluated - self.last_gain_at >= self.limit


def optimize_model(
    model: nn.Module,
    example_inputs: Sequence[Any] = (),
    *,
    example_kwargs: Mapping[str, Any] | None = None,
    budget: int = 100,
    seconds: float | None = None,
    db: Any = None,
    strategy: str = "auto",
    plan: Plan | None = None,
    train: bool = False,
    patience: int | None = 12,
    min_gain: float = 1.002,
    compare: bool | None = None,
    memory: MemoryObjective | None = None,
    name: str = "model",
    progress: ProgressFn | None = None,
    devices: Sequence[int] | str | None = None,
    executor: str = "local",
    ray_address: str | None = None,
    force_retune: bool | None = None,
    require_tuned: bool | None = None,
    skip_logits: bool = False,
) -> tuple[nn.Module, dict[str, Any]]:
    """Profile ``model(*example_inputs)``, tune its top workloads within the budget, compile it.

    Returns ``(compiled_model, report)``: ``torch.compile(model, backend=<kernelsmith>)``, run
    once, and a JSON-ready dict (``workloads`` tuned or skipped and why, ``sites`` replaced or
    not and why, ``evaluations`` and ``wall_s`` spent, the plan's top rows, the expected gain).
    ``budget`` is a count of evaluations in all, ``seconds`` a wall-time limit (None: none);
    ``db`` the database; ``plan`` a plan to use instead of profiling; ``train`` also tunes the
    backward families and compiles for training; ``patience`` and ``min_gain`` say when returns
    diminish (see the module docstring); ``compare`` keeps the replacements only when the
    compiled graph times faster than Inductor alone (None: on for CUDA models, see
    :class:`~kernelsmith.frontends.backend.KernelsmithBackend`). ``devices``, ``executor`` and
    ``ray_address`` say where the candidates run (see :func:`kernelsmith.tuner.tune_spec`). See
    :mod:`kernelsmith.whole_model.optimize`. ``force_retune`` tunes the workloads again even where
    decisions are stored; ``require_tuned`` tunes nothing and raises
    :class:`kernelsmith.NotTunedError` for the first workload not in the database (None: the
    settings ``KERNELSMITH_FORCE_RETUNE`` / ``KERNELSMITH_REQUIRE_TUNED``; docs/cache.md).

    ``example_kwargs`` are keyword inputs of the model's calls, as Hugging Face models take them
    (``input_ids``, ``labels``, ``attention_mask``): with ``labels`` the loss is computed inside the
    model, so it is in the plan, in the graph and among the sites. With ``train=True`` (and
    ``compare`` not False; None: on a GPU) the whole training step decides which families'
    replacements stay (:mod:`kernelsmith.whole_model.train_step`): each family's alone, timed with
    its peak memory against none, kept where the step is not slower or where ``memory`` (a
    :class:`~kernelsmith.whole_model.train_step.MemoryObjective`) accepts its memory saving; the
    report's ``train_step`` says what each kept family saves.

    ``skip_logits=True`` (for Hugging Face causal LMs trained with ``labels``) first patches
    ``model`` itself with :func:`kernelsmith.hf.fuse_lm_loss`: its training calls with labels then
    compute the loss through the fused linear + cross-entropy and return ``logits=None`` (the
    memory of the logits is saved only by not returning them); its kernel is tuned on the first
    such call within ``min(budget, FUSED_LOSS_BUDGET)`` evaluations (not counted in the report's
    ``evaluations``). The report's ``skip_logits`` says whether the model was patched (or why not)
    and where the loss ran the op's PyTorch reference instead of a kernel (``fallbacks``).
    ``kernelsmith.hf.unfuse_lm_loss`` undoes the patch.
    """
    if budget < 0:
        raise ValueError(f"budget must be a count of evaluations >= 0, not {budget}")
    from kernelsmith.evaluate.executor import check_executor

    check_executor(executor, ray_address)  # an unreachable cluster: one line, before profiling
    force = bool(settings.get("KERNELSMITH_FORCE_RETUNE") if force_retune is None else force_retune)
    # Where the candidates run, and the cache's switches: tune_spec's keyword arguments.
    where = {"devices": devices, "executor": executor, "ray_address": ray_address, "force": force,
             "require_tuned": require_tuned}
    started = time.monotonic()
    inputs = tuple(example_inputs)
    kwargs = dict(example_kwargs or {})
    tensors = [t for t in (*inputs, *kwargs.values(), *model.parameters()) if isinstance(t, torch.Tensor)]
    mode = dispatch.mode_for(tensors)
    allowance = _Budget(budget, started + seconds if seconds is not None else None)
    report: dict[str, Any] = {
        "model": name,
        "mode": mode or "none",
        "budget": budget,
        "seconds": seconds,
        "train": train,
        "note": _mode_note(mode),
    }

    if skip_logits:
        report["skip_logits"] = _fuse_lm_loss(model, db, strategy, budget, mode)

    def tell(stage: str, message: str = "", **fields: Any) -> None:
        log.info("%s: %s", stage, message)
        if progress is not None:
            progress(OptimizeProgress(stage, message, total_done=allowance.spent, total_budget=budget, **fields))

    was_training = model.training
    try:
        if plan is None:
            tell("profile", f"profiling {name}")
            plan = _profile(model, inputs, name, kwargs)
        model.train(was_training)
        tell("discover", "tracing the model for op patterns")
        sites = discover_sites(model, inputs, train=train, kwargs=kwargs)
        workloads = rank(workloads_of(sites, train), plan)
        stopped = "" if mode is not None else report["note"]
        if mode is not None:
            stopped = _tune_all(workloads, allowance, mode, db, strategy, patience, min_gain, tell, where)
        tell("compile", "compiling with the kernelsmith backend")
        backend = KernelsmithBackend(db=db, compare=compare)
        compiled = cast(nn.Module, torch.compile(model, backend=backend))
        with torch.set_grad_enabled(train):
            compiled(*inputs, **kwargs)
        if train and (compare if compare is not None else mode == "gpu"):
            tell("compile", "timing the training step with and without each family's replacements")
            compiled, step_report = _decide_training_step(model, backend, db, inputs, kwargs, memory)
            report["train_step"] = step_report
    finally:
        model.train(was_training)
    replaced = [s for s in backend.sites if s.status == "replaced"]
    report.update(
        evaluations=allowance.spent,
        wall_s=time.monotonic() - started,
        stopped=stopped,
        plan=_plan_summary(plan),
        workloads=[w.to_dict() for w in workloads],
        sites=[s.summary() for s in backend.sites],
        replaced=len(replaced),
        expected_gain=expected_gain(workloads, replaced),
        peak_memory_bytes=plan.peak_memory_bytes,
        created=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    )
    if skip_logits:
        from kernelsmith.frontends.hf_lm_loss import fallback_reasons

        report["skip_logits"]["fallbacks"] = fallback_reasons(model)
    tell("done", f"{len(replaced)} of {len(backend.sites)} sites replaced, {allowance.spent} evaluations")
    return compiled, report


def _fuse_lm_loss(model: nn.Module, db: Any, strategy: str, budget: int, mode: str | None) -> dict[str, Any]:
    """``optimize_model(skip_logits=True)``: the model patched by :func:`kernelsmith.hf.fuse_lm_loss`
    (its kernel tuned on its first training call), or why not."""
    from kernelsmith.frontends.hf_lm_loss import fuse_lm_loss, is_fused, refusal

    why = refusal(model)
    fused_budget = min(budget, FUSED_LOSS_BUDGET)
    fuse_lm_loss(model, tune=mode is not None and fused_budget > 0, budget=fused_budget, strategy=strategy, db=db)
    return {"patched": is_fused(model), "refusal": why, "budget": fused_budget}


def _mode_note(mode: str | None) -> str:
    if mode is None:
        return "not CUDA tensors: nothing can be tuned (set KERNELSMITH_INTERPRET=1 to run kernels on the CPU)"
    if mode == "interpreter":
        return "interpreter mode: timings prove the pipeline, not performance"
    return ""


def _profile(model: nn.Module, inputs: tuple[Any, ...], name: str, kwargs: Mapping[str, Any] | None = None) -> Plan:
    from kernelsmith.whole_model.profile import profile_model

    keywords = dict(kwargs or {})
    on_gpu = any(isinstance(t, torch.Tensor) and t.device.type == "cuda" for t in (*inputs, *keywords.values()))
    warmup, iterations = (3, 5) if on_gpu else (1, 2)
    return profile_model(model, inputs, name=name, warmup=warmup, iterations=iterations, kwargs=keywords)


def discover_sites(
    model: nn.Module, inputs: Sequence[Any], *, train: bool = False, kwargs: Mapping[str, Any] | None = None
) -> list[Site]:
    """The sites the kernelsmith backend finds in ``model``'s graphs (one forward, run eagerly)."""
    backend = KernelsmithBackend(discover=True)
    with torch.set_grad_enabled(train):
        torch.compile(model, backend=backend)(*inputs, **dict(kwargs or {}))
    return backend.sites


def _decide_training_step(
    model: nn.Module,
    backend: KernelsmithBackend,
    db: Any,
    inputs: tuple[Any, ...],
    kwargs: dict[str, Any],
    memory: MemoryObjective | None,
) -> tuple[nn.Module, dict[str, Any]]:
    """The model compiled with the families whose replacements the training step keeps
    (:func:`kernelsmith.whole_model.train_step.decide_training_step`), and the step report. The
    sites of a dropped family become "slower in context", with the step's numbers as the reason."""
    families = sorted({s.op for s in backend.sites if s.status == "replaced"})

    def build(chosen: frozenset[str]) -> nn.Module:
        only = KernelsmithBackend(db=db, compare=False, families=tuple(f for f in families if f in chosen))
        return cast(nn.Module, torch.compile(model, backend=only))

    params = [p for p in model.parameters() if p.requires_grad]
    device = next((p.device for p in params), torch.device("cpu"))
    model.train()
    compiled, step = decide_training_step(build, families, params, device, inputs, kwargs, objective=memory)
    for p in params:
        p.grad = None
    verdicts = {d.family: d for d in step.families}
    for site in backend.sites:
        verdict = verdicts.get(site.op)
        if site.status == "replaced" and verdict is not None and site.op not in step.kept:
            site.status, site.reason = "slower in context", f"training step: {verdict.reason}"
    return cast(nn.Module, compiled), step.to_dict()


def workloads_of(sites: Sequence[Site], train: bool = False) -> list[Workload]:
    """The distinct buckets of ``sites`` (and, with ``train``, of their backward families)."""
    found: dict[tuple[str, str], Workload] = {}

    def add(op: str, spec: OpSpec, shape: tuple[int, ...], backward_of: str = "") -> None:
        bucket = get_op(op).bucket(spec)
        key = (op, bucket.workload_hash)
        if key in found:
            found[key].sites += 1
        else:
            found[key] = Workload(op, bucket, shape, backward_of=backward_of)

    for site in sites:
        if site.status != "found":
            continue
        family = get_op(site.op)
        shape = tuple(site.spec.inputs[0].shape)
        add(site.op, site.spec, shape)
        if train and site.needs_grad and family.backward is not None:
            backward = get_op(family.backward)
            try:
                add(backward.name, backward.spec_for(*_backward_metas(family, site), **site.constants), shape, site.op)
            except UnsupportedWorkload as exc:
                log.info("%s: backward not tunable: %s", site.spec.describe(), exc)
    return list(found.values())


def rank(workloads: list[Workload], plan: Plan) -> list[Workload]:
    """``workloads`` with their shares of ``plan``'s time, largest first (see the module docstring)."""
    claims: dict[int, list[Workload]] = defaultdict(list)  # plan row rank -> workloads of its shape
    unmatched: list[Workload] = []
    for w in workloads:
        if w.backward_of:
            continue
        families = PLAN_FAMILIES.get(w.op, (w.op,))
        rows = [r for r in plan.rows if r.family in families and r.shapes and tuple(r.shapes[0]) == w.shape]
        for row in rows:
            claims[row.rank].append(w)
        if not rows:
            unmatched.append(w)
    by_rank = {r.rank: r for r in plan.rows}
    for row_rank, claimants in claims.items():
        total = sum(w.sites for w in claimants)
        for w in claimants:
            w.share += by_rank[row_rank].share * w.sites / total
    for family_group in {PLAN_FAMILIES.get(w.op, (w.op,)) for w in unmatched}:
        group = [w for w in unmatched if PLAN_FAMILIES.get(w.op, (w.op,)) == family_group]
        free = sum(r.share for r in plan.rows if r.family in family_group and r.rank not in claims)
        total = sum(w.sites for w in group)
        for w in group:
            w.share = free * w.sites / total
    forward_share = {(w.op, w.shape): w.share for w in workloads if not w.backward_of}
    for w in workloads:
        if w.backward_of:
            w.share = forward_share.get((w.backward_of, w.shape), 0.0)
    return sorted(workloads, key=lambda w: -w.share)


def _tune_all(
    workloads: list[Workload],
    allowance: _Budget,
    mode: str,
    db: Any,
    strategy: str,
    patience: int | None,
    min_gain: float,
    tell: Callable[..., None],
    where: dict[str, Any],
) -> str:
    """Tune ``workloads`` in order within ``allowance``; returns why tuning stopped ("" when all were done)."""
    stopped = ""
    count = len(workloads)
    for index, w in enumerate(workloads, 1):
        stored = None if where.get("force") else _stored(db, mode, w.spec)
        if stored is not None:
            w.status, w.reason = "stored", "decided in the database already"
            w.decided(stored.winner, stored.metrics)
            continue
        if not stopped and amdahl_gain(min(w.share, 1.0), GAIN_SPEEDUPS[1]) < min_gain:
            stopped = f"returns diminish: the remaining workloads could gain under {100 * (min_gain - 1):.1f}% at 3x"
        elif not stopped and allowance.left <= 0:
            stopped = "the evaluation budget is spent"
        elif not stopped and allowance.out_of_time():
            stopped = "the time budget is spent"
        if stopped:
            w.status, w.reason = "skipped", stopped
            continue
        left_share = sum(x.share for x in workloads[index - 1 :] if x.status == "pending")
        part = round(allowance.left * w.share / left_share) if left_share > 0 else allowance.left
        op_budget = min(allowance.left, max(MIN_EVALUATIONS, part))
        _tune_one(w, index, count, op_budget, allowance, mode, db, strategy, patience, tell, where)
    return stopped


def _tune_one(
    w: Workload,
    index: int,
    count: int,
    op_budget: int,
    allowance: _Budget,
    mode: str,
    db: Any,
    strategy: str,
    patience: int | None,
    tell: Callable[..., None],
    where: dict[str, Any],
) -> None:
    """One search, stopped early when the time is up or it runs out of patience; ``where`` says
    where its candidates run (see :func:`kernelsmith.tuner.tune_spec`)."""
    from kernelsmith.tuner import tune_spec

    watch = _Patience(patience)

    def on_result(done: int, total: int, best: Any) -> None:
        watch.observe(done, best)
        best_us = getattr(best, "median_us", None)
        tell("evaluation", workload=index, workloads=count, done=done, budget=op_budget, best_us=best_us)

    tell("tune", f"{w.spec.describe()}: {100 * w.share:.1f}% of the time, budget {op_budget}",
         workload=index, workloads=count, budget=op_budget)
    began = time.monotonic()
    result = tune_spec(
        w.spec, budget=op_budget, strategy=strategy, db=db, mode=mode, progress=on_result,
        stop=lambda: allowance.out_of_time() or watch.exhausted(), **where,
    )
    allowance.spent += result.evaluations
    w.status, w.evaluations, w.seconds = "tuned", result.evaluations, time.monotonic() - began
    ci = result.speedup_ci or (None, None)
    w.decided(result.winner, {"speedup": result.speedup_vs_baseline, "ci_low": ci[0], "ci_high": ci[1]})
    if watch.exhausted():
        w.reason = f"stopped after {patience} evaluations without a 1% better time"
    tell("tuned", f"{w.spec.describe()}: {result.winner}, {w.versus}",
         workload=index, workloads=count, done=result.evaluations, budget=op_budget)


def _stored(db: Any, mode: str, bucket: OpSpec) -> DecisionRecord | None:
    with open_database(db) as database:
        return dispatch.stored_decision(database, mode, bucket)


def expected_gain(workloads: Sequence[Workload], replaced: Sequence[Site]) -> float:
    """Amdahl's end-to-end speedup of the forward, if each replaced site's workload runs at its
    stored speedup (measured vs eager) and the profile's shares hold."""
    speedups = {(s.op, get_op(s.op).bucket(s.spec).workload_hash): s.speedup for s in replaced}
    saved = 0.0
    for w in workloads:
        speedup = speedups.get((w.op, w.spec.workload_hash))
        if not w.backward_of and speedup and speedup > 0:
            saved += w.share * (1 - 1 / speedup)
    return 1.0 / (1.0 - min(saved, 0.999))


def _plan_summary(plan: Plan, top: int = 10) -> dict[str, Any]:
    return {
        "mode": plan.mode,
        "note": plan.note,
        "total_us": plan.total_us,
        "wall_ms": plan.wall_ms,
        "rows": [
            {"rank": r.rank, "family": r.family, "shape": r.shape, "share": r.share, "tunable": r.tunable}
            for r in plan.rows[:top]
        ],
    }


__all__ = ["OptimizeProgress", "Workload", "discover_sites", "optimize_model", "rank", "workloads_of"]

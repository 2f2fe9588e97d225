"""The tuning loop: spec -> candidates -> strategy -> evaluator -> decision -> database.

:func:`tune_spec` is the engine every front door calls. It

1. returns the stored decision at once when this workload was already tuned on this
   fingerprint (no evaluation at all; an imported claim not validated here does not count);
2. measures the device's copy bandwidth once per fingerprint (the roofline ceiling);
3. carries over a kernel decision stored under a *near* fingerprint (the same GPU, CUDA, torch
   and Triton, another driver build or kernelsmith release; see
   :class:`~kernelsmith.db.records.Fingerprint`) whose variant is unchanged (same source hash):
   its candidate is evaluated here like any other (built, validated on fresh secret data, timed)
   and re-timed against the baseline in step 5; only if it still wins with confidence is it
   stored under this fingerprint and served. A changed variant, a failed validation or a lost
   race against the baseline leaves it as a warm-start seed for step 4;
4. asks the strategy for batches of candidates, reuses any trial already measured here
   (failed configs are never measured again; imported trials never stand in), evaluates the
   rest in parallel workers, and stores every result immediately (an interrupted search loses nothing);
5. re-times the best few candidates interleaved with the baseline in one worker and adopts the
   best only if it beats both the incumbent and the baseline with statistical confidence. The
   baseline is the op's PyTorch reference run eagerly and, on a GPU
   (``KERNELSMITH_COMPILE_BASELINE``), the same reference compiled by torch.compile: a kernel
   must then beat both, so in particular the faster (a compile failure is recorded in the
   decision's note, which then says it was decided against eager only); a
   winner from outside the package (a strategy's own kernel source) is kept only if a decisive
   run in brand-new worker processes agrees (:mod:`kernelsmith.evaluate.confirm`).

Three switches, as arguments or settings (:mod:`kernelsmith.settings`): ``force``
(``KERNELSMITH_FORCE_RETUNE``) skips steps 1 and 3 and reuses no trial stored before the run;
``database_only`` (``KERNELSMITH_DATABASE_ONLY``) stops after step 3, returning a baseline
result that is not stored when nothing was served; ``require_tuned``
(``KERNELSMITH_REQUIRE_TUNED``) stops there too but raises :class:`NotTunedError` instead.

Layout: this module is the engine's front, :func:`tune_spec` (the steps above, in order) and
:func:`tune`. One search (steps 3 to 5: the proposal loop, claims shared with other tuners, the
final re-timing) is :class:`~kernelsmith._tuner_search._Search`; :class:`TuneResult` and the
records the tuner reads and writes are in :mod:`~kernelsmith._tuner_records`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import torch

from kernelsmith import notify
from kernelsmith._tuner_records import TuneResult, _carried, _copy_bandwidth, _result_from_decision
from kernelsmith._tuner_records import _trial as _trial  # importable from here, as before the split
from kernelsmith._tuner_search import REVALIDATED as REVALIDATED
from kernelsmith._tuner_search import Progress, _Search
from kernelsmith.cost import search_cost
from kernelsmith.db import Fingerprint, current_fingerprint, open_database
from kernelsmith.evaluate.confirm import plausible as plausible  # tuner.plausible is the public name
from kernelsmith.evaluate.executor import check_executor, make_executor
from kernelsmith.exceptions import KernelsmithError
from kernelsmith.llm._base import LLMClient, Metered
from kernelsmith.ops import OpFamily, get_op
from kernelsmith.settings import get as setting
from kernelsmith.spec import OpSpec
from kernelsmith.strategies import make_strategy

log = logging.getLogger(__name__)


class NotTunedError(KernelsmithError, LookupError):
    """A workload has no decision in the database and tuning was not allowed (``require_tuned``,
    ``KERNELSMITH_REQUIRE_TUNED``): the message names the workload, the machine and the fix.
    ``spec`` is the workload, ``fingerprint`` the machine's fingerprint hash."""

    def __init__(self, spec: OpSpec, fp: Fingerprint, why: str = "") -> None:
        detail = f" ({why})" if why else ""
        super().__init__(
            f"{spec.describe()} (workload {spec.workload_hash}) is not tuned on {fp.describe()}{detail}; "
            f"tune it first (kernelsmith tune {spec.op} ..., or unset KERNELSMITH_REQUIRE_TUNED)"
        )
        self.spec, self.fingerprint = spec, fp.hash


def tune_spec(
    spec: OpSpec,
    *,
    budget: int = 50,
    strategy: str = "auto",
    db: Any = None,
    seed: int = 0,
    workers: int | None = None,
    mode: str | None = None,
    progress: Progress | None = None,
    client: LLMClient | None = None,
    stop: Callable[[], bool] | None = None,
    devices: Sequence[int] | str | None = None,
    executor: str = "local",
    ray_address: str | None = None,
    force: bool | None = None,
    database_only: bool | None = None,
    require_tuned: bool | None = None,
) -> TuneResult:
    """Tune one workload (see the module docstring); returns a :class:`TuneResult`.

    ``force``, ``database_only`` and ``require_tuned`` are the switches of the module docstring;
    None reads each one's setting (``KERNELSMITH_FORCE_RETUNE``, ``KERNELSMITH_DATABASE_ONLY``,
    ``KERNELSMITH_REQUIRE_TUNED``). ``require_tuned`` raises :class:`NotTunedError` where
    ``database_only`` would return an unstored baseline result (``from_database=False``,
    ``evaluations=0`` unless a near record was re-validated, and a ``note`` saying why).

    ``stop``, when given, is asked before each new proposal; True ends the search early (the
    whole-model optimizer uses it for wall-time budgets and diminishing returns), and the
    decision is then made over what was evaluated.

    ``client`` is the LLM of ``strategy="llm"`` (which otherwise builds one from the environment,
    see :mod:`kernelsmith.llm`) and of ``"auto"`` (which uses an LLM only when given one); its
    tokens, requests and wall time go into ``TuneResult.cost``.

    Where the candidates run (:mod:`kernelsmith.evaluate.executor`): ``executor="local"``, worker
    processes on this host over ``devices`` (GPU numbers, default every visible one), or
    ``"ray"``, actors of the Ray cluster at ``ray_address`` (default: the one this process joined,
    or a new local one). A Ray address that does not answer fails here, before anything is written.
    """
    if budget < 1:
        raise ValueError("budget must be at least 1")
    require_tuned = setting("KERNELSMITH_REQUIRE_TUNED") if require_tuned is None else require_tuned
    database_only = setting("KERNELSMITH_DATABASE_ONLY") if database_only is None else database_only
    searching = not (database_only or require_tuned)
    if force and not searching:
        raise ValueError("force (retune) contradicts database_only / require_tuned, which never tune")
    # KERNELSMITH_FORCE_RETUNE yields to a run that never tunes (a deployment's database-only code).
    force = bool(setting("KERNELSMITH_FORCE_RETUNE")) and searching if force is None else force
    if strategy == "llm" and client is None:
        from kernelsmith.llm import make_client

        client = make_client()  # raises, before any work, when no LLM is configured
    meter = Metered(client) if client is not None else None
    make_strategy(strategy, client=meter)  # fail early on an unknown name or a missing dependency
    check_executor(executor, ray_address)  # an unreachable cluster: one line, before any work
    started = time.perf_counter()
    family = get_op(spec.op)
    family.check_supported(spec)
    fp = current_fingerprint(mode)
    database = open_database(db)
    try:
        stored = None if force else database.get_decision(fp.hash, spec.workload_hash)
        if stored is not None and stored.servable:  # an unvalidated imported claim is tuned afresh
            return _result_from_decision(
                stored, fp, from_database=True, evaluations=0, wall_s=time.perf_counter() - started
            )
        near, carried = _carried(database, spec, fp, force)
        if not carried and not searching:
            why = "a record of a near fingerprint did not re-validate here" if near else "not in the database"
            return _not_tuned(spec, fp, started, require_tuned, why)  # nothing written: a read-only database serves
        database.put_fingerprint(fp)
        with make_executor(fp.mode, workers, devices=devices, executor=executor, ray_address=ray_address) as evaluator:
            copy_gbps = _copy_bandwidth(database, fp, evaluator)
            search = _Search(family, spec, fp, database, evaluator, progress, copy_gbps)
            decision = search.carry_over(carried, near, copy_gbps) if carried else None
            if decision is None and not searching:
                return _not_tuned(spec, fp, started, require_tuned,
                                  "a record of a near fingerprint did not re-validate here", search.evaluated)
            if decision is None:
                search = _Search(family, spec, fp, database, evaluator, progress, copy_gbps,
                                 since=time.time() if force else 0.0)
                search.run(strategy, budget, seed, client=meter, stop=stop)
                decision = search.decide(strategy, copy_gbps)
        cost = search_cost(
            search.results, search.fresh, fp.mode, wall_s=time.perf_counter() - started, recheck_s=search.recheck_s,
            llm=meter.usage.as_cost() if meter is not None else None,
        )
        decision = replace(decision, metrics={**decision.metrics, "cost": cost.totals()})
        if search.winner_source:  # a strategy's own kernel won: keep its text so dispatch can serve it
            database.put_variant_source(spec.op, search.winner_source)
        database.put_decision(decision)
        result = _result_from_decision(
            decision,
            fp,
            from_database=False,
            evaluations=search.evaluated,
            failures=search.failures(),
            failure_examples=search.failure_examples(),
            wall_s=time.perf_counter() - started,
            top=search.top(),
            cost=cost,
        )
        notify.tuning_done(result)  # optional webhook; never raises
        return result
    finally:
        if database is not db:
            database.close()


def _not_tuned(
    spec: OpSpec, fp: Fingerprint, started: float, require_tuned: bool, why: str, evaluations: int = 0
) -> TuneResult:
    """What ``database_only`` returns for a workload with no servable decision (nothing is
    stored: the baseline runs), or the :class:`NotTunedError` that ``require_tuned`` raises."""
    if require_tuned:
        raise NotTunedError(spec, fp, why)
    log.info("%s is not tuned (%s) and tuning is off (database only): the original code runs", spec.describe(), why)
    return TuneResult(
        op=spec.op, workload=spec.workload_hash, spec=spec.to_dict(), mode=fp.mode, winner="baseline",
        evaluations=evaluations, wall_s=time.perf_counter() - started, fingerprint=fp.describe(),
        note=f"not tuned ({why}); database-only mode never tunes",
    )


def tune(
    op: str | OpFamily,
    *example_inputs: torch.Tensor,
    budget: int = 50,
    strategy: str = "auto",
    db: Any = None,
    seed: int = 0,
    workers: int | None = None,
    client: LLMClient | None = None,
    devices: Sequence[int] | str | None = None,
    executor: str = "local",
    ray_address: str | None = None,
    force: bool | None = None,
    database_only: bool | None = None,
    require_tuned: bool | None = None,
    **constants: Any,
) -> TuneResult:
    """Tune ``op`` for the workload of ``example_inputs``; see :func:`tune_spec` (``force``,
    ``database_only`` and ``require_tuned`` are its switches).

    >>> import torch, kernelsmith
    >>> x = torch.randn(64, 1024, dtype=torch.bfloat16, device="cuda")  # doctest: +SKIP
    >>> kernelsmith.tune("softmax", x, budget=20).winner                 # doctest: +SKIP
    'kernel'
    """
    family = get_op(op) if isinstance(op, str) else op
    spec = family.spec_for(*example_inputs, **constants)
    return tune_spec(
        spec, budget=budget, strategy=strategy, db=db, seed=seed, workers=workers, client=client,
        devices=devices, executor=executor, ray_address=ray_address, force=force, database_only=database_only,
        require_tuned=require_tuned,
    )  # fmt: skip

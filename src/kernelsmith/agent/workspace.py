"""The coding-agent workspace: one kernel file, a fixed harness outside it, keep or revert.

:func:`init_workspace` creates a folder holding

- ``kernel.py``: a kernel file (docs/kernel-files.md: ``@triton.jit`` device code plus a literal
  launch description and ``CONFIG``) to edit: the database's stored winner when it is a kernel
  file this user trusts (a kernel an earlier session kept, or the ``llm`` strategy's, verbatim),
  else the family's hand-written template (:mod:`kernelsmith.agent.templates`) with its first
  config. The op families' built-in variants are the package's own code and launch through
  Python, so they cannot be handed out as kernel files; a family with no template has no
  workspace;
- ``best.py``: a copy of it, the version to go back to after a REVERT;
- ``AGENTS.md``: the rules and the playbook (:mod:`kernelsmith.agent.playbook`);
- ``workspace.json``: the op, the workload's spec, the fingerprint mode and hash, the database,
  and the incumbent;
- ``results.tsv``: a header, then one row per bench.

:func:`bench_workspace` evaluates ``kernel.py`` with the package's own harness, never with
anything in the folder:

1. the file is read as *text* and checked by the kernel-file gate
   (:func:`kernelsmith.evaluate.kernel_file.check_kernel_file`), in this process, without running
   it: each problem the gate finds is a line of the REVERT reason, and nothing is evaluated;
2. the kernel file (with its ``CONFIG``) and the incumbent (the stored winner, or none: the eager
   baseline) are evaluated together by an :class:`~kernelsmith.evaluate.pool.Evaluator` worker,
   which launches the file's kernels with kernelsmith's own launcher, validates and times them
   interleaved with the baseline (``gpu`` mode with CUDA, else ``interpreter``);
3. the verdict is KEEP when the kernel is correct and faster than the incumbent with 95%
   confidence (:func:`kernelsmith.decide.compare` on the paired rounds), else REVERT;
4. every bench is stored as a trial (failures included) and appended to ``results.tsv``; on
   KEEP the source is stored by hash (``Database.put_variant_source``) and becomes the
   workload's decision, which the decorator, the ``kernelsmith::kernel`` op and the compile
   backend serve from then on (:func:`kernelsmith.dispatch.build_runner`).

Tests inject the evaluation (``evaluate=``) to fix a verdict without timing noise.

Layout: the files and the :class:`Workspace` record are in :mod:`~kernelsmith.agent._workspace_layout`,
the starting kernel in :mod:`~kernelsmith.agent._workspace_kernel`, the bench's evaluation and verdict in
:mod:`~kernelsmith.agent._workspace_bench`; this module holds ``init`` and ``bench``, and every
public name is importable from here.
"""

from __future__ import annotations

import datetime
import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kernelsmith.agent._workspace_bench import (
    BenchReport,
    _confirm_keep,
    _evaluate,
    _flops,
    _incumbent,
    _judge,
    _precheck,
)
from kernelsmith.agent._workspace_kernel import Start, starting_kernel
from kernelsmith.agent._workspace_kernel import config_block as config_block
from kernelsmith.agent._workspace_layout import (
    AGENT_VARIANT,
    AGENTS_FILE,
    BEST_FILE,
    INTERPRETER_NOTE,
    KERNEL_FILE,
    RESULTS_COLUMNS,
    RESULTS_FILE,
    WORKSPACE_FILE,
    WORKSPACE_FORMAT,
    Evaluate,
    Workspace,
    WorkspaceError,
)
from kernelsmith.agent._workspace_layout import GATE_REASON as GATE_REASON
from kernelsmith.agent._workspace_layout import GPU_TIMING as GPU_TIMING
from kernelsmith.agent._workspace_layout import INTERPRETER_TIMING as INTERPRETER_TIMING
from kernelsmith.db import (
    Database,
    DecisionRecord,
    Fingerprint,
    TrialRecord,
    current_fingerprint,
    open_database,
    variant_source_hash,
)
from kernelsmith.evaluate.protocol import Candidate, EvalResult
from kernelsmith.ops import OpFamily, get_op
from kernelsmith.space import Config
from kernelsmith.spec import OpSpec, parse_shape

log = logging.getLogger(__name__)

def _db_location(db: Any) -> str | None:
    """What workspace.json records for ``db``: an absolute path, a URL as given, or None."""
    if db is None:
        return None
    if isinstance(db, Database):
        raise WorkspaceError("pass the database as a path or URL, so that `bench` can open it again")
    text = os.fspath(db)
    if text in (":memory:", "sqlite://", "sqlite:///:memory:"):
        raise WorkspaceError("an in-memory database would be gone before the first bench: give a file")
    return text if "://" in text else os.path.abspath(text)


def _io_facts(family: OpFamily, spec: OpSpec) -> tuple[str, str, str]:
    inputs = ", ".join(f"`in{i}` {t}" for i, t in enumerate(spec.inputs))
    outputs = ", ".join(f"`out{i}` {t}" for i, t in enumerate(family.output_specs(spec)))
    constants = ", ".join(f"{k}={v!r}" for k, v in spec.constants.items())
    return inputs, outputs, constants


@dataclass
class InitResult:
    """What :func:`init_workspace` made."""

    path: Path
    spec: OpSpec
    mode: str
    start: Start
    incumbent: dict[str, Any]
    notes: list[str] = field(default_factory=list)


def init_workspace(
    op: str,
    shape: str | Sequence[int],
    dtype: str,
    *,
    directory: str | os.PathLike[str],
    db: Any = None,
    constants: Mapping[str, Any] | None = None,
    mode: str | None = None,
    full_size: bool = False,
    force: bool = False,
) -> InitResult:
    """Create a workspace for ``op`` on ``shape``/``dtype`` in ``directory`` (see the module docstring).

    The workload is the one the decorator looks up: row-wise ops are bucketed (rows rounded up to
    a power of two). Without a GPU the shape shrinks to the family's small shape unless
    ``full_size``. Refuses to overwrite an existing workspace unless ``force``.

    >>> # init_workspace("rmsnorm", "8x64", "fp32", directory="ws-rmsnorm", db="kernelsmith.db")
    """
    from kernelsmith.agent.playbook import Facts, agents_md

    family = get_op(op)
    asked = parse_shape(shape) if isinstance(shape, str) else tuple(int(s) for s in shape)
    fp = current_fingerprint(mode)
    notes: list[str] = []
    run_shape = asked
    if fp.mode == "interpreter" and not full_size:
        run_shape = family.small_shape(asked)
        if run_shape != asked:
            notes.append(
                f"no CUDA GPU: the workspace uses shape {'x'.join(map(str, run_shape))} (asked "
                f"{'x'.join(map(str, asked))}) so the Triton interpreter runs it in seconds"
            )
    spec = family.spec(run_shape, dtype, **dict(constants or {}))
    family.check_supported(spec)
    bucket = family.bucket(spec)
    if bucket != spec:
        notes.append(f"tuned as its bucket {bucket.describe()}, the workload calls of this shape look up")
    if fp.mode == "interpreter":
        notes.append(INTERPRETER_NOTE)

    path = Path(directory)
    if (path / WORKSPACE_FILE).exists() and not force:
        raise WorkspaceError(f"{path} already holds a workspace; use --force to replace it")
    location = _db_location(db)
    database = open_database(location)
    try:
        database.put_fingerprint(fp)
        decision = database.get_decision(fp.hash, bucket.workload_hash)
        start = starting_kernel(family, bucket, decision, database)
    finally:
        database.close()
    incumbent = _incumbent_record(decision)
    if start.origin == "template" and incumbent["kind"] == "kernel":
        notes.append(
            f"kernel.py is the {family.name} template: the incumbent ({incumbent['variant']}) is not a kernel "
            "file this workspace can edit (a built-in variant, or a stored source that is missing or not trusted)"
        )

    inputs, outputs, consts = _io_facts(family, bucket)
    facts = Facts(
        op=family.name, summary=family.summary, workload=bucket.describe(), inputs=inputs, outputs=outputs,
        constants=consts, mode=fp.mode, machine=fp.describe(), sm_count=fp.sm_count,
        bytes_moved=family.bytes_moved(bucket), flops=_flops(family, bucket), start=start.describe(),
        tensor_names=(*(f"in{i}" for i in range(len(bucket.inputs))),
                      *(f"out{i}" for i in range(len(family.output_specs(bucket))))),
    )  # fmt: skip
    path.mkdir(parents=True, exist_ok=True)
    (path / KERNEL_FILE).write_text(start.source)
    (path / BEST_FILE).write_text(start.source)
    (path / AGENTS_FILE).write_text(agents_md(facts))
    (path / RESULTS_FILE).write_text("\t".join(RESULTS_COLUMNS) + "\n")
    workspace = Workspace(path, {
        "format": WORKSPACE_FORMAT,
        "version": 1,
        "op": family.name,
        "spec": bucket.to_dict(),
        "workload": bucket.workload_hash,
        "shape_asked": list(asked),
        "mode": fp.mode,
        "fingerprint": fp.hash,
        "machine": fp.describe(),
        "sm_count": fp.sm_count,
        "db": location,
        "start": {"origin": start.origin, "variant": start.variant, "config": start.config},
        "incumbent": incumbent,
        "created_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    })  # fmt: skip
    workspace.save()
    log.info("workspace %s for %s from the %s", path, bucket.describe(), start.origin)
    return InitResult(path, bucket, fp.mode, start, incumbent, notes)


def _incumbent_record(decision: DecisionRecord | None) -> dict[str, Any]:
    """workspace.json's view of what calls run today, with its stored time if any."""
    if decision is None or decision.winner != "kernel":
        time_us = decision.metrics.get("baseline_median_us") if decision is not None else None
        return {"kind": "baseline", "time_us": time_us}
    return {
        "kind": "kernel",
        "variant": decision.variant,
        "source_hash": decision.source_hash,
        "config": dict(decision.config),
        "time_us": decision.metrics.get("median_us"),
    }


def bench_workspace(
    directory: str | os.PathLike[str] = ".", *, db: Any = None, evaluate: Evaluate | None = None
) -> BenchReport:
    """Evaluate the workspace's ``kernel.py`` against the incumbent; see the module docstring.

    ``db`` overrides the database recorded at init; ``evaluate`` replaces the worker evaluation
    (tests). Returns the report; results.tsv, the database and (on KEEP) best.py and
    workspace.json are updated.
    """
    workspace = Workspace.load(directory)
    family = get_op(workspace.op)
    spec = workspace.spec
    try:
        fp = current_fingerprint(workspace.mode)
    except RuntimeError as exc:
        raise WorkspaceError(f"this workspace was made for mode {workspace.mode!r}: {exc}") from None
    try:
        source = (workspace.path / KERNEL_FILE).read_text()
    except FileNotFoundError:
        raise WorkspaceError(f"{workspace.path / KERNEL_FILE} is missing: `cp best.py kernel.py`") from None
    notes = [INTERPRETER_NOTE] if fp.mode == "interpreter" else []
    if fp.hash != workspace.data.get("fingerprint"):
        notes.append("the machine or its software changed since init: results go under the current fingerprint")
    source_hash = variant_source_hash(source)
    location = db if db is not None else workspace.db
    database = open_database(location)
    try:
        database.put_fingerprint(fp)
        decision = database.get_decision(fp.hash, spec.workload_hash)
        incumbent, label, incumbent_note = _incumbent(family, decision, database)
        if incumbent_note:
            notes.append(incumbent_note)
        config, kind, problem = _precheck(source)
        candidate = Candidate(AGENT_VARIANT, Config(config), source)
        result: EvalResult | None = None
        if kind:
            figures: dict[str, Any] = {"status": kind, "error": problem, "verdict": "REVERT",
                                       "reason": f"{kind}: {problem}"[:4000]}  # fmt: skip
        else:
            candidates = [candidate] + ([incumbent] if incumbent is not None else [])
            results, copy_gbps = _evaluate(fp, database, spec, candidates, evaluate)
            result = results[0]
            figures = _judge(family, spec, result, results[1] if incumbent is not None else None, label, copy_gbps)
            if figures["verdict"] == "KEEP" and evaluate is None:  # decisive: judged again in fresh workers
                figures = _confirm_keep(family, spec, fp.mode, candidates, label, copy_gbps)
        comparison = figures.pop("comparison", None)
        metrics = figures.pop("metrics", dict(result.metrics) if result is not None else {})
        report = BenchReport(
            op=family.name, workload=spec.workload_hash, mode=fp.mode, source_hash=source_hash, config=config,
            incumbent=label, note="; ".join(notes), **figures,
        )  # fmt: skip
        database.add_trial(TrialRecord(
            fp.hash, spec.workload_hash, family.name, AGENT_VARIANT, source_hash, config, report.status,
            report.error[:2000], metrics,
        ))  # fmt: skip
        if report.verdict == "KEEP":
            _keep(workspace, database, fp, spec, source, report, metrics, comparison)
        elif report.incumbent_us is not None:  # the incumbent's time as measured in this run
            workspace.data["incumbent"]["time_us"] = report.incumbent_us
            workspace.save()
    finally:
        if database is not db:
            database.close()
    workspace.append_result(report.tsv_row())
    return report


def _keep(
    workspace: Workspace,
    db: Database,
    fp: Fingerprint,
    spec: OpSpec,
    source: str,
    report: BenchReport,
    metrics: Mapping[str, Any],
    comparison: Any,
) -> None:
    """Store the kept kernel as the workload's winner, so every front door serves it."""
    stored_hash = db.put_variant_source(spec.op, source)
    assert stored_hash == report.source_hash
    copy_gbps = 100.0 * report.gbps / report.pct_of_ceiling if report.gbps and report.pct_of_ceiling else None
    decision_metrics: dict[str, Any] = {
        "median_us": report.time_us,
        "p10_us": metrics.get("p10_us"),
        "p90_us": metrics.get("p90_us"),
        "baseline_median_us": report.baseline_us,
        "gbps": report.gbps,
        "baseline_gbps": metrics.get("baseline_gbps"),
        "copy_gbps": copy_gbps,
        "timer": metrics.get("timer"),
        "pct_of_copy_bandwidth": report.pct_of_ceiling,
        "speedup": comparison.speedup,  # over the baseline, as the tuner's decisions
        "ci_low": comparison.ci_low,
        "ci_high": comparison.ci_high,
        "rounds": comparison.rounds,
        "speedup_vs_incumbent": report.speedup_vs_incumbent,
        "replaced": report.incumbent,
    }
    if report.mode == "interpreter":
        decision_metrics["note"] = "interpreter mode: host-clock timings of the Triton interpreter, not GPU performance"
    db.put_decision(DecisionRecord(
        fingerprint=fp.hash, workload=spec.workload_hash, op=spec.op, spec=spec.to_dict(), winner="kernel",
        variant=AGENT_VARIANT, source_hash=stored_hash, config=dict(report.config), metrics=decision_metrics,
        strategy="agent", evaluations=1,
    ))  # fmt: skip
    report.stored = True
    (workspace.path / BEST_FILE).write_text(source)
    workspace.data["incumbent"] = {
        "kind": "kernel", "variant": AGENT_VARIANT, "source_hash": stored_hash, "config": dict(report.config),
        "time_us": report.time_us, "kept_at": report.timestamp,
    }  # fmt: skip
    workspace.save()
    log.info("kept %s for %s: %s", stored_hash, spec.describe(), report.reason)

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
"""

from __future__ import annotations

import datetime
import json
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from kernelsmith.db import (
    Database,
    DecisionRecord,
    Fingerprint,
    TrialRecord,
    current_fingerprint,
    open_database,
    variant_source_hash,
)
from kernelsmith.decide import compare
from kernelsmith.evaluate.kernel_file import KernelFileError, check_kernel_file, parse_kernel_file
from kernelsmith.evaluate.protocol import Candidate, EvalResult, TimingSettings
from kernelsmith.exceptions import KernelsmithError
from kernelsmith.ops import OpFamily, get_op
from kernelsmith.space import Config
from kernelsmith.spec import OpSpec, parse_shape

log = logging.getLogger(__name__)

# The variant name decisions and trials record for a kernel kept from a workspace.
AGENT_VARIANT = "agent"
KERNEL_FILE = "kernel.py"
BEST_FILE = "best.py"
AGENTS_FILE = "AGENTS.md"
WORKSPACE_FILE = "workspace.json"
RESULTS_FILE = "results.tsv"
WORKSPACE_FORMAT = "kernelsmith-agent-workspace"
RESULTS_COLUMNS = (
    "timestamp", "mode", "source_hash", "config", "correct", "time_us", "incumbent_us", "baseline_us",
    "gbps", "pct_of_ceiling", "speedup_vs_incumbent", "verdict", "reason",
)  # fmt: skip
INTERPRETER_NOTE = "interpreter: timings are not performance"
GATE_REASON = "the kernel-file gate rejected kernel.py (nothing ran; AGENTS.md says what a kernel file may contain):"
# Without a GPU the interpreter runs the kernels, thousands of times slower: shapes shrink to the
# family's small_shape unless the caller insists (as `kernelsmith tune` does).
GPU_TIMING = TimingSettings(rounds=100)
INTERPRETER_TIMING = TimingSettings(warmup_ms=0.0, rounds=6, input_sets=2, flush_l2=False)

# Evaluates candidates together (timed interleaved with each other and the baseline).
Evaluate = Callable[[OpSpec, Sequence[Candidate], TimingSettings], list[EvalResult]]


class WorkspaceError(KernelsmithError):
    """A problem with the workspace or the request (one line for the user, no traceback)."""


# ---- kernel.py ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Start:
    """Where ``kernel.py`` came from."""

    origin: str  # "database winner", "best kernel measured", "template"
    variant: str  # "agent", "llm" (a stored kernel file) or "template"
    config: dict[str, Any]
    source: str  # the complete kernel.py

    def describe(self) -> str:
        return f"the {self.origin} ({self.variant}, CONFIG {_config_text(self.config)})"


def _config_text(config: Mapping[str, Any]) -> str:
    return "{" + ", ".join(f"{json.dumps(k)}: {_literal(v)}" for k, v in sorted(config.items())) + "}"


def _literal(value: Any) -> str:
    return json.dumps(value) if isinstance(value, str) else repr(value)


def config_block(config: Mapping[str, Any]) -> str:
    """The ``CONFIG`` statement appended to a kernel file."""
    return (
        "\n# The config `kernelsmith agent bench` evaluates: a literal dict with a value for every\n"
        "# parameter of SPACE, meeting CONSTRAINTS (bench reads it without running this file).\n"
        f"CONFIG = {_config_text(config)}\n"
    )


def _header(family: OpFamily, spec: OpSpec, where: str) -> str:
    return (
        f"{family.name}: {family.summary}.\n\n"
        f"The kernel file `kernelsmith agent bench` evaluates, on {spec.describe()}.\n"
        f"Started from {where}.\n\n"
        "A kernel file (AGENTS.md has the rules): @triton.jit device code, literal constants, SPACE and\n"
        "CONSTRAINTS (the configs), LAUNCH (how kernelsmith launches the kernels: grid, arguments,\n"
        "constexprs, warps) and CONFIG (the config bench evaluates). Nothing here runs as host Python.\n"
    )


def _with_config(source: str, config: Mapping[str, Any]) -> str:
    return source.rstrip() + "\n\n" + config_block(config)


def _template_start(family: OpFamily, spec: OpSpec) -> Start:
    """``kernel.py`` from the family's template and the first config of its space for ``spec``."""
    from kernelsmith.agent.templates import OPS, template_source

    text = template_source(family.name)
    if text is None:
        raise WorkspaceError(
            f"no kernel-file template for {family.name}: `kernelsmith agent init` supports {', '.join(OPS)}"
        )
    template = parse_kernel_file(text)  # the package's own file: a failure here is a bug
    space = template.space(spec)
    configs = space.configs()
    if not configs:
        raise WorkspaceError(
            f"the {family.name} template has no config for {spec.describe()}: "
            + "; ".join(c.reason for c in space.constraints)
        )
    config = configs[0].to_dict()
    # The workspace's header goes above the template's own docstring, which explains the kernel.
    doc = '"""' + _header(family, spec, f"the template kernelsmith/agent/templates/{family.name}.py") + "\n"
    body = text.lstrip()
    body = body[3:] if body.startswith('"""') else '"""\n' + body
    return Start("template", "template", config, _with_config(doc + body, config))


def _trusted_source(db: Database, source_hash: str) -> str | None:
    """The stored kernel file ``source_hash`` when this user trusts it and it passes the gate."""
    record = db.variant_source(source_hash)
    if record is None:
        log.warning("the stored winner's source %s is missing from the database", source_hash)
        return None
    if not record.trusted:
        log.warning("the stored winner's source %s is imported and not trusted (kernelsmith db trust)", source_hash)
        return None
    problems = check_kernel_file(record.source)
    if problems:
        log.warning("the stored winner's source %s is not a kernel file: %s", source_hash, problems[0])
        return None
    return record.source


def starting_kernel(family: OpFamily, spec: OpSpec, decision: DecisionRecord | None, db: Database) -> Start:
    """The ``kernel.py`` of a new workspace for ``spec`` (see the module docstring)."""
    builtin = {v.name for v in family.variants}
    if decision is not None and decision.variant and decision.variant not in builtin:
        origin = "database winner" if decision.winner == "kernel" else "best kernel measured"
        stored = _trusted_source(db, decision.source_hash)
        if stored is not None:
            if parse_kernel_file(stored).config is None:  # an llm kernel: its config is the decision's
                stored = _with_config(stored, decision.config)
            return Start(origin, decision.variant, dict(decision.config), stored)
    return _template_start(family, spec)


# ---- the workspace -----------------------------------------------------------------------------
@dataclass
class Workspace:
    """A workspace folder and the contents of its ``workspace.json``."""

    path: Path
    data: dict[str, Any]

    @property
    def op(self) -> str:
        return str(self.data["op"])

    @property
    def spec(self) -> OpSpec:
        return OpSpec.from_dict(self.data["spec"])

    @property
    def mode(self) -> str:
        return str(self.data["mode"])

    @property
    def db(self) -> str | None:
        return self.data.get("db")

    @classmethod
    def load(cls, directory: str | os.PathLike[str]) -> Workspace:
        path = Path(directory)
        try:
            data = json.loads((path / WORKSPACE_FILE).read_text())
        except FileNotFoundError:
            raise WorkspaceError(
                f"{path} is not a kernelsmith workspace (no {WORKSPACE_FILE}): create one with "
                "`kernelsmith agent init OP --shape ... --dtype ... --dir PATH`"
            ) from None
        except json.JSONDecodeError as exc:
            raise WorkspaceError(f"{path / WORKSPACE_FILE} is not valid JSON: {exc}") from None
        if data.get("format") != WORKSPACE_FORMAT:
            raise WorkspaceError(f"{path / WORKSPACE_FILE} is not a kernelsmith workspace file")
        return cls(path, data)

    def save(self) -> None:
        (self.path / WORKSPACE_FILE).write_text(json.dumps(self.data, indent=2, sort_keys=True) + "\n")

    def append_result(self, row: Mapping[str, Any]) -> None:
        values = [str(row.get(column, "")) for column in RESULTS_COLUMNS]
        line = "\t".join(v.replace("\t", " ").replace("\n", " ") for v in values)
        with open(self.path / RESULTS_FILE, "a") as handle:
            handle.write(line + "\n")


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


def _flops(family: OpFamily, spec: OpSpec) -> int | None:
    try:
        return int(family.flops(spec))
    except NotImplementedError:
        return None


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


# ---- bench -------------------------------------------------------------------------------------
@dataclass
class BenchReport:
    """One bench: the verdict and the figures behind it. ``lines()`` is the printed block."""

    op: str
    workload: str
    mode: str
    source_hash: str
    config: dict[str, Any]
    status: str  # "ok" or the failure kind (build, validate, runtime, timeout, crash, cheat)
    verdict: str  # "KEEP" or "REVERT"
    reason: str
    incumbent: str  # what it was compared with
    error: str = ""
    time_us: float | None = None
    incumbent_us: float | None = None
    baseline_us: float | None = None
    gbps: float | None = None
    tflops: float | None = None
    pct_of_ceiling: float | None = None
    speedup_vs_incumbent: float | None = None
    speedup_ci: tuple[float, float] | None = None
    speedup_vs_baseline: float | None = None
    note: str = ""
    stored: bool = False
    timestamp: str = field(default_factory=lambda: datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"))

    @property
    def correct(self) -> bool:
        return self.status == "ok"

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["correct"] = self.correct
        data["speedup_ci"] = list(self.speedup_ci) if self.speedup_ci else None
        return data

    def lines(self) -> list[str]:
        """The grep-friendly verdict block: one ``key: value`` a line, ``n/a`` for no value."""
        ci = f"{self.speedup_ci[0]:.3f}-{self.speedup_ci[1]:.3f}" if self.speedup_ci else None
        rows: list[tuple[str, Any]] = [
            ("op", self.op),
            ("workload", self.workload),
            ("mode", self.mode),
        ]
        if self.note:
            rows.append(("note", self.note))
        rows += [
            ("source_hash", self.source_hash),
            ("config", _config_text(self.config)),
            ("correct", "yes" if self.correct else "no"),
            ("status", self.status),
            ("time_us", _num(self.time_us, 2)),
            ("incumbent", self.incumbent),
            ("incumbent_us", _num(self.incumbent_us, 2)),
            ("baseline_us", _num(self.baseline_us, 2)),
            ("gbps", _num(self.gbps, 1)),
            ("tflops", _num(self.tflops, 3)),
            ("pct_of_ceiling", _num(self.pct_of_ceiling, 1)),
            ("speedup_vs_incumbent", _num(self.speedup_vs_incumbent, 3)),
            ("speedup_ci", ci or "n/a"),
            ("speedup_vs_baseline", _num(self.speedup_vs_baseline, 3)),
            ("verdict", self.verdict),
        ]
        # The reason comes last: its first line after the key, the gate's problems (one each) below.
        first, *more = self.reason.splitlines() or [""]
        return [f"{key}: {value}" for key, value in rows] + [f"reason: {first}", *more]

    def tsv_row(self) -> dict[str, Any]:
        return {
            "timestamp": self.timestamp,
            "mode": self.mode,
            "source_hash": self.source_hash,
            "config": _config_text(self.config),
            "correct": "yes" if self.correct else "no",
            "time_us": _num(self.time_us, 2),
            "incumbent_us": _num(self.incumbent_us, 2),
            "baseline_us": _num(self.baseline_us, 2),
            "gbps": _num(self.gbps, 1),
            "pct_of_ceiling": _num(self.pct_of_ceiling, 1),
            "speedup_vs_incumbent": _num(self.speedup_vs_incumbent, 3),
            "verdict": self.verdict,
            "reason": self.reason[:300],
        }


def _num(value: float | None, digits: int) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def _precheck(source: str) -> tuple[dict[str, Any], str, str]:
    """``(CONFIG, failure kind, problem)`` from reading the kernel file, without running it.

    The gate's problems are the problem, one a line (the first line says what happened); a file
    that passes but has no ``CONFIG`` is a build failure.
    """
    try:
        kernel_file = parse_kernel_file(source)
    except KernelFileError as exc:
        return {}, "cheat", "\n".join([GATE_REASON, *(f"  {p}" for p in exc.problems)])
    if kernel_file.config is None:
        return {}, "build", "kernel.py defines no CONFIG = {...}: the config bench evaluates"
    return dict(kernel_file.config), "", ""


def _incumbent(
    family: OpFamily, decision: DecisionRecord | None, db: Database
) -> tuple[Candidate | None, str, str]:
    """``(candidate or None for the baseline, its label, a note)`` for what calls run today."""
    baseline = "baseline (eager PyTorch)"
    if decision is None or decision.winner != "kernel":
        return None, baseline, ""
    config = Config(decision.config)
    builtin = {v.name: v for v in family.variants}
    if decision.variant in builtin:
        variant = builtin[decision.variant]
        if decision.source_hash and decision.source_hash != variant.source_hash:
            return None, baseline, f"the stored winner {decision.variant} changed since it was tuned"
        return Candidate(variant.name, config), f"kernel {variant.name} [{config.key}]", ""
    record = db.variant_source(decision.source_hash)
    if record is None:
        return None, baseline, f"the stored winner's source {decision.source_hash} is missing"
    if not record.trusted:
        return None, baseline, (f"the stored winner's source {decision.source_hash} is imported and not trusted "
                                f"(`kernelsmith db trust {decision.source_hash}` after reading it)")
    source = record.source
    label = f"kernel {decision.variant}@{decision.source_hash[:8]} [{config.key}]"
    return Candidate(decision.variant, config, source), label, ""


def _copy_gbps(db: Database, fp: Fingerprint, evaluator: Any) -> float | None:
    """The measured copy bandwidth (the roofline ceiling), once per fingerprint."""
    if fp.mode != "gpu":
        return None
    stored = db.get_ceiling(fp.hash, "copy_gbps")
    if stored or evaluator is None:
        return stored
    result = evaluator.measure_ceiling()
    if result.status != "ok":
        log.warning("could not measure copy bandwidth: %s", result.error)
        return None
    db.put_ceiling(fp.hash, "copy_gbps", result.copy_gbps, result.detail)
    return float(result.copy_gbps)


def _evaluate(
    fp: Fingerprint, db: Database, spec: OpSpec, candidates: Sequence[Candidate], evaluate: Evaluate | None
) -> tuple[list[EvalResult], float | None]:
    settings = GPU_TIMING if fp.mode == "gpu" else INTERPRETER_TIMING
    if evaluate is not None:
        return evaluate(spec, candidates, settings), _copy_gbps(db, fp, None)
    from kernelsmith.evaluate.pool import Evaluator

    with Evaluator(fp.mode, workers=1) as evaluator:
        copy_gbps = _copy_gbps(db, fp, evaluator)
        return evaluator.evaluate_together(spec, candidates, settings), copy_gbps


def _judge(
    family: OpFamily,
    spec: OpSpec,
    result: EvalResult,
    incumbent_result: EvalResult | None,
    label: str,
    copy_gbps: float | None,
) -> dict[str, Any]:
    """The report's figures and verdict for a candidate that ran."""
    from kernelsmith.tuner import plausible

    result = plausible(result, copy_gbps)
    if not result.ok:
        return {"status": result.status, "error": result.error, "verdict": "REVERT",
                "reason": f"{result.status}: {result.error}"[:500]}  # fmt: skip
    m = result.metrics
    samples, baseline_samples = m["samples_us"], m["baseline_samples_us"]
    reference, reference_samples = "the baseline (eager PyTorch)", baseline_samples
    incumbent_us = float(m["baseline_median_us"])
    if incumbent_result is not None and incumbent_result.ok:
        reference, reference_samples = f"the incumbent {label}", incumbent_result.metrics["samples_us"]
        incumbent_us = incumbent_result.median_us
    elif incumbent_result is not None:
        reference += f" (the incumbent {label} failed: {incumbent_result.status})"
    versus = compare(samples, reference_samples)
    versus_baseline = compare(samples, baseline_samples)
    flops = _flops(family, spec)
    figures = {
        "status": "ok",
        "time_us": result.median_us,
        "incumbent_us": incumbent_us,
        "baseline_us": float(m["baseline_median_us"]),
        "gbps": m.get("gbps"),
        "tflops": flops / (result.median_us * 1e-6) / 1e12 if flops else None,
        "pct_of_ceiling": 100.0 * m["gbps"] / copy_gbps if copy_gbps and m.get("gbps") else None,
        "speedup_vs_incumbent": versus.speedup,
        "speedup_ci": (versus.ci_low, versus.ci_high),
        "speedup_vs_baseline": versus_baseline.speedup,
        "comparison": versus_baseline,
        "metrics": m,
    }
    detail = f"{versus.speedup:.3f}x vs {reference} (95% CI {versus.ci_low:.3f}-{versus.ci_high:.3f})"
    if versus.significant:
        figures.update(verdict="KEEP", reason=f"correct and faster: {detail}")
    else:
        figures.update(verdict="REVERT", reason=f"correct but not faster with confidence: {detail}")
    return figures


def _confirm_keep(
    family: OpFamily, spec: OpSpec, mode: str, candidates: Sequence[Candidate], label: str, copy_gbps: float | None
) -> dict[str, Any]:
    """The figures and verdict of a KEEP's decisive run (issue 12).

    A KEEP stores the kernel for every front door, so the kernel and the incumbent are validated
    and timed again in a brand-new worker process, beside a baseline also timed alone in another
    one that never loaded a candidate (:func:`kernelsmith.evaluate.pool.confirm`). The verdict is
    that run's: KEEP only if it agrees. (An injected ``evaluate`` skips this: tests fix verdicts.)
    """
    from kernelsmith.evaluate.pool import confirm

    settings = GPU_TIMING if mode == "gpu" else INTERPRETER_TIMING
    confirmation = confirm(spec, candidates, mode, settings, copy_gbps=copy_gbps)
    against = 1 if len(candidates) > 1 else None
    results = confirmation.results
    figures = _judge(family, spec, results[0], results[1] if against else None, label, copy_gbps)
    why = confirmation.disagreement(0, against) if figures["verdict"] == "KEEP" else figures["reason"]
    if why:
        figures.update(verdict="REVERT", reason=f"not confirmed in a fresh worker: {why}"[:4000])
    return figures


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

"""Call-time dispatch: from a stored decision to a launcher, and the ``torch.library`` op.

A :class:`KernelRunner` is a built launcher plus the shapes of the outputs it writes: calling it
allocates the outputs and launches, nothing else. Front doors keep runners in in-process tables
keyed by the call's shapes, dtypes, strides and device, so a repeated call does no hashing of
large objects, no database query and no tracing.

``torch.ops.kernelsmith.kernel(op, inputs, constants, decisions)`` exposes every tuned kernel as
one ``torch.library`` custom op (defined in :mod:`kernelsmith.frontends.torch_op`, which
``import kernelsmith`` registers) with a fake (meta) implementation, so that torch.compile graphs
and torch.export can hold kernelsmith kernels. Its implementation (:func:`run_kernel`) serves, for
the concrete inputs' workload, the decision the graph carries in ``decisions`` (see
:func:`encode_decisions`), else the stored winner, else the op's PyTorch reference.

Kernels written outside the package. A decision may name a variant that is not one of the
family's built-in ones: a kernel file (``docs/kernel-files.md``: Triton device code and a
declarative launch, no host Python) a coding agent (``kernelsmith agent bench``) or an LLM
proposed, whose text the database keeps by source hash (``Database.put_variant_source``). Such
source is evaluated in worker processes; serving its winner means compiling its kernels in the
caller's process and launching them with kernelsmith's own launcher (the file's Python never
runs, but its device code reads and writes the call's tensors), which is a trust decision:
:func:`build_runner` loads only text that

- this user trusts: the tool itself stored it after it passed the full harness (static gate,
  validation on every distribution and tail shape, timing checks) in a worker, or the user
  trusted it with ``kernelsmith db trust`` (imported text, and text in a database someone else
  wrote, is never read before that; see :mod:`kernelsmith.db.trust`);
- still hashes to the hash the decision names (a row edited by hand is refused);
- passes the kernel-file gate again, as it did before evaluation (only the Triton language in
  kernel bodies, only literal launch data);

and the front doors check the first call's output against the float64 reference before they
adopt the runner, then check its first served calls and a secret sample of later ones on the
user's real inputs (:class:`CheckedRunner`, :mod:`kernelsmith.servecheck`). Device code is not
a sandbox: a kernel reaches whatever memory its pointers do, so the gate keeps host code out and
trust keeps unknown device code out; neither stops a determined attacker with write access to
the database, who could equally edit the package.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from kernelsmith import servecheck
from kernelsmith.db import (
    Database,
    DatabaseError,
    DecisionRecord,
    current_fingerprint,
    open_database,
    variant_source_hash,
    warn_unusable_database,
)
from kernelsmith.frontends.torch_op import KERNEL as KERNEL  # re-exported: the op lives there
from kernelsmith.frontends.torch_op import kernel_op as kernel_op
from kernelsmith.ops import OpFamily, UnsupportedWorkload, get_op
from kernelsmith.ops._base import Launcher
from kernelsmith.space import Config
from kernelsmith.spec import OpSpec

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class KernelRunner:
    """A configured launcher and the outputs it writes.

    ``like_first_input`` marks the outputs allocated with ``torch.empty_like(inputs[0])``, a
    cheaper call than ``torch.empty``; only for a contiguous first input of the output's shape
    and dtype (the call key pins both, so every call of this runner has them). ``source_hash``
    is the one its decision names (what a failed serve check records).
    """

    launcher: Launcher
    outputs: tuple[tuple[tuple[int, ...], torch.dtype], ...]
    variant: str
    config: Config
    like_first_input: tuple[bool, ...] = ()
    source_hash: str = ""

    @classmethod
    def build(
        cls, family: OpFamily, spec: OpSpec, launcher: Launcher, variant: str, config: Config, source_hash: str = ""
    ) -> KernelRunner:
        """The runner of ``launcher`` for calls with exactly ``spec``'s inputs."""
        first = spec.inputs[0]
        outputs = tuple((t.shape, t.torch_dtype) for t in family.output_specs(spec))
        like = tuple(first.is_contiguous and t.shape == first.shape and t.dtype == first.dtype
                     for t in family.output_specs(spec))
        return cls(launcher, outputs, variant, config, like, source_hash)

    def __call__(self, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        first = inputs[0]
        if self.like_first_input == (True,):  # the common case, one output like the input
            outs = [torch.empty_like(first)]
        else:
            like = self.like_first_input or (False,) * len(self.outputs)
            outs = [
                torch.empty_like(first) if same else torch.empty(shape, dtype=dtype, device=first.device)
                for (shape, dtype), same in zip(self.outputs, like, strict=True)
            ]
        self.launcher(inputs, outs)
        return outs


class KernelFunction(torch.autograd.Function):
    """A tuned forward and a tuned backward as one autograd node.

    The forward family says how its backward is fed (``backward_inputs``: by default
    ``(dy, *inputs)``) and which input each gradient belongs to (``input_gradients``); gradients
    accumulated in float32 (weights) are cast here to their input's dtype. Returns the forward's
    single output, or a tuple when it has several.
    """

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        family: OpFamily,
        forward: Callable[[Sequence[torch.Tensor]], list[torch.Tensor]],
        backward: Callable[[Sequence[torch.Tensor]], list[torch.Tensor]],
        *inputs: torch.Tensor,
    ) -> torch.Tensor | tuple[torch.Tensor, ...]:
        outputs = forward(inputs)
        ctx.save_for_backward(*inputs, *outputs)
        ctx.family, ctx.backward_runner, ctx.input_count = family, backward, len(inputs)
        return outputs[0] if len(outputs) == 1 else tuple(outputs)

    @staticmethod
    def backward(ctx: Any, *grad_outputs: torch.Tensor) -> tuple[torch.Tensor | None, ...]:  # type: ignore[override]
        saved = ctx.saved_tensors
        inputs, outputs = saved[: ctx.input_count], saved[ctx.input_count :]
        grad_outputs = tuple(g.contiguous() for g in grad_outputs)
        grads = ctx.backward_runner(ctx.family.backward_inputs(grad_outputs, inputs, outputs))
        per_input = ctx.family.input_gradients(grads, inputs)
        cast = [
            g.to(t.dtype) if g is not None and ctx.needs_input_grad[i + 3] else None
            for i, (g, t) in enumerate(zip(per_input, inputs, strict=True))
        ]
        return (None, None, None, *cast)


def build_runner(family: OpFamily, spec: OpSpec, decision: DecisionRecord, db: Any = None) -> KernelRunner:
    """The runner of a "kernel" decision for ``spec`` (the exact call, not its bucket).

    A built-in variant is built from the package; any other variant name is a kernel written
    outside the package, loaded from its source in the database ``db`` (default: the default
    database) by :func:`load_stored_source` (see the module docstring for why that is trusted).
    Raises LookupError when the stored variant no longer exists or its source changed since it
    was measured: a decision is only as good as the code it was measured on. Also, before any
    stored text is read (DESIGN.md rule 13), for an imported claim not validated here
    (:func:`refuse_unservable`) and for a kernel source this user has not trusted
    (:func:`refuse_untrusted_source`).
    """
    config = Config(decision.config)
    failed = servecheck.disabled(decision.workload, decision.variant, decision.source_hash, decision.config)
    if failed:
        raise LookupError(f"{family.name}/{decision.variant} is disabled here by a failed serve check: {failed}")
    if decision.variant not in {v.name for v in family.variants}:
        refuse_untrusted_source(family.name, decision.source_hash, db)
        refuse_unservable(family.name, decision)
        build = load_stored_source(family.name, decision.source_hash, db)
        return KernelRunner.build(family, spec, build(spec, config), decision.variant, config, decision.source_hash)
    refuse_unservable(family.name, decision)
    variant = family.variant(decision.variant)
    if decision.source_hash and decision.source_hash != variant.source_hash:
        raise LookupError(f"{family.name}/{variant.name} changed since it was tuned (source hash differs)")
    return KernelRunner.build(family, spec, variant.build(spec, config), variant.name, config, decision.source_hash)


def refuse_unservable(op: str, decision: DecisionRecord) -> None:
    """Raise LookupError (saying what to run) unless ``decision`` was measured here or is an
    imported claim validated here (DESIGN.md rule 13)."""
    if decision.servable:
        return
    if decision.validation_error:
        why = f"its validation here failed: {decision.validation_error}"
    else:
        why = "it is an imported claim not validated on this machine; run `kernelsmith db validate`"
    raise LookupError(f"{op}: the stored decision for {decision.workload} is not served: {why}")


def refuse_untrusted_source(op: str, source_hash: str, db: Any = None) -> None:
    """Raise LookupError unless this user trusts the kernel source ``source_hash`` (stored by
    the tuner after the harness passed it here, or trusted with ``kernelsmith db trust``; see
    :mod:`kernelsmith.db.trust`). Called before the text is parsed or loaded at all."""
    database = open_database(db)
    try:
        record = database.variant_source(source_hash) if source_hash else None
    finally:
        if database is not db:
            database.close()
    if record is None:
        raise LookupError(f"{op}: no stored source for variant {source_hash or '(no hash)'} in the database")
    if not record.trusted:
        raise LookupError(
            f"{op}: kernel source {source_hash} ({record.origin}) is not trusted by this user; review it "
            f"with `kernelsmith db trust {source_hash}`"
        )


# Stored kernel files loaded in this process, by source hash: each is parsed and compiled once.
_SOURCE_BUILDS: dict[str, Callable[[OpSpec, Config], Launcher]] = {}
_SOURCE_LOCK = threading.Lock()


def load_stored_source(op: str, source_hash: str, db: Any = None) -> Callable[[OpSpec, Config], Launcher]:
    """The ``build`` of the kernel file stored under ``source_hash``.

    The text must still match its hash and be a kernel file that passes the gate
    (:func:`kernelsmith.evaluate.kernel_file.parse_kernel_file`); its kernels are launched by
    kernelsmith's launcher, so nothing in the text runs as host Python. Raises LookupError when
    there is no such source or it fails a check.
    """
    with _SOURCE_LOCK:
        if source_hash in _SOURCE_BUILDS:
            return _SOURCE_BUILDS[source_hash]
    from kernelsmith.evaluate.kernel_file import KernelFileError, parse_kernel_file

    database = open_database(db)
    try:
        source = database.get_variant_source(source_hash) if source_hash else None
    finally:
        if database is not db:
            database.close()
    if source is None:
        raise LookupError(f"{op}: no stored source for variant {source_hash or '(no hash)'} in the database")
    if variant_source_hash(source) != source_hash:
        raise LookupError(f"{op}: the stored source {source_hash} does not match its hash (edited?)")
    try:
        kernel_file = parse_kernel_file(source)
    except KernelFileError as exc:
        problems = "; ".join(exc.problems[:3])
        raise LookupError(f"{op}: the stored source {source_hash} is not a valid kernel file: {problems}") from None
    with _SOURCE_LOCK:
        build = _SOURCE_BUILDS.setdefault(source_hash, kernel_file.build)
    log.info("loaded stored kernel file %s for %s", source_hash, op)
    return build


def interpreter_enabled() -> bool:
    """Whether the user asked for kernels on CPU tensors through the Triton interpreter."""
    from kernelsmith import settings

    return settings.interpreter_requested()


def mode_for(tensors: Sequence[torch.Tensor]) -> str | None:
    """ "gpu" for CUDA tensors, "interpreter" for CPU tensors when enabled, else None."""
    devices = {t.device.type for t in tensors}
    if devices == {"cuda"}:
        return "gpu"
    if devices == {"cpu"} and interpreter_enabled():
        return "interpreter"
    return None


def lookup_decision(db: Database, mode: str, family: OpFamily, spec: OpSpec) -> DecisionRecord | None:
    """The decision serving a call of ``spec``: the one stored for its exact workload (what
    ``kernelsmith.tune`` stores for the example inputs it was given), else its bucket's (what the
    front doors tune), so a workload tuned ahead of time for 30 rows is served to 30-row calls."""
    if family.bucket(spec) != spec:
        exact = stored_decision(db, mode, spec)
        if exact is not None:
            return exact
    return stored_decision(db, mode, family.bucket(spec))


def lookup_or_revalidate(db: Database, mode: str, family: OpFamily, spec: OpSpec) -> DecisionRecord | None:
    """:func:`lookup_decision`; where this machine's fingerprint has no decision for the call's
    workload nor its bucket, a kernel decision stored under a *near* fingerprint (another driver
    build or kernelsmith release) is first re-validated and re-timed here and stored under this
    one, by the tuner's own carry-over (``tune_spec(database_only=True)``, as the decorator's
    database-only mode does: nothing is searched). So the compile backend and
    ``kernelsmith::kernel`` keep serving a cache across an upgrade, as the decorator does.

    Re-validation is an optimization: a failure is logged and the call is served as untuned."""
    decision = lookup_decision(db, mode, family, spec)
    if decision is not None:
        return decision
    fp = current_fingerprint(mode)
    bucket = family.bucket(spec)
    for workload in (spec, bucket) if bucket != spec else (bucket,):  # the exact workload first, as above
        if not db.near_decisions(fp, workload.workload_hash):
            continue
        from kernelsmith.tuner import tune_spec

        try:
            tune_spec(workload, db=db, mode=mode, database_only=True, require_tuned=False)
        except Exception as exc:  # workers that cannot start, a broken record: served as untuned
            log.warning("re-validating the near fingerprint's record of %s failed: %s: %s", workload.describe(),
                        type(exc).__name__, exc)
            continue
        decision = stored_decision(db, mode, workload)
        if decision is not None:
            return decision
    return None


def stored_decision(db: Database, mode: str, bucket: OpSpec) -> DecisionRecord | None:
    """The decision stored for ``bucket`` on this machine in ``mode``, claims included: a claim
    not validated here is returned (so the front doors do not tune over it) and then refused by
    :func:`build_runner`, which makes them run the user's function."""
    decision = db.get_decision(current_fingerprint(mode).hash, bucket.workload_hash)
    if decision is not None and not decision.servable:
        log.debug("decision for %s is a claim in state %s", bucket.workload_hash, decision.claim_state)
    return decision


# ---- serve checks against the op's PyTorch reference ---------------------------------------------
class CheckedRunner:
    """A runner served with checks (DESIGN.md rule 12, :mod:`kernelsmith.servecheck`) against
    the op family's PyTorch reference: by ``kernelsmith::kernel`` for each call key, and as a
    decorated function's tuned backward.

    Its first calls and a secret sample of later ones are compared on their real inputs; after a
    failed check it runs the reference (``runner`` becomes None) and ``on_failure`` is told.
    """

    def __init__(
        self,
        runner: KernelRunner,
        op: str,
        constants: str,
        policy: servecheck.CheckPolicy,
        mode: str,
        db: Any = None,
        where: str = "kernelsmith::kernel",
        on_failure: Callable[[], None] | None = None,
    ) -> None:
        self.runner: KernelRunner | None = runner
        self.op, self.constants, self._on_failure = op, constants, on_failure
        self.check = servecheck.ServeCheck(policy, where, mode, db, self._disable) if policy.enabled else None

    def __call__(self, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        check = self.check
        if check is not None:
            check.countdown -= 1
            if check.countdown <= 0 and check.due():
                return self._checked(check, inputs)
        runner = self.runner
        if runner is None:
            return _reference(self.op, inputs, self.constants)
        return runner(inputs)

    def _checked(self, check: servecheck.ServeCheck, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        runner = self.runner
        assert runner is not None  # a failed check is never due again
        family, spec = _spec_of(self.op, inputs, self.constants)

        def reference64(clones: Sequence[torch.Tensor]) -> Sequence[torch.Tensor]:
            with _autograd_inside_op():  # the references of backward families are autograd
                return [t.detach() for t in family.reference_fp64(spec, clones)]

        results, _ = check.run(
            family, spec, runner, inputs, lambda: _reference(self.op, inputs, self.constants), reference64,
            lambda: runner(inputs),
        )
        return list(results)

    def _disable(self, problem: str) -> None:
        self.runner = None
        if self._on_failure is not None:
            self._on_failure()


def _reference(op: str, inputs: Sequence[torch.Tensor], constants: str) -> list[torch.Tensor]:
    """The op family's PyTorch reference, as ``kernelsmith::kernel`` returns it (fresh tensors)."""
    family, spec = _spec_of(op, inputs, constants)
    with _autograd_inside_op():
        return [t.detach().clone() for t in family.reference(spec, inputs)]


# ---- the torch.library op ------------------------------------------------------------------------
# Per call key: the checked runner serving it, or None where the op's PyTorch reference runs.
_RUNNERS: dict[tuple[Any, ...], CheckedRunner | None] = {}
_RUNNERS_LOCK = threading.Lock()


def _spec_of(op: str, inputs: Sequence[torch.Tensor], constants: str) -> tuple[OpFamily, OpSpec]:
    family = get_op(op)
    spec = family.spec_for(*inputs, **json.loads(constants))
    written = family.written_inputs(spec)
    if written:  # (decode attention's write_kv: the fused cache write is not served through this op yet)
        raise UnsupportedWorkload(f"{op}: this workload writes its inputs {list(written)}, and kernelsmith::kernel "
                                  "is declared without mutations (torch.compile would not see the write)")  # fmt: skip
    return family, spec


def _served(
    key: tuple[Any, ...], runner: KernelRunner, op: str, constants: str, mode: str, db: Any = None
) -> CheckedRunner:
    """``runner`` as ``kernelsmith::kernel`` serves it for ``key``: checked, and replaced in the
    table by the reference when a check fails (the policy is read from the environment now)."""

    def fall_back() -> None:
        with _RUNNERS_LOCK:
            _RUNNERS[key] = None

    return CheckedRunner(runner, op, constants, servecheck.CheckPolicy.resolve(), mode, db, on_failure=fall_back)


def _runner_key(
    op: str, inputs: Sequence[torch.Tensor], constants: str, device: torch.device | None = None, decisions: str = ""
) -> tuple[Any, ...]:
    return (op, constants, decisions, *((tuple(t.shape), t.dtype, t.stride(), device or t.device) for t in inputs))


def install_runner(
    op: str,
    inputs: Sequence[torch.Tensor],
    constants: str,
    runner: KernelRunner,
    device: torch.device | None = None,
    db: Any = None,
) -> None:
    """Serve ``runner`` to ``kernelsmith::kernel`` calls with exactly these inputs' shapes,
    dtypes, strides and device (``device`` overrides theirs: the compile backend installs from
    example tensors) in this process, with serve checks (a failure is recorded in ``db``);
    other calls resolve from the database as usual."""
    key = _runner_key(op, inputs, constants, device)
    where = device or inputs[0].device
    mode = "gpu" if where.type == "cuda" else "interpreter"
    with _RUNNERS_LOCK:
        _RUNNERS[key] = _served(key, runner, op, constants, mode, db)


def runner_for(op: str, inputs: Sequence[torch.Tensor], constants: str, decisions: str = "") -> CheckedRunner | None:
    """The (checked) runner ``kernelsmith::kernel`` uses for these inputs: installed, or built
    from the decision ``decisions`` carry for their bucket, or from the stored decision (cached),
    or None when the op's PyTorch reference must run."""
    key = _runner_key(op, inputs, constants, decisions=decisions)
    if key in _RUNNERS:
        return _RUNNERS[key]
    runner: CheckedRunner | None = None
    mode = mode_for(inputs)
    try:
        family, spec = _spec_of(op, inputs, constants)
        if mode is not None:
            runner = _carried_runner(key, family, spec, constants, mode, decisions)
            if runner is None:
                with open_database() as db:
                    decision = lookup_or_revalidate(db, mode, family, spec)
                if decision is not None and decision.winner == "kernel":
                    runner = _served(key, build_runner(family, spec, decision), op, constants, mode)
    except (UnsupportedWorkload, LookupError, KeyError) as exc:
        log.info("kernelsmith::kernel(%s) uses the PyTorch reference: %s", op, exc)
    except DatabaseError as exc:  # a broken cache is not a broken program
        warn_unusable_database(exc)
    with _RUNNERS_LOCK:
        _RUNNERS[key] = runner
    return runner


def _carried_runner(
    key: tuple[Any, ...], family: OpFamily, spec: OpSpec, constants: str, mode: str, decisions: str
) -> CheckedRunner | None:
    """The runner of the decision the graph carries for ``spec`` (its exact workload, else its
    bucket), or None. A carried decision that cannot be built here (a kernel file, whose source
    lives in a database; a variant changed since) is logged and the database is asked instead."""
    if not decisions:
        return None
    entry = carried_entry(decisions, mode, family, spec)
    if entry is None:
        return None
    try:
        runner = build_runner(family, spec, entry)
    except LookupError as exc:
        log.info("kernelsmith::kernel(%s): the carried decision is not used: %s", family.name, exc)
        return None
    return _served(key, runner, family.name, constants, mode)


def run_kernel(op: str, inputs: Sequence[torch.Tensor], constants: str, decisions: str = "") -> list[torch.Tensor]:
    """The implementation of ``kernelsmith::kernel`` (:mod:`kernelsmith.frontends.torch_op`)."""
    runner = runner_for(op, inputs, constants, decisions)
    if runner is None:
        return _reference(op, inputs, constants)
    return runner(inputs)


# ---- decisions a graph carries ------------------------------------------------------------------
# Format version of the ``decisions`` string; a string of another version is ignored (logged).
DECISIONS_VERSION = 1
_CONFIG_VALUES = (int, float, str, bool)


def encode_decisions(records: Sequence[DecisionRecord], mode: str) -> str:
    """The ``decisions`` argument of ``kernelsmith::kernel`` carrying ``records`` (kernel winners
    measured in ``mode``): per workload, its op, variant, variant source hash and config.

    Plain JSON of strings and numbers; :func:`parse_decisions` reads it back field by field.
    """
    entries = [
        {"mode": mode, "workload": r.workload, "op": r.op, "variant": r.variant, "source_hash": r.source_hash,
         "config": dict(r.config)}
        for r in sorted(records, key=lambda r: (r.op, r.workload))
        if r.winner == "kernel"
    ]
    if not entries:
        return ""
    return json.dumps({"kernelsmith_decisions": DECISIONS_VERSION, "entries": entries}, sort_keys=True,
                      separators=(",", ":"))


@functools.lru_cache(maxsize=256)
def parse_decisions(text: str) -> dict[tuple[str, str], DecisionRecord]:
    """The decisions of a ``decisions`` string by (mode, workload hash); entries that are not
    exactly the shape :func:`encode_decisions` writes are dropped (and logged), never guessed at."""
    try:
        data = json.loads(text)
    except ValueError as exc:
        log.warning("kernelsmith::kernel: ignoring a decisions string that is not JSON: %s", exc)
        return {}
    if not isinstance(data, dict) or data.get("kernelsmith_decisions") != DECISIONS_VERSION:
        log.warning("kernelsmith::kernel: ignoring decisions of an unknown format version")
        return {}
    found: dict[tuple[str, str], DecisionRecord] = {}
    for entry in data.get("entries", ()):
        record = _carried_record(entry)
        if record is None:
            log.warning("kernelsmith::kernel: ignoring a malformed carried decision: %.200r", entry)
            continue
        found[(entry["mode"], record.workload)] = record
    return found


def carried_entry(decisions: str, mode: str, family: OpFamily, spec: OpSpec) -> DecisionRecord | None:
    """The decision of a ``decisions`` string that serves ``spec`` measured in ``mode``: its
    exact workload's, else its bucket's, else a config pinned for every shape; None when none."""
    carried = parse_decisions(decisions)
    return (
        carried.get((mode, spec.workload_hash))
        or carried.get((mode, family.bucket(spec).workload_hash))
        or carried.get((mode, pinned_workload(family.name)))
    )


def _carried_record(entry: Any) -> DecisionRecord | None:
    names = ("mode", "workload", "op", "variant", "source_hash")
    if not isinstance(entry, dict) or set(entry) != {*names, "config"}:
        return None
    if not all(isinstance(entry[n], str) for n in names) or not isinstance(entry["config"], dict):
        return None
    config = entry["config"]
    if not all(isinstance(k, str) and isinstance(v, _CONFIG_VALUES) for k, v in config.items()):
        return None
    return DecisionRecord("carried", entry["workload"], entry["op"], {}, "kernel", entry["variant"],
                          entry["source_hash"], dict(config), origin="carried")


def pinned_workload(op: str) -> str:
    """The workload name of a decision that serves every shape of ``op`` (a config pinned in
    code: ``@kernelsmith.optimize(config=...)``)."""
    return f"{op}:*"


def carried_winners(
    db: Database, family: OpFamily, spec: OpSpec, mode: str, compare_dtypes: bool = True,
    fingerprint: str | None = None,
) -> list[DecisionRecord]:
    """Every stored winner a graph can carry for ``family`` with ``spec``'s constants (and input
    dtypes) on this machine in ``mode`` (or under ``fingerprint``): one per tuned workload, each
    call's shape picks one."""
    wanted = json.loads(json.dumps(spec.to_dict()))  # the form stored specs have (lists, not tuples)
    dtypes = [t["dtype"] for t in wanted["inputs"]]

    def same(stored: dict[str, Any]) -> bool:
        if stored.get("constants") != wanted["constants"]:
            return False
        return not compare_dtypes or [t.get("dtype") for t in stored.get("inputs", [])] == dtypes

    records = db.decisions(fingerprint or current_fingerprint(mode).hash, family.name)
    return [r for r in records if embeddable(r, family) and same(r.spec)]


# (fingerprint, workload) pairs whose near fingerprint's records this process re-validated, or
# tried to: a record that does not re-validate is not tried again at every trace.
_NEAR_TRIED: set[tuple[str, str]] = set()
_NEAR_LOCK = threading.Lock()


def revalidate_near_winners(db: Database, family: OpFamily, spec: OpSpec, mode: str) -> None:
    """Re-validate here (:func:`lookup_or_revalidate`) every winner :func:`carried_winners` would
    find for ``spec`` under a *near* fingerprint (another driver build or kernelsmith release)
    for a workload this fingerprint has no decision for, once per process: a graph made after an
    upgrade then carries the winners of every bucket tuned before it, as the eager decorator
    serves them bucket by bucket. One tuner carry-over (a harness evaluation and a re-timing)
    per workload, once per upgrade."""
    fp = current_fingerprint(mode)
    here = {r.workload for r in db.decisions(fp.hash, family.name)}
    for other in db.fingerprints():
        if not fp.near(other):
            continue
        for record in carried_winners(db, family, spec, mode, fingerprint=other.hash):
            key = (fp.hash, record.workload)
            with _NEAR_LOCK:
                if record.workload in here or key in _NEAR_TRIED:
                    continue
                _NEAR_TRIED.add(key)
            lookup_or_revalidate(db, mode, family, OpSpec.from_dict(record.spec))


def embeddable(decision: DecisionRecord, family: OpFamily) -> bool:
    """Whether a graph can carry ``decision``: a servable kernel winner of a built-in variant
    (a kernel file's source lives in a database, with its trust, and is not carried)."""
    return (
        decision.winner == "kernel"
        and decision.servable
        and decision.variant in {v.name for v in family.variants}
    )


def _autograd_inside_op() -> contextlib.AbstractContextManager[Any]:
    """Autograd, re-enabled inside a custom op's body (where the dispatcher switches it off).

    The PyTorch references of the backward families *are* autograd (the gradient of the
    forward's formulation), so the reference fallback of ``kernelsmith::kernel`` needs it.
    """
    guard = getattr(torch._C, "_SetExcludeDispatchKeyGuard", None)
    if guard is None:  # an older torch: the references of forward families still work
        return contextlib.nullcontext()
    stack = contextlib.ExitStack()
    for key in ("AutogradFunctionality", "ADInplaceOrView"):
        stack.enter_context(guard(getattr(torch._C.DispatchKey, key), False))
    stack.enter_context(torch.enable_grad())
    return stack


def constants_json(constants: dict[str, Any]) -> str:
    return json.dumps(constants, sort_keys=True)

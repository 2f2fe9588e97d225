"""Imported records are claims: re-validating them on this machine, and trusting kernel sources.

DESIGN.md rule 13. A decision read from an export (or a colleague's database) says "on this
machine, this variant with this config is correct and faster". Nothing acts on that until this
machine checked it:

- :func:`validate_claims` runs each claim's variant and config through the harness in a worker
  process (the :class:`~kernelsmith.evaluate.pool.Evaluator` of the claim's fingerprint mode),
  exactly as a tuning candidate is validated, and stores the claim as validated or with the
  reason it failed. With ``retime`` a validated claim is measured again instead: a fresh tuning
  run here, which the ``auto`` strategy warm-starts from the claim (the nearest stored winner,
  at distance 0), so the decision finally stored is a local one. Claims measured on another
  machine (another fingerprint) cannot be checked here and just stay stored.
- :func:`trust_sources` is what ``kernelsmith db trust`` does once the user saw the text: the
  source must pass the kernel-file gate (docs/kernel-files.md: Triton device code and literal
  launch data only, so a Python module is refused whatever its hash), is then marked trusted
  by this user (:mod:`kernelsmith.db.trust`), and every decision here that names it is
  re-validated in a worker before the front doors serve it.

Nothing here loads a candidate's text in this process: validation happens in workers, and the
gate only reads the syntax tree.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from kernelsmith.db._base import Database
from kernelsmith.db.records import DecisionRecord, VariantSource

logger = logging.getLogger(__name__)

# How many lines of a source `kernelsmith db trust` shows before trusting it.
PREVIEW_LINES = 15
DEFAULT_RETIME_BUDGET = 10


@dataclass(frozen=True)
class ClaimOutcome:
    """What :func:`validate_claims` did with one decision.

    ``status``: ``"validated"``, ``"retimed"`` (a fresh local decision replaced the claim),
    ``"failed"`` (stored with ``detail`` as its validation error), or ``"skipped"`` (left as it
    was: another machine's claim, or one naming a source not trusted here; ``detail`` says which).
    """

    decision: DecisionRecord
    status: str
    detail: str = ""


def kernel_file_problem(source: str) -> str | None:
    """None when ``source`` is a kernel file the gate accepts, else why not (one line).

    The gate only reads the syntax tree (docs/kernel-files.md,
    :func:`kernelsmith.evaluate.kernel_file.check_kernel_file`); it never runs the text.
    """
    from kernelsmith.evaluate.kernel_file import check_kernel_file

    problems = check_kernel_file(source)
    if problems:
        more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
        return "not a kernel file: " + "; ".join(problems[:3]) + more
    return None


def this_machine_mode(fingerprint: str) -> str | None:
    """The mode (``"gpu"`` or ``"interpreter"``) in which this process has fingerprint
    ``fingerprint``, or None when it is another machine's (or this one's GPU is not visible)."""
    from kernelsmith.db.fingerprint import current_fingerprint

    for mode in ("interpreter", "gpu"):
        try:
            if current_fingerprint(mode).hash == fingerprint:
                return mode
        except RuntimeError:  # no CUDA: this process cannot have a GPU fingerprint
            continue
    return None


def pending_claims(db: Database) -> list[DecisionRecord]:
    """Decisions the front doors do not serve yet: unvalidated claims and failed validations."""
    return [d for d in db.decisions() if not d.servable]


def describe_source(record: VariantSource, lines: int = PREVIEW_LINES) -> str:
    """What the user is asked to trust: op, hash, origin, and the first lines of the text."""
    text = record.source.splitlines()
    shown = "\n".join(f"    {line}" for line in text[:lines])
    more = f"\n    ... ({len(text) - lines} more lines)" if len(text) > lines else ""
    return f"{record.op} kernel source {record.source_hash} ({record.origin}, {len(text)} lines):\n{shown}{more}"


def validate_claims(
    db: Database,
    decisions: Iterable[DecisionRecord],
    *,
    retime: bool = False,
    budget: int = DEFAULT_RETIME_BUDGET,
    workers: int | None = None,
) -> list[ClaimOutcome]:
    """Re-validate ``decisions`` on this machine (see the module docstring); stores the results
    and returns one :class:`ClaimOutcome` per decision, in order."""
    outcomes: dict[int, ClaimOutcome] = {}
    by_mode: dict[str, list[tuple[int, DecisionRecord]]] = {}
    for index, decision in enumerate(decisions):
        mode = this_machine_mode(decision.fingerprint)
        if mode is None:
            outcomes[index] = ClaimOutcome(decision, "skipped", "measured on another machine: kept stored as a claim")
        else:
            by_mode.setdefault(mode, []).append((index, decision))
    for mode, items in by_mode.items():
        outcomes.update(_validate_in_mode(db, mode, items, workers))
        if retime:
            for index, _ in items:
                if outcomes[index].status == "validated":
                    outcomes[index] = _retime(db, mode, outcomes[index].decision, budget, workers)
    return [outcomes[i] for i in sorted(outcomes)]


def _validate_in_mode(
    db: Database, mode: str, items: Sequence[tuple[int, DecisionRecord]], workers: int | None
) -> dict[int, ClaimOutcome]:
    """Validate the claims of one mode, with one pool of workers started only if a claim needs it."""
    from kernelsmith.evaluate.pool import Evaluator
    from kernelsmith.evaluate.protocol import Candidate
    from kernelsmith.spec import OpSpec

    outcomes: dict[int, ClaimOutcome] = {}
    to_run: list[tuple[int, DecisionRecord, Any, Candidate]] = []
    for index, decision in items:
        prepared = candidate_of(db, decision)
        if isinstance(prepared, ClaimOutcome):
            outcomes[index] = _store(db, prepared)
        elif prepared is None:  # a baseline decision: none of its code ever runs in the user's process
            outcomes[index] = _store(db, ClaimOutcome(decision, "validated", "baseline wins: nothing to run"))
        else:
            to_run.append((index, decision, OpSpec.from_dict(decision.spec), prepared))
    if not to_run:
        return outcomes
    with Evaluator(mode, workers) as evaluator:
        futures = [(i, d, evaluator.submit(spec, c, measure=False)) for i, d, spec, c in to_run]
        for index, decision, future in futures:
            result = future.result()
            if not result.ok:
                outcome = ClaimOutcome(decision, "failed", f"{result.status}: {result.error}"[:2000])
            elif decision.source_hash and result.source_hash != decision.source_hash:
                outcome = ClaimOutcome(decision, "failed", f"the variant's source hash is {result.source_hash}, "
                                       f"not the claimed {decision.source_hash}")
            else:
                outcome = ClaimOutcome(decision, "validated", "passed the harness here")
            outcomes[index] = _store(db, outcome)
    return outcomes


def candidate_of(db: Database, decision: DecisionRecord) -> Any:
    """The candidate that checks ``decision``, None for a baseline decision, or the
    :class:`ClaimOutcome` that settles it without running anything: an unknown family, a
    built-in variant whose source here differs from the one measured (its source hash), an
    outside kernel not stored, not trusted or not a kernel file. Used for imported claims and
    for records of a near fingerprint carried over by the tuner."""
    from kernelsmith.evaluate.protocol import Candidate
    from kernelsmith.ops import get_op
    from kernelsmith.space import Config

    if decision.winner != "kernel":
        return None
    try:
        family = get_op(decision.op)
    except (KeyError, ValueError) as exc:
        return ClaimOutcome(decision, "failed", f"unknown op family: {exc}")
    config = Config(decision.config)
    if decision.variant in {v.name for v in family.variants}:
        variant = family.variant(decision.variant)
        if decision.source_hash and decision.source_hash != variant.source_hash:
            return ClaimOutcome(decision, "failed", f"{family.name}/{variant.name} here differs from the one "
                                "the claim was measured on (source hash)")
        return Candidate(variant.name, config)
    record = db.variant_source(decision.source_hash)
    if record is None:
        return ClaimOutcome(decision, "failed", f"no kernel source {decision.source_hash or '(no hash)'} is stored")
    if not record.trusted:
        return ClaimOutcome(decision, "skipped", f"names kernel source {record.source_hash}, not trusted here: "
                            f"review it with `kernelsmith db trust {record.source_hash}`")
    problem = kernel_file_problem(record.source)
    if problem:
        return ClaimOutcome(decision, "failed", problem)
    return Candidate(decision.variant, config, record.source)


def _store(db: Database, outcome: ClaimOutcome) -> ClaimOutcome:
    """Store a validation result on the claim, unless the decision changed meanwhile (a local
    tuning run replaced it); returns the outcome with the decision as stored."""
    if outcome.status == "skipped":
        return outcome
    claim = outcome.decision
    current = db.get_decision(claim.fingerprint, claim.workload)
    if current is None or current.created_at != claim.created_at or current.variant != claim.variant:
        return ClaimOutcome(current or claim, "skipped", "replaced by another decision meanwhile")
    ok = outcome.status == "validated"
    stored = replace(claim, validated=ok, validation_error="" if ok else outcome.detail or "failed")
    db.put_decision(stored)
    logger.info("claim %s/%s on %s: %s %s", claim.op, claim.workload, claim.fingerprint, outcome.status, outcome.detail)
    return replace(outcome, decision=stored)


def _retime(db: Database, mode: str, decision: DecisionRecord, budget: int, workers: int | None) -> ClaimOutcome:
    """A fresh local decision for a validated claim's workload, warm-started from the claim."""
    from kernelsmith.spec import OpSpec
    from kernelsmith.tuner import tune_spec

    # The claim steps aside while its workload is tuned (tune_spec returns a servable stored
    # decision as it is); it stays the warm start, and comes back if tuning fails.
    db.put_decision(replace(decision, validated=False))
    try:
        tune_spec(OpSpec.from_dict(decision.spec), budget=budget, db=db, mode=mode, workers=workers)
    except Exception as exc:  # the claim stays validated; a failed re-timing is reported, not raised
        db.put_decision(decision)
        return ClaimOutcome(decision, "validated", f"re-timing failed: {type(exc).__name__}: {exc}")
    fresh = db.get_decision(decision.fingerprint, decision.workload) or decision
    return ClaimOutcome(fresh, "retimed", f"measured here: {fresh.winner} {fresh.variant} {fresh.config}".strip())


def trust_sources(
    db: Database, source_hashes: Sequence[str], *, validate: bool = True, workers: int | None = None
) -> tuple[dict[str, str], list[ClaimOutcome]]:
    """Trust the stored sources ``source_hashes`` that pass the kernel-file gate (the caller has
    shown them to the user), then re-validate every decision here that names one of them.

    Returns ``{hash: problem or ""}`` (``""``: trusted) and the validation outcomes. The
    decisions naming a newly trusted source are marked unvalidated first, so none is served on
    the strength of the trust alone; with ``validate=False`` they wait for
    ``kernelsmith db validate``.
    """
    problems: dict[str, str] = {}
    for source_hash in source_hashes:
        record = db.variant_source(source_hash)
        if record is None:
            problems[source_hash] = "no such kernel source is stored"
            continue
        problem = kernel_file_problem(record.source)
        if problem:
            problems[source_hash] = problem
            continue
        db.trust_variant_source(source_hash)
        problems[source_hash] = ""
        logger.info("trusted %s kernel source %s", record.op, source_hash)
    trusted = {h for h, p in problems.items() if not p}
    naming = [d for d in db.decisions() if d.source_hash in trusted and d.winner == "kernel"]
    naming = [_unvalidated(db, d) for d in naming]
    outcomes = validate_claims(db, naming, workers=workers) if validate else []
    return problems, outcomes


def _unvalidated(db: Database, decision: DecisionRecord) -> DecisionRecord:
    stored = replace(decision, validated=False, validation_error="")
    db.put_decision(stored)
    return stored

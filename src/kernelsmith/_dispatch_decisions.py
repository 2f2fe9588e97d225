"""Which decision serves a call: stored in the database, or carried by a graph.

Part of :mod:`kernelsmith.dispatch`, which re-exports every public name here.

Stored decisions. A call runs in a mode (:func:`mode_for`: "gpu" for CUDA tensors, "interpreter"
for CPU tensors when the user asked for the Triton interpreter) and is served the decision stored
under this machine's fingerprint for its exact workload, else for its bucket
(:func:`lookup_decision`); where there is none, one stored under a *near* fingerprint (another
driver build or kernelsmith release) is re-validated and re-timed here first
(:func:`lookup_or_revalidate`).

Carried decisions. A torch.compile graph or an exported program carries its kernels' decisions in
the ``decisions`` argument of ``kernelsmith::kernel``: :func:`encode_decisions` writes that plain
JSON, :func:`parse_decisions` reads it back field by field, :func:`carried_entry` picks the one
serving a call, and :func:`carried_winners` lists what a graph made here can carry (kernel
winners of built-in variants only, :func:`embeddable`).
"""

from __future__ import annotations

import functools
import json
import logging
import threading
from collections.abc import Sequence
from typing import Any

import torch

from kernelsmith.db import Database, DecisionRecord, current_fingerprint
from kernelsmith.ops import OpFamily
from kernelsmith.spec import OpSpec

log = logging.getLogger("kernelsmith.dispatch")  # this code's logger in dispatch.py, before the split


# ---- decisions stored in the database ------------------------------------------------------------
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
    :func:`kernelsmith.dispatch.build_runner`, which makes them run the user's function."""
    decision = db.get_decision(current_fingerprint(mode).hash, bucket.workload_hash)
    if decision is not None and not decision.servable:
        log.debug("decision for %s is a claim in state %s", bucket.workload_hash, decision.claim_state)
    return decision


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


def revalidate_near_winners(
    db: Database, family: OpFamily, spec: OpSpec, mode: str, compare_dtypes: bool = True
) -> None:
    """Re-validate here (:func:`lookup_or_revalidate`) every winner :func:`carried_winners` would
    find for ``spec`` under a *near* fingerprint (another driver build or kernelsmith release)
    for a workload this fingerprint has no decision for, once per process: a graph made after an
    upgrade then carries the winners of every bucket tuned before it, as the eager decorator
    serves them bucket by bucket. One tuner carry-over (a harness evaluation and a re-timing)
    per workload, once per upgrade.

    A training graph asks this for its backward family too, with the forward call's ``spec``
    and ``compare_dtypes=False``: the backward's inputs (gradients, saved tensors) are not the
    forward's, so its winners are matched on the constants alone, as the graph then carries
    them (:func:`carried_winners`). A record that fails validation or loses the re-timing is
    not stored here, so the graph does not carry it."""
    fp = current_fingerprint(mode)
    here = {r.workload for r in db.decisions(fp.hash, family.name)}
    for other in db.fingerprints():
        if not fp.near(other):
            continue
        for record in carried_winners(db, family, spec, mode, compare_dtypes=compare_dtypes, fingerprint=other.hash):
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

"""Export and import a database as JSON lines: for sharing results and for backups.

JSON lines rather than a copy of the SQLite file because it diffs, greps and merges: results
from several machines can be concatenated into one database, and a human can read what is in
it. The first line is a header naming the format and its version, so that a file written by a
newer kernelsmith is refused with a clear message instead of being half understood. Each
following line is one record with a ``"type"``: ``"fingerprint"``, ``"trial"``, ``"decision"``,
``"ceiling"`` or ``"variant_source"`` (the text of a kernel written outside the package, which
decisions naming it need; format version 2, written only when an export holds such records, so
older readers still take every other file).

Everything imported is a claim (DESIGN.md rule 13), whatever the file says about it:

- trials and ceilings are stored with ``origin="imported"``: shown, exported again, but never
  used in place of a measurement here (an imported failure does not stop a candidate from being
  measured, an imported ceiling does not move the plausibility check);
- decisions are stored unvalidated: the front doors serve none of them until this machine
  re-validated it (``kernelsmith db import`` does so at once unless ``--no-validate``; see
  :mod:`kernelsmith.db.claims`), and none replaces a decision measured here;
- kernel sources are stored untrusted: their text is checked against its hash, and nothing
  loads it until the user trusts it (``kernelsmith db trust``, :mod:`kernelsmith.db.trust`).

Import is idempotent: a trial already present (same fingerprint, workload, variant, source
hash, config and status) is skipped, decisions and ceilings are upserted (claims over claims),
so importing the same file twice changes nothing (sources are stored by content hash).
"""

from __future__ import annotations

import json
import logging
from dataclasses import replace
from typing import IO, Any

from kernelsmith.db._base import Ceiling, Database, DatabaseError
from kernelsmith.db.records import (
    IMPORTED,
    LOCAL,
    DecisionRecord,
    Fingerprint,
    TrialRecord,
    VariantSource,
    variant_source_hash,
)

logger = logging.getLogger(__name__)

FORMAT = "kernelsmith-jsonl"
FORMAT_VERSION = 2  # the newest this code reads; a file without variant sources is written as 1

RECORD_TYPES = ("fingerprint", "trial", "decision", "ceiling", "variant_source")

# Fields each record type must carry (the rest have defaults in the record classes).
_REQUIRED: dict[str, tuple[str, ...]] = {
    "fingerprint": tuple(Fingerprint.__dataclass_fields__),
    "trial": ("fingerprint", "workload", "op", "variant", "source_hash", "config", "status"),
    "decision": ("fingerprint", "workload", "op", "spec", "winner"),
    "ceiling": ("fingerprint", "name", "value"),
    "variant_source": ("source_hash", "op", "source"),
}


def _line(obj: dict[str, Any]) -> str:
    return json.dumps(obj, sort_keys=True, default=_default) + "\n"


def _default(obj: Any) -> Any:
    item = getattr(obj, "item", None)
    if callable(item):
        return item()
    raise TypeError(f"{type(obj).__name__} is not JSON serialisable")


def export_jsonl(
    db: Database,
    stream: IO[str],
    fingerprint: str | None = None,
    op: str | None = None,
) -> int:
    """Write the header and every matching record to ``stream``; returns the records written.

    ``fingerprint`` limits the export to one fingerprint hash, ``op`` to one op family (its
    trials and decisions; fingerprints and ceilings follow the fingerprints those reference).
    """
    from kernelsmith import __version__

    trials = db.trials(fingerprint=fingerprint, op=op)
    decisions = db.decisions(fingerprint=fingerprint, op=op)
    if fingerprint is not None:
        wanted: set[str] | None = {fingerprint}
    elif op is not None:
        wanted = {t.fingerprint for t in trials} | {d.fingerprint for d in decisions}
    else:
        wanted = None  # everything
    fingerprints = [f for f in db.fingerprints() if wanted is None or f.hash in wanted]
    ceilings = [c for c in db.ceilings() if wanted is None or c.fingerprint in wanted]
    # Outside kernel sources: those the exported trials and decisions name (all when unfiltered).
    named = None if wanted is None else {t.source_hash for t in trials} | {d.source_hash for d in decisions}
    sources = [v for v in db.variant_sources(op=op) if named is None or v.source_hash in named]

    version = 2 if sources else 1
    stream.write(_line({"type": "header", "format": FORMAT, "version": version,
                        "kernelsmith": __version__}))
    count = 0
    for f in fingerprints:
        stream.write(_line({"type": "fingerprint", "hash": f.hash, **f.to_dict()}))
        count += 1
    for t in trials:
        stream.write(_line({"type": "trial", **t.to_dict()}))
        count += 1
    for d in decisions:
        stream.write(_line({"type": "decision", **d.to_dict()}))
        count += 1
    for c in ceilings:
        stream.write(_line({"type": "ceiling", **c.to_dict()}))
        count += 1
    for v in sources:
        stream.write(_line({"type": "variant_source", **v.to_dict()}))
        count += 1
    logger.info("exported %d records (%d trials, %d decisions)", count, len(trials), len(decisions))
    return count


def _check_header(obj: Any, where: str) -> None:
    if not isinstance(obj, dict) or obj.get("type") != "header":
        raise DatabaseError(f"{where}: not a kernelsmith export (the first line is not a header)")
    if obj.get("format") != FORMAT:
        raise DatabaseError(f"{where}: format {obj.get('format')!r} is not {FORMAT!r}")
    version = obj.get("version")
    if not isinstance(version, int) or version < 1:
        raise DatabaseError(f"{where}: bad format version {version!r}")
    if version > FORMAT_VERSION:
        raise DatabaseError(
            f"{where}: written by kernelsmith {obj.get('kernelsmith', '?')} in format version "
            f"{version}, newer than the {FORMAT_VERSION} this kernelsmith reads; "
            "upgrade kernelsmith"
        )


def _parse(obj: Any, where: str) -> tuple[str, Any]:
    if not isinstance(obj, dict):
        raise DatabaseError(f"{where}: expected a JSON object")
    kind = obj.get("type")
    if kind not in RECORD_TYPES:
        raise DatabaseError(f"{where}: unknown record type {kind!r}")
    missing = [k for k in _REQUIRED[kind] if k not in obj]
    if missing:
        raise DatabaseError(f"{where}: {kind} record lacks {', '.join(missing)}")
    data = {k: v for k, v in obj.items() if k != "type"}
    try:
        if kind == "fingerprint":
            fp = Fingerprint.from_dict(data)
            stored_hash = data.get("hash")
            if stored_hash is not None and stored_hash != fp.hash:
                raise DatabaseError(
                    f"{where}: fingerprint hash {stored_hash} does not match its fields")
            return kind, fp
        if kind == "trial":
            return kind, TrialRecord.from_dict(data)
        if kind == "decision":
            return kind, DecisionRecord.from_dict(data)
        if kind == "variant_source":
            source = VariantSource.from_dict(data)
            if not isinstance(source.source, str) or variant_source_hash(source.source) != source.source_hash:
                raise DatabaseError(f"{where}: variant source hash {source.source_hash} does not match its text")
            return kind, source
        return kind, Ceiling.from_dict(data)
    except (TypeError, ValueError) as e:
        raise DatabaseError(f"{where}: bad {kind} record: {e}") from e


def read_jsonl(stream: IO[str]) -> list[tuple[str, Any]]:
    """Parse and check a whole export: ``(type, record)`` pairs, records as the file has them.

    Raises :class:`DatabaseError` naming the line of the first problem, so a malformed file is
    refused before anything is stored.
    """
    name = getattr(stream, "name", "<stream>")
    records: list[tuple[str, Any]] = []
    seen_header = False
    for lineno, raw in enumerate(stream, start=1):
        if not raw.strip():
            continue
        where = f"{name}, line {lineno}"
        try:
            obj = json.loads(raw)
        except json.JSONDecodeError as e:
            raise DatabaseError(f"{where}: invalid JSON: {e.msg}") from e
        if not seen_header:
            _check_header(obj, where)
            seen_header = True
            continue
        if isinstance(obj, dict) and obj.get("type") == "header":
            _check_header(obj, where)  # concatenated exports: each part has its own header
            continue
        records.append(_parse(obj, where))
    if not seen_header:
        raise DatabaseError(f"{name}: empty, not a kernelsmith export")
    return records


def import_jsonl(db: Database, stream: IO[str]) -> dict[str, int]:
    """Read an export from ``stream`` into ``db`` as claims; returns counts by record type.

    The whole stream is validated before anything is written, so a malformed file imports
    nothing. See :func:`import_records` for the counts.
    """
    return import_records(db, read_jsonl(stream))


def import_records(db: Database, records: list[tuple[str, Any]]) -> dict[str, int]:
    """Store records read by :func:`read_jsonl` as claims (see the module docstring).

    The counts are of records actually stored, under ``"fingerprint"``, ``"trial"``,
    ``"decision"``, ``"ceiling"`` and ``"variant_source"``, plus ``"duplicate_trial"`` for
    trials skipped because the database already held them and ``"kept_local_decision"`` for
    decisions skipped because this machine measured its own.
    """
    counts = dict.fromkeys((*RECORD_TYPES, "duplicate_trial", "kept_local_decision"), 0)
    existing: dict[str, set[tuple[str, ...]]] = {}
    new_trials: list[TrialRecord] = []
    for kind, rec in records:
        if kind == "fingerprint":
            db.put_fingerprint(rec)
        elif kind == "trial":
            keys = existing.get(rec.fingerprint)
            if keys is None:
                stored = db.trials(fingerprint=rec.fingerprint)
                keys = existing[rec.fingerprint] = {_trial_key(t) for t in stored}
            key = _trial_key(rec)
            if key in keys:
                counts["duplicate_trial"] += 1
                continue
            keys.add(key)
            new_trials.append(replace(rec, origin=IMPORTED))
        elif kind == "decision":
            here = db.get_decision(rec.fingerprint, rec.workload)
            if here is not None and here.origin == LOCAL:
                counts["kept_local_decision"] += 1
                continue
            db.put_decision(as_claim(rec))
        elif kind == "variant_source":
            db.put_variant_source(rec.op, rec.source, origin=IMPORTED, trusted=False)
        else:
            db.put_ceiling(rec.fingerprint, rec.name, rec.value, rec.detail,
                           measured_at=rec.measured_at, origin=IMPORTED)
        if kind != "trial":
            counts[kind] += 1
    counts["trial"] = db.add_trials(new_trials)
    logger.info("imported %s", ", ".join(f"{v} {k}" for k, v in counts.items()))
    return counts


def as_claim(decision: DecisionRecord) -> DecisionRecord:
    """``decision`` as an imported, unvalidated claim, whatever the file said about it."""
    return replace(decision, origin=IMPORTED, validated=False, validation_error="")


def _trial_key(t: TrialRecord) -> tuple[str, ...]:
    return (t.workload, t.variant, t.source_hash, t.config_key, t.status)

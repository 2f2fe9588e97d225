"""What :func:`kernelsmith.dispatch.build_runner` may serve, and the stored kernel files it loads.

Part of :mod:`kernelsmith.dispatch` (its module docstring says why this is the trust decision it
is), which re-exports every name here. Before any stored text is read, a decision must be servable
here (:func:`refuse_unservable`: measured on this machine, or an imported claim validated on it,
DESIGN.md rule 13) and a kernel file's source must be trusted by this user
(:func:`refuse_untrusted_source`, :mod:`kernelsmith.db.trust`). :func:`load_stored_source` then
checks the text against its hash and the kernel-file gate, and keeps the parsed file's ``build``
for the rest of the process.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from kernelsmith.db import DecisionRecord, open_database, variant_source_hash
from kernelsmith.ops._base import Launcher
from kernelsmith.space import Config
from kernelsmith.spec import OpSpec

log = logging.getLogger("kernelsmith.dispatch")  # this code's logger in dispatch.py, before the split


def _read(db: Any, read: Callable[[Any], Any]) -> Any:
    """``read(database)`` on ``db`` (a path, a URL or an open database), closing what it opened."""
    database = open_database(db)
    try:
        return read(database)
    finally:
        if database is not db:
            database.close()


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
    record = _read(db, lambda database: database.variant_source(source_hash) if source_hash else None)
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

    source = _read(db, lambda database: database.get_variant_source(source_hash) if source_hash else None)
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

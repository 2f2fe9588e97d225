"""Stored winners for tests: a "kernel" decision for a workload, as a GPU tuning run would store it.

Interpreter timings never beat PyTorch, and a GPU test should not spend its minutes tuning, so
tests that exercise *serving* (the compile backend's replacements, a captured decode step) store
the decision directly: the first variant whose space has a config at the workload's bucket, with
that config (or a named variant and the first of its configs a predicate accepts).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from kernelsmith.db import DecisionRecord, current_fingerprint, open_database
from kernelsmith.ops import get_op
from kernelsmith.space import Config
from kernelsmith.spec import OpSpec


def store_kernel_decisions(db: Any, specs: Iterable[OpSpec], mode: str = "interpreter", variant: str | None = None,
                           where: Callable[[Config], bool] | None = None) -> None:  # fmt: skip
    """A "kernel" decision (speedup 1.5) for each spec's bucket on this machine in ``mode``: the
    first variant with a config there, or ``variant``; its first config, or the first ``where``
    accepts (a StopIteration when none does: the test asked for what the space does not hold)."""
    fingerprint = current_fingerprint(mode)
    with open_database(db) as database:
        database.put_fingerprint(fingerprint)
        for spec in specs:
            family = get_op(spec.op)
            bucket = family.bucket(spec)
            if variant is None:
                chosen, configs = next((v, c) for v in family.variants if (c := v.space(bucket).configs()))
            else:
                chosen = family.variant(variant)
                configs = chosen.space(bucket).configs()
            if where is not None:
                configs = (next(c for c in configs if where(c)),)
            database.put_decision(DecisionRecord(
                fingerprint.hash, bucket.workload_hash, spec.op, bucket.to_dict(), "kernel", chosen.name,
                chosen.source_hash, configs[0].to_dict(), {"speedup": 1.5}))  # fmt: skip

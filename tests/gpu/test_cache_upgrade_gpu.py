"""A cache survives a changed driver string on the GPU, where a kernel can really win.

GPU only. A workload is tuned for real; its decision is then copied into a fresh database under a
near fingerprint (another driver build), as a database written before a driver update holds it.
Tuning there in database-only mode must re-validate it (one harness evaluation, no search) and
re-time it against the baseline: stored as ``"revalidated"`` when it still wins, else not served.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from kernelsmith import tuner
from kernelsmith.db import current_fingerprint, open_database
from kernelsmith.ops import get_op
from kernelsmith.tuner import tune_spec

pytestmark = pytest.mark.gpu


def test_a_winner_of_an_older_driver_is_revalidated_and_served(tmp_path) -> None:
    spec = get_op("rmsnorm").spec((8192, 4096), "bf16")
    first = tune_spec(spec, budget=12, db=str(tmp_path / "before.db"), mode="gpu")
    if first.winner != "kernel":
        pytest.skip(f"no kernel beat the baseline for {spec.describe()} here: nothing to carry over")
    here = current_fingerprint("gpu")
    older = replace(here, driver=f"{here.driver} (older build)")
    with open_database(str(tmp_path / "before.db")) as db:
        decision = db.get_decision(here.hash, spec.workload_hash)
    assert decision is not None
    after = str(tmp_path / "after.db")
    with open_database(after) as db:
        db.put_fingerprint(older)
        db.put_decision(replace(decision, fingerprint=older.hash))

    result = tune_spec(spec, budget=12, db=after, mode="gpu", database_only=True)

    assert result.evaluations == 1  # the carried candidate only: no search
    with open_database(after) as db:
        stored = db.get_decision(here.hash, spec.workload_hash)
    if result.winner == "kernel":
        assert stored is not None and stored.strategy == tuner.REVALIDATED
        assert stored.metrics["revalidated_from"] == [older.hash]
        assert (stored.variant, stored.config) == (decision.variant, decision.config)
        again = tune_spec(spec, budget=12, db=after, mode="gpu", require_tuned=True)
        assert again.from_database and again.evaluations == 0
    else:  # the re-timing did not confirm the win (noise at a small margin): never served
        assert stored is None

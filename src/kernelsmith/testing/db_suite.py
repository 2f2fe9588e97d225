"""A reusable test suite every :class:`~kernelsmith.db.Database` implementation must pass.

Optuna's pattern: the expectations live here once, and each backend's test module subclasses
:class:`DatabaseSuite` and overrides the ``location`` fixture (and, when its databases are not
opened by :func:`~kernelsmith.db.open_database`, the :meth:`DatabaseSuite.open` method)::

    class TestSQLiteDatabase(DatabaseSuite):
        @pytest.fixture
        def location(self, tmp_path):
            return str(tmp_path / "suite.db")

Tests that need a second connection (persistence, several processes) are skipped for a backend
that sets ``persistent = False`` or ``multiprocess = False``. The multi-process test opens the
location with :func:`~kernelsmith.db.open_database` in each child, since children are spawned.

Layout: the records the tests write (and the processes that write them) are in
:mod:`~kernelsmith.testing._db_records`, importable from here as before.
"""

from __future__ import annotations

import io
import json
import multiprocessing as mp
import time
from collections.abc import Iterator
from dataclasses import replace
from typing import Any, ClassVar

import pytest

from kernelsmith.db import (
    Database,
    DatabaseError,
    current_fingerprint,
    open_database,
    variant_source_hash,
)
from kernelsmith.db.jsonl import export_jsonl, import_jsonl
from kernelsmith.testing._db_records import (
    GPU_FP,
    INTERP_FP,
    LOAD_CONFIGS,
    LOAD_WORKLOADS,
    LOAD_WRITERS,
    _claim_and_write,
    _load_checksum,
    _write_trials,
    make_decision,
    make_trial,
)


class DatabaseSuite:
    """Behaviour every Database must have. Subclass it and override ``location``."""

    persistent: ClassVar[bool] = True
    multiprocess: ClassVar[bool] = True

    @pytest.fixture
    def location(self) -> str:
        raise NotImplementedError("override the location fixture in the subclass")

    def open(self, location: str) -> Database:
        """Open the database at ``location`` (override for backends open_database doesn't know)."""
        return open_database(location)

    @pytest.fixture
    def db(self, location: str) -> Iterator[Database]:
        database = self.open(location)
        yield database
        database.close()

    # -- trials ------------------------------------------------------------------------------

    def test_add_find_trial(self, db: Database) -> None:
        rec = make_trial()
        db.add_trial(rec)
        found = db.find_trial(rec.fingerprint, rec.workload, rec.variant, rec.source_hash,
                              rec.config_key)
        assert found == rec
        assert db.find_trial(rec.fingerprint, rec.workload, rec.variant, rec.source_hash,
                             rec.config) == rec  # a config mapping works too
        # every part of the key matters
        assert db.find_trial(rec.fingerprint, rec.workload, rec.variant, "other",
                             rec.config_key) is None
        assert db.find_trial(rec.fingerprint, rec.workload, "other", rec.source_hash,
                             rec.config_key) is None
        assert db.find_trial(rec.fingerprint, "other", rec.variant, rec.source_hash,
                             rec.config_key) is None
        assert db.find_trial(rec.fingerprint, rec.workload, rec.variant, rec.source_hash,
                             "BLOCK=64,num_warps=4") is None

    def test_find_trial_returns_latest(self, db: Database) -> None:
        first = make_trial(status="timeout", error="took too long")
        second = make_trial(metrics={"median_us": 9.0})
        db.add_trial(first)
        db.add_trial(second)
        found = db.find_trial(first.fingerprint, first.workload, first.variant,
                              first.source_hash, first.config_key)
        assert found == second

    def test_trials_listing_and_filters(self, db: Database) -> None:
        recs = [
            make_trial(config={"BLOCK": 64}),
            make_trial(workload="w2", config={"BLOCK": 32}),
            make_trial(op="layernorm", workload="ln", config={"BLOCK": 16}),
            make_trial(fingerprint=GPU_FP.hash, config={"BLOCK": 8}),
            make_trial(config={"BLOCK": 256}),
        ]
        for r in recs:
            db.add_trial(r)
        assert db.trials() == recs  # insertion order
        assert db.trials(fingerprint=INTERP_FP.hash) == [recs[0], recs[1], recs[2], recs[4]]
        assert db.trials(workload="w2") == [recs[1]]
        assert db.trials(op="layernorm") == [recs[2]]
        assert db.trials(fingerprint=GPU_FP.hash, op="softmax") == [recs[3]]
        assert db.trials(fingerprint="nope") == []

    def test_add_trials_bulk(self, db: Database) -> None:
        recs = [make_trial(config={"BLOCK": b}) for b in (16, 32, 64)]
        assert db.add_trials(recs) == 3
        assert db.add_trials([]) == 0
        assert db.trials() == recs

    def test_failures_are_stored_and_found(self, db: Database) -> None:
        kinds = ("build", "validate", "runtime", "timeout", "crash", "cheat")
        for i, kind in enumerate(kinds):
            db.add_trial(make_trial(config={"BLOCK": i}, status=kind,
                                    error=f"{kind} failed\nline 2"))
        for i, kind in enumerate(kinds):
            found = db.find_trial(INTERP_FP.hash, "softmax:f16:4096x4096", "row", "src0",
                                  f"BLOCK={i}")
            assert found is not None
            assert found.status == kind
            assert not found.ok
            assert found.error == f"{kind} failed\nline 2"
            assert found.metrics == {}
        assert [t.status for t in db.trials()] == list(kinds)

    def test_trial_json_fields_round_trip(self, db: Database) -> None:
        rec = make_trial(config={"BLOCK": 128, "num_warps": 8, "flag": True, "name": "x"},
                         metrics={"median_us": 1.25, "q": [1.0, 2.0], "nested": {"a": None}})
        db.add_trial(rec)
        (back,) = db.trials()
        assert back == rec
        assert back.config_key == rec.config_key
        assert back.created_at == rec.created_at

    # -- decisions ---------------------------------------------------------------------------

    def test_decision_upsert_and_get(self, db: Database) -> None:
        assert db.get_decision(INTERP_FP.hash, "softmax:f16:4096x4096") is None
        first = make_decision(speedup=1.2)
        db.put_decision(first)
        assert db.get_decision(first.fingerprint, first.workload) == first
        other = make_decision(workload="ln", op="layernorm", winner="baseline", config={})
        db.put_decision(other)
        second = make_decision(speedup=1.9, config={"BLOCK": 256})
        db.put_decision(second)
        assert db.get_decision(first.fingerprint, first.workload) == second
        assert db.decisions() == [second, other]  # one per workload, first-decided order
        assert db.decisions(op="layernorm") == [other]
        assert db.decisions(fingerprint=INTERP_FP.hash, op="softmax") == [second]
        assert db.decisions(fingerprint="nope") == []

    # -- ceilings ----------------------------------------------------------------------------

    def test_ceilings(self, db: Database) -> None:
        assert db.get_ceiling(GPU_FP.hash, "copy_gbps") is None
        db.put_ceiling(GPU_FP.hash, "copy_gbps", 4100.5, {"bytes": 1 << 30})
        assert db.get_ceiling(GPU_FP.hash, "copy_gbps") == 4100.5
        assert db.get_ceiling(INTERP_FP.hash, "copy_gbps") is None
        assert db.get_ceiling(GPU_FP.hash, "other") is None
        db.put_ceiling(GPU_FP.hash, "copy_gbps", 4200.0)  # re-measured: the latest wins
        assert db.get_ceiling(GPU_FP.hash, "copy_gbps") == 4200.0
        (c,) = db.ceilings(GPU_FP.hash)
        assert (c.fingerprint, c.name, c.value, c.detail) == (GPU_FP.hash, "copy_gbps", 4200.0, {})
        assert db.ceilings(INTERP_FP.hash) == []

    # -- fingerprints ------------------------------------------------------------------------

    def test_fingerprint_round_trip(self, db: Database) -> None:
        assert db.get_fingerprint(GPU_FP.hash) is None
        for fp in (GPU_FP, INTERP_FP, current_fingerprint("interpreter")):
            db.put_fingerprint(fp)
            db.put_fingerprint(fp)  # idempotent
            assert db.get_fingerprint(fp.hash) == fp
        assert len(db.fingerprints()) == len({GPU_FP.hash, INTERP_FP.hash,
                                              current_fingerprint("interpreter").hash})

    def test_fingerprints_isolated(self, db: Database) -> None:
        """Interpreter results are never visible under a GPU fingerprint, nor the reverse."""
        assert GPU_FP.hash != INTERP_FP.hash
        interp_trial = make_trial(fingerprint=INTERP_FP.hash)
        db.add_trial(interp_trial)
        db.put_decision(make_decision(fingerprint=INTERP_FP.hash))
        db.put_ceiling(INTERP_FP.hash, "copy_gbps", 10.0)
        key = (interp_trial.workload, interp_trial.variant, interp_trial.source_hash,
               interp_trial.config_key)
        assert db.find_trial(GPU_FP.hash, *key) is None
        assert db.trials(fingerprint=GPU_FP.hash) == []
        assert db.get_decision(GPU_FP.hash, interp_trial.workload) is None
        assert db.decisions(fingerprint=GPU_FP.hash) == []
        assert db.get_ceiling(GPU_FP.hash, "copy_gbps") is None

        gpu_decision = make_decision(fingerprint=GPU_FP.hash, speedup=3.0)
        db.put_decision(gpu_decision)
        assert db.get_decision(GPU_FP.hash, interp_trial.workload) == gpu_decision
        interp = db.get_decision(INTERP_FP.hash, interp_trial.workload)
        assert interp is not None and interp.metrics["speedup"] == 1.6

    # -- lifetime ----------------------------------------------------------------------------

    def test_persistence_across_reopen(self, location: str) -> None:
        if not self.persistent:
            pytest.skip("backend does not persist")
        trial = make_trial(status="crash", error="segfault")
        decision = make_decision()
        with self.open(location) as db:
            db.put_fingerprint(INTERP_FP)
            db.add_trial(trial)
            db.put_decision(decision)
            db.put_ceiling(INTERP_FP.hash, "copy_gbps", 12.0)
        with self.open(location) as db:
            assert db.get_fingerprint(INTERP_FP.hash) == INTERP_FP
            assert db.trials() == [trial]
            assert db.get_decision(decision.fingerprint, decision.workload) == decision
            assert db.get_ceiling(INTERP_FP.hash, "copy_gbps") == 12.0

    def test_two_connections_see_each_other(self, location: str) -> None:
        """Writes are committed at once: another open connection sees them without a close."""
        if not self.persistent:
            pytest.skip("backend does not persist")
        with self.open(location) as a, self.open(location) as b:
            a.add_trial(make_trial())
            assert len(b.trials()) == 1
            b.put_decision(make_decision())
            assert len(a.decisions()) == 1

    def test_context_manager_closes(self, location: str) -> None:
        from kernelsmith.db import DatabaseError

        with self.open(location) as db:
            db.add_trial(make_trial())
        db.close()  # idempotent
        with pytest.raises(DatabaseError):
            db.trials()

    def test_threads_share_one_database(self, db: Database) -> None:
        import threading

        def work(k: int) -> None:
            for i in range(20):
                db.add_trial(make_trial(workload=f"t{k}", config={"i": i}))

        threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(db.trials()) == 80

    def test_concurrent_writers_from_two_processes(self, location: str) -> None:
        if not self.multiprocess:
            pytest.skip("backend is private to one process")
        n = 40
        # no database exists yet: the children also race to create the schema
        ctx = mp.get_context("spawn")
        start = ctx.Barrier(2)
        procs = [ctx.Process(target=_write_trials, args=(location, w, n, start)) for w in range(2)]
        for p in procs:
            p.start()
        deadline = time.monotonic() + 120  # generous: CI machines are small and busy
        for p in procs:
            p.join(timeout=max(0.0, deadline - time.monotonic()))
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()
        assert [p.exitcode for p in procs] == [0, 0]
        with self.open(location) as db:
            for w in range(2):
                trials = db.trials(workload=f"w{w}")
                assert [t.config["i"] for t in trials] == list(range(n))  # none lost, in order

    # -- claims ------------------------------------------------------------------------------

    def test_claims_are_exclusive_until_released(self, db: Database) -> None:
        key = (INTERP_FP.hash, "w", "row", "src0", "BLOCK=64")
        assert db.claim_evaluation(*key, owner="a")
        assert db.claim_evaluation(*key, owner="a")  # one's own claim: still held
        assert not db.claim_evaluation(*key, owner="b")  # being evaluated elsewhere
        assert db.claim_evaluation(INTERP_FP.hash, "w", "row", "src0", {"BLOCK": 32}, owner="b")  # another config
        assert db.claim_evaluation(GPU_FP.hash, "w", "row", "src0", "BLOCK=64", owner="b")  # another machine
        db.release_evaluation(*key, owner="b")  # not b's: nothing happens
        assert not db.claim_evaluation(*key, owner="b")
        db.release_evaluation(*key, owner="a")
        db.release_evaluation(*key, owner="a")  # idempotent
        assert db.claim_evaluation(*key, owner="b")

    def test_a_measured_candidate_cannot_be_claimed(self, db: Database) -> None:
        trial = make_trial(status="timeout", error="measured here")
        key = (trial.fingerprint, trial.workload, trial.variant, trial.source_hash, trial.config_key)
        db.add_trial(replace(trial, origin="imported"))  # a claim from a file measures nothing here
        assert db.claim_evaluation(*key, owner="a")
        db.add_trial(trial)
        db.release_evaluation(*key, owner="a")
        assert not db.claim_evaluation(*key, owner="b")  # read its trial instead
        assert db.find_trial(*key) == trial

    def test_trials_before_since_are_ignored(self, db: Database) -> None:
        """A forced retune (``since``: when it began) neither reuses nor is blocked by older trials."""
        old = make_trial(status="timeout", error="measured before")
        old = replace(old, created_at=100.0)
        key = (old.fingerprint, old.workload, old.variant, old.source_hash, old.config_key)
        db.add_trial(old)
        assert db.find_trial(*key) == old and db.find_trial(*key, since=100.0) == old
        assert db.find_trial(*key, since=200.0) is None
        assert not db.claim_evaluation(*key, owner="a")
        assert db.claim_evaluation(*key, owner="a", since=200.0)
        fresh = replace(old, status="ok", error="", created_at=300.0)
        db.add_trial(fresh)
        db.release_evaluation(*key, owner="a")
        assert db.find_trial(*key, since=200.0) == fresh
        assert not db.claim_evaluation(*key, owner="b", since=200.0)

    def test_near_decisions(self, db: Database) -> None:
        """Decisions of fingerprints that differ only in the driver build or kernelsmith release,
        newest first; never this fingerprint's own, another toolchain's or another GPU's."""
        near_driver = replace(GPU_FP, driver="12.8")
        near_release = replace(GPU_FP, kernelsmith="0.0.9")
        far = [replace(GPU_FP, triton="3.5.0"), replace(GPU_FP, torch="2.10.0"), replace(GPU_FP, sm_count=114)]
        for n, fp in enumerate([GPU_FP, near_driver, near_release, *far]):
            db.put_fingerprint(fp)
            db.put_decision(replace(make_decision(fingerprint=fp.hash, workload="w"), created_at=1000.0 + n))
        found = db.near_decisions(GPU_FP, "w")
        assert [d.fingerprint for d in found] == [near_release.hash, near_driver.hash]
        assert db.near_decisions(GPU_FP, "other") == []

    def test_an_expired_claim_is_taken_over(self, db: Database) -> None:
        """A tuner that died mid-evaluation blocks the candidate only until its claim expires."""
        key = (INTERP_FP.hash, "w", "row", "src0", "BLOCK=64")
        assert db.claim_evaluation(*key, owner="dead", ttl_s=0.2)
        assert not db.claim_evaluation(*key, owner="alive")
        time.sleep(0.3)
        assert db.claim_evaluation(*key, owner="alive")
        assert not db.claim_evaluation(*key, owner="dead")

    def test_eight_writers_claiming_overlapping_candidates(self, location: str) -> None:
        """8 processes store trials of the same 40 candidates with claims: each candidate is
        evaluated exactly once (claims won = trials stored), none is lost, no row is garbled,
        and every writer sees the decisions the others made."""
        if not self.multiprocess:
            pytest.skip("backend is private to one process")
        ctx = mp.get_context("spawn")
        start = ctx.Barrier(LOAD_WRITERS)
        results = ctx.Queue()
        procs = [ctx.Process(target=_claim_and_write, args=(location, w, start, results)) for w in range(LOAD_WRITERS)]
        for p in procs:
            p.start()
        reports = []
        deadline = time.monotonic() + 120
        for _ in procs:
            reports.append(results.get(timeout=max(1.0, deadline - time.monotonic())))
        for p in procs:
            p.join(timeout=max(0.0, deadline - time.monotonic()))
            if p.is_alive():
                p.kill()
                p.join()
        assert [p.exitcode for p in procs] == [0] * LOAD_WRITERS
        won = [pair for _, pairs, _ in reports for pair in pairs]
        everything = {(f"load{w}", i) for w in range(LOAD_WORKLOADS) for i in range(LOAD_CONFIGS)}
        assert len(won) == len(set(won)) == len(everything)  # no duplicate evaluation
        by_writer = {f"writer-{w}": set(pairs) for w, pairs, _ in reports}
        with self.open(location) as db:
            trials = db.trials()
            assert len(trials) == len(won)  # claims won = trials written: none lost, none extra
            assert {(t.workload, t.config["i"]) for t in trials} == everything
            for t in trials:  # nothing garbled: each row is what its writer wrote
                owner = t.metrics["owner"]
                assert t.metrics["checksum"] == _load_checksum(t.workload, t.config_key, owner)
                assert t.metrics["median_us"] == 1.0 + t.config["i"] and t.status == "ok"
                assert (t.workload, t.config["i"]) in by_writer[owner]  # stored by the claim's winner
            assert {d.workload for d in db.decisions()} == {f"load{w}" for w in range(LOAD_WORKLOADS)}
        assert [seen for _, _, seen in reports] == [LOAD_WORKLOADS] * LOAD_WRITERS

    # -- export / import ---------------------------------------------------------------------

    def _fill(self, db: Database) -> None:
        db.put_fingerprint(INTERP_FP)
        db.put_fingerprint(GPU_FP)
        db.add_trial(make_trial())
        db.add_trial(make_trial(config={"BLOCK": 64}, status="validate", error="max_abs 3.0"))
        db.add_trial(make_trial(fingerprint=GPU_FP.hash, op="layernorm", workload="ln"))
        db.put_decision(make_decision())
        db.put_decision(make_decision(fingerprint=GPU_FP.hash, op="layernorm", workload="ln"))
        db.put_ceiling(GPU_FP.hash, "copy_gbps", 4000.0, {"runs": 5})

    def test_export_import_round_trip(self, db: Database, tmp_path: Any) -> None:
        self._fill(db)
        buf = io.StringIO()
        written = export_jsonl(db, buf)
        assert written == 2 + 3 + 2 + 1
        with open_database(str(tmp_path / "copy.db")) as copy:
            counts = import_jsonl(copy, io.StringIO(buf.getvalue()))
            assert counts == {"fingerprint": 2, "trial": 3, "decision": 2, "ceiling": 1,
                              "variant_source": 0, "duplicate_trial": 0, "kept_local_decision": 0}
            # everything arrives as a claim, otherwise as it was
            assert copy.trials() == [replace(t, origin="imported") for t in db.trials()]
            assert copy.decisions() == [replace(d, origin="imported", validated=False) for d in db.decisions()]
            assert copy.ceilings() == [replace(c, origin="imported") for c in db.ceilings()]
            assert sorted(f.hash for f in copy.fingerprints()) == sorted(
                f.hash for f in db.fingerprints())
            # importing again adds nothing
            again = import_jsonl(copy, io.StringIO(buf.getvalue()))
            assert again["trial"] == 0 and again["duplicate_trial"] == 3
            assert len(copy.trials()) == 3
            assert len(copy.decisions()) == 2

    # -- variant sources ---------------------------------------------------------------------

    def test_variant_sources(self, db: Database) -> None:
        text = "def build(spec, config):\n    return None\n"
        source_hash = db.put_variant_source("rmsnorm", text)
        assert source_hash == variant_source_hash(text)
        assert db.put_variant_source("softmax", text) == source_hash  # idempotent, first op kept
        other = db.put_variant_source("softmax", text + "# another\n")
        assert db.get_variant_source(source_hash) == text
        assert db.get_variant_source("0" * 16) is None
        assert [v.source_hash for v in db.variant_sources()] == [source_hash, other]
        assert [v.op for v in db.variant_sources(op="rmsnorm")] == ["rmsnorm"]

    def test_variant_sources_export_import(self, db: Database, tmp_path: Any) -> None:
        self._fill(db)
        plain = io.StringIO()
        export_jsonl(db, plain)
        assert '"version": 1' in plain.getvalue().splitlines()[0]  # no sources: readable by 1
        text = "def build(spec, config):\n    return None\n"
        source_hash = db.put_variant_source("softmax", text)
        db.add_trial(make_trial(variant="agent", source_hash=source_hash))
        buf = io.StringIO()
        export_jsonl(db, buf, fingerprint=INTERP_FP.hash)
        assert '"version": 2' in buf.getvalue().splitlines()[0]
        with open_database(str(tmp_path / "copy.db")) as copy:
            counts = import_jsonl(copy, io.StringIO(buf.getvalue()))
            assert counts["variant_source"] == 1
            assert copy.get_variant_source(source_hash) == text
        tampered = buf.getvalue().replace("return None", "return 1")
        with open_database(str(tmp_path / "other.db")) as other:
            with pytest.raises(DatabaseError, match="does not match its text"):
                import_jsonl(other, io.StringIO(tampered))
            assert other.variant_sources() == []

    def test_export_filters(self, db: Database) -> None:
        self._fill(db)
        buf = io.StringIO()
        assert export_jsonl(db, buf, fingerprint=GPU_FP.hash) == 1 + 1 + 1 + 1
        buf = io.StringIO()
        assert export_jsonl(db, buf, op="softmax") == 1 + 2 + 1  # interp fp, 2 trials, 1 decision
        lines = buf.getvalue().splitlines()
        assert '"type": "header"' in lines[0]

    # -- where records came from (DESIGN.md rule 13) ----------------------------------------

    def test_origin_fields_round_trip(self, db: Database) -> None:
        trial = replace(make_trial(), origin="imported")
        claim = replace(make_decision(), origin="imported", validated=False, validation_error="validate: off by 3")
        db.add_trial(trial)
        db.put_decision(claim)
        db.put_ceiling(GPU_FP.hash, "copy_gbps", 10.0, origin="imported")
        assert db.trials() == [trial]
        assert db.get_decision(claim.fingerprint, claim.workload) == claim
        assert not claim.servable and claim.claim_state == "failed"
        assert [c.origin for c in db.ceilings()] == ["imported"]
        assert make_decision().claim_state == "local" and make_decision().servable

    def test_find_trial_uses_only_local_trials(self, db: Database) -> None:
        """An imported failure never stands in for a measurement here (rule 13)."""
        cheat = replace(make_trial(status="cheat", error="claimed by a file"), origin="imported")
        db.add_trial(cheat)
        key = (cheat.fingerprint, cheat.workload, cheat.variant, cheat.source_hash, cheat.config_key)
        assert db.find_trial(*key) is None
        local = make_trial(status="timeout", error="measured here")
        db.add_trial(local)
        db.add_trial(replace(make_trial(status="crash"), origin="imported"))  # newer, but imported
        assert db.find_trial(*key) == local
        assert len(db.trials()) == 3  # imported trials are still stored and listed

    def test_claims_never_replace_local_decisions(self, db: Database) -> None:
        local = make_decision(speedup=1.1)
        db.put_decision(local)
        db.put_decision(replace(make_decision(speedup=9.0), origin="imported", validated=False))
        assert db.get_decision(local.fingerprint, local.workload) == local
        other = make_decision(workload="w2", speedup=2.0)
        claim = replace(other, origin="imported", validated=False)
        db.put_decision(claim)
        assert db.get_decision(other.fingerprint, "w2") == claim
        newer_claim = replace(claim, metrics={"speedup": 3.0})
        db.put_decision(newer_claim)  # a claim over a claim: replaced
        assert db.get_decision(other.fingerprint, "w2") == newer_claim
        db.put_decision(other)  # measured here: replaces the claim
        assert db.get_decision(other.fingerprint, "w2") == other

    def test_imported_ceilings_are_not_used(self, db: Database) -> None:
        db.put_ceiling(GPU_FP.hash, "copy_gbps", 1.0, origin="imported")
        assert db.get_ceiling(GPU_FP.hash, "copy_gbps") is None  # measure it here instead
        db.put_ceiling(GPU_FP.hash, "copy_gbps", 4000.0)
        db.put_ceiling(GPU_FP.hash, "copy_gbps", 1.0, origin="imported")  # never over a measurement
        assert db.get_ceiling(GPU_FP.hash, "copy_gbps") == 4000.0
        assert [(c.value, c.origin) for c in db.ceilings()] == [(4000.0, "local")]

    def test_variant_source_trust(self, db: Database) -> None:
        text = "@triton.jit\ndef k(x):\n    pass\n"
        local = db.put_variant_source("rmsnorm", text)
        record = db.variant_source(local)
        assert record is not None and record.trusted and record.origin == "local"
        imported = db.put_variant_source("rmsnorm", text + "# 2\n", origin="imported")
        record = db.variant_source(imported)
        assert record is not None and not record.trusted and record.origin == "imported"
        assert db.variant_source("0" * 16) is None
        assert db.put_variant_source("rmsnorm", text, origin="imported", trusted=False) == local
        assert db.variant_source(local).trusted  # type: ignore[union-attr]  # storing again never untrusts
        assert db.trust_variant_source(imported)
        assert db.variant_source(imported).trusted  # type: ignore[union-attr]
        assert not db.trust_variant_source("f" * 16)
        assert [(v.source_hash, v.trusted) for v in db.variant_sources()] == [(local, True), (imported, True)]

    def test_trust_belongs_to_the_user_who_gave_it(self, location: str, tmp_path: Any,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
        """A database another user wrote (a shared cache) carries no trust for this user."""
        if not self.persistent:
            pytest.skip("backend does not persist")
        monkeypatch.setenv("KERNELSMITH_TRUST_KEY", str(tmp_path / "someone-else.key"))
        with self.open(location) as db:
            source_hash = db.put_variant_source("rmsnorm", "@triton.jit\ndef k(x):\n    pass\n")
            assert db.variant_source(source_hash).trusted  # type: ignore[union-attr]
        monkeypatch.setenv("KERNELSMITH_TRUST_KEY", str(tmp_path / "me.key"))
        with self.open(location) as db:
            assert not db.variant_source(source_hash).trusted  # type: ignore[union-attr]
            assert db.trust_variant_source(source_hash)
            assert db.variant_source(source_hash).trusted  # type: ignore[union-attr]

    def test_import_makes_claims_whatever_the_file_says(self, db: Database) -> None:
        """A file cannot declare its records local, validated or trusted."""
        text = "@triton.jit\ndef k(x):\n    pass\n"
        header = {"type": "header", "format": "kernelsmith-jsonl", "version": 2}
        lines = [
            header,
            {"type": "trial", **make_trial(status="cheat").to_dict(), "origin": "local"},
            {"type": "decision", **make_decision().to_dict(), "origin": "local", "validated": True},
            {"type": "ceiling", "fingerprint": GPU_FP.hash, "name": "copy_gbps", "value": 1.0, "origin": "local"},
            {"type": "variant_source", "source_hash": variant_source_hash(text), "op": "softmax", "source": text,
             "origin": "local", "trusted": True},
        ]
        import_jsonl(db, io.StringIO("".join(json.dumps(line) + "\n" for line in lines)))
        (trial,) = db.trials()
        assert trial.origin == "imported" and db.find_trial(
            trial.fingerprint, trial.workload, trial.variant, trial.source_hash, trial.config_key) is None
        (decision,) = db.decisions()
        assert decision.origin == "imported" and not decision.validated and not decision.servable
        assert db.get_ceiling(GPU_FP.hash, "copy_gbps") is None
        (source,) = db.variant_sources()
        assert source.origin == "imported" and not source.trusted

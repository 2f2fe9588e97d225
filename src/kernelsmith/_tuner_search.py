"""One search of the tuner (:mod:`kernelsmith.tuner`): steps 3 to 5 of its module docstring.

:class:`_Search` holds the state of one search over a workload's candidates: the proposal loop
that keeps every worker busy (:meth:`_Search.run`), the claims that let tuners sharing a database
split the work instead of measuring a candidate twice, the immediate storing of every trial, the
re-validation of a near fingerprint's decision (:meth:`_Search.carry_over`), and the final, paired
re-timing that adopts a kernel only on a confident win over every baseline (:meth:`_Search.decide`).
:func:`~kernelsmith.tuner.tune_spec` creates one and reads its results; the names are importable
from :mod:`kernelsmith.tuner` as before.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections import Counter, deque
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import replace
from typing import Any

from kernelsmith._tuner_records import _from_trial, _trial
from kernelsmith.cost import LLM_TOKENS_KEY
from kernelsmith.db import Database, DecisionRecord, Fingerprint
from kernelsmith.db.records import variant_source_hash
from kernelsmith.decide import Comparison, compare
from kernelsmith.evaluate.compile_ahead import FAILED, Ahead, CompileAhead
from kernelsmith.evaluate.confirm import plausible
from kernelsmith.evaluate.executor import Executor
from kernelsmith.evaluate.protocol import Candidate, EvalResult, TimingSettings
from kernelsmith.evaluate.timing import pinned_graph_replay
from kernelsmith.llm._base import Metered
from kernelsmith.ops import OpFamily
from kernelsmith.settings import compile_baseline_wanted
from kernelsmith.settings import get as setting
from kernelsmith.spec import OpSpec
from kernelsmith.strategies import Strategy, make_strategy
from kernelsmith.strategies.warm import Seeds

log = logging.getLogger("kernelsmith.tuner")  # this code's logger in tuner.py

FINALISTS = 3
# How often a tuner waiting for a candidate another tuner is evaluating looks for its trial (s).
CLAIM_POLL_S = 0.5
Progress = Callable[[int, int, "EvalResult | None"], None]
REVALIDATED = "revalidated"  # the strategy name of a decision carried over from a near fingerprint
# The search stops proposing once its best candidate moves the family's bytes at the device's
# copy bandwidth, to within that candidate's own timing spread (its interquartile range, at least
# CEILING_MIN_SPREAD of its median): no configuration can move the same bytes faster than a copy
# of them, so the rest of the budget could only tie it (issue 19: search cost). Not before
# CEILING_MIN_EVALUATIONS evaluations, so that one lucky sample does not end a search.
CEILING_MIN_EVALUATIONS = 8
CEILING_MIN_SPREAD = 0.02


def _speedup(result: EvalResult) -> float:
    """Speedup over the baseline timed in the same worker run."""
    m = result.metrics
    if not result.ok or not m.get("median_us"):
        return 0.0
    return float(m["baseline_median_us"]) / float(m["median_us"])


def _verdicts(result: EvalResult) -> tuple[Comparison, Comparison | None]:
    """A re-timed candidate's paired comparison with the eager baseline, and with the
    torch.compile baseline where the worker timed one in the same rounds (else None)."""
    m = result.metrics
    eager = compare(m["samples_us"], m["baseline_samples_us"])
    compiled = compare(m["samples_us"], m["compile_samples_us"]) if m.get("compile_samples_us") else None
    return eager, compiled


def _wins(eager: Comparison, compiled: Comparison | None) -> bool:
    """A kernel is kept only if it beats every baseline measured with confidence: eager, and
    torch.compile where it was timed (so in particular the faster of the two)."""
    return eager.significant and (compiled is None or compiled.significant)


def _rank(results: Sequence[EvalResult]) -> list[EvalResult]:
    """Successful results, fastest first. Timing is serialized on the device, so medians from
    one search compare directly; ratios to the baseline would add the baseline's noise."""
    return sorted((r for r in results if r.ok), key=lambda r: r.median_us)


class _Search:
    """State of one search; kept in a class so each step reads as one short method."""

    def __init__(
        self,
        family: OpFamily,
        spec: OpSpec,
        fp: Fingerprint,
        db: Database,
        evaluator: Executor,
        progress: Progress | None,
        copy_gbps: float | None = None,
        since: float = 0.0,
        compile_ahead: CompileAhead | None = None,
    ) -> None:
        self.family, self.spec, self.fp, self.db = family, spec, fp, db
        self.evaluator, self.progress = evaluator, progress
        self.copy_gbps = copy_gbps
        self.since = since  # trials stored before this time are not reused (a forced retune)
        self.source_hashes = {v.name: v.source_hash for v in family.variants}
        self.results: list[EvalResult] = []
        self.fresh: list[bool] = []  # per result: evaluated now (True) or reused from the database
        self.recheck_s = 0.0  # worker seconds of the final re-check
        self.winner_source = ""  # the winning candidate's module text, when a strategy wrote it
        self.evaluated = 0
        self.meter: Metered | None = None  # the LLM client of the run's strategy, if it has one
        # Claims in a shared database (Database.claim_evaluation): who this search is, and the
        # candidates it claimed and has not stored yet.
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.claimed: set[tuple[str, str, str]] = set()
        self.finished = threading.Event()  # ends the threads waiting on other tuners' claims
        self.stopped_at_ceiling = ""  # why the search stopped early at the copy ceiling, if it did
        # Compiling waiting candidates ahead of their worker (kernelsmith.evaluate.compile_ahead):
        # the one given (tests), else one made where it can help; what it did, for the decision.
        self.given_compile_ahead = compile_ahead
        self.compile_report: dict[str, Any] = {}

    def candidates(self) -> list[Candidate]:
        return [Candidate(v.name, c) for v in self.family.variants for c in v.space(self.spec)]

    def run(
        self,
        strategy_name: str,
        budget: int,
        seed: int,
        client: Metered | None = None,
        stop: Callable[[], bool] | None = None,
    ) -> None:
        """Keep every worker busy: each finished evaluation makes room for the next proposal.
        ``stop()`` returning True ends the proposals early (evaluations in flight finish)."""
        strategy = make_strategy(
            strategy_name, seed, budget=budget, db=self.db, spec=self.spec, fingerprint=self.fp.hash, client=client
        )
        self.meter = client
        strategy.setup(self.candidates())
        self._drive(strategy, budget, stop)

    def _drive(self, strategy: Strategy, budget: int, stop: Callable[[], bool] | None) -> None:
        """Run ``strategy`` (set up) to its end or ``budget``, then let go of unstored claims."""
        compiler = self._compile_ahead()
        try:
            self._loop(strategy, budget, stop, compiler)
        finally:
            self.finished.set()
            if compiler is not None:
                compiler.close()
            self._report_compiles(compiler)
            for candidate_id in list(self.claimed):  # not stored (an error): let others have it
                self.db.release_evaluation(self.fp.hash, self.spec.workload_hash, *candidate_id, owner=self.owner)

    def _compile_ahead(self) -> CompileAhead | None:
        """The compiler of this search's waiting candidates, or None: ``KERNELSMITH_COMPILE_AHEAD``
        off, or (unless a test gave one) no GPU or workers that do not share this process's
        Triton cache (a Ray cluster's), where compiling here could not help."""
        if not setting("KERNELSMITH_COMPILE_AHEAD"):
            return None
        if self.given_compile_ahead is not None:
            return self.given_compile_ahead
        if not getattr(self.evaluator, "shares_triton_cache", False) or self.evaluator.mode != "gpu":
            return None
        return CompileAhead(self.family, self.spec)

    def _loop(
        self,
        strategy: Strategy,
        budget: int,
        stop: Callable[[], bool] | None,
        compiler: CompileAhead | None = None,
    ) -> None:
        """The body of :meth:`run`. A candidate no trial is stored for is claimed before it is
        evaluated; one another tuner claimed (it is measuring it right now) is waited for in a
        thread, without taking a worker or budget, and its trial reused once stored, or
        evaluated here if that tuner's claim lapses first (it died).

        With a ``compiler`` the search proposes up to ``compiler.depth`` candidates more than
        there are workers: a proposal that finds a worker free (and none waiting before it) goes
        to it at once, the others wait in ``queued``, in proposal order, each compiled here
        meanwhile, and go to the next free worker in that order (:meth:`_send_queued`). Without
        one, every proposal goes to a worker at once, as it always did."""
        running: set[Future[EvalResult]] = set()
        waiting: dict[Future[EvalResult | None], Candidate] = {}  # being evaluated by another tuner
        queued: deque[tuple[Candidate, Future[Ahead]]] = deque()  # claimed, compiling here, waiting for a worker
        workers = self.evaluator.n_workers
        in_flight = workers + (compiler.depth if compiler is not None else 0)
        exhausted = False
        while True:
            while (not exhausted and len(running) + len(queued) < in_flight
                   and self.evaluated + len(running) + len(queued) < budget):  # fmt: skip
                if (stop is not None and stop()) or self._at_ceiling():
                    if self.stopped_at_ceiling:
                        log.info("%s: %s", self.spec.op, self.stopped_at_ceiling)
                    exhausted = True
                    self._drop_queued(queued)  # not sent to a worker yet: not evaluated
                    break
                proposal = strategy.propose(1)
                if not proposal:
                    exhausted = True
                    break
                known = self._known(proposal[0])
                if known is not None:  # measured (or failed) before: reuse, free of budget
                    self._record(strategy, known, fresh=False, budget=budget)
                elif not self._claim(proposal[0]):
                    waiting[self._wait_for_other(proposal[0])] = proposal[0]
                elif compiler is None or (not queued and len(running) < workers):
                    running.add(self.evaluator.submit(self.spec, proposal[0]))
                else:
                    queued.append((proposal[0], compiler.start(proposal[0])))
            if self._send_queued(queued, running, strategy, budget, compiler):
                continue  # a compile failure was recorded: its place goes to the next proposal
            if not running and not waiting and not queued:
                break
            pending: set[Future[Any]] = {*running, *waiting}
            head_compiling = bool(queued) and len(running) < workers  # a worker is free: wait for that compile
            if head_compiling:
                pending.add(queued[0][1])
            waited_from = time.perf_counter()
            done, _ = wait(pending, return_when=FIRST_COMPLETED)
            if head_compiling and compiler is not None:
                compiler.waited_s += time.perf_counter() - waited_from
            for future in done:
                if future is (queued[0][1] if queued else None):
                    continue  # the compile a free worker waited for: sent on the next turn
                if future in waiting:
                    candidate = waiting.pop(future)
                    other = future.result()
                    if other is not None:  # measured by another tuner: reuse, free of budget
                        self._record(strategy, other, fresh=False, budget=budget)
                    else:  # its claim lapsed and this search holds it now
                        running.add(self.evaluator.submit(self.spec, candidate))
                    continue
                running.discard(future)
                self.evaluated += 1
                self._record(strategy, future.result(), fresh=True, budget=budget)

    def _send_queued(
        self,
        queued: deque[tuple[Candidate, Future[Ahead]]],
        running: set[Future[EvalResult]],
        strategy: Strategy,
        budget: int,
        compiler: CompileAhead | None,
    ) -> bool:
        """Send the queued candidates, in order, to the free workers, and return whether a compile
        failure was recorded. The first in the queue goes once its compile here is done; one
        whose compile has not started yet (every compiling thread busy) goes at once, its
        compile cancelled (its worker compiles it); one compiling now is waited for. A
        candidate that failed to compile is recorded as its "build" failure, as a worker would
        have reported it, and takes no worker."""
        recorded = False
        while queued and len(running) < self.evaluator.n_workers:
            candidate, compiling = queued[0]
            if compiling.cancel():  # not started: no worse off than without compile-ahead
                assert compiler is not None
                compiler.sent_uncompiled += 1
            elif not compiling.done():
                break  # compiling now: the loop waits for it
            queued.popleft()
            outcome = None if compiling.cancelled() else compiling.result()
            if outcome is not None and outcome.status == FAILED:
                assert compiler is not None
                self.evaluated += 1
                self._record(strategy, compiler.failure(outcome, self._source_hash(candidate)), fresh=True,
                             budget=budget)  # fmt: skip
                recorded = True
            else:
                running.add(self.evaluator.submit(self.spec, candidate))
        return recorded

    def _drop_queued(self, queued: deque[tuple[Candidate, Future[Ahead]]]) -> None:
        """Forget the queued candidates (the search stopped): their claims are released."""
        while queued:
            candidate, compiling = queued.popleft()
            compiling.cancel()
            self._release(candidate)

    def _report_compiles(self, compiler: CompileAhead | None) -> None:
        """What compiling took on and off the timing path, in :attr:`compile_report` (the
        decision's ``compile_ahead`` metrics) and the log: with compile-ahead on, the compiles
        done here and the time the search waited for them with a worker free; either way the
        workers' loading, compiling and validation seconds (``validate_s``, which a compile done
        ahead shortens to a load from Triton's cache; lock waits included)."""
        fresh = [r for r, new in zip(self.results, self.fresh, strict=True) if new]
        report: dict[str, Any] = {"enabled": compiler is not None}
        if compiler is not None:
            report.update(compiler.report())
        report["worker_validate_s"] = round(sum(float(r.metrics.get("validate_s", 0.0)) for r in fresh), 3)
        self.compile_report = report
        log.info("%s: compiles: %s", self.spec.op, report)

    def _candidate_id(self, candidate: Candidate) -> tuple[str, str, str]:
        return candidate.variant, self._source_hash(candidate), candidate.config.key

    def _claim(self, candidate: Candidate) -> bool:
        """Claim ``candidate`` for this search; False when another tuner is evaluating it (or
        stored its trial since :meth:`_known` looked)."""
        candidate_id = self._candidate_id(candidate)
        if not self.db.claim_evaluation(
            self.fp.hash, self.spec.workload_hash, *candidate_id, owner=self.owner, since=self.since
        ):
            return False
        self.claimed.add(candidate_id)
        return True

    def _release(self, candidate: Candidate) -> None:
        candidate_id = self._candidate_id(candidate)
        if candidate_id in self.claimed:
            self.db.release_evaluation(self.fp.hash, self.spec.workload_hash, *candidate_id, owner=self.owner)
            self.claimed.discard(candidate_id)

    def _wait_for_other(self, candidate: Candidate) -> Future[EvalResult | None]:
        """A future of the trial another tuner is measuring: its result once stored, or None
        once this search claimed the candidate itself (the other's claim lapsed)."""
        future: Future[EvalResult | None] = Future()

        def poll() -> None:
            try:
                while not self.finished.wait(CLAIM_POLL_S):
                    known = self._known(candidate)
                    if known is not None or self._claim(candidate):
                        future.set_result(known)
                        return
            except Exception as exc:  # the database failed: the search sees it, as for its own writes
                future.set_exception(exc)

        log.info("%s is being evaluated by another tuner: waiting for its trial", candidate.key)
        threading.Thread(target=poll, name="kernelsmith-claim-wait", daemon=True).start()
        return future

    def _known(self, candidate: Candidate) -> EvalResult | None:
        record = self.db.find_trial(
            self.fp.hash,
            self.spec.workload_hash,
            candidate.variant,
            self._source_hash(candidate),
            candidate.config.key,
            since=self.since,
        )
        return None if record is None else _from_trial(record, candidate)

    def _source_hash(self, candidate: Candidate) -> str:
        """A built-in variant's hash, or for source proposed by a strategy (an LLM's kernel) the
        hash of that source, as the worker computes it (evaluate/_worker_candidates.py ``_load_source``)."""
        if candidate.source:
            return variant_source_hash(candidate.source)
        return self.source_hashes[candidate.variant]

    def _record(self, strategy: Strategy, result: EvalResult, *, fresh: bool, budget: int) -> None:
        if not result.source_hash and result.candidate.source:  # rejected before the worker hashed it
            result = replace(result, source_hash=self._source_hash(result.candidate))
        tokens = self.meter.tokens.get(result.candidate) if fresh and self.meter is not None else None
        if tokens:  # the LLM tokens spent proposing it, stored with the trial (kernelsmith.cost)
            result = replace(result, metrics={**result.metrics, LLM_TOKENS_KEY: tokens})
        result = plausible(result, self.copy_gbps)
        if fresh and result.status != "skipped":
            self.db.add_trial(_trial(self.fp, self.spec, result))  # at once: a crash loses nothing
        if fresh:
            self._release(result.candidate)  # after the trial: others find it instead of a claim
        self.results.append(result)
        self.fresh.append(fresh)
        strategy.observe([result])
        if self.progress:
            self.progress(self.evaluated, budget, self.best())

    def best(self) -> EvalResult | None:
        ranked = _rank(self.results)
        return ranked[0] if ranked else None

    def _at_ceiling(self) -> bool:
        """Whether the best candidate so far is at the copy ceiling, within its own noise (see
        ``CEILING_MIN_EVALUATIONS``); sets :attr:`stopped_at_ceiling` to say so. Never in
        interpreter mode (no ceiling) nor for a family that reports no bytes (no ``gbps``)."""
        if self.stopped_at_ceiling:
            return True
        if not self.copy_gbps or self.evaluated < CEILING_MIN_EVALUATIONS:
            return False
        best = self.best()
        m = best.metrics if best is not None else {}
        gbps, median = m.get("gbps"), m.get("median_us")
        if not gbps or not median:
            return False
        spread = max(CEILING_MIN_SPREAD, (float(m.get("p75_us", median)) - float(m.get("p25_us", median))) / median)
        if gbps < self.copy_gbps * (1.0 - spread):
            return False
        self.stopped_at_ceiling = (
            f"stopped after {self.evaluated} evaluations: the best candidate moves {gbps:.0f} GB/s, within its "
            f"timing spread ({100 * spread:.1f}%) of the {self.copy_gbps:.0f} GB/s copy ceiling"
        )
        return True

    def failures(self) -> dict[str, int]:
        return dict(Counter(r.status for r in self.results if not r.ok))

    def failure_examples(self) -> dict[str, str]:
        """The first error message of each failure status: why candidates failed, at a glance."""
        examples: dict[str, str] = {}
        for r in self.results:
            if not r.ok and r.status not in examples:
                examples[r.status] = f"{r.candidate.key}: {r.error}"[:500]
        return examples

    def top(self, n: int = 5) -> list[dict[str, Any]]:
        ok = _rank(self.results)[:n]
        return [
            {
                "variant": r.candidate.variant,
                "config": r.candidate.config.to_dict(),
                "median_us": r.metrics["median_us"],
                "baseline_us": r.metrics["baseline_median_us"],
                "speedup": _speedup(r),
                "gbps": r.metrics.get("gbps"),
            }
            for r in ok
        ]

    def decide(self, strategy: str, copy_gbps: float | None) -> DecisionRecord:
        """Final, paired re-timing of the finalists; adopt only a confident win."""
        ranked = _rank(self.results)
        finalists = [r.candidate for r in ranked[:FINALISTS]]
        base: dict[str, Any] = {
            "fingerprint": self.fp.hash,
            "workload": self.spec.workload_hash,
            "op": self.spec.op,
            "spec": self.spec.to_dict(),
            "strategy": strategy,
            "evaluations": self.evaluated,
        }
        if not finalists:
            return DecisionRecord(winner="baseline", metrics={"note": "no candidate passed validation"}, **base)
        with_compiled = compile_baseline_wanted(self.fp.mode)
        if self.fp.mode == "gpu":
            settings = TimingSettings(rounds=100, compile_baseline=with_compiled)
        else:
            settings = TimingSettings(warmup_ms=0.0, rounds=6, input_sets=2, flush_l2=False,
                                      compile_baseline=with_compiled)  # fmt: skip
        rechecked = self.evaluator.evaluate_together(self.spec, finalists, settings)
        self.recheck_s = max((r.seconds for r in rechecked), default=0.0)  # one request: the longest spans it
        final = [r for r in rechecked if r.ok]
        if final:  # a confirmation times the way the re-check did, so that its figures compare
            settings = replace(settings, graph_replay=pinned_graph_replay(final[0].metrics))
        unconfirmed: list[str] = []
        while final:
            # The incumbent is the search's best; a challenger replaces it only with confidence.
            incumbent = final[0]
            for challenger in final[1:]:
                if compare(challenger.metrics["samples_us"], incumbent.metrics["samples_us"]).significant:
                    incumbent = challenger
            verdict, versus_compiled = _verdicts(incumbent)
            if not (_wins(verdict, versus_compiled) and incumbent.candidate.source):
                break
            confirmed, reason = self._confirm(incumbent, settings, copy_gbps)
            if confirmed is not None:
                incumbent = confirmed
                verdict, versus_compiled = _verdicts(incumbent)
                break
            unconfirmed.append(f"{incumbent.candidate.key} not confirmed in a fresh worker: {reason}"[:500])
            final = [r for r in final if r.candidate != incumbent.candidate]  # the built-ins may still win
        if not final:
            note = "; ".join(unconfirmed) or "finalists failed the final re-check"
            return DecisionRecord(winner="baseline", metrics={"note": note}, **base)
        m = incumbent.metrics
        metrics: dict[str, Any] = {
            "median_us": m["median_us"],
            "p10_us": m["p10_us"],
            "p90_us": m["p90_us"],
            "baseline_median_us": m["baseline_median_us"],
            "gbps": m["gbps"],
            "baseline_gbps": m["baseline_gbps"],
            "copy_gbps": copy_gbps,
            "timer": m["timer"],
            "timing_mode": m.get("timing_mode", "stream"),  # how the figures were timed (evaluate/timing.py)
            "timing_mode_reason": m.get("timing_mode_reason", ""),
            "pct_of_copy_bandwidth": 100.0 * m["gbps"] / copy_gbps if copy_gbps else None,
            "speedup": verdict.speedup,
            "ci_low": verdict.ci_low,
            "ci_high": verdict.ci_high,
            "rounds": verdict.rounds,
        }
        won = _wins(verdict, versus_compiled)
        notes = list(unconfirmed)
        if self.fp.mode == "interpreter":
            notes.append("interpreter mode: host-clock timings of the Triton interpreter, not GPU performance")
        if versus_compiled is not None:
            metrics.update({"compile_median_us": m["compile_median_us"], "compile_speedup": versus_compiled.speedup,
                            "compile_ci_low": versus_compiled.ci_low, "compile_ci_high": versus_compiled.ci_high})
            if verdict.significant and not versus_compiled.significant:
                notes.append(f"the best candidate beat eager PyTorch ({verdict.speedup:.2f}x) but not torch.compile "
                             f"with confidence ({versus_compiled.speedup:.2f}x, 95% CI {versus_compiled.ci_low:.2f}-"
                             f"{versus_compiled.ci_high:.2f})")  # fmt: skip
        elif m.get("compile_baseline_error"):
            notes.append(f"{m['compile_baseline_error']}; decided against eager PyTorch only")
        if not verdict.significant and self.fp.mode != "interpreter":  # there, the note above says why
            notes.append("no candidate beat the baseline with confidence")
        if self.stopped_at_ceiling:
            metrics["stopped_at_ceiling"] = self.stopped_at_ceiling
        if self.compile_report:
            metrics["compile_ahead"] = self.compile_report
        if notes:
            metrics["note"] = "; ".join(notes)
        if won:
            self.winner_source = incumbent.candidate.source
        # A baseline decision keeps the best candidate's identity and figures, for the record.
        return DecisionRecord(
            winner="kernel" if won else "baseline",
            variant=incumbent.candidate.variant,
            source_hash=incumbent.source_hash,
            config=incumbent.candidate.config.to_dict(),
            metrics=metrics,
            **base,
        )

    def carry_over(
        self, candidates: Sequence[Candidate], near: Sequence[DecisionRecord], copy_gbps: float | None
    ) -> DecisionRecord | None:
        """Step 3 of the module docstring: the decision to store here for the ``candidates`` of
        the kernel decisions ``near`` (see :func:`_carried`), or None when none carries over.

        Each candidate is evaluated here as in a search (validation on fresh secret data,
        timing; the trial is stored under this fingerprint), then :meth:`decide` re-times the
        survivors against the baseline, and only a confident win is returned.
        """
        log.info("%s: re-validating %d record(s) of a near fingerprint (another driver or kernelsmith release)",
                 self.spec.describe(), len(candidates))
        seeds = Seeds(candidates)
        seeds.setup(candidates)
        self._drive(seeds, len(candidates), None)
        decision = self.decide(REVALIDATED, copy_gbps)
        if decision.winner != "kernel":
            log.info("%s: the near fingerprint's winner did not win here (%s): not served",
                     self.spec.describe(), decision.metrics.get("note", "baseline wins"))
            return None
        origins = sorted({d.fingerprint for d in near if d.variant == decision.variant and d.config == decision.config})
        return replace(decision, metrics={**decision.metrics, "revalidated_from": origins})

    def _confirm(
        self, result: EvalResult, settings: TimingSettings, copy_gbps: float | None
    ) -> tuple[EvalResult | None, str]:
        """A winner from outside the package, judged again in fresh workers before it is kept
        (:meth:`Evaluator.confirm`): ``(its confirmed result, "")`` or ``(None, why not)``.

        A failure of the candidate there (a cheat, a wrong result) is stored as its latest trial,
        so it is never reused as a success; a confirmation that could not run at all is not.
        """
        confirmation = self.evaluator.confirm(self.spec, [result.candidate], settings, copy_gbps)
        reason = confirmation.disagreement(0)
        checked = confirmation.results[0]
        if not reason:
            return checked, ""
        if checked.status not in ("ok", "skipped"):
            checked = replace(checked, source_hash=checked.source_hash or self._source_hash(checked.candidate))
            self.db.add_trial(_trial(self.fp, self.spec, checked))
        log.warning("%s was not confirmed in a fresh worker: %s", result.candidate.key, reason)
        return None, reason

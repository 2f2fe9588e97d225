"""Compiling waiting candidates ahead of their worker (issue 19: search cost).

In the interpreter nothing compiles, so the search's mechanism is tested with a spy compile
function at :class:`CompileAhead`'s seam and a stand-in evaluator whose "workers" take a few
milliseconds per candidate (what is under test is when and what is compiled, and what reaches a
worker, not the harness). A GPU test compiles a real candidate without launching it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future
from typing import Any

import pytest
import torch

from kernelsmith._tuner_search import _Search
from kernelsmith.db import open_database
from kernelsmith.db.fingerprint import current_fingerprint
from kernelsmith.db.records import variant_source_hash
from kernelsmith.evaluate import compile_ahead
from kernelsmith.evaluate.compile_ahead import COMPILED, NOT_COMPILED, CompileAhead
from kernelsmith.evaluate.protocol import Candidate, EvalResult
from kernelsmith.ops import get_op
from kernelsmith.strategies import Strategy, make_strategy
from kernelsmith.strategies.warm import Seeds

EVALUATION_S = 0.03  # how long a stand-in worker takes per candidate


class CompilationError(Exception):
    """Named as Triton's: what compile-ahead must take for the candidate's own build failure."""


class _SlowEvaluator:
    """``n_workers`` stand-in workers, each taking EVALUATION_S per candidate; records when each
    candidate was submitted."""

    mode = "interpreter"

    def __init__(self, n_workers: int = 1) -> None:
        self.n_workers = n_workers
        self.submitted: list[tuple[str, float]] = []  # (candidate key, time submitted)

    def submit(self, spec: Any, candidate: Candidate, **_: Any) -> Future[EvalResult]:
        self.submitted.append((candidate.key, time.perf_counter()))
        future: Future[EvalResult] = Future()
        source_hash = (variant_source_hash(candidate.source) if candidate.source
                       else get_op("rmsnorm").variant(candidate.variant).source_hash)  # fmt: skip
        result = EvalResult(candidate, "ok", metrics={"median_us": 2.0, "baseline_median_us": 3.0},
                            source_hash=source_hash)  # fmt: skip
        threading.Timer(EVALUATION_S, future.set_result, (result,)).start()
        return future

    @property
    def keys(self) -> list[str]:
        return [key for key, _ in self.submitted]


class _Spy:
    """A compile function that takes ``seconds`` and records what it compiled and when it
    finished; ``fail`` maps a candidate key to the exception to raise."""

    def __init__(self, fail: dict[str, Exception] | None = None, seconds: float = 0.0) -> None:
        self.compiled: list[tuple[str, float]] = []
        self.fail = fail or {}
        self.seconds = seconds
        self._lock = threading.Lock()

    def __call__(self, family: Any, spec: Any, candidate: Candidate) -> None:
        time.sleep(self.seconds)
        with self._lock:
            self.compiled.append((candidate.key, time.perf_counter()))
        if candidate.key in self.fail:
            raise self.fail[candidate.key]

    @property
    def keys(self) -> list[str]:
        return [key for key, _ in self.compiled]


class _Counting(Strategy):
    """Another strategy, counting the most candidates proposed and not yet observed."""

    def __init__(self, inner: Strategy) -> None:
        super().__init__()
        self.inner = inner
        self.outstanding = 0
        self.most_outstanding = 0

    def setup(self, candidates: Sequence[Candidate]) -> None:
        self.inner.setup(candidates)

    def propose(self, n: int) -> list[Candidate]:
        proposal = self.inner.propose(n)
        self.outstanding += len(proposal)
        self.most_outstanding = max(self.most_outstanding, self.outstanding)
        return proposal

    def observe(self, results: Sequence[EvalResult]) -> None:
        self.outstanding -= len(results)
        self.inner.observe(results)

    def _order(self) -> Sequence[Candidate]:  # unused: propose is the inner strategy's
        return []


def _search(db: Any, evaluator: _SlowEvaluator, spy: _Spy | None = None, depth: int = 3) -> _Search:
    """A search of rmsnorm on ``evaluator``'s workers; with ``spy``, compiling ahead through it on
    one thread, up to ``depth`` candidates waiting (without, a test gives its own compiler later)."""
    family = get_op("rmsnorm")
    spec = family.spec_for(torch.randn(5, 48), torch.randn(48))
    compiler = None if spy is None else CompileAhead(family, spec, spy, threads=1, depth=depth)
    return _Search(family, spec, current_fingerprint("interpreter"), db, evaluator, None,  # type: ignore[arg-type]
                   compile_ahead=compiler)  # fmt: skip


def _grid(search: _Search, budget: int) -> _Counting:
    strategy = _Counting(make_strategy("grid", 0, budget=budget))
    strategy.setup(search.candidates())
    return strategy


def test_waiting_candidates_are_compiled_before_they_reach_a_worker_in_order(tmp_path: Any) -> None:
    """One worker: the first proposal goes to it at once; every later one waits, is compiled
    here meanwhile (in proposal order) and reaches the worker compiled, in proposal order. Each
    compile takes longer than an evaluation, so the worker is free while one is compiling: the
    search waits for it rather than send it uncompiled."""
    with open_database(tmp_path / "k.db") as db:
        spy = _Spy(seconds=2 * EVALUATION_S)
        evaluator = _SlowEvaluator(n_workers=1)
        search = _search(db, evaluator, spy)
        budget = 7
        strategy = _grid(search, budget)
        search._drive(strategy, budget, None)
        proposed = [r.candidate.key for r in search.results]  # recorded as they finish: one worker, in order
        assert len(proposed) == budget and evaluator.keys == proposed
        assert spy.keys == proposed[1:]  # all but the first, which found the worker free
        compiled_at = dict(spy.compiled)
        for key, submitted_at in evaluator.submitted[1:]:
            assert compiled_at[key] < submitted_at
        assert strategy.most_outstanding == 1 + 3  # the worker's candidate and the queue's depth
        report = search.compile_report
        assert report["enabled"] and report["compiled"] == budget - 1 and report["failed"] == 0
        assert report["ahead_s"] >= (budget - 1) * spy.seconds and report["waited_s"] > 0.0


def test_a_compile_failure_is_the_candidates_build_failure_and_the_search_goes_on(tmp_path: Any) -> None:
    """The grid's second candidate fails to compile here: it is a stored "build" failure with a
    worker's message and takes no worker; the third raises something else, which is not its
    failure: its worker gets it. The budget is spent all the same."""
    with open_database(tmp_path / "k.db") as db:
        evaluator = _SlowEvaluator(n_workers=1)
        search = _search(db, evaluator)
        budget = 6
        strategy = _grid(search, budget)
        first = strategy.inner.propose(3)  # peek at the grid's order, then start it again
        strategy = _grid(search, budget)
        broken, odd = first[1].key, first[2].key
        spy = _Spy({broken: CompilationError("at 3:4: unsupported tensor shape"), odd: RuntimeError("no meta kernel")})
        search.given_compile_ahead = CompileAhead(search.family, search.spec, spy, threads=1, depth=2)
        search._drive(strategy, budget, None)
        failed = [r for r in search.results if r.candidate.key == broken]
        assert len(failed) == 1 and failed[0].status == "build"
        assert failed[0].error == "CompilationError: at 3:4: unsupported tensor shape"
        assert failed[0].source_hash == search.family.variant(failed[0].candidate.variant).source_hash
        assert broken not in evaluator.keys  # it took no worker
        assert odd in evaluator.keys  # not a compile error: its worker decides
        assert search.evaluated == budget and len(evaluator.keys) == budget - 1  # the search went on
        assert sum(t.status == "build" for t in db.trials()) == 1 and len(db.trials()) == budget
        assert search.compile_report["failed"] == 1 and search.compile_report["not_compiled"] == 1


def test_the_setting_off_compiles_nothing_and_keeps_the_old_order(tmp_path: Any, monkeypatch: Any) -> None:
    """KERNELSMITH_COMPILE_AHEAD=0: no compile here, and never more candidates proposed and not
    yet observed than there are workers (the loop as it was before compile-ahead)."""
    monkeypatch.setenv("KERNELSMITH_COMPILE_AHEAD", "0")
    with open_database(tmp_path / "k.db") as db:
        spy = _Spy()
        evaluator = _SlowEvaluator(n_workers=2)
        search = _search(db, evaluator, spy)
        budget = 7
        strategy = _grid(search, budget)
        search._drive(strategy, budget, None)
        assert spy.compiled == [] and search.compile_report["enabled"] is False
        assert strategy.most_outstanding == evaluator.n_workers
        assert len(evaluator.keys) == budget


def test_a_kernel_file_is_never_compiled_in_the_tuning_process(tmp_path: Any) -> None:
    """An agent's or LLM's kernel file waiting for a worker is sent to it uncompiled: the spy
    (the host's compile) never sees it, the worker gets it."""
    source = "# a kernel file's text: only ever built in a worker\n"
    with open_database(tmp_path / "k.db") as db:
        spy = _Spy()
        evaluator = _SlowEvaluator(n_workers=1)
        search = _search(db, evaluator, spy)
        built_in = search.candidates()[:3]
        kernel_file = Candidate("from_agent", built_in[0].config, source=source)
        seeds = [built_in[0], kernel_file, built_in[1], built_in[2]]
        strategy = Seeds(seeds)
        strategy.setup(seeds)
        search._drive(strategy, len(seeds), None)
        assert evaluator.keys == [c.key for c in seeds]
        assert spy.keys == [built_in[1].key, built_in[2].key]
        assert search.compile_report["not_compiled"] == 1


def test_compile_ahead_refuses_source_even_when_called_directly() -> None:
    spy = _Spy()
    family = get_op("rmsnorm")
    spec = family.spec_for(torch.randn(5, 48), torch.randn(48))
    compiler = CompileAhead(family, spec, spy, threads=1)
    try:
        config = _first_config(family, spec)
        outcome = compiler.start(Candidate("from_llm", config, source="# kernel file\n")).result()
        assert outcome.status == NOT_COMPILED and spy.compiled == []
        built_in = compiler.start(Candidate(family.variants[0].name, config)).result()
        assert built_in.status == COMPILED and spy.keys == [built_in.candidate.key]
    finally:
        compiler.close()


def _first_config(family: Any, spec: Any) -> Any:
    return family.variants[0].space(spec).configs()[0]


def test_a_warmup_launch_compiles_through_triton_and_launches_nothing() -> None:
    """The seam under compile_variant: what its launchers call is Triton's ``run`` with
    ``warmup=True`` (compile this specialization, no launch), at the launcher's grid."""
    seen: list[tuple[Any, Any, dict[str, Any]]] = []

    class Kernel:
        def run(self, *args: Any, **kwargs: Any) -> str:
            seen.append((args, kwargs.pop("grid"), kwargs))
            return "compiled"

    assert compile_ahead.WarmupLaunch(Kernel(), (3, 1))(1, 2, BLOCK=64) == "compiled"
    assert seen == [((1, 2), (3, 1), {"warmup": True, "BLOCK": 64})]


def test_compile_variant_calls_the_launchers_on_meta_tensors_built_to_warm_up() -> None:
    """compile_variant builds each validation shape's launcher so that its launches are warmups
    (a direct launcher would load the module onto the device here) and calls it with meta
    tensors of the workload's shapes; launchers built outside it launch directly again."""
    rmsnorm = get_op("rmsnorm")
    spec = rmsnorm.spec_for(torch.randn(37, 48), torch.randn(48))
    calls: list[tuple[Any, list[Any], list[Any]]] = []

    def build(vspec: Any, config: Any) -> Any:
        from kernelsmith.ops._launch import direct_launch

        launch = direct_launch(object(), (1,))

        def launcher(inputs: list[Any], outputs: list[Any]) -> None:
            calls.append((launch, [(t.device.type, tuple(t.shape)) for t in inputs],
                          [t.device.type for t in outputs]))  # fmt: skip

        return launcher

    class _Family:
        def variant(self, name: str) -> Any:
            return type("V", (), {"build": staticmethod(build)})()

        validation_specs = rmsnorm.validation_specs
        output_specs = rmsnorm.output_specs

    compile_ahead.compile_variant(_Family(), spec, Candidate("any", _first_config(rmsnorm, spec)))  # type: ignore[arg-type]
    vspecs = rmsnorm.validation_specs(spec)
    assert len(calls) == len(vspecs) >= 1
    for (launch, inputs, outputs), vspec in zip(calls, vspecs, strict=True):
        assert isinstance(launch, compile_ahead.WarmupLaunch) and launch.grid == (1,)
        assert inputs == [("meta", tuple(t.shape)) for t in vspec.inputs] and set(outputs) == {"meta"}
    from kernelsmith.ops._launch import direct_launch

    class Plain:  # not a JITFunction: direct_launch's own launch is ``kernel[grid]``
        def __getitem__(self, grid: Any) -> str:
            return "launched"

    assert direct_launch(Plain(), (1,)) == "launched"  # outside compile_variant: launches, as before


@pytest.mark.gpu
def test_compile_variant_compiles_into_the_cache_without_launching(tmp_path: Any, monkeypatch: Any) -> None:
    """On a GPU: a built-in candidate compiled ahead lands in Triton's on-disk cache, and nothing
    ran on the device (no memory allocated, no kernel launched)."""
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "cache"))
    family = get_op("rmsnorm")
    spec = family.spec_for(torch.randn(37, 1000, device="cuda"), torch.randn(1000, device="cuda"))
    candidate = Candidate(family.variants[0].name, _first_config(family, spec))
    torch.cuda.synchronize()
    allocated = torch.cuda.memory_allocated()
    compile_ahead.compile_variant(family, spec, candidate)
    torch.cuda.synchronize()
    assert torch.cuda.memory_allocated() == allocated
    assert any((tmp_path / "cache").rglob("*.cubin"))

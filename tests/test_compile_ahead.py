"""Compiling waiting candidates ahead of their worker, in compile processes (issue 19).

In the interpreter nothing compiles, so the search's mechanism is tested with a stand-in compile
process (:mod:`kernelsmith.testing.compile_stand_in`: the real process's loop, a compile
function that does what a script says) and a stand-in evaluator whose "workers" take a few
milliseconds per candidate (what is under test is when and what is compiled, what reaches a
worker, and what a compile process's crash does, not the harness). One stand-in process serves
the whole module (each test writes its script), started once. The real compile process is
started once too, where no GPU makes its compile fail; GPU tests compile a real candidate.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest
import torch

from kernelsmith._tuner_search import _Search
from kernelsmith.db import open_database
from kernelsmith.db.fingerprint import current_fingerprint
from kernelsmith.db.records import variant_source_hash
from kernelsmith.evaluate import compile_ahead
from kernelsmith.evaluate.compile_ahead import COMPILED, NOT_COMPILED, CompileAhead, CompilePool
from kernelsmith.evaluate.protocol import Candidate, EvalResult, ProtocolError
from kernelsmith.ops import get_op
from kernelsmith.strategies import Strategy, make_strategy
from kernelsmith.strategies.warm import Seeds

EVALUATION_S = 0.03  # how long a stand-in worker takes per candidate
STAND_IN = "kernelsmith.testing.compile_stand_in"


class _SlowEvaluator:
    """``n_workers`` stand-in workers, each taking EVALUATION_S per candidate; records when each
    candidate was submitted (``time.monotonic()``, the stand-in compile process's clock)."""

    mode = "interpreter"

    def __init__(self, n_workers: int = 1) -> None:
        self.n_workers = n_workers
        self.submitted: list[tuple[str, float]] = []  # (candidate key, time submitted)

    def submit(self, spec: Any, candidate: Candidate, **_: Any) -> Future[EvalResult]:
        self.submitted.append((candidate.key, time.monotonic()))
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


class _StandIn:
    """The module's stand-in compile process and its script (see compile_stand_in)."""

    def __init__(self, folder: Path) -> None:
        self.script_path, self.log_path = folder / "script.json", folder / "compiled.jsonl"
        self.pool = CompilePool(1, command=(STAND_IN, str(self.script_path)))

    def script(self, **script: Any) -> CompilePool:
        """Write a test's script, empty the log and have the process started (as a search would
        find it, after its first search); returns the pool to compile in."""
        self.script_path.write_text(json.dumps({"log": str(self.log_path), **script}))
        self.log_path.write_text("")
        self.pool.run(lambda process: process.ensure_started())
        return self.pool

    @property
    def compiled(self) -> list[dict[str, Any]]:
        """What reached the process, in order: {"key", "at", "pid"}."""
        return [json.loads(line) for line in self.log_path.read_text().splitlines()]

    @property
    def keys(self) -> list[str]:
        return [entry["key"] for entry in self.compiled]


@pytest.fixture(scope="module")
def stand_in(tmp_path_factory: pytest.TempPathFactory) -> Iterator[_StandIn]:
    process = _StandIn(tmp_path_factory.mktemp("compile-stand-in"))
    try:
        yield process
    finally:
        process.pool.close()


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


def _search(db: Any, evaluator: _SlowEvaluator, pool: CompilePool | None = None, depth: int = 3,
            max_lost: int = compile_ahead.MAX_LOST_PROCESSES) -> _Search:  # fmt: skip
    """A search of rmsnorm on ``evaluator``'s workers; with ``pool``, compiling ahead in it, up to
    ``depth`` candidates waiting (without, a test gives its own compiler later)."""
    family = get_op("rmsnorm")
    spec = family.spec_for(torch.randn(5, 48), torch.randn(48))
    compiler = None if pool is None else CompileAhead(family, spec, pool, depth=depth, max_lost=max_lost)
    return _Search(family, spec, current_fingerprint("interpreter"), db, evaluator, None,  # type: ignore[arg-type]
                   compile_ahead=compiler)  # fmt: skip


def _grid(search: _Search, budget: int) -> _Counting:
    strategy = _Counting(make_strategy("grid", 0, budget=budget))
    strategy.setup(search.candidates())
    return strategy


def _grid_order(search: _Search, n: int) -> list[str]:
    """The keys of the grid's first ``n`` proposals (the grid is deterministic)."""
    return [c.key for c in _grid(search, n).inner.propose(n)]


def test_waiting_candidates_are_compiled_before_they_reach_a_worker_in_order(tmp_path: Any, stand_in: _StandIn) -> None:
    """One worker: the first proposal goes to it at once; every later one waits, is compiled in
    the compile process meanwhile (in proposal order) and reaches the worker compiled, in
    proposal order. Each compile takes longer than an evaluation, so the worker is free while one
    is compiling: the search waits for it rather than send it uncompiled."""
    seconds = 2 * EVALUATION_S
    pool = stand_in.script(seconds=seconds)
    with open_database(tmp_path / "k.db") as db:
        evaluator = _SlowEvaluator(n_workers=1)
        search = _search(db, evaluator, pool)
        budget = 7
        strategy = _grid(search, budget)
        search._drive(strategy, budget, None)
        proposed = [r.candidate.key for r in search.results]  # recorded as they finish: one worker, in order
        assert len(proposed) == budget and evaluator.keys == proposed
        assert stand_in.keys == proposed[1:]  # all but the first, which found the worker free
        compiled_at = {entry["key"]: entry["at"] for entry in stand_in.compiled}
        for key, submitted_at in evaluator.submitted[1:]:
            assert compiled_at[key] < submitted_at
        assert strategy.most_outstanding == 1 + 3  # the worker's candidate and the queue's depth
        report = search.compile_report
        assert report["enabled"] and report["compiled"] == budget - 1 and report["failed"] == 0
        assert report["lost_processes"] == 0
        assert report["ahead_s"] >= (budget - 1) * seconds and report["waited_s"] > 0.0


def test_a_compile_failure_is_the_candidates_build_failure_and_the_search_goes_on(
    tmp_path: Any, stand_in: _StandIn
) -> None:
    """The grid's second candidate fails to compile in the compile process: it is a stored
    "build" failure with a worker's message and takes no worker; the third raises something
    else, which is not its failure: its worker gets it. The budget is spent all the same."""
    with open_database(tmp_path / "k.db") as db:
        evaluator = _SlowEvaluator(n_workers=1)
        search = _search(db, evaluator)
        budget = 6
        _, broken, odd = _grid_order(search, 3)
        pool = stand_in.script(fail={broken: "at 3:4: unsupported tensor shape"}, odd={odd: "no meta kernel"})
        search.given_compile_ahead = CompileAhead(search.family, search.spec, pool, depth=2)
        search._drive(_grid(search, budget), budget, None)
        failed = [r for r in search.results if r.candidate.key == broken]
        assert len(failed) == 1 and failed[0].status == "build"
        assert failed[0].error == "CompilationError: at 3:4: unsupported tensor shape"
        assert failed[0].source_hash == search.family.variant(failed[0].candidate.variant).source_hash
        assert broken not in evaluator.keys  # it took no worker
        assert odd in evaluator.keys  # not a compile error: its worker decides
        assert search.evaluated == budget and len(evaluator.keys) == budget - 1  # the search went on
        assert sum(t.status == "build" for t in db.trials()) == 1 and len(db.trials()) == budget
        assert search.compile_report["failed"] == 1 and search.compile_report["not_compiled"] == 1


def test_the_setting_off_compiles_nothing_and_keeps_the_old_order(
    tmp_path: Any, monkeypatch: Any, stand_in: _StandIn
) -> None:
    """KERNELSMITH_COMPILE_AHEAD=0: nothing compiled ahead, and never more candidates proposed
    and not yet observed than there are workers (the loop as it was before compile-ahead)."""
    monkeypatch.setenv("KERNELSMITH_COMPILE_AHEAD", "0")
    pool = stand_in.script()
    with open_database(tmp_path / "k.db") as db:
        evaluator = _SlowEvaluator(n_workers=2)
        search = _search(db, evaluator, pool)
        budget = 7
        strategy = _grid(search, budget)
        try:
            search._drive(strategy, budget, None)
        finally:
            assert search.given_compile_ahead is not None
            search.given_compile_ahead.close()
        assert stand_in.keys == [] and search.compile_report["enabled"] is False
        assert strategy.most_outstanding == evaluator.n_workers
        assert len(evaluator.keys) == budget


def test_a_kernel_file_never_reaches_a_compile_process(tmp_path: Any, stand_in: _StandIn) -> None:
    """An agent's or LLM's kernel file waiting for a worker is sent to it uncompiled: the compile
    process never sees it, the worker gets it."""
    source = "# a kernel file's text: only ever built in a worker\n"
    pool = stand_in.script()
    with open_database(tmp_path / "k.db") as db:
        evaluator = _SlowEvaluator(n_workers=1)
        search = _search(db, evaluator, pool)
        built_in = search.candidates()[:3]
        kernel_file = Candidate("from_agent", built_in[0].config, source=source)
        seeds = [built_in[0], kernel_file, built_in[1], built_in[2]]
        strategy = Seeds(seeds)
        strategy.setup(seeds)
        search._drive(strategy, len(seeds), None)
        assert evaluator.keys == [c.key for c in seeds]
        assert stand_in.keys == [built_in[1].key, built_in[2].key]
        assert search.compile_report["not_compiled"] == 1


def test_compile_ahead_refuses_source_even_when_called_directly(stand_in: _StandIn) -> None:
    """:meth:`CompileAhead.start` never sends a kernel file, and the compile process's own
    request handler refuses one (the boundary kept on both sides)."""
    pool = stand_in.script()
    family = get_op("rmsnorm")
    spec = family.spec_for(torch.randn(5, 48), torch.randn(48))
    compiler = CompileAhead(family, spec, pool)
    kernel_file = Candidate("from_llm", _first_config(family, spec), source="# kernel file\n")
    try:
        outcome = compiler.start(kernel_file).result()
        assert outcome.status == NOT_COMPILED and stand_in.keys == []
        built_in = compiler.start(Candidate(family.variants[0].name, kernel_file.config)).result()
        assert built_in.status == COMPILED and stand_in.keys == [built_in.candidate.key]
    finally:
        compiler.close()
    called: list[Candidate] = []
    request = {"kind": "compile", "spec": spec.to_dict(), "candidate": kernel_file.to_json()}
    reply = compile_ahead.compile_request(request, lambda family, spec, candidate: called.append(candidate))
    assert reply["status"] == NOT_COMPILED and called == []


def test_compile_processes_start_only_for_a_waiting_candidate() -> None:
    """A search whose candidates never wait for a worker starts no compile process."""
    family = get_op("rmsnorm")
    compiler = CompileAhead(family, family.spec_for(torch.randn(5, 48), torch.randn(48)))
    compiler.close()
    assert compiler.pool.size == compile_ahead.COMPILE_AHEAD_PROCESSES
    assert all(process.proc is None for process in compiler.pool.processes)


def test_the_tuning_process_reads_only_well_formed_compile_replies() -> None:
    assert compile_ahead._read_reply(b'{"kind": "compiled", "status": "failed", "error": "E: x"}') == ("failed", "E: x")
    for garbage in (b"\x80pickle", b"[]", b'{"kind": "compiled", "status": "ok", "error": ""}',
                    b'{"kind": "compiled", "status": "compiled", "error": 3}',
                    b'{"kind": "compiled", "status": "compiled", "error": "", "extra": 1}'):  # fmt: skip
        with pytest.raises(ProtocolError):
            compile_ahead._read_reply(garbage)


def test_a_lost_compile_process_leaves_the_search_running_and_the_candidate_to_its_worker(
    tmp_path: Any, stand_in: _StandIn, caplog: Any
) -> None:
    """The compile process dies on the grid's third candidate (os._exit), is started again and
    compiles the fourth, segfaults on the fifth and hangs on the sixth (past its time limit):
    each lost candidate goes to its worker as if not compiled ahead, and after the third loss
    compile-ahead is off for the search (the seventh and eighth are not sent). Every candidate
    is evaluated by its worker, in order, and nothing is recorded as the candidates' failure."""
    with open_database(tmp_path / "k.db") as db:
        evaluator = _SlowEvaluator(n_workers=1)
        search = _search(db, evaluator)
        budget = 8
        order = _grid_order(search, budget)
        pool = stand_in.script(exit=[order[2]], segv=[order[4]], hang=[order[5]])
        pool.timeout_s = 1.0
        try:
            search.given_compile_ahead = CompileAhead(search.family, search.spec, pool, depth=3, max_lost=3)
            with caplog.at_level(logging.WARNING, logger="kernelsmith.evaluate.compile_ahead"):
                search._drive(_grid(search, budget), budget, None)
        finally:
            pool.timeout_s = compile_ahead.COMPILE_TIMEOUT_S
        assert evaluator.keys == order and [r.status for r in search.results] == ["ok"] * budget
        assert stand_in.keys == order[1:6]  # none after compile-ahead was switched off
        pids = [entry["pid"] for entry in stand_in.compiled]
        assert pids[0] == pids[1] != pids[2] == pids[3] != pids[4]  # started again after each loss
        outcomes = {o.candidate.key: o for o in search.given_compile_ahead.outcomes}
        assert [outcomes[key].status for key in order[1:6]] == [COMPILED, NOT_COMPILED, COMPILED] + [NOT_COMPILED] * 2
        # after the switch-off: not compiled (or, on a slow host, taken by the worker before that)
        assert all(outcomes[key].status == NOT_COMPILED for key in order[6:] if key in outcomes)
        assert "exit code 3" in outcomes[order[2]].error and "exit code -11" in outcomes[order[4]].error
        assert "time limit" in outcomes[order[5]].error
        report = search.compile_report
        assert report["lost_processes"] == 3 and report["compiled"] == 2 and report["failed"] == 0
        assert any("compile-ahead switched off" in r.getMessage() for r in caplog.records)


def test_the_real_compile_process_compiles_there_not_in_the_tuning_process(tmp_path: Any, monkeypatch: Any) -> None:
    """The real compile process (``python -m kernelsmith.evaluate.compile_ahead``) answers for a
    built-in candidate, and the tuning process neither compiles (its compile_variant would say
    so) nor initializes CUDA. Without a GPU Triton has no driver there: "not compiled", and the
    candidate goes to its worker."""

    def here(*_: Any) -> None:
        raise AssertionError("compiled in the tuning process")

    cuda_inits: list[bool] = []
    cuda_before = torch.cuda.is_initialized()  # (on a GPU, an earlier test may have)
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "cache"))  # a GPU compiles: not into the user's
    monkeypatch.setattr(compile_ahead, "compile_variant", here)
    monkeypatch.setattr(torch.cuda, "_lazy_init", lambda: cuda_inits.append(True))
    pool = CompilePool(1)
    pool.run(lambda process: process.ensure_started())  # else the worker takes the candidate first
    with open_database(tmp_path / "k.db") as db:
        evaluator = _SlowEvaluator(n_workers=1)
        search = _search(db, evaluator)
        search.given_compile_ahead = CompileAhead(search.family, search.spec, pool, depth=1)
        try:
            search._drive(_grid(search, 2), 2, None)
        finally:
            pool.close()
        (outcome,) = search.given_compile_ahead.outcomes
        assert outcome.status in (NOT_COMPILED, COMPILED) and "tuning process" not in outcome.error
        if not torch.cuda.is_available():
            assert outcome.status == NOT_COMPILED and outcome.error  # Triton's error, from there
        assert len(evaluator.keys) == 2 and search.compile_report["lost_processes"] == 0
    assert torch.cuda.is_initialized() == cuda_before and cuda_inits == []


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


_FRESH_TUNING_PROCESS = """
import json, sys, torch
from kernelsmith.evaluate.compile_ahead import CompileAhead
from kernelsmith.evaluate.protocol import Candidate
from kernelsmith.ops import get_op
family = get_op("rmsnorm")
spec = family.spec_for(torch.randn(37, 1000), torch.randn(1000))  # shapes only: no device tensor here
config = family.variants[0].space(spec).configs()[0]
compiler = CompileAhead(family, spec)
outcome = compiler.start(Candidate(family.variants[0].name, config)).result()
compiler.close()
print(json.dumps({"status": outcome.status, "error": outcome.error, "cuda": torch.cuda.is_initialized()}))
"""


@pytest.mark.gpu
def test_compiling_ahead_on_a_gpu_fills_the_cache_and_leaves_cuda_alone_in_the_tuning_process(tmp_path: Any) -> None:
    """On a GPU, in a fresh tuning process: a built-in candidate compiled ahead (by the real
    compile processes) lands in Triton's on-disk cache, and the tuning process never
    initialized CUDA."""
    env = {**os.environ, "TRITON_CACHE_DIR": str(tmp_path / "cache")}
    env.pop("TRITON_INTERPRET", None)
    done = subprocess.run([sys.executable, "-c", _FRESH_TUNING_PROCESS], env=env, capture_output=True, text=True,
                          timeout=300, check=True)  # fmt: skip
    answer = json.loads(done.stdout.strip().splitlines()[-1])
    assert answer == {"status": COMPILED, "error": "", "cuda": False}, done.stderr[-2000:]
    assert any((tmp_path / "cache").rglob("*.cubin"))

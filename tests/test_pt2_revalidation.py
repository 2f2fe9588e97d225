"""The compile backend and ``kernelsmith::kernel`` serve a cache across a driver upgrade, in the interpreter.

A kernel decision stored under a *near* fingerprint (the driver string changed, the rest equal)
is re-validated here by the real harness and re-timed against the baseline, then stored under
this fingerprint and served, through :func:`kernelsmith.dispatch.lookup_or_revalidate`: the
tuner's carry-over, as the decorator's database-only mode uses it (tests/test_cache_upgrade.py).
Interpreter timings never beat eager PyTorch, so the final paired re-timing is told the kernel
took half the baseline's time (test_cache_upgrade's ``executors``); building, validating and
timing the candidate stay real. Inductor is replaced by a recorder that runs its graph.
"""

from __future__ import annotations

import pytest
import torch
import torch._dynamo.testing

import kernelsmith
from kernelsmith import _dispatch_decisions, dispatch, tuner
from kernelsmith.db import Fingerprint, open_database
from kernelsmith.frontends import backend as ks_backend
from test_backend import kernel_ops, record_inductor, spy_runners
from test_cache_upgrade import (
    BUCKET,
    X,
    _here,
    _Made,
    _plant_bucket,
    executors,  # noqa: F401  (a fixture)
    last_dim_softmax,
)

# Each test starts a worker and runs the harness's validation in the interpreter: 40-60 s on two cores.
pytestmark = pytest.mark.slow

UPGRADED = {"driver": "535.104.05 / CUDA 12.2"}  # the record's driver string; this machine's differs


@pytest.fixture
def db_path(tmp_path, monkeypatch) -> str:
    """The default database (what ``kernelsmith::kernel`` reads) holding one softmax kernel
    decision for X's bucket measured under an older driver build."""
    path = str(tmp_path / "cache.db")
    monkeypatch.setenv("KERNELSMITH_DB", path)
    old = Fingerprint(**{**_here().to_dict(), **UPGRADED})
    assert old.near(_here()) and old.hash != _here().hash
    _plant_bucket(path, old)
    dispatch._RUNNERS.clear()
    _dispatch_decisions._NEAR_TRIED.clear()
    torch._dynamo.reset()
    return path


def _revalidated_here(db_path: str) -> bool:
    with open_database(db_path) as db:
        decision = db.get_decision(_here().hash, BUCKET.workload_hash)
    return decision is not None and decision.winner == "kernel" and decision.strategy == tuner.REVALIDATED


def test_kernelsmith_kernel_serves_a_revalidated_record_of_an_older_driver(executors: _Made, db_path, monkeypatch):  # noqa: F811
    calls = spy_runners(monkeypatch)
    (out,) = torch.ops.kernelsmith.kernel("softmax", [X], dispatch.constants_json({"dim": -1}))
    torch.testing.assert_close(out, torch.softmax(X, dim=-1), rtol=1e-5, atol=1e-6)
    assert executors[0].submitted and calls  # re-validated in a worker, then the kernel ran here
    assert _revalidated_here(db_path)


def test_the_backend_serves_a_revalidated_record_of_an_older_driver(executors: _Made, db_path, monkeypatch):  # noqa: F811
    seen = record_inductor(monkeypatch)
    backend = ks_backend.KernelsmithBackend(db=db_path, compare=False)
    with torch.no_grad():
        out = torch.compile(last_dim_softmax, backend=backend)(X)
    (site,) = backend.sites
    assert site.status == "replaced", site.reason
    assert kernel_ops(seen[-1]) == ["softmax"]
    torch.testing.assert_close(out, torch.softmax(X, dim=-1), rtol=1e-5, atol=1e-6)
    assert executors[0].submitted and _revalidated_here(db_path)


def test_a_cold_compile_of_a_decorated_function_carries_a_revalidated_record(executors: _Made, db_path,  # noqa: F811
                                                                             monkeypatch):
    """Decorate-then-compile after the upgrade: the compile plan finds no winner under this
    fingerprint, re-validates the near fingerprint's (every bucket it tuned) and carries it."""
    calls = spy_runners(monkeypatch)
    fn = kernelsmith.optimize(last_dim_softmax, mode="db", db=db_path)
    counter = torch._dynamo.testing.CompileCounterWithBackend("eager")
    out = torch.compile(fn, backend=counter, fullgraph=True)(X)  # no eager call first
    torch.testing.assert_close(out, torch.softmax(X, dim=-1), rtol=1e-5, atol=1e-6)
    (graph,) = counter.graphs
    assert kernel_ops(graph) == ["softmax"]
    assert executors[0].submitted and calls and _revalidated_here(db_path)


def test_a_record_that_does_not_revalidate_is_not_served_by_the_op(db_path, monkeypatch):
    """Without the timing stand-in the interpreter's kernel loses to PyTorch on the re-timing:
    nothing is stored under this fingerprint and the op computes the reference."""
    calls = spy_runners(monkeypatch)
    (out,) = torch.ops.kernelsmith.kernel("softmax", [X], dispatch.constants_json({"dim": -1}))
    torch.testing.assert_close(out, torch.softmax(X, dim=-1), rtol=1e-5, atol=1e-6)
    assert calls == [] and not _revalidated_here(db_path)

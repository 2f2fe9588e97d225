"""The compile backend and ``kernelsmith::kernel`` serve a cache across a driver upgrade, in the interpreter.

A kernel decision stored under a *near* fingerprint (the driver string changed, the rest equal)
is re-validated here by the real harness and re-timed against the baseline, then stored under
this fingerprint and served, through :func:`kernelsmith.dispatch.lookup_or_revalidate`: the
tuner's carry-over, as the decorator's database-only mode uses it (tests/test_cache_upgrade.py).
Interpreter timings never beat eager PyTorch, so the final paired re-timing is told the kernel
took half the baseline's time (test_cache_upgrade's ``executors``); building, validating and
timing the candidate stay real. Inductor is replaced by a recorder that runs its graph.

Training graphs: with the forward (rmsnorm) tuned under this fingerprint and only its backward
family's record under the near one, a decorated training step compiled cold and a backend site
with symbolic sizes re-validate the backward record at compile time and carry it in the graph.
"""

from __future__ import annotations

import pytest
import torch
import torch._dynamo.testing

import kernelsmith
from kernelsmith import _dispatch_decisions, dispatch, tuner
from kernelsmith.db import DecisionRecord, Fingerprint, open_database
from kernelsmith.frontends import backend as ks_backend
from kernelsmith.ops import get_op
from kernelsmith.spec import OpSpec
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
from test_decorator import hf_rmsnorm
from test_pt2_dynamic import served_rows

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


def _revalidated_here(db_path: str, bucket: OpSpec = BUCKET) -> bool:
    with open_database(db_path) as db:
        decision = db.get_decision(_here().hash, bucket.workload_hash)
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


# ---- training graphs: the backward family's near records ----------------------------------------
NORM = get_op("rmsnorm")
XN = torch.randn(6, 32)
WN = torch.randn(32) * 0.5 + 1
NORM_BUCKET = NORM.bucket(NORM.spec_for(XN, WN, eps=1e-6))


def _backward_bucket() -> OpSpec:
    """The bucket of rmsnorm's backward family at XN, WN, as the op's autograd formula builds its inputs."""
    spec = NORM.spec_for(XN, WN, eps=1e-6)
    outputs = tuple(torch.empty(t.shape, dtype=t.torch_dtype) for t in NORM.output_specs(spec))
    grads = tuple(torch.randn_like(o) for o in outputs)
    backward = get_op(str(NORM.backward))
    return backward.bucket(backward.spec_for(*NORM.backward_inputs(grads, (XN, WN), outputs), eps=1e-6))


BACKWARD_BUCKET = _backward_bucket()


def _plant(path: str, fp: Fingerprint, bucket: OpSpec) -> None:
    """A kernel decision for ``bucket`` with its family's first variant and config, measured under ``fp``."""
    variant = get_op(bucket.op).variants[0]
    config = variant.space(bucket).configs()[0]
    with open_database(path) as db:
        db.put_fingerprint(fp)
        db.put_decision(DecisionRecord(fp.hash, bucket.workload_hash, bucket.op, bucket.to_dict(), "kernel",
                                       variant.name, variant.source_hash, config.to_dict(), strategy="grid"))


@pytest.fixture
def training_db(tmp_path, monkeypatch) -> str:
    """The default database holding rmsnorm's forward winner under this fingerprint and its
    backward family's winner under an older driver build only."""
    path = str(tmp_path / "training.db")
    monkeypatch.setenv("KERNELSMITH_DB", path)
    _plant(path, _here(), NORM_BUCKET)
    _plant(path, Fingerprint(**{**_here().to_dict(), **UPGRADED}), BACKWARD_BUCKET)
    assert not _revalidated_here(path, BACKWARD_BUCKET)
    dispatch._RUNNERS.clear()
    _dispatch_decisions._NEAR_TRIED.clear()
    torch._dynamo.reset()
    return path


def _carried_ops(decisions: str) -> set[str]:
    return {record.op for record in dispatch.parse_decisions(decisions).values()} if decisions else set()


def _graph_carries(gm: torch.fx.GraphModule) -> set[str]:
    """The ops whose decisions the graph's ``kernelsmith::kernel`` calls carry."""
    return {op for n in gm.graph.nodes if n.target is torch.ops.kernelsmith.kernel.default
            for op in _carried_ops(n.args[3])}


def _step_gradients(compiled, dynamic_rows: bool = False) -> tuple[torch.Tensor, ...]:
    """The compiled step's gradients of XN and WN beside the original function's; with
    ``dynamic_rows``, XN's row count is a symbolic size of the graph."""
    xs, ws = XN.clone().requires_grad_(), WN.clone().requires_grad_()
    if dynamic_rows:
        torch._dynamo.mark_dynamic(xs, 0)
    compiled(xs, ws).float().pow(2).sum().backward()
    xr, wr = XN.clone().requires_grad_(), WN.clone().requires_grad_()
    hf_rmsnorm(xr, wr).float().pow(2).sum().backward()
    return xs.grad, xr.grad, ws.grad, wr.grad


def test_a_cold_compiled_training_step_carries_a_revalidated_backward(executors: _Made, training_db,  # noqa: F811
                                                                       monkeypatch):
    """The forward is stored here, so before this change the graph carried it alone; now the
    compile plan re-validates the backward family's near record and carries it too."""
    calls = spy_runners(monkeypatch)
    fn = kernelsmith.optimize(hf_rmsnorm, mode="db", db=training_db)
    counter = torch._dynamo.testing.CompileCounterWithBackend("aot_eager")
    gx, rx, gw, rw = _step_gradients(torch.compile(fn, backend=counter, fullgraph=True))  # no eager call first
    torch.testing.assert_close(gx, rx, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(gw, rw, atol=1e-4, rtol=1e-4)
    (graph,) = counter.graphs
    assert kernel_ops(graph) == ["rmsnorm"]
    assert _graph_carries(graph) == {"rmsnorm", "rmsnorm_backward"}
    assert len(executors) == 1 and executors[0].submitted  # one re-validation: the backward's
    assert _revalidated_here(training_db, BACKWARD_BUCKET)
    assert served_rows("rmsnorm") == {6: True} and served_rows("rmsnorm_backward") == {6: True}
    assert len(calls) == 2  # the forward kernel and the re-validated backward kernel ran


def test_a_backward_that_loses_the_retiming_is_not_carried(training_db, monkeypatch):
    """Without the timing stand-in the interpreter's backward kernel loses the re-timing: the
    graph carries the forward only, nothing is stored here and the original backward runs."""
    fn = kernelsmith.optimize(hf_rmsnorm, mode="db", db=training_db)
    counter = torch._dynamo.testing.CompileCounterWithBackend("aot_eager")
    gx, rx, gw, rw = _step_gradients(torch.compile(fn, backend=counter, fullgraph=True))
    torch.testing.assert_close(gx, rx, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(gw, rw, atol=1e-4, rtol=1e-4)
    (graph,) = counter.graphs
    assert _graph_carries(graph) == {"rmsnorm"}
    assert not _revalidated_here(training_db, BACKWARD_BUCKET)
    assert served_rows("rmsnorm") == {6: True} and served_rows("rmsnorm_backward") == {6: False}


def test_a_dynamic_backend_training_site_carries_a_revalidated_backward(executors: _Made, training_db,  # noqa: F811
                                                                         monkeypatch):
    record_inductor(monkeypatch)
    backend = ks_backend.KernelsmithBackend(db=training_db, compare=False)
    # symbolic rows, a static width: the site's graph carries its winners (_resolve_dynamic)
    gx, rx, gw, rw = _step_gradients(torch.compile(hf_rmsnorm, backend=backend), dynamic_rows=True)
    torch.testing.assert_close(gx, rx, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(gw, rw, atol=1e-4, rtol=1e-4)
    (site,) = backend.sites
    assert site.status == "replaced" and site.needs_grad, site.reason
    assert _carried_ops(site.decisions) == {"rmsnorm", "rmsnorm_backward"}
    assert executors[0].submitted and _revalidated_here(training_db, BACKWARD_BUCKET)
    assert served_rows("rmsnorm_backward") == {6: True}


def test_a_static_backend_training_site_serves_a_revalidated_backward(executors: _Made, training_db,  # noqa: F811
                                                                       monkeypatch):
    """Static sizes: the site's backward bucket is looked up (and re-validated) like its forward."""
    seen = record_inductor(monkeypatch)
    backend = ks_backend.KernelsmithBackend(db=training_db, compare=False)
    gx, rx, gw, rw = _step_gradients(torch.compile(hf_rmsnorm, backend=backend, dynamic=False))
    torch.testing.assert_close(gx, rx, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(gw, rw, atol=1e-4, rtol=1e-4)
    (site,) = backend.sites
    assert site.status == "replaced" and site.needs_grad, site.reason
    assert [op for op, _, _ in site.runners] == ["rmsnorm", "rmsnorm_backward"]
    assert kernel_ops(seen[-1]) == ["rmsnorm"]
    assert executors[0].submitted and _revalidated_here(training_db, BACKWARD_BUCKET)

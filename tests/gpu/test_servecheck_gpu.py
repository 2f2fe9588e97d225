"""Serve checks on the GPU (DESIGN.md rule 12): off, the check path is never entered; on, a CUDA
graph can capture a served call (the check is put off until the capture is over)."""

from __future__ import annotations

import pytest
import torch

import kernelsmith
from kernelsmith import dispatch, servecheck
from kernelsmith.db import DecisionRecord, current_fingerprint, open_database
from kernelsmith.evaluate.errors import check_close
from kernelsmith.ops import get_op

pytestmark = pytest.mark.gpu

RMSNORM = get_op("rmsnorm")


def hf_rmsnorm(x, weight, eps=1e-6):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * weight


@pytest.fixture
def served(tmp_path, monkeypatch):
    """A decorated RMSNorm whose stored winner (the first variant, its first config) is served on
    the GPU, with inputs; the serve checks' process state is this test's own."""
    monkeypatch.setattr(servecheck, "_DISABLED", {})
    monkeypatch.setattr(dispatch, "_RUNNERS", {})
    for name in ("KERNELSMITH_CHECK", "KERNELSMITH_CHECK_RATE", "KERNELSMITH_CHECK_FIRST"):
        monkeypatch.delenv(name, raising=False)
    db = str(tmp_path / "serve.db")
    x = torch.randn(512, 1024, dtype=torch.bfloat16, device="cuda")
    w = torch.randn(1024, dtype=torch.bfloat16, device="cuda")
    bucket = RMSNORM.bucket(RMSNORM.spec_for(x, w, eps=1e-6))
    variant = RMSNORM.variants[0]
    fp = current_fingerprint("gpu")
    with open_database(db) as database:
        database.put_fingerprint(fp)
        database.put_decision(DecisionRecord(
            fp.hash, bucket.workload_hash, "rmsnorm", bucket.to_dict(), "kernel", variant.name,
            variant.source_hash, variant.space(bucket).configs()[0].to_dict(), {"note": "stored by a test"}))
    return db, x, w


def _never(*args, **kwargs):
    raise AssertionError("the check path was entered")


def test_with_checking_off_the_check_path_is_never_entered(served, monkeypatch):
    db, x, w = served
    monkeypatch.setenv("KERNELSMITH_CHECK", "0")
    fn = kernelsmith.optimize(hf_rmsnorm, mode="db", db=db)
    fn(x, w)  # the slow path adopts the runner
    monkeypatch.setattr(servecheck.ServeCheck, "due", _never)
    monkeypatch.setattr(servecheck.ServeCheck, "run", _never)
    monkeypatch.setattr(dispatch.CheckedRunner, "_checked", _never)
    for _ in range(2000):  # more than a 1-in-1000 sample would leave unchecked
        y = fn(x, w)
    torch.cuda.synchronize()
    assert fn.kernelsmith.stats["kernel_calls"] == 2000 and fn.kernelsmith.stats["checks"] == 0
    spec = RMSNORM.spec_for(x, w, eps=1e-6)
    assert check_close(y, RMSNORM.reference_fp64(spec, (x, w))[0], hf_rmsnorm(x, w), RMSNORM.tolerance) is None
    # the op path too: no check state is made at all
    dispatch.install_runner("rmsnorm", [x, w], dispatch.constants_json({"eps": 1e-6}),
                            dispatch.build_runner(RMSNORM, spec, _decision(db, spec)))
    served_op = dispatch.runner_for("rmsnorm", [x, w], dispatch.constants_json({"eps": 1e-6}))
    assert served_op is not None and served_op.check is None
    for _ in range(2000):
        torch.ops.kernelsmith.kernel("rmsnorm", [x, w], dispatch.constants_json({"eps": 1e-6}))
    torch.cuda.synchronize()


def _decision(db: str, spec) -> DecisionRecord:
    with open_database(db) as database:
        decision = dispatch.stored_decision(database, "gpu", RMSNORM.bucket(spec))
    assert decision is not None
    return decision


def test_a_cuda_graph_captures_a_served_call_with_checking_on(served):
    db, x, w = served
    fn = kernelsmith.optimize(hf_rmsnorm, mode="db", db=db)  # checks on, the default
    fn(x, w)  # the slow path: recognize, adopt (this launch compiles the kernel, outside any capture)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = fn(x, w)  # the first served call: its check is due, and put off (it would synchronize)
    assert fn.kernelsmith.stats["checks"] == 0 and fn.kernelsmith.stats["kernel_calls"] == 1
    x.copy_(torch.randn_like(x))  # a replay computes on whatever the captured input holds now
    graph.replay()
    torch.cuda.synchronize()
    spec = RMSNORM.spec_for(x, w, eps=1e-6)
    assert check_close(y, RMSNORM.reference_fp64(spec, (x, w))[0], hf_rmsnorm(x, w), RMSNORM.tolerance) is None
    fn(x, w)  # out of the capture, the due check is made
    assert fn.kernelsmith.stats["checks"] == 1 and fn.kernelsmith.stats["kernel_calls"] == 2
    assert not fn.kernelsmith.reasons  # and passed: the key still serves the kernel

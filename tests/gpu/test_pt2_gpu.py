"""PyTorch 2 paths on the GPU (issue 14): dynamic shapes, programs that carry their kernels,
decorate-then-compile, training steps, CUDA graphs (``mode="reduce-overhead"``) around a decorated
function and the backend, and opcheck on CUDA tensors. The compiles use Inductor itself.

Winners are stored as a GPU tuning run would store them (each family's first variant and first
config), so the tests need no search; a kernel is known to have served a call when
``kernelsmith::kernel``'s table holds a runner for that call's shape.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch
import torch._dynamo.testing

import kernelsmith
from gpu.test_stress_data_gpu import SHAPES
from kernelsmith import dispatch
from kernelsmith.db import DecisionRecord, current_fingerprint, open_database
from kernelsmith.ops import get_op, op_names
from kernelsmith.spec import OpSpec
from test_decorator import hf_rmsnorm, last_dim_softmax

pytestmark = pytest.mark.gpu
WIDTH = 256


@pytest.fixture
def db(tmp_path, monkeypatch) -> str:
    path = str(tmp_path / "pt2-gpu.db")
    monkeypatch.setenv("KERNELSMITH_DB", path)
    torch._dynamo.reset()
    dispatch._RUNNERS.clear()
    return path


def store(db: str, spec: OpSpec) -> None:
    """A "kernel" decision for the bucket of ``spec`` on this GPU, as a tuning run stores it."""
    family = get_op(spec.op)
    bucket = family.bucket(spec)
    variant = family.variants[0]
    config = variant.space(bucket).configs()[0]
    fp = current_fingerprint("gpu")
    with open_database(db) as database:
        database.put_fingerprint(fp)
        database.put_decision(DecisionRecord(
            fp.hash, bucket.workload_hash, spec.op, bucket.to_dict(), "kernel", variant.name, variant.source_hash,
            config.to_dict(), {"note": "stored by a GPU test"}))


def store_rmsnorm(db: str, rows: int, dtype: torch.dtype = torch.bfloat16, backward: bool = False) -> None:
    x = torch.randn(rows, WIDTH, device="cuda", dtype=dtype)
    w = torch.ones(WIDTH, device="cuda", dtype=dtype)
    store(db, get_op("rmsnorm").spec_for(x, w, eps=1e-6))
    if backward:
        store(db, get_op("rmsnorm_backward").spec_for(torch.randn_like(x), x, w, eps=1e-6))


def served(op: str) -> dict[int, bool]:
    return {key[3][0][0]: runner is not None for key, runner in dispatch._RUNNERS.items() if key[0] == op}


def test_dynamic_true_one_graph_under_inductor(db):
    store_rmsnorm(db, 64)
    fn = kernelsmith.optimize(hf_rmsnorm, mode="db")
    counter = torch._dynamo.testing.CompileCounterWithBackend("inductor")
    compiled = torch.compile(fn, backend=counter, dynamic=True)
    w = torch.randn(WIDTH, device="cuda", dtype=torch.bfloat16)
    for rows in (33, 40, 64, 100):
        x = torch.randn(rows, WIDTH, device="cuda", dtype=torch.bfloat16)
        torch.testing.assert_close(compiled(x, w), hf_rmsnorm(x, w), atol=2e-2, rtol=2e-2)
    assert counter.frame_count == 1
    assert served("rmsnorm") == {33: True, 40: True, 64: True, 100: False}


def test_mark_dynamic_and_a_cold_compile_emit_the_op(db):
    store_rmsnorm(db, 64)
    fn = kernelsmith.optimize(hf_rmsnorm, mode="db")
    compiled = torch.compile(fn, fullgraph=True)  # no eager call first
    w = torch.randn(WIDTH, device="cuda", dtype=torch.bfloat16)
    for rows in (48, 64):
        x = torch.randn(rows, WIDTH, device="cuda", dtype=torch.bfloat16)
        torch._dynamo.mark_dynamic(x, 0)
        torch.testing.assert_close(compiled(x, w), hf_rmsnorm(x, w), atol=2e-2, rtol=2e-2)
    assert fn.kernelsmith.stats["calls"] == 0
    assert served("rmsnorm") == {48: True, 64: True}


@pytest.mark.parametrize("fullgraph", [False, True])
def test_a_tuned_training_step_compiles_under_inductor(db, fullgraph):
    store_rmsnorm(db, 64, dtype=torch.float32, backward=True)
    fn = kernelsmith.optimize(hf_rmsnorm, mode="db")
    x = torch.randn(64, WIDTH, device="cuda", requires_grad=True)
    w = (torch.randn(WIDTH, device="cuda") * 0.5 + 1).requires_grad_()
    fn(x, w)
    fn(x, w).sum().backward()  # warmed up eagerly
    x.grad = w.grad = None
    compiled = torch.compile(lambda a, b: fn(a, b).pow(2).sum(), fullgraph=fullgraph)
    compiled(x, w).backward()
    gx, gw = x.grad.clone(), w.grad.clone()
    x.grad = w.grad = None
    hf_rmsnorm(x, w).pow(2).sum().backward()
    torch.testing.assert_close(gx, x.grad, atol=1e-3, rtol=1e-3)
    torch.testing.assert_close(gw, w.grad, atol=1e-2, rtol=1e-3)
    assert served("rmsnorm_backward") == {64: True}


def test_cuda_graphs_around_a_decorated_function(db):
    store_rmsnorm(db, 64)
    fn = kernelsmith.optimize(hf_rmsnorm, mode="db")
    compiled = torch.compile(fn, mode="reduce-overhead")
    x = torch.randn(64, WIDTH, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(WIDTH, device="cuda", dtype=torch.bfloat16)
    for _ in range(5):  # warm-up, capture, replays
        y = compiled(x, w)
    torch.testing.assert_close(y, hf_rmsnorm(x, w), atol=2e-2, rtol=2e-2)
    assert served("rmsnorm") == {64: True}


def test_cuda_graphs_around_the_backend(db):
    x = torch.randn(64, WIDTH, device="cuda")
    store(db, get_op("softmax").spec_for(x))
    backend = kernelsmith.backend(db=db, compare=False)
    compiled = torch.compile(last_dim_softmax, backend=backend, mode="reduce-overhead")
    for _ in range(5):
        y = compiled(x)
    torch.testing.assert_close(y, torch.softmax(x, -1))
    assert [s.status for s in backend.sites] == ["replaced"]


def test_an_exported_program_runs_its_kernel_with_an_empty_database(db, tmp_path):
    store_rmsnorm(db, 64)

    class Norm(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.weight = torch.nn.Parameter(torch.randn(WIDTH, device="cuda", dtype=torch.bfloat16))
            self.norm = kernelsmith.optimize(hf_rmsnorm, mode="db")

        def forward(self, x):
            return self.norm(x, self.weight)

    with torch.no_grad():
        program = torch.export.export(Norm(), (torch.randn(48, WIDTH, device="cuda", dtype=torch.bfloat16),),
                                      dynamic_shapes={"x": {0: torch.export.Dim("batch", min=2, max=4096)}})
    path = str(tmp_path / "norm.pt2")
    torch.export.save(program, path)
    code = textwrap.dedent(f"""
        import torch, kernelsmith
        from kernelsmith import dispatch
        program = torch.export.load({path!r})
        with torch.no_grad():
            program.module()(torch.randn(50, {WIDTH}, device="cuda", dtype=torch.bfloat16))
        print([runner.runner.variant for runner in dispatch._RUNNERS.values() if runner is not None])
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "KERNELSMITH_DB": str(tmp_path / "empty.db")})
    assert done.returncode == 0, done.stderr
    assert get_op("rmsnorm").variants[0].name in done.stdout


@pytest.mark.parametrize("name", op_names())
def test_opcheck_on_cuda_tensors(db, name):
    family = get_op(name)
    spec = family.spec({**SHAPES, "decode_attention": (1, 4, 19, 16)}.get(name, (13, 40)), "float32")
    inputs = list(family.make_inputs(spec, seed=0, device="cuda"))
    if family.backward is not None:
        inputs = [t.requires_grad_() if t.dtype.is_floating_point else t for t in inputs]
    torch.library.opcheck(torch.ops.kernelsmith.kernel.default,
                          (name, inputs, dispatch.constants_json(dict(spec.constants))))

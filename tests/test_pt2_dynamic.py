"""Dynamic shapes through the decorator, the custom op and the compile backend (issue 14, item 1).

In the Triton interpreter (conftest). Winners are stored directly, as a GPU run would have; a
kernel is known to have served a call when ``kernelsmith::kernel``'s table holds a runner (not
None, which is the PyTorch reference) for that call's shape.
"""

from __future__ import annotations

import pytest
import torch
import torch._dynamo.testing

import kernelsmith
from kernelsmith import dispatch
from kernelsmith.db import DecisionRecord, current_fingerprint, open_database
from kernelsmith.ops import get_op
from test_decorator import hf_rmsnorm, last_dim_softmax, store_decision

WIDTH = 32


@pytest.fixture
def db(tmp_path, monkeypatch) -> str:
    path = str(tmp_path / "pt2.db")
    monkeypatch.setenv("KERNELSMITH_DB", path)  # the op's run-time lookups read the same database
    torch._dynamo.reset()
    dispatch._RUNNERS.clear()
    return path


def served_rows(op: str) -> dict[int, bool]:
    """Row count of each call the op saw -> whether a kernel (not the reference) served it."""
    return {key[3][0][0]: runner is not None for key, runner in dispatch._RUNNERS.items() if key[0] == op}


def test_dynamic_true_makes_one_graph_and_each_shape_picks_its_bucket(db):
    store_decision(db, get_op("softmax").spec_for(torch.randn(8, WIDTH)))  # the 8-row bucket: rows 5..8
    fn = kernelsmith.optimize(last_dim_softmax, mode="db", db=db)
    counter = torch._dynamo.testing.CompileCounter()
    compiled = torch.compile(fn, backend=counter, dynamic=True, fullgraph=True)
    rows = [3, 5, 6, 7, 8, 9, 12]
    for n in rows:
        x = torch.randn(n, WIDTH)
        torch.testing.assert_close(compiled(x), torch.softmax(x, -1), atol=1e-6, rtol=1e-5)
    assert counter.frame_count == 1  # was 8 graphs for 12 shapes: the call key specialized sizes
    assert served_rows("softmax") == {n: 5 <= n <= 8 for n in rows}


def test_mark_dynamic_keeps_the_batch_symbolic(db):
    store_decision(db, get_op("rmsnorm").spec_for(torch.randn(16, WIDTH), torch.ones(WIDTH), eps=1e-6))
    fn = kernelsmith.optimize(hf_rmsnorm, mode="db", db=db)
    counter = torch._dynamo.testing.CompileCounter()
    compiled = torch.compile(fn, backend=counter, fullgraph=True)
    w = torch.randn(WIDTH)
    for n in (10, 13, 16):
        x = torch.randn(n, WIDTH)
        torch._dynamo.mark_dynamic(x, 0)  # raised ConstraintViolationError: the key read the size
        torch.testing.assert_close(compiled(x, w), hf_rmsnorm(x, w), atol=1e-5, rtol=1e-4)
    assert counter.frame_count == 1
    assert served_rows("rmsnorm") == {10: True, 13: True, 16: True}


class Norm(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(WIDTH))
        self.norm = kernelsmith.optimize(hf_rmsnorm, mode="db")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x, self.weight)


def test_export_with_a_dynamic_batch_holds_the_op_and_serves_every_batch(db):
    store_decision(db, get_op("rmsnorm").spec_for(torch.randn(16, WIDTH), torch.ones(WIDTH), eps=1e-6))
    model = Norm()
    batch = torch.export.Dim("batch", min=2, max=64)
    with torch.no_grad():  # TypeError: unhashable type: non-nested SymInt, from the call key
        program = torch.export.export(model, (torch.randn(12, WIDTH),), dynamic_shapes={"x": {0: batch}})
    targets = [n.target for n in program.graph.nodes if n.op == "call_function"]
    assert torch.ops.kernelsmith.kernel.default in targets
    for n in (9, 16, 40):
        x = torch.randn(n, WIDTH)
        with torch.no_grad():
            torch.testing.assert_close(program.module()(x), hf_rmsnorm(x, model.weight), atol=1e-5, rtol=1e-4)
    assert served_rows("rmsnorm") == {9: True, 16: True, 40: False}  # 40 rows: the 64-row bucket, not tuned


def test_the_backend_replaces_sites_in_a_dynamic_graph(db):
    store_decision(db, get_op("softmax").spec_for(torch.randn(8, WIDTH)))
    backend = kernelsmith.backend(db=db)
    compiled = torch.compile(last_dim_softmax, backend=backend, dynamic=True)
    for n in (5, 7, 11):
        x = torch.randn(n, WIDTH)
        torch.testing.assert_close(compiled(x), torch.softmax(x, -1), atol=1e-6, rtol=1e-5)
    assert [s.status for s in backend.sites] == ["replaced"]  # was: passed through untouched
    assert served_rows("softmax") == {5: True, 7: True, 11: False}


def test_a_workload_tuned_ahead_of_time_for_its_exact_rows_is_served(db):
    x = torch.randn(30, WIDTH)  # the decorator's bucket is 32 rows; kernelsmith.tune stores exactly 30
    family = get_op("softmax")
    spec = family.spec_for(x)
    variant = family.variants[0]
    fp = current_fingerprint("interpreter")
    with open_database(db) as database:
        database.put_fingerprint(fp)
        database.put_decision(DecisionRecord(
            fp.hash, spec.workload_hash, "softmax", spec.to_dict(), "kernel", variant.name, variant.source_hash,
            variant.space(spec).configs()[0].to_dict(), {"note": "as kernelsmith.tune stores it"}))
    fn = kernelsmith.optimize(last_dim_softmax, mode="db", db=db)
    fn(x)
    fn(x)
    assert fn.kernelsmith.stats["kernel_calls"] == 1, fn.kernelsmith.reasons


def test_autocast_is_part_of_the_call_key(db):
    fn = kernelsmith.optimize(last_dim_softmax, mode="db", db=db)
    x = torch.randn(4, WIDTH)
    fn(x)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        fn(x)
    assert len(fn.kernelsmith.table) == 2


def test_dynamic_true_serves_a_norm_whose_eps_dynamo_made_symbolic(db):
    # Under dynamic=True Dynamo passes hf_rmsnorm's float eps as a tensor read back with .item(),
    # and makes the width symbolic too; the backend found no site (the .item() between the norm's
    # first node and its output was taken for a side effect) and said nothing.
    store_decision(db, get_op("rmsnorm").spec_for(torch.randn(16, WIDTH), torch.ones(WIDTH), eps=1e-6))
    backend = kernelsmith.backend(db=db)
    compiled = torch.compile(hf_rmsnorm, backend=backend, dynamic=True)
    w = torch.randn(WIDTH)
    for n in (10, 13, 16):
        x = torch.randn(n, WIDTH)
        torch.testing.assert_close(compiled(x, w), hf_rmsnorm(x, w), atol=1e-5, rtol=1e-4)
    # one graph reported: the first trace, whose guard specialized eps, was retraced with eps constant
    assert [(s.op, s.status) for s in backend.sites] == [("rmsnorm", "replaced")]
    assert backend.sites[0].constants == {"eps": 1e-6}
    assert served_rows("rmsnorm") == {10: True, 13: True, 16: True}


def test_another_eps_recompiles_instead_of_reusing_the_baked_constant(db):
    store_decision(db, get_op("rmsnorm").spec_for(torch.randn(16, WIDTH), torch.ones(WIDTH), eps=1e-6))
    backend = kernelsmith.backend(db=db)
    compiled = torch.compile(hf_rmsnorm, backend=backend, dynamic=True)
    w = torch.randn(WIDTH)
    x = torch.randn(12, WIDTH) * 1e-2  # small rows: eps=0.5 vs 1e-6 changes the result by far more than tolerance
    torch.testing.assert_close(compiled(x, w), hf_rmsnorm(x, w), atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(compiled(x, w, 0.5), hf_rmsnorm(x, w, 0.5), atol=1e-5, rtol=1e-4)
    assert sorted(s.constants["eps"] for s in backend.sites) == [1e-6, 0.5]  # the second graph's own constant


@torch._dynamo.config.patch(capture_dynamic_output_shape_ops=True)  # x[keep] stays in the graph
def test_a_softmax_with_a_data_dependent_row_count_is_not_served_and_says_why(db, caplog):
    def picked_softmax(x, keep):
        return torch.softmax(x[keep], dim=-1)  # x[keep]: a row count known only at run time

    backend = kernelsmith.backend(db=db)
    compiled = torch.compile(picked_softmax, backend=backend, fullgraph=True)
    x, keep = torch.randn(8, WIDTH), torch.arange(8) % 2 == 0
    with caplog.at_level("INFO", logger="kernelsmith.frontends.backend"):
        torch.testing.assert_close(compiled(x, keep), torch.softmax(x[keep], -1))
    assert backend.sites == []
    notes = [r.getMessage() for r in caplog.records if "data-dependent" in r.getMessage()]
    assert any(m.startswith("softmax at ") and "not served" in m for m in notes), notes
    assert any("no op kernelsmith recognizes" in r.getMessage() and "data-dependent" in r.getMessage()
               for r in caplog.records)


def test_an_int_argument_the_constants_are_read_at_is_guarded(db):
    # An int argument stays a SymInt under dynamic=True (no retrace, unlike a float): without the
    # backend's guard on it, eps=3 ran the graph compiled for eps=2 with the kernel's eps=2.
    def rmsnorm_int_eps(x, w, eps):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * w

    store_decision(db, get_op("rmsnorm").spec_for(torch.randn(16, WIDTH), torch.ones(WIDTH), eps=2.0))
    backend = kernelsmith.backend(db=db)
    compiled = torch.compile(rmsnorm_int_eps, backend=backend, dynamic=True)
    w, x = torch.randn(WIDTH), torch.randn(12, WIDTH) * 0.1
    for eps in (2, 3):
        torch.testing.assert_close(compiled(x, w, eps), rmsnorm_int_eps(x, w, eps), atol=1e-5, rtol=1e-4)
    assert [(s.status, s.constants["eps"]) for s in backend.sites] == [("replaced", 2.0), ("not tuned", 3.0)]


def test_a_view_on_the_batch_symbol_before_a_softmax_keeps_one_graph(db):
    # x.view(n, -1) reads the row count as a SymInt input of a candidate region: guarding it, as an
    # eps is guarded, would recompile for every batch. (Today the recognizer turns down the region
    # holding the view anyway; the size-symbol filter in _recognize_region is the second line.)
    def viewed_softmax(x):
        return torch.softmax(x.view(x.shape[0], -1) * 2.0, dim=-1)

    store_decision(db, get_op("softmax").spec_for(torch.randn(8, WIDTH)))
    counter = torch._dynamo.testing.CompileCounterWithBackend(kernelsmith.backend(db=db))
    compiled = torch.compile(viewed_softmax, backend=counter, dynamic=True)
    for n in (5, 7):
        x = torch.randn(n, WIDTH)
        torch.testing.assert_close(compiled(x), viewed_softmax(x), atol=1e-6, rtol=1e-5)
    assert counter.frame_count == 1

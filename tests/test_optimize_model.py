"""kernelsmith.optimize_model and `kernelsmith optimize`: ranking by the plan, the budget, the report.

Interpreter mode on CPU tensors (conftest sets TRITON_INTERPRET=1). Inductor is replaced by a
recorder that runs the graph eagerly (tests/test_backend.py compiles with the real one).
"""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

import kernelsmith
from kernelsmith.db import DecisionRecord, current_fingerprint, open_database
from kernelsmith.frontends.backend import KernelsmithBackend
from kernelsmith.models import example_inputs, get_model
from kernelsmith.ops import get_op
from kernelsmith.whole_model.optimize import Workload, rank
from kernelsmith.whole_model.profile import Plan, PlanRow


def store_winners(db: str, model, inputs) -> None:
    """A "kernel" decision for every site of ``model``, as a GPU run would have stored."""
    backend = KernelsmithBackend(discover=True)
    with torch.no_grad():
        torch.compile(model, backend=backend)(*inputs)
    fp = current_fingerprint("interpreter")
    with open_database(db) as database:
        database.put_fingerprint(fp)
        for site in backend.sites:
            family = get_op(site.op)
            bucket, variant = family.bucket(site.spec), family.variants[0]
            database.put_decision(DecisionRecord(
                fp.hash, bucket.workload_hash, site.op, bucket.to_dict(), "kernel", variant.name,
                variant.source_hash, variant.space(bucket).configs()[0].to_dict(), {"speedup": 1.5}))


def record_inductor(monkeypatch) -> list[torch.fx.GraphModule]:
    """compile_fx replaced by a recorder that runs the graph it is handed."""
    import torch._inductor.compile_fx as inductor

    seen: list[torch.fx.GraphModule] = []

    def compile_fx(gm, example_inputs, **kwargs):
        seen.append(gm)
        return gm.forward

    monkeypatch.setattr(inductor, "compile_fx", compile_fx)
    return seen


@pytest.fixture
def tiny():
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = get_model("llama-160m", tiny=True, n_layers=1)
    return model, example_inputs(model, 2, 8)


def row(rank_: int, family: str, shapes: list[list[int]], share: float) -> PlanRow:
    return PlanRow(rank_, family, "", shapes, 0.0, 1.0, share, {}, True, "module", [], [])


def test_workloads_are_ranked_by_their_share_of_the_plan():
    rms = get_op("rmsnorm").spec((2, 8, 64), "fp32")
    add = get_op("add_rmsnorm").spec((2, 8, 64), "fp32")
    swiglu = get_op("swiglu").spec((2, 8, 176), "fp32")
    softmax = get_op("softmax").spec((4, 100), "fp32")
    workloads = [
        Workload("rmsnorm", rms, (2, 8, 64), sites=1),
        Workload("add_rmsnorm", add, (2, 8, 64), sites=3),
        Workload("swiglu", swiglu, (2, 8, 176), sites=2),
        Workload("softmax", softmax, (4, 100), sites=1),
        Workload("rmsnorm_backward", rms, (2, 8, 64), backward_of="rmsnorm"),
    ]
    plan = Plan("m", "gpu", "d", "float32", 1, 100.0, [
        row(1, "rmsnorm", [[2, 8, 64], [64]], 0.40),  # shared by the RMSNorm and the add_rmsnorm sites
        row(2, "silu", [[2, 8, 176]], 0.10),
        row(3, "softmax", [], 0.05),  # compiled code: no shapes, the family's workloads share it
        row(4, "matmul", [[2, 8, 64], [176, 64]], 0.45),
    ])
    ranked = rank(workloads, plan)
    shares = {w.op: round(w.share, 6) for w in ranked}
    assert shares == {"add_rmsnorm": 0.3, "rmsnorm": 0.1, "rmsnorm_backward": 0.1, "swiglu": 0.1, "softmax": 0.05}
    assert [w.op for w in ranked][:1] == ["add_rmsnorm"] and ranked[-1].op == "softmax"
    assert ranked[0].gain == pytest.approx(1 / (1 - 0.3 + 0.15))


def tiny_plan(norm_share: float, silu_share: float) -> Plan:
    """A plan of the tiny LLaMA's forward (CPU profiles are too noisy to rank by in a test)."""
    return Plan("llama", "gpu", "d", "float32", 1, 100.0, [
        row(1, "rmsnorm", [[2, 8, 64], [64]], norm_share), row(2, "silu", [[2, 8, 176]], silu_share)])


def test_optimize_model_spends_no_more_than_its_budget(tiny, tmp_path, monkeypatch):
    model, inputs = tiny
    record_inductor(monkeypatch)
    db = str(tmp_path / "k.db")
    stages: list[str] = []
    fast, report = kernelsmith.optimize_model(
        model, inputs, budget=3, db=db, plan=tiny_plan(0.3, 0.05), patience=None, strategy="grid",
        progress=lambda e: stages.append(e.stage),
    )
    assert report["evaluations"] == 3 and report["mode"] == "interpreter"
    assert [(w["op"], w["status"], w["evaluations"]) for w in report["workloads"]] == [
        ("add_rmsnorm", "tuned", 3), ("rmsnorm", "skipped", 0), ("swiglu", "skipped", 0)]
    assert report["workloads"][0]["share"] == pytest.approx(0.2)  # 2 of the 3 RMSNorm sites
    assert report["stopped"] == "the evaluation budget is spent"
    assert stages[:2] == ["discover", "tune"] and stages[-2:] == ["compile", "done"]
    assert stages.count("evaluation") == 3
    # The interpreter never wins: every site stays with Inductor, and the result is the model's.
    assert report["replaced"] == 0 and {s["status"] for s in report["sites"]} <= {"baseline wins", "not tuned"}
    with torch.no_grad():
        torch.testing.assert_close(fast(*inputs), model(*inputs))
    json.dumps(report)  # JSON-ready


def test_stored_winners_cost_nothing_and_are_served(tiny, tmp_path, monkeypatch):
    model, inputs = tiny
    db = str(tmp_path / "k.db")
    store_winners(db, model, inputs)
    seen = record_inductor(monkeypatch)
    model.train()
    fast, report = kernelsmith.optimize_model(model, inputs, budget=10, db=db)
    assert model.training  # profiling ran in eval mode; the model is handed back as it came
    assert report["evaluations"] == 0
    assert {w["status"] for w in report["workloads"]} == {"stored"}
    assert report["replaced"] == 4 and report["expected_gain"] > 1.0
    assert sorted(n.args[0] for n in seen[-1].graph.nodes if n.target is torch.ops.kernelsmith.kernel.default) == [
        "add_rmsnorm", "add_rmsnorm", "rmsnorm", "swiglu"]
    with torch.no_grad():
        torch.testing.assert_close(fast(*inputs), model(*inputs), rtol=1e-5, atol=1e-5)


def test_tuning_stops_when_time_is_up_or_returns_diminish(tiny, tmp_path, monkeypatch):
    model, inputs = tiny
    record_inductor(monkeypatch)
    db = str(tmp_path / "k.db")
    _, report = kernelsmith.optimize_model(model, inputs, budget=50, seconds=0, db=db, plan=tiny_plan(0.3, 0.1))
    assert report["evaluations"] == 0 and report["stopped"] == "the time budget is spent"
    assert {w["status"] for w in report["workloads"]} == {"skipped"}
    _, report = kernelsmith.optimize_model(model, inputs, budget=50, db=db, plan=tiny_plan(0.002, 0.001))
    assert report["evaluations"] == 0 and report["stopped"].startswith("returns diminish")


def test_the_optimize_command_writes_its_report(tmp_path, monkeypatch):
    from kernelsmith.cli.main import app

    torch._dynamo.reset()
    record_inductor(monkeypatch)
    monkeypatch.setenv("KERNELSMITH_INTERPRET", "1")
    out = tmp_path / "report.json"
    result = CliRunner().invoke(app, [
        "optimize", "llama-160m", "--tiny", "--kwargs", '{"n_layers": 1}', "--device", "cpu", "--batch", "2",
        "--seq", "8", "--budget", "0", "--db", str(tmp_path / "k.db"), "--out", str(out),
    ])
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    assert report["model"] == "llama-160m" and report["evaluations"] == 0
    assert {w["op"] for w in report["workloads"]} == {"rmsnorm", "add_rmsnorm", "swiglu"}
    assert "workloads by share" in result.output and "interpreter mode" in result.output


def test_patience_and_the_tuner_stop_hook(tmp_path):
    from types import SimpleNamespace

    from kernelsmith.tuner import tune_spec
    from kernelsmith.whole_model.optimize import _Patience

    watch = _Patience(3)
    for evaluated, best_us in [(1, 10.0), (2, 9.0), (3, 8.95), (4, 8.93)]:
        watch.observe(evaluated, SimpleNamespace(median_us=best_us))
        assert not watch.exhausted()  # 9.0 was 10% better; 8.95 and 8.93 are not 1% better
    watch.observe(5, SimpleNamespace(median_us=8.93))
    assert watch.exhausted()

    seen: list[int] = []
    result = tune_spec(
        get_op("softmax").spec((4, 32), "fp32"), budget=6, strategy="grid", db=str(tmp_path / "k.db"),
        progress=lambda done, total, best: seen.append(done), stop=lambda: bool(seen),
    )
    assert 1 <= result.evaluations <= 2 < 6  # what was in flight when it said stop (one per worker)

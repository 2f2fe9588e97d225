"""Whole-model features on a Hugging Face model: a tiny ``LlamaForCausalLM`` built from its config.

The config (vocab 256, hidden 64, 4 heads of 16, 2 KV heads) is saved with ``save_pretrained`` and
loaded the way ``--hf-config DIR`` loads it (random weights, nothing downloaded). What is proved:

- the torch.compile backend finds Hugging Face's own formulations: ``LlamaRMSNorm`` (upcast to
  float32, ``pow(2).mean``, ``rsqrt``, cast back, times the weight), the residual add folded into
  the next RMSNorm, ``act_fn(gate_proj(x)) * up_proj(x)`` as SwiGLU, and the causal-LM loss
  (shifted labels, ``ignore_index=-100``) as cross-entropy; with stored winners it replaces them
  all, the installed launchers run and the model's ``ModelOutput`` matches eager (a training
  step's loss and gradients too). Attention (SDPA) and RoPE are not backend families: they stay
  with Inductor;
- ``kernelsmith optimize --hf-config``, ``kernelsmith verify --hf-config`` (aot_eager, and the
  kernelsmith backend serving stored winners with gradients) and ``kernelsmith report`` over a
  real interpreter tune of one of the model's workloads.

CPU only: kernels run in the Triton interpreter (conftest sets TRITON_INTERPRET=1), winners are
stored directly (interpreter timings never beat PyTorch), and Inductor is replaced by a recorder
that runs the graph it is handed (tests/test_backend.py compiles with the real one).
"""

from __future__ import annotations

import csv
import json

import pytest
import torch
from typer.testing import CliRunner

from kernelsmith.cli.main import app
from kernelsmith.frontends import backend as ks_backend
from kernelsmith.models import example_inputs, load_model
from test_backend import discover, kernel_ops, record_inductor, spy_runners, store_all

transformers = pytest.importorskip("transformers")

runner = CliRunner()
BATCH, SEQ = 2, 8


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory) -> str:
    """A one-layer tiny Llama config directory, as ``save_pretrained`` writes it."""
    config = transformers.LlamaConfig(
        vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=128,
    )
    path = tmp_path_factory.mktemp("hf") / "tiny-llama"
    config.save_pretrained(path)
    return str(path)


def hf_llama(hf_dir: str, **overrides) -> torch.nn.Module:
    torch._dynamo.reset()
    torch.manual_seed(0)
    loaded = load_model(None, hf_config=hf_dir, kwargs=overrides)
    assert loaded.source == "hf-config"
    assert type(loaded.module).__name__ == "LlamaForCausalLM"
    return loaded.module.eval()


def target_name(node: torch.fx.Node) -> str:
    return getattr(node.target, "__name__", str(node.target))


def test_hugging_face_llama_sites_are_found_in_its_own_formulation(hf_dir):
    model = hf_llama(hf_dir, num_hidden_layers=2)
    (ids,) = example_inputs(model, BATCH, SEQ)
    sites = discover(model, ids)
    # Per layer: input norm, attention (not a family), residual add + post-attention norm, SwiGLU MLP;
    # every norm after the first follows a residual add; the model's final norm follows the last MLP's.
    assert [s.op for s in sites] == [
        "rmsnorm", "add_rmsnorm", "swiglu", "add_rmsnorm", "add_rmsnorm", "swiglu", "add_rmsnorm"]
    norm = sites[0]
    assert norm.spec.describe() == "rmsnorm(2x8x64:float32, 64:float32, eps=1e-06)"  # LlamaConfig's rms_norm_eps
    # LlamaRMSNorm whole: to(float32), pow, mean, add eps, rsqrt, mul, to(input dtype), weight mul.
    assert [target_name(n) for n in norm.region] == ["to", "pow", "mean", "add", "rsqrt", "mul", "to", "mul"]
    fused = [s for s in sites if s.op == "add_rmsnorm"]
    assert all(s.residual_add is not None and s.spec.constants == {"eps": 1e-06} for s in fused)
    mlp = sites[2]
    assert mlp.spec.describe() == "swiglu(2x8x128:float32, 2x8x128:float32, layout=pair)"
    assert [target_name(n) for n in mlp.region] == ["silu", "mul"]  # ACT2FN["silu"](gate_proj(x)) * up_proj(x)

    # With labels the model computes its loss (logits.float(), labels shifted): the LM head and its
    # cross-entropy over the tokens are one linear_cross_entropy site (h, W, shifted labels).
    torch._dynamo.reset()
    loss = discover(lambda i: model(i, labels=i).loss, ids)[-1]
    hidden, weight, target = loss.spec.inputs
    assert loss.op == "linear_cross_entropy" and weight.shape == (256, 64) and hidden.shape == (BATCH * SEQ, 64)
    assert target.shape == (BATCH * SEQ,) and target.dtype == "int64"
    assert loss.constants["ignore_index"] == -100 and loss.constants["label_smoothing"] == 0.0


def test_stored_winners_replace_the_hf_sites_and_the_output_matches_eager(hf_dir, tmp_path, monkeypatch):
    db = str(tmp_path / "k.db")
    model = hf_llama(hf_dir)
    (ids,) = example_inputs(model, BATCH, SEQ)
    store_all(db, discover(model, ids))
    seen = record_inductor(monkeypatch)
    calls = spy_runners(monkeypatch)
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="kernelsmith", options={"db": db})
    with torch.no_grad():
        out, expected = compiled(ids), model(ids)
    assert isinstance(out, transformers.modeling_outputs.CausalLMOutputWithPast)
    (graph,) = seen
    assert sorted(kernel_ops(graph)) == ["add_rmsnorm", "add_rmsnorm", "rmsnorm", "swiglu"]
    targets = {getattr(n.target, "__name__", n.target) for n in graph.graph.nodes}
    assert not targets & {"rsqrt", "silu", "mean"}  # the matched regions are gone
    assert "scaled_dot_product_attention" in targets  # attention stays with Inductor
    torch.testing.assert_close(out.logits, expected.logits, rtol=1e-5, atol=1e-5)
    calls.clear()
    with torch.no_grad():
        again = compiled(ids)
    assert len(calls) == 4  # the installed launchers ran; no PyTorch reference
    torch.testing.assert_close(again.logits, expected.logits, rtol=1e-5, atol=1e-5)


def test_a_training_step_through_the_hf_loss_matches_eager(hf_dir, tmp_path, monkeypatch):
    db = str(tmp_path / "k.db")
    model = hf_llama(hf_dir).train()
    (ids,) = example_inputs(model, BATCH, SEQ)
    sites = discover(lambda i: model(i, labels=i).loss, ids, grad=True)
    assert [(s.op, s.needs_grad) for s in sites] == [
        ("rmsnorm", True), ("add_rmsnorm", True), ("swiglu", True), ("add_rmsnorm", True),
        ("linear_cross_entropy", True)]
    store_all(db, sites, backward=True)
    seen = record_inductor(monkeypatch)
    calls = spy_runners(monkeypatch)
    backend = ks_backend.backend(db=db)
    torch._dynamo.reset()
    compiled = torch.compile(model, backend=backend)
    compiled(ids, labels=ids).loss.backward()  # compiles (and checks each kernel once)
    assert {s.status for s in backend.sites} == {"replaced"}
    assert sorted(kernel_ops(seen[-1])) == ["add_rmsnorm", "add_rmsnorm", "linear_cross_entropy", "rmsnorm", "swiglu"]
    model.zero_grad()
    calls.clear()
    loss = compiled(ids, labels=ids).loss
    loss.backward()
    assert len(calls) == 10  # five forward and five backward kernels
    grads = {name: p.grad for name, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    expected = model(ids, labels=ids).loss
    expected.backward()
    torch.testing.assert_close(loss, expected, rtol=1e-5, atol=1e-6)
    for name, p in model.named_parameters():
        got = grads[name]
        assert got is not None and p.grad is not None, name
        torch.testing.assert_close(got, p.grad, rtol=1e-5, atol=1e-6, msg=f"gradient of {name}")


def test_the_optimize_command_on_an_hf_config(hf_dir, tmp_path, monkeypatch):
    torch._dynamo.reset()
    record_inductor(monkeypatch)
    monkeypatch.setenv("KERNELSMITH_INTERPRET", "1")
    out = tmp_path / "report.json"
    result = runner.invoke(app, [
        "optimize", "--hf-config", hf_dir, "--device", "cpu", "--batch", "2", "--seq", "8", "--budget", "0",
        "--db", str(tmp_path / "k.db"), "--out", str(out),
    ])
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    assert report["model"] == hf_dir and report["mode"] == "interpreter" and report["evaluations"] == 0
    workloads = {w["op"]: w for w in report["workloads"]}
    assert set(workloads) == {"rmsnorm", "add_rmsnorm", "swiglu"}
    assert workloads["add_rmsnorm"]["sites"] == 2 and workloads["rmsnorm"]["sites"] == 1
    assert workloads["swiglu"]["spec"] == "swiglu(16x128:float32, 16x128:float32, layout=pair)"
    assert {w["status"] for w in report["workloads"]} == {"skipped"}
    assert sorted(s["op"] for s in report["sites"]) == ["add_rmsnorm", "add_rmsnorm", "rmsnorm", "swiglu"]
    assert "rmsnorm" in {r["family"] for r in report["plan"]["rows"]}  # the profile saw the HF model's norms
    assert "workloads by share" in result.output


def test_the_verify_command_on_an_hf_config(hf_dir):
    torch._dynamo.reset()
    result = runner.invoke(app, [
        "verify", "--hf-config", hf_dir, "--seq", "8", "--seeds", "1", "--seed", "7", "--backend", "aot_eager",
        "--no-time", "--json",
    ])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["source"] == "hf-config" and data["backend"] == "aot_eager" and "timing" not in data
    assert (data["batch"], data["seq"], data["dtype"]) == (2, 8, "float32")
    verdict = data["verify"]
    assert verdict["ok"] and verdict["truth"] == "fp64" and verdict["seeds"] == [7] and verdict["failures"] == 0
    # The CausalLMOutputWithPast is compared field by field: its logits (and any tensors of its cache).
    assert ("output", "output.logits", True) in [(c["kind"], c["name"], c["ok"]) for c in verdict["checks"]]
    assert all(c["ok"] and c["name"].startswith(("output.logits", "output.past_key_values")) for c in verdict["checks"])


def test_verify_with_the_kernelsmith_backend_serving_hf_winners(hf_dir, tmp_path, monkeypatch):
    db = str(tmp_path / "k.db")
    model = hf_llama(hf_dir)
    store_all(db, discover(model, *example_inputs(model, BATCH, SEQ), grad=True), backward=True)
    record_inductor(monkeypatch)
    calls = spy_runners(monkeypatch)
    torch._dynamo.reset()
    result = runner.invoke(app, [
        "verify", "--hf-config", hf_dir, "--seq", "8", "--seeds", "1", "--seed", "3", "--train", "--db", db,
        "--no-time", "--json",
    ])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["backend"] == "kernelsmith" and data["verify"]["ok"] and data["verify"]["train"]
    kinds = {c["kind"] for c in data["verify"]["checks"]}
    assert kinds == {"output", "grad"}  # token ids are not differentiable: no input gradients
    assert sum(c["kind"] == "grad" for c in data["verify"]["checks"]) == len(list(model.parameters()))
    # The four sites' forward and backward kernels ran (plus the checks made when they were installed).
    assert len(calls) >= 8


def test_report_of_a_real_interpreter_tune_of_an_hf_workload(hf_dir, tmp_path, monkeypatch):
    import kernelsmith
    from kernelsmith.whole_model.profile import Plan, PlanRow
    from kernelsmith.whole_model.report import write_report

    db = str(tmp_path / "tune.db")
    model = hf_llama(hf_dir)
    inputs = example_inputs(model, BATCH, SEQ)
    record_inductor(monkeypatch)
    # A fixed plan (the model's norms at 30%, its SiLU at 5%): CPU profiles are too noisy to rank by in a test.
    rows = [PlanRow(1, "rmsnorm", "", [[2, 8, 64], [64]], 30.0, 3.0, 0.30, {}, True, "module", [], []),
            PlanRow(2, "silu", "", [[2, 8, 128]], 5.0, 1.0, 0.05, {}, True, "module", [], [])]
    plan = Plan("tiny-llama", "gpu", "d", "float32", 1, 100.0, rows)
    fast, report = kernelsmith.optimize_model(
        model, inputs, budget=2, db=db, plan=plan, strategy="grid", patience=None, name=hf_dir)
    assert report["mode"] == "interpreter" and report["evaluations"] == 2
    assert [(w["op"], w["status"], w["evaluations"]) for w in report["workloads"]] == [
        ("add_rmsnorm", "tuned", 2), ("rmsnorm", "skipped", 0), ("swiglu", "skipped", 0)]
    tuned = report["workloads"][0]
    assert tuned["spec"] == "add_rmsnorm(16x64:float32, 16x64:float32, 64:float32, eps=1e-06)"
    # The interpreter never wins: every site stays with Inductor, and the compiled model is the model.
    assert report["replaced"] == 0 and {s["status"] for s in report["sites"]} <= {"baseline wins", "not tuned"}
    with torch.no_grad():
        torch.testing.assert_close(fast(*inputs).logits, model(*inputs).logits)

    written = write_report(db, tmp_path / "report", plots=False)
    with open(written.files["results.tsv"], newline="") as handle:
        trials = list(csv.DictReader(handle, delimiter="\t"))
    assert len(trials) == 2 and {t["op"] for t in trials} == {"add_rmsnorm"}
    assert all(t["mode"] == "interpreter" for t in trials) and len({t["workload"] for t in trials}) == 1
    markdown = written.files["report.md"].read_text()
    assert "add_rmsnorm" in markdown and trials[0]["workload"] in markdown

    result = runner.invoke(app, ["report", "--db", db, "--out", str(tmp_path / "cli"), "--no-plots"])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "cli" / "results.tsv").read_text() == written.files["results.tsv"].read_text()

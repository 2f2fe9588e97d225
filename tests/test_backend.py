"""torch.compile(model, backend="kernelsmith"): sites found, stored winners swapped in, the rest left alone.

Interpreter mode on CPU tensors (conftest sets TRITON_INTERPRET=1, which dispatch honours as an
explicit request). Interpreter timings never beat PyTorch, so winners are stored directly, as a
GPU run would have. Most tests replace Inductor (``compile_fx``) with a recorder that runs the
graph it is handed eagerly: what the backend hands Inductor is what is tested, and CPU Inductor
compiles take seconds; one test compiles a model with the real Inductor.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from kernelsmith import dispatch
from kernelsmith.db import DecisionRecord, current_fingerprint, open_database
from kernelsmith.frontends import backend as ks_backend
from kernelsmith.models import example_inputs, get_model
from kernelsmith.ops import get_op
from kernelsmith.spec import OpSpec


def store(db: str, spec: OpSpec, winner: str = "kernel", speedup: float = 1.5) -> None:
    """A decision for the bucket of ``spec``, with the family's first variant and config."""
    family = get_op(spec.op)
    bucket = family.bucket(spec)
    variant = family.variants[0]
    config = variant.space(bucket).configs()[0]
    fp = current_fingerprint("interpreter")
    with open_database(db) as database:
        database.put_fingerprint(fp)
        database.put_decision(DecisionRecord(
            fp.hash, bucket.workload_hash, spec.op, bucket.to_dict(), winner, variant.name, variant.source_hash,
            config.to_dict(), {"speedup": speedup}))


def discover(fn, *inputs, grad: bool = False) -> list[ks_backend.Site]:
    backend = ks_backend.KernelsmithBackend(discover=True)
    with torch.set_grad_enabled(grad):
        torch.compile(fn, backend=backend)(*inputs)
    return backend.sites


def store_all(db: str, sites, backward: bool = False) -> None:
    for site in sites:
        store(db, site.spec)
        if backward:
            family = get_op(site.op)
            backward_family = get_op(family.backward)
            store(db, backward_family.spec_for(*ks_backend._backward_metas(family, site), **site.constants))


def record_inductor(monkeypatch) -> list[torch.fx.GraphModule]:
    """compile_fx replaced by a recorder that runs the graph it gets (through AOTAutograd when
    a graph needs gradients, as Inductor would)."""
    import torch._inductor.compile_fx as inductor
    from torch._dynamo.backends.debugging import aot_eager

    seen: list[torch.fx.GraphModule] = []

    def compile_fx(gm, example_inputs, **kwargs):
        seen.append(gm)
        gm.meta["inductor_kwargs"] = kwargs
        if torch.is_grad_enabled() and any(getattr(t, "requires_grad", False) for t in example_inputs):
            return aot_eager(gm, example_inputs)
        return gm.forward

    monkeypatch.setattr(inductor, "compile_fx", compile_fx)
    return seen


def kernel_ops(gm: torch.fx.GraphModule) -> list[str]:
    return [n.args[0] for n in gm.graph.nodes if n.target is torch.ops.kernelsmith.kernel.default]


def spy_runners(monkeypatch) -> list[str]:
    calls: list[str] = []
    original = dispatch.KernelRunner.__call__

    def call(self, inputs):
        calls.append(self.variant)
        return original(self, inputs)

    monkeypatch.setattr(dispatch.KernelRunner, "__call__", call)
    return calls


def test_the_backend_is_registered_by_its_entry_point():
    from torch._dynamo.backends.registry import lookup_backend

    assert lookup_backend("kernelsmith") is ks_backend.kernelsmith_backend


def test_llama_sites_are_found_with_the_residual_add_folded_in():
    torch._dynamo.reset()
    model = get_model("llama-160m", tiny=True, n_layers=1)
    sites = discover(model, *example_inputs(model, 2, 8))
    assert [s.op for s in sites] == ["rmsnorm", "add_rmsnorm", "swiglu", "add_rmsnorm"]
    norm = sites[0]
    assert norm.spec.describe() == "rmsnorm(2x8x64:float32, 64:float32, eps=1e-05)"
    assert len(norm.region) == 8 and norm.status == "found"  # cast, pow, mean, add, rsqrt, mul, cast, mul
    fused = sites[1]
    assert fused.residual_add is not None and fused.spec.constants == {"eps": 1e-05}
    assert [n.name for n in sites[2].region] == ["silu", "mul_9"]


def test_stored_winners_are_replaced_and_the_output_matches_eager(tmp_path, monkeypatch):
    torch._dynamo.reset()
    db = str(tmp_path / "k.db")
    torch.manual_seed(0)
    model = get_model("llama-160m", tiny=True, n_layers=1)
    inputs = example_inputs(model, 2, 8)
    store_all(db, discover(model, *inputs))
    seen = record_inductor(monkeypatch)
    calls = spy_runners(monkeypatch)
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="kernelsmith", options={"db": db})
    with torch.no_grad():
        out, expected = compiled(*inputs), model(*inputs)
    (graph,) = seen
    assert sorted(kernel_ops(graph)) == ["add_rmsnorm", "add_rmsnorm", "rmsnorm", "swiglu"]
    targets = {getattr(n.target, "__name__", n.target) for n in graph.graph.nodes}
    assert not targets & {"rsqrt", "silu", "mean"}  # the matched regions are gone
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    calls.clear()
    with torch.no_grad():
        compiled(*inputs)
    assert len(calls) == 4  # the installed launchers ran; no PyTorch reference


def test_a_graph_without_a_winner_is_handed_to_inductor_unchanged(tmp_path, monkeypatch):
    torch._dynamo.reset()
    db = str(tmp_path / "k.db")
    seen = record_inductor(monkeypatch)
    given: list[torch.fx.GraphModule] = []
    backend = ks_backend.backend(db=db)

    def recording(gm, example_inputs):
        given.append(gm)
        return backend(gm, example_inputs)

    def no_pattern(x, w):
        return torch.relu(x @ w) + 1

    def softmax_not_tuned(x):
        return torch.softmax(x * 0.5, dim=-1)

    x, w = torch.randn(4, 32), torch.randn(32, 32)
    torch.compile(no_pattern, backend=recording)(x, w)
    store(db, get_op("softmax").spec_for(x, scale=0.5), winner="baseline")  # the site takes the scale in
    torch.compile(softmax_not_tuned, backend=recording, dynamic=False)(x)
    torch.compile(softmax_not_tuned, backend=recording, dynamic=False)(torch.randn(8, 48))
    assert len(seen) == 3 and all(a is b for a, b in zip(seen, given, strict=True))
    assert [(s.op, s.status) for s in backend.sites] == [("softmax", "baseline wins"), ("softmax", "not tuned")]
    # Inductor's mode and options pass through.
    torch.compile(lambda a: a.relu() + 1, backend="kernelsmith", mode="max-autotune")(x)
    assert seen[-1].meta["inductor_kwargs"]["config_patches"]["max_autotune"] is True
    torch.compile(lambda a: a.relu() + 2, backend=ks_backend.backend(epilogue_fusion=False))(x)
    assert seen[-1].meta["inductor_kwargs"]["config_patches"] == {"epilogue_fusion": False}


def test_scaled_masked_softmax_matches_the_softmax_alone(tmp_path, monkeypatch):
    torch._dynamo.reset()
    db = str(tmp_path / "k.db")

    def attention_probs(scores, mask):
        return torch.softmax(scores * 0.125 + mask, dim=-1)

    scores, mask = torch.randn(2, 4, 8, 8), torch.zeros(8, 8)
    (site,) = discover(attention_probs, scores, mask)
    assert site.op == "softmax" and [n.name for n in site.region] == ["softmax"]
    store(db, site.spec)
    seen = record_inductor(monkeypatch)
    out = torch.compile(attention_probs, backend=ks_backend.backend(db=db))(scores, mask)
    assert kernel_ops(seen[0]) == ["softmax"]
    torch.testing.assert_close(out, attention_probs(scores, mask))


def test_gpt2_layernorm_and_gelu_tanh_through_the_real_inductor(tmp_path):
    torch._dynamo.reset()
    db = str(tmp_path / "k.db")
    torch.manual_seed(0)
    model = get_model("gpt2", tiny=True, n_layers=1)
    inputs = example_inputs(model, 2, 8)
    sites = discover(model, *inputs)
    assert sorted({s.op for s in sites}) == ["gelu_tanh", "layernorm"]
    store_all(db, sites)
    backend = ks_backend.backend(db=db)
    torch._dynamo.reset()
    with torch.no_grad():
        out = torch.compile(model, backend=backend)(*inputs)
        expected = model(*inputs)
    assert {s.status for s in backend.sites} == {"replaced"}
    torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-4)


class NormMLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(1 + 0.1 * torch.randn(48))
        self.gate = nn.Linear(48, 96)
        self.up = nn.Linear(48, 96)

    def forward(self, x):
        xf = x.float()
        h = self.weight * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype)
        return F.silu(self.gate(h)) * self.up(h)


def test_a_training_step_matches_eager_gradients(tmp_path, monkeypatch):
    torch._dynamo.reset()
    db = str(tmp_path / "k.db")
    torch.manual_seed(0)
    model = NormMLP()
    x = torch.randn(3, 5, 48, requires_grad=True)
    sites = discover(model, x, grad=True)
    assert [(s.op, s.needs_grad) for s in sites] == [("rmsnorm", True), ("swiglu", True)]
    store(db, sites[0].spec)  # the forward alone is not enough in a training graph
    backend = ks_backend.backend(db=db)
    seen = record_inductor(monkeypatch)
    torch.compile(model, backend=backend)(x)
    assert [(s.op, s.status) for s in backend.sites] == [("rmsnorm", "not tuned"), ("swiglu", "not tuned")]
    assert "backward" in backend.sites[0].reason and kernel_ops(seen[0]) == []

    store_all(db, sites, backward=True)
    calls = spy_runners(monkeypatch)
    torch._dynamo.reset()
    compiled = torch.compile(model, backend=ks_backend.backend(db=db))
    compiled(x).sum().backward()  # compiles (and checks each kernel once)
    assert sorted(kernel_ops(seen[-1])) == ["rmsnorm", "swiglu"]
    x.grad = None
    model.zero_grad()
    calls.clear()
    compiled(x).square().mean().backward()
    assert len(calls) == 4  # two forward and two backward kernels, nothing else
    grads = [x.grad.clone(), *(p.grad.clone() for p in model.parameters())]
    x.grad = None
    model.zero_grad()
    model(x).square().mean().backward()
    for got, expected in zip(grads, [x.grad, *(p.grad for p in model.parameters())], strict=True):
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)


def test_the_custom_op_differentiates_through_the_reference_when_no_kernel_is_installed():
    x = torch.randn(4, 40, requires_grad=True)
    w = torch.randn(40, requires_grad=True)
    dy = torch.randn(4, 40)
    (y,) = torch.ops.kernelsmith.kernel("rmsnorm", [x, w], dispatch.constants_json({"eps": 1e-6}))
    got = torch.autograd.grad(y, (x, w), dy)
    expected_y = (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)) * w
    expected = torch.autograd.grad(expected_y, (x, w), dy)
    torch.testing.assert_close(y, expected_y)
    for a, b in zip(got, expected, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_compare_keeps_inductor_alone_when_the_kernels_are_slower(tmp_path, monkeypatch):
    torch._dynamo.reset()
    db = str(tmp_path / "k.db")

    def rmsnorm(x, w):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype) * w

    x, w = torch.randn(64, 256), torch.randn(256)
    store_all(db, discover(rmsnorm, x, w))
    seen = record_inductor(monkeypatch)
    backend = ks_backend.backend(db=db, compare=True)
    out = torch.compile(rmsnorm, backend=backend)(x, w)
    # Compiled both ways; the interpreter's kernel loses to the graph it replaces.
    assert [kernel_ops(g) for g in seen] == [["rmsnorm"], []]
    (site,) = backend.sites
    assert site.status == "slower in context" and "Inductor alone" in site.reason
    torch.testing.assert_close(out, rmsnorm(x, w))


def norm_then_swiglu(x, w, b):
    xf = x.float()
    h = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype) * w
    return F.silu(h) * b


def test_compare_falls_back_to_the_one_family_that_pays_in_context(tmp_path, monkeypatch):
    """Every replacement together loses; RMSNorm's alone wins; SwiGLU's alone loses: the graph
    with only the RMSNorm kernel is kept and the SwiGLU site says why it was not."""
    torch._dynamo.reset()
    db = str(tmp_path / "k.db")
    x, w, b = torch.randn(64, 256), torch.randn(256), torch.randn(64, 256)
    store_all(db, discover(norm_then_swiglu, x, w, b))
    seen = record_inductor(monkeypatch)
    timings = iter([[1.0, 1.2], [1.0, 0.9, 1.1]])  # [alone, all]; then [alone, rmsnorm, swiglu]
    monkeypatch.setattr(ks_backend, "time_graphs", lambda graphs, inputs: next(timings))
    backend = ks_backend.backend(db=db, compare=True)
    out = torch.compile(norm_then_swiglu, backend=backend)(x, w, b)
    # compiled: all, alone, then each family alone (rmsnorm, swiglu)
    assert [sorted(kernel_ops(g)) for g in seen] == [["rmsnorm", "swiglu"], [], ["rmsnorm"], ["swiglu"]]
    status = {site.op: site for site in backend.sites}
    assert status["rmsnorm"].status == "replaced"
    assert status["swiglu"].status == "slower in context" and "rmsnorm alone: 0.900 ms" in status["swiglu"].reason
    torch.testing.assert_close(out, norm_then_swiglu(x, w, b), rtol=1e-5, atol=1e-5)


def test_compare_keeps_inductor_alone_when_no_family_pays(tmp_path, monkeypatch):
    torch._dynamo.reset()
    db = str(tmp_path / "k.db")
    x, w, b = torch.randn(64, 256), torch.randn(256), torch.randn(64, 256)
    store_all(db, discover(norm_then_swiglu, x, w, b))
    record_inductor(monkeypatch)
    timings = iter([[1.0, 1.2], [1.0, 1.05, 1.1]])
    monkeypatch.setattr(ks_backend, "time_graphs", lambda graphs, inputs: next(timings))
    backend = ks_backend.backend(db=db, compare=True)
    torch.compile(norm_then_swiglu, backend=backend)(x, w, b)
    assert {site.status for site in backend.sites} == {"slower in context"}


def test_compare_is_off_by_default_in_interpreter_mode(tmp_path, monkeypatch):
    """Interpreter times are not performance: by default a CPU graph is not timed in context."""
    torch._dynamo.reset()
    db = str(tmp_path / "k.db")
    x, w, b = torch.randn(64, 256), torch.randn(256), torch.randn(64, 256)
    store_all(db, discover(norm_then_swiglu, x, w, b))
    seen = record_inductor(monkeypatch)
    monkeypatch.setattr(ks_backend, "time_graphs", lambda graphs, inputs: pytest.fail("timed a CPU graph"))
    backend = ks_backend.backend(db=db)
    torch.compile(norm_then_swiglu, backend=backend)(x, w, b)
    assert len(seen) == 1 and sorted(kernel_ops(seen[0])) == ["rmsnorm", "swiglu"]


def test_families_limit_the_sites():
    torch._dynamo.reset()
    model = get_model("llama-160m", tiny=True, n_layers=1)
    inputs = example_inputs(model, 2, 8)

    def ops(**options) -> list[str]:
        backend = ks_backend.KernelsmithBackend(discover=True, **options)
        torch._dynamo.reset()
        torch.compile(model, backend=backend)(*inputs)
        return [s.op for s in backend.sites]

    assert ops(families=["add_rmsnorm"]) == ["add_rmsnorm", "add_rmsnorm"]
    assert ops(families=["rmsnorm", "swiglu"]) == ["rmsnorm", "rmsnorm", "swiglu", "rmsnorm"]
    assert ops(fuse_residual=False) == ["rmsnorm", "rmsnorm", "swiglu", "rmsnorm"]


def test_in_context_timing_calls_real_inductor_output():
    """time_graphs calls what compile_fx returns as Dynamo does (an H200 run found the boxed
    convention wrong: compile_fx's output has ``_boxed_call`` yet takes the inputs as arguments)."""
    torch._dynamo.reset()
    timed: list[float] = []

    def timing_backend(gm, example_inputs):
        compiled = ks_backend.KernelsmithBackend()._inductor(gm, example_inputs)
        timed.extend(ks_backend.time_graphs([compiled], example_inputs, rounds=1, calls=1))
        return compiled

    def fn(x, w):
        return torch.relu(x) * w + 1.0

    x, w = torch.randn(8, 16), torch.randn(16)
    out = torch.compile(fn, backend=timing_backend)(x, w)
    torch.testing.assert_close(out, fn(x, w))
    assert len(timed) == 1 and timed[0] > 0

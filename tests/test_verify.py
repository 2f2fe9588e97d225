"""kernelsmith verify: the comparison catches planted wrong models (outputs, dtypes, gradients),
diagnose names the culprit replacement, timing runs every variant in one run, and the command."""

from __future__ import annotations

import copy
import json
import time
import types

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from typer.testing import CliRunner

from kernelsmith.cli.main import app
from kernelsmith.models import example_inputs, get_model
from kernelsmith.models.llama import MLP, RMSNorm
from kernelsmith.whole_model import verify as v

SEEDS = (1, 2)


@pytest.fixture(scope="module")
def llama():
    torch.manual_seed(0)
    return get_model("llama-160m", tiny=True).eval()


def inputs_for(model):
    return lambda seed: example_inputs(model, 2, 16, seed=seed)


class ScaleGrad(torch.autograd.Function):
    """Identity forward, gradient scaled in backward: right outputs, wrong gradients."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad * 1.01


# ---- the comparison ---------------------------------------------------------------------------


def test_a_correct_copy_passes_against_the_fp64_truth(llama):
    twin = copy.deepcopy(llama)  # a separate module: its own parameters are compared
    result = v.verify_model(llama, twin, inputs_for(llama), seeds=SEEDS, train=True)
    assert result.ok and result.truth == "fp64" and result.seeds == list(SEEDS)
    assert {c.kind for c in result.checks} == {"output", "grad"}
    assert sum(c.kind == "grad" for c in result.checks) == 2 * len(list(llama.parameters()))
    assert "PASS" in result.summary()


@pytest.mark.parametrize(
    ("wrong", "reason"),
    [
        (lambda m: lambda ids: m(ids) * 1.001, "relative L2 error"),  # a 0.1% error, far above fp32's
        (lambda m: lambda ids: m(ids).half().float(), "error"),  # precision quietly lowered
        (lambda m: lambda ids: m(ids).to(torch.bfloat16), "dtype"),  # the output dtype changed
        (lambda m: lambda ids: m(ids)[:, :-1], "shape"),
        (lambda m: lambda ids: m(ids).masked_fill(ids[..., None] == ids[0, 0], float("nan")), "NaN"),
    ],
)
def test_wrong_models_are_caught(llama, wrong, reason):
    result = v.verify_model(llama, wrong(llama), inputs_for(llama), seeds=SEEDS)
    assert not result.ok and result.failures
    assert all(c.kind == "output" and c.name == "output" for c in result.failures)
    assert reason in result.failures[0].reason, result.failures[0].reason


def test_without_fp64_truth_the_fallback_tolerances_still_catch_errors(llama):
    right = v.verify_model(llama, copy.deepcopy(llama), inputs_for(llama), seeds=SEEDS, truth="original")
    assert right.ok and right.truth == "original"
    wrong = v.verify_model(llama, lambda ids: llama(ids) * 1.001, inputs_for(llama), seeds=SEEDS, truth="original")
    assert not wrong.ok and "no float64 truth" in wrong.failures[0].reason


def test_fp64_truth_is_skipped_when_it_does_not_fit(llama, monkeypatch):
    monkeypatch.setattr(v, "_fp64_fits", lambda model, device, train: False)
    result = v.verify_model(llama, llama, inputs_for(llama), seeds=(1,))
    assert result.ok and result.truth == "original" and "does not fit" in result.note


def test_train_compares_parameter_and_input_gradients():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(12, 32), nn.SiLU(), nn.Linear(32, 5)).eval()
    twin = copy.deepcopy(model)
    inputs_fn = lambda seed: (torch.randn(4, 12, generator=torch.Generator().manual_seed(seed)),)

    def wrong_backward(x):  # the same forward, the model's own parameters; the first layer's gradient is off by 1%
        return model[2](model[1](ScaleGrad.apply(model[0](x))))

    forward_only = v.verify_model(model, wrong_backward, inputs_fn, seeds=SEEDS)
    assert forward_only.ok  # outputs agree: only the gradients can tell
    trained = v.verify_model(model, wrong_backward, inputs_fn, seeds=SEEDS, train=True)
    assert not trained.ok
    failed = {(c.kind, c.name) for c in trained.failures}
    assert ("grad", "0.weight") in failed and ("grad", "0.bias") in failed and ("input_grad", "input[0]") in failed
    assert ("grad", "2.weight") not in failed  # the layer after the bug is still right
    right = v.verify_model(model, twin, inputs_fn, seeds=SEEDS, train=True)
    assert right.ok and any(c.kind == "input_grad" for c in right.checks)


def test_outputs_of_any_structure_are_compared():
    class Structured(nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = nn.Linear(8, 8)

        def forward(self, x):
            y = self.proj(x)
            return {"hidden": y, "extra": (y.sum(-1), y.argmax(-1)), "none": None}

    model = Structured().eval()
    inputs_fn = lambda seed: (torch.randn(3, 8, generator=torch.Generator().manual_seed(seed)),)
    result = v.verify_model(model, model, inputs_fn, seeds=(1,))
    assert result.ok
    assert [c.name for c in result.checks] == ["output.hidden", "output.extra[0]", "output.extra[1]"]
    swapped = lambda x: {"hidden": model(x)["hidden"], "extra": (model(x)["extra"][0], model(x)["extra"][1] + 1)}
    bad = v.verify_model(model, swapped, inputs_fn, seeds=(1,))
    assert [c.name for c in bad.failures] == ["output.extra[1]"]  # integers must be equal
    assert "elements differ" in bad.failures[0].reason


def test_a_model_that_is_not_deterministic_is_reported():
    class Noisy(nn.Module):
        def forward(self, x):
            return x + 0.01 * torch.rand_like(x)  # a different answer on every call

    model = Noisy()
    result = v.verify_model(model, model, lambda seed: (torch.ones(4, 4),), seeds=(1,))
    assert not result.ok
    assert result.failures[0].name == "output (original run twice)" and "deterministic" in result.failures[0].reason


def test_default_optimized_model_uses_the_kernelsmith_backend_or_says_it_falls_back(llama, monkeypatch):
    import torch._dynamo

    def backend_of(model, backend=None, options=None):
        return backend

    monkeypatch.setattr(torch, "compile", backend_of)
    from kernelsmith.frontends.backend import KernelsmithBackend

    # One backend instance, so that what it replaced can be read afterwards; options reach it.
    instance, name, note = v.optimized_model(llama, None, {"db": "x.db"})
    assert isinstance(instance, KernelsmithBackend) and (name, note) == ("kernelsmith", "")
    assert instance.resolver.db == "x.db"
    monkeypatch.setattr(v, "_backend_instance", lambda options: None)  # no backend module: by name
    monkeypatch.setattr(torch._dynamo, "list_backends", lambda exclude_tags=(): ["inductor", "kernelsmith"])
    assert v.optimized_model(llama) == ("kernelsmith", "kernelsmith", "")  # registered by its entry point
    monkeypatch.setattr(torch._dynamo, "list_backends", lambda exclude_tags=(): ["inductor", "eager"])
    function = lambda gm, inputs, **kwargs: gm.forward
    monkeypatch.setattr(v, "_backend_function", lambda: function)
    assert v.optimized_model(llama) == (function, "kernelsmith", "")  # a checkout: imported
    monkeypatch.setattr(v, "_backend_function", lambda: None)
    compiled_with, backend, note = v.optimized_model(llama)
    assert compiled_with == backend == "inductor" and "not available" in note
    assert v.optimized_model(llama, "aot_eager") == ("aot_eager", "aot_eager", "")


# ---- diagnose ---------------------------------------------------------------------------------


def _rmsnorm_rewritten(self, x):  # a correct replacement: the same function, written differently
    return self.weight * F.rms_norm(x.float(), (x.shape[-1],), eps=self.variance_epsilon).to(x.dtype)


def _swiglu_wrong(self, x):  # a wrong replacement: GELU where the model has SiLU
    return self.down_proj(F.gelu(self.gate_proj(x)) * self.up_proj(x))


def _mlp_scaled(self, x):
    return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x)) * 1.01


def build_with(replacements):
    """A build hook: a copy of the model with the enabled replacements patched in."""

    def build(model, enabled):
        patched = copy.deepcopy(model)
        for module in patched.modules():
            for name in enabled:
                target, forward = replacements[name]
                if isinstance(module, target) and forward is not None:
                    module.forward = types.MethodType(forward, module)
            if isinstance(module, MLP) and {"a", "b"} <= set(enabled):  # wrong only together
                module.forward = types.MethodType(_mlp_scaled, module)
        return patched

    return build


def test_diagnose_names_the_wrong_replacement(llama):
    replacements = {"rmsnorm": (RMSNorm, _rmsnorm_rewritten), "swiglu": (MLP, _swiglu_wrong), "rope": (MLP, None)}
    build = build_with(replacements)
    assert not v.verify_model(llama, build(llama, list(replacements)), inputs_for(llama), seeds=SEEDS).ok
    diagnosis = v.diagnose(llama, build, list(replacements), inputs_for(llama), seeds=SEEDS)
    assert diagnosis.culprits == ["swiglu"] and "swiglu" in diagnosis.verdict
    assert [(s.enabled, s.ok) for s in diagnosis.steps] == [
        ([], True), (["rmsnorm"], True), (["swiglu"], False), (["rope"], True),
    ]  # fmt: skip


def test_diagnose_finds_an_interaction_and_blames_the_compiler_when_nothing_is_enabled(llama):
    build = build_with({"a": (MLP, None), "b": (MLP, None), "c": (MLP, None)})
    diagnosis = v.diagnose(llama, build, ["a", "b", "c"], inputs_for(llama), seeds=(1,))
    assert diagnosis.culprits == ["b"] and "interaction" in diagnosis.verdict
    assert [s.enabled for s in diagnosis.steps][-1] == ["a", "b"]
    broken = lambda model, enabled: lambda ids: model(ids) * 1.01
    blamed = v.diagnose(llama, broken, ["a"], inputs_for(llama), seeds=(1,))
    assert blamed.culprits == [] and "compiler itself" in blamed.verdict and len(blamed.steps) == 1


def test_diagnose_with_gradients(llama):
    def build(model, enabled):
        patched = copy.deepcopy(model)
        if "norm" in enabled:  # right forward, wrong backward through the final norm
            norm = patched.norm
            norm.forward = types.MethodType(lambda self, x: ScaleGrad.apply(RMSNorm.forward(self, x)), norm)
        return patched

    assert v.diagnose(llama, build, ["norm"], inputs_for(llama), seeds=(1,)).culprits == []
    assert v.diagnose(llama, build, ["norm"], inputs_for(llama), seeds=(1,), train=True).culprits == ["norm"]


# ---- timing -----------------------------------------------------------------------------------


def test_time_models_runs_every_variant_in_one_run_and_says_no_gpu():
    calls = {"eager": 0, "inductor": 0, "kernelsmith": 0}

    def runner(name, seconds):
        def run():
            calls[name] += 1
            time.sleep(seconds)

        return run

    variants = {
        name: runner(name, seconds) for name, seconds in (("eager", 4e-3), ("inductor", 3e-3), ("kernelsmith", 1e-3))
    }
    result = v.time_models(variants, warmup=1, rounds=6, optimized="kernelsmith")
    assert [r.name for r in result.rows] == ["eager", "inductor", "kernelsmith"]
    assert calls == {"eager": 7, "inductor": 7, "kernelsmith": 7}
    assert result.timer == "host-clock" and result.note == v.NO_GPU_NOTE
    assert result.rows[0].speedup_vs_eager == pytest.approx(1.0)
    assert (result.rows[2].speedup_vs_eager or 0.0) > 2.0
    assert set(result.comparisons) == {"eager", "inductor"}
    assert result.comparisons["eager"]["speedup"] > 2.0 and result.comparisons["eager"]["significant"]


def test_a_stalled_round_does_not_make_an_interval():
    """The bug behind "kernelsmith vs eager 2.221x (CI 1.77-236.5)": over the 5 rounds a CPU run
    took, the bootstrap of the median returns about the smallest and largest ratio, so one stalled
    round became the upper bound. Five rounds cannot carry a 95% interval of a median at all."""
    from kernelsmith.decide import compare

    optimized = [10.0, 10.0, 10.0, 10.0, 10.0]
    eager = [22.0, 22.5, 17.7, 22.2, 2365.0]  # one round of eager stalled
    assert compare(optimized, eager).ci_high > 200  # what verify used to print
    five = v.paired_speedup(optimized, eager)
    assert five["ci_low"] is None and not five["resolved"] and not five["significant"] and five["rounds"] == 5
    # Twelve rounds (the CPU default now) with the same stall: the interval ignores it.
    twelve = v.paired_speedup([10.0] * 12, [22.0, 22.5, 17.7, 22.2, 21.9, 22.4, 22.1, 21.8, 22.3, 22.0, 21.7, 2365.0])
    assert twelve["resolved"] and twelve["significant"] and 1.77 <= twelve["ci_low"] < twelve["ci_high"] < 2.3


def test_median_interval_is_exact_order_statistics():
    assert v.median_interval([3.0, 1.0, 2.0, 5.0, 4.0]) is None  # too few for 95%
    assert v.median_interval([float(i) for i in range(6)]) == (0.0, 5.0)  # 6: the range (96.9% coverage)
    assert v.median_interval([float(i) for i in range(12)]) == (2.0, 9.0)  # P(B(12, .5) <= 2) = 1.9%
    # Coverage on random data is at least the confidence (distribution-free).
    import random

    rng = random.Random(0)
    trials = 2000
    covered = sum(
        (lambda i: i is not None and i[0] <= 0.0 <= i[1])(v.median_interval([rng.gauss(0, 1) for _ in range(10)]))
        for _ in range(trials)
    )
    assert covered / trials >= 0.95


def test_forward_runner_trains_when_asked(llama):
    model = copy.deepcopy(llama)
    ids = example_inputs(model, 1, 8)
    v.forward_runner(model, ids)()
    assert all(p.grad is None for p in model.parameters())
    v.forward_runner(model, ids, train=True)()
    assert model.lm_head.weight.grad is not None


# ---- the command ------------------------------------------------------------------------------

runner = CliRunner()


def test_cli_verify_passes_and_times_in_one_run(monkeypatch):
    real_compile = torch.compile

    def quick_compile(model, backend=None, mode=None, **kwargs):  # Inductor is slow to build on a CPU
        return real_compile(model, backend="aot_eager" if backend in (None, "inductor") else backend)

    monkeypatch.setattr(torch, "compile", quick_compile)
    result = runner.invoke(
        app,
        ["verify", "gpt2", "--tiny", "--seq", "16", "--seed", "4", "--seeds", "2", "--train", "--backend", "aot_eager",
         "--rounds", "2", "--warmup", "1", "--json"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["verify"]["ok"] and data["verify"]["seeds"] == [4, 5] and data["verify"]["truth"] == "fp64"
    assert data["backend"] == "aot_eager" and data["batch"] == 2 and data["seq"] == 16
    assert [r["name"] for r in data["timing"]["rows"]] == ["eager", "inductor", "aot_eager"]
    assert data["timing"]["note"] == v.NO_GPU_NOTE and data["timing"]["train"] is True


def test_cli_verify_prints_no_speedup_when_the_backend_replaced_nothing(monkeypatch):
    """With an empty database the kernelsmith backend replaces nothing: its model is torch.compile
    alone, and verify says so instead of printing a kernelsmith speedup over eager."""
    from kernelsmith.frontends.backend import KernelsmithBackend

    real_compile = torch.compile

    def quick_compile(model, backend=None, mode=None, **kwargs):  # Inductor is slow to build on a CPU
        return real_compile(model, backend="aot_eager" if backend in (None, "inductor") else backend)

    monkeypatch.setattr(torch, "compile", quick_compile)
    monkeypatch.setattr(KernelsmithBackend, "_inductor", lambda self, gm, inputs: gm.forward)
    torch._dynamo.reset()
    args = ["verify", "llama-160m", "--tiny", "--seq", "8", "--seed", "3", "--seeds", "1", "--rounds", "6",
            "--warmup", "1"]  # fmt: skip
    result = runner.invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["backend"] == "kernelsmith" and data["replaced"] == []
    table = runner.invoke(app, args, env={"COLUMNS": "200"})
    assert table.exit_code == 0, table.output
    assert "no kernelsmith speedup: the backend replaced nothing" in table.output
    assert "kernelsmith vs" not in table.output and "CI" not in table.output
    torch._dynamo.reset()


def test_cli_timing_lines_name_torch_compile_first_and_refuse_a_wide_interval():
    from kernelsmith.cli.verify import _print_timing

    rows = [{"name": n, "median_ms": 1.0, "p10_ms": 0.9, "p90_ms": 1.1} for n in ("eager", "inductor", "kernelsmith")]
    comparisons = {
        "eager": {"speedup": 2.2, "ci_low": 1.77, "ci_high": 236.5, "resolved": False, "rounds": 12},
        "inductor": {"speedup": 1.1, "ci_low": 1.05, "ci_high": 1.15, "resolved": True, "rounds": 12},
    }
    timing = {"rows": rows, "timer": "cuda-events", "rounds": 12, "train": False, "comparisons": comparisons,
              "note": ""}  # fmt: skip
    from kernelsmith.cli import common

    with common.out.capture() as captured:
        _print_timing({"backend": "kernelsmith", "replaced": ["rmsnorm"]}, timing)
    text = captured.get()
    assert text.index("vs torch.compile (Inductor): 1.100x (95% CI 1.050-1.150") < text.index("vs eager: unresolved")
    assert "2.2" not in text.split("vs eager:")[1].split("(")[0]  # no number for an interval that wide


def test_cli_verify_fails_with_status_1_on_a_miscompiled_model(tmp_path):
    (tmp_path / "net.py").write_text(
        "import torch\nfrom torch import nn\n\n"
        "class Net(nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.embed = nn.Embedding(50, 8)\n\n"
        "    def forward(self, ids):\n"
        "        x = self.embed(ids)\n"
        "        return x * 1.01 if torch.compiler.is_compiling() else x  # wrong only when compiled\n"
    )
    result = runner.invoke(
        app, ["verify", f"{tmp_path / 'net.py'}:Net", "--seq", "8", "--seeds", "1", "--backend", "aot_eager",
              "--no-time"],
    )  # fmt: skip
    assert result.exit_code == 1, result.output
    assert "FAIL" in result.output and "failed checks" in result.output and "--seed" in result.output


def test_backend_hooks_drive_the_real_backend(llama, monkeypatch):
    backend = pytest.importorskip("kernelsmith.frontends.backend")
    monkeypatch.setattr(backend.KernelsmithBackend, "_inductor", lambda self, gm, inputs: gm.forward)  # fast on CPU
    hooks = v.backend_hooks()
    assert hooks is not None
    replacements, build = hooks
    ids = example_inputs(llama, 1, 8)
    assert replacements(llama, ids) == []  # an empty database: nothing wins, nothing is replaced
    with torch.no_grad():
        assert torch.equal(build(llama, ["add_rmsnorm"])(*ids), llama(*ids))


def test_cli_diagnose_needs_the_backend_hooks(llama, monkeypatch):
    monkeypatch.setattr(v, "kernelsmith_backend_available", lambda: False)
    monkeypatch.setattr(v, "_backend_function", lambda: None)  # no kernelsmith backend at all: Inductor
    monkeypatch.setattr(v, "_backend_instance", lambda options: None)
    result = runner.invoke(app, ["verify", "gpt2", "--tiny", "--seq", "8", "--diagnose", "--no-time"])
    assert result.exit_code == 2 and "--diagnose" in result.output

    replacements = {"rmsnorm": (RMSNorm, _rmsnorm_rewritten), "swiglu": (MLP, _swiglu_wrong)}
    build = build_with(replacements)
    monkeypatch.setattr(v, "backend_hooks", lambda db, train: (lambda model, inputs: list(replacements), build))
    monkeypatch.setattr(
        v, "optimized_model", lambda model, backend, options: (build(model, list(replacements)), "kernelsmith", "")
    )
    result = runner.invoke(
        app, ["verify", "llama-160m", "--tiny", "--seq", "8", "--seeds", "1", "--diagnose", "--no-time", "--json"]
    )
    assert result.exit_code == 1, result.output
    data = json.loads(result.stdout)
    assert data["diagnosis"]["culprits"] == ["swiglu"] and not data["verify"]["ok"]

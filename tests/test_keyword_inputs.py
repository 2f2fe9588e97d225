"""Keyword inputs where a model is run: a Hugging Face causal LM called with ``labels=`` computes
its loss inside, and the profile, the discovered sites, optimize_model and verify_model all see
it (interpreter mode on the CPU; peak memory is not measured there, and the plan says so)."""

from __future__ import annotations

import pytest
import torch
import transformers

from kernelsmith.whole_model import keyword_inputs as ki
from kernelsmith.whole_model.optimize import discover_sites, optimize_model
from kernelsmith.whole_model.profile import profile_model
from kernelsmith.whole_model.verify import verify_model


@pytest.fixture(scope="module")
def llama() -> torch.nn.Module:
    config = transformers.LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
        num_key_value_heads=2,
    )  # fmt: skip
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config).eval()


def _kwargs(seed: int = 0) -> dict[str, torch.Tensor]:
    ids = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(seed))
    return ki.keyword_inputs(ids, ("input_ids", "labels", "attention_mask"))


def test_names_parse_and_inputs_are_made_from_the_token_ids() -> None:
    assert ki.parse_keywords("labels") == ("input_ids", "labels")
    assert ki.parse_keywords(" attention_mask, input_ids ,labels") == ki.KEYWORDS
    assert ki.parse_keywords(None) == ()
    for bad in ("labels,tokens", "labels,labels"):
        with pytest.raises(ValueError):
            ki.parse_keywords(bad)
    made = _kwargs()
    assert torch.equal(made["labels"], made["input_ids"]) and made["labels"] is not made["input_ids"]
    assert bool((made["attention_mask"] == 1).all())


def test_the_profile_sees_the_loss_and_says_memory_is_not_measured_on_a_cpu(llama) -> None:
    plan = profile_model(llama, (), kwargs=_kwargs(), warmup=0, iterations=1, name="tiny")
    assert any(r.family == "cross_entropy" for r in plan.rows), [r.family for r in plan.rows]
    assert plan.peak_memory_bytes is None and "not measured" in plan.memory_note
    without = profile_model(llama, (), kwargs={"input_ids": _kwargs()["input_ids"]}, warmup=0, iterations=1)
    assert not any(r.family == "cross_entropy" for r in without.rows)


def test_discovered_sites_include_the_lm_head_and_its_loss(llama) -> None:
    torch._dynamo.reset()
    ops = [s.op for s in discover_sites(llama, (), kwargs=_kwargs())]
    assert ops[-1] == "linear_cross_entropy"


def test_optimize_model_takes_keyword_inputs(llama, tmp_path, monkeypatch) -> None:
    import torch._inductor.compile_fx as inductor

    monkeypatch.setattr(inductor, "compile_fx", lambda gm, example_inputs, **_: gm.forward)  # (CPU compiles: slow)
    torch._dynamo.reset()
    kwargs = _kwargs()
    compiled, report = optimize_model(llama, example_kwargs=kwargs, budget=0, db=str(tmp_path / "k.db"))
    assert "linear_cross_entropy" in [s["op"] for s in report["sites"]]
    assert report["peak_memory_bytes"] is None
    torch.testing.assert_close(compiled(**kwargs).loss, llama(**kwargs).loss)


def test_verify_model_calls_both_models_by_keyword(llama) -> None:
    names = ("input_ids", "labels")
    result = verify_model(llama, llama, lambda s: tuple(_kwargs(s)[n] for n in names), seeds=[1], truth="original",
                          keywords=names)  # fmt: skip
    assert result.ok, result
    with pytest.raises(TypeError, match="expected 2 inputs"):
        ki.KeywordCall(llama, names)(_kwargs()["input_ids"])


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory) -> str:
    config = transformers.LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64,
    )  # fmt: skip
    path = tmp_path_factory.mktemp("hf") / "tiny"
    config.save_pretrained(path)
    return str(path)


def test_the_commands_take_keyword_inputs_and_verify_train_compares_the_steps(hf_dir, tmp_path, monkeypatch) -> None:
    import json

    from typer.testing import CliRunner

    from kernelsmith.cli.main import app

    compile_ = torch.compile  # every compile eager here: CPU Inductor compiles take seconds each
    monkeypatch.setattr(torch, "compile", lambda model, backend=None, **kw: compile_(model, backend="eager"))
    runner = CliRunner()
    torch._dynamo.reset()
    plan_file = tmp_path / "plan.json"
    result = runner.invoke(app, ["profile", "--hf-config", hf_dir, "--seq", "8", "--keyword-inputs", "labels",
                                 "--out", str(plan_file), "--json"])  # fmt: skip
    assert result.exit_code == 0, result.output
    plan = json.loads(result.stdout)
    assert plan["peak_memory_bytes"] is None and any(r["family"] == "cross_entropy" for r in plan["rows"])
    result = runner.invoke(app, ["verify", "--hf-config", hf_dir, "--seq", "8", "--seeds", "1", "--seed", "3",
                                 "--backend", "eager", "--keyword-inputs", "input_ids,labels", "--train",
                                 "--warmup", "0", "--rounds", "6", "--json"])  # fmt: skip
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["verify"]["ok"]
    assert "output.loss" in [c["name"] for c in data["verify"]["checks"]]
    steps = {s["name"]: s for s in data["train_steps"]}
    assert list(steps) == ["eager", "torch.compile", "kernelsmith", "kernelsmith (fused loss, no logits)", "liger"]
    assert "no fused-loss kernel served" in steps["kernelsmith (fused loss, no logits)"]["note"]  # none stored
    assert steps["torch.compile"]["agrees"] and steps["kernelsmith"]["agrees"]
    assert steps["kernelsmith"]["measure"]["peak_bytes"] is None  # a CPU
    result = runner.invoke(app, ["verify", "--hf-config", hf_dir, "--keyword-inputs", "tokens"])
    assert result.exit_code != 0 and "unknown" in result.output

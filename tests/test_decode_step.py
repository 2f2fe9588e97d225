"""The decode step: decode-shaped projections routed to decode_matmul by the backend, the graph
wrapper, greedy generation compared with eager (built-in Llama with a KV cache, and Hugging Face
``generate()`` with a static cache), and the bad inputs that must leave the original code running.

CPU, interpreter mode (conftest). As in test_backend, Inductor is replaced by a recorder that runs
the graph it is handed, and winners are stored directly (interpreter timings never win).
"""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from kernelsmith.frontends import backend as ks_backend
from kernelsmith.models import get_model
from kernelsmith.testing.decisions import store_kernel_decisions
from kernelsmith.testing.models import tiny_llama
from kernelsmith.whole_model import decode
from test_backend import kernel_ops, record_inductor, spy_runners

BATCH, PROMPT, NEW = 2, 6, 4


def store_winners(db: str, sites) -> None:
    store_kernel_decisions(db, [s.spec for s in sites])


def decode_sites(fn, *inputs) -> list[ks_backend.Site]:
    torch._dynamo.reset()
    probe = ks_backend.KernelsmithBackend(discover=True, decode=True)
    with torch.no_grad():
        torch.compile(fn, backend=probe)(*inputs)
    return probe.sites


@pytest.fixture(scope="module")
def llama() -> nn.Module:
    torch.manual_seed(0)
    return get_model("llama-160m", tiny=True, n_layers=1).eval()


def step_inputs(decoder: decode.KVCacheLlama) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    ids = torch.tensor([[3], [5]])
    return ids, torch.tensor([PROMPT]), torch.ones(BATCH, decoder.cache_len, dtype=torch.bool)


def epilogues(sites) -> list[tuple[str, str]]:
    return [(s.op, s.spec.const("epilogue") if s.op == "decode_matmul" else "") for s in sites]


def test_decode_projections_are_sites_with_their_fused_epilogues(llama):
    decoder = decode.KVCacheLlama(llama, BATCH, 16)
    sites = decode_sites(decoder, *step_inputs(decoder))
    assert [e for e in epilogues(sites) if e[0] == "decode_matmul"] == [
        ("decode_matmul", "none"), ("decode_matmul", "none"), ("decode_matmul", "none"),  # q, k, v
        ("decode_matmul", "residual"),  # o + the residual
        ("decode_matmul", "swiglu"),  # gate and up in one pass
        ("decode_matmul", "residual"),  # down + the residual
        ("decode_matmul", "none"),  # the LM head
    ]  # fmt: skip
    swiglu = next(s for s in sites if s.op == "decode_matmul" and s.spec.const("epilogue") == "swiglu")
    assert [t.shape for t in swiglu.spec.inputs] == [(BATCH, 1, 64), (176, 64), (176, 64), (64,)]  # ..., gamma
    # Every norm feeds projections only, so q, k, v, gate/up and the LM head recompute it in their
    # prologue (test_decode_prologue); the attention reads the decoder's valid-positions mask (masked layout).
    assert [s.spec.constants.get("prologue") for s in sites if s.op == "decode_matmul"] == [
        "rmsnorm", "rmsnorm", "rmsnorm", None, "rmsnorm", None, "rmsnorm"]  # fmt: skip
    assert {s.op for s in sites} == {"decode_matmul", "decode_attention"}
    assert [s.spec.const("cache") for s in sites if s.op == "decode_attention"] == ["masked"]


def test_decode_matching_is_opt_in(llama):
    decoder = decode.KVCacheLlama(llama, BATCH, 16)
    torch._dynamo.reset()
    probe = ks_backend.KernelsmithBackend(discover=True)
    with torch.no_grad():
        torch.compile(decoder, backend=probe)(*step_inputs(decoder))
    assert "decode_matmul" not in {s.op for s in probe.sites}
    assert "decode_matmul" not in ks_backend.FAMILIES and "decode_matmul" in ks_backend.KNOWN_FAMILIES
    assert "decode_matmul" in ks_backend.backend(decode=True).families


def test_prefill_rows_and_unknown_layouts_stay_the_original_code():
    w = torch.randn(24, 40)

    def rows(x):  # 65 rows: a prefill, not a decode step
        return F.linear(x, w)

    def matmul_layout(x):  # the weight (K, N): a layout decode_matmul does not take
        return x @ w.T.contiguous()

    def strided(x):  # x not contiguous: the kernels' contract is contiguous inputs
        return F.linear(x.t(), w)

    assert decode_sites(rows, torch.randn(65, 40)) == []
    assert decode_sites(matmul_layout, torch.randn(2, 40)) == []
    assert decode_sites(strided, torch.randn(40, 2)) == []
    assert [s.op for s in decode_sites(rows, torch.randn(64, 40))] == ["decode_matmul"]


def test_two_products_of_different_x_are_not_one_swiglu():
    gate, up = nn.Linear(32, 48, bias=False), nn.Linear(32, 48, bias=False)

    def fn(a, b):
        return F.silu(gate(a)) * up(b)

    sites = decode_sites(fn, torch.randn(1, 32), torch.randn(1, 32))
    assert epilogues(sites)[:2] == [("decode_matmul", "none"), ("decode_matmul", "none")]


@pytest.fixture
def served(tmp_path, monkeypatch, llama):
    """A database holding a winner for every site of the tiny Llama's decode step, and Inductor
    replaced by the recorder; returns (db path, recorded graphs, runner calls)."""
    db = str(tmp_path / "k.db")
    decoder = decode.KVCacheLlama(llama, BATCH, PROMPT + NEW - 1)
    store_winners(db, decode_sites(decoder, *step_inputs(decoder)))
    seen = record_inductor(monkeypatch)
    calls = spy_runners(monkeypatch)
    torch._dynamo.reset()
    return db, seen, calls


@pytest.mark.slow  # ~60 s: every decode step runs seven kernels in the interpreter, twice per variant
def test_a_served_decode_step_generates_eager_tokens_on_a_ragged_batch(llama, served):
    db, seen, calls = served
    backend = decode.kernelsmith_backend(db=db)
    report = decode.verify_decode(llama, batch=BATCH, prompt_len=PROMPT, new_tokens=NEW, ragged=True,
                                  variants=("eager", "kernelsmith"), backend=backend)  # fmt: skip
    assert report.ok, report.to_dict()
    assert [r.name for r in report.rows] == ["eager", "kernelsmith"]
    assert report.rows[1].same_tokens and report.rows[1].tokens_per_s > 0
    assert kernel_ops(seen[0]).count("decode_matmul") == 7
    assert {s.status for s in backend.sites} == {"replaced"}, [(s.op, s.status, s.reason) for s in backend.sites]
    assert calls  # the kernels ran (in the interpreter) in every decode step
    assert CPU_NOTE_IN(report)


def CPU_NOTE_IN(report: decode.DecodeReport) -> bool:
    return decode.CPU_NOTE in report.notes


def test_the_kv_cache_step_equals_the_full_forward(llama):
    """The decoder with its cache computes what the model computes on the whole sequence."""
    ids = torch.randint(0, 512, (BATCH, PROMPT))
    decoder = decode.KVCacheLlama(llama, BATCH, PROMPT)
    valid = torch.ones(BATCH, PROMPT, dtype=torch.bool)
    with torch.no_grad():
        full = llama(ids)
        decoder(ids[:, :-1], torch.arange(PROMPT - 1), valid)
        last = decoder(ids[:, -1:], torch.tensor([PROMPT - 1]), valid)
    torch.testing.assert_close(last[:, 0], full[:, -1], rtol=1e-4, atol=1e-4)


def test_padding_changes_nothing_for_the_padded_sequence_s_tokens(llama):
    """A left-padded prompt generates what the same prompt alone generates (the padding masked)."""
    ids, mask = decode.prompt_batch(512, 2, PROMPT, torch.device("cpu"), ragged=True)
    decoder = decode.KVCacheLlama(llama, 2, PROMPT + NEW - 1)
    valid = torch.ones(2, decoder.cache_len, dtype=torch.bool)
    valid[:, :PROMPT] = mask.bool()
    padded = decode.greedy(decoder, decoder, ids, valid, NEW, decoder.cache_len, keep_logits=False)
    pad = int((mask[1] == 0).sum())
    alone = decode.KVCacheLlama(llama, 1, PROMPT - pad + NEW - 1)
    valid_alone = torch.ones(1, alone.cache_len, dtype=torch.bool)
    single = decode.greedy(alone, alone, ids[1:, pad:], valid_alone, NEW, alone.cache_len, keep_logits=False)
    assert torch.equal(padded.tokens[1], single.tokens[0])


def test_a_cache_position_past_the_end_is_refused_before_anything_runs(llama):
    decoder = decode.KVCacheLlama(llama, BATCH, 8)
    ran = []

    def step(*args):
        ran.append(args)
        return decoder(*args)

    prompt = torch.zeros(BATCH, 6, dtype=torch.int64)
    valid = torch.ones(BATCH, 8, dtype=torch.bool)
    with pytest.raises(ValueError, match="the cache holds 8"):
        decode.greedy(step, step, prompt, valid, 4, 8, keep_logits=False)  # 6 + 4 - 1 = 9 positions
    assert ran == []
    with pytest.raises(ValueError, match="the cache holds"):
        decode.verify_decode(llama, batch=1, prompt_len=6, new_tokens=4, cache_len=8, variants=("eager",))
    decode.greedy(step, step, prompt, valid, 3, 8, keep_logits=False)  # 8 positions: fits


def test_a_model_decode_does_not_know_is_refused():
    with pytest.raises(ValueError, match="built-in llama"):
        decode.verify_decode(get_model("gpt2", tiny=True), variants=("eager",))


def test_tokens_that_part_on_a_tie_pass_and_otherwise_fail():
    tokens = torch.tensor([[1, 2, 3]])
    values = torch.tensor([[[5.0, 4.999]], [[5.0, 1.0]], [[5.0, 1.0]]])
    indices = torch.tensor([[[1, 7]], [[2, 8]], [[3, 9]]])
    eager = decode.Generation(tokens, values, indices, 1.0, 2)
    assert decode.compare_tokens(eager, tokens.clone(), torch.bfloat16).same
    tie = decode.compare_tokens(eager, torch.tensor([[7, 4, 4]]), torch.bfloat16)
    assert (tie.same, tie.ok, tie.first_difference["step"], tie.first_difference["tie"]) == (False, True, 0, True)
    wrong = decode.compare_tokens(eager, torch.tensor([[1, 8, 3]]), torch.bfloat16)  # a gap of 4: no tie
    assert (wrong.ok, wrong.first_difference["step"], wrong.first_difference["tie"]) == (False, 1, False)
    other = decode.compare_tokens(eager, torch.tensor([[9, 2, 3]]), torch.bfloat16)  # not eager's second pick
    assert not other.ok


def test_bytes_per_step_count_weights_once_and_the_cache(llama):
    decoder = decode.KVCacheLlama(llama, BATCH, 16)
    expected = sum(p.nbytes for p in llama.parameters()) - llama.embed_tokens.weight.nbytes
    assert decode.weight_bytes(llama) == expected
    assert decoder.cache_bytes() == 2 * 1 * BATCH * 2 * 16 * 16 * 4  # k and v, 1 layer, 2 KV heads of 16, fp32


def test_the_graph_wrapper_copies_into_static_buffers_and_refuses_other_shapes():
    calls = []

    def step(x, scale):
        calls.append(x.data_ptr())
        return x * scale

    wrapped = decode.cuda_graph(step, (torch.ones(3), 2.0))
    assert torch.equal(wrapped(torch.arange(3.0), 2.0), torch.tensor([0.0, 2.0, 4.0]))
    assert set(calls) == {wrapped.static_inputs[0].data_ptr()}  # always the static buffer
    with pytest.raises(ValueError, match="fixed shapes"):
        wrapped(torch.ones(4), 2.0)
    with pytest.raises(ValueError, match=r"captured with 2\.0"):
        wrapped(torch.ones(3), 3.0)
    import kernelsmith

    assert kernelsmith.cuda_graph is decode.cuda_graph


def test_in_context_timing_follows_how_the_step_runs():
    assert decode.in_context_timer("auto", None, {}) is ks_backend.time_graphs
    assert decode.in_context_timer("graph", None, {}) is decode.time_replayed
    assert decode.in_context_timer("graph", "reduce-overhead", {}) is ks_backend.time_graphs  # Inductor's graphs
    assert decode.in_context_timer("auto", None, {"triton.cudagraphs": True}) is ks_backend.time_graphs
    with decode.graph_capture_planned():
        assert decode.in_context_timer("auto", None, {}) is decode.time_replayed
        assert decode.in_context_timer("calls", None, {}) is ks_backend.time_graphs
    assert not decode.graph_capture_is_planned()
    with pytest.raises(ValueError, match="timing"):
        decode.in_context_timer("sometimes", None, {})
    assert ks_backend.backend(timing="graph")._timer() is decode.time_replayed
    # No CUDA tensors: replay timing is call timing.
    assert len(decode.time_replayed([lambda x: x + 1], [torch.ones(2)], rounds=1, replays=1)) == 1


# ---- Hugging Face generate() with a static cache ---------------------------------------------------


@pytest.fixture(scope="module")
def hf_llama() -> nn.Module:
    return tiny_llama(num_hidden_layers=1)


@pytest.mark.slow  # ~35 s
def test_hf_generate_with_served_decode_kernels_gives_eager_tokens_with_padding(hf_llama, tmp_path, monkeypatch):
    db = str(tmp_path / "k.db")
    seen = record_inductor(monkeypatch)
    probe = decode.kernelsmith_backend(db=db)
    ids, mask = decode.prompt_batch(128, BATCH, PROMPT, torch.device("cpu"), ragged=True)
    torch._dynamo.reset()
    decode.hf_generate(hf_llama, ids, mask, 2, "kernelsmith", probe)  # finds the decode graph's sites
    assert "decode_matmul" in {s.op for s in probe.sites}
    store_winners(db, [s for s in probe.sites if s.op == "decode_matmul"])
    seen.clear()
    backend = decode.kernelsmith_backend(db=db)
    report = decode.verify_decode(hf_llama, batch=BATCH, prompt_len=PROMPT, new_tokens=NEW, ragged=True,
                                  variants=("eager", "kernelsmith"), backend=backend)  # fmt: skip
    assert report.ok, report.to_dict()
    assert report.kind == "hf" and report.rows[1].same_tokens
    assert {s.status for s in backend.sites if s.op == "decode_matmul"} == {"replaced"}
    assert kernel_ops(seen[0]).count("decode_matmul") == 7  # q, k, v, o + residual, gate+up, down + residual, head
    assert report.cache_bytes == 2 * 1 * BATCH * 2 * (PROMPT + NEW) * 16 * 4


# ---- kernelsmith verify MODEL --decode -------------------------------------------------------------


def test_verify_decode_refuses_a_model_it_cannot_decode_and_a_cache_too_short():
    from typer.testing import CliRunner

    from kernelsmith.cli.main import app

    result = CliRunner().invoke(app, ["verify", "gpt2", "--tiny", "--decode", "--seq", "4", "--new-tokens", "2"])
    assert result.exit_code == 2 and "built-in llama" in result.output
    result = CliRunner().invoke(app, ["verify", "llama-160m", "--tiny", "--decode", "--seq", "4", "--new-tokens", "0"])
    assert result.exit_code == 2  # --new-tokens is at least 1


def test_verify_decode_reports_every_variant_in_json(monkeypatch):
    """The command's JSON: one row per variant with tokens/s and the token check (the variants'
    generation is verify_decode's, stubbed here to the eager one so the test stays fast)."""
    from typer.testing import CliRunner

    from kernelsmith.cli.main import app

    real = decode.verify_decode

    def eager_only(model, **kwargs):
        return real(model, **{**kwargs, "variants": ("eager",)})

    monkeypatch.setattr(decode, "verify_decode", eager_only)
    result = CliRunner().invoke(app, ["verify", "llama-160m", "--tiny", "--decode", "--seq", "5", "--new-tokens", "3",
                                      "--batch", "1", "--json"])  # fmt: skip
    assert result.exit_code == 0, result.output
    report = json.loads(result.output.strip().splitlines()[-1])
    assert report["ok"] and report["prompt"] == 5 and report["new_tokens"] == 3 and report["kind"] == "builtin"
    assert [r["name"] for r in report["rows"]] == ["eager"] and report["rows"][0]["tokens_per_s"] > 0


def test_a_deep_copy_of_the_backend_is_the_backend():
    """transformers' CompileConfig deep-copies its backend: the sites must land on the user's."""
    import copy

    backend = decode.kernelsmith_backend()
    assert copy.deepcopy(backend) is backend
    assert copy.deepcopy({"backend": backend})["backend"] is backend

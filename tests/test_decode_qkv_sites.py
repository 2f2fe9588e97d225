"""A decoder layer's q, k and v projections as one ``decode_matmul`` site (``weights="qkv"``).

(kernelsmith.frontends.patterns.decode_qkv.) The q and k RoPE sites and v's plain site of one
layer, all reading the same normed x, become one site whose kernel writes the concatenated row;
the rewrite gives q's and k's rotated heads and v's heads as slices of it. Where a condition fails
(batch > 1: a slice's layout differs; k with a bias; v reading another x; no decision for the fused
spec) the three sites stay. CPU, interpreter mode (conftest); Inductor replaced by a recorder and
winners stored directly, as in test_decode_step and test_decode_prologue.
"""

from __future__ import annotations

import operator

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from kernelsmith.models import get_model
from kernelsmith.ops import get_op
from kernelsmith.testing.decisions import store_kernel_decisions
from kernelsmith.whole_model import decode
from test_backend import kernel_ops, record_inductor, spy_runners
from test_decode_prologue import LlamaNorm
from test_decode_rope_sites import rotate_half, tables
from test_decode_step import decode_sites, store_winners

HIDDEN, HEADS, KV_HEADS, D = 64, 4, 2, 16
PROMPT, NEW = 6, 4


class Layer(nn.Module):
    """Hugging Face's Llama attention block written out: the input norm, q, k and v viewed to
    heads, q and k rotated, then SDPA (GQA by repeating k and v). ``k_bias``: k_proj has a bias;
    ``v_reads``: "x" for v projecting the un-normed input instead of the norm's output."""

    def __init__(self, k_bias: bool = False, v_reads: str = "h") -> None:
        super().__init__()
        torch.manual_seed(0)
        self.norm = LlamaNorm(HIDDEN)
        self.q_proj = nn.Linear(HIDDEN, HEADS * D, bias=False)
        self.k_proj = nn.Linear(HIDDEN, KV_HEADS * D, bias=k_bias)
        self.v_proj = nn.Linear(HIDDEN, KV_HEADS * D, bias=False)
        self.v_reads = v_reads

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        h = self.norm(x)
        q = self.q_proj(h).view(b, s, -1, D).transpose(1, 2)
        k = self.k_proj(h).view(b, s, -1, D).transpose(1, 2)
        v = self.v_proj(h if self.v_reads == "h" else x).view(b, s, -1, D).transpose(1, 2)
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        k, v = k.repeat_interleave(HEADS // KV_HEADS, 1), v.repeat_interleave(HEADS // KV_HEADS, 1)
        return F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, s, HEADS * D)


def projections(sites) -> list[tuple[str | None, list[int] | None, str | None]]:
    """(weights, rope, prologue) of each decode_matmul site, in graph order."""
    return [(s.spec.constants.get("weights"), s.spec.constants.get("rope"), s.spec.constants.get("prologue"))
            for s in sites if s.op == "decode_matmul"]  # fmt: skip


def test_q_k_and_v_of_one_token_become_one_site() -> None:
    layer, x = Layer(), torch.randn(1, 1, HIDDEN)
    sites = decode_sites(layer, x, *tables(1))
    assert projections(sites) == [("qkv", [HEADS, KV_HEADS], "rmsnorm")]
    (qkv,) = (s for s in sites if s.op == "decode_matmul")
    assert [t.shape for t in qkv.spec.inputs] == [(1, 1, HIDDEN), (HEADS * D, HIDDEN), (KV_HEADS * D, HIDDEN),
                                                  (KV_HEADS * D, HIDDEN), (HIDDEN,), (1, 1, D), (1, 1, D)]  # fmt: skip
    assert [(p.start, p.stop, p.view) for p in qkv.slices] == [
        (0, 64, (1, 1, HEADS, D)), (64, 96, (1, 1, KV_HEADS, D)), (96, 128, (1, 1, KV_HEADS, D))]  # fmt: skip
    assert qkv.output is qkv.region[-1] and qkv.prologue  # the norm, recomputed once


@pytest.mark.parametrize(
    ("layer", "batch"),
    [(Layer(), 2), (Layer(k_bias=True), 1), (Layer(v_reads="x"), 1)],
    ids=["batch-2-slices-laid-out-otherwise", "k-has-a-bias", "v-reads-another-x"],
)
def test_otherwise_the_three_sites_stay(layer: Layer, batch: int) -> None:
    sites = decode_sites(layer, torch.randn(batch, 1, HIDDEN), *tables(batch))
    found = projections(sites)
    assert "qkv" not in {w for w, _, _ in found}
    assert len(found) == 3 if layer.v_reads == "h" and layer.k_proj.bias is None else len(found) >= 2


def served(layer: Layer, x: torch.Tensor, db: str, monkeypatch) -> tuple[torch.Tensor, list, object]:
    """The layer compiled by the backend on ``db``'s decisions (Inductor recorded): its output,
    the recorded graphs and the backend."""
    seen = record_inductor(monkeypatch)
    spy_runners(monkeypatch)
    torch._dynamo.reset()
    backend = decode.kernelsmith_backend(db=db)
    with torch.no_grad():
        out = torch.compile(layer, backend=backend)(x, *tables(1))
    return out, seen, backend


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_served_qkv_site_computes_eager_s_output(tmp_path, monkeypatch, dtype: torch.dtype) -> None:
    db = str(tmp_path / "k.db")
    layer, x = Layer().to(dtype), torch.randn(1, 1, HIDDEN, dtype=dtype)
    cos, sin = (t.to(dtype) for t in tables(1))
    store_winners(db, decode_sites(layer, x, cos, sin))
    seen = record_inductor(monkeypatch)
    calls = spy_runners(monkeypatch)
    torch._dynamo.reset()
    backend = decode.kernelsmith_backend(db=db)
    with torch.no_grad():
        out = torch.compile(layer, backend=backend)(x, cos, sin)
        expected = layer(x, cos, sin)
    tolerance = 2e-2 if dtype == torch.bfloat16 else 1e-4
    torch.testing.assert_close(out, expected, rtol=tolerance, atol=tolerance)
    replaced = [s for s in backend.sites if s.op == "decode_matmul"]
    assert [(s.spec.constants.get("weights"), s.status) for s in replaced] == [("qkv", "replaced")]
    assert kernel_ops(seen[0]).count("decode_matmul") == 1 and calls
    graph = seen[0].graph
    assert not [n for n in graph.nodes if "rsqrt" in str(n.target)]  # the norm, erased
    narrows = [n for n in graph.nodes if n.target == "narrow"]
    assert [n.args[1:] for n in narrows] == [(-1, 0, 64), (-1, 64, 32), (-1, 96, 32)]
    assert all(n.args[0].target is operator.getitem for n in narrows)


def test_without_a_decision_for_the_fused_spec_the_three_sites_are_served(tmp_path, monkeypatch) -> None:
    """A database tuned before the fused form existed: the q and k RoPE sites and v's are served."""
    db = str(tmp_path / "k.db")
    layer, x = Layer(), torch.randn(1, 1, HIDDEN)
    sites = decode_sites(layer, x, *tables(1))
    (fused,) = (s for s in sites if s.op == "decode_matmul")
    assert fused.spec.constants["weights"] == "qkv"
    # the three sites' specs at batch 1: those the batch-2 graph has (no fused site there), one row
    three = [s for s in decode_sites(Layer(), torch.randn(2, 1, HIDDEN), *tables(2)) if s.op == "decode_matmul"]
    specs = [get_op("decode_matmul")._with_rows(s.spec, 1) for s in three]
    assert len(specs) == 3 and all("weights" not in s.constants for s in specs)
    store_kernel_decisions(db, specs)
    out, seen, backend = served(layer, x, db, monkeypatch)
    torch.testing.assert_close(out, layer(x, *tables(1)), rtol=1e-4, atol=1e-4)
    statuses = {(str(s.spec.constants.get("rope")), s.status) for s in backend.sites if s.op == "decode_matmul"}
    assert statuses == {(str([HEADS, 0]), "replaced"), (str([KV_HEADS, 0]), "replaced"), ("None", "replaced")}
    assert kernel_ops(seen[0]).count("decode_matmul") == 3


def kv_cache_llama_sites(layers: int = 2) -> tuple[nn.Module, decode.KVCacheLlama, list]:
    torch.manual_seed(0)
    llama = get_model("llama-160m", tiny=True, n_layers=layers).eval()
    decoder = decode.KVCacheLlama(llama, 1, PROMPT + NEW - 1)
    ids, positions = torch.tensor([[3]]), torch.tensor([PROMPT])
    return llama, decoder, decode_sites(decoder, ids, positions, torch.ones(1, decoder.cache_len, dtype=torch.bool))


def test_a_kv_cache_llama_step_has_one_qkv_site_per_layer() -> None:
    _, _, sites = kv_cache_llama_sites()
    qkv = [s for s in sites if s.spec.constants.get("weights") == "qkv"]
    rope_only = [s for s in sites if "rope" in s.constants and "weights" not in s.constants]
    assert len(qkv) == 2 and not rope_only
    assert [s.spec.const("epilogue") for s in sites if s.op == "decode_matmul"] == [
        "none", "residual", "swiglu", "residual"] * 2 + ["none"]  # fmt: skip


@pytest.mark.slow  # ~1 min: every step runs nine kernels in the interpreter
def test_a_served_kv_cache_llama_with_qkv_sites_generates_eager_tokens(tmp_path, monkeypatch) -> None:
    db = str(tmp_path / "k.db")
    llama, _, sites = kv_cache_llama_sites()
    store_winners(db, sites)
    seen, calls = record_inductor(monkeypatch), spy_runners(monkeypatch)
    torch._dynamo.reset()
    backend = decode.kernelsmith_backend(db=db)
    report = decode.verify_decode(llama, batch=1, prompt_len=PROMPT, new_tokens=NEW, ragged=False,
                                  variants=("eager", "kernelsmith"), backend=backend)  # fmt: skip
    assert report.ok, report.to_dict()
    assert report.rows[1].same_tokens
    assert kernel_ops(seen[0]).count("decode_matmul") == 9 and calls
    served = [s for s in backend.sites if s.op == "decode_matmul"]
    assert [s.spec.constants.get("weights") for s in served].count("qkv") == 2
    assert {s.status for s in backend.sites} == {"replaced"}, [(s.op, s.status, s.reason) for s in backend.sites]


def test_a_graph_that_needs_gradients_keeps_q_k_and_v_to_the_original_code(tmp_path, monkeypatch) -> None:
    """decode_matmul has no backward: with grad enabled and weights requiring it, the fused site is
    refused as each of the three is ("no backward"), and the layer's gradients still flow (on the
    H200, 2026-12-02, the fused site was served in such a graph and Inductor could not trace its
    backward)."""
    db = str(tmp_path / "k.db")
    layer, x = Layer(), torch.randn(1, 1, HIDDEN)
    store_winners(db, decode_sites(layer, x, *tables(1)))
    record_inductor(monkeypatch)
    torch._dynamo.reset()
    backend = decode.kernelsmith_backend(db=db)
    out = torch.compile(layer, backend=backend)(x, *tables(1))
    out.sum().backward()
    assert layer.q_proj.weight.grad is not None
    fused = [s for s in backend.sites if s.spec.constants.get("weights") == "qkv"]
    assert fused and all(s.needs_grad and s.status != "replaced" for s in fused), [(s.status, s.reason) for s in fused]


def test_verify_decode_builds_the_built_in_step_without_gradients(monkeypatch) -> None:
    """On CUDA the kernelsmith step compiles and is captured when it is built (kernelsmith.cuda_graph),
    so it must be built under no_grad: built with grad enabled, the backend saw a training graph and
    refused every decode site it could serve (2 of 11 served on the H200, 2026-12-02)."""
    modes: list[bool] = []
    built = decode._builtin_step

    def recording(*args, **kwargs):
        modes.append(torch.is_grad_enabled())
        return built(*args, **kwargs)

    monkeypatch.setattr(decode, "_builtin_step", recording)
    llama = get_model("llama-160m", tiny=True, n_layers=1).eval()
    report = decode.verify_decode(llama, batch=1, prompt_len=3, new_tokens=2, ragged=False, variants=("eager",))
    assert report.ok and modes == [False]

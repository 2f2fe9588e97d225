"""RoPE served in the epilogue of Llama's q and k projections by the compile backend.

(kernelsmith.frontends.patterns.decode, "RoPE epilogues".) Where the database holds the fused
site's winner, ``F.linear(x, Wq).view(B, S, H, D).transpose(1, 2)`` and its rotation become one
``decode_matmul`` call with ``epilogue="rope"``, followed by the same view and transpose; where
it holds only the plain projection's (a database tuned before RoPE sites existed), the fused site
gives its nodes back and the plain projection is served as before, the rotation left in the graph.

The backend passes ``find_sites`` its resolver's ``kernel_decided`` as the ``rope_decided`` test.
CPU, interpreter mode (conftest), Inductor replaced by a recorder and winners stored directly, as in
test_decode_prologue; the modules and tables are test_decode_rope_sites'.
"""

from __future__ import annotations

import json
import logging
import operator

import pytest
import torch

import test_decode_rope_sites as rope_graphs
from kernelsmith.frontends import _backend_decode_sites, _backend_rewrite, _backend_sites
from kernelsmith.frontends import backend as ks_backend
from kernelsmith.testing.decisions import store_kernel_decisions
from test_backend import kernel_ops, record_inductor, spy_runners

ODD_K, HEADS, KV_HEADS = 33, 2, 1  # the attention's hidden size (the projections' K), q's and k's heads


@pytest.fixture
def small_attention(monkeypatch) -> None:
    """test_decode_rope_sites' Attention at 2 q heads and 1 KV head of 16, over an odd K."""
    monkeypatch.setattr(rope_graphs, "HIDDEN", ODD_K)
    monkeypatch.setattr(rope_graphs, "HEADS", HEADS)
    monkeypatch.setattr(rope_graphs, "KV_HEADS", KV_HEADS)


def decode_sites(fn, inputs, rope: bool) -> list[_backend_sites.Site]:
    """The decode_matmul sites of ``fn``'s graph: with every RoPE site offered, or none (and no
    fused QKV site, which test_decode_qkv_sites tests: at batch 1 it would take q, k and v)."""
    gm = rope_graphs.capture(fn, *inputs)
    offered = (lambda site: "weights" not in site.constants) if rope else None
    return _backend_sites.find_sites(gm, ("decode_matmul",), rope_decided=offered)


def fused(site: _backend_sites.Site) -> str:
    """What a decode site fuses: "rope" for a rotated projection (whose spec's epilogue is its
    matmul part's, "none"), else its epilogue."""
    return "rope" if "rope" in site.spec.constants else str(site.spec.const("epilogue"))


def epilogues(gm: torch.fx.GraphModule) -> list[str]:
    """The epilogue of each kernelsmith::kernel call of a rewritten graph."""
    return [json.loads(n.args[2]).get("epilogue", "none") for n in gm.graph.nodes
            if n.target is torch.ops.kernelsmith.kernel.default]  # fmt: skip


def rotations(gm: torch.fx.GraphModule) -> int:
    """rotate_half's negations (its ``-x2``) left in a graph: one per rotation q or k still does."""
    return sum(1 for n in gm.graph.nodes if n.op == "call_function" and n.target in (operator.neg, torch.neg))


def compiled(fn, inputs, db: str, monkeypatch) -> tuple[torch.Tensor, ks_backend.KernelsmithBackend, list]:
    seen = record_inductor(monkeypatch)
    backend = ks_backend.KernelsmithBackend(db=db, compare=False, families=("decode_matmul",))
    torch._dynamo.reset()
    with torch.no_grad():
        out = torch.compile(fn, backend=backend, fullgraph=True)(*inputs)
    return out, backend, seen


@pytest.mark.parametrize(("batch", "dtype"), [(1, torch.float32), (2, torch.float32), (2, torch.bfloat16)])
def test_q_and_k_are_served_with_their_rotation(small_attention, tmp_path, monkeypatch, batch, dtype):
    db = str(tmp_path / "k.db")
    attn = rope_graphs.Attention().to(dtype)
    x = torch.randn(batch, 1, ODD_K, dtype=dtype)
    cos, sin = (t.to(dtype) for t in rope_graphs.tables(batch))
    sites = decode_sites(attn, (x, cos, sin), rope=True)
    assert [fused(s) for s in sites] == ["none", "rope", "rope"]  # in graph order: v alone, rotated q and k
    store_kernel_decisions(db, [s.spec for s in sites])
    calls = spy_runners(monkeypatch)
    out, backend, seen = compiled(attn, (x, cos, sin), db, monkeypatch)

    assert [(s.status, s.spec.constants.get("rope")) for s in backend.sites] == [
        ("replaced", None), ("replaced", [HEADS, 0]), ("replaced", [KV_HEADS, 0])]  # fmt: skip
    assert epilogues(seen[0]) == ["none", "rope", "rope"]
    assert len(calls) == 2 * 3  # each kernel twice: the resolver's check on fresh inputs, then the graph's call
    assert rotations(seen[0]) == 0  # q's and k's rotations are in the kernels
    with torch.no_grad():
        eager = attn(x, cos, sin)
        exact = attn.double()(x.double(), cos.double(), sin.double())
    tolerance = {"rtol": 1e-4, "atol": 1e-4} if dtype == torch.float32 else {"rtol": 2e-2, "atol": 2e-2}
    torch.testing.assert_close(out, eager, **tolerance)
    torch.testing.assert_close(out.double(), exact, **tolerance)


def test_a_database_with_only_the_plain_projections_still_serves_them(small_attention, tmp_path, monkeypatch):
    """Tuned before RoPE sites: q's and k's fused sites find no decision and give their nodes back,
    and the plain q, k and v projections are served as they were (the rotations stay)."""
    db = str(tmp_path / "k.db")
    attn, batch = rope_graphs.Attention(), 2
    inputs = (torch.randn(batch, 1, ODD_K), *rope_graphs.tables(batch))
    plain = decode_sites(attn, inputs, rope=False)
    assert [fused(s) for s in plain] == ["none"] * 3
    store_kernel_decisions(db, [s.spec for s in plain])
    out, backend, seen = compiled(attn, inputs, db, monkeypatch)

    assert [(s.status, fused(s)) for s in backend.sites] == [("replaced", "none")] * 3
    assert epilogues(seen[0]) == ["none"] * 3 and rotations(seen[0]) == 2
    with torch.no_grad():
        torch.testing.assert_close(out, attn(*inputs), rtol=1e-4, atol=1e-4)


def test_a_fused_site_with_a_decision_is_kept_when_the_plain_one_has_none_too(small_attention, tmp_path, monkeypatch):
    """Only q's fused site is stored: q is served with its rotation, and k's fused site, with no
    decision, leaves k to its plain projection (not tuned either: the original code)."""
    db = str(tmp_path / "k.db")
    attn, batch = rope_graphs.Attention(), 1
    inputs = (torch.randn(batch, 1, ODD_K), *rope_graphs.tables(batch))
    q = next(s for s in decode_sites(attn, inputs, rope=True) if "rope" in s.spec.constants)
    assert q.spec.constants["rope"] == [HEADS, 0]
    store_kernel_decisions(db, [q.spec])
    out, backend, seen = compiled(attn, inputs, db, monkeypatch)

    # in graph order: k's and v's plain projections, then q's rotation (the fused site's output)
    assert [(s.status, fused(s)) for s in backend.sites] == [
        ("not tuned", "none"), ("not tuned", "none"), ("replaced", "rope")]  # fmt: skip
    assert epilogues(seen[0]) == ["rope"] and rotations(seen[0]) == 1  # k's rotation stays
    with torch.no_grad():
        torch.testing.assert_close(out, attn(*inputs), rtol=1e-4, atol=1e-4)


def test_a_site_whose_viewed_output_is_not_the_graph_s_is_refused(small_attention, caplog):
    """The finder's check and the rewrite's: the kernel's (B, S, H * D) output viewed otherwise
    than as the graph viewed it has other strides, and the site is refused or left as it was."""
    attn, batch = rope_graphs.Attention(), 2
    sites = decode_sites(attn, (torch.randn(batch, 1, ODD_K), *rope_graphs.tables(batch)), rope=True)
    q = next(s for s in sites if "rope" in s.spec.constants)
    assert _backend_decode_sites.output_view_problem(q) == ""
    q.output_view = (batch, 1, rope_graphs.D, HEADS)  # the same elements, heads and head dim swapped
    assert "the graph reads" in _backend_decode_sites.output_view_problem(q)

    gm = q.output.graph.owning_module
    with caplog.at_level(logging.WARNING, logger="kernelsmith.frontends.backend"):
        rewritten = _backend_rewrite.rewrite(gm, [q])
    assert "left to the original code" in caplog.text
    assert kernel_ops(rewritten) == [] and rotations(rewritten) == rotations(gm) == 2
    assert [n.op for n in rewritten.graph.nodes] == [n.op for n in gm.graph.nodes]  # nothing added stays


def test_the_backend_itself_serves_rope(small_attention, tmp_path, monkeypatch):
    """The backend as a user builds it (decode=True, nothing patched) serves the fused sites."""
    db = str(tmp_path / "k.db")
    attn, batch = rope_graphs.Attention(), 1
    inputs = (torch.randn(batch, 1, ODD_K), *rope_graphs.tables(batch))
    store_kernel_decisions(db, [s.spec for s in decode_sites(attn, inputs, rope=True)])
    seen = record_inductor(monkeypatch)
    torch._dynamo.reset()
    with torch.no_grad():
        torch.compile(attn, backend=ks_backend.KernelsmithBackend(db=db, compare=False, decode=True))(*inputs)
    assert "rope" in epilogues(seen[0])


def hf_llama(hidden: int = 40):
    """transformers' LlamaForCausalLM, one layer, 2 q heads and 1 KV head of 16 over a hidden size
    that is no multiple of 16 (transformers wants a multiple of the heads: no odd one here)."""
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(vocab_size=96, hidden_size=hidden, intermediate_size=48, num_hidden_layers=1,
                                      num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, head_dim=rope_graphs.D,
                                      max_position_embeddings=64)  # fmt: skip
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config).eval()


@pytest.mark.slow  # ~10 s: seven kernels in the interpreter, each checked and then run
def test_transformers_llama_step_serves_rope_with_the_input_norm_in_its_prologue(tmp_path, monkeypatch):
    """One decode step of a whole LlamaForCausalLM (tables computed in the graph at each
    sequence's position): q and k rotated in their kernels, the input norm recomputed in their
    prologue (and v's), every projection served, the logits eager's."""
    model = hf_llama()
    ids, positions = torch.tensor([[3], [5]]), torch.tensor([[4], [9]])

    def step(i: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
        return model(input_ids=i, position_ids=p, use_cache=False).logits

    sites = decode_sites(step, (ids, positions), rope=True)
    assert [fused(s) for s in sites].count("rope") == 2
    assert all(s.spec.constants.get("prologue") == "rmsnorm" for s in sites if fused(s) == "rope")
    db = str(tmp_path / "k.db")
    store_kernel_decisions(db, [s.spec for s in sites])
    out, backend, seen = compiled(step, (ids, positions), db, monkeypatch)

    assert {s.status for s in backend.sites} == {"replaced"}, [(s.op, s.status, s.reason) for s in backend.sites]
    assert epilogues(seen[0]).count("rope") == 2 and rotations(seen[0]) == 0
    # the layer's two norms are in prologues; the final one stays, read through logits_to_keep's slice
    assert sum("rsqrt" in str(n.target) for n in seen[0].graph.nodes) == 1
    with torch.no_grad():
        torch.testing.assert_close(out, step(ids, positions), rtol=1e-4, atol=1e-4)

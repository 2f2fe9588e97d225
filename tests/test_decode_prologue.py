"""The compile backend folds the RMSNorm before decode projections into their prologue.

(kernelsmith.frontends.patterns.decode, "RMSNorm prologues".) The norm feeding q, k and v, and the
one feeding gate and up, become ``prologue="rmsnorm"`` on each projection's ``decode_matmul``
call, and the norm's nodes are erased from the rewritten graph; the cases the family cannot take
leave the norm as it was. CPU, interpreter mode (conftest), Inductor replaced by a recorder and
winners stored directly, as in test_decode_step (whose fixtures and helpers this reuses).
"""

from __future__ import annotations

import operator

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from kernelsmith.whole_model import decode
from test_backend import kernel_ops, record_inductor, spy_runners
from test_decode_step import decode_sites, hf_llama, store_winners  # noqa: F401 (hf_llama: a fixture)

HIDDEN, FFN = 32, 48


class LlamaNorm(nn.Module):
    """Hugging Face's LlamaRMSNorm, with an optional Gemma offset (``x * (1 + weight)``)."""

    def __init__(self, n: int, offset: bool = False) -> None:
        super().__init__()
        self.weight = nn.Parameter(1 + 0.1 * torch.randn(n))
        self.offset = offset

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.to(torch.float32)
        normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)
        if self.offset:
            return (normed * (1.0 + self.weight.float())).type_as(x)
        return self.weight * normed.to(x.dtype)


class Layer(nn.Module):
    """The projections of one decoder layer around its two norms (no attention: the norms and
    products are what is under test)."""

    def __init__(self, offset: bool = False) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.norm1, self.norm2 = LlamaNorm(HIDDEN, offset), LlamaNorm(HIDDEN, offset)
        self.q, self.k, self.v = (nn.Linear(HIDDEN, n, bias=False) for n in (HIDDEN, 16, 16))
        self.gate, self.up = (nn.Linear(HIDDEN, FFN, bias=False) for _ in range(2))
        self.down = nn.Linear(FFN, HIDDEN, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm1(x)
        q, k, v = self.q(h), self.k(h), self.v(h)
        x = x + q * (k.sum(-1, keepdim=True) + v.sum(-1, keepdim=True))  # stands in for attention and o
        h = self.norm2(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


def prologues(sites) -> list[tuple[str, str]]:
    """(epilogue, prologue) of each decode_matmul site, in graph order."""
    return [(s.spec.const("epilogue"), s.spec.constants.get("prologue", "none")) for s in sites
            if s.op == "decode_matmul"]  # fmt: skip


def test_the_norms_before_qkv_and_gate_up_become_prologues():
    layer = Layer()
    sites = decode_sites(layer, torch.randn(2, 1, HIDDEN))
    assert prologues(sites) == [
        ("none", "rmsnorm"), ("none", "rmsnorm"), ("none", "rmsnorm"),  # q, k, v: each recomputes norm1
        ("swiglu", "rmsnorm"),  # gate and up in one pass, norm2 in its prologue
        ("residual", "none"),  # down + the residual
    ]  # fmt: skip
    assert "rmsnorm" not in {s.op for s in sites}  # the norms are no sites of their own
    q, k = sites[0], sites[1]
    assert q.prologue and q.prologue == k.prologue and [n.name for n in q.region] == ["q"]
    assert [t.shape for t in q.spec.inputs] == [(2, 1, HIDDEN), (HIDDEN, HIDDEN), (HIDDEN,)]  # x, w, gamma
    assert q.spec.const("eps") == pytest.approx(1e-6)


def test_served_prologues_erase_the_norm_and_compute_eager_s_output(tmp_path, monkeypatch):
    db = str(tmp_path / "k.db")
    layer, x = Layer(), torch.randn(2, 1, HIDDEN)
    store_winners(db, decode_sites(layer, x))
    seen, calls = record_inductor(monkeypatch), spy_runners(monkeypatch)
    torch._dynamo.reset()
    backend = decode.kernelsmith_backend(db=db)
    with torch.no_grad():
        out = torch.compile(layer, backend=backend)(x)
        expected = layer(x)
    torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-4)
    assert {s.status for s in backend.sites} == {"replaced"}, [(s.op, s.status, s.reason) for s in backend.sites]
    assert kernel_ops(seen[0]) == ["decode_matmul"] * 5 and set(calls) <= {"gemv", "split_k", "persistent"} and calls
    assert not [n for n in seen[0].graph.nodes if "rsqrt" in str(n.target)]  # both norms erased


def test_a_norm_left_for_an_unserved_projection_stays_in_the_graph(tmp_path, monkeypatch):
    """Only q has a winner: k and v stay the original code and still read the norm."""
    db = str(tmp_path / "k.db")
    layer, x = Layer(), torch.randn(1, HIDDEN)
    store_winners(db, decode_sites(layer, x)[:1])
    seen = record_inductor(monkeypatch)
    torch._dynamo.reset()
    with torch.no_grad():
        out = torch.compile(layer, backend=decode.kernelsmith_backend(db=db))(x)
    torch.testing.assert_close(out, layer(x), rtol=1e-4, atol=1e-4)
    assert kernel_ops(seen[0]) == ["decode_matmul"]
    assert [n for n in seen[0].graph.nodes if "rsqrt" in str(n.target)]  # norm1 kept for k and v


def test_a_residual_add_before_the_norm_stays_and_only_the_norm_is_folded():
    """``h = a + b`` is the next residual: the projections read h, the add stays a graph node
    (no add_rmsnorm site takes it), and the norm is gone into the prologues."""
    norm, q, k = LlamaNorm(HIDDEN), nn.Linear(HIDDEN, 16, bias=False), nn.Linear(HIDDEN, 16, bias=False)

    def fn(a, b):
        h = a + b
        n = norm(h)
        return q(n), k(n), h

    sites = decode_sites(fn, torch.randn(1, HIDDEN), torch.randn(1, HIDDEN))
    assert [s.op for s in sites] == ["decode_matmul", "decode_matmul"]
    assert prologues(sites) == [("none", "rmsnorm")] * 2
    h = sites[0].inputs[0].node  # the projections' x is the sum, which stays in the graph
    assert h.target is operator.add and h not in sites[0].prologue
    assert all(s.residual_add is None and s.inputs[0].node is h for s in sites)


def test_a_norm_with_another_user_is_not_folded():
    norm, q = LlamaNorm(HIDDEN), nn.Linear(HIDDEN, 16, bias=False)

    def returned(x):  # the normed row is an output too
        n = norm(x)
        return q(n), n

    def product(x):  # a user that is no decode projection: x @ w, a layout decode_matmul does not take
        n = norm(x)
        return q(n), n @ q.weight.T.contiguous()

    for fn in (returned, product):
        sites = decode_sites(fn, torch.randn(1, HIDDEN))
        assert prologues(sites) == [("none", "none")], fn.__name__
        assert "rmsnorm" in {s.op for s in sites}, fn.__name__  # the norm is a site of its own


def test_prefill_rows_fold_nothing():
    norm, q = LlamaNorm(HIDDEN), nn.Linear(HIDDEN, 16, bias=False)
    sites = decode_sites(lambda x: q(norm(x)), torch.randn(65, HIDDEN))  # 65 rows: a prefill
    assert [s.op for s in sites] == ["rmsnorm"]


def test_a_norm_the_rmsnorm_pattern_refuses_is_not_folded():
    """``mean(-1)`` then ``unsqueeze`` (no keepdim) is refused by the rmsnorm pattern: nothing
    to recompute, so the product is served without a prologue and the norm's nodes stay."""
    weight, q = 1 + 0.1 * torch.randn(HIDDEN), nn.Linear(HIDDEN, 16, bias=False)

    def fn(x):
        return q(x * torch.rsqrt(x.pow(2).mean(-1).unsqueeze(-1) + 1e-6) * weight)

    sites = decode_sites(fn, torch.randn(1, HIDDEN))
    assert prologues(sites) == [("none", "none")] and [s.op for s in sites] == ["decode_matmul"]
    assert not sites[0].prologue


def test_gemma_s_offset_norm_is_not_folded():
    """The decode prologue has no weight offset: Gemma's norm stays an rmsnorm site (with its
    offset) and the projections are served without a prologue."""
    sites = decode_sites(Layer(offset=True), torch.randn(1, HIDDEN))
    assert prologues(sites) == [("none", "none")] * 3 + [("swiglu", "none"), ("residual", "none")]
    norms = [s for s in sites if s.op in ("rmsnorm", "add_rmsnorm")]  # norm2 takes the residual add before it
    assert len(norms) == 2 and all(s.constants.get("weight_offset") == 1.0 for s in norms)


@pytest.mark.slow  # ~50 s: generate() with every projection in the interpreter
def test_hf_generate_with_prologues_gives_eager_tokens(hf_llama, tmp_path, monkeypatch):  # noqa: F811
    """transformers' Llama: q, k, v and gate/up take their layer's norms in their prologues; the
    final norm feeds the LM head through logits_to_keep's slice and stays. Served, generate()
    gives eager's tokens, and the decode graph keeps only the final norm's rsqrt."""
    db = str(tmp_path / "k.db")
    seen = record_inductor(monkeypatch)
    probe = decode.kernelsmith_backend(db=db)
    ids, mask = decode.prompt_batch(128, 2, 6, torch.device("cpu"), ragged=True)
    torch._dynamo.reset()
    decode.hf_generate(hf_llama, ids, mask, 2, "kernelsmith", probe)
    assert prologues(probe.sites) == [("none", "rmsnorm")] * 3 + [  # q, k, v
        ("residual", "none"), ("swiglu", "rmsnorm"), ("residual", "none"), ("none", "none")  # o, gate+up, down, head
    ]  # fmt: skip
    assert [s.op for s in probe.sites].count("rmsnorm") == 1  # the final norm
    store_winners(db, [s for s in probe.sites if s.op == "decode_matmul"])
    seen.clear()
    backend = decode.kernelsmith_backend(db=db)
    report = decode.verify_decode(hf_llama, batch=2, prompt_len=6, new_tokens=4, ragged=True,
                                  variants=("eager", "kernelsmith"), backend=backend)  # fmt: skip
    assert report.ok and report.rows[1].same_tokens, report.to_dict()
    assert prologues([s for s in backend.sites if s.status == "replaced"]).count(("none", "rmsnorm")) == 3
    graph = next(g for g in seen if "decode_matmul" in kernel_ops(g))
    assert sum("rsqrt" in str(n.target) for n in graph.graph.nodes) == 1  # the final norm's only

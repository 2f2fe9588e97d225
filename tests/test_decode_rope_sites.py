"""RoPE in the epilogue of Llama's separate q and k projections: the sites the decode pattern finds.

(kernelsmith.frontends.patterns.decode, "RoPE epilogues".) A decode-shaped ``F.linear(x, Wq)``
viewed to ``(B, S, H, D)``, transposed to ``(B, H, S, D)`` and rotated as Hugging Face's
``apply_rotary_pos_emb`` spells it becomes one ``decode_matmul`` site with ``epilogue="rope"``
and ``rope=(H, 0)``, and k's projection the same with its KV heads; the spellings the kernels do
not compute (GPT-J's interleaved pairs, partial rotary, a table shared over the batch, a rotation
read half-way) are refused. Graphs are captured by Dynamo on CPU (a backend that keeps the graph);
the kernel runs in the interpreter (conftest) on one site, and its output, viewed as the rewrite
must view it, is the graph's rotated q.
"""

from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F
from torch import fx, nn

from kernelsmith.frontends import _backend_sites as ks_sites
from kernelsmith.frontends.patterns import decode
from kernelsmith.ops.decode_matmul import MAX_M, OP
from kernelsmith.testing.kernels import run_single_output
from kernelsmith.testing.models import tiny_llama

HIDDEN, HEADS, KV_HEADS, D = 64, 4, 2, 16


def capture(fn, *inputs, fullgraph: bool = True, **keywords) -> fx.GraphModule:
    """The one graph Dynamo makes of ``fn`` on ``inputs`` and ``keywords`` (example values in each
    node's meta); ``fullgraph=False`` for a model whose forward is not compiled with it (one graph
    all the same, or the assertion says so)."""
    graphs: list[fx.GraphModule] = []

    def keep(gm: fx.GraphModule, _example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    with torch.no_grad():
        torch.compile(fn, backend=keep, fullgraph=fullgraph)(*inputs, **keywords)
    assert len(graphs) == 1
    return graphs[0]


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


def rotate_every_two(x: torch.Tensor) -> torch.Tensor:  # GPT-J's interleaved pairs (2i, 2i + 1)
    x1, x2 = x[..., ::2], x[..., 1::2]
    return torch.stack((-x2, x1), dim=-1).flatten(-2)


class Attention(nn.Module):
    """The projections and rotation of Hugging Face's Llama attention, written out, then SDPA
    (GQA by repeating k and v); ``style`` picks the rotation's spelling."""

    def __init__(self, style: str = "half") -> None:
        super().__init__()
        torch.manual_seed(0)
        self.q_proj = nn.Linear(HIDDEN, HEADS * D, bias=False)
        self.k_proj = nn.Linear(HIDDEN, KV_HEADS * D, bias=False)
        self.v_proj = nn.Linear(HIDDEN, KV_HEADS * D, bias=False)
        self.style = style

    def rotate(self, t: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        if self.style == "interleaved":
            return t * cos + rotate_every_two(t) * sin
        if self.style == "partial":  # rotary_dim = D / 2, the rest passes (NeoX, Phi)
            rot, rest = t[..., : D // 2], t[..., D // 2 :]
            return torch.cat((rot * cos[..., : D // 2] + rotate_half(rot) * sin[..., : D // 2], rest), dim=-1)
        return t * cos + rotate_half(t) * sin

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q = self.q_proj(x).view(b, s, -1, D).transpose(1, 2)
        k = self.k_proj(x).view(b, s, -1, D).transpose(1, 2)
        v = self.v_proj(x).view(b, s, -1, D).transpose(1, 2)
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        q, k = self.rotate(q, cos, sin), self.rotate(k, cos, sin)
        k, v = k.repeat_interleave(HEADS // KV_HEADS, 1), v.repeat_interleave(HEADS // KV_HEADS, 1)
        return F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, s, HEADS * D)


def tables(batch: int, seq: int = 1, shared: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Hugging Face's LlamaRotaryEmbedding's cos and sin (B, S, D) at positions 7, 8, ... (one
    sequence's row for all when ``shared``)."""
    positions = torch.arange(7, 7 + seq, dtype=torch.float32).expand(1 if shared else batch, seq)
    inv_freq = 10000.0 ** (-torch.arange(0, D, 2, dtype=torch.float32) / D)
    freqs = positions[..., None] * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def found(gm: fx.GraphModule) -> tuple[list[decode.RopeSite], list[str]]:
    sites, reasons = [], []
    for item in decode.rope_sites(gm, set()):
        if isinstance(item, decode.RopeSite):
            sites.append(item)
        else:
            reasons.append(item[1])
    return sites, reasons


def weight_of(site: decode.RopeSite) -> str:
    return str(site.site.inputs[1].node.name)


@pytest.mark.parametrize(("batch", "dtype"), [(1, torch.float32), (3, torch.float32), (2, torch.bfloat16)])
def test_q_and_k_become_rope_sites_of_their_heads(batch: int, dtype: torch.dtype) -> None:
    attn = Attention().to(dtype)
    x = torch.randn(batch, 1, HIDDEN, dtype=dtype)
    gm = capture(attn, x, *(t.to(dtype) for t in tables(batch)))
    sites, reasons = found(gm)
    assert [(s.site.spec.constants["rope"], s.output_view) for s in sites] == [
        ([HEADS, 0], (batch, 1, HEADS, D)), ([KV_HEADS, 0], (batch, 1, KV_HEADS, D))]  # fmt: skip
    assert ["q_proj" in weight_of(s) for s in sites] == [True, False]
    assert len(reasons) == 1  # v: viewed and transposed, but read by repeat_interleave, no rotation
    q = sites[0].site
    assert [t.shape for t in q.spec.inputs] == [(batch, 1, HIDDEN), (HEADS * D, HIDDEN), (batch, 1, D), (batch, 1, D)]
    assert [i.reshape for i in q.inputs] == [None, None, (batch, 1, D), (batch, 1, D)]
    assert q.output is q.region[-1] and len(q.region) == 10  # linear, view, transpose and 7 rotation nodes


def test_the_kernel_computes_the_graph_s_rotated_q() -> None:
    """On the module's own weights and tables: the site's kernel (gemv, in the interpreter), viewed
    as the rewrite must view it, is eager's rotated q; and the family's reference says the same."""
    attn, batch = Attention(), 3
    x, (cos, sin) = torch.randn(batch, 1, HIDDEN), tables(batch)
    gm = capture(attn, x, cos, sin)
    rope = found(gm)[0][0]
    spec = rope.site.spec
    inputs = (x, attn.q_proj.weight.detach(), cos, sin)
    config = min(OP.variants[0].space(spec).configs(), key=lambda c: c["BLOCK_K"] * c["BLOCK_N"])
    y = run_single_output(OP, spec, "gemv", config, inputs)
    with torch.no_grad():
        q = attn.q_proj(x).view(batch, 1, HEADS, D).transpose(1, 2)
        want = q * cos.unsqueeze(1) + rotate_half(q) * sin.unsqueeze(1)
    b, s, h, d = rope.output_view
    torch.testing.assert_close(y.view(b, s, h, d).transpose(1, 2), want, rtol=1e-5, atol=1e-5)
    (ref,) = OP.reference(spec, inputs)
    torch.testing.assert_close(ref.view(b, s, h, d).transpose(1, 2), want, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(want, q, atol=1e-3)  # positions 7..: the rotation moves every pair


@pytest.mark.parametrize(
    ("style", "shared", "match"),
    [("interleaved", False, "do not compute RoPE's rotate_half"),
     ("partial", False, "position table .* is not one \\(B, S, D\\) row"),
     ("half", True, "position table .* is not one \\(B, S, D\\) row")],
    ids=["gpt-j-interleaved", "partial-rotary", "table-shared-over-the-batch"],
)  # fmt: skip
def test_spellings_the_kernels_do_not_compute_are_refused(style: str, shared: bool, match: str) -> None:
    batch = 2
    gm = capture(Attention(style), torch.randn(batch, 1, HIDDEN), *tables(batch, shared=shared))
    sites, reasons = found(gm)
    assert sites == []
    assert len(reasons) == 3 and [bool(re.search(match, r)) for r in reasons] == [True, True, False], reasons


def test_a_rotation_read_half_way_is_refused() -> None:
    """A value of the rotation read outside it (here q * cos, returned too) would have to stay."""

    def fn(x: torch.Tensor, w: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        q = F.linear(x, w).view(2, 1, HEADS, D).transpose(1, 2)
        scaled = q * cos.unsqueeze(1)
        return scaled + rotate_half(q) * sin.unsqueeze(1), scaled

    gm = capture(fn, torch.randn(2, 1, HIDDEN), torch.randn(HEADS * D, HIDDEN), *tables(2))
    sites, reasons = found(gm)
    assert sites == [] and len(reasons) == 1 and "read outside" in reasons[0], reasons


def test_prefill_rows_are_no_decode_site() -> None:
    seq = 80  # more rows than MAX_M
    gm = capture(Attention(), torch.randn(1, seq, HIDDEN), *tables(1, seq))
    assert seq > MAX_M and found(gm) == ([], [])


@pytest.mark.parametrize("batch", [1, 2])
def test_transformers_llama_attention_q_and_k_are_rope_sites(batch: int) -> None:
    """transformers' own LlamaAttention and LlamaRotaryEmbedding, one decode step captured on CPU."""
    transformers = pytest.importorskip("transformers")
    llama = pytest.importorskip("transformers.models.llama.modeling_llama")
    config = transformers.LlamaConfig(hidden_size=HIDDEN, num_attention_heads=HEADS, num_key_value_heads=KV_HEADS,
                                      intermediate_size=128, max_position_embeddings=64)  # fmt: skip
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    attn, rotary = llama.LlamaAttention(config, layer_idx=0).eval(), llama.LlamaRotaryEmbedding(config)
    x = torch.randn(batch, 1, HIDDEN)
    position_ids = torch.tensor([[5 + i] for i in range(batch)])
    cos, sin = rotary(x, position_ids)

    def step(h: torch.Tensor, c: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        return attn(h, position_embeddings=(c, s), attention_mask=None)[0]

    gm = capture(step, x, cos, sin)
    sites, _ = found(gm)
    assert [s.site.spec.constants["rope"] for s in sites] == [[HEADS, 0], [KV_HEADS, 0]]
    assert [s.output_view for s in sites] == [(batch, 1, HEADS, D), (batch, 1, KV_HEADS, D)]
    # the site's kernel inputs are the graph's x, the projection weight and HF's (B, S, D) tables
    q = sites[0].site
    assert q.spec.inputs[2].shape == (batch, 1, D) and q.inputs[2].reshape == (batch, 1, D)


def llama_step_graph() -> fx.GraphModule:
    """The graph of a whole transformers LlamaForCausalLM forward of one token per sequence (two
    layers; the tables computed in the graph by its LlamaRotaryEmbedding)."""
    model = tiny_llama(hidden_size=HIDDEN, num_attention_heads=HEADS, num_key_value_heads=KV_HEADS)
    return capture(model, fullgraph=False, input_ids=torch.tensor([[3], [5]]), position_ids=torch.tensor([[4], [6]]),
                   use_cache=False)  # fmt: skip


def test_transformers_llama_for_causal_lm_step_has_a_rope_site_per_q_and_k() -> None:
    """q and k of every layer, nothing else."""
    sites, _ = found(llama_step_graph())
    assert [(s.site.spec.constants["rope"], weight_of(s).split("layers_modules_")[1][:1]) for s in sites] == [
        ([HEADS, 0], "0"), ([KV_HEADS, 0], "0"), ([HEADS, 0], "1"), ([KV_HEADS, 0], "1")]  # fmt: skip
    assert all("q_proj" in weight_of(s) for s in sites[::2]) and all("k_proj" in weight_of(s) for s in sites[1::2])


def test_the_input_norm_folds_into_a_rope_site_s_prologue() -> None:
    """Llama's input_layernorm before q_proj: with_prologue makes the RoPE site prologue="rmsnorm"
    (gamma before cos and sin, as the family orders them), checked with the heads transposed back;
    without that view the same check refuses it (the check compares, it does not wave through)."""
    from kernelsmith.frontends._backend_sites import _CHARACTERISTIC, _levels, _recognize_region, _target_name

    gm = llama_step_graph()
    nodes = list(gm.graph.nodes)
    order = {n: i for i, n in enumerate(nodes)}
    generators: dict[torch.device, torch.Generator] = {}
    q = found(gm)[0][0]
    x = q.site.inputs[0].node
    assert x in set(decode.prologue_norms(gm, set()))
    norm = None
    for region in reversed(_levels(x, set())):  # as the backend's decode_sites looks for it
        if not any(_target_name(n) in _CHARACTERISTIC for n in region):
            break
        norm = _recognize_region(gm, x, region, nodes, order, {"rmsnorm"}, generators)
        if norm is not None:
            break
    assert norm is not None
    fused = decode.with_prologue(gm, q.site, norm, nodes, order, generators, q.output_view)
    assert isinstance(fused, ks_sites.Site), fused
    assert fused.spec.constants["prologue"] == "rmsnorm" and fused.spec.constants["rope"] == [HEADS, 0]
    assert [t.shape for t in fused.spec.inputs] == [(2, 1, HIDDEN), (HEADS * D, HIDDEN), (HIDDEN,), (2, 1, D),
                                                    (2, 1, D)]  # fmt: skip
    assert fused.prologue == list(norm.region)
    unviewed = decode.with_prologue(gm, q.site, norm, nodes, order, generators)
    assert isinstance(unviewed, str) and "do not compute" in unviewed

"""decode_attention served inside CUDA graphs: every layout's launcher captured and replayed at new
lengths, masks and values; the compile backend's decode attention site (lengths derived on the
device from a position tensor) captured by ``kernelsmith.cuda_graph`` and replayed at new
positions; and Hugging Face ``generate()`` with a static cache and a padded batch under
``mode="reduce-overhead"``, its prepared mask read by the masked layout, giving eager's tokens.

GPU only. Winners are stored directly (kernelsmith.testing.decisions): these check serving inside
capture, not tuning.
"""

from __future__ import annotations

import pytest
import torch

from kernelsmith import dispatch
from kernelsmith.frontends import backend as ks_backend
from kernelsmith.ops import get_op
from kernelsmith.testing.decisions import store_kernel_decisions
from kernelsmith.testing.graph_replays import assert_write_kv_replays_at_new_positions
from kernelsmith.whole_model import decode
from test_decode_attention_sites import StaticDecoder, decoder_inputs

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("cache", ["static", "dynamic", "masked"])
def test_every_decode_attention_variant_launches_inside_a_capture(cache):
    family = get_op("decode_attention")
    spec = family.spec((3, 32, 300, 80), "bf16", kv_heads=8, cache=cache)
    for variant in family.variants:
        config = variant.space(family.bucket(spec)).configs()[0]
        runner = dispatch.KernelRunner.build(family, spec, variant.build(spec, config), variant.name, config)
        inputs = family.make_inputs(spec, 0, "uneven" if cache != "dynamic" else "full", "cuda")
        runner(inputs)  # the first call compiles and records what direct launches need
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            (out,) = runner(inputs)
        for seed in (1, 2):  # new lengths, masks and values in the same buffers: the replay follows them
            fresh = family.make_inputs(spec, seed, "uneven" if cache != "dynamic" else "full", "cuda")
            for buffer, new in zip(inputs, fresh, strict=True):
                buffer.copy_(new)
            graph.replay()
            (expected,) = family.reference(spec, inputs)
            torch.testing.assert_close(out, expected, rtol=2e-2, atol=2e-2, msg=f"{variant.name} {config}")


@pytest.mark.parametrize("mask", ["causal", "padding"])
def test_a_captured_decode_attention_site_replays_at_new_positions(tmp_path, mask):
    """The position is a device tensor: the lengths (or the mask) follow it in every replay."""
    batch, heads, kv_heads, head_dim, cache_len = 2, 32, 8, 64, 256
    with torch.device("cuda"):
        served = StaticDecoder(batch, heads, kv_heads, head_dim, cache_len, mask=mask).to(torch.bfloat16)
        eager = StaticDecoder(batch, heads, kv_heads, head_dim, cache_len, mask=mask).to(torch.bfloat16)
        valid = torch.ones(batch, cache_len, dtype=torch.bool)
    valid[1, :10] = False

    def inputs_at(offset):
        q, k, v, position = decoder_inputs(batch, heads, kv_heads, head_dim, 1, offset)
        return (q.cuda().bfloat16(), k.cuda().bfloat16(), v.cuda().bfloat16(), position.cuda(), valid)

    torch._dynamo.reset()
    probe = ks_backend.KernelsmithBackend(discover=True, families=("decode_attention",))
    with torch.no_grad():
        torch.compile(served, backend=probe, fullgraph=True)(*inputs_at(20))
    assert [s.spec.const("cache") for s in probe.sites] == ["static" if mask == "causal" else "masked"]
    db = str(tmp_path / "k.db")
    store_kernel_decisions(db, [s.spec for s in probe.sites], mode="gpu")
    torch._dynamo.reset()
    backend = ks_backend.KernelsmithBackend(db=db, families=("decode_attention",), compare=False)
    with torch.no_grad():
        for offset in range(20):  # the same prefix in both caches
            eager(*inputs_at(offset))
            served(*inputs_at(offset))
        step = decode.cuda_graph(torch.compile(served, backend=backend, fullgraph=True), inputs_at(20))
        eager(*inputs_at(20))
        assert {s.status for s in backend.sites} == {"replaced"}
        for offset in (21, 100, cache_len - 1):
            got = step(*inputs_at(offset)).clone()
            expected = eager(*inputs_at(offset))
            torch.testing.assert_close(got.float(), expected.float(), rtol=2e-2, atol=2e-2)


def test_hf_generate_reduce_overhead_with_decode_attention_gives_eager_tokens(tmp_path):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=1000, hidden_size=256, intermediate_size=704, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256,
    )  # fmt: skip
    with torch.device("cuda"):
        model = transformers.LlamaForCausalLM(config).to(torch.bfloat16).eval()
    db = str(tmp_path / "k.db")
    probe = decode.kernelsmith_backend(db=db)
    ids, mask = decode.prompt_batch(1000, 2, 12, torch.device("cuda"), ragged=True)
    torch._dynamo.reset()
    # as many new tokens as the verification's run: a static cache of the same length (12 + 16), so the
    # same decode attention workload (a 2-token probe's 14-long cache is another bucket: not tuned)
    decode.hf_generate(model, ids, mask, 16, "kernelsmith", probe)
    attention = [s for s in probe.sites if s.op == "decode_attention"]
    assert attention and {s.spec.const("cache") for s in attention} == {"masked"}  # generate()'s prepared mask
    store_kernel_decisions(db, [s.spec for s in probe.sites], mode="gpu")
    backend = decode.kernelsmith_backend(db=db, compare=False)
    report = decode.verify_decode(model, batch=2, prompt_len=12, new_tokens=16, ragged=True,
                                  variants=("eager", "kernelsmith"), backend=backend)  # fmt: skip
    assert report.ok, report.to_dict()
    assert {s.status for s in backend.sites if s.op == "decode_attention"} == {"replaced"}


@pytest.mark.parametrize("q_len", [2, 4])
def test_several_new_tokens_write_kv_replays_inside_a_capture_at_new_positions(q_len):
    """write_kv with Sq > 1 (a speculative verify step): the compiled kernels store the Sq rows at
    consecutive positions from the device-side cache_position and attend causally, inside a CUDA
    graph replayed at new positions, rows and caches; output vs SDPA and caches bit for bit."""
    family = get_op("decode_attention")
    spec = family.spec((3, 32, 300, 64), "bf16", kv_heads=8, q_len=q_len, write_kv=True)
    for variant in family.variants:
        assert_write_kv_replays_at_new_positions(family, spec, variant, variant.space(family.bucket(spec)).configs()[0])


def test_a_captured_plain_decoder_with_folded_cache_writes_gives_eager_outputs(tmp_path, monkeypatch):
    """The default since issue 13's fold: the plain StaticDecoder (writes at the mask's positions)
    with its index_copy_ writes folded, replayed as a graph, matches eager step by step, caches
    included. (Hugging Face's StaticCache folds its first layer only, whose write index the graph
    proves the mask's positions: tests/test_decode_hf_static_cache_writes.py.)"""
    from kernelsmith.frontends.patterns import decode_attention as pattern

    monkeypatch.setattr(pattern, "FOLD_CACHE_WRITES", True)
    batch, heads, kv_heads, head_dim, cache_len = 1, 32, 8, 64, 256
    eager = StaticDecoder(batch, heads, kv_heads, head_dim, cache_len).cuda()
    served = StaticDecoder(batch, heads, kv_heads, head_dim, cache_len).cuda()
    probe = ks_backend.KernelsmithBackend(discover=True, families=("decode_attention",))
    first = [t.cuda() for t in decoder_inputs(batch, heads, kv_heads, head_dim, 1, 0)]
    with torch.no_grad():
        torch.compile(served, backend=probe)(*first)
        eager(*first)
    assert [s.spec.constants.get("write_kv") for s in probe.sites] == [True]
    db = str(tmp_path / "k.db")
    store_kernel_decisions(db, [s.spec for s in probe.sites])
    torch._dynamo.reset()
    compiled = torch.compile(served, backend=ks_backend.KernelsmithBackend(db=db, families=("decode_attention",)),
                             mode="reduce-overhead")  # fmt: skip
    with torch.no_grad():
        for offset in range(1, 40):
            inputs = [t.cuda() for t in decoder_inputs(batch, heads, kv_heads, head_dim, 1, offset)]
            torch.testing.assert_close(compiled(*inputs), eager(*inputs), rtol=2e-2, atol=2e-2)
            assert torch.equal(served.k_cache, eager.k_cache) and torch.equal(served.v_cache, eager.v_cache)

"""A decode step with kernelsmith kernels captured as a CUDA graph: replay equals eager.

GPU only. Winners are stored directly (kernelsmith.testing.decisions), so these tests check
serving inside capture, not tuning: every decode_matmul variant's launcher launching directly
inside a stream capture (split-K's counters and scratch included), the compile backend's graph
with decode_matmul sites captured by ``kernelsmith.cuda_graph`` and replayed at new inputs, the
in-context timer replaying graphs, and Hugging Face ``generate()`` with a static cache under
``mode="reduce-overhead"`` producing eager's greedy tokens on a padded batch.
"""

from __future__ import annotations

import pytest
import torch

from kernelsmith import dispatch
from kernelsmith.frontends import backend as ks_backend
from kernelsmith.models import get_model
from kernelsmith.ops import get_op
from kernelsmith.testing.decisions import store_kernel_decisions
from kernelsmith.whole_model import decode

pytestmark = pytest.mark.gpu
SIZES = {"hidden": 256, "intermediate": 704, "n_heads": 4, "n_kv_heads": 2, "vocab_size": 1000}


@pytest.mark.parametrize(("epilogue", "prologue"), [
    ("none", "none"), ("residual", "none"), ("swiglu", "none"),
    ("none", "rmsnorm"), ("swiglu", "rmsnorm"),  # the backend's RMSNorm prologues: q, k, v; gate/up
])  # fmt: skip
def test_every_decode_matmul_variant_launches_inside_a_capture(epilogue, prologue):
    family = get_op("decode_matmul")
    spec = family.spec((2, 768, 512), "bf16", epilogue=epilogue, prologue=prologue)
    bucket = family.bucket(spec)
    for variant in family.variants:
        configs = variant.space(bucket).configs()
        if not configs:
            continue
        runner = dispatch.KernelRunner.build(family, spec, variant.build(spec, configs[0]), variant.name, configs[0])
        inputs = family.make_inputs(spec, 0, "normal", "cuda")
        runner(inputs)  # the first call compiles and records what direct launches need
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            (out,) = runner(inputs)
        for seed in (1, 2):  # new values in the same buffers: the replay computes them
            for buffer, fresh in zip(inputs, family.make_inputs(spec, seed, "normal", "cuda"), strict=True):
                buffer.copy_(fresh)
            graph.replay()
            (expected,) = family.reference(spec, inputs)
            torch.testing.assert_close(out, expected, rtol=2e-2, atol=2e-2, msg=f"{variant.name} {configs[0]}")


def _decoder(batch: int, cache: int) -> decode.KVCacheLlama:
    torch.manual_seed(0)
    model = get_model("llama-160m", device="cuda", dtype=torch.bfloat16, n_layers=2, **SIZES).eval()
    return decode.KVCacheLlama(model, batch, cache)


def _sites(decoder: decode.KVCacheLlama, inputs) -> list[ks_backend.Site]:
    torch._dynamo.reset()
    probe = ks_backend.KernelsmithBackend(discover=True, decode=True)
    with torch.no_grad():
        torch.compile(decoder, backend=probe, fullgraph=True)(*inputs)
    return [s for s in probe.sites if s.op == "decode_matmul"]


def test_a_captured_kernelsmith_step_replays_what_eager_computes(tmp_path):
    batch, cache = 2, 64
    decoder = _decoder(batch, cache)
    valid = torch.ones(batch, cache, dtype=torch.bool, device="cuda")
    inputs = (torch.tensor([[7], [9]], device="cuda"), torch.tensor([40], device="cuda"), valid)
    db = str(tmp_path / "k.db")
    sites = _sites(decoder, inputs)
    # q, k, v, gate/up and the LM head recompute their norm in the prologue (2 layers: 2 x 4 + 1)
    assert [s.spec.constants.get("prologue") for s in sites].count("rmsnorm") == 9
    store_kernel_decisions(db, [s.spec for s in sites], mode="gpu")
    torch._dynamo.reset()
    backend = decode.kernelsmith_backend(db=db, compare=False)
    with torch.no_grad():
        step = decode.cuda_graph(torch.compile(decoder, backend=backend, fullgraph=True), inputs)
        assert {s.status for s in backend.sites if s.op == "decode_matmul"} == {"replaced"}
        for ids, position in (([[3], [5]], 41), ([[11], [2]], 42)):
            fresh = (torch.tensor(ids, device="cuda"), torch.tensor([position], device="cuda"), valid)
            got = step(*fresh).clone()
            expected = decoder(*fresh)  # rewrites the same cache position with eager's k and v
            torch.testing.assert_close(got.float(), expected.float(), rtol=5e-2, atol=5e-2)


def test_in_context_choices_time_graph_replays():
    x = torch.randn(1, 4096, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    times = decode.time_replayed([lambda x, w: x @ w.T, lambda x, w: (x @ w.T) + 1], [x, w], rounds=3, replays=2)
    assert len(times) == 2 and all(0.0 < t < 100.0 for t in times)
    with decode.graph_capture_planned():
        assert ks_backend.backend(decode=True)._timer() is decode.time_replayed


@pytest.mark.parametrize("variant", [None, "split_k", "persistent"])
def test_hf_generate_reduce_overhead_with_decode_kernels_gives_eager_tokens(tmp_path, variant):
    """Under torch.compile's CUDA graphs (reduce-overhead), every decode projection served. The split-K
    variants with the last program reducing (arrival counters: scratch a launcher must make per
    call, since the graphs' first call runs in their memory pool) as well as the first variant."""
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
    decode.hf_generate(model, ids, mask, 2, "kernelsmith", probe)
    last_program = None if variant is None else (lambda c: c["REDUCE"] == "last_program" and c["SPLIT_K"] > 1)
    store_kernel_decisions(db, [s.spec for s in probe.sites if s.op == "decode_matmul"], mode="gpu", variant=variant,
                           where=last_program)  # fmt: skip
    backend = decode.kernelsmith_backend(db=db, compare=False)
    report = decode.verify_decode(model, batch=2, prompt_len=12, new_tokens=16, ragged=True,
                                  variants=("eager", "kernelsmith"), backend=backend)  # fmt: skip
    assert report.ok, report.to_dict()
    assert {s.status for s in backend.sites if s.op == "decode_matmul"} == {"replaced"}
    # q, k, v and gate/up of both layers took their norm in the prologue (the final norm stays)
    assert [s.spec.constants.get("prologue") for s in backend.sites].count("rmsnorm") == 8
    assert report.rows[1].tokens_per_s and report.copy_gbps

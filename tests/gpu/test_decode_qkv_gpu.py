"""The fused QKV projection from three weights (``decode_matmul``, ``weights="qkv"``) on the GPU.

GPU only (tests/interpreter/test_decode_matmul_qkv.py and tests/test_decode_qkv_sites.py are the
CPU side). Every variant launches inside a CUDA-graph capture and its replays compute the reference
at new inputs; the decode step of a two-layer Llama at batch 1, whose backend makes one QKV site per
layer, replays under ``kernelsmith.cuda_graph`` what eager computes and gives eager's greedy tokens.
Winners are stored directly (kernelsmith.testing.decisions), as in test_decode_step_gpu.
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


@pytest.mark.parametrize("rows", [1, 3, 17])
@pytest.mark.parametrize("prologue", ["none", "rmsnorm"])
def test_every_qkv_variant_launches_inside_a_capture(rows: int, prologue: str) -> None:
    family = get_op("decode_matmul")
    # Llama-3.2-1B's q, k and v
    spec = family.spec((rows, (32 + 2 * 8) * 64, 2048), "bf16", epilogue="rope", rope=(32, 8), prologue=prologue,
                       weights="qkv")  # fmt: skip
    for variant in family.variants:
        configs = variant.space(family.bucket(spec)).configs()
        if not configs:
            continue
        for config in (configs[0], configs[-1]):
            runner = dispatch.KernelRunner.build(family, spec, variant.build(spec, config), variant.name, config)
            inputs = family.make_inputs(spec, 0, "normal", "cuda")
            runner(inputs)  # the first call compiles and records what direct launches need
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                (out,) = runner(inputs)
            for seed in (1, 2):
                for buffer, fresh in zip(inputs, family.make_inputs(spec, seed, "normal", "cuda"), strict=True):
                    buffer.copy_(fresh)
                graph.replay()
                (expected,) = family.reference(spec, inputs)
                torch.testing.assert_close(out, expected, rtol=2e-2, atol=2e-2, msg=f"{variant.name} {config}")


def _decoder(cache: int) -> decode.KVCacheLlama:
    torch.manual_seed(0)
    model = get_model("llama-160m", device="cuda", dtype=torch.bfloat16, n_layers=2, **SIZES).eval()
    return decode.KVCacheLlama(model, 1, cache)


def test_a_captured_step_with_qkv_sites_replays_eager_s_step_and_tokens(tmp_path) -> None:
    cache = 64
    decoder = _decoder(cache)
    valid = torch.ones(1, cache, dtype=torch.bool, device="cuda")
    inputs = (torch.tensor([[7]], device="cuda"), torch.tensor([40], device="cuda"), valid)
    torch._dynamo.reset()
    probe = ks_backend.KernelsmithBackend(discover=True, decode=True)
    with torch.no_grad():
        torch.compile(decoder, backend=probe, fullgraph=True)(*inputs)
    sites = [s for s in probe.sites if s.op == "decode_matmul"]
    assert [s.spec.constants.get("weights") for s in sites].count("qkv") == 2  # one a layer
    db = str(tmp_path / "k.db")
    store_kernel_decisions(db, [s.spec for s in sites], mode="gpu")
    torch._dynamo.reset()
    backend = decode.kernelsmith_backend(db=db, compare=False)
    with torch.no_grad():
        step = decode.cuda_graph(torch.compile(decoder, backend=backend, fullgraph=True), inputs)
        served = [s for s in backend.sites if s.op == "decode_matmul"]
        assert {s.status for s in served} == {"replaced"}
        assert [s.spec.constants.get("weights") for s in served].count("qkv") == 2
        for ids, position in (([[3]], 41), ([[11]], 42)):
            fresh = (torch.tensor(ids, device="cuda"), torch.tensor([position], device="cuda"), valid)
            got = step(*fresh).clone()
            expected = decoder(*fresh)  # rewrites the same cache position with eager's k and v
            torch.testing.assert_close(got.float(), expected.float(), rtol=5e-2, atol=5e-2)
            assert torch.equal(got[..., -1, :].argmax(-1), expected[..., -1, :].argmax(-1))  # the greedy token
    torch._dynamo.reset()
    report = decode.verify_decode(decoder.model, batch=1, prompt_len=12, new_tokens=16, ragged=False,
                                  variants=("eager", "kernelsmith"),
                                  backend=decode.kernelsmith_backend(db=db, compare=False))  # fmt: skip
    assert report.ok, report.to_dict()
    assert report.rows[1].same_tokens

"""The decode kernels on a real GPU: decode_matmul (with its RMSNorm prologue and RoPE epilogue) and
decode_attention compiled for the device and validated by the harness at Llama decode shapes, the
K loop's software pipelining (the reason for the tl.range loop, see decode_matmul's docstring),
out-of-range cache lengths, and capture in a CUDA graph. Correctness only: speed is
benchmarks/decode.py's, never a timed test.
"""

from __future__ import annotations

import math

import pytest
import torch

from kernelsmith.evaluate.errors import check_close
from kernelsmith.evaluate.validate import validate
from kernelsmith.ops._base import OpFamily
from kernelsmith.ops._decode_matmul_kernels import _decode_gemv_kernel
from kernelsmith.ops.decode_attention import OP as ATTENTION
from kernelsmith.ops.decode_matmul import OP as MATMUL
from kernelsmith.space import Config
from kernelsmith.spec import OpSpec

pytestmark = pytest.mark.gpu

# Llama-3.2-1B's fused forms at batch 1 and 8: the QKV projection after the input RMSNorm with RoPE,
# gate/up after the post-attention RMSNorm with SwiGLU, down with the residual; plus odd sizes.
MATMUL_SPECS = [
    ((1, 3072, 2048), {"epilogue": "rope", "rope": (32, 8), "prologue": "rmsnorm"}),
    ((8, 3072, 2048), {"epilogue": "rope", "rope": (32, 8), "prologue": "rmsnorm"}),
    ((1, 8192, 2048), {"epilogue": "swiglu", "prologue": "rmsnorm"}),
    ((1, 2048, 8192), {"epilogue": "residual"}),
    ((3, 1000, 129), {}),
]
ATTENTION_SPECS = [
    ((1, 32, 1024, 64), {"kv_heads": 8}),
    ((8, 32, 1000, 128), {"kv_heads": 8}),
    ((2, 8, 33, 64), {"kv_heads": 1, "q_len": 3}),
    ((3, 16, 300, 128), {"kv_heads": 16, "cache": "dynamic"}),
]


def spread(configs: tuple[Config, ...], count: int = 4) -> list[Config]:
    """``count`` configs from across a space (its order runs through the parameters)."""
    step = max(1, len(configs) // count)
    return list(dict.fromkeys(configs[::step][:count] + configs[-1:]))


@pytest.mark.parametrize(("shape", "constants"), MATMUL_SPECS, ids=lambda v: str(v))
def test_decode_matmul_variants_pass_validation(shape: tuple[int, ...], constants: dict[str, object]) -> None:
    spec = MATMUL.spec(shape, "bfloat16", **constants)
    for variant in MATMUL.variants:
        configs = variant.space(spec).configs()
        assert configs, (variant.name, spec.describe())
        # CUDA cores with and without folded partial sums, pipelined or not, and the tensor cores
        picked = spread(configs) + [c for c in configs if c["FOLD"] > 1 and c["num_stages"] > 1][:1]
        for config in picked:
            assert validate(MATMUL, spec, variant.build, config, "cuda", torch.cuda.synchronize) > 0, config.key


@pytest.mark.parametrize(("shape", "constants"), ATTENTION_SPECS, ids=lambda v: str(v))
def test_decode_attention_variants_pass_validation(shape: tuple[int, ...], constants: dict[str, object]) -> None:
    spec = ATTENTION.spec(shape, "bfloat16", **constants)
    for variant in ATTENTION.variants:
        for config in spread(variant.space(spec).configs()):
            assert validate(ATTENTION, spec, variant.build, config, "cuda", torch.cuda.synchronize) > 0, config.key


def test_the_cuda_core_loop_is_software_pipelined() -> None:
    """num_stages > 1 on the CUDA-core GEMV loop issues asynchronous copies (cp.async) ahead of
    their use; one stage does not. This is what the tl.range loop is for."""
    m, n, k = 1, 256, 4096
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    y = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    flags = {"HAS_BIAS": False, "EPILOGUE": 0, "BLOCK_M": 1, "BLOCK_N": 8, "BLOCK_K": 512, "EVEN_N": True,
             "EVEN_K": True, "DOT": False, "IEEE": False, "UPCAST": False, "FOLD": 8, "RMS": False, "ROPE_DIM": 0,
             "K_START": 0, "V_START": 0}
    ptx = {}
    for stages in (1, 3):
        compiled = _decode_gemv_kernel[(n // 8,)](x, w, w, w, w, x, x, x, x, x, y, m, n, k, 0.0, 0, **flags,
                                                 STAGES=stages, num_warps=4, num_stages=stages)  # fmt: skip
        ptx[stages] = compiled.asm["ptx"]
    assert "cp.async" in ptx[3] and "cp.async" not in ptx[1]
    torch.testing.assert_close(y.float(), (x.float() @ w.float().T), rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("variant", ("single_pass", "split_kv"))
def test_lengths_out_of_range_give_nan_rows_on_the_gpu(variant: str) -> None:
    spec = ATTENTION.spec((3, 32, 256, 64), "bfloat16", kv_heads=8)
    q, k, v, _ = ATTENTION.make_inputs(spec, seed=2, device="cuda")
    lengths = torch.tensor([257, 100, 0], dtype=torch.int64, device="cuda")
    space = ATTENTION.variant(variant).space(spec).configs()
    y = torch.full_like(q, math.nan)
    ATTENTION.variant(variant).build(spec, space[len(space) // 2])((q, k, v, lengths), (y,))
    assert bool(torch.isnan(y[0]).all()) and bool(torch.isnan(y[2]).all()) and bool(torch.isfinite(y[1]).all())


def _captured_matches_eager(op: OpFamily, spec: OpSpec, variant: str, config: Config) -> None:
    """Warm up (compiles, makes split-K's counters), capture one call in a CUDA graph, refill the
    inputs in place, replay: the replay equals an eager call on the new inputs."""
    launcher = op.variant(variant).build(spec, config)
    inputs = op.make_inputs(spec, seed=1, device="cuda")
    (out,) = op.output_specs(spec)
    y = torch.empty(out.shape, dtype=out.torch_dtype, device="cuda")
    launcher(inputs, (y,))
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        launcher(inputs, (y,))
    fresh = op.make_inputs(spec, seed=2, device="cuda")
    for t, new in zip(inputs, fresh, strict=True):
        t.copy_(new)
    graph.replay()
    expected = torch.empty_like(y)
    launcher(inputs, (expected,))
    torch.cuda.synchronize()
    assert torch.equal(y, expected)
    (ref64,) = op.reference_fp64(spec, inputs)
    (lowp,) = op.reference(spec, inputs)
    assert check_close(y, ref64, lowp, op.tolerance) is None


def test_the_kernels_run_inside_a_cuda_graph() -> None:
    """No host sync, no allocation capture cannot take: split-K's partials and counters, the
    attention splits' partials (made in the graph's pool), replayed on refilled inputs."""
    qkv = MATMUL.spec((1, 3072, 2048), "bfloat16", epilogue="rope", rope=(32, 8), prologue="rmsnorm")
    split = next(c for c in MATMUL.variant("split_k").space(qkv).configs() if c["REDUCE"] == "last_program")
    _captured_matches_eager(MATMUL, qkv, "split_k", split)
    _captured_matches_eager(MATMUL, qkv, "gemv", MATMUL.variant("gemv").space(qkv).configs()[0])
    attention = ATTENTION.spec((2, 32, 1024, 64), "bfloat16", kv_heads=8)
    for variant in ATTENTION.variants:
        _captured_matches_eager(ATTENTION, attention, variant.name, variant.space(attention).configs()[-1])

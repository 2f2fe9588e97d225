"""The fused QKV projection from three weights (``decode_matmul``, ``weights="qkv"``).

Llama's attention holds ``q_proj``, ``k_proj`` and ``v_proj`` apart. ``weights="qkv"`` with
``epilogue="rope"``, ``rope=(heads, kv_heads)`` takes them as three inputs (``x, wq, wk, wv[, gamma],
cos, sin``) and gives the concatenated ``(..., (heads + 2 kv_heads) * D)`` row of the one-weight
form, the kernels choosing per block of output columns the weight whose segment holds it. These
tests run every variant in the interpreter on small and odd shapes (M of 1, 3 and 17; 4/2 and 2/1
heads; head dims 16 and 32; K not a multiple of any block; with and without the RMSNorm prologue;
bfloat16 and float32)
against the float64 reference, check that the output is bitwise the one-weight form's on the same
values and config, that the reference is the three ``F.linear`` and Hugging Face's rotation, put one
config of each variant through the harness, and check the refusals.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from real_compiler_run import assert_every_kernel_lowers

from kernelsmith.evaluate.validate import validate
from kernelsmith.ops import UnsupportedWorkload
from kernelsmith.ops._decode_matmul_launch import _fusions, _one_weight
from kernelsmith.ops.decode_matmul import OP, _gemv_space, _persistent_space, _split_k_space, apply_rope_half
from kernelsmith.space import Config
from kernelsmith.spec import OpSpec
from kernelsmith.testing.kernels import assert_matches_fp64, run_single_output
from kernelsmith.testing.validation_runs import validation_runs

SPACES = {"gemv": _gemv_space, "split_k": _split_k_space, "persistent": _persistent_space}

# (M, heads, kv_heads, D, K, dtype, prologue): M of 1, 3 and 17 (17: the tensor-core blocks and a
# partial row block), GQA 4/2 and 2/1, head dims 16 and 32, K not a multiple of any block.
CASES = (
    (1, 4, 2, 16, 40, "bfloat16", "rmsnorm"),
    (3, 2, 1, 32, 33, "float32", "none"),
    (17, 2, 1, 16, 65, "bfloat16", "rmsnorm"),
)


def qkv_spec(m: int, heads: int, kv_heads: int, d: int, k: int, dtype: str, prologue: str = "none") -> OpSpec:
    n = (heads + 2 * kv_heads) * d
    return OP.spec((m, n, k), dtype, epilogue="rope", rope=(heads, kv_heads), prologue=prologue, weights="qkv")


def cost(spec: OpSpec, config: Config) -> float:
    """About how long the interpreter takes: programs x K steps, weighted by the block's elements."""
    m, k = spec.inputs[0].shape[0], spec.inputs[0].shape[-1]
    n = OP.output_specs(spec)[0].shape[-1]
    splits = int(config.get("SPLIT_K", 1))
    programs = math.ceil(m / config["BLOCK_M"]) * math.ceil(n / config["BLOCK_N"]) * splits
    steps = programs * math.ceil(math.ceil(k / config["BLOCK_K"]) / splits)
    return steps * (1 + config["BLOCK_M"] * config["BLOCK_N"] * config["BLOCK_K"] / 2000)


def configs_to_run(variant: str, spec: OpSpec) -> list[Config]:
    """The cheapest valid config of each class that changes the code the segments run through:
    CUDA or tensor cores, split K or not, and one block a head or several (several blocks in a
    segment, and segments of one block: the k and v heads at 2/1). FOLD's code paths do not touch
    the weight pointers (test_decode_matmul_rope_projection.py runs them)."""
    d = _fusions(spec).rope_dim
    by_class: dict[tuple[object, ...], Config] = {}
    for c in sorted(SPACES[variant](spec, prune=False), key=lambda c: cost(spec, c)):
        key = (c["BLOCK_M"] >= 16, c.get("SPLIT_K", 1) > 1, c["BLOCK_N"] == d)
        by_class.setdefault(key, c)
    return list(by_class.values())


def test_the_spec_takes_three_weights() -> None:
    spec = qkv_spec(2, 32, 8, 64, 2048, "bfloat16", "rmsnorm")  # Llama-3.2-1B's q, k and v projections
    assert [t.shape for t in spec.inputs] == [(2, 2048), (2048, 2048), (512, 2048), (512, 2048), (2048,), (2, 64),
                                              (2, 64)]  # fmt: skip
    assert spec.constants["weights"] == "qkv" and spec.constants["rope"] == [32, 8]
    assert OP.output_specs(spec)[0].shape == (2, 3072)
    f = _fusions(spec)
    assert (f.rope_dim, f.rope_cols, f.k_start, f.v_start, f.extra) == (64, 2560, 2048, 2560, 4)
    one = _one_weight(spec)
    assert [t.shape for t in one.inputs[:2]] == [(2, 2048), (3072, 2048)] and "weights" not in one.constants
    assert OP.flops(spec) == OP.flops(one) and OP.bytes_moved(spec) == OP.bytes_moved(one)
    inputs = OP.make_inputs(spec, seed=1, device="cpu")
    assert OP.spec_for(*inputs, epilogue="rope", rope=(32, 8), prologue="rmsnorm", weights="qkv") == spec
    assert all(t.is_contiguous() for t in inputs)
    # the same values as the one-weight form's inputs, its weight cut into three
    x, w, *rest = OP.make_inputs(one, seed=1, device="cpu")
    assert torch.equal(torch.cat(inputs[1:4]), w) and torch.equal(inputs[0], x)
    assert all(torch.equal(a, b) for a, b in zip(inputs[4:], rest, strict=True))
    assert OP._with_rows(spec, 5).inputs[1:4] == spec.inputs[1:4]


def test_the_reference_is_three_linears_then_the_rotation() -> None:
    spec = qkv_spec(3, 4, 2, 16, 40, "float32")
    x, wq, wk, wv, cos, sin = (t.double() for t in OP.make_inputs(spec, seed=3, device="cpu"))
    (ours,) = OP.reference_fp64(spec, (x, wq, wk, wv, cos, sin))
    q = apply_rope_half(F.linear(x, wq), cos, sin, 4, 0)
    k = apply_rope_half(F.linear(x, wk), cos, sin, 2, 0)
    assert torch.allclose(ours, torch.cat((q, k, F.linear(x, wv)), dim=-1))
    assert not torch.allclose(ours[:, :64], F.linear(x, wq))  # q rotated
    assert torch.equal(ours[:, 96:], F.linear(x, wv))  # v not


@pytest.mark.parametrize("variant", list(SPACES))
def test_every_variant_matches_float64_and_the_one_weight_form(variant: str, device: str) -> None:
    for i, (m, heads, kv_heads, d, k, dtype, prologue) in enumerate(CASES):
        spec = qkv_spec(m, heads, kv_heads, d, k, dtype, prologue)
        one = _one_weight(spec)
        configs = configs_to_run(variant, spec)
        assert configs, f"{variant}: no config for {spec.describe()}"
        inputs = OP.make_inputs(spec, seed=i, device=device)
        x, wq, wk, wv, *rest = inputs
        one_inputs = (x, torch.cat((wq, wk, wv)), *rest)
        for config in configs:
            what = f"{variant} {config.key} {spec.describe()}"
            y = run_single_output(OP, spec, variant, config, inputs)
            assert_matches_fp64(OP, spec, inputs, y, what)
            # every column from its own weight: bitwise the concatenated weight's kernel
            assert torch.equal(y, run_single_output(OP, one, variant, config, one_inputs)), what


def real_compiler_cases() -> list[tuple[object, str, OpSpec, Config]]:
    """The cases real_compiler.py lowers: on a bfloat16 spec at Llama's head dim, with and without
    the prologue, each variant's cheapest config of each class (configs_to_run)."""
    cases: list[tuple[object, str, OpSpec, Config]] = []
    for prologue in ("none", "rmsnorm"):
        spec = qkv_spec(17, 4, 2, 64, 256, "bfloat16", prologue)
        for variant in SPACES:
            cases += [(OP, variant, spec, c) for c in configs_to_run(variant, spec)]
    return cases


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the kernels compile for real in the GPU tests")
def test_the_qkv_kernels_compile_under_the_real_triton_compiler() -> None:
    """The interpreter runs the pointer select as numpy; the real front end must lower it too (a
    select of two pointers per block, in a process without the interpreter)."""
    assert_every_kernel_lowers("test_decode_matmul_qkv:real_compiler_cases")


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_one_config_of_each_variant_passes_the_harness(dtype: str, device: str) -> None:
    spec = qkv_spec(3, 2, 1, 16, 40, dtype, "rmsnorm")
    for variant in OP.variants:
        config = min(variant.space(spec).configs(), key=lambda c: cost(spec, c))
        assert {validate(OP, spec, variant.build, config, device, lambda: None)} == validation_runs(OP, spec)


def test_a_weight_in_the_wrong_segment_is_caught() -> None:
    """The check that k's and v's weights are distinct inputs: swapping them changes the output."""
    spec = qkv_spec(1, 2, 1, 16, 40, "float32")
    x, wq, wk, wv, cos, sin = OP.make_inputs(spec, seed=4, device="cpu")
    config = min(_gemv_space(spec, prune=False), key=lambda c: cost(spec, c))
    y = run_single_output(OP, spec, "gemv", config, (x, wq, wk, wv, cos, sin))
    swapped = run_single_output(OP, spec, "gemv", config, (x, wq, wv, wk, cos, sin))
    assert not torch.equal(y, swapped)
    assert torch.equal(y[:, :32], swapped[:, :32])  # q's columns read q's weight only


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"rope": (6, 0)}, "kv_heads > 0"),
        ({"epilogue": "bias+rope"}, "no bias"),
        ({"weights": "fused"}, "weights must be"),
    ],
    ids=["no-kv-heads", "bias", "unknown-weights"],
)
def test_refuses_what_is_not_a_qkv_projection(change: dict[str, object], match: str) -> None:
    constants: dict[str, object] = {"epilogue": "rope", "rope": (4, 1), "weights": "qkv", **change}
    with pytest.raises(UnsupportedWorkload, match=match):
        OP.spec((1, 96, 32), "bf16", **constants)  # type: ignore[arg-type]


def test_spec_for_refuses_weights_that_do_not_split_as_the_heads_say() -> None:
    spec = qkv_spec(1, 4, 2, 16, 32, "bfloat16")
    x, wq, wk, wv, cos, sin = OP.make_inputs(spec, seed=0, device="cpu")
    rope = {"epilogue": "rope", "rope": (4, 2), "weights": "qkv"}
    with pytest.raises(UnsupportedWorkload, match="k's weight"):
        OP.spec_for(x, wq, wk[:16], torch.cat((wv, wk[16:])), cos, sin, **rope)  # 32 + 16 + 48 rows
    with pytest.raises(UnsupportedWorkload, match="contiguous"):
        OP.spec_for(x, wq.t().contiguous().t(), wk, wv, cos, sin, **rope)
    with pytest.raises(UnsupportedWorkload, match="x's dtype"):
        OP.spec_for(x, wq, wk.float(), wv, cos, sin, **rope)
    with pytest.raises(UnsupportedWorkload, match="2-D weights"):
        OP.spec_for(x, wq, wk, cos[0], sin, **rope)  # v missing: a 1-D table in its place

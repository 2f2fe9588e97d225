"""RoPE in the epilogue of one projection (``decode_matmul``, ``epilogue="rope"``, ``rope=(heads, 0)``).

Llama's attention has separate q and k projections: ``q_proj`` makes ``heads x D`` columns, which
Hugging Face views to ``(B, S, heads, D)`` and rotates with ``apply_rotary_pos_emb`` (rotate_half:
channel ``j < D/2`` pairs with ``j + D/2``), and ``k_proj`` the same with the KV heads. The spec
``rope=(heads, 0)`` says "the whole output is ``heads`` rotated heads": the fused-QKV kernels
rotate every column below ``(heads + kv_heads) * D``, here all of them. These tests run every
variant in the interpreter on small and odd shapes (M of 1 and 3; 1, 2 and 5 heads; D of 64 and
128; bfloat16 and float32) against the float64 reference, check that reference against
transformers' own ``apply_rotary_pos_emb``, put one config of each variant through the harness,
and check the refusals.
"""

from __future__ import annotations

import math

import pytest
import torch

from kernelsmith.evaluate.validate import validate
from kernelsmith.ops import UnsupportedWorkload
from kernelsmith.ops._decode_matmul_launch import _fusions
from kernelsmith.ops.decode_matmul import OP, _gemv_space, _persistent_space, _split_k_space
from kernelsmith.space import Config
from kernelsmith.spec import OpSpec
from kernelsmith.testing.kernels import assert_matches_fp64, run_single_output
from kernelsmith.testing.validation_runs import validation_runs

SPACES = {"gemv": _gemv_space, "split_k": _split_k_space, "persistent": _persistent_space}

# (M, heads, D, K, dtype): M of 1 and 3, 1, 2 and 5 heads, both head dims Llama models use, K not a
# multiple of any block (the masked last K block runs), both the dtypes Llama runs in and float32.
CASES = (
    (1, 1, 64, 40, "bfloat16"),
    (3, 2, 64, 33, "float32"),
    (1, 5, 128, 65, "float32"),
    (3, 1, 128, 40, "bfloat16"),
    (3, 5, 64, 33, "bfloat16"),
)


def cost(spec: OpSpec, config: Config) -> float:
    """About how long the interpreter takes: programs x K steps, weighted by the block's elements."""
    m, (n, k) = spec.inputs[0].shape[0], spec.inputs[1].shape
    splits = int(config.get("SPLIT_K", 1))
    programs = math.ceil(m / config["BLOCK_M"]) * math.ceil(n / config["BLOCK_N"]) * splits
    steps = programs * math.ceil(math.ceil(k / config["BLOCK_K"]) / splits)
    return steps * (1 + config["BLOCK_M"] * config["BLOCK_N"] * config["BLOCK_K"] / 2000)


def configs_to_run(variant: str, spec: OpSpec) -> list[Config]:
    """The cheapest valid config of each class that changes the code RoPE runs through: CUDA or
    tensor cores, FOLD, split K or not, and the block height relative to the head (one block a
    head, or several: the chunk index of _weight_rows and _rotate)."""
    d = _fusions(spec).rope_dim
    by_class: dict[tuple[object, ...], Config] = {}
    for c in sorted(SPACES[variant](spec, prune=False), key=lambda c: cost(spec, c)):
        key = (c["BLOCK_M"] >= 16, c["FOLD"], c.get("SPLIT_K", 1) > 1, c["BLOCK_N"] == d)
        by_class.setdefault(key, c)
    return list(by_class.values())


def test_a_single_projection_spec_rotates_every_column() -> None:
    spec = OP.spec((2, 3, 32 * 64, 2048), "bf16", epilogue="rope", rope=(32, 0))  # Llama-3.2-1B's q_proj
    assert [t.shape for t in spec.inputs] == [(2, 3, 2048), (2048, 2048), (2, 3, 64), (2, 3, 64)]
    assert spec.constants["rope"] == [32, 0]
    f = _fusions(spec)
    assert (f.rope_dim, f.rope_cols) == (64, 2048)
    k_spec = OP.spec((1, 8 * 64, 2048), "bf16", epilogue="bias+rope", rope=(8, 0))  # its k_proj, with a bias
    assert (_fusions(k_spec).rope_dim, _fusions(k_spec).rope_cols) == (64, 512)
    x, w = torch.zeros(2, 3, 2048, dtype=torch.bfloat16), torch.zeros(2048, 2048, dtype=torch.bfloat16)
    cos = torch.zeros(2, 3, 64, dtype=torch.bfloat16)
    assert OP.spec_for(x, w, cos, cos, epilogue="rope", rope=(32, 0)) == spec


@pytest.mark.parametrize("variant", list(SPACES))
def test_every_variant_matches_float64(variant: str, device: str) -> None:
    for i, (m, heads, d, k, dtype) in enumerate(CASES):
        spec = OP.spec((m, heads * d, k), dtype, epilogue="bias+rope" if i % 2 else "rope", rope=(heads, 0))
        configs = configs_to_run(variant, spec)
        assert configs, f"{variant}: no config for {spec.describe()}"
        inputs = OP.make_inputs(spec, seed=i, device=device)
        for config in configs:
            y = run_single_output(OP, spec, variant, config, inputs)
            assert_matches_fp64(OP, spec, inputs, y, f"{variant} {config.key} {spec.describe()}")


def test_the_reference_is_transformers_apply_rotary_pos_emb() -> None:
    """The family's float64 reference on q_proj and k_proj outputs equals transformers' own
    apply_rotary_pos_emb on the (B, heads, S, D) views Llama's attention makes."""
    llama = pytest.importorskip("transformers.models.llama.modeling_llama")
    batch, seq, heads, kv_heads, d, k = 2, 3, 4, 2, 64, 48
    q_spec = OP.spec((batch, seq, heads * d, k), "float32", epilogue="rope", rope=(heads, 0))
    k_spec = OP.spec((batch, seq, kv_heads * d, k), "float32", epilogue="rope", rope=(kv_heads, 0))
    x, wq, cos, sin = (t.double() for t in OP.make_inputs(q_spec, seed=5, device="cpu"))
    wk = torch.randn(kv_heads * d, k, dtype=torch.float64, generator=torch.Generator().manual_seed(6))
    (q_ours,) = OP.reference_fp64(q_spec, (x, wq, cos, sin))
    (k_ours,) = OP.reference_fp64(k_spec, (x, wk, cos, sin))
    q = torch.nn.functional.linear(x, wq).view(batch, seq, heads, d).transpose(1, 2)
    kk = torch.nn.functional.linear(x, wk).view(batch, seq, kv_heads, d).transpose(1, 2)
    q_hf, k_hf = llama.apply_rotary_pos_emb(q, kk, cos, sin)  # unsqueeze_dim=1: cos (B, S, D) over the heads
    assert torch.allclose(q_ours, q_hf.transpose(1, 2).reshape(batch, seq, heads * d))
    assert torch.allclose(k_ours, k_hf.transpose(1, 2).reshape(batch, seq, kv_heads * d))
    assert not torch.allclose(q_ours, torch.nn.functional.linear(x, wq))  # the rotation did something


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_one_config_of_each_variant_passes_the_harness(dtype: str, device: str) -> None:
    spec = OP.spec((3, 2 * 64, 40), dtype, epilogue="rope", rope=(2, 0))
    for variant in OP.variants:
        config = min(variant.space(spec).configs(), key=lambda c: cost(spec, c))
        assert {validate(OP, spec, variant.build, config, device, lambda: None)} == validation_runs(OP, spec)


@pytest.mark.parametrize(
    ("n", "rope", "match"),
    [(128, (0, 0), "heads > 0"), (128, (2, -1), "heads > 0"), (130, (4, 0), "split"), (66, (2, 0), "split"),
     (60, (2, 0), "multiple")],
    ids=["no-heads", "negative-kv-heads", "heads-do-not-split-N", "odd-head-dim", "head-dim-not-a-block"],
)  # fmt: skip
def test_refuses_what_is_not_a_rotated_projection(n: int, rope: tuple[int, int], match: str) -> None:
    with pytest.raises(UnsupportedWorkload, match=match):
        OP.spec((1, n, 32), "bf16", epilogue="rope", rope=rope)

"""decode_attention with ``write_kv=True``: Hugging Face's ``StaticCache.update`` (the new tokens' keys
and values stored into the cache at ``cache_position``) fused into the attention's own pass, for one
new token and for several (a speculative verify step, a chunked prefill into a static cache).

Every case checks both things the op does: the output against the float64 reference, and the caches
bit for bit against ``index_copy_`` (nothing else in them moved). Then the same through the
harness (``validate``, the worker's timing), and the planted failures it must reject.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from real_compiler_run import assert_every_kernel_lowers
from test_decode_attention import config, smallest_and_largest_blocks

from kernelsmith.evaluate.validate import Rejected, validate
from kernelsmith.ops import UnsupportedWorkload
from kernelsmith.ops.decode_attention import OP, DecodeAttention
from kernelsmith.space import Config
from kernelsmith.spec import OpSpec
from kernelsmith.testing.harness import evaluate_launcher
from kernelsmith.testing.kernels import assert_matches_fp64
from kernelsmith.testing.validation_runs import validation_runs


def call(spec: OpSpec, variant: str, cfg: Config, inputs: tuple[torch.Tensor, ...]) -> torch.Tensor:
    (out,) = OP.output_specs(spec)
    y = torch.full(out.shape, math.nan, dtype=out.torch_dtype, device=inputs[0].device)
    OP.variant(variant).build(spec, cfg)(inputs, (y,))
    return y


# (B, H, kv_heads, L, D, dtype, distribution, BLOCK_N, SPLITS): a cache of one position (the new
# token alone, every split's range empty), odd lengths no block divides, a position drawn anywhere
# (uneven), GQA 4:1, MQA and plain heads, head dims that are not powers of two (48, 80).
CASES = [
    (1, 8, 8, 1, 16, "bfloat16", "full", 16, 4),
    (2, 8, 2, 17, 32, "float16", "uneven", 16, 4),
    (3, 8, 1, 17, 48, "float32", "full", 32, 2),
    (2, 8, 2, 100, 64, "bfloat16", "uneven", 32, 8),
    (3, 4, 1, 67, 80, "float16", "peaked", 64, 2),
    (1, 16, 2, 40, 64, "float32", "uneven", 16, 16),
]


@pytest.mark.parametrize("variant", ("single_pass", "split_kv"))
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}x{c[1]}/{c[2]}x{c[3]}x{c[4]}-{c[5]}-{c[6]}")
def test_attends_and_writes_the_new_rows(case: tuple[Any, ...], variant: str, device: str) -> None:
    b, h, hk, cache_len, d, dtype, distribution, block_n, splits = case
    spec = OP.spec((b, h, cache_len, d), dtype, kv_heads=hk, write_kv=True)
    inputs = OP.make_inputs(spec, seed=sum(case[:5]), distribution=distribution, device=device)
    before = tuple(t.clone() for t in inputs)
    y = call(spec, variant, config(variant, block_n, splits), inputs)
    assert_matches_fp64(OP, spec, before, y, variant)  # the references start from the state before
    k_after, v_after = OP.reference_written(spec, before)
    assert torch.equal(inputs[1], k_after) and torch.equal(inputs[2], v_after), "the caches are not HF's update"
    position = int(before[5])
    assert torch.equal(inputs[1][:, :, position], before[3][:, :, 0])  # (the reference does write the row)
    for i in (0, 3, 4, 5):
        assert torch.equal(inputs[i], before[i]), f"input {i} changed"


# (B, H, kv_heads, L, D, Sq, dtype, distribution, BLOCK_N, SPLITS) with several new tokens: B 1 and 3,
# kv heads 1 and 2, groups 1 and 4, odd cache lengths, D = 64; Sq = L (the cache holds only the new
# tokens), a Sq no power of two, and as many rows as a program holds (4 heads x 4 tokens = 16).
MULTI_CASES = [
    (1, 4, 1, 17, 64, 3, "float32", "uneven", 16, 4),
    (3, 8, 2, 19, 64, 2, "bfloat16", "full", 16, 2),
    (3, 2, 2, 9, 64, 4, "float16", "uneven", 32, 4),
    (1, 1, 1, 5, 64, 5, "float32", "full", 16, 8),
    (3, 4, 1, 33, 64, 4, "bfloat16", "peaked", 16, 4),
    (1, 2, 2, 21, 64, 3, "float32", "uneven", 64, 2),
]


@pytest.mark.parametrize("variant", ("single_pass", "split_kv"))
@pytest.mark.parametrize("case", MULTI_CASES, ids=lambda c: f"{c[0]}x{c[1]}/{c[2]}x{c[3]}x{c[4]}-q{c[5]}-{c[6]}-{c[7]}")
def test_several_new_tokens_attend_causally_and_write_consecutive_rows(case: tuple[Any, ...], variant: str,
                                                                       device: str) -> None:  # fmt: skip
    b, h, hk, cache_len, d, q_len, dtype, distribution, block_n, splits = case
    spec = OP.spec((b, h, cache_len, d), dtype, kv_heads=hk, q_len=q_len, write_kv=True)
    inputs = OP.make_inputs(spec, seed=sum(case[:6]), distribution=distribution, device=device)
    before = tuple(t.clone() for t in inputs)
    y = call(spec, variant, config(variant, block_n, splits), inputs)
    assert_matches_fp64(OP, spec, before, y, variant)
    k_after, v_after = OP.reference_written(spec, before)
    assert torch.equal(inputs[1], k_after) and torch.equal(inputs[2], v_after), "the caches are not HF's update"
    rows = slice(int(before[5]), int(before[5]) + q_len)
    assert torch.equal(inputs[1][:, :, rows], before[3]) and torch.equal(inputs[2][:, :, rows], before[4])  # in order
    for i in (0, 3, 4, 5):
        assert torch.equal(inputs[i], before[i]), f"input {i} changed"


@pytest.mark.parametrize("variant", ("single_pass", "split_kv"))
def test_several_new_tokens_at_position_zero_see_only_each_other(variant: str, device: str) -> None:
    """An empty past (every split's cached range empty): token i sees new tokens 0 .. i only, the
    first exactly its own value (softmax over one key)."""
    spec = OP.spec((3, 8, 23, 64), "float32", kv_heads=2, q_len=3, write_kv=True)
    inputs = list(OP.make_inputs(spec, seed=11, device=device))
    inputs[5] = torch.zeros(1, dtype=torch.int64, device=device)
    before = tuple(t.clone() for t in inputs)
    y = call(spec, variant, config(variant), tuple(inputs))
    assert_matches_fp64(OP, spec, before, y, variant)
    group = 4
    torch.testing.assert_close(y[:, :, 0], before[4][:, :, 0].repeat_interleave(group, dim=1))
    assert torch.equal(inputs[1][:, :, :3], before[3]) and torch.equal(inputs[1][:, :, 3:], before[1][:, :, 3:])


@pytest.mark.parametrize("variant", ("single_pass", "split_kv"))
@pytest.mark.parametrize("q_len", (1, 3))
def test_a_repeated_call_gives_the_same_output_and_cache(variant: str, q_len: int, device: str) -> None:
    """Idempotence, which the harness's reruns and timing rounds rely on."""
    spec = OP.spec((2, 8, 40, 32), "bfloat16", kv_heads=2, q_len=q_len, write_kv=True)
    inputs = OP.make_inputs(spec, seed=3, distribution="uneven", device=device)
    first = call(spec, variant, config(variant), inputs)
    caches = (inputs[1].clone(), inputs[2].clone())
    assert torch.equal(first, call(spec, variant, config(variant), inputs))
    assert torch.equal(inputs[1], caches[0]) and torch.equal(inputs[2], caches[1])


@pytest.mark.parametrize("variant", ("single_pass", "split_kv"))
@pytest.mark.parametrize(("q_len", "position"), [(1, -1), (1, 24), (1, 1000), (3, -1), (3, 22), (3, 1000)])
def test_a_position_outside_the_cache_writes_nothing_and_gives_nan(variant: str, q_len: int, position: int,
                                                                   device: str) -> None:  # fmt: skip
    """(3 new tokens at 22 of a cache of 24: the first two would fit, the third not; nothing is written.)"""
    spec = OP.spec((2, 4, 24, 16), "float32", kv_heads=2, q_len=q_len, write_kv=True)
    inputs = list(OP.make_inputs(spec, seed=5, device=device))
    inputs[5] = torch.tensor([position], dtype=torch.int64, device=device)
    before = [t.clone() for t in inputs]
    y = call(spec, variant, config(variant), tuple(inputs))
    assert bool(torch.isnan(y).all())
    assert all(torch.equal(t, b) for t, b in zip(inputs, before, strict=True))
    (reference,) = OP.reference(spec, [t.clone() for t in before])
    assert bool(torch.isnan(reference).all())  # the reference agrees: no answer, and no write
    assert [torch.equal(t, b) for t, b in zip(OP.reference_written(spec, before), before[1:3], strict=True)] == [
        True,
        True,
    ]


def test_the_reference_is_index_copy_then_sdpa(device: str) -> None:
    """The low-precision reference is what Hugging Face runs: the update in place, then SDPA
    over positions up to the new one."""
    spec = OP.spec((1, 4, 12, 16), "float32", kv_heads=2, write_kv=True)
    q, k, v, k_new, v_new, position = OP.make_inputs(spec, seed=9, distribution="uneven", device=device)
    mine_k, mine_v = k.clone(), v.clone()
    (out,) = OP.reference(spec, (q, mine_k, mine_v, k_new, v_new, position))
    k.index_copy_(2, position, k_new)
    v.index_copy_(2, position, v_new)
    visible = (torch.arange(12, device=device) <= position)[None, None, None, :]
    hf = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=visible, enable_gqa=True)
    assert torch.equal(mine_k, k) and torch.equal(mine_v, v)
    torch.testing.assert_close(out, hf)


# ---- through the harness ----------------------------------------------------------------------------
@pytest.mark.parametrize(("dtype", "q_len"), [("bfloat16", 1), ("float32", 1), ("float32", 3)])
def test_one_config_of_each_variant_passes_the_harness(dtype: str, q_len: int, device: str) -> None:
    spec = OP.spec((2, 4, 24, 16), dtype, kv_heads=2, q_len=q_len, write_kv=True)
    assert OP.written_inputs(spec) == (1, 2)
    for variant in OP.variants:
        cfg = min(variant.space(spec).configs(), key=lambda c: (c["BLOCK_N"], c.get("SPLITS", 1), c["num_warps"],
                                                                 c["num_stages"]))  # fmt: skip
        assert {validate(OP, spec, variant.build, cfg, device, lambda: None)} == validation_runs(OP, spec)


def _skips_the_write(s: OpSpec, c: Config) -> Any:
    """The plain static-cache kernel fed the position as its (one sequence's) length: it attends
    the past only and never stores the new rows."""
    static = OP.spec((1, s.inputs[0].shape[1], s.inputs[1].shape[2], s.inputs[0].shape[3]), s.inputs[0].dtype,
                     kv_heads=s.inputs[1].shape[1])  # fmt: skip
    inner = OP.variant("single_pass").build(static, c)
    return lambda inputs, outputs: inner((*inputs[:3], inputs[5]), outputs)


def test_the_harness_rejects_a_kernel_that_skips_the_write(device: str) -> None:
    spec = OP.spec((1, 4, 24, 16), "float32", kv_heads=2, write_kv=True)
    with pytest.raises(Rejected) as caught:
        validate(OP, spec, _skips_the_write, config("single_pass"), device, lambda: None)
    assert caught.value.kind == "validate"
    assert "input 1, which the op writes" in str(caught.value)


def test_the_harness_rejects_a_write_the_family_does_not_declare(device: str) -> None:
    """The declaration is the family's: under a family that declares nothing, the same correct
    kernel is a cheat for writing the caches."""

    class Undeclared(DecodeAttention):
        def written_inputs(self, spec: OpSpec) -> tuple[int, ...]:
            return ()

    spec = OP.spec((1, 4, 24, 16), "float32", kv_heads=2, write_kv=True)
    with pytest.raises(Rejected) as caught:
        validate(Undeclared(), spec, OP.variant("single_pass").build, config("single_pass"), device, lambda: None)
    assert caught.value.kind == "cheat"
    assert "which the op does not write" in str(caught.value)


def test_the_worker_validates_and_times_a_writing_kernel() -> None:
    """The whole worker path (compile, validate, the timing rounds on shared input sets, rule 5's
    refill, the state check of the written inputs after timing): an honest kernel is "ok"."""
    spec = OP.spec((1, 4, 24, 16), "float32", kv_heads=2, write_kv=True)
    result = evaluate_launcher(spec, lambda s, c: OP.variant("split_kv").build(s, config("split_kv")))
    assert result.status == "ok", result.error


def test_kernelsmith_kernel_refuses_a_writing_workload(device: str) -> None:
    """``kernelsmith::kernel`` is declared without mutations: a write_kv call through it is an
    error, never a silent write torch.compile would not see (the backend emits
    ``kernelsmith::kernel_mutating`` for such a site, which declares the caches written)."""
    from kernelsmith import dispatch

    spec = OP.spec((1, 4, 24, 16), "float32", kv_heads=2, write_kv=True)
    inputs = list(OP.make_inputs(spec, seed=2, device=device))
    before = [t.clone() for t in inputs]
    with pytest.raises(UnsupportedWorkload, match=r"writes its inputs \[1, 2\], and kernelsmith::kernel is called "
                                                  r"declaring \[\] written"):
        dispatch.run_kernel("decode_attention", inputs, dispatch.constants_json({}))
    assert all(torch.equal(t, b) for t, b in zip(inputs, before, strict=True))


# ---- specs ------------------------------------------------------------------------------------------
def test_spec_for_hugging_face_tensors_and_views(device: str) -> None:
    """k_new/v_new as HF makes them (``proj(x).view(B, 1, Hk, D).transpose(1, 2)``) are accepted."""
    b, hk, d = 2, 2, 16
    k_new = torch.zeros(b, 1, hk, d).transpose(1, 2)
    v_new = torch.zeros(b, 1, hk, d).transpose(1, 2)
    q, k, v = torch.zeros(b, 8, 1, d), torch.zeros(b, hk, 32, d), torch.zeros(b, hk, 32, d)
    spec = OP.spec_for(q, k, v, k_new, v_new, torch.tensor([5]))
    assert spec.constants["write_kv"] is True and OP.written_inputs(spec) == (1, 2)
    assert OP.written_inputs(OP.spec_for(q, k, v, torch.tensor([5, 5]))) == ()
    inputs = OP.make_inputs(spec, seed=1, device=device)
    y = call(spec, "single_pass", config("single_pass"), inputs)
    assert bool(torch.isfinite(y).all())


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda: OP.spec((1, 4, 24, 16), "float32", kv_heads=2, write_kv=True, q_len=25), "do not fit"),
        (lambda: OP.spec((1, 4, 24, 16), "float32", kv_heads=2, write_kv=True, cache="dynamic"), "static cache"),
        (lambda: OP.spec((1, 4, 24, 16), "float32", kv_heads=2, write_kv="yes"), "True or False"),
        (lambda: OP.spec_for(torch.zeros(1, 4, 1, 16), torch.zeros(1, 2, 8, 16), torch.zeros(1, 2, 8, 16),
                             torch.zeros(1, 2, 2, 16), torch.zeros(1, 2, 1, 16), torch.tensor([1])), "k_new"),
        (lambda: OP.spec_for(torch.zeros(1, 4, 2, 16), torch.zeros(1, 2, 8, 16), torch.zeros(1, 2, 8, 16),
                             torch.zeros(1, 2, 2, 16), torch.zeros(1, 2, 1, 16), torch.tensor([1])), "v_new"),
        (lambda: OP.spec_for(torch.zeros(1, 4, 1, 16), torch.zeros(1, 2, 8, 16), torch.zeros(1, 2, 8, 16),
                             torch.zeros(1, 2, 1, 16), torch.zeros(1, 2, 1, 16), torch.tensor([1.0])),
         "cache_position"),
    ],
)  # fmt: skip
def test_refuses_what_it_does_not_know(make: Any, match: str) -> None:
    with pytest.raises(UnsupportedWorkload, match=match):
        make()


# ---- the real compiler (tests/interpreter/real_compiler.py; run by test_decode_attention.py's test) ----
def real_compiler_cases() -> list[tuple[DecodeAttention, str, OpSpec, Config]]:
    specs = [OP.spec((2, 32, 64, 128), d, kv_heads=8, write_kv=True) for d in ("bfloat16", "float16", "float32")]
    specs.append(OP.spec((2, 32, 64, 128), "bfloat16", kv_heads=8, q_len=3, write_kv=True))  # several new rows
    return smallest_and_largest_blocks(specs)


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the other tests compile for real")
def test_write_kv_kernels_compile_under_the_real_triton_compiler() -> None:
    assert_every_kernel_lowers("test_decode_attention_write_kv:real_compiler_cases")

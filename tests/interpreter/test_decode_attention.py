"""The ``decode_attention`` family (new query tokens over a Hugging Face KV cache): both variants in
the Triton interpreter on small and odd shapes against the float64 reference (cache lengths 1, 17
and 1000; 1, 2 and 8 key/value heads; 1, 3 and 17 new tokens; uneven lengths in a batch, with stale
values past every length), the harness, split reproducibility, out-of-range lengths (NaN, never a
plausible answer), specs and refusals, and the real compiler's front end.

Outputs are pre-filled with NaN and followed by a NaN guard (a kernel that skips an element or
writes past the end is caught). The interpreter ignores num_warps and num_stages, so configs take
the fewest a config allows.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from real_compiler_run import assert_every_kernel_lowers

from kernelsmith.evaluate.validate import Rejected, validate
from kernelsmith.ops import UnsupportedWorkload, get_op
from kernelsmith.ops.decode_attention import OP, STALE_VALUE, DecodeAttention, check_lengths
from kernelsmith.space import Config
from kernelsmith.spec import OpSpec
from kernelsmith.testing.kernels import assert_matches_fp64, run_single_output
from kernelsmith.testing.validation_runs import validation_runs


def run(spec: OpSpec, variant: str, config: Config, inputs: tuple[torch.Tensor, ...], launcher: Any = None) -> Any:
    return run_single_output(OP, spec, variant, config, inputs, launcher)


def assert_matches(spec: OpSpec, inputs: tuple[torch.Tensor, ...], y: torch.Tensor, what: str) -> None:
    assert_matches_fp64(OP, spec, inputs, y, what)


def config(variant: str, block_n: int = 16, splits: int = 4) -> Config:
    extra = {"SPLITS": splits} if variant == "split_kv" else {}
    return Config(BLOCK_N=block_n, num_warps=4, num_stages=1, **extra)


# (B, H, kv_heads, q_len, L, D, cache, dtype, BLOCK_N, SPLITS): every length, group and token count
# of the docstring, each dtype, both caches, blocks that do and do not divide L, splits that leave
# ranges empty (L = 1 with 4 splits), and a head dim that is not a power of two (48).
CASES = [
    (1, 8, 8, 1, 1, 16, "static", "bfloat16", 16, 4),
    (2, 8, 2, 1, 17, 32, "static", "float16", 16, 4),
    (3, 8, 1, 3, 17, 16, "static", "float32", 32, 2),
    (2, 4, 2, 1, 1000, 16, "static", "bfloat16", 64, 8),
    (1, 2, 1, 17, 40, 48, "dynamic", "float16", 16, 2),
    (2, 8, 8, 3, 17, 16, "dynamic", "bfloat16", 16, 8),
    (1, 16, 2, 1, 1000, 64, "dynamic", "float32", 128, 16),
    # Llama-shaped groups at the head dims of Llama (64) and of some Phi/Qwen models (80, not a
    # power of two): GQA 4:1 and MQA over caches of 1, 17 and 100 positions, 1 and 3 sequences.
    (3, 8, 2, 1, 100, 64, "static", "float32", 32, 4),
    (1, 8, 2, 1, 17, 80, "static", "bfloat16", 16, 2),
    (3, 4, 1, 1, 100, 80, "static", "float16", 64, 8),
    (3, 4, 1, 1, 1, 64, "dynamic", "float32", 16, 2),
    # generate()'s boolean mask over a static cache: left padding, holes, 1 and 3 new tokens.
    (3, 8, 2, 1, 17, 64, "masked", "float32", 16, 4),
    (1, 4, 1, 3, 100, 80, "masked", "bfloat16", 32, 8),
    (2, 8, 8, 1, 1, 16, "masked", "float16", 16, 2),
]


@pytest.mark.parametrize("variant", ("single_pass", "split_kv"))
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}x{c[1]}/{c[2]}x{c[3]}x{c[4]}x{c[5]}-{c[6]}-{c[7]}")
def test_matches_float64_on_small_and_odd_shapes(case: tuple, variant: str, device: str) -> None:  # type: ignore[type-arg]
    b, h, hk, q_len, cache_len, d, cache, dtype, block_n, splits = case
    spec = OP.spec((b, h, cache_len, d), dtype, kv_heads=hk, q_len=q_len, cache=cache)
    cfg = config(variant, block_n, splits)
    assert cfg in OP.variant(variant).space(spec) or block_n < 32  # (the pruned space keeps BLOCK_N >= 32)
    for distribution in ("uneven", "peaked") if cache in ("static", "masked") else ("full",):
        inputs = OP.make_inputs(spec, seed=7, distribution=distribution, device=device)
        assert_matches(spec, inputs, run(spec, variant, cfg, inputs), f"{variant} {distribution} {spec.describe()}")


def test_uneven_lengths_read_nothing_past_a_sequence(device: str) -> None:
    """Positions past each length hold keys that would win every softmax and values of 1000: the
    output stays within the real values' range, and agrees with attention over the valid
    prefix of each sequence computed one at a time."""
    spec = OP.spec((4, 4, 64, 16), "float32", kv_heads=2)
    q, k, v, _ = OP.make_inputs(spec, seed=1, distribution="full", device=device)
    k, v = k.clone(), v.clone()
    lengths = torch.tensor([64, 1, 37, 5], dtype=torch.int64, device=device)
    for i, n in enumerate(lengths.tolist()):
        k[i, :, n:] = 30.0
        v[i, :, n:] = STALE_VALUE
    inputs = (q, k, v, lengths)
    for variant in ("single_pass", "split_kv"):
        y = run(spec, variant, config(variant, 16, 8), inputs)
        assert float(y.abs().max()) < 10, variant
        for i, n in enumerate(lengths.tolist()):
            kk = k[i : i + 1, :, :n].repeat_interleave(2, dim=1)
            vv = v[i : i + 1, :, :n].repeat_interleave(2, dim=1)
            expected = torch.nn.functional.scaled_dot_product_attention(q[i : i + 1].double(), kk.double(), vv.double())
            assert torch.allclose(y[i : i + 1].double(), expected, atol=1e-5), (variant, i, n)


@pytest.mark.parametrize("variant", ("single_pass", "split_kv"))
def test_a_length_out_of_range_gives_nan_never_an_answer(variant: str, device: str) -> None:
    """lengths[b] past the cache's end, or below the new tokens: that sequence's outputs are NaN
    (the others right), in the kernels and the reference; check_lengths refuses on the host."""
    spec = OP.spec((3, 4, 20, 16), "float16", kv_heads=2, q_len=2)
    q, k, v, _ = OP.make_inputs(spec, seed=3, device=device)
    lengths = torch.tensor([21, 20, 1], dtype=torch.int64, device=device)
    inputs = (q, k, v, lengths)
    y = run(spec, variant, config(variant), inputs)
    (ref,) = OP.reference_fp64(spec, inputs)
    for out in (y, ref, OP.reference(spec, inputs)[0]):
        assert bool(torch.isnan(out[0]).all()) and bool(torch.isnan(out[2]).all())
        assert bool(torch.isfinite(out[1]).all())
    assert torch.allclose(y[1].double(), ref[1], atol=2e-3)
    with pytest.raises(UnsupportedWorkload, match="outside"):
        check_lengths(lengths, 2, 20)
    check_lengths(lengths[1:2], 2, 20)  # in range: no error


def test_splits_are_bitwise_reproducible(device: str) -> None:
    spec = OP.spec((2, 8, 300, 32), "bfloat16", kv_heads=2)
    inputs = OP.make_inputs(spec, seed=4, distribution="uneven", device=device)
    cfg = config("split_kv", 32, 8)
    first = run(spec, "split_kv", cfg, inputs)
    assert_matches(spec, inputs, first, "split_kv")
    assert torch.equal(first, run(spec, "split_kv", cfg, inputs))


@pytest.mark.parametrize("cache", ("static", "dynamic", "masked"))
def test_one_config_of_each_variant_passes_the_harness(cache: str, device: str) -> None:
    spec = OP.spec((2, 4, 24, 16), "bfloat16", kv_heads=2, cache=cache)
    for variant in OP.variants:
        cfg = min(variant.space(spec).configs(), key=lambda c: (c["BLOCK_N"], c.get("SPLITS", 1), c["num_warps"],
                                                                 c["num_stages"]))  # fmt: skip
        assert {validate(OP, spec, variant.build, cfg, device, lambda: None)} == validation_runs(OP, spec)


def test_the_harness_rejects_a_kernel_that_reads_past_the_length(device: str) -> None:
    """A kernel ignoring lengths (attending the whole static cache) is caught on the uneven data."""
    spec = OP.spec((2, 4, 24, 16), "float32", kv_heads=2)
    dynamic = OP.spec((2, 4, 24, 16), "float32", kv_heads=2, cache="dynamic")

    def build(s: OpSpec, c: Config):  # type: ignore[no-untyped-def]
        inner = OP.variant("single_pass").build(dynamic if len(s.inputs) == 4 else s, c)
        return lambda inputs, outputs: inner(inputs[:3], outputs)

    with pytest.raises(Rejected):
        validate(OP, spec, build, config("single_pass", 32), device, lambda: None)


def test_the_harness_rejects_a_kernel_that_ignores_the_mask(device: str) -> None:
    """A kernel attending by the causal rule alone, not the mask's padding and holes, is caught."""
    spec = OP.spec((2, 4, 24, 16), "float32", kv_heads=2, cache="masked")
    dynamic = OP.spec((2, 4, 24, 16), "float32", kv_heads=2, cache="dynamic")

    def build(s: OpSpec, c: Config):  # type: ignore[no-untyped-def]
        inner = OP.variant("single_pass").build(OP._resized(dynamic, s.inputs[0].shape[0], s.inputs[1].shape[2]), c)
        return lambda inputs, outputs: inner(inputs[:3], outputs)

    with pytest.raises(Rejected):
        validate(OP, spec, build, config("single_pass", 32), device, lambda: None)


def test_a_broadcast_mask_is_read_in_place(device: str) -> None:
    """One mask for every sequence, a stride-0 view (as the backend passes a (1, 1, 1, L) mask)."""
    q, k = torch.zeros(3, 4, 1, 16), torch.zeros(3, 2, 40, 16)
    spec = OP.spec_for(q, k, k, torch.ones(1, 1, 1, 40, dtype=torch.bool).expand(3, 1, 1, 40))
    inputs = OP.make_inputs(spec, seed=5, distribution="uneven", device=device)
    assert inputs[3].stride(0) == 0 and not bool(inputs[3].all())
    assert_matches(spec, inputs, run(spec, "split_kv", config("split_kv", 16, 4), inputs), "broadcast mask")


def test_a_masked_row_sees_exactly_its_mask(device: str) -> None:
    """Left padding and a hole: the output is the softmax over the marked positions alone, which
    hold ordinary values while every other position holds stale ones."""
    spec = OP.spec((2, 4, 40, 16), "float32", kv_heads=1, cache="masked")
    q, k, v, _ = OP.make_inputs(spec, seed=3, distribution="full", device=device)
    mask = torch.zeros(2, 1, 1, 40, dtype=torch.bool, device=device)
    mask[0, ..., 5:31] = True
    mask[0, ..., 17] = False
    mask[1, ..., :40] = True
    k, v = k.clone(), v.clone()
    k[0, :, ~mask[0, 0, 0]] = 30.0
    v[0, :, ~mask[0, 0, 0]] = STALE_VALUE
    y = run(spec, "split_kv", config("split_kv", 16, 4), (q, k, v, mask))
    seen = mask[0, 0, 0]
    expected = (
        torch.softmax(q[0].double() @ k[0, :, seen].double().transpose(-1, -2) / 4.0, -1) @ v[0, :, seen].double()
    )
    torch.testing.assert_close(y[0].double(), expected, rtol=1e-4, atol=1e-4)
    assert float(y[0].abs().max()) < 10.0  # no stale value leaked in


# ---- specs ---------------------------------------------------------------------------------------


def test_specs_of_hugging_face_caches() -> None:
    assert get_op("decode_attention") is OP and isinstance(OP, DecodeAttention)
    spec = OP.spec((2, 32, 1024, 64), "bf16", kv_heads=8)
    assert [t.shape for t in spec.inputs] == [(2, 32, 1, 64), (2, 8, 1024, 64), (2, 8, 1024, 64), (2,)]
    assert spec.const("cache") == "static" and spec.const("scale") == pytest.approx(1 / 8)
    q = torch.zeros(2, 1, 32, 64, dtype=torch.bfloat16).transpose(1, 2)  # proj(x).view(B, S, H, D).transpose(1, 2)
    k = torch.zeros(2, 8, 1024, 64, dtype=torch.bfloat16)
    lengths = torch.zeros(2, dtype=torch.int32)
    assert OP.spec_for(q, k, k, lengths).inputs[3].dtype == "int32"
    assert OP.spec_for(q, k, k).const("cache") == "dynamic"
    mask = torch.ones(1, 1, 1, 1024, dtype=torch.bool).expand(2, 1, 1, 1024)  # a broadcast view
    assert OP.spec_for(q, k, k, mask).const("cache") == "masked"
    masked = OP.spec((3, 32, 1000, 64), "bf16", kv_heads=8, cache="masked")
    assert [t.shape for t in OP.bucket(masked).inputs[1:]] == [(4, 8, 1024, 64), (4, 8, 1024, 64), (4, 1, 1, 1024)]
    # a growing dynamic cache is one bucket per power of two; tails at other lengths and batches
    dyn = OP.spec((3, 32, 1000, 64), "bf16", kv_heads=8, cache="dynamic")
    assert OP.bucket(dyn).inputs[1].shape == (4, 8, 1024, 64)
    assert [(s.inputs[1].shape[0], s.inputs[1].shape[2]) for s in OP.validation_specs(dyn)] == [(3, 1000), (1, 1),
                                                                                                   (3, 67)]  # fmt: skip
    assert OP.bytes_moved(spec) >= 2 * 2 * 8 * 1024 * 64 * 2  # both caches at least


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda: OP.spec((1, 6, 16, 16), "bf16", kv_heads=4), "divide"),
        (lambda: OP.spec((1, 4, 4, 16), "bf16", q_len=5), "do not fit"),
        (lambda: OP.spec((1, 4, 16, 24), "bf16"), "multiple of 16"),
        (lambda: OP.spec((1, 32, 16, 16), "bf16", kv_heads=1, q_len=5), "prefill"),
        (lambda: OP.spec((1, 4, 16, 16), "bf16", cache="paged"), "cache must be"),
        (lambda: OP.spec_for(torch.zeros(1, 4, 1, 16), torch.zeros(1, 4, 16, 16).transpose(2, 3).contiguous()
                             .transpose(2, 3), torch.zeros(1, 4, 16, 16)), "layout"),
        (lambda: OP.spec_for(torch.zeros(1, 4, 1, 16), torch.zeros(1, 4, 16, 16), torch.zeros(1, 4, 16, 16),
                             torch.zeros(1)), "lengths"),
        (lambda: OP.spec_for(torch.zeros(1, 4, 1, 16), torch.zeros(1, 4, 16, 16), torch.zeros(1, 4, 16, 16),
                             cache="static"), "4 tensors"),
        (lambda: OP.spec_for(torch.zeros(1, 4, 1, 16), torch.zeros(1, 4, 16, 16), torch.zeros(1, 4, 16, 16),
                             torch.ones(1, 4, 1, 16, dtype=torch.bool)), "the mask must be bool of shape"),
    ],
    ids=["heads", "tokens-past-cache", "head-dim", "too-many-rows", "unknown-cache", "transposed-cache",
         "float-lengths", "static-without-lengths", "per-head-mask"],
)  # fmt: skip
def test_refuses_what_it_does_not_know(make, match: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(UnsupportedWorkload, match=match):
        make()


def test_spaces_do_not_depend_on_batch_or_length() -> None:
    """A config tuned at one cache length is valid at every other (validation's tails rely on it)."""
    for variant in OP.variants:
        keys = {
            tuple(c.key for c in variant.space(OP.spec((b, 32, n, 128), "bf16", kv_heads=8)).configs())
            for b, n in ((1, 16), (8, 4096), (3, 1000))
        }
        assert len(keys) == 1 and keys != {()}, variant.name


# ---- the real compiler -----------------------------------------------------------------------------


def smallest_and_largest_blocks(specs: list[OpSpec]) -> list[tuple[DecodeAttention, str, OpSpec, Config]]:
    """real_compiler.py's cases on ``specs``: both variants on each, at the smallest and the largest
    BLOCK_N of their unpruned spaces (one case where they are the same config)."""
    cases = []
    for spec in specs:
        for variant in OP.variants:
            configs = sorted(variant.space(spec, prune=False).configs(), key=lambda c: (c["BLOCK_N"], c.key))  # type: ignore[call-arg]
            cases += [(OP, variant.name, spec, c) for c in {c.key: c for c in configs[:1] + configs[-1:]}.values()]
    return cases


def real_compiler_cases() -> list[tuple[DecodeAttention, str, OpSpec, Config]]:
    """Both variants at each dtype and cache, the smallest and largest blocks of their spaces."""
    return smallest_and_largest_blocks([
        OP.spec((2, 32, 64, 128), dtype, kv_heads=8, q_len=q_len, cache=cache)
        for dtype, cache, q_len in (("bfloat16", "static", 1), ("float32", "dynamic", 3), ("float16", "static", 2),
                                    ("bfloat16", "masked", 3))
    ])  # fmt: skip


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the other tests compile for real")
def test_every_variant_compiles_under_the_real_triton_compiler() -> None:
    assert_every_kernel_lowers("test_decode_attention:real_compiler_cases")

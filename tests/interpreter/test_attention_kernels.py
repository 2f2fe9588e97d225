"""Attention: specs, inputs, the reference's semantics, the spaces, and every variant's kernel.

Without a GPU the kernels run in the Triton interpreter (tests/conftest.py sets it up), which is
slow: shapes stay small (B 1-2, H 1-4, S 1, 5, 17, 33 and one 129) and instead of every config each
variant runs a *covering* set, in which every value of every parameter appears at least once.
Every kernel run writes into NaN-filled outputs followed by NaN guards, and the output is
compared with the float64 reference under the harness's own tolerance (``check_close``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from kernelsmith.evaluate.errors import check_close
from kernelsmith.evaluate.validate import validate
from kernelsmith.ops import UnsupportedWorkload, get_op
from kernelsmith.ops.attention import OP, Attention
from kernelsmith.space import Config, Space
from kernelsmith.spec import OpSpec, TensorSpec
from kernelsmith.testing.kernels import covering_configs, launch_guarded

VARIANTS = [v.name for v in OP.variants]


def run_and_check(variant: str, spec: OpSpec, config: Config, inputs: tuple[torch.Tensor, ...] | None = None,
                  seed: int = 0, distribution: str = "normal", device: str = "cpu") -> torch.Tensor:
    """Launch into a NaN-filled output followed by NaN guards; check the output, the guards and
    that the inputs are untouched; return the output."""
    what = f"{variant} {config.key} {spec.describe()} {distribution}"
    if inputs is None:
        inputs = OP.make_inputs(spec, seed=seed, distribution=distribution, device=device)
    before = [t.clone() for t in inputs]
    (out,), (guard,) = launch_guarded(OP, variant, spec, config, inputs)
    assert all(torch.equal(a, b) for a, b in zip(inputs, before, strict=True)), f"{what}: inputs modified"
    assert bool(torch.isfinite(out).all()), f"{what}: elements never written"
    assert bool(torch.isnan(guard).all()), f"{what}: the kernel wrote past the end of its output"
    ref64, lowp = OP.reference_fp64(spec, inputs)[0], OP.reference(spec, inputs)[0]
    problem = check_close(out, ref64, lowp, OP.tolerance)
    assert problem is None, f"{what}: {problem}"
    return out


def fit(config: Config, space: Space) -> Config | None:
    """``config`` without the parameters ``space`` does not have (PACK_GQA without grouping), or
    None when it is not in ``space`` (split_kv has no config for long queries)."""
    names = {p.name for p in space.params}
    fitted = Config({k: v for k, v in config.items() if k in names})
    return fitted if fitted in space else None


@dataclass(frozen=True)
class Case:
    """One workload of the kernel tests: q is (batch, heads, q_len, head_dim) in the layout."""

    batch: int
    heads: int
    q_len: int
    dtype: str
    constants: dict[str, Any] = field(default_factory=dict)
    head_dim: int = 64

    def spec(self) -> OpSpec:
        return OP.spec((self.batch, self.heads, self.q_len, self.head_dim), self.dtype, **self.constants)


# Workloads the configs of one variant take in turn: S = 1, 9, 17, 33 and 129, query and key lengths
# that differ both ways (a decode step against a cache, causal Sq > Sk), causal and not, both
# layouts and both memory orders, boolean and additive masks of several broadcast shapes,
# grouped- and multi-query attention, every dtype.
CASES = (
    Case(1, 4, 17, "float16", {"causal": True, "kv_heads": 2}),
    Case(2, 2, 1, "bfloat16", {"layout": "bshd", "kv_len": 33, "kv_heads": 1}),
    Case(1, 2, 17, "float32", {"kv_len": 5, "mask": "boolean"}),
    Case(1, 4, 9, "bfloat16", {"kv_len": 40, "kv_heads": 1, "mask": "additive", "memory": "bshd"}),
    Case(1, 2, 129, "float16", {"layout": "bshd", "causal": True, "kv_heads": 1}),
    Case(2, 3, 33, "float32", {"causal": True, "kv_len": 17}),
    Case(1, 2, 129, "bfloat16", {"kv_len": 70, "mask": "boolean"}),
)


@pytest.mark.parametrize(
    "variant", [pytest.param(v, marks=pytest.mark.slow) if v == "split_kv" else v for v in VARIANTS]
)  # (split_kv's config classes take about 110 s in the interpreter: CI's slow part runs them)
def test_every_config_class_matches_the_reference(variant: str, device: str) -> None:
    # The covering set of a float32 grouped-query space: every BLOCK_M, BLOCK_N, warp count,
    # num_stages, TWO_LOOPS, PACK_GQA (and SPLITS / PROGRAMS_PER_SM). float32's shared-memory
    # constraint is the tightest, so each config is valid for every dtype.
    space = OP.variant(variant).space(Case(1, 4, 17, "float32", {"kv_heads": 2}).spec())
    configs = covering_configs(space)
    assert len(configs) >= 5
    ran = set()
    for i, config in enumerate(configs):
        # Two cases per config: the next ones it applies to, from case i and from case i + 3.
        for start in (i, i + len(CASES) // 2):
            for j in range(len(CASES)):
                case = CASES[(start + j) % len(CASES)]
                fitted = fit(config, OP.variant(variant).space(case.spec()))
                if fitted is not None:
                    break
            assert fitted is not None
            run_and_check(variant, case.spec(), fitted, seed=i, distribution=OP.distributions[(i + start) % 2],
                          device=device)
            ran.add(CASES.index(case))
    assert len(ran) == len(CASES) if variant != "split_kv" else len(ran) >= len(CASES) - 2


# Head dims 16 (the smallest), 128, 80 and 48 (padded to 128 and 64: masked channels), 256 (the
# largest), with a GQA pack, a mask, causal and not.
HEAD_CASES = (
    Case(1, 2, 17, "bfloat16", {"causal": True}, head_dim=16),
    Case(1, 4, 5, "float16", {"kv_heads": 2, "kv_len": 17}, head_dim=128),
    Case(2, 2, 9, "float32", {"layout": "bshd", "mask": "boolean", "kv_len": 12}, head_dim=80),
    Case(1, 2, 3, "bfloat16", {"causal": True, "kv_len": 20}, head_dim=256),
    Case(1, 3, 7, "float16", {"kv_heads": 1, "mask": "additive"}, head_dim=48),
)


@pytest.mark.parametrize("variant", VARIANTS)
def test_head_dims(variant: str, device: str) -> None:
    for i, case in enumerate(HEAD_CASES):
        spec = case.spec()
        configs = OP.variant(variant).space(spec).configs()
        if variant == "tma" and case.head_dim not in (16, 32, 64, 128, 256):
            assert not configs  # a tensor descriptor's block is a power of two wide
            continue
        config = configs[0] if i % 2 else configs[len(configs) // 2]
        run_and_check(variant, spec, config, seed=50 + i, distribution=OP.distributions[i % 2], device=device)


def _smallest(variant: str, spec: OpSpec, **params: Any) -> Config:
    return next(c for c in OP.variant(variant).space(spec) if params.items() <= c.items())


@pytest.mark.parametrize("variant", VARIANTS)
def test_fully_masked_rows_output_zeros(variant: str, device: str) -> None:
    # torch's safe softmax: a query whose every key is masked out gets 0, not NaN; so does one
    # whose additive mask is -inf throughout. Hugging Face's finfo.min mask is no such thing: it
    # is an ordinary softmax over very negative values.
    g = torch.Generator(device=device).manual_seed(7)
    q, k, v = (torch.randn(2, 3, n, 32, generator=g, device=device).half() for n in (9, 20, 20))
    boolean = torch.rand(2, 1, 9, 20, generator=g, device=device) < 0.7
    boolean[0, :, 3] = False
    boolean[1, :, 8] = False
    additive = torch.randn(9, 20, generator=g, device=device).half()
    additive[4] = float("-inf")
    lowest = torch.zeros(1, 1, 1, 20, device=device, dtype=torch.float32)
    lowest[..., 5:] = torch.finfo(torch.float32).min
    for inputs in ((q, k, v, boolean), (q, k, v, additive), (q.float(), k.float(), v.float(), lowest)):
        spec = OP.spec_for(*inputs)
        out = run_and_check(variant, spec, _smallest(variant, spec, TWO_LOOPS=True), inputs=inputs)
        if inputs[3] is boolean:
            assert torch.equal(out[0, :, 3], torch.zeros_like(out[0, :, 3]))
            assert torch.equal(out[1, :, 8], torch.zeros_like(out[1, :, 8]))
        elif inputs[3] is additive:
            assert torch.equal(out[:, :, 4], torch.zeros_like(out[:, :, 4]))
        else:
            assert float(out.abs().amin()) > 0  # every row attends (to the first 5 keys)


@pytest.mark.parametrize(
    ("variant", "config", "args"),
    [
        pytest.param("flash", Config(BLOCK_M=16, BLOCK_N=32, TWO_LOOPS=True, num_warps=2, num_stages=2),
                     ((2, 2, 5, 32), "float16", {"causal": True}), id="flash-causal"),
        pytest.param("persistent", Config(BLOCK_M=32, BLOCK_N=16, TWO_LOOPS=False, PACK_GQA=True, PROGRAMS_PER_SM=1,
                                          num_warps=1, num_stages=1),
                     ((1, 4, 6, 16), "bfloat16", {"layout": "bshd", "kv_heads": 2, "mask": "additive"}),
                     id="persistent-gqa-mask"),
        pytest.param("split_kv", Config(BLOCK_M=16, BLOCK_N=16, SPLITS=4, TWO_LOOPS=True, PACK_GQA=True,
                                        num_warps=1, num_stages=1),
                     ((2, 4, 1, 16), "float32", {"kv_heads": 1, "kv_len": 40, "memory": "bshd"}), id="split-decode"),
    ],
)
def test_the_harness_accepts_every_variant(variant: str, config: Config, args: tuple, device: str) -> None:
    shape, dtype, constants = args
    spec = OP.spec(shape, dtype, **constants)
    # validate raises Rejected on a wrong output, a canary the tolerance cannot tell apart, a torch
    # op in the launcher (split_kv's scratch buffers are allocations, which are allowed), modified
    # inputs or two runs that differ; it returns the number of runs.
    runs = validate(OP, spec, OP.variant(variant).build, config, device, lambda: None)
    assert runs == 2 * (len(OP.distributions) + len(OP.validation_specs(spec)) - 1)


# ---- the reference's semantics ------------------------------------------------------------------


def explicit_attention(q, k, v, mask=None, causal=False, scale=None):  # type: ignore[no-untyped-def]
    """softmax(q k^T * scale + bias) v in float64, with torch's documented masking (bhsd)."""
    q, k, v = q.double(), k.double(), v.double()
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    scores = q @ k.transpose(-2, -1) * (1 / math.sqrt(q.shape[-1]) if scale is None else scale)
    if causal:
        keep = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool).tril()
        scores = scores.masked_fill(~keep, float("-inf"))
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask.double()
    return torch.softmax(scores, -1) @ v


def test_reference_is_torch_sdpa(device: str) -> None:
    for constants in ({"causal": True, "kv_heads": 2, "kv_len": 11}, {"layout": "bshd", "mask": "additive"},
                      {"mask": "boolean", "kv_heads": 1, "scale": 0.3}):
        spec = OP.spec((2, 4, 7, 32), "bfloat16", **constants)
        inputs = OP.make_inputs(spec, seed=1, device=device)
        q, k, v = inputs[:3]
        mask = inputs[3] if len(inputs) == 4 else None
        if constants.get("layout") == "bshd":
            q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        expected = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=spec.const("causal"),
                                                  scale=spec.const("scale"), enable_gqa=k.shape[1] != q.shape[1])
        expected64 = explicit_attention(q, k, v, mask, spec.const("causal"), spec.const("scale"))
        if constants.get("layout") == "bshd":
            expected, expected64 = expected.transpose(1, 2), expected64.transpose(1, 2)
        (got,), (got64,) = OP.reference(spec, inputs), OP.reference_fp64(spec, inputs)
        assert torch.equal(got, expected) and got.is_contiguous() and got.dtype == torch.bfloat16
        assert torch.allclose(got64, expected64, atol=1e-12) and got64.dtype == torch.float64


def test_causal_is_aligned_to_the_top_left(device: str) -> None:
    # torch's is_causal with fewer queries than keys: query i sees keys 0..i only (query 0: key
    # 0, whose value it returns), not the whole cache as flash-attn's bottom-right causal would.
    spec = OP.spec((1, 2, 3, 16), "float32", causal=True, kv_len=10)
    q, k, v = OP.make_inputs(spec, seed=3, device=device)
    (ref64,) = OP.reference_fp64(spec, (q, k, v))
    assert torch.allclose(ref64[:, :, 0], v[:, :, 0].double(), atol=1e-12)
    config = _smallest("flash", spec)
    out = run_and_check("flash", spec, config, inputs=(q, k, v), device=device)
    assert torch.allclose(out[:, :, 0], v[:, :, 0], atol=1e-6)
    # More queries than keys: the queries past the keys see them all.
    longer = OP.spec((1, 2, 12, 16), "float32", causal=True, kv_len=4)
    inputs = OP.make_inputs(longer, seed=3, device=device)
    plain = OP.spec((1, 2, 12, 16), "float32", kv_len=4)
    assert torch.allclose(OP.reference_fp64(longer, inputs)[0][:, :, 3:], OP.reference_fp64(plain, inputs)[0][:, :, 3:])


def test_the_tolerance_catches_wrong_attention(device: str) -> None:
    spec = OP.spec((2, 4, 17, 32), "bfloat16", causal=True, kv_heads=2)
    q, k, v = OP.make_inputs(spec, seed=4, device=device)
    (ref64,), (lowp,) = OP.reference_fp64(spec, (q, k, v)), OP.reference(spec, (q, k, v))
    assert check_close(lowp, ref64, lowp, OP.tolerance) is None
    not_causal = OP.spec((2, 4, 17, 32), "bfloat16", kv_heads=2)
    other_scale = OP.spec((2, 4, 17, 32), "bfloat16", causal=True, kv_heads=2, scale=0.2)
    wrong = {
        "not causal": OP.reference(not_causal, (q, k, v))[0],
        "another scale": OP.reference(other_scale, (q, k, v))[0],
        "heads grouped the other way": OP.reference(spec, (q, k[:, [1, 0]], v[:, [1, 0]]))[0],
        "bottom-right causal": F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True).flip(2),
    }
    for name, out in wrong.items():
        assert check_close(out, ref64, lowp, OP.tolerance) is not None, f"{name} passes"


# ---- specs --------------------------------------------------------------------------------------


def test_spec_from_command_line_shape() -> None:
    spec = OP.spec((8, 32, 2048, 128), "bf16", causal=True, kv_heads=8)
    q, k, v = spec.inputs
    assert spec.op == "attention" and dict(spec.constants) == {"layout": "bhsd", "causal": True,
                                                                 "scale": 1 / math.sqrt(128)}
    assert q.shape == (8, 32, 2048, 128) and k.shape == v.shape == (8, 8, 2048, 128)
    assert q.is_contiguous and k.is_contiguous and q.dtype == "bfloat16"
    decode = OP.spec((4, 32, 1, 128), "fp16", layout="bshd", kv_len=4096, mask="boolean", scale=0.1)
    q, k, v, mask = decode.inputs
    assert q.shape == (4, 1, 32, 128) and k.shape == (4, 4096, 32, 128)
    assert mask == TensorSpec((4, 1, 1, 4096), "bool") and decode.const("scale") == 0.1
    hf = OP.spec((2, 4, 16, 64), "bf16", memory="bshd")  # Hugging Face's transposed view
    assert hf.inputs[0].strides == (16 * 4 * 64, 64, 4 * 64, 1)
    assert "BxHxSxD" in OP.shape_help and get_op("attention") is OP


def test_spec_for_matches_spec(device: str) -> None:
    spec = OP.spec((2, 4, 6, 32), "float16", kv_heads=2, kv_len=9, mask="additive")
    inputs = OP.make_inputs(spec, seed=0, device=device)
    assert OP.spec_for(*inputs) == spec
    assert OP.spec_for(*inputs, layout="bhsd", causal=False, scale=None) == spec
    q, k, v, mask = inputs
    # A mask expanded over the heads (stride 0) is the (B, 1, Sq, Sk) mask it expands.
    assert OP.spec_for(q, k, v, mask.expand(2, 4, 6, 9)).workload_hash == spec.workload_hash
    # Hugging Face's q: a (B, S, H, D) projection transposed to (B, H, S, D).
    q_hf = torch.zeros(2, 6, 4, 32, dtype=torch.float16, device=device).transpose(1, 2)
    k_hf = torch.zeros(2, 9, 2, 32, dtype=torch.float16, device=device).transpose(1, 2)
    hf = OP.spec_for(q_hf, k_hf, k_hf, mask)
    assert hf == OP.spec((2, 4, 6, 32), "float16", kv_heads=2, kv_len=9, mask="additive", memory="bshd") != spec
    # One position: the transposed view is plain contiguous memory, the same workload.
    one = OP.spec_for(torch.zeros(2, 1, 4, 32, dtype=torch.float16, device=device).transpose(1, 2), k, v)
    assert one == OP.spec((2, 4, 1, 32), "float16", kv_heads=2, kv_len=9)
    assert OpSpec.from_dict(hf.to_dict()).workload_hash == hf.workload_hash
    others = {OP.spec((2, 4, 6, 32), "float16", **c).workload_hash
              for c in ({"layout": "bshd"}, {"causal": True}, {"kv_heads": 1}, {"kv_len": 7}, {"scale": 1.0},
                        {"mask": "boolean"})}
    assert len(others) == 6 and OP.spec((2, 4, 6, 32), "float16").workload_hash not in others


def _qkv(q=(1, 2, 4, 16), k=None, dtype=torch.float16):  # type: ignore[no-untyped-def]
    k = k or q
    return [torch.zeros(q, dtype=dtype), torch.zeros(k, dtype=dtype), torch.zeros(k, dtype=dtype)]


@pytest.mark.parametrize(
    ("make", "constants"),
    [
        pytest.param(lambda: _qkv()[:2], {}, id="two-inputs"),
        pytest.param(lambda: [torch.zeros(2, 4, 16)] * 3, {}, id="3d"),
        pytest.param(lambda: _qkv(k=(1, 3, 4, 16)), {}, id="kv-heads-do-not-divide"),
        pytest.param(lambda: _qkv(q=(1, 2, 4, 24)), {}, id="head-dim-not-multiple-of-16"),
        pytest.param(lambda: _qkv(q=(1, 2, 4, 512)), {}, id="head-dim-512"),
        pytest.param(lambda: _qkv(k=(1, 2, 4, 32)), {}, id="k-head-dim"),
        pytest.param(lambda: _qkv(k=(2, 2, 4, 16)), {}, id="k-batch"),
        pytest.param(lambda: [*_qkv()[:2], torch.zeros(1, 2, 5, 16, dtype=torch.float16)], {}, id="v-length"),
        pytest.param(lambda: [*_qkv()[:2], torch.zeros(1, 2, 4, 16)], {}, id="v-dtype"),
        pytest.param(lambda: _qkv(dtype=torch.float64), {}, id="float64"),
        pytest.param(lambda: _qkv(q=(1, 2, 0, 16)), {}, id="empty"),
        pytest.param(lambda: [torch.zeros(1, 2, 4, 32, dtype=torch.float16)[..., ::2], *_qkv()[1:]], {},
                     id="strided-head-dim"),
        pytest.param(lambda: [torch.zeros(1, 1, 4, 16, dtype=torch.float16).expand(1, 2, 4, 16), *_qkv()[1:]], {},
                     id="expanded-q"),
        pytest.param(lambda: [*_qkv(), torch.zeros(4, 4)], {}, id="float32-mask-for-float16"),
        pytest.param(lambda: [*_qkv(), torch.zeros(4, 4, dtype=torch.int32)], {}, id="integer-mask"),
        pytest.param(lambda: [*_qkv(), torch.zeros(3, 4, dtype=torch.bool)], {}, id="mask-shape"),
        pytest.param(lambda: [*_qkv(), torch.zeros(4, dtype=torch.bool)], {}, id="1d-mask"),
        pytest.param(lambda: [*_qkv(), torch.zeros(1, 1, 1, 4, 4, dtype=torch.bool)], {}, id="5d-mask"),
        pytest.param(lambda: [*_qkv(), torch.ones(4, 4, dtype=torch.bool)], {"causal": True}, id="causal-and-mask"),
        pytest.param(_qkv, {"layout": "bsdh"}, id="bad-layout"),
        pytest.param(_qkv, {"causal": 1}, id="causal-not-bool"),
        pytest.param(_qkv, {"scale": float("inf")}, id="infinite-scale"),
        pytest.param(_qkv, {"dropout_p": 0.1}, id="unknown-constant"),
    ],
)
def test_spec_for_rejects_what_the_kernels_cannot_do(make, constants) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(UnsupportedWorkload):
        OP.spec_for(*make(), **constants)


def test_bad_specs_are_rejected() -> None:
    bad: list[tuple[tuple[int, ...], dict[str, Any]]] = [
        ((8, 32, 128), {}), ((8, 32, 0, 128), {}), ((1, 4, 8, 64), {"kv_heads": 3}), ((1, 4, 8, 64), {"kv_len": 0}),
        ((1, 4, 8, 72), {}), ((1, 4, 8, 64), {"layout": "hbsd"}), ((1, 4, 8, 64), {"mask": "float"}),
        ((1, 4, 8, 64), {"mask": "boolean", "causal": True}), ((1, 4, 8, 64), {"memory": "sbhd"}),
        ((1, 4, 8, 64), {"eps": 1.0}), ((1, 4, 8, 64), {"scale": "big"}),
    ]
    for shape, constants in bad:
        with pytest.raises(UnsupportedWorkload):
            OP.spec(shape, "bf16", **constants)
    with pytest.raises(UnsupportedWorkload):
        OP.spec((1, 4, 8, 64), "fp64")
    good = OP.spec((1, 4, 8, 64), "bf16")
    with pytest.raises(UnsupportedWorkload):  # a missing constant
        OP.check_supported(OpSpec("attention", good.inputs, {"layout": "bhsd", "causal": False}))
    with pytest.raises(UnsupportedWorkload):  # a mask broadcast by a zero stride instead of size 1
        OP.check_supported(OpSpec("attention", (*good.inputs, TensorSpec((1, 4, 8, 8), "bool", (64, 0, 8, 1))),
                                  dict(good.constants)))


def test_output_specs_bytes_and_flops() -> None:
    spec = OP.spec((8, 32, 2048, 128), "bfloat16", kv_heads=8)
    (out,) = OP.output_specs(spec)
    assert out == TensorSpec((8, 32, 2048, 128), "bfloat16") and out.is_contiguous
    q_bytes, kv_bytes = 8 * 32 * 2048 * 128 * 2, 8 * 8 * 2048 * 128 * 2
    assert OP.bytes_moved(spec) == 2 * q_bytes + 2 * kv_bytes  # q, k, v read once, the output written
    assert OP.flops(spec) == 4 * 8 * 32 * 2048 * 2048 * 128
    causal = OP.spec((8, 32, 2048, 128), "bfloat16", causal=True)
    assert OP.flops(causal) == 4 * 8 * 32 * 128 * (2048 * 2049 // 2)  # "half", exactly
    decode = OP.spec((1, 2, 3, 16), "float16", causal=True, kv_len=10)  # query i: keys 0..i
    assert OP.flops(decode) == 4 * 2 * 16 * (1 + 2 + 3)
    longer = OP.spec((1, 2, 6, 16), "float16", causal=True, kv_len=2)  # 1 + 2 + 2 + 2 + 2 + 2
    assert OP.flops(longer) == 4 * 2 * 16 * 11
    masked = OP.spec((2, 4, 6, 32), "float16", mask="additive", layout="bshd")
    assert OP.bytes_moved(masked) == (4 * 2 * 4 * 6 * 32 + 2 * 6 * 6) * 2
    assert OP.output_specs(masked)[0] == TensorSpec((2, 6, 4, 32), "float16")


def test_is_an_op_family() -> None:
    assert isinstance(OP, Attention) and OP.name == "attention"
    assert VARIANTS == ["flash", "persistent", "split_kv", "tma"]
    assert len({v.source_hash for v in OP.variants}) == len(OP.variants)


# ---- spaces and validation shapes ---------------------------------------------------------------


def test_spaces_do_not_depend_on_lengths_or_batch() -> None:
    base = OP.spec((2, 8, 64, 128), "bfloat16", kv_heads=2, causal=True)
    for variant in OP.variants:
        configs = set(variant.space(base))
        assert configs, variant.name
        for spec in OP.validation_specs(base)[1:]:
            assert set(variant.space(spec)) == configs, variant.name
        assert all("PACK_GQA" in c for c in configs)
    plain = OP.spec((1, 8, 64, 128), "bfloat16")
    assert all("PACK_GQA" not in c for v in OP.variants for c in v.space(plain))
    # The register and shared-memory budgets cut big tiles at D = 256 and in float32.
    wide = OP.spec((1, 8, 64, 256), "float32")
    assert len(OP.variant("flash").space(wide)) < len(OP.variant("flash").space(plain))
    # Key splitting is offered for short queries only; their tails are short too.
    long_query = OP.spec((1, 8, 129, 64), "float16")
    assert len(OP.variant("split_kv").space(long_query)) == 0
    decode = OP.spec((8, 32, 1, 128), "bfloat16", kv_heads=8, kv_len=4096)
    assert len(OP.variant("split_kv").space(decode)) > 0
    assert all(len(OP.variant("split_kv").space(s)) > 0 for s in OP.validation_specs(decode))


def test_validation_specs_keep_the_workload_kind() -> None:
    spec = OP.spec((4, 8, 100, 64), "float16", kv_heads=2, kv_len=300, mask="boolean", memory="bshd")
    target, one, odd = OP.validation_specs(spec)
    assert target == spec
    assert one == OP.spec((1, 8, 1, 64), "float16", kv_heads=2, kv_len=1, mask="boolean", memory="bshd")
    assert odd == OP.spec((2, 8, 67, 64), "float16", kv_heads=2, kv_len=67, mask="boolean", memory="bshd")
    short = OP.spec((1, 2, 1, 16), "bfloat16", layout="bshd", causal=True)
    assert [s.inputs[0].shape for s in OP.validation_specs(short)] == [(1, 1, 2, 16), (1, 3, 2, 16)]
    keys = OP.spec_for(*OP.make_inputs(OP.spec((2, 2, 5, 16), "float32"), seed=0, device="cpu"),
                       torch.ones(2, 1, 1, 5, dtype=torch.bool))
    assert [s.inputs[3].shape for s in OP.validation_specs(keys)] == [(2, 1, 1, 5), (1, 1, 1, 1), (2, 1, 1, 7)]


def test_calls_are_bucketed_by_powers_of_two() -> None:
    spec = OP.spec((3, 8, 1, 64), "bfloat16", kv_heads=2, kv_len=3000, memory="bshd", mask="boolean")
    bucket = OP.bucket(spec)
    assert bucket == OP.spec((4, 8, 1, 64), "bfloat16", kv_heads=2, kv_len=4096, memory="bshd", mask="boolean")
    assert OP.bucket(bucket) == bucket
    for variant in OP.variants:  # the bucket's configs are the call's
        assert set(variant.space(bucket)) <= set(variant.space(spec))
    prefill = OP.spec((8, 32, 1000, 128), "float16", causal=True)
    bucket = OP.bucket(prefill)
    assert bucket.inputs[0].shape == (8, 32, 1024, 128) and bucket.constants == prefill.constants


# ---- inputs -------------------------------------------------------------------------------------


def test_make_inputs_is_deterministic_by_seed(device: str) -> None:
    spec = OP.spec((2, 4, 5, 32), "bfloat16", kv_heads=2, kv_len=7, memory="bshd", mask="additive")
    for distribution in OP.distributions:
        a = OP.make_inputs(spec, seed=11, distribution=distribution, device=device)
        b = OP.make_inputs(spec, seed=11, distribution=distribution, device=device)
        c = OP.make_inputs(spec, seed=12, distribution=distribution, device=device)
        assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
        assert all(not torch.equal(x, y) for x, y in zip(a, c, strict=True))
        for tensor, tensor_spec in zip(a, spec.inputs, strict=True):
            assert TensorSpec.of(tensor) == tensor_spec
        mask = a[3]
        assert bool(torch.isinf(mask).any()) and bool(torch.isfinite(mask).any(-1).all())  # no row fully masked
    boolean = OP.spec((1, 2, 40, 16), "float16", kv_len=3, mask="boolean")
    mask = OP.make_inputs(boolean, seed=0, device=device)[3]
    assert mask.dtype == torch.bool and bool(mask.any(-1).all()) and not bool(mask.all())
    with pytest.raises(ValueError):
        OP.make_inputs(boolean, seed=0, distribution="uniform", device=device)


# ---- the tma variant reads through descriptors where it can, through pointers where it cannot --------

TMA_CASES = (
    Case(2, 4, 17, "bfloat16", {"causal": True, "kv_heads": 2}),  # (B, H, S, D) memory, GQA
    Case(2, 2, 9, "float16", {"layout": "bshd", "kv_len": 33}),  # (B, S, H, D) memory: heads side by side
    Case(1, 4, 9, "float32", {"kv_len": 40, "kv_heads": 2, "mask": "additive", "memory": "bshd"}),  # HF's view
    Case(1, 2, 33, "bfloat16", {"kv_len": 70, "mask": "boolean"}, head_dim=32),
)


@pytest.mark.parametrize("case", TMA_CASES, ids=lambda c: c.spec().describe())
def test_tma_reads_k_and_v_through_descriptors(case: Case, monkeypatch: pytest.MonkeyPatch, device: str) -> None:
    from kernelsmith.ops import _attention_launch as attention

    addressed: list[Any] = []  # what the launcher learned of k and v: None would mean pointer loads
    real = attention._descriptor_rows
    monkeypatch.setattr(attention, "_descriptor_rows", lambda t, layout: addressed.append(real(t, layout)) or
                        addressed[-1])  # fmt: skip
    spec = case.spec()
    configs = OP.variant("tma").space(spec).configs()
    for i, config in enumerate((configs[0], configs[len(configs) // 2], configs[-1])):
        run_and_check("tma", spec, config, seed=70 + i, distribution=OP.distributions[i % 2], device=device)
    assert len(addressed) >= 6 and None not in addressed  # k and v through descriptors on every call


def test_tma_values_past_the_keys_cannot_poison_the_output(device: str) -> None:
    """A block that runs past Sk reads the next head's values; an infinite value there must not
    turn the masked (zero) probabilities into NaN."""
    spec = Case(1, 2, 5, "float32", {"kv_len": 9}, head_dim=16).spec()
    q, k, v = OP.make_inputs(spec, seed=3, device=device)
    v = v.clone()
    v[:, 1, 0, :] = float("inf")  # head 1's first value: read by head 0's padded block
    config = _smallest("tma", spec, BLOCK_N=16)
    (out,), _ = launch_guarded(OP, "tma", spec, config, (q, k, v))
    assert bool(torch.isfinite(out[:, 0]).all())
    ref = OP.reference_fp64(spec, (q, k, v))[0]
    assert torch.allclose(out[:, 0].double(), ref[:, 0], rtol=1e-4, atol=1e-4)


def test_tma_falls_back_to_pointers_for_unaligned_storage(device: str) -> None:
    spec = Case(1, 2, 9, "bfloat16", {}, head_dim=32).spec()
    q, k, v = OP.make_inputs(spec, seed=4, device=device)
    shifted = torch.empty(k.numel() + 1, dtype=k.dtype, device=device)[1:].view(k.shape)  # 2 bytes off
    shifted.copy_(k)
    from kernelsmith.ops._attention_launch import _descriptor_rows

    assert _descriptor_rows(k, "bhsd") is not None and _descriptor_rows(shifted, "bhsd") is None
    config = OP.variant("tma").space(spec).configs()[0]
    run_and_check("tma", spec, config, inputs=(q, shifted, v), device=device)

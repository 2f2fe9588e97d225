"""RoPE: specs, inputs, the reference, the spaces, and every variant's kernel.

Without a GPU the kernels run in the Triton interpreter (tests/conftest.py sets it up), which is
slow: shapes stay small (B 1-2, H 1-3, S 1, 7, 33), and instead of every config each variant runs
a *covering* set, in which every value of every parameter appears at least once. Every kernel run
writes into NaN-filled outputs followed by NaN guards, and both outputs are compared with the
float64 reference under the harness's own tolerance (``check_close``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import pytest
import torch

from kernelsmith.evaluate.errors import check_close
from kernelsmith.evaluate.validate import validate
from kernelsmith.ops import UnsupportedWorkload
from kernelsmith.ops.rope import OP, RoPE
from kernelsmith.space import Config
from kernelsmith.spec import OpSpec, TensorSpec
from kernelsmith.testing.kernels import covering_configs

VARIANTS = [v.name for v in OP.variants]
STYLES = ("half", "interleaved")
GUARD = 32  # NaN elements after each output: a kernel writing past its end overwrites them


def run_and_check(variant: str, spec: OpSpec, config: Config, seed: int = 0, distribution: str = "normal",
                  device: str = "cpu") -> None:
    """Launch into NaN-filled outputs followed by NaN guards; check both outputs, the guards and
    that the inputs are untouched."""
    what = f"{variant} {config.key} {spec.describe()} {distribution}"
    inputs = OP.make_inputs(spec, seed=seed, distribution=distribution, device=device)
    before = [t.clone() for t in inputs]
    outputs, guards = [], []
    for out_spec in OP.output_specs(spec):
        buffer = torch.full((out_spec.numel + GUARD,), math.nan, dtype=out_spec.torch_dtype, device=device)
        outputs.append(buffer[: out_spec.numel].view(out_spec.shape))
        guards.append(buffer[out_spec.numel :])
    OP.variant(variant).build(spec, config)(inputs, outputs)
    assert all(torch.equal(a, b) for a, b in zip(inputs, before, strict=True)), f"{what}: inputs modified"
    refs64 = OP.reference_fp64(spec, inputs)
    lowps = OP.reference(spec, inputs)
    for name, out, guard, ref64, lowp in zip(("q_out", "k_out"), outputs, guards, refs64, lowps, strict=True):
        assert bool(torch.isfinite(out).all()), f"{what}: {name} has elements never written"
        assert bool(torch.isnan(guard).all()), f"{what}: the kernel wrote past the end of {name}"
        problem = check_close(out, ref64, lowp, OP.tolerance)
        assert problem is None, f"{what}: {name}: {problem}"


@dataclass(frozen=True)
class Case:
    """One workload of the kernel tests (spec arguments besides heads and head_dim)."""

    batch: int
    seq: int
    dtype: str
    layout: str = "bhsd"
    memory: str | None = None
    kv_heads: int | None = None
    batched_cos: bool = False

    def spec(self, heads: int, head_dim: int, style: str, rotary_dim: int | None = None) -> OpSpec:
        return OP.spec((self.batch, heads, self.seq, head_dim), self.dtype, layout=self.layout, style=style,
                       kv_heads=self.kv_heads, rotary_dim=rotary_dim, memory=self.memory,
                       batched_cos=self.batched_cos)


# Workloads the configs of one case take in turn: both layouts in both memory orders (bshd
# memory under the bhsd layout is Hugging Face's q.transpose(1, 2)), grouped-query k (1 head for
# 3), per-sequence (B, S, R) caches, 1, 7 and 33 positions, and every dtype.
CASES = (
    Case(1, 7, "float32"),
    Case(2, 1, "bfloat16", layout="bshd", kv_heads=1, batched_cos=True),
    Case(1, 33, "float16", memory="bshd"),
    Case(2, 7, "float16", layout="bshd", memory="bhsd", kv_heads=1, batched_cos=True),
    Case(1, 1, "bfloat16", kv_heads=1),
    Case(2, 7, "bfloat16", layout="bshd", kv_heads=3),
)


# ---- the kernels --------------------------------------------------------------------------------


@pytest.mark.parametrize("style", STYLES)
@pytest.mark.parametrize("variant", VARIANTS)
def test_every_config_class_matches_the_reference(variant: str, style: str, device: str) -> None:
    # 3 heads of 64 channels: BLOCK_H 1, 2 and 4 (one program or loop step may hold more heads
    # than exist), every BLOCK_S, every warp count, every num_stages and both PAIRS.
    space = OP.variant(variant).space(CASES[0].spec(3, 64, style))
    configs = covering_configs(space)
    assert len(configs) >= 3
    for i, config in enumerate(configs):
        case = CASES[i % len(CASES)]
        spec = case.spec(3, 64, style)
        assert config in OP.variant(variant).space(spec)  # spaces do not depend on B, S or layout
        run_and_check(variant, spec, config, seed=i, distribution=OP.distributions[i % 2], device=device)


# (heads, head_dim, rotary_dim, case): head dims 16 and 128, a single head, partial rotary (only
# 32 of 96 channels rotate, the rest pass through), a rotated part of 80 channels (40 pairs: a
# masked, non power of two block), and the smallest head (one pair).
HEAD_CASES = (
    (1, 16, None, Case(2, 7, "bfloat16", batched_cos=True)),
    (2, 128, None, Case(1, 7, "float16", layout="bshd", kv_heads=1)),
    (3, 96, 32, Case(1, 7, "float32", memory="bshd")),
    (2, 80, None, Case(2, 1, "bfloat16", layout="bshd", memory="bhsd", kv_heads=2)),
    (1, 2, None, Case(1, 7, "float32")),
)


@pytest.mark.parametrize("style", STYLES)
@pytest.mark.parametrize("variant", VARIANTS)
def test_head_dims_and_partial_rotary(variant: str, style: str, device: str) -> None:
    for i, (heads, head_dim, rotary_dim, case) in enumerate(HEAD_CASES):
        spec = case.spec(heads, head_dim, style, rotary_dim)
        configs = OP.variant(variant).space(spec).configs()
        config = configs[0] if i % 2 else configs[-1]
        run_and_check(variant, spec, config, seed=100 + i, distribution=OP.distributions[i % 2], device=device)


@pytest.mark.parametrize(
    ("variant", "config", "args"),
    [
        pytest.param("per_head", Config(BLOCK_H=2, num_warps=1), ((2, 2, 3, 16), "float16", {"kv_heads": 1}),
                     id="per_head-gqa"),
        pytest.param("per_token", Config(BLOCK_H=1, PAIRS="split", num_warps=1, num_stages=2),
                     ((2, 2, 3, 16), "bfloat16", {"layout": "bshd", "style": "interleaved", "batched_cos": True}),
                     id="per_token-interleaved"),
        pytest.param("blocked_seq", Config(BLOCK_S=4, num_warps=1),
                     ((1, 2, 6, 16), "float32", {"memory": "bshd", "rotary_dim": 8}), id="blocked_seq-hf-partial"),
    ],
)
def test_the_harness_accepts_every_variant(variant: str, config: Config, args: tuple, device: str) -> None:
    shape, dtype, constants = args
    spec = OP.spec(shape, dtype, **constants)
    # validate raises Rejected on a wrong output, a canary the tolerance cannot tell apart, a torch
    # op in the launcher, modified inputs or two runs that differ; it returns the number of runs.
    runs = validate(OP, spec, OP.variant(variant).build, config, device, lambda: None)
    assert runs == 2 * (len(OP.distributions) + len(OP.validation_specs(spec)) - 1)


# ---- the reference and the tolerance ------------------------------------------------------------


def hf_rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


def hf_apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):  # type: ignore[no-untyped-def]
    """transformers' Llama apply_rotary_pos_emb, verbatim."""
    cos = cos.unsqueeze(unsqueeze_dim)
    sin = sin.unsqueeze(unsqueeze_dim)
    q_embed = (q * cos) + (hf_rotate_half(q) * sin)
    k_embed = (k * cos) + (hf_rotate_half(k) * sin)
    return q_embed, k_embed


def test_reference_is_hugging_face_apply_rotary_pos_emb(device: str) -> None:
    for layout, unsqueeze_dim in (("bhsd", 1), ("bshd", 2)):
        spec = OP.spec((2, 4, 5, 32), "bfloat16", layout=layout, kv_heads=2, batched_cos=True)
        q, k, cos, sin = OP.make_inputs(spec, seed=1, device=device)
        got = OP.reference(spec, (q, k, cos, sin))
        expected = hf_apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim)
        assert all(torch.equal(a, b) for a, b in zip(got, expected, strict=True))
        assert got[0].dtype == torch.bfloat16 and got[1].shape == k.shape
        # An (S, R) cache is the (1, S, R) one of position ids shared by the batch.
        shared = OP.spec((2, 4, 5, 32), "bfloat16", layout=layout, kv_heads=2)
        q, k, cos, sin = OP.make_inputs(shared, seed=1, device=device)
        assert cos.shape == (5, 32)
        expected = hf_apply_rotary_pos_emb(q, k, cos[None], sin[None], unsqueeze_dim)
        assert all(torch.equal(a, b) for a, b in zip(OP.reference(shared, (q, k, cos, sin)), expected, strict=True))


def test_interleaved_is_the_complex_rotation_of_pairs(device: str) -> None:
    # Meta's Llama: pairs (x[2i], x[2i+1]) as complex numbers times exp(1j * angle_i), the angle
    # read from the cache, in which cos[..., 2i] == cos[..., 2i + 1] (GPT-J's repeat_interleave).
    spec = OP.spec((1, 2, 6, 16), "float32", style="interleaved", kv_heads=1)
    q, k, cos, sin = OP.make_inputs(spec, seed=2, device=device)
    assert torch.equal(cos[..., 0::2], cos[..., 1::2]) and torch.equal(sin[..., 0::2], sin[..., 1::2])
    rotation = torch.complex(cos[..., 0::2].double(), sin[..., 0::2].double())  # (S, D/2)
    q64, k64 = OP.reference_fp64(spec, (q, k, cos, sin))
    for x, y in ((q, q64), (k, k64)):
        pairs = torch.view_as_complex(x.double().reshape(*x.shape[:-1], -1, 2).contiguous())
        expected = torch.view_as_real(pairs * rotation).flatten(-2)
        assert torch.allclose(y, expected, atol=1e-12)


def test_partial_rotary_passes_the_other_channels_through(device: str) -> None:
    spec = OP.spec((1, 2, 3, 24), "float16", rotary_dim=8)
    q, k, cos, sin = OP.make_inputs(spec, seed=3, device=device)
    assert cos.shape == (3, 8)
    q_out, k_out = OP.reference(spec, (q, k, cos, sin))
    assert torch.equal(q_out[..., 8:], q[..., 8:]) and torch.equal(k_out[..., 8:], k[..., 8:])
    full = OP.spec((1, 2, 3, 8), "float16")
    rotated = OP.reference(full, (q[..., :8].contiguous(), k[..., :8].contiguous(), cos, sin))
    assert torch.equal(q_out[..., :8], rotated[0]) and torch.equal(k_out[..., :8], rotated[1])


@pytest.mark.parametrize("style", STYLES)
def test_the_tolerance_catches_the_wrong_rotation(style: str, device: str) -> None:
    spec = OP.spec((2, 2, 9, 32), "bfloat16", style=style)
    q, k, cos, sin = OP.make_inputs(spec, seed=4, device=device)
    refs64 = OP.reference_fp64(spec, (q, k, cos, sin))
    lowps = OP.reference(spec, (q, k, cos, sin))
    other = OP.spec((2, 2, 9, 32), "bfloat16", style="half" if style == "interleaved" else "interleaved")
    wrong = {
        "identity": (q, k),
        "inverse rotation": OP.reference(spec, (q, k, cos, -sin)),
        "other style": OP.reference(other, (q, k, cos, sin)),
        "positions shifted": OP.reference(spec, (q, k, cos.roll(1, 0), sin.roll(1, 0))),
    }
    for out, ref64, lowp in zip(lowps, refs64, lowps, strict=True):
        assert check_close(out, ref64, lowp, OP.tolerance) is None
    for name, outs in wrong.items():
        for i, (out, ref64, lowp) in enumerate(zip(outs, refs64, lowps, strict=True)):
            assert check_close(out, ref64, lowp, OP.tolerance) is not None, f"{name} passes for output {i}"


# ---- specs --------------------------------------------------------------------------------------


def test_spec_from_command_line_shape() -> None:
    spec = OP.spec((8, 32, 2048, 128), "bf16", kv_heads=8)
    q, k, cos, sin = spec.inputs
    assert spec.op == "rope" and dict(spec.constants) == {"layout": "bhsd", "style": "half"}
    assert q.shape == (8, 32, 2048, 128) and k.shape == (8, 8, 2048, 128)
    assert cos == sin == TensorSpec((2048, 128), "bfloat16")
    assert q.is_contiguous and k.is_contiguous
    bshd = OP.spec((8, 32, 2048, 128), "fp16", layout="bshd", style="interleaved", rotary_dim=64, batched_cos=True)
    q, k, cos, _ = bshd.inputs
    assert q.shape == k.shape == (8, 2048, 32, 128) and cos.shape == (8, 2048, 64)
    assert dict(bshd.constants) == {"layout": "bshd", "style": "interleaved"}
    # Hugging Face's transposed view: (B, H, S, D) in bshd memory.
    hf = OP.spec((2, 4, 16, 64), "bf16", memory="bshd")
    assert hf.inputs[0].strides == (16 * 4 * 64, 64, 4 * 64, 1)
    assert "BxHxSxD" in OP.shape_help


def test_spec_for_matches_spec(device: str) -> None:
    b, h, hk, s, d = 2, 4, 2, 6, 32
    spec = OP.spec((b, h, s, d), "bfloat16", kv_heads=hk)
    q, k, cos, sin = OP.make_inputs(spec, seed=0, device=device)
    assert OP.spec_for(q, k, cos, sin) == spec
    assert OP.spec_for(q, k, cos, sin, layout="bhsd", style="half", kv_heads=hk, rotary_dim=d) == spec
    # (1, S, D) caches and caches expanded over the batch are the same shared (S, D) table.
    assert OP.spec_for(q, k, cos[None], sin[None]).workload_hash == spec.workload_hash
    assert OP.spec_for(q, k, cos.expand(b, s, d), sin.expand(b, s, d)) == spec
    batched = OP.spec_for(q, k, cos.repeat(b, 1, 1), sin.repeat(b, 1, 1))
    assert batched == OP.spec((b, h, s, d), "bfloat16", kv_heads=hk, batched_cos=True) != spec
    # Hugging Face's q and k: projections viewed as (B, S, H, D) and transposed to (B, H, S, D).
    q_hf = torch.zeros(b, s, h, d, dtype=torch.bfloat16, device=device).transpose(1, 2)
    k_hf = torch.zeros(b, s, hk, d, dtype=torch.bfloat16, device=device).transpose(1, 2)
    hf = OP.spec_for(q_hf, k_hf, cos, sin)
    assert hf == OP.spec((b, h, s, d), "bfloat16", kv_heads=hk, memory="bshd") and hf != spec
    assert OP.spec_for(q_hf, k, cos, sin).inputs[1].is_contiguous  # each of q and k on its own
    # A transposed view with one position is plain contiguous memory: the same workload.
    q_one = torch.zeros(b, 1, h, d, dtype=torch.bfloat16, device=device).transpose(1, 2)
    k_one = torch.zeros(b, 1, hk, d, dtype=torch.bfloat16, device=device).transpose(1, 2)
    one = OP.spec_for(q_one, k_one, cos[:1], sin[:1])
    assert one == OP.spec((b, h, 1, d), "bfloat16", kv_heads=hk)
    bshd = OP.spec((b, h, s, d), "float32", layout="bshd", style="interleaved")
    assert OP.spec_for(*OP.make_inputs(bshd, seed=0, device=device), layout="bshd", style="interleaved") == bshd
    assert OpSpec.from_dict(hf.to_dict()).workload_hash == hf.workload_hash
    others = {OP.spec((b, h, s, d), "bfloat16", **c).workload_hash
              for c in ({"layout": "bshd"}, {"style": "interleaved"}, {"rotary_dim": 16}, {"kv_heads": 4})}
    assert len(others) == 4 and spec.workload_hash not in others


def _tensors(q_shape=(1, 2, 3, 8), k_shape=None, cos_shape=(3, 8), dtype=torch.float32):  # type: ignore[no-untyped-def]
    k_shape = k_shape or q_shape
    return [torch.zeros(q_shape, dtype=dtype), torch.zeros(k_shape, dtype=dtype),
            torch.zeros(cos_shape, dtype=dtype), torch.zeros(cos_shape, dtype=dtype)]


def _with(index: int, tensor: torch.Tensor) -> list[torch.Tensor]:
    tensors = _tensors()
    tensors[index] = tensor
    return tensors


@pytest.mark.parametrize(
    ("make", "constants"),
    [
        pytest.param(lambda: _tensors()[:3], {}, id="three-inputs"),
        pytest.param(lambda: _tensors(q_shape=(2, 3, 8), cos_shape=(3, 8)), {}, id="3d-q"),
        pytest.param(lambda: _tensors(k_shape=(1, 3, 3, 8)), {}, id="k-heads-do-not-divide"),
        pytest.param(lambda: _tensors(k_shape=(1, 2, 3, 16)), {}, id="k-head-dim"),
        pytest.param(lambda: _tensors(k_shape=(2, 2, 3, 8)), {}, id="k-batch"),
        pytest.param(lambda: _tensors(cos_shape=(4, 8)), {}, id="cos-positions"),
        pytest.param(lambda: _tensors(cos_shape=(3, 3)), {}, id="odd-rotary-dim"),
        pytest.param(lambda: _tensors(cos_shape=(3, 16)), {}, id="rotary-dim-above-head-dim"),
        pytest.param(lambda: _tensors(cos_shape=(2, 3, 8)), {}, id="cos-batch"),
        pytest.param(lambda: _tensors(cos_shape=(1, 1, 3, 8)), {}, id="4d-cos"),
        pytest.param(lambda: _with(3, torch.zeros(3, 4)), {}, id="sin-shape"),
        pytest.param(lambda: _with(1, torch.zeros(1, 2, 3, 8, dtype=torch.float16)), {}, id="dtypes"),
        pytest.param(lambda: _tensors(dtype=torch.float64), {}, id="float64"),
        pytest.param(lambda: _tensors(dtype=torch.int32), {}, id="int32"),
        pytest.param(lambda: _with(0, torch.zeros(1, 2, 3, 16)[..., ::2]), {}, id="strided-channels"),
        pytest.param(lambda: _with(0, torch.zeros(1, 2, 3, 16)[..., :8]), {}, id="padded-rows"),
        pytest.param(lambda: [torch.zeros(3, 2, 2, 8).permute(1, 2, 0, 3), *_tensors(q_shape=(2, 2, 3, 8))[1:]], {},
                     id="sbhd-memory"),
        pytest.param(lambda: _with(2, torch.zeros(3, 16)[:, :8]), {}, id="strided-cos"),
        pytest.param(lambda: _tensors(q_shape=(1, 2, 0, 8), cos_shape=(0, 8)), {}, id="empty"),
        pytest.param(_tensors, {"layout": "bsdh"}, id="bad-layout"),
        pytest.param(_tensors, {"style": "neox"}, id="bad-style"),
        pytest.param(_tensors, {"kv_heads": 1}, id="kv-heads-mismatch"),
        pytest.param(_tensors, {"rotary_dim": 4}, id="rotary-dim-mismatch"),
        pytest.param(_tensors, {"eps": 1e-6}, id="unknown-constant"),
        pytest.param(_tensors, {"layout": "bshd"}, id="bshd-positions"),
    ],
)
def test_spec_for_rejects_what_the_kernels_cannot_do(make, constants) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(UnsupportedWorkload):
        OP.spec_for(*make(), **constants)


def test_bad_specs_are_rejected() -> None:
    bad: list[tuple[tuple[int, ...], dict[str, Any]]] = [
        ((8, 32, 128), {}), ((8, 32, 0, 128), {}), ((1, 4, 8, 64), {"kv_heads": 3}),
        ((1, 4, 8, 64), {"kv_heads": 0}), ((1, 4, 8, 64), {"rotary_dim": 65}), ((1, 4, 8, 64), {"rotary_dim": 128}),
        ((1, 4, 8, 2048), {}), ((1, 4, 8, 64), {"layout": "hbsd"}), ((1, 4, 8, 64), {"memory": "sbhd"}),
        ((1, 4, 8, 64), {"style": "rotate"}), ((1, 4, 8, 64), {"batched_cos": "yes"}),
        ((1, 4, 8, 64), {"eps": 1.0}),
    ]
    for shape, constants in bad:
        with pytest.raises(UnsupportedWorkload):
            OP.spec(shape, "bf16", **constants)
    with pytest.raises(UnsupportedWorkload):
        OP.spec((1, 4, 8, 64), "fp64")
    good = OP.spec((1, 4, 8, 64), "bf16")
    q, k, cos, sin = good.inputs
    with pytest.raises(UnsupportedWorkload):  # a non-canonical (1, S, R) cache spec
        OP.check_supported(OpSpec("rope", (q, k, cos.with_shape((1, 8, 64)), sin.with_shape((1, 8, 64))),
                                  dict(good.constants)))
    with pytest.raises(UnsupportedWorkload):  # k in another dtype than q
        OP.check_supported(OpSpec("rope", (q, TensorSpec(k.shape, "float16"), cos, sin), dict(good.constants)))
    with pytest.raises(UnsupportedWorkload):  # a missing constant
        OP.check_supported(OpSpec("rope", good.inputs, {"layout": "bhsd"}))


def test_output_specs_bytes_and_flops() -> None:
    spec = OP.spec((8, 32, 2048, 128), "bfloat16", kv_heads=8)
    q_out, k_out = OP.output_specs(spec)
    assert (q_out.shape, k_out.shape) == ((8, 32, 2048, 128), (8, 8, 2048, 128))
    assert q_out.dtype == k_out.dtype == "bfloat16" and q_out.is_contiguous and k_out.is_contiguous
    q_bytes, k_bytes, table_bytes = 8 * 32 * 2048 * 128 * 2, 8 * 8 * 2048 * 128 * 2, 2048 * 128 * 2
    # q and k read and written once, cos and sin read once
    assert OP.bytes_moved(spec) == 2 * q_bytes + 2 * k_bytes + 2 * table_bytes
    assert OP.flops(spec) == 3 * 8 * 2048 * (32 + 8) * 128
    partial = OP.spec((2, 4, 16, 64), "float32", rotary_dim=16, batched_cos=True)
    assert OP.bytes_moved(partial) == (4 * 2 * 4 * 16 * 64 + 2 * 2 * 16 * 16) * 4
    assert OP.flops(partial) == 3 * 2 * 16 * 8 * 16
    hf = OP.spec((2, 4, 16, 64), "float16", memory="bshd")
    assert [t.is_contiguous for t in OP.output_specs(hf)] == [True, True]
    assert OP.bytes_moved(hf) == OP.bytes_moved(OP.spec((2, 4, 16, 64), "float16"))


def test_is_an_op_family() -> None:
    assert isinstance(OP, RoPE) and OP.name == "rope"
    assert VARIANTS == ["per_head", "per_token", "blocked_seq"]
    assert len({v.source_hash for v in OP.variants}) == len(OP.variants)


# ---- inputs -------------------------------------------------------------------------------------


@pytest.mark.parametrize("style", STYLES)
def test_make_inputs_is_deterministic_by_seed(style: str, device: str) -> None:
    spec = OP.spec((2, 4, 5, 32), "bfloat16", style=style, kv_heads=2, memory="bshd", batched_cos=True)
    for distribution in OP.distributions:
        a = OP.make_inputs(spec, seed=11, distribution=distribution, device=device)
        b = OP.make_inputs(spec, seed=11, distribution=distribution, device=device)
        c = OP.make_inputs(spec, seed=12, distribution=distribution, device=device)
        assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
        assert all(not torch.equal(x, y) for x, y in zip(a, c, strict=True))  # even the positions move
        for tensor, tensor_spec in zip(a, spec.inputs, strict=True):
            assert TensorSpec.of(tensor) == tensor_spec  # shapes, strides and dtype of the spec
            assert tensor.device.type == torch.device(device).type
        cos, sin = a[2], a[3]
        assert torch.allclose(cos.float() ** 2 + sin.float() ** 2, torch.ones_like(cos.float()), atol=2e-2)
        assert not torch.equal(cos[0], cos[1])  # (B, S, R) caches: each sequence its own positions
        first, second = (cos[..., :16], cos[..., 16:]) if style == "half" else (cos[..., 0::2], cos[..., 1::2])
        assert torch.equal(first, second)


def test_inputs_rotate_substantially(device: str) -> None:
    # The harness's identity canary must fail even for one position of one pair: the first angle
    # is kept at least pi/3 from a multiple of 2 pi.
    for seed in range(20):
        spec = OP.spec((1, 1, 1, 2), "bfloat16")
        q, k, cos, sin = OP.make_inputs(spec, seed=seed, device=device)
        assert float(cos.float().max()) <= 0.51
        (ref64, _), (lowp, _) = OP.reference_fp64(spec, (q, k, cos, sin)), OP.reference(spec, (q, k, cos, sin))
        assert check_close(q, ref64, lowp, OP.tolerance) is not None
    # Positions start in the thousands: the fastest pair's angle runs through every value.
    spec = OP.spec((1, 1, 64, 128), "float32")
    _, _, cos, _ = OP.make_inputs(spec, seed=0, device=device)
    assert float(cos[:, 0].min()) < -0.9 and float(cos[:, 0].max()) > 0.9


def test_outliers_inflate_a_few_channels(device: str) -> None:
    spec = OP.spec((1, 4, 64, 64), "float16")
    normal = OP.make_inputs(spec, seed=5, distribution="normal", device=device)[0].float()
    outliers = OP.make_inputs(spec, seed=5, distribution="outliers", device=device)[0].float()
    channel_std = outliers.std(dim=(0, 1, 2))
    assert 1 <= int((channel_std > 10).sum()) <= 2 and float(normal.std(dim=(0, 1, 2)).max()) < 1.5
    with pytest.raises(ValueError, match="distribution"):
        OP.make_inputs(spec, seed=0, distribution="cauchy", device=device)


# ---- spaces, buckets and validation shapes -----------------------------------------------------


def test_space_sizes_are_modest() -> None:
    sizes = {}
    for style in STYLES:
        spec = OP.spec((8, 32, 2048, 128), "bfloat16", style=style)
        sizes[style] = {v.name: len(v.space(spec)) for v in OP.variants}
        assert 30 <= sum(sizes[style].values()) <= 200, sizes
    assert sizes["half"] == {"per_head": 20, "per_token": 56, "blocked_seq": 18}
    assert all(sizes["interleaved"][v] == 2 * sizes["half"][v] for v in VARIANTS)  # PAIRS doubles them


@pytest.mark.parametrize(
    ("shape", "constants"),
    [((1, 1, 1, 2), {}), ((1, 1, 1, 16), {"style": "interleaved"}), ((2, 3, 7, 80), {}),
     ((1, 64, 4, 1024), {"kv_heads": 8}), ((1, 128, 1, 256), {"rotary_dim": 64})],
)
def test_spaces_are_non_empty_and_valid(shape: tuple[int, ...], constants: dict) -> None:
    spec = OP.spec(shape, "float16", **constants)
    for variant in OP.variants:
        space = variant.space(spec)
        assert len(space) > 0, f"{variant.name} has no config for {spec.describe()}"
        for config in space:
            assert space.violations(config) == []
            assert config["num_warps"] in (1, 2, 4, 8)
            assert ("num_stages" in config) == (variant.name == "per_token")  # only the loop pipelines
            assert ("PAIRS" in config) == (spec.const("style") == "interleaved")
            if "BLOCK_H" in config:
                assert config["BLOCK_H"] <= max(1, 1 << (shape[1] - 1).bit_length())
    assert {c["BLOCK_H"] for c in OP.variant("per_head").space(OP.spec((1, 3, 8, 64), "bf16"))} == {1, 2, 4}
    with pytest.raises(ValueError, match="not in the space"):
        OP.variant("per_head").build(spec, Config(BLOCK_H=3, num_warps=1))


def test_validation_specs_vary_batch_and_length_and_share_the_space() -> None:
    spec = OP.spec((4, 8, 100, 64), "float16", layout="bshd", memory="bhsd", kv_heads=2, batched_cos=True,
                   style="interleaved")
    tails = OP.validation_specs(spec)
    assert tails[0] == spec
    seen = set()
    for tail in tails[1:]:
        b, s, h, d = tail.inputs[0].shape
        seen.add((b, s))
        assert (h, d) == (8, 64) and tail.inputs[1].shape == (b, s, 2, d)
        assert dict(tail.constants) == dict(spec.constants)
        assert tail.inputs[2].shape == ((b, s, 64) if b > 1 else (s, 64))
        if s > 1:  # still the transposed memory order (with one position it is plain contiguous)
            assert not tail.inputs[0].is_contiguous
        OP.check_supported(tail)
        for variant in OP.variants:
            assert variant.space(tail).configs() == variant.space(spec).configs()
    assert seen == {(1, 1), (2, 7), (1, 67)}
    small = OP.validation_specs(OP.spec((1, 2, 7, 16), "float32"))
    assert [t.inputs[0].shape[2] for t in small] == [7, 1, 9]


def test_bucket_rounds_batch_and_length_up() -> None:
    spec = OP.spec((3, 8, 1000, 128), "bfloat16", kv_heads=2, memory="bshd", batched_cos=True)
    bucket = OP.bucket(spec)
    assert bucket.inputs[0].shape == (4, 8, 1024, 128) and bucket.inputs[1].shape == (4, 2, 1024, 128)
    assert bucket.inputs[2].shape == (4, 1024, 128)
    assert bucket == OP.spec((4, 8, 1024, 128), "bfloat16", kv_heads=2, memory="bshd", batched_cos=True)
    assert OP.bucket(bucket) == bucket
    assert OP.bucket(OP.spec((8, 32, 2048, 128), "bf16")) == OP.spec((8, 32, 2048, 128), "bf16")
    assert OP.bucket(OP.spec((5, 32, 1, 128), "bf16")).inputs[0].shape == (8, 32, 1, 128)

"""How a RoPE spec and config become launches: the shapes (batch, heads, positions, head dim and
the layouts' strides), the config spaces of the variants and their launchers. The kernels are in
:mod:`kernelsmith.ops._rope_kernels`, the family (specs, inputs, the reference) in
:mod:`kernelsmith.ops.rope`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import triton

from kernelsmith.ops._base import Launcher
from kernelsmith.ops._elementwise import checked
from kernelsmith.ops._launch import direct_launch
from kernelsmith.ops._rope_kernels import _rope_kernel
from kernelsmith.ops._rowwise import Warps
from kernelsmith.space import Config, Constraint, Param, Space, next_power_of_two, powers_of_two
from kernelsmith.spec import OpSpec, TensorSpec, contiguous_strides

# =================================================================================================
# Shapes
# =================================================================================================


@dataclass(frozen=True)
class _Dims:
    """The sizes of one workload, whatever the layout."""

    batch: int
    heads: int
    kv_heads: int
    seq: int
    head_dim: int
    rotary_dim: int
    batched_cos: bool  # cos/sin are (B, S, R) rather than (S, R)


def _logical_shape(layout: str, b: int, h: int, s: int, d: int) -> tuple[int, int, int, int]:
    return (b, h, s, d) if layout == "bhsd" else (b, s, h, d)


def _other(layout: str) -> str:
    return "bshd" if layout == "bhsd" else "bhsd"


def _strides(shape: tuple[int, ...], layout: str, memory: str) -> tuple[int, ...]:
    """Strides of a 4-D tensor of ``shape`` (in ``layout``) whose memory is in order ``memory``:
    contiguous when they agree, else the contiguous tensor of the other order with dims 1 and 2
    swapped (what ``.transpose(1, 2)`` of it gives)."""
    if memory == layout:
        return contiguous_strides(shape)
    a, b, c, d = contiguous_strides((shape[0], shape[2], shape[1], shape[3]))
    return (a, c, b, d)


def _same_strides(shape: tuple[int, ...], s1: tuple[int, ...], s2: tuple[int, ...]) -> bool:
    """Equal strides on every dimension of size > 1 (the stride of a size-1 dim never matters)."""
    return all(n == 1 or x == y for n, x, y in zip(shape, s1, s2, strict=True))


def _memory_of(t: TensorSpec, layout: str) -> str | None:
    """The memory order of a q or k spec: the layout (contiguous), the other order, or None.

    When both fit (a size-1 head or sequence dimension makes them the same memory), the
    contiguous reading wins.
    """
    if len(t.shape) != 4:
        return None
    for memory in (layout, _other(layout)):
        if _same_strides(t.shape, t.strides, _strides(t.shape, layout, memory)):
            return memory
    return None


def _head_tensor(shape: tuple[int, ...], dtype: str, layout: str, memory: str) -> TensorSpec:
    """The canonical spec of q or k: exact strides of the (simplest equivalent) memory order."""
    if _same_strides(shape, _strides(shape, layout, memory), contiguous_strides(shape)):
        memory = layout
    return TensorSpec(shape, dtype, _strides(shape, layout, memory))


def _dims(spec: OpSpec) -> _Dims:
    q, k, cos = spec.inputs[0], spec.inputs[1], spec.inputs[2]
    if spec.const("layout") == "bhsd":
        b, h, s, d = q.shape
        hk = k.shape[1]
    else:
        b, s, h, d = q.shape
        hk = k.shape[2]
    return _Dims(b, h, hk, s, d, cos.shape[-1], len(cos.shape) == 3)


def _make_spec(dims: _Dims, dtype: str, layout: str, style: str, q_memory: str, k_memory: str) -> OpSpec:
    d = dims
    q = _head_tensor(_logical_shape(layout, d.batch, d.heads, d.seq, d.head_dim), dtype, layout, q_memory)
    k = _head_tensor(_logical_shape(layout, d.batch, d.kv_heads, d.seq, d.head_dim), dtype, layout, k_memory)
    cos_shape = (d.batch, d.seq, d.rotary_dim) if d.batched_cos else (d.seq, d.rotary_dim)
    cos = TensorSpec(cos_shape, dtype)
    return OpSpec("rope", (q, k, cos, cos), {"layout": layout, "style": style})


def _resized(spec: OpSpec, batch: int, seq: int) -> OpSpec:
    """The same workload (layout, memory orders, heads, dims) at another batch and length."""
    layout = spec.const("layout")
    d = _dims(spec)
    memories = [_memory_of(t, layout) or layout for t in spec.inputs[:2]]
    batched = d.batched_cos and batch > 1
    new = _Dims(batch, d.heads, d.kv_heads, seq, d.head_dim, d.rotary_dim, batched)
    return _make_spec(new, spec.inputs[0].dtype, layout, spec.const("style"), memories[0], memories[1])


# =================================================================================================
# Config spaces and builders
# =================================================================================================

_WARPS = (1, 2, 4, 8)
_STAGES = (1, 2, 3)
_BLOCK_H = powers_of_two(1, 64)
_BLOCK_S = powers_of_two(2, 64)
_PAIRS = ("strided", "split")
# Values of x a thread holds (each with its partner, its cos and its sin live: about four float32
# registers): more than this and registers spill.
_MAX_PER_THREAD = 32
# Warp counts that suit a block of rows: no idle warps (one warp is always allowed, so that the
# smallest blocks keep a config) and at most _MAX_PER_THREAD values a thread.
_WARP_RULE = Warps(per_thread=_MAX_PER_THREAD, always=1)


def _rotated_width(spec: OpSpec) -> int:
    """Lanes of one row's rotated part as the kernels hold it: 2 * BLOCK_HALF."""
    return 2 * next_power_of_two(_dims(spec).rotary_dim // 2)


def _pairs_params(spec: OpSpec) -> list[Param]:
    """PAIRS for the interleaved style; the half style has one way to load its pairs."""
    return [Param("PAIRS", _PAIRS)] if spec.const("style") == "interleaved" else []


@dataclass(frozen=True)
class _Common:
    """What every launcher needs from the spec, computed once at build time."""

    dims: _Dims
    layout: str
    constexprs: dict[str, Any]


def _common(spec: OpSpec, config: Config) -> _Common:
    d = _dims(spec)
    interleaved = spec.const("style") == "interleaved"
    passthrough = d.head_dim - d.rotary_dim
    constexprs = {
        "R_HALF": d.rotary_dim // 2,
        "BLOCK_HALF": next_power_of_two(d.rotary_dim // 2),
        "PASS": passthrough,
        "BLOCK_PASS": next_power_of_two(passthrough),
        "INTERLEAVED": interleaved,
        "SPLIT_PAIRS": interleaved and config.get("PAIRS") == "split",
    }
    return _Common(d, spec.const("layout"), constexprs)


def _stride_args(common: _Common, inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> list[int]:
    """(batch, head, position) strides of q, k, q_out, k_out, then cos/sin's (batch, position)."""
    b_dim, h_dim, s_dim = (0, 1, 2) if common.layout == "bhsd" else (0, 2, 1)
    args: list[int] = []
    for t in (inputs[0], inputs[1], outputs[0], outputs[1]):
        args += [t.stride(b_dim), t.stride(h_dim), t.stride(s_dim)]
    cos = inputs[2]
    # Shared caches, (S, R) or a (1, S, R) / batch-expanded (B, S, R) view of one: batch stride 0.
    args += [cos.stride(0) if common.dims.batched_cos else 0, cos.stride(-2)]
    return args


def _launcher(
    spec: OpSpec, config: Config, schedule: str, programs: int, block: int, blocks: tuple[int, int, int]
) -> Launcher:
    """The launcher of ``_rope_kernel`` under ``schedule`` (a variant's name): ``programs``
    programs, each taking ``block`` heads (or positions, in blocked_seq) at a time; ``blocks``
    the kernel's (Q_BLOCKS, K_BLOCKS, S_BLOCKS)."""
    common = _common(spec, config)
    d = common.dims
    kernel = direct_launch(_rope_kernel, (programs,))
    meta = {"SCHEDULE": schedule, "BLOCK": block, **common.constexprs,
            "NUM_STAGES": int(config.get("num_stages", 1)), "num_warps": int(config["num_warps"])}
    if "num_stages" in config:  # per_token: the loop's depth, also given as the launch option
        meta["num_stages"] = int(config["num_stages"])

    def launch(inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> None:
        kernel(inputs[0], inputs[1], inputs[2], inputs[3], outputs[0], outputs[1], d.seq, d.heads, d.kv_heads,
               *_stride_args(common, inputs, outputs), *blocks, **meta)

    return launch


def _head_block_space(spec: OpSpec, stages: list[Param], extra: list[Constraint]) -> Space:
    """The space of the schedules that take q's and k's heads BLOCK_H at a time (per_head,
    per_token): ``stages`` and ``extra`` are what per_token adds for its head loops."""
    width = _rotated_width(spec)
    most_heads = next_power_of_two(_dims(spec).heads)
    return Space(
        [Param("BLOCK_H", _BLOCK_H), *_pairs_params(spec), Param("num_warps", _WARPS), *stages],
        [
            Constraint("BLOCK_H is no larger than q's head count (rounded up to a power of two)",
                       lambda c: c["BLOCK_H"] <= most_heads),
            *extra,
            _WARP_RULE.constraint("BLOCK_H rows of the rotated part", lambda c: c["BLOCK_H"] * width),
        ],
    )


# ---- per_head -----------------------------------------------------------------------------------


def _per_head_space(spec: OpSpec) -> Space:
    return _head_block_space(spec, [], [])


def _per_head_build(spec: OpSpec, config: Config) -> Launcher:
    checked(_per_head_space(spec), config)
    d, block_h = _dims(spec), int(config["BLOCK_H"])
    q_blocks, k_blocks = triton.cdiv(d.heads, block_h), triton.cdiv(d.kv_heads, block_h)
    programs = d.batch * d.seq * (q_blocks + k_blocks)
    return _launcher(spec, config, "per_head", programs, block_h, (q_blocks, k_blocks, 1))


# ---- per_token ----------------------------------------------------------------------------------


def _per_token_space(spec: OpSpec) -> Space:
    heads = _dims(spec).heads
    # One block covers every head: each loop runs once, and there is nothing to pipeline.
    one_block = Constraint("num_stages is 1 when one head block covers all the heads",
                           lambda c: c["num_stages"] == 1 or c["BLOCK_H"] < heads)
    return _head_block_space(spec, [Param("num_stages", _STAGES)], [one_block])


def _per_token_build(spec: OpSpec, config: Config) -> Launcher:
    checked(_per_token_space(spec), config)
    d, block_h = _dims(spec), int(config["BLOCK_H"])
    blocks = (triton.cdiv(d.heads, block_h), triton.cdiv(d.kv_heads, block_h), 1)
    return _launcher(spec, config, "per_token", d.batch * d.seq, block_h, blocks)


# ---- blocked_seq --------------------------------------------------------------------------------


def _blocked_seq_space(spec: OpSpec) -> Space:
    # BLOCK_S does not depend on S: the same configs serve every sequence length (a short
    # sequence masks the rest of its block), so that the validation tails share the space.
    width = _rotated_width(spec)
    return Space(
        [Param("BLOCK_S", _BLOCK_S), *_pairs_params(spec), Param("num_warps", _WARPS)],
        [_WARP_RULE.constraint("BLOCK_S rows of the rotated part", lambda c: c["BLOCK_S"] * width)],
    )


def _blocked_seq_build(spec: OpSpec, config: Config) -> Launcher:
    checked(_blocked_seq_space(spec), config)
    d, block_s = _dims(spec), int(config["BLOCK_S"])
    s_blocks = triton.cdiv(d.seq, block_s)
    programs = d.batch * (d.heads + d.kv_heads) * s_blocks
    return _launcher(spec, config, "blocked_seq", programs, block_s, (1, 1, s_blocks))

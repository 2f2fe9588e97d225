"""How a decode attention spec and config become launches: the dimensions a spec implies, the
config spaces of the two variants (valid whatever the batch, cache length or lengths) and their
launchers. The kernels are in :mod:`kernelsmith.ops._decode_attention_kernels`, the family (specs,
inputs, the references) in :mod:`kernelsmith.ops.decode_attention`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from kernelsmith.ops._base import Launcher
from kernelsmith.ops._decode_attention_kernels import LOG2E, _decode_attn_combine_kernel, _decode_attn_kernel
from kernelsmith.ops._launch import direct_launch
from kernelsmith.ops.gelu import checked
from kernelsmith.space import Config, Constraint, Param, Space, next_power_of_two
from kernelsmith.spec import OpSpec


@dataclass(frozen=True)
class _Dims:
    batch: int
    heads: int
    kv_heads: int
    q_len: int
    cache_len: int  # L: the cache tensors' length (max_cache_len for a static cache)
    head_dim: int
    itemsize: int
    has_lengths: bool  # a static cache's (B,) lengths
    masked: bool = False  # a boolean (B, 1, Sq, L) mask instead (every position scanned)
    write_kv: bool = False  # k_new, v_new and the cache position instead: the kernel writes the new rows

    @property
    def group(self) -> int:
        return self.heads // self.kv_heads

    @property
    def rows(self) -> int:
        """Query rows one program holds: the group's heads times the new tokens."""
        return self.group * self.q_len

    @property
    def block_q(self) -> int:
        return max(16, next_power_of_two(self.rows))

    @property
    def block_d(self) -> int:
        return max(16, next_power_of_two(self.head_dim))


def _dims(spec: OpSpec) -> _Dims:
    q, k = spec.inputs[0], spec.inputs[1]
    b, h, sq, d = q.shape
    fourth = spec.inputs[3].dtype if len(spec.inputs) == 4 else None
    return _Dims(b, h, k.shape[1], sq, k.shape[2], d, q.torch_dtype.itemsize, fourth not in (None, "bool"),
                 fourth == "bool", bool(spec.constants.get("write_kv", False)))  # fmt: skip


BLOCKS_N = (16, 32, 64, 128, 256)
WARPS = (1, 2, 4, 8)
STAGES = (1, 2, 3, 4)
SPLITS = (2, 4, 8, 16, 32, 64)
MAX_VALUES_PER_THREAD = 128  # float32 scores and accumulators a thread holds
SHARED_MEMORY_BUDGET = 220 * 1024
MIN_PRUNED_BLOCK_N = 32  # narrower key blocks move too few bytes a step to keep the loads busy


def _constraints(dims: _Dims, prune: bool) -> list[Constraint]:
    """Validity (registers and shared memory; never B, L or the lengths), then pruning."""

    def values(c: Config) -> int:
        return dims.block_q * (c["BLOCK_N"] + dims.block_d)

    def stage_bytes(c: Config) -> int:
        return 2 * c["BLOCK_N"] * dims.block_d * dims.itemsize

    constraints = [
        Constraint(f"the scores and the accumulator fit in registers ({MAX_VALUES_PER_THREAD} a thread)",
                   lambda c: values(c) <= MAX_VALUES_PER_THREAD * 32 * c["num_warps"]),
        Constraint(f"num_stages key and value blocks fit in shared memory ({SHARED_MEMORY_BUDGET} bytes)",
                   lambda c: c["num_stages"] * stage_bytes(c) <= SHARED_MEMORY_BUDGET),
    ]  # fmt: skip
    if prune:
        constraints.append(Constraint(f"key blocks of at least {MIN_PRUNED_BLOCK_N} positions",
                                      lambda c: c["BLOCK_N"] >= MIN_PRUNED_BLOCK_N))  # fmt: skip
    return constraints


def _block_params() -> list[Param]:
    return [Param("BLOCK_N", BLOCKS_N), Param("num_warps", WARPS), Param("num_stages", STAGES)]


def _single_space(spec: OpSpec, prune: bool = True) -> Space:
    return Space(_block_params(), _constraints(_dims(spec), prune))


def _split_space(spec: OpSpec, prune: bool = True) -> Space:
    return Space([*_block_params(), Param("SPLITS", SPLITS)], _constraints(_dims(spec), prune))


def _interpreted() -> bool:
    return type(_decode_attn_kernel).__name__ == "InterpretedFunction"


def _launcher(spec: OpSpec, config: Config, splits: int) -> Launcher:
    dims = _dims(spec)
    programs = dims.batch * dims.kv_heads
    dtype = spec.inputs[0].dtype
    shape = {"Q_LEN": dims.q_len, "GROUP": dims.group, "HEAD_DIM": dims.head_dim, "BLOCK_D": dims.block_d,
             "BLOCK_Q": dims.block_q, "HAS_LENGTHS": dims.has_lengths, "WRITE_KV": dims.write_kv}  # fmt: skip
    flags = {**shape, "BLOCK_N": int(config["BLOCK_N"]), "IEEE": dtype == "float32",
             "UPCAST": _interpreted() and dtype == "bfloat16", "MASKED": dims.masked}  # fmt: skip
    launch_kwargs = {"num_warps": int(config["num_warps"]), "num_stages": int(config["num_stages"])}
    qk_scale = float(spec.const("scale")) * LOG2E
    kernel = direct_launch(_decode_attn_kernel, (programs, splits))
    combine = direct_launch(_decode_attn_combine_kernel, (programs,))
    partial_rows = programs * splits * dims.rows

    def launch(inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> None:
        q, k, v = inputs[0], inputs[1], inputs[2]
        lengths = inputs[3] if len(inputs) == 4 else q  # the lengths or the mask (never read without)
        k_new = v_new = q  # (never read without write_kv)
        if dims.write_kv:  # (q, k_cache, v_cache, k_new, v_new, cache_position)
            k_new, v_new, lengths = inputs[3], inputs[4], inputs[5]
        new_strides = (*k_new.stride()[:3], *v_new.stride()[:3])  # (for q: never read)
        mask_strides = (lengths.stride(0), lengths.stride(2), lengths.stride(3)) if dims.masked else (0, 0, 0)
        o = outputs[0]
        acc = ml = o  # unused by one pass
        if splits > 1:  # every element the combine reads is written first
            acc = o.new_empty((partial_rows, dims.head_dim), dtype=torch.float32)
            ml = o.new_empty((2, partial_rows), dtype=torch.float32)
        kernel(q, k, v, lengths, o, acc, ml, k_new, v_new, qk_scale, dims.heads, dims.kv_heads, dims.cache_len,
               q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
               v.stride(0), v.stride(1), v.stride(2), *mask_strides, *new_strides, SPLITS=splits, **flags,
               **launch_kwargs)  # fmt: skip
        if splits > 1:
            combine(acc, ml, lengths, o, dims.heads, dims.kv_heads, dims.cache_len, SPLITS=splits, **shape,
                    num_warps=4)  # fmt: skip

    return launch


def _single_build(spec: OpSpec, config: Config) -> Launcher:
    checked(_single_space(spec, prune=False), config)
    return _launcher(spec, config, 1)


def _split_build(spec: OpSpec, config: Config) -> Launcher:
    checked(_split_space(spec, prune=False), config)
    return _launcher(spec, config, int(config["SPLITS"]))

"""How an attention spec and config become launches: the shapes (batch, heads, positions, head
dim and the layouts' strides), the config spaces of the four variants and their launchers. The
kernels are in :mod:`kernelsmith.ops._attention_kernels`, the family (specs, inputs, the reference)
in :mod:`kernelsmith.ops.attention`.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import triton

from kernelsmith.ops._attention_kernels import (
    _ADDITIVE,
    _BOOLEAN,
    _NO_MASK,
    LOG2E,
    _attn_combine_kernel,
    _attn_flash_kernel,
    _attn_persistent_kernel,
    _attn_split_kernel,
)
from kernelsmith.ops._base import Launcher
from kernelsmith.ops._elementwise import checked
from kernelsmith.ops._launch import direct_launch, tensor_descriptor_class, tma_available
from kernelsmith.space import Config, Constraint, Param, Space, next_power_of_two
from kernelsmith.spec import OpSpec, TensorSpec, contiguous_strides

# =================================================================================================
# Shapes
# =================================================================================================


@dataclass(frozen=True)
class _Dims:
    """The sizes of one workload, whatever the layout: q's (B, H, Sq, D), then the heads and the
    length of k and v."""

    batch: int
    heads: int
    q_len: int
    head_dim: int
    kv_heads: int
    kv_len: int

    @property
    def group(self) -> int:
        return self.heads // self.kv_heads


def _logical(layout: str, b: int, h: int, s: int, d: int) -> tuple[int, int, int, int]:
    return (b, h, s, d) if layout == "bhsd" else (b, s, h, d)


def _bhs_strides(t: torch.Tensor | TensorSpec, layout: str) -> tuple[int, int, int]:
    """(batch, head, position) strides of a q, k, v or output tensor in ``layout``."""
    strides = tuple(t.stride()) if isinstance(t, torch.Tensor) else t.strides
    return (strides[0], strides[1], strides[2]) if layout == "bhsd" else (strides[0], strides[2], strides[1])


def _dims(spec: OpSpec) -> _Dims:
    q, k = spec.inputs[0], spec.inputs[1]
    if spec.const("layout") == "bhsd":
        b, h, sq, d = q.shape
        hk, sk = k.shape[1], k.shape[2]
    else:
        b, sq, h, d = q.shape
        sk, hk = k.shape[1], k.shape[2]
    return _Dims(batch=b, heads=h, q_len=sq, head_dim=d, kv_heads=hk, kv_len=sk)


def _order(t: TensorSpec) -> tuple[int, ...]:
    """The dims of ``t`` from the largest stride to the smallest (ties: the logical order)."""
    return tuple(sorted(range(len(t.shape)), key=lambda i: (-t.strides[i], i)))


def _strides_in_order(shape: tuple[int, ...], order: tuple[int, ...]) -> tuple[int, ...]:
    """Dense strides of ``shape`` with its dims laid out in memory in ``order`` (outermost first)."""
    strides = [0] * len(shape)
    step = 1
    for i in reversed(order):
        strides[i] = step
        step *= max(shape[i], 1)
    return tuple(strides)


def _broadcast_mask_shape(dims: _Dims, like: TensorSpec, batch: int, q_len: int, kv_len: int) -> tuple[int, ...]:
    """A mask's shape at other sizes, keeping which of its dims broadcast (size 1)."""
    full = (batch, dims.heads, q_len, kv_len)
    shape = like.shape
    aligned = full[4 - len(shape):]
    return tuple(1 if n == 1 else f for n, f in zip(shape, aligned, strict=True))


def _resized(spec: OpSpec, batch: int, q_len: int, kv_len: int) -> OpSpec:
    """The same workload (heads, head dim, layout, memory orders, mask kind) at other lengths."""
    d = _dims(spec)
    layout = spec.const("layout")
    tensors = []
    for t, heads, seq in zip(spec.inputs[:3], (d.heads, d.kv_heads, d.kv_heads), (q_len, kv_len, kv_len), strict=True):
        shape = _logical(layout, batch, heads, seq, d.head_dim)
        tensors.append(_canonical(shape, _strides_in_order(shape, _order(t)), t.dtype))
    if len(spec.inputs) == 4:
        mask = spec.inputs[3]
        mask_shape = _broadcast_mask_shape(d, mask, batch, q_len, kv_len)
        tensors.append(_canonical(mask_shape, _strides_in_order(mask_shape, _order(mask)), mask.dtype))
    return OpSpec(spec.op, tuple(tensors), dict(spec.constants))


def _canonical(shape: tuple[int, ...], strides: tuple[int, ...], dtype: str) -> TensorSpec:
    """The spec of a tensor, with the strides of its size-1 dims (which address nothing) set to
    a contiguous tensor's, so that one memory layout has one spec (and one workload hash)."""
    dense = contiguous_strides(shape)
    return TensorSpec(shape, dtype, tuple(d if n == 1 else s for n, s, d in zip(shape, strides, dense, strict=True)))


def _mask_strides(mask: torch.Tensor | TensorSpec) -> tuple[int, int, int, int]:
    """(batch, head, query, key) strides of a mask broadcast to (B, H, Sq, Sk): 0 where it broadcasts."""
    shape = tuple(mask.shape)
    strides = tuple(mask.stride()) if isinstance(mask, torch.Tensor) else mask.strides
    pad = 4 - len(shape)
    full_shape, full_strides = (1,) * pad + shape, (0,) * pad + strides
    b, h, q, k = (0 if n == 1 else s for n, s in zip(full_shape, full_strides, strict=True))
    return b, h, q, k


# =================================================================================================
# Config spaces and builders
# =================================================================================================

_BLOCK_M = (16, 32, 64, 128, 256)
_BLOCK_N = (16, 32, 64, 128)
_WARPS = (1, 2, 4, 8)
_STAGES = (1, 2, 3, 4)
_SPLITS = (2, 4, 8, 16, 32)
_PROGRAMS_PER_SM = (1, 2)
# float32 values a thread holds for the running output and one score block. Past 128 the kernels
# spill registers (ptxas for sm_90 through Triton 3.9: 198 registers for a 128x64 tile at D=128
# and 8 warps, 227 for 128x64 at D=64 and 4 warps, spills from 160 values a thread on).
_MAX_PER_THREAD = 128
# Shared memory a program may use for its q tile and the pipelined k and v tiles (Hopper: 227 KiB).
_SHARED_BYTES = 227 * 1024
# Splits of the combine kernel's grid, and its warps (a [SPLITS, D] block: small).
_COMBINE_WARPS = 2


def _tile_params(spec: OpSpec, block_m: tuple[int, ...] = _BLOCK_M) -> list[Param]:
    params = [
        Param("BLOCK_M", block_m),
        Param("BLOCK_N", _BLOCK_N),
        Param("num_warps", _WARPS),
        Param("num_stages", _STAGES),
        Param("TWO_LOOPS", (True, False)),
    ]
    if _dims(spec).group > 1:
        params.append(Param("PACK_GQA", (False, True)))
    return params


def _tile_constraints(spec: OpSpec) -> list[Constraint]:
    d = _dims(spec)
    block_d = next_power_of_two(d.head_dim)
    itemsize = spec.inputs[0].torch_dtype.itemsize
    return [
        Constraint(
            "every warp owns at least a 16x16 block of the scores",
            lambda c: c["BLOCK_M"] * c["BLOCK_N"] >= 256 * c["num_warps"],
        ),
        Constraint(
            f"the output and score blocks fit in registers ({_MAX_PER_THREAD} float32 values a thread)",
            lambda c: c["BLOCK_M"] * (block_d + c["BLOCK_N"]) <= _MAX_PER_THREAD * 32 * c["num_warps"],
        ),
        Constraint(
            f"the q tile and num_stages k and v tiles fit in shared memory ({_SHARED_BYTES} bytes)",
            lambda c: (c["BLOCK_M"] + 2 * c["num_stages"] * c["BLOCK_N"]) * block_d * itemsize <= _SHARED_BYTES,
        ),
    ]


@dataclass(frozen=True)
class _Plan:
    """What every launcher needs from the spec and the config, computed once at build time."""

    dims: _Dims
    layout: str
    has_mask: bool
    pack: int  # query heads per tile (1, or the group size with PACK_GQA)
    head_tiles: int  # H / pack
    m_blocks: int  # query blocks per (batch, head tile)
    qk_scale: float
    constexprs: dict[str, Any]
    launch: dict[str, int]  # num_warps, num_stages


def _interpreted() -> bool:
    """Whether the kernels run in the Triton interpreter (decided when they were decorated)."""
    return type(_attn_flash_kernel).__name__ == "InterpretedFunction"


def _plan(spec: OpSpec, config: Config) -> _Plan:
    d = _dims(spec)
    has_mask = len(spec.inputs) == 4
    mask_kind = _NO_MASK
    if has_mask:
        mask_kind = _BOOLEAN if spec.inputs[3].dtype == "bool" else _ADDITIVE
    pack = d.group if config.get("PACK_GQA", False) else 1
    scale = float(spec.const("scale"))
    block_m = int(config["BLOCK_M"])
    constexprs = {
        "GROUP": d.group,
        "PACK": pack,
        "HEAD_DIM": d.head_dim,
        "BLOCK_D": next_power_of_two(d.head_dim),
        "BLOCK_M": block_m,
        "BLOCK_N": int(config["BLOCK_N"]),
        "CAUSAL": bool(spec.const("causal")),
        "MASK_KIND": mask_kind,
        "TWO_LOOPS": bool(config["TWO_LOOPS"]),
        "PRECISION": "ieee" if spec.inputs[0].dtype == "float32" else "tf32",
        "DOT_IN_FP32": _interpreted() and spec.inputs[0].dtype == "bfloat16",
    }
    return _Plan(
        dims=d,
        layout=spec.const("layout"),
        has_mask=has_mask,
        pack=pack,
        head_tiles=d.heads // pack,
        m_blocks=triton.cdiv(d.q_len * pack, block_m),
        qk_scale=scale if mask_kind == _ADDITIVE else scale * LOG2E,
        constexprs=constexprs,
        launch={"num_warps": int(config["num_warps"]), "num_stages": int(config["num_stages"])},
    )


def _tensor_args(plan: _Plan, inputs: Sequence[torch.Tensor]) -> tuple[list[Any], list[int]]:
    """(q, k, v, mask pointers) and their strides: q's, k's, v's (batch, head, position), then the
    mask's (batch, head, query, key) (zeros without a mask: its pointer is q's, never read)."""
    q, k, v = inputs[0], inputs[1], inputs[2]
    mask = inputs[3] if plan.has_mask else q
    strides = [*_bhs_strides(q, plan.layout), *_bhs_strides(k, plan.layout), *_bhs_strides(v, plan.layout)]
    mask_strides = list(_mask_strides(mask)) if plan.has_mask else [0, 0, 0, 0]
    return [q, k, v, mask], strides + mask_strides


def _keys_needed(plan: _Plan) -> int:
    """Keys any query can see: all of them, or, causal (top left), the first Sq."""
    d = plan.dims
    return min(d.kv_len, d.q_len) if plan.constexprs["CAUSAL"] else d.kv_len


# ---- flash ----------------------------------------------------------------------------------------


def _flash_space(spec: OpSpec) -> Space:
    return Space(_tile_params(spec), _tile_constraints(spec))


def _flash_build(spec: OpSpec, config: Config) -> Launcher:
    checked(_flash_space(spec), config)
    return _flash_launcher(spec, config, descriptors=False)


# ---- tma ------------------------------------------------------------------------------------------


def _tma_space(spec: OpSpec) -> Space:
    d = _dims(spec)
    usable = tma_available(_interpreted()) and d.head_dim == next_power_of_two(d.head_dim)
    only_here = Constraint("tensor descriptors: a Triton that has them, Hopper or newer, a power-of-two head_dim",
                           lambda c: usable)  # fmt: skip
    return Space(_tile_params(spec), [*_tile_constraints(spec), only_here])


def _tma_build(spec: OpSpec, config: Config) -> Launcher:
    checked(_tma_space(spec), config)
    return _flash_launcher(spec, config, descriptors=True)


def _descriptor_rows(t: torch.Tensor, layout: str) -> tuple[int, int] | None:
    """``(rows, row_length)`` of ``t`` seen as a 2-D tensor of rows ``row_length`` (its position
    stride) elements apart, with every (batch, head)'s positions at the same columns of
    consecutive rows; or None when a tensor descriptor cannot address ``t`` so (its storage not
    16-byte aligned, or heads that do not fit in a row)."""
    sb, sh, ss = _bhs_strides(t, layout)
    b, h, s, d = (t.shape[0], t.shape[2], t.shape[1], t.shape[3]) if layout == "bshd" else tuple(t.shape)
    if t.data_ptr() % 16 or (ss * t.element_size()) % 16 or ss < d or sb % ss:
        return None
    if sh % ss and (h - 1) * sh + d > ss:  # heads side by side in a row must fit in it
        return None
    rows = ((b - 1) * sb + (h - 1) * sh + (s - 1) * ss) // ss + 1
    return (rows, ss) if rows < 2**31 else None


def _flash_launcher(spec: OpSpec, config: Config, descriptors: bool) -> Launcher:
    """The flash kernel's launcher; with ``descriptors`` (the tma variant) k and v are read
    through tensor descriptors wherever :func:`_descriptor_rows` can address them, and through
    pointers (the same tiles) where it cannot."""
    plan = _plan(spec, config)
    d = plan.dims
    grid = (plan.m_blocks * d.batch * plan.head_tiles,)
    kernel = direct_launch(_attn_flash_kernel, grid)
    keys = triton.cdiv(d.kv_len, plan.constexprs["BLOCK_N"]) * plan.constexprs["BLOCK_N"]
    descriptor = tensor_descriptor_class() if descriptors else None
    block = [plan.constexprs["BLOCK_N"], d.head_dim]

    def launch(inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> None:
        tensors, strides = _tensor_args(plan, inputs)
        k_desc, v_desc = tensors[1], tensors[2]  # placeholders the kernel ignores without descriptors
        described = False
        if descriptor is not None:
            k_rows, v_rows = _descriptor_rows(inputs[1], plan.layout), _descriptor_rows(inputs[2], plan.layout)
            if k_rows is not None and v_rows is not None:
                k_desc = descriptor(inputs[1], list(k_rows), [k_rows[1], 1], block)
                v_desc = descriptor(inputs[2], list(v_rows), [v_rows[1], 1], block)
                described = True
        o = outputs[0]
        o_strides = _bhs_strides(o, plan.layout)
        kernel(*tensors, o, k_desc, v_desc, plan.qk_scale, d.q_len, d.kv_len, keys, plan.head_tiles,
               plan.m_blocks, *strides[:9], *o_strides, *strides[9:], **plan.constexprs, USE_DESC=described,
               **plan.launch)  # fmt: skip

    return launch


# ---- persistent -----------------------------------------------------------------------------------

# Without a GPU (the Triton interpreter) any program count is correct; a small one keeps the
# tile loop exercised by tests with a few tiles.
_INTERPRETER_MULTIPROCESSORS = 2


@functools.cache
def _multiprocessor_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def _programs(per_multiprocessor: int) -> int:
    if torch.cuda.is_available():
        count = _multiprocessor_count(torch.cuda.current_device())
    else:
        count = _INTERPRETER_MULTIPROCESSORS
    return per_multiprocessor * count


def _persistent_space(spec: OpSpec) -> Space:
    return Space([*_tile_params(spec), Param("PROGRAMS_PER_SM", _PROGRAMS_PER_SM)], _tile_constraints(spec))


def _persistent_build(spec: OpSpec, config: Config) -> Launcher:
    checked(_persistent_space(spec), config)
    plan = _plan(spec, config)
    d = plan.dims
    tiles = plan.m_blocks * d.batch * plan.head_tiles
    kernel = direct_launch(_attn_persistent_kernel, (min(tiles, _programs(int(config["PROGRAMS_PER_SM"]))),))
    keys = triton.cdiv(d.kv_len, plan.constexprs["BLOCK_N"]) * plan.constexprs["BLOCK_N"]

    def launch(inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> None:
        tensors, strides = _tensor_args(plan, inputs)
        o = outputs[0]
        o_strides = _bhs_strides(o, plan.layout)
        kernel(*tensors, o, plan.qk_scale, d.q_len, d.kv_len, keys, plan.head_tiles, plan.m_blocks, tiles,
               *strides[:9], *o_strides, *strides[9:], **plan.constexprs, **plan.launch)

    return launch


# ---- split_kv -------------------------------------------------------------------------------------


_SPLIT_MAX_QUERY = 128  # longest query split_kv is offered for


def _split_space(spec: OpSpec) -> Space:
    # Query blocks of 256 rows are for long queries, which need no key splitting. Long queries
    # get no config at all: they fill the GPU without splitting, and the partial buffers would be
    # SPLITS times the output. (Every validation tail of a short query is short too.)
    short = _dims(spec).q_len <= _SPLIT_MAX_QUERY
    return Space(
        [*_tile_params(spec, _BLOCK_M[:-1]), Param("SPLITS", _SPLITS)],
        [
            Constraint(f"the query is short (at most {_SPLIT_MAX_QUERY} positions)", lambda c: short),
            *_tile_constraints(spec),
        ],
    )


def _split_build(spec: OpSpec, config: Config) -> Launcher:
    checked(_split_space(spec), config)
    plan = _plan(spec, config)
    d = plan.dims
    splits = int(config["SPLITS"])
    block_n = plan.constexprs["BLOCK_N"]
    keys_per_split = triton.cdiv(triton.cdiv(_keys_needed(plan), block_n), splits) * block_n
    grid = (splits * plan.m_blocks * d.batch * plan.head_tiles,)
    kernel = direct_launch(_attn_split_kernel, grid)
    rows = d.batch * d.heads * d.q_len
    combine = direct_launch(_attn_combine_kernel, (rows,))
    # The partials: acc as [SPLITS, B, H, Sq, D] and m, l as [SPLITS, B, H, Sq], float32.
    acc_strides = (d.heads * d.q_len * d.head_dim, d.q_len * d.head_dim, d.head_dim, rows * d.head_dim)
    ml_strides = (d.heads * d.q_len, d.q_len, rows)
    log2_units = plan.constexprs["MASK_KIND"] != _ADDITIVE
    combine_constexprs = {
        "SPLITS": splits,
        "BLOCK_S": next_power_of_two(splits),
        "HEAD_DIM": d.head_dim,
        "BLOCK_D": plan.constexprs["BLOCK_D"],
        "LOG2_UNITS": log2_units,
    }

    def launch(inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> None:
        tensors, strides = _tensor_args(plan, inputs)
        o = outputs[0]
        device = o.device
        acc = torch.empty((splits * rows * d.head_dim,), dtype=torch.float32, device=device)
        m = torch.empty((splits * rows,), dtype=torch.float32, device=device)
        l = torch.empty((splits * rows,), dtype=torch.float32, device=device)
        kernel(*tensors, acc, m, l, plan.qk_scale, d.q_len, d.kv_len, keys_per_split, plan.head_tiles,
               plan.m_blocks, splits, *strides[:9], *acc_strides, *ml_strides, *strides[9:],
               **plan.constexprs, **plan.launch)
        combine(acc, m, l, o, d.q_len, d.heads, *_bhs_strides(o, plan.layout), acc_strides[3], ml_strides[2],
                **combine_constexprs, num_warps=_COMBINE_WARPS)

    return launch

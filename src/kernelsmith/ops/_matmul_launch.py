"""How a matmul spec and config become launches: the geometry of a workload, the config spaces of
the four variants (with the validity and pruning constraints the module docstring of
:mod:`kernelsmith.ops.matmul` explains) and their launchers. The kernels are in
:mod:`kernelsmith.ops._matmul_kernels`, the family (specs, inputs, the reference) in
:mod:`kernelsmith.ops.matmul`.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import triton

from kernelsmith.ops._base import Launcher
from kernelsmith.ops._elementwise import checked, multiprocessor_count
from kernelsmith.ops._launch import direct_launch, tensor_descriptor_class
from kernelsmith.ops._launch import tma_available as tma_descriptors_here
from kernelsmith.ops._matmul_kernels import (
    _EPILOGUE_CODES,
    EPI_RESIDUAL,
    EPI_SWIGLU,
    INTERPRETED,
    _matmul_persistent_kernel,
    _matmul_split_k_kernel,
    _matmul_split_k_reduce_kernel,
    _matmul_tiled_kernel,
    _matmul_tma_kernel,
)
from kernelsmith.space import Config, Constraint, Param, Space, next_power_of_two
from kernelsmith.spec import OpSpec

# =================================================================================================
# Geometry, spaces and builders
# =================================================================================================

TILE_M = (16, 32, 64, 128, 256)
TILE_N = (32, 64, 128, 256)
TILE_K = (32, 64, 128)
GROUPS = (1, 8)
WARPS = (4, 8)
STAGES = (2, 3, 4, 5)
PERSISTENT_TILE = (64, 128, 256)
PERSISTENT_STAGES = (3, 4)
SPLIT_TILE_M = (16, 32, 64)
SPLIT_TILE_K = (32, 64, 128, 256)
SPLITS = (2, 4, 8, 16)
SPLIT_WARPS = (2, 4, 8)
SPLIT_STAGES = (2, 3, 4)  # a split walks few K blocks: deep pipelines hardly pay
SPLIT_K_MAX_M = 256  # split-K is offered for this many rows or fewer (a power of two: see buckets)
# Shared memory for the num_stages pipelined (x, w[, w3]) tiles: Hopper allows 227 KiB a block;
# the rest is left for the epilogue's layout conversions.
SHARED_MEMORY_BUDGET = 220 * 1024
MAX_ACCUMULATORS_PER_THREAD = 128  # float32 accumulator registers a thread (255 registers in all)
MIN_ACCUMULATORS_PER_THREAD = 4  # fewer, and extra warps only idle
MIN_BIG_TILE = 64  # tiles narrower than this are for a small M or N only
REDUCE_TILE = 2048  # elements of one tile of the split-K reduction
REDUCE_WARPS = 4


@dataclass(frozen=True)
class _Geometry:
    """Everything a build needs to know about a spec, computed once."""

    m: int
    n: int
    k: int
    itemsize: int
    weights: int  # weight matrices read per K step: 2 for SwiGLU
    layout: str
    epilogue: int  # EPI_* code
    has_bias: bool
    ieee: bool  # float32 products in IEEE float32 (not TF32)
    upcast: bool  # interpreter + bfloat16: widen tiles before the dot


def _geometry(spec: OpSpec) -> _Geometry:
    x, w = spec.inputs[0], spec.inputs[1]
    layout = spec.const("layout")
    n = w.shape[0] if layout == "linear" else w.shape[1]
    k = x.shape[-1]
    epilogue = spec.const("epilogue")
    float32 = x.dtype == "float32"
    return _Geometry(
        m=x.numel // k, n=n, k=k, itemsize=x.torch_dtype.itemsize, weights=2 if epilogue == "swiglu" else 1,
        layout=layout, epilogue=_EPILOGUE_CODES[epilogue], has_bias=bool(spec.const("bias")),
        ieee=float32 and not spec.const("allow_tf32"), upcast=INTERPRETED and x.dtype == "bfloat16",
    )  # fmt: skip


def _validity(g: _Geometry, params: Sequence[Param]) -> list[Constraint]:
    """Constraints every config a build accepts satisfies: they depend on N, K, the dtype and the
    epilogue, never on M (see the module docstring). The smallest BLOCK_N and BLOCK_K of
    ``params`` are always allowed, so that a small N or K keeps a config."""
    choices = {p.name: p.choices for p in params}
    widest_n = max(min(choices["BLOCK_N"]), next_power_of_two(g.n))
    deepest_k = max(min(choices["BLOCK_K"]), next_power_of_two(g.k))

    def accumulators(c: Config) -> int:
        return g.weights * c["BLOCK_M"] * c["BLOCK_N"]

    def stage_bytes(c: Config) -> int:
        return (c["BLOCK_M"] + g.weights * c["BLOCK_N"]) * c["BLOCK_K"] * g.itemsize

    return [
        Constraint("BLOCK_N is no wider than the padded N", lambda c: c["BLOCK_N"] <= widest_n),
        Constraint("BLOCK_K is no deeper than the padded K", lambda c: c["BLOCK_K"] <= deepest_k),
        Constraint(
            f"the float32 accumulators fit in registers ({MIN_ACCUMULATORS_PER_THREAD} to "
            f"{MAX_ACCUMULATORS_PER_THREAD} a thread)",
            lambda c: (
                MIN_ACCUMULATORS_PER_THREAD * 32 * c["num_warps"]
                <= accumulators(c)
                <= MAX_ACCUMULATORS_PER_THREAD * 32 * c["num_warps"]
            ),
        ),
        Constraint(
            f"num_stages tiles of x and w fit in shared memory ({SHARED_MEMORY_BUDGET} bytes)",
            lambda c: c["num_stages"] * stage_bytes(c) <= SHARED_MEMORY_BUDGET,
        ),
    ]


def _pruning(g: _Geometry, smallest_m: int) -> list[Constraint]:
    """Constraints that only save search time, looking at M: a config they exclude is still
    correct (and accepted by build) at this M."""
    tallest = max(smallest_m, next_power_of_two(g.m))
    return [
        Constraint("BLOCK_M is no taller than the padded M", lambda c: c["BLOCK_M"] <= tallest),
        Constraint(
            f"tiles are at least {MIN_BIG_TILE} wide unless M or N is small",
            lambda c: (
                c["BLOCK_M"] >= min(MIN_BIG_TILE, next_power_of_two(g.m))
                and c["BLOCK_N"] >= min(MIN_BIG_TILE, next_power_of_two(g.n))
            ),
        ),
        Constraint("GROUP_M > 1 needs several rows of tiles", lambda c: c.get("GROUP_M", 1) == 1 or g.m > c["BLOCK_M"]),
    ]


def _space(params: list[Param], g: _Geometry, prune: bool, smallest_m: int, extra: Sequence[Constraint] = ()) -> Space:
    return Space(params, [*_validity(g, params), *extra, *(_pruning(g, smallest_m) if prune else [])])


def _tile_flags(g: _Geometry, config: Config) -> dict[str, Any]:
    """The compile-time flags every matmul kernel takes."""
    return {
        "BLOCK_M": int(config["BLOCK_M"]),
        "BLOCK_N": int(config["BLOCK_N"]),
        "BLOCK_K": int(config["BLOCK_K"]),
        "EVEN_N": g.n % int(config["BLOCK_N"]) == 0,
        "EVEN_K": g.k % int(config["BLOCK_K"]) == 0,
        "IEEE": g.ieee,
        "UPCAST": g.upcast,
    }


def _weight_strides(g: _Geometry) -> tuple[int, int]:
    """(stride_wk, stride_wn): the weight read as a (K, N) matrix."""
    return (1, g.k) if g.layout == "linear" else (g.n, 1)


def _operands(g: _Geometry, inputs: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
    """(x, w, w3, bias, residual), unused pointers standing in as x (never read)."""
    x, w = inputs[0], inputs[1]
    rest = list(inputs[2:])
    w3 = rest.pop(0) if g.epilogue == EPI_SWIGLU else x
    bias = rest.pop(0) if g.has_bias else x
    residual = rest.pop(0) if g.epilogue == EPI_RESIDUAL else x
    return x, w, w3, bias, residual


# ---- tiled --------------------------------------------------------------------------------------


def _tiled_params() -> list[Param]:
    return [Param("BLOCK_M", TILE_M), Param("BLOCK_N", TILE_N), Param("BLOCK_K", TILE_K), Param("GROUP_M", GROUPS),
            Param("num_warps", WARPS), Param("num_stages", STAGES)]  # fmt: skip


def _tiled_space(spec: OpSpec, prune: bool = True) -> Space:
    return _space(_tiled_params(), _geometry(spec), prune, TILE_M[0])


def _tiled_build(spec: OpSpec, config: Config) -> Launcher:
    checked(_tiled_space(spec, prune=False), config)
    return _tiled_launcher(_geometry(spec), config)


def _tiled_launcher(g: _Geometry, config: Config) -> Launcher:
    """The tiled kernel's launcher for a config already checked (tiled's, or tma's for its fallback)."""
    flags = _tile_flags(g, config)
    tiles = triton.cdiv(g.m, flags["BLOCK_M"]) * triton.cdiv(g.n, flags["BLOCK_N"])
    kernel = direct_launch(_matmul_tiled_kernel, (tiles,))
    stride_wk, stride_wn = _weight_strides(g)
    group_m, num_warps, num_stages = int(config["GROUP_M"]), int(config["num_warps"]), int(config["num_stages"])

    def launch(inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> None:
        x, w, w3, bias, residual = _operands(g, inputs)
        kernel(x, w, w3, bias, residual, outputs[0], g.m, g.n, g.k, g.k, stride_wk, stride_wn, g.n, g.n,
               HAS_BIAS=g.has_bias, EPILOGUE=g.epilogue, GROUP_M=group_m, **flags,
               num_warps=num_warps, num_stages=num_stages)  # fmt: skip

    return launch


# ---- persistent ---------------------------------------------------------------------------------


def _persistent_params() -> list[Param]:
    return [Param("BLOCK_M", PERSISTENT_TILE), Param("BLOCK_N", PERSISTENT_TILE), Param("BLOCK_K", TILE_K),
            Param("GROUP_M", GROUPS), Param("num_warps", WARPS), Param("num_stages", PERSISTENT_STAGES),
            Param("FLATTEN", (False, True))]  # fmt: skip


def _persistent_space(spec: OpSpec, prune: bool = True) -> Space:
    return _space(_persistent_params(), _geometry(spec), prune, PERSISTENT_TILE[0])


def _persistent_build(spec: OpSpec, config: Config) -> Launcher:
    checked(_persistent_space(spec, prune=False), config)
    g = _geometry(spec)
    flags = _tile_flags(g, config)
    tiles = triton.cdiv(g.m, flags["BLOCK_M"]) * triton.cdiv(g.n, flags["BLOCK_N"])
    kernel = direct_launch(_matmul_persistent_kernel, (min(tiles, multiprocessor_count()),))
    stride_wk, stride_wn = _weight_strides(g)
    group_m, flatten = int(config["GROUP_M"]), bool(config["FLATTEN"])
    num_warps, num_stages = int(config["num_warps"]), int(config["num_stages"])

    def launch(inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> None:
        x, w, w3, bias, residual = _operands(g, inputs)
        kernel(x, w, w3, bias, residual, outputs[0], g.m, g.n, g.k, g.k, stride_wk, stride_wn, g.n, g.n,
               HAS_BIAS=g.has_bias, EPILOGUE=g.epilogue, GROUP_M=group_m, FLATTEN=flatten, **flags,
               num_warps=num_warps, num_stages=num_stages)  # fmt: skip

    return launch


# ---- split_k ------------------------------------------------------------------------------------


def _split_k_params() -> list[Param]:
    return [Param("BLOCK_M", SPLIT_TILE_M), Param("BLOCK_N", TILE_N), Param("BLOCK_K", SPLIT_TILE_K),
            Param("SPLIT_K", SPLITS), Param("num_warps", SPLIT_WARPS), Param("num_stages", SPLIT_STAGES)]  # fmt: skip


def _split_k_space(spec: OpSpec, prune: bool = True) -> Space:
    g = _geometry(spec)
    extra = [Constraint("every split gets at least one K block",
                        lambda c: c["SPLIT_K"] <= triton.cdiv(g.k, c["BLOCK_K"]))]  # fmt: skip
    if prune:
        extra.append(Constraint(f"split-K is for M <= {SPLIT_K_MAX_M}", lambda c: g.m <= SPLIT_K_MAX_M))
    return _space(_split_k_params(), g, prune, SPLIT_TILE_M[0], extra)


def _reduce_tile(m: int) -> tuple[int, int]:
    """(BLOCK_M, BLOCK_N) of the reduction: REDUCE_TILE elements, at most 16 rows."""
    block_m = min(next_power_of_two(m), 16)
    return block_m, REDUCE_TILE // block_m


def _split_k_build(spec: OpSpec, config: Config) -> Launcher:
    checked(_split_k_space(spec, prune=False), config)
    g = _geometry(spec)
    flags = _tile_flags(g, config)
    splits = int(config["SPLIT_K"])
    tiles = triton.cdiv(g.m, flags["BLOCK_M"]) * triton.cdiv(g.n, flags["BLOCK_N"])
    partial_kernel = direct_launch(_matmul_split_k_kernel, (tiles, splits))
    reduce_m, reduce_n = _reduce_tile(g.m)
    reduce_grid = (triton.cdiv(g.m, reduce_m), triton.cdiv(g.n, reduce_n))
    reduce_kernel = direct_launch(_matmul_split_k_reduce_kernel, reduce_grid)
    stride_wk, stride_wn = _weight_strides(g)
    num_warps, num_stages = int(config["num_warps"]), int(config["num_stages"])
    scratch_shape = (g.weights * splits, g.m, g.n)

    def launch(inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> None:
        x, w, w3, bias, residual = _operands(g, inputs)
        y = outputs[0]
        partial = y.new_empty(scratch_shape, dtype=torch.float32)  # every element is written
        partial_kernel(x, w, w3, partial, g.m, g.n, g.k, g.k, stride_wk, stride_wn,
                       SPLIT_K=splits, SWIGLU=g.epilogue == EPI_SWIGLU, **flags,
                       num_warps=num_warps, num_stages=num_stages)  # fmt: skip
        reduce_kernel(partial, y, bias, residual, g.m, g.n, g.n, g.n,
                      SPLIT_K=splits, HAS_BIAS=g.has_bias, EPILOGUE=g.epilogue,
                      BLOCK_M=reduce_m, BLOCK_N=reduce_n, num_warps=REDUCE_WARPS)  # fmt: skip

    return launch


# ---- tma ----------------------------------------------------------------------------------------


@functools.cache
def tma_available() -> bool:
    """Whether the tma variant can run here (see :func:`kernelsmith.ops._launch.tma_available`)."""
    return tma_descriptors_here(INTERPRETED)


def _tma_aligned(g: _Geometry) -> bool:
    """A tensor descriptor needs rows that start on 16-byte boundaries: K (and, for layout
    "matmul", N) elements of a row must be a multiple of 16 bytes."""
    weight_row = g.k if g.layout == "linear" else g.n
    return (g.k * g.itemsize) % 16 == 0 and (weight_row * g.itemsize) % 16 == 0


def _tma_params() -> list[Param]:
    return [Param("BLOCK_M", PERSISTENT_TILE), Param("BLOCK_N", PERSISTENT_TILE), Param("BLOCK_K", TILE_K),
            Param("GROUP_M", GROUPS), Param("num_warps", WARPS), Param("num_stages", STAGES)]  # fmt: skip


def _tma_space(spec: OpSpec, prune: bool = True) -> Space:
    g = _geometry(spec)
    usable = tma_available() and _tma_aligned(g)
    extra = [Constraint("tensor descriptors: Hopper or newer, a Triton that has them, 16-byte aligned rows",
                        lambda c: usable)]  # fmt: skip
    return _space(_tma_params(), g, prune, PERSISTENT_TILE[0], extra)


def _tma_build(spec: OpSpec, config: Config) -> Launcher:
    checked(_tma_space(spec, prune=False), config)
    g = _geometry(spec)
    flags = _tile_flags(g, config)
    block_m, block_n, block_k = flags["BLOCK_M"], flags["BLOCK_N"], flags["BLOCK_K"]
    tiles = triton.cdiv(g.m, block_m) * triton.cdiv(g.n, block_n)
    kernel = direct_launch(_matmul_tma_kernel, (tiles,))
    descriptor = tensor_descriptor_class()
    linear = g.layout == "linear"
    w_shape, w_block = ([g.n, g.k], [block_n, block_k]) if linear else ([g.k, g.n], [block_k, block_n])
    group_m, num_warps, num_stages = int(config["GROUP_M"]), int(config["num_warps"]), int(config["num_stages"])
    # The same tiles through pointers, for inputs whose storage does not start 16-byte aligned (a
    # view into a larger tensor): a descriptor cannot address them.
    fallback = _tiled_launcher(g, config)

    def launch(inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> None:
        x, w, w3, bias, residual = _operands(g, inputs)
        if any(t.data_ptr() % 16 for t in (x, w, w3)):
            fallback(inputs, outputs)
            return
        x_desc = descriptor(x, [g.m, g.k], [g.k, 1], [block_m, block_k])
        w_desc = descriptor(w, w_shape, [w_shape[1], 1], w_block)
        w3_desc = descriptor(w3, w_shape, [w_shape[1], 1], w_block) if g.epilogue == EPI_SWIGLU else w_desc
        kernel(x_desc, w_desc, w3_desc, bias, residual, outputs[0], g.m, g.n, g.k, g.n, g.n,
               HAS_BIAS=g.has_bias, EPILOGUE=g.epilogue, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
               GROUP_M=group_m, LINEAR=linear, IEEE=g.ieee, UPCAST=g.upcast,
               num_warps=num_warps, num_stages=num_stages)  # fmt: skip

    return launch


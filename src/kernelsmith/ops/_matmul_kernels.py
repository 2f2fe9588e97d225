"""The kernels of the matmul family (:mod:`kernelsmith.ops.matmul`, whose docstring explains the
op, its precision and the variants): the tiled, persistent, split-K (and its ordered reduction)
and TMA forms of ``y = epilogue(x @ w.T + bias)``, and the epilogue they share. The decode-shaped
family (:mod:`kernelsmith.ops._decode_matmul_kernels`) and the fused linear cross-entropy borrow
the dot, the epilogue and the reduction. The spaces and launchers are in
:mod:`kernelsmith.ops._matmul_launch`.
"""

from __future__ import annotations

from typing import Any

import triton
import triton.language as tl

from kernelsmith.ops.gelu import gelu_f32, sigmoid_f32

EPILOGUES = ("none", "gelu", "gelu_tanh", "silu", "residual", "swiglu")

# The epilogue as a kernel constexpr.
EPI_NONE, EPI_GELU, EPI_GELU_TANH, EPI_SILU, EPI_RESIDUAL, EPI_SWIGLU = range(6)
_EPILOGUE_CODES = dict(zip(EPILOGUES, range(6), strict=True))

# =================================================================================================
# Kernels
#
# x is (M, K) with row stride stride_xm and unit column stride; the weight is read as a (K, N)
# matrix through two strides: (stride_wk, stride_wn) = (1, K) for layout "linear" (w stored
# (N, K)) and (N, 1) for "matmul". w3 (SwiGLU's up projection) has w's layout and strides.
# =================================================================================================


@triton.jit
def _dot(a, b, acc, IEEE: tl.constexpr, UPCAST: tl.constexpr):
    """acc + a @ b in float32: IEEE float32 products for float32 tiles when TF32 is not allowed;
    UPCAST widens the tiles first (the interpreter's bfloat16 dot is wrong: see kernelsmith.ops.matmul)."""
    if UPCAST:
        a = a.to(tl.float32)
        b = b.to(tl.float32)
    return tl.dot(a, b, acc, input_precision="ieee") if IEEE else tl.dot(a, b, acc)


@triton.jit
def _tile_ids(tile, num_pid_m, num_pid_n, GROUP_M: tl.constexpr):
    """(pid_m, pid_n) of tile number ``tile`` in grouped order.

    Tiles are numbered down columns of GROUP_M tile rows: tile 0 is (0, 0), tile 1 (1, 0), ...,
    tile GROUP_M is (0, 1). The last group has ``num_pid_m % GROUP_M`` rows when that is not 0.
    """
    per_group = GROUP_M * num_pid_n
    group = tile // per_group
    first_m = group * GROUP_M
    group_rows = tl.minimum(num_pid_m - first_m, GROUP_M)
    within = tile % per_group
    return first_m + within % group_rows, within // group_rows


@triton.jit
def _tile_product(
    x_ptr, w_ptr, w3_ptr, pid_m, pid_n, k_first, k_last, M, N, K, stride_xm, stride_wk, stride_wn,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_N: tl.constexpr,
    EVEN_K: tl.constexpr, SWIGLU: tl.constexpr, IEEE: tl.constexpr, UPCAST: tl.constexpr,
):  # fmt: skip
    """The float32 products of tile (pid_m, pid_n) over the K blocks [k_first, k_last):
    ``(x @ w, x @ w3)`` (the second is the first again unless SWIGLU)."""
    # Rows past M and columns past N read row % M and col % N: valid addresses, no mask in the
    # loop; those rows and columns are never stored.
    rows = ((pid_m * BLOCK_M + tl.arange(0, BLOCK_M)) % M).to(tl.int64)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    if not EVEN_N:
        cols = cols % N
    ks = k_first * BLOCK_K + tl.arange(0, BLOCK_K)
    x_ptrs = x_ptr + rows[:, None] * stride_xm + ks[None, :]
    w_offsets = ks[:, None].to(tl.int64) * stride_wk + cols[None, :].to(tl.int64) * stride_wn
    w_ptrs = w_ptr + w_offsets
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    if SWIGLU:  # (constexpr branches: without SwiGLU, no w3 pointers or accumulator exist at all)
        w3_ptrs = w3_ptr + w_offsets
        acc3 = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    k_offsets = tl.arange(0, BLOCK_K)
    for kb in range(k_first, k_last):
        if EVEN_K:
            a = tl.load(x_ptrs)
            b = tl.load(w_ptrs)
        else:
            k_mask = k_offsets < K - kb * BLOCK_K  # the last block may run past K
            a = tl.load(x_ptrs, mask=k_mask[None, :], other=0.0)
            b = tl.load(w_ptrs, mask=k_mask[:, None], other=0.0)
        acc = _dot(a, b, acc, IEEE, UPCAST)
        if SWIGLU:
            b3 = tl.load(w3_ptrs) if EVEN_K else tl.load(w3_ptrs, mask=k_mask[:, None], other=0.0)
            acc3 = _dot(a, b3, acc3, IEEE, UPCAST)
            w3_ptrs += BLOCK_K * stride_wk
        x_ptrs += BLOCK_K
        w_ptrs += BLOCK_K * stride_wk
    if not SWIGLU:
        acc3 = acc  # unused: the epilogue reads it for SwiGLU only
    return acc, acc3


@triton.jit
def _finish_tile(
    acc, acc3, y_ptr, bias_ptr, res_ptr, pid_m, pid_n, M, N, stride_ym, stride_rm,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HAS_BIAS: tl.constexpr, EPILOGUE: tl.constexpr,
):  # fmt: skip
    """The epilogue on a float32 [BLOCK_M, BLOCK_N] product, rounded once, stored masked."""
    rows = pid_m.to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    col_mask = cols < N
    mask = (rows < M)[:, None] & col_mask[None, :]
    if HAS_BIAS:
        acc += tl.load(bias_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)[None, :]
    if EPILOGUE == 1:
        acc = gelu_f32(acc, False)
    elif EPILOGUE == 2:
        acc = gelu_f32(acc, True)
    elif EPILOGUE == 3:
        acc = acc * sigmoid_f32(acc)
    elif EPILOGUE == 4:
        res = tl.load(res_ptr + rows[:, None] * stride_rm + cols[None, :], mask=mask, other=0.0)
        acc += res.to(tl.float32)
    elif EPILOGUE == 5:
        acc = acc * sigmoid_f32(acc) * acc3
    tl.store(y_ptr + rows[:, None] * stride_ym + cols[None, :], acc.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _whole_tile(
    x_ptr, w_ptr, w3_ptr, bias_ptr, res_ptr, y_ptr, pid_m, pid_n, k_blocks, M, N, K,
    stride_xm, stride_wk, stride_wn, stride_rm, stride_ym, HAS_BIAS: tl.constexpr, EPILOGUE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_N: tl.constexpr,
    EVEN_K: tl.constexpr, IEEE: tl.constexpr, UPCAST: tl.constexpr,
):  # fmt: skip
    """Output tile (pid_m, pid_n) over all ``k_blocks`` blocks of K, its epilogue and its store:
    what the tiled and the persistent kernels do with each tile they own (a jitted call is
    inlined, so the kernels compile as if it were written out in each)."""
    acc, acc3 = _tile_product(x_ptr, w_ptr, w3_ptr, pid_m, pid_n, 0, k_blocks, M, N, K,
                              stride_xm, stride_wk, stride_wn, BLOCK_M, BLOCK_N, BLOCK_K, EVEN_N, EVEN_K,
                              EPILOGUE == 5, IEEE, UPCAST)  # fmt: skip
    _finish_tile(acc, acc3, y_ptr, bias_ptr, res_ptr, pid_m, pid_n, M, N, stride_ym, stride_rm,
                 BLOCK_M, BLOCK_N, HAS_BIAS, EPILOGUE)  # fmt: skip


@triton.jit
def _matmul_tiled_kernel(
    x_ptr, w_ptr, w3_ptr, bias_ptr, res_ptr, y_ptr, M, N, K, stride_xm, stride_wk, stride_wn, stride_rm, stride_ym,
    HAS_BIAS: tl.constexpr, EPILOGUE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, EVEN_N: tl.constexpr, EVEN_K: tl.constexpr,
    IEEE: tl.constexpr, UPCAST: tl.constexpr,
):  # fmt: skip
    """tiled: program i computes output tile i (grouped order)."""
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    pid_m, pid_n = _tile_ids(tl.program_id(0), num_pid_m, num_pid_n, GROUP_M)
    _whole_tile(x_ptr, w_ptr, w3_ptr, bias_ptr, res_ptr, y_ptr, pid_m, pid_n, tl.cdiv(K, BLOCK_K), M, N, K,
                stride_xm, stride_wk, stride_wn, stride_rm, stride_ym, HAS_BIAS, EPILOGUE,
                BLOCK_M, BLOCK_N, BLOCK_K, EVEN_N, EVEN_K, IEEE, UPCAST)  # fmt: skip


@triton.jit
def _matmul_persistent_kernel(
    x_ptr, w_ptr, w3_ptr, bias_ptr, res_ptr, y_ptr, M, N, K, stride_xm, stride_wk, stride_wn, stride_rm, stride_ym,
    HAS_BIAS: tl.constexpr, EPILOGUE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, EVEN_N: tl.constexpr, EVEN_K: tl.constexpr,
    IEEE: tl.constexpr, UPCAST: tl.constexpr, FLATTEN: tl.constexpr,
):  # fmt: skip
    """persistent: a fixed grid; program pid computes tiles pid, pid + programs, ..."""
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    k_blocks = tl.cdiv(K, BLOCK_K)
    for tile in tl.range(tl.program_id(0), num_pid_m * num_pid_n, tl.num_programs(0), flatten=FLATTEN):
        # tl.cast, not .to(): in the interpreter the loop variable is a plain Python int.
        pid_m, pid_n = _tile_ids(tl.cast(tile, tl.int32), num_pid_m, num_pid_n, GROUP_M)
        _whole_tile(x_ptr, w_ptr, w3_ptr, bias_ptr, res_ptr, y_ptr, pid_m, pid_n, k_blocks, M, N, K,
                    stride_xm, stride_wk, stride_wn, stride_rm, stride_ym, HAS_BIAS, EPILOGUE,
                    BLOCK_M, BLOCK_N, BLOCK_K, EVEN_N, EVEN_K, IEEE, UPCAST)  # fmt: skip


@triton.jit
def _matmul_split_k_kernel(
    x_ptr, w_ptr, w3_ptr, partial_ptr, M, N, K, stride_xm, stride_wk, stride_wn,
    SPLIT_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    EVEN_N: tl.constexpr, EVEN_K: tl.constexpr, SWIGLU: tl.constexpr, IEEE: tl.constexpr, UPCAST: tl.constexpr,
):  # fmt: skip
    """split_k, step 1: program (tile, s) writes the float32 product of its tile over the s-th
    range of K blocks to partial[s] (and x @ w3's to partial[SPLIT_K + s] for SwiGLU)."""
    num_pid_n = tl.cdiv(N, BLOCK_N)
    tile = tl.program_id(0)
    pid_m = tile // num_pid_n
    pid_n = tile % num_pid_n
    split = tl.program_id(1)
    k_blocks = tl.cdiv(K, BLOCK_K)
    per_split = tl.cdiv(k_blocks, SPLIT_K)
    k_first = split * per_split
    k_last = tl.minimum(k_first + per_split, k_blocks)  # an empty range stores zeros
    acc, acc3 = _tile_product(x_ptr, w_ptr, w3_ptr, pid_m, pid_n, k_first, k_last, M, N, K,
                              stride_xm, stride_wk, stride_wn, BLOCK_M, BLOCK_N, BLOCK_K, EVEN_N, EVEN_K,
                              SWIGLU, IEEE, UPCAST)  # fmt: skip
    rows = pid_m.to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (rows < M)[:, None] & (cols < N)[None, :]
    plane = tl.cast(M, tl.int64) * N  # elements of one partial product (tl.cast: M = 1 is a constexpr)
    offsets = rows[:, None] * N + cols[None, :]
    tl.store(partial_ptr + split * plane + offsets, acc, mask=mask)
    if SWIGLU:
        tl.store(partial_ptr + (SPLIT_K + split) * plane + offsets, acc3, mask=mask)


@triton.jit
def _matmul_split_k_reduce_kernel(
    partial_ptr, y_ptr, bias_ptr, res_ptr, M, N, stride_ym, stride_rm,
    SPLIT_K: tl.constexpr, HAS_BIAS: tl.constexpr, EPILOGUE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    """split_k, step 2: sum the SPLIT_K partials of a tile in order 0, 1, ... (bitwise
    reproducible), then the epilogue and the store."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rows = pid_m.to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (rows < M)[:, None] & (cols < N)[None, :]
    plane = tl.cast(M, tl.int64) * N
    offsets = rows[:, None] * N + cols[None, :]
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    acc3 = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for s in tl.static_range(SPLIT_K):
        acc += tl.load(partial_ptr + s * plane + offsets, mask=mask, other=0.0)
        if EPILOGUE == 5:
            acc3 += tl.load(partial_ptr + (SPLIT_K + s) * plane + offsets, mask=mask, other=0.0)
    _finish_tile(acc, acc3, y_ptr, bias_ptr, res_ptr, pid_m, pid_n, M, N, stride_ym, stride_rm,
                 BLOCK_M, BLOCK_N, HAS_BIAS, EPILOGUE)  # fmt: skip


@triton.jit
def _weight_tile(desc, off_k, off_n, LINEAR: tl.constexpr):
    """The [BLOCK_K, BLOCK_N] weight tile at (off_k, off_n) through a tensor descriptor: layout
    "linear" stores the weight (N, K), so its [BLOCK_N, BLOCK_K] block is loaded and transposed."""
    return tl.trans(desc.load([off_n, off_k])) if LINEAR else desc.load([off_k, off_n])


@triton.jit
def _matmul_tma_kernel(
    x_desc, w_desc, w3_desc, bias_ptr, res_ptr, y_ptr, M, N, K, stride_rm, stride_ym,
    HAS_BIAS: tl.constexpr, EPILOGUE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, LINEAR: tl.constexpr, IEEE: tl.constexpr, UPCAST: tl.constexpr,
):  # fmt: skip
    """tma: the tiled kernel with x and weight tiles loaded by the Tensor Memory Accelerator (one
    bulk copy a tile; blocks past the tensors' ends read zeros, so no masks and no modulo)."""
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    pid_m, pid_n = _tile_ids(tl.program_id(0), num_pid_m, num_pid_n, GROUP_M)
    off_m = pid_m * BLOCK_M
    off_n = pid_n * BLOCK_N
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    if EPILOGUE == 5:
        acc3 = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for kb in range(0, tl.cdiv(K, BLOCK_K)):
        off_k = kb * BLOCK_K
        a = x_desc.load([off_m, off_k])
        acc = _dot(a, _weight_tile(w_desc, off_k, off_n, LINEAR), acc, IEEE, UPCAST)
        if EPILOGUE == 5:
            acc3 = _dot(a, _weight_tile(w3_desc, off_k, off_n, LINEAR), acc3, IEEE, UPCAST)
    if EPILOGUE != 5:
        acc3 = acc  # unused
    _finish_tile(acc, acc3, y_ptr, bias_ptr, res_ptr, pid_m, pid_n, M, N, stride_ym, stride_rm,
                 BLOCK_M, BLOCK_N, HAS_BIAS, EPILOGUE)  # fmt: skip


def _interpreted(kernel: Any) -> bool:
    """Whether Triton runs ``kernel`` in its interpreter (decided when the kernel was defined)."""
    try:
        from triton.runtime.interpreter import InterpretedFunction
    except ImportError:  # pragma: no cover - every supported Triton has it
        return False
    return isinstance(kernel, InterpretedFunction)


INTERPRETED = _interpreted(_matmul_tiled_kernel)

"""Matrix multiplication with fused epilogues: ``y = epilogue(x @ w.T + bias)`` in one kernel.

The op
------
``x`` of shape ``(..., K)`` (every leading dimension flattened into ``M`` rows) times a 2-D weight,
in one of two layouts (the constant ``layout``):

``"linear"`` (default)
    ``w`` is ``(N, K)``, as ``nn.Linear`` stores it: ``y = x @ w.T``, i.e. ``F.linear(x, w)``;
``"matmul"``
    ``w`` is ``(K, N)``: ``y = x @ w``.

The output is ``(..., N)`` in the input dtype. What happens to the product before it is stored is
the constant ``epilogue``, plus the constant ``bias`` (a ``(N,)`` vector added first, as
``F.linear(x, w, b)`` does):

============  ===============================================  =========================
epilogue      y (``h = x @ w.T`` plus the bias, if any)        inputs
============  ===============================================  =========================
``none``      ``h``                                            ``x, w[, bias]``
``gelu``      ``F.gelu(h)`` (exact, erf)                       ``x, w[, bias]``
``gelu_tanh`` ``F.gelu(h, approximate="tanh")``                ``x, w[, bias]``
``silu``      ``F.silu(h) = h * sigmoid(h)``                   ``x, w[, bias]``
``residual``  ``h + r``, ``r`` shaped like the output          ``x, w[, bias], r``
``swiglu``    ``F.silu(x @ w1.T) * (x @ w3.T)`` (Llama's MLP)  ``x, w1, w3`` (no bias)
============  ===============================================  =========================

The command line's ``--epilogue bias`` is ``bias=True`` with ``epilogue="none"``, and the two may
be joined: ``--epilogue bias+gelu`` (GPT-2's and BERT's MLP), ``bias+residual``. ``swiglu`` runs
both products in one kernel, sharing every load of ``x``.

Precision
---------
float16 and bfloat16 tiles are multiplied on the tensor cores with float32 accumulation, as
cuBLAS does. float32 inputs are multiplied in float32 (``tl.dot(..., input_precision="ieee")``)
unless the user's PyTorch lets cuBLAS use TF32 (``torch.backends.cuda.matmul.allow_tf32``, or the
newer ``fp32_precision == "tf32"`` that ``torch.set_float32_matmul_precision("high")`` sets): then
the kernels use TF32 too. The setting is read when a spec is made and recorded as the constant
``allow_tf32`` (always False for 16-bit inputs, where it means nothing), so that it is part of the
workload, and the reference (:meth:`Matmul.reference`) runs under the recorded setting, in
whatever process computes it. The epilogue is computed in float32 on the accumulator and rounded
once, on the store; the PyTorch reference rounds the product first and the epilogue's result again,
so the kernels are a little more accurate than the baseline they are measured against.

The variants
------------
Every variant cuts the ``(M, N)`` output into ``BLOCK_M x BLOCK_N`` tiles and walks ``K`` in
``BLOCK_K`` steps (``tl.dot`` on each pair of tiles); they differ in how tiles meet programs:

``tiled``
    One program per output tile. Programs are numbered in *grouped* order (``GROUP_M``): ``GROUP_M``
    consecutive programs share a column of weight tiles and walk down ``GROUP_M`` row tiles before
    moving right, so the weight tiles they read are still in L2 (with ``GROUP_M = 1``, plain
    row-major order: each row of tiles reads the whole weight again).
``persistent``
    One program per multiprocessor, each walking tiles ``pid, pid + programs, ...`` in the same
    grouped order. ``FLATTEN`` asks the compiler to flatten the tile and K loops into one
    software-pipelined loop (``tl.range(flatten=True)``), so the next tile's loads overlap the
    current tile's epilogue.
``split_k``
    For small ``M`` (decoding, ``M`` = 1..64): there are too few output tiles to fill the GPU, so
    ``K`` is cut into ``SPLIT_K`` ranges, one program per (tile, range). Each writes its float32
    partial product to a ``(SPLIT_K, M, N)`` scratch buffer; a second kernel sums the partials in
    a fixed order (bitwise reproducible: no atomics) and applies the epilogue. Offered when
    ``M <= SPLIT_K_MAX_M``.
``tma``
    ``tiled`` with the ``x`` and weight tiles loaded by the Tensor Memory Accelerator through
    tensor descriptors (``triton.tools.tensor_descriptor.TensorDescriptor``, made on the host at
    each call): one bulk copy a tile, zeros past the tensors' ends (no masks, no modulo). Its space
    is empty unless the installed Triton has tensor descriptors and the GPU is a Hopper or newer
    (or kernels run in the interpreter), and unless rows are 16-byte aligned (``K``, and ``N`` for
    layout ``"matmul"``, a multiple of 16 bytes). A call whose ``x`` or weight storage does not
    start on a 16-byte boundary (a view into a larger tensor) runs the ``tiled`` kernel with the
    same config instead.

Rows past ``M`` and columns past ``N`` are read at ``row % M`` and ``col % N`` (valid addresses,
no mask in the inner loop) and masked on the store; when ``N`` or ``K`` is a multiple of its
block (compile-time flags ``EVEN_N``, ``EVEN_K``, known from the spec) the modulo or the ``K`` mask
disappears. Row offsets are 64-bit.

Spaces, buckets and validation
------------------------------
Parameters are ``BLOCK_M``, ``BLOCK_N``, ``BLOCK_K``, ``GROUP_M``, ``num_warps``, ``num_stages``
(plus ``FLATTEN`` or ``SPLIT_K``). *Validity* constraints depend on the dtype, ``N``, ``K`` and the
epilogue only: the float32 accumulators fit in registers (at most ``MAX_ACCUMULATORS_PER_THREAD``
a thread; SwiGLU has two), the ``num_stages`` pipelined tiles fit in shared memory
(``SHARED_MEMORY_BUDGET``), blocks no wider than the padded ``N`` and ``K``. *Pruning* constraints
also look at ``M`` (tiles taller than the padded ``M`` only compute masked rows; tiles under 64
rows or columns are for a small ``M`` or ``N``; ``GROUP_M > 1`` with one row of tiles changes
nothing; split-K for large ``M``): they shape the search, but
``build`` checks validity only, so a config tuned for ``M`` rows is correct, and accepted, for any
other row count: the validation tails (1, 7, 67 and ``M - 1`` rows, the ones below ``M``) and the
row counts of its bucket (``M`` rounded up to a power of two at fixed ``N`` and ``K``).

Testing without a GPU: the Triton interpreter's ``tl.dot`` multiplies bfloat16 *bit patterns* as
integers (it runs ``numpy.matmul`` on the raw 16-bit storage), so in interpreter mode, and only
there, bfloat16 tiles are widened to float32 before the dot (``UPCAST``): exact, and the same
arithmetic as the tensor cores' bfloat16 products with float32 accumulation.

Front doors: ``kernelsmith tune matmul --shape 8192x11008x4096 --epilogue bias+gelu``;
``@kernelsmith.optimize`` recognizes ``F.linear``, ``nn.Linear``, ``@`` and ``torch.matmul`` with
the epilogues above (:mod:`kernelsmith.frontends.patterns.matmul`). There is no backward family
yet: a call whose inputs require gradients runs as written.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import inspect
import math
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from kernelsmith.ops import gelu as _gelu_module
from kernelsmith.ops._base import Launcher, OpFamily, Tolerance, UnsupportedWorkload, Variant, generator
from kernelsmith.ops._launch import direct_launch, tensor_descriptor_class
from kernelsmith.ops._launch import tma_available as tma_descriptors_here
from kernelsmith.ops.gelu import checked, gelu_f32, multiprocessor_count, sigmoid_f32
from kernelsmith.space import Config, Constraint, Param, Space, next_power_of_two
from kernelsmith.spec import OpSpec, TensorSpec, dtype_name

LAYOUTS = ("linear", "matmul")
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
    UPCAST widens the tiles first (the interpreter's bfloat16 dot is wrong, see the docstring)."""
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
    acc, acc3 = _tile_product(x_ptr, w_ptr, w3_ptr, pid_m, pid_n, 0, tl.cdiv(K, BLOCK_K), M, N, K,
                              stride_xm, stride_wk, stride_wn, BLOCK_M, BLOCK_N, BLOCK_K, EVEN_N, EVEN_K,
                              EPILOGUE == 5, IEEE, UPCAST)  # fmt: skip
    _finish_tile(acc, acc3, y_ptr, bias_ptr, res_ptr, pid_m, pid_n, M, N, stride_ym, stride_rm,
                 BLOCK_M, BLOCK_N, HAS_BIAS, EPILOGUE)  # fmt: skip


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
        acc, acc3 = _tile_product(x_ptr, w_ptr, w3_ptr, pid_m, pid_n, 0, k_blocks, M, N, K,
                                  stride_xm, stride_wk, stride_wn, BLOCK_M, BLOCK_N, BLOCK_K, EVEN_N, EVEN_K,
                                  EPILOGUE == 5, IEEE, UPCAST)  # fmt: skip
        _finish_tile(acc, acc3, y_ptr, bias_ptr, res_ptr, pid_m, pid_n, M, N, stride_ym, stride_rm,
                     BLOCK_M, BLOCK_N, HAS_BIAS, EPILOGUE)  # fmt: skip


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


# =================================================================================================
# Precision setting
# =================================================================================================


def tf32_allowed() -> bool:
    """Whether PyTorch currently lets cuBLAS multiply float32 matrices in TF32.

    Newer PyTorch (2.9+) keeps the setting in ``torch.backends.cuda.matmul.fp32_precision``
    (``"tf32"``, ``"ieee"``, or ``"none"``: the default, IEEE); reading the legacy
    ``allow_tf32`` raises there once a program has mixed the two APIs, so the new one is read
    first.
    """
    matmul = torch.backends.cuda.matmul
    precision = getattr(matmul, "fp32_precision", None)
    if isinstance(precision, str):
        return precision == "tf32"
    return bool(matmul.allow_tf32)  # pragma: no cover - PyTorch before 2.9


@contextlib.contextmanager
def matmul_precision(allow_tf32: bool) -> Iterator[None]:
    """Run the block with cuBLAS's float32 matmul precision set as recorded in a spec; nothing is
    touched when it already is (in the user's own process it normally is)."""
    if tf32_allowed() == allow_tf32:
        yield
        return
    matmul = torch.backends.cuda.matmul
    if isinstance(getattr(matmul, "fp32_precision", None), str):
        previous = matmul.fp32_precision
        matmul.fp32_precision = "tf32" if allow_tf32 else "ieee"
        try:
            yield
        finally:
            matmul.fp32_precision = previous
    else:  # pragma: no cover - PyTorch before 2.9
        old = matmul.allow_tf32
        matmul.allow_tf32 = allow_tf32
        try:
            yield
        finally:
            matmul.allow_tf32 = old


# =================================================================================================
# The op family
# =================================================================================================


@dataclass(frozen=True)
class _MatmulVariant(Variant):
    """A variant whose kernels also run code of kernelsmith.ops.gelu (the activations): its
    source hash covers that module too, so that a change there invalidates stored decisions."""

    @property
    def source_hash(self) -> str:
        text = f"{super().source_hash}\n{inspect.getsource(_gelu_module)}"
        return hashlib.sha256(text.encode()).hexdigest()[:16]


def parse_epilogue(epilogue: Any = "none", bias: Any = None) -> tuple[str, bool]:
    """``(epilogue, bias)`` from an epilogue name that may include ``bias``: ``"bias"`` is
    ``("none", True)``, ``"bias+gelu"`` (or ``"bias,gelu"``) ``("gelu", True)``.

    >>> parse_epilogue("bias+gelu")
    ('gelu', True)
    >>> parse_epilogue("residual", bias=True)
    ('residual', True)
    """
    if not isinstance(epilogue, str):
        raise UnsupportedWorkload(f"matmul: epilogue must be a string such as 'bias+gelu', not {epilogue!r}")
    if bias is not None and not isinstance(bias, bool):
        raise UnsupportedWorkload(f"matmul: bias must be true or false, not {bias!r}")
    tokens = [t for t in re.split(r"[+,\s]+", epilogue.strip().lower()) if t]
    named_bias = "bias" in tokens
    if named_bias and bias is False:
        raise UnsupportedWorkload(f"matmul: epilogue {epilogue!r} names a bias but bias=False")
    rest = [t for t in tokens if t != "bias"]
    if len(rest) > 1:
        raise UnsupportedWorkload(f"matmul: one epilogue at a time besides the bias, not {rest}")
    name = rest[0] if rest else "none"
    if name not in EPILOGUES:
        raise UnsupportedWorkload(f"matmul: epilogue must be bias or one of {EPILOGUES} (or bias+...), not {name!r}")
    has_bias = named_bias or bool(bias)
    if has_bias and name == "swiglu":
        raise UnsupportedWorkload("matmul: the swiglu epilogue takes no bias")
    return name, has_bias


_SUPPORTED_TORCH_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


class Matmul(OpFamily):
    name = "matmul"
    summary = ("y = epilogue(x @ w.T + bias) (or x @ w), the epilogue fused: none, gelu, gelu_tanh, silu, "
               "residual add, or swiglu (silu(x @ w1.T) * (x @ w3.T))")  # fmt: skip
    shape_help = (
        "MxNxK: x (M, K) times a weight (N, K) as nn.Linear stores it (layout=linear, the default) or "
        "(K, N) (layout=matmul); more leading sizes are batch dims of x (4x2048x11008x4096 is x "
        "(4, 2048, 4096)); --epilogue bias|gelu|silu|residual|swiglu, or bias+gelu"
    )
    distributions = ("normal", "wide", "outliers")
    tolerance = Tolerance()
    variants = (
        _MatmulVariant("tiled", "one program per BLOCK_M x BLOCK_N output tile, grouped order (GROUP_M) for L2 reuse",
                       _tiled_space, _tiled_build),
        _MatmulVariant("persistent", "one program per multiprocessor walking the tiles (FLATTEN: one pipelined loop)",
                       _persistent_space, _persistent_build),
        _MatmulVariant("split_k", "small M: K cut into SPLIT_K ranges, float32 partials summed in order by a "
                       "second kernel with the epilogue", _split_k_space, _split_k_build),
        _MatmulVariant("tma", "tiled, the x and weight tiles loaded through tensor descriptors (Hopper+; empty "
                       "space elsewhere)", _tma_space, _tma_build),
    )  # fmt: skip

    # ---- specs -----------------------------------------------------------------------------------
    def spec(
        self,
        shape: tuple[int, ...],
        dtype: str,
        layout: str = "linear",
        epilogue: str = "none",
        bias: bool | None = None,
        allow_tf32: bool | None = None,
        **constants: Any,
    ) -> OpSpec:
        """``shape`` is ``(..., M, N, K)``: x ``(..., M, K)``; the weight ``(N, K)`` or ``(K, N)``.

        >>> [str(t) for t in OP.spec((8192, 11008, 4096), "bf16", epilogue="bias+gelu").inputs]
        ['8192x4096:bfloat16', '11008x4096:bfloat16', '11008:bfloat16']
        """
        if constants:
            raise UnsupportedWorkload(f"matmul: unknown constants {sorted(constants)}")
        shape = tuple(int(s) for s in shape)
        if len(shape) < 3 or any(s <= 0 for s in shape):
            raise UnsupportedWorkload(f"matmul: the shape is M x N x K (positive sizes), not {shape}")
        *lead, n, k = shape
        name = dtype_name(dtype)
        epilogue, has_bias = parse_epilogue(epilogue, bias)
        consts = self._constants(layout, epilogue, has_bias, allow_tf32, name)
        x = TensorSpec((*lead, k), name)
        w = TensorSpec((n, k) if layout == "linear" else (k, n), name)
        inputs = [x, w]
        if epilogue == "swiglu":
            inputs.append(w)
        if has_bias:
            inputs.append(TensorSpec((n,), name))
        if epilogue == "residual":
            inputs.append(TensorSpec((*lead, n), name))
        spec = OpSpec(self.name, tuple(inputs), consts)
        self.check_supported(spec)
        return spec

    def spec_for(
        self,
        *inputs: torch.Tensor,
        layout: str = "linear",
        epilogue: str = "none",
        bias: bool | None = None,
        allow_tf32: bool | None = None,
        **constants: Any,
    ) -> OpSpec:
        """The spec of ``(x, w[, w3][, bias][, residual])``; with ``bias`` not given, a tensor more
        than the epilogue needs is the bias (``spec_for(x, w, b)`` is ``F.linear(x, w, b)``)."""
        if constants:
            raise UnsupportedWorkload(f"matmul: unknown constants {sorted(constants)}")
        if not all(isinstance(t, torch.Tensor) for t in inputs):
            raise UnsupportedWorkload("matmul takes tensors only")
        name, has_bias = parse_epilogue(epilogue, bias)
        needed = 2 + (name == "swiglu") + (name == "residual")
        if bias is None and "bias" not in epilogue.lower() and len(inputs) == needed + 1 and name != "swiglu":
            has_bias = True
        if len(inputs) != needed + has_bias:
            raise UnsupportedWorkload(
                f"matmul with epilogue {name!r}{' and a bias' if has_bias else ''} takes {needed + has_bias} "
                f"tensors, not {len(inputs)}"
            )
        for t in inputs:
            if t.dtype not in _SUPPORTED_TORCH_DTYPES:
                raise UnsupportedWorkload(f"matmul: dtype {t.dtype} is not supported")
        if inputs[0].dim() < 1 or inputs[0].numel() == 0:
            raise UnsupportedWorkload("matmul: x must be a non-empty tensor of at least one dimension")
        consts = self._constants(layout, name, has_bias, allow_tf32, dtype_name(inputs[0].dtype))
        spec = OpSpec(self.name, tuple(TensorSpec.of(t) for t in inputs), consts)
        self.check_supported(spec)
        return spec

    @staticmethod
    def _constants(layout: Any, epilogue: str, has_bias: bool, allow_tf32: Any, dtype: str) -> dict[str, Any]:
        if layout not in LAYOUTS:
            raise UnsupportedWorkload(f"matmul: layout must be one of {LAYOUTS}, not {layout!r}")
        if allow_tf32 is not None and not isinstance(allow_tf32, bool):
            raise UnsupportedWorkload(f"matmul: allow_tf32 must be true or false, not {allow_tf32!r}")
        if allow_tf32 and dtype != "float32":
            raise UnsupportedWorkload(f"matmul: allow_tf32 is for float32 inputs, not {dtype}")
        # 16-bit inputs are multiplied exactly: TF32 does not apply to them.
        tf32 = dtype == "float32" and (tf32_allowed() if allow_tf32 is None else allow_tf32)
        return {"layout": layout, "epilogue": epilogue, "bias": has_bias, "allow_tf32": tf32}

    def check_supported(self, spec: OpSpec) -> None:
        super().check_supported(spec)  # dtypes, contiguity
        consts = dict(spec.constants)
        if set(consts) != {"layout", "epilogue", "bias", "allow_tf32"}:
            raise UnsupportedWorkload(f"matmul: constants {sorted(consts)} are not layout, epilogue, bias, allow_tf32")
        epilogue, has_bias = parse_epilogue(consts["epilogue"], consts["bias"])
        if epilogue != consts["epilogue"] or consts["layout"] not in LAYOUTS:
            raise UnsupportedWorkload(f"matmul: bad constants {consts}")
        needed = 2 + (epilogue == "swiglu") + has_bias + (epilogue == "residual")
        if len(spec.inputs) != needed:
            raise UnsupportedWorkload(f"matmul: {spec.describe()} needs {needed} inputs")
        x, w = spec.inputs[0], spec.inputs[1]
        if not x.shape or x.numel == 0:
            raise UnsupportedWorkload(f"matmul: x {x} must be non-empty, of at least one dimension")
        if len(w.shape) != 2:
            raise UnsupportedWorkload(f"matmul: the weight {w} must be 2-D")
        k = x.shape[-1]
        n, w_k = (w.shape[0], w.shape[1]) if consts["layout"] == "linear" else (w.shape[1], w.shape[0])
        if w_k != k:
            want = "(N, K)" if consts["layout"] == "linear" else "(K, N)"
            raise UnsupportedWorkload(f"matmul: x {x} and weight {w} do not fit: layout {consts['layout']} "
                                      f"wants the weight {want} with K = {k}")  # fmt: skip
        weight = TensorSpec(w.shape, x.dtype)
        expected = [x, weight] + ([weight] if epilogue == "swiglu" else [])
        expected += [TensorSpec((n,), x.dtype)] if has_bias else []
        expected += [TensorSpec((*x.shape[:-1], n), x.dtype)] if epilogue == "residual" else []
        for got, wanted in zip(spec.inputs, expected, strict=True):
            if got.shape != wanted.shape or got.dtype != wanted.dtype:
                raise UnsupportedWorkload(f"matmul: input {got} should be {wanted} in {spec.describe()}")
        if consts["allow_tf32"] and x.dtype != "float32":
            raise UnsupportedWorkload("matmul: allow_tf32 is for float32 inputs only")

    def output_specs(self, spec: OpSpec) -> tuple[TensorSpec, ...]:
        x = spec.inputs[0]
        return (TensorSpec((*x.shape[:-1], _geometry(spec).n), x.dtype),)

    def small_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        """M capped at 32, N and K at 128: a few tiles, seconds in the interpreter."""
        *lead, n, k = shape
        return (min(math.prod(lead), 32), min(n, 128), min(k, 128))

    def _with_rows(self, spec: OpSpec, m: int) -> OpSpec:
        """The spec with x flattened to (m, K) and the residual, if any, to (m, N)."""
        g = _geometry(spec)
        x = spec.inputs[0]
        inputs = [x.with_shape((m, g.k)), *spec.inputs[1:]]
        if g.epilogue == EPI_RESIDUAL:
            inputs[-1] = inputs[-1].with_shape((m, g.n))
        return OpSpec(spec.op, tuple(inputs), dict(spec.constants))

    def bucket(self, spec: OpSpec) -> OpSpec:
        """M rounded up to a power of two at the same N and K (x flattened to 2-D): a config is
        correct for every M (see the module docstring), only its speed was measured at the top."""
        m = _geometry(spec).m
        return self._with_rows(spec, next_power_of_two(m)) if len(spec.inputs[0].shape) > 1 else spec

    def validation_specs(self, spec: OpSpec) -> list[OpSpec]:
        """The target, then 1, 7, 67 and M - 1 rows (those below M) at the same N and K: partial
        row tiles of every height, and the specializations of M = 1."""
        m = _geometry(spec).m
        tails = sorted({t for t in (1, 7, 67, m - 1) if 1 <= t < m})
        return [spec] + [self._with_rows(spec, t) for t in tails]

    # ---- math ------------------------------------------------------------------------------------
    def _compute(self, spec: OpSpec, inputs: Sequence[torch.Tensor]) -> torch.Tensor:
        """The epilogue applied to the product as a user writes it, in the inputs' dtype."""
        epilogue, has_bias = spec.const("epilogue"), spec.const("bias")
        x, w = inputs[0], inputs[1]
        rest = list(inputs[2:])
        w3 = rest.pop(0) if epilogue == "swiglu" else None
        b = rest.pop(0) if has_bias else None
        residual = rest.pop(0) if epilogue == "residual" else None

        def product(weight: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
            if spec.const("layout") == "linear":
                return F.linear(x, weight, b)
            h = torch.matmul(x, weight)
            return h if b is None else h + b

        if epilogue == "swiglu":
            assert w3 is not None
            return F.silu(product(w, None)) * product(w3, None)
        h = product(w, b)
        if epilogue == "gelu":
            return F.gelu(h)
        if epilogue == "gelu_tanh":
            return F.gelu(h, approximate="tanh")
        if epilogue == "silu":
            return F.silu(h)
        if epilogue == "residual":
            assert residual is not None
            return h + residual
        return h

    def reference(self, spec: OpSpec, inputs: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        """The PyTorch expression in the inputs' dtype, under the spec's float32 precision
        (``allow_tf32``): ``F.linear`` (or ``torch.matmul``) and the epilogue as written."""
        if spec.inputs[0].dtype != "float32":  # the setting is for float32 only: spare its ~1 us
            return (self._compute(spec, inputs),)
        with matmul_precision(bool(spec.const("allow_tf32"))):
            return (self._compute(spec, inputs),)

    def reference_fp64(self, spec: OpSpec, inputs: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        return (self._compute(spec, [t.double() for t in inputs]),)

    def make_inputs(
        self,
        spec: OpSpec,
        seed: int,
        distribution: str = "normal",
        device: str | torch.device = "cuda",
    ) -> tuple[torch.Tensor, ...]:
        """Inputs drawn in float32 on ``device`` and rounded to the dtype, deterministic in ``seed``.

        Weights are ``N(0, 1) / sqrt(K)`` (so that outputs are about N(0, 1) for normal x), the
        bias and the residual ``N(0, 1)``; x depends on ``distribution``:

        - ``normal``: ``N(0, 1)``, where GELU and SiLU bend;
        - ``wide``: ``8 * N(0, 1)``: saturated activations, outputs around +-8;
        - ``outliers``: ``N(0, 1)`` with one column in 16 (the same columns in every row) times
          20, as the outlier features of large language models: a few products dominate each sum.
        """
        if distribution not in self.distributions:
            raise ValueError(f"matmul: unknown distribution {distribution!r} (known: {', '.join(self.distributions)})")
        g = _geometry(spec)
        dtype = spec.inputs[0].torch_dtype

        def draw(shape: tuple[int, ...], stream: int) -> torch.Tensor:
            return torch.randn(shape, generator=generator(seed ^ stream, device), device=device)

        x = draw(spec.inputs[0].shape, 0)
        if distribution == "wide":
            x = x * 8
        elif distribution == "outliers":
            columns = torch.arange(g.k, device=device) % 16 == (seed % 16)
            x = torch.where(columns, x * 20, x)
        weights = {1, 2} if g.epilogue == EPI_SWIGLU else {1}
        tensors = [x]
        for i, t in enumerate(spec.inputs[1:], start=1):
            scale = 1 / math.sqrt(g.k) if i in weights else 1.0
            tensors.append(draw(t.shape, 0x5EED * i) * scale)
        return tuple(t.to(dtype) for t in tensors)

    def flops(self, spec: OpSpec) -> int:
        """2 M N K a product (two for SwiGLU), plus the epilogue's few per output element."""
        g = _geometry(spec)
        per_output = {EPI_NONE: 0, EPI_GELU: 6, EPI_GELU_TANH: 11, EPI_SILU: 6, EPI_RESIDUAL: 1, EPI_SWIGLU: 7}
        return 2 * g.m * g.n * g.k * g.weights + g.m * g.n * (per_output[g.epilogue] + g.has_bias)


OP = Matmul()

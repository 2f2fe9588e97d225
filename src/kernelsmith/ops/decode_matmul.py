"""Decode-shaped matmul: ``y = epilogue(x @ w.T + bias)`` for a few rows against an ``F.linear`` weight.

When a language model generates text, each step multiplies one new token's hidden state (or one
per sequence of a small batch: ``M`` = 1 to 64 rows) by every projection weight of the model. The
weight, ``N x K`` elements stored as ``nn.Linear`` stores it, is read once and used for ``M``
multiply-adds per element: a few flops per byte, so the op is bound by memory bandwidth, and a good
kernel is one that keeps every multiprocessor streaming weight bytes from the first microsecond to
the last. The tiled kernels of :mod:`kernelsmith.ops.matmul` are built the other way round: they cut
the *output* into tiles, and an ``M = 1`` output of 2048 columns is a handful of tiles for a GPU of
132 multiprocessors.

The op is the :mod:`~kernelsmith.ops.matmul` family's, restricted to its decode shapes: layout
``"linear"`` only (``w`` is ``(N, K)``), ``x`` of ``(..., K)`` with at most ``MAX_M`` rows in all,
float16, bfloat16 or float32, float32 accumulation, and the same fused epilogues (``epilogue`` and
``bias`` constants, see that module): ``none``, ``gelu``, ``gelu_tanh``, ``silu``, ``residual``
(``h + r``: the o and down projections' residual add, in the epilogue) and ``swiglu``
(``silu(x @ w1.T) * (x @ w3.T)``: the gate and up projections in one pass, sharing every load of
``x``). Specs, references, inputs, the roofline and the tolerance are the matmul family's
(:class:`DecodeMatmul` subclasses :class:`~kernelsmith.ops.matmul.Matmul`), and so are the epilogue
code and the split-K reduction kernel.

Two fusions only a decode step affords (one row of activations costs nothing next to the weight)
are this family's own, each adding inputs after matmul's and constants a plain spec does not have:

``prologue="rmsnorm"`` (constant ``eps``; input ``gamma`` of ``(K,)``)
    ``x`` is Llama's RMSNorm of itself first, ``x * rsqrt(mean(x**2) + eps) * gamma``: the
    ``input_layernorm`` before QKV and the ``post_attention_layernorm`` before gate/up. Since
    ``1/rms`` is one factor per row, the kernels multiply ``x * gamma`` by the weight and scale the
    float32 sum by ``1/rms`` at the end; the sum of squares comes with the K loop (``gemv``) or, for
    a program that sees only a range of K, from one more pass over its rows of ``x`` (a few
    kilobytes, from L2) by the program that finishes the block. The reference is Hugging Face's
    ``LlamaRMSNorm`` (the normalized row rounded to the dtype, then times gamma) and ``F.linear``.
``epilogue="rope"`` with ``rope=(heads, kv_heads)`` (inputs ``cos`` and ``sin`` of ``(..., D)``)
    ``w`` is a fused QKV projection of ``(heads + 2 kv_heads) * D`` rows; q's and k's columns are
    rotated by Hugging Face's ``apply_rotary_pos_emb`` (``rotate_half``: channel ``j < D/2`` pairs
    with ``j + D/2``, as :mod:`kernelsmith.ops.rope`'s ``"half"`` style), at each row's own position
    (cos and sin already indexed by the position ids, one row per row of ``x``); v's pass. A block of
    ``BLOCK_N`` weight rows then holds ``BLOCK_N / 2`` channels of one head's first half and their
    partners (``_weight_rows``), so the rotation pairs sit in one program's registers; ``BLOCK_N``
    divides ``D``. A bias may come before the rotation, no other epilogue.

The variants
------------
Every variant cuts the weight into blocks of ``BLOCK_N`` rows (output columns) by ``BLOCK_K``
columns and the rows of ``x`` into blocks of ``BLOCK_M``; a program multiplies its rows of ``x`` by
its rows of ``w`` over a range of ``K`` and accumulates in float32. Programs that share weight rows
(the ``M`` blocks of one ``N`` block) have consecutive numbers, so they run together and all but
the first read those rows from L2. The weight is loaded with ``evict_first`` (it is read once; L2
is left to ``x`` and the partial sums), in rows of ``BLOCK_K`` contiguous elements: wide vector
loads.

``gemv`` (split-N)
    One program per (``M`` block, ``N`` block), walking all of ``K``; the epilogue is applied and
    the output stored by the same program. Enough programs when ``N / BLOCK_N`` covers the GPU a few
    times over (the large projections, the LM head).
``split_k``
    ``K`` cut into ``SPLIT_K`` ranges as well, one program per (``M`` block, range, ``N`` block):
    ``SPLIT_K`` times more programs for the small projections (``N = 2048``: 64 blocks of 32 rows,
    half the GPU). Each writes its float32 partial product to a ``(SPLIT_K, M, N)`` scratch buffer,
    and the partials of an output block are summed in order 0, 1, ... before the epilogue: the
    order is fixed, so the output is bitwise reproducible (the harness requires it, rule 9; float
    atomics, whose order of arrival changes the rounding from run to run, would be rejected).
    ``REDUCE`` says who sums: ``"last_program"``, the program that finishes a block's last range
    (an atomic arrival counter per block, set back to zero by that program: one launch, which is
    what a decode step of a few microseconds a projection wants), or ``"kernel"``, the matmul
    family's reduction kernel, launched next (no counters).
``persistent``
    The ``split_k`` tiles walked by a fixed grid of ``PROGRAMS_PER_SM`` programs per multiprocessor
    (tile ``pid``, ``pid + programs``, ...): no program start-up between tiles, and a ``SPLIT_K``
    that need not divide the work evenly among programs. ``SPLIT_K = 1`` is a persistent split-N.

How a block is multiplied depends on ``BLOCK_M``, so that no parameter can contradict another:

- ``BLOCK_M`` of 1 to 8: on the CUDA cores. Each thread multiplies its weight elements by the
  matching ``x`` values and keeps float32 partial sums; the sums over ``K`` are reduced once, after
  the loop, so the loop is loads and fused multiply-adds only. This is the classic GEMV, and what
  ``M = 1`` wants (there the ``x`` row is broadcast over a 2-D weight block, no 3-D product).
  ``FOLD`` says how many consecutive products share a partial sum: 1 (one per weight element), or
  one 16-byte vector (8 elements of 16 bits, 4 of 32), whose products a thread adds in its own
  registers, so that a step's weight block can be 8 times larger for the same registers;
- ``BLOCK_M`` of 16 to 64: on the tensor cores (``tl.dot`` of the ``x`` block and the transposed
  weight block). At ``M = 8`` each weight element already costs 8 multiply-adds, a good part of
  what the CUDA cores can do at full bandwidth; the tensor cores do it without noticing, rows past
  ``M`` padding the block (read at ``row % M``, never stored).

Why the first version streamed 17-45% of the copy bandwidth at ``M = 1`` (H200, 2026-12-01), and
what changed: a memory-bound kernel needs enough bytes *in flight* on every multiprocessor (by
Little's law about bandwidth x latency, some 40 KiB an SM on an H200), and those come from many
resident programs, large steps, or loads issued ahead of their use. The K loop was a plain
``range``, and Triton's software pipeliner prefetches the loads of a loop that feeds no ``tl.dot``
only when the loop itself carries ``num_stages`` (``tl.range(..., num_stages=)``; Triton's
AssignLoadLatencies sets ``pipelineWithoutDot`` from that attribute alone): the CUDA-core
loop had one weight block in flight per program, whatever ``num_stages`` said. The loop is a
``tl.range`` with the config's ``num_stages`` now; the accumulator no longer costs a register per
weight element (``FOLD``), so steps can be larger; and the pruning keeps the search on configs
that move at least 8 KiB of weight a step, on grids of at least one program a multiprocessor, and
splits K only where the row blocks are fewer than 4 a multiprocessor (into at most 16 tiles a
multiprocessor). These are the reasons as read from the code and the compiler; the H200 measurement of
benchmarks/decode.py is what confirms them.

Rows past ``M`` and columns past ``N`` are read at ``row % M`` and ``col % N`` (valid addresses, no
mask in the loop) and masked on the store; the last ``K`` block is masked unless ``K`` is a
multiple of ``BLOCK_K`` (``EVEN_K``, known from the spec). Offsets into the weight are 64-bit (the
LM head has 128256 x 4096 = 5e8 elements; 2**31 is near).

Spaces
------
Parameters: ``BLOCK_M``, ``BLOCK_N``, ``BLOCK_K``, ``FOLD``, ``num_warps``, ``num_stages`` (plus
``SPLIT_K`` and ``PROGRAMS_PER_SM``, ``REDUCE``). *Validity* constraints depend on ``N``, ``K``, the
dtype, the epilogue and the fusions only, so a config tuned at one ``M`` is correct at every other
(the validation tails, a bucket's rows): registers (the CUDA-core partial sums, weight block and x
block, or the tensor-core accumulators), shared memory for the ``num_stages`` pipelined blocks,
blocks no larger than the padded ``N`` and ``K``, at least one ``K`` block a split, RoPE's blocks
within a head, and no RMSNorm or RoPE for the matmul family's reduction kernel. *Pruning*
constraints look at ``M`` and the GPU: the CUDA-core ``BLOCK_M`` is the padded ``M`` (up to 8),
tensor-core blocks no taller than needed, every thread loads at least 16 bytes of weight a step,
and the bandwidth rules above. The spaces enumerate stage by stage (``_StagedSpace``): the product
of the parameters is 10**5 configs.

Testing without a GPU: the interpreter's bfloat16 ``tl.dot`` is wrong (see the matmul module), so
bfloat16 blocks are widened to float32 before a dot there (``UPCAST``), as the matmul family does.

Front door: ``kernelsmith tune decode_matmul --shape 1x2048x2048 --epilogue residual``. The
``@kernelsmith.optimize`` pattern for ``F.linear`` still routes every product to ``matmul``; the
whole-step capture (issue 13, items 3-4) is what calls the fused forms.
"""

from __future__ import annotations

import hashlib
import inspect
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import triton
import triton.language as tl

from kernelsmith.ops import matmul as _matmul_module
from kernelsmith.ops._base import Launcher, UnsupportedWorkload, check_eps, generator
from kernelsmith.ops._launch import direct_launch
from kernelsmith.ops.gelu import checked, multiprocessor_count
from kernelsmith.ops.matmul import (
    EPI_NONE,
    SHARED_MEMORY_BUDGET,
    Matmul,
    _dot,
    _finish_tile,
    _Geometry,
    _geometry,
    _matmul_split_k_reduce_kernel,
    _MatmulVariant,
    _operands,
    _reduce_tile,
)
from kernelsmith.space import Config, Constraint, Param, Space, next_power_of_two
from kernelsmith.spec import OpSpec, TensorSpec

MAX_M = 64  # the most rows (all leading dims of x) the family takes: decode batches

# =================================================================================================
# Kernels
#
# x is (M, K) and the weight (N, K), both contiguous (row strides K); y, and the residual, (M, N);
# gamma (the RMSNorm prologue's weight) (K,); cos and sin (the RoPE epilogue's) (M, ROPE_DIM).
# =================================================================================================


@triton.jit
def _weight_rows(pid_n, BLOCK_N: tl.constexpr, ROPE_DIM: tl.constexpr):
    """The weight rows (output columns) of block ``pid_n``: BLOCK_N consecutive ones, or with RoPE
    (ROPE_DIM, the head dim, a multiple of BLOCK_N) BLOCK_N / 2 consecutive channels of one head's
    first half followed by their rotation partners, ROPE_DIM / 2 further on: a block holds both
    halves of every pair it rotates."""
    i = tl.arange(0, BLOCK_N)
    if ROPE_DIM == 0:
        cols = pid_n * BLOCK_N + i
    else:
        half: tl.constexpr = BLOCK_N // 2
        chunks: tl.constexpr = ROPE_DIM // BLOCK_N
        first = (pid_n // chunks) * ROPE_DIM + (pid_n % chunks) * half
        cols = first + i % half + (i // half) * (ROPE_DIM // 2)
    return cols


@triton.jit
def _block_product(
    x_ptr, w_ptr, w3_ptr, g_ptr, pid_m, pid_n, k_first, k_last, M, N, K,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_N: tl.constexpr,
    EVEN_K: tl.constexpr, SWIGLU: tl.constexpr, DOT: tl.constexpr, IEEE: tl.constexpr, UPCAST: tl.constexpr,
    FOLD: tl.constexpr, STAGES: tl.constexpr, RMS: tl.constexpr, ROPE_DIM: tl.constexpr,
):  # fmt: skip
    """The float32 ``[BLOCK_M, BLOCK_N]`` products of rows block ``pid_m`` of x and weight rows block
    ``pid_n`` over the K blocks [k_first, k_last): ``(x @ w.T, x @ w3.T, sum of x**2 per row)`` (the
    second is the first again unless SWIGLU; the third is zeros unless RMS, where x is multiplied
    by gamma before the product: RMSNorm's 1/rms is a factor per row, applied after the sum).

    DOT: on the tensor cores. Otherwise on the CUDA cores, with float32 partial sums: one per
    FOLD consecutive weight elements (FOLD = 1: one per element; FOLD = one 16-byte vector: the
    products of each thread's vector are added in its registers, so a step's block can be FOLD
    times larger for the same registers), reduced over K once, after the loop. BLOCK_M = 1 is the
    classic GEMV: the x row broadcast over a 2-D weight block, no 3-D product.

    The loop is a ``tl.range`` with ``num_stages=STAGES``: the compiler pipelines (prefetches
    through shared memory) only the loads of loops carrying that attribute when they feed no dot,
    and a GEMV lives on having several weight blocks in flight."""
    # Rows past M and weight rows past N are read at row % M and col % N: valid addresses, no mask
    # in the loop; they are never stored.
    rows = ((pid_m * BLOCK_M + tl.arange(0, BLOCK_M)) % M).to(tl.int64)
    cols = _weight_rows(pid_n, BLOCK_N, ROPE_DIM)
    if not EVEN_N:
        cols = cols % N
    ks = k_first * BLOCK_K + tl.arange(0, BLOCK_K)
    x_ptrs = x_ptr + rows[:, None] * K + ks[None, :]
    g_ptrs = g_ptr + ks
    w_offsets = cols[:, None].to(tl.int64) * K + ks[None, :]  # 64-bit: the LM head nears 2**31
    w_ptrs = w_ptr + w_offsets
    if DOT:
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    elif BLOCK_M == 1:
        acc = tl.zeros([BLOCK_N, BLOCK_K // FOLD], dtype=tl.float32)
    else:
        acc = tl.zeros([BLOCK_M, BLOCK_N, BLOCK_K // FOLD], dtype=tl.float32)
    if SWIGLU:  # (constexpr branches: without SwiGLU, no w3 pointers or accumulator exist at all)
        w3_ptrs = w3_ptr + w_offsets
        acc3 = tl.zeros_like(acc)
    sumsq = tl.zeros([BLOCK_M], dtype=tl.float32)
    k_offsets = tl.arange(0, BLOCK_K)
    for kb in tl.range(k_first, k_last, num_stages=STAGES):
        # The weight is read once: evict_first leaves L2 to x and the partial sums.
        if EVEN_K:
            a = tl.load(x_ptrs)
            b = tl.load(w_ptrs, eviction_policy="evict_first")
        else:
            k_mask = k_offsets < K - kb * BLOCK_K  # the last block may run past K: zeros add nothing
            a = tl.load(x_ptrs, mask=k_mask[None, :], other=0.0)
            b = tl.load(w_ptrs, mask=k_mask[None, :], other=0.0, eviction_policy="evict_first")
        if RMS:
            gamma = tl.load(g_ptrs) if EVEN_K else tl.load(g_ptrs, mask=k_mask, other=0.0)
            xf = a.to(tl.float32)
            sumsq += tl.sum(xf * xf, axis=1)
            a = xf * gamma.to(tl.float32)[None, :]
            if DOT:  # the tensor cores take x * gamma in the weight's dtype (Hugging Face rounds too)
                a = a.to(b.dtype)
            g_ptrs += BLOCK_K
        acc = _multiply_add(a, b, acc, BLOCK_M, BLOCK_N, BLOCK_K, DOT, IEEE, UPCAST, FOLD)
        if SWIGLU:
            if EVEN_K:
                b3 = tl.load(w3_ptrs, eviction_policy="evict_first")
            else:
                b3 = tl.load(w3_ptrs, mask=k_mask[None, :], other=0.0, eviction_policy="evict_first")
            acc3 = _multiply_add(a, b3, acc3, BLOCK_M, BLOCK_N, BLOCK_K, DOT, IEEE, UPCAST, FOLD)
            w3_ptrs += BLOCK_K
        x_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    acc = _reduce_partials(acc, BLOCK_M, DOT)
    if SWIGLU:  # noqa: SIM108 (without SwiGLU acc3 does not exist: a statement, not an expression)
        acc3 = _reduce_partials(acc3, BLOCK_M, DOT)
    else:
        acc3 = acc  # unused: the epilogue reads it for SwiGLU only
    return acc, acc3, sumsq


@triton.jit
def _multiply_add(
    a, b, acc, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, DOT: tl.constexpr,
    IEEE: tl.constexpr, UPCAST: tl.constexpr, FOLD: tl.constexpr,
):  # fmt: skip
    """acc + the products of x block ``a`` [BLOCK_M, BLOCK_K] and weight block ``b`` [BLOCK_N,
    BLOCK_K]: ``a @ b.T`` on the tensor cores (DOT), or the products added to the partial sums of
    their FOLD-element runs (see _block_product).

    One return, after the branches: Triton's compiler does not stop at a ``return`` inside an
    ``if`` on a constexpr, it goes on to compile what follows (the interpreter, plain Python,
    does stop), so an early return would compile the CUDA-core sum against the dot's 2-D acc."""
    if DOT:
        acc = _dot(a, tl.trans(b), acc, IEEE, UPCAST)
    elif BLOCK_M == 1:
        prod = a.to(tl.float32) * b.to(tl.float32)  # the x row broadcast over the weight rows
        if FOLD > 1:
            prod = tl.sum(tl.reshape(prod, [BLOCK_N, BLOCK_K // FOLD, FOLD]), axis=2)
        acc = acc + prod
    else:
        prod = a.to(tl.float32)[:, None, :] * b.to(tl.float32)[None, :, :]
        if FOLD > 1:
            prod = tl.sum(tl.reshape(prod, [BLOCK_M, BLOCK_N, BLOCK_K // FOLD, FOLD]), axis=3)
        acc = acc + prod
    return acc


@triton.jit
def _reduce_partials(acc, BLOCK_M: tl.constexpr, DOT: tl.constexpr):
    """The CUDA-core partial sums reduced over K: [BLOCK_M, BLOCK_N] (the dot's acc as it is)."""
    if not DOT:
        acc = tl.sum(acc, axis=1)[None, :] if BLOCK_M == 1 else tl.sum(acc, axis=2)
    return acc


@triton.jit
def _row_sumsq(x_ptr, pid_m, M, K, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr):
    """sum(x**2) of each row of block pid_m over all of K (the RMSNorm prologue of a program that
    multiplies only a range of K: x is a few kilobytes, from L2)."""
    rows = ((pid_m * BLOCK_M + tl.arange(0, BLOCK_M)) % M).to(tl.int64)
    ks = tl.arange(0, BLOCK_K)
    total = tl.zeros([BLOCK_M], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        if EVEN_K:
            x = tl.load(x_ptr + rows[:, None] * K + (k0 + ks)[None, :])
        else:
            x = tl.load(x_ptr + rows[:, None] * K + (k0 + ks)[None, :], mask=(k0 + ks < K)[None, :], other=0.0)
        xf = x.to(tl.float32)
        total += tl.sum(xf * xf, axis=1)
    return total


@triton.jit
def _rotate(acc, cos_ptr, sin_ptr, rows, pid_n, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
            ROPE_DIM: tl.constexpr):  # fmt: skip
    """Hugging Face's RoPE (rotate_half) on a block of _weight_rows' RoPE order: its first half
    holds channels c of a head, its second half channels c + ROPE_DIM / 2, so
    ``out_lo = lo * cos[c] - hi * sin[c]`` and ``out_hi = hi * cos[c + D/2] + lo * sin[c + D/2]``
    with cos and sin at each row's position (rows: valid row indices)."""
    half: tl.constexpr = BLOCK_N // 2
    chunks: tl.constexpr = ROPE_DIM // BLOCK_N
    c = (pid_n % chunks) * half + tl.arange(0, half)
    at = rows[:, None] * ROPE_DIM + c[None, :]
    cos_lo = tl.load(cos_ptr + at).to(tl.float32)
    sin_lo = tl.load(sin_ptr + at).to(tl.float32)
    cos_hi = tl.load(cos_ptr + at + ROPE_DIM // 2).to(tl.float32)
    sin_hi = tl.load(sin_ptr + at + ROPE_DIM // 2).to(tl.float32)
    lo, hi = tl.split(tl.permute(tl.reshape(acc, [BLOCK_M, 2, half]), (0, 2, 1)))
    out = tl.join(lo * cos_lo - hi * sin_lo, hi * cos_hi + lo * sin_hi)  # [BLOCK_M, half, 2]
    return tl.reshape(tl.permute(out, (0, 2, 1)), [BLOCK_M, BLOCK_N])


@triton.jit
def _decode_finish(
    acc, acc3, rstd, y_ptr, bias_ptr, res_ptr, cos_ptr, sin_ptr, pid_m, pid_n, M, N, ROPE_COLS,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HAS_BIAS: tl.constexpr, EPILOGUE: tl.constexpr,
    RMS: tl.constexpr, ROPE_DIM: tl.constexpr,
):  # fmt: skip
    """RMSNorm's 1/rms per row (RMS), then the matmul family's epilogue and store, or with RoPE the
    bias, the rotation of the q and k columns (those below ROPE_COLS; v's pass) and the store in
    _weight_rows' order."""
    if RMS:
        acc = acc * rstd[:, None]
        acc3 = acc3 * rstd[:, None]
    if ROPE_DIM == 0:
        _finish_tile(acc, acc3, y_ptr, bias_ptr, res_ptr, pid_m, pid_n, M, N, N, N, BLOCK_M, BLOCK_N, HAS_BIAS,
                     EPILOGUE)  # fmt: skip
    else:
        rows = pid_m.to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
        cols = _weight_rows(pid_n, BLOCK_N, ROPE_DIM)  # all below N: N is a multiple of ROPE_DIM
        if HAS_BIAS:
            acc += tl.load(bias_ptr + cols).to(tl.float32)[None, :]
        rotated = _rotate(acc, cos_ptr, sin_ptr, rows % M, pid_n, BLOCK_M, BLOCK_N, ROPE_DIM)
        acc = tl.where(pid_n * BLOCK_N < ROPE_COLS, rotated, acc)  # a block lies within one head
        tl.store(y_ptr + rows[:, None] * N + cols[None, :], acc.to(y_ptr.dtype.element_ty),
                 mask=(rows < M)[:, None])  # fmt: skip


@triton.jit
def _decode_gemv_kernel(
    x_ptr, w_ptr, w3_ptr, bias_ptr, res_ptr, g_ptr, cos_ptr, sin_ptr, y_ptr, M, N, K, eps, ROPE_COLS,
    HAS_BIAS: tl.constexpr, EPILOGUE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr, EVEN_N: tl.constexpr, EVEN_K: tl.constexpr, DOT: tl.constexpr,
    IEEE: tl.constexpr, UPCAST: tl.constexpr, FOLD: tl.constexpr, STAGES: tl.constexpr, RMS: tl.constexpr,
    ROPE_DIM: tl.constexpr,
):  # fmt: skip
    """gemv: program i computes rows block i % (M blocks) of weight rows block i // (M blocks)
    over all of K (so the RMSNorm sum of squares comes with the loop), then the epilogue and the
    store (M blocks of one N block run together)."""
    num_pid_m = tl.cdiv(M, BLOCK_M)
    pid = tl.program_id(0)
    pid_m = pid % num_pid_m
    pid_n = pid // num_pid_m
    acc, acc3, sumsq = _block_product(x_ptr, w_ptr, w3_ptr, g_ptr, pid_m, pid_n, 0, tl.cdiv(K, BLOCK_K), M, N, K,
                                      BLOCK_M, BLOCK_N, BLOCK_K, EVEN_N, EVEN_K, EPILOGUE == 5, DOT, IEEE,
                                      UPCAST, FOLD, STAGES, RMS, ROPE_DIM)  # fmt: skip
    rstd = tl.rsqrt(sumsq / K + eps) if RMS else sumsq  # (unused without RMS)
    _decode_finish(acc, acc3, rstd, y_ptr, bias_ptr, res_ptr, cos_ptr, sin_ptr, pid_m, pid_n, M, N, ROPE_COLS,
                   BLOCK_M, BLOCK_N, HAS_BIAS, EPILOGUE, RMS, ROPE_DIM)  # fmt: skip


@triton.jit
def _decode_split_k_kernel(
    x_ptr, w_ptr, w3_ptr, g_ptr, cos_ptr, sin_ptr, partial_ptr, counter_ptr, y_ptr, bias_ptr, res_ptr,
    M, N, K, eps, ROPE_COLS,
    HAS_BIAS: tl.constexpr, EPILOGUE: tl.constexpr, SPLIT_K: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_N: tl.constexpr, EVEN_K: tl.constexpr, DOT: tl.constexpr,
    IEEE: tl.constexpr, UPCAST: tl.constexpr, LAST_REDUCES: tl.constexpr, FOLD: tl.constexpr,
    STAGES: tl.constexpr, RMS: tl.constexpr, ROPE_DIM: tl.constexpr,
):  # fmt: skip
    """split_k and persistent: programs walk the tiles pid, pid + programs, ... (one tile each when
    there are as many programs as tiles). Tile t is rows block t % (M blocks), K range
    (t // M blocks) % SPLIT_K and weight rows block t // (M blocks * SPLIT_K); its float32 product
    goes to partial[range] (and x @ w3.T's to partial[SPLIT_K + range] for SwiGLU), at the
    columns _weight_rows gives.

    LAST_REDUCES: the program that finishes an output block's last range (counted on the block's
    counter) sums its SPLIT_K partials in order, applies RMSNorm's 1/rms (its sum of squares over
    all of K, read again) and the epilogue, stores, and sets the counter back to 0 for the next
    launch: one launch instead of two. Otherwise the matmul family's reduction kernel runs next
    (no RMSNorm or RoPE then: the spaces say so)."""
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    k_blocks = tl.cdiv(K, BLOCK_K)
    per_split = tl.cdiv(k_blocks, SPLIT_K)
    plane = tl.cast(M, tl.int64) * N  # elements of one partial product (tl.cast: M = 1 is a constexpr)
    for tile in tl.range(tl.program_id(0), num_pid_m * SPLIT_K * num_pid_n, tl.num_programs(0)):
        t = tl.cast(tile, tl.int32)  # tl.cast, not .to(): in the interpreter the loop variable is an int
        pid_m = t % num_pid_m
        split = (t // num_pid_m) % SPLIT_K
        pid_n = t // (num_pid_m * SPLIT_K)
        k_first = split * per_split
        k_last = tl.minimum(k_first + per_split, k_blocks)  # an empty range stores zeros
        acc, acc3, _ = _block_product(x_ptr, w_ptr, w3_ptr, g_ptr, pid_m, pid_n, k_first, k_last, M, N, K,
                                      BLOCK_M, BLOCK_N, BLOCK_K, EVEN_N, EVEN_K, EPILOGUE == 5, DOT, IEEE,
                                      UPCAST, FOLD, STAGES, RMS, ROPE_DIM)  # fmt: skip
        rows = pid_m.to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
        cols = _weight_rows(pid_n, BLOCK_N, ROPE_DIM)
        mask = (rows < M)[:, None] & (cols < N)[None, :]
        offsets = rows[:, None] * N + cols[None, :]
        tl.store(partial_ptr + split * plane + offsets, acc, mask=mask)
        if EPILOGUE == 5:
            tl.store(partial_ptr + (SPLIT_K + split) * plane + offsets, acc3, mask=mask)
        if LAST_REDUCES:
            # Every thread's stores come before the counter's release (the barrier, then the
            # release is cumulative); the last program's acquire comes before its loads, which
            # bypass L1 (.cg), so they see the other programs' partials.
            tl.debug_barrier()
            counter = counter_ptr + pid_n * num_pid_m + pid_m
            if tl.atomic_add(counter, 1, sem="acq_rel") == SPLIT_K - 1:
                total = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
                total3 = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
                for s in tl.static_range(SPLIT_K):  # in order: bitwise the same whoever is last
                    total += tl.load(partial_ptr + s * plane + offsets, mask=mask, other=0.0, cache_modifier=".cg")
                    if EPILOGUE == 5:
                        total3 += tl.load(partial_ptr + (SPLIT_K + s) * plane + offsets, mask=mask, other=0.0,
                                          cache_modifier=".cg")  # fmt: skip
                rstd = tl.zeros([BLOCK_M], dtype=tl.float32)
                if RMS:
                    rstd = tl.rsqrt(_row_sumsq(x_ptr, pid_m, M, K, BLOCK_M, BLOCK_K, EVEN_K) / K + eps)
                _decode_finish(total, total3, rstd, y_ptr, bias_ptr, res_ptr, cos_ptr, sin_ptr, pid_m, pid_n, M, N,
                               ROPE_COLS, BLOCK_M, BLOCK_N, HAS_BIAS, EPILOGUE, RMS, ROPE_DIM)  # fmt: skip
                tl.atomic_xchg(counter, 0)  # ready for the next launch


@triton.jit
def _zero_kernel(ptr, n, BLOCK: tl.constexpr):
    """Set ``n`` int32 counters to 0 (once, when a launcher first runs: a kernel, not PyTorch,
    which the harness would take for the candidate computing with PyTorch, rule 7)."""
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(ptr + offsets, tl.zeros([BLOCK], dtype=tl.int32), mask=offsets < n)


# =================================================================================================
# Spaces and builders
# =================================================================================================

BLOCKS_M = (1, 2, 4, 8, 16, 32, 64)
DOT_MIN_M = 16  # BLOCK_M from here up multiplies on the tensor cores (tl.dot's smallest block)
BLOCKS_N = (4, 8, 16, 32, 64, 128, 256)
BLOCKS_K = (32, 64, 128, 256, 512, 1024, 2048)
WARPS = (1, 2, 4, 8)
STAGES = (1, 2, 4)
# Partial sums of the CUDA-core loop: one per weight element (1) or one per 16-byte vector (8
# elements of 16 bits, 4 of 32).
FOLDS = (1, 4, 8)
VECTOR_BYTES = 16
SPLITS = (2, 4, 8, 16)
PERSISTENT_SPLITS = (1, 2, 4, 8)
PROGRAMS_PER_SM = (1, 2)
# Who sums a split output block's partials: its last program ("last_program", one launch) or a
# second kernel ("kernel").
REDUCTIONS = ("last_program", "kernel")
ZERO_BLOCK = 1024
# 32-bit registers a thread gives the CUDA-core loop: its float32 partial sums, the weight block it
# loads (two 16-bit elements a register) and its share of the x block.
MAX_FMA_VALUES_PER_THREAD = 128
MAX_ACCUMULATORS_PER_THREAD = 128  # on the tensor cores, as in the matmul family
MIN_LOAD_BYTES = 16  # weight bytes a thread loads a step: one 128-bit vector load at least
# Split-K only pays while the weight-row blocks alone are too few programs to fill the GPU, and up
# to a point: more programs than this a multiprocessor only add partial sums to write and read.
SPLIT_BELOW_PROGRAMS_PER_SM = 4
MAX_SPLIT_PROGRAMS_PER_SM = 16
# Weight bytes a program's step moves at least (for weights of 64 KiB and more): fewer,
# and a multiprocessor cannot hold enough programs to keep ~40 KiB in flight.
MIN_STEP_BYTES = 8192
PRUNING_MULTIPROCESSORS = 132  # an H200's, for pruning where no GPU is present (the interpreter)


@dataclass(frozen=True)
class _Fusions:
    """The decode-only fusions of a spec (module docstring): the RMSNorm prologue and RoPE."""

    rms: bool
    eps: float
    rope_dim: int  # the head dim when the q and k columns are rotated, else 0
    rope_cols: int  # (heads + kv_heads) * head dim: the columns that rotate (q's and k's)
    extra: int  # the index of the first decode-only input (gamma, then cos and sin)


def _fusions(spec: OpSpec) -> _Fusions:
    rms = spec.constants.get("prologue", "none") == "rmsnorm"
    heads, kv_heads = spec.constants.get("rope", (0, 0))
    n = _geometry(spec).n
    rope_dim = n // (heads + 2 * kv_heads) if heads else 0
    extra = len(spec.inputs) - rms - (2 if heads else 0)
    return _Fusions(rms, float(spec.constants.get("eps", 0.0)), rope_dim, (heads + kv_heads) * rope_dim, extra)


def _is_dot(config: Config) -> bool:
    return int(config["BLOCK_M"]) >= DOT_MIN_M


def _validity(g: _Geometry, f: _Fusions, extra: Sequence[Constraint] = ()) -> list[Constraint]:
    """Constraints every config a build accepts satisfies: they look at N, K, the dtype, the
    epilogue and the fusions, never at M, so a config is correct at every row count."""
    widest_n = max(BLOCKS_N[0], next_power_of_two(g.n))
    deepest_k = max(BLOCKS_K[0], next_power_of_two(g.k))
    vector = VECTOR_BYTES // g.itemsize

    def registers_fit(c: Config) -> bool:
        threads = 32 * int(c["num_warps"])
        if _is_dot(c):
            return g.weights * c["BLOCK_M"] * c["BLOCK_N"] <= MAX_ACCUMULATORS_PER_THREAD * threads
        block = c["BLOCK_N"] * c["BLOCK_K"]
        values = g.weights * (c["BLOCK_M"] * block // c["FOLD"] + block * g.itemsize // 4) + c["BLOCK_M"] * c["BLOCK_K"]
        return values <= MAX_FMA_VALUES_PER_THREAD * threads

    def shared_memory_fits(c: Config) -> bool:
        stage = (c["BLOCK_M"] + g.weights * c["BLOCK_N"]) * c["BLOCK_K"] * g.itemsize
        return c["num_stages"] == 1 or c["num_stages"] * stage <= SHARED_MEMORY_BUDGET

    constraints = [
        Constraint("BLOCK_N is no wider than the padded N", lambda c: c["BLOCK_N"] <= widest_n),
        Constraint("BLOCK_K is no deeper than the padded K", lambda c: c["BLOCK_K"] <= deepest_k),
        Constraint(f"tensor-core blocks (BLOCK_M >= {DOT_MIN_M}) are at least 16 weight rows",
                   lambda c: not _is_dot(c) or c["BLOCK_N"] >= 16),
        Constraint(f"FOLD is 1 or one {VECTOR_BYTES}-byte vector ({vector} elements); 1 on the tensor cores",
                   lambda c: c["FOLD"] == 1 or (c["FOLD"] == vector and not _is_dot(c))),
        Constraint(f"the float32 partial sums and the weight block fit in registers "
                   f"({MAX_FMA_VALUES_PER_THREAD} a thread; tensor cores: {MAX_ACCUMULATORS_PER_THREAD} "
                   "accumulators)", registers_fit),
        Constraint(f"num_stages blocks of x and the weight fit in shared memory ({SHARED_MEMORY_BUDGET} bytes)",
                   shared_memory_fits),
        *extra,
    ]  # fmt: skip
    if f.rope_dim:
        constraints.append(Constraint(f"RoPE: a weight-row block lies within one head ({f.rope_dim} a multiple "
                                      "of BLOCK_N)", lambda c: f.rope_dim % c["BLOCK_N"] == 0))  # fmt: skip
    return constraints


def _multiprocessors_for_pruning() -> int:
    return multiprocessor_count() if torch.cuda.is_available() else PRUNING_MULTIPROCESSORS


def _pruning(g: _Geometry, kind: str) -> list[Constraint]:
    """Constraints that only save search time, looking at M: a config they exclude is still
    correct (and accepted by build) at this M. ``kind``: gemv, split_k or persistent."""
    padded = next_power_of_two(g.m)
    fma_m = min(padded, DOT_MIN_M // 2)
    multiprocessors = _multiprocessors_for_pruning()
    # (an eighth of the padded weight, if smaller: a tiny weight still splits)
    step_bytes = min(MIN_STEP_BYTES, next_power_of_two(g.n) * next_power_of_two(g.k) * g.itemsize // 8)
    # split-N programs cover every multiprocessor, where the narrowest weight-row blocks can
    fill = min(multiprocessors, triton.cdiv(g.m, DOT_MIN_M) * triton.cdiv(g.n, BLOCKS_N[0]))
    split_below = SPLIT_BELOW_PROGRAMS_PER_SM * multiprocessors
    most_programs = MAX_SPLIT_PROGRAMS_PER_SM * multiprocessors

    def useful_m(c: Config) -> bool:
        if _is_dot(c):
            return c["BLOCK_M"] <= max(DOT_MIN_M, padded)
        return c["BLOCK_M"] == fma_m

    constraints = [
        Constraint(f"CUDA-core blocks are the padded M (at most {fma_m} rows), tensor-core blocks no taller "
                   "than needed", useful_m),
        Constraint(f"every thread loads at least {MIN_LOAD_BYTES} bytes of weight a step",
                   lambda c: c["BLOCK_N"] * c["BLOCK_K"] * g.itemsize >= MIN_LOAD_BYTES * 32 * c["num_warps"]),
        Constraint(f"a step moves at least {step_bytes} bytes of weight",
                   lambda c: g.weights * c["BLOCK_N"] * c["BLOCK_K"] * g.itemsize >= step_bytes),
    ]  # fmt: skip
    if kind == "gemv":
        constraints.append(Constraint(f"at least {fill} programs (one a multiprocessor, where N allows)",
                                      lambda c: _tiles(g, c) >= fill))  # fmt: skip
    if kind == "split_k":
        constraints.append(Constraint(f"at least {fill} programs (one a multiprocessor, where N allows)",
                                      lambda c: _tiles(g, c, c["SPLIT_K"]) >= fill))  # fmt: skip
    if kind != "gemv":
        constraints += [
            Constraint(f"split K only while the output blocks are fewer than {SPLIT_BELOW_PROGRAMS_PER_SM} a "
                       "multiprocessor", lambda c: c["SPLIT_K"] == 1 or _tiles(g, c) < split_below),
            Constraint(f"split K into at most {MAX_SPLIT_PROGRAMS_PER_SM} tiles a multiprocessor",
                       lambda c: c["SPLIT_K"] == 1 or _tiles(g, c, c["SPLIT_K"]) <= most_programs),
        ]  # fmt: skip
    return constraints


class _StagedSpace(Space):
    """A :class:`~kernelsmith.space.Space` that enumerates its product parameter by parameter,
    dropping a partial config as soon as a constraint that can already be evaluated on it fails
    (one that reads a parameter not chosen yet raises KeyError and waits). The same configs in the
    same order as the plain product filter, which at 10**5 candidates takes seconds a space; every
    survivor is checked again whole. (So a constraint reads parameters as ``c[name]``, never
    ``c.get``, whose default would judge a partial config as if the parameter had it.)"""

    def configs(self) -> tuple[Config, ...]:
        if self._valid is None:
            partial: list[dict[str, Any]] = [{}]
            for param in self.params:
                partial = [grown for values in partial for v in param.choices
                           if self._plausible(grown := {**values, param.name: v})]  # fmt: skip
            whole = (Config(values) for values in partial)
            self._valid = tuple(c for c in whole if all(k.check(c) for k in self.constraints))
        return self._valid

    def _plausible(self, values: dict[str, Any]) -> bool:
        for constraint in self.constraints:
            try:
                if not constraint.check(values):  # type: ignore[arg-type]
                    return False
            except KeyError:
                continue
        return True


def _space(params: list[Param], spec: OpSpec, prune: bool, kind: str, extra: Sequence[Constraint] = ()) -> Space:
    g = _geometry(spec)
    return _StagedSpace(params, [*_validity(g, _fusions(spec), extra), *(_pruning(g, kind) if prune else [])])


def _block_params() -> list[Param]:
    return [Param("BLOCK_M", BLOCKS_M), Param("BLOCK_N", BLOCKS_N), Param("BLOCK_K", BLOCKS_K),
            Param("FOLD", FOLDS), Param("num_warps", WARPS), Param("num_stages", STAGES)]  # fmt: skip


def _flags(g: _Geometry, f: _Fusions, config: Config) -> dict[str, object]:
    """The compile-time flags every decode kernel takes."""
    block_n, block_k = int(config["BLOCK_N"]), int(config["BLOCK_K"])
    return {
        "HAS_BIAS": g.has_bias,
        "EPILOGUE": g.epilogue,
        "BLOCK_M": int(config["BLOCK_M"]),
        "BLOCK_N": block_n,
        "BLOCK_K": block_k,
        "EVEN_N": g.n % block_n == 0,
        "EVEN_K": g.k % block_k == 0,
        "DOT": _is_dot(config),
        "IEEE": g.ieee,
        "UPCAST": g.upcast,
        "FOLD": int(config["FOLD"]),
        "STAGES": int(config["num_stages"]),
        "RMS": f.rms,
        "ROPE_DIM": f.rope_dim,
    }


def _decode_operands(g: _Geometry, f: _Fusions, inputs: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
    """(x, w, w3, bias, residual, gamma, cos, sin), unused pointers standing in as x (never read)."""
    x = inputs[0]
    gamma = inputs[f.extra] if f.rms else x
    cos, sin = (inputs[f.extra + f.rms], inputs[f.extra + f.rms + 1]) if f.rope_dim else (x, x)
    return (*_operands(g, inputs[: f.extra]), gamma, cos, sin)


def _tiles(g: _Geometry, config: Config, splits: int = 1) -> int:
    return triton.cdiv(g.m, int(config["BLOCK_M"])) * triton.cdiv(g.n, int(config["BLOCK_N"])) * splits


def _split_constraints(g: _Geometry, f: _Fusions) -> list[Constraint]:
    return [
        Constraint("every split gets at least one K block", lambda c: c["SPLIT_K"] <= triton.cdiv(g.k, c["BLOCK_K"])),
        Constraint("the matmul family's reduction kernel (REDUCE=kernel) knows no RMSNorm prologue or RoPE",
                   lambda c: c["REDUCE"] == "last_program" or not (f.rms or f.rope_dim)),
    ]  # fmt: skip


# ---- gemv ---------------------------------------------------------------------------------------


def _gemv_space(spec: OpSpec, prune: bool = True) -> Space:
    return _space(_block_params(), spec, prune, "gemv")


def _gemv_build(spec: OpSpec, config: Config) -> Launcher:
    checked(_gemv_space(spec, prune=False), config)
    g, f = _geometry(spec), _fusions(spec)
    flags = _flags(g, f, config)
    kernel = direct_launch(_decode_gemv_kernel, (_tiles(g, config),))
    num_warps, num_stages = int(config["num_warps"]), int(config["num_stages"])

    def launch(inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> None:
        x, w, w3, bias, residual, gamma, cos, sin = _decode_operands(g, f, inputs)
        kernel(x, w, w3, bias, residual, gamma, cos, sin, outputs[0], g.m, g.n, g.k, f.eps, f.rope_cols, **flags,
               num_warps=num_warps, num_stages=num_stages)  # fmt: skip

    return launch


# ---- split_k and persistent ---------------------------------------------------------------------


def _split_k_space(spec: OpSpec, prune: bool = True) -> Space:
    params = [*_block_params(), Param("SPLIT_K", SPLITS), Param("REDUCE", REDUCTIONS)]
    return _space(params, spec, prune, "split_k", _split_constraints(_geometry(spec), _fusions(spec)))


def _persistent_space(spec: OpSpec, prune: bool = True) -> Space:
    params = [*_block_params(), Param("SPLIT_K", PERSISTENT_SPLITS), Param("PROGRAMS_PER_SM", PROGRAMS_PER_SM),
              Param("REDUCE", REDUCTIONS[:1])]  # (one launch: a persistent grid is about launches saved)  # fmt: skip
    return _space(params, spec, prune, "persistent",
                  [*_split_constraints(_geometry(spec), _fusions(spec)), _persistent_block_fits(_geometry(spec))])


def _persistent_block_fits(g: _Geometry) -> Constraint:
    """Observed on the H200 (Triton 3.6, 2026-12-01): persistent configs whose weight block
    (BLOCK_N x BLOCK_K) is larger than the budget asked for 256-320 KiB of shared memory even at
    num_stages = 1, which the pipelining model exempts, and failed to launch (BLOCK_N 64 or 256,
    BLOCK_K 2048). This bound excludes every failure seen; the compiler's reason is not established."""
    return Constraint(f"a persistent program's weight block fits in shared memory ({SHARED_MEMORY_BUDGET} bytes)",
                      lambda c: c["BLOCK_N"] * c["BLOCK_K"] * g.itemsize <= SHARED_MEMORY_BUDGET)


def _split_k_build(spec: OpSpec, config: Config) -> Launcher:
    checked(_split_k_space(spec, prune=False), config)
    g = _geometry(spec)
    splits = int(config["SPLIT_K"])
    return _split_launcher(g, _fusions(spec), config, splits, _tiles(g, config, splits))


def _persistent_build(spec: OpSpec, config: Config) -> Launcher:
    checked(_persistent_space(spec, prune=False), config)
    g = _geometry(spec)
    splits = int(config["SPLIT_K"])
    programs = min(_tiles(g, config, splits), int(config["PROGRAMS_PER_SM"]) * multiprocessor_count())
    return _split_launcher(g, _fusions(spec), config, splits, programs)


def _split_launcher(g: _Geometry, f: _Fusions, config: Config, splits: int, programs: int) -> Launcher:
    """The split-K kernel on ``programs`` programs, the partials reduced in order (bitwise
    reproducible, see the module docstring) by the last program of each output block
    (``REDUCE="last_program"``: one launch) or by the matmul family's reduction kernel
    (``REDUCE="kernel"``: two launches, no counters)."""
    flags = _flags(g, f, config)
    last_reduces = config["REDUCE"] == "last_program"
    partial_kernel = direct_launch(_decode_split_k_kernel, (programs,))
    reduce_m, reduce_n = _reduce_tile(g.m)
    reduce_grid = (triton.cdiv(g.m, reduce_m), triton.cdiv(g.n, reduce_n))
    reduce_kernel = direct_launch(_matmul_split_k_reduce_kernel, reduce_grid)
    num_warps, num_stages = int(config["num_warps"]), int(config["num_stages"])
    scratch_shape = (g.weights * splits, g.m, g.n)
    # One arrival counter per output block, zero between launches (the last program of a block
    # resets its own); made at the first call, on the inputs' device, and kept by the launcher.
    counters: dict[torch.device, torch.Tensor] = {}
    blocks = _tiles(g, config)

    def launch(inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> None:
        x, w, w3, bias, residual, gamma, cos, sin = _decode_operands(g, f, inputs)
        y = outputs[0]
        partial = y.new_empty(scratch_shape, dtype=torch.float32)  # every element is written
        counter = y  # unused without LAST_REDUCES
        if last_reduces:
            counter = counters.get(y.device)  # type: ignore[assignment]
            if counter is None:
                counter = counters.setdefault(y.device, y.new_empty(blocks, dtype=torch.int32))
                _zero_kernel[(triton.cdiv(blocks, ZERO_BLOCK),)](counter, blocks, BLOCK=ZERO_BLOCK)
        partial_kernel(x, w, w3, gamma, cos, sin, partial, counter, y, bias, residual, g.m, g.n, g.k, f.eps,
                       f.rope_cols, SPLIT_K=splits, **flags, LAST_REDUCES=last_reduces, num_warps=num_warps,
                       num_stages=num_stages)  # fmt: skip
        if not last_reduces:
            reduce_kernel(partial, y, bias, residual, g.m, g.n, g.n, g.n, SPLIT_K=splits, HAS_BIAS=g.has_bias,
                          EPILOGUE=g.epilogue, BLOCK_M=reduce_m, BLOCK_N=reduce_n, num_warps=4)  # fmt: skip

    return launch


# =================================================================================================
# The op family
# =================================================================================================


@dataclass(frozen=True)
class _DecodeVariant(_MatmulVariant):
    """A variant whose kernels also run the matmul family's epilogue, dot and reduction code (and,
    through them, kernelsmith.ops.gelu's): its source hash covers both modules, so that a change
    there invalidates stored decisions."""

    @property
    def source_hash(self) -> str:
        text = f"{super().source_hash}\n{inspect.getsource(_matmul_module)}"
        return hashlib.sha256(text.encode()).hexdigest()[:16]


PROLOGUES = ("none", "rmsnorm")
DEFAULT_EPS = 1e-6
ROPE_BASE = 10000.0  # make_inputs' angles: position * ROPE_BASE ** (-2 i / D)
MAX_POSITION = 8192  # make_inputs' positions are drawn below this


def _base_spec(spec: OpSpec) -> OpSpec:
    """The matmul family's spec inside a decode spec: the fused prologue's and RoPE's inputs and
    constants taken off."""
    f = _fusions(spec)
    constants = {k: v for k, v in spec.constants.items() if k not in ("prologue", "eps", "rope")}
    return OpSpec(spec.op, spec.inputs[: f.extra], constants)


def _rope_split(epilogue: Any) -> tuple[Any, bool]:
    """(the epilogue without "rope", whether it named RoPE): "bias+rope" is ("bias", True)."""
    if not isinstance(epilogue, str):
        return epilogue, False
    tokens = [t for t in re.split(r"[+,\s]+", epilogue.strip().lower()) if t]
    rest = [t for t in tokens if t != "rope"]
    return "+".join(rest) or "none", len(rest) != len(tokens)


def apply_rope_half(h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, heads: int, kv_heads: int) -> torch.Tensor:
    """Hugging Face's ``apply_rotary_pos_emb`` (rotate_half) on the q and k parts of a fused QKV
    projection's output ``h`` (..., (heads + 2 kv_heads) * D), cos and sin (..., D) at each row's
    position; v's part unchanged. In h's dtype, as Hugging Face computes it."""
    d = cos.shape[-1]
    lead = h.shape[:-1]
    qk = h[..., : (heads + kv_heads) * d].reshape(*lead, heads + kv_heads, d)
    c, s = cos.unsqueeze(-2), sin.unsqueeze(-2)
    rotated = torch.cat((-qk[..., d // 2 :], qk[..., : d // 2]), dim=-1)
    qk = (qk * c + rotated * s).reshape(*lead, (heads + kv_heads) * d)
    return torch.cat((qk, h[..., (heads + kv_heads) * d :]), dim=-1)


class DecodeMatmul(Matmul):
    name = "decode_matmul"
    summary = (f"decode-shaped y = epilogue(x @ w.T + bias) for at most {MAX_M} rows of x against an nn.Linear "
               "weight, streaming the weight at the bandwidth limit (split-N, split-K, persistent); epilogues "
               "as matmul's (none, gelu, gelu_tanh, silu, residual add, swiglu) or RoPE on a fused QKV "
               "output; optionally RMSNorm of x in the prologue")  # fmt: skip
    shape_help = (
        f"MxNxK: x (M, K) with M <= {MAX_M} times a weight (N, K) as nn.Linear stores it, e.g. 1x2048x8192 for "
        "Llama-3.2-1B's down projection at batch 1; more leading sizes are batch dims of x (4x2x4096x4096); "
        "--epilogue bias|gelu|silu|residual|swiglu|rope, or bias+gelu; constants prologue=rmsnorm (eps), "
        "rope=[heads, kv_heads] (with the rope epilogue)"
    )
    # (mypy infers Matmul.variants as a tuple of four _MatmulVariant; any tuple of variants will do)
    variants = (  # type: ignore[assignment]
        _DecodeVariant("gemv", "split-N: one program per BLOCK_N weight rows (and BLOCK_M rows of x), all of K, "
                       "epilogue fused", _gemv_space, _gemv_build),
        _DecodeVariant("split_k", "split-N and split-K: float32 partials of SPLIT_K ranges of K, summed in order "
                       "(by the last program of a block, or a second kernel) with the epilogue",
                       _split_k_space, _split_k_build),
        _DecodeVariant("persistent", "the split_k tiles walked by PROGRAMS_PER_SM programs per multiprocessor, "
                       "then the ordered reduction", _persistent_space, _persistent_build),
    )  # fmt: skip

    # ---- specs: matmul's, plus the fused prologue and RoPE ---------------------------------------
    def spec(  # type: ignore[override]
        self,
        shape: tuple[int, ...],
        dtype: str,
        layout: str = "linear",
        epilogue: str = "none",
        bias: bool | None = None,
        allow_tf32: bool | None = None,
        prologue: str = "none",
        eps: float = DEFAULT_EPS,
        rope: Sequence[int] | None = None,
        **constants: Any,
    ) -> OpSpec:
        """Matmul's spec, then ``prologue="rmsnorm"`` adds gamma ``(K,)`` (and the constant
        ``eps``) and ``epilogue="rope"`` (with ``rope=(heads, kv_heads)``) cos and sin
        ``(..., D)``, in that order after matmul's inputs.

        >>> [str(t) for t in OP.spec((1, 96, 64), "bf16", epilogue="rope", rope=(4, 1), prologue="rmsnorm").inputs]
        ['1x64:bfloat16', '96x64:bfloat16', '64:bfloat16', '1x16:bfloat16', '1x16:bfloat16']
        """
        rest, named_rope = _rope_split(epilogue)
        base = super().spec(shape, dtype, layout, rest, bias, allow_tf32, **constants)
        extra_inputs, extra_constants = self._extras(base, prologue, eps, named_rope, rope)
        spec = OpSpec(self.name, (*base.inputs, *extra_inputs), {**base.constants, **extra_constants})
        self.check_supported(spec)
        return spec

    def spec_for(  # type: ignore[override]
        self,
        *inputs: torch.Tensor,
        layout: str = "linear",
        epilogue: str = "none",
        bias: bool | None = None,
        allow_tf32: bool | None = None,
        prologue: str = "none",
        eps: float = DEFAULT_EPS,
        rope: Sequence[int] | None = None,
        **constants: Any,
    ) -> OpSpec:
        """The spec of ``(x, w[, w3][, bias][, residual][, gamma][, cos, sin])``."""
        rest, named_rope = _rope_split(epilogue)
        extra = (prologue == "rmsnorm") + 2 * named_rope
        if len(inputs) <= extra:
            raise UnsupportedWorkload(f"{self.name}: too few tensors ({len(inputs)}) for the fusions asked for")
        base = super().spec_for(*inputs[: len(inputs) - extra], layout=layout, epilogue=rest, bias=bias,
                                allow_tf32=allow_tf32, **constants)  # fmt: skip
        _, extra_constants = self._extras(base, prologue, eps, named_rope, rope)
        try:
            extra_inputs = tuple(TensorSpec.of(t) for t in inputs[len(inputs) - extra :])
        except ValueError as err:
            raise UnsupportedWorkload(f"{self.name}: {err}") from None
        spec = OpSpec(self.name, (*base.inputs, *extra_inputs), {**base.constants, **extra_constants})
        self.check_supported(spec)
        return spec

    def _extras(
        self, base: OpSpec, prologue: Any, eps: Any, named_rope: bool, rope: Sequence[int] | None
    ) -> tuple[tuple[TensorSpec, ...], dict[str, Any]]:
        """The decode-only inputs and constants (module docstring), checked."""
        x = base.inputs[0]
        inputs: list[TensorSpec] = []
        constants: dict[str, Any] = {}
        if prologue not in PROLOGUES:
            raise UnsupportedWorkload(f"{self.name}: prologue must be one of {PROLOGUES}, not {prologue!r}")
        if prologue == "rmsnorm":
            inputs.append(TensorSpec((x.shape[-1],), x.dtype))
            constants.update(prologue="rmsnorm", eps=check_eps(self.name, eps))
        if named_rope != (rope is not None):
            raise UnsupportedWorkload(f"{self.name}: the rope epilogue and rope=(heads, kv_heads) go together")
        if rope is not None:
            try:
                heads, kv_heads = (int(v) for v in rope)
            except (TypeError, ValueError):
                raise UnsupportedWorkload(f"{self.name}: rope must be (heads, kv_heads), not {rope!r}") from None
            if heads <= 0 or kv_heads <= 0:
                raise UnsupportedWorkload(f"{self.name}: rope heads must be positive, not {rope!r}")
            n = _geometry(base).n
            d = n // (heads + 2 * kv_heads)
            inputs += [TensorSpec((*x.shape[:-1], d), x.dtype)] * 2
            constants["rope"] = [heads, kv_heads]
        return tuple(inputs), constants

    def check_supported(self, spec: OpSpec) -> None:
        """The matmul family's checks on the matmul part, then the decode shapes (layout "linear",
        M <= MAX_M) and the fusions' inputs."""
        unknown = set(spec.constants) - {"layout", "epilogue", "bias", "allow_tf32", "prologue", "eps", "rope"}
        if unknown:
            raise UnsupportedWorkload(f"{self.name}: unknown constants {sorted(unknown)}")
        if spec.constants.get("prologue", "rmsnorm") != "rmsnorm" or ("prologue" in spec.constants) != (
            "eps" in spec.constants
        ):
            raise UnsupportedWorkload(f"{self.name}: the constants prologue='rmsnorm' and eps go together")
        rope = spec.constants.get("rope", [1, 1])
        if (not isinstance(rope, list | tuple) or len(rope) != 2
                or not all(isinstance(v, int) and v > 0 for v in rope)):  # fmt: skip
            raise UnsupportedWorkload(f"{self.name}: rope must be [heads, kv_heads], not {rope!r}")
        f = _fusions(spec)
        if f.extra < 2:
            raise UnsupportedWorkload(f"{self.name}: {spec.describe()} lacks the fused inputs")
        base = _base_spec(spec)
        super().check_supported(base)
        for t in spec.inputs[f.extra :]:
            if t.dtype not in self.dtypes or not t.is_contiguous:
                raise UnsupportedWorkload(f"{self.name}: fused input {t} must be contiguous, in x's dtype")
        if spec.const("layout") != "linear":
            raise UnsupportedWorkload(f"{self.name}: the weight must be (N, K) as nn.Linear stores it "
                                      "(layout 'linear'); use matmul for x @ w")  # fmt: skip
        g = _geometry(spec)
        if g.m > MAX_M:
            raise UnsupportedWorkload(f"{self.name}: x has {g.m} rows; decode shapes have at most {MAX_M} "
                                      "(use matmul)")  # fmt: skip
        x = spec.inputs[0]
        if f.rms and (spec.inputs[f.extra].shape != (g.k,) or spec.inputs[f.extra].dtype != x.dtype):
            raise UnsupportedWorkload(f"{self.name}: RMSNorm's gamma must be ({g.k},) in x's dtype")
        if "rope" in spec.constants:
            heads, kv_heads = spec.constants["rope"]
            d = f.rope_dim
            if g.epilogue != EPI_NONE or d * (heads + 2 * kv_heads) != g.n or d % 2:
                raise UnsupportedWorkload(f"{self.name}: RoPE wants a fused QKV output of (heads + 2 kv_heads) x an "
                                          f"even head dim columns ({heads} + 2 x {kv_heads} heads do not split "
                                          f"{g.n}) and no other epilogue than a bias")  # fmt: skip
            if d % BLOCKS_N[0]:
                raise UnsupportedWorkload(f"{self.name}: RoPE needs a head dim that is a multiple of {BLOCKS_N[0]}, "
                                          f"not {d}")  # fmt: skip
            wanted = TensorSpec((*x.shape[:-1], d), x.dtype)
            for t in spec.inputs[f.extra + f.rms :]:
                if t.shape != wanted.shape or t.dtype != wanted.dtype:
                    raise UnsupportedWorkload(f"{self.name}: cos and sin must be {wanted} (one row per row of x)")

    def _with_rows(self, spec: OpSpec, m: int) -> OpSpec:
        """Matmul's, and cos and sin follow x's rows."""
        f = _fusions(spec)
        resized = super()._with_rows(_base_spec(spec), m)
        extras = list(spec.inputs[f.extra :])
        if f.rope_dim:
            extras[-2:] = [TensorSpec((m, f.rope_dim), t.dtype) for t in extras[-2:]]
        return OpSpec(spec.op, (*resized.inputs, *extras), dict(spec.constants))

    def stressed_inputs(self, spec: OpSpec) -> tuple[int, ...]:
        """The matmul part's (x, and a residual shaped like it): never gamma, cos or sin."""
        return super().stressed_inputs(_base_spec(spec))

    # ---- math ------------------------------------------------------------------------------------
    def _compute(self, spec: OpSpec, inputs: Sequence[torch.Tensor]) -> torch.Tensor:
        """Hugging Face's modules in order, in the inputs' dtype: LlamaRMSNorm on x (float32 sums,
        the normalized row rounded, times gamma), the projection and its epilogue, then
        apply_rotary_pos_emb on q and k."""
        f = _fusions(spec)
        base = _base_spec(spec)
        x = inputs[0]
        if f.rms:
            gamma = inputs[f.extra]
            xf = x.to(torch.promote_types(x.dtype, torch.float32))
            x = gamma * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + f.eps)).to(x.dtype)
        h = super()._compute(base, [x, *inputs[1 : f.extra]])
        if f.rope_dim:
            heads, kv_heads = spec.constants["rope"]
            h = apply_rope_half(h, inputs[f.extra + f.rms], inputs[f.extra + f.rms + 1], heads, kv_heads)
        return h

    def make_inputs(
        self,
        spec: OpSpec,
        seed: int,
        distribution: str = "normal",
        device: str | torch.device = "cuda",
    ) -> tuple[torch.Tensor, ...]:
        """Matmul's inputs, then gamma ``1 + 0.5 N(0, 1)`` and cos and sin at a random position per
        row (Hugging Face's cache: ``cat(freqs, freqs)`` of ``position * ROPE_BASE ** (-2i / D)``)."""
        f = _fusions(spec)
        tensors = list(super().make_inputs(_base_spec(spec), seed, distribution, device))
        dtype = spec.inputs[0].torch_dtype
        g = generator(seed ^ 0xD3C0DE, device)
        if f.rms:
            tensors.append((1 + 0.5 * torch.randn(spec.inputs[f.extra].shape, generator=g, device=device)).to(dtype))
        if f.rope_dim:
            rows = _geometry(spec).m
            positions = torch.randint(0, MAX_POSITION, (rows, 1), generator=g, device=device).to(torch.float64)
            i = torch.arange(0, f.rope_dim, 2, device=device, dtype=torch.float64)
            freqs = positions * ROPE_BASE ** (-i / f.rope_dim)
            angles = torch.cat((freqs, freqs), dim=-1)
            shape = spec.inputs[-1].shape
            tensors += [angles.cos().to(dtype).reshape(shape), angles.sin().to(dtype).reshape(shape)]
        return tuple(tensors)

    def flops(self, spec: OpSpec) -> int:
        """Matmul's, plus RMSNorm's 4 an element of x and RoPE's 3 a rotated element."""
        f = _fusions(spec)
        m = _geometry(spec).m
        return super().flops(spec) + 4 * m * _geometry(spec).k * f.rms + 3 * m * f.rope_cols


OP = DecodeMatmul()

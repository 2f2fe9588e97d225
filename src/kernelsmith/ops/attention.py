"""Scaled dot-product attention, forward: ``softmax(q @ k^T * scale + mask) @ v``, FlashAttention style.

The op
------
Inputs ``(q, k, v)`` or ``(q, k, v, mask)``; one output shaped like ``q``, in ``q``'s dtype,
contiguous in the spec's layout. It computes exactly what ``F.scaled_dot_product_attention``
computes with ``dropout_p=0``.

- ``q`` has ``H`` heads of ``Sq`` positions, ``k`` and ``v`` have ``Hk`` heads of ``Sk``
  positions; all three share the head dimension ``D`` (a multiple of 16, at most 256) and the
  dtype (float16, bfloat16 or float32). ``Hk`` divides ``H``: query head ``h`` reads key/value
  head ``h // (H / Hk)``, which is torch's ``enable_gqa=True`` (``repeat_interleave`` of the
  key/value heads): grouped-query attention, multi-query attention for ``Hk = 1``.
- The constant ``layout`` says how the four sizes are ordered: ``"bhsd"`` (``(B, H, S, D)``,
  torch's SDPA layout) or ``"bshd"`` (``(B, S, H, D)``, the projection's output, flash-attn's
  layout). Any strides are accepted as long as ``D`` has unit stride: Hugging Face's
  ``proj(x).view(B, S, H, D).transpose(1, 2)`` (a ``bhsd`` tensor with ``bshd`` memory) and
  slices of a fused qkv projection are read in place. The output is contiguous in the layout.
- ``mask``, optional, is boolean (True = attend, torch's convention) or additive (a float mask
  in ``q``'s dtype, added to the scaled scores), of any shape broadcastable to
  ``(B, H, Sq, Sk)`` whatever the layout: ``(Sq, Sk)``, Hugging Face's ``(B, 1, Sq, Sk)``, a key
  padding mask ``(B, 1, 1, Sk)``... A mask broadcast by ``expand`` (stride 0) is recorded in
  the spec as its size-1 form.
- Constants: ``layout``, ``causal`` (torch's ``is_causal``) and ``scale``, the softmax scale
  (``1 / sqrt(D)`` unless given; the spec always holds the number).

Semantics worth knowing (all of them torch's):

- **Causal masking is aligned to the top left**: query ``i`` attends to keys ``j <= i``. When
  ``Sq < Sk`` (a decode step against a key/value cache) query 0 therefore sees key 0 only,
  *not* the whole cache: that is what ``is_causal=True`` computes in
  ``F.scaled_dot_product_attention`` (flash-attn's ``causal=True`` and torch's
  ``causal_lower_right`` bias align to the bottom right instead). Decoding code passes
  ``is_causal=False`` for a single query, or an explicit mask. ``causal`` together with a mask is
  refused (torch's CUDA backends reject the pair).
- A query row whose every key is masked (all ``False``, or all ``-inf``) outputs zeros, as
  torch's "safe softmax" does since 2.5, not NaN.
- An additive mask of large finite negative values (Hugging Face uses ``finfo(dtype).min``) is
  an ordinary softmax over those values: nothing treats them as ``-inf``.

The algorithm (online softmax, FlashAttention-2)
-----------------------------------------------
A program owns ``BLOCK_M`` query rows and walks the keys ``BLOCK_N`` at a time, never
materialising the ``Sq x Sk`` score matrix. For each key block it computes the scores
``s = q k^T * scale (+ mask)`` with ``tl.dot`` (fp32 accumulation) and keeps, per row, the running
max ``m``, the running sum ``l = sum exp(s - m)`` and the unnormalised output ``acc = sum
exp(s - m) v``. When a block raises the max from ``m`` to ``m'``, ``l`` and ``acc`` are rescaled
by ``alpha = exp(m - m')`` before the block's terms are added (Milakov & Gimelshein's online
softmax); the output is ``acc / l`` at the end. Masked scores are ``-inf``; while every score a
row has seen is ``-inf`` its max is ``-inf`` and the kernels shift by 0 instead (``-inf - -inf``
would be NaN), so fully masked blocks add nothing and fully masked rows end with ``l = 0`` and
are written as 0.

Without an additive mask the scale is folded with ``log2(e)`` into one multiply and the
exponentials are ``exp2`` (what ``exp`` compiles to anyway). With an additive mask the scores
stay in natural units (``q k^T * scale + mask``, then ``exp``): folding ``log2(e)`` into the mask
would overflow Hugging Face's ``finfo(float32).min`` to ``-inf``.

Precision: q, k and v are read in their dtype; both products accumulate in float32; the
probabilities are rounded to the inputs' dtype before the ``p @ v`` product (as FlashAttention
and cuDNN do in fp16/bf16); everything else is float32 and the output is rounded once. float32
inputs are multiplied in full IEEE float32 (``input_precision="ieee"``), never TF32, matching
PyTorch's float32 SDPA.

Causal block skipping: a program stops at the diagonal (the last key any of its rows may see),
about halving the work. Key blocks that need no masking at all (below the diagonal, inside
``Sk``) and the "edge" blocks that do (the diagonal, the ragged last block) can run in two
separate loops (``TWO_LOOPS=True``: the interior loop has no compares and no selects, at the
price of code size) or in one masked loop (``TWO_LOOPS=False``). For causal tiles the programs
of a head start with its heaviest (last) query block.

The variants
------------
``flash``
    One program per (query block, head, batch): the FlashAttention-2 forward. The default for
    prefill shapes.
``persistent``
    A fixed grid of ``PROGRAMS_PER_SM`` programs per multiprocessor, each walking the tiles
    ``pid, pid + programs, ...``: fewer, longer programs, no launch tail.
``split_kv``
    Flash-decoding: the keys are cut into ``SPLITS`` ranges computed by separate programs, each
    writing a partial ``(acc, m, l)`` to a float32 scratch buffer; a second kernel merges them
    (``o = sum_s exp(m_s - M) acc_s / sum_s exp(m_s - M) l_s``). For short queries against long
    caches, where one program per (query block, head) leaves most of the GPU idle.

Every variant has ``BLOCK_M``, ``BLOCK_N``, ``num_warps``, ``num_stages`` (the pipelining depth of
the key loop) and ``TWO_LOOPS``; with grouped-query attention also ``PACK_GQA``: when True the
``H / Hk`` query heads sharing a key/value head are packed into the rows of one tile (row ``r``
is position ``r // G`` of head ``r % G``), so that each key/value block is loaded once for the
whole group: for decoding (``Sq = 1``) a 16-row tile then holds up to 16 useful rows instead of
one. Constraints keep the tiles that fit: the q tile and ``num_stages`` k and v tiles in shared
memory (227 KiB, the exact amount Triton allocates), at most 128 float32 values of output and
scores a thread (past that ptxas spills registers), at least a 16x16 score block a warp. Spaces
depend on ``D``, the dtype and the head grouping, never on ``B`` or ``Sk``, so that a config is
validated on other lengths (see :meth:`Attention.validation_specs`); the one exception is
``split_kv``, offered for queries of at most 128 positions only (longer queries fill the GPU
without splitting, and the partial buffers would be ``SPLITS`` times the output), which every
validation tail of a short query is too.

``tma``
    The flash forward with the key and value blocks loaded through tensor descriptors: on Hopper
    the Tensor Memory Accelerator copies them to shared memory asynchronously (no address
    arithmetic or bounds checks in registers, and Triton's pipeliner overlaps the copies with the
    products). k and v are described as 2-D tensors whose rows are their position stride apart:
    ``(B * Hk * Sk, D)`` for ``(B, H, S, D)`` memory, ``(B * Sk, Hk * D)`` for ``(B, S, H, D)``
    memory, each (batch, head) starting at a row and a column of its own. A block that runs past
    ``Sk`` reads the next head's rows (or zeros past the end): their scores are masked, and their
    values are zeroed before the product so that an infinite value elsewhere cannot make a NaN.
    Offered where Triton has tensor descriptors and the GPU is a Hopper or newer (and in the
    interpreter), for power-of-two head dims; k or v that a descriptor cannot address (storage
    not 16-byte aligned) run the flash variant's pointer loads with the same config.

Warp specialization (producer and consumer warps, as cuDNN and FlashAttention-3 use on Hopper) is
not used yet; it is the next step towards cuDNN's throughput.

In the Triton interpreter (3.9 at least) ``tl.dot`` multiplies bfloat16 blocks as their raw
uint16 bits; there, and only there, the kernels convert bfloat16 operands to float32 before the
products (``DOT_IN_FP32``), which is exact.

Flops: ``4 * B * H * D`` per attended (query, key) pair (two products of 2 flops a
multiply-add); causal attention counts only the pairs ``j <= i`` (``Sq (Sq + 1) / 2`` for
``Sq = Sk``, the usual "half"); the softmax's exponentials are not counted (the usual convention,
which the TFLOP/s of FlashAttention and cuDNN papers follow).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import triton
import triton.language as tl

from kernelsmith.ops._base import (
    FINITE_STRESS_DISTRIBUTIONS,
    Launcher,
    OpFamily,
    UnsupportedWorkload,
    Variant,
    generator,
)
from kernelsmith.ops._launch import direct_launch, tensor_descriptor_class, tma_available
from kernelsmith.space import Config, Constraint, Param, Space, next_power_of_two
from kernelsmith.spec import OpSpec, TensorSpec, contiguous_strides, dtype_name

LAYOUTS = ("bhsd", "bshd")
MASKS = ("none", "additive", "boolean")  # spec()'s mask argument
MAX_HEAD_DIM = 256
MAX_PROGRAMS = 2**31 - 1  # a CUDA grid's first dimension
LOG2E = 1.4426950408889634

# Mask kinds as the kernels see them (a constexpr).
_NO_MASK, _ADDITIVE, _BOOLEAN = 0, 1, 2

# =================================================================================================
# Kernels
#
# Conventions. A "tile" is BLOCK_M query rows of one (batch, head). Row r of a tile is position
# r // PACK of query head head * PACK + r % PACK (PACK = 1: one head, rows are positions; PACK =
# G = H / Hk: the G query heads of one key/value head, interleaved). Every tensor is addressed
# through explicit (batch, head, position) strides with unit stride along D; offsets are int64.
# Scores are in log2 units (scale * log2 e folded in, exp2) except with an additive mask
# (natural units, exp): see the module docstring.
# =================================================================================================


@triton.jit
def _load_block(ptrs, rows_ok, cols_ok, CHECK_ROWS: tl.constexpr, CHECK_COLS: tl.constexpr):
    """A [rows, cols] block, bounds-checked only where asked (zeros outside)."""
    if CHECK_ROWS and CHECK_COLS:
        x = tl.load(ptrs, mask=rows_ok[:, None] & cols_ok[None, :], other=0.0)
    elif CHECK_ROWS:
        x = tl.load(ptrs, mask=rows_ok[:, None], other=0.0)
    elif CHECK_COLS:
        x = tl.load(ptrs, mask=cols_ok[None, :], other=0.0)
    else:
        x = tl.load(ptrs)
    return x


@triton.jit
def _dot(a, b, acc, PRECISION: tl.constexpr, IN_FP32: tl.constexpr):
    """``a @ b (+ acc)`` in float32. IN_FP32: the operands are converted to float32 first, which
    is exact for products of 16-bit values; used only in the Triton interpreter, whose tl.dot
    multiplies bfloat16 blocks as their raw uint16 bits (Triton 3.9)."""
    if IN_FP32:
        c = tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
    else:
        c = tl.dot(a, b, acc, input_precision=PRECISION)
    return c


@triton.jit
def _attn_steps(
    acc, l_i, m_i,  # running output [BLOCK_M, BLOCK_D], sum and max [BLOCK_M] (float32)
    q,  # [BLOCK_M, BLOCK_D] in the inputs' dtype
    k_base, v_base,  # k and v pointers at (batch, kv head)
    k_desc, v_desc,  # with USE_DESC: tensor descriptors of k and v seen as 2-D (rows of D elements)
    k_row, k_col, v_row, v_col,  # with USE_DESC: where key 0 of this (batch, kv head) is in them
    mask_rows,  # [BLOCK_M] pointers at each row's mask row (unused without a mask)
    pos, row_ok,  # [BLOCK_M]: each row's query position and whether it exists
    lo, hi, Sk,  # key range [lo, hi) of this loop, and the key count
    k_ss, v_ss, mask_sk,
    qk_scale,  # scale (additive mask) or scale * log2(e)
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr,
    MASK_KIND: tl.constexpr,
    EDGE: tl.constexpr,  # the blocks may cross Sk or the diagonal: mask by key index
    PRECISION: tl.constexpr,
    DOT_IN_FP32: tl.constexpr,
    USE_DESC: tl.constexpr,  # load k and v blocks through tensor descriptors (TMA on Hopper)
):  # fmt: skip
    """The online-softmax update over the key blocks [lo, hi)."""
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < HEAD_DIM
    # Pointers of key block 0; block `start` is these plus one 64-bit scalar offset, so that no
    # per-element 64-bit multiply runs in the loop. (The mask's [BLOCK_M, BLOCK_N] pointers are
    # made in each step instead: kept across the loop they would hold too many registers.)
    k_block = k_base + offs_n[:, None] * k_ss + offs_d[None, :]
    v_block = v_base + offs_n[:, None] * v_ss + offs_d[None, :]
    for start in range(lo, hi, BLOCK_N):
        cols = start + offs_n
        cols_ok = cols < Sk
        start64 = tl.cast(start, tl.int64)  # (tl.cast: in the interpreter start is a Python int)
        if USE_DESC:  # rows past Sk belong to the next head (or are zeros): their scores are masked
            k = k_desc.load([k_row + start, k_col])
        else:
            k = _load_block(k_block + start64 * k_ss, cols_ok, d_ok, EDGE, HEAD_DIM < BLOCK_D)
        qk = _dot(q, tl.trans(k), None, PRECISION, DOT_IN_FP32)  # [BLOCK_M, BLOCK_N], float32

        if MASK_KIND != 0:
            mask_ptrs = mask_rows[:, None] + (cols.to(tl.int64) * mask_sk)[None, :]
        if MASK_KIND == 1:  # additive: natural units, the mask added to the scaled scores
            bias = _load_block(mask_ptrs, row_ok, cols_ok, True, EDGE)
            s = qk * qk_scale + bias.to(tl.float32)
        else:
            s = qk * qk_scale
        if MASK_KIND == 2:  # boolean: False is -inf (rows past Sq load False: never stored)
            keep = _load_block(mask_ptrs, row_ok, cols_ok, True, EDGE)
            s = tl.where(keep != 0, s, float("-inf"))
        if EDGE:
            ok = cols_ok[None, :]
            if CAUSAL:  # top-left aligned: query i sees keys j <= i
                ok = ok & (cols[None, :] <= pos[:, None])
            s = tl.where(ok, s, float("-inf"))

        m_new = tl.maximum(m_i, tl.max(s, 1))
        # While a row has seen only -inf its max is -inf; shifting by 0 keeps exp(-inf) = 0
        # instead of exp(-inf - -inf) = NaN.
        shift = tl.where(m_new == float("-inf"), 0.0, m_new)
        if MASK_KIND == 1:
            p = tl.exp(s - shift[:, None])
            alpha = tl.exp(m_i - shift)
        else:
            p = tl.exp2(s - shift[:, None])
            alpha = tl.exp2(m_i - shift)
        l_i = l_i * alpha + tl.sum(p, 1)
        if USE_DESC:
            v = v_desc.load([v_row + start, v_col])
            if EDGE:  # another head's values past Sk: p is 0 there, but 0 * inf would be NaN
                v = tl.where(cols_ok[:, None], v, 0.0)
        else:
            v = _load_block(v_block + start64 * v_ss, cols_ok, d_ok, EDGE, HEAD_DIM < BLOCK_D)
        acc = acc * alpha[:, None]
        acc = _dot(p.to(v.dtype), v, acc, PRECISION, DOT_IN_FP32)
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def _attn_tile(
    q_ptr, k_ptr, v_ptr, mask_ptr, o_ptr, m_ptr, l_ptr, k_desc, v_desc,
    b, head, m_block, split,  # the tile: batch, head (of q, or of k/v when packed), query block, key split
    qk_scale, Sq, Sk, keys_per_split,
    q_sb, q_sh, q_ss, k_sb, k_sh, k_ss, v_sb, v_sh, v_ss,
    o_sb, o_sh, o_ss, o_split,  # the output's strides, or the partial acc's (split: its split stride)
    ml_sb, ml_sh, ml_split,  # partial m and l: (batch, head, split) strides, position stride 1
    mask_sb, mask_sh, mask_sq, mask_sk,
    GROUP: tl.constexpr,  # query heads per key/value head
    PACK: tl.constexpr,  # query heads packed into one tile's rows (1 or GROUP)
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr,
    MASK_KIND: tl.constexpr,
    TWO_LOOPS: tl.constexpr,
    PARTIAL: tl.constexpr,  # split-kv: write (acc, m, l) unnormalised instead of the output
    PRECISION: tl.constexpr,
    DOT_IN_FP32: tl.constexpr,
    USE_DESC: tl.constexpr,
):  # fmt: skip
    """Attention of one tile of query rows over the keys [split * keys_per_split, ...)."""
    rows = m_block * BLOCK_M + tl.arange(0, BLOCK_M)
    pos = rows // PACK
    qh = (head * PACK + rows % PACK).to(tl.int64)  # each row's query head
    kvh = (head * PACK) // GROUP  # the key/value head of the whole tile
    row_ok = pos < Sq
    pos64 = pos.to(tl.int64)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < HEAD_DIM

    q_rows = q_ptr + b * q_sb + qh * q_sh + pos64 * q_ss
    q = _load_block(q_rows[:, None] + offs_d[None, :], row_ok, d_ok, True, HEAD_DIM < BLOCK_D)
    k_base = k_ptr + b * k_sb + kvh * k_sh
    v_base = v_ptr + b * v_sb + kvh * v_sh
    # In a descriptor, k is rows of k_ss elements: key 0 of this (batch, head) starts at row
    # offset // k_ss, column offset % k_ss (column 0 for (B, H, S, D) memory, head * D for
    # (B, S, H, D) memory). Unused without descriptors.
    k_off = b * k_sb + kvh * k_sh
    v_off = b * v_sb + kvh * v_sh
    k_row, k_col = (k_off // k_ss).to(tl.int32), (k_off % k_ss).to(tl.int32)
    v_row, v_col = (v_off // v_ss).to(tl.int32), (v_off % v_ss).to(tl.int32)
    mask_rows = mask_ptr + b * mask_sb + qh * mask_sh + pos64 * mask_sq

    # Keys this tile needs: all of them, or (causal) up to its last row's position; and the end
    # of the interior blocks, which need no masking (inside Sk, below every row's diagonal).
    if CAUSAL:
        hi = tl.minimum(Sk, (m_block * BLOCK_M + BLOCK_M - 1) // PACK + 1)
        interior = tl.minimum((m_block * BLOCK_M) // PACK + 1, Sk) // BLOCK_N * BLOCK_N
    else:
        hi = Sk
        interior = Sk // BLOCK_N * BLOCK_N
    lo = split * keys_per_split
    stop = tl.minimum(lo + keys_per_split, hi)

    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    if TWO_LOOPS:
        mid = tl.maximum(lo, tl.minimum(interior, stop))
        acc, l_i, m_i = _attn_steps(acc, l_i, m_i, q, k_base, v_base, k_desc, v_desc, k_row, k_col, v_row, v_col,
                                    mask_rows, pos, row_ok, lo, mid, Sk, k_ss, v_ss, mask_sk, qk_scale, HEAD_DIM,
                                    BLOCK_D, BLOCK_N, CAUSAL, MASK_KIND, False, PRECISION, DOT_IN_FP32, USE_DESC)
    else:
        mid = lo
    acc, l_i, m_i = _attn_steps(acc, l_i, m_i, q, k_base, v_base, k_desc, v_desc, k_row, k_col, v_row, v_col,
                                mask_rows, pos, row_ok, mid, stop, Sk, k_ss, v_ss, mask_sk, qk_scale, HEAD_DIM,
                                BLOCK_D, BLOCK_N, CAUSAL, MASK_KIND, True, PRECISION, DOT_IN_FP32, USE_DESC)

    o_rows = o_ptr + b * o_sb + qh * o_sh + pos64 * o_ss
    store_mask = row_ok[:, None] & d_ok[None, :]
    if PARTIAL:
        o_rows += split * o_split
        tl.store(o_rows[:, None] + offs_d[None, :], acc, mask=store_mask)
        ml = split * ml_split + b * ml_sb + qh * ml_sh + pos64
        tl.store(m_ptr + ml, m_i, mask=row_ok)
        tl.store(l_ptr + ml, l_i, mask=row_ok)
    else:
        inv = 1.0 / tl.where(l_i == 0.0, 1.0, l_i)  # a fully masked row has acc = 0: it writes 0
        out = acc * inv[:, None]
        tl.store(o_rows[:, None] + offs_d[None, :], out.to(o_ptr.dtype.element_ty), mask=store_mask)


@triton.jit
def _attn_flash_kernel(
    q_ptr, k_ptr, v_ptr, mask_ptr, o_ptr, k_desc, v_desc,
    qk_scale, Sq, Sk, keys_per_split, HEAD_TILES, M_BLOCKS,
    q_sb, q_sh, q_ss, k_sb, k_sh, k_ss, v_sb, v_sh, v_ss, o_sb, o_sh, o_ss,
    mask_sb, mask_sh, mask_sq, mask_sk,
    GROUP: tl.constexpr, PACK: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr, MASK_KIND: tl.constexpr,
    TWO_LOOPS: tl.constexpr, PRECISION: tl.constexpr, DOT_IN_FP32: tl.constexpr, USE_DESC: tl.constexpr,
):  # fmt: skip
    """One program per tile; the query blocks of one head are consecutive programs (they share
    its keys and values in L2), the heaviest first when causal. USE_DESC (the tma variant): k and
    v are read through tensor descriptors; otherwise k_desc and v_desc are unused."""
    pid = tl.program_id(0)
    m_block = pid % M_BLOCKS
    if CAUSAL:
        m_block = M_BLOCKS - 1 - m_block
    bh = (pid // M_BLOCKS).to(tl.int64)
    _attn_tile(q_ptr, k_ptr, v_ptr, mask_ptr, o_ptr, o_ptr, o_ptr, k_desc, v_desc, bh // HEAD_TILES,
               bh % HEAD_TILES, m_block, 0, qk_scale, Sq, Sk, keys_per_split,
               q_sb, q_sh, q_ss, k_sb, k_sh, k_ss, v_sb, v_sh, v_ss, o_sb, o_sh, o_ss, 0, 0, 0, 0,
               mask_sb, mask_sh, mask_sq, mask_sk, GROUP, PACK, HEAD_DIM, BLOCK_D, BLOCK_M, BLOCK_N, CAUSAL,
               MASK_KIND, TWO_LOOPS, False, PRECISION, DOT_IN_FP32, USE_DESC)


@triton.jit
def _attn_persistent_kernel(
    q_ptr, k_ptr, v_ptr, mask_ptr, o_ptr,
    qk_scale, Sq, Sk, keys_per_split, HEAD_TILES, M_BLOCKS, N_TILES,
    q_sb, q_sh, q_ss, k_sb, k_sh, k_ss, v_sb, v_sh, v_ss, o_sb, o_sh, o_ss,
    mask_sb, mask_sh, mask_sq, mask_sk,
    GROUP: tl.constexpr, PACK: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr, MASK_KIND: tl.constexpr,
    TWO_LOOPS: tl.constexpr, PRECISION: tl.constexpr, DOT_IN_FP32: tl.constexpr,
):  # fmt: skip
    """A fixed grid striding over the tiles in the flash kernel's order."""
    for tile in tl.range(tl.program_id(0), N_TILES, tl.num_programs(0)):
        m_block = tile % M_BLOCKS
        if CAUSAL:
            m_block = M_BLOCKS - 1 - m_block
        bh = tl.cast(tile // M_BLOCKS, tl.int64)  # (tl.cast: in the interpreter tile is a Python int)
        _attn_tile(q_ptr, k_ptr, v_ptr, mask_ptr, o_ptr, o_ptr, o_ptr, k_ptr, v_ptr, bh // HEAD_TILES,
                   bh % HEAD_TILES, m_block, 0, qk_scale, Sq, Sk, keys_per_split,
                   q_sb, q_sh, q_ss, k_sb, k_sh, k_ss, v_sb, v_sh, v_ss, o_sb, o_sh, o_ss, 0, 0, 0, 0,
                   mask_sb, mask_sh, mask_sq, mask_sk,
                   GROUP, PACK, HEAD_DIM, BLOCK_D, BLOCK_M, BLOCK_N, CAUSAL, MASK_KIND, TWO_LOOPS, False, PRECISION,
                   DOT_IN_FP32, False)


@triton.jit
def _attn_split_kernel(
    q_ptr, k_ptr, v_ptr, mask_ptr, acc_ptr, m_ptr, l_ptr,
    qk_scale, Sq, Sk, keys_per_split, HEAD_TILES, M_BLOCKS, SPLITS,
    q_sb, q_sh, q_ss, k_sb, k_sh, k_ss, v_sb, v_sh, v_ss,
    acc_sb, acc_sh, acc_ss, acc_split, ml_sb, ml_sh, ml_split,
    mask_sb, mask_sh, mask_sq, mask_sk,
    GROUP: tl.constexpr, PACK: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr, MASK_KIND: tl.constexpr,
    TWO_LOOPS: tl.constexpr, PRECISION: tl.constexpr, DOT_IN_FP32: tl.constexpr,
):  # fmt: skip
    """One program per (key split, tile): the partial results of one key range."""
    pid = tl.program_id(0)
    split = (pid % SPLITS).to(tl.int64)  # int64: split * (the partials' split stride) may pass 2**31
    rest = pid // SPLITS
    m_block = rest % M_BLOCKS
    bh = (rest // M_BLOCKS).to(tl.int64)
    _attn_tile(q_ptr, k_ptr, v_ptr, mask_ptr, acc_ptr, m_ptr, l_ptr, k_ptr, v_ptr, bh // HEAD_TILES,
               bh % HEAD_TILES, m_block, split, qk_scale, Sq, Sk, keys_per_split,
               q_sb, q_sh, q_ss, k_sb, k_sh, k_ss, v_sb, v_sh, v_ss,
               acc_sb, acc_sh, acc_ss, acc_split, ml_sb, ml_sh, ml_split, mask_sb, mask_sh, mask_sq, mask_sk,
               GROUP, PACK, HEAD_DIM, BLOCK_D, BLOCK_M, BLOCK_N, CAUSAL, MASK_KIND, TWO_LOOPS, True, PRECISION,
               DOT_IN_FP32, False)


@triton.jit
def _attn_combine_kernel(
    acc_ptr, m_ptr, l_ptr, o_ptr,
    Sq, H,
    o_sb, o_sh, o_ss, acc_split, ml_split,
    SPLITS: tl.constexpr, BLOCK_S: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    LOG2_UNITS: tl.constexpr,  # the partial maxima are in log2 units (no additive mask)
):  # fmt: skip
    """Merge the SPLITS partial results of one query row (program) into its output."""
    row = tl.program_id(0).to(tl.int64)  # (batch * H + head) * Sq + position
    pos = row % Sq
    bh = row // Sq
    s = tl.arange(0, BLOCK_S).to(tl.int64)
    s_ok = s < SPLITS
    m = tl.load(m_ptr + s * ml_split + row, mask=s_ok, other=float("-inf"))
    l = tl.load(l_ptr + s * ml_split + row, mask=s_ok, other=0.0)
    m_max = tl.max(m, 0)
    shift = tl.where(m_max == float("-inf"), 0.0, m_max)  # every split empty or fully masked
    w = tl.exp2(m - shift) if LOG2_UNITS else tl.exp(m - shift)
    total = tl.sum(w * l, 0)
    d = tl.arange(0, BLOCK_D)
    d_ok = d < HEAD_DIM
    acc = tl.load(acc_ptr + s[:, None] * acc_split + row * HEAD_DIM + d[None, :],
                  mask=s_ok[:, None] & d_ok[None, :], other=0.0)
    out = tl.sum(acc * w[:, None], 0) / tl.where(total == 0.0, 1.0, total)
    o = o_ptr + (bh // H) * o_sb + (bh % H) * o_sh + pos * o_ss + d
    tl.store(o, out.to(o_ptr.dtype.element_ty), mask=d_ok)


# =================================================================================================
# Shapes
# =================================================================================================


@dataclass(frozen=True)
class _Dims:
    """The sizes of one workload, whatever the layout."""

    batch: int
    heads: int
    kv_heads: int
    q_len: int
    kv_len: int
    head_dim: int

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
    return _Dims(b, h, hk, sq, sk, d)


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


def _positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise UnsupportedWorkload(f"attention: {name} must be a positive integer, not {value!r}")
    return value


def _choice(name: str, value: Any, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise UnsupportedWorkload(f"attention: {name} must be one of {', '.join(choices)}, not {value!r}")
    return str(value)


def _flag(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise UnsupportedWorkload(f"attention: {name} must be true or false, not {value!r}")
    return value


def _scale(value: Any, head_dim: int) -> float:
    """The softmax scale: ``value`` as a finite float, or torch's default ``1 / sqrt(D)``."""
    if value is None:
        return 1.0 / math.sqrt(head_dim)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise UnsupportedWorkload(f"attention: scale must be a finite number, not {value!r}")
    return float(value)


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


def _checked(space: Space, config: Config) -> None:
    problems = space.violations(config)
    if problems:
        raise ValueError(f"config {config.key} is not in the space: {'; '.join(problems)}")


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
    _checked(_flash_space(spec), config)
    return _flash_launcher(spec, config, descriptors=False)


# ---- tma ------------------------------------------------------------------------------------------


def _tma_space(spec: OpSpec) -> Space:
    d = _dims(spec)
    usable = tma_available(_interpreted()) and d.head_dim == next_power_of_two(d.head_dim)
    only_here = Constraint("tensor descriptors: a Triton that has them, Hopper or newer, a power-of-two head_dim",
                           lambda c: usable)  # fmt: skip
    return Space(_tile_params(spec), [*_tile_constraints(spec), only_here])


def _tma_build(spec: OpSpec, config: Config) -> Launcher:
    _checked(_tma_space(spec), config)
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
    _checked(_persistent_space(spec), config)
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
    _checked(_split_space(spec), config)
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


# =================================================================================================
# The reference
# =================================================================================================


def _sdpa(spec: OpSpec, inputs: Sequence[torch.Tensor], dtype: torch.dtype | None) -> torch.Tensor:
    """F.scaled_dot_product_attention on the spec's inputs, in ``dtype`` (None: their own), with
    the result contiguous in the spec's layout. In float64 the key/value heads are expanded with
    repeat_interleave and the batch is done one sequence at a time (the math backend holds the
    whole (H, Sq, Sk) score matrix)."""
    q, k, v = (t if dtype is None else t.to(dtype) for t in inputs[:3])
    mask = inputs[3] if len(inputs) == 4 else None
    if mask is not None and dtype is not None and mask.dtype != torch.bool:
        mask = mask.to(dtype)
    if spec.const("layout") == "bshd":
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    causal, scale = bool(spec.const("causal")), float(spec.const("scale"))
    gqa = k.shape[1] != q.shape[1]
    if dtype is None:
        out = torch.nn.functional.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, is_causal=causal, scale=scale, enable_gqa=gqa
        )
    else:
        if gqa:
            group = q.shape[1] // k.shape[1]
            k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        if mask is not None:
            mask = mask.expand(q.shape[0], q.shape[1], q.shape[2], k.shape[2])
        parts = []
        for i in range(q.shape[0]):
            one = slice(i, i + 1)
            part_mask = None if mask is None else mask[one]
            parts.append(torch.nn.functional.scaled_dot_product_attention(
                q[one], k[one], v[one], attn_mask=part_mask, is_causal=causal, scale=scale
            ))  # fmt: skip
        out = torch.cat(parts)
    if spec.const("layout") == "bshd":
        out = out.transpose(1, 2)
    return out.contiguous()


# =================================================================================================
# The op family
# =================================================================================================

_SUPPORTED = ("float16", "bfloat16", "float32")


class Attention(OpFamily):
    name = "attention"
    summary = "scaled dot-product attention forward (FlashAttention; causal, masks, GQA/MQA, decode)"
    shape_help = (
        "q's sizes as BxHxSxD whatever the layout, e.g. 8x32x2048x128 (batch, heads, query length, head "
        "dim); constants: layout=bhsd|bshd, causal=true (torch's top-left is_causal), kv_heads (default H), "
        "kv_len (default S), scale (default 1/sqrt(D)), mask=none|additive|boolean (a (B, 1, S, kv_len) "
        "mask), memory=bhsd|bshd (q/k/v's memory order, default the layout)"
    )
    distributions = ("normal", "peaked")
    # No nonfinite data: an infinity in q or k makes scores infinite of both signs, which the
    # float64 math reference and an online (flash) softmax resolve differently; neither is the
    # one right answer to hold kernels to.
    stress_distributions = FINITE_STRESS_DISTRIBUTIONS
    variants = (
        Variant("flash", "one program per (query block, head, batch): the FlashAttention-2 forward",
                _flash_space, _flash_build),
        Variant("persistent", "a fixed grid of programs striding over the (query block, head) tiles",
                _persistent_space, _persistent_build),
        Variant("split_kv", "flash-decoding: key ranges in separate programs, then a merge kernel",
                _split_space, _split_build),
        Variant("tma", "the flash forward with k and v blocks loaded through tensor descriptors (TMA)",
                _tma_space, _tma_build),
    )  # fmt: skip

    # ---- specs -----------------------------------------------------------------------------------
    def small_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        """BxHxSxD shrunk for the interpreter: one sequence of at most 16 positions, heads kept
        (so that a --kv-heads still divides them)."""
        if len(shape) != 4:
            return shape
        _, h, s, d = shape
        return (1, h, min(s, 16), d)

    def spec(
        self,
        shape: tuple[int, ...],
        dtype: str,
        layout: str = "bhsd",
        causal: bool = False,
        kv_heads: int | None = None,
        kv_len: int | None = None,
        scale: float | None = None,
        mask: str = "none",
        memory: str | None = None,
        **constants: Any,
    ) -> OpSpec:
        if constants:
            raise UnsupportedWorkload(f"attention: unknown constants {sorted(constants)}")
        shape = tuple(shape)
        if len(shape) != 4:
            raise UnsupportedWorkload(f"attention: --shape is BxHxSxD (4 sizes), not {'x'.join(map(str, shape))}")
        b, h, s, d = (_positive_int(n, v) for n, v in zip(("B", "H", "S", "D"), shape, strict=True))
        layout = _choice("layout", layout, LAYOUTS)
        memory = _choice("memory", layout if memory is None else memory, LAYOUTS)
        mask = _choice("mask", mask, MASKS)
        dims = _Dims(b, h, _positive_int("kv_heads", h if kv_heads is None else kv_heads), s,
                     _positive_int("kv_len", s if kv_len is None else kv_len), d)
        name = dtype_name(dtype)
        order = (0, 1, 2, 3) if memory == layout else (0, 2, 1, 3)
        tensors = []
        for heads, seq in ((dims.heads, dims.q_len), (dims.kv_heads, dims.kv_len), (dims.kv_heads, dims.kv_len)):
            t_shape = _logical(layout, b, heads, seq, d)
            tensors.append(_canonical(t_shape, _strides_in_order(t_shape, order), name))
        if mask != "none":
            tensors.append(TensorSpec((b, 1, s, dims.kv_len), "bool" if mask == "boolean" else name))
        constants = {"layout": layout, "causal": _flag("causal", causal), "scale": _scale(scale, d)}
        spec = OpSpec(self.name, tuple(tensors), constants)
        self.check_supported(spec)
        return spec

    def spec_for(self, *inputs: torch.Tensor, **constants: Any) -> OpSpec:
        if len(inputs) not in (3, 4) or not all(isinstance(t, torch.Tensor) for t in inputs):
            raise UnsupportedWorkload(f"attention takes (q, k, v) or (q, k, v, mask), not {len(inputs)} inputs")
        layout = _choice("layout", constants.pop("layout", "bhsd"), LAYOUTS)
        causal = _flag("causal", constants.pop("causal", False))
        scale = constants.pop("scale", None)
        if constants:
            raise UnsupportedWorkload(f"attention: unknown constants {sorted(constants)}")
        q = inputs[0]
        if q.dim() != 4:
            raise UnsupportedWorkload(f"attention: q must be 4-D, not {q.dim()}-D")
        try:
            tensors = [_canonical(tuple(t.shape), tuple(t.stride()), dtype_name(t.dtype)) for t in inputs[:3]]
            if len(inputs) == 4:
                tensors.append(self._mask_spec(inputs[3]))
        except ValueError as err:  # a dtype kernelsmith does not know at all
            raise UnsupportedWorkload(f"attention: {err}") from None
        constants = {"layout": layout, "causal": causal, "scale": _scale(scale, q.shape[-1])}
        spec = OpSpec(self.name, tuple(tensors), constants)
        self.check_supported(spec)
        return spec

    @staticmethod
    def _mask_spec(mask: torch.Tensor) -> TensorSpec:
        """The mask's spec, with dims broadcast by expand (stride 0) recorded as size 1."""
        shape = tuple(1 if s == 0 else n for n, s in zip(mask.shape, mask.stride(), strict=True))
        return _canonical(shape, tuple(mask.stride()), dtype_name(mask.dtype))

    def check_supported(self, spec: OpSpec) -> None:
        if len(spec.inputs) not in (3, 4):
            raise UnsupportedWorkload(f"attention takes (q, k, v) or (q, k, v, mask), not {len(spec.inputs)} tensors")
        if set(spec.constants) != {"layout", "causal", "scale"}:
            raise UnsupportedWorkload(f"attention: constants must be layout, causal and scale, not "
                                      f"{sorted(spec.constants)}")
        _choice("layout", spec.const("layout"), LAYOUTS)
        _flag("causal", spec.const("causal"))
        scale = spec.const("scale")
        if isinstance(scale, bool) or not isinstance(scale, int | float) or not math.isfinite(scale):
            raise UnsupportedWorkload(f"attention: scale must be a finite number, not {scale!r}")
        q, k, v = spec.inputs[:3]
        if any(len(t.shape) != 4 for t in (q, k, v)):
            raise UnsupportedWorkload("attention: q, k and v must be 4-D")
        if q.dtype not in _SUPPORTED or k.dtype != q.dtype or v.dtype != q.dtype:
            raise UnsupportedWorkload(f"attention: q, k and v must share one of the dtypes {', '.join(_SUPPORTED)}, "
                                      f"not {q.dtype}, {k.dtype}, {v.dtype}")
        d = _dims(spec)
        if min(d.batch, d.heads, d.kv_heads, d.q_len, d.kv_len, d.head_dim) <= 0:
            raise UnsupportedWorkload("attention: empty inputs are not supported")
        if k.shape != v.shape or k.shape != _logical(spec.const("layout"), d.batch, d.kv_heads, d.kv_len,
                                                      d.head_dim):
            raise UnsupportedWorkload(f"attention: k {k} and v {v} do not match q {q} (same batch and head "
                                      f"dimension; v shaped like k)")
        if d.heads % d.kv_heads:
            raise UnsupportedWorkload(f"attention: k and v's {d.kv_heads} heads do not divide q's {d.heads}")
        if d.head_dim % 16 or d.head_dim > MAX_HEAD_DIM:
            raise UnsupportedWorkload(f"attention: the head dimension must be a multiple of 16 up to "
                                      f"{MAX_HEAD_DIM}, not {d.head_dim}")
        for name, t in (("q", q), ("k", k), ("v", v)):
            if t.strides[3] != 1:
                raise UnsupportedWorkload(f"attention: {name} must have unit stride along the head dimension")
            if any(n > 1 and s == 0 for n, s in zip(t.shape, t.strides, strict=True)):
                raise UnsupportedWorkload(f"attention: {name} has a broadcast (stride 0) dimension")
        if len(spec.inputs) == 4:
            self._check_mask(spec, d)
        if d.batch * d.heads * triton.cdiv(d.q_len, 16) > MAX_PROGRAMS:
            raise UnsupportedWorkload("attention: too many (query block, head, batch) tiles for one grid")

    @staticmethod
    def _check_mask(spec: OpSpec, d: _Dims) -> None:
        mask = spec.inputs[3]
        if spec.const("causal"):
            raise UnsupportedWorkload("attention: causal with an explicit mask is not supported (torch's CUDA "
                                      "backends refuse it too): fold the causal part into the mask")
        if mask.dtype not in ("bool", spec.inputs[0].dtype):
            raise UnsupportedWorkload(f"attention: the mask must be boolean or in q's dtype {spec.inputs[0].dtype}, "
                                      f"not {mask.dtype}")
        full = (d.batch, d.heads, d.q_len, d.kv_len)
        if not 2 <= len(mask.shape) <= 4 or any(
            n not in (1, f) for n, f in zip(mask.shape, full[4 - len(mask.shape):], strict=True)
        ):
            raise UnsupportedWorkload(f"attention: the mask's shape {mask.shape} does not broadcast to "
                                      f"(B, H, Sq, Sk) = {full}")
        if any(n > 1 and s == 0 for n, s in zip(mask.shape, mask.strides, strict=True)):
            raise UnsupportedWorkload("attention: a broadcast mask dimension must have size 1 in the spec")

    def output_specs(self, spec: OpSpec) -> tuple[TensorSpec, ...]:
        q = spec.inputs[0]
        return (TensorSpec(q.shape, q.dtype),)

    def bucket(self, spec: OpSpec) -> OpSpec:
        """B, Sq and Sk rounded up to powers of two; heads, head dim, layout, memory orders, mask
        kind and constants kept.

        Every config is validated on other lengths (see validation_specs) and spaces do not
        depend on B or Sk (split_kv's on Sq only through "at most 128", which a call at or below
        its bucket meets whenever the bucket does), so the configs tuned for the bucket are
        correct for every call in it: a decode step against a cache of 3000 tokens reuses the
        decision for 4096 instead of tuning anew at every length.
        """
        d = _dims(spec)
        return _resized(spec, next_power_of_two(d.batch), next_power_of_two(d.q_len), next_power_of_two(d.kv_len))

    def validation_specs(self, spec: OpSpec) -> list[OpSpec]:
        """The target, then tails with the same heads, head dim, layout, memory orders and mask
        kind: one query against one key, and odd lengths past the target's (67 from 64 on), which
        no block size divides, on up to 2 sequences.

        Spaces do not depend on B or Sk, and split_kv's only admits shorter queries, so the
        target's configs apply to every tail.
        """
        d = _dims(spec)

        def odd(n: int) -> int:
            return 67 if n >= 64 else 2 * (n // 2) + 3

        tails = [(1, 1, 1), (min(d.batch, 2), odd(d.q_len), odd(d.kv_len))]
        specs = [spec]
        for batch, q_len, kv_len in dict.fromkeys(tails):
            if (batch, q_len, kv_len) != (d.batch, d.q_len, d.kv_len):
                specs.append(_resized(spec, batch, q_len, kv_len))
        return specs

    # ---- math ------------------------------------------------------------------------------------
    def reference(self, spec: OpSpec, inputs: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        """``F.scaled_dot_product_attention`` in the inputs' dtype (whichever backend torch picks;
        the math backend on the CPU), with ``enable_gqa`` for fewer key/value heads; the result is
        made contiguous in the spec's layout."""
        return (_sdpa(spec, inputs, None),)

    def reference_fp64(self, spec: OpSpec, inputs: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        return (_sdpa(spec, inputs, torch.float64),)

    def make_inputs(
        self,
        spec: OpSpec,
        seed: int,
        distribution: str = "normal",
        device: str | torch.device = "cuda",
    ) -> tuple[torch.Tensor, ...]:
        """q, k and v from ``distribution``, with the spec's strides; the mask if the spec has one.

        - normal: standard normal q, k and v: scores of standard deviation about 1;
        - peaked: q and k 2.5 times larger: scores of standard deviation about 6, nearly one-hot
          rows whose max moves from block to block (the online rescaling at work).

        A boolean mask keeps about 4 keys in 5; an additive one is standard normal with about 1
        key in 5 at ``-inf``. Either way every query row keeps at least one key (the one at index
        ``i mod Sk``), so that no row is fully masked: torch's fused GPU backends differ on such
        rows (the kernels write 0 there, as torch's math backend does; the tests check it).
        """
        if distribution not in self.distributions:
            raise ValueError(f"attention: unknown distribution {distribution!r} "
                             f"(known: {', '.join(self.distributions)})")
        g = generator(seed, device)
        dtype = spec.inputs[0].torch_dtype
        spread = 2.5 if distribution == "peaked" else 1.0
        tensors = []
        for t, factor in zip(spec.inputs[:3], (spread, spread, 1.0), strict=True):
            x = torch.randn(t.shape, generator=g, device=device, dtype=torch.float32) * factor
            tensors.append(torch.empty_strided(t.shape, t.strides, dtype=dtype, device=device).copy_(x))
        if len(spec.inputs) == 4:
            tensors.append(self._make_mask(spec.inputs[3], g, device))
        return tuple(tensors)

    @staticmethod
    def _make_mask(t: TensorSpec, g: torch.Generator, device: str | torch.device) -> torch.Tensor:
        shape = t.shape
        q_len, kv_len = shape[-2], shape[-1]
        kept = torch.zeros((q_len, kv_len), dtype=torch.bool, device=device)
        kept[torch.arange(q_len, device=device), torch.arange(q_len, device=device) % kv_len] = True
        if t.dtype == "bool":
            x = (torch.rand(shape, generator=g, device=device) < 0.8) | kept
        else:
            x = torch.randn(shape, generator=g, device=device)
            dropped = torch.rand(shape, generator=g, device=device) < 0.2
            x = torch.where(dropped & ~kept, float("-inf"), x)
        return torch.empty_strided(shape, t.strides, dtype=t.torch_dtype, device=device).copy_(x)

    def flops(self, spec: OpSpec) -> int:
        # Two products of 2 flops a multiply-add, over the attended (query, key) pairs.
        d = _dims(spec)
        if spec.const("causal"):  # query i attends keys 0..min(i, Sk - 1)
            seen = min(d.q_len, d.kv_len)
            pairs = seen * (seen + 1) // 2 + (d.q_len - seen) * d.kv_len
        else:
            pairs = d.q_len * d.kv_len
        return 4 * d.batch * d.heads * d.head_dim * pairs


OP = Attention()

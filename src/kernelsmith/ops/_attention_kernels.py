"""The kernels of the attention family (:mod:`kernelsmith.ops.attention`, whose docstring
explains the math and the variants): the flash forward over key blocks, its persistent and
split-key forms, and the split-key combine. Its launchers are in
:mod:`kernelsmith.ops._attention_launch`.
"""

from __future__ import annotations

import triton
import triton.language as tl

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
    qk_scale = tl.cast(qk_scale, tl.float32)  # float32 math even where Inductor passes a Python float as fp64
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

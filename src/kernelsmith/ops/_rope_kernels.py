"""The kernels of the RoPE family (:mod:`kernelsmith.ops.rope`, whose docstring explains the
math and the variants). Their launchers are in :mod:`kernelsmith.ops._rope_launch`.
"""

from __future__ import annotations

import triton
import triton.language as tl

# =================================================================================================
# Kernels
#
# Common conventions. A "row" is the D channels of one head at one position; the kernels address
# a row by the int64 offset of its first element, with channels at unit stride. The rotated part
# of a row is R = 2 * R_HALF channels; a row holds R_HALF rotation pairs (x1, x2), padded to
# BLOCK_HALF (a power of two) with masked lanes. The D - R = PASS channels after them are copied
# unchanged. Arithmetic is float32 whatever the storage dtype; the store rounds once.
# =================================================================================================


@triton.jit
def _load_pairs(
    ptr,
    rows,  # int64 [ROWS]: offset of each row's first element
    row_mask,  # [ROWS]: which rows exist
    ROWS: tl.constexpr,
    R_HALF: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
    INTERLEAVED: tl.constexpr,
    SPLIT_PAIRS: tl.constexpr,
):
    """The two members of every rotation pair of ROWS rows, as two [ROWS, BLOCK_HALF] float32
    blocks: (x[j], x[j + R/2]) in the half style, (x[2i], x[2i + 1]) in the interleaved one."""
    if SPLIT_PAIRS:  # interleaved only: one contiguous load, pairs split in registers
        j = tl.arange(0, 2 * BLOCK_HALF)
        mask = row_mask[:, None] & (j < 2 * R_HALF)[None, :]
        x = tl.load(ptr + rows[:, None] + j[None, :], mask=mask, other=0.0).to(tl.float32)
        first, second = tl.split(tl.reshape(x, [ROWS, BLOCK_HALF, 2]))
    else:
        i = tl.arange(0, BLOCK_HALF)
        mask = row_mask[:, None] & (i < R_HALF)[None, :]
        if INTERLEAVED:
            offsets = rows[:, None] + 2 * i[None, :]
            partner = 1
        else:
            offsets = rows[:, None] + i[None, :]
            partner = R_HALF
        first = tl.load(ptr + offsets, mask=mask, other=0.0).to(tl.float32)
        second = tl.load(ptr + offsets + partner, mask=mask, other=0.0).to(tl.float32)
    return first, second


@triton.jit
def _store_pairs(
    ptr,
    rows,
    row_mask,
    first,
    second,
    ROWS: tl.constexpr,
    R_HALF: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
    INTERLEAVED: tl.constexpr,
    SPLIT_PAIRS: tl.constexpr,
):
    """Store the pairs where _load_pairs found them, rounded to the output's dtype."""
    if SPLIT_PAIRS:
        j = tl.arange(0, 2 * BLOCK_HALF)
        mask = row_mask[:, None] & (j < 2 * R_HALF)[None, :]
        x = tl.reshape(tl.join(first, second), [ROWS, 2 * BLOCK_HALF])
        tl.store(ptr + rows[:, None] + j[None, :], x.to(ptr.dtype.element_ty), mask=mask)
    else:
        i = tl.arange(0, BLOCK_HALF)
        mask = row_mask[:, None] & (i < R_HALF)[None, :]
        if INTERLEAVED:
            offsets = rows[:, None] + 2 * i[None, :]
            partner = 1
        else:
            offsets = rows[:, None] + i[None, :]
            partner = R_HALF
        tl.store(ptr + offsets, first.to(ptr.dtype.element_ty), mask=mask)
        tl.store(ptr + offsets + partner, second.to(ptr.dtype.element_ty), mask=mask)


@triton.jit
def _rotate_rows(
    x_ptr,
    o_ptr,
    x_rows,  # int64 [ROWS]: first element of each input row
    o_rows,  # int64 [ROWS]: first element of each output row
    row_mask,
    cos1,  # float32, broadcastable to [ROWS, BLOCK_HALF]: the cache entries of each pair
    cos2,
    sin1,
    sin2,
    ROWS: tl.constexpr,
    R_HALF: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
    PASS: tl.constexpr,  # D - R channels copied unchanged (0: every channel rotates)
    BLOCK_PASS: tl.constexpr,
    INTERLEAVED: tl.constexpr,
    SPLIT_PAIRS: tl.constexpr,
):
    """Rotate ROWS rows: out = x * cos + rotate(x) * sin, channel by channel, in float32."""
    x1, x2 = _load_pairs(x_ptr, x_rows, row_mask, ROWS, R_HALF, BLOCK_HALF, INTERLEAVED, SPLIT_PAIRS)
    # rotate(x) is -x2 at x1's place and x1 at x2's place (rotate_half and rotate_every_two alike).
    o1 = x1 * cos1 - x2 * sin1
    o2 = x2 * cos2 + x1 * sin2
    _store_pairs(o_ptr, o_rows, row_mask, o1, o2, ROWS, R_HALF, BLOCK_HALF, INTERLEAVED, SPLIT_PAIRS)
    if PASS > 0:  # partial rotary: the channels past R are copied bit for bit
        p = 2 * R_HALF + tl.arange(0, BLOCK_PASS)
        mask = row_mask[:, None] & (p < 2 * R_HALF + PASS)[None, :]
        v = tl.load(x_ptr + x_rows[:, None] + p[None, :], mask=mask)
        tl.store(o_ptr + o_rows[:, None] + p[None, :], v, mask=mask)


@triton.jit
def _rope_per_head_kernel(
    q_ptr, k_ptr, cos_ptr, sin_ptr, qo_ptr, ko_ptr,
    S, HQ, HK,
    q_sb, q_sh, q_ss, k_sb, k_sh, k_ss,  # input strides (batch, head, position)
    qo_sb, qo_sh, qo_ss, ko_sb, ko_sh, ko_ss,  # output strides
    c_sb, c_ss,  # cos/sin strides (batch: 0 when shared by the batch, position)
    Q_BLOCKS,  # cdiv(HQ, BLOCK_H): head blocks of q; those of k follow
    HEAD_BLOCKS,  # Q_BLOCKS + cdiv(HK, BLOCK_H)
    BLOCK_H: tl.constexpr,
    R_HALF: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
    PASS: tl.constexpr,
    BLOCK_PASS: tl.constexpr,
    INTERLEAVED: tl.constexpr,
    SPLIT_PAIRS: tl.constexpr,
):  # fmt: skip
    """One program rotates BLOCK_H heads of q (or of k) at one (batch, position)."""
    pid = tl.program_id(0).to(tl.int64)  # 64-bit: every offset below is then 64-bit
    token = pid // HEAD_BLOCKS
    block = pid % HEAD_BLOCKS
    b = token // S
    s = token % S

    # The cos/sin row of this position, as [1, BLOCK_HALF] blocks broadcast over the heads.
    one = tl.arange(0, 1)
    c_rows = b * c_sb + s * c_ss + one
    cos1, cos2 = _load_pairs(cos_ptr, c_rows, one < 1, 1, R_HALF, BLOCK_HALF, INTERLEAVED, SPLIT_PAIRS)
    sin1, sin2 = _load_pairs(sin_ptr, c_rows, one < 1, 1, R_HALF, BLOCK_HALF, INTERLEAVED, SPLIT_PAIRS)

    heads = tl.arange(0, BLOCK_H)
    if block < Q_BLOCKS:
        h = block * BLOCK_H + heads
        _rotate_rows(q_ptr, qo_ptr, b * q_sb + s * q_ss + h * q_sh, b * qo_sb + s * qo_ss + h * qo_sh, h < HQ,
                     cos1, cos2, sin1, sin2, BLOCK_H, R_HALF, BLOCK_HALF, PASS, BLOCK_PASS, INTERLEAVED,
                     SPLIT_PAIRS)
    else:
        h = (block - Q_BLOCKS) * BLOCK_H + heads
        _rotate_rows(k_ptr, ko_ptr, b * k_sb + s * k_ss + h * k_sh, b * ko_sb + s * ko_ss + h * ko_sh, h < HK,
                     cos1, cos2, sin1, sin2, BLOCK_H, R_HALF, BLOCK_HALF, PASS, BLOCK_PASS, INTERLEAVED,
                     SPLIT_PAIRS)


@triton.jit
def _rope_per_token_kernel(
    q_ptr, k_ptr, cos_ptr, sin_ptr, qo_ptr, ko_ptr,
    S, HQ, HK,
    q_sb, q_sh, q_ss, k_sb, k_sh, k_ss,
    qo_sb, qo_sh, qo_ss, ko_sb, ko_sh, ko_ss,
    c_sb, c_ss,
    Q_BLOCKS,
    K_BLOCKS,
    BLOCK_H: tl.constexpr,
    R_HALF: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
    PASS: tl.constexpr,
    BLOCK_PASS: tl.constexpr,
    INTERLEAVED: tl.constexpr,
    SPLIT_PAIRS: tl.constexpr,
    NUM_STAGES: tl.constexpr,  # software-pipelining depth of the head loops (1: none)
):  # fmt: skip
    """One program rotates every head of q and k at one (batch, position), BLOCK_H at a time,
    with the cos/sin row loaded once."""
    token = tl.program_id(0).to(tl.int64)
    b = token // S
    s = token % S

    one = tl.arange(0, 1)
    c_rows = b * c_sb + s * c_ss + one
    cos1, cos2 = _load_pairs(cos_ptr, c_rows, one < 1, 1, R_HALF, BLOCK_HALF, INTERLEAVED, SPLIT_PAIRS)
    sin1, sin2 = _load_pairs(sin_ptr, c_rows, one < 1, 1, R_HALF, BLOCK_HALF, INTERLEAVED, SPLIT_PAIRS)

    heads = tl.arange(0, BLOCK_H)
    q_token = b * q_sb + s * q_ss
    qo_token = b * qo_sb + s * qo_ss
    # The depth is given on tl.range itself (as in softmax: Triton 3.6 leaves a loop without a
    # matrix product unpipelined when num_stages is only a launch option). In the interpreter the
    # loop variable is a Python int; `block * BLOCK_H + heads` is a tensor either way.
    for block in tl.range(0, Q_BLOCKS, num_stages=NUM_STAGES):
        h = (block * BLOCK_H + heads).to(tl.int64)
        _rotate_rows(q_ptr, qo_ptr, q_token + h * q_sh, qo_token + h * qo_sh, h < HQ,
                     cos1, cos2, sin1, sin2, BLOCK_H, R_HALF, BLOCK_HALF, PASS, BLOCK_PASS, INTERLEAVED,
                     SPLIT_PAIRS)
    k_token = b * k_sb + s * k_ss
    ko_token = b * ko_sb + s * ko_ss
    for block in tl.range(0, K_BLOCKS, num_stages=NUM_STAGES):
        h = (block * BLOCK_H + heads).to(tl.int64)
        _rotate_rows(k_ptr, ko_ptr, k_token + h * k_sh, ko_token + h * ko_sh, h < HK,
                     cos1, cos2, sin1, sin2, BLOCK_H, R_HALF, BLOCK_HALF, PASS, BLOCK_PASS, INTERLEAVED,
                     SPLIT_PAIRS)


@triton.jit
def _rope_blocked_seq_kernel(
    q_ptr, k_ptr, cos_ptr, sin_ptr, qo_ptr, ko_ptr,
    S, HQ, HK,
    q_sb, q_sh, q_ss, k_sb, k_sh, k_ss,
    qo_sb, qo_sh, qo_ss, ko_sb, ko_sh, ko_ss,
    c_sb, c_ss,
    S_BLOCKS,  # cdiv(S, BLOCK_S)
    BLOCK_S: tl.constexpr,
    R_HALF: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
    PASS: tl.constexpr,
    BLOCK_PASS: tl.constexpr,
    INTERLEAVED: tl.constexpr,
    SPLIT_PAIRS: tl.constexpr,
):  # fmt: skip
    """One program rotates BLOCK_S positions of one head (of q, or of k) of one sequence."""
    pid = tl.program_id(0).to(tl.int64)
    s_block = pid % S_BLOCKS  # fastest: consecutive programs walk one head along the sequence
    rest = pid // S_BLOCKS
    head = rest % (HQ + HK)  # q heads first, then k heads
    b = rest // (HQ + HK)

    pos = s_block * BLOCK_S + tl.arange(0, BLOCK_S)
    pos_mask = pos < S  # the last block may run past the end of the sequence
    c_rows = b * c_sb + pos * c_ss
    cos1, cos2 = _load_pairs(cos_ptr, c_rows, pos_mask, BLOCK_S, R_HALF, BLOCK_HALF, INTERLEAVED, SPLIT_PAIRS)
    sin1, sin2 = _load_pairs(sin_ptr, c_rows, pos_mask, BLOCK_S, R_HALF, BLOCK_HALF, INTERLEAVED, SPLIT_PAIRS)

    if head < HQ:
        _rotate_rows(q_ptr, qo_ptr, b * q_sb + head * q_sh + pos * q_ss, b * qo_sb + head * qo_sh + pos * qo_ss,
                     pos_mask, cos1, cos2, sin1, sin2, BLOCK_S, R_HALF, BLOCK_HALF, PASS, BLOCK_PASS, INTERLEAVED,
                     SPLIT_PAIRS)
    else:
        kh = head - HQ
        _rotate_rows(k_ptr, ko_ptr, b * k_sb + kh * k_sh + pos * k_ss, b * ko_sb + kh * ko_sh + pos * ko_ss,
                     pos_mask, cos1, cos2, sin1, sin2, BLOCK_S, R_HALF, BLOCK_HALF, PASS, BLOCK_PASS, INTERLEAVED,
                     SPLIT_PAIRS)

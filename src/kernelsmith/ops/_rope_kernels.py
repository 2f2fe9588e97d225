"""The kernel of the RoPE family (:mod:`kernelsmith.ops.rope`, whose docstring explains the
math and the variants) and its jitted helpers. Its launchers are in
:mod:`kernelsmith.ops._rope_launch`.

Read from the bottom up: ``_rope_kernel`` maps a program to its rows of q or k under the
variant's schedule; ``_rotate_rows`` rotates a block of rows given the cos/sin entries of their
pairs; ``_load_pairs`` and ``_store_pairs`` move the two members of every pair between memory and
registers, at the offsets ``_pair_offsets`` gives.
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
def _pair_offsets(
    rows,  # int64 [ROWS]: offset of each row's first element
    row_mask,  # [ROWS]: which rows exist
    R_HALF: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
    INTERLEAVED: tl.constexpr,
    SPLIT_PAIRS: tl.constexpr,
):
    """Where the rotation pairs of ROWS rows are, and the mask of their real lanes. With
    SPLIT_PAIRS, the offsets of the whole rotated part, [ROWS, 2 * BLOCK_HALF], the pairs side by
    side; else those of every pair's first member, [ROWS, BLOCK_HALF], whose partner is the next
    channel (interleaved style) or R_HALF channels on (half style)."""
    if SPLIT_PAIRS:  # interleaved only: one contiguous block, pairs split in registers
        j = tl.arange(0, 2 * BLOCK_HALF)
        mask = row_mask[:, None] & (j < 2 * R_HALF)[None, :]
        offsets = rows[:, None] + j[None, :]
    else:
        i = tl.arange(0, BLOCK_HALF)
        mask = row_mask[:, None] & (i < R_HALF)[None, :]
        offsets = rows[:, None] + (2 * i[None, :] if INTERLEAVED else i[None, :])
    return offsets, mask


@triton.jit
def _load_pairs(
    ptr,
    rows,
    row_mask,
    ROWS: tl.constexpr,
    R_HALF: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
    INTERLEAVED: tl.constexpr,
    SPLIT_PAIRS: tl.constexpr,
):
    """The two members of every rotation pair of ROWS rows, as two [ROWS, BLOCK_HALF] float32
    blocks: (x[j], x[j + R/2]) in the half style, (x[2i], x[2i + 1]) in the interleaved one."""
    offsets, mask = _pair_offsets(rows, row_mask, R_HALF, BLOCK_HALF, INTERLEAVED, SPLIT_PAIRS)
    if SPLIT_PAIRS:
        x = tl.load(ptr + offsets, mask=mask, other=0.0).to(tl.float32)
        first, second = tl.split(tl.reshape(x, [ROWS, BLOCK_HALF, 2]))
    else:
        partner = 1 if INTERLEAVED else R_HALF
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
    offsets, mask = _pair_offsets(rows, row_mask, R_HALF, BLOCK_HALF, INTERLEAVED, SPLIT_PAIRS)
    if SPLIT_PAIRS:
        x = tl.reshape(tl.join(first, second), [ROWS, 2 * BLOCK_HALF])
        tl.store(ptr + offsets, x.to(ptr.dtype.element_ty), mask=mask)
    else:
        partner = 1 if INTERLEAVED else R_HALF
        tl.store(ptr + offsets, first.to(ptr.dtype.element_ty), mask=mask)
        tl.store(ptr + offsets + partner, second.to(ptr.dtype.element_ty), mask=mask)


@triton.jit
def _rotate_rows(
    x_ptr,
    o_ptr,
    x_rows,  # int64 [ROWS]: first element of each input row
    o_rows,  # int64 [ROWS]: first element of each output row
    row_mask,
    cache,  # (cos1, cos2, sin1, sin2): the cos/sin entries of each pair, broadcastable to [ROWS, BLOCK_HALF]
    ROWS: tl.constexpr,
    R_HALF: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
    PASS: tl.constexpr,  # D - R channels copied unchanged (0: every channel rotates)
    BLOCK_PASS: tl.constexpr,
    INTERLEAVED: tl.constexpr,
    SPLIT_PAIRS: tl.constexpr,
):
    """Rotate ROWS rows: out = x * cos + rotate(x) * sin, channel by channel, in float32."""
    cos1, cos2, sin1, sin2 = cache
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
def _rope_kernel(
    q_ptr, k_ptr, cos_ptr, sin_ptr, qo_ptr, ko_ptr,
    S, HQ, HK,
    q_sb, q_sh, q_ss, k_sb, k_sh, k_ss,  # input strides (batch, head, position)
    qo_sb, qo_sh, qo_ss, ko_sb, ko_sh, ko_ss,  # output strides
    c_sb, c_ss,  # cos/sin strides (batch: 0 when shared by the batch, position)
    # The blocks the schedule walks: cdiv(HQ, BLOCK) and cdiv(HK, BLOCK) head blocks of q and k
    # (per_head, per_token), cdiv(S, BLOCK) position blocks (blocked_seq); 1 for those it does
    # not walk (an argument equal to 1 is specialized away: it costs nothing).
    Q_BLOCKS, K_BLOCKS, S_BLOCKS,
    SCHEDULE: tl.constexpr,  # the variant: "per_head", "per_token" or "blocked_seq"
    BLOCK: tl.constexpr,  # heads a block (the config's BLOCK_H); in blocked_seq, positions (BLOCK_S)
    R_HALF: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
    PASS: tl.constexpr,
    BLOCK_PASS: tl.constexpr,
    INTERLEAVED: tl.constexpr,
    SPLIT_PAIRS: tl.constexpr,
    NUM_STAGES: tl.constexpr,  # per_token: software-pipelining depth of the head loops (1: none)
):  # fmt: skip
    """Rotate the rows of q and k that this program owns under SCHEDULE (the rope module's
    docstring describes the three): a block of heads at one (batch, position) for per_head,
    every head at one (batch, position) for per_token, a block of positions of one head for
    blocked_seq. The schedule is a constexpr: each variant compiles only its own branch."""
    pid = tl.program_id(0).to(tl.int64)  # 64-bit: every offset below is then 64-bit
    if SCHEDULE == "blocked_seq":
        # pid -> (position block, head, batch), position blocks fastest: consecutive programs
        # walk one head along the sequence. The cos/sin tile has a row per position.
        s_block = pid % S_BLOCKS
        rest = pid // S_BLOCKS
        head = rest % (HQ + HK)  # q heads first, then k heads
        b = rest // (HQ + HK)
        pos = s_block * BLOCK + tl.arange(0, BLOCK)
        pos_mask = pos < S  # the last block may run past the end of the sequence
        c_rows = b * c_sb + pos * c_ss
        cos1, cos2 = _load_pairs(cos_ptr, c_rows, pos_mask, BLOCK, R_HALF, BLOCK_HALF, INTERLEAVED, SPLIT_PAIRS)
        sin1, sin2 = _load_pairs(sin_ptr, c_rows, pos_mask, BLOCK, R_HALF, BLOCK_HALF, INTERLEAVED, SPLIT_PAIRS)
        cache = (cos1, cos2, sin1, sin2)
        if head < HQ:
            _rotate_rows(q_ptr, qo_ptr, b * q_sb + head * q_sh + pos * q_ss, b * qo_sb + head * qo_sh + pos * qo_ss,
                         pos_mask, cache, BLOCK, R_HALF, BLOCK_HALF, PASS, BLOCK_PASS, INTERLEAVED, SPLIT_PAIRS)
        else:
            kh = head - HQ
            _rotate_rows(k_ptr, ko_ptr, b * k_sb + kh * k_sh + pos * k_ss, b * ko_sb + kh * ko_sh + pos * ko_ss,
                         pos_mask, cache, BLOCK, R_HALF, BLOCK_HALF, PASS, BLOCK_PASS, INTERLEAVED, SPLIT_PAIRS)
    else:
        # per_head: pid -> (token, head block), head blocks fastest (q's, then k's), so that the
        # programs sharing a cos/sin row run next to each other; per_token: pid -> token. Either
        # way the cos/sin row of the token is one [1, BLOCK_HALF] block broadcast over the heads.
        token = pid
        if SCHEDULE == "per_head":
            token = pid // (Q_BLOCKS + K_BLOCKS)
        b = token // S
        s = token % S
        one = tl.arange(0, 1)
        c_rows = b * c_sb + s * c_ss + one
        cos1, cos2 = _load_pairs(cos_ptr, c_rows, one < 1, 1, R_HALF, BLOCK_HALF, INTERLEAVED, SPLIT_PAIRS)
        sin1, sin2 = _load_pairs(sin_ptr, c_rows, one < 1, 1, R_HALF, BLOCK_HALF, INTERLEAVED, SPLIT_PAIRS)
        cache = (cos1, cos2, sin1, sin2)
        heads = tl.arange(0, BLOCK)
        q_token, qo_token = b * q_sb + s * q_ss, b * qo_sb + s * qo_ss  # the token's first rows
        if SCHEDULE == "per_head":
            block = pid % (Q_BLOCKS + K_BLOCKS)
            if block < Q_BLOCKS:
                h = block * BLOCK + heads
                _rotate_rows(q_ptr, qo_ptr, q_token + h * q_sh, qo_token + h * qo_sh, h < HQ, cache,
                             BLOCK, R_HALF, BLOCK_HALF, PASS, BLOCK_PASS, INTERLEAVED, SPLIT_PAIRS)
            else:
                h = (block - Q_BLOCKS) * BLOCK + heads
                k_token, ko_token = b * k_sb + s * k_ss, b * ko_sb + s * ko_ss
                _rotate_rows(k_ptr, ko_ptr, k_token + h * k_sh, ko_token + h * ko_sh, h < HK, cache,
                             BLOCK, R_HALF, BLOCK_HALF, PASS, BLOCK_PASS, INTERLEAVED, SPLIT_PAIRS)
        else:
            # The depth is given on tl.range itself (as in softmax: Triton 3.6 leaves a loop
            # without a matrix product unpipelined when num_stages is only a launch option). In
            # the interpreter the loop variable is a Python int; `block * BLOCK + heads` is a
            # tensor either way.
            for block in tl.range(0, Q_BLOCKS, num_stages=NUM_STAGES):
                h = (block * BLOCK + heads).to(tl.int64)
                _rotate_rows(q_ptr, qo_ptr, q_token + h * q_sh, qo_token + h * qo_sh, h < HQ, cache,
                             BLOCK, R_HALF, BLOCK_HALF, PASS, BLOCK_PASS, INTERLEAVED, SPLIT_PAIRS)
            k_token, ko_token = b * k_sb + s * k_ss, b * ko_sb + s * ko_ss
            for block in tl.range(0, K_BLOCKS, num_stages=NUM_STAGES):
                h = (block * BLOCK + heads).to(tl.int64)
                _rotate_rows(k_ptr, ko_ptr, k_token + h * k_sh, ko_token + h * ko_sh, h < HK, cache,
                             BLOCK, R_HALF, BLOCK_HALF, PASS, BLOCK_PASS, INTERLEAVED, SPLIT_PAIRS)

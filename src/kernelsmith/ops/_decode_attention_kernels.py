"""The kernels of the decode attention family (:mod:`kernelsmith.ops.decode_attention`, whose
docstring explains the op, the math and the two variants): the query block of one (sequence,
key/value head), the online softmax over a range of cache positions, the one-pass and split
forward, and the merge of the splits. Their launchers are in
:mod:`kernelsmith.ops._decode_attention_launch`.
"""

from __future__ import annotations

import triton
import triton.language as tl

LOG2E = 1.4426950408889634  # the kernels' softmax is in base 2: scale * log2(e) folds into the scores


@triton.jit
def _group_rows(q_ptr, bh, H, Hk, q_sb, q_sh, q_ss,
                Q_LEN: tl.constexpr, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
                BLOCK_Q: tl.constexpr):  # fmt: skip
    """The query block of program (sequence, key/value head) ``bh``: row r is query head
    ``kvh * GROUP + r // Q_LEN``, token ``r % Q_LEN``. Returns (q [BLOCK_Q, BLOCK_D] in its dtype,
    token index of each row, which rows are real, the query head of each row)."""
    b = bh // Hk
    kvh = bh % Hk
    r = tl.arange(0, BLOCK_Q)
    r_ok = r < GROUP * Q_LEN
    head = kvh * GROUP + r // Q_LEN
    token = r % Q_LEN
    d = tl.arange(0, BLOCK_D)
    d_ok = d < HEAD_DIM
    offsets = b.to(tl.int64) * q_sb + head.to(tl.int64) * q_sh + token.to(tl.int64) * q_ss
    q = tl.load(q_ptr + offsets[:, None] + d[None, :], mask=r_ok[:, None] & d_ok[None, :], other=0.0)
    return q, token, r_ok, head


@triton.jit
def _sequence_length(len_ptr, b, L, Q_LEN: tl.constexpr, HAS_LENGTHS: tl.constexpr, WRITE_KV: tl.constexpr):
    """(the valid length clamped into [0, L], whether lengths[b] was out of range [Q_LEN, L]).

    ``WRITE_KV``: ``len_ptr`` is the first new token's cache position (one for the batch, as
    Hugging Face's ``cache_position[0]``); the cache holds the ``position`` past tokens before it,
    which is the length returned, and the ``Q_LEN`` new rows at ``position .. position + Q_LEN - 1``
    must fit: a position outside [0, L - Q_LEN] is bad."""
    if WRITE_KV:
        position = tl.load(len_ptr).to(tl.int64)
        bad = (position < 0) | (position + Q_LEN > L)
        length = tl.minimum(tl.maximum(position, 0), L)
    else:
        length = tl.load(len_ptr + b).to(tl.int64) if HAS_LENGTHS else tl.cast(L, tl.int64)
        bad = (length < Q_LEN) | (length > L)
        length = tl.minimum(tl.maximum(length, 0), L)
    return length, bad


@triton.jit
def _attend_new_rows(q, token, acc, m_i, l_i, k_ptr, v_ptr, k_base, v_base, k_ss, v_ss, kn_ptr, vn_ptr,
                     kn_base, vn_base, kn_ss, vn_ss, position, bad, qk_scale,
                     Q_LEN: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr):  # fmt: skip
    """The new tokens' own keys and values (not yet in the cache: read from ``k_new``/``v_new``)
    folded into the online softmax state of the query block, causally: new row ``j`` is seen by
    the query rows of token ``j`` and later. Each row is stored into the caches at ``position + j``
    as it goes (``bad``, a position outside the cache: nothing is stored). Returns (acc, m, l).

    Row 0 is seen by every query row, so after it every row's running max is finite and the
    rescaling ``2^(m_old - m_new)`` below never meets ``-inf - -inf``."""
    d = tl.arange(0, BLOCK_D)
    d_ok = d < HEAD_DIM
    write_ok = d < tl.where(bad, 0, HEAD_DIM)
    for j in tl.static_range(Q_LEN):
        k = tl.load(kn_ptr + kn_base + j * kn_ss + d, mask=d_ok, other=0.0)
        v = tl.load(vn_ptr + vn_base + j * vn_ss + d, mask=d_ok, other=0.0)
        s = tl.sum(q.to(tl.float32) * k.to(tl.float32)[None, :], 1) * qk_scale  # [BLOCK_Q]
        s = tl.where(token >= j, s, float("-inf"))  # causal among the new tokens
        m_new = tl.maximum(m_i, s)
        alpha = tl.exp2(m_i - m_new)  # 0 for a row that saw no cached key (m_i = -inf)
        p = tl.exp2(s - m_new)
        l_i = l_i * alpha + p
        pv = p.to(v.dtype).to(tl.float32)  # the value product in the cache's precision, as _attend
        acc = acc * alpha[:, None] + pv[:, None] * v.to(tl.float32)[None, :]
        m_i = m_new
        tl.store(k_ptr + k_base + (position + j) * k_ss + d, k, mask=write_ok)
        tl.store(v_ptr + v_base + (position + j) * v_ss + d, v, mask=write_ok)
    return acc, m_i, l_i


@triton.jit
def _attend(q, token, k_ptr, v_ptr, k_base, v_base, k_ss, v_ss, start, end, length, qk_scale,
            mask_ptr, m_base, m_ss, m_sl,
            Q_LEN: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_Q: tl.constexpr,
            BLOCK_N: tl.constexpr, IEEE: tl.constexpr, UPCAST: tl.constexpr, MASKED: tl.constexpr):  # fmt: skip
    """Online softmax of the query block over cache positions [start, end): (acc [BLOCK_Q,
    BLOCK_D] unnormalized, m running max in log2 units, l sum of 2^(s - m)). Row r sees the
    positions below ``length - Q_LEN + token + 1`` or, ``MASKED``, those its row of the boolean
    mask (at ``mask_ptr + m_base``, token stride ``m_ss``, position stride ``m_sl``) marks."""
    limit = length - Q_LEN + token + 1  # [BLOCK_Q]: keys each row may see (unless MASKED)
    d = tl.arange(0, BLOCK_D)
    d_ok = d < HEAD_DIM
    if UPCAST:
        q = q.to(tl.float32)
    m_i = tl.full([BLOCK_Q], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_Q], dtype=tl.float32)
    acc = tl.zeros([BLOCK_Q, BLOCK_D], dtype=tl.float32)
    for n0 in range(start, end, BLOCK_N):
        n = n0 + tl.arange(0, BLOCK_N)
        n_ok = n < end  # positions at or past the length are never loaded
        tile_ok = n_ok[:, None] & d_ok[None, :]
        k = tl.load(k_ptr + k_base + n[:, None] * k_ss + d[None, :], mask=tile_ok, other=0.0)
        v = tl.load(v_ptr + v_base + n[:, None] * v_ss + d[None, :], mask=tile_ok, other=0.0)
        if UPCAST:
            k = k.to(tl.float32)
        s = tl.dot(q, tl.trans(k), input_precision="ieee") if IEEE else tl.dot(q, tl.trans(k))
        if MASKED:  # the mask alone (past the range it loads False)
            m_offsets = m_base + token.to(tl.int64)[:, None] * m_ss + n.to(tl.int64)[None, :] * m_sl
            visible = tl.load(mask_ptr + m_offsets, mask=n_ok[None, :], other=0) != 0
        else:  # (n_ok too: with WRITE_KV the limit runs past the cached range by the new tokens)
            visible = (n[None, :] < limit[:, None]) & n_ok[None, :]
        s = tl.where(visible, s * qk_scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        shift = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row that has seen no key yet
        alpha = tl.exp2(m_i - shift)
        p = tl.exp2(s - shift[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        pv = p.to(v.dtype)  # the value product in the cache's precision, as FlashAttention does
        if UPCAST:
            pv = pv.to(tl.float32)
            v = v.to(tl.float32)
        if IEEE:
            acc = tl.dot(pv, v, acc * alpha[:, None], input_precision="ieee")
        else:
            acc = tl.dot(pv, v, acc * alpha[:, None])
        m_i = m_new
    return acc, m_i, l_i


@triton.jit
def _decode_attn_kernel(
    q_ptr, k_ptr, v_ptr, len_ptr, o_ptr, acc_ptr, ml_ptr, kn_ptr, vn_ptr,
    qk_scale, H, Hk, L, q_sb, q_sh, q_ss, k_sb, k_sh, k_ss, v_sb, v_sh, v_ss, m_sb, m_ss, m_sl,
    kn_sb, kn_sh, kn_ss, vn_sb, vn_sh, vn_ss,
    SPLITS: tl.constexpr, Q_LEN: tl.constexpr, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_N: tl.constexpr, HAS_LENGTHS: tl.constexpr,
    IEEE: tl.constexpr, UPCAST: tl.constexpr, MASKED: tl.constexpr, WRITE_KV: tl.constexpr = False,
):  # fmt: skip
    """Program (bh, split): sequence bh // Hk, key/value head bh % Hk, the split-th of SPLITS
    ranges of the sequence's length. SPLITS == 1 normalizes and stores o; otherwise the partials
    go to acc_ptr ([bh, split, row, d], float32) and ml_ptr ([2, bh, split, row]: m then l).
    ``MASKED``: len_ptr is the boolean (B, 1, Q_LEN, L) mask (batch stride m_sb), every position
    is scanned and the mask says which each row sees.
    ``WRITE_KV``: len_ptr is the first new token's cache position; the splits cover the cached
    past [0, position), and the last split alone adds the Q_LEN new keys and values (``kn_ptr``/
    ``vn_ptr``, (B, Hk, Q_LEN, D), token stride kn_ss/vn_ss) from registers and stores them into
    the cache at position .. position + Q_LEN - 1: no program reads a row being written."""
    qk_scale = tl.cast(qk_scale, tl.float32)  # float32 math even where Inductor passes a Python float as fp64
    ROWS: tl.constexpr = GROUP * Q_LEN
    bh = tl.program_id(0)
    split = tl.program_id(1)
    b = bh // Hk
    kvh = bh % Hk
    q, token, r_ok, head = _group_rows(q_ptr, bh, H, Hk, q_sb, q_sh, q_ss, Q_LEN, GROUP, HEAD_DIM, BLOCK_D,
                                       BLOCK_Q)  # fmt: skip
    length, bad = _sequence_length(len_ptr, b, L, Q_LEN, HAS_LENGTHS, WRITE_KV)
    # Each split takes a whole number of blocks of this sequence's own length.
    per_split = tl.cdiv(tl.cdiv(length, SPLITS), BLOCK_N) * BLOCK_N
    start = split * per_split
    end = tl.minimum(start + per_split, length)
    k_base = b.to(tl.int64) * k_sb + kvh.to(tl.int64) * k_sh
    v_base = b.to(tl.int64) * v_sb + kvh.to(tl.int64) * v_sh
    # The keys each row sees end at the new tokens: with WRITE_KV past the cached ``length`` by Q_LEN.
    visible_len = length + Q_LEN if WRITE_KV else length
    acc, m_i, l_i = _attend(q, token, k_ptr, v_ptr, k_base, v_base, k_ss, v_ss, start, end, visible_len, qk_scale,
                            len_ptr, b.to(tl.int64) * m_sb, m_ss, m_sl,
                            Q_LEN, HEAD_DIM, BLOCK_D, BLOCK_Q, BLOCK_N, IEEE, UPCAST, MASKED)  # fmt: skip
    d = tl.arange(0, BLOCK_D)
    d_ok = d < HEAD_DIM
    if WRITE_KV and split == SPLITS - 1:
        kn_base = b.to(tl.int64) * kn_sb + kvh.to(tl.int64) * kn_sh
        vn_base = b.to(tl.int64) * vn_sb + kvh.to(tl.int64) * vn_sh
        acc, m_i, l_i = _attend_new_rows(q, token, acc, m_i, l_i, k_ptr, v_ptr, k_base, v_base, k_ss, v_ss,
                                         kn_ptr, vn_ptr, kn_base, vn_base, kn_ss, vn_ss, length, bad,
                                         qk_scale, Q_LEN, HEAD_DIM, BLOCK_D)  # fmt: skip
    r = tl.arange(0, BLOCK_Q)
    store_ok = r_ok[:, None] & d_ok[None, :]
    if SPLITS == 1:
        out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
        out = tl.where(bad, float("nan"), out)
        o_rows = (b.to(tl.int64) * H + head) * Q_LEN + token
        tl.store(o_ptr + o_rows[:, None] * HEAD_DIM + d[None, :], out.to(o_ptr.dtype.element_ty), mask=store_ok)
    else:
        row = (bh.to(tl.int64) * SPLITS + split) * ROWS + r  # only the real rows are stored
        tl.store(acc_ptr + row[:, None] * HEAD_DIM + d[None, :], acc, mask=store_ok)
        plane = tl.num_programs(0).to(tl.int64) * SPLITS * ROWS
        tl.store(ml_ptr + row, m_i, mask=r_ok)
        tl.store(ml_ptr + plane + row, l_i, mask=r_ok)


@triton.jit
def _decode_attn_combine_kernel(
    acc_ptr, ml_ptr, len_ptr, o_ptr, H, Hk, L,
    SPLITS: tl.constexpr, Q_LEN: tl.constexpr, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_Q: tl.constexpr, HAS_LENGTHS: tl.constexpr, WRITE_KV: tl.constexpr = False,
):  # fmt: skip
    """Program bh merges the SPLITS partials of its GROUP * Q_LEN rows, in split order."""
    ROWS: tl.constexpr = GROUP * Q_LEN
    bh = tl.program_id(0)
    b = bh // Hk
    kvh = bh % Hk
    r = tl.arange(0, BLOCK_Q)
    r_ok = r < ROWS
    d = tl.arange(0, BLOCK_D)
    ok = r_ok[:, None] & (d < HEAD_DIM)[None, :]
    plane = tl.num_programs(0).to(tl.int64) * SPLITS * ROWS
    first = bh.to(tl.int64) * SPLITS * ROWS + r
    m_max = tl.full([BLOCK_Q], float("-inf"), dtype=tl.float32)
    for s in tl.static_range(SPLITS):
        m_max = tl.maximum(m_max, tl.load(ml_ptr + first + s * ROWS, mask=r_ok, other=float("-inf")))
    shift = tl.where(m_max == float("-inf"), 0.0, m_max)
    total = tl.zeros([BLOCK_Q], dtype=tl.float32)
    out = tl.zeros([BLOCK_Q, BLOCK_D], dtype=tl.float32)
    for s in tl.static_range(SPLITS):
        rows = first + s * ROWS
        w = tl.exp2(tl.load(ml_ptr + rows, mask=r_ok, other=float("-inf")) - shift)
        total += w * tl.load(ml_ptr + plane + rows, mask=r_ok, other=0.0)
        out += w[:, None] * tl.load(acc_ptr + rows[:, None] * HEAD_DIM + d[None, :], mask=ok, other=0.0)
    out = out / tl.where(total == 0.0, 1.0, total)[:, None]
    _, bad = _sequence_length(len_ptr, b, L, Q_LEN, HAS_LENGTHS, WRITE_KV)
    out = tl.where(bad, float("nan"), out)
    head = kvh * GROUP + r // Q_LEN
    o_rows = (b.to(tl.int64) * H + head) * Q_LEN + r % Q_LEN
    tl.store(o_ptr + o_rows[:, None] * HEAD_DIM + d[None, :], out.to(o_ptr.dtype.element_ty), mask=ok)

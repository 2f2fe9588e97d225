"""The kernels of the decode-shaped matmul family (:mod:`kernelsmith.ops.decode_matmul`, whose
docstring explains the op, the fusions and the variants): the block product on the CUDA cores or
the tensor cores, the RMSNorm prologue's sums of squares, the RoPE rotation, and the split-N
(``gemv``) and split-K kernels. The dot, the epilogue and the split-K reduction kernel are the
matmul family's (:mod:`kernelsmith.ops._matmul_kernels`); the spaces and launchers are in
:mod:`kernelsmith.ops._decode_matmul_launch`.
"""

from __future__ import annotations

import triton
import triton.language as tl

from kernelsmith.ops._matmul_kernels import _dot, _finish_tile

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
def _segment_weight(w_ptr, wk_ptr, wv_ptr, pid_n, BLOCK_N: tl.constexpr, K_START: tl.constexpr,
                    V_START: tl.constexpr):  # fmt: skip
    """``(weight pointer, its first output column)`` for block ``pid_n``: the one weight, column 0
    (K_START = 0), or with the q, k and v weights given apart (``weights="qkv"``: columns [0,
    K_START) are q's rows, [K_START, V_START) k's, from V_START v's) the weight whose segment the
    block lies in. A block never straddles two: every segment is whole heads and BLOCK_N divides
    the head dim, and a block of _weight_rows' RoPE order stays in its head, whose first column
    is at most ``pid_n * BLOCK_N`` and whose last is above it. So one scalar select per block, and
    no weight is ever copied or concatenated."""
    if K_START == 0:
        w, first = w_ptr, 0
    else:
        start = pid_n * BLOCK_N
        w = tl.where(start >= V_START, wv_ptr, tl.where(start >= K_START, wk_ptr, w_ptr))
        first = tl.where(start >= V_START, V_START, tl.where(start >= K_START, K_START, 0))
    return w, first


@triton.jit
def _block_product(
    x_ptr, w_ptr, w3_ptr, wk_ptr, wv_ptr, g_ptr, pid_m, pid_n, k_first, k_last, M, N, K,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_N: tl.constexpr,
    EVEN_K: tl.constexpr, SWIGLU: tl.constexpr, DOT: tl.constexpr, IEEE: tl.constexpr, UPCAST: tl.constexpr,
    FOLD: tl.constexpr, STAGES: tl.constexpr, RMS: tl.constexpr, ROPE_DIM: tl.constexpr,
    K_START: tl.constexpr, V_START: tl.constexpr,
):  # fmt: skip
    """The float32 ``[BLOCK_M, BLOCK_N]`` products of rows block ``pid_m`` of x and weight rows block
    ``pid_n`` over the K blocks [k_first, k_last): ``(x @ w.T, x @ w3.T, sum of x**2 per row)`` (the
    second is the first again unless SWIGLU; the third is zeros unless RMS, where x is multiplied
    by gamma before the product: RMSNorm's 1/rms is a factor per row, applied after the sum).
    With the q, k and v weights apart (K_START > 0), the rows come from the one whose segment
    holds the block (_segment_weight), at the block's columns less the segment's first.

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
    w_base, first = _segment_weight(w_ptr, wk_ptr, wv_ptr, pid_n, BLOCK_N, K_START, V_START)
    w_offsets = (cols - first)[:, None].to(tl.int64) * K + ks[None, :]  # 64-bit: the LM head nears 2**31
    w_ptrs = w_base + w_offsets
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
    x_ptr, w_ptr, w3_ptr, wk_ptr, wv_ptr, bias_ptr, res_ptr, g_ptr, cos_ptr, sin_ptr, y_ptr, M, N, K, eps, ROPE_COLS,
    HAS_BIAS: tl.constexpr, EPILOGUE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr, EVEN_N: tl.constexpr, EVEN_K: tl.constexpr, DOT: tl.constexpr,
    IEEE: tl.constexpr, UPCAST: tl.constexpr, FOLD: tl.constexpr, STAGES: tl.constexpr, RMS: tl.constexpr,
    ROPE_DIM: tl.constexpr, K_START: tl.constexpr, V_START: tl.constexpr,
):  # fmt: skip
    """gemv: program i computes rows block i % (M blocks) of weight rows block i // (M blocks)
    over all of K (so the RMSNorm sum of squares comes with the loop), then the epilogue and the
    store (M blocks of one N block run together)."""
    eps = tl.cast(eps, tl.float32)  # float32 math even where Inductor passes a Python float as fp64
    num_pid_m = tl.cdiv(M, BLOCK_M)
    pid = tl.program_id(0)
    pid_m = pid % num_pid_m
    pid_n = pid // num_pid_m
    acc, acc3, sumsq = _block_product(x_ptr, w_ptr, w3_ptr, wk_ptr, wv_ptr, g_ptr, pid_m, pid_n, 0,
                                      tl.cdiv(K, BLOCK_K), M, N, K, BLOCK_M, BLOCK_N, BLOCK_K, EVEN_N, EVEN_K,
                                      EPILOGUE == 5, DOT, IEEE, UPCAST, FOLD, STAGES, RMS, ROPE_DIM, K_START,
                                      V_START)  # fmt: skip
    rstd = tl.rsqrt(sumsq / K + eps) if RMS else sumsq  # (unused without RMS)
    _decode_finish(acc, acc3, rstd, y_ptr, bias_ptr, res_ptr, cos_ptr, sin_ptr, pid_m, pid_n, M, N, ROPE_COLS,
                   BLOCK_M, BLOCK_N, HAS_BIAS, EPILOGUE, RMS, ROPE_DIM)  # fmt: skip


@triton.jit
def _decode_split_k_kernel(
    x_ptr, w_ptr, w3_ptr, wk_ptr, wv_ptr, g_ptr, cos_ptr, sin_ptr, partial_ptr, counter_ptr, y_ptr, bias_ptr, res_ptr,
    M, N, K, eps, ROPE_COLS,
    HAS_BIAS: tl.constexpr, EPILOGUE: tl.constexpr, SPLIT_K: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_N: tl.constexpr, EVEN_K: tl.constexpr, DOT: tl.constexpr,
    IEEE: tl.constexpr, UPCAST: tl.constexpr, LAST_REDUCES: tl.constexpr, FOLD: tl.constexpr,
    STAGES: tl.constexpr, RMS: tl.constexpr, ROPE_DIM: tl.constexpr, K_START: tl.constexpr, V_START: tl.constexpr,
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
    eps = tl.cast(eps, tl.float32)  # float32 math even where Inductor passes a Python float as fp64
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
        acc, acc3, _ = _block_product(x_ptr, w_ptr, w3_ptr, wk_ptr, wv_ptr, g_ptr, pid_m, pid_n, k_first, k_last,
                                      M, N, K, BLOCK_M, BLOCK_N, BLOCK_K, EVEN_N, EVEN_K, EPILOGUE == 5, DOT, IEEE,
                                      UPCAST, FOLD, STAGES, RMS, ROPE_DIM, K_START, V_START)  # fmt: skip
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
    """Set ``n`` int32 counters to 0 (before every last_program split-K call: a kernel, not PyTorch,
    which the harness would take for the candidate computing with PyTorch, rule 7)."""
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(ptr + offsets, tl.zeros([BLOCK], dtype=tl.int32), mask=offsets < n)

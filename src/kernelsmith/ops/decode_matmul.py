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
code and the split-K reduction kernel: only the way the weight is walked is new.

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
  matching ``x`` values and keeps a float32 partial sum per element (a ``[BLOCK_M, BLOCK_N,
  BLOCK_K]`` accumulator); the sums over ``K`` are reduced once, after the loop, so the loop is
  loads and fused multiply-adds only. This is the classic GEMV, and what ``M = 1`` wants;
- ``BLOCK_M`` of 16 to 64: on the tensor cores (``tl.dot`` of the ``x`` block and the transposed
  weight block). At ``M = 8`` each weight element already costs 8 multiply-adds, a good part of
  what the CUDA cores can do at full bandwidth; the tensor cores do it without noticing, rows past
  ``M`` padding the block (read at ``row % M``, never stored).

Rows past ``M`` and columns past ``N`` are read at ``row % M`` and ``col % N`` (valid addresses, no
mask in the loop) and masked on the store; the last ``K`` block is masked unless ``K`` is a
multiple of ``BLOCK_K`` (``EVEN_K``, known from the spec). Offsets into the weight are 64-bit (the
LM head has 128256 x 4096 = 5e8 elements; 2**31 is near).

Spaces
------
Parameters: ``BLOCK_M``, ``BLOCK_N``, ``BLOCK_K``, ``num_warps``, ``num_stages`` (plus ``SPLIT_K`` and
``PROGRAMS_PER_SM``, ``REDUCE``). *Validity* constraints depend on ``N``, ``K``, the dtype and the epilogue
only, so a config tuned at one ``M`` is correct at every other (the validation tails, a bucket's
rows): registers (the CUDA-core accumulator and weight block, or the tensor-core accumulators),
shared memory for the ``num_stages`` pipelined blocks of a tensor-core loop, blocks no larger than
the padded ``N`` and ``K``, at least one ``K`` block a split. *Pruning* constraints look at ``M``:
the CUDA-core ``BLOCK_M`` is the padded ``M`` (up to 8), tensor-core blocks no taller than needed,
and every thread loads at least 16 bytes of weight a step.

Testing without a GPU: the interpreter's bfloat16 ``tl.dot`` is wrong (see the matmul module), so
bfloat16 blocks are widened to float32 before a dot there (``UPCAST``), as the matmul family does.

Front door: ``kernelsmith tune decode_matmul --shape 1x2048x2048 --epilogue residual``. The
``@kernelsmith.optimize`` pattern for ``F.linear`` still routes every product to ``matmul``.
"""

from __future__ import annotations

import hashlib
import inspect
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from kernelsmith.ops import matmul as _matmul_module
from kernelsmith.ops._base import Launcher, UnsupportedWorkload
from kernelsmith.ops._launch import direct_launch
from kernelsmith.ops.gelu import checked, multiprocessor_count
from kernelsmith.ops.matmul import (
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
from kernelsmith.spec import OpSpec

MAX_M = 64  # the most rows (all leading dims of x) the family takes: decode batches

# =================================================================================================
# Kernels
#
# x is (M, K) and the weight (N, K), both contiguous (row strides K); y, and the residual, (M, N).
# =================================================================================================


@triton.jit
def _block_product(
    x_ptr, w_ptr, w3_ptr, pid_m, pid_n, k_first, k_last, M, N, K,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_N: tl.constexpr,
    EVEN_K: tl.constexpr, SWIGLU: tl.constexpr, DOT: tl.constexpr, IEEE: tl.constexpr, UPCAST: tl.constexpr,
):  # fmt: skip
    """The float32 ``[BLOCK_M, BLOCK_N]`` products of rows block ``pid_m`` of x and rows block
    ``pid_n`` of the weight over the K blocks [k_first, k_last): ``(x @ w.T, x @ w3.T)`` (the second
    is the first again unless SWIGLU). DOT: on the tensor cores; otherwise on the CUDA cores, with
    one partial sum per weight element, reduced over K after the loop."""
    # Rows past M and weight rows past N are read at row % M and col % N: valid addresses, no mask
    # in the loop; they are never stored.
    rows = ((pid_m * BLOCK_M + tl.arange(0, BLOCK_M)) % M).to(tl.int64)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    if not EVEN_N:
        cols = cols % N
    ks = k_first * BLOCK_K + tl.arange(0, BLOCK_K)
    x_ptrs = x_ptr + rows[:, None] * K + ks[None, :]
    w_offsets = cols[:, None].to(tl.int64) * K + ks[None, :]  # 64-bit: the LM head nears 2**31
    w_ptrs = w_ptr + w_offsets
    if DOT:
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    else:
        acc = tl.zeros([BLOCK_M, BLOCK_N, BLOCK_K], dtype=tl.float32)
    if SWIGLU:  # (constexpr branches: without SwiGLU, no w3 pointers or accumulator exist at all)
        w3_ptrs = w3_ptr + w_offsets
        acc3 = tl.zeros_like(acc)
    k_offsets = tl.arange(0, BLOCK_K)
    for kb in range(k_first, k_last):
        # The weight is read once: evict_first leaves L2 to x and the partial sums.
        if EVEN_K:
            a = tl.load(x_ptrs)
            b = tl.load(w_ptrs, eviction_policy="evict_first")
        else:
            k_mask = k_offsets < K - kb * BLOCK_K  # the last block may run past K: zeros add nothing
            a = tl.load(x_ptrs, mask=k_mask[None, :], other=0.0)
            b = tl.load(w_ptrs, mask=k_mask[None, :], other=0.0, eviction_policy="evict_first")
        acc = _multiply_add(a, b, acc, DOT, IEEE, UPCAST)
        if SWIGLU:
            if EVEN_K:
                b3 = tl.load(w3_ptrs, eviction_policy="evict_first")
            else:
                b3 = tl.load(w3_ptrs, mask=k_mask[None, :], other=0.0, eviction_policy="evict_first")
            acc3 = _multiply_add(a, b3, acc3, DOT, IEEE, UPCAST)
            w3_ptrs += BLOCK_K
        x_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    if not DOT:  # one reduction over K per output, after the loop
        acc = tl.sum(acc, axis=2)
        if SWIGLU:
            acc3 = tl.sum(acc3, axis=2)
    if not SWIGLU:
        acc3 = acc  # unused: the epilogue reads it for SwiGLU only
    return acc, acc3


@triton.jit
def _multiply_add(a, b, acc, DOT: tl.constexpr, IEEE: tl.constexpr, UPCAST: tl.constexpr):
    """acc + the products of x block ``a`` [BLOCK_M, BLOCK_K] and weight block ``b`` [BLOCK_N,
    BLOCK_K]: ``a @ b.T`` on the tensor cores (DOT), or every product a[m, k] * b[n, k] added to
    its own float32 partial sum (acc is then [BLOCK_M, BLOCK_N, BLOCK_K]).

    One return, after the branches: Triton's compiler does not stop at a ``return`` inside an
    ``if`` on a constexpr, it goes on to compile what follows (the interpreter, plain Python,
    does stop), so an early return would compile the CUDA-core sum against the dot's 2-D acc."""
    if DOT:
        acc = _dot(a, tl.trans(b), acc, IEEE, UPCAST)
    else:
        acc = acc + a.to(tl.float32)[:, None, :] * b.to(tl.float32)[None, :, :]
    return acc


@triton.jit
def _decode_gemv_kernel(
    x_ptr, w_ptr, w3_ptr, bias_ptr, res_ptr, y_ptr, M, N, K,
    HAS_BIAS: tl.constexpr, EPILOGUE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr, EVEN_N: tl.constexpr, EVEN_K: tl.constexpr, DOT: tl.constexpr,
    IEEE: tl.constexpr, UPCAST: tl.constexpr,
):  # fmt: skip
    """gemv: program i computes rows block i % (M blocks) of weight rows block i // (M blocks)
    over all of K, then the epilogue and the store (M blocks of one N block run together)."""
    num_pid_m = tl.cdiv(M, BLOCK_M)
    pid = tl.program_id(0)
    pid_m = pid % num_pid_m
    pid_n = pid // num_pid_m
    acc, acc3 = _block_product(x_ptr, w_ptr, w3_ptr, pid_m, pid_n, 0, tl.cdiv(K, BLOCK_K), M, N, K,
                               BLOCK_M, BLOCK_N, BLOCK_K, EVEN_N, EVEN_K, EPILOGUE == 5, DOT, IEEE,
                               UPCAST)  # fmt: skip
    _finish_tile(acc, acc3, y_ptr, bias_ptr, res_ptr, pid_m, pid_n, M, N, N, N, BLOCK_M, BLOCK_N, HAS_BIAS,
                 EPILOGUE)  # fmt: skip


@triton.jit
def _decode_split_k_kernel(
    x_ptr, w_ptr, w3_ptr, partial_ptr, counter_ptr, y_ptr, bias_ptr, res_ptr, M, N, K,
    HAS_BIAS: tl.constexpr, EPILOGUE: tl.constexpr, SPLIT_K: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_N: tl.constexpr, EVEN_K: tl.constexpr, DOT: tl.constexpr,
    IEEE: tl.constexpr, UPCAST: tl.constexpr, LAST_REDUCES: tl.constexpr,
):  # fmt: skip
    """split_k and persistent: programs walk the tiles pid, pid + programs, ... (one tile each when
    there are as many programs as tiles). Tile t is rows block t % (M blocks), K range
    (t // M blocks) % SPLIT_K and weight rows block t // (M blocks * SPLIT_K); its float32 product
    goes to partial[range] (and x @ w3.T's to partial[SPLIT_K + range] for SwiGLU).

    LAST_REDUCES: the program that finishes an output block's last range (counted on the block's
    counter) sums its SPLIT_K partials in order, applies the epilogue, stores, and sets the counter
    back to 0 for the next launch: one launch instead of two. Otherwise the matmul family's
    reduction kernel runs next."""
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
        acc, acc3 = _block_product(x_ptr, w_ptr, w3_ptr, pid_m, pid_n, k_first, k_last, M, N, K,
                                   BLOCK_M, BLOCK_N, BLOCK_K, EVEN_N, EVEN_K, EPILOGUE == 5, DOT, IEEE,
                                   UPCAST)  # fmt: skip
        rows = pid_m.to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
        cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
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
                _finish_tile(total, total3, y_ptr, bias_ptr, res_ptr, pid_m, pid_n, M, N, N, N, BLOCK_M, BLOCK_N,
                             HAS_BIAS, EPILOGUE)  # fmt: skip
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
BLOCKS_K = (32, 64, 128, 256, 512)
WARPS = (1, 2, 4, 8)
STAGES = (1, 2, 3)
SPLITS = (2, 4, 8, 16, 32)
PERSISTENT_SPLITS = (1, 2, 4, 8, 16)
PROGRAMS_PER_SM = (1, 2)
# Who sums a split output block's partials: its last program ("last_program", one launch) or a
# second kernel ("kernel").
REDUCTIONS = ("last_program", "kernel")
ZERO_BLOCK = 1024
# float32 values a thread holds on the CUDA cores: its partial sums plus the weight block it loads.
MAX_FMA_VALUES_PER_THREAD = 128
MAX_ACCUMULATORS_PER_THREAD = 128  # on the tensor cores, as in the matmul family
MIN_LOAD_BYTES = 16  # weight bytes a thread loads a step: one 128-bit vector load at least


def _is_dot(config: Config) -> bool:
    return int(config["BLOCK_M"]) >= DOT_MIN_M


def _validity(g: _Geometry, extra: Sequence[Constraint] = ()) -> list[Constraint]:
    """Constraints every config a build accepts satisfies: they look at N, K, the dtype and the
    epilogue, never at M, so a config is correct at every row count (module docstring)."""
    widest_n = max(BLOCKS_N[0], next_power_of_two(g.n))
    deepest_k = max(BLOCKS_K[0], next_power_of_two(g.k))

    def registers_fit(c: Config) -> bool:
        threads = 32 * int(c["num_warps"])
        if _is_dot(c):
            return g.weights * c["BLOCK_M"] * c["BLOCK_N"] <= MAX_ACCUMULATORS_PER_THREAD * threads
        return g.weights * (c["BLOCK_M"] + 1) * c["BLOCK_N"] * c["BLOCK_K"] <= MAX_FMA_VALUES_PER_THREAD * threads

    def shared_memory_fits(c: Config) -> bool:
        stage = (c["BLOCK_M"] + g.weights * c["BLOCK_N"]) * c["BLOCK_K"] * g.itemsize
        return not _is_dot(c) or c["num_stages"] * stage <= SHARED_MEMORY_BUDGET

    return [
        Constraint("BLOCK_N is no wider than the padded N", lambda c: c["BLOCK_N"] <= widest_n),
        Constraint("BLOCK_K is no deeper than the padded K", lambda c: c["BLOCK_K"] <= deepest_k),
        Constraint(f"tensor-core blocks (BLOCK_M >= {DOT_MIN_M}) are at least 16 weight rows",
                   lambda c: not _is_dot(c) or c["BLOCK_N"] >= 16),
        Constraint(f"the float32 partial sums and the weight block fit in registers "
                   f"({MAX_FMA_VALUES_PER_THREAD} a thread; tensor cores: {MAX_ACCUMULATORS_PER_THREAD} "
                   "accumulators)", registers_fit),
        Constraint(f"num_stages tensor-core blocks fit in shared memory ({SHARED_MEMORY_BUDGET} bytes)",
                   shared_memory_fits),
        *extra,
    ]  # fmt: skip


def _pruning(g: _Geometry) -> list[Constraint]:
    """Constraints that only save search time, looking at M: a config they exclude is still
    correct (and accepted by build) at this M."""
    padded = next_power_of_two(g.m)
    fma_m = min(padded, DOT_MIN_M // 2)

    def useful_m(c: Config) -> bool:
        if _is_dot(c):
            return c["BLOCK_M"] <= max(DOT_MIN_M, padded)
        return c["BLOCK_M"] == fma_m

    return [
        Constraint(f"CUDA-core blocks are the padded M (at most {fma_m} rows), tensor-core blocks no taller "
                   "than needed", useful_m),
        Constraint(f"every thread loads at least {MIN_LOAD_BYTES} bytes of weight a step",
                   lambda c: c["BLOCK_N"] * c["BLOCK_K"] * g.itemsize >= MIN_LOAD_BYTES * 32 * c["num_warps"]),
    ]  # fmt: skip


def _space(params: list[Param], g: _Geometry, prune: bool, extra: Sequence[Constraint] = ()) -> Space:
    return Space(params, [*_validity(g, extra), *(_pruning(g) if prune else [])])


def _block_params() -> list[Param]:
    return [Param("BLOCK_M", BLOCKS_M), Param("BLOCK_N", BLOCKS_N), Param("BLOCK_K", BLOCKS_K),
            Param("num_warps", WARPS), Param("num_stages", STAGES)]  # fmt: skip


def _flags(g: _Geometry, config: Config) -> dict[str, object]:
    """The compile-time flags every decode kernel takes."""
    block_n, block_k = int(config["BLOCK_N"]), int(config["BLOCK_K"])
    return {
        "BLOCK_M": int(config["BLOCK_M"]),
        "BLOCK_N": block_n,
        "BLOCK_K": block_k,
        "EVEN_N": g.n % block_n == 0,
        "EVEN_K": g.k % block_k == 0,
        "DOT": _is_dot(config),
        "IEEE": g.ieee,
        "UPCAST": g.upcast,
    }


def _tiles(g: _Geometry, config: Config, splits: int = 1) -> int:
    return triton.cdiv(g.m, int(config["BLOCK_M"])) * triton.cdiv(g.n, int(config["BLOCK_N"])) * splits


def _split_constraint(g: _Geometry) -> Constraint:
    return Constraint("every split gets at least one K block",
                      lambda c: c["SPLIT_K"] <= triton.cdiv(g.k, c["BLOCK_K"]))  # fmt: skip


# ---- gemv ---------------------------------------------------------------------------------------


def _gemv_space(spec: OpSpec, prune: bool = True) -> Space:
    return _space(_block_params(), _geometry(spec), prune)


def _gemv_build(spec: OpSpec, config: Config) -> Launcher:
    checked(_gemv_space(spec, prune=False), config)
    g = _geometry(spec)
    flags = _flags(g, config)
    kernel = direct_launch(_decode_gemv_kernel, (_tiles(g, config),))
    num_warps, num_stages = int(config["num_warps"]), int(config["num_stages"])

    def launch(inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> None:
        x, w, w3, bias, residual = _operands(g, inputs)
        kernel(x, w, w3, bias, residual, outputs[0], g.m, g.n, g.k, HAS_BIAS=g.has_bias, EPILOGUE=g.epilogue,
               **flags, num_warps=num_warps, num_stages=num_stages)  # fmt: skip

    return launch


# ---- split_k and persistent ---------------------------------------------------------------------


def _split_k_space(spec: OpSpec, prune: bool = True) -> Space:
    g = _geometry(spec)
    params = [*_block_params(), Param("SPLIT_K", SPLITS), Param("REDUCE", REDUCTIONS)]
    return _space(params, g, prune, [_split_constraint(g)])


def _persistent_space(spec: OpSpec, prune: bool = True) -> Space:
    g = _geometry(spec)
    params = [*_block_params(), Param("SPLIT_K", PERSISTENT_SPLITS), Param("PROGRAMS_PER_SM", PROGRAMS_PER_SM),
              Param("REDUCE", REDUCTIONS)]
    return _space(params, g, prune, [_split_constraint(g)])


def _split_k_build(spec: OpSpec, config: Config) -> Launcher:
    checked(_split_k_space(spec, prune=False), config)
    g = _geometry(spec)
    splits = int(config["SPLIT_K"])
    return _split_launcher(g, config, splits, _tiles(g, config, splits))


def _persistent_build(spec: OpSpec, config: Config) -> Launcher:
    checked(_persistent_space(spec, prune=False), config)
    g = _geometry(spec)
    splits = int(config["SPLIT_K"])
    programs = min(_tiles(g, config, splits), int(config["PROGRAMS_PER_SM"]) * multiprocessor_count())
    return _split_launcher(g, config, splits, programs)


def _split_launcher(g: _Geometry, config: Config, splits: int, programs: int) -> Launcher:
    """The split-K kernel on ``programs`` programs, the partials reduced in order (bitwise
    reproducible, see the module docstring) by the last program of each output block
    (``REDUCE="last_program"``: one launch) or by the matmul family's reduction kernel
    (``REDUCE="kernel"``: two launches, no counters)."""
    flags = _flags(g, config)
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
        x, w, w3, bias, residual = _operands(g, inputs)
        y = outputs[0]
        partial = y.new_empty(scratch_shape, dtype=torch.float32)  # every element is written
        counter = y  # unused without LAST_REDUCES
        if last_reduces:
            counter = counters.get(y.device)  # type: ignore[assignment]
            if counter is None:
                counter = counters.setdefault(y.device, y.new_empty(blocks, dtype=torch.int32))
                _zero_kernel[(triton.cdiv(blocks, ZERO_BLOCK),)](counter, blocks, BLOCK=ZERO_BLOCK)
        partial_kernel(x, w, w3, partial, counter, y, bias, residual, g.m, g.n, g.k, HAS_BIAS=g.has_bias,
                       EPILOGUE=g.epilogue, SPLIT_K=splits, **flags, LAST_REDUCES=last_reduces,
                       num_warps=num_warps, num_stages=num_stages)  # fmt: skip
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


class DecodeMatmul(Matmul):
    name = "decode_matmul"
    summary = (f"decode-shaped y = epilogue(x @ w.T + bias) for at most {MAX_M} rows of x against an nn.Linear "
               "weight, streaming the weight at the bandwidth limit (split-N, split-K, persistent); epilogues "
               "as matmul's: none, gelu, gelu_tanh, silu, residual add, swiglu")  # fmt: skip
    shape_help = (
        f"MxNxK: x (M, K) with M <= {MAX_M} times a weight (N, K) as nn.Linear stores it, e.g. 1x2048x8192 for "
        "Llama-3.2-1B's down projection at batch 1; more leading sizes are batch dims of x (4x2x4096x4096); "
        "--epilogue bias|gelu|silu|residual|swiglu, or bias+gelu"
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

    def check_supported(self, spec: OpSpec) -> None:
        """The matmul family's checks, then the decode shapes: layout "linear" and M <= MAX_M."""
        super().check_supported(spec)
        if spec.const("layout") != "linear":
            raise UnsupportedWorkload(f"{self.name}: the weight must be (N, K) as nn.Linear stores it "
                                      "(layout 'linear'); use matmul for x @ w")  # fmt: skip
        m = _geometry(spec).m
        if m > MAX_M:
            raise UnsupportedWorkload(f"{self.name}: x has {m} rows; decode shapes have at most {MAX_M} "
                                      "(use matmul)")  # fmt: skip


OP = DecodeMatmul()

"""Residual add + RMSNorm: ``h = x + residual``, ``y = rmsnorm(h) * weight``, in one pass.

Every decoder layer of Llama, Mistral, Qwen and their kin adds the output of a block (``x``) to
the residual stream and normalises the sum before the next block. Hugging Face writes it as

    hidden_states = residual + hidden_states      # in the model's dtype: the sum is ROUNDED
    residual = hidden_states                      # the next layer's residual
    hidden_states = self.post_attention_layernorm(hidden_states)   # LlamaRMSNorm

so the op takes ``x`` and ``residual`` of shape ``(..., N)`` and ``weight`` of shape ``(N,)`` and
returns TWO outputs, in this order:

    y = weight * (hf * rsqrt(mean(hf ** 2, last dim) + eps)).to(dtype)   with hf = h.float()
    h = residual + x                                                     (rounded to the dtype)

Eagerly that is an add kernel (read 2, write 1) and then RMSNorm (read 1 again, write 1); fused,
``x`` and ``residual`` are read once and ``y`` and ``h`` written once: 4 row-sized transfers
instead of 5, and one launch instead of several. Like RMSNorm it is bound by memory bandwidth.

Gemma's residual add + RMSNorm scales by ``1 + weight``: the constant ``weight_offset`` (1.0 for
Gemma; left out of the constants when 0, so that every other workload hashes as before) is added
to the weight in float32 right after the kernels load it, under a ``WEIGHT_OFFSET`` constexpr
(0.0 compiles no add), as :mod:`kernelsmith.ops.rmsnorm` does. With an offset the reference is
Gemma's: ``h = residual + x`` rounded, then ``GemmaRMSNorm(h)``, float32 rounded once.

The rounding of ``h``
---------------------
The model stores ``h`` in its own dtype and normalises *that* stored value. The kernels do the
same: they add in float32, round the sum to the storage dtype, store it, and compute the
statistics and ``y`` from the rounded value (load, add, round, store, then reuse the rounded
registers). Normalising the unrounded float32 sum instead would be a slightly different function
(``y`` would no longer be the norm of the ``h`` the op returns), which drifts from the reference
by up to half a unit in the last place of ``h`` in bfloat16.

Rounding is done by :func:`_to_storage`, which rounds float32 to bfloat16 to nearest-even *by
hand* (integer operations on the bits) before the conversion. On a GPU a plain ``.to(bfloat16)``
already rounds to nearest-even, and the hand rounding costs a few integer operations in a kernel
bound by memory. But the Triton interpreter (the CPU test bed) *truncates* float32 to bfloat16,
so without it the tests would check a different ``h`` than the GPU computes. With it, ``h`` is
bit for bit ``residual + x`` as PyTorch computes it, on both (float32 holds every sum of two
float16 or bfloat16 values closely enough, 24 >= 2 * 11 + 2 bits, that rounding the float32 sum
once more is the correctly rounded sum). ``y`` is rounded the same way.

The float64 reference, and why it includes the rounding of ``h``
-----------------------------------------------------------------
``reference_fp64`` first forms ``h`` in the input dtype exactly as the model does (``residual +
x``, correctly rounded), then does everything else in float64. So the "truth" is the op as models
define it: ``h``'s rounding is part of the function, not an error of it, and ``y``'s truth is the
exact norm of the ``h`` the op returns. The alternative, an unrounded float64 sum, is wrong for
the tolerance test in two ways: (1) the rounding of ``h``, which every correct implementation
must perform, would count as PyTorch's own *error* and loosen ``y``'s tolerance (in bfloat16 it
raises PyTorch's relative L2 error of ``y`` from about 2.3e-3 to 3.0e-3); and (2) a kernel that
normalised the unrounded float32 sum would then look *more* accurate (1.7e-3) than a correct one
(2.4e-3). With the rounded truth, PyTorch's ``h`` has no error at all (``check_close`` then allows
``floor_ulps`` of rounding: the kernels' ``h`` is exact), a correct ``y`` scores 1.7e-3, and the
unrounded-sum kernel 2.4e-3. (Within ``k = 4`` times PyTorch's error both still pass: the
tolerance cannot see that drift, so the tests check the rounded ``h`` is used bit for bit.)

Variants (the same split of work as :mod:`kernelsmith.ops.rmsnorm`)
-------------------------------------------------------------------
``whole_row``
    One program per row, the whole row (padded to ``BLOCK_N``, a power of two) in registers:
    load ``x`` and ``residual``, add, round, store ``h``, reduce, scale, store ``y``. The default
    for the usual hidden sizes (1024 to 16384).
``multi_row``
    ``ROWS`` rows per program as one ``[ROWS, BLOCK_N]`` block, for narrow rows, where one row
    gives a program too little work to hide memory latency. The last program masks rows past the
    end.
``looped``
    One program per row in column blocks of ``BLOCK_N``, two passes: the first adds, rounds,
    stores ``h`` and accumulates the sum of squares; the second re-reads ``h`` (just written, so
    in L2: one tensor re-read instead of ``x`` and ``residual``) and writes ``y``. For rows too
    wide for registers. A barrier between the passes makes pass 1's stores visible to every
    thread of the program before pass 2 reads them back (with software pipelining, pass 2's
    loads are asynchronous copies issued by other threads than the ones that stored).
``persistent``
    A fixed grid of ``PROGRAMS_PER_SM`` programs per multiprocessor walking rows ``pid, pid +
    programs, ...``; the weight is loaded once per program, and ``num_stages`` pipelines the next
    rows' loads behind the current row's arithmetic.

``aligned_row``
    ``whole_row`` on a row cut into a 16-byte-aligned body (vector loads and stores) and a short
    head and tail, for widths that are not a multiple of 16 (rows Triton cannot prove aligned).
``split_row``
    ``(row, chunk)`` programs and two launches: the first stores ``h`` and each chunk's sum of
    squares, the second re-reads ``h`` and writes ``y`` with the row's rstd. For rows too wide
    for one program and for few rows (see the row-wise skeleton's section on both).

``num_stages`` appears only in the spaces of the two variants with a loop, and is given both to
``tl.range`` and at launch (Triton 3.6 leaves a loop without a matrix product unpipelined when it
is only a launch option).

Backward (not implemented here): the gradient needs ``h`` (an output already) and each row's
``rstd``, which a backward kernel recomputes from ``h`` in one extra read; a variant that also
stores ``rstd`` (a third, float32 ``(rows,)`` output) can be added through ``output_specs``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import triton
import triton.language as tl

from kernelsmith.ops import _rowwise as skeleton
from kernelsmith.ops._base import Variant, generator
from kernelsmith.ops.rmsnorm import OP as _RMSNORM
from kernelsmith.ops.rmsnorm import RMSNormLike, _scaled, norm_variant, split_row_variant, weight_offset_of
from kernelsmith.space import Space
from kernelsmith.spec import OpSpec, TensorSpec

# ---------------------------------------------------------------------------------------------
# Kernels
#
# x, residual, y and h are (rows, N) matrices with unit column stride and explicit row strides
# (the realigned kernels address row r at r * N); row offsets are 64-bit so that tensors of more
# than 2**31 elements address correctly. All arithmetic is float32; padding lanes load 0.0, which
# adds nothing to the sum of squares. Every kernel takes x, residual, the weight, y and h, then
# their row strides, ``n_rows`` where a program owns several rows, ``N`` and eps; its constexprs
# are the block (``BLOCK_N``, ``ROWS``), ``EVICT_X`` ("" or "evict_first" for x and residual,
# each read once), ``NUM_STAGES`` in the kernels with a loop, and ``WEIGHT_OFFSET``, added to the
# weight (Gemma: 1.0; 0.0 compiles no add); the realigned kernels' ``ALIGN`` is the elements in
# 16 bytes.
# ---------------------------------------------------------------------------------------------


@triton.jit
def _to_storage(v, ptr):
    """Float32 ``v`` converted to ``ptr``'s element type, rounded to nearest-even everywhere.

    bfloat16 keeps the top 16 bits of a float32: adding 0x7FFF plus the lowest kept bit and
    clearing the low half rounds to nearest, ties to even (the interpreter's own conversion
    truncates). Infinities are unchanged; finite values round as IEEE does. A NaN stays NaN,
    with its quiet bit set (so that the interpreter's truncating conversion keeps it a NaN): the
    carry of that addition would run through a NaN's mantissa into its exponent and sign, and an
    NVIDIA GPU's arithmetic NaN is 0x7FFFFFFF, which it turned into -0.0 (a row holding a NaN or
    an Inf came out finite). The interpreter's NaNs (x86's 0xFFC00000, or an input's payload)
    survive the carry, so only the GPU showed it. float16 and float32 need nothing: the
    conversion itself rounds correctly on every backend.
    """
    if ptr.dtype.element_ty == tl.bfloat16:
        bits = v.to(tl.uint32, bitcast=True)
        rounded = (bits + (0x7FFF + ((bits >> 16) & 1))) & 0xFFFF0000
        is_nan = (bits & 0x7FFFFFFF) > 0x7F800000  # on the bits: no float compare to optimise away
        v = tl.where(is_nan, bits | 0x00400000, rounded).to(tl.float32, bitcast=True)
    return v.to(ptr.dtype.element_ty)


@triton.jit
def _add_rmsnorm_whole_row_kernel(x_ptr, r_ptr, w_ptr, y_ptr, h_ptr, x_row_stride, r_row_stride, y_row_stride,
                                  h_row_stride, N, eps, BLOCK_N: tl.constexpr, EVICT_X: tl.constexpr,
                                  WEIGHT_OFFSET: tl.constexpr):
    """One program a row, the whole row (``BLOCK_N``, the padded row) in registers."""
    eps = tl.cast(eps, tl.float32)  # float32 math even where Inductor passes a Python float as fp64
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < N

    x = tl.load(x_ptr + row * x_row_stride + cols, mask=mask, other=0.0, eviction_policy=EVICT_X)
    r = tl.load(r_ptr + row * r_row_stride + cols, mask=mask, other=0.0, eviction_policy=EVICT_X)
    # Add in float32, round to the storage dtype, store; then use the *rounded* value.
    h = _to_storage(x.to(tl.float32) + r.to(tl.float32), h_ptr)
    tl.store(h_ptr + row * h_row_stride + cols, h, mask=mask)
    hf = h.to(tl.float32)

    rstd = tl.rsqrt(tl.sum(hf * hf, axis=0) / N + eps)  # mean over the N real elements
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    if WEIGHT_OFFSET != 0.0:  # resolved at compile time: no add for Llama's norm
        w += WEIGHT_OFFSET  # in float32, after the load (Gemma's 1.0 + weight.float())
    y = hf * rstd * w  # rounded once, on the store
    tl.store(y_ptr + row * y_row_stride + cols, _to_storage(y, y_ptr), mask=mask)


@triton.jit
def _add_rmsnorm_multi_row_kernel(x_ptr, r_ptr, w_ptr, y_ptr, h_ptr, x_row_stride, r_row_stride, y_row_stride,
                                  h_row_stride, n_rows, N, eps, ROWS: tl.constexpr, BLOCK_N: tl.constexpr,
                                  WEIGHT_OFFSET: tl.constexpr):
    """``ROWS`` rows a program, as one [ROWS, BLOCK_N] block (``BLOCK_N``: the padded row)."""
    eps = tl.cast(eps, tl.float32)  # float32 math even where Inductor passes a Python float as fp64
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK_N)
    col_mask = cols < N
    mask = (rows < n_rows)[:, None] & col_mask[None, :]  # the last program may run past the end
    rows64 = rows.to(tl.int64)[:, None]

    x = tl.load(x_ptr + rows64 * x_row_stride + cols[None, :], mask=mask, other=0.0)
    r = tl.load(r_ptr + rows64 * r_row_stride + cols[None, :], mask=mask, other=0.0)
    h = _to_storage(x.to(tl.float32) + r.to(tl.float32), h_ptr)
    tl.store(h_ptr + rows64 * h_row_stride + cols[None, :], h, mask=mask)
    hf = h.to(tl.float32)

    # One rstd per row. Rows past the end are all zeros: rsqrt(eps) (or inf when eps = 0) is
    # computed for them, multiplied by zeros and never stored.
    rstd = tl.rsqrt(tl.sum(hf * hf, axis=1) / N + eps)
    w = tl.load(w_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)
    if WEIGHT_OFFSET != 0.0:
        w += WEIGHT_OFFSET
    y = hf * rstd[:, None] * w[None, :]
    tl.store(y_ptr + rows64 * y_row_stride + cols[None, :], _to_storage(y, y_ptr), mask=mask)


@triton.jit
def _add_rmsnorm_looped_kernel(x_ptr, r_ptr, w_ptr, y_ptr, h_ptr, x_row_stride, r_row_stride, y_row_stride,
                               h_row_stride, N, eps, BLOCK_N: tl.constexpr, NUM_STAGES: tl.constexpr,
                               WEIGHT_OFFSET: tl.constexpr):
    """One program a row, two passes over column blocks of ``BLOCK_N``, each loop pipelined
    ``NUM_STAGES`` deep (1: not at all)."""
    eps = tl.cast(eps, tl.float32)  # float32 math even where Inductor passes a Python float as fp64
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * x_row_stride
    r_row = r_ptr + row * r_row_stride
    y_row = y_ptr + row * y_row_stride
    h_row = h_ptr + row * h_row_stride
    cols = tl.arange(0, BLOCK_N)

    # Pass 1: h = round(x + residual), stored; per-lane float32 partial sums of h^2 (added up
    # once at the end: fewer cross-lane reductions, and a tree-shaped, more accurate sum).
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    for start in tl.range(0, N, BLOCK_N, num_stages=NUM_STAGES):
        offs = start + cols
        mask = offs < N
        x = tl.load(x_row + offs, mask=mask, other=0.0).to(tl.float32)
        r = tl.load(r_row + offs, mask=mask, other=0.0).to(tl.float32)
        h = _to_storage(x + r, h_ptr)
        tl.store(h_row + offs, h, mask=mask)
        hf = h.to(tl.float32)
        acc += hf * hf
    rstd = tl.rsqrt(tl.sum(acc, axis=0) / N + eps)
    # Pass 1's stores must be visible to whichever threads load h back below.
    tl.debug_barrier()

    # Pass 2: re-read the rounded h (now in L2), scale, multiply by the weight, store y.
    for start in tl.range(0, N, BLOCK_N, num_stages=NUM_STAGES):
        offs = start + cols
        mask = offs < N
        hf = tl.load(h_row + offs, mask=mask, other=0.0).to(tl.float32)
        w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        if WEIGHT_OFFSET != 0.0:
            w += WEIGHT_OFFSET
        tl.store(y_row + offs, _to_storage(hf * rstd * w, y_ptr), mask=mask)


@triton.jit
def _add_rmsnorm_persistent_kernel(x_ptr, r_ptr, w_ptr, y_ptr, h_ptr, x_row_stride, r_row_stride, y_row_stride,
                                   h_row_stride, n_rows, N, eps, BLOCK_N: tl.constexpr, NUM_STAGES: tl.constexpr,
                                   WEIGHT_OFFSET: tl.constexpr):
    """A fixed grid of programs walking rows ``pid, pid + programs, ...`` (whole rows of
    ``BLOCK_N``), the row loop pipelined ``NUM_STAGES`` deep; the weight is loaded once."""
    eps = tl.cast(eps, tl.float32)  # float32 math even where Inductor passes a Python float as fp64
    cols = tl.arange(0, BLOCK_N)
    mask = cols < N
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)  # once per program
    if WEIGHT_OFFSET != 0.0:
        w += WEIGHT_OFFSET
    for row in tl.range(tl.program_id(0), n_rows, tl.num_programs(0), num_stages=NUM_STAGES):
        row64 = tl.cast(row, tl.int64)  # (tl.cast: in the interpreter, row is a Python int)
        x = tl.load(x_ptr + row64 * x_row_stride + cols, mask=mask, other=0.0).to(tl.float32)
        r = tl.load(r_ptr + row64 * r_row_stride + cols, mask=mask, other=0.0).to(tl.float32)
        h = _to_storage(x + r, h_ptr)
        tl.store(h_ptr + row64 * h_row_stride + cols, h, mask=mask)
        hf = h.to(tl.float32)
        rstd = tl.rsqrt(tl.sum(hf * hf, axis=0) / N + eps)
        tl.store(y_ptr + row64 * y_row_stride + cols, _to_storage(hf * rstd * w, y_ptr), mask=mask)


@triton.jit
def _add_pieces(x_ptr, r_ptr, h_ptr, row_start, N, chunk, BLOCK_N: tl.constexpr, ALIGN: tl.constexpr,
                EVICT_X: tl.constexpr):
    """One chunk of a realigned row (``skeleton.row_pieces``): ``h = round(x + residual)``
    stored, and returned in float32 with the pieces' offsets and masks."""
    body, body_mask, edge, edge_mask = skeleton.row_pieces(row_start, N, chunk, BLOCK_N, ALIGN)
    x = tl.load(x_ptr + body, mask=body_mask, other=0.0, eviction_policy=EVICT_X)
    r = tl.load(r_ptr + body, mask=body_mask, other=0.0, eviction_policy=EVICT_X)
    h = _to_storage(x.to(tl.float32) + r.to(tl.float32), h_ptr)
    tl.store(h_ptr + body, h, mask=body_mask)
    x_edge = tl.load(x_ptr + edge, mask=edge_mask, other=0.0)
    r_edge = tl.load(r_ptr + edge, mask=edge_mask, other=0.0)
    h_edge = _to_storage(x_edge.to(tl.float32) + r_edge.to(tl.float32), h_ptr)
    tl.store(h_ptr + edge, h_edge, mask=edge_mask)
    return body, body_mask, h.to(tl.float32), edge, edge_mask, h_edge.to(tl.float32)


@triton.jit
def _store_normalised(y_ptr, w_ptr, hf, offsets, mask, row_start, rstd, WEIGHT_OFFSET: tl.constexpr):
    """y at ``offsets`` (one piece of a realigned row): ``h * rstd * (weight + offset)``."""
    y = _scaled(hf, w_ptr, offsets - row_start, mask, rstd, WEIGHT_OFFSET)
    tl.store(y_ptr + offsets, _to_storage(y, y_ptr), mask=mask)


@triton.jit
def _add_rmsnorm_aligned_row_kernel(x_ptr, r_ptr, w_ptr, y_ptr, h_ptr, N, eps, BLOCK_N: tl.constexpr,
                                    EVICT_X: tl.constexpr, WEIGHT_OFFSET: tl.constexpr, ALIGN: tl.constexpr):
    """whole_row on a row cut into an aligned body and a head and tail, so that the body's loads
    and stores are 16-byte vectors whatever the width."""
    eps = tl.cast(eps, tl.float32)  # float32 math even where Inductor passes a Python float as fp64
    row_start = tl.program_id(0).to(tl.int64) * N
    body, body_mask, hf, edge, edge_mask, hf_edge = _add_pieces(x_ptr, r_ptr, h_ptr, row_start, N, 0, BLOCK_N,
                                                                ALIGN, EVICT_X)
    rstd = tl.rsqrt((tl.sum(hf * hf, axis=0) + tl.sum(hf_edge * hf_edge, axis=0)) / N + eps)
    _store_normalised(y_ptr, w_ptr, hf, body, body_mask, row_start, rstd, WEIGHT_OFFSET)
    _store_normalised(y_ptr, w_ptr, hf_edge, edge, edge_mask, row_start, rstd, WEIGHT_OFFSET)


@triton.jit
def _add_rmsnorm_split_stats_kernel(x_ptr, r_ptr, h_ptr, partial_ptr, N, BLOCK_N: tl.constexpr, SPLITS: tl.constexpr,
                                    ALIGN: tl.constexpr):
    """split_row, first launch: h of one chunk of one row, stored, and its sum of squares, into
    ``partial`` ((rows, chunks) float32)."""
    row = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1)
    _, _, hf, _, _, hf_edge = _add_pieces(x_ptr, r_ptr, h_ptr, row * N, N, chunk, BLOCK_N, ALIGN, "")
    total = tl.sum(hf * hf, axis=0) + tl.sum(hf_edge * hf_edge, axis=0)
    tl.store(partial_ptr + row * tl.num_programs(1) + chunk, total)


@triton.jit
def _add_rmsnorm_split_apply_kernel(h_ptr, w_ptr, y_ptr, partial_ptr, N, eps, BLOCK_N: tl.constexpr,
                                    SPLITS: tl.constexpr, ALIGN: tl.constexpr, WEIGHT_OFFSET: tl.constexpr):
    """split_row, second launch: the row's rstd from its chunks' sums (one fixed order), then the
    chunk's y from the rounded h the first launch stored (one tensor re-read, as looped does)."""
    eps = tl.cast(eps, tl.float32)  # float32 math even where Inductor passes a Python float as fp64
    row = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1)
    chunks = tl.num_programs(1)
    lanes = tl.arange(0, SPLITS)
    sums = tl.load(partial_ptr + row * chunks + lanes, mask=lanes < chunks, other=0.0)
    rstd = tl.rsqrt(tl.sum(sums, axis=0) / N + eps)
    row_start = row * N
    body, body_mask, edge, edge_mask = skeleton.row_pieces(row_start, N, chunk, BLOCK_N, ALIGN)
    hf = tl.load(h_ptr + body, mask=body_mask, other=0.0).to(tl.float32)
    _store_normalised(y_ptr, w_ptr, hf, body, body_mask, row_start, rstd, WEIGHT_OFFSET)
    hf_edge = tl.load(h_ptr + edge, mask=edge_mask, other=0.0).to(tl.float32)
    _store_normalised(y_ptr, w_ptr, hf_edge, edge, edge_mask, row_start, rstd, WEIGHT_OFFSET)


# ---------------------------------------------------------------------------------------------
# Spaces (the launchers are the skeleton's: kernelsmith.ops._rowwise)
#
# The budgets are RMSNorm's; x and residual are in flight together (twice RMSNorm's values), and
# the persistent kernel keeps x, residual and the weight in registers.
# ---------------------------------------------------------------------------------------------


def _whole_row_space(spec: OpSpec) -> Space:
    return skeleton.whole_row_space(spec, skeleton.NORM_WARPS, in_flight=2)


def _multi_row_space(spec: OpSpec) -> Space:
    return skeleton.multi_row_space(spec, skeleton.NORM_WARPS, in_flight=2)


def _looped_space(spec: OpSpec) -> Space:
    return skeleton.looped_space(spec, skeleton.NORM_WARPS, in_flight=2)


def _persistent_space(spec: OpSpec) -> Space:
    return skeleton.persistent_space(spec, skeleton.NORM_WARPS, in_registers=3, pipelined=2)


def _aligned_row_space(spec: OpSpec) -> Space:
    return skeleton.aligned_row_space(spec, skeleton.NORM_WARPS, in_flight=2)


def _split_row_space(spec: OpSpec) -> Space:
    return skeleton.split_row_space(spec, skeleton.NORM_WARPS, in_flight=2)


def _variant(name: str, summary: str, space: Callable[[OpSpec], Space], kernel: Any, pipelined: bool = False,
             strides: int = 4) -> Variant:
    # Four row-strided tensors (x, residual, y, h). The kernels call RMSNorm's jitted row math, so
    # its module is in the hash too.
    return norm_variant(__name__, name, summary, space, kernel, strides, pipelined, uses=("kernelsmith.ops.rmsnorm",))


def _split_stats_tensors(inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor],
                         partial: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return inputs[0], inputs[1], outputs[1], partial  # x, residual, h (written), the chunks' sums


def _split_apply_tensors(inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor],
                         partial: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return outputs[1], inputs[2], outputs[0], partial  # h (read back), the weight, y, the chunks' sums


# ---------------------------------------------------------------------------------------------
# The op family (its specs are every RMSNorm family's: kernelsmith.ops.rmsnorm.RMSNormLike)
# ---------------------------------------------------------------------------------------------


class AddRMSNorm(RMSNormLike):
    name = "add_rmsnorm"
    summary = "residual add then RMSNorm (a Llama decoder layer's h = residual + x; y = rmsnorm(h) * weight)"
    shape_help = (
        "the shape of x and of residual, e.g. 8192x4096 for x and residual of shape (8192, 4096) "
        "(rows x hidden size); weight has the last size, (4096,); more leading sizes are allowed "
        "(2x1024x4096). Outputs: y (the normalised sum) and h (the sum), both shaped like x"
    )
    input_names = ("x", "residual", "weight")
    backward = "add_rmsnorm_backward"  # takes the saved sum h, not (x, residual): see backward_inputs
    rowwise = True  # configs depend on the row width only: calls are bucketed by row count
    row_block = max(skeleton.ROWS_PER_PROGRAM)
    distributions = ("normal", "large", "small", "outliers")  # the tolerance: the default
    variants = (
        _variant("whole_row", "one program per row, the whole row in registers",
                 _whole_row_space, _add_rmsnorm_whole_row_kernel),
        _variant("multi_row", "ROWS rows per program as a 2D block, for narrow rows",
                 _multi_row_space, _add_rmsnorm_multi_row_kernel),
        _variant("looped", "one program per row in column blocks: add, store h, sum squares; then re-read h",
                 _looped_space, _add_rmsnorm_looped_kernel, pipelined=True),
        _variant("persistent", "PROGRAMS_PER_SM programs per SM walk the rows, weight loaded once",
                 _persistent_space, _add_rmsnorm_persistent_kernel, pipelined=True),
        _variant("aligned_row", "whole_row with each row's 16-byte-aligned body apart from its head and tail, "
                 "for widths whose rows Triton cannot prove aligned", _aligned_row_space,
                 _add_rmsnorm_aligned_row_kernel, strides=0),
        # split_row's build is RMSNorm's (and its kernels run rmsnorm's _scaled): that module is in the hash.
        split_row_variant(__name__, "(row, chunk) programs: h stored and chunk sums of squares, then each chunk's "
                          "y from h; for wide rows and few rows", _split_row_space,
                          (_add_rmsnorm_split_stats_kernel, _split_stats_tensors),
                          (_add_rmsnorm_split_apply_kernel, _split_apply_tensors)),
    )

    def output_specs(self, spec: OpSpec) -> tuple[TensorSpec, ...]:
        """(y, h): both shaped like x, in x's dtype."""
        x = spec.inputs[0]
        return (TensorSpec(x.shape, x.dtype), TensorSpec(x.shape, x.dtype))

    # ---- autograd: the backward takes the saved sum h, not (x, residual) -------------------------
    def backward_inputs(self, grad_outputs: Sequence[torch.Tensor], inputs: Sequence[torch.Tensor],
                        outputs: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        """``(dy, dh, h, weight)``: the gradients of both outputs, the saved sum and the weight."""
        dy, dh = grad_outputs
        return (dy, dh, outputs[1], inputs[2])

    def input_gradients(self, grads: Sequence[torch.Tensor], inputs: Sequence[torch.Tensor]
                        ) -> tuple[torch.Tensor | None, ...]:
        """``h = x + residual``: both addends receive the same gradient, ``dsum``."""
        dsum, dw = grads
        return (dsum, dsum, dw)

    # ---- math --------------------------------------------------------------------------------
    def reference(self, spec: OpSpec, inputs: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        """A Hugging Face Llama decoder layer's residual add, then LlamaRMSNorm of the sum, verbatim
        in substance (RMSNorm's reference); with a weight offset, Gemma's (float32, rounded once)."""
        x, residual, weight = inputs
        h = residual + x  # in the input dtype: rounded
        return (*_RMSNORM.reference(spec, (h, weight)), h)

    def reference_fp64(self, spec: OpSpec, inputs: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        """RMSNorm's float64 math, after ``h`` is formed (rounded) in the input dtype as models do:
        the rounding of ``h`` is part of the op, not an error of it (see the module docstring)."""
        x, residual, weight = inputs
        h = residual + x
        return (*_RMSNORM.reference_fp64(spec, (h, weight)), h.double())

    def make_inputs(
        self,
        spec: OpSpec,
        seed: int,
        distribution: str = "normal",
        device: str | torch.device = "cuda",
    ) -> tuple[torch.Tensor, ...]:
        """(x, residual, weight) for ``distribution``, deterministic in ``seed``.

        x and residual are drawn independently at the same scale (so that h = x + residual
        differs from either, and neither term is negligible), weight = 1 + 0.5 * N(0, 1) less
        the spec's weight offset (the weight rows are scaled by is drawn alike either way):

        - normal: N(0, 1);
        - large: 100 * N(0, 1): squares of h reach 1e5 to 1e7, past float16's range, so only a
          kernel that squares in float32 gets them right;
        - small: 1e-3 * N(0, 1): mean(h^2) is about 2e-6, the size of eps, so eps must be added
          in the right place;
        - outliers: N(0, 1) with about 0.1% of x's elements times 50, and the residual's
          "massive activation" channels: about 0.2% of the columns (the same in every row)
          times 50, as in the residual streams of real language models.
        """
        x_spec, r_spec, w_spec = spec.inputs
        g = generator(seed, device)

        def randn(shape: tuple[int, ...]) -> torch.Tensor:
            return torch.randn(shape, generator=g, device=device, dtype=torch.float32)

        if distribution == "normal":
            x, r = randn(x_spec.shape), randn(r_spec.shape)
        elif distribution == "large":
            x, r = randn(x_spec.shape) * 100, randn(r_spec.shape) * 100
        elif distribution == "small":
            x, r = randn(x_spec.shape) * 1e-3, randn(r_spec.shape) * 1e-3
        elif distribution == "outliers":
            x, r = randn(x_spec.shape), randn(r_spec.shape)
            picked = torch.rand(x_spec.shape, generator=g, device=device) < 1e-3
            x = torch.where(picked, x * 50, x)
            channels = torch.rand(r_spec.shape[-1:], generator=g, device=device) < 2e-3
            r = torch.where(channels, r * 50, r)
        else:
            raise ValueError(f"add_rmsnorm: unknown distribution {distribution!r} "
                             f"(known: {', '.join(self.distributions)})")
        weight = 1 + 0.5 * randn(w_spec.shape) - weight_offset_of(spec)
        return x.to(x_spec.torch_dtype), r.to(r_spec.torch_dtype), weight.to(w_spec.torch_dtype)

    def flops(self, spec: OpSpec) -> int:
        # Per element: the add, square, add to the sum, multiply by rstd, multiply by the weight.
        return 5 * spec.inputs[0].numel


OP = AddRMSNorm()

"""The skeleton the row-wise families share: who owns which rows, the config spaces, the launcher.

A row-wise op computes every row of the last dimension on its own (RMSNorm, residual-add +
RMSNorm, softmax, the row reductions...). Its kernels differ in their math, and in nothing else
than *how rows are assigned to programs*, which is one of four schedules:

``whole_row``
    One program per row; the whole row, padded to a power of two (``BLOCK_N``), sits in
    registers: loaded once, reduced, mapped, stored. Rows up to :data:`MAX_WHOLE_ROW`.
``multi_row``
    One program per ``ROWS`` consecutive rows, as one ``[ROWS, BLOCK_N]`` block reduced along its
    columns: narrow rows give a one-row program too little work to hide memory latency. The last
    program masks the rows past the end.
``looped``
    One program per row, walked in column blocks of ``BLOCK_N`` (two passes: reduce, then map):
    any width in a fixed register footprint, and a loop the compiler can pipeline (``num_stages``).
``persistent``
    A fixed grid of ``PROGRAMS_PER_SM`` programs per multiprocessor, each walking rows ``pid,
    pid + programs, ...``: the weight (if any) is loaded once, program start-up is paid once, and
    the next row's load can be pipelined under the current row's math.

A family writes its kernels (its math, the part worth reading) and this module writes the rest
once: the spaces of each schedule and their constraints (:func:`whole_row_space` ...), the grid
and the launcher (:func:`launcher`), and the variants (:func:`variant`), whose source hash covers
both the family's module and this one (``Variant.modules``); also the checks the norms' specs
share (:func:`command_line_shape`, :func:`check_rows_and_weight`) and, for the backward families,
the spaces of the two schedules of a backward with parameter gradients (the last section; their
launchers and fixed-order sum are :mod:`kernelsmith.ops._rowwise_backward`'s). The kernels
themselves stay in the family files: a kernel's schedule is its first few lines (which rows,
which columns, which mask), its tensors and scalars differ from family to family, and a kernel
written out whole keeps the exact loads, stores and constexprs that were measured, where a
generic kernel calling the family's math would need one signature for all.

Kernel conventions (what :func:`launcher` passes). A family's kernel takes, in order: its input
tensors, its output tensors, the row stride of each of its ``strides`` row-strided tensors (every
one ``N``: the families refuse non-contiguous tensors, so row ``r`` starts at element ``r * N``,
and the launcher passes the tensors as they are, without a view per call), ``n_rows`` when the
schedule has programs owning several rows (``multi_row``, ``persistent``), ``N``, then the
family's own scalars (``eps``...). Its constexprs are ``BLOCK_N`` (the config's, or the padded
row), ``ROWS`` and ``EVICT_X`` when the config has them, ``NUM_STAGES`` when the kernel gives the
pipelining depth on ``tl.range`` itself, and any the family adds. Kernels address rows in 64-bit
integers (``tl.program_id(0).to(tl.int64)``, or a 64-bit loop counter), so that tensors of more
than 2**31 elements are addressed correctly, and mask every load and store.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import triton
import triton.language as tl

from kernelsmith.ops._base import Launcher, OpFamily, UnsupportedWorkload, Variant, rows_and_width
from kernelsmith.ops._launch import direct_launch
from kernelsmith.space import Config, Constraint, Param, Space, next_power_of_two, powers_of_two
from kernelsmith.spec import OpSpec

# ---- the choices every schedule draws from ------------------------------------------------------------
WARPS = (1, 2, 4, 8, 16, 32)
STAGES = (1, 2, 3)  # software-pipelining depths, for kernels with a loop
# For a loop-free kernel num_stages would change nothing; a family that has always listed it
# (so that its stored config keys hold it) offers this single value.
NO_LOOP_STAGES = (1,)
# Cache hint for read-once activations: "" (the default policy) or "evict_first" (leaves L2 to
# the weight). Which is faster depends on the device: a search parameter.
EVICTION = ("", "evict_first")
ROWS_PER_PROGRAM = (2, 4, 8, 16, 32)  # multi_row's ROWS
LOOPED_BLOCKS = powers_of_two(64, 8192)  # looped's BLOCK_N
PROGRAMS_PER_SM = (1, 2, 4, 8)  # persistent's programs per multiprocessor

# ---- the budgets ------------------------------------------------------------------------------------
# The widest row the register-resident schedules accept: at 32 warps (1024 threads) a row of
# 65536 float32 values is 64 registers a thread, about the most that does not spill.
MAX_WHOLE_ROW = 65536
# The most elements one multi_row block holds (ROWS * BLOCK_N): 16 values a thread at 32 warps.
MAX_MULTI_ROW_BLOCK = 16384
MAX_WARPS_PER_SM = 64  # resident warps a multiprocessor holds (Hopper, Ampere)
REGISTERS_PER_SM = 65536  # 32-bit registers a multiprocessor holds
# Shared memory for software-pipelined loads, per multiprocessor (Hopper has 227 KiB a block;
# the rest is left for the reduction's scratch).
PIPELINE_SHARED_BYTES = 192 * 1024
# Without a GPU (the interpreter) any program count is correct; a small one keeps the persistent
# grid-stride loop exercised by tests with a few dozen rows.
INTERPRETER_MULTIPROCESSORS = 4


@dataclass(frozen=True)
class Warps:
    """Which warp counts suit a block of ``lanes`` columns holding ``held`` float32 values in
    registers (``held = lanes`` unless a kernel keeps more): one family's register rule.

    No more threads than lanes (idle warps only add scheduling cost), except that counts up to
    ``always`` are allowed whatever the block, so that the tiniest rows keep a choice; and at most
    ``per_thread`` values a thread, beyond which registers spill to local memory (and, for a sum,
    the sequential part of each thread's reduction grows, which is where float32 loses accuracy).
    With ``register_share``, a thread's values are also bounded by its share of a multiprocessor's
    registers (see :meth:`values_per_thread`).
    """

    per_thread: int
    always: int
    register_share: bool = False

    def values_per_thread(self, num_warps: int) -> int:
        """The most values a thread may hold at ``num_warps`` warps. With ``register_share``: a
        multiprocessor has 65536 32-bit registers, so a thread of a program of ``32 * num_warps``
        threads gets at most ``65536 / (32 * num_warps)`` of them (never more than 255); compiled
        for sm_90, the kernels take about 2.5 registers per float32 value plus some fixed
        overhead, so a quarter of that share is the bound: 64 up to 8 warps, 32 at 16, 16 at 32."""
        if not self.register_share:
            return self.per_thread
        share = min(256, REGISTERS_PER_SM // (32 * num_warps))
        return min(self.per_thread, share // 4)

    def fit(self, lanes: int, num_warps: int, held: int | None = None) -> bool:
        threads = 32 * num_warps
        values = lanes if held is None else held
        return (num_warps <= self.always or threads <= lanes) and values <= threads * self.values_per_thread(num_warps)

    def constraint(self, what: str, lanes: Callable[[Config], int],
                   held: Callable[[Config], int] | None = None) -> Constraint:
        """``num_warps`` must suit the ``lanes(config)`` columns (holding ``held(config)`` values)
        described by ``what``."""
        values = held or lanes
        return Constraint(f"num_warps must suit {what} (no idle warps, no spilled registers)",
                          lambda c: self.fit(lanes(c), c["num_warps"], values(c)))


# The rules in use: the RMSNorms' (values a thread up to 128, 1 or 2 warps always allowed), the
# reductions' (at most 64 values a thread, which also bounds a sum's sequential part) and
# LayerNorm's (the reductions', within each thread's register share: measured with
# triton.compile for sm_90, a 65536-wide row at 32 warps, 64 values a thread, spills 536 bytes a
# thread; 32768 at 16 warps spills 472; 16384 at 32 warps, 16 values, takes 51 registers and does
# not spill).
NORM_WARPS = Warps(per_thread=128, always=2)
REDUCTION_WARPS = Warps(per_thread=64, always=1)
LAYERNORM_WARPS = Warps(per_thread=64, always=1, register_share=True)


# ---- the spaces of the four schedules ------------------------------------------------------------------
def _padded_row(spec: OpSpec) -> int:
    return next_power_of_two(rows_and_width(spec)[1])


def _row_fits(block_n: int, max_row: int) -> Constraint:
    return Constraint(f"the whole row must fit: BLOCK_N <= {max_row}", lambda c: block_n <= max_row)


def whole_row_space(spec: OpSpec, warps: Warps, in_flight: int = 1, stages: tuple[int, ...] = (),
                    max_row: int = MAX_WHOLE_ROW) -> Space:
    """``num_warps`` (and ``num_stages`` from ``stages``, when given), ``EVICT_X``; ``in_flight``
    padded rows are in registers at once (x and a residual: 2), of at most ``max_row`` elements."""
    block_n = _padded_row(spec)
    stage_param = [Param("num_stages", stages)] if stages else []
    return Space(
        [Param("num_warps", WARPS), *stage_param, Param("EVICT_X", EVICTION)],
        [_row_fits(block_n, max_row),
         warps.constraint(f"{in_flight} row(s) of BLOCK_N elements", lambda c: in_flight * block_n)],
    )


def multi_row_space(spec: OpSpec, warps: Warps, in_flight: int = 1, stages: tuple[int, ...] = (),
                    rows: tuple[int, ...] = ROWS_PER_PROGRAM, extra: Sequence[Constraint] = ()) -> Space:
    """``ROWS`` rows per program, ``num_warps`` (and ``num_stages`` from ``stages``, when given);
    ``in_flight`` blocks of ``[ROWS, BLOCK_N]`` are in registers at once; ``extra``: a family's
    own bounds on the block."""
    block_n = _padded_row(spec)
    stage_param = [Param("num_stages", stages)] if stages else []
    return Space(
        [Param("ROWS", rows), Param("num_warps", WARPS), *stage_param],
        [Constraint(f"the block must fit: ROWS * BLOCK_N <= {MAX_MULTI_ROW_BLOCK}",
                    lambda c: c["ROWS"] * block_n <= MAX_MULTI_ROW_BLOCK),
         *extra,
         warps.constraint(f"{in_flight} block(s) of ROWS * BLOCK_N elements",
                          lambda c: in_flight * c["ROWS"] * block_n)],
    )


def looped_space(spec: OpSpec, warps: Warps, in_flight: int = 1, whole_row_block: bool = False,
                 held: Callable[[Config], int] | None = None) -> Space:
    """``BLOCK_N`` columns a step, ``num_warps``, ``num_stages``; ``in_flight`` blocks at once
    (holding ``held(config)`` values in registers, when a kernel keeps more than the blocks).

    A block as wide as the padded row is whole_row with a loop around it, so blocks are narrower
    than the row, unless ``whole_row_block`` (softmax's online loop, whose one step is not its
    whole_row kernel: a block may be as wide as the padded row); the smallest block is always
    allowed, so that the space is never empty for narrow rows.
    """
    full = _padded_row(spec)
    smallest = LOOPED_BLOCKS[0]
    if whole_row_block:
        widest = max(smallest, full)
        narrow = Constraint("BLOCK_N is no wider than the padded row", lambda c: c["BLOCK_N"] <= widest)
    else:
        narrow = Constraint("BLOCK_N must be narrower than the row (or the smallest block)",
                            lambda c: c["BLOCK_N"] < full or c["BLOCK_N"] == smallest)
    return Space(
        [Param("BLOCK_N", LOOPED_BLOCKS), Param("num_warps", WARPS), Param("num_stages", STAGES)],
        [narrow,
         warps.constraint(f"{in_flight} block(s) of BLOCK_N elements", lambda c: in_flight * c["BLOCK_N"], held)],
    )


def persistent_space(spec: OpSpec, warps: Warps, in_registers: int, pipelined: int = 0,
                     max_row: int = MAX_WHOLE_ROW, held: int | None = None) -> Space:
    """``PROGRAMS_PER_SM``, ``num_warps``, ``num_stages``; ``in_registers`` padded rows (of at most
    ``max_row`` elements) stay in registers (the row, its residual, the weight...), or ``held``
    values where a family measured what its kernel keeps.

    ``pipelined`` rows of the input dtype are loaded per step of the row loop: with ``num_stages
    = s`` the compiler keeps ``s - 1`` steps of them in flight in shared memory, for each of the
    programs sharing a multiprocessor, which must fit, and those programs must all be resident.
    ``pipelined = 0`` leaves both bounds out (a family whose kernel gives the depth only as a launch
    option).
    """
    block_n = _padded_row(spec)
    row_bytes = block_n * spec.inputs[0].torch_dtype.itemsize
    bounds = []
    if pipelined:
        bounds = [
            Constraint(f"the programs of a multiprocessor are all resident ({MAX_WARPS_PER_SM} warps)",
                       lambda c: c["PROGRAMS_PER_SM"] * c["num_warps"] <= MAX_WARPS_PER_SM),
            Constraint(f"the rows in flight fit in shared memory ({PIPELINE_SHARED_BYTES} bytes an SM)",
                       lambda c: c["PROGRAMS_PER_SM"] * (c["num_stages"] - 1) * pipelined * row_bytes
                       <= PIPELINE_SHARED_BYTES),
        ]
    return Space(
        [Param("PROGRAMS_PER_SM", PROGRAMS_PER_SM), Param("num_warps", WARPS), Param("num_stages", STAGES)],
        [_row_fits(block_n, max_row), *bounds,
         warps.constraint(f"{in_registers} row(s) of BLOCK_N elements", lambda c: in_registers * block_n,
                          None if held is None else (lambda c: held))],
    )


# ---- grids and the launcher ------------------------------------------------------------------------------
@functools.cache
def _multiprocessor_count(device_index: int) -> int:
    return int(torch.cuda.get_device_properties(device_index).multi_processor_count)


def programs(per_multiprocessor: int) -> int:
    """``per_multiprocessor`` programs for each multiprocessor of the current GPU (of a small
    stand-in without one: see :data:`INTERPRETER_MULTIPROCESSORS`)."""
    if torch.cuda.is_available():
        return per_multiprocessor * _multiprocessor_count(torch.cuda.current_device())
    return per_multiprocessor * INTERPRETER_MULTIPROCESSORS


def checked(op: str, space: Space, config: Config) -> None:
    """ValueError unless ``config`` is in ``space``: a build outside its space is a caller's bug."""
    problems = space.violations(config)
    if problems:
        raise ValueError(f"{op}: config {config.key} is not in the space: {'; '.join(problems)}")


def grid(rows: int, config: Config) -> tuple[tuple[int], bool]:
    """The grid of a schedule, told by its config's parameters, and whether its programs own
    several rows (so that the kernel takes ``n_rows`` to mask or stop at)."""
    if "ROWS" in config:  # multi_row
        return (triton.cdiv(rows, int(config["ROWS"])),), True
    if "PROGRAMS_PER_SM" in config:  # persistent
        return (min(rows, programs(int(config["PROGRAMS_PER_SM"]))),), True
    return (rows,), False  # whole_row, looped: one program a row


Operands = Callable[[Sequence[torch.Tensor], Sequence[torch.Tensor]], Sequence[torch.Tensor]]


def launcher(kernel: Any, spec: OpSpec, config: Config, strides: int, scalars: tuple[Any, ...] = (),
             pipelined: bool = False, operands: Operands | None = None, **constexprs: Any) -> Launcher:
    """The launcher of one of a family's kernels at ``config`` (see the module docstring for the
    arguments a kernel takes). ``pipelined``: the kernel takes ``NUM_STAGES`` (the depth it gives
    ``tl.range``); ``operands(inputs, outputs)``: the tensors the kernel takes, where they are not
    the inputs then the outputs (placeholders for optional ones: views only); ``constexprs``: the
    family's own.

    Everything is worked out here, once; the launcher only launches into the caller's outputs.
    """
    rows, n = rows_and_width(spec)
    shape, several_rows = grid(rows, config)
    args = (*(n,) * strides, *((rows,) if several_rows else ()), n, *scalars)
    meta = dict(constexprs)
    meta["BLOCK_N"] = int(config["BLOCK_N"]) if "BLOCK_N" in config else next_power_of_two(n)
    if "ROWS" in config:
        meta["ROWS"] = int(config["ROWS"])
    if "EVICT_X" in config:
        meta["EVICT_X"] = str(config["EVICT_X"])
    meta["num_warps"] = int(config["num_warps"])
    if "num_stages" in config:
        meta["num_stages"] = int(config["num_stages"])
        if pipelined:
            meta["NUM_STAGES"] = int(config["num_stages"])
    run = direct_launch(kernel, shape)
    if operands is not None:
        tensors = operands

        def launch_operands(inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> None:
            run(*tensors(inputs, outputs), *args, **meta)

        return launch_operands

    def launch(inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> None:
        run(*inputs, *outputs, *args, **meta)

    return launch


# ---- variants ----------------------------------------------------------------------------------------
def variant(module: str, name: str, summary: str, space: Callable[[OpSpec], Space], kernel: Any,
            strides: int, scalars: Callable[[OpSpec], tuple[Any, ...]] = lambda spec: (),
            pipelined: bool = False, constexprs_of: Callable[[OpSpec], dict[str, Any]] | None = None,
            uses: tuple[str, ...] = (), **constexprs: Any) -> Variant:
    """A variant of the family in ``module`` running ``kernel`` over the configs of ``space``;
    ``scalars(spec)`` are the kernel's own scalar arguments after ``N`` (see :func:`launcher`);
    ``constexprs`` the family's constexprs of every workload, ``constexprs_of(spec)`` those that
    depend on the workload (a weight offset, ``ALIGN``). Its source hash covers this module (its
    build's), the family's and ``uses``: other modules whose jitted code the family's kernels call."""
    op = module.rsplit(".", 1)[-1]

    def build(spec: OpSpec, config: Config) -> Launcher:
        checked(op, space(spec), config)
        own = constexprs_of(spec) if constexprs_of is not None else {}
        return launcher(kernel, spec, config, strides, scalars(spec), pipelined, **constexprs, **own)

    return Variant(name, summary, space, build, modules=(module, *uses))


def command_line_shape(op: str, shape: Sequence[Any], constants: dict[str, Any], what: str = "x") -> tuple[int, ...]:
    """A ``--shape`` as integers, for a family's ``spec``: UnsupportedWorkload for constants it
    does not know (``constants``, what is left of its keyword arguments) or a shape of ``what``
    that is empty or not positive."""
    if constants:
        raise UnsupportedWorkload(f"{op}: unknown constants {sorted(constants)}")
    sizes = tuple(int(s) for s in shape)
    if not sizes or any(s <= 0 for s in sizes):
        raise UnsupportedWorkload(f"{op}: {what} must have a positive shape, not {sizes}")
    return sizes


def check_rows_and_weight(family: OpFamily, spec: OpSpec, names: tuple[str, ...]) -> None:
    """UnsupportedWorkload unless ``spec``'s inputs are ``names``: activations of one shape, then
    a weight of their last size, all of one dtype (and what :meth:`OpFamily.check_supported`
    asks of every input). The check of an RMSNorm-like family with a weight."""
    if len(spec.inputs) != len(names):
        raise UnsupportedWorkload(f"{family.name} takes ({', '.join(names)}), not {len(spec.inputs)} inputs")
    OpFamily.check_supported(family, spec)
    *rows, weight = spec.inputs
    if any(t.shape != rows[0].shape for t in rows) or weight.shape != rows[0].shape[-1:]:
        raise UnsupportedWorkload(f"{family.name}: inconsistent shapes {spec.describe()}")
    if len({t.dtype for t in spec.inputs}) != 1:
        raise UnsupportedWorkload(f"{family.name}: mixed dtypes {spec.describe()}")


def eps_of(spec: OpSpec) -> tuple[float]:
    """The scalars of a normalisation's kernels: its ``eps``."""
    return (float(spec.const("eps")),)


# ---- rows that start at unaligned addresses, and rows split across programs ------------------------------
#
# Why rows need realigning. Row ``r`` of a contiguous ``(rows, N)`` tensor starts at element ``r *
# N``. Triton proves a load 16-byte aligned, and then issues one vector load for every 16 bytes,
# only when it can see that every row start is: it knows the tensor's base address is (it
# specializes pointers on that), and ``r * N`` is a multiple of 16 elements when ``N`` is (it
# specializes integers on that too). For any other width it issues one load per element, and
# when ``N * itemsize`` is not a multiple of 16 bytes the rows really are misaligned: measured on
# the H200, rows of a vocabulary-sized width that is not a multiple of 8 reach 36-48% of copy
# bandwidth (every peer too).
#
# The choice here: each row is cut, by *absolute* element index, into three pieces. The body
# starts at the row's first element whose address is a multiple of 16 bytes (its index rounded up
# to a multiple of ``ALIGN = 16 / itemsize``) and holds a multiple of ``ALIGN`` elements; the
# compiler is told both (``tl.multiple_of`` on its start and its length, ``tl.max_contiguous`` on
# its offsets), so that the body's address and its mask ``lanes < length`` are each constant over
# groups of ``ALIGN`` lanes, and its loads and stores are 16-byte vectors. The at most ``ALIGN -
# 1`` elements before the body (the head) and after it (the tail) go in one ``2 * ALIGN``-lane
# masked access: two short scalar pieces a row, which cost a few instructions and no bandwidth.
# The other way, loading the aligned 16-byte words that cover the row and shifting them into place
# through shared memory, costs a shared-memory round trip for every element, and Triton has no
# portable register shuffle to do it in registers; the pieces cost two masked loads.
#
# A weight (indexed by column, ``offset - row_start``) is not realigned: the body's first column
# differs from row to row, but every row reads the same weight from L1/L2, not DRAM.
#
# ``aligned_row`` (the whole row in registers, realigned) is pruned where Triton already proves
# alignment (``N`` a multiple of 16): there it is ``whole_row`` with two empty pieces.
#
# ``split_row``: a row cut into chunks of ``BLOCK_N`` body elements (the first chunk also takes the
# head and tail), one program per (row, chunk), and two launches: the first reduces each chunk to
# a few float32 statistics in a ``(rows, chunks, stats)`` scratch buffer, the second combines the
# row's statistics (always in the same order: deterministic) and maps its chunk again. For rows
# too wide for one program's registers (RMSNorm tens of thousands wide), and for small workloads
# of wide rows, where one program per row leaves multiprocessors idle (8 rows of 32000 are 8
# programs for 132 SMs; split in chunks of 2048, 128). The second launch reads x again: from L2
# for the workloads it is for (tens of MB), from DRAM for big ones, where the search prefers the
# others. No atomics and no waiting between programs, so any grid is safe, and both launches are
# CUDA-graph capturable (the scratch buffer is allocated through the caching allocator).
#
# Kernel conventions of ``split_row`` (what :func:`split_row_launcher` passes): a grid of ``(rows,
# chunks)``; the tensors each :class:`SplitKernel` names, then ``N``, then its scalars; the
# constexprs ``BLOCK_N`` (body elements a chunk), ``SPLITS`` (the chunk count padded to a power of
# two: the second kernel loads a row's statistics as one block), ``ALIGN`` and the family's own.
#
# split_row is offered for rows of more than SPLIT_MIN_ROW_BYTES only. A row of at most 8 KB
# (4096 bfloat16 values) is what one program of the other schedules streams well, and cutting it
# makes programs of a few KB that pay a second launch and a second read for it; the search
# spaces recorded on the H200 (tests/data/spaces: 1024- and 4096-wide rows) are also the
# current candidate sets only while these rows have no split_row configs. Lowering the bound
# (few rows of a usual hidden size, where the split would fill more SMs) means re-recording them
# with benchmarks/record_space.py.
SPLIT_BLOCKS = powers_of_two(64, 8192)  # split_row's BLOCK_N
MAX_SPLITS = 1024  # chunks a row: the second kernel holds a row's statistics in registers
SPLIT_MIN_ROW_BYTES = 8192


def alignment(spec: OpSpec) -> int:
    """``ALIGN``: elements of the first input's dtype in 16 bytes."""
    return max(1, 16 // spec.inputs[0].torch_dtype.itemsize)


def _alignment_unproven(spec: OpSpec) -> Constraint:
    n = rows_and_width(spec)[1]
    return Constraint("N must not be a multiple of 16 (Triton proves those rows aligned: whole_row is this kernel)",
                      lambda c: n % 16 != 0)


@triton.jit
def row_pieces(row_start, N, chunk, BLOCK_N: tl.constexpr, ALIGN: tl.constexpr):
    """The element offsets (absolute: add them to a tensor's base pointer) of chunk ``chunk`` of
    the row of ``N`` elements starting at element ``row_start`` (64-bit), cut as the section above
    says: ``(body, body_mask, edge, edge_mask)``. ``body``: ``BLOCK_N`` lanes, the body's elements
    ``chunk * BLOCK_N`` on (aligned, hinted); ``edge``: ``2 * ALIGN`` lanes, the head then the
    tail, masked off except in chunk 0. Every element of the row is in exactly one unmasked lane
    of the row's chunks, when they are ``cdiv(N, BLOCK_N)`` (the body is at most N long)."""
    to_aligned = (ALIGN - row_start % ALIGN) % ALIGN  # elements before the first aligned one
    head = tl.minimum(to_aligned, N)  # (a row shorter than that is all head)
    body_len = tl.multiple_of(tl.maximum(N - to_aligned, 0) // ALIGN * ALIGN, ALIGN)
    first = chunk * BLOCK_N  # the chunk's first body element
    lanes = tl.arange(0, BLOCK_N)
    # Aligned even where the body is empty: the hint is true of every program.
    body_start = tl.multiple_of(row_start + to_aligned + first, ALIGN)
    body = tl.max_contiguous(tl.multiple_of(body_start + lanes, ALIGN), BLOCK_N)
    body_mask = lanes < body_len - first
    edge_lanes = tl.arange(0, 2 * ALIGN)
    in_tail = edge_lanes >= ALIGN
    tail_start = row_start + head + body_len
    edge = tl.where(in_tail, tail_start + edge_lanes - ALIGN, row_start + edge_lanes)
    edge_mask = tl.where(in_tail, edge_lanes - ALIGN < N - head - body_len, edge_lanes < head)
    # Only chunk 0 takes the edge (a comparison of lanes: the interpreter turns `mask & scalar`
    # into integers, which it then refuses as a mask).
    edge_mask = edge_mask & (edge_lanes < tl.where(chunk == 0, 2 * ALIGN, 0))
    return body, body_mask, edge, edge_mask


@triton.jit
def split_partials(partial_ptr, STATS: tl.constexpr, SPLITS: tl.constexpr):
    """Where a split_row second-launch program stands: (its row, int64; its chunk; the addresses of
    the row's chunks' STATS statistics in the (rows, chunks, STATS) float32 partials, one per lane of
    SPLITS; which lanes are real chunks: SPLITS is the chunk count rounded up to a power of two)."""
    row = tl.program_id(0).to(tl.int64)
    chunks = tl.num_programs(1)
    lanes = tl.arange(0, SPLITS)
    return row, tl.program_id(1), partial_ptr + (row * chunks + lanes) * STATS, lanes < chunks


def aligned_row_space(spec: OpSpec, warps: Warps, in_flight: int = 1, stages: tuple[int, ...] = (),
                      max_row: int = MAX_WHOLE_ROW) -> Space:
    """:func:`whole_row_space` for rows whose alignment Triton cannot prove (empty for the others:
    see the section above)."""
    space = whole_row_space(spec, warps, in_flight, stages, max_row)
    return Space(space.params, [_alignment_unproven(spec), *space.constraints])


def split_row_space(spec: OpSpec, warps: Warps, in_flight: int = 1) -> Space:
    """``BLOCK_N`` body elements a chunk (``in_flight`` chunk-sized blocks in registers at once),
    ``num_warps``: two to :data:`MAX_SPLITS` chunks a row, for rows of more than
    :data:`SPLIT_MIN_ROW_BYTES` (empty for the others: see the section above)."""
    n = rows_and_width(spec)[1]
    row_bytes = n * spec.inputs[0].torch_dtype.itemsize
    return Space(
        [Param("BLOCK_N", SPLIT_BLOCKS), Param("num_warps", WARPS)],
        [Constraint(f"rows of more than {SPLIT_MIN_ROW_BYTES} bytes", lambda c: row_bytes > SPLIT_MIN_ROW_BYTES),
         Constraint("a row is split in at least two chunks", lambda c: c["BLOCK_N"] < n),
         Constraint(f"a row has at most {MAX_SPLITS} chunks", lambda c: triton.cdiv(n, c["BLOCK_N"]) <= MAX_SPLITS),
         warps.constraint(f"{in_flight} chunk(s) of BLOCK_N elements", lambda c: in_flight * c["BLOCK_N"])],
    )


SplitTensors = Callable[[Sequence[torch.Tensor], Sequence[torch.Tensor], torch.Tensor], Sequence[torch.Tensor]]


@dataclass(frozen=True)
class SplitKernel:
    """One of split_row's two kernels: ``tensors(inputs, outputs, partial)`` are its tensor
    arguments (``partial`` the float32 scratch of statistics), ``scalars`` follow ``N``,
    ``constexprs`` are the family's own."""

    kernel: Any
    tensors: SplitTensors
    scalars: tuple[Any, ...] = ()
    constexprs: tuple[tuple[str, Any], ...] = ()


def split_row_launcher(spec: OpSpec, config: Config, stats: SplitKernel, apply: SplitKernel, n_stats: int
                       ) -> Launcher:
    """The launcher of a split_row variant: ``stats`` then ``apply`` over a ``(rows, chunks)``
    grid, with a ``(rows, chunks, n_stats)`` float32 scratch buffer between them."""
    rows, n = rows_and_width(spec)
    block_n = int(config["BLOCK_N"])
    splits = triton.cdiv(n, block_n)
    meta = {"BLOCK_N": block_n, "SPLITS": next_power_of_two(splits), "ALIGN": alignment(spec),
            "num_warps": int(config["num_warps"])}
    run_stats = direct_launch(stats.kernel, (rows, splits))
    run_apply = direct_launch(apply.kernel, (rows, splits))
    stats_meta, apply_meta = {**meta, **dict(stats.constexprs)}, {**meta, **dict(apply.constexprs)}

    def launch(inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> None:
        partial = inputs[0].new_empty((rows, splits, n_stats), dtype=torch.float32)
        run_stats(*stats.tensors(inputs, outputs, partial), n, *stats.scalars, **stats_meta)
        run_apply(*apply.tensors(inputs, outputs, partial), n, *apply.scalars, **apply_meta)

    return launch


# ---- backward: the spaces of a norm backward's two schedules ---------------------------------------------
#
# A normalisation's backward computes dx row by row, and parameter gradients (dw, db) as sums over
# every row, which its programs write as shares to a float32 scratch that a second kernel adds up
# in a fixed order (the launchers and that sum are :mod:`kernelsmith.ops._rowwise_backward`'s).
# Two schedules:
#
# ``two_stage``: GROUPS programs per multiprocessor (at most one a row), each walking whole rows
#   in registers (rows up to BACKWARD_MAX_ROW), then the sum with BLOCK_R share rows a step;
# ``looped``: for wide rows, the row statistics in one pass over column blocks, then (column
#   block, group) programs, then the sum.

# two_stage holds four row-sized float32 vectors per program (x, dy, weight, the dw share):
# 4 * BLOCK_N values, at most 32 warps * 32 threads * 128 values.
BACKWARD_MAX_ROW = 32768
GROUPS = (1, 2, 4)  # two_stage's programs per multiprocessor
REDUCE_ROWS = (8, 32)  # BLOCK_R: share rows summed per step of the reduction
BACKWARD_BLOCKS = powers_of_two(256, 4096)  # looped's BLOCK_N
LOOPED_GROUPS = (1, 4)  # fewer choices than two_stage: the looped space has BLOCK_N too


def two_stage_space(block_n: int, itemsize: int, held: int, what: str, rows_in_flight: int = 2,
                    reduce_rows: tuple[int, ...] = REDUCE_ROWS) -> Space:
    """The two_stage space for rows of ``block_n`` (padded) elements of ``itemsize`` bytes, of
    which ``rows_in_flight`` are loaded per row step (dy and x; add_rmsnorm_backward also loads
    dh), ``held`` float32 values (``what``) live in registers at once."""
    row_bytes = block_n * itemsize

    def pipeline_bytes(c: Config) -> int:
        # num_stages = s keeps s - 1 row steps in flight in shared memory, for each of the
        # GROUPS programs sharing a multiprocessor.
        return int(c["GROUPS"] * (c["num_stages"] - 1) * rows_in_flight * row_bytes)

    return Space(
        [Param("GROUPS", GROUPS), Param("BLOCK_R", reduce_rows), Param("num_warps", WARPS),
         Param("num_stages", STAGES)],
        [
            Constraint(f"the programs of a multiprocessor are all resident ({MAX_WARPS_PER_SM} warps)",
                       lambda c: c["GROUPS"] * c["num_warps"] <= MAX_WARPS_PER_SM),
            Constraint(f"the rows in flight fit in shared memory ({PIPELINE_SHARED_BYTES} bytes an SM)",
                       lambda c: pipeline_bytes(c) <= PIPELINE_SHARED_BYTES),
            _row_fits(block_n, BACKWARD_MAX_ROW),
            Constraint(f"num_warps must suit {what}", lambda c: NORM_WARPS.fit(held, c["num_warps"])),
        ],
    )


def looped_backward_space(block_n: int, values_per_column: int, what: str) -> Space:
    """The looped backward space for rows of ``block_n`` (padded) elements whose widest pass
    (``what``) holds ``values_per_column`` float32 values a column of its block."""
    smallest = BACKWARD_BLOCKS[0]
    return Space(
        [Param("BLOCK_N", BACKWARD_BLOCKS), Param("GROUPS", LOOPED_GROUPS), Param("num_warps", WARPS),
         Param("num_stages", STAGES)],
        [
            # A block as wide as the row is two_stage with extra work; the smallest block is
            # always allowed so that the space is never empty for narrow rows.
            Constraint("BLOCK_N must be narrower than the row (or the smallest block)",
                       lambda c: c["BLOCK_N"] < block_n or c["BLOCK_N"] == smallest),
            # 16 to 128 float32 values a thread: fewer leave warps idle, more spill.
            Constraint(f"num_warps must suit {what}: 16 to 128 of its {values_per_column} * BLOCK_N values a thread",
                       lambda c: 16 * 32 * c["num_warps"] <= values_per_column * c["BLOCK_N"]
                       <= 128 * 32 * c["num_warps"]),
        ],
    )


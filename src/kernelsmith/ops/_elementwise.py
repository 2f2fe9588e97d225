"""The skeleton the elementwise families share: how elements are cut into programs, the config
spaces, the launchers.

An elementwise op computes every output element from the input elements at the same place (GELU,
SwiGLU and GeGLU, their gradients). Its kernels differ in their math, and in nothing else than
*which elements a program computes*, one of five schedules. Three walk the tensors as one flat
array of ``n`` elements:

``blocked``
    One program per ``BLOCK`` consecutive elements (``cdiv(n, BLOCK)`` programs), the classic
    elementwise kernel; the hardware schedules the programs. ``EVICT_X`` (or ``EVICT``) is the
    cache policy of the read-once inputs.
``multi_block``
    One program per ``ITEMS`` consecutive blocks, walked by a loop that the compiler
    software-pipelines (``num_stages``): the next block's load is in flight while the current one
    is computed and stored. Fewer, longer programs; more bytes in flight per program.
``persistent``
    A fixed grid of ``PROGRAMS_PER_SM`` programs per multiprocessor, each walking blocks ``pid,
    pid + programs, ...`` in a pipelined grid-stride loop: no program start-up beyond the first.

and two walk a ``(rows, cols)`` view in 2-D tiles, for the families whose inputs are not one flat
array (the halves of a gated activation's concatenated input, at a column offset of ``H``):

``rows``
    One program per ``BLOCK_M`` rows by ``BLOCK_N`` columns (a 2-D grid), no division at all.
``persistent`` (tiles)
    ``PROGRAMS_PER_SM`` programs per multiprocessor walk the same tiles, in row-major tile order,
    with a pipelined grid-stride loop. The tile holds ``TILE`` elements; its shape follows the row
    width (:func:`tile_shape`), so narrow rows get tall tiles without a larger space.

A family writes its kernels, each a signature, the schedule's first line (a call of
:func:`block_offsets` or :func:`span_offsets`, :func:`tile_offsets` or
:func:`persistent_tile_offsets`, below: the 64-bit offsets and the mask) and a call of its own
jitted math on the block; this module writes the rest once: the spaces of each schedule and their
constraints, the grids and the launchers (:func:`flat_launcher`, :func:`tile_launcher`) and the
variants (:func:`variant`), whose source hash covers this module, the row-wise skeleton whose
choices it shares, and the family's modules. Also the shapes of the elementwise families'
validation and buckets, and the activation distributions they draw from.

Kernel conventions (what the launchers pass). A kernel takes, in order: the tensors (and, for the
tile schedules, row strides and column offsets) that the family's ``operands(inputs, outputs)``
gives; then ``n`` (and ``n_blocks`` for ``persistent``), or ``n_rows, n_cols`` (and
``n_col_tiles, n_tiles`` for the persistent tiles); then its constexprs: the family's own, the
config's parameters spelled in capitals (``BLOCK``, ``ITEMS``, ``BLOCK_M``, ``BLOCK_N``,
``EVICT_X``, a family's ``FAST_ERF``...) under their own names, ``BLOCK_M`` and ``BLOCK_N`` of a
``TILE``, and ``NUM_STAGES`` (the depth it gives ``tl.range``: Triton 3.6 pipelines a loop without
a dot only when ``tl.range`` asks for it) wherever the config has ``num_stages``. ``num_warps`` and
``num_stages`` are launch options; ``PROGRAMS_PER_SM`` and ``TILE`` only shape the grid.

Spaces depend on the dtype and the row width only, never on the row count: the families are
bucketed by rows, and a config tuned for a bucket is valid, and validated, for every row count in
it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
import triton
import triton.language as tl

from kernelsmith.ops._base import Launcher, Variant, generator, tail_rows
from kernelsmith.ops._launch import direct_launch
from kernelsmith.ops._rowwise import EVICTION, MAX_WARPS_PER_SM, PIPELINE_SHARED_BYTES, STAGES, WARPS, programs
from kernelsmith.space import Config, Constraint, Param, Space, next_power_of_two, powers_of_two
from kernelsmith.spec import OpSpec

# ---- the schedules in the kernels ---------------------------------------------------------------


@triton.jit
def span_offsets(start, n, BLOCK: tl.constexpr):
    """The offsets of the BLOCK elements from ``start`` (a 64-bit element index) of a flat array
    of ``n``, and their mask (partial at the end, empty past it)."""
    offs = start + tl.arange(0, BLOCK)
    return offs, offs < n


@triton.jit
def block_offsets(block, n, BLOCK: tl.constexpr):
    """:func:`span_offsets` of block ``block`` (of BLOCK elements).

    The block index is widened to 64 bits before it is multiplied, so that tensors of more than
    2**31 elements are addressed correctly (tl.cast, not .to(): in the interpreter a loop
    variable is a plain Python int). Written out rather than calling span_offsets: in the
    interpreter every call of a jitted function re-patches triton.language, which costs more
    than the two lines.
    """
    offs = tl.cast(block, tl.int64) * BLOCK + tl.arange(0, BLOCK)
    return offs, offs < n


@triton.jit
def tile_offsets(tile_m, tile_n, n_rows, n_cols, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """The rows (64-bit), columns and mask of tile (tile_m, tile_n) of a (n_rows, n_cols) view.

    Columns stay 32-bit: they are below the row width. A family addresses a tensor of the tile
    as ``ptr + rows[:, None] * row_stride + cols[None, :]``.
    """
    rows = tl.cast(tile_m, tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tile_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (rows < n_rows)[:, None] & (cols < n_cols)[None, :]
    return rows, cols, mask


@triton.jit
def persistent_tile_offsets(tile, n_col_tiles, n_rows, n_cols, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """:func:`tile_offsets` of the ``tile``-th tile in row-major tile order (the persistent loop's),
    written out for the interpreter's sake (see :func:`block_offsets`)."""
    tile_m = tile // n_col_tiles
    rows = tl.cast(tile_m, tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = (tile - tile_m * n_col_tiles) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (rows < n_rows)[:, None] & (cols < n_cols)[None, :]
    return rows, cols, mask


# ---- the choices of the spaces ---------------------------------------------------------------------
# WARPS, STAGES and EVICTION are the row-wise skeleton's; so are the residency bounds of a
# persistent grid (MAX_WARPS_PER_SM, PIPELINE_SHARED_BYTES) and the multiprocessor count.
BLOCKS = powers_of_two(256, 8192)  # blocked's BLOCK
MULTI_BLOCKS = powers_of_two(256, 4096)  # multi_block's BLOCK
MULTI_ITEMS = (2, 4, 8)  # multi_block's ITEMS
PERSISTENT_BLOCKS = (1024, 2048, 4096)  # persistent's BLOCK, or the persistent tiles' TILE
PROGRAMS_PER_SM = (1, 2, 4, 8)
ROWS_BLOCK_M = (1, 2, 4, 8, 16)  # rows' BLOCK_M (also the most rows a program owns)
ROWS_BLOCK_N = powers_of_two(64, 4096)
ROWS_TILE = (1024, 8192)  # smallest and largest BLOCK_M * BLOCK_N
MIN_TILE_BLOCK_N = 16  # the persistent tiles' narrowest BLOCK_N
# Elements a thread holds in a pipelined loop, which keeps up to num_stages blocks in flight:
# a narrower range than a loop-free kernel's (which also keeps the spaces small).
LOOP_PER_THREAD = (8, 16)
# The 1-D validation tail: an odd length, so that the last block of every power-of-two BLOCK is
# partial, and several of the largest blocks long.
ODD_TAIL = 3 * 8192 + 5


def multiprocessor_count() -> int:
    """Multiprocessors of the current GPU (without one, the interpreter's small stand-in)."""
    return programs(1)


def checked(space: Space, config: Config) -> None:
    """ValueError unless ``config`` is in ``space``: a build outside its space is a caller's bug."""
    problems = space.violations(config)
    if problems:
        raise ValueError(f"config {config.key} is not in the space: {'; '.join(problems)}")


def per_thread_constraint(elements: Callable[[Config], int], low: int, high: int) -> Constraint:
    """num_warps such that each thread holds between ``low`` and ``high`` of the block's elements."""
    return Constraint(
        f"each thread holds {low} to {high} elements",
        lambda c: low * 32 * c["num_warps"] <= elements(c) <= high * 32 * c["num_warps"],
    )


def persistent_constraints(loaded_bytes: Callable[[Config], int]) -> list[Constraint]:
    """All PROGRAMS_PER_SM programs of a multiprocessor are resident: warps, and the
    ``num_stages - 1`` blocks in flight (``loaded_bytes`` a block) in shared memory."""
    return [
        Constraint(
            f"the programs of a multiprocessor are all resident ({MAX_WARPS_PER_SM} warps)",
            lambda c: c["PROGRAMS_PER_SM"] * c["num_warps"] <= MAX_WARPS_PER_SM,
        ),
        Constraint(
            f"the blocks in flight fit in shared memory ({PIPELINE_SHARED_BYTES} bytes an SM)",
            lambda c: c["PROGRAMS_PER_SM"] * (c["num_stages"] - 1) * loaded_bytes(c) <= PIPELINE_SHARED_BYTES,
        ),
    ]


# ---- the spaces of the schedules ---------------------------------------------------------------------
# ``per_thread`` is a family's register rule, (fewest, most) elements a thread: each element loads
# one value of every input, so families with more inputs take a narrower range. ``extra``: a
# family's own parameters, last (its stored config keys name them).


def blocked_space(per_thread: tuple[int, int], evict: str = "EVICT", extra: Sequence[Param] = ()) -> Space:
    """``BLOCK``, ``num_warps`` and the eviction policy ``evict`` (the name of the parameter)."""
    return Space(
        [Param("BLOCK", BLOCKS), Param("num_warps", WARPS), Param(evict, EVICTION), *extra],
        [per_thread_constraint(lambda c: c["BLOCK"], *per_thread)],
    )


def multi_block_space(extra: Sequence[Param] = ()) -> Space:
    """``BLOCK``, ``ITEMS`` blocks a program, ``num_warps``, ``num_stages`` (at most ``ITEMS``)."""
    return Space(
        [Param("BLOCK", MULTI_BLOCKS), Param("ITEMS", MULTI_ITEMS), Param("num_warps", WARPS),
         Param("num_stages", STAGES), *extra],
        [
            per_thread_constraint(lambda c: c["BLOCK"], *LOOP_PER_THREAD),
            Constraint("no deeper pipeline than the loop has steps", lambda c: c["num_stages"] <= c["ITEMS"]),
        ],
    )  # fmt: skip


def persistent_space(itemsize: int, loaded: int, per_thread: tuple[int, int] = LOOP_PER_THREAD,
                     block: str = "BLOCK", extra: Sequence[Param] = ()) -> Space:
    """``PROGRAMS_PER_SM``, the block (``BLOCK`` of the flat schedule, ``TILE`` of the tiles),
    ``num_warps``, ``num_stages``; ``loaded`` arrays of ``itemsize`` bytes are loaded a block."""
    return Space(
        [Param("PROGRAMS_PER_SM", PROGRAMS_PER_SM), Param(block, PERSISTENT_BLOCKS), Param("num_warps", WARPS),
         Param("num_stages", STAGES), *extra],
        [
            per_thread_constraint(lambda c: c[block], *per_thread),
            *persistent_constraints(lambda c: loaded * c[block] * itemsize),
        ],
    )  # fmt: skip


def rows_space(cols: int, per_thread: tuple[int, int]) -> Space:
    """``BLOCK_M`` by ``BLOCK_N`` tiles of rows of ``cols`` columns, ``num_warps``."""
    # Blocks wider than the padded row only add masked lanes; the narrowest is always allowed.
    widest = max(ROWS_BLOCK_N[0], next_power_of_two(cols))
    low, high = ROWS_TILE
    return Space(
        [Param("BLOCK_M", ROWS_BLOCK_M), Param("BLOCK_N", ROWS_BLOCK_N), Param("num_warps", WARPS)],
        [
            Constraint("BLOCK_N is no wider than the padded row", lambda c: c["BLOCK_N"] <= widest),
            Constraint(f"a tile holds {low} to {high} elements",
                       lambda c: low <= c["BLOCK_M"] * c["BLOCK_N"] <= high),
            per_thread_constraint(lambda c: c["BLOCK_M"] * c["BLOCK_N"], *per_thread),
        ],
    )  # fmt: skip


def tile_shape(cols: int, tile: int) -> tuple[int, int]:
    """(BLOCK_M, BLOCK_N) of a ``tile``-element tile for rows of ``cols`` columns."""
    block_n = min(tile, max(MIN_TILE_BLOCK_N, next_power_of_two(cols)))
    return tile // block_n, block_n


# ---- grids and the launchers --------------------------------------------------------------------------

Operands = Callable[[Sequence[torch.Tensor], Sequence[torch.Tensor]], Sequence[Any]]

# Config parameters that are not a kernel's constexprs: launch options, and what shapes the grid.
_NOT_CONSTEXPRS = ("num_warps", "num_stages", "PROGRAMS_PER_SM", "TILE")


def _meta(config: Config, constexprs: dict[str, Any]) -> dict[str, Any]:
    """The keyword arguments of a launch: the family's constexprs, the config's own (see the
    module docstring), ``NUM_STAGES`` and the launch options."""
    meta = dict(constexprs)
    meta.update((k, v) for k, v in config.items() if k not in _NOT_CONSTEXPRS)
    meta["num_warps"] = int(config["num_warps"])
    if "num_stages" in config:
        meta["NUM_STAGES"] = meta["num_stages"] = int(config["num_stages"])
    return meta


def _launch(kernel: Any, grid: tuple[int, ...], operands: Operands, args: tuple[Any, ...],
            meta: dict[str, Any]) -> Launcher:
    """The launcher: everything is worked out when it is built; it only launches into the
    caller's outputs."""
    run = direct_launch(kernel, grid)

    def launch(inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> None:
        run(*operands(inputs, outputs), *args, **meta)

    return launch


def flat_launcher(kernel: Any, n: int, config: Config, operands: Operands, **constexprs: Any) -> Launcher:
    """The launcher of a flat schedule over ``n`` elements, told by its config: ``multi_block``
    (it has ``ITEMS``), ``persistent`` (``PROGRAMS_PER_SM``) or ``blocked``."""
    block = int(config["BLOCK"])
    args: tuple[int, ...] = (n,)
    if "ITEMS" in config:
        grid = triton.cdiv(n, block * int(config["ITEMS"]))
    elif "PROGRAMS_PER_SM" in config:
        n_blocks = triton.cdiv(n, block)
        grid, args = min(n_blocks, programs(int(config["PROGRAMS_PER_SM"]))), (n, n_blocks)
    else:
        grid = triton.cdiv(n, block)
    return _launch(kernel, (grid,), operands, args, _meta(config, constexprs))


def tile_launcher(kernel: Any, rows: int, cols: int, config: Config, operands: Operands,
                  **constexprs: Any) -> Launcher:
    """The launcher of a tile schedule over a (rows, cols) view, told by its config: the
    persistent tiles (it has ``TILE``) or ``rows``."""
    meta = _meta(config, constexprs)
    if "TILE" not in config:
        block_m, block_n = int(config["BLOCK_M"]), int(config["BLOCK_N"])
        # Row blocks on axis 0 (up to 2**31 - 1 programs); column blocks on axis 1 (at most 65535).
        return _launch(kernel, (triton.cdiv(rows, block_m), triton.cdiv(cols, block_n)), operands, (rows, cols), meta)
    block_m, block_n = tile_shape(cols, int(config["TILE"]))
    n_col_tiles = triton.cdiv(cols, block_n)
    n_tiles = triton.cdiv(rows, block_m) * n_col_tiles
    grid = min(n_tiles, programs(int(config["PROGRAMS_PER_SM"])))
    meta.update(BLOCK_M=block_m, BLOCK_N=block_n)
    return _launch(kernel, (grid,), operands, (rows, cols, n_col_tiles, n_tiles), meta)


# ---- variants ----------------------------------------------------------------------------------------


def variant(module: str, name: str, summary: str, space: Callable[[OpSpec], Space],
            launcher: Callable[[OpSpec, Config], Launcher], uses: tuple[str, ...] = ()) -> Variant:
    """A variant of the family in ``module`` over the configs of ``space``, built by
    ``launcher(spec, config)`` once the config is checked to be in the space. Its source hash
    covers this module, the row-wise skeleton's (its choices), the family's and ``uses`` (modules
    whose jitted math the kernels call)."""

    def build(spec: OpSpec, config: Config) -> Launcher:
        checked(space(spec), config)
        return launcher(spec, config)

    return Variant(name, summary, space, build, modules=(module, "kernelsmith.ops._rowwise", *uses))


# ---- shapes and inputs of the elementwise families ---------------------------------------------------


def row_tail_shapes(shape: tuple[int, ...], block: int = 8) -> list[tuple[int, ...]]:
    """Shapes with the same last size and the base class's tail row counts (one row, every
    residue modulo 8 and the edges modulo ``block``: :func:`~kernelsmith.ops._base.tail_rows`),
    without the target's own shape; none for a 1-D shape."""
    *lead, width = shape
    if not lead:
        return []
    return [(r, width) for r in tail_rows(math.prod(lead), block) if (r, width) != shape]


def bucketed_shape(shape: tuple[int, ...]) -> tuple[int, ...]:
    """Leading sizes flattened into rows, the row count rounded up to a power of two."""
    *lead, width = shape
    rows = math.prod(lead) if lead else 1
    return (1 << max(rows - 1, 0).bit_length(), width)


DISTRIBUTIONS = ("normal", "wide", "small", "tails")


def draw(op: str, distribution: str, shape: tuple[int, ...], seed: int, device: str | torch.device) -> torch.Tensor:
    """A float32 tensor of ``shape`` from one of the activation distributions:

    - ``normal``: N(0, 1), where the activations bend;
    - ``wide``: 8 * N(0, 1): mostly the saturated regions, where act(x) is about x or about 0;
    - ``small``: 1e-3 * N(0, 1): act(x) is about x / 2, checked relative to a tiny scale;
    - ``tails``: +-(10 + 2 * N(0, 1)), a random sign each: erf, tanh and sigmoid are +-1 (or 0)
      to float32 precision there, exp(-|x|) underflows, and GELU's tanh form's cube reaches
      thousands.
    """
    g = generator(seed, device)
    if distribution == "normal":
        return torch.randn(shape, generator=g, device=device)
    if distribution == "wide":
        return torch.randn(shape, generator=g, device=device) * 8
    if distribution == "small":
        return torch.randn(shape, generator=g, device=device) * 1e-3
    if distribution == "tails":
        magnitude = 10 + 2 * torch.randn(shape, generator=g, device=device)
        sign = torch.randint(0, 2, shape, generator=g, device=device) * 2 - 1
        return magnitude * sign
    raise ValueError(f"{op}: unknown distribution {distribution!r} (known: {', '.join(DISTRIBUTIONS)})")

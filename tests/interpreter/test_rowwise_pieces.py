"""The row-wise skeleton's realigned rows (``row_pieces``): which elements each program covers.

Every variant built on it (aligned_row, split_row, in every family that has them) is only right if
the chunks of a row and its head and tail cover each of the row's elements exactly once, and only
fast if each body starts at a multiple of ``ALIGN`` elements and holds a multiple of ``ALIGN``.
Checked here on the pieces alone, for widths below, at and above ``ALIGN`` and the chunk width,
rows starting at every residue modulo ``ALIGN`` (through a start offset), one chunk and several.
"""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from kernelsmith.ops._rowwise import row_pieces
from kernelsmith.space import next_power_of_two


@triton.jit
def _cover_kernel(count_ptr, start_ptr, length_ptr, offset, N, BLOCK_N: tl.constexpr, ALIGN: tl.constexpr):
    """Program (row, chunk): add 1 to the count of every element its pieces cover; record its
    body's first offset and its body's length."""
    row = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1)
    program = row * tl.num_programs(1) + chunk
    body, body_mask, edge, edge_mask = row_pieces(offset + row * N, N, chunk, BLOCK_N, ALIGN)
    tl.atomic_add(count_ptr + body, tl.full([BLOCK_N], 1, tl.int32), mask=body_mask)
    tl.atomic_add(count_ptr + edge, tl.full([2 * ALIGN], 1, tl.int32), mask=edge_mask)
    tl.store(start_ptr + program, tl.min(body, axis=0))
    tl.store(length_ptr + program, tl.sum(body_mask.to(tl.int32), axis=0))


@pytest.mark.parametrize("align", [4, 8])
@pytest.mark.parametrize("width", [1, 7, 8, 33, 1000, 4097])
def test_the_pieces_cover_every_element_once_with_aligned_bodies(width: int, align: int, device: str) -> None:
    rows = 3
    for block_n, offset in ((64, 0), (64, 1), (max(64, next_power_of_two(width)), align - 1)):
        chunks = triton.cdiv(width, block_n)
        counts = torch.zeros(offset + rows * width + 64, dtype=torch.int32, device=device)
        starts = torch.empty(rows * chunks, dtype=torch.int64, device=device)
        lengths = torch.empty(rows * chunks, dtype=torch.int32, device=device)
        _cover_kernel[(rows, chunks)](counts, starts, lengths, offset, width, BLOCK_N=block_n, ALIGN=align)
        what = f"N={width} ALIGN={align} BLOCK_N={block_n} offset={offset}"
        region = counts[offset: offset + rows * width]
        assert bool((region == 1).all()), f"{what}: elements covered {sorted(set(region.tolist()))} times"
        assert int(counts.sum()) == rows * width, f"{what}: an element outside the rows was covered"
        assert bool((starts % align == 0).all()), f"{what}: a body starts unaligned: {starts.tolist()}"
        per_row = lengths.view(rows, chunks).sum(1)
        assert bool((per_row % align == 0).all()), f"{what}: a body is not a multiple of ALIGN"
        assert bool((width - per_row < 2 * align).all()), f"{what}: more than the head and tail left out of the body"
        assert bool((lengths <= block_n).all())

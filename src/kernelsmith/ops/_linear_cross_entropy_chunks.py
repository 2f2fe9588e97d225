"""The chunk loop and the memory rules the linear + cross-entropy gradient variants share
(:mod:`kernelsmith.ops.linear_cross_entropy_backward`, whose docstring explains the math, the
steps and the memory, and :mod:`kernelsmith.ops._linear_cross_entropy_library`): the chunk
sizes, the scratch formula and its cap, the search's rules on chunks and row blocks, and
:class:`ChunkPlan`, the loop over chunks of tokens (count, logits, cross-entropy backward's row
kernel turning them into their gradient in place, the products, the final reduction) into which
each variant plugs its own GEMMs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
import triton

from kernelsmith import settings
from kernelsmith.ops._cross_entropy_kernels import _ceb_mean_scale_kernel, _ceb_online_row_kernel
from kernelsmith.ops._cross_entropy_launch import _REDUCE_BLOCK, _SCALE_PER_ROW, _reducer, scale_mode
from kernelsmith.ops._launch import direct_launch
from kernelsmith.ops.linear_cross_entropy import (
    LCE_MODULES,
    constants_of,
    cross_entropy_spec,
    dtype_of,
    has_bias,
    shape_of,
)
from kernelsmith.space import Config, Constraint, next_power_of_two, powers_of_two
from kernelsmith.spec import OpSpec

FUSED_NAME = "linear_cross_entropy_fused"
# What a gradient variant's source hash covers besides its own module: the forward's list, the
# forward module (shapes, references) and this one.
GRADIENT_MODULES = (*LCE_MODULES, "kernelsmith.ops.linear_cross_entropy", __name__)

CHUNKS = powers_of_two(16, 8192)
MAX_CHUNKS = 64  # smaller chunks than this many per call are not worth timing (or the largest)
ROW_BLOCKS = powers_of_two(64, 8192)
DW_ACCUMULATORS = ("float32", "output")
AUX_WARPS = 4  # the "mean" count (and the Triton variant's casts)


# The memory cap. The fused loss exists to not hold the (T, V) logits, so its scratch (the Memory
# section of kernelsmith.ops.linear_cross_entropy_backward) should stay well under them whatever
# the tuner finds fastest: by default at most
# 3/16 of the logits in a 16-bit dtype, T x V x 2 bytes. Not 1/8: with T a power of two the chunk
# logits are a power-of-two fraction of the logits (CHUNK = T/16 is exactly 1/8), so a cap of 1/8
# would drop that chunk for the few KiB of per-row losses beside it; 3/16 keeps CHUNK <= T/16
# with room to spare and drops T/8. At 16k tokens x 128256 x 2048 (bf16) that is 752 MiB: chunks
# of up to 1024 tokens (501 MiB), and the float32 dW accumulator (1 GiB) only where a user raises
# the cap. Below 64 MiB memory is not worth a slower config (small workloads keep their whole
# space), and the cap never drops the configs of the smallest scratch, so no space is left empty.
SCRATCH_FRACTION_OF_LOGITS = 3 / 16
SCRATCH_FLOOR_BYTES = 64 * 2**20


def chunked_scratch_bytes(spec: OpSpec, config: Mapping[str, Any]) -> int:
    """Bytes one call of a gradient variant allocates for ``spec`` under ``config`` besides its
    inputs and outputs (all alive for the whole call): the formula of the module's Memory section.
    Only ``CHUNK`` and ``DW_ACC`` of the config matter, and whose config it is: the Triton
    variant's (it has tiles, ``BLOCK_M``) holds its chunk of logits in float32; the library
    variant's (:mod:`kernelsmith.ops._linear_cross_entropy_library`) in the inputs' dtype, and
    it adds the float32 ``(V,)`` partial sums of db when there is a bias and more than one chunk."""
    t, h, v = shape_of(spec)
    low_precision = dtype_of(spec).dtype != "float32"
    reduction = str(spec.const("reduction"))
    float32 = 4
    library = "BLOCK_M" not in config
    chunk = min(int(config["CHUNK"]), t)
    chunk_logits = chunk * v * (dtype_of(spec).torch_dtype.itemsize if library else float32)
    dw_accumulator = v * h if config["DW_ACC"] == "float32" and low_precision else 0
    db_accumulator = v if has_bias(spec) and low_precision else 0
    db_partial = v if library and has_bias(spec) and t > chunk else 0
    row_losses = t if spec.op == FUSED_NAME and reduction != "none" else 0
    mean_scale = 1 if reduction == "mean" else 0
    return chunk_logits + float32 * (dw_accumulator + db_accumulator + db_partial + row_losses + mean_scale)


def scratch_cap_bytes(spec: OpSpec) -> int:
    """The scratch the search's space allows for ``spec`` before the smallest-config rule:
    ``KERNELSMITH_LCE_SCRATCH_MIB`` MiB where set (> 0), else :data:`SCRATCH_FRACTION_OF_LOGITS` of
    the ``T x V x 2``-byte logits, at least :data:`SCRATCH_FLOOR_BYTES`."""
    mib = float(settings.get("KERNELSMITH_LCE_SCRATCH_MIB"))
    if mib < 0:
        raise settings.SettingError(f"KERNELSMITH_LCE_SCRATCH_MIB={mib} is negative (0: the default cap)")
    if mib > 0:
        return int(mib * 2**20)
    t, _, v = shape_of(spec)
    return max(SCRATCH_FLOOR_BYTES, int(t * v * 2 * SCRATCH_FRACTION_OF_LOGITS))


def chunk_constraints(spec: OpSpec, dw_choices: Sequence[str], logits: Mapping[str, Any]) -> list[Constraint]:
    """The search's rules on ``CHUNK`` (and ``DW_ACC``) for ``spec``: chunk sizes that make sense
    for ``T`` tokens, and scratch under the memory cap (the smallest-scratch configs always stay).
    ``logits`` stands for the variant's other parameters in :func:`chunked_scratch_bytes` (which
    variant's config it is)."""
    t, _, _ = shape_of(spec)
    smallest_above = next(c for c in CHUNKS if c >= min(t, CHUNKS[-1]))

    def chunk_fits(chunk: int) -> bool:
        return chunk <= smallest_above and (triton.cdiv(t, chunk) <= MAX_CHUNKS or chunk == CHUNKS[-1])

    # Scratch depends only on (CHUNK, DW_ACC), and every pair the chunk rules allow has the same
    # other parameters, so the smallest scratch over those pairs is met by some config of the space.
    scratch = {
        (c, d): chunked_scratch_bytes(spec, {**logits, "CHUNK": c, "DW_ACC": d}) for c in CHUNKS for d in dw_choices
    }
    cap = max(scratch_cap_bytes(spec), min(n for (c, _), n in scratch.items() if chunk_fits(c)))
    return [
        Constraint(
            "CHUNK no larger than the smallest chunk holding every token", lambda c: c["CHUNK"] <= smallest_above
        ),
        Constraint(
            f"at most {MAX_CHUNKS} chunks (or the largest chunk)",
            lambda c: triton.cdiv(t, c["CHUNK"]) <= MAX_CHUNKS or c["CHUNK"] == CHUNKS[-1],
        ),
        Constraint(
            f"scratch (chunk logits, float32 dW/db) at most {cap} bytes (KERNELSMITH_LCE_SCRATCH_MIB; default: "
            "3/16 of the T x V x 2-byte logits, at least 64 MiB); where none fits, the smallest-scratch configs stay",
            lambda c: scratch[c["CHUNK"], c["DW_ACC"]] <= cap,
        ),
    ]


def row_constraints(vocab: int, blocks: Sequence[int]) -> list[Constraint]:
    """The row kernel's ``BLOCK_V`` (one of ``blocks``) for rows of ``vocab`` logits."""
    widest_row = max(blocks[0], next_power_of_two(vocab))
    return [
        Constraint("BLOCK_V no wider than the padded row", lambda c: c["BLOCK_V"] <= widest_row),
        Constraint(
            "at most 512 steps over a row (or the widest block)",
            lambda c: triton.cdiv(vocab, c["BLOCK_V"]) <= 512 or c["BLOCK_V"] == blocks[-1],
        ),
    ]


def dw_accumulators(spec: OpSpec) -> tuple[str, ...]:
    """``DW_ACC``'s values: a float32 dW is always its own accumulator."""
    return DW_ACCUMULATORS if dtype_of(spec).dtype != "float32" else DW_ACCUMULATORS[:1]


class ChunkPlan:
    """The chunk loop every gradient variant shares (the steps of the module docstring), with
    what a launcher of one spec precomputes: shapes, constants, scale mode, the count, the row
    kernel by chunk size, the final reduction. A variant supplies how a chunk's logits are made
    (:meth:`logits`), how its gradient is contracted into dh, dW and db (:meth:`products`), its
    scratch besides the chunk (:meth:`accumulators`) and the end of the call (:meth:`finish`)."""

    CAP_INPUT = False  # the chunk holds raw logits u: the row kernel soft-caps them as it reads them

    def __init__(self, spec: OpSpec, config: Config, row_warps: int) -> None:
        self.fused = spec.op == FUSED_NAME
        self.t, self.h, self.v = shape_of(spec)
        self.reduction, self.ignore_index, self.smoothing, self.softcap = constants_of(spec)
        self.bias = has_bias(spec)
        self.chunk = min(int(config["CHUNK"]), self.t)
        self.block_v, self.row_warps = int(config["BLOCK_V"]), row_warps
        self.dw_scratch = config["DW_ACC"] == "float32" and dtype_of(spec).dtype != "float32"
        self.db_scratch = dtype_of(spec).dtype != "float32"
        self.scale_mode = scale_mode(self.reduction, self.fused)
        self.count = direct_launch(_ceb_mean_scale_kernel, (1,)) if self.reduction == "mean" else None
        self.count_block = min(_REDUCE_BLOCK, next_power_of_two(self.t))
        self.reduce = _reducer(cross_entropy_spec(spec)) if self.fused else None
        self.sizes = {self.chunk, self.t - (self.t // self.chunk) * self.chunk} - {0}
        self.rows = {c: direct_launch(_ceb_online_row_kernel, (c,)) for c in self.sizes}

    def launch(self, inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> None:
        if self.fused:
            hidden, weight, target = inputs[:3]
            loss, dh, dw = outputs[:3]
            dloss = loss
        else:
            dloss, hidden, weight, target = inputs[:4]
            dh, dw = outputs[:2]
            loss = dh
        bias = inputs[-1] if self.bias else None
        db = outputs[-1] if self.bias else None
        scale = dloss
        if self.count is not None:
            scale = dh.new_empty((1,), dtype=torch.float32)
            self.count(dloss, target, scale, self.t, self.ignore_index,
                       UNIT=self.fused, BLOCK_R=self.count_block, num_warps=AUX_WARPS)  # fmt: skip
        losses = loss
        if self.fused and self.reduce is not None:
            losses = dh.new_empty((self.t,), dtype=torch.float32)
        acc = self.accumulators(dw, db)
        z_all = dh.new_empty((self.chunk, self.v), dtype=self.logits_dtype(hidden))
        for start in range(0, self.t, self.chunk):
            c = min(self.chunk, self.t - start)
            h_c, t_c, z, dh_c = hidden[start : start + c], target[start : start + c], z_all[:c], dh[start : start + c]
            self.logits(h_c, weight, bias, z)
            scale_c = scale[start : start + c] if self.scale_mode == _SCALE_PER_ROW else scale
            losses_c = losses[start : start + c] if self.fused else losses
            # g over z in place: cross-entropy backward's row kernel, soft-cap factor included.
            self.rows[c](
                z, t_c, scale_c, z, losses_c, z.stride(0), z.stride(0), self.v, self.ignore_index, self.smoothing,
                BLOCK_V=self.block_v, SCALE=self.scale_mode, LOSS=self.fused, SMOOTH=self.fused and self.smoothing > 0,
                NUM_STAGES=2, softcap=self.softcap if self.softcap > 0 else 1.0, CAP=self.softcap > 0,
                CAP_INPUT=self.CAP_INPUT and self.softcap > 0, num_warps=self.row_warps,
            )  # fmt: skip
            self.products(start, z, h_c, weight, dh_c, acc)
        self.finish(dw, db, acc)
        if self.reduce is not None:
            self.reduce(losses, target, loss)

    # ---- what a variant supplies ------------------------------------------------------------------
    def logits_dtype(self, hidden: torch.Tensor) -> torch.dtype:
        """The dtype of the chunk of logits (then of their gradient)."""
        raise NotImplementedError

    def accumulators(self, dw: torch.Tensor, db: torch.Tensor | None) -> tuple[torch.Tensor | None, ...]:
        """``(dW's accumulator, db's accumulator or None, ...)``, made once a call."""
        dw_acc = dw.new_empty(dw.shape, dtype=torch.float32) if self.dw_scratch else dw
        db_acc = None
        if db is not None:
            db_acc = db.new_empty((self.v,), dtype=torch.float32) if self.db_scratch else db
        return dw_acc, db_acc

    def logits(self, h_c: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, z: torch.Tensor) -> None:
        raise NotImplementedError

    def products(
        self, start: int, g: torch.Tensor, h_c: torch.Tensor, weight: torch.Tensor, dh_c: torch.Tensor,
        acc: tuple[torch.Tensor | None, ...],
    ) -> None:  # fmt: skip
        """dh_c = g @ W; dW (+)= g.T @ h_c and db (+)= the column sums of g (the first chunk,
        ``start == 0``, writes)."""
        raise NotImplementedError

    def finish(self, dw: torch.Tensor, db: torch.Tensor | None, acc: tuple[torch.Tensor | None, ...]) -> None:
        raise NotImplementedError

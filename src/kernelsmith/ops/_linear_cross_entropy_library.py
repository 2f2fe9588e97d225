"""The linear + cross-entropy gradients with the library's GEMMs: the variant
``chunked_library_gemm`` of ``linear_cross_entropy_backward`` and ``linear_cross_entropy_fused``
(:mod:`kernelsmith.ops.linear_cross_entropy_backward`, whose docstring gives the math).

Why
---
The ``chunked`` variant's three GEMMs are our own Triton tiles; on an H200 they lost to the
reference (issue 18), while Liger-Kernel's fused linear + cross-entropy is fast because its GEMMs
are cuBLAS's. This variant runs the same chunk loop
(:class:`~kernelsmith.ops._linear_cross_entropy_chunks.ChunkPlan`) with PyTorch's matrix products
(cuBLAS on a GPU; written ``out=`` into tensors made once a call, so that a chunk allocates
nothing and the loop can be captured in a CUDA graph) and keeps our one Triton kernel where the
library has none: cross-entropy backward's online row kernel, which turns a chunk of logits into
its loss and its gradient in place.

The steps of a chunk ``h_c`` (``c`` tokens)
--------------------------------------------
1. ``z = h_c @ W.T (+ b)``: ``torch.mm`` (``torch.addmm`` with a bias) into the ``(CHUNK, V)``
   scratch in the inputs' dtype. These are the reference's logits to the bit pattern where the
   library computes the chunk's rows as it computes the whole product: ``F.linear`` rounds its
   float32 sums to the inputs' dtype, and the reference (``F.linear(h, W, b).float()``) upcasts
   those rounded logits before the loss.
2. the row kernel reads ``z`` in that dtype and computes in float32: soft-capping
   ``x = c tanh(z / c)`` as it reads (``CAP_INPUT``: the capped logits are float32, as the
   reference's are, never rounded back), the online max and sum of exponentials (and the fused
   op's loss), then ``g = d loss / d z`` written over ``z`` in the same dtype, i.e. rounded as
   PyTorch rounds the gradient it hands ``F.linear``'s backward.
3. ``dh_c = g @ W``: ``torch.mm`` into ``dh``'s rows.
4. ``dW (+)= g.T @ h_c``: the first chunk writes (``torch.mm``), later chunks add
   (``torch.addmm``, ``beta = 1``). ``DW_ACC`` = ``output``: into dW itself, rounded to its dtype
   after every chunk (Liger's default); ``float32`` (16-bit inputs only): into a float32
   accumulator, the library's float32 sums added without rounding (``out_dtype=float32``, as
   Liger's ``accum_dtype``), dW rounded once at the end.
5. ``db (+)= sum over the chunk's tokens of g``: ``torch.sum`` in float32 (into db's accumulator
   for the first chunk, into a ``(V,)`` float32 partial sum added to it after).

Memory
------
:func:`~kernelsmith.ops._linear_cross_entropy_chunks.chunked_scratch_bytes` tells this variant's
configs by their lack of tiles (``BLOCK_M``): the chunk costs ``min(CHUNK, T) * V`` elements of
the inputs' dtype (half the Triton variant's float32 chunk in bfloat16, so twice the tokens fit
under the same cap), plus ``4 * V`` for db's partial sums with a bias and more than one chunk;
the rest is as the backward module's Memory section says.

``out_dtype`` is CUDA's only: elsewhere (the interpreter's CPU runs of the tests) step 4's float32
accumulation multiplies float32 copies of ``g.T`` and ``h_c``, made per chunk and not in the
formula.

The harness
-----------
The variant computes with PyTorch: the aten ops it issues are :data:`LIBRARY_OPS` (and, off
CUDA, :data:`LIBRARY_OPS_OFF_CUDA`). The harness's rule 7 (:mod:`kernelsmith.evaluate.validate`)
rejects a candidate that issues any op beyond views and allocations; this built-in variant declares
these as its :attr:`~kernelsmith.ops._base.Variant.library_ops`, which rule 7 allows for it alone
(a candidate's kernel file never has an allowance). Any other op it issued would still be rejected.
"""

from __future__ import annotations

import torch

from kernelsmith.ops._base import Launcher, Variant
from kernelsmith.ops._cross_entropy_launch import _checked
from kernelsmith.ops._linear_cross_entropy_chunks import (
    CHUNKS,
    GRADIENT_MODULES,
    ChunkPlan,
    chunk_constraints,
    dw_accumulators,
    row_constraints,
)
from kernelsmith.ops.linear_cross_entropy import shape_of
from kernelsmith.space import Config, Constraint, Param, Space, powers_of_two
from kernelsmith.spec import OpSpec

VARIANT_NAME = "chunked_library_gemm"

# The row kernel's columns a step and warps (Liger runs 32 warps over 32768-column blocks on wide
# vocabularies): from 4 to 64 columns a thread, fewer only for the smallest warp count.
LIBRARY_ROW_BLOCKS = powers_of_two(64, 32768)
ROW_WARPS = (4, 8, 16, 32)
_MIN_COLUMNS_PER_THREAD, _MAX_COLUMNS_PER_THREAD = 4, 64

# The aten ops a call issues besides views and allocations (rule 7 of the harness: the module
# docstring). The CUDA path: the GEMMs with and without out_dtype, the column sums, their
# accumulation, and the final roundings of the float32 accumulators into dW and db; elsewhere,
# the float32 copies of step 4 too.
LIBRARY_OPS = frozenset(
    {
        "aten.mm.out",
        "aten.addmm.out",
        "aten.mm.dtype_out",
        "aten.addmm.dtype_out",
        "aten.sum.IntList_out",
        "aten.add_.Tensor",
        "aten.copy_.default",
    }
)
LIBRARY_OPS_OFF_CUDA = frozenset({"aten._to_copy.default"})


def _library_space(spec: OpSpec, prune: bool = True) -> Space:
    """The variant's space: CHUNK and DW_ACC under the Triton variant's rules (the cap included,
    on this variant's scratch), the row kernel's BLOCK_V and warps. ``prune`` as the Triton
    variant's (builds check without the chunk rules: validation runs a config on fewer tokens)."""
    _, _, v = shape_of(spec)
    dw_choices = dw_accumulators(spec)
    return Space(
        [
            Param("CHUNK", CHUNKS),
            Param("DW_ACC", dw_choices),
            Param("BLOCK_V", LIBRARY_ROW_BLOCKS),
            Param("ROW_WARPS", ROW_WARPS),
        ],
        [
            *(chunk_constraints(spec, dw_choices, {}) if prune else []),
            *row_constraints(v, LIBRARY_ROW_BLOCKS),
            Constraint(
                f"at least {_MIN_COLUMNS_PER_THREAD} columns a thread (or {ROW_WARPS[0]} warps)",
                lambda c: (
                    c["ROW_WARPS"] == ROW_WARPS[0] or c["BLOCK_V"] >= 32 * c["ROW_WARPS"] * _MIN_COLUMNS_PER_THREAD
                ),
            ),
            Constraint(
                f"at most {_MAX_COLUMNS_PER_THREAD} columns a thread (or {ROW_WARPS[-1]} warps)",
                lambda c: (
                    c["ROW_WARPS"] == ROW_WARPS[-1] or c["BLOCK_V"] <= 32 * c["ROW_WARPS"] * _MAX_COLUMNS_PER_THREAD
                ),
            ),
        ],
    )


def _add_product(acc: torch.Tensor, a: torch.Tensor, b: torch.Tensor, first: bool) -> None:
    """``acc = a @ b`` (``first``) or ``acc += a @ b``, in place, the products' sums in float32
    (the library's accumulation), ``acc`` of ``a``'s dtype or float32."""
    if acc.dtype == a.dtype:
        if first:
            torch.mm(a, b, out=acc)
        else:
            torch.addmm(acc, a, b, out=acc)
    elif acc.device.type == "cuda":
        if first:
            torch.mm(a, b, out_dtype=acc.dtype, out=acc)
        else:
            torch.addmm(acc, a, b, out_dtype=acc.dtype, out=acc)
    else:  # (no out_dtype off CUDA: float32 copies, exact products and float32 sums all the same)
        torch.addmm(acc, a.to(acc.dtype), b.to(acc.dtype), beta=0 if first else 1, out=acc)


class _LibraryPlan(ChunkPlan):
    """Steps 1, 3, 4 and 5 of the module docstring around the shared loop's row kernel."""

    CAP_INPUT = True

    def __init__(self, spec: OpSpec, config: Config) -> None:
        super().__init__(spec, config, int(config["ROW_WARPS"]))
        self.db_partial = self.bias and self.t > self.chunk

    def logits_dtype(self, hidden: torch.Tensor) -> torch.dtype:
        return hidden.dtype

    def accumulators(self, dw: torch.Tensor, db: torch.Tensor | None) -> tuple[torch.Tensor | None, ...]:
        dw_acc, db_acc = super().accumulators(dw, db)
        partial = dw.new_empty((self.v,), dtype=torch.float32) if self.db_partial else None
        return dw_acc, db_acc, partial

    def logits(self, h_c: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, z: torch.Tensor) -> None:
        if bias is None:
            torch.mm(h_c, weight.t(), out=z)
        else:
            torch.addmm(bias, h_c, weight.t(), out=z)

    def products(
        self, start: int, g: torch.Tensor, h_c: torch.Tensor, weight: torch.Tensor, dh_c: torch.Tensor,
        acc: tuple[torch.Tensor | None, ...],
    ) -> None:  # fmt: skip
        dw_acc, db_acc, partial = acc
        assert dw_acc is not None
        torch.mm(g, weight, out=dh_c)
        _add_product(dw_acc, g.t(), h_c, first=start == 0)
        if db_acc is not None:
            if start == 0:
                torch.sum(g, dim=0, dtype=torch.float32, out=db_acc)
            else:
                assert partial is not None
                torch.sum(g, dim=0, dtype=torch.float32, out=partial)
                db_acc.add_(partial)

    def finish(self, dw: torch.Tensor, db: torch.Tensor | None, acc: tuple[torch.Tensor | None, ...]) -> None:
        dw_acc, db_acc, _ = acc
        assert dw_acc is not None  # (dW always has an accumulator: itself or a float32 one)
        if dw_acc is not dw:
            dw.copy_(dw_acc)  # (float32 to dW's dtype, rounded once)
        if db is not None and db_acc is not None and db_acc is not db:
            db.copy_(db_acc)


def _library_build(spec: OpSpec, config: Config) -> Launcher:
    _checked(_library_space(spec, prune=False), config)
    return _LibraryPlan(spec, config).launch


LIBRARY_VARIANT = Variant(
    VARIANT_NAME,
    "tokens in CHUNK-row chunks, the GEMMs the library's (cuBLAS): logits h @ W.T into a chunk in the "
    "inputs' dtype, loss and gradient in place by one Triton row kernel, then dh = g @ W, dW (+)= g.T @ h, "
    "db (+)= the sum of g",
    _library_space,
    _library_build,
    modules=GRADIENT_MODULES,
    library_ops=LIBRARY_OPS | LIBRARY_OPS_OFF_CUDA,
)

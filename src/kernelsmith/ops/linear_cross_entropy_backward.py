"""Fused linear + cross-entropy backward ``(dloss, h, W, target[, b]) -> (dh, dW[, db])``, and the
fused training form ``(h, W, target[, b]) -> (loss, dh, dW[, db])``: the gradients of
:mod:`kernelsmith.ops.linear_cross_entropy`, never holding more than one chunk of logits.

The ops
-------
``linear_cross_entropy_backward`` takes the forward's float32 ``dloss`` (0-d for "mean"/"sum",
``(T,)`` for "none") and the forward's inputs and constants; its outputs are the gradients of the
floating-point inputs, in their dtypes. ``linear_cross_entropy_fused`` takes the forward's inputs
and returns the loss too, for an upstream gradient of 1 (Liger-Kernel's form: the gradient is
made during the forward pass, and the backward only scales it when the upstream is not 1).

The math
--------
With ``z = softcap(W h + b)`` and cross-entropy's row gradient (see
:mod:`kernelsmith.ops.cross_entropy_backward`)

    g[j] = d loss / d z[j] = (softmax(z)[j] - (1 - eps) [j == t] - eps / V) * scale,

soft-capping ``z = c tanh(u / c)`` multiplies it by ``dz / du = 1 - (z / c)**2``. Then

    dh = g @ W,    dW = g.T @ h,    db = sum over tokens of g.

Tokens go in chunks of ``CHUNK``; per chunk, four launches:

1. the chunk's logits ``z`` (a tiled ``h_c @ W.T`` with the bias and soft-cap in its epilogue)
   into a float32 ``(CHUNK, V)`` scratch, the only memory that grows with the vocabulary;
2. one program per row walks its logits twice: the online max and sum of exponentials (and, for
   the fused op, the row's loss), then ``g`` written over ``z`` in place (cross-entropy
   backward's own online-row kernel, with its soft-cap factor switched on);
3. ``dh`` for the chunk's rows: ``g @ W``, a plain GEMM (``g`` rounded to W's dtype as it is
   loaded, as PyTorch's bfloat16 gradient is);
4. ``dW (+)= g.T @ h_c``, a plain GEMM through transposed strides, whose A tiles' row sums are
   ``db``'s contributions (free: the tiles are loaded anyway). The first chunk writes, later
   chunks add. ``DW_ACC`` chooses where the sum lives: ``float32`` (a float32 scratch rounded once
   into dW at the end, as one big GEMM would) or ``output`` (dW itself, rounded after every chunk,
   as Liger does; no scratch as large as W). A float32 dW is always its own accumulator.

The GEMMs of steps 3 and 4 are plain GEMMs; they are the linear + cross-entropy families' own
small tiled kernel (:func:`kernelsmith.ops._linear_cross_entropy_kernels.lce_tile`, where all
their kernels live) rather than the matmul family's, whose kernels take a unit-stride ``x`` of the
weight's dtype and have no accumulate-into-the-output epilogue. One tiling (``BLOCK_M``,
``BLOCK_N``, ``BLOCK_K``, warps, stages) serves the three GEMMs of a config. "mean" needs the
count of non-ignored tokens over *all* chunks first: cross-entropy backward's count kernel.

Ignored rows have zero gradient; an out-of-range target makes its row of ``g`` NaN (and so the
loss, ``dh``'s row, and all of ``dW`` and ``db``): see the forward for the error the front door
raises instead.

Memory
------
What a call allocates besides its inputs and outputs
(:func:`kernelsmith.ops._linear_cross_entropy_chunks.chunked_scratch_bytes`, also
``OP.scratch_bytes(spec, config)``), all of it float32 and alive for the whole call, in bytes:

    4 * min(CHUNK, T) * V    the chunk's logits (then, in place, their gradient g)
  + 4 * V * H                the dW accumulator, if DW_ACC is float32 and W is not
  + 4 * V                    the db accumulator, if there is a bias and it is not float32
  + 4 * T                    the per-row losses before "mean"/"sum" (the fused op only)
  + 4                        the scale 1 / (tokens not ignored), for "mean"

At 16k tokens, V 128256, H 2048 in bfloat16 the first two terms are up to 4 GiB (CHUNK 8192) and
1 GiB, against the 4 GiB of bfloat16 logits the fused loss exists not to hold, so the search's
space caps them (:func:`~kernelsmith.ops._linear_cross_entropy_chunks.scratch_cap_bytes`,
``KERNELSMITH_LCE_SCRATCH_MIB``): by default 3/16 of the ``T x V x 2``-byte logits, at least
64 MiB, and never below the smallest config's need.

The variant ``chunked_library_gemm`` (:mod:`kernelsmith.ops._linear_cross_entropy_library`) runs
the same loop (:class:`~kernelsmith.ops._linear_cross_entropy_chunks.ChunkPlan`) with the
library's GEMMs (cuBLAS on a GPU) and its chunk in the inputs' dtype; its module says how.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch
import triton

from kernelsmith.ops._base import (
    FINITE_STRESS_DISTRIBUTIONS,
    NO_FLOOR,
    Launcher,
    OpFamily,
    UnsupportedWorkload,
    Variant,
    generator,
)
from kernelsmith.ops._cross_entropy_launch import _checked
from kernelsmith.ops._launch import direct_launch
from kernelsmith.ops._linear_cross_entropy_chunks import (
    AUX_WARPS,
    CHUNKS,
    FUSED_NAME,
    GRADIENT_MODULES,
    ROW_BLOCKS,
    ChunkPlan,
    chunk_constraints,
    chunked_scratch_bytes,
    dw_accumulators,
    row_constraints,
)
from kernelsmith.ops._linear_cross_entropy_kernels import _lceb_cast_kernel, _lceb_gemm_kernel, _lceb_logits_kernel
from kernelsmith.ops._linear_cross_entropy_library import LIBRARY_VARIANT
from kernelsmith.ops._softmax_condition import centered_spread, floor_of, probability_error
from kernelsmith.ops.linear_cross_entropy import (
    OP as _FORWARD,
)
from kernelsmith.ops.linear_cross_entropy import (
    TILE_M,
    command_line_spec,
    dtype_of,
    first_forward_input,
    forward_spec_for,
    make_forward_inputs,
    reference_loss,
    shape_of,
    softmax_conditions,
    tail_specs,
    tile_constraints,
    tile_flags,
    tile_params,
)
from kernelsmith.space import Config, Param, Space
from kernelsmith.spec import OpSpec, TensorSpec

if TYPE_CHECKING:
    from kernelsmith.ops._base import ErrorFloor

BACKWARD_NAME = "linear_cross_entropy_backward"

# =================================================================================================
# Space and builder
# =================================================================================================

_CAST_BLOCK = 1024


def _chunked_space(spec: OpSpec, prune: bool = True) -> Space:
    """The chunked variant's space. ``prune`` (the search's space) also keeps chunk sizes to
    those that make sense for ``T`` tokens and scratch under the memory cap; builds check without
    it, because validation runs a config chosen for ``T`` tokens on fewer (tails of 1, 7, ...
    tokens), and a stored config stays correct whatever cap the user sets later."""
    _, h, v = shape_of(spec)
    element_size = dtype_of(spec).torch_dtype.itemsize
    dw_choices = dw_accumulators(spec)
    return Space(
        [*tile_params(), Param("CHUNK", CHUNKS), Param("BLOCK_V", ROW_BLOCKS), Param("DW_ACC", dw_choices)],
        [
            # One tiling serves (CHUNK, V, H), (CHUNK, H, V) and (V, H, CHUNK) GEMMs: bounded by
            # the larger of V and H in every dimension (not by the token count, which tails change).
            *tile_constraints(max(v, h), max(v, h), max(h, v), element_size),
            *(chunk_constraints(spec, dw_choices, {"BLOCK_M": TILE_M[0]}) if prune else []),
            *row_constraints(v, ROW_BLOCKS),
        ],
    )


def _row_warps(block_v: int) -> int:
    """Warps of the row kernel: about 16 columns a thread, 1 to 16 warps."""
    return max(1, min(16, block_v // (32 * 16)))


class _Plan(ChunkPlan):
    """The Triton variant: our own tiled GEMMs (steps 1, 3 and 4), one tiling for the three."""

    def __init__(self, spec: OpSpec, config: Config) -> None:
        super().__init__(spec, config, _row_warps(int(config["BLOCK_V"])))
        bm, bn = config["BLOCK_M"], config["BLOCK_N"]
        self.tiles = {
            "BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": config["BLOCK_K"], **tile_flags(dtype_of(spec).dtype),
            "num_warps": config["num_warps"], "num_stages": config["num_stages"],
        }  # fmt: skip
        sizes = self.sizes
        self.logits_kernel = {
            c: direct_launch(_lceb_logits_kernel, (triton.cdiv(c, bm), triton.cdiv(self.v, bn))) for c in sizes
        }
        self.dh = {c: direct_launch(_lceb_gemm_kernel, (triton.cdiv(c, bm), triton.cdiv(self.h, bn))) for c in sizes}
        self.dw = direct_launch(_lceb_gemm_kernel, (triton.cdiv(self.v, bm), triton.cdiv(self.h, bn)))
        self.cast_dw = direct_launch(_lceb_cast_kernel, (triton.cdiv(self.v * self.h, _CAST_BLOCK),))
        self.cast_db = direct_launch(_lceb_cast_kernel, (triton.cdiv(self.v, _CAST_BLOCK),))

    def logits_dtype(self, hidden: torch.Tensor) -> torch.dtype:
        return torch.float32

    def logits(self, h_c: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, z: torch.Tensor) -> None:
        b = weight if bias is None else bias  # (an unread stand-in pointer without a bias)
        c = h_c.shape[0]
        self.logits_kernel[c](h_c, weight, b, z, c, self.v, self.h, h_c.stride(0), weight.stride(0), z.stride(0),
                              self.softcap, HAS_BIAS=self.bias, CAP=self.softcap > 0, **self.tiles)  # fmt: skip

    def products(
        self, start: int, g: torch.Tensor, h_c: torch.Tensor, weight: torch.Tensor, dh_c: torch.Tensor,
        acc: tuple[torch.Tensor | None, ...],
    ) -> None:  # fmt: skip
        dw_acc, db_acc = acc
        assert dw_acc is not None
        c, v, h = h_c.shape[0], self.v, self.h
        # dh_c = g @ W: (c, V) @ (V, H).
        self.dh[c](g, weight, dh_c, dh_c, c, h, v, g.stride(0), 1, weight.stride(0), 1, dh_c.stride(0), 0,
                   ROW_SUM=False, **self.tiles)  # fmt: skip
        # dW (+)= g.T @ h_c: (V, c) @ (c, H); db (+)= the row sums of g.T.
        sums = dw_acc if db_acc is None else db_acc  # (an unwritten stand-in without a bias)
        self.dw(g, h_c, dw_acc, sums, v, h, c, 1, g.stride(0), h_c.stride(0), 1, dw_acc.stride(0),
                int(start > 0), ROW_SUM=self.bias, **self.tiles)  # fmt: skip

    def finish(self, dw: torch.Tensor, db: torch.Tensor | None, acc: tuple[torch.Tensor | None, ...]) -> None:
        dw_acc, db_acc = acc
        if self.dw_scratch:
            self.cast_dw(dw_acc, dw, self.v * self.h, BLOCK=_CAST_BLOCK, num_warps=AUX_WARPS)
        if db is not None and self.db_scratch:
            self.cast_db(db_acc, db, self.v, BLOCK=_CAST_BLOCK, num_warps=AUX_WARPS)


def _chunked_build(spec: OpSpec, config: Config) -> Launcher:
    _checked(_chunked_space(spec, prune=False), config)
    return _Plan(spec, config).launch


_VARIANTS = (
    Variant(
        "chunked",
        "tokens in CHUNK-row chunks: logits GEMM into a float32 chunk, gradient in place, "
        "then dh = g @ W and dW (+)= g.T @ h (db from the same tiles)",
        _chunked_space,
        _chunked_build,
        modules=GRADIENT_MODULES,
    ),
    LIBRARY_VARIANT,  # the same chunks with cuBLAS's GEMMs (Liger's shape): ops/_linear_cross_entropy_library.py
)


# =================================================================================================
# The op families
# =================================================================================================


def _autograd(
    spec: OpSpec, dloss: torch.Tensor | None, inputs: Sequence[torch.Tensor], dtype: torch.dtype
) -> tuple[torch.Tensor, ...]:
    """``(loss, dh, dW[, db])`` by autograd through :func:`reference_loss` in ``dtype``, fed
    ``dloss`` (None: ones, the fused op's)."""
    with torch.enable_grad():
        leaves = [x.detach().requires_grad_() if x.is_floating_point() else x for x in inputs]
        loss = reference_loss(leaves, spec, dtype)
        upstream = torch.ones_like(loss) if dloss is None else dloss.detach().to(loss.dtype)
        differentiable = [x for x in leaves if x.is_floating_point()]
        grads = torch.autograd.grad(loss, differentiable, upstream)
    return (loss.detach(), *(g.detach() for g in grads))


def _wide(inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    return [x.double() if x.is_floating_point() else x for x in inputs]


def _gradient_floors(
    spec: OpSpec, forward: Sequence[torch.Tensor], dloss: torch.Tensor | None, refs64: Sequence[torch.Tensor]
) -> tuple[ErrorFloor, ...]:
    """Floors of ``(dh, dW[, db])`` (the last ``refs64``): what rounding the logits can do to them.

    The logits' gradient is ``g = (p - y) s`` per row (``s``: the upstream ``dloss`` times the
    row's share, :class:`SoftmaxCondition`), and ``y`` does not depend on the logits, so each
    ``g_tj`` moves by at most ``|s_t| E_tj`` (``E`` the probability bound of
    :mod:`kernelsmith.ops._softmax_condition`, where the quadrature below is explained). Then:

    - ``dh_t = g_t @ W`` is a row's ``p``-weighted sum of W's rows: ``|s_t|`` times the centred
      spread of its probabilities' errors over ``W`` (:func:`centered_spread`);
    - ``dW_j = sum_t g_tj h_t`` and ``db_j = sum_t g_tj`` take one probability of each row, and
      rows round independently: ``sqrt(sum_t s_t^2 E_tj^2 h_t^2)`` and ``sqrt(sum_t s_t^2 E_tj^2)``.

    (A soft-cap multiplies ``g`` by its slope, at most 1; the rounding of the slope itself is not
    in the floor.)
    """
    conditions = softmax_conditions(spec, forward)
    if not conditions:
        return tuple(NO_FLOOR for _ in refs64)
    tokens = forward[2].shape[0]
    weight = forward[1].double()
    upstream = torch.ones((), dtype=torch.float64) if dloss is None else dloss.detach().double().abs()
    upstream = upstream.to(weight.device).expand(tokens)
    dh, dw_square, db_square = [], torch.zeros_like(weight), weight.new_zeros(weight.shape[0])
    for c in conditions:
        scale = (c.share * upstream[c.rows]).reshape(-1, 1)
        error = probability_error(c.p, c.error)
        dh.append(scale * centered_spread(c.p, error, weight))
        square = (scale * error).square()
        dw_square += square.T @ forward[0][c.rows].double().square()
        db_square += square.sum(dim=0)
    bounds = [torch.cat(dh), dw_square.sqrt(), db_square.sqrt()][: len(refs64)]  # (db: with a bias)
    return tuple(floor_of(bound, ref) for bound, ref in zip(bounds, refs64, strict=True))


class _LinearCrossEntropyGradient(OpFamily):
    distributions = _FORWARD.distributions
    stress_distributions = FINITE_STRESS_DISTRIBUTIONS  # no nonfinite: see kernelsmith.ops._base
    row_block = TILE_M[-1]
    variants = _VARIANTS

    def small_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        return _FORWARD.small_shape(shape)

    def check_supported(self, spec: OpSpec) -> None:
        from kernelsmith.ops.linear_cross_entropy import check_forward_shapes

        check_forward_shapes(spec)

    def validation_specs(self, spec: OpSpec) -> list[OpSpec]:
        return tail_specs(spec, self.row_block)

    def stressed_inputs(self, spec: OpSpec) -> tuple[int, ...]:
        return (first_forward_input(spec),)  # h

    def _grad_outputs(self, spec: OpSpec) -> tuple[TensorSpec, ...]:
        at = first_forward_input(spec)
        return tuple(x for x in spec.inputs[at:] if x.dtype != "int64")

    def flops(self, spec: OpSpec) -> int:
        t, h, v = shape_of(spec)
        return 3 * 2 * t * h * v + 10 * t * v

    def scratch_bytes(self, spec: OpSpec, config: Mapping[str, Any]) -> int:
        """The bytes a call allocates besides its inputs and outputs: :func:`chunked_scratch_bytes`."""
        return chunked_scratch_bytes(spec, config)


class LinearCrossEntropyBackward(_LinearCrossEntropyGradient):
    name = BACKWARD_NAME
    summary = "gradients dh, dW (, db) of linear + cross-entropy given dloss, chunk by chunk"
    shape_help = _FORWARD.shape_help + "; dloss is 0-d float32 ((T,) with reduction=none)"

    def spec(self, shape: tuple[int, ...], dtype: str, **constants: Any) -> OpSpec:
        return self._from_forward(command_line_spec(self.name, shape, dtype, constants))

    def spec_for(self, *inputs: torch.Tensor, **constants: Any) -> OpSpec:
        if len(inputs) not in (4, 5) or not isinstance(inputs[0], torch.Tensor):
            raise UnsupportedWorkload(f"{self.name} takes (dloss, h, W, target[, bias]), not {len(inputs)} inputs")
        if inputs[0].dtype != torch.float32:
            raise UnsupportedWorkload(f"{self.name}: dloss must be float32, not {inputs[0].dtype}")
        forward = forward_spec_for(self.name, inputs[1:], constants)
        spec = OpSpec(self.name, (TensorSpec.of(inputs[0]), *forward.inputs), dict(forward.constants))
        self.check_supported(spec)
        return spec

    def _from_forward(self, forward: OpSpec) -> OpSpec:
        t, _, _ = shape_of(forward)
        dloss = TensorSpec((t,) if forward.const("reduction") == "none" else (), "float32")
        spec = OpSpec(self.name, (dloss, *forward.inputs), dict(forward.constants))
        self.check_supported(spec)
        return spec

    def check_supported(self, spec: OpSpec) -> None:
        super().check_supported(spec)
        t, _, _ = shape_of(spec)
        expected = TensorSpec((t,) if spec.const("reduction") == "none" else (), "float32")
        if first_forward_input(spec) != 1 or spec.inputs[0] != expected:
            raise UnsupportedWorkload(f"{self.name}: dloss must be {expected}, not {spec.inputs[0]}")

    def output_specs(self, spec: OpSpec) -> tuple[TensorSpec, ...]:
        """``(dh, dW[, db])``, like h, W and b."""
        return self._grad_outputs(spec)

    def reference(self, spec: OpSpec, inputs: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        return _autograd(spec, inputs[0], inputs[1:], torch.float32)[1:]

    def reference_fp64(self, spec: OpSpec, inputs: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        return _autograd(spec, inputs[0].double(), _wide(inputs[1:]), torch.float64)[1:]

    def error_floors(
        self, spec: OpSpec, inputs: Sequence[torch.Tensor], refs64: Sequence[torch.Tensor]
    ) -> tuple[ErrorFloor, ...]:
        return _gradient_floors(spec, inputs[1:], inputs[0], refs64)

    def make_inputs(
        self, spec: OpSpec, seed: int, distribution: str = "normal", device: str | torch.device = "cuda"
    ) -> tuple[torch.Tensor, ...]:
        """The forward's inputs, and ``dloss`` of magnitude in [0.5, 2) with a random sign."""
        forward = make_forward_inputs(spec, seed, distribution, device)
        g = generator(seed ^ 0x5EED_D1FF, device)
        shape = spec.inputs[0].shape
        dloss = (0.5 + 1.5 * torch.rand(shape, generator=g, device=device)) * (
            torch.randint(0, 2, shape, generator=g, device=device) * 2 - 1
        )
        return (dloss, *forward)


class LinearCrossEntropyFused(_LinearCrossEntropyGradient):
    name = FUSED_NAME
    summary = "linear + cross-entropy loss and its gradients dh, dW (, db) for an upstream gradient of 1"
    shape_help = _FORWARD.shape_help + "; the outputs are the loss, dh, dW (and db)"

    def spec(self, shape: tuple[int, ...], dtype: str, **constants: Any) -> OpSpec:
        return command_line_spec(self.name, shape, dtype, constants)

    def spec_for(self, *inputs: torch.Tensor, **constants: Any) -> OpSpec:
        return forward_spec_for(self.name, inputs, constants)

    def output_specs(self, spec: OpSpec) -> tuple[TensorSpec, ...]:
        t, _, _ = shape_of(spec)
        loss = TensorSpec((t,) if spec.const("reduction") == "none" else (), "float32")
        return (loss, *self._grad_outputs(spec))

    def reference(self, spec: OpSpec, inputs: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        return _autograd(spec, None, inputs, torch.float32)

    def reference_fp64(self, spec: OpSpec, inputs: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        return _autograd(spec, None, _wide(inputs), torch.float64)

    def error_floors(
        self, spec: OpSpec, inputs: Sequence[torch.Tensor], refs64: Sequence[torch.Tensor]
    ) -> tuple[ErrorFloor, ...]:
        """The loss's floor as the forward's, the gradients' for an upstream gradient of 1."""
        (loss,) = _FORWARD.error_floors(spec, inputs, refs64[:1])
        return (loss, *_gradient_floors(spec, inputs, None, refs64[1:]))

    def make_inputs(
        self, spec: OpSpec, seed: int, distribution: str = "normal", device: str | torch.device = "cuda"
    ) -> tuple[torch.Tensor, ...]:
        return tuple(make_forward_inputs(spec, seed, distribution, device))


OP = LinearCrossEntropyBackward()
FUSED = LinearCrossEntropyFused()

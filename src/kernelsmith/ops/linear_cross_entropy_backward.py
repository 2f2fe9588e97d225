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
What a call allocates besides its inputs and outputs (:func:`chunked_scratch_bytes`, also
``OP.scratch_bytes(spec, config)``), all of it float32 and alive for the whole call, in bytes:

    4 * min(CHUNK, T) * V    the chunk's logits (then, in place, their gradient g)
  + 4 * V * H                the dW accumulator, if DW_ACC is float32 and W is not
  + 4 * V                    the db accumulator, if there is a bias and it is not float32
  + 4 * T                    the per-row losses before "mean"/"sum" (the fused op only)
  + 4                        the scale 1 / (tokens not ignored), for "mean"

At 16k tokens, V 128256, H 2048 in bfloat16 the first two terms are up to 4 GiB (CHUNK 8192) and
1 GiB, against the 4 GiB of bfloat16 logits the fused loss exists not to hold, so the search's
space caps them (:func:`scratch_cap_bytes`, ``KERNELSMITH_LCE_SCRATCH_MIB``): by default 3/16 of
the ``T x V x 2``-byte logits, at least 64 MiB, and never below the smallest config's need.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch
import triton

from kernelsmith import settings
from kernelsmith.ops._base import (
    FINITE_STRESS_DISTRIBUTIONS,
    NO_FLOOR,
    Launcher,
    OpFamily,
    UnsupportedWorkload,
    Variant,
    generator,
)
from kernelsmith.ops._cross_entropy_kernels import _ceb_mean_scale_kernel, _ceb_online_row_kernel
from kernelsmith.ops._cross_entropy_launch import (
    _REDUCE_BLOCK,
    _SCALE_PER_ROW,
    _checked,
    _reducer,
    scale_mode,
)
from kernelsmith.ops._launch import direct_launch
from kernelsmith.ops._linear_cross_entropy_kernels import _lceb_cast_kernel, _lceb_gemm_kernel, _lceb_logits_kernel
from kernelsmith.ops._softmax_condition import centered_spread, floor_of, probability_error
from kernelsmith.ops.linear_cross_entropy import (
    LCE_MODULES,
    TILE_M,
    command_line_spec,
    constants_of,
    cross_entropy_spec,
    dtype_of,
    first_forward_input,
    forward_spec_for,
    has_bias,
    make_forward_inputs,
    reference_loss,
    shape_of,
    softmax_conditions,
    tail_specs,
    tile_constraints,
    tile_flags,
    tile_params,
)
from kernelsmith.ops.linear_cross_entropy import (
    OP as _FORWARD,
)
from kernelsmith.space import Config, Constraint, Param, Space, next_power_of_two, powers_of_two
from kernelsmith.spec import OpSpec, TensorSpec

if TYPE_CHECKING:
    from kernelsmith.ops._base import ErrorFloor

BACKWARD_NAME = "linear_cross_entropy_backward"
FUSED_NAME = "linear_cross_entropy_fused"

# =================================================================================================
# Space and builder
# =================================================================================================

CHUNKS = powers_of_two(16, 8192)
MAX_CHUNKS = 64  # smaller chunks than this many per call are not worth timing (or the largest)
ROW_BLOCKS = powers_of_two(64, 8192)
DW_ACCUMULATORS = ("float32", "output")
_CAST_BLOCK = 1024
_AUX_WARPS = 4


# The memory cap. The fused loss exists to not hold the (T, V) logits, so its scratch (the Memory
# section above) should stay well under them whatever the tuner finds fastest: by default at most
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
    """Bytes one call of the chunked launcher allocates for ``spec`` under ``config`` besides its
    inputs and outputs (float32, all alive for the whole call): the formula of the module's Memory
    section. Only ``CHUNK`` and ``DW_ACC`` of the config matter."""
    t, h, v = shape_of(spec)
    low_precision = dtype_of(spec).dtype != "float32"
    reduction = str(spec.const("reduction"))
    float32 = 4
    chunk_logits = min(int(config["CHUNK"]), t) * v
    dw_accumulator = v * h if config["DW_ACC"] == "float32" and low_precision else 0
    db_accumulator = v if has_bias(spec) and low_precision else 0
    row_losses = t if spec.op == FUSED_NAME and reduction != "none" else 0
    mean_scale = 1 if reduction == "mean" else 0
    return float32 * (chunk_logits + dw_accumulator + db_accumulator + row_losses + mean_scale)


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


def _chunked_space(spec: OpSpec, prune: bool = True) -> Space:
    """The chunked variant's space. ``prune`` (the search's space) also keeps chunk sizes to
    those that make sense for ``T`` tokens and scratch under the memory cap; builds check without
    it, because validation runs a config chosen for ``T`` tokens on fewer (tails of 1, 7, ...
    tokens), and a stored config stays correct whatever cap the user sets later."""
    t, h, v = shape_of(spec)
    element_size = dtype_of(spec).torch_dtype.itemsize
    widest_row = max(ROW_BLOCKS[0], next_power_of_two(v))
    dw_choices = DW_ACCUMULATORS if dtype_of(spec).dtype != "float32" else DW_ACCUMULATORS[:1]
    smallest_above = next(c for c in CHUNKS if c >= min(t, CHUNKS[-1]))

    def chunk_fits(chunk: int) -> bool:
        return chunk <= smallest_above and (triton.cdiv(t, chunk) <= MAX_CHUNKS or chunk == CHUNKS[-1])

    # Scratch depends only on (CHUNK, DW_ACC), and every pair the chunk rules allow has the same
    # tilings, so the smallest scratch over those pairs is met by some config of the space.
    scratch = {(c, d): chunked_scratch_bytes(spec, {"CHUNK": c, "DW_ACC": d}) for c in CHUNKS for d in dw_choices}
    cap = max(scratch_cap_bytes(spec), min(n for (c, _), n in scratch.items() if chunk_fits(c)))
    chunk_constraints = [
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
    return Space(
        [*tile_params(), Param("CHUNK", CHUNKS), Param("BLOCK_V", ROW_BLOCKS), Param("DW_ACC", dw_choices)],
        [
            # One tiling serves (CHUNK, V, H), (CHUNK, H, V) and (V, H, CHUNK) GEMMs: bounded by
            # the larger of V and H in every dimension (not by the token count, which tails change).
            *tile_constraints(max(v, h), max(v, h), max(h, v), element_size),
            *(chunk_constraints if prune else []),
            Constraint("BLOCK_V no wider than the padded row", lambda c: c["BLOCK_V"] <= widest_row),
            Constraint(
                "at most 512 steps over a row (or the widest block)",
                lambda c: triton.cdiv(v, c["BLOCK_V"]) <= 512 or c["BLOCK_V"] == ROW_BLOCKS[-1],
            ),
        ],
    )


def _row_warps(block_v: int) -> int:
    """Warps of the row kernel: about 16 columns a thread, 1 to 16 warps."""
    return max(1, min(16, block_v // (32 * 16)))


class _Plan:
    """What a launcher of one spec precomputes: shapes, constants, scale mode, kernels by grid."""

    def __init__(self, spec: OpSpec, config: Config) -> None:
        self.fused = spec.op == FUSED_NAME
        self.t, self.h, self.v = shape_of(spec)
        self.reduction, self.ignore_index, self.smoothing, self.softcap = constants_of(spec)
        self.bias = has_bias(spec)
        self.chunk = min(int(config["CHUNK"]), self.t)
        self.block_v = int(config["BLOCK_V"])
        self.dw_scratch = config["DW_ACC"] == "float32" and dtype_of(spec).dtype != "float32"
        self.db_scratch = dtype_of(spec).dtype != "float32"
        self.scale_mode = scale_mode(self.reduction, self.fused)
        self.count = direct_launch(_ceb_mean_scale_kernel, (1,)) if self.reduction == "mean" else None
        self.count_block = min(_REDUCE_BLOCK, next_power_of_two(self.t))
        self.reduce = _reducer(cross_entropy_spec(spec)) if self.fused else None
        bm, bn = config["BLOCK_M"], config["BLOCK_N"]
        self.tiles = {
            "BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": config["BLOCK_K"], **tile_flags(dtype_of(spec).dtype),
            "num_warps": config["num_warps"], "num_stages": config["num_stages"],
        }  # fmt: skip
        sizes = {self.chunk, self.t - (self.t // self.chunk) * self.chunk} - {0}
        self.logits = {
            c: direct_launch(_lceb_logits_kernel, (triton.cdiv(c, bm), triton.cdiv(self.v, bn))) for c in sizes
        }
        self.rows = {c: direct_launch(_ceb_online_row_kernel, (c,)) for c in sizes}
        self.dh = {c: direct_launch(_lceb_gemm_kernel, (triton.cdiv(c, bm), triton.cdiv(self.h, bn))) for c in sizes}
        self.dw = direct_launch(_lceb_gemm_kernel, (triton.cdiv(self.v, bm), triton.cdiv(self.h, bn)))
        self.cast_dw = direct_launch(_lceb_cast_kernel, (triton.cdiv(self.v * self.h, _CAST_BLOCK),))
        self.cast_db = direct_launch(_lceb_cast_kernel, (triton.cdiv(self.v, _CAST_BLOCK),))

    def launch(self, inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> None:
        if self.fused:
            hidden, weight, target = inputs[:3]
            loss, dh, dw = outputs[:3]
            dloss = loss
        else:
            dloss, hidden, weight, target = inputs[:4]
            dh, dw = outputs[:2]
            loss = dh
        bias = inputs[-1] if self.bias else weight  # (an unread stand-in pointer without a bias)
        db = outputs[-1] if self.bias else dw
        scale = dloss
        if self.count is not None:
            scale = dh.new_empty((1,), dtype=torch.float32)
            self.count(dloss, target, scale, self.t, self.ignore_index,
                       UNIT=self.fused, BLOCK_R=self.count_block, num_warps=_AUX_WARPS)  # fmt: skip
        losses = loss
        if self.fused and self.reduce is not None:
            losses = dh.new_empty((self.t,), dtype=torch.float32)
        dw_acc = dw.new_empty(dw.shape, dtype=torch.float32) if self.dw_scratch else dw
        db_acc = db.new_empty((self.v,), dtype=torch.float32) if self.bias and self.db_scratch else db
        z_all = dh.new_empty((self.chunk, self.v), dtype=torch.float32)
        v, h = self.v, self.h
        for start in range(0, self.t, self.chunk):
            c = min(self.chunk, self.t - start)
            h_c, t_c, z, dh_c = hidden[start : start + c], target[start : start + c], z_all[:c], dh[start : start + c]
            self.logits[c](h_c, weight, bias, z, c, v, h, h_c.stride(0), weight.stride(0), z.stride(0), self.softcap,
                           HAS_BIAS=self.bias, CAP=self.softcap > 0, **self.tiles)  # fmt: skip
            scale_c = scale[start : start + c] if self.scale_mode == _SCALE_PER_ROW else scale
            losses_c = losses[start : start + c] if self.fused else losses
            # g over z in place: cross-entropy backward's row kernel, soft-cap factor included.
            self.rows[c](
                z, t_c, scale_c, z, losses_c, z.stride(0), z.stride(0), v, self.ignore_index, self.smoothing,
                BLOCK_V=self.block_v, SCALE=self.scale_mode, LOSS=self.fused, SMOOTH=self.fused and self.smoothing > 0,
                NUM_STAGES=2, softcap=self.softcap if self.softcap > 0 else 1.0, CAP=self.softcap > 0,
                num_warps=_row_warps(self.block_v),
            )  # fmt: skip
            # dh_c = g @ W: (c, V) @ (V, H).
            self.dh[c](z, weight, dh_c, dh_c, c, h, v, z.stride(0), 1, weight.stride(0), 1, dh_c.stride(0), 0,
                       ROW_SUM=False, **self.tiles)  # fmt: skip
            # dW (+)= g.T @ h_c: (V, c) @ (c, H); db (+)= the row sums of g.T.
            self.dw(z, h_c, dw_acc, db_acc, v, h, c, 1, z.stride(0), h_c.stride(0), 1, dw_acc.stride(0),
                    int(start > 0), ROW_SUM=self.bias, **self.tiles)  # fmt: skip
        if self.dw_scratch:
            self.cast_dw(dw_acc, dw, v * h, BLOCK=_CAST_BLOCK, num_warps=_AUX_WARPS)
        if self.bias and self.db_scratch:
            self.cast_db(db_acc, db, v, BLOCK=_CAST_BLOCK, num_warps=_AUX_WARPS)
        if self.reduce is not None:
            self.reduce(losses, target, loss)


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
        modules=(*LCE_MODULES, "kernelsmith.ops.linear_cross_entropy"),
    ),
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

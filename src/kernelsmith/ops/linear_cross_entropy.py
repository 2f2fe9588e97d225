"""Fused linear + cross-entropy: ``F.cross_entropy(F.linear(h, W, b).float(), target)`` without
ever materializing the ``(tokens x vocabulary)`` logits.

The op
------
Inputs: ``h`` of shape ``(T, H)`` (T tokens of hidden size H), the LM head's weight ``W`` of
shape ``(V, H)`` (as ``nn.Linear`` stores it), int64 ``target`` of shape ``(T,)`` and, when the
spec has four inputs, a bias ``b`` of shape ``(V,)``; ``h``, ``W`` and ``b`` in one of float16,
bfloat16 or float32. Constants: cross-entropy's own (``reduction`` "mean"/"sum"/"none",
``ignore_index`` default -100, ``label_smoothing`` in [0, 1]; see
:mod:`kernelsmith.ops.cross_entropy`) and ``softcap`` (0: none), Gemma 2's final-logit
soft-capping. The output is the float32 loss: 0-d for "mean"/"sum", ``(T,)`` for "none".

The math
--------
The logits of a token are ``z = W h + b`` (float32 accumulation), soft-capped when ``softcap``
``c > 0``:  ``z <- c * tanh(z / c)``. The loss of a row is cross-entropy's,

    loss = log(s) + (1 - eps) (m - z[t]) + eps (m - mean_j z[j]),   m = max_j z[j],
    s = sum_j exp(z[j] - m)

(:func:`kernelsmith.ops._cross_entropy_kernels._ce_row_loss`, shared). ``m`` and ``s`` are found online,
tile by tile: when a new tile of logits raises the max from ``m`` to ``m'``, ``s`` is rescaled by
``exp(m - m')``. So the forward never stores a logit: one kernel is a tiled matmul whose epilogue
folds each ``BLOCK_M x BLOCK_N`` tile of logits, still in registers, into per-row running
``(m, s, z[t], sum z)``; each of ``SPLITS`` programs per row block walks ``~V / SPLITS`` columns,
and a small combine kernel merges the splits into per-row losses. "mean"/"sum" are the
cross-entropy family's deterministic float64 reduction kernel.

Rows whose target is ``ignore_index`` lose 0 and are not counted ("mean" over every row ignored
is NaN, as torch). A target outside ``[0, V)`` that is not ``ignore_index`` cannot raise inside a
kernel: its row's loss is NaN (the kernels never read outside the logits; "mean"/"sum" are then
NaN too). :func:`check_targets` raises torch's ``IndexError`` instead; :meth:`spec_for` (the
front doors' path) calls it on the example targets and the references raise as
``F.cross_entropy`` does.

Soft-capping is computed without ``tanh`` (``tl.math`` lacks it): ``tanh(x) = sign(x) (1 - e) /
(1 + e)`` with ``e = exp(-2|x|)`` (never overflows), and its Taylor series below ``|x| < 1/4``,
where ``1 - e`` would cancel.

Memory: besides its inputs and output a call allocates float32 ``(4, T, n_splits)`` running
statistics (``n_splits <= SPLITS``, :func:`split_layout`) and, for "mean"/"sum", the ``(T,)``
per-row losses: ``4 * T * (4 * n_splits + 1)`` bytes, at most 516 a token (32 splits), never
growing with the vocabulary (:func:`online_lse_scratch_bytes`), so the forward's space has no
memory cap; the backward's chunk scratch does grow with it, and its space is capped.

The gradients are in :mod:`kernelsmith.ops.linear_cross_entropy_backward`; the kernels of both
in :mod:`kernelsmith.ops._linear_cross_entropy_kernels`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import triton

from kernelsmith.ops._base import NO_FLOOR, Launcher, OpFamily, UnsupportedWorkload, Variant, generator, tail_rows
from kernelsmith.ops._cross_entropy_launch import CROSS_ENTROPY_MODULES, _checked, _reducer
from kernelsmith.ops._launch import direct_launch
from kernelsmith.ops._linear_cross_entropy_kernels import _lce_combine_kernel, _lce_stats_kernel
from kernelsmith.ops._matmul_kernels import INTERPRETED
from kernelsmith.ops._softmax_condition import LOGIT_ERROR, floor_of, logit_error
from kernelsmith.ops.cross_entropy import _checked_constants
from kernelsmith.space import Config, Constraint, Param, Space, next_power_of_two
from kernelsmith.spec import OpSpec, TensorSpec, dtype_name

if TYPE_CHECKING:
    from kernelsmith.ops._base import ErrorFloor

# What the variants' source hash covers besides this module: the kernels of the three linear +
# cross-entropy families, the cross-entropy row kernels and launchers they reuse, matmul's kernels
# module (its _dot helper, which their tiles call) and the activations that module's epilogues
# call, so that a change in any of them invalidates stored decisions (the backward and fused
# families add this module).
LCE_MODULES = (
    "kernelsmith.ops._linear_cross_entropy_kernels",
    *CROSS_ENTROPY_MODULES,
    "kernelsmith.ops._matmul_kernels",
    "kernelsmith.ops.gelu",
    "kernelsmith.ops._elementwise",
)

NAME = "linear_cross_entropy"

# =================================================================================================
# Shapes, constants and the config space
# =================================================================================================

TILE_M = (16, 32, 64, 128)
TILE_N = (32, 64, 128, 256)
TILE_K = (32, 64, 128)
SPLITS = (1, 2, 4, 8, 16, 32)
WARPS = (4, 8)
STAGES = (2, 3, 4)
SHARED_MEMORY_BUDGET = 220 * 1024  # pipelined (h, W) tiles: Hopper allows 227 KiB a block
MAX_ACCUMULATORS_PER_THREAD = 128  # float32 logits a thread (255 registers in all)
_COMBINE_ELEMENTS = 2048  # ROWS * next_power_of_two(splits) values a combine program holds
_AUX_WARPS = 4


def has_bias(spec: OpSpec) -> bool:
    return bool(spec.const("bias"))


def first_forward_input(spec: OpSpec) -> int:
    """Where ``h`` is among a spec's inputs: the forward's ``(h, W, target[, b])`` follow a
    backward's ``dloss`` (1) or start the inputs (0)."""
    return len(spec.inputs) - (4 if has_bias(spec) else 3)


def shape_of(spec: OpSpec) -> tuple[int, int, int]:
    """``(T, H, V)``: tokens, hidden size, vocabulary."""
    at = first_forward_input(spec)
    t, h = spec.inputs[at].shape
    return t, h, spec.inputs[at + 1].shape[0]


def dtype_of(spec: OpSpec) -> TensorSpec:
    """The spec of ``h`` (whose dtype W and b share)."""
    return spec.inputs[first_forward_input(spec)]


def constants_of(spec: OpSpec) -> tuple[str, int, float, float]:
    """``(reduction, ignore_index, label_smoothing, softcap)``."""
    return (
        str(spec.const("reduction")),
        int(spec.const("ignore_index")),
        float(spec.const("label_smoothing")),
        float(spec.const("softcap")),
    )


def cross_entropy_spec(spec: OpSpec) -> OpSpec:
    """The cross-entropy spec of the same (T, V) logits (for its reduction kernel)."""
    t, _, v = shape_of(spec)
    reduction, ignore_index, smoothing, _ = constants_of(spec)
    logits = TensorSpec((t, v), "float32")
    constants = {"reduction": reduction, "ignore_index": ignore_index, "label_smoothing": smoothing}
    return OpSpec("cross_entropy", (logits, TensorSpec((t,), "int64")), constants)


def tile_flags(dtype: str) -> dict[str, bool]:
    """IEEE float32 products for float32 inputs (PyTorch's default matmul precision); UPCAST for
    bfloat16 in the interpreter, whose bfloat16 dot is wrong (see kernelsmith.ops.matmul)."""
    return {"IEEE": dtype == "float32", "UPCAST": INTERPRETED and dtype == "bfloat16"}


def tile_constraints(m: int, n: int, k: int, element_size: int) -> list[Constraint]:
    """What a (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages) tiling of an (m, n, k) product
    must satisfy: tiles no larger than the padded problem (the smallest always allowed), the
    accumulator in registers without idle warps, the pipelined tiles in shared memory."""
    widest = {"BLOCK_M": max(TILE_M[0], next_power_of_two(m)), "BLOCK_N": max(TILE_N[0], next_power_of_two(n)),
              "BLOCK_K": max(TILE_K[0], next_power_of_two(k))}  # fmt: skip
    return [
        Constraint(
            "tiles no larger than the padded problem",
            lambda c: all(c[name] <= limit for name, limit in widest.items()),
        ),
        Constraint(
            f"at most {MAX_ACCUMULATORS_PER_THREAD} accumulators a thread",
            lambda c: c["BLOCK_M"] * c["BLOCK_N"] <= MAX_ACCUMULATORS_PER_THREAD * 32 * c["num_warps"],
        ),
        Constraint(
            "more warps only for tiles that keep them busy (16 accumulators a thread)",
            lambda c: c["num_warps"] == WARPS[0] or c["BLOCK_M"] * c["BLOCK_N"] >= 16 * 32 * c["num_warps"],
        ),
        Constraint(
            f"the pipelined tiles fit in {SHARED_MEMORY_BUDGET // 1024} KiB of shared memory",
            lambda c: (
                (c["BLOCK_M"] + c["BLOCK_N"]) * c["BLOCK_K"] * element_size * c["num_stages"] <= SHARED_MEMORY_BUDGET
            ),
        ),
    ]


def tile_params() -> list[Param]:
    return [
        Param("BLOCK_M", TILE_M),
        Param("BLOCK_N", TILE_N),
        Param("BLOCK_K", TILE_K),
        Param("num_warps", WARPS),
        Param("num_stages", STAGES),
    ]


def _online_lse_space(spec: OpSpec, prune: bool = True) -> Space:
    """The forward's space. ``prune`` (the search's space) also drops row tiles taller than the
    padded token count; builds check without it, because validation runs a config chosen for
    ``T`` tokens on fewer (tails of 1, 7, ... tokens)."""
    t, h, v = shape_of(spec)
    t = t if prune else TILE_M[-1]
    element_size = dtype_of(spec).torch_dtype.itemsize
    return Space(
        [*tile_params(), Param("SPLITS", SPLITS)],
        [
            *tile_constraints(t, v, h, element_size),
            Constraint(
                "every split holds at least one column tile",
                lambda c: c["SPLITS"] == 1 or c["SPLITS"] * c["BLOCK_N"] <= next_power_of_two(v),
            ),
        ],
    )


def split_layout(vocab: int, splits: int, block_n: int) -> tuple[int, int]:
    """``(split_cols, n_splits)``: about ``vocab / splits`` columns a split in whole tiles."""
    split_cols = triton.cdiv(triton.cdiv(vocab, splits), block_n) * block_n
    return split_cols, triton.cdiv(vocab, split_cols)


def online_lse_scratch_bytes(spec: OpSpec, config: Config) -> int:
    """Bytes one call of the forward allocates besides its inputs and output for ``config``:
    float32 ``(4, T, n_splits)`` statistics, plus ``(T,)`` losses unless the reduction is "none"."""
    t, _, v = shape_of(spec)
    _, n_splits = split_layout(v, config["SPLITS"], config["BLOCK_N"])
    row_losses = t if spec.const("reduction") != "none" else 0
    return 4 * (4 * t * n_splits + row_losses)


def _online_lse_build(spec: OpSpec, config: Config) -> Launcher:
    _checked(_online_lse_space(spec, prune=False), config)
    t, h, v = shape_of(spec)
    _, ignore_index, smoothing, softcap = constants_of(spec)
    bias = has_bias(spec)
    block_m = config["BLOCK_M"]
    split_cols, n_splits = split_layout(v, config["SPLITS"], config["BLOCK_N"])
    plane_stride = t * n_splits
    stats_kernel = direct_launch(_lce_stats_kernel, (triton.cdiv(t, block_m), n_splits))
    splits_p2 = next_power_of_two(n_splits)
    combine_rows = max(1, min(next_power_of_two(t), _COMBINE_ELEMENTS // splits_p2))
    combine = direct_launch(_lce_combine_kernel, (triton.cdiv(t, combine_rows),))
    reduce = _reducer(cross_entropy_spec(spec))
    meta = {
        "BLOCK_M": block_m, "BLOCK_N": config["BLOCK_N"], "BLOCK_K": config["BLOCK_K"], "HAS_BIAS": bias,
        "CAP": softcap > 0, "SMOOTH": smoothing > 0, **tile_flags(dtype_of(spec).dtype),
        "num_warps": config["num_warps"], "num_stages": config["num_stages"],
    }  # fmt: skip

    def launch(inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> None:
        hidden, weight, target = inputs[:3]
        b = inputs[3] if bias else weight  # (an unread stand-in pointer without a bias)
        out = outputs[0]
        stats = out.new_empty((4, t, n_splits))
        stats_kernel(
            hidden, weight, b, target, stats, t, v, h, hidden.stride(0), weight.stride(0), n_splits, split_cols,
            plane_stride, softcap, **meta,
        )  # fmt: skip
        losses = out if reduce is None else out.new_empty((t,))
        combine(
            target, stats, losses, t, v, n_splits, plane_stride, ignore_index, smoothing,
            ROWS=combine_rows, SPLITS=splits_p2, SMOOTH=smoothing > 0, num_warps=_AUX_WARPS,
        )  # fmt: skip
        if reduce is not None:
            reduce(losses, target, out)

    return launch


# =================================================================================================
# The op family
# =================================================================================================

_TORCH_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def checked_constants(bias: Any = False, softcap: Any = None, **cross_entropy: Any) -> dict[str, Any]:
    """The spec's constants, validated: cross-entropy's, ``bias`` and ``softcap`` (None or 0:
    none; else a finite number > 0)."""
    constants = _checked_constants(**cross_entropy)
    cap = 0.0 if softcap is None else softcap
    if isinstance(cap, bool) or not isinstance(cap, int | float) or not math.isfinite(cap) or cap < 0:
        raise UnsupportedWorkload(f"{NAME}: softcap must be None or a finite number > 0, not {softcap!r}")
    return {**constants, "softcap": float(cap), "bias": bool(bias)}


def check_targets(target: torch.Tensor, vocab: int, ignore_index: int) -> None:
    """Raise ``F.cross_entropy``'s IndexError for a target outside ``[0, vocab)`` that is not
    ``ignore_index`` (the kernels cannot raise: they give such a row a NaN loss)."""
    bad = (target != ignore_index) & ((target < 0) | (target >= vocab))
    if bool(bad.any()):
        value = int(target[bad][0])
        raise IndexError(f"Target {value} is out of bounds.")


def reference_loss(inputs: Sequence[torch.Tensor], spec: OpSpec, dtype: torch.dtype) -> torch.Tensor:
    """``F.cross_entropy(softcap(F.linear(h, W, b).to(dtype)), target)``: the product in the
    inputs' own precision, the loss in ``dtype`` (float32: training code's upcast form)."""
    reduction, ignore_index, smoothing, softcap = constants_of(spec)
    hidden, weight, target = inputs[:3]
    bias = inputs[3] if has_bias(spec) else None
    z = torch.nn.functional.linear(hidden, weight, bias).to(dtype)
    if softcap > 0:
        z = softcap * torch.tanh(z / softcap)
    return torch.nn.functional.cross_entropy(
        z, target, reduction=reduction, ignore_index=ignore_index, label_smoothing=smoothing
    )


@dataclass(frozen=True)
class SoftmaxCondition:
    """What rounding the logits can do to some rows of a draw's softmax
    (:mod:`kernelsmith.ops._softmax_condition`), in float64 from the forward inputs: for the
    ``rows`` of the chunk, ``p`` their ``(rows, V)`` softmax, ``error`` the bound ``a`` on each
    logit's error, ``share`` each row's weight in the reduced outputs (0 for an ignored row,
    ``1 / count`` for "mean", else 1), ``smoothed`` the label-smoothed targets ``y`` (a row's loss
    is ``lse(z) - y . z``)."""

    rows: slice
    p: torch.Tensor
    error: torch.Tensor
    share: torch.Tensor
    smoothed: torch.Tensor


# The chunks of rows the conditions are computed for hold at most this many logits (a few float64
# (rows, V) temporaries of 256 MiB each: the whole (T, V) would be tens of GiB at an LM head's size).
_CONDITION_LOGITS = 2**25


def softmax_conditions(spec: OpSpec, forward: Sequence[torch.Tensor]) -> list[SoftmaxCondition]:
    """The draw's :class:`SoftmaxCondition`, chunk by chunk of rows; none when no row counts
    (every target ignored, or one out of range: the references are NaN or raise there).

    A logit ``z = W h + b`` is a dot product of ``H`` terms plus the bias: its rounding errors
    scale with ``|W| |h| + |b|``. The reference (``F.linear`` in the inputs' dtype, then the
    upcast) also rounds each logit once to that dtype, an error of up to half its epsilon times
    ``|z|``: a kernel that keeps its logits in the inputs' dtype as the reference does (the
    library-GEMM variant) rounds them just as much, but at other places than PyTorch's own GEMM
    (another kernel, another summation order), and on a draw where PyTorch's roundings happen to
    cancel in a "mean" its error is many times PyTorch's (the H200, 2026-12-02: 4.3e-05 against
    4.9e-06 on 1000 tokens of "large" data). A soft-cap ``c tanh(u / c)`` shrinks the error of ``u``
    (its slope is at most 1) and adds its own rounding, of a few ulps of ``c`` at most."""
    reduction, ignore_index, smoothing, softcap = constants_of(spec)
    hidden, weight, target = forward[0], forward[1].double(), forward[2]
    stored = torch.finfo(hidden.dtype).eps / 2  # the reference's rounding of each logit to the inputs' dtype
    bias = forward[3].double() if has_bias(spec) else None
    tokens, vocab = target.shape[0], weight.shape[0]
    kept = target != ignore_index
    if not bool(kept.any()) or bool(((target < 0) | (target >= vocab))[kept].any()):
        return []
    share = kept.double() / (int(kept.sum()) if reduction == "mean" else 1)
    step = max(1, _CONDITION_LOGITS // vocab)
    conditions = []
    for start in range(0, tokens, step):
        rows = slice(start, min(start + step, tokens))
        h = hidden[rows].double()
        logits, magnitude = h @ weight.T, h.abs() @ weight.abs().T
        if bias is not None:
            logits, magnitude = logits + bias, magnitude + bias.abs()
        error = logit_error(magnitude) + stored * logits.abs() + LOGIT_ERROR * softcap
        if softcap > 0:
            logits = softcap * torch.tanh(logits / softcap)
        smoothed = torch.full_like(logits, smoothing / vocab)
        chunk_kept = kept[rows]
        at = torch.arange(rows.stop - rows.start, device=target.device)[chunk_kept]
        smoothed[at, target[rows][chunk_kept]] += 1.0 - smoothing
        conditions.append(SoftmaxCondition(rows, torch.softmax(logits, dim=-1), error, share[rows], smoothed))
    return conditions


def loss_error_bound(conditions: Sequence[SoftmaxCondition], reduction: str) -> torch.Tensor:
    """How far rounding the logits can move the loss (per row for "none", else the reduced one).

    A row's loss is ``lse(z) - y . z``. With logit errors ``|d_j| <= a_j`` (at most ``A`` on
    the row), ``lse(z + d) - lse(z) = log sum_j p_j e^{d_j} = p . d + R`` with
    ``0 <= R <= A^2 / 2`` (Jensen's inequality below; Hoeffding's lemma above, ``d`` ranging over
    ``2A``), so the loss moves by ``(p - y) . d + R``: the logits' independent errors in
    quadrature (:mod:`kernelsmith.ops._softmax_condition`), ``sqrt(sum_j (p_j - y_j)^2 a_j^2)``,
    plus ``A^2 / 2``, small on a confident right row (``p`` close to ``y``) however large its
    logits. Rows are independent too: a sum or mean adds their bounds in quadrature."""
    per_row = []
    for c in conditions:
        largest = c.error.amax(dim=-1)
        linear = ((c.p - c.smoothed) * c.error).square().sum(dim=-1).sqrt()
        per_row.append((linear + largest * largest / 2) * (c.share > 0))
    rows = torch.cat(per_row)
    if reduction == "none":
        return rows
    return (rows * torch.cat([c.share for c in conditions])).square().sum().sqrt()


def make_forward_inputs(spec: OpSpec, seed: int, distribution: str, device: str | torch.device) -> list[torch.Tensor]:
    """``[h, W, target(, b)]`` for ``distribution`` (see :meth:`LinearCrossEntropy.make_inputs`)."""
    t, h, v = shape_of(spec)
    _, ignore_index, _, _ = constants_of(spec)
    dtype = dtype_of(spec).torch_dtype
    g = generator(seed, device)
    hidden = torch.randn((t, h), generator=g, device=device)
    weight = torch.randn((v, h), generator=g, device=device) / math.sqrt(h)
    target = torch.randint(0, v, (t,), generator=g, device=device)
    if distribution == "large":
        hidden = hidden * 8
    elif distribution == "peaked":
        # h pushed along the target's row of W (another row on odd tokens) so that one logit
        # stands about 30 + log(V) over the rest: a confident model, right or wrong.
        rows = torch.arange(t, device=device)
        other = (target + torch.randint(1, max(v, 2), (t,), generator=g, device=device)) % v
        hot = weight[torch.where(rows % 2 == 0, target, other)]
        norm2 = (hot * hot).sum(dim=1, keepdim=True).clamp_min(1e-6)
        hidden = hidden + hot * (30.0 + math.log(v)) / norm2
    elif distribution != "normal":
        raise ValueError(f"{NAME}: unknown distribution {distribution!r} (known: normal, large, peaked)")
    ignored = torch.randperm(t, generator=g, device=device)[: int(t / 10 + 0.5)]
    target[ignored] = ignore_index
    inputs = [hidden.to(dtype), weight.to(dtype), target]
    if has_bias(spec):
        inputs.append((torch.randn((v,), generator=g, device=device) * 0.5).to(dtype))
    return inputs


def tail_specs(spec: OpSpec, row_block: int) -> list[OpSpec]:
    """``spec`` plus tail token counts (:func:`tail_rows`): h, the targets and a per-row
    ``dloss`` follow the count; W and b keep their shapes."""
    t, _, _ = shape_of(spec)
    at = first_forward_input(spec)
    token_inputs = {at, at + 2} | ({0} if at == 1 and spec.const("reduction") == "none" else set())
    specs = [spec]
    for r in tail_rows(t, row_block):
        inputs = tuple(x.with_shape((r, *x.shape[1:])) if i in token_inputs else x for i, x in enumerate(spec.inputs))
        specs.append(OpSpec(spec.op, inputs, dict(spec.constants)))
    return specs


def forward_spec_for(op: str, inputs: Sequence[torch.Tensor], constants: dict[str, Any]) -> OpSpec:
    """The spec of example ``(h, W, target[, b])`` under the op name ``op``, targets checked
    (:func:`check_targets`); UnsupportedWorkload for what the kernels do not handle."""
    if len(inputs) not in (3, 4) or not all(isinstance(x, torch.Tensor) for x in inputs):
        raise UnsupportedWorkload(f"{op} takes (h, W, target[, bias]) tensors, not {len(inputs)} inputs")
    hidden, weight, target = inputs[:3]
    for x in (hidden, weight, *inputs[3:]):
        if x.dtype not in _TORCH_DTYPES or x.dtype != hidden.dtype:
            raise UnsupportedWorkload(f"{op}: h, W and bias must share one of float16/bfloat16/float32, not {x.dtype}")
    if target.dtype != torch.int64:
        raise UnsupportedWorkload(f"{op}: targets must be int64 class indices, not {target.dtype}")
    given = dict(constants)
    given["bias"] = len(inputs) == 4
    spec = OpSpec(op, tuple(TensorSpec.of(x) for x in inputs), checked_constants(**given))
    check_forward_shapes(spec)
    if weight.dim() == 2 and target.dim() == 1 and target.device.type != "meta":  # (the backend's shapes)
        check_targets(target, weight.shape[0], int(spec.const("ignore_index")))
    return spec


def command_line_spec(op: str, shape: tuple[int, ...], dtype: str, constants: dict[str, Any]) -> OpSpec:
    """The forward inputs for ``--shape TxHxV``: h (T, H), W (V, H), target (T,), b (V,) with
    ``bias=True``."""
    shape = tuple(int(s) for s in shape)
    if len(shape) != 3:
        raise UnsupportedWorkload(f"{op}: --shape is tokens x hidden x vocabulary, not {shape}")
    t, h, v = shape
    name = dtype_name(dtype)
    constants = checked_constants(**constants)
    inputs = [TensorSpec((t, h), name), TensorSpec((v, h), name), TensorSpec((t,), "int64")]
    if constants["bias"]:
        inputs.append(TensorSpec((v,), name))
    spec = OpSpec(op, tuple(inputs), constants)
    check_forward_shapes(spec)
    return spec


def check_forward_shapes(spec: OpSpec) -> None:
    """UnsupportedWorkload unless the forward inputs are ``(h (T, H), W (V, H), target (T,)[,
    b (V,)])``, contiguous, non-empty, in one supported dtype; the constants valid."""
    op = spec.op
    at = first_forward_input(spec)
    forward = spec.inputs[at:]
    if len(forward) not in (3, 4):
        raise UnsupportedWorkload(f"{op}: expected (h, W, target[, bias]), not {len(forward)} inputs")
    hidden, weight, target = forward[:3]
    if len(hidden.shape) != 2 or len(weight.shape) != 2:
        raise UnsupportedWorkload(f"{op}: h must be (T, H) and W (V, H), not {hidden} and {weight}")
    t, h = hidden.shape
    v = weight.shape[0]
    if weight.shape[1] != h or target.shape != (t,) or target.dtype != "int64":
        raise UnsupportedWorkload(f"{op}: shapes {hidden}, {weight}, {target} do not fit together")
    if len(forward) == 4 and forward[3].shape != (v,):
        raise UnsupportedWorkload(f"{op}: the bias must be ({v},), not {forward[3]}")
    if min(t, h, v) <= 0:
        raise UnsupportedWorkload(f"{op}: empty inputs are not supported")
    if v >= 2**31 or t * max(h, v) >= 2**62:
        raise UnsupportedWorkload(f"{op}: too large for the kernels' offsets")
    for x in (hidden, weight, *forward[3:]):
        if x.dtype not in ("float16", "bfloat16", "float32") or x.dtype != hidden.dtype:
            raise UnsupportedWorkload(f"{op}: h, W and bias must share one of float16/bfloat16/float32")
    for x in spec.inputs:
        if not x.is_contiguous:
            raise UnsupportedWorkload(f"{op}: non-contiguous input {x} is not supported")
    checked_constants(**dict(spec.constants))


class LinearCrossEntropy(OpFamily):
    name = NAME
    summary = "cross-entropy of h @ W.T (+ b, optional soft-cap) against int64 targets, logits never stored"
    shape_help = (
        "tokens x hidden x vocabulary: --shape 16384x2048x128256 is h (16384, 2048), W (128256, 2048) "
        "and (16384,) int64 targets; bias=True adds a (128256,) bias; the loss is float32"
    )
    distributions = ("normal", "large", "peaked")
    row_block = TILE_M[-1]
    backward = "linear_cross_entropy_backward"
    variants = (
        Variant(
            "online_lse",
            "tiled h @ W.T whose epilogue folds each logits tile into a running log-sum-exp "
            "(logits stay in registers), SPLITS programs per row block, then a combine",
            _online_lse_space,
            _online_lse_build,
            modules=LCE_MODULES,
        ),
    )

    # ---- specs -----------------------------------------------------------------------------------
    def spec(self, shape: tuple[int, ...], dtype: str, **constants: Any) -> OpSpec:
        return command_line_spec(self.name, shape, dtype, constants)

    def spec_for(self, *inputs: torch.Tensor, **constants: Any) -> OpSpec:
        return forward_spec_for(self.name, inputs, constants)

    def check_supported(self, spec: OpSpec) -> None:
        check_forward_shapes(spec)

    def small_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        t, h, v = shape
        return (min(t, 32), min(h, 64), min(v, 512))

    def output_specs(self, spec: OpSpec) -> tuple[TensorSpec, ...]:
        t, _, _ = shape_of(spec)
        return (TensorSpec((t,) if spec.const("reduction") == "none" else (), "float32"),)

    def validation_specs(self, spec: OpSpec) -> list[OpSpec]:
        return tail_specs(spec, self.row_block)

    def stressed_inputs(self, spec: OpSpec) -> tuple[int, ...]:
        return (0,)  # h: the activations

    # ---- math ------------------------------------------------------------------------------------
    def reference(self, spec: OpSpec, inputs: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        """The training-code form: ``F.linear`` in the inputs' dtype, the logits upcast to float32."""
        return (reference_loss(inputs, spec, torch.float32),)

    def reference_fp64(self, spec: OpSpec, inputs: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        wide = [x.double() if x.is_floating_point() else x for x in inputs]
        return (reference_loss(wide, spec, torch.float64),)

    def error_floors(
        self, spec: OpSpec, inputs: Sequence[torch.Tensor], refs64: Sequence[torch.Tensor]
    ) -> tuple[ErrorFloor, ...]:
        """The loss's floor: what rounding the logits can do to it (:func:`loss_error_bound`)."""
        conditions = softmax_conditions(spec, inputs)
        if not conditions:
            return (NO_FLOOR,)
        return (floor_of(loss_error_bound(conditions, constants_of(spec)[0]), refs64[0]),)

    def make_inputs(
        self, spec: OpSpec, seed: int, distribution: str = "normal", device: str | torch.device = "cuda"
    ) -> tuple[torch.Tensor, ...]:
        """``h`` standard normal, ``W`` normal over ``sqrt(H)`` (logits about N(0, 1)), int64
        targets uniform in ``[0, V)`` with about 10% set to ``ignore_index``, and a bias
        ``N(0, 0.25)`` when the spec has one; deterministic in ``seed``.

        - ``normal``: an untrained model (losses about log V);
        - ``large``: ``h`` times 8: logits about N(0, 64), far from uniform;
        - ``peaked``: ``h`` pushed along the target's row of W on even tokens (another row on odd
          ones) so that logit stands ``30 + log(V)`` over the rest.
        """
        return tuple(make_forward_inputs(spec, seed, distribution, device))

    def bytes_moved(self, spec: OpSpec) -> int:
        return super().bytes_moved(spec)

    def flops(self, spec: OpSpec) -> int:
        t, h, v = shape_of(spec)
        return 2 * t * h * v + 5 * t * v

    def scratch_bytes(self, spec: OpSpec, config: Config) -> int:
        """The bytes a call allocates besides its inputs and output: :func:`online_lse_scratch_bytes`."""
        return online_lse_scratch_bytes(spec, config)


OP = LinearCrossEntropy()

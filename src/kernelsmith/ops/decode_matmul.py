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
code and the split-K reduction kernel.

Two fusions only a decode step affords (one row of activations costs nothing next to the weight)
are this family's own, each adding inputs after matmul's and constants a plain spec does not have:

``prologue="rmsnorm"`` (constant ``eps``; input ``gamma`` of ``(K,)``)
    ``x`` is Llama's RMSNorm of itself first, ``x * rsqrt(mean(x**2) + eps) * gamma``: the
    ``input_layernorm`` before QKV and the ``post_attention_layernorm`` before gate/up. Since
    ``1/rms`` is one factor per row, the kernels multiply ``x * gamma`` by the weight and scale the
    float32 sum by ``1/rms`` at the end; the sum of squares comes with the K loop (``gemv``) or, for
    a program that sees only a range of K, from one more pass over its rows of ``x`` (a few
    kilobytes, from L2) by the program that finishes the block. The reference is Hugging Face's
    ``LlamaRMSNorm`` (the normalized row rounded to the dtype, then times gamma) and ``F.linear``.
``epilogue="rope"`` with ``rope=(heads, kv_heads)`` (inputs ``cos`` and ``sin`` of ``(..., D)``)
    ``w`` is a fused QKV projection of ``(heads + 2 kv_heads) * D`` rows; q's and k's columns are
    rotated by Hugging Face's ``apply_rotary_pos_emb`` (``rotate_half``: channel ``j < D/2`` pairs
    with ``j + D/2``, as :mod:`kernelsmith.ops.rope`'s ``"half"`` style), at each row's own position
    (cos and sin already indexed by the position ids, one row per row of ``x``); v's pass. A block of
    ``BLOCK_N`` weight rows then holds ``BLOCK_N / 2`` channels of one head's first half and their
    partners (``_weight_rows``), so the rotation pairs sit in one program's registers; ``BLOCK_N``
    divides ``D``. A bias may come before the rotation, no other epilogue.
``weights="qkv"`` (with ``epilogue="rope"``, ``rope=(heads, kv_heads)``, ``kv_heads > 0``)
    The same fused QKV projection with its weight given as Llama's three tensors, ``q_proj``'s
    ``(heads * D, K)``, ``k_proj``'s and ``v_proj``'s ``(kv_heads * D, K)``: inputs ``x, wq, wk,
    wv[, gamma], cos, sin``, output the concatenated ``(..., (heads + 2 kv_heads) * D)`` row as the
    one-weight form gives, so that a decoder layer's q, k and v are one launch (one RMSNorm
    prologue, not three) without a concatenated copy of the weights. The three segments are whole
    heads and ``BLOCK_N`` divides ``D``, so a block of output columns lies in one segment: the
    kernels pick that segment's weight pointer per block (``_segment_weight``) and the rest is the
    one-weight code, variant for variant; spaces, flops and inputs are the one-weight form's
    (``_one_weight``), and ``make_inputs`` draws the same values, cut into three. No bias (Llama's
    projections have none) and no other epilogue. The reference is the three ``F.linear``, then
    the rotation of q and k, concatenated.
``epilogue="rope"`` with ``rope=(heads, 0)``
    ``w`` is one projection whose ``heads * D`` output columns all rotate: Llama's separate
    ``q_proj`` (``rope=(num_heads, 0)``) or ``k_proj`` (``rope=(num_kv_heads, 0)``), whose outputs
    Hugging Face views to ``(B, S, heads, D)`` and rotates the same way. Nothing else changes: the
    kernels rotate the columns below ``(heads + kv_heads) * D``, which are all of them here.

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
    (an atomic arrival counter per block, zeroed by a tiny kernel before the partial products:
    the sum needs no second pass over the partials), or ``"kernel"``, the matmul family's
    reduction kernel, launched next (no counters).
``persistent``
    The ``split_k`` tiles walked by a fixed grid of ``PROGRAMS_PER_SM`` programs per multiprocessor
    (tile ``pid``, ``pid + programs``, ...): no program start-up between tiles, and a ``SPLIT_K``
    that need not divide the work evenly among programs. ``SPLIT_K = 1`` is a persistent split-N.

How a block is multiplied depends on ``BLOCK_M``, so that no parameter can contradict another:

- ``BLOCK_M`` of 1 to 8: on the CUDA cores. Each thread multiplies its weight elements by the
  matching ``x`` values and keeps float32 partial sums; the sums over ``K`` are reduced once, after
  the loop, so the loop is loads and fused multiply-adds only. This is the classic GEMV, and what
  ``M = 1`` wants (there the ``x`` row is broadcast over a 2-D weight block, no 3-D product).
  ``FOLD`` says how many consecutive products share a partial sum: 1 (one per weight element), or
  one 16-byte vector (8 elements of 16 bits, 4 of 32), whose products a thread adds in its own
  registers, so that a step's weight block can be 8 times larger for the same registers;
- ``BLOCK_M`` of 16 to 64: on the tensor cores (``tl.dot`` of the ``x`` block and the transposed
  weight block). At ``M = 8`` each weight element already costs 8 multiply-adds, a good part of
  what the CUDA cores can do at full bandwidth; the tensor cores do it without noticing, rows past
  ``M`` padding the block (read at ``row % M``, never stored).

Why the first version streamed 17-45% of the copy bandwidth at ``M = 1`` (H200, 2026-12-01), and
what changed: a memory-bound kernel needs enough bytes *in flight* on every multiprocessor (by
Little's law about bandwidth x latency, some 40 KiB an SM on an H200), and those come from many
resident programs, large steps, or loads issued ahead of their use. The K loop was a plain
``range``, and Triton's software pipeliner prefetches the loads of a loop that feeds no ``tl.dot``
only when the loop itself carries ``num_stages`` (``tl.range(..., num_stages=)``; Triton's
AssignLoadLatencies sets ``pipelineWithoutDot`` from that attribute alone): the CUDA-core
loop had one weight block in flight per program, whatever ``num_stages`` said. The loop is a
``tl.range`` with the config's ``num_stages`` now; the accumulator no longer costs a register per
weight element (``FOLD``), so steps can be larger; and the pruning keeps the search on configs
that move at least 8 KiB of weight a step, on grids of at least one program a multiprocessor, and
splits K only where the row blocks are fewer than 4 a multiprocessor (into at most 16 tiles a
multiprocessor). These are the reasons as read from the code and the compiler; the H200 measurement of
benchmarks/decode.py is what confirms them.

Rows past ``M`` and columns past ``N`` are read at ``row % M`` and ``col % N`` (valid addresses, no
mask in the loop) and masked on the store; the last ``K`` block is masked unless ``K`` is a
multiple of ``BLOCK_K`` (``EVEN_K``, known from the spec). Offsets into the weight are 64-bit (the
LM head has 128256 x 4096 = 5e8 elements; 2**31 is near).

Spaces
------
Parameters: ``BLOCK_M``, ``BLOCK_N``, ``BLOCK_K``, ``FOLD``, ``num_warps``, ``num_stages`` (plus
``SPLIT_K`` and ``PROGRAMS_PER_SM``, ``REDUCE``). *Validity* constraints depend on ``N``, ``K``, the
dtype, the epilogue and the fusions only, so a config tuned at one ``M`` is correct at every other
(the validation tails, a bucket's rows): registers (the CUDA-core partial sums, weight block and x
block, or the tensor-core accumulators), shared memory for the ``num_stages`` pipelined blocks,
blocks no larger than the padded ``N`` and ``K``, at least one ``K`` block a split, RoPE's blocks
within a head, and no RMSNorm or RoPE for the matmul family's reduction kernel. *Pruning*
constraints look at ``M`` and the GPU: the CUDA-core ``BLOCK_M`` is the padded ``M`` (up to 8),
tensor-core blocks no taller than needed, every thread loads at least 16 bytes of weight a step,
and the bandwidth rules above. The spaces enumerate stage by stage (``_StagedSpace``): the product
of the parameters is 10**5 configs.

Testing without a GPU: the interpreter's bfloat16 ``tl.dot`` is wrong (see the matmul module), so
bfloat16 blocks are widened to float32 before a dot there (``UPCAST``), as the matmul family does.

Front door: ``kernelsmith tune decode_matmul --shape 1x2048x2048 --epilogue residual``. The
``@kernelsmith.optimize`` pattern for ``F.linear`` still routes every product to ``matmul``; the
whole-step capture (issue 13, items 3-4) is what calls the fused forms.

Where the code is: this module holds the family (specs, the reference, inputs, the roofline
model); the kernels are in :mod:`kernelsmith.ops._decode_matmul_kernels`, the fusions of a spec,
the spaces and the launchers in :mod:`kernelsmith.ops._decode_matmul_launch`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F

from kernelsmith.ops._base import UnsupportedWorkload, Variant, check_eps, generator
from kernelsmith.ops._decode_matmul_launch import (
    BLOCKS_N,
    WEIGHTS_QKV,
    _decode_geometry,
    _fusions,
    _gemv_build,
    _gemv_space,
    _one_weight,
    _persistent_build,
    _persistent_space,
    _split_k_build,
    _split_k_space,
)
from kernelsmith.ops._matmul_kernels import EPI_NONE
from kernelsmith.ops._matmul_launch import _geometry
from kernelsmith.ops.matmul import Matmul, epilogue_tokens
from kernelsmith.spec import OpSpec, TensorSpec

MAX_M = 64  # the most rows (all leading dims of x) the family takes: decode batches

# =================================================================================================
# The op family
# =================================================================================================

# What a variant's source hash covers besides its build's module (_decode_matmul_launch): its
# kernels, the matmul family's kernels, geometry and family code it borrows (and, through the
# epilogue, kernelsmith.ops.gelu's activations), and this module, so that a change in any of them
# invalidates stored decisions.
_MODULES = (
    "kernelsmith.ops._decode_matmul_kernels",
    "kernelsmith.ops._matmul_kernels",
    "kernelsmith.ops._matmul_launch",
    "kernelsmith.ops.gelu",
    "kernelsmith.ops._elementwise",
    "kernelsmith.ops.matmul",
    __name__,
)

PROLOGUES = ("none", "rmsnorm")
DEFAULT_EPS = 1e-6
ROPE_BASE = 10000.0  # make_inputs' angles: position * ROPE_BASE ** (-2 i / D)
MAX_POSITION = 8192  # make_inputs' positions are drawn below this


def _base_spec(spec: OpSpec) -> OpSpec:
    """The matmul family's spec inside a decode spec: the fused prologue's and RoPE's inputs and
    constants taken off (and q's, k's and v's weights as one)."""
    spec = _one_weight(spec)
    f = _fusions(spec)
    constants = {k: v for k, v in spec.constants.items() if k not in ("prologue", "eps", "rope")}
    return OpSpec(spec.op, spec.inputs[: f.extra], constants)


def _rope_split(epilogue: Any) -> tuple[Any, bool]:
    """(the epilogue without "rope", whether it named RoPE): "bias+rope" is ("bias", True)."""
    if not isinstance(epilogue, str):
        return epilogue, False
    tokens = epilogue_tokens(epilogue)
    rest = [t for t in tokens if t != "rope"]
    return "+".join(rest) or "none", len(rest) != len(tokens)


def apply_rope_half(h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, heads: int, kv_heads: int) -> torch.Tensor:
    """Hugging Face's ``apply_rotary_pos_emb`` (rotate_half) on the q and k parts of a fused QKV
    projection's output ``h`` (..., (heads + 2 kv_heads) * D), cos and sin (..., D) at each row's
    position; v's part unchanged (kv_heads = 0: h is one projection's heads x D, all rotated). In
    h's dtype, as Hugging Face computes it."""
    d = cos.shape[-1]
    lead = h.shape[:-1]
    qk = h[..., : (heads + kv_heads) * d].reshape(*lead, heads + kv_heads, d)
    c, s = cos.unsqueeze(-2), sin.unsqueeze(-2)
    rotated = torch.cat((-qk[..., d // 2 :], qk[..., : d // 2]), dim=-1)
    qk = (qk * c + rotated * s).reshape(*lead, (heads + kv_heads) * d)
    return torch.cat((qk, h[..., (heads + kv_heads) * d :]), dim=-1)


def _with_weights(one: OpSpec, weights: Sequence[TensorSpec]) -> OpSpec:
    """The one-weight spec ``one`` with its weight given as ``weights`` (q's, k's and v's):
    ``weights="qkv"``, the inverse of ``_one_weight``."""
    return OpSpec(one.op, (one.inputs[0], *weights, *one.inputs[2:]), {**one.constants, "weights": WEIGHTS_QKV})


class DecodeMatmul(Matmul):
    name = "decode_matmul"
    summary = (f"decode-shaped y = epilogue(x @ w.T + bias) for at most {MAX_M} rows of x against an nn.Linear "
               "weight, streaming the weight at the bandwidth limit (split-N, split-K, persistent); epilogues "
               "as matmul's (none, gelu, gelu_tanh, silu, residual add, swiglu) or RoPE on a fused QKV "
               "output or a single q or k projection; optionally RMSNorm of x in the prologue")  # fmt: skip
    shape_help = (
        f"MxNxK: x (M, K) with M <= {MAX_M} times a weight (N, K) as nn.Linear stores it, e.g. 1x2048x8192 for "
        "Llama-3.2-1B's down projection at batch 1; more leading sizes are batch dims of x (4x2x4096x4096); "
        "--epilogue bias|gelu|silu|residual|swiglu|rope, or bias+gelu; constants prologue=rmsnorm (eps), "
        "rope=[heads, kv_heads] (with the rope epilogue; kv_heads 0: one projection of heads x D, all rotated), "
        "weights=qkv (with rope and kv_heads > 0: the fused QKV weight given as q's, k's and v's, three inputs)"
    )
    # (mypy infers Matmul.variants as a tuple of four variants; any tuple of variants will do)
    variants = (  # type: ignore[assignment]
        Variant("gemv", "split-N: one program per BLOCK_N weight rows (and BLOCK_M rows of x), all of K, "
                "epilogue fused", _gemv_space, _gemv_build, _MODULES),
        Variant("split_k", "split-N and split-K: float32 partials of SPLIT_K ranges of K, summed in order "
                "(by the last program of a block, or a second kernel) with the epilogue",
                _split_k_space, _split_k_build, _MODULES),
        Variant("persistent", "the split_k tiles walked by PROGRAMS_PER_SM programs per multiprocessor, "
                "then the ordered reduction", _persistent_space, _persistent_build, _MODULES),
    )  # fmt: skip

    # ---- specs: matmul's, plus the fused prologue and RoPE ---------------------------------------
    def spec(  # type: ignore[override]
        self, shape: tuple[int, ...], dtype: str, *, epilogue: str = "none", prologue: str = "none",
        eps: float = DEFAULT_EPS, rope: Sequence[int] | None = None, weights: str | None = None,
        **constants: Any,
    ) -> OpSpec:  # fmt: skip
        """Matmul's spec (``constants``: its ``layout``, ``bias`` and ``allow_tf32``), then
        ``prologue="rmsnorm"`` adds gamma ``(K,)`` (and the constant ``eps``) and
        ``epilogue="rope"`` (with ``rope=(heads, kv_heads)``) cos and sin ``(..., D)``, in that
        order after matmul's inputs; ``weights="qkv"`` gives the weight as q's, k's and v's.

        >>> [str(t) for t in OP.spec((1, 96, 64), "bf16", epilogue="rope", rope=(4, 1), prologue="rmsnorm").inputs]
        ['1x64:bfloat16', '96x64:bfloat16', '64:bfloat16', '1x16:bfloat16', '1x16:bfloat16']
        >>> [str(t) for t in OP.spec((1, 96, 64), "bf16", epilogue="rope", rope=(4, 1), weights="qkv").inputs]
        ['1x64:bfloat16', '64x64:bfloat16', '16x64:bfloat16', '16x64:bfloat16', '1x16:bfloat16', '1x16:bfloat16']
        """
        rest, named_rope = _rope_split(epilogue)
        base = super().spec(shape, dtype, epilogue=rest, **constants)
        extra_inputs, extra_constants = self._extras(base, prologue, eps, named_rope, rope)
        spec = OpSpec(self.name, (*base.inputs, *extra_inputs), {**base.constants, **extra_constants})
        if weights is not None:
            spec = _with_weights(spec, self._qkv_weights(spec, weights))
        self.check_supported(spec)
        return spec

    def _qkv_weights(self, one: OpSpec, weights: Any) -> tuple[TensorSpec, ...]:
        """q's, k's and v's weights of the one-weight spec ``one`` (rope=(heads, kv_heads))."""
        if weights != WEIGHTS_QKV:
            raise UnsupportedWorkload(f"{self.name}: weights must be {WEIGHTS_QKV!r} (q, k and v apart), not "
                                      f"{weights!r}")  # fmt: skip
        heads, kv_heads = one.constants.get("rope", (0, 0))
        if not kv_heads:
            raise UnsupportedWorkload(f"{self.name}: weights='qkv' is a fused QKV projection: the rope epilogue with "
                                      "rope=(heads, kv_heads), kv_heads > 0")  # fmt: skip
        g, d = _geometry(one), _fusions(one).rope_dim
        w = one.inputs[1]
        return (w.with_shape((heads * d, g.k)), *[w.with_shape((kv_heads * d, g.k))] * 2)

    def spec_for(  # type: ignore[override]
        self, *inputs: torch.Tensor, epilogue: str = "none", prologue: str = "none", eps: float = DEFAULT_EPS,
        rope: Sequence[int] | None = None, weights: str | None = None, **constants: Any,
    ) -> OpSpec:  # fmt: skip
        """The spec of ``(x, w[, w3][, bias][, residual][, gamma][, cos, sin])`` (``constants``:
        matmul's ``layout``, ``bias`` and ``allow_tf32``), or with ``weights="qkv"`` of ``(x, wq,
        wk, wv[, gamma], cos, sin)``."""
        if weights is not None:
            if len(inputs) < 4 or not all(isinstance(t, torch.Tensor) and t.dim() == 2 for t in inputs[1:4]):
                raise UnsupportedWorkload(f"{self.name}: weights='qkv' takes x, then q's, k's and v's 2-D weights")
            wq, wk, wv = inputs[1:4]
            # the one-weight form's spec (a meta tensor of the three's rows: nothing allocated)
            w = torch.empty((wq.shape[0] + wk.shape[0] + wv.shape[0], wq.shape[1]), dtype=wq.dtype, device="meta")
            one = self.spec_for(inputs[0], w, *inputs[4:], epilogue=epilogue, prologue=prologue, eps=eps, rope=rope,
                                **constants)  # fmt: skip
            self._qkv_weights(one, weights)  # (checks that the constants make a fused QKV projection)
            try:
                given = tuple(TensorSpec.of(t) for t in (wq, wk, wv))
            except ValueError as err:
                raise UnsupportedWorkload(f"{self.name}: {err}") from None
            spec = _with_weights(one, given)
            self.check_supported(spec)
            return spec
        rest, named_rope = _rope_split(epilogue)
        extra = (prologue == "rmsnorm") + 2 * named_rope
        if len(inputs) <= extra:
            raise UnsupportedWorkload(f"{self.name}: too few tensors ({len(inputs)}) for the fusions asked for")
        base = super().spec_for(*inputs[: len(inputs) - extra], epilogue=rest, **constants)
        _, extra_constants = self._extras(base, prologue, eps, named_rope, rope)
        try:
            extra_inputs = tuple(TensorSpec.of(t) for t in inputs[len(inputs) - extra :])
        except ValueError as err:
            raise UnsupportedWorkload(f"{self.name}: {err}") from None
        spec = OpSpec(self.name, (*base.inputs, *extra_inputs), {**base.constants, **extra_constants})
        self.check_supported(spec)
        return spec

    def _extras(
        self, base: OpSpec, prologue: Any, eps: Any, named_rope: bool, rope: Sequence[int] | None
    ) -> tuple[tuple[TensorSpec, ...], dict[str, Any]]:
        """The decode-only inputs and constants (module docstring), checked."""
        x = base.inputs[0]
        inputs: list[TensorSpec] = []
        constants: dict[str, Any] = {}
        if prologue not in PROLOGUES:
            raise UnsupportedWorkload(f"{self.name}: prologue must be one of {PROLOGUES}, not {prologue!r}")
        if prologue == "rmsnorm":
            inputs.append(TensorSpec((x.shape[-1],), x.dtype))
            constants.update(prologue="rmsnorm", eps=check_eps(self.name, eps))
        if named_rope != (rope is not None):
            raise UnsupportedWorkload(f"{self.name}: the rope epilogue and rope=(heads, kv_heads) go together")
        if rope is not None:
            try:
                heads, kv_heads = (int(v) for v in rope)
            except (TypeError, ValueError):
                raise UnsupportedWorkload(f"{self.name}: rope must be (heads, kv_heads), not {rope!r}") from None
            if heads <= 0 or kv_heads < 0:
                raise UnsupportedWorkload(f"{self.name}: rope wants heads > 0 and kv_heads >= 0 (0: one "
                                          f"projection, all rotated), not {rope!r}")  # fmt: skip
            n = _geometry(base).n
            d = n // (heads + 2 * kv_heads)
            inputs += [TensorSpec((*x.shape[:-1], d), x.dtype)] * 2
            constants["rope"] = [heads, kv_heads]
        return tuple(inputs), constants

    def check_supported(self, spec: OpSpec) -> None:
        """The matmul family's checks on the matmul part, then the decode shapes (layout "linear",
        M <= MAX_M) and the fusions' inputs; a ``weights="qkv"`` spec's three weights, then its
        one-weight form."""
        if "weights" in spec.constants:
            self._check_qkv(spec)
            self.check_supported(_one_weight(spec))
            return
        unknown = set(spec.constants) - {"layout", "epilogue", "bias", "allow_tf32", "prologue", "eps", "rope"}
        if unknown:
            raise UnsupportedWorkload(f"{self.name}: unknown constants {sorted(unknown)}")
        if spec.constants.get("prologue", "rmsnorm") != "rmsnorm" or ("prologue" in spec.constants) != (
            "eps" in spec.constants
        ):
            raise UnsupportedWorkload(f"{self.name}: the constants prologue='rmsnorm' and eps go together")
        rope = spec.constants.get("rope", [1, 1])
        if (not isinstance(rope, list | tuple) or len(rope) != 2
                or not all(isinstance(v, int) for v in rope) or rope[0] <= 0 or rope[1] < 0):  # fmt: skip
            raise UnsupportedWorkload(f"{self.name}: rope must be [heads, kv_heads], not {rope!r}")
        f = _fusions(spec)
        if f.extra < 2:
            raise UnsupportedWorkload(f"{self.name}: {spec.describe()} lacks the fused inputs")
        base = _base_spec(spec)
        super().check_supported(base)
        for t in spec.inputs[f.extra :]:
            if t.dtype not in self.dtypes or not t.is_contiguous:
                raise UnsupportedWorkload(f"{self.name}: fused input {t} must be contiguous, in x's dtype")
        if spec.const("layout") != "linear":
            raise UnsupportedWorkload(f"{self.name}: the weight must be (N, K) as nn.Linear stores it "
                                      "(layout 'linear'); use matmul for x @ w")  # fmt: skip
        g = _geometry(spec)
        if g.m > MAX_M:
            raise UnsupportedWorkload(f"{self.name}: x has {g.m} rows; decode shapes have at most {MAX_M} "
                                      "(use matmul)")  # fmt: skip
        x = spec.inputs[0]
        if f.rms and (spec.inputs[f.extra].shape != (g.k,) or spec.inputs[f.extra].dtype != x.dtype):
            raise UnsupportedWorkload(f"{self.name}: RMSNorm's gamma must be ({g.k},) in x's dtype")
        if "rope" in spec.constants:
            heads, kv_heads = spec.constants["rope"]
            d = f.rope_dim
            if g.epilogue != EPI_NONE or d * (heads + 2 * kv_heads) != g.n or d % 2:
                raise UnsupportedWorkload(f"{self.name}: RoPE wants a fused QKV output of (heads + 2 kv_heads) x an "
                                          f"even head dim columns, or kv_heads = 0 and heads x D ({heads} + 2 x "
                                          f"{kv_heads} heads do not split {g.n}), and no other epilogue than a "
                                          "bias")  # fmt: skip
            if d % BLOCKS_N[0]:
                raise UnsupportedWorkload(f"{self.name}: RoPE needs a head dim that is a multiple of {BLOCKS_N[0]}, "
                                          f"not {d}")  # fmt: skip
            wanted = TensorSpec((*x.shape[:-1], d), x.dtype)
            for t in spec.inputs[f.extra + f.rms :]:
                if t.shape != wanted.shape or t.dtype != wanted.dtype:
                    raise UnsupportedWorkload(f"{self.name}: cos and sin must be {wanted} (one row per row of x)")

    def _check_qkv(self, spec: OpSpec) -> None:
        """A ``weights="qkv"`` spec: q's ``(heads * D, K)``, k's and v's ``(kv_heads * D, K)``
        weights, contiguous in x's dtype, with RoPE over kv_heads > 0 and no bias or other epilogue."""
        if spec.constants["weights"] != WEIGHTS_QKV:
            got = spec.constants["weights"]
            raise UnsupportedWorkload(f"{self.name}: weights must be {WEIGHTS_QKV!r}, not {got!r}")
        rope = spec.constants.get("rope")
        if (not isinstance(rope, list | tuple) or len(rope) != 2 or not all(isinstance(v, int) for v in rope)
                or rope[0] <= 0 or rope[1] <= 0 or len(spec.inputs) < 6):  # fmt: skip
            raise UnsupportedWorkload(f"{self.name}: weights='qkv' is a fused QKV projection: rope=(heads, kv_heads) "
                                      "with kv_heads > 0, inputs x, wq, wk, wv[, gamma], cos, sin")  # fmt: skip
        if spec.constants.get("bias") or spec.constants.get("epilogue") != "none":
            raise UnsupportedWorkload(f"{self.name}: weights='qkv' takes no bias and no epilogue but RoPE")
        heads, kv_heads = rope
        x, weights = spec.inputs[0], spec.inputs[1:4]
        n = sum(w.shape[0] for w in weights if len(w.shape) == 2)
        d = n // (heads + 2 * kv_heads)
        k = x.shape[-1] if x.shape else 0
        wanted = [(heads * d, k), (kv_heads * d, k), (kv_heads * d, k)]
        for name, w, shape in zip(("q", "k", "v"), weights, wanted, strict=True):
            if w.shape != shape or w.dtype != x.dtype or not w.is_contiguous:
                raise UnsupportedWorkload(f"{self.name}: {name}'s weight {w} should be {shape[0]}x{shape[1]}, "
                                          f"contiguous, in x's dtype ({heads} + 2 x {kv_heads} heads of "
                                          f"{d})")  # fmt: skip

    def output_specs(self, spec: OpSpec) -> tuple[TensorSpec, ...]:
        """Matmul's, of the one-weight form (``weights="qkv"``: all three projections' columns)."""
        return super().output_specs(_one_weight(spec))

    def _with_rows(self, spec: OpSpec, m: int) -> OpSpec:
        """Matmul's, and cos and sin follow x's rows."""
        if "weights" in spec.constants:
            return _with_weights(self._with_rows(_one_weight(spec), m), spec.inputs[1:4])
        f = _fusions(spec)
        resized = super()._with_rows(_base_spec(spec), m)
        extras = list(spec.inputs[f.extra :])
        if f.rope_dim:
            extras[-2:] = [TensorSpec((m, f.rope_dim), t.dtype) for t in extras[-2:]]
        return OpSpec(spec.op, (*resized.inputs, *extras), dict(spec.constants))

    def stressed_inputs(self, spec: OpSpec) -> tuple[int, ...]:
        """The matmul part's (x, and a residual shaped like it): never gamma, cos or sin."""
        return super().stressed_inputs(_base_spec(spec))

    # ---- math ------------------------------------------------------------------------------------
    def _compute(self, spec: OpSpec, inputs: Sequence[torch.Tensor]) -> torch.Tensor:
        """Hugging Face's modules in order, in the inputs' dtype: LlamaRMSNorm on x (float32 sums,
        the normalized row rounded, times gamma), the projection and its epilogue, then
        apply_rotary_pos_emb on q and k."""
        f = _fusions(spec)
        base = _base_spec(spec)
        x = inputs[0]
        if f.rms:
            gamma = inputs[f.extra]
            xf = x.to(torch.promote_types(x.dtype, torch.float32))
            x = gamma * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + f.eps)).to(x.dtype)
        if f.k_start:  # weights="qkv": the three projections as Hugging Face's modules run them
            h = torch.cat([F.linear(x, w) for w in inputs[1:4]], dim=-1)
        else:
            h = super()._compute(base, [x, *inputs[1 : f.extra]])
        if f.rope_dim:
            heads, kv_heads = spec.constants["rope"]
            h = apply_rope_half(h, inputs[f.extra + f.rms], inputs[f.extra + f.rms + 1], heads, kv_heads)
        return h

    def make_inputs(
        self,
        spec: OpSpec,
        seed: int,
        distribution: str = "normal",
        device: str | torch.device = "cuda",
    ) -> tuple[torch.Tensor, ...]:
        """Matmul's inputs, then gamma ``1 + 0.5 N(0, 1)`` and cos and sin at a random position per
        row (Hugging Face's cache: ``cat(freqs, freqs)`` of ``position * ROPE_BASE ** (-2i / D)``).
        ``weights="qkv"``: the one-weight form's inputs, its weight cut into q's, k's and v's."""
        if "weights" in spec.constants:
            x, w, *rest = self.make_inputs(_one_weight(spec), seed, distribution, device)
            sizes = [t.shape[0] for t in spec.inputs[1:4]]
            return (x, *(part.contiguous() for part in w.split(sizes)), *rest)
        f = _fusions(spec)
        tensors = list(super().make_inputs(_base_spec(spec), seed, distribution, device))
        dtype = spec.inputs[0].torch_dtype
        g = generator(seed ^ 0xD3C0DE, device)
        if f.rms:
            tensors.append((1 + 0.5 * torch.randn(spec.inputs[f.extra].shape, generator=g, device=device)).to(dtype))
        if f.rope_dim:
            rows = _geometry(spec).m
            positions = torch.randint(0, MAX_POSITION, (rows, 1), generator=g, device=device).to(torch.float64)
            i = torch.arange(0, f.rope_dim, 2, device=device, dtype=torch.float64)
            freqs = positions * ROPE_BASE ** (-i / f.rope_dim)
            angles = torch.cat((freqs, freqs), dim=-1)
            shape = spec.inputs[-1].shape
            tensors += [angles.cos().to(dtype).reshape(shape), angles.sin().to(dtype).reshape(shape)]
        return tuple(tensors)

    def flops(self, spec: OpSpec) -> int:
        """Matmul's, plus RMSNorm's 4 an element of x and RoPE's 3 a rotated element."""
        f = _fusions(spec)
        g = _decode_geometry(spec)
        return super().flops(_one_weight(spec)) + 4 * g.m * g.k * f.rms + 3 * g.m * f.rope_cols


OP = DecodeMatmul()

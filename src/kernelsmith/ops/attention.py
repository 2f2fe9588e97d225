"""Scaled dot-product attention, forward: ``softmax(q @ k^T * scale + mask) @ v``, FlashAttention style.

The op
------
Inputs ``(q, k, v)`` or ``(q, k, v, mask)``; one output shaped like ``q``, in ``q``'s dtype,
contiguous in the spec's layout. It computes exactly what ``F.scaled_dot_product_attention``
computes with ``dropout_p=0``.

- ``q`` has ``H`` heads of ``Sq`` positions, ``k`` and ``v`` have ``Hk`` heads of ``Sk``
  positions; all three share the head dimension ``D`` (a multiple of 16, at most 256) and the
  dtype (float16, bfloat16 or float32). ``Hk`` divides ``H``: query head ``h`` reads key/value
  head ``h // (H / Hk)``, which is torch's ``enable_gqa=True`` (``repeat_interleave`` of the
  key/value heads): grouped-query attention, multi-query attention for ``Hk = 1``.
- The constant ``layout`` says how the four sizes are ordered: ``"bhsd"`` (``(B, H, S, D)``,
  torch's SDPA layout) or ``"bshd"`` (``(B, S, H, D)``, the projection's output, flash-attn's
  layout). Any strides are accepted as long as ``D`` has unit stride: Hugging Face's
  ``proj(x).view(B, S, H, D).transpose(1, 2)`` (a ``bhsd`` tensor with ``bshd`` memory) and
  slices of a fused qkv projection are read in place. The output is contiguous in the layout.
- ``mask``, optional, is boolean (True = attend, torch's convention) or additive (a float mask
  in ``q``'s dtype, added to the scaled scores), of any shape broadcastable to
  ``(B, H, Sq, Sk)`` whatever the layout: ``(Sq, Sk)``, Hugging Face's ``(B, 1, Sq, Sk)``, a key
  padding mask ``(B, 1, 1, Sk)``... A mask broadcast by ``expand`` (stride 0) is recorded in
  the spec as its size-1 form.
- Constants: ``layout``, ``causal`` (torch's ``is_causal``) and ``scale``, the softmax scale
  (``1 / sqrt(D)`` unless given; the spec always holds the number).

Semantics worth knowing (all of them torch's):

- **Causal masking is aligned to the top left**: query ``i`` attends to keys ``j <= i``. When
  ``Sq < Sk`` (a decode step against a key/value cache) query 0 therefore sees key 0 only,
  *not* the whole cache: that is what ``is_causal=True`` computes in
  ``F.scaled_dot_product_attention`` (flash-attn's ``causal=True`` and torch's
  ``causal_lower_right`` bias align to the bottom right instead). Decoding code passes
  ``is_causal=False`` for a single query, or an explicit mask. ``causal`` together with a mask is
  refused (torch's CUDA backends reject the pair).
- A query row whose every key is masked (all ``False``, or all ``-inf``) outputs zeros, as
  torch's "safe softmax" does since 2.5, not NaN.
- An additive mask of large finite negative values (Hugging Face uses ``finfo(dtype).min``) is
  an ordinary softmax over those values: nothing treats them as ``-inf``.

The algorithm (online softmax, FlashAttention-2)
-----------------------------------------------
A program owns ``BLOCK_M`` query rows and walks the keys ``BLOCK_N`` at a time, never
materialising the ``Sq x Sk`` score matrix. For each key block it computes the scores
``s = q k^T * scale (+ mask)`` with ``tl.dot`` (fp32 accumulation) and keeps, per row, the running
max ``m``, the running sum ``l = sum exp(s - m)`` and the unnormalised output ``acc = sum
exp(s - m) v``. When a block raises the max from ``m`` to ``m'``, ``l`` and ``acc`` are rescaled
by ``alpha = exp(m - m')`` before the block's terms are added (Milakov & Gimelshein's online
softmax); the output is ``acc / l`` at the end. Masked scores are ``-inf``; while every score a
row has seen is ``-inf`` its max is ``-inf`` and the kernels shift by 0 instead (``-inf - -inf``
would be NaN), so fully masked blocks add nothing and fully masked rows end with ``l = 0`` and
are written as 0.

Without an additive mask the scale is folded with ``log2(e)`` into one multiply and the
exponentials are ``exp2`` (what ``exp`` compiles to anyway). With an additive mask the scores
stay in natural units (``q k^T * scale + mask``, then ``exp``): folding ``log2(e)`` into the mask
would overflow Hugging Face's ``finfo(float32).min`` to ``-inf``.

Precision: q, k and v are read in their dtype; both products accumulate in float32; the
probabilities are rounded to the inputs' dtype before the ``p @ v`` product (as FlashAttention
and cuDNN do in fp16/bf16); everything else is float32 and the output is rounded once. float32
inputs are multiplied in full IEEE float32 (``input_precision="ieee"``), never TF32, matching
PyTorch's float32 SDPA.

Causal block skipping: a program stops at the diagonal (the last key any of its rows may see),
about halving the work. Key blocks that need no masking at all (below the diagonal, inside
``Sk``) and the "edge" blocks that do (the diagonal, the ragged last block) can run in two
separate loops (``TWO_LOOPS=True``: the interior loop has no compares and no selects, at the
price of code size) or in one masked loop (``TWO_LOOPS=False``). For causal tiles the programs
of a head start with its heaviest (last) query block.

The variants
------------
``flash``
    One program per (query block, head, batch): the FlashAttention-2 forward. The default for
    prefill shapes.
``persistent``
    A fixed grid of ``PROGRAMS_PER_SM`` programs per multiprocessor, each walking the tiles
    ``pid, pid + programs, ...``: fewer, longer programs, no launch tail.
``split_kv``
    Flash-decoding: the keys are cut into ``SPLITS`` ranges computed by separate programs, each
    writing a partial ``(acc, m, l)`` to a float32 scratch buffer; a second kernel merges them
    (``o = sum_s exp(m_s - M) acc_s / sum_s exp(m_s - M) l_s``). For short queries against long
    caches, where one program per (query block, head) leaves most of the GPU idle.

Every variant has ``BLOCK_M``, ``BLOCK_N``, ``num_warps``, ``num_stages`` (the pipelining depth of
the key loop) and ``TWO_LOOPS``; with grouped-query attention also ``PACK_GQA``: when True the
``H / Hk`` query heads sharing a key/value head are packed into the rows of one tile (row ``r``
is position ``r // G`` of head ``r % G``), so that each key/value block is loaded once for the
whole group: for decoding (``Sq = 1``) a 16-row tile then holds up to 16 useful rows instead of
one. Constraints keep the tiles that fit: the q tile and ``num_stages`` k and v tiles in shared
memory (227 KiB, the exact amount Triton allocates), at most 128 float32 values of output and
scores a thread (past that ptxas spills registers), at least a 16x16 score block a warp. Spaces
depend on ``D``, the dtype and the head grouping, never on ``B`` or ``Sk``, so that a config is
validated on other lengths (see :meth:`Attention.validation_specs`); the one exception is
``split_kv``, offered for queries of at most 128 positions only (longer queries fill the GPU
without splitting, and the partial buffers would be ``SPLITS`` times the output), which every
validation tail of a short query is too.

``tma``
    The flash forward with the key and value blocks loaded through tensor descriptors: on Hopper
    the Tensor Memory Accelerator copies them to shared memory asynchronously (no address
    arithmetic or bounds checks in registers, and Triton's pipeliner overlaps the copies with the
    products). k and v are described as 2-D tensors whose rows are their position stride apart:
    ``(B * Hk * Sk, D)`` for ``(B, H, S, D)`` memory, ``(B * Sk, Hk * D)`` for ``(B, S, H, D)``
    memory, each (batch, head) starting at a row and a column of its own. A block that runs past
    ``Sk`` reads the next head's rows (or zeros past the end): their scores are masked, and their
    values are zeroed before the product so that an infinite value elsewhere cannot make a NaN.
    Offered where Triton has tensor descriptors and the GPU is a Hopper or newer (and in the
    interpreter), for power-of-two head dims; k or v that a descriptor cannot address (storage
    not 16-byte aligned) run the flash variant's pointer loads with the same config.

Warp specialization (producer and consumer warps, as cuDNN and FlashAttention-3 use on Hopper) is
not used yet; it is the next step towards cuDNN's throughput.

In the Triton interpreter (3.9 at least) ``tl.dot`` multiplies bfloat16 blocks as their raw
uint16 bits; there, and only there, the kernels convert bfloat16 operands to float32 before the
products (``DOT_IN_FP32``), which is exact.

Flops: ``4 * B * H * D`` per attended (query, key) pair (two products of 2 flops a
multiply-add); causal attention counts only the pairs ``j <= i`` (``Sq (Sq + 1) / 2`` for
``Sq = Sk``, the usual "half"); the softmax's exponentials are not counted (the usual convention,
which the TFLOP/s of FlashAttention and cuDNN papers follow).

The code
--------
This module holds the family: its specs, inputs and reference. The kernels are in
:mod:`kernelsmith.ops._attention_kernels`; the shapes, the config spaces and the launchers of
the variants in :mod:`kernelsmith.ops._attention_launch`.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import torch
import triton

from kernelsmith.ops._attention_launch import (
    _canonical,
    _Dims,
    _dims,
    _flash_build,
    _flash_space,
    _logical,
    _persistent_build,
    _persistent_space,
    _resized,
    _split_build,
    _split_space,
    _strides_in_order,
    _tma_build,
    _tma_space,
)
from kernelsmith.ops._base import FINITE_STRESS_DISTRIBUTIONS, OpFamily, UnsupportedWorkload, Variant, generator
from kernelsmith.ops._softmax_condition import centered_spread, floor_of, logit_error, probability_error
from kernelsmith.ops._spec_args import SpecArgs
from kernelsmith.space import next_power_of_two
from kernelsmith.spec import OpSpec, TensorSpec, dtype_name

if TYPE_CHECKING:
    from kernelsmith.ops._base import ErrorFloor

LAYOUTS = ("bhsd", "bshd")
MASKS = ("none", "additive", "boolean")  # spec()'s mask argument
MAX_HEAD_DIM = 256
MAX_PROGRAMS = 2**31 - 1  # a CUDA grid's first dimension
_ARGS = SpecArgs("attention")

# =================================================================================================
# The reference
# =================================================================================================


def _sdpa(spec: OpSpec, inputs: Sequence[torch.Tensor], dtype: torch.dtype | None) -> torch.Tensor:
    """F.scaled_dot_product_attention on the spec's inputs, in ``dtype`` (None: their own), with
    the result contiguous in the spec's layout. In float64 the key/value heads are expanded with
    repeat_interleave and the batch is done one sequence at a time (the math backend holds the
    whole (H, Sq, Sk) score matrix)."""
    q, k, v = (t if dtype is None else t.to(dtype) for t in inputs[:3])
    mask = inputs[3] if len(inputs) == 4 else None
    if mask is not None and dtype is not None and mask.dtype != torch.bool:
        mask = mask.to(dtype)
    if spec.const("layout") == "bshd":
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    causal, scale = bool(spec.const("causal")), float(spec.const("scale"))
    gqa = k.shape[1] != q.shape[1]
    if dtype is None:
        out = torch.nn.functional.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, is_causal=causal, scale=scale, enable_gqa=gqa
        )
    else:
        if gqa:
            group = q.shape[1] // k.shape[1]
            k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        if mask is not None:
            mask = mask.expand(q.shape[0], q.shape[1], q.shape[2], k.shape[2])
        parts = []
        for i in range(q.shape[0]):
            one = slice(i, i + 1)
            part_mask = None if mask is None else mask[one]
            parts.append(torch.nn.functional.scaled_dot_product_attention(
                q[one], k[one], v[one], attn_mask=part_mask, is_causal=causal, scale=scale
            ))  # fmt: skip
        out = torch.cat(parts)
    if spec.const("layout") == "bshd":
        out = out.transpose(1, 2)
    return out.contiguous()


def _score_rows(
    spec: OpSpec, inputs: Sequence[torch.Tensor]
) -> Iterator[tuple[int, int, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]]:
    """For each (sequence, head), in float64: ``(b, h, p, magnitude, seen, v)``, the softmax rows
    ``p`` (Sq, Sk) the reference attends with (0 where a key is masked, and on a row that sees no
    key), each score's magnitude (what its rounding errors scale with: ``|scale| |q_i| . |k_j|``,
    plus ``|mask_ij|`` for an additive mask, whose addition rounds too), which keys each row sees,
    and the values. One (sequence, head) at a time: every head's (Sq, Sk) together can be
    gigabytes."""
    d = _dims(spec)
    q, k, v = (t.double() for t in inputs[:3])
    mask = inputs[3] if len(inputs) == 4 else None
    if spec.const("layout") == "bshd":
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    if mask is not None:
        mask = mask.expand(d.batch, d.heads, d.q_len, d.kv_len)
    group = d.heads // d.kv_heads
    scale = float(spec.const("scale"))
    visible = torch.ones((d.q_len, d.kv_len), dtype=torch.bool, device=q.device)
    if spec.const("causal"):  # top-left aligned: query i sees keys j <= i
        visible = visible.tril()
    for b in range(d.batch):
        for h in range(d.heads):
            qi, ki = q[b, h], k[b, h // group]
            scores, magnitude = qi @ ki.T * scale, qi.abs() @ ki.abs().T * abs(scale)
            seen = visible
            if mask is not None and mask.dtype == torch.bool:
                seen = seen & mask[b, h]
            elif mask is not None:
                additive = mask[b, h].double()
                seen = seen & (additive != -math.inf)
                scores, magnitude = scores + additive, magnitude + additive.abs()
            p = torch.softmax(scores.masked_fill(~seen, -math.inf), dim=-1).nan_to_num(0.0)
            yield b, h, p, magnitude, seen, v[b, h // group]


def _output_error_bound(spec: OpSpec, inputs: Sequence[torch.Tensor]) -> torch.Tensor:
    """How far rounding the scores alone can move each output element, in float64, shaped and laid
    out like the output (:mod:`kernelsmith.ops._softmax_condition`): the output row
    ``o_i = sum_j p_ij v_j`` moves by the centred spread of its probabilities' errors over ``v``
    (:func:`centered_spread`), each score's error being ``eps`` times its magnitude."""
    q = inputs[0]
    bound = torch.empty(q.shape, dtype=torch.float64, device=q.device)
    rows = bound.transpose(1, 2) if spec.const("layout") == "bshd" else bound  # (a bhsd view)
    for b, h, p, magnitude, seen, v in _score_rows(spec, inputs):
        rows[b, h] = centered_spread(p, probability_error(p, logit_error(magnitude, seen)), v)
    return bound


# =================================================================================================
# The op family
# =================================================================================================

# The launchers live in kernelsmith.ops._attention_launch and the kernels in
# kernelsmith.ops._attention_kernels: a variant's source hash covers those and this module.
_MODULES = ("kernelsmith.ops._attention_kernels", __name__)
_SUPPORTED = ("float16", "bfloat16", "float32")


class Attention(OpFamily):
    name = "attention"
    summary = "scaled dot-product attention forward (FlashAttention; causal, masks, GQA/MQA, decode)"
    shape_help = (
        "q's sizes as BxHxSxD whatever the layout, e.g. 8x32x2048x128 (batch, heads, query length, head "
        "dim); constants: layout=bhsd|bshd, causal=true (torch's top-left is_causal), kv_heads (default H), "
        "kv_len (default S), scale (default 1/sqrt(D)), mask=none|additive|boolean (a (B, 1, S, kv_len) "
        "mask), memory=bhsd|bshd (q/k/v's memory order, default the layout)"
    )
    distributions = ("normal", "peaked")
    # No nonfinite data: an infinity in q or k makes scores infinite of both signs, which the
    # float64 math reference and an online (flash) softmax resolve differently; neither is the
    # one right answer to hold kernels to.
    stress_distributions = FINITE_STRESS_DISTRIBUTIONS
    variants = (
        Variant("flash", "one program per (query block, head, batch): the FlashAttention-2 forward",
                _flash_space, _flash_build, _MODULES),
        Variant("persistent", "a fixed grid of programs striding over the (query block, head) tiles",
                _persistent_space, _persistent_build, _MODULES),
        Variant("split_kv", "flash-decoding: key ranges in separate programs, then a merge kernel",
                _split_space, _split_build, _MODULES),
        Variant("tma", "the flash forward with k and v blocks loaded through tensor descriptors (TMA)",
                _tma_space, _tma_build, _MODULES),
    )  # fmt: skip

    # ---- specs -----------------------------------------------------------------------------------
    def small_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        """BxHxSxD shrunk for the interpreter: one sequence of at most 16 positions, heads kept
        (so that a --kv-heads still divides them)."""
        if len(shape) != 4:
            return shape
        _, h, s, d = shape
        return (1, h, min(s, 16), d)

    def spec(
        self,
        shape: tuple[int, ...],
        dtype: str,
        layout: str = "bhsd",
        causal: bool = False,
        kv_heads: int | None = None,
        kv_len: int | None = None,
        scale: float | None = None,
        mask: str = "none",
        memory: str | None = None,
        **constants: Any,
    ) -> OpSpec:
        b, h, s, d = _ARGS.bhsd(shape, constants)
        layout = _ARGS.choice("layout", layout, LAYOUTS)
        memory = _ARGS.choice("memory", layout if memory is None else memory, LAYOUTS)
        mask = _ARGS.choice("mask", mask, MASKS)
        dims = _Dims(batch=b, heads=h, q_len=s, head_dim=d,
                     kv_heads=_ARGS.positive_int("kv_heads", h if kv_heads is None else kv_heads),
                     kv_len=_ARGS.positive_int("kv_len", s if kv_len is None else kv_len))
        name = dtype_name(dtype)
        order = (0, 1, 2, 3) if memory == layout else (0, 2, 1, 3)
        tensors = []
        for heads, seq in ((dims.heads, dims.q_len), (dims.kv_heads, dims.kv_len), (dims.kv_heads, dims.kv_len)):
            t_shape = _logical(layout, b, heads, seq, d)
            tensors.append(_canonical(t_shape, _strides_in_order(t_shape, order), name))
        if mask != "none":
            tensors.append(TensorSpec((b, 1, s, dims.kv_len), "bool" if mask == "boolean" else name))
        constants = {"layout": layout, "causal": _ARGS.flag("causal", causal), "scale": _ARGS.softmax_scale(scale, d)}
        spec = OpSpec(self.name, tuple(tensors), constants)
        self.check_supported(spec)
        return spec

    def spec_for(self, *inputs: torch.Tensor, **constants: Any) -> OpSpec:
        if len(inputs) not in (3, 4) or not all(isinstance(t, torch.Tensor) for t in inputs):
            raise UnsupportedWorkload(f"attention takes (q, k, v) or (q, k, v, mask), not {len(inputs)} inputs")
        layout = _ARGS.choice("layout", constants.pop("layout", "bhsd"), LAYOUTS)
        causal = _ARGS.flag("causal", constants.pop("causal", False))
        scale = constants.pop("scale", None)
        _ARGS.no_more(constants)
        q = inputs[0]
        if q.dim() != 4:
            raise UnsupportedWorkload(f"attention: q must be 4-D, not {q.dim()}-D")
        try:
            tensors = [_canonical(tuple(t.shape), tuple(t.stride()), dtype_name(t.dtype)) for t in inputs[:3]]
            if len(inputs) == 4:
                tensors.append(self._mask_spec(inputs[3]))
        except ValueError as err:  # a dtype kernelsmith does not know at all
            raise UnsupportedWorkload(f"attention: {err}") from None
        constants = {"layout": layout, "causal": causal, "scale": _ARGS.softmax_scale(scale, q.shape[-1])}
        spec = OpSpec(self.name, tuple(tensors), constants)
        self.check_supported(spec)
        return spec

    @staticmethod
    def _mask_spec(mask: torch.Tensor) -> TensorSpec:
        """The mask's spec, with dims broadcast by expand (stride 0) recorded as size 1."""
        shape = tuple(1 if s == 0 else n for n, s in zip(mask.shape, mask.stride(), strict=True))
        return _canonical(shape, tuple(mask.stride()), dtype_name(mask.dtype))

    def check_supported(self, spec: OpSpec) -> None:
        if len(spec.inputs) not in (3, 4):
            raise UnsupportedWorkload(f"attention takes (q, k, v) or (q, k, v, mask), not {len(spec.inputs)} tensors")
        if set(spec.constants) != {"layout", "causal", "scale"}:
            raise UnsupportedWorkload(f"attention: constants must be layout, causal and scale, not "
                                      f"{sorted(spec.constants)}")
        _ARGS.choice("layout", spec.const("layout"), LAYOUTS)
        _ARGS.flag("causal", spec.const("causal"))
        _ARGS.finite("scale", spec.const("scale"))
        q, k, v = spec.inputs[:3]
        if any(len(t.shape) != 4 for t in (q, k, v)):
            raise UnsupportedWorkload("attention: q, k and v must be 4-D")
        if q.dtype not in _SUPPORTED or k.dtype != q.dtype or v.dtype != q.dtype:
            raise UnsupportedWorkload(f"attention: q, k and v must share one of the dtypes {', '.join(_SUPPORTED)}, "
                                      f"not {q.dtype}, {k.dtype}, {v.dtype}")
        d = _dims(spec)
        if min(d.batch, d.heads, d.kv_heads, d.q_len, d.kv_len, d.head_dim) <= 0:
            raise UnsupportedWorkload("attention: empty inputs are not supported")
        if k.shape != v.shape or k.shape != _logical(spec.const("layout"), d.batch, d.kv_heads, d.kv_len,
                                                      d.head_dim):
            raise UnsupportedWorkload(f"attention: k {k} and v {v} do not match q {q} (same batch and head "
                                      f"dimension; v shaped like k)")
        if d.heads % d.kv_heads:
            raise UnsupportedWorkload(f"attention: k and v's {d.kv_heads} heads do not divide q's {d.heads}")
        if d.head_dim % 16 or d.head_dim > MAX_HEAD_DIM:
            raise UnsupportedWorkload(f"attention: the head dimension must be a multiple of 16 up to "
                                      f"{MAX_HEAD_DIM}, not {d.head_dim}")
        for name, t in (("q", q), ("k", k), ("v", v)):
            if t.strides[3] != 1:
                raise UnsupportedWorkload(f"attention: {name} must have unit stride along the head dimension")
            if any(n > 1 and s == 0 for n, s in zip(t.shape, t.strides, strict=True)):
                raise UnsupportedWorkload(f"attention: {name} has a broadcast (stride 0) dimension")
        if len(spec.inputs) == 4:
            self._check_mask(spec, d)
        if d.batch * d.heads * triton.cdiv(d.q_len, 16) > MAX_PROGRAMS:
            raise UnsupportedWorkload("attention: too many (query block, head, batch) tiles for one grid")

    @staticmethod
    def _check_mask(spec: OpSpec, d: _Dims) -> None:
        mask = spec.inputs[3]
        if spec.const("causal"):
            raise UnsupportedWorkload("attention: causal with an explicit mask is not supported (torch's CUDA "
                                      "backends refuse it too): fold the causal part into the mask")
        if mask.dtype not in ("bool", spec.inputs[0].dtype):
            raise UnsupportedWorkload(f"attention: the mask must be boolean or in q's dtype {spec.inputs[0].dtype}, "
                                      f"not {mask.dtype}")
        full = (d.batch, d.heads, d.q_len, d.kv_len)
        if not 2 <= len(mask.shape) <= 4 or any(
            n not in (1, f) for n, f in zip(mask.shape, full[4 - len(mask.shape):], strict=True)
        ):
            raise UnsupportedWorkload(f"attention: the mask's shape {mask.shape} does not broadcast to "
                                      f"(B, H, Sq, Sk) = {full}")
        if any(n > 1 and s == 0 for n, s in zip(mask.shape, mask.strides, strict=True)):
            raise UnsupportedWorkload("attention: a broadcast mask dimension must have size 1 in the spec")

    def output_specs(self, spec: OpSpec) -> tuple[TensorSpec, ...]:
        q = spec.inputs[0]
        return (TensorSpec(q.shape, q.dtype),)

    def bucket(self, spec: OpSpec) -> OpSpec:
        """B, Sq and Sk rounded up to powers of two; heads, head dim, layout, memory orders, mask
        kind and constants kept.

        Every config is validated on other lengths (see validation_specs) and spaces do not
        depend on B or Sk (split_kv's on Sq only through "at most 128", which a call at or below
        its bucket meets whenever the bucket does), so the configs tuned for the bucket are
        correct for every call in it: a decode step against a cache of 3000 tokens reuses the
        decision for 4096 instead of tuning anew at every length.
        """
        d = _dims(spec)
        return _resized(spec, next_power_of_two(d.batch), next_power_of_two(d.q_len), next_power_of_two(d.kv_len))

    def validation_specs(self, spec: OpSpec) -> list[OpSpec]:
        """The target, then tails with the same heads, head dim, layout, memory orders and mask
        kind: one query against one key, and odd lengths past the target's (67 from 64 on), which
        no block size divides, on up to 2 sequences.

        Spaces do not depend on B or Sk, and split_kv's only admits shorter queries, so the
        target's configs apply to every tail.
        """
        d = _dims(spec)

        def odd(n: int) -> int:
            return 67 if n >= 64 else 2 * (n // 2) + 3

        tails = [(1, 1, 1), (min(d.batch, 2), odd(d.q_len), odd(d.kv_len))]
        specs = [spec]
        for batch, q_len, kv_len in dict.fromkeys(tails):
            if (batch, q_len, kv_len) != (d.batch, d.q_len, d.kv_len):
                specs.append(_resized(spec, batch, q_len, kv_len))
        return specs

    # ---- math ------------------------------------------------------------------------------------
    def reference(self, spec: OpSpec, inputs: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        """``F.scaled_dot_product_attention`` in the inputs' dtype (whichever backend torch picks;
        the math backend on the CPU), with ``enable_gqa`` for fewer key/value heads; the result is
        made contiguous in the spec's layout."""
        return (_sdpa(spec, inputs, None),)

    def reference_fp64(self, spec: OpSpec, inputs: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        return (_sdpa(spec, inputs, torch.float64),)

    def error_floors(
        self, spec: OpSpec, inputs: Sequence[torch.Tensor], refs64: Sequence[torch.Tensor]
    ) -> tuple[ErrorFloor, ...]:
        """What rounding the scores can do to the output (:func:`_output_error_bound`)."""
        return (floor_of(_output_error_bound(spec, inputs), refs64[0]),)

    def make_inputs(
        self,
        spec: OpSpec,
        seed: int,
        distribution: str = "normal",
        device: str | torch.device = "cuda",
    ) -> tuple[torch.Tensor, ...]:
        """q, k and v from ``distribution``, with the spec's strides; the mask if the spec has one.

        - normal: standard normal q, k and v: scores of standard deviation about 1;
        - peaked: q and k 2.5 times larger: scores of standard deviation about 6, nearly one-hot
          rows whose max moves from block to block (the online rescaling at work).

        A boolean mask keeps about 4 keys in 5; an additive one is standard normal with about 1
        key in 5 at ``-inf``. Either way every query row keeps at least one key (the one at index
        ``i mod Sk``), so that no row is fully masked: torch's fused GPU backends differ on such
        rows (the kernels write 0 there, as torch's math backend does; the tests check it).
        """
        if distribution not in self.distributions:
            raise ValueError(f"attention: unknown distribution {distribution!r} "
                             f"(known: {', '.join(self.distributions)})")
        g = generator(seed, device)
        dtype = spec.inputs[0].torch_dtype
        spread = 2.5 if distribution == "peaked" else 1.0
        tensors = []
        for t, factor in zip(spec.inputs[:3], (spread, spread, 1.0), strict=True):
            x = torch.randn(t.shape, generator=g, device=device, dtype=torch.float32) * factor
            tensors.append(torch.empty_strided(t.shape, t.strides, dtype=dtype, device=device).copy_(x))
        if len(spec.inputs) == 4:
            tensors.append(self._make_mask(spec.inputs[3], g, device))
        return tuple(tensors)

    @staticmethod
    def _make_mask(t: TensorSpec, g: torch.Generator, device: str | torch.device) -> torch.Tensor:
        shape = t.shape
        q_len, kv_len = shape[-2], shape[-1]
        kept = torch.zeros((q_len, kv_len), dtype=torch.bool, device=device)
        kept[torch.arange(q_len, device=device), torch.arange(q_len, device=device) % kv_len] = True
        if t.dtype == "bool":
            x = (torch.rand(shape, generator=g, device=device) < 0.8) | kept
        else:
            x = torch.randn(shape, generator=g, device=device)
            dropped = torch.rand(shape, generator=g, device=device) < 0.2
            x = torch.where(dropped & ~kept, float("-inf"), x)
        return torch.empty_strided(shape, t.strides, dtype=t.torch_dtype, device=device).copy_(x)

    def flops(self, spec: OpSpec) -> int:
        # Two products of 2 flops a multiply-add, over the attended (query, key) pairs.
        d = _dims(spec)
        if spec.const("causal"):  # query i attends keys 0..min(i, Sk - 1)
            seen = min(d.q_len, d.kv_len)
            pairs = seen * (seen + 1) // 2 + (d.q_len - seen) * d.kv_len
        else:
            pairs = d.q_len * d.kv_len
        return 4 * d.batch * d.heads * d.head_dim * pairs


OP = Attention()

"""Decode attention: a few new query tokens per sequence against a key/value cache.

When a language model generates text, every step appends one token (a few, with speculative
decoding) to each sequence and attends from it to everything the sequence holds so far. The keys
and values of the past positions live in a *cache* written by the earlier steps, so the step reads
the whole cache once and does two multiply-adds per cached element for each query head: a few
flops per byte, bound by memory bandwidth like the decode projections
(:mod:`kernelsmith.ops.decode_matmul`). A good kernel reads each cached key and value exactly once
and keeps every multiprocessor streaming; the query-tiled kernels of :mod:`kernelsmith.ops.attention`
have one query block per (head, sequence), too few programs at batch 1.

The op
------
Inputs ``(q, k_cache, v_cache[, lengths])``, output ``o`` shaped like ``q``:

- ``q`` is ``(B, H, Sq, D)``: ``Sq`` new tokens (1 in plain decoding) of ``H`` query heads. Any
  memory order of those four dims with a unit stride along ``D`` is accepted (Hugging Face builds
  ``q`` as ``proj(x).view(B, Sq, H, D).transpose(1, 2)``); the output is contiguous ``(B, H, Sq, D)``.
- ``k_cache`` and ``v_cache`` are Hugging Face's cache layout, ``(B, Hk, L, D)`` with a unit stride
  along ``D`` (strides of the other dims are passed to the kernels), ``Hk`` dividing ``H``
  (grouped-query attention; ``Hk = 1`` is multi-query): query head ``h`` reads key/value head
  ``h // (H / Hk)``, as ``repeat_interleave`` and ``enable_gqa`` do.
- The constant ``cache`` says how much of the cache holds tokens:

  ``"static"`` (Hugging Face's ``StaticCache``: ``L`` is ``max_cache_len``, allocated once)
      ``lengths`` (``(B,)``, int32 or int64) holds each sequence's number of valid positions,
      *the new tokens included* (they were written into the cache before attention, as
      ``past_key_value.update`` does). Positions at or past ``lengths[b]`` hold anything and are
      never read. Sequences of a batch may have different lengths.
  ``"dynamic"`` (``DynamicCache``: the tensors grow by ``Sq`` positions a step)
      every position is valid: the length of every sequence is ``L``; no ``lengths`` input.
  ``"masked"`` (a static cache under the boolean mask ``generate()`` prepares)
      ``mask`` (``(B, 1, Sq, L)``, bool, any non-negative strides: a broadcast view is fine)
      says which positions each new token sees, padding and all; every position of the cache
      is scanned (nothing says where the valid ones end), the causal rule below does not apply
      (the mask is the whole rule), and a row that sees nothing is 0, as torch's SDPA gives.

- The ``Sq`` query tokens are the *last* ``Sq`` positions of their sequence: query ``i`` sits at
  position ``len - Sq + i`` and attends keys ``0 .. len - Sq + i`` (causal, bottom-right aligned,
  which is what Hugging Face's mask at ``cache_position`` is). With ``Sq = 1`` that is every valid key.
- ``scale`` multiplies the scores (default ``1 / sqrt(D)``).
- The constant ``write_kv=True`` (a static cache) fuses Hugging Face's cache update into the
  op: the inputs are ``(q, k_cache, v_cache, k_new, v_new, cache_position)``, ``k_new``/``v_new``
  the ``Sq`` new tokens' keys and values ``(B, Hk, Sq, D)`` (any strides with a unit one along
  ``D``), ``cache_position`` ``(1,)`` int32/int64 on the device: the *first* new token's position
  ``p``, shared by the batch (``StaticCache.update``'s ``cache_position`` is ``p .. p + Sq - 1``,
  consecutive; a caller passes its first element). The op stores the new rows into both caches
  at ``p .. p + Sq - 1``, in place (``index_copy_`` along the length, as the update does), and
  query ``i`` attends over positions ``0 .. p + i`` (``Sq > 1``: a speculative verify step, or a
  chunk of a prefill into a static cache). The kernels' programs read the past ``[0, p)`` from the
  cache and the new tokens' own keys and values from ``k_new``/``v_new`` (one program per
  (sequence, key/value head) adds them, causally among themselves, and stores them): no program
  reads a row another writes, and the position is read on the device, so the step stays
  CUDA-graph capturable. A position outside ``[0, L - Sq]`` writes nothing and gives NaN. The
  family declares the caches written (:meth:`DecodeAttention.written_inputs`): the harness checks
  them bit for bit against ``index_copy_``, every other input unchanged (rule 2). Writing the
  same rows at the same position again leaves the same cache, so repeated calls (validation's
  rerun, timing) agree.

Math, for query row ``(b, h, i)`` with ``n = len - Sq + i + 1`` visible keys and ``g = h // (H / Hk)``::

    s_j = scale * q[b, h, i] . k_cache[b, g, j]          (j < n)
    o[b, h, i] = sum_j softmax(s)_j * v_cache[b, g, j]

Bad input never gives a plausible wrong answer. What the spec shows (a layout other than the
above, ``Sq > L``, more rows per key/value head than one program holds) is an
:class:`UnsupportedWorkload` (the checks, and the specs, are in
:mod:`kernelsmith.ops._decode_attention_spec`). What only the data shows, a ``lengths[b]`` past
the cache's end or shorter than ``Sq``, cannot be checked without reading ``lengths`` on the host
(a device sync, which CUDA-graph capture forbids): the kernels then write NaN to every output of
that sequence, and so does the reference; :func:`check_lengths` is the host-side check for callers
that can afford it.

The kernels
-----------
(In :mod:`kernelsmith.ops._decode_attention_kernels`; their spaces and launchers in
:mod:`kernelsmith.ops._decode_attention_launch`.) A program owns one (sequence, key/value head)
and a range of cache positions. Its ``GROUP * Sq`` query rows (the query heads sharing that
key/value head, each with its ``Sq`` tokens) are one ``[BLOCK_Q, D]`` block, ``BLOCK_Q`` the rows
padded to a power of two of at least 16 (``tl.dot``'s smallest block): every key and value block
``[BLOCK_N, D]`` is loaded once for all the heads of the group (4 in Llama-3 at 32 over 8 heads),
which is the whole point of grouping. The scores are a ``tl.dot`` on the tensor cores, the softmax
is the online (FlashAttention) one in float32 and in base-2 units (``scale * log2(e)`` folded into
the scores), the loads of the next blocks are pipelined by the compiler (``num_stages``: loads
feeding a dot are), and cache offsets are 64-bit (a cache of 8 x 8 x 32768 x 128 has 2**28
elements per tensor, and batch strides multiply).

``single_pass``
    One program per (sequence, key/value head) walks all the sequence's positions and writes the
    normalized output. Enough programs only for large ``B * Hk``.
``split_kv`` (flash-decoding, Dao et al. 2023)
    ``SPLITS`` programs per (sequence, key/value head), each over ``1 / SPLITS`` of that sequence's
    *own* length (computed in the kernel from ``lengths``, so a short sequence in a long static
    cache costs what it holds, and ranges stay balanced), storing its unnormalized float32 output
    rows, running max and sum of exponentials (only the ``GROUP * Sq`` real rows). A second,
    small kernel merges the splits of each (sequence, key/value head) in split order (``o = sum_s
    2^(m_s - m) acc_s / sum_s 2^(m_s - m) l_s``): a fixed order, so the output is bitwise
    reproducible (the harness requires it, rule 9; float atomics would not be). A split whose range
    is empty stores ``m = -inf, l = 0`` and adds nothing.

Spaces depend on the heads, ``Sq``, ``D`` and the dtype only, never on ``B``, ``L`` or the lengths,
so a config tuned at one cache length is correct at every other: calls are bucketed by ``B`` and
``L`` rounded up to powers of two (a dynamic cache grows every step), and validated on other
lengths (see :meth:`DecodeAttention.validation_specs`).

The baseline is ``F.scaled_dot_product_attention`` on the same inputs, with the boolean mask the
lengths imply and ``enable_gqa``.
Testing without a GPU: the interpreter's bfloat16 ``tl.dot`` is wrong (see the matmul module), so
bfloat16 blocks are widened to float32 before a dot there (``UPCAST``), after the rounding to
bfloat16 the GPU path does.

Front door: ``kernelsmith tune decode_attention --shape 1x32x1024x64 --kv-heads 8`` (B x H x L x D).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from kernelsmith.ops._base import FINITE_STRESS_DISTRIBUTIONS, OpFamily, UnsupportedWorkload, Variant, generator
from kernelsmith.ops._decode_attention_launch import _dims, _single_build, _single_space, _split_build, _split_space
from kernelsmith.ops._decode_attention_spec import DTYPES, check_spec, command_line_spec, resized, spec_of
from kernelsmith.ops._softmax_condition import centered_spread, floor_of, logit_error, probability_error
from kernelsmith.space import next_power_of_two
from kernelsmith.spec import OpSpec, TensorSpec

if TYPE_CHECKING:
    from kernelsmith.ops._base import ErrorFloor

# What a position past a static cache's valid length holds in make_inputs: keys that would win
# every softmax and values far from the others, so a kernel reading past a length is caught.
STALE_KEY, STALE_VALUE = 30.0, 1e3
# The kernels live in kernelsmith.ops._decode_attention_kernels, the launchers (the builds the
# variants name) in kernelsmith.ops._decode_attention_launch and the specs (what the kernels
# accept) in kernelsmith.ops._decode_attention_spec: a variant's source hash covers those and
# this module.
_MODULES = ("kernelsmith.ops._decode_attention_kernels", "kernelsmith.ops._decode_attention_spec", __name__)

# =================================================================================================
# Host-side checks and the references
# =================================================================================================


def check_lengths(lengths: torch.Tensor, q_len: int, cache_len: int) -> None:
    """UnsupportedWorkload unless every length is in [q_len, cache_len]: for callers that can read
    ``lengths`` on the host (this synchronizes with the device; never call it inside a CUDA graph
    capture, where the kernels' NaN rows are the guard instead)."""
    low, high = int(lengths.min()), int(lengths.max())
    if low < q_len or high > cache_len:
        raise UnsupportedWorkload(f"decode_attention: sequence lengths {low}..{high} are outside [{q_len}, "
                                  f"{cache_len}] (the new tokens past the cache's end, or fewer positions than "
                                  "new tokens)")  # fmt: skip


def _lengths(spec: OpSpec, inputs: Sequence[torch.Tensor]) -> torch.Tensor:
    dims = _dims(spec)
    if dims.write_kv:  # the position's past and the new tokens
        return (inputs[5].to(torch.int64) + dims.q_len).expand(dims.batch)
    if dims.has_lengths:
        return inputs[3].to(torch.int64)
    return torch.full((dims.batch,), dims.cache_len, dtype=torch.int64, device=inputs[0].device)


def _visible(spec: OpSpec, inputs: Sequence[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """(the boolean (B, 1, Sq, L) mask of the keys each query row sees, the (B,) bad sequences)."""
    dims = _dims(spec)
    if dims.masked:
        return inputs[3].bool(), torch.zeros(dims.batch, dtype=torch.bool, device=inputs[0].device)
    lengths = _lengths(spec, inputs)
    device = inputs[0].device
    limit = lengths[:, None] - dims.q_len + torch.arange(dims.q_len, device=device)[None, :] + 1  # (B, Sq)
    keys = torch.arange(dims.cache_len, device=device)
    mask = keys[None, None, :] < limit[:, :, None]
    bad = (lengths < dims.q_len) | (lengths > dims.cache_len)
    return mask[:, None], bad


def _poison_bad(out: torch.Tensor, bad: torch.Tensor) -> torch.Tensor:
    return torch.where(bad[:, None, None, None], torch.full_like(out, math.nan), out)


def _write_new_rows(spec: OpSpec, inputs: Sequence[torch.Tensor], k: torch.Tensor, v: torch.Tensor) -> None:
    """``write_kv``: Hugging Face's ``StaticCache.update`` into ``k`` and ``v`` (in place): the
    ``Sq`` new rows ``index_copy_``-ed at the positions ``p .. p + Sq - 1`` from the first one,
    and nothing written where they do not all fit the cache (the indices are clamped and the old
    rows written back, without a host sync)."""
    k_new, v_new, position = inputs[3], inputs[4], inputs[5].to(torch.int64)
    cache_len, q_len = k.shape[2], k_new.shape[2]
    bad = (position < 0) | (position + q_len > cache_len)  # (1,)
    index = (position + torch.arange(q_len, device=position.device)).clamp(0, cache_len - 1)
    for cache, new in ((k, k_new), (v, v_new)):
        kept = torch.where(bad[:, None, None, None], cache.index_select(2, index), new.to(cache.dtype))
        cache.index_copy_(2, index, kept)


# =================================================================================================
# The op family
# =================================================================================================


class DecodeAttention(OpFamily):
    name = "decode_attention"
    summary = ("decode attention: a few new query tokens per sequence over a Hugging Face KV cache (static with "
               "per-sequence lengths, or dynamic), GQA/MQA, flash-decoding split over the cache length")  # fmt: skip
    shape_help = (
        "BxHxLxD: batch, query heads, cache length (max_cache_len for a static cache), head dim, e.g. "
        "1x32x1024x64; constants: kv_heads (default H), q_len (new tokens, default 1), "
        "cache=static|dynamic|masked (static takes a lengths tensor, masked a boolean mask), "
        "scale (default 1/sqrt(D)), write_kv=True (static: k_new, v_new and the first new token's "
        "cache_position; the q_len new rows stored into the cache)"
    )
    # full: every sequence fills the cache (what the bytes model assumes; timed); uneven: lengths
    # from q_len to L, the positions past each length stale (see STALE_KEY); peaked: full, with
    # scores of standard deviation about 6 (the online rescaling at work).
    distributions = ("full", "uneven", "peaked")
    # No nonfinite data: an infinity in q or k makes scores infinite of both signs, which the float64
    # reference and an online softmax resolve differently (as in the attention family).
    stress_distributions = FINITE_STRESS_DISTRIBUTIONS
    dtypes = DTYPES  # (what the specs accept: kernelsmith.ops._decode_attention_spec)
    variants = (
        Variant("single_pass", "one program per (sequence, key/value head) over the whole cache, all the "
                "group's query heads sharing each key/value load", _single_space, _single_build, _MODULES),
        Variant("split_kv", "flash-decoding: SPLITS programs per (sequence, key/value head) over ranges of the "
                "sequence's length, merged in order by a second kernel", _split_space, _split_build, _MODULES),
    )  # fmt: skip

    # ---- specs -----------------------------------------------------------------------------------
    def spec(self, shape: tuple[int, ...], dtype: str, **constants: Any) -> OpSpec:
        """``shape`` is ``(B, H, L, D)``; the constants ``kv_heads``, ``q_len``, ``cache``, ``scale``
        and ``write_kv`` (see :func:`~kernelsmith.ops._decode_attention_spec.command_line_spec`).

        >>> [str(t) for t in OP.spec((2, 32, 1024, 64), "bf16", kv_heads=8).inputs]
        ['2x32x1x64:bfloat16', '2x8x1024x64:bfloat16', '2x8x1024x64:bfloat16', '2:int64']
        """
        return command_line_spec(shape, dtype, **constants)

    def spec_for(self, *inputs: torch.Tensor, scale: float | None = None, **constants: Any) -> OpSpec:
        """The spec of ``(q, k_cache, v_cache[, lengths or mask])`` or, with ``write_kv``, of ``(q,
        k_cache, v_cache, k_new, v_new, cache_position)``; ``cache`` may be given, and must then
        agree."""
        return spec_of(inputs, scale, constants)

    def check_supported(self, spec: OpSpec) -> None:
        """Everything but the lengths' values (see the module docstring)."""
        check_spec(spec)

    def written_inputs(self, spec: OpSpec) -> tuple[int, ...]:
        """``write_kv`` writes the new rows into both caches (inputs 1 and 2); otherwise nothing."""
        return (1, 2) if _dims(spec).write_kv else ()

    def reference_written(self, spec: OpSpec, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """The caches after Hugging Face's update: clones with the new rows ``index_copy_``-ed in."""
        k, v = inputs[1].clone(), inputs[2].clone()
        _write_new_rows(spec, inputs, k, v)
        return [k, v]

    def output_specs(self, spec: OpSpec) -> tuple[TensorSpec, ...]:
        q = spec.inputs[0]
        return (TensorSpec(q.shape, q.dtype),)

    def small_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        """One sequence, heads kept (so that --kv-heads still divides them), a cache of at most 64."""
        if len(shape) != 4:
            return shape
        _, h, cache_len, d = shape
        return (1, h, min(cache_len, 64), d)

    def _resized(self, spec: OpSpec, batch: int, cache_len: int) -> OpSpec:
        return resized(spec, batch, cache_len)

    def bucket(self, spec: OpSpec) -> OpSpec:
        """B and L rounded up to powers of two (a dynamic cache grows every step): spaces never
        look at them, and every config is validated at other batches and lengths."""
        dims = _dims(spec)
        return self._resized(spec, next_power_of_two(dims.batch), next_power_of_two(dims.cache_len))

    def validation_specs(self, spec: OpSpec) -> list[OpSpec]:
        """The target, then one sequence whose cache holds only the new tokens, and up to 3
        sequences of an odd length no key block divides (17 under 64 positions, else 67 or more)."""
        dims = _dims(spec)
        odd = 17 if dims.cache_len < 64 else 67
        tails = [(1, dims.q_len), (min(dims.batch, 3), max(odd, dims.q_len + 2))]
        specs = [spec]
        for batch, cache_len in dict.fromkeys(tails):
            if (batch, cache_len) != (dims.batch, dims.cache_len):
                specs.append(self._resized(spec, batch, cache_len))
        return specs

    def stressed_inputs(self, spec: OpSpec) -> tuple[int, ...]:
        """The stress data goes into q and both caches (the cache is what the kernels stream), and
        the new key and value with ``write_kv``."""
        return (0, 1, 2, 3, 4) if _dims(spec).write_kv else (0, 1, 2)

    # ---- math ------------------------------------------------------------------------------------
    def reference(self, spec: OpSpec, inputs: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        """What a user writes: ``F.scaled_dot_product_attention`` with the boolean mask the lengths
        imply (none for a dynamic cache at one new token) and ``enable_gqa``,
        in the inputs' dtype; NaN for a sequence whose length is out of range. With ``write_kv``, what
        Hugging Face runs: ``StaticCache.update`` (the new rows written into the caches, in place),
        then the same attention over the positions up to the new one."""
        dims = _dims(spec)
        q, k, v = inputs[:3]
        if dims.write_kv:
            _write_new_rows(spec, inputs, k, v)
        mask, bad = _visible(spec, inputs)
        plain = not dims.has_lengths and not dims.masked and not dims.write_kv and dims.q_len == 1
        attn_mask = None if plain else mask
        kwargs: dict[str, Any] = {"attn_mask": attn_mask, "scale": float(spec.const("scale"))}
        if dims.group > 1:
            kwargs["enable_gqa"] = True  # (torch >= 2.5; kernelsmith needs 2.11)
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, **kwargs)
        return (_poison_bad(out, bad).contiguous(),)

    def reference_fp64(self, spec: OpSpec, inputs: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        """The math in float64, the key/value heads repeated, the invisible keys' weights exactly 0."""
        dims = _dims(spec)
        # (copies: ``.double()`` of a float64 tensor is the tensor itself, and write_kv writes k, v)
        q, k, v = (t.to(torch.float64, copy=True) for t in inputs[:3])
        if dims.write_kv:  # into the float64 copies: the caller's caches stay as they were
            _write_new_rows(spec, inputs, k, v)
        k, v = k.repeat_interleave(dims.group, dim=1), v.repeat_interleave(dims.group, dim=1)
        mask, bad = _visible(spec, inputs)
        scores = torch.matmul(q, k.transpose(-1, -2)) * float(spec.const("scale"))
        scores = scores.masked_fill(~mask, -math.inf)
        weights = torch.softmax(scores, dim=-1).masked_fill(~mask, 0.0)  # 0 * a stale value stays 0
        return (_poison_bad(torch.matmul(weights, v), bad),)

    def error_floors(
        self, spec: OpSpec, inputs: Sequence[torch.Tensor], refs64: Sequence[torch.Tensor]
    ) -> tuple[ErrorFloor, ...]:
        """What rounding the scores alone can do to the output, as attention's floor
        (:mod:`kernelsmith.ops._softmax_condition`): a score's errors scale with
        ``|scale| |q| . |k|``, and each output row moves by the centred spread of its
        probabilities' errors over the values it sees."""
        dims = _dims(spec)
        # (copies: ``.double()`` of a float64 tensor is the tensor itself, and write_kv writes k, v)
        q, k, v = (t.to(torch.float64, copy=True) for t in inputs[:3])
        if dims.write_kv:  # the keys and values the call attends over: the cache after the write
            _write_new_rows(spec, inputs, k, v)
        k, v = k.repeat_interleave(dims.group, dim=1), v.repeat_interleave(dims.group, dim=1)
        visible, _ = _visible(spec, inputs)
        visible = visible.expand(-1, dims.heads, -1, -1)
        scale = float(spec.const("scale"))
        scores = (q @ k.transpose(-1, -2) * scale).masked_fill(~visible, -math.inf)
        p = torch.softmax(scores, dim=-1).nan_to_num(0.0)  # (a row that sees nothing is 0)
        magnitude = q.abs() @ k.abs().transpose(-1, -2) * abs(scale)
        error = probability_error(p, logit_error(magnitude, visible))
        return (floor_of(centered_spread(p, error, v), refs64[0]),)

    def make_inputs(
        self,
        spec: OpSpec,
        seed: int,
        distribution: str = "full",
        device: str | torch.device = "cuda",
    ) -> tuple[torch.Tensor, ...]:
        """q and the caches standard normal (``peaked``: q and k 2.5 times larger), with the spec's
        strides; a static cache's lengths all ``L`` (``full``, ``peaked``) or, ``uneven``, drawn from
        ``[Sq, L]`` with the first sequence full and, with more than one, the last holding only the
        new tokens. Positions past a length hold stale keys of ``STALE_KEY`` and values of
        ``STALE_VALUE`` (a dynamic cache has none)."""
        if distribution not in self.distributions:
            raise ValueError(f"decode_attention: unknown distribution {distribution!r} "
                             f"(known: {', '.join(self.distributions)})")  # fmt: skip
        dims = _dims(spec)
        g = generator(seed, device)
        spread = 2.5 if distribution == "peaked" else 1.0
        tensors = []
        for t, factor in zip(spec.inputs[:3], (spread, spread, 1.0), strict=True):
            x = torch.randn(t.shape, generator=g, device=device, dtype=torch.float32) * factor
            tensors.append(torch.empty_strided(t.shape, t.strides, dtype=t.torch_dtype, device=device).copy_(x))
        if dims.write_kv:
            return (*tensors, *self._new_token(spec, g, spread, distribution, tensors[1], tensors[2], device))
        if not dims.has_lengths and not dims.masked:
            return tuple(tensors)
        lengths = torch.full((dims.batch,), dims.cache_len, dtype=torch.int64, device=device)
        if distribution == "uneven":
            drawn = torch.randint(dims.q_len, dims.cache_len + 1, (dims.batch,), generator=g, device=device)
            lengths = drawn.clone()
            lengths[0] = dims.cache_len
            if dims.batch > 1:
                lengths[-1] = dims.q_len
        stale = torch.arange(dims.cache_len, device=device)[None, :] >= lengths[:, None]  # (B, L)
        fourth = lengths.to(spec.inputs[3].torch_dtype)
        if dims.masked:
            mask = _padded_causal_mask(dims, lengths, g, holes=distribution == "uneven")
            strides = spec.inputs[3].strides
            for dim in (d for d, stride in enumerate(strides) if stride == 0):  # a broadcast view: one mask
                mask = mask.narrow(dim, 0, 1)
            if 0 in strides:
                fourth = mask.contiguous().expand(spec.inputs[3].shape)
            else:
                fourth = torch.empty_strided(mask.shape, strides, dtype=torch.bool, device=device).copy_(mask)
            stale = ~fourth.any(dim=2)[:, 0]  # positions no new token sees
        k, v = tensors[1], tensors[2]
        k.masked_fill_(stale[:, None, :, None], STALE_KEY)
        v.masked_fill_(stale[:, None, :, None], STALE_VALUE)
        return (*tensors, fourth)

    def _new_token(
        self, spec: OpSpec, g: torch.Generator, spread: float, distribution: str, k: torch.Tensor, v: torch.Tensor,
        device: str | torch.device,
    ) -> tuple[torch.Tensor, ...]:
        """``write_kv``'s (k_new, v_new, cache_position): the new rows standard normal (k_new times
        ``spread``), the first position ``L - Sq`` (``full``, ``peaked``: the cache full after the
        write) or drawn from ``[0, L - Sq]`` (``uneven``). The caches at and past the position hold
        stale rows, so a kernel that skips the write or reads past the position is caught."""
        dims = _dims(spec)
        new = []
        for t, factor in zip(spec.inputs[3:5], (spread, 1.0), strict=True):
            x = torch.randn(t.shape, generator=g, device=device, dtype=torch.float32) * factor
            new.append(torch.empty_strided(t.shape, t.strides, dtype=t.torch_dtype, device=device).copy_(x))
        position = torch.full((1,), dims.cache_len - dims.q_len, dtype=torch.int64, device=device)
        if distribution == "uneven":
            position = torch.randint(0, dims.cache_len - dims.q_len + 1, (1,), generator=g, device=device)
        stale = torch.arange(dims.cache_len, device=device) >= position
        k.masked_fill_(stale[None, None, :, None], STALE_KEY)
        v.masked_fill_(stale[None, None, :, None], STALE_VALUE)
        return (*new, position.to(spec.inputs[5].torch_dtype))

    def flops(self, spec: OpSpec) -> int:
        """Two products of 2 flops a multiply-add per (query row, cached key): the full cache."""
        dims = _dims(spec)
        return 4 * dims.batch * dims.heads * dims.q_len * dims.cache_len * dims.head_dim


def _padded_causal_mask(dims: Any, lengths: torch.Tensor, g: torch.Generator, holes: bool) -> torch.Tensor:
    """A ``generate()``-like (B, 1, Sq, L) mask: sequence ``b`` left-padded by a random count
    (none with ``holes`` off), each new token seeing the positions from the padding up to its own;
    with ``holes``, a fifth of those hidden at random besides (any mask is the rule), never a
    token's own position, so no row sees nothing."""
    device = lengths.device
    keys = torch.arange(dims.cache_len, device=device)
    own = lengths[:, None] - dims.q_len + torch.arange(dims.q_len, device=device)[None, :]  # (B, Sq)
    pad = torch.zeros_like(lengths)
    if holes:
        pad = (torch.rand(lengths.shape, generator=g, device=device) * (lengths - dims.q_len + 1)).long()
    mask = (keys[None, None, :] >= pad[:, None, None]) & (keys[None, None, :] <= own[:, :, None])
    if holes:
        hidden = torch.rand(mask.shape, generator=g, device=device) < 0.2
        mask &= ~hidden | (keys[None, None, :] == own[:, :, None])
    return mask[:, None]




OP = DecodeAttention()

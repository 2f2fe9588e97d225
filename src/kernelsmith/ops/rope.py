"""Rotary position embedding (RoPE): rotate the query and key of every head by position angles.

The op
------
Inputs ``(q, k, cos, sin)``; outputs ``(q_out, k_out)`` with q's and k's shapes and dtype.

- ``q`` has ``H`` heads and ``k`` has ``Hk`` heads, ``Hk`` dividing ``H`` (grouped-query
  attention; ``Hk == H`` is plain multi-head attention). Both are 4-D, in the spec's ``layout``:
  ``"bhsd"`` (``(B, H, S, D)``, the Hugging Face layout after ``.transpose(1, 2)``) or ``"bshd"``
  (``(B, S, H, D)``, the layout of the projection's output, as in flash-attention). Hugging Face
  attention layers build q and k as ``proj(x).view(B, S, H, D).transpose(1, 2)``, a ``bhsd``
  tensor whose *memory* is ``bshd``: either memory order is accepted for either layout, and the
  spec's strides say which one (any other strides are an :class:`UnsupportedWorkload`).
- ``cos`` and ``sin`` are the Hugging Face caches after indexing by the position ids, of shape
  ``(S, R)``, or ``(B, S, R)`` when every sequence has its own positions (``spec_for`` also takes
  ``(1, S, R)`` and a batch-expanded ``(B, S, R)`` with batch stride 0, and records them as the
  ``(S, R)`` they are). ``R``, the rotary dimension, is normally the head dimension ``D``; with
  ``R < D`` (partial rotary, as in GPT-NeoX, Phi or GLM) only the first ``R`` channels of each
  head rotate and the other ``D - R`` pass through unchanged. All four tensors share one dtype.

The constant ``style`` says which channels form the rotation pairs, and how the caches are laid
out (for a pair rotated by the angle ``a = position * base ** (-2 i / R)``):

``"half"`` (Hugging Face ``rotate_half``, Llama, Mistral, Qwen...)
    Channel ``j < R/2`` pairs with channel ``j + R/2``; ``cos[..., j] == cos[..., j + R/2] ==
    cos(a_j)`` (the cache is ``cat(freqs, freqs)``), and
    ``out = x * cos + rotate_half(x) * sin`` with ``rotate_half(x) = cat(-x[R/2:], x[:R/2])``.
``"interleaved"`` (GPT-J, Meta's original Llama, Megatron's ``rotary_interleaved``)
    Channel ``2i`` pairs with channel ``2i + 1``; the caches hold each angle twice in a row,
    ``cos[..., 2i] == cos[..., 2i + 1] == cos(a_i)`` (``repeat_interleave(freqs, 2)``, exactly
    what Hugging Face's GPT-J builds before rotating), and
    ``out = x * cos + rotate_every_two(x) * sin`` with ``rotate_every_two(x)[2i] = -x[2i + 1]``
    and ``rotate_every_two(x)[2i + 1] = x[2i]``.

The kernels compute exactly these formulas with the caches as given, both entries of a pair
read from the cache (``out1 = x1 * cos1 - x2 * sin1``, ``out2 = x2 * cos2 + x1 * sin2``), so
they agree with the reference for any caches, not only for caches whose halves are equal.

The reference is Hugging Face's ``apply_rotary_pos_emb`` (``cos.unsqueeze`` on the head
dimension, then the formula above in the inputs' dtype: three roundings per element in bf16 and
fp16). The kernels load in the storage dtype, compute in float32 and round once on the store,
which is more accurate.

The variants
------------
RoPE reads q, k, cos and sin once and writes q_out and k_out once, with three flops an element:
it is bound by memory bandwidth, and the tuning question is how to cut ``B * S * (H + Hk)`` head
rows of ``D`` channels into programs, and how to share each cos/sin row among the heads that use
it.

``per_head``
    One program per (batch, position, block of ``BLOCK_H`` heads): a 1-D grid over every token
    and, fastest-varying, the q head blocks followed by the k head blocks, so that q and k are
    rotated by one launch and the programs sharing a cos/sin row run next to each other.
``per_token``
    One program per (batch, position): it loads the cos/sin row once and loops over all the
    heads of q, then of k, ``BLOCK_H`` at a time (``num_stages`` pipelines the loop). Fewer,
    longer programs; the cos/sin row is read once per token instead of once per head block.
``blocked_seq``
    One program per (block of ``BLOCK_S`` positions, head, batch): a ``[BLOCK_S, D]`` tile of one
    head, with its ``[BLOCK_S, R]`` tile of cos and sin (re-read by every head, from L2). In the
    ``bhsd`` memory order such a tile is one contiguous run of memory.

For the interleaved style every variant has a ``PAIRS`` parameter: ``"strided"`` loads the even
and the odd channels with two stride-2 loads, ``"split"`` loads the row contiguously and splits
the pairs in registers (``tl.reshape`` + ``tl.split``, and ``tl.join`` before the store), which
vectorises the memory access at the price of a register shuffle the compiler may route through
shared memory. Which one wins depends on the compiler and device.

The spaces depend on the heads, head and rotary dimensions, style and dtype only, never on ``B``
or ``S``: a config is validated on 1, 7 and 67 (or an odd count above ``S``) positions and is
correct for every batch and sequence length, so calls are bucketed by ``B`` and ``S`` rounded up
to powers of two (see :meth:`RoPE.bucket`).

All offsets are computed in 64-bit integers (tensors past 2**31 elements address correctly);
launchers pass every stride explicitly (inputs and outputs separately, since the outputs are
always contiguous and the inputs need not be), and require unit stride along the head dimension.

The code: this module holds the family (specs, inputs, the reference); the kernels are in
:mod:`kernelsmith.ops._rope_kernels`, the shapes, spaces and launchers in
:mod:`kernelsmith.ops._rope_launch`. The three variants are one kernel, ``_rope_kernel``, whose
``SCHEDULE`` constexpr selects how a program finds its rows (each variant compiles only its own
schedule); the rows are rotated by one jitted helper, whatever the schedule.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from kernelsmith.ops._base import OpFamily, UnsupportedWorkload, Variant, generator
from kernelsmith.ops._rope_launch import (
    _blocked_seq_build,
    _blocked_seq_space,
    _Dims,
    _dims,
    _head_tensor,
    _make_spec,
    _memory_of,
    _other,
    _per_head_build,
    _per_head_space,
    _per_token_build,
    _per_token_space,
    _resized,
)
from kernelsmith.ops._spec_args import SpecArgs
from kernelsmith.space import next_power_of_two
from kernelsmith.spec import OpSpec, TensorSpec, dtype_name

LAYOUTS = ("bhsd", "bshd")
STYLES = ("half", "interleaved")
ROPE_BASE = 10000.0  # the frequency base of make_inputs' caches (Llama's; any base is supported)
MAX_HEAD_DIM = 1024  # widest head the spaces are sized for (real models use 64 to 256)
MAX_PROGRAMS = 2**31 - 1  # a CUDA grid's first dimension
_ARGS = SpecArgs("rope")


# =================================================================================================
# The reference formulas
# =================================================================================================


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    """Hugging Face's rotate_half."""
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


def _rotate_every_two(x: torch.Tensor) -> torch.Tensor:
    """Hugging Face's GPT-J rotate_every_two."""
    x1 = x[..., ::2]
    x2 = x[..., 1::2]
    return torch.stack((-x2, x1), dim=-1).flatten(-2)


def _apply(spec: OpSpec, inputs: Sequence[torch.Tensor], dtype: torch.dtype | None) -> tuple[torch.Tensor, ...]:
    """apply_rotary_pos_emb, in ``dtype`` (None: the inputs' own)."""
    q, k, cos, sin = (t if dtype is None else t.to(dtype) for t in inputs)
    if cos.dim() == 2:  # (S, R): one cache for the whole batch
        cos, sin = cos.unsqueeze(0), sin.unsqueeze(0)
    unsqueeze_dim = 1 if spec.const("layout") == "bhsd" else 2  # the head dimension
    cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
    rotate = _rotate_half if spec.const("style") == "half" else _rotate_every_two
    r = cos.shape[-1]
    outputs = []
    for x in (q, k):
        x_rot, x_pass = x[..., :r], x[..., r:]
        embedded = (x_rot * cos) + (rotate(x_rot) * sin)
        outputs.append(torch.cat((embedded, x_pass), dim=-1) if x_pass.shape[-1] else embedded)
    return tuple(outputs)


# =================================================================================================
# The op family
# =================================================================================================


# The launchers live in kernelsmith.ops._rope_launch and the kernels in kernelsmith.ops._rope_kernels:
# a variant's source hash covers those and this module.
_MODULES = ("kernelsmith.ops._rope_kernels", __name__)


class RoPE(OpFamily):
    name = "rope"
    summary = "rotary position embedding of q and k (Hugging Face apply_rotary_pos_emb; GQA, partial rotary)"
    shape_help = (
        "q's sizes as BxHxSxD whatever the layout, e.g. 8x32x2048x128 (batch, heads, positions, head "
        "dim); constants: layout=bhsd|bshd (q is (B,H,S,D) or (B,S,H,D)), style=half|interleaved, "
        "kv_heads (k's heads, default H), rotary_dim (default D), memory=bhsd|bshd (q/k's memory "
        "order, default the layout: bshd with layout=bhsd is Hugging Face's transposed view), "
        "batched_cos=true for (B,S,R) caches instead of (S,R)"
    )
    distributions = ("normal", "outliers")
    variants = (
        Variant("per_head", "one program per (batch, position, BLOCK_H heads), q and k in one grid",
                _per_head_space, _per_head_build, _MODULES),
        Variant("per_token", "one program per (batch, position): cos/sin loaded once, loop over all heads",
                _per_token_space, _per_token_build, _MODULES),
        Variant("blocked_seq", "one program per (BLOCK_S positions, head, batch): a [BLOCK_S, D] tile",
                _blocked_seq_space, _blocked_seq_build, _MODULES),
    )

    # ---- specs -----------------------------------------------------------------------------------
    def small_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        """BxHxSxD shrunk for the interpreter: one batch, at most 4 heads and 16 positions."""
        if len(shape) != 4:
            return shape
        _, h, s, d = shape
        return (1, min(h, 4), min(s, 16), d)

    def spec(self, shape: tuple[int, ...], dtype: str, layout: str = "bhsd", style: str = "half",
             kv_heads: int | None = None, rotary_dim: int | None = None, memory: str | None = None,
             batched_cos: bool = False, **constants: Any) -> OpSpec:  # fmt: skip
        b, h, s, d = _ARGS.bhsd(shape, constants)
        layout = _ARGS.choice("layout", layout, LAYOUTS)
        style = _ARGS.choice("style", style, STYLES)
        memory = _ARGS.choice("memory", layout if memory is None else memory, LAYOUTS)
        _ARGS.flag("batched_cos", batched_cos)
        hk = _ARGS.positive_int("kv_heads", h if kv_heads is None else kv_heads)
        r = _ARGS.positive_int("rotary_dim", d if rotary_dim is None else rotary_dim)
        dims = _Dims(b, h, hk, s, d, r, batched_cos and b > 1)
        spec = _make_spec(dims, dtype_name(dtype), layout, style, memory, memory)
        self.check_supported(spec)
        return spec

    def spec_for(self, *inputs: torch.Tensor, **constants: Any) -> OpSpec:
        if len(inputs) != 4 or not all(isinstance(t, torch.Tensor) for t in inputs):
            raise UnsupportedWorkload(f"rope takes (q, k, cos, sin), not {len(inputs)} inputs")
        layout = _ARGS.choice("layout", constants.pop("layout", "bhsd"), LAYOUTS)
        style = _ARGS.choice("style", constants.pop("style", "half"), STYLES)
        kv_heads = constants.pop("kv_heads", None)
        rotary_dim = constants.pop("rotary_dim", None)
        _ARGS.no_more(constants)
        q, k, cos, sin = inputs
        if q.dim() != 4 or k.dim() != 4:
            raise UnsupportedWorkload(f"rope: q and k must be 4-D, not {q.dim()}-D and {k.dim()}-D")
        if cos.shape != sin.shape or cos.dim() not in (2, 3):
            raise UnsupportedWorkload(f"rope: cos and sin must both be (S, R) or (B, S, R), not "
                                      f"{tuple(cos.shape)} and {tuple(sin.shape)}")
        try:
            dtype = dtype_name(q.dtype)
            q_spec, k_spec = TensorSpec.of(q), TensorSpec.of(k)
        except ValueError as err:  # a dtype kernelsmith does not know at all
            raise UnsupportedWorkload(f"rope: {err}") from None
        if len({q.dtype, k.dtype, cos.dtype, sin.dtype}) != 1:
            raise UnsupportedWorkload(f"rope: q, k, cos and sin must share a dtype, not "
                                      f"{q.dtype}, {k.dtype}, {cos.dtype}, {sin.dtype}")
        if q.numel() == 0 or k.numel() == 0:
            raise UnsupportedWorkload("rope: empty inputs are not supported")
        b, h, s, d = q.shape if layout == "bhsd" else (q.shape[0], q.shape[2], q.shape[1], q.shape[3])
        hk = k.shape[1] if layout == "bhsd" else k.shape[2]
        if kv_heads is not None and kv_heads != hk:
            raise UnsupportedWorkload(f"rope: kv_heads={kv_heads!r} but k has {hk} heads")
        if rotary_dim is not None and rotary_dim != cos.shape[-1]:
            raise UnsupportedWorkload(f"rope: rotary_dim={rotary_dim!r} but cos has {cos.shape[-1]} channels")
        memories = []
        for name, t in (("q", q_spec), ("k", k_spec)):
            memory = _memory_of(t, layout)
            if memory is None:
                raise UnsupportedWorkload(f"rope: {name} of strides {t.strides} is neither contiguous nor a "
                                          f"transposed view of a contiguous {_other(layout)} tensor")
            memories.append(memory)
        batched = self._cos_batching(cos, sin, b, s)
        dims = _Dims(b, h, hk, s, d, cos.shape[-1], batched)
        spec = _make_spec(dims, dtype, layout, style, memories[0], memories[1])
        if tuple(k.shape) != spec.inputs[1].shape:  # B, S or D of k differ from q's
            raise UnsupportedWorkload(f"rope: k's shape {tuple(k.shape)} does not match q's {tuple(q.shape)} "
                                      f"in layout {layout}")
        self.check_supported(spec)
        return spec

    @staticmethod
    def _cos_batching(cos: torch.Tensor, sin: torch.Tensor, batch: int, seq: int) -> bool:
        """Whether the caches differ along the batch (True: (B, S, R)) or are one (S, R) table
        (given as (S, R), (1, S, R) or expanded over the batch with stride 0)."""
        if cos.shape[-2] != seq:
            raise UnsupportedWorkload(f"rope: cos/sin have {cos.shape[-2]} positions, q has {seq}")
        r = cos.shape[-1]
        for t in (cos, sin):
            if (r > 1 and t.stride(-1) != 1) or (seq > 1 and t.stride(-2) != r):
                raise UnsupportedWorkload(f"rope: cos/sin rows must be contiguous, not strides {tuple(t.stride())}")
        if cos.dim() == 2 or cos.shape[0] == 1:
            return False
        if cos.shape[0] != batch:
            raise UnsupportedWorkload(f"rope: cos/sin have batch {cos.shape[0]}, q has {batch}")
        strides = {cos.stride(0), sin.stride(0)}
        if strides == {0}:
            return False
        if strides == {seq * r}:
            return True
        raise UnsupportedWorkload(f"rope: cos/sin batch strides {sorted(strides)} are neither 0 nor S * R")

    def check_supported(self, spec: OpSpec) -> None:
        if len(spec.inputs) != 4:
            raise UnsupportedWorkload(f"rope takes (q, k, cos, sin), not {len(spec.inputs)} tensors")
        if set(spec.constants) != {"layout", "style"}:
            raise UnsupportedWorkload(f"rope: constants must be layout and style, not {sorted(spec.constants)}")
        layout = _ARGS.choice("layout", spec.const("layout"), LAYOUTS)
        _ARGS.choice("style", spec.const("style"), STYLES)
        q, k, cos, sin = spec.inputs
        for t in spec.inputs:
            if t.dtype not in self.dtypes:
                raise UnsupportedWorkload(f"rope: dtype {t.dtype} is not supported")
        if len({t.dtype for t in spec.inputs}) != 1:
            raise UnsupportedWorkload("rope: q, k, cos and sin must share a dtype")
        if len(q.shape) != 4 or len(k.shape) != 4 or len(cos.shape) not in (2, 3):
            raise UnsupportedWorkload("rope: q and k must be 4-D, cos and sin (S, R) or (B, S, R)")
        d = _dims(spec)
        if min(d.batch, d.heads, d.kv_heads, d.seq, d.head_dim, d.rotary_dim) <= 0:
            raise UnsupportedWorkload("rope: empty inputs are not supported")
        if d.heads % d.kv_heads:
            raise UnsupportedWorkload(f"rope: k's {d.kv_heads} heads do not divide q's {d.heads}")
        if d.rotary_dim % 2 or d.rotary_dim > d.head_dim:
            raise UnsupportedWorkload(f"rope: the rotary dimension {d.rotary_dim} must be even and at most the "
                                      f"head dimension {d.head_dim}")
        if d.head_dim > MAX_HEAD_DIM:
            raise UnsupportedWorkload(f"rope: head dimension {d.head_dim} is above {MAX_HEAD_DIM}")
        if d.batch * d.seq * (d.heads + d.kv_heads) > MAX_PROGRAMS:
            raise UnsupportedWorkload("rope: too many (batch, position, head) rows for one grid")
        expected = _make_spec(d, q.dtype, layout, spec.const("style"), layout, layout)
        if k.shape != expected.inputs[1].shape:
            raise UnsupportedWorkload(f"rope: k {k} does not match q {q} in layout {layout}")
        if cos != sin or cos.shape != expected.inputs[2].shape or not cos.is_contiguous or (
            d.batched_cos and d.batch == 1
        ):
            raise UnsupportedWorkload(f"rope: cos/sin {cos}, {sin} must be contiguous (S, R) tables, or "
                                      f"(B, S, R) with B > 1")
        for name, t in (("q", q), ("k", k)):
            memory = _memory_of(t, layout)
            if memory is None or t != _head_tensor(t.shape, t.dtype, layout, memory):
                raise UnsupportedWorkload(f"rope: {name} {t} is neither contiguous nor a transposed view of a "
                                          f"contiguous {_other(layout)} tensor")

    def output_specs(self, spec: OpSpec) -> tuple[TensorSpec, ...]:
        q, k = spec.inputs[0], spec.inputs[1]
        return TensorSpec(q.shape, q.dtype), TensorSpec(k.shape, k.dtype)

    def bucket(self, spec: OpSpec) -> OpSpec:
        """B and S rounded up to powers of two; heads, dims, layout and memory order kept.

        Spaces do not depend on B or S, and every config is validated on several batch sizes
        and sequence lengths (see validation_specs), so the configs tuned for the bucket are
        correct for every call in it: a prefill of 1000 tokens reuses the decision for 1024.
        """
        d = _dims(spec)
        return _resized(spec, next_power_of_two(d.batch), next_power_of_two(d.seq))

    def validation_specs(self, spec: OpSpec) -> list[OpSpec]:
        """The target, then tails: one position of one sequence, 7 positions of up to 2 sequences
        (exercising the batch strides) and an odd length past the target's (67 from S >= 64),
        which no BLOCK_S divides."""
        d = _dims(spec)
        tails = [(1, 1), (min(d.batch, 2), 7), (1, 67 if d.seq >= 64 else 2 * (d.seq // 2) + 3)]
        specs = [spec]
        for batch, seq in dict.fromkeys(tails):
            if (batch, seq) != (d.batch, d.seq):
                specs.append(_resized(spec, batch, seq))
        return specs

    # ---- math ------------------------------------------------------------------------------------
    def reference(self, spec: OpSpec, inputs: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        """Hugging Face's apply_rotary_pos_emb (rotate_half, or GPT-J's rotate_every_two), in the
        inputs' dtype, with the partial-rotary split of GLM and Phi when R < D."""
        return _apply(spec, inputs, None)

    def reference_fp64(self, spec: OpSpec, inputs: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        return _apply(spec, inputs, torch.float64)

    def make_inputs(
        self,
        spec: OpSpec,
        seed: int,
        distribution: str = "normal",
        device: str | torch.device = "cuda",
    ) -> tuple[torch.Tensor, ...]:
        """q and k from ``distribution``; cos and sin the real caches of some positions.

        - normal: q and k standard normal;
        - outliers: standard normal, with a few head channels (one in 32, the same for every head
          and position) 20 times larger, as in the "massive activations" of real keys.

        cos and sin hold the rotary angles ``position * 10000 ** (-2 i / R)`` of positions
        ``p0, p0 + 1, ...``, computed in float64 and rounded to the dtype, in the style's cache
        layout. ``p0`` is drawn from [1000, 4000) (per sequence for (B, S, R) caches): far from 0,
        so that the fast pairs turn by large angles and an output equal to the input is far from
        the right one; it is moved on until the first pair's first angle is at least pi/3 from a
        multiple of 2 pi, so that even a single position of a single pair rotates.
        """
        if distribution not in self.distributions:
            raise ValueError(f"rope: unknown distribution {distribution!r} (known: {', '.join(self.distributions)})")
        d = _dims(spec)
        q_spec, k_spec = spec.inputs[0], spec.inputs[1]
        dtype = q_spec.torch_dtype
        g = generator(seed, device)
        heads = []
        for t in (q_spec, k_spec):
            x = torch.randn(t.shape, generator=g, device=device, dtype=torch.float32)
            if distribution == "outliers":
                channels = torch.randint(0, d.head_dim, (max(1, d.head_dim // 32),), generator=g, device=device)
                x[..., channels] *= 20.0
            out = torch.empty_strided(t.shape, t.strides, dtype=dtype, device=device)
            heads.append(out.copy_(x))

        n_tables = d.batch if d.batched_cos else 1
        starts = torch.randint(1000, 4000, (n_tables,), generator=g, device=device).tolist()
        for i, p0 in enumerate(starts):
            while abs(math.sin(p0 / 2)) < 0.5:  # angle p0 (the first pair turns by 1 a position)
                p0 += 1
            starts[i] = p0
        positions = torch.tensor(starts, dtype=torch.float64, device=device)[:, None] + torch.arange(
            d.seq, dtype=torch.float64, device=device
        )
        exponents = torch.arange(0, d.rotary_dim, 2, dtype=torch.float64, device=device) / d.rotary_dim
        angles = positions[..., None] * ROPE_BASE ** (-exponents)  # (tables, S, R/2)
        if spec.const("style") == "half":
            angles = torch.cat((angles, angles), dim=-1)
        else:
            angles = torch.repeat_interleave(angles, 2, dim=-1)
        cos, sin = angles.cos().to(dtype), angles.sin().to(dtype)
        if not d.batched_cos:
            cos, sin = cos[0], sin[0]
        return heads[0], heads[1], cos.contiguous(), sin.contiguous()

    def flops(self, spec: OpSpec) -> int:
        # Per rotated channel: two multiplications and an addition; passed-through channels: none.
        d = _dims(spec)
        return 3 * d.batch * d.seq * (d.heads + d.kv_heads) * d.rotary_dim


OP = RoPE()

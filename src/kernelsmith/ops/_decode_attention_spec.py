"""The specs of the decode attention family (:mod:`kernelsmith.ops.decode_attention`, whose
docstring explains the op): which inputs it takes (q, the caches, and the lengths, the mask or the
new token and its position), how a command-line shape or example tensors become a spec, what
:func:`check_spec` rejects as :class:`UnsupportedWorkload`, and the same spec at another batch
and cache length (:func:`resized`: the family's buckets and validation shapes).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from kernelsmith.ops._base import UnsupportedWorkload
from kernelsmith.ops._decode_attention_launch import _dims
from kernelsmith.spec import OpSpec, TensorSpec, dtype_name

NAME = "decode_attention"
DTYPES = ("float16", "bfloat16", "float32")
CACHES = ("static", "dynamic", "masked")
WRITE_KV_INPUTS = 6  # (q, k_cache, v_cache, k_new, v_new, cache_position)
LENGTH_DTYPES = ("int32", "int64")
MAX_HEAD_DIM = 256
MAX_ROWS = 128  # GROUP * Sq rows one program holds; more is prefill-like (use the attention family)

# =================================================================================================
# From a command-line shape, or from example tensors
# =================================================================================================


def command_line_spec(
    shape: tuple[int, ...],
    dtype: str,
    kv_heads: int | None = None,
    q_len: int = 1,
    cache: str = "static",
    scale: float | None = None,
    write_kv: bool = False,
    **constants: Any,
) -> OpSpec:
    """``shape`` is ``(B, H, L, D)``; a static cache adds an int64 ``lengths`` of ``(B,)``, a
    masked one a boolean mask of ``(B, 1, Sq, L)``; ``write_kv`` (a static cache) takes the
    new ``k_new``, ``v_new`` of ``(B, Hk, Sq, D)`` and an int64 ``cache_position`` of ``(1,)``
    (the first new token's) instead of the lengths.

    """
    if constants:
        raise UnsupportedWorkload(f"decode_attention: unknown constants {sorted(constants)}")
    shape = tuple(int(s) for s in shape)
    if len(shape) != 4 or any(s <= 0 for s in shape):
        raise UnsupportedWorkload(f"decode_attention: the shape is B x H x L x D (positive sizes), not {shape}")
    b, h, cache_len, d = shape
    hk = h if kv_heads is None else _positive("kv_heads", kv_heads)
    name = dtype_name(dtype)
    tensors = [TensorSpec((b, h, _positive("q_len", q_len), d), name),
               TensorSpec((b, hk, cache_len, d), name), TensorSpec((b, hk, cache_len, d), name)]  # fmt: skip
    extra: dict[str, Any] = {}
    if write_kv is True:
        extra["write_kv"] = True
        tensors += [TensorSpec((b, hk, q_len, d), name), TensorSpec((b, hk, q_len, d), name),
                    TensorSpec((1,), "int64")]  # fmt: skip
    elif write_kv is not False:
        raise UnsupportedWorkload(f"decode_attention: write_kv must be True or False, not {write_kv!r}")
    elif _cache_kind(cache) == "static":
        tensors.append(TensorSpec((b,), "int64"))
    elif cache == "masked":
        tensors.append(TensorSpec((b, 1, q_len, cache_len), "bool"))
    spec = OpSpec(NAME, tuple(tensors), {"cache": cache, "scale": _scale(scale, d), **extra})
    check_spec(spec)
    return spec


def spec_of(inputs: Sequence[torch.Tensor], scale: float | None, constants: dict[str, Any]) -> OpSpec:
    """The spec of ``(q, k_cache, v_cache, lengths)`` (a static cache) or ``(q, k_cache, v_cache)``
    (a dynamic one); ``cache`` may be given, and must then agree."""
    constants = dict(constants)
    cache = constants.pop("cache", None)
    write_kv = constants.pop("write_kv", len(inputs) == WRITE_KV_INPUTS)
    if constants:
        raise UnsupportedWorkload(f"decode_attention: unknown constants {sorted(constants)}")
    if write_kv is True:
        return _write_kv_spec_of(inputs, cache, scale)
    if len(inputs) not in (3, 4) or not all(isinstance(t, torch.Tensor) for t in inputs):
        raise UnsupportedWorkload("decode_attention takes (q, k_cache, v_cache[, lengths]) tensors")
    kind = "dynamic" if len(inputs) == 3 else "masked" if inputs[3].dtype == torch.bool else "static"
    if cache is not None and _cache_kind(cache) != kind:
        fourth = {"static": ", lengths", "masked": ", mask"}.get(str(cache), "")
        raise UnsupportedWorkload(f"decode_attention: a {cache} cache takes {3 if not fourth else 4} tensors "
                                  f"(q, k_cache, v_cache{fourth}), not {len(inputs)}")  # fmt: skip
    if inputs[0].dim() != 4:
        raise UnsupportedWorkload(f"decode_attention: q must be 4-D (B, H, Sq, D), not {inputs[0].dim()}-D")
    try:
        tensors = tuple(TensorSpec.of(t) for t in inputs)
    except ValueError as err:  # a dtype kernelsmith does not know at all
        raise UnsupportedWorkload(f"decode_attention: {err}") from None
    spec = OpSpec(NAME, tensors, {"cache": kind, "scale": _scale(scale, inputs[0].shape[-1])})
    check_spec(spec)
    return spec


def _write_kv_spec_of(inputs: Sequence[torch.Tensor], cache: Any, scale: float | None) -> OpSpec:
    """The spec of ``(q, k_cache, v_cache, k_new, v_new, cache_position)`` (``write_kv``)."""
    if len(inputs) != WRITE_KV_INPUTS or not all(isinstance(t, torch.Tensor) for t in inputs):
        raise UnsupportedWorkload("decode_attention with write_kv takes (q, k_cache, v_cache, k_new, v_new, "
                                  "cache_position) tensors")  # fmt: skip
    if cache not in (None, "static"):
        raise UnsupportedWorkload(f"decode_attention: write_kv needs a static cache, not {cache!r}")
    if inputs[0].dim() != 4:
        raise UnsupportedWorkload(f"decode_attention: q must be 4-D (B, H, Sq, D), not {inputs[0].dim()}-D")
    try:
        tensors = tuple(TensorSpec.of(t) for t in inputs)
    except ValueError as err:
        raise UnsupportedWorkload(f"decode_attention: {err}") from None
    constants = {"cache": "static", "scale": _scale(scale, inputs[0].shape[-1]), "write_kv": True}
    spec = OpSpec(NAME, tensors, constants)
    check_spec(spec)
    return spec

# =================================================================================================
# What the kernels handle
# =================================================================================================


def check_spec(spec: OpSpec) -> None:
    """Everything but the lengths' values (see the module docstring): the layout, the dtypes,
    the group fitting one program."""
    write_kv = spec.constants.get("write_kv", False)
    if set(spec.constants) - {"write_kv"} != {"cache", "scale"} or write_kv not in (True, False):
        raise UnsupportedWorkload(f"decode_attention: constants must be cache and scale (and write_kv), not "
                                  f"{sorted(spec.constants)}")  # fmt: skip
    if write_kv is True:
        _check_write_kv(spec)
    kind = _cache_kind(spec.const("cache"))
    _finite_scale(spec.const("scale"))
    wanted = WRITE_KV_INPUTS if write_kv else 3 if kind == "dynamic" else 4
    if len(spec.inputs) != wanted:
        raise UnsupportedWorkload(f"decode_attention: a {kind} cache takes {wanted} inputs, not {len(spec.inputs)}")
    q, k, v = spec.inputs[:3]
    if any(len(t.shape) != 4 for t in (q, k, v)):
        raise UnsupportedWorkload("decode_attention: q, k_cache and v_cache must be 4-D (B, heads, length, D)")
    if {k.dtype, v.dtype} != {q.dtype} or q.dtype not in DTYPES:
        raise UnsupportedWorkload(f"decode_attention: q and the caches must share one of {DTYPES}, not "
                                  f"{q.dtype}, {k.dtype}, {v.dtype}")  # fmt: skip
    if k.shape != v.shape or k.shape[0] != q.shape[0] or k.shape[3] != q.shape[3]:
        raise UnsupportedWorkload(f"decode_attention: the caches {k}, {v} do not fit q {q} (B, Hk, L, D "
                                  "with q's B and D, v shaped like k)")  # fmt: skip
    if min(*q.shape, *k.shape) <= 0:
        raise UnsupportedWorkload("decode_attention: empty inputs are not supported")
    dims = _dims(spec)
    if dims.heads % dims.kv_heads:
        raise UnsupportedWorkload(f"decode_attention: {dims.kv_heads} key/value heads do not divide "
                                  f"{dims.heads} query heads")  # fmt: skip
    if dims.q_len > dims.cache_len:
        raise UnsupportedWorkload(f"decode_attention: {dims.q_len} new tokens do not fit a cache of "
                                  f"{dims.cache_len} positions")  # fmt: skip
    if dims.rows > MAX_ROWS:
        raise UnsupportedWorkload(f"decode_attention: {dims.group} query heads per key/value head times "
                                  f"{dims.q_len} new tokens is over {MAX_ROWS} rows a program: a prefill "
                                  "(use the attention family)")  # fmt: skip
    if dims.head_dim % 16 or dims.head_dim > MAX_HEAD_DIM:
        raise UnsupportedWorkload(f"decode_attention: the head dimension must be a multiple of 16 up to "
                                  f"{MAX_HEAD_DIM}, not {dims.head_dim}")  # fmt: skip
    for label, t in (("q", q), ("k_cache", k), ("v_cache", v)):
        if t.strides[3] != 1 or any(n > 1 and s == 0 for n, s in zip(t.shape, t.strides, strict=True)):
            raise UnsupportedWorkload(f"decode_attention: {label} {t} has strides {t.strides}: a layout "
                                      "kernelsmith does not know (the head dim must have unit stride, "
                                      "nothing broadcast)")  # fmt: skip
    if any(s < 0 for t in (q, k, v) for s in t.strides):
        raise UnsupportedWorkload("decode_attention: negative strides are not supported")
    if kind == "static" and not write_kv:
        lengths = spec.inputs[3]
        if lengths.shape != (dims.batch,) or lengths.dtype not in LENGTH_DTYPES:
            raise UnsupportedWorkload(f"decode_attention: lengths must be int32 or int64 of shape "
                                      f"({dims.batch},), not {lengths}")  # fmt: skip
        if not lengths.is_contiguous:
            raise UnsupportedWorkload("decode_attention: lengths must be contiguous")
    if kind == "masked":
        mask = spec.inputs[3]
        if mask.shape != (dims.batch, 1, dims.q_len, dims.cache_len) or mask.dtype != "bool":
            raise UnsupportedWorkload(f"decode_attention: the mask must be bool of shape ({dims.batch}, 1, "
                                      f"{dims.q_len}, {dims.cache_len}), not {mask}")  # fmt: skip
        if any(s < 0 for s in mask.strides):
            raise UnsupportedWorkload("decode_attention: negative strides are not supported")


def _check_write_kv(spec: OpSpec) -> None:
    """``write_kv``'s own layout: a static cache, k_new and v_new shaped (B, Hk, Sq, D) like q's
    new tokens, in the caches' dtype with a unit stride along D, a (1,) integer position (the
    first new token's: the Sq rows go to consecutive positions from it)."""
    if spec.constants["cache"] != "static":
        raise UnsupportedWorkload(f"decode_attention: write_kv needs a static cache, not "
                                  f"{spec.constants['cache']!r}")  # fmt: skip
    if len(spec.inputs) != WRITE_KV_INPUTS:
        raise UnsupportedWorkload(f"decode_attention: write_kv takes {WRITE_KV_INPUTS} inputs, not "
                                  f"{len(spec.inputs)}")  # fmt: skip
    q, k, _, k_new, v_new, position = spec.inputs
    if len(q.shape) != 4:
        raise UnsupportedWorkload(f"decode_attention: write_kv takes q of (B, H, Sq, D), not {q}")
    if len(k.shape) != 4:
        raise UnsupportedWorkload("decode_attention: k_cache must be 4-D (B, Hk, L, D)")
    wanted = (k.shape[0], k.shape[1], q.shape[2], k.shape[3])
    for label, t in (("k_new", k_new), ("v_new", v_new)):
        if t.shape != wanted or t.dtype != k.dtype or t.strides[3] != 1 or any(s < 0 for s in t.strides):
            raise UnsupportedWorkload(f"decode_attention: {label} {t} must be {k.dtype} of shape {wanted} with a "
                                      "unit stride along D")  # fmt: skip
    if position.shape != (1,) or position.dtype not in LENGTH_DTYPES:
        raise UnsupportedWorkload(f"decode_attention: cache_position must be int32 or int64 of shape (1,), "
                                  f"not {position}")  # fmt: skip

# =================================================================================================
# The same spec at another batch and cache length
# =================================================================================================


def resized(spec: OpSpec, batch: int, cache_len: int) -> OpSpec:
    """The spec at another batch and cache length (the caches' memory order kept)."""
    q, k, v = spec.inputs[:3]
    tensors = [_resized_tensor(q, (batch, *q.shape[1:])),
               _resized_tensor(k, (batch, k.shape[1], cache_len, k.shape[3])),
               _resized_tensor(v, (batch, v.shape[1], cache_len, v.shape[3]))]  # fmt: skip
    if _dims(spec).masked:
        tensors.append(TensorSpec((batch, 1, q.shape[2], cache_len), "bool"))
    elif _dims(spec).write_kv:
        k_new, v_new, position = spec.inputs[3:]
        tensors += [_resized_tensor(k_new, (batch, *k_new.shape[1:])),
                    _resized_tensor(v_new, (batch, *v_new.shape[1:])), position]  # fmt: skip
    elif len(spec.inputs) == 4:
        tensors.append(TensorSpec((batch,), spec.inputs[3].dtype))
    return OpSpec(spec.op, tuple(tensors), dict(spec.constants))


def _positive(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise UnsupportedWorkload(f"decode_attention: {name} must be a positive integer, not {value!r}")
    return value


def _cache_kind(value: Any) -> str:
    if value not in CACHES:
        raise UnsupportedWorkload(f"decode_attention: cache must be one of {CACHES} (Hugging Face's StaticCache "
                                  f"and DynamicCache layouts), not {value!r}")  # fmt: skip
    return str(value)


def _scale(value: Any, head_dim: int) -> float:
    """The scale a caller gives (None: torch's default ``1 / sqrt(D)``), checked."""
    return 1.0 / math.sqrt(head_dim) if value is None else _finite_scale(value)


def _finite_scale(value: Any) -> float:
    """``value`` as a float; UnsupportedWorkload unless it is a finite number (not a bool)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise UnsupportedWorkload(f"decode_attention: scale must be a finite number, not {value!r}")
    return float(value)


def _resized_tensor(t: TensorSpec, shape: tuple[int, ...]) -> TensorSpec:
    """``t`` at ``shape`` with its memory order kept (contiguous in the order of its strides)."""
    order = sorted(range(len(t.shape)), key=lambda i: (-t.strides[i], i))
    strides = [0] * len(shape)
    step = 1
    for i in reversed(order):
        strides[i] = step
        step *= shape[i]
    return TensorSpec(shape, t.dtype, tuple(strides))

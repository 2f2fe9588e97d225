"""The op families kernelsmith can tune, by name.

>>> from kernelsmith.ops import get_op
>>> get_op("rmsnorm").name
'rmsnorm'
"""

from __future__ import annotations

import importlib

from kernelsmith.ops._base import Launcher, OpFamily, Tolerance, UnknownOpError, UnsupportedWorkload, Variant

# name -> "module" (which defines OP) or "module:ATTR" for modules holding several families.
# Modules import lazily so that `import kernelsmith` stays cheap.
_MODULES: dict[str, str] = {
    "rmsnorm": "kernelsmith.ops.rmsnorm",
    "rmsnorm_backward": "kernelsmith.ops.rmsnorm_backward",
    "softmax": "kernelsmith.ops.softmax",
    "rope": "kernelsmith.ops.rope",
    "attention": "kernelsmith.ops.attention",
    "layernorm": "kernelsmith.ops.layernorm",
    "layernorm_backward": "kernelsmith.ops.layernorm_backward",
    "add_rmsnorm": "kernelsmith.ops.add_rmsnorm",
    "add_rmsnorm_backward": "kernelsmith.ops.add_rmsnorm_backward",
    "cross_entropy": "kernelsmith.ops.cross_entropy",
    "cross_entropy_backward": "kernelsmith.ops.cross_entropy_backward",
    "cross_entropy_fused": "kernelsmith.ops.cross_entropy_backward:FUSED",
    "gelu": "kernelsmith.ops.gelu:GELU",
    "gelu_tanh": "kernelsmith.ops.gelu:GELU_TANH",
    "swiglu": "kernelsmith.ops.gated:SWIGLU",
    "geglu": "kernelsmith.ops.gated:GEGLU",
    "swiglu_backward": "kernelsmith.ops.gated_backward:SWIGLU_BACKWARD",
    "geglu_backward": "kernelsmith.ops.gated_backward:GEGLU_BACKWARD",
    "sum": "kernelsmith.ops.reductions:SUM",
    "mean": "kernelsmith.ops.reductions:MEAN",
    "max": "kernelsmith.ops.reductions:MAX",
    "matmul": "kernelsmith.ops.matmul",
    "decode_matmul": "kernelsmith.ops.decode_matmul",
    "decode_attention": "kernelsmith.ops.decode_attention",
    "linear_cross_entropy": "kernelsmith.ops.linear_cross_entropy",
    "linear_cross_entropy_backward": "kernelsmith.ops.linear_cross_entropy_backward",
    "linear_cross_entropy_fused": "kernelsmith.ops.linear_cross_entropy_backward:FUSED",
}
_LOADED: dict[str, OpFamily] = {}


def op_names() -> list[str]:
    return sorted(_MODULES)


def get_op(name: str) -> OpFamily:
    """The op family registered under ``name``; ValueError for an unknown name."""
    if name not in _MODULES:
        raise UnknownOpError(f"unknown op {name!r} (known: {', '.join(op_names())})")
    if name not in _LOADED:
        module_name, _, attribute = _MODULES[name].partition(":")
        _LOADED[name] = getattr(importlib.import_module(module_name), attribute or "OP")
    return _LOADED[name]


__all__ = [
    "Launcher", "OpFamily", "Tolerance", "UnknownOpError", "UnsupportedWorkload", "Variant", "get_op", "op_names",
]

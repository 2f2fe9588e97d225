"""What is being tuned: tensor specs, op specs and the stable workload hash.

An :class:`OpSpec` names one *workload*: an op family, the shapes, dtypes and strides of its
inputs, and the constants that change its meaning (``eps``, ``dim``...). Two specs with the same
hash are the same tuning problem, on any machine; the machine itself is described separately by
the fingerprint (see :mod:`kernelsmith.db.fingerprint`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

# The dtypes kernelsmith accepts, by their short command-line name and their torch name.
DTYPES: dict[str, torch.dtype] = {
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float32": torch.float32,
    "float64": torch.float64,
    "int64": torch.int64,
    "int32": torch.int32,
    "bool": torch.bool,  # attention's boolean masks
}
DTYPE_ALIASES: dict[str, str] = {
    "fp16": "float16",
    "half": "float16",
    "f16": "float16",
    "bf16": "bfloat16",
    "fp32": "float32",
    "float": "float32",
    "f32": "float32",
    "fp64": "float64",
    "double": "float64",
    "long": "int64",
    "i64": "int64",
    "int": "int32",
    "i32": "int32",
}


def dtype_name(dtype: torch.dtype | str) -> str:
    """Canonical name (``"bfloat16"``) of a torch dtype or an alias such as ``"bf16"``."""
    if isinstance(dtype, torch.dtype):
        for name, value in DTYPES.items():
            if value == dtype:
                return name
        raise ValueError(f"unsupported dtype {dtype}")
    name = DTYPE_ALIASES.get(dtype.lower(), dtype.lower())
    if name not in DTYPES:
        known = ", ".join(sorted({*DTYPES, *DTYPE_ALIASES}))
        raise ValueError(f"unknown dtype {dtype!r} (known: {known})")
    return name


def contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides: list[int] = []
    step = 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(size, 1)
    return tuple(reversed(strides))


def parse_shape(text: str) -> tuple[int, ...]:
    """Parse ``"8192x4096"`` (or ``"8192,4096"``) into ``(8192, 4096)``."""
    parts = text.lower().replace(",", "x").replace("*", "x").split("x")
    try:
        shape = tuple(int(p) for p in parts if p.strip())
    except ValueError:
        raise ValueError(f"bad shape {text!r}: expected sizes joined by 'x', such as 8192x4096") from None
    if not shape or any(s <= 0 for s in shape):
        raise ValueError(f"bad shape {text!r}: sizes must be positive integers, such as 8192x4096")
    return shape


@dataclass(frozen=True)
class TensorSpec:
    """Shape, dtype and strides of one tensor argument (device is not part of the workload)."""

    shape: tuple[int, ...]
    dtype: str
    strides: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", tuple(int(s) for s in self.shape))
        object.__setattr__(self, "dtype", dtype_name(self.dtype))
        strides = tuple(int(s) for s in self.strides) or contiguous_strides(self.shape)
        if len(strides) != len(self.shape):
            raise ValueError(f"strides {strides} do not match shape {self.shape}")
        # A size-1 dim is never stepped along, so its stride means nothing (PyTorch ignores it too:
        # ``y.transpose(1, 2).reshape(b, 1, -1)`` of a decode step is contiguous with the stride 16
        # there); canonical, so that such a tensor is the contiguous workload it is.
        canonical = contiguous_strides(self.shape)
        strides = tuple(c if size == 1 else s for s, c, size in zip(strides, canonical, self.shape, strict=True))
        object.__setattr__(self, "strides", strides)

    @classmethod
    def of(cls, tensor: torch.Tensor) -> TensorSpec:
        return cls(tuple(tensor.shape), dtype_name(tensor.dtype), tuple(tensor.stride()))

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    @property
    def nbytes(self) -> int:
        return self.numel * self.torch_dtype.itemsize

    @property
    def is_contiguous(self) -> bool:
        return self.strides == contiguous_strides(self.shape)

    def with_shape(self, shape: tuple[int, ...]) -> TensorSpec:
        """Same dtype, new shape, contiguous strides."""
        return TensorSpec(shape, self.dtype)

    def to_dict(self) -> dict[str, Any]:
        return {"shape": list(self.shape), "dtype": self.dtype, "strides": list(self.strides)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TensorSpec:
        return cls(tuple(data["shape"]), data["dtype"], tuple(data.get("strides", ())))

    def __str__(self) -> str:
        text = "x".join(str(s) for s in self.shape) + f":{self.dtype}"
        return text if self.is_contiguous else text + f"@{self.strides}"


def _plain(value: Any) -> Any:
    """Constants must be JSON scalars so that the hash is stable across processes and versions."""
    if isinstance(value, bool | int | str) or value is None:
        return value
    if isinstance(value, float):
        return float(value)
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    raise TypeError(f"op constant {value!r} must be a JSON scalar or a list of them")


@dataclass(frozen=True)
class OpSpec:
    """One workload: op family name, input tensor specs and constants.

    >>> spec = OpSpec("rmsnorm", (TensorSpec((8, 64), "bf16"), TensorSpec((64,), "bf16")), {"eps": 1e-6})
    >>> spec.const("eps")
    1e-06
    >>> len(spec.workload_hash)
    16
    """

    op: str
    inputs: tuple[TensorSpec, ...]
    constants: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "inputs", tuple(self.inputs))
        frozen = tuple(sorted((str(k), _plain(v)) for k, v in dict(self.constants).items()))
        object.__setattr__(self, "constants", _FrozenDict(frozen))

    def const(self, name: str) -> Any:
        return self.constants[name]

    def to_dict(self) -> dict[str, Any]:
        return {
            "op": self.op,
            "inputs": [t.to_dict() for t in self.inputs],
            "constants": dict(self.constants),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> OpSpec:
        return cls(
            data["op"],
            tuple(TensorSpec.from_dict(t) for t in data["inputs"]),
            dict(data.get("constants", {})),
        )

    @property
    def workload_hash(self) -> str:
        """A stable 16-hex-digit name of (op, shapes, dtypes, strides, constants)."""
        canonical = json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()[:16]

    def describe(self) -> str:
        args = ", ".join(str(t) for t in self.inputs)
        consts = ", ".join(f"{k}={v}" for k, v in self.constants.items())
        return f"{self.op}({args}{', ' if consts else ''}{consts})"

    def __hash__(self) -> int:
        return hash(self.workload_hash)


class _FrozenDict(dict):  # type: ignore[type-arg]
    """A read-only dict, so that specs stay hashable and are never edited in place."""

    def __init__(self, items: tuple[tuple[str, Any], ...]) -> None:
        super().__init__(items)

    def _readonly(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError("OpSpec constants are read-only")

    __setitem__ = __delitem__ = clear = pop = popitem = setdefault = update = _readonly  # type: ignore[assignment]

    def __hash__(self) -> int:  # type: ignore[override]
        return hash(tuple(self.items()))

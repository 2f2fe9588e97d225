"""The checks softmax and the row reductions (``sum``, ``mean``, ``max``) share about their input.

Each of these families takes one tensor ``x`` of at least one dimension, in float16, bfloat16 or
float32, and works over its last dimension only: its spec holds the constant ``dim``, always
``-1`` (``dim = x.ndim - 1`` names the same dimension and is accepted). The families' ``spec`` and
``spec_for`` take their own constants (softmax's ``scale``, the reductions' ``keepdim``) and call
these for the rest.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from kernelsmith.ops._base import UnsupportedWorkload
from kernelsmith.spec import TensorSpec

SUPPORTED_TORCH_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def one_tensor(op: str, inputs: Sequence[Any]) -> torch.Tensor:
    """The one input of ``op``'s ``spec_for``: UnsupportedWorkload unless ``inputs`` is a single
    tensor of a supported dtype."""
    if len(inputs) != 1 or not isinstance(inputs[0], torch.Tensor):
        raise UnsupportedWorkload(f"{op} takes one tensor, got {len(inputs)} inputs")
    (x,) = inputs
    if x.dtype not in SUPPORTED_TORCH_DTYPES:
        raise UnsupportedWorkload(f"{op}: dtype {x.dtype} is not supported")
    return x


def check_last_dim(op: str, x: TensorSpec, dim: Any) -> None:
    """UnsupportedWorkload unless ``x`` has at least one dimension and one element, and ``dim``
    names its last dimension (``-1`` or ``x.ndim - 1``)."""
    ndim = len(x.shape)
    if ndim == 0:
        raise UnsupportedWorkload(f"{op}: x must have at least one dimension")
    if x.numel == 0:
        raise UnsupportedWorkload(f"{op}: x {x} is empty")
    if isinstance(dim, bool) or not isinstance(dim, int) or dim not in (-1, ndim - 1):
        raise UnsupportedWorkload(f"{op}: only the last dimension is supported (dim=-1 or {ndim - 1}), got dim={dim!r}")

"""Example keyword inputs, as Hugging Face models are called: ``model(input_ids=..., labels=...,
attention_mask=...)``.

Why it matters: a Hugging Face causal LM computes its loss inside ``forward`` from the
``labels=`` keyword, so a model run with positional token ids only never shows the LM head's loss
to the profile, the plan or the compile backend. The whole-model functions take ``kwargs``
(``optimize_model(..., example_kwargs=...)``, ``profile_model(..., kwargs=...)``) and
``verify_model(..., keywords=...)``; the commands take ``--keyword-inputs input_ids,labels``.

- :func:`keyword_inputs` makes them from the example token ids: ``input_ids`` the ids,
  ``labels`` the same ids (the model shifts them by one itself), ``attention_mask`` ones;
- :class:`KeywordCall` calls a model with positional tensors passed on as keywords, so code that
  handles positional inputs (the comparisons of :mod:`kernelsmith.whole_model.verify`) runs a
  keyword model unchanged.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

KEYWORDS = ("input_ids", "labels", "attention_mask")


def parse_keywords(text: str | None) -> tuple[str, ...]:
    """The names of ``--keyword-inputs`` (comma-separated, each one of :data:`KEYWORDS`, once);
    ValueError otherwise. ``input_ids`` is implied when ``labels`` or ``attention_mask`` is named."""
    if not text:
        return ()
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    unknown = [n for n in names if n not in KEYWORDS]
    if unknown:
        raise ValueError(f"--keyword-inputs: unknown {unknown}; the choices are {', '.join(KEYWORDS)}")
    if len(set(names)) != len(names):
        raise ValueError(f"--keyword-inputs names one input twice: {text}")
    return tuple(n for n in KEYWORDS if n in names or n == "input_ids")


def keyword_inputs(token_ids: torch.Tensor, names: Sequence[str]) -> dict[str, torch.Tensor]:
    """``{name: tensor}`` for ``names`` (see the module docstring), from example token ids."""
    made = {
        "input_ids": token_ids,
        "labels": token_ids.clone(),
        "attention_mask": torch.ones_like(token_ids),
    }
    unknown = [n for n in names if n not in made]
    if unknown:
        raise ValueError(f"unknown keyword inputs {unknown}; known: {', '.join(KEYWORDS)}")
    return {n: made[n] for n in names}


class KeywordCall(nn.Module):
    """``model(**dict(zip(names, tensors)))`` for positional ``tensors``: the model's parameters
    are this module's (``model`` is a submodule), so gradients and copies follow it."""

    def __init__(self, model: nn.Module, names: Sequence[str]) -> None:
        super().__init__()
        self.model = model
        self.names = tuple(names)

    @staticmethod
    def calling(fn: Callable[..., Any], names: Sequence[str]) -> Callable[..., Any]:
        """``fn`` (a compiled model, say) called the same way: positional tensors as keywords."""
        keys = tuple(names)

        def call(*tensors: Any) -> Any:
            return fn(**dict(zip(keys, tensors, strict=True)))

        return call

    def forward(self, *tensors: Any) -> Any:
        if len(tensors) != len(self.names):
            raise TypeError(f"expected {len(self.names)} inputs ({', '.join(self.names)}), got {len(tensors)}")
        return self.model(**dict(zip(self.names, tensors, strict=True)))


__all__ = ["KEYWORDS", "KeywordCall", "keyword_inputs", "parse_keywords"]

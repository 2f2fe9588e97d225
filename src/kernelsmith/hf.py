"""Hugging Face helpers: :func:`fuse_lm_loss` computes a causal LM's training loss without its
logits (the output's ``logits`` is then None); see :mod:`kernelsmith.frontends.hf_lm_loss`."""

from __future__ import annotations

from kernelsmith.frontends.hf_lm_loss import (
    KNOWN_CLASSES,
    causal_lm_loss,
    fallback_reasons,
    fuse_lm_loss,
    is_fused,
    refusal,
    unfuse_lm_loss,
)

__all__ = [
    "KNOWN_CLASSES",
    "causal_lm_loss",
    "fallback_reasons",
    "fuse_lm_loss",
    "is_fused",
    "refusal",
    "unfuse_lm_loss",
]

"""Hugging Face helpers: :func:`fuse_lm_loss` computes a causal LM's training loss without its
logits (the output's ``logits`` is then None), serving a kernel that lost on time by at most
``max_slowdown`` (:func:`tradeoffs` says what it traded); see :mod:`kernelsmith.frontends.hf_lm_loss`."""

from __future__ import annotations

from kernelsmith.frontends.hf_lm_loss import (
    DEFAULT_MAX_SLOWDOWN,
    KNOWN_CLASSES,
    causal_lm_loss,
    fallback_reasons,
    fuse_lm_loss,
    is_fused,
    refusal,
    tradeoffs,
    unfuse_lm_loss,
)

__all__ = [
    "DEFAULT_MAX_SLOWDOWN",
    "KNOWN_CLASSES",
    "causal_lm_loss",
    "fallback_reasons",
    "fuse_lm_loss",
    "is_fused",
    "refusal",
    "tradeoffs",
    "unfuse_lm_loss",
]

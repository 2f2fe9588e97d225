"""Helpers the built-in models share."""

from __future__ import annotations

import torch


def token_ids(vocab_size: int, batch: int, seq: int, device: str | torch.device, seed: int = 0) -> torch.Tensor:
    """Random token ids ``(batch, seq)`` in ``[0, vocab_size)``, drawn on the CPU so that a seed
    gives the same ids on every device."""
    if batch < 1 or seq < 1:
        raise ValueError(f"batch and seq must be positive (got batch={batch}, seq={seq})")
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab_size, (batch, seq), generator=generator).to(device)

"""Seeded random search: each variant's configs shuffled, variants interleaved.

Sampling variants in turn (rather than uniformly over all configs) keeps a variant with a large
space from crowding out the others when the budget is small.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from kernelsmith.evaluate.protocol import Candidate
from kernelsmith.strategies._base import Strategy, interleave_variants


class RandomSearch(Strategy):
    name = "random"

    def _order(self) -> Sequence[Candidate]:
        if not hasattr(self, "_shuffled"):
            rng = random.Random(self.seed)
            shuffled = list(self.candidates)
            rng.shuffle(shuffled)
            variants = sorted({c.variant for c in shuffled})
            rng.shuffle(variants)
            rank = {v: i for i, v in enumerate(variants)}
            shuffled.sort(key=lambda c: rank[c.variant])  # stable: keeps the shuffle within a variant
            self._shuffled = interleave_variants(shuffled)
        return self._shuffled

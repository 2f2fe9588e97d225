"""Grid search: every candidate in a fixed order, variants interleaved."""

from __future__ import annotations

from collections.abc import Sequence

from kernelsmith.evaluate.protocol import Candidate
from kernelsmith.strategies._base import Strategy, interleave_variants


class GridSearch(Strategy):
    name = "grid"

    def _order(self) -> Sequence[Candidate]:
        if not hasattr(self, "_grid"):
            self._grid = interleave_variants(self.candidates)
        return self._grid

"""Search strategies behind one ask/tell interface, chosen by name.

>>> make_strategy("random", seed=1).name
'random'
"""

from __future__ import annotations

from kernelsmith.strategies._base import Strategy
from kernelsmith.strategies.grid import GridSearch
from kernelsmith.strategies.random import RandomSearch

STRATEGIES: dict[str, type[Strategy]] = {"grid": GridSearch, "random": RandomSearch}


def make_strategy(name: str, seed: int = 0) -> Strategy:
    if name not in STRATEGIES:
        raise ValueError(f"unknown strategy {name!r} (known: {', '.join(sorted(STRATEGIES))})")
    return STRATEGIES[name](seed=seed)


__all__ = ["STRATEGIES", "GridSearch", "RandomSearch", "Strategy", "make_strategy"]

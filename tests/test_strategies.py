"""Strategies propose each candidate once, respect the set they were given, and are seeded."""

from __future__ import annotations

import pytest

from kernelsmith.evaluate.protocol import Candidate
from kernelsmith.space import Config
from kernelsmith.strategies import make_strategy

CANDIDATES = [Candidate(v, Config(b=b, w=w)) for v in ("a", "b", "c") for b in (1, 2, 4, 8) for w in (1, 2)]


def _drain(strategy, n=5):
    seen = []
    while batch := strategy.propose(n):
        assert len(batch) <= n
        seen.extend(batch)
    return seen


@pytest.mark.parametrize("name", ["grid", "random"])
def test_every_candidate_exactly_once(name):
    s = make_strategy(name, seed=3)
    s.setup(CANDIDATES)
    seen = _drain(s)
    assert sorted(c.key for c in seen) == sorted(c.key for c in CANDIDATES)
    assert s.propose(4) == []


@pytest.mark.parametrize("name", ["grid", "random"])
def test_small_budget_covers_every_variant(name):
    s = make_strategy(name, seed=1)
    s.setup(CANDIDATES)
    assert {c.variant for c in s.propose(3)} == {"a", "b", "c"}


def test_random_is_deterministic_by_seed_and_differs_across_seeds():
    def order(seed):
        s = make_strategy("random", seed=seed)
        s.setup(CANDIDATES)
        return [c.key for c in _drain(s)]

    assert order(7) == order(7)
    assert order(7) != order(8)


def test_unknown_strategy():
    with pytest.raises(ValueError, match="unknown strategy"):
        make_strategy("annealing")

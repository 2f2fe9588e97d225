"""The decision adopts only confident wins; noise and ties keep the baseline."""

from __future__ import annotations

import random

from kernelsmith.decide import compare


def _noisy(center: float, spread: float, n: int, seed: int) -> list[float]:
    rng = random.Random(seed)
    return [center * (1 + rng.uniform(-spread, spread)) for _ in range(n)]


def test_clear_win_is_significant():
    c = compare(_noisy(80, 0.05, 60, 1), _noisy(100, 0.05, 60, 2))
    assert c.significant and 1.15 < c.speedup < 1.35 and c.ci_low > 1.0 and c.ci_low <= c.speedup <= c.ci_high


def test_tie_within_noise_is_not_adopted():
    for seed in range(10):
        c = compare(_noisy(100, 0.1, 40, seed), _noisy(100, 0.1, 40, seed + 100))
        assert not c.significant, c


def test_slower_candidate_is_never_adopted():
    c = compare(_noisy(120, 0.02, 40, 3), _noisy(100, 0.02, 40, 4))
    assert not c.significant and c.speedup < 1.0


def test_min_speedup_margin_is_enforced():
    c = compare([98.0] * 40, [100.0] * 40, min_speedup=1.05)
    assert not c.significant and abs(c.speedup - 100 / 98) < 1e-9


def test_too_few_rounds_or_empty_series_are_not_significant():
    assert not compare([1.0, 1.0], [2.0, 2.0]).significant
    empty = compare([], [])
    assert not empty.significant and empty.rounds == 0


def test_pairing_cancels_shared_drift():
    # Both series drift together (clock or co-tenant changes); pairing still sees the 10% win.
    drift = [1 + 0.5 * i / 40 for i in range(40)]
    baseline = [100 * d for d in drift]
    candidate = [90 * d for d in drift]
    c = compare(candidate, baseline)
    assert c.significant and abs(c.speedup - 100 / 90) < 1e-9

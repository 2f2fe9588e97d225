"""The statistical decision: is a candidate really faster than what it would replace?

Timings come in interleaved rounds: in round ``i`` the baseline took ``b_i`` and the candidate
``c_i`` under the same conditions. The speedup is estimated as the median of the paired ratios
``b_i / c_i``, and its confidence interval by a seeded bootstrap over rounds. A candidate is
adopted only when the *lower* bound of that interval clears ``min_speedup``: a difference
smaller than the noise is not a win, and "the baseline wins" is a valid outcome.

>>> c = compare([10.0] * 30, [12.0] * 30)
>>> round(c.speedup, 2), c.significant
(1.2, True)
>>> compare([10.0, 11.0] * 15, [10.5, 10.4] * 15).significant
False
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Comparison:
    """``speedup`` > 1 means the candidate is faster than the reference it was compared with."""

    speedup: float
    ci_low: float
    ci_high: float
    significant: bool
    rounds: int

    def to_dict(self) -> dict[str, float | bool | int]:
        return {
            "speedup": self.speedup,
            "ci_low": self.ci_low,
            "ci_high": self.ci_high,
            "significant": self.significant,
            "rounds": self.rounds,
        }


def compare(
    candidate_us: Sequence[float],
    reference_us: Sequence[float],
    *,
    min_speedup: float = 1.0,
    confidence: float = 0.95,
    resamples: int = 2000,
    seed: int = 0,
) -> Comparison:
    """Paired comparison of two interleaved timing series (same length, same rounds)."""
    n = min(len(candidate_us), len(reference_us))
    if n == 0:
        return Comparison(float("nan"), float("nan"), float("nan"), False, 0)
    log_ratios = [
        math.log(reference_us[i] / candidate_us[i]) for i in range(n) if candidate_us[i] > 0 and reference_us[i] > 0
    ]
    if not log_ratios:
        return Comparison(float("nan"), float("nan"), float("nan"), False, 0)
    estimate = math.exp(statistics.median(log_ratios))
    rng = random.Random(seed)
    medians = sorted(statistics.median(rng.choices(log_ratios, k=len(log_ratios))) for _ in range(resamples))
    tail = (1.0 - confidence) / 2.0
    low = math.exp(medians[int(tail * (resamples - 1))])
    high = math.exp(medians[int((1.0 - tail) * (resamples - 1))])
    # One-sided: adopt only when the lower bound clears the bar.
    return Comparison(estimate, low, high, low > min_speedup and len(log_ratios) >= 5, len(log_ratios))

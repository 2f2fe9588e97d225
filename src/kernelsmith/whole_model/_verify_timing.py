"""End-to-end time: several callables timed on the same inputs in interleaved rounds.

Part of the whole-model verification (:mod:`kernelsmith.whole_model.verify`), its third question
(is it faster?): :func:`time_models` times forwards (or training steps) round by round, and
:func:`paired_speedup` states a speedup as the median of the round-by-round ratios with a 95%
interval from order statistics (:func:`median_interval`), or "unresolved".
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import nn

from kernelsmith.whole_model._verify_compare import _leaves
from kernelsmith.whole_model._verify_results import NO_GPU_NOTE, TimingResult, TimingRow

# ---------------------------------------------------------------------------------------------
# End-to-end time
# ---------------------------------------------------------------------------------------------


def time_models(
    variants: Mapping[str, Callable[[], Any]],
    *,
    device: torch.device | str = "cpu",
    warmup: int = 3,
    rounds: int = 10,
    train: bool = False,
    optimized: str | None = None,
) -> TimingResult:
    """Time each zero-argument runner in ``variants`` in interleaved rounds (module docstring).

    Runners are called as they are: wrap the forward (and backward, for ``train``) yourself.
    The first variant is the one speedups are relative to (``eager``); ``optimized`` names the
    variant whose paired speedups over ``eager`` and ``inductor`` (when present) are reported.
    ``warmup`` calls of each come first (compilation happens there).
    """
    from kernelsmith.evaluate.timing import summarize

    if rounds < 1 or warmup < 0:
        raise ValueError(f"rounds must be positive and warmup non-negative (got {rounds}, {warmup})")
    device = torch.device(device)
    on_gpu = device.type == "cuda"
    names = list(variants)
    fns = [variants[n] for n in names]
    for fn in fns:
        for _ in range(warmup):
            fn()
    if on_gpu:
        torch.cuda.synchronize(device)
    samples: list[list[float]] = [[] for _ in fns]
    for r in range(rounds):
        for j in range(len(fns)):
            i = (j + r) % len(fns)
            if on_gpu:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                fns[i]()
                end.record()
                torch.cuda.synchronize(device)
                samples[i].append(start.elapsed_time(end) * 1000.0)
            else:
                t0 = time.perf_counter()
                fns[i]()
                samples[i].append((time.perf_counter() - t0) * 1e6)
    stats = [summarize(s) for s in samples]
    eager_ms = stats[0]["median_us"] / 1000.0
    rows = [
        TimingRow(
            name,
            s["median_us"] / 1000.0,
            s["p10_us"] / 1000.0,
            s["p90_us"] / 1000.0,
            eager_ms / (s["median_us"] / 1000.0) if s["median_us"] > 0 else None,
        )
        for name, s in zip(names, stats, strict=True)
    ]
    comparisons: dict[str, dict[str, Any]] = {}
    if optimized is not None and optimized in names:
        mine = samples[names.index(optimized)]
        for other in (names[0], "inductor"):
            if other in names and other != optimized:
                comparisons[other] = paired_speedup(mine, samples[names.index(other)])
    return TimingResult(
        rows,
        timer="cuda-events" if on_gpu else "host-clock",
        rounds=rounds,
        train=train,
        comparisons=comparisons,
        note="" if on_gpu else NO_GPU_NOTE,
    )


# A speedup whose 95% interval spans more than this factor (high / low) is not stated: the rounds
# disagree too much for one number to mean anything (a loaded machine, a stall in one round).
RESOLVED_SPREAD = 1.5
CONFIDENCE = 0.95


def median_interval(values: Sequence[float], confidence: float = CONFIDENCE) -> tuple[float, float] | None:
    """A distribution-free ``confidence`` interval for the median of ``values``: the order
    statistics ``(x_(k), x_(n+1-k))`` with the largest ``k`` whose coverage, from the binomial
    distribution of how many values fall below the median, is at least ``confidence``. None when
    there are too few values for any such interval (fewer than 6 at 95%).

    Why not the bootstrap of :func:`kernelsmith.decide.compare`: over the 5-20 rounds a whole
    model is timed for, the bootstrap of a median returns about the smallest and largest ratio
    whatever the confidence asked, which is how one stalled round once printed an interval of
    1.77-236.5; this interval's coverage is exact for any distribution, and it says when the
    rounds cannot support one.

    >>> median_interval([1.0, 2.0, 3.0, 4.0, 5.0]) is None
    True
    >>> median_interval([float(i) for i in range(1, 21)])
    (6.0, 15.0)
    """
    n = len(values)
    ordered = sorted(values)
    tail = (1.0 - confidence) / 2.0
    k, below = 0, 0.0  # below: P(Binomial(n, 1/2) <= k - 1), the chance x_(k) is above the median
    while k < n // 2:
        step = below + math.comb(n, k) / 2.0**n
        if step > tail:
            break
        below, k = step, k + 1
    if k == 0:
        return None
    return ordered[k - 1], ordered[n - k]


def paired_speedup(candidate: Sequence[float], reference: Sequence[float]) -> dict[str, Any]:
    """The candidate's speedup over the reference from paired rounds (``reference[i] /
    candidate[i]``): the median ratio, its 95% :func:`median_interval` (None with too few rounds),
    ``significant`` (the interval is above 1), ``resolved`` (an interval exists and spans at most
    :data:`RESOLVED_SPREAD`) and the rounds used."""
    ratios = [r / c for c, r in zip(candidate, reference, strict=False) if c > 0 and r > 0]
    interval = median_interval(ratios)
    low, high = interval if interval is not None else (None, None)
    return {
        "speedup": statistics.median(ratios) if ratios else None,
        "ci_low": low,
        "ci_high": high,
        "significant": low is not None and low > 1.0,
        "resolved": low is not None and high is not None and high <= RESOLVED_SPREAD * low,
        "rounds": len(ratios),
    }


def forward_runner(fn: Callable[..., Any], inputs: Sequence[Any], *, train: bool = False) -> Callable[[], Any]:
    """A zero-argument runner for :func:`time_models`: ``fn(*inputs)`` under ``no_grad``, or with
    ``train`` a forward and a backward of the outputs' sum (gradients cleared first)."""
    params = [p for p in fn.parameters()] if isinstance(fn, nn.Module) else []

    def forward() -> Any:
        with torch.no_grad():
            return fn(*inputs)

    def step() -> Any:
        for p in params:
            p.grad = None
        leaves = [t for _, t in _leaves(fn(*inputs), "output") if t.requires_grad]
        torch.stack([t.float().sum() for t in leaves]).sum().backward()

    return step if train else forward

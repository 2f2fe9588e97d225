"""Timing inside the worker: CUDA events, L2 flushed, interleaved rounds, rotating input sets.

The timer functions are bound when this module is imported, which happens before any candidate
code is loaded: a candidate that monkey-patches ``torch.cuda.Event`` or ``time.perf_counter``
does not change what the harness measures with (and the worker's integrity check notices it).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence

import torch

_Event = torch.cuda.Event
_synchronize = torch.cuda.synchronize
_perf_counter = time.perf_counter

# Runs implementation i on input set s: fns[i](s).
Runner = Callable[[int], object]


class L2Flusher:
    """Writes a buffer several times the L2 size so every timed call starts with a cold cache."""

    def __init__(self, device: torch.device) -> None:
        props = torch.cuda.get_device_properties(device)
        l2 = int(getattr(props, "L2_cache_size", 0) or 64 << 20)
        self.buffer = torch.empty(4 * l2, dtype=torch.uint8, device=device)

    def flush(self) -> None:
        self.buffer.zero_()


def summarize(samples_us: Sequence[float]) -> dict[str, float]:
    """Median, quantiles and spread of a list of timings in microseconds."""
    ordered = sorted(samples_us)
    n = len(ordered)

    def q(p: float) -> float:
        return ordered[min(n - 1, max(0, round(p * (n - 1))))]

    return {
        "median_us": statistics.median(ordered),
        "p10_us": q(0.10),
        "p25_us": q(0.25),
        "p75_us": q(0.75),
        "p90_us": q(0.90),
        "min_us": ordered[0],
        "mean_us": statistics.fmean(ordered),
        "n": n,
    }


def _warm_up_gpu(fn: Runner, n_sets: int, warmup_ms: float) -> None:
    """Run until about ``warmup_ms`` of device time has passed (at least twice)."""
    start, end = _Event(enable_timing=True), _Event(enable_timing=True)
    start.record()
    fn(0)
    end.record()
    _synchronize()
    once_ms = max(start.elapsed_time(end), 1e-3)
    for i in range(max(1, min(1000, int(warmup_ms / once_ms)))):
        fn(i % n_sets)
    _synchronize()


def interleaved_gpu(
    fns: Sequence[Runner], n_sets: int, rounds: int, warmup_ms: float, flusher: L2Flusher | None
) -> list[list[float]]:
    """Time every implementation once per round, in an order that rotates each round.

    Interleaving puts every implementation under the same clock, thermal and co-tenant
    conditions, so paired comparisons (round by round) cancel most drift.
    """
    for fn in fns:
        _warm_up_gpu(fn, n_sets, warmup_ms)
    pending: list[tuple[int, torch.cuda.Event, torch.cuda.Event]] = []
    for r in range(rounds):
        s = r % n_sets
        for j in range(len(fns)):
            i = (j + r) % len(fns)
            if flusher is not None:
                flusher.flush()
            start, end = _Event(enable_timing=True), _Event(enable_timing=True)
            start.record()
            fns[i](s)
            end.record()
            pending.append((i, start, end))
    _synchronize()
    samples: list[list[float]] = [[] for _ in fns]
    for i, start, end in pending:
        samples[i].append(start.elapsed_time(end) * 1000.0)
    return samples


def synchronized_gpu(fns: Sequence[Runner], n_sets: int, rounds: int) -> list[float]:
    """Shortest time of each implementation with a device-wide synchronize before the end event.

    Work a candidate hides on a side stream or a background thread escapes the stream's events
    but not a device-wide synchronize: compared with the event-only timing, it shows up as an
    overhead far larger than the baseline's (see the worker's side-work check).
    """
    minima = []
    for fn in fns:
        times = []
        for r in range(rounds):
            start, end = _Event(enable_timing=True), _Event(enable_timing=True)
            start.record()
            fn(r % n_sets)
            _synchronize()
            end.record()
            _synchronize()
            times.append(start.elapsed_time(end) * 1000.0)
        minima.append(min(times))
    return minima


def interleaved_cpu(fns: Sequence[Runner], n_sets: int, rounds: int) -> list[list[float]]:
    """Host-clock timing for the Triton interpreter (never reported as performance)."""
    samples: list[list[float]] = [[] for _ in fns]
    for r in range(rounds):
        for j in range(len(fns)):
            i = (j + r) % len(fns)
            t0 = _perf_counter()
            fns[i](r % n_sets)
            samples[i].append((_perf_counter() - t0) * 1e6)
    return samples


def measure_copy_bandwidth(
    device: torch.device, nbytes: int = 1 << 30, repeats: int = 20
) -> tuple[float, dict[str, float]]:
    """Device-to-device copy bandwidth in GB/s, counting bytes read plus bytes written.

    The ceiling is the *best* of ``repeats`` copies of ``nbytes``: the highest rate this device
    has shown, so percentages of it are never flattered by a slow measurement.
    """
    src = torch.empty(nbytes, dtype=torch.uint8, device=device).random_(0, 255)
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    times = []
    for _ in range(repeats):
        start, end = _Event(enable_timing=True), _Event(enable_timing=True)
        start.record()
        dst.copy_(src)
        end.record()
        _synchronize()
        times.append(start.elapsed_time(end) / 1000.0)
    best_gbps = 2 * nbytes / min(times) / 1e9
    median_gbps = 2 * nbytes / statistics.median(times) / 1e9
    return best_gbps, {"nbytes": float(nbytes), "median_gbps": median_gbps, "repeats": float(repeats)}

"""Rule 6's side-work check on a model device: the harness's own measuring code
(``timing.synchronized_gpu``, ``timing.interleaved_gpu``) and its decision
(``timing.side_work_problem``) run on the CPU against a small simulation of a GPU and its host.

The model: host time advances only when a call spends it (issuing launches) or waits (a
synchronize waits for every stream, then a wake-up latency). Each stream runs its kernels in
order; a kernel starts once it is issued (plus a launch latency) and its stream's earlier work is
done. Events are zero-length items on the timed stream. A "thread" issues its launch at a later
host time, whatever the main thread is doing. That is enough to tell the cases h32 is about apart:
a slow host issuing a correct multi-launch kernel (found rejected on a busy H200), work on a side
stream, work handed to a thread.
"""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest

from kernelsmith.evaluate import timing
from kernelsmith.evaluate.timing import SyncRound, side_work_problem

LAUNCH_US = 2.0  # host issue to the device seeing it


class ModelDevice:
    def __init__(self, wake_us: Callable[[], float] = lambda: 5.0) -> None:
        self.now = 0.0  # host clock, microseconds
        self.free_at: dict[str, float] = {"timed": 0.0}  # when each stream's queued work ends
        self.thread_launches: list[tuple[float, str, float]] = []  # (host time, stream, device us)
        self.wake_us = wake_us
        self.host_slowdown = 1.0  # a busy host: every host step takes this many times longer
        self.idle_at_call: list[bool] = []  # per call of rule 6's pass: was the device idle?
        self.record_delay: Callable[[], float] = lambda: 0.0  # the host away before an event reaches the device

    # what implementations do
    def spend(self, us: float) -> None:
        self.now += us * self.host_slowdown

    def launch(self, stream: str, us: float, at: float | None = None) -> None:
        issued = self.now if at is None else at
        begin = max(issued + LAUNCH_US, self.free_at.get(stream, 0.0))
        self.free_at[stream] = begin + us

    def from_a_thread(self, delay_us: float, stream: str, us: float) -> None:
        self.thread_launches.append((self.now + delay_us, stream, us))

    # what the harness calls (bound into timing in place of CUDA's)
    def _thread_launches_due(self) -> None:
        for item in sorted(x for x in self.thread_launches if x[0] <= self.now):
            self.thread_launches.remove(item)
            self.launch(item[1], item[2], at=item[0])

    def record(self) -> float:
        self.now += self.record_delay()
        self._thread_launches_due()
        self.launch("timed", 0.0)
        return self.free_at["timed"]

    def synchronize(self) -> None:
        self._thread_launches_due()  # issued before the synchronize: waited for
        self.now = max([self.now, *self.free_at.values()]) + self.wake_us()
        self._thread_launches_due()  # issued while it waited: queued, not waited for

    def perf_counter(self) -> float:
        return self.now * 1e-6

    def idle(self) -> bool:
        """Nothing queued but the start event the harness has just recorded."""
        return all(t <= self.now + LAUNCH_US for t in self.free_at.values()) and not self.thread_launches


class ModelEvent:
    def __init__(self, device: ModelDevice) -> None:
        self.device, self.at = device, 0.0

    def record(self) -> None:
        self.at = self.device.record()

    def elapsed_time(self, end: ModelEvent) -> float:
        return (end.at - self.at) / 1000.0  # milliseconds, as CUDA's


@pytest.fixture
def device(monkeypatch: pytest.MonkeyPatch) -> ModelDevice:
    model = ModelDevice()
    monkeypatch.setattr(timing, "_Event", lambda enable_timing=False: ModelEvent(model))
    monkeypatch.setattr(timing, "_synchronize", model.synchronize)
    monkeypatch.setattr(timing, "_perf_counter", model.perf_counter)
    return model


# ---- implementations on the model ----------------------------------------------------------------
def baseline(device: ModelDevice) -> Callable[[int], None]:
    """PyTorch's reference: one cheap call, 80 us of device work."""

    def call(s: int) -> None:
        device.spend(8.0)
        device.launch("timed", 80.0)

    return call


def multi_launch(device: ModelDevice, launches: int = 8) -> Callable[[int], None]:
    """A correct kernel issued as several launches (persistent layernorm, split-KV write_kv):
    10 us of host time and 10 us of device work each, all on the timed stream."""

    def call(s: int) -> None:
        for _ in range(launches):
            device.spend(10.0)
            device.launch("timed", 10.0)

    return call


def side_stream(device: ModelDevice, work_us: float = 60.0) -> Callable[[int], None]:
    """Its kernel on a stream of its own, never joined: the timed stream stays empty."""

    def call(s: int) -> None:
        device.spend(10.0)
        device.launch("side", work_us)

    return call


def background_thread(device: ModelDevice, delay_us: float = 5.0) -> Callable[[int], None]:
    """Returns at once; a thread launches the kernel ``delay_us`` later on the default (timed)
    stream. A Python thread gets the GIL when the main thread waits in the synchronize (which
    releases it), so its launch lands there: 5 us after the call returned."""

    def call(s: int) -> None:
        device.spend(15.0)
        device.from_a_thread(delay_us, "timed", 60.0)

    return call


def event_minima(fns: list[Callable[[int], None]]) -> list[float]:
    samples = timing.interleaved_gpu(fns, n_sets=2, rounds=10, warmup_ms=0.0, flusher=None)
    return [min(x) for x in samples]


Judged = tuple[str | None, list[list[SyncRound]], list[float]]


def judge(device: ModelDevice, candidate: Callable[[int], None], host_slowdown: float = 1.0,
          late: Callable[[], float] | None = None) -> Judged:  # fmt: skip
    """The worker's sequence: event timing on a quiet host, then rule 6's pass with the host
    ``host_slowdown`` times slower (contention arriving late in a request, as on the H200) and,
    given ``late``, away that long before each event it records."""
    fns = [baseline(device), candidate]
    device.host_slowdown = 1.0
    events = event_minima(fns)
    device.host_slowdown = host_slowdown
    if late is not None:
        device.record_delay = late
    rounds = timing.synchronized_gpu(fns, n_sets=2, rounds=timing.SIDE_WORK_ROUNDS)
    return side_work_problem(rounds[1], rounds[0], events[1]), rounds, events


def old_rule_flags(rounds: list[list[SyncRound]], events: list[float]) -> bool:
    """The rule before h32: start -> end with a synchronize against the events, host time included."""
    sync = [min(r.stream_us + r.tail_us for r in per) for per in rounds]
    return sync[1] - events[1] > (sync[0] - events[0]) + max(20.0, 0.5 * sync[1])


# ---- the cases -----------------------------------------------------------------------------------
def test_a_correct_multi_launch_kernel_on_a_slow_host_is_not_flagged(device: ModelDevice) -> None:
    problem, rounds, events = judge(device, multi_launch(device), host_slowdown=4.5)
    assert problem is None
    # The model reproduces what the H200 showed: ~360 us with a synchronize against ~80 us by
    # events, which the earlier rule called hidden work.
    assert min(r.stream_us + r.tail_us for r in rounds[1]) > 4 * events[1]
    assert old_rule_flags(rounds, events)


def test_the_same_kernel_on_a_quiet_host_is_not_flagged(device: ModelDevice) -> None:
    assert judge(device, multi_launch(device))[0] is None


@pytest.mark.parametrize("host_slowdown", [1.0, 4.5])
def test_side_stream_work_is_flagged(device: ModelDevice, host_slowdown: float) -> None:
    problem, _, events = judge(device, side_stream(device), host_slowdown)
    assert events[1] < 5.0  # the events saw (almost) nothing
    assert problem is not None and "work continued after the timed region" in problem
    assert "side stream or thread" in problem


def test_background_thread_work_is_flagged(device: ModelDevice) -> None:
    problem = judge(device, background_thread(device))[0]
    assert problem is not None and "work continued after the timed region" in problem


def test_a_thread_that_launches_after_the_end_event_is_not_this_rules_to_catch(device: ModelDevice) -> None:
    """Stated limit: a launch that waits past ``end`` is in no timing of its own call (it lands in a
    later call's). The worker's per-call thread count is what rejects threads ("started a thread")."""
    assert judge(device, background_thread(device, delay_us=30.0))[0] is None


def test_short_side_work_below_the_floor_is_not_told_from_noise(device: ModelDevice) -> None:
    """The floor is a real limit of the check, stated: 10 us of hidden work passes."""
    assert judge(device, side_stream(device, work_us=10.0))[0] is None
    assert judge(device, side_stream(device, work_us=2 * timing.SIDE_WORK_FLOOR_US))[0] is not None


def test_bursts_of_host_latency_neither_accuse_nor_excuse(device: ModelDevice) -> None:
    """A third of the synchronizes come back 100-600 us late (a descheduled host): minima over
    interleaved rounds and the baseline's tail noise keep a correct kernel clean, and hidden work
    longer than that noise, there in every call, still shows. (Hidden work shorter than the
    baseline's own tail noise is excused by design: the limit grows with it.)"""
    draw = random.Random(32)
    device.wake_us = lambda: 5.0 if draw.random() < 0.67 else draw.uniform(100.0, 600.0)
    for seed in range(20):
        draw.seed(seed)
        assert judge(device, multi_launch(device), host_slowdown=4.5)[0] is None, seed
    for seed in range(20):
        draw.seed(seed)
        assert judge(device, side_stream(device, work_us=700.0))[0] is not None, seed


def tail_only_rule_flags(rounds: list[list[SyncRound]], events: list[float]) -> bool:
    """The rule of h32 before the span was counted: the candidate's shortest tail alone."""
    return min(r.tail_us for r in rounds[1]) - min(r.tail_us for r in rounds[0]) > max(20.0, 0.5 * events[1])


def test_a_host_late_to_record_mid_does_not_hide_side_work(device: ModelDevice) -> None:
    """One event in five reaches the device 150-400 us late (the host lost its core), as beside 32
    spinning processes on the H200: rounds where ``mid`` came after a side stream's 100 us of work
    hid it from the tail-only rule; the span still holds it. A correct multi-launch kernel under the
    same lateness stays clean."""
    draw = random.Random(6)

    def late() -> float:
        return draw.uniform(150.0, 400.0) if draw.random() < 0.2 else 0.0

    missed_by_tail_only = 0
    for seed in range(20):
        draw.seed(seed)
        problem, rounds, events = judge(device, side_stream(device, work_us=100.0), late=late)
        assert problem is not None, seed
        missed_by_tail_only += not tail_only_rule_flags(rounds, events)
    assert missed_by_tail_only > 10  # the case is real: the tail alone lets most of these through
    for seed in range(20):
        draw.seed(seed)
        assert judge(device, multi_launch(device), host_slowdown=4.5, late=late)[0] is None, seed
        assert judge(device, baseline(device), late=late)[0] is None, seed


def test_a_noisy_host_gets_more_rounds(device: ModelDevice, monkeypatch: pytest.MonkeyPatch) -> None:
    """Tails 5 us or 100-600 us late at random: the pass goes on (up to SIDE_WORK_MAX_ROUNDS) while
    the baseline's median tail is far above its minimum, and the lower quantile that allows catches
    60 us of side work that the median of 15 such rounds would excuse."""
    draw = random.Random(60)
    device.wake_us = lambda: 5.0 if draw.random() < 0.4 else draw.uniform(100.0, 600.0)
    caught, extended = 0, 0
    for seed in range(20):
        draw.seed(seed)
        problem, rounds, _ = judge(device, side_stream(device, work_us=60.0))
        assert len(rounds[0]) in (timing.SIDE_WORK_ROUNDS, 2 * timing.SIDE_WORK_ROUNDS, timing.SIDE_WORK_MAX_ROUNDS)
        extended += len(rounds[0]) > timing.SIDE_WORK_ROUNDS  # (15 quiet-enough rounds stop it early)
        caught += problem is not None
    assert extended >= 10 and caught >= 18
    monkeypatch.setattr(timing, "SIDE_WORK_MAX_ROUNDS", timing.SIDE_WORK_ROUNDS)  # 15 rounds, no more
    caught_in_15 = 0
    for seed in range(20):
        draw.seed(seed)
        caught_in_15 += judge(device, side_stream(device, work_us=60.0))[0] is not None
    assert caught_in_15 < caught - 5
    for seed in range(20):
        draw.seed(seed)
        assert judge(device, multi_launch(device), host_slowdown=4.5)[0] is None, seed


def test_the_pass_interleaves_and_starts_every_call_on_an_idle_device(device: ModelDevice) -> None:
    order: list[int] = []

    def tracked(i: int, inner: Callable[[int], None]) -> Callable[[int], None]:
        def call(s: int) -> None:
            device.idle_at_call.append(device.idle())
            order.append(i)
            inner(s)

        return call

    fns = [tracked(0, baseline(device)), tracked(1, side_stream(device)), tracked(2, multi_launch(device))]
    rounds = timing.synchronized_gpu(fns, n_sets=2, rounds=4)
    assert [len(r) for r in rounds] == [4, 4, 4]
    assert order == [0, 1, 2, 1, 2, 0, 2, 0, 1, 0, 1, 2]  # each round rotates who goes first
    assert all(device.idle_at_call)
    assert all(r.issue_us == pytest.approx(80.0) for r in rounds[2])  # host time inside the call


# ---- the decision on its own ---------------------------------------------------------------------
def rounds_of(*tails: float, issue: float = 10.0, stream: float | None = None) -> list[SyncRound]:
    """Rounds with these tails; the stream events' start -> mid is the issue time unless given (a
    host on time to record ``mid`` after a call whose stream work was done when it returned)."""
    return [SyncRound(issue, issue if stream is None else stream, t) for t in tails]


def test_the_limit_is_the_largest_of_floor_share_and_baseline_noise() -> None:
    quiet = rounds_of(5.0, 5.0, 6.0)
    assert side_work_problem(rounds_of(24.0), quiet, event_min_us=10.0) is None  # 19 us < 20 floor
    assert side_work_problem(rounds_of(26.0), quiet, event_min_us=10.0) is not None
    assert side_work_problem(rounds_of(45.0), quiet, event_min_us=100.0) is None  # 40 us < half of 100
    assert side_work_problem(rounds_of(60.0), quiet, event_min_us=100.0) is not None
    # 15 rounds: one quick, the others 80-93 us; the 9th smallest (noise_rank(15)) is 87, so the
    # host adds up to 82 us by chance
    noisy = rounds_of(5.0, *(80.0 + i for i in range(14)))
    assert timing.noise_rank(15) == 9
    assert side_work_problem(rounds_of(80.0), noisy, event_min_us=10.0) is None  # 75 us
    assert side_work_problem(rounds_of(95.0), noisy, event_min_us=10.0) is not None  # 90 us


@pytest.mark.parametrize("n", [3, 15, 30, 45])
def test_the_noise_rank_is_the_first_whose_false_alarm_is_at_most_one_in_a_thousand(n: int) -> None:
    """All n candidate rounds above the baseline's k-th smallest, when the 2n rounds are exchangeable:
    checked by counting on a random permutation model, not by the formula that computes k."""
    import math

    k = timing.noise_rank(n)

    def chance(k: int) -> float:
        return math.comb(2 * n - k, n) / math.comb(2 * n, n)

    if k < n:
        assert chance(k) <= timing.SIDE_WORK_FALSE_ALARM < chance(k - 1)
    else:  # too few rounds for that chance: the largest tail
        assert chance(n) > timing.SIDE_WORK_FALSE_ALARM
    draw = random.Random(n)
    trials, alarms = 20000, 0
    for _ in range(trials):
        ranks = draw.sample(range(2 * n), 2 * n)
        baseline, candidate = sorted(ranks[:n]), ranks[n:]
        alarms += min(candidate) > baseline[k - 1]
    assert alarms / trials <= 3 * max(chance(k), 1.0 / trials) + 3 * math.sqrt(chance(k) / trials)


def test_a_late_mid_moves_time_from_the_tail_to_the_stream_but_not_out_of_the_span() -> None:
    """A round where the host recorded ``mid`` 300 us after the call returned: a side stream's 100 us
    were done by then, so its tail is the latency alone; its span still holds them."""
    quiet = rounds_of(5.0, 5.0, 6.0)
    late = rounds_of(5.0, issue=10.0, stream=310.0)  # nothing on the timed stream: 300 us late
    assert side_work_problem(late, quiet, event_min_us=2.0) is not None
    # an honest call's late round counts its lateness too, but the minimum over rounds drops it
    honest = [*rounds_of(5.0, issue=10.0, stream=90.0), *rounds_of(5.0, issue=10.0, stream=390.0)]
    assert side_work_problem(honest, quiet, event_min_us=85.0) is None


def test_issue_time_never_counts_as_hidden_work() -> None:
    quiet = rounds_of(5.0, 5.0)
    assert side_work_problem(rounds_of(6.0, issue=5000.0), quiet, event_min_us=10.0) is None


def test_missing_rounds_are_an_error_not_a_pass() -> None:
    with pytest.raises(ValueError, match="synchronized rounds"):
        side_work_problem([], rounds_of(5.0), event_min_us=10.0)

"""RS-6 and RS-10: client-side adaptive throttling.

The refusal probability is ``max(0, (requests - K * accepts) / (requests + 1))`` over the
last W seconds. Unit tests pin the formula and the window on a FakeClock; the RS-10 tests
make 10,000 calls with a seeded random source (threads, asyncio tasks, processes) and
require the refusal rate to match the formula within 3 percentage points. The thread test
also requires every request and accept to be counted while the current second is closed
again and again under the threads, and its meta-test shows that it catches a lock that
protects nothing.
"""

from __future__ import annotations

import asyncio
import math
import multiprocessing
import random

import pytest

from baldur_django.core.errors import ConfigError
from baldur_django.core.stages import throttle as throttle_module
from baldur_django.core.stages.throttle import AdaptiveThrottle
from baldur_django.core.testing import FakeClock

from .budget_helpers import SharedClock, fast_switching, run_threads, unlocked  # noqa: F401 - fixture

CALLS = 10_000
TOLERANCE = 0.03  # percentage points, as a fraction


def make(k: float = 2.0, window: float = 10, seed: int = 7, start: float = 1000.0):
    clock = FakeClock(start=start)
    return AdaptiveThrottle("payments", k, window, clock, rand=random.Random(seed).random), clock


# ----------------------------------------------------------------------------- RS-6 unit
def test_rs6_no_history_admits_everything():
    """RS-6: with no requests the probability is 0 and the random source is never asked."""
    clock = FakeClock()

    def never() -> float:
        raise AssertionError("the random source was asked while nothing can be refused")

    throttle = AdaptiveThrottle("payments", 2.0, 60, clock, rand=never)
    assert throttle.probability() == 0.0
    for _ in range(100):
        assert throttle.admit()
        throttle.accepted()
    assert throttle.counts() == (100, 100)
    assert throttle.probability() == 0.0


def test_rs6_probability_is_the_formula():
    """RS-6: (requests - K * accepts) / (requests + 1), at least 0; refused requests count."""
    throttle, _ = make(k=2.0, seed=1)
    for _ in range(10):
        throttle.admit()
    assert throttle.probability() == pytest.approx(10 / 11)
    throttle.accepted()
    throttle.accepted()
    assert throttle.probability() == pytest.approx((10 - 4) / 11)
    for _ in range(3):
        throttle.accepted()
    assert throttle.probability() == 0.0  # 10 - 2 * 5 = 0
    requests = throttle.counts()[0]
    for _ in range(30):
        throttle.admit()  # refused or not, each one is a request
    assert throttle.counts() == (requests + 30, 5)


def test_rs6_admit_refuses_when_the_draw_is_below_the_probability():
    """RS-6: admit() compares one draw with the probability before the request is counted."""
    draws = iter([0.5, 0.6])
    throttle = AdaptiveThrottle("payments", 1.0, 60, FakeClock(), rand=lambda: next(draws))
    assert throttle.admit()  # probability 0: no draw
    assert throttle.admit()  # (1 - 0) / 2 = 0.5 and the draw 0.5 is not below it
    assert throttle.probability() == pytest.approx(2 / 3)
    assert not throttle.admit()  # the draw 0.6 is below 2/3


def test_rs6_k_one_refuses_as_soon_as_anything_fails():
    """RS-6: with K = 1, one failed request among successes is already a chance of refusal."""
    throttle, _ = make(k=1.0)
    for _ in range(99):
        throttle.admit()
        throttle.accepted()
    throttle.admit()  # fails
    assert throttle.probability() == pytest.approx(1 / 101)


def test_rs6_counts_leave_the_window():
    """RS-6: W seconds of history: a second's counts leave W seconds later."""
    throttle, clock = make(k=2.0, window=5)
    for _ in range(50):
        throttle.admit()  # a failing burst at second 1000
    clock.advance(2)
    for _ in range(10):
        throttle.admit()
        throttle.accepted()
    assert throttle.counts() == (60, 10)
    clock.advance(2.999)  # 1004.999: still in
    assert throttle.probability() == pytest.approx((60 - 20) / 61)
    clock.advance(0.001)  # 1005.0: second 1000 left
    assert throttle.counts() == (10, 10)
    assert throttle.probability() == 0.0
    clock.advance(60)
    assert throttle.counts() == (0, 0)


def test_rs6_a_window_of_a_fraction_is_rounded_up_to_whole_seconds():
    """RS-6: window 1.5 keeps the current second and the one before."""
    throttle, clock = make(window=1.5)
    throttle.admit()
    clock.advance(1)
    throttle.admit()
    assert throttle.counts() == (2, 0)
    clock.advance(1)
    assert throttle.counts() == (1, 0)


@pytest.mark.parametrize(
    ("k", "window", "knob"),
    [
        (0, 60, "adaptive_throttling_k"),
        (-2, 60, "adaptive_throttling_k"),
        (math.inf, 60, "adaptive_throttling_k"),
        ("2", 60, "adaptive_throttling_k"),
        (2.0, 0.5, "adaptive_throttling_window"),
        (2.0, math.nan, "adaptive_throttling_window"),
        (2.0, False, "adaptive_throttling_window"),
    ],
)
def test_rs6_bad_numbers_are_a_config_error_naming_the_knob(k, window, knob):
    """RS-8 for the throttle: the error names the knob and the bad value."""
    with pytest.raises(ConfigError, match=knob) as caught:
        AdaptiveThrottle("payments", k, window, FakeClock())
    assert repr(window if knob.endswith("window") else k) in str(caught.value)


# --------------------------------------------------------------- RS-10 refusal rate
def test_rs10_refusal_rate_matches_the_formula_against_a_saturated_service():
    """RS-10/RS-6: 1,000 calls a second for 10 s against a service that serves at most 100 a
    second, K = 2, W = 5 s, seeded: refusals match the summed probabilities within 3
    points, and once settled the rate is the formula's (1000 - 2 * 100) / 1000 = 0.8."""
    throttle, clock = make(k=2.0, window=5, seed=2024)
    expected = 0.0
    refused = 0
    late = []  # refusals of the last 2 s
    served: dict[int, int] = {}
    for i in range(CALLS):
        expected += throttle.probability()
        if throttle.admit():
            second = math.floor(clock.monotonic())
            if served.get(second, 0) < 100:
                served[second] = served.get(second, 0) + 1
                throttle.accepted()
        else:
            refused += 1
            if i >= 8_000:
                late.append(i)
        clock.advance(0.001)
    assert abs(refused - expected) / CALLS <= TOLERANCE
    assert abs(len(late) / 2_000 - 0.8) <= TOLERANCE


def probability_run(throttle: AdaptiveThrottle, calls: int, success: random.Random) -> tuple[float, int]:
    """*calls* requests; an admitted one succeeds with probability 0.4 (K * 0.4 < 1, so the
    probability keeps climbing). Returns (summed probability before each call, refusals)."""
    expected = 0.0
    refused = 0
    for _ in range(calls):
        expected += throttle.probability()
        if not throttle.admit():
            refused += 1
        elif success.random() < 0.4:
            throttle.accepted()
    return expected, refused


#: requests or accepts a thread run may miss: one counted by a thread that read the current
#: second just before another closed it (at most a few per roll; 0 in practice on CPython)
STRAGGLERS = 32


def thread_run(throttle: AdaptiveThrottle, clock: SharedClock, threads: int = 16) -> tuple[float, int, int]:
    """16 threads, 10,000 calls, each call moving the clock 10 ms (the run crosses 100
    seconds, so the current second is closed about 100 times while threads count):
    (summed probability, refusals, accepts recorded)."""
    results: list[tuple[float, int]] = [(0.0, 0)] * threads
    accepts = [0] * threads

    def work(i: int) -> None:
        success = random.Random(i)
        expected = 0.0
        refused = 0
        for _ in range(CALLS // threads):
            expected += throttle.probability()
            if not throttle.admit():
                refused += 1
            elif success.random() < 0.4:
                throttle.accepted()
                accepts[i] += 1
            clock.advance(0.01)
        results[i] = (expected, refused)

    run_threads(threads, work)
    return sum(e for e, _ in results), sum(r for _, r in results), sum(accepts)


def counted_right(throttle: AdaptiveThrottle, accepts: int) -> bool:
    requests, counted = throttle.counts()
    return 0 <= CALLS - requests <= STRAGGLERS and 0 <= accepts - counted <= STRAGGLERS


def threaded_throttle() -> tuple[AdaptiveThrottle, SharedClock]:
    clock = SharedClock(start=1000.5)
    return AdaptiveThrottle("payments", 2.0, 120, clock, rand=random.Random(11).random), clock


@pytest.mark.usefixtures("fast_switching")
def test_rs10_threads_refusal_rate_and_counts():
    """RS-10, threads: 16 threads, 10,000 calls over 100 s of a shared clock (window 120 s),
    seeded: the refusal rate matches the formula within 3 points, and every request and
    accept is counted (but for a straggler or two at a second's edge)."""
    throttle, clock = threaded_throttle()
    expected, refused, accepts = thread_run(throttle, clock)
    assert abs(refused - expected) / CALLS <= TOLERANCE
    assert counted_right(throttle, accepts), (throttle.counts(), CALLS, accepts)


@pytest.mark.usefixtures("fast_switching")
def test_rs10_meta_the_thread_test_catches_a_missing_lock(monkeypatch):
    """RS-10 meta-test: with a lock that protects nothing, two threads close the same second:
    the counts of one of the new seconds are lost, or a second leaves the totals twice."""
    for _ in range(20):
        with unlocked(throttle_module, monkeypatch):
            throttle, clock = threaded_throttle()
        try:
            _, _, accepts = thread_run(throttle, clock)
        except ZeroDivisionError:
            return  # the window's totals went below zero: caught as well
        if not counted_right(throttle, accepts):
            return
    pytest.fail("without the lock every count was right: the thread test would not notice a missing lock")


def test_rs10_asyncio_tasks_refusal_rate():
    """RS-10, asyncio: 200 tasks of 50 calls, switching at every step, seeded."""
    throttle, _ = make(k=2.0, window=60, seed=5)
    success = random.Random(99)
    totals = [0.0, 0]

    async def task() -> None:
        for _ in range(CALLS // 200):
            totals[0] += throttle.probability()
            await asyncio.sleep(0)
            if not throttle.admit():
                totals[1] += 1
            elif success.random() < 0.4:
                throttle.accepted()
            await asyncio.sleep(0)

    async def main() -> None:
        await asyncio.gather(*(task() for _ in range(200)))

    asyncio.run(main())
    assert abs(totals[1] - totals[0]) / CALLS <= TOLERANCE
    assert throttle.counts()[0] == CALLS


def _process_worker(seed: int, barrier, results) -> None:  # pragma: no cover - runs in a child
    throttle = AdaptiveThrottle("payments", 2.0, 60, FakeClock(), rand=random.Random(seed).random)
    barrier.wait(60)
    results.put(probability_run(throttle, CALLS // 4, random.Random(seed + 100)))


@pytest.mark.multiprocess
def test_rs10_processes_refusal_rate():
    """RS-10, processes: 4 workers, 2,500 calls each (10,000 in all), each with its own seeded
    throttle: the fleet's refusals match the summed probabilities within 3 points."""
    ctx = multiprocessing.get_context("fork")
    barrier = ctx.Barrier(4)
    results = ctx.Queue()
    workers = [ctx.Process(target=_process_worker, args=(seed, barrier, results)) for seed in range(4)]
    for worker in workers:
        worker.start()
    answers = [results.get(timeout=60) for _ in workers]
    for worker in workers:
        worker.join(60)
        assert worker.exitcode == 0
    expected = sum(e for e, _ in answers)
    refused = sum(r for _, r in answers)
    assert abs(refused - expected) / CALLS <= TOLERANCE
    assert refused > 0.3 * CALLS  # the run did throttle (K * 0.4 < 1: the probability climbs)

"""RS-10 (with RS-4, RS-6, RS-9): the stage lanes under 16 threads switching every
microsecond, released together, with a meta-test for each that breaks the lock-free step
the lane relies on and sees the race test fail.

The calls all succeed, so the breaker's window stays clean and the calls run on the lanes
(a refusal is no failure); each test also checks that they did.
"""

from __future__ import annotations

import itertools
import queue
import sys
import threading
import time

import pytest

import baldur_django as baldur
from baldur_django import BulkheadFullError, ThrottledError
from baldur_django.core.registry import registry
from baldur_django.core.stages import service as service_module
from baldur_django.core.stages import throttle as throttle_module
from baldur_django.core.stages.bulkhead import Bulkhead
from baldur_django.core.stages.deadline import ARMED
from baldur_django.core.stages.service import stages_of
from tests.stages.budget_helpers import run_threads
from tests.stages.race_tools import Meter, fast_switching

LIMIT = 3
THREADS = 16
CALLS = 300
QUIET = {"sliding_window_size": 5, "minimum_calls": 5, "failure_threshold": 10**6, "failure_rate_threshold": 0}


@pytest.fixture(autouse=True)
def no_deadline_ever_set():
    """A deadline set by an earlier test in this process takes every call off the lanes."""
    ARMED.clear()
    yield
    ARMED.clear()


def called_from_a_lane() -> bool:
    return sys._getframe(2).f_code.co_filename.endswith("lanes.py")


# ------------------------------------------------------------------ the bulkhead's lane
class RacyTakeBulkhead(Bulkhead):
    """A bulkhead whose lane looks for a free slot and takes it in two steps, with a thread
    switch between them (meta-test): a slot can be handed to two calls at once."""

    __slots__ = ()

    def lane_steps(self):  # type: ignore[no-untyped-def]
        take, put, waiters, grant = super().lane_steps()
        free = self.limit

        def racy_take() -> object:
            if self.in_flight() >= free:
                raise queue.Empty
            time.sleep(0)  # another thread may take the last slot now
            try:
                return take()
            except queue.Empty:
                return True  # admitted on what it saw

        def racy_put(token: bool) -> None:
            if self.in_flight() > 0:
                put(token)

        return racy_take, racy_put, waiters, grant


def bulkhead_run(meter: Meter, laned: list[int]) -> None:
    @baldur.protected("pay", **QUIET, max_concurrent_calls=LIMIT)
    def pay() -> str:
        meter.arrive()
        if called_from_a_lane():
            next(laned_count)
        time.sleep(0)  # give up the GIL while inside
        meter.depart()
        return "ok"

    laned_count = itertools.count()
    for _ in range(10):
        pay()  # a full, clean window: the calls below run on the lane

    def work(_: int) -> None:
        for _ in range(CALLS):
            if meter.troubled():
                return
            try:
                pay()
            except BulkheadFullError:
                meter.refusal()

    with fast_switching():
        run_threads(THREADS, work, timeout=120.0)
    laned.append(int(repr(laned_count)[6:-1]))


def test_rs10_rs9_sixteen_threads_on_the_bulkhead_lane_never_exceed_its_slots():
    """RS-10, RS-4, RS-9: 16 threads make 300 calls each through a bulkhead of 3 slots
    (no wait): never more than 3 inside, every slot back, and the calls ran on the lane."""
    meter, laned = Meter(), []
    bulkhead_run(meter, laned)
    assert meter.most <= LIMIT, f"{meter.most} calls were in flight at once; the limit is {LIMIT}"
    assert meter.calls + meter.refused == THREADS * CALLS + 10
    bulkhead = stages_of(baldur.get_breaker("pay")).bulkhead
    assert bulkhead.in_flight() == 0 and bulkhead.waiting() == 0
    assert laned[0] >= meter.calls // 2, f"only {laned[0]} of {meter.calls} calls ran on the lane"


def test_rs10_meta_a_lane_that_looks_then_takes_fails_the_bulkhead_lane_test(monkeypatch):
    """RS-10 (meta): with the lane's atomic take replaced by a look, a thread switch and a
    take (admitted on what it saw), the test above sees more than 3 calls inside."""
    monkeypatch.setattr(service_module, "Bulkhead", RacyTakeBulkhead)
    for _ in range(10):
        registry.clear()  # a fresh breaker and bulkhead each round
        meter = Meter()
        bulkhead_run(meter, [])
        if meter.most > LIMIT:
            return
    pytest.fail("a lane that looks, then takes, never let more than 3 calls in")


# ------------------------------------------------------------------ the throttle's lane
class RacyCount:
    """An ``itertools.count`` that reads, switches threads, then writes (meta-test)."""

    def __init__(self) -> None:
        self.n = 0

    def __next__(self) -> int:
        n = self.n
        time.sleep(0)
        self.n = n + 1
        return n

    def __repr__(self) -> str:
        return f"count({self.n})"


def throttle_run(clock) -> tuple[int, int, int, int]:
    """16 threads x 300 successful calls on the throttle's lane (the clock stands still:
    one second). Returns the throttle's (requests, accepts), the calls made on the lane and
    the calls it refused (ThrottledError)."""
    laned, refused = itertools.count(), itertools.count()

    @baldur.protected("api", **QUIET, adaptive_throttling_k=2.0)
    def api() -> str:
        if called_from_a_lane():
            next(laned)
        return "ok"

    for _ in range(10):
        api()

    def work(_: int) -> None:
        for _ in range(CALLS):
            try:
                api()
            except ThrottledError:
                next(refused)

    with fast_switching():
        run_threads(THREADS, work, timeout=120.0)
    requests, accepts = stages_of(baldur.get_breaker("api")).throttle.counts()
    return requests, accepts, int(repr(laned)[6:-1]), int(repr(refused)[6:-1])


def test_rs10_rs9_sixteen_threads_on_the_throttle_lane_lose_no_count(clock):
    """RS-10, RS-6, RS-9: every request and every accept made on the throttle's lane by 16
    threads at once is counted (nothing refused: all succeed), and the calls ran on the
    lane."""
    requests, accepts, laned, refused = throttle_run(clock)
    calls = THREADS * CALLS + 10
    assert refused == 0
    assert (requests, accepts) == (calls, calls)
    assert laned >= calls - 10


def test_rs10_meta_counters_that_read_then_write_fail_the_throttle_lane_test(clock, monkeypatch):
    """RS-10 (meta): with the throttle's counters made of a read, a thread switch and a
    write, the test above loses counts (and the lost accepts may get calls refused)."""

    class RacyItertools:
        count = RacyCount

    monkeypatch.setattr(throttle_module, "itertools", RacyItertools)
    requests, accepts, _, refused = throttle_run(clock)
    calls = THREADS * CALLS + 10
    assert (requests, accepts, refused) != (calls, calls, 0), "racy counters lost nothing"


def test_rs10_the_throttle_lane_refuses_under_threads_without_errors(clock, monkeypatch):
    """RS-10, RS-6: with a seeded random source and old failures in the window, 16 threads
    on the lane get only successes or ThrottledError, and the refusals are counted."""
    import random

    monkeypatch.setattr(throttle_module, "default_rand", random.Random(5).random)
    failing = threading.Event()
    failing.set()

    @baldur.protected("api", **QUIET, adaptive_throttling_k=1.5)
    def api() -> str:
        if failing.is_set():
            raise ConnectionError("down")
        return "ok"

    for i in range(30):
        try:
            if i % 3 == 0:
                failing.clear()
            api()
        except (ConnectionError, ThrottledError):
            pass
        finally:
            failing.set()
    failing.clear()
    outcomes: list[str] = []
    lock = threading.Lock()

    def work(_: int) -> None:
        for _ in range(CALLS):
            try:
                result = api()
            except ThrottledError:
                result = "refused"
            with lock:
                outcomes.append(result)

    with fast_switching():
        run_threads(THREADS, work, timeout=120.0)
    throttle = stages_of(baldur.get_breaker("api")).throttle
    assert set(outcomes) <= {"ok", "refused"}
    assert outcomes.count("refused") >= 1
    assert throttle.refused() >= outcomes.count("refused")

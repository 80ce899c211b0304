"""Concurrency of one breaker under real threads and real asyncio tasks: CB-8, CB-9.

Every threaded test forces very frequent thread switches (``sys.setswitchinterval(1e-6)``,
restored afterwards) and releases its threads together from a ``threading.Barrier``.

How we know these tests would catch a missing lock: each scenario is a plain function
returning a list of violations, and takes a breaker built by :func:`make_breaker`, which
can swap in :class:`NoLock` (a lock that does nothing) and :class:`YieldingWindow` (a
window whose counters are Python properties, so a thread switch can land between the
read and the write of ``calls += 1``, as it can on a free-threaded interpreter; on
CPython 3.11 with the GIL such a straight-line increment contains no switch point, so a
missing lock almost never loses one there). The meta-tests at the end run the same
scenarios with ``NoLock`` and require them to misbehave at least once, while the normal
tests require zero violations with the real lock, with either window.
``tests/core/race_demo.py`` (not collected) prints how often each scenario catches it.

The breaker's ``record_success`` has a lock-free path while the window is full of
successes (``_healthy_permit``); the full-window tests exercise it (about half of their
successes take it), the filling-window tests exercise the locked path.

Also here: stale outcomes (CB-8) through the facade, asyncio tasks racing into
HALF_OPEN, and the order in which concurrent transitions reach listeners (CB-14).
"""

from __future__ import annotations

import asyncio
import contextvars
import random
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

import baldur_django as baldur
from baldur_django.core.breaker import CircuitBreaker, Permit, core_of
from baldur_django.core.config import SettingsSource, build_config
from baldur_django.core.errors import CircuitOpenError
from baldur_django.core.events import EventBus
from baldur_django.core.events import bus as process_bus
from baldur_django.core.testing import FakeClock, RecordingListener
from baldur_django.core.window import CountWindow

NEVER = 10**9  # a failure threshold no test reaches


# --------------------------------------------------------------------------- fixtures
@pytest.fixture(autouse=True)
def fast_switching():
    """Switch threads as often as the interpreter allows; restore the interval after."""
    previous = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        yield
    finally:
        sys.setswitchinterval(previous)


class NoLock:
    """Stands in for ``threading.Lock`` and protects nothing (meta-tests only)."""

    def acquire(self, *args: Any, **kwargs: Any) -> bool:
        return True

    def release(self) -> None:
        pass

    def __enter__(self) -> NoLock:
        return self

    def __exit__(self, *exc: Any) -> bool:
        return False


class YieldingWindow(CountWindow):
    """A CountWindow whose ``calls``/``failures`` go through Python getters and setters.

    Each access is a Python call, hence a point where the interpreter may switch
    threads: ``calls += 1`` becomes read, (switch), write. Under the breaker's lock this
    changes nothing; without it, increments get lost.
    """

    __slots__ = ("_calls", "_failures")

    def _get_calls(self) -> int:
        return self._calls

    def _set_calls(self, value: int) -> None:
        self._calls = value

    def _get_failures(self) -> int:
        return self._failures

    def _set_failures(self, value: int) -> None:
        self._failures = value

    calls = property(_get_calls, _set_calls)
    failures = property(_get_failures, _set_failures)


WINDOWS = {"plain": CountWindow, "yielding": YieldingWindow}


class Rig:
    """A breaker on a fake clock and a private bus, plus what it published."""

    def __init__(self, breaker: CircuitBreaker, clock: FakeClock, listener: RecordingListener) -> None:
        self.breaker = breaker
        self.clock = clock
        self.listener = listener

    def transitions(self, since: int = 0) -> list[tuple[str, str, str]]:
        return self.listener.transitions()[since:]

    def counts(self) -> tuple[int, int, int]:
        snap = self.breaker.snapshot()
        return snap["consecutive_failures"], snap["window_calls"], snap["window_failures"]


def make_breaker(*, unprotected: bool = False, window: str = "plain", **overrides: Any) -> Rig:
    """A breaker built directly (no registry). *unprotected* swaps in :class:`NoLock`."""
    config = build_config("race", overrides, SettingsSource(environ={}))
    clock = FakeClock()
    bus = EventBus()
    listener = RecordingListener(bus)
    breaker = CircuitBreaker("race", config, clock=clock, bus=bus)
    core_of(breaker).window = WINDOWS[window](config.sliding_window_size)
    if unprotected:
        core_of(breaker).lock = NoLock()
    return Rig(breaker, clock, listener)


def run_threads(count: int, target: Callable[[int], None], timeout: float = 30.0) -> None:
    """Start *count* threads running ``target(i)``, released together by a barrier.

    Re-raises the first error a thread hit; fails if a thread is still running after
    *timeout* seconds.
    """
    barrier = threading.Barrier(count)
    errors: list[BaseException] = []

    def body(i: int) -> None:
        try:
            barrier.wait(timeout)
            target(i)
        except BaseException as exc:  # noqa: BLE001 - reported to the test
            errors.append(exc)

    threads = [threading.Thread(target=body, args=(i,), name=f"race-{i}", daemon=True) for i in range(count)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + timeout
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    assert not any(t.is_alive() for t in threads), "a thread is stuck"
    if errors:
        raise errors[0]


def cascade_calls(breaker: CircuitBreaker) -> int:
    """Calls counted in the 429-cascade window: the one counter the lock-free healthy path
    touches, so the only place a lost healthy success could show."""
    return core_of(breaker).cascade.totals(core_of(breaker).clock.monotonic())[0]


# ------------------------------------------------------------------------- scenarios
# Each returns a list of human-readable violations; [] means the breaker behaved.


def scenario_filling_window(rig: Rig, threads: int = 16, per_thread: int = 400) -> list[str]:
    """CB-9, locked path: the window never fills, every 4th outcome fails, no trigger can
    fire; every outcome must be counted exactly once."""
    b = rig.breaker

    def work(i: int) -> None:
        for j in range(per_thread):
            permit = b.acquire()
            if j % 4 == 0:
                b.record_failure(permit)
            else:
                b.record_success(permit)

    run_threads(threads, work)
    total = threads * per_thread
    _, calls, failures = rig.counts()
    problems = []
    if (calls, failures) != (total, total // 4):
        problems.append(f"window holds {calls} calls / {failures} failures, expected {total} / {total // 4}")
    if cascade_calls(b) != total:
        problems.append(f"cascade counted {cascade_calls(b)} calls, expected {total}")
    if b.state is not baldur.CircuitState.CLOSED or rig.transitions():
        problems.append(f"breaker moved: {rig.transitions()}")
    return problems


def scenario_consecutive_count(rig: Rig, threads: int = 16, per_thread: int = 300) -> list[str]:
    """CB-2 + CB-9: only failures, threshold out of reach: the consecutive count and the
    window must both equal the number of failures recorded."""
    b = rig.breaker

    def work(i: int) -> None:
        for _ in range(per_thread):
            b.record_failure(b.acquire())

    run_threads(threads, work)
    total = threads * per_thread
    counts = rig.counts()
    return (
        [] if counts == (total, total, total) else [f"(consecutive, calls, failures) = {counts}, expected {total} each"]
    )


def scenario_full_window(
    rig: Rig, threads: int = 16, per_thread: int = 1500, failing: int = 8, every: int = 16
) -> list[str]:
    """CB-9 on a full window: successes take the lock-free healthy path while *failing*
    threads inject a failure every *every* calls (each failure switches the healthy path
    off until the window is clean again, so the two paths keep alternating). No outcome
    may be lost: the cascade counts every one, and the window's failure count must still
    match its slots (checked by flushing the window sequentially afterwards)."""
    b = rig.breaker
    size = b.config.sliding_window_size
    before = cascade_calls(b)

    def work(i: int) -> None:
        for j in range(per_thread):
            permit = b.acquire()
            if i < failing and j % every == i:
                b.record_failure(permit)
            else:
                b.record_success(permit)

    run_threads(threads, work)
    total = threads * per_thread
    problems = []
    if cascade_calls(b) - before != total:
        problems.append(f"cascade counted {cascade_calls(b) - before} calls, expected {total}")
    consecutive, calls, failures = rig.counts()
    # each failing thread has a success of its own between two failures: a run of
    # consecutive failures holds at most one per failing thread
    if calls != size or not 0 <= failures <= size or consecutive > failing:
        problems.append(f"after the race: consecutive={consecutive} calls={calls} failures={failures}")
    # Flush sequentially: `size` successes must leave a clean, healthy window...
    for _ in range(size):
        b.record_success(b.acquire())
    if rig.counts() != (0, size, 0):
        problems.append(f"after {size} successes: (consecutive, calls, failures) = {rig.counts()}")
    if core_of(b).healthy_permit is not b.acquire():
        problems.append("a clean full window did not re-enable the healthy path")
    # ...and `size` failures a window full of failures.
    for _ in range(size):
        b.record_failure(b.acquire())
    if rig.counts() != (size, size, size):
        problems.append(f"after {size} failures: (consecutive, calls, failures) = {rig.counts()}")
    if rig.transitions():
        problems.append(f"breaker moved: {rig.transitions()}")
    return problems


def scenario_trip_once(
    rig: Rig, rounds: int = 300, threads: int = 16, threshold: int = 8, stop_at_first: bool = False
) -> list[str]:
    """CB-2, CB-8, CB-9: each round, *threads* callers all admitted while CLOSED fail at
    once. The breaker trips exactly once, at exactly *threshold* failures; the later
    failures are stale and dropped, so the counts the ``opened`` listener saw are final.

    The same threads run every round (a barrier action checks the round and resets the
    breaker), so hundreds of rounds cost well under a second.
    """
    b = rig.breaker
    problems: list[str] = []
    at_trip: list[tuple[int, int, int]] = []
    book = {"round": -1, "seen": 0, "permit": None, "stop": False}

    def on_event(event: Any) -> None:
        if event.kind == "state_changed" and event.to_state == "open":
            at_trip.append(rig.counts())

    def between_rounds() -> None:  # runs in one thread while the others wait
        r = book["round"]
        if r >= 0:
            opened = [t for t in rig.transitions(book["seen"]) if t[1] == "open"]
            counts = rig.counts()
            if len(opened) != 1:
                problems.append(f"round {r}: {len(opened)} open events")
            if counts != (threshold, threshold, threshold):
                problems.append(f"round {r}: (consecutive, calls, failures) = {counts}, expected {threshold} each")
            if at_trip and at_trip[0] != counts:
                problems.append(f"round {r}: counts moved after the trip: {at_trip[0]} -> {counts}")
            book["stop"] = bool(problems) and stop_at_first
        b.reset()
        at_trip.clear()
        book["seen"] = len(rig.listener.transitions())
        book["permit"] = b.acquire()  # one CLOSED permit, shared by every caller of the round
        book["round"] = r + 1

    core_of(rig.breaker).bus.subscribe(on_event)
    barrier = threading.Barrier(threads, action=between_rounds, timeout=30)

    def work(i: int) -> None:
        try:
            for _ in range(rounds):
                barrier.wait()
                if book["stop"]:
                    return
                b.record_failure(book["permit"])
            barrier.wait()
        except BaseException:
            barrier.abort()  # the other threads stop at once instead of waiting forever
            raise

    run_threads(threads, work)
    if not book["stop"] and book["round"] != rounds:
        problems.append(f"only {book['round']} of {rounds} rounds ran")
    return problems


def scenario_half_open_race(rig: Rig, rounds: int = 25, threads: int = 32) -> list[str]:
    """CB-5, CB-6, CB-9: *threads* callers race into a breaker whose recovery timeout has
    just expired (the lazy OPEN -> HALF_OPEN step is raced too). Each round: exactly one
    HALF_OPEN and one CLOSED event, exactly ``half_open_max_calls`` trial permits, every
    other attempt rejected with ``half_open_full`` until the round closes."""
    b = rig.breaker
    budget = b.config.half_open_max_calls
    problems: list[str] = []
    for r in range(rounds):
        # trip with a fresh CLOSED permit, then let the recovery timeout expire unread
        b.record_failure(b.acquire())
        assert core_of(b).state is baldur.CircuitState.OPEN
        rig.clock.advance(b.config.recovery_timeout)
        seen = len(rig.listener.transitions())
        trials: list[Permit] = []
        reasons: list[str] = []
        grant_lock = threading.Lock()  # protects the test's own lists, not the breaker

        def work(i: int) -> None:
            for _ in range(40):
                try:
                    permit = b.acquire()
                except CircuitOpenError as rejection:
                    with grant_lock:
                        reasons.append(rejection.reason)
                    continue
                if not permit.trial:
                    return  # the round is over: CLOSED admits freely
                with grant_lock:
                    trials.append(permit)
                b.record_success(permit)

        run_threads(threads, work)
        moved = [(f, t) for f, t, _ in rig.transitions(seen)]
        if moved != [("open", "half_open"), ("half_open", "closed")]:
            problems.append(f"round {r}: transitions {moved}")
        if len(trials) != budget:
            problems.append(f"round {r}: {len(trials)} trial permits granted, budget {budget}")
        if set(reasons) - {"half_open_full"}:
            problems.append(f"round {r}: rejection reasons {sorted(set(reasons))}")
        if b.state is not baldur.CircuitState.CLOSED:
            problems.append(f"round {r}: ended {b.state}")
    return problems


def scenario_half_open_giveback(rig: Rig, rounds: int = 15, threads: int = 32) -> list[str]:
    """CB-6, CB-9, CB-10: like the race above, but some trials end in an ignored
    exception and hand their slot back. At no moment are more than
    ``half_open_max_calls`` trials outstanding; the round closes after exactly that many
    successes, once."""
    b = rig.breaker
    budget = b.config.half_open_max_calls
    problems: list[str] = []
    for r in range(rounds):
        b.record_failure(b.acquire())
        rig.clock.advance(b.config.recovery_timeout)
        seen = len(rig.listener.transitions())
        book = threading.Lock()
        state = {"out": 0, "max": 0, "successes": 0, "ignored": 0}

        def work(i: int) -> None:
            rng = random.Random(r * 1000 + i)
            for _ in range(60):
                try:
                    permit = b.acquire()
                except CircuitOpenError:
                    continue
                if not permit.trial:
                    return
                with book:  # this trial is now outstanding...
                    state["out"] += 1
                    state["max"] = max(state["max"], state["out"])
                ignored = rng.random() < 0.5  # (other threads run here)
                with book:  # ...and stops being so just before the breaker hears of it
                    state["out"] -= 1
                    state["ignored" if ignored else "successes"] += 1
                if ignored:
                    b.record_ignored(permit)
                else:
                    b.record_success(permit)

        run_threads(threads, work)
        moved = [(f, t) for f, t, _ in rig.transitions(seen)]
        if moved != [("open", "half_open"), ("half_open", "closed")]:
            problems.append(f"round {r}: transitions {moved}")
        if state["max"] > budget:
            problems.append(f"round {r}: {state['max']} trials outstanding at once, budget {budget}")
        if state["successes"] != budget:
            problems.append(f"round {r}: {state['successes']} trial successes recorded, expected {budget}")
    return problems


# ------------------------------------------------------------------------ the tests
@pytest.mark.parametrize("window", sorted(WINDOWS))
def test_cb9_no_lost_updates_while_window_fills(window):
    """CB-9: 16 threads x 400 outcomes into a window that never fills: exact counts."""
    assert (
        scenario_filling_window(
            make_breaker(
                window=window,
                failure_threshold=NEVER,
                failure_rate_threshold=0,
                sliding_window_size=100_000,
                minimum_calls=1,
            )
        )
        == []
    )


@pytest.mark.parametrize("window", sorted(WINDOWS))
def test_cb2_cb9_consecutive_failures_not_lost(window):
    """CB-2, CB-9: 16 threads x 300 failures: consecutive count and window exact."""
    assert (
        scenario_consecutive_count(
            make_breaker(
                window=window,
                failure_threshold=NEVER,
                failure_rate_threshold=0,
                sliding_window_size=100_000,
                minimum_calls=1,
            )
        )
        == []
    )


@pytest.mark.parametrize("window", sorted(WINDOWS))
def test_cb9_full_window_healthy_path_loses_nothing(window):
    """CB-9: lock-free healthy successes racing locked failures on a full window."""
    rig = make_breaker(
        window=window, failure_threshold=NEVER, failure_rate_threshold=0, sliding_window_size=16, minimum_calls=1
    )
    for _ in range(16):  # start full and healthy
        rig.breaker.record_success(rig.breaker.acquire())
    assert core_of(rig.breaker).healthy_permit is not None
    assert scenario_full_window(rig) == []


def test_cb9_window_fills_under_contention_then_goes_lock_free():
    """CB-9: the window fills while 16 threads race (locked path -> healthy path switch)."""
    rig = make_breaker(failure_threshold=NEVER, failure_rate_threshold=0, sliding_window_size=200, minimum_calls=1)
    b = rig.breaker
    run_threads(16, lambda i: [b.record_success(b.acquire()) for _ in range(500)])
    assert rig.counts() == (0, 200, 0)
    assert cascade_calls(b) == 16 * 500
    assert core_of(b).healthy_permit is b.acquire()


@pytest.mark.parametrize("window", sorted(WINDOWS))
def test_cb2_cb8_cb9_trips_exactly_once(window):
    """CB-2, CB-8, CB-9: 300 rounds of 16 concurrent failures, threshold 8: one open
    event per round, counts exactly 8."""
    rig = make_breaker(
        window=window, failure_threshold=8, failure_rate_threshold=0, sliding_window_size=100, minimum_calls=1
    )
    assert scenario_trip_once(rig) == []


@pytest.mark.parametrize("budget", [1, 3])
def test_cb6_cb9_half_open_budget_under_32_threads(budget):
    """CB-5, CB-6, CB-9: 32 threads race into HALF_OPEN: budget respected, one close."""
    rig = make_breaker(
        failure_threshold=1,
        failure_rate_threshold=0,
        half_open_max_calls=budget,
        recovery_timeout=5,
        sliding_window_size=10,
        minimum_calls=1,
    )
    assert scenario_half_open_race(rig) == []


def test_cb6_cb10_half_open_slots_given_back_under_threads():
    """CB-6, CB-9, CB-10: ignored trials return slots; never more than N outstanding."""
    rig = make_breaker(
        failure_threshold=1,
        failure_rate_threshold=0,
        half_open_max_calls=3,
        recovery_timeout=5,
        sliding_window_size=10,
        minimum_calls=1,
    )
    assert scenario_half_open_giveback(rig) == []


def test_cb6_half_open_trials_held_concurrently_exactly_budget():
    """CB-6, CB-9: 32 threads each try to hold a trial at the same time: exactly N hold
    one, the other 32-N are refused with half_open_full (retry_after None)."""
    rig = make_breaker(
        failure_threshold=1,
        failure_rate_threshold=0,
        half_open_max_calls=3,
        recovery_timeout=5,
        sliding_window_size=10,
        minimum_calls=1,
    )
    b = rig.breaker
    b.record_failure(b.acquire())
    rig.clock.advance(5)
    held: list[Permit] = []
    refused: list[CircuitOpenError] = []
    book = threading.Lock()

    def work(i: int) -> None:
        try:
            permit = b.acquire()
        except CircuitOpenError as rejection:
            with book:
                refused.append(rejection)
        else:
            with book:
                held.append(permit)

    run_threads(32, work)
    assert len(held) == 3 and all(p.trial for p in held)
    assert len(refused) == 29
    assert {(e.reason, e.retry_after) for e in refused} == {("half_open_full", None)}
    assert b.snapshot()["half_open_trials"] == 3
    run_threads(3, lambda i: b.record_success(held[i]))
    assert [t[:2] for t in rig.transitions()] == [("closed", "open"), ("open", "half_open"), ("half_open", "closed")]


def test_cb8_stale_trials_of_an_earlier_round_take_no_slot():
    """CB-8, CB-6, CB-10: trials of round 1 that are still running when one of them
    fails (the breaker reopens) finish during round 2, from 8 threads at once, while 8
    other threads take round 2's slots: the stale successes do not count towards
    closing, the stale ignored ones give no slot back, round 2 grants exactly its budget
    and closes once."""
    rig = make_breaker(
        failure_threshold=1,
        failure_rate_threshold=0,
        half_open_max_calls=3,
        recovery_timeout=5,
        sliding_window_size=10,
        minimum_calls=1,
    )
    b = rig.breaker
    b.record_failure(b.acquire())
    rig.clock.advance(5)
    round_one = [b.acquire() for _ in range(3)]
    b.record_failure(round_one.pop())  # a failed trial reopens: the other two are now stale
    rig.clock.advance(5)
    assert b.state is baldur.CircuitState.HALF_OPEN
    # make more stale trial permits so each outcome kind is raced several times
    stale = [round_one[i % 2] for i in range(8)]
    granted: list[Permit] = []
    book = threading.Lock()

    def work(i: int) -> None:
        if i < 8:  # a stale round-1 trial finishing now
            (b.record_success if i % 2 else b.record_ignored)(stale[i])
            return
        try:
            permit = b.acquire()
        except CircuitOpenError as rejection:
            assert rejection.reason == "half_open_full"
            return
        with book:
            granted.append(permit)

    run_threads(16, work)
    assert len(granted) == 3 and all(p.trial for p in granted)
    snap = b.snapshot()
    assert (snap["state"], snap["half_open_trials"], snap["half_open_successes"]) == ("half_open", 3, 0)
    with pytest.raises(CircuitOpenError):
        b.acquire()
    run_threads(3, lambda i: b.record_success(granted[i]))
    moved = [t[:2] for t in rig.transitions()]
    assert moved == [
        ("closed", "open"),
        ("open", "half_open"),
        ("half_open", "open"),
        ("open", "half_open"),
        ("half_open", "closed"),
    ]


class HookedClock(FakeClock):
    """A FakeClock that runs *hook* on every wall-clock read. The breaker reads the wall
    clock under its lock while it builds a ``state_changed`` event, so a hook that looks
    at the state learns the moment a transition has been decided."""

    def __init__(self) -> None:
        super().__init__()
        self.hook: Callable[[], None] | None = None

    def wall(self) -> float:
        if self.hook is not None:
            self.hook()
        return super().wall()


def _ordering_rig() -> tuple[CircuitBreaker, HookedClock, EventBus, threading.Event]:
    """An OPEN breaker whose recovery timeout has expired, plus an Event set as soon as
    another thread has *decided* (not yet published) the HALF_OPEN -> CLOSED step."""
    config = build_config(
        "order",
        {
            "failure_threshold": 1,
            "failure_rate_threshold": 0,
            "recovery_timeout": 5,
            "half_open_max_calls": 1,
            "sliding_window_size": 10,
            "minimum_calls": 1,
        },
        SettingsSource(environ={}),
    )
    clock = HookedClock()
    bus = EventBus()
    b = CircuitBreaker("order", config, clock=clock, bus=bus)
    b.record_failure(b.acquire())
    clock.advance(5)
    close_decided = threading.Event()

    def hook() -> None:
        if core_of(b).state is baldur.CircuitState.CLOSED:
            close_decided.set()

    clock.hook = hook
    return b, clock, bus, close_decided


def _race_reader_and_closer(b: CircuitBreaker, in_listener: threading.Event) -> None:
    """Thread R reads ``state`` (as the recovery sweep does: OPEN -> HALF_OPEN) and gets
    stuck in a listener; meanwhile thread C takes the trial and closes the breaker."""
    reader = threading.Thread(target=lambda: b.state, daemon=True)
    reader.start()
    assert in_listener.wait(10)

    def close() -> None:
        trial = b.acquire()  # HALF_OPEN was decided: this is the round's only trial
        assert trial.trial
        b.record_success(trial)

    closer = threading.Thread(target=close, daemon=True)
    closer.start()
    reader.join(10)
    closer.join(10)
    assert not reader.is_alive() and not closer.is_alive()
    assert b.state is baldur.CircuitState.CLOSED


def test_cb8_cb14_transitions_delivered_in_the_order_they_happened():
    """CB-8, CB-14: the recovery sweep (or any reader of ``state``) moves OPEN ->
    HALF_OPEN; while its event is still being delivered (a slow first listener, as a
    logging handler doing I/O can be), another thread takes the trial and closes the
    breaker. Listeners after the slow one must still see ``half_open`` before ``closed``,
    or one that mirrors the state ends on HALF_OPEN while the breaker is CLOSED.

    (Regression test: before the breaker queued events under its lock, the closing
    thread delivered ``closed`` at once, overtaking ``half_open``.)"""
    b, _clock, bus, close_decided = _ordering_rig()
    in_listener = threading.Event()

    def slow_listener(event: Any) -> None:
        if event.kind == "state_changed" and event.to_state == "half_open":
            in_listener.set()
            assert close_decided.wait(10)
            # Give a closing thread that does not wait its turn the time to overtake us.
            # Bounded; with ordered delivery it is waiting for us and nothing happens here.
            threading.Event().wait(0.2)

    bus.subscribe(slow_listener)
    mirror = RecordingListener(bus)
    _race_reader_and_closer(b, in_listener)
    assert [t[:2] for t in mirror.transitions()] == [("open", "half_open"), ("half_open", "closed")]


def test_cb14_listener_reading_the_breaker_does_not_reorder_events():
    """CB-14, CB-8: same race, but the first listener does what a dashboard or a signal
    handler plausibly does: it reads ``snapshot()`` while handling ``half_open``, after
    another thread has already decided (and queued) ``closed``. The listener after it
    must still receive ``half_open`` first.

    (Regression test: while ``_publish`` drained re-entrantly, the snapshot inside the
    listener delivered ``closed`` to every listener in the middle of ``half_open``.)"""
    b, _clock, bus, close_decided = _ordering_rig()
    in_listener = threading.Event()

    def dashboard(event: Any) -> None:
        if event.kind == "state_changed" and event.to_state == "half_open":
            in_listener.set()
            assert close_decided.wait(10)
            b.snapshot()  # waits for the closing thread's lock section: "closed" is queued now

    bus.subscribe(dashboard)
    mirror = RecordingListener(bus)
    _race_reader_and_closer(b, in_listener)
    assert [t[:2] for t in mirror.transitions()] == [("open", "half_open"), ("half_open", "closed")]


# ------------------------------------------------------- stale outcomes, via the facade
class Response:
    def __init__(self, status_code: int) -> None:
        self.status_code = status_code


class Boom(Exception):
    pass


class Ignored(Exception):
    pass


def _slow_calls(service: str, count: int, gate: threading.Event, inside: threading.Barrier):
    """A decorated function whose calls wait inside the body until *gate* opens, and
    per-call outcomes by i % 4: 0 returns a value, 1 raises a counted error, 2 returns
    a 503 response, 3 raises an ignored exception."""
    outcomes: dict[int, Any] = {}

    @baldur.circuit_breaker(
        service,
        failure_threshold=3,
        failure_rate_threshold=0,
        sliding_window_size=50,
        minimum_calls=1,
        recovery_timeout=10,
        half_open_max_calls=2,
        ignore_exceptions=(Ignored,),
    )
    def slow(i: int) -> Any:
        inside.wait()
        assert gate.wait(30)
        kind = i % 4
        if kind == 0:
            value = ("value", i)
            outcomes[i] = value
            return value
        if kind == 3:
            ignored = Ignored(i)
            outcomes[i] = ignored
            raise ignored
        if kind == 1:
            error = Boom(i)
            outcomes[i] = error
            raise error
        response = Response(503)
        outcomes[i] = response
        return response

    return slow, outcomes


def _start_slow(slow: Callable[[int], Any], count: int) -> tuple[list[threading.Thread], dict[int, Any]]:
    got: dict[int, Any] = {}

    def body(i: int) -> None:
        try:
            got[i] = slow(i)
        except BaseException as exc:  # noqa: BLE001 - checked by the test
            got[i] = exc

    threads = [threading.Thread(target=body, args=(i,), daemon=True) for i in range(count)]
    for thread in threads:
        thread.start()
    return threads, got


def _service_transitions(events, service: str) -> list[tuple[str, str]]:
    return [(e.from_state, e.to_state) for e in events.events if e.kind == "state_changed" and e.service == service]


def test_cb8_stale_outcomes_after_trip_are_dropped(clock, events):
    """CB-8, CB-9: 24 calls admitted while CLOSED finish together after the breaker
    tripped: none enters the window, none closes or reopens it, every caller still gets
    its own value, exception or response; the trip is published exactly once."""
    count = 24
    gate = threading.Event()
    inside = threading.Barrier(count + 1)
    slow, outcomes = _slow_calls("stale-open", count, gate, inside)
    b = slow.breaker
    threads, got = _start_slow(slow, count)
    inside.wait(30)  # every call is now running under a CLOSED permit
    for _ in range(3):
        b.record_failure(b.acquire())
    assert b.state is baldur.CircuitState.OPEN
    frozen = b.snapshot()
    gate.set()  # all 24 finish at once, racing each other
    for thread in threads:
        thread.join(30)
    assert not any(t.is_alive() for t in threads)
    for i in range(count):
        assert got[i] is outcomes[i], f"call {i} got {got[i]!r}"
    after = b.snapshot()
    for key in ("state", "consecutive_failures", "window_calls", "window_failures", "opened_at"):
        assert after[key] == frozen[key], key
    assert (after["consecutive_failures"], after["window_calls"], after["window_failures"]) == (3, 3, 3)
    assert _service_transitions(events, "stale-open") == [("closed", "open")]


def test_cb8_stale_outcomes_during_half_open_take_no_slot(clock, events):
    """CB-8, CB-6: calls admitted while CLOSED finish during the HALF_OPEN round: their
    successes do not close, their failures do not reopen, and no slot is used or
    returned by them; the real trials then close the breaker, once."""
    count = 24
    gate = threading.Event()
    inside = threading.Barrier(count + 1)
    slow, outcomes = _slow_calls("stale-half", count, gate, inside)
    b = slow.breaker
    threads, got = _start_slow(slow, count)
    inside.wait(30)
    for _ in range(3):
        b.record_failure(b.acquire())
    clock.advance(10)
    first_trial = b.acquire()
    assert first_trial.trial and b.state is baldur.CircuitState.HALF_OPEN
    gate.set()
    for thread in threads:
        thread.join(30)
    assert not any(t.is_alive() for t in threads)
    for i in range(count):
        assert got[i] is outcomes[i], f"call {i} got {got[i]!r}"
    snap = b.snapshot()
    assert (snap["state"], snap["half_open_trials"], snap["half_open_successes"]) == ("half_open", 1, 0)
    second_trial = b.acquire()
    with pytest.raises(CircuitOpenError) as refused:
        b.acquire()
    assert refused.value.reason == "half_open_full"
    b.record_success(first_trial)
    assert b.state is baldur.CircuitState.HALF_OPEN
    b.record_success(second_trial)
    assert b.state is baldur.CircuitState.CLOSED
    assert b.snapshot()["window_calls"] == 0
    assert _service_transitions(events, "stale-half") == [
        ("closed", "open"),
        ("open", "half_open"),
        ("half_open", "closed"),
    ]


def test_cb8_stale_outcomes_racing_the_trip(clock, events):
    """CB-8, CB-9: slow CLOSED calls finish *while* other threads drive the breaker to
    its trip. Whatever the interleaving: one open event, and nothing enters the window
    after it (the counts the ``opened`` listener saw are final)."""
    count = 24
    for attempt in range(10):
        service = f"stale-race-{attempt}"
        gate = threading.Event()
        inside = threading.Barrier(count + 1)
        slow, outcomes = _slow_calls(service, count, gate, inside)
        b = slow.breaker
        at_trip: list[tuple[int, int, int]] = []

        def on_open(event, b=b, service=service):
            if event.kind == "state_changed" and event.service == service and event.to_state == "open":
                s = b.snapshot()
                at_trip.append((s["consecutive_failures"], s["window_calls"], s["window_failures"]))

        process_bus.subscribe(on_open)
        threads, got = _start_slow(slow, count)
        inside.wait(30)
        failers = [b.acquire() for _ in range(8)]
        # the gate opens from inside the race: slow calls and failures interleave
        run_threads(8, lambda i: (gate.set() if i == 0 else None, b.record_failure(failers[i])))
        for thread in threads:
            thread.join(30)
        process_bus.unsubscribe(on_open)
        assert not any(t.is_alive() for t in threads)
        for i in range(count):
            assert got[i] is outcomes[i]
        assert _service_transitions(events, service) == [("closed", "open")], attempt
        snap = b.snapshot()
        assert at_trip == [(snap["consecutive_failures"], snap["window_calls"], snap["window_failures"])], attempt
        assert snap["consecutive_failures"] >= 3


# ------------------------------------------------------------------------- asyncio
def test_cb9_async_closed_calls_run_concurrently(clock):
    """CB-9: no lock is held across an awaited call: 40 decorated coroutines are all
    inside their bodies at the same moment."""
    inside = {"now": 0, "max": 0}

    @baldur.circuit_breaker("async-closed")
    async def call(i: int, gate: asyncio.Event) -> int:
        inside["now"] += 1
        inside["max"] = max(inside["max"], inside["now"])
        await gate.wait()
        await asyncio.sleep(0)
        inside["now"] -= 1
        return i

    async def main() -> list[int]:
        gate = asyncio.Event()
        tasks = [asyncio.create_task(call(i, gate)) for i in range(40)]
        while inside["now"] < 40:
            await asyncio.sleep(0)
        gate.set()
        return await asyncio.gather(*tasks)

    assert asyncio.run(main()) == list(range(40))
    assert inside["max"] == 40


IS_TRIAL: contextvars.ContextVar[bool] = contextvars.ContextVar("IS_TRIAL", default=False)


def _async_half_open_round(
    clock: FakeClock, loops: int, tasks_per_loop: int, budget: int, hold: bool, seed: int
) -> tuple[str, dict[str, Any]]:
    """Trip an async-decorated breaker, expire its timeout, and race ``loops`` event
    loops (one per thread) of ``tasks_per_loop`` tasks each into HALF_OPEN.

    To tell trial bodies from CLOSED ones, the breaker's slow admission path is wrapped
    (before decoration, which binds it) to flag the task's context when it hands out a
    trial permit; the body reads the flag. Returns the service name and a tally.
    """
    service = f"async-half-{loops}-{hold}-{budget}-{seed}"
    book = threading.Lock()
    tally: dict[str, Any] = {
        "granted": 0,
        "trial_bodies": 0,
        "trials_inside": 0,
        "max_trials_inside": 0,
        "reasons": set(),
        "bodies": 0,
    }
    release = threading.Event()
    decorate = baldur.circuit_breaker(
        service,
        failure_threshold=1,
        failure_rate_threshold=0,
        recovery_timeout=5,
        half_open_max_calls=budget,
        sliding_window_size=10,
        minimum_calls=1,
    )
    b = baldur.get_breaker(service)
    admit = core_of(b).acquire_slow

    def spy() -> Permit:
        permit = admit()  # raises CircuitOpenError when refused
        IS_TRIAL.set(permit.trial)
        if permit.trial:
            with book:
                tally["granted"] += 1
        return permit

    core_of(b).acquire_slow = spy

    @decorate
    async def call(i: int) -> int:
        trial = IS_TRIAL.get()
        with book:
            tally["bodies"] += 1
            if trial:
                tally["trial_bodies"] += 1
                tally["trials_inside"] += 1
                tally["max_trials_inside"] = max(tally["max_trials_inside"], tally["trials_inside"])
        for _ in range(3):
            await asyncio.sleep(0)
        if hold and trial:
            while not release.is_set():
                await asyncio.sleep(0)
        if trial:
            with book:
                tally["trials_inside"] -= 1
        return i

    assert call.breaker is b
    b.record_failure(b.acquire())
    clock.advance(5)

    async def caller(i: int, rng: random.Random) -> None:
        for _ in range(rng.randrange(4)):
            await asyncio.sleep(0)
        for _ in range(2000):
            try:
                assert await call(i) == i
                return
            except CircuitOpenError as rejection:
                with book:
                    tally["reasons"].add(rejection.reason)
                    if tally["trials_inside"] >= budget:
                        release.set()  # every slot is held inside a body: let the trials finish
                await asyncio.sleep(0)
        raise AssertionError(f"caller {i} was never admitted")

    async def loop_main(k: int) -> None:
        rng = random.Random(seed * 100 + k)
        await asyncio.gather(*(caller(k * tasks_per_loop + i, rng) for i in range(tasks_per_loop)))

    run_threads(loops, lambda k: asyncio.run(loop_main(k)))
    tally["state"] = b.state.value
    return service, tally


@pytest.mark.parametrize("loops", [1, 4])
@pytest.mark.parametrize("hold", [False, True])
def test_cb6_cb9_async_half_open_budget(clock, events, loops, hold):
    """CB-6, CB-9: 64 coroutines (on 1 event loop, or 4 loops in 4 threads) race into
    HALF_OPEN through ``@circuit_breaker`` on an ``async def``: exactly
    ``half_open_max_calls`` trial bodies run, the rest are refused with half_open_full
    until the round closes, once; then every caller gets through. With *hold*, the
    trials wait inside their bodies until the others have been refused: all of them are
    inside at the same time (decorated coroutines run concurrently)."""
    for seed in range(5):
        service, tally = _async_half_open_round(clock, loops, 64 // loops, budget=3, hold=hold, seed=seed)
        assert tally["granted"] == 3, tally
        assert tally["trial_bodies"] == 3, tally
        assert tally["bodies"] == 64, tally
        assert tally["reasons"] == {"half_open_full"}, tally
        assert tally["state"] == "closed"
        assert _service_transitions(events, service) == [
            ("closed", "open"),
            ("open", "half_open"),
            ("half_open", "closed"),
        ]
        if hold:
            assert tally["max_trials_inside"] == 3, tally


# -------------------------------------------------------------------- meta-tests
# The same scenarios with the breaker's lock replaced by NoLock must go wrong at least
# once in a few attempts; this proves the tests above can fail.

META_ATTEMPTS = 20


def _misbehaves(build: Callable[[], Rig], scenario: Callable[[Rig], list[str]]) -> list[str]:
    """Run *scenario* on fresh unprotected breakers until it reports a problem (at most
    META_ATTEMPTS times); return the first problems found."""
    for _ in range(META_ATTEMPTS):
        problems = _crash_is_a_problem(scenario, build())
        if problems:
            return problems
    return []


def _crash_is_a_problem(scenario: Callable[..., list[str]], rig: Rig, **options: Any) -> list[str]:
    """An unprotected breaker may also corrupt itself badly enough to raise: that counts."""
    try:
        return scenario(rig, **options)
    except Exception as exc:  # noqa: BLE001
        return [f"crashed: {exc!r}"]


def test_meta_lost_updates_show_without_the_lock():
    """Meta (CB-9): without the lock (and with switch points inside ``calls += 1``), the
    filling-window scenario loses updates. Measured: 12-14 runs in 20."""
    problems = _misbehaves(
        lambda: make_breaker(
            unprotected=True,
            window="yielding",
            failure_threshold=NEVER,
            failure_rate_threshold=0,
            sliding_window_size=100_000,
            minimum_calls=1,
        ),
        scenario_filling_window,
    )
    assert problems, "the scenario did not notice a missing lock"


def test_meta_consecutive_count_loses_failures_without_the_lock():
    """Meta (CB-2, CB-9): without the lock, the consecutive/window counts lose failures.
    Measured: 12-19 runs in 20."""
    problems = _misbehaves(
        lambda: make_breaker(
            unprotected=True,
            window="yielding",
            failure_threshold=NEVER,
            failure_rate_threshold=0,
            sliding_window_size=100_000,
            minimum_calls=1,
        ),
        scenario_consecutive_count,
    )
    assert problems, "the scenario did not notice a missing lock"


def test_meta_full_window_drifts_without_the_lock():
    """Meta (CB-9): without the lock, the full-window scenario (about half the successes
    on the lock-free healthy path, half on the locked path) corrupts the window's
    failure count. Measured: 7-16 runs in 20."""

    def build() -> Rig:
        rig = make_breaker(
            unprotected=True,
            window="yielding",
            failure_threshold=NEVER,
            failure_rate_threshold=0,
            sliding_window_size=16,
            minimum_calls=1,
        )
        for _ in range(16):
            rig.breaker.record_success(rig.breaker.acquire())
        return rig

    assert _misbehaves(build, scenario_full_window), "the scenario did not notice a missing lock"


def test_meta_double_trip_shows_without_the_lock():
    """Meta (CB-2, CB-9): without the lock, concurrent failures sometimes trip twice (two
    ``opened`` events in one round). Measured: about 1 round in 100 to 300, so this runs up to
    3000 rounds and stops at the first double trip."""
    rig = make_breaker(
        unprotected=True, failure_threshold=8, failure_rate_threshold=0, sliding_window_size=100, minimum_calls=1
    )
    problems = _crash_is_a_problem(scenario_trip_once, rig, rounds=3000, stop_at_first=True)
    assert problems, "the scenario did not notice a missing lock"


def test_meta_half_open_budget_breaks_without_the_lock():
    """Meta (CB-6, CB-9): without the lock, the half-open race grants too many trials or
    publishes a transition twice. Measured: 19-20 runs in 20."""
    problems = _misbehaves(
        lambda: make_breaker(
            unprotected=True,
            failure_threshold=1,
            failure_rate_threshold=0,
            half_open_max_calls=3,
            recovery_timeout=5,
            sliding_window_size=10,
            minimum_calls=1,
        ),
        scenario_half_open_race,
    )
    assert problems, "the scenario did not notice a missing lock"

"""CB-15 (time-based window) and CB-17 (slow-call trigger), driven by a FakeClock.

Durations are read on the breaker's injectable monotonic clock: a call "takes" as long as
the test advances the clock while it runs.
"""

from __future__ import annotations

import asyncio

import pytest

import baldur_django as baldur
from baldur_django.core.breaker import CircuitBreaker, core_of
from baldur_django.core.config import SettingsSource, build_config
from baldur_django.core.events import EventBus
from baldur_django.core.testing import FakeClock, RecordingListener

TIME = {
    "sliding_window_type": "time",
    "sliding_window_seconds": 10,
    "failure_rate_threshold": 50,
    "minimum_calls": 4,
    "failure_threshold": 100,
    "recovery_timeout": 5,
    "half_open_max_calls": 1,
}
SLOW = {
    "slow_call_duration": 1.0,
    "slow_call_rate_threshold": 50,
    "minimum_calls": 2,
    "failure_threshold": 100,
    "failure_rate_threshold": 0,
    "recovery_timeout": 5,
    "half_open_max_calls": 1,
    "sliding_window_size": 10,
}


def make(overrides, clock=None):
    clock = clock or FakeClock()
    bus = EventBus()
    events = RecordingListener(bus)
    breaker = CircuitBreaker("w", build_config("w", overrides, SettingsSource(environ={})), clock=clock, bus=bus)
    return breaker, clock, events


def outcome(breaker, ok=True, takes=0.0, clock=None):
    permit = breaker.acquire()
    if takes:
        clock.advance(takes)
    if ok:
        breaker.record_success(permit)
    else:
        breaker.record_failure(permit)


def test_cb15_rate_over_the_last_seconds_trips_at_the_threshold():
    """CB-15: 3 successes then failures within 10 s: 25 %, 40 %, then 50 % opens (failure_rate)."""
    b, clock, events = make(TIME)
    for _ in range(3):
        outcome(b)
    clock.advance(5)
    outcome(b, ok=False)
    outcome(b, ok=False)
    assert b.snapshot()["state"] == "closed" and b.snapshot()["window_calls"] == 5
    outcome(b, ok=False)
    assert events.transitions() == [("closed", "open", "failure_rate")]


def test_cb15_old_seconds_age_out_and_minimum_calls_counts_only_the_window():
    """CB-15: successes 11 s old have left the window; two failures are below minimum_calls
    (4) counted over the window, so nothing opens; two more do (100 %)."""
    b, clock, events = make(TIME)
    for _ in range(20):
        outcome(b)
    clock.advance(11)
    outcome(b, ok=False)
    outcome(b, ok=False)
    snap = b.snapshot()
    assert (snap["state"], snap["window_calls"], snap["window_failures"]) == ("closed", 2, 2)
    outcome(b, ok=False)
    outcome(b, ok=False)
    assert events.transitions() == [("closed", "open", "failure_rate")]


def test_cb15_quiet_spell_empties_the_window_and_outcome_belongs_to_its_completion_second():
    """CB-15: an outcome is counted in the second the call completed (a call admitted 12 s
    ago that fails now is in the window); a quiet spell longer than the window empties it."""
    b, clock, _ = make(TIME)
    outcome(b, ok=False)
    clock.advance(30)
    assert b.snapshot()["window_calls"] == 0
    permit = b.acquire()
    clock.advance(12)
    b.record_failure(permit)
    snap = b.snapshot()
    assert (snap["window_calls"], snap["window_failures"]) == (1, 1)


def test_cb15_time_window_per_call_override_and_setting(clock, monkeypatch):
    """CB-15: the window type is a per-call override and a global setting; the decorator's
    breaker counts by time."""

    @baldur.circuit_breaker(
        "timed-window",
        sliding_window_type="time",
        sliding_window_seconds=5,
        minimum_calls=2,
        failure_rate_threshold=50,
        failure_threshold=100,
    )
    def call(ok=True):
        if not ok:
            raise RuntimeError("down")
        return "ok"

    assert call() == "ok"
    clock.advance(6)  # the success has aged out
    with pytest.raises(RuntimeError):
        call(ok=False)
    assert baldur.get_breaker("timed-window").state is baldur.CircuitState.CLOSED  # 1 call < minimum
    with pytest.raises(RuntimeError):
        call(ok=False)
    assert baldur.get_breaker("timed-window").state is baldur.CircuitState.OPEN
    snap = baldur.get_breaker("timed-window").snapshot()
    assert snap["config"]["sliding_window_type"] == "time" and snap["config"]["sliding_window_seconds"] == 5


def test_cb17_slow_successes_open_with_slow_call_rate_and_results_pass_unchanged():
    """CB-17: two successes of 2 s (threshold 1 s, 50 %, minimum 2) open the breaker with
    trigger slow_call_rate; each result still reached its caller."""
    clock = FakeClock()
    b, _, events = make(SLOW, clock)
    outcome(b, takes=0.5, clock=clock)  # fast
    outcome(b, takes=2.0, clock=clock)  # slow: 1 of 2 = 50 %
    assert events.transitions() == [("closed", "open", "slow_call_rate")]
    assert b.snapshot()["window_slow_calls"] == 1


def test_cb17_failure_rate_wins_when_both_cross_on_one_outcome():
    """CB-17: a slow failure crossing both rates opens with trigger failure_rate."""
    overrides = dict(SLOW, failure_rate_threshold=50)
    clock = FakeClock()
    b, _, events = make(overrides, clock)
    outcome(b, takes=0.1, clock=clock)
    outcome(b, ok=False, takes=2.0, clock=clock)
    assert events.transitions() == [("closed", "open", "failure_rate")]


def test_cb17_slow_trial_is_a_failed_trial():
    """CB-17, CB-6: a trial that succeeds slowly reopens with trigger slow_call_rate."""
    clock = FakeClock()
    b, _, events = make(dict(SLOW, failure_threshold=1), clock)
    outcome(b, ok=False)
    clock.advance(5)
    trial = b.acquire()
    assert trial.trial
    clock.advance(1.5)
    b.record_success(trial)
    assert events.transitions()[-1] == ("half_open", "open", "slow_call_rate")


def test_cb17_ignored_exceptions_are_never_slow():
    """CB-17, CB-10: a slow call ending in an ignored exception counts for nothing."""
    clock = FakeClock()
    b, _, _events = make(SLOW, clock)
    for _ in range(3):
        permit = b.acquire()
        clock.advance(5)
        b.record_ignored(permit)
    snap = b.snapshot()
    assert (snap["window_calls"], snap["window_slow_calls"], snap["state"]) == (0, 0, "closed")


def test_cb17_decorated_sync_and_async_calls_are_timed(clock):
    """CB-17: through the decorators, a call's own duration on the injected clock decides."""

    @baldur.protected(
        "slow-sync", slow_call_duration=1, slow_call_rate_threshold=100, minimum_calls=2, failure_rate_threshold=0
    )
    def slow_call():
        clock.advance(1.5)
        return {"value": 1}

    @baldur.aprotected(
        "slow-async", slow_call_duration=1, slow_call_rate_threshold=100, minimum_calls=2, failure_rate_threshold=0
    )
    async def aslow_call():
        clock.advance(1.5)
        return "v"

    assert slow_call() == {"value": 1}
    assert baldur.get_breaker("slow-sync").state is baldur.CircuitState.CLOSED
    assert slow_call() == {"value": 1}
    assert baldur.get_breaker("slow-sync").snapshot()["last_trigger"] == "slow_call_rate"

    async def twice():
        return [await aslow_call(), await aslow_call()]

    assert asyncio.run(twice()) == ["v", "v"]
    assert baldur.get_breaker("slow-async").state is baldur.CircuitState.OPEN


class CountingClock(FakeClock):
    def __init__(self):
        super().__init__()
        self.reads = 0

    def monotonic(self):
        self.reads += 1
        return super().monotonic()


def test_cb17_trigger_off_adds_no_clock_read_to_the_closed_hot_path(fresh_registry):
    """CB-17: with the slow-call trigger off (the default) a healthy CLOSED call through the
    decorator reads no clock; with it on, each call reads it (admission and outcome)."""
    counting = CountingClock()
    fresh_registry.clock = counting

    @baldur.circuit_breaker("no-timing", sliding_window_size=10, minimum_calls=1)
    def fast():
        return 1

    for _ in range(20):
        fast()
    before = counting.reads
    for _ in range(10):
        fast()
    assert counting.reads - before <= 10  # at most the cascade's once-per-call bucket check

    @baldur.circuit_breaker("with-timing", sliding_window_size=10, minimum_calls=1, slow_call_duration=5)
    def timed():
        return 1

    before_timed = counting.reads
    timed()
    assert counting.reads - before_timed >= 2


def test_cb17_admission_stays_lock_free_after_a_failure():
    """CB-17: with the slow-call trigger on, a recorded failure in CLOSED leaves admission on
    the lock-free timed permit (only a state change replaces it)."""
    clock = FakeClock()
    b, _, _ = make(dict(SLOW, minimum_calls=10), clock)
    b.record_failure(b.acquire())
    assert core_of(b).timing_permit is not None
    with core_of(b).lock:  # admission must not need the lock: this would deadlock if it did
        permit = core_of(b).acquire_slow()
    assert permit.started is not None and not permit.trial


@pytest.mark.parametrize("off", [{"slow_call_rate_threshold": 0}, {"slow_call_duration": 0}])
def test_cb17_trigger_off_a_slow_trial_closes(off):
    """CB-17: with the slow-call rate threshold 0 or the duration 0 the trigger is off, so a
    slow trial in HALF_OPEN is a plain success: it closes the breaker (trigger half_open_success)."""
    clock = FakeClock()
    b, _, events = make(dict(SLOW, failure_threshold=1, **off), clock)
    outcome(b, ok=False)
    clock.advance(5)
    trial = b.acquire()
    assert trial.trial
    clock.advance(30)  # far past the slow-call duration
    b.record_success(trial)
    assert events.transitions()[-1] == ("half_open", "closed", "half_open_success")
    assert b.state is baldur.CircuitState.CLOSED


@pytest.mark.parametrize("off", [{"slow_call_rate_threshold": 0}, {"slow_call_duration": 0}])
def test_cb17_trigger_off_nothing_is_slow_in_closed(off):
    """CB-17: with the trigger off, slow CLOSED calls are never counted slow and never open."""
    clock = FakeClock()
    b, _, events = make(dict(SLOW, **off), clock)
    for _ in range(6):
        outcome(b, takes=30.0, clock=clock)
    snap = b.snapshot()
    assert (snap["state"], snap["window_slow_calls"], snap["window_calls"]) == ("closed", 0, 6)
    assert events.transitions() == []

"""Unit tests of the breaker state machine, driven by a FakeClock.

Covers CB-1..CB-8, CB-10..CB-14 (thread races, CB-9, live elsewhere), OP-1..OP-3 and
OP-5 core semantics, ST-1 (memory store) and the attributes of CircuitOpenError.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import pickle
import threading
from datetime import UTC, datetime
from http import HTTPStatus

import pytest

import baldur_django as baldur
from baldur_django import BaldurError, CircuitOpenError, CircuitState, ConfigError
from baldur_django.core.breaker import CircuitBreaker
from baldur_django.core.config import BreakerConfig, build_config, settings
from baldur_django.core.events import bus
from baldur_django.core.registry import registry
from baldur_django.core.testing import RecordingListener

CLOSED, OPEN, HALF_OPEN = CircuitState.CLOSED, CircuitState.OPEN, CircuitState.HALF_OPEN
LOGGER = "baldur.circuit_breaker"


def make(name: str = "svc", **overrides) -> CircuitBreaker:
    """A registered breaker with per-call overrides (create the `clock` fixture first)."""
    return registry.get(name, overrides)


def fail(breaker: CircuitBreaker, n: int = 1) -> None:
    for _ in range(n):
        breaker.record_failure(breaker.acquire())


def succeed(breaker: CircuitBreaker, n: int = 1) -> None:
    for _ in range(n):
        breaker.record_success(breaker.acquire())


def rejection(breaker: CircuitBreaker) -> CircuitOpenError:
    with pytest.raises(CircuitOpenError) as info:
        breaker.acquire()
    return info.value


class Response:
    """A returned object carrying an HTTP status the way requests/httpx/Django do."""

    def __init__(self, status_code):
        self.status_code = status_code


class AioResponse:
    """aiohttp-style: the status lives in ``.status``."""

    def __init__(self, status):
        self.status = status


def records(caplog, event: str | None = None):
    found = [r for r in caplog.records if r.name == LOGGER]
    if event is not None:
        found = [r for r in found if getattr(r, "event", None) == event]
    return found


# ---------------------------------------------------------------------------- CB-1


def test_cb1_state_values_are_the_documented_strings():
    """CB-1: three states whose values (and str()) are "closed", "open", "half_open"."""
    assert [s.value for s in CircuitState] == ["closed", "open", "half_open"]
    assert str(CLOSED) == "closed" and CLOSED == "closed"


def test_cb1_new_breaker_is_closed_and_admits_without_trial(clock):
    """CB-1: a new breaker is CLOSED; acquire() hands out a plain (non-trial) permit."""
    breaker = make()
    assert breaker.state is CLOSED
    permit = breaker.acquire()
    assert not permit.trial and not permit.dry_run
    breaker.record_success(permit)
    assert breaker.state is CLOSED


def test_cb1_snapshot_has_the_contract_keys(clock):
    """CB-1/section 0: a snapshot carries at least the documented keys with sane values."""
    snap = make("snap").snapshot()
    for key in (
        "service",
        "state",
        "consecutive_failures",
        "window_calls",
        "window_failures",
        "opened_at",
        "forced",
        "force_expires_at",
        "dry_run_rejections",
        "backend",
    ):
        assert key in snap, key
    assert snap["service"] == "snap"
    assert snap["state"] == "closed"
    assert (snap["consecutive_failures"], snap["window_calls"], snap["window_failures"]) == (0, 0, 0)
    assert snap["opened_at"] is None and snap["forced"] is None and snap["force_expires_at"] is None
    assert snap["dry_run_rejections"] == 0


def test_cb1_closed_passes_calls_through(clock):
    """CB-1: a CLOSED breaker invokes the callable with its arguments and returns its value."""
    seen = []

    @baldur.circuit_breaker("pass-through")
    def double(x, *, factor=2):
        seen.append((x, factor))
        return x * factor

    assert double(21) == 42
    assert double(5, factor=3) == 15
    assert seen == [(21, 2), (5, 3)]


# ---------------------------------------------------------------------------- CB-2


def test_cb2_consecutive_failures_open_the_breaker(clock, events):
    """CB-2: failure_threshold consecutive failures open it, trigger consecutive_failures."""
    breaker = make(failure_threshold=3)
    fail(breaker, 2)
    assert breaker.state is CLOSED
    fail(breaker)
    assert breaker.state is OPEN
    assert events.transitions() == [("closed", "open", "consecutive_failures")]
    snap = breaker.snapshot()
    assert snap["opened_at"] == clock.wall()
    assert snap["consecutive_failures"] == 3


def test_cb2_a_success_resets_the_consecutive_count(clock):
    """CB-2: a success between failures resets the count."""
    breaker = make(failure_threshold=3)
    fail(breaker, 2)
    succeed(breaker)
    assert breaker.snapshot()["consecutive_failures"] == 0
    fail(breaker, 2)
    assert breaker.state is CLOSED
    fail(breaker)
    assert breaker.state is OPEN


def test_cb2_applies_at_any_traffic_volume(clock):
    """CB-2: the consecutive trigger ignores minimum_calls (2 calls in all can trip it)."""
    breaker = make(failure_threshold=2, minimum_calls=50)
    fail(breaker, 2)
    assert breaker.state is OPEN
    assert breaker.snapshot()["window_calls"] == 2


# ---------------------------------------------------------------------------- CB-3


def rate_breaker(name="rate", **extra):
    cfg = dict(failure_threshold=1000, sliding_window_size=10, minimum_calls=10, failure_rate_threshold=50)
    cfg.update(extra)
    return make(name, **cfg)


def test_cb3_rate_trigger_waits_for_minimum_calls_then_opens(clock, events):
    """CB-3: below minimum_calls no rate trip, even at a high failure rate; at minimum_calls
    a rate >= threshold opens it (trigger failure_rate) - evaluated after a success too."""
    breaker = rate_breaker()
    for i in range(9):  # F S F S ... F : 5 failures of 9 (55 %) but only 9 outcomes
        (fail if i % 2 == 0 else succeed)(breaker)
    assert breaker.state is CLOSED
    assert breaker.snapshot()["window_failures"] == 5
    succeed(breaker)  # 10th outcome, 5/10 = 50 % >= 50 %
    assert breaker.state is OPEN
    assert events.transitions() == [("closed", "open", "failure_rate")]


def test_cb3_rate_below_threshold_stays_closed(clock):
    """CB-3: 4 failures in 10 (40 %) stay CLOSED at a 50 % threshold."""
    breaker = rate_breaker()
    fail(breaker, 4)
    succeed(breaker, 6)
    snap = breaker.snapshot()
    assert (snap["window_calls"], snap["window_failures"], snap["state"]) == (10, 4, "closed")


def test_cb3_window_slides_over_the_last_n_outcomes(clock):
    """CB-3: only the last sliding_window_size outcomes count; old failures fall out."""
    breaker = rate_breaker()
    fail(breaker, 4)
    succeed(breaker, 6)
    succeed(breaker, 4)  # pushes the four failures out
    snap = breaker.snapshot()
    assert (snap["window_calls"], snap["window_failures"]) == (10, 0)
    fail(breaker, 4)
    assert breaker.snapshot()["window_failures"] == 4
    assert breaker.state is CLOSED
    fail(breaker)  # 5 of the last 10
    assert breaker.state is OPEN


def test_cb3_zero_rate_threshold_disables_the_trigger(clock):
    """CB-3: failure_rate_threshold 0 disables the rate trigger (100 % failures stay CLOSED)."""
    breaker = rate_breaker("rate-off", failure_rate_threshold=0)
    fail(breaker, 30)
    assert breaker.state is CLOSED


def test_cb3_minimum_calls_gates_only_the_rate_trigger(clock):
    """CB-3: with a high minimum_calls the rate trigger waits, the consecutive one does not."""
    breaker = make("gate", failure_threshold=3, sliding_window_size=100, minimum_calls=100, failure_rate_threshold=1)
    fail(breaker, 2)
    succeed(breaker)
    fail(breaker, 2)
    assert breaker.state is CLOSED  # 4/5 failures, but the window is far from 100 calls
    fail(breaker)
    assert breaker.state is OPEN


def test_cb3_status_on_neither_list_is_a_success(clock):
    """CB-3/CB-11: a returned 404 (on neither list) is a recorded success."""

    @baldur.circuit_breaker("not-found", failure_threshold=2, sliding_window_size=4, minimum_calls=4)
    def lookup(status):
        return Response(status)

    lookup(503)
    lookup(404)
    lookup(503)
    lookup(404)
    snap = baldur.get_breaker("not-found").snapshot()
    assert (snap["window_calls"], snap["window_failures"], snap["consecutive_failures"]) == (4, 2, 0)
    assert snap["state"] == "open"  # 2/4 = 50 %: the rate trigger, not the consecutive one
    assert snap["last_trigger"] == "failure_rate"


# ---------------------------------------------------------------------------- CB-4


def test_cb4_open_rejects_at_once_without_invoking(clock, events):
    """CB-4: OPEN raises CircuitOpenError(reason="open") and never calls the function."""
    calls = []

    @baldur.circuit_breaker("reject", failure_threshold=1, recovery_timeout=30)
    def call(ok):
        calls.append(ok)
        if not ok:
            raise ConnectionError("down")
        return "ok"

    with pytest.raises(ConnectionError):
        call(False)
    with pytest.raises(CircuitOpenError) as info:
        call(True)
    assert calls == [False]
    err = info.value
    assert (err.service, err.reason) == ("reject", "open")
    assert err.retry_after == pytest.approx(30)
    assert isinstance(err, BaldurError)
    rejected = [e for e in events.events if e.kind == "call_rejected"]
    assert len(rejected) == 1 and rejected[0].reason == "open" and not rejected[0].dry_run


def test_cb4_retry_after_counts_down_to_the_probe(clock):
    """CB-4/section 0: retry_after is the seconds left until a probe is admitted."""
    breaker = make(failure_threshold=1, recovery_timeout=30)
    fail(breaker)
    clock.advance(12.5)
    assert rejection(breaker).retry_after == pytest.approx(17.5)


# ---------------------------------------------------------------------------- CB-5


def test_cb5_recovery_timeout_moves_open_to_half_open_lazily(clock, events):
    """CB-5: OPEN reads OPEN until recovery_timeout (a float) has passed, then HALF_OPEN; the
    step is published once on the bus with trigger recovery_timeout."""
    breaker = make(failure_threshold=1, recovery_timeout=2.5)
    fail(breaker)
    clock.advance(2.4)
    assert breaker.state is OPEN
    clock.advance(0.1)
    assert breaker.state is HALF_OPEN
    assert breaker.state is HALF_OPEN
    breaker.snapshot()
    assert events.transitions() == [
        ("closed", "open", "consecutive_failures"),
        ("open", "half_open", "recovery_timeout"),
    ]


def test_cb5_half_open_step_writes_no_log_line(clock, caplog):
    """CB-5/CB-13: the automatic step to HALF_OPEN is never logged, at any level."""
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    breaker = make(failure_threshold=1, recovery_timeout=1)
    fail(breaker)
    assert len(records(caplog, "circuit_breaker.opened")) == 1
    before = len(records(caplog))
    clock.advance(1)
    assert breaker.state is HALF_OPEN
    assert len(records(caplog)) == before
    assert not [r for r in caplog.records if "half_open" in r.getMessage().split(" ")[0]]


def test_cb5_reading_state_or_snapshot_never_takes_a_trial_slot(clock):
    """Section 0/CB-5: reading state and snapshots in HALF_OPEN consumes no trial slot."""
    breaker = make(failure_threshold=1, recovery_timeout=1, half_open_max_calls=2)
    fail(breaker)
    clock.advance(1)
    for _ in range(10):
        assert breaker.state is HALF_OPEN
        assert breaker.snapshot()["state"] == "half_open"
    assert breaker.acquire().trial and breaker.acquire().trial
    assert rejection(breaker).reason == "half_open_full"


def test_cb5_snapshot_reports_half_open_after_timeout(clock):
    """CB-5/section 0: a snapshot of an OPEN breaker past its timeout reads half_open."""
    breaker = make(failure_threshold=1, recovery_timeout=5)
    fail(breaker)
    clock.advance(5)
    assert breaker.snapshot()["state"] == "half_open"


# ---------------------------------------------------------------------------- CB-6


def half_open(name="probe", n=2, recovery_timeout=10.0, **extra) -> CircuitBreaker:
    breaker = make(name, failure_threshold=1, recovery_timeout=recovery_timeout, half_open_max_calls=n, **extra)
    fail(breaker)
    clock = registry.clock
    clock.advance(recovery_timeout)
    assert breaker.state is HALF_OPEN
    return breaker


def test_cb6_half_open_admits_at_most_n_trials(clock, events):
    """CB-6: N trial permits, then CircuitOpenError(reason="half_open_full", retry_after=None)."""
    breaker = half_open(n=2)
    permits = [breaker.acquire(), breaker.acquire()]
    assert all(p.trial for p in permits)
    err = rejection(breaker)
    assert (err.reason, err.retry_after) == ("half_open_full", None)
    assert [e.reason for e in events.events if e.kind == "call_rejected"] == ["half_open_full"]


def test_cb6_n_successful_trials_close_the_breaker(clock, events):
    """CB-6: the breaker closes once half_open_max_calls trials have succeeded, not before."""
    breaker = half_open(n=3)
    permits = [breaker.acquire() for _ in range(3)]
    breaker.record_success(permits[0])
    breaker.record_success(permits[1])
    assert breaker.state is HALF_OPEN
    assert breaker.snapshot()["half_open_successes"] == 2
    breaker.record_success(permits[2])
    assert breaker.state is CLOSED
    assert events.transitions()[-1] == ("half_open", "closed", "half_open_success")


def test_cb6_one_failed_trial_reopens_and_restarts_the_timer(clock, events):
    """CB-6: a single failed trial reopens (trigger half_open_failure) and restarts recovery_timeout."""
    breaker = half_open(n=3, recovery_timeout=10)
    first, second = breaker.acquire(), breaker.acquire()
    breaker.record_success(first)
    clock.advance(3)
    breaker.record_failure(second)
    assert breaker.state is OPEN
    assert events.transitions()[-1] == ("half_open", "open", "half_open_failure")
    assert rejection(breaker).retry_after == pytest.approx(10)
    clock.advance(9.9)
    assert breaker.state is OPEN
    clock.advance(0.1)
    assert breaker.state is HALF_OPEN
    # a fresh round: the full allowance again
    assert [breaker.acquire().trial for _ in range(3)] == [True, True, True]


def test_cb6_trial_outcomes_do_not_enter_the_window(clock):
    """CB-6: trial successes and failures leave the window untouched."""
    breaker = make("trial-window", failure_threshold=2, recovery_timeout=1, half_open_max_calls=2)
    succeed(breaker, 3)
    fail(breaker, 2)
    before = breaker.snapshot()
    assert (before["window_calls"], before["window_failures"]) == (5, 2)
    clock.advance(1)
    breaker.record_success(breaker.acquire())
    mid = breaker.snapshot()
    assert (mid["window_calls"], mid["window_failures"]) == (5, 2)
    breaker.record_failure(breaker.acquire())
    after = breaker.snapshot()
    assert after["state"] == "open"
    assert (after["window_calls"], after["window_failures"]) == (5, 2)


# ---------------------------------------------------------------------------- CB-7


def test_cb7_closing_clears_the_count_and_the_window(clock):
    """CB-7: after HALF_OPEN closes, consecutive count and window are empty; old failures are forgotten."""
    breaker = make("clear", failure_threshold=3, recovery_timeout=1, half_open_max_calls=1)
    succeed(breaker, 2)
    fail(breaker, 3)
    assert breaker.state is OPEN
    clock.advance(1)
    breaker.record_success(breaker.acquire())
    snap = breaker.snapshot()
    assert snap["state"] == "closed"
    assert (snap["consecutive_failures"], snap["window_calls"], snap["window_failures"]) == (0, 0, 0)
    assert snap["opened_at"] is None
    fail(breaker, 2)
    assert breaker.state is CLOSED  # the earlier three are gone


# ---------------------------------------------------------------------------- CB-8


def test_cb8_stale_success_after_a_trip_is_dropped(clock, events):
    """CB-8: a call admitted in CLOSED that succeeds after the trip neither closes the breaker
    nor restarts its timer; the transition is published exactly once."""
    breaker = make("stale", failure_threshold=2, recovery_timeout=20)
    slow = breaker.acquire()
    fail(breaker, 2)
    clock.advance(5)
    breaker.record_success(slow)
    assert breaker.state is OPEN
    assert rejection(breaker).retry_after == pytest.approx(15)
    assert events.transitions() == [("closed", "open", "consecutive_failures")]


def test_cb8_stale_failure_after_a_trip_does_not_restart_the_timer(clock, events):
    """CB-8: a stale failure arriving while OPEN changes nothing (no re-open, timer kept)."""
    breaker = make("stale-f", failure_threshold=2, recovery_timeout=20)
    slow = breaker.acquire()
    fail(breaker, 2)
    clock.advance(5)
    breaker.record_failure(slow)
    assert rejection(breaker).retry_after == pytest.approx(15)
    assert breaker.snapshot()["window_calls"] == 2
    assert len(events.transitions()) == 1


def test_cb8_stale_outcome_in_half_open_takes_no_slot_and_decides_nothing(clock, events):
    """CB-8: a CLOSED-era outcome arriving in HALF_OPEN neither reopens, closes nor uses a slot."""
    breaker = make("stale-h", failure_threshold=1, recovery_timeout=1, half_open_max_calls=1)
    slow_fail, slow_ok = breaker.acquire(), breaker.acquire()
    fail(breaker)
    clock.advance(1)
    assert breaker.state is HALF_OPEN
    breaker.record_failure(slow_fail)
    breaker.record_success(slow_ok)
    breaker.record_ignored(slow_ok)
    assert breaker.state is HALF_OPEN
    snap = breaker.snapshot()
    assert (snap["half_open_trials"], snap["half_open_successes"]) == (0, 0)
    trial = breaker.acquire()
    assert trial.trial
    assert rejection(breaker).reason == "half_open_full"
    assert events.transitions() == [
        ("closed", "open", "consecutive_failures"),
        ("open", "half_open", "recovery_timeout"),
    ]


def test_cb8_stale_outcome_after_reclose_never_enters_the_new_window(clock):
    """CB-8: an outcome admitted before trip+recovery+close does not enter the fresh window."""
    breaker = make("stale-c", failure_threshold=1, recovery_timeout=1, half_open_max_calls=1)
    slow = breaker.acquire()
    fail(breaker)
    clock.advance(1)
    breaker.record_success(breaker.acquire())
    assert breaker.state is CLOSED
    breaker.record_failure(slow)
    snap = breaker.snapshot()
    assert (snap["consecutive_failures"], snap["window_calls"], snap["window_failures"]) == (0, 0, 0)
    assert breaker.state is CLOSED


def test_cb8_stale_trial_of_an_earlier_round_is_dropped(clock):
    """CB-8: a trial of round 1 finishing in round 2 neither counts nor frees a round-2 slot."""
    breaker = half_open("stale-t", n=2, recovery_timeout=1)
    old_a, old_b = breaker.acquire(), breaker.acquire()
    breaker.record_failure(old_b)  # round 1 fails
    clock.advance(1)
    new = breaker.acquire()  # round 2, one slot taken
    breaker.record_success(old_a)
    breaker.record_ignored(old_a)
    snap = breaker.snapshot()
    assert (snap["state"], snap["half_open_trials"], snap["half_open_successes"]) == ("half_open", 1, 0)
    breaker.acquire()
    assert rejection(breaker).reason == "half_open_full"
    breaker.record_success(new)
    assert breaker.state is HALF_OPEN


@pytest.mark.parametrize("outcome", ["late value", TimeoutError("late error")], ids=["value", "exception"])
def test_cb8_stale_value_and_exception_still_reach_the_caller(clock, events, outcome):
    """CB-8: a slow call admitted in CLOSED that finishes after a trip still hands its value
    (or its exception) to its caller; the trip is published once and its timer is kept."""
    name = f"slow-{type(outcome).__name__}"

    @baldur.circuit_breaker(name, failure_threshold=2, recovery_timeout=60)
    def failing():
        raise ConnectionError("down")

    def trip():
        for _ in range(2):
            with contextlib.suppress(ConnectionError):
                failing()

    @baldur.circuit_breaker(name)
    def slow():
        # other callers trip the breaker meanwhile: from another thread, since a call made
        # inside this one through the same breaker would be part of it (CB-19)
        other = threading.Thread(target=trip)
        other.start()
        other.join()
        clock.advance(10)
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    if isinstance(outcome, BaseException):
        with pytest.raises(TimeoutError) as info:
            slow()
        assert info.value is outcome
    else:
        assert slow() == outcome
    breaker = baldur.get_breaker(name)
    assert breaker.state is OPEN
    assert rejection(breaker).retry_after == pytest.approx(50)
    assert breaker.snapshot()["window_calls"] == 2
    assert events.transitions() == [("closed", "open", "consecutive_failures")]


# --------------------------------------------------------------------------- CB-10


class BaseIgnored(Exception):
    pass


class SubIgnored(BaseIgnored):
    pass


def test_cb10_ignored_subclass_is_neither_success_nor_failure(clock):
    """CB-10: an exception whose type subclasses one in ignore_exceptions is re-raised unchanged
    and counts as neither success (count not reset) nor failure (no trip)."""
    error = SubIgnored("not the dependency's fault")

    @baldur.circuit_breaker("ignored", failure_threshold=2, ignore_exceptions=(BaseIgnored,))
    def call(mode):
        if mode == "fail":
            raise ConnectionError()
        if mode == "ignored":
            raise error
        return "ok"

    with pytest.raises(ConnectionError):
        call("fail")
    with pytest.raises(SubIgnored) as info:
        call("ignored")
    assert info.value is error
    snap = baldur.get_breaker("ignored").snapshot()
    assert (snap["consecutive_failures"], snap["window_calls"]) == (1, 1)
    for _ in range(5):
        with pytest.raises(SubIgnored):
            call("ignored")
    assert baldur.get_breaker("ignored").state is CLOSED
    with pytest.raises(ConnectionError):
        call("fail")
    assert baldur.get_breaker("ignored").state is OPEN  # the ignored ones did not reset the count


def test_cb10_single_type_ignore_is_accepted(clock):
    """CB-10: ignore_exceptions may be given as a single type."""

    @baldur.circuit_breaker("ignored-one", failure_threshold=1, ignore_exceptions=KeyError)
    def call():
        raise KeyError("k")

    with pytest.raises(KeyError):
        call()
    assert baldur.get_breaker("ignored-one").state is CLOSED


@pytest.mark.parametrize("exc_type", [KeyboardInterrupt, SystemExit, GeneratorExit])
def test_cb10_base_exceptions_are_never_failures(clock, exc_type):
    """CB-10: BaseExceptions that are not Exceptions propagate and never count as failures."""

    @baldur.circuit_breaker("base-exc", failure_threshold=1)
    def call():
        raise exc_type()

    for _ in range(3):
        with pytest.raises(exc_type):
            call()
    snap = baldur.get_breaker("base-exc").snapshot()
    assert (snap["state"], snap["consecutive_failures"], snap["window_calls"]) == ("closed", 0, 0)


def test_cb10_cancelled_error_is_never_a_failure(clock):
    """CB-10: asyncio.CancelledError in an async protected call is not a failure."""

    @baldur.circuit_breaker("cancel", failure_threshold=1)
    async def call():
        raise asyncio.CancelledError()

    for _ in range(3):
        with pytest.raises(asyncio.CancelledError):
            asyncio.run(call())
    assert baldur.get_breaker("cancel").snapshot()["consecutive_failures"] == 0
    assert baldur.get_breaker("cancel").state is CLOSED


@pytest.mark.parametrize("exc_type", [SubIgnored, KeyboardInterrupt, SystemExit])
def test_cb10_trial_ending_uncounted_gives_its_slot_back(clock, exc_type):
    """CB-10: a trial that ends in an ignored exception or a BaseException returns its slot."""
    calls = []

    @baldur.circuit_breaker(
        "slot-back", failure_threshold=1, recovery_timeout=1, half_open_max_calls=1, ignore_exceptions=(BaseIgnored,)
    )
    def call(mode):
        calls.append(mode)
        if mode == "fail":
            raise ConnectionError()
        if mode == "odd":
            raise exc_type()
        return "ok"

    with pytest.raises(ConnectionError):
        call("fail")
    clock.advance(1)
    with pytest.raises(exc_type):
        call("odd")
    breaker = baldur.get_breaker("slot-back")
    assert breaker.state is HALF_OPEN
    assert breaker.snapshot()["half_open_trials"] == 0
    assert call("ok") == "ok"  # admitted as the one trial, and it closes the breaker
    assert breaker.state is CLOSED
    assert calls == ["fail", "odd", "ok"]


def test_cb10_async_trial_cancelled_gives_its_slot_back(clock):
    """CB-10: an async trial cancelled mid-flight returns its slot."""

    @baldur.circuit_breaker("slot-back-async", failure_threshold=1, recovery_timeout=1, half_open_max_calls=1)
    async def call(mode):
        if mode == "fail":
            raise ConnectionError()
        if mode == "cancel":
            raise asyncio.CancelledError()
        return "ok"

    with pytest.raises(ConnectionError):
        asyncio.run(call("fail"))
    clock.advance(1)
    with pytest.raises(asyncio.CancelledError):
        asyncio.run(call("cancel"))
    assert asyncio.run(call("ok")) == "ok"
    assert baldur.get_breaker("slot-back-async").state is CLOSED


def test_cb10_record_ignored_on_a_closed_permit_records_nothing(clock):
    """CB-10: record_ignored on a CLOSED permit leaves counts and window as they were."""
    breaker = make("ignored-permit", failure_threshold=3)
    fail(breaker)
    breaker.record_ignored(breaker.acquire())
    snap = breaker.snapshot()
    assert (snap["consecutive_failures"], snap["window_calls"], snap["window_failures"]) == (1, 1, 1)


# --------------------------------------------------------------------------- CB-11


def test_cb11_returned_failure_status_counts_and_is_returned_unchanged(clock):
    """CB-11: a returned object whose status_code is on the failure list records a failure,
    comes back as the very same object, never raises and never calls the fallback."""
    fallback_calls = []
    answers = [Response(503), Response(HTTPStatus.BAD_GATEWAY)]

    @baldur.protected("returned", failure_threshold=2, fallback=lambda *a: fallback_calls.append(a))
    def call(i):
        return answers[i]

    assert call(0) is answers[0]
    assert baldur.get_breaker("returned").snapshot()["consecutive_failures"] == 1
    assert call(1) is answers[1]
    assert baldur.get_breaker("returned").state is OPEN
    assert fallback_calls == []


def test_cb11_status_attribute_is_read_too(clock):
    """CB-11: an object with an integer `status` (aiohttp style) is classified the same way."""

    @baldur.circuit_breaker("aio-status", failure_threshold=1)
    def call():
        return AioResponse(500)

    result = call()
    assert isinstance(result, AioResponse) and result.status == 500
    assert baldur.get_breaker("aio-status").state is OPEN


@pytest.mark.parametrize(
    "value",
    [
        Response(200),
        Response(404),
        Response("503"),
        Response(True),
        Response(None),
        AioResponse(302),
        {"status_code": 503},
        503,
        "503",
        None,
    ],
)
def test_cb11_other_returns_are_successes(clock, value):
    """CB-11: only an *integer* status on the list fails; strings, booleans, dicts, plain ints succeed."""

    @baldur.circuit_breaker("not-failure", failure_threshold=1)
    def call():
        return value

    assert call() is value
    breaker = baldur.get_breaker("not-failure")
    assert breaker.state is CLOSED
    assert breaker.snapshot()["window_failures"] == 0


def test_cb11_status_property_that_raises_is_not_an_error(clock):
    """CB-11: a returned object whose status property blows up is returned as-is, as a success."""

    class Weird:
        @property
        def status_code(self):
            raise RuntimeError("lazy response not read")

    weird = Weird()

    @baldur.circuit_breaker("weird", failure_threshold=1)
    def call():
        return weird

    assert call() is weird
    assert baldur.get_breaker("weird").state is CLOSED


def test_cb11_failure_list_comes_from_the_setting(clock, monkeypatch):
    """CB-11: BALDUR_MIDDLEWARE_CB_STATUS_CODES decides which statuses fail."""
    monkeypatch.setenv("BALDUR_MIDDLEWARE_CB_STATUS_CODES", "418")
    settings.reset()

    @baldur.circuit_breaker("teapot", failure_threshold=1)
    def call(code):
        return Response(code)

    call(503)
    assert baldur.get_breaker("teapot").state is CLOSED
    call(418)
    assert baldur.get_breaker("teapot").state is OPEN


def test_cb11_async_returned_failure_counts(clock):
    """CB-11: the same in an async protected call."""
    answer = Response(504)

    @baldur.protected("returned-async", failure_threshold=1)
    async def call():
        return answer

    assert asyncio.run(call()) is answer
    assert baldur.get_breaker("returned-async").state is OPEN


# --------------------------------------------------------------------------- CB-12


def test_cb12_same_name_shares_state(clock):
    """CB-12: two functions protected under one name share one breaker."""

    @baldur.circuit_breaker("shared", failure_threshold=2)
    def a():
        raise ConnectionError()

    @baldur.circuit_breaker("shared")
    def b():
        return "b"

    for _ in range(2):
        with pytest.raises(ConnectionError):
            a()
    with pytest.raises(CircuitOpenError):
        b()
    assert baldur.get_breaker("shared") is registry.get("shared")


def test_cb12_different_names_never_interfere(clock):
    """CB-12: tripping one breaker leaves a differently named one untouched."""
    one, two = make("one", failure_threshold=1), make("two", failure_threshold=1)
    fail(one)
    assert one.state is OPEN
    assert two.state is CLOSED
    assert two.snapshot()["window_calls"] == 0


ODD_NAMES = ["a b", "pay:ments", "x" * 1000, "{tag}", "x" * 300, "ünïcödé ☃", "a*b?[c]", "a/b?c=d", "{", "}:{"]


def test_cb12_odd_names_are_valid_and_independent(clock):
    """CB-12: inner spaces, colons, braces, glob characters, 300 and 1,000 characters, unicode:
    all valid, all separate breakers."""
    breakers = [make(name, failure_threshold=1) for name in ODD_NAMES]
    assert len({id(b) for b in breakers}) == len(ODD_NAMES)
    fail(breakers[3])
    for name, breaker in zip(ODD_NAMES, breakers, strict=True):
        assert breaker.snapshot()["service"] == name
        assert breaker.state is (OPEN if name == "{tag}" else CLOSED)
    assert set(ODD_NAMES) <= set(registry.names())


@pytest.mark.parametrize("name", ["", None, 42])
def test_cb12_empty_or_non_string_name_is_config_error(name):
    """CB-12: the empty string (or a non-string) is not a breaker name."""
    with pytest.raises(ConfigError):
        baldur.get_breaker(name)
    with pytest.raises(ConfigError):
        baldur.circuit_breaker(name)
    with pytest.raises(ConfigError):
        baldur.protected(name)
    with pytest.raises(ConfigError):
        baldur.protect(name, lambda: 1)
    with pytest.raises(ConfigError):
        baldur.force_open_circuit(name, ttl_minutes=1)
    with pytest.raises(ConfigError):
        CircuitBreaker(name, BreakerConfig())
    assert len(registry) == 0


def test_cb12_unhashable_name_is_config_error():
    """CB-12: a list as a name is a ConfigError like any other non-string."""
    with pytest.raises(ConfigError):
        baldur.get_breaker(["x"])


# --------------------------------------------------------------------------- CB-13


def check_record(record, event, service, from_state, to_state, trigger, level=logging.WARNING):
    assert record.getMessage().startswith(event)
    assert record.event == event
    assert record.service == service
    assert (record.from_state, record.to_state, record.trigger) == (from_state, to_state, trigger)
    assert record.levelno == level


def test_cb13_open_and_close_are_logged_with_attributes(clock, caplog):
    """CB-13: opened/closed lines start with the event name and carry service, from/to state and trigger."""
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    breaker = make("logged", failure_threshold=1, recovery_timeout=1, half_open_max_calls=1)
    fail(breaker)
    (opened,) = records(caplog, "circuit_breaker.opened")
    check_record(opened, "circuit_breaker.opened", "logged", "closed", "open", "consecutive_failures")
    clock.advance(1)
    breaker.record_success(breaker.acquire())
    (closed,) = records(caplog, "circuit_breaker.closed")
    check_record(closed, "circuit_breaker.closed", "logged", "half_open", "closed", "half_open_success")
    assert not records(caplog, "circuit_breaker.half_opened")


def test_cb13_reopen_after_failed_probe_is_logged(clock, caplog):
    """CB-13: a failed probe logs circuit_breaker.opened with trigger half_open_failure."""
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    breaker = half_open("reopen-log", n=1, recovery_timeout=1)
    breaker.record_failure(breaker.acquire())
    last = records(caplog, "circuit_breaker.opened")[-1]
    check_record(last, "circuit_breaker.opened", "reopen-log", "half_open", "open", "half_open_failure")


def test_cb13_forces_releases_and_lapses_are_logged(clock, caplog):
    """CB-13: forced_open, forced_closed, released and force_lapsed lines, with their attributes."""
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    baldur.force_open_circuit("ops", ttl_minutes=1, reason="maintenance", actor="alice")
    (rec,) = records(caplog, "circuit_breaker.forced_open")
    check_record(rec, "circuit_breaker.forced_open", "ops", "closed", "open", "forced")
    assert "maintenance" in rec.getMessage()
    # the expiry reads as a UTC date and time in the line; the raw Unix seconds stay an attribute
    stamp = datetime.fromtimestamp(rec.expires_at, tz=UTC).isoformat(timespec="milliseconds")
    assert f"expires_at={stamp.replace('+00:00', 'Z')}" in rec.getMessage()
    assert str(rec.expires_at) not in rec.getMessage()
    assert baldur.release_circuit("ops", actor="bob") is True
    (rec,) = records(caplog, "circuit_breaker.released")
    check_record(rec, "circuit_breaker.released", "ops", "open", "half_open", "released")
    baldur.force_close_circuit("ops", ttl_minutes=0.5)
    (rec,) = records(caplog, "circuit_breaker.forced_closed")
    check_record(rec, "circuit_breaker.forced_closed", "ops", "half_open", "closed", "forced")
    clock.advance(30)
    assert baldur.get_breaker("ops").state is CLOSED
    (rec,) = records(caplog, "circuit_breaker.force_lapsed")
    check_record(rec, "circuit_breaker.force_lapsed", "ops", "closed", "closed", "force_lapsed")
    assert not records(caplog, "circuit_breaker.half_opened")


@pytest.mark.parametrize("level_name", ["DEBUG", "INFO", "ERROR", "CRITICAL"])
def test_cb13_level_follows_the_setting(clock, caplog, monkeypatch, level_name):
    """CB-13: transition/force lines go out at BALDUR_EVENT_LOGGING_CB_LOG_LEVEL."""
    monkeypatch.setenv("BALDUR_EVENT_LOGGING_CB_LOG_LEVEL", level_name.lower())
    settings.reset()
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    breaker = make("levels", failure_threshold=1)
    fail(breaker)
    baldur.force_close_circuit("levels", ttl_minutes=1)
    expected = getattr(logging, level_name)
    assert records(caplog, "circuit_breaker.opened")[0].levelno == expected
    assert records(caplog, "circuit_breaker.forced_closed")[0].levelno == expected


def test_cb13_lines_below_the_logger_level_are_not_emitted(clock, caplog, monkeypatch):
    """CB-13: at level DEBUG with the logger at INFO, the transition line is filtered out."""
    monkeypatch.setenv("BALDUR_EVENT_LOGGING_CB_LOG_LEVEL", "DEBUG")
    settings.reset()
    caplog.set_level(logging.INFO, logger=LOGGER)
    fail(make("quiet", failure_threshold=1))
    assert records(caplog, "circuit_breaker.opened") == []


# --------------------------------------------------------------------------- CB-14


def test_cb14_events_for_transitions_forces_releases_lapses_and_rejections(clock, events):
    """CB-14: one in-process event per transition, force, release, lapse and rejection."""
    breaker = make("evt", failure_threshold=1, recovery_timeout=1, half_open_max_calls=1)
    fail(breaker)  # state_changed closed->open
    rejection(breaker)  # call_rejected
    clock.advance(1)
    breaker.state  # noqa: B018 - state_changed open->half_open
    breaker.record_success(breaker.acquire())  # state_changed half_open->closed
    breaker.force_open(ttl_minutes=1)  # forced
    breaker.release()  # released
    breaker.force_close(ttl_minutes=1)  # forced
    clock.advance(60)
    breaker.state  # noqa: B018 - force_lapsed
    assert events.kinds() == [
        "state_changed",
        "call_rejected",
        "state_changed",
        "state_changed",
        "forced",
        "released",
        "forced",
        "force_lapsed",
    ]
    assert all(e.service == "evt" for e in events.events)


def test_cb14_raising_listener_is_contained_and_others_still_run(clock, caplog):
    """CB-14: a listener that raises is logged, later listeners still get the event, and the
    protected call raises / returns exactly what it would have."""
    caplog.set_level(logging.DEBUG)

    def broken(event):
        raise RuntimeError("listener bug")

    bus.subscribe(broken)
    after = RecordingListener(bus)  # subscribed after the broken one
    original = ConnectionError("down")

    @baldur.protected("contained", failure_threshold=1, recovery_timeout=1, half_open_max_calls=1)
    def call(ok):
        if not ok:
            raise original
        return "value"

    with pytest.raises(ConnectionError) as info:
        call(False)
    assert info.value is original
    with pytest.raises(CircuitOpenError):
        call(True)
    clock.advance(1)
    assert call(True) == "value"  # the closing transition goes through the broken listener too
    assert after.transitions() == [
        ("closed", "open", "consecutive_failures"),
        ("open", "half_open", "recovery_timeout"),
        ("half_open", "closed", "half_open_success"),
    ]
    failures = [r for r in caplog.records if r.name == "baldur.events" and r.exc_info]
    assert len(failures) >= 4
    assert "listener bug" in str(failures[0].exc_info[1])
    assert baldur.get_breaker("contained").state is CLOSED


def test_cb14_raising_listener_does_not_break_forces(clock):
    """CB-14: an operator force still applies when a listener raises."""
    bus.subscribe(lambda event: 1 / 0)
    baldur.force_open_circuit("forced-contained", ttl_minutes=1)
    assert baldur.get_breaker("forced-contained").state is OPEN
    assert baldur.release_circuit("forced-contained") is True


# --------------------------------------------------------------- CircuitOpenError


def test_circuit_open_error_attributes_and_pickling():
    """Section 0: CircuitOpenError carries service, reason, retry_after and survives pickling."""
    err = CircuitOpenError("pay", "half_open_full", None)
    assert (err.service, err.reason, err.retry_after) == ("pay", "half_open_full", None)
    clone = pickle.loads(pickle.dumps(CircuitOpenError("pay", "open", 1.5)))
    assert (clone.service, clone.reason, clone.retry_after) == ("pay", "open", 1.5)
    assert "pay" in str(clone)
    assert issubclass(CircuitOpenError, BaldurError) and issubclass(ConfigError, ValueError)


# ------------------------------------------------------------------- OP-1..OP-3


def test_op1_force_open_registers_unseen_service_with_default_lifetime(clock, events):
    """OP-1: forcing an unseen service registers it; default lifetime is 90 minutes."""
    baldur.force_open_circuit("never-seen", reason="maintenance", actor="alice")
    breaker = registry.get("never-seen", create=False)
    assert breaker is not None and breaker.state is OPEN
    snap = breaker.snapshot()
    assert snap["forced"] == "open"
    assert snap["force_expires_at"] == pytest.approx(clock.wall() + 90 * 60)
    forced = [e for e in events.events if e.kind == "forced"]
    assert len(forced) == 1 and forced[0].mode == "open" and forced[0].ttl_minutes == 90
    assert (forced[0].reason, forced[0].actor) == ("maintenance", "alice")


def test_op1_default_lifetime_follows_the_setting(clock, monkeypatch):
    """OP-1: ttl_minutes=None uses BALDUR_CB_MANUAL_OVERRIDE_TTL_MINUTES."""
    monkeypatch.setenv("BALDUR_CB_MANUAL_OVERRIDE_TTL_MINUTES", "2")
    settings.reset()
    baldur.force_close_circuit("ttl-env", ttl_minutes=None)
    assert baldur.get_breaker("ttl-env").snapshot()["force_expires_at"] == pytest.approx(clock.wall() + 120)
    clock.advance(119.9)
    assert baldur.get_breaker("ttl-env").forced == "closed"
    clock.advance(0.1)
    assert baldur.get_breaker("ttl-env").forced is None


def test_op1_fractional_lifetime_lapses_to_half_open(clock, events):
    """OP-1/OP-3: a 0.5-minute forced open lapses after 30 s, straight to HALF_OPEN."""
    breaker = make("lapse", recovery_timeout=5)
    baldur.force_open_circuit("lapse", ttl_minutes=0.5)
    clock.advance(29.9)
    assert breaker.state is OPEN
    assert rejection(breaker).retry_after == pytest.approx(0.1)
    clock.advance(0.1)
    assert breaker.state is HALF_OPEN
    assert breaker.snapshot()["forced"] is None
    lapsed = [e for e in events.events if e.kind == "force_lapsed"]
    assert len(lapsed) == 1 and (lapsed[0].previous, lapsed[0].to_state) == ("open", "half_open")
    assert breaker.acquire().trial


@pytest.mark.parametrize("ttl", [0, -1, 1441, 1440.01, math.nan, math.inf, True, "5"], ids=repr)
@pytest.mark.parametrize("force", ["force_open_circuit", "force_close_circuit"])
def test_op1_bad_lifetime_is_config_error_and_changes_nothing(clock, events, force, ttl):
    """OP-1/CFG-3: a TTL <= 0, above 1440, NaN, infinite, boolean or text raises ConfigError naming
    ttl_minutes and the value; the breaker and its force stay as they were, no event is published."""
    breaker = make("bad-ttl", failure_threshold=3)
    fail(breaker)
    baldur.force_close_circuit("bad-ttl", ttl_minutes=10)
    before = breaker.snapshot()
    published = len(events.events)
    with pytest.raises(ConfigError) as info:
        getattr(baldur, force)("bad-ttl", ttl_minutes=ttl)
    assert "ttl_minutes" in str(info.value) and repr(ttl) in str(info.value)
    assert breaker.snapshot() == before
    assert len(events.events) == published


@pytest.mark.parametrize("ttl", [1440, 0.001, 1])
def test_op1_lifetime_bounds_are_inclusive_of_1440(clock, ttl):
    """OP-1: any number > 0 and <= 1440 is a valid lifetime."""
    baldur.force_open_circuit("ttl-ok", ttl_minutes=ttl)
    assert baldur.get_breaker("ttl-ok").snapshot()["force_expires_at"] == pytest.approx(clock.wall() + ttl * 60)


def test_op2_forced_open_allows_no_probe(clock):
    """OP-2: forced open outranks the recovery timeout: no HALF_OPEN, no trial, retry_after is
    the time until the force lapses."""
    breaker = make("held", failure_threshold=1, recovery_timeout=1)
    fail(breaker)
    baldur.force_open_circuit("held", ttl_minutes=10)
    clock.advance(120)
    assert breaker.state is OPEN
    err = rejection(breaker)
    assert err.reason == "open"
    assert err.retry_after == pytest.approx(600 - 120)


def test_op2_forced_closed_records_failures_but_never_trips(clock, events):
    """OP-2: forced closed: failures are recorded (counts grow) but neither trigger opens it."""
    breaker = make("held-closed", failure_threshold=2, sliding_window_size=4, minimum_calls=4)
    baldur.force_close_circuit("held-closed", ttl_minutes=10)
    fail(breaker, 10)
    snap = breaker.snapshot()
    assert snap["state"] == "closed"
    assert snap["consecutive_failures"] == 10
    assert (snap["window_calls"], snap["window_failures"]) == (4, 4)
    assert events.transitions() == []


def test_op2_forced_closed_survives_a_rate_limit_storm(clock):
    """OP-2: a 429 storm does not trip a forced-closed breaker."""
    make("storm", failure_threshold=1000, failure_rate_threshold=0)
    baldur.force_close_circuit("storm", ttl_minutes=10)
    for _ in range(50):
        baldur.record_rate_limit("storm", retry_after=0)
    assert baldur.get_breaker("storm").state is CLOSED


def test_op2_force_closed_from_open_admits_calls_and_clears_counts(clock):
    """OP-2/CB-7: forcing an OPEN breaker closed admits calls at once and clears its counts."""
    breaker = make("reopened", failure_threshold=1)
    fail(breaker)
    baldur.force_close_circuit("reopened", ttl_minutes=1)
    assert breaker.state is CLOSED
    assert not breaker.acquire().trial
    assert breaker.snapshot()["consecutive_failures"] == 0


def test_op3_release_forced_open_goes_to_half_open(clock, events):
    """OP-3: releasing a forced open goes straight to HALF_OPEN; release returns True."""
    breaker = make("rel", half_open_max_calls=1, recovery_timeout=1000)
    baldur.force_open_circuit("rel", ttl_minutes=60)
    assert baldur.release_circuit("rel", actor="bob") is True
    assert breaker.state is HALF_OPEN
    assert breaker.snapshot()["forced"] is None
    released = [e for e in events.events if e.kind == "released"]
    assert len(released) == 1 and released[0].actor == "bob" and released[0].previous == "open"
    breaker.record_success(breaker.acquire())
    assert breaker.state is CLOSED


def test_op3_release_forced_closed_keeps_counts_and_next_outcome_decides(clock, events):
    """OP-3: releasing a forced closed returns to automatic CLOSED with its counts; the next
    failure evaluates the triggers and opens it."""
    breaker = make("rel-closed", failure_threshold=3)
    baldur.force_close_circuit("rel-closed", ttl_minutes=60)
    fail(breaker, 5)
    assert baldur.release_circuit("rel-closed") is True
    assert breaker.state is CLOSED
    assert breaker.snapshot()["consecutive_failures"] == 5
    fail(breaker)
    assert breaker.state is OPEN
    assert events.transitions() == [("closed", "open", "consecutive_failures")]


def test_op3_forced_closed_lapse_keeps_counts(clock):
    """OP-3: a forced closed that lapses returns to automatic CLOSED with its counts."""
    breaker = make("lapse-closed", failure_threshold=3)
    baldur.force_close_circuit("lapse-closed", ttl_minutes=1)
    fail(breaker, 4)
    clock.advance(60)
    assert breaker.state is CLOSED and breaker.forced is None
    assert breaker.snapshot()["consecutive_failures"] == 4
    succeed(breaker)  # the next outcome evaluates: a success resets the count
    fail(breaker, 2)
    assert breaker.state is CLOSED
    fail(breaker)
    assert breaker.state is OPEN


def test_op3_release_of_unforced_breaker_is_a_no_op(clock, events):
    """OP-3: releasing an unforced (or already lapsed) breaker returns False and publishes nothing."""
    breaker = make("free", failure_threshold=1)
    fail(breaker)
    assert baldur.release_circuit("free") is False
    assert breaker.state is OPEN
    baldur.force_open_circuit("free", ttl_minutes=1)
    clock.advance(60)
    assert breaker.state is HALF_OPEN  # the lapse is evaluated (and published) here
    published = len(events.events)
    assert baldur.release_circuit("free") is False
    assert [e.kind for e in events.events[published:]] == []


def test_op3_force_open_while_already_forced_closed_switches(clock):
    """OP-1: a new force replaces the previous one (closed -> open) with its own lifetime."""
    baldur.force_close_circuit("switch", ttl_minutes=60)
    baldur.force_open_circuit("switch", ttl_minutes=1)
    breaker = baldur.get_breaker("switch")
    assert breaker.state is OPEN and breaker.forced == "open"
    assert rejection(breaker).retry_after == pytest.approx(60)


def test_op1_forced_open_rejects_slow_calls_started_before(clock):
    """OP-1/CB-8: a call admitted before a force open cannot close or reopen the forced breaker."""
    breaker = make("pre-force", failure_threshold=1)
    permit = breaker.acquire()
    baldur.force_open_circuit("pre-force", ttl_minutes=1)
    breaker.record_success(permit)
    assert breaker.state is OPEN and breaker.forced == "open"


# ------------------------------------------------------------------------- OP-5


@pytest.fixture
def dry_run(monkeypatch):
    monkeypatch.setenv("BALDUR_DRY_RUN", "true")
    settings.reset()


def test_op5_dry_run_never_rejects_and_counts_would_be_rejections(clock, dry_run, events, caplog):
    """OP-5: in dry-run the breaker still opens, but an OPEN breaker lets the call through,
    counts it in dry_run_rejections, logs circuit_breaker.dry_run_reject, records no outcome
    and never runs the fallback."""
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    fallback_calls = []
    calls = []

    @baldur.protected(
        "dry", failure_threshold=2, recovery_timeout=30, fallback=lambda *a: fallback_calls.append(a) or "fallback"
    )
    def call(mode):
        calls.append(mode)
        if mode == "fail":
            raise ConnectionError("down")
        return "real"

    for _ in range(2):
        assert call("fail") == "fallback"  # CLOSED-era failures still use the fallback
    breaker = baldur.get_breaker("dry")
    assert breaker.state is OPEN
    assert events.transitions()[-1][1] == "open" and events.events[-1].dry_run
    fallback_calls.clear()
    before = breaker.snapshot()
    assert call("ok") == "real"
    with pytest.raises(ConnectionError):
        call("fail")
    after = breaker.snapshot()
    assert after["dry_run_rejections"] == 2
    assert fallback_calls == []
    assert calls[-2:] == ["ok", "fail"]
    for key in ("state", "consecutive_failures", "window_calls", "window_failures", "opened_at"):
        assert after[key] == before[key], key
    rejects = records(caplog, "circuit_breaker.dry_run_reject")
    assert len(rejects) == 2 and rejects[0].levelno == logging.WARNING
    assert rejects[0].getMessage().startswith("circuit_breaker.dry_run_reject")
    assert rejection_free(breaker)


def rejection_free(breaker) -> bool:
    permit = breaker.acquire()  # must not raise
    return permit.dry_run


def test_op5_dry_run_lets_forced_open_through(clock, dry_run):
    """OP-5: a forced-open breaker is applied (and reads OPEN) but rejects nothing in dry-run."""

    @baldur.circuit_breaker("dry-forced")
    def call():
        return "through"

    baldur.force_open_circuit("dry-forced", ttl_minutes=5)
    assert baldur.get_breaker("dry-forced").state is OPEN
    assert call() == "through"
    assert call() == "through"
    assert baldur.get_breaker("dry-forced").snapshot()["dry_run_rejections"] == 2


def test_op5_dry_run_half_open_full_lets_through_without_deciding(clock, dry_run):
    """OP-5: past the half-open allowance, calls pass as dry-run; their outcomes never close or reopen."""
    breaker = half_open("dry-half", n=1, recovery_timeout=1)
    trial = breaker.acquire()
    extra = breaker.acquire()
    assert extra.dry_run and not extra.trial
    breaker.record_success(extra)
    breaker.record_failure(extra)
    assert breaker.state is HALF_OPEN
    breaker.record_success(trial)
    assert breaker.state is CLOSED
    assert breaker.snapshot()["dry_run_rejections"] == 1


def test_op5_dry_run_counter_counts_each_would_be_rejection(clock, dry_run):
    """OP-5: dry_run_rejections counts every call that would have been rejected."""
    breaker = make("dry-count", failure_threshold=1)
    fail(breaker)
    for _ in range(5):
        assert breaker.acquire().dry_run
    assert breaker.snapshot()["dry_run_rejections"] == 5


def test_op5_without_dry_run_open_rejects(clock):
    """OP-5 (control): with BALDUR_DRY_RUN unset, the same OPEN breaker rejects."""
    breaker = make("not-dry", failure_threshold=1)
    fail(breaker)
    assert rejection(breaker).reason == "open"
    assert breaker.snapshot()["dry_run_rejections"] == 0


def test_op5_dry_run_never_refuses_for_a_cooldown(clock, dry_run):
    """OP-5: in dry-run a 429 cooldown longer than the allowed wait does not refuse the attempt."""
    baldur.record_rate_limit("dry-cool", retry_after=3600)
    calls = []
    assert baldur.protect("dry-cool", lambda: calls.append(1) or "through", retry=True) == "through"
    assert calls == [1]


# ------------------------------------------------------------------------- ST-1


def test_st1_memory_backend_is_the_default(clock):
    """ST-1: with no store configured, snapshots say backend "memory"."""
    assert make("mem").snapshot()["backend"] == "memory"


def test_st1_half_open_allowance_is_per_process(clock):
    """ST-1: on the memory store each worker's breaker has its own half-open allowance.
    Two CircuitBreaker objects for one service stand for two worker processes."""
    config = build_config("payments", {"failure_threshold": 1, "recovery_timeout": 1, "half_open_max_calls": 2})
    workers = [CircuitBreaker("payments", config, clock=clock) for _ in range(2)]
    for breaker in workers:
        fail(breaker)
    clock.advance(1)
    trials = [breaker.acquire() for breaker in workers for _ in range(2)]
    assert len(trials) == 4 and all(t.trial for t in trials)
    for breaker in workers:
        assert rejection(breaker).reason == "half_open_full"
    workers[0].record_failure(trials[0])
    assert (workers[0].state, workers[1].state) == (OPEN, HALF_OPEN)

"""RS-9 (with RS-3..RS-6): the fast lane of a ``def`` with one load-aware stage on.

A call site with exactly one stage (bulkhead, throttle, retry budget or Retry-After gate,
kept in this worker) runs its CLOSED healthy calls in one frame (``core/stages/lanes.py``).
These tests check that the lane is taken where it should be, and that what it does is what
the staged way does: the stage's figures, failures, fallbacks, retries, refusals,
reconfiguration and nested calls. A call's caller frame tells which way it went.
"""

from __future__ import annotations

import dataclasses
import sys

import pytest

import baldur_django as baldur
from baldur_django import BulkheadFullError, DeadlineExceededError, RetryPolicy, ThrottledError
from baldur_django.contrib.outbound import clipped_timeout
from baldur_django.core.stages import throttle as throttle_module
from baldur_django.core.stages.deadline import ARMED, time_left
from baldur_django.core.stages.service import stages_of

WINDOW = 5
#: small windows, a breaker that never opens (a failure stays a failure of the call)
QUIET = {
    "sliding_window_size": WINDOW,
    "minimum_calls": WINDOW,
    "failure_threshold": 10**6,
    "failure_rate_threshold": 0,
}
AGAIN = RetryPolicy(max_attempts=2, backoff_initial=0.1, backoff_multiplier=1.0, jitter=0)
KNOBS = {
    "deadline": {"deadline": 5.0},
    "bulkhead": {"max_concurrent_calls": 2},
    "throttle": {"adaptive_throttling_k": 2.0},
    "budget": {"retry": AGAIN, "retry_budget_ratio": 0.2},
    "gate": {"honor_retry_after": True},
}


@pytest.fixture(autouse=True)
def no_deadline_ever_set():
    """A deadline set by an earlier test in this process takes every call off the lanes."""
    ARMED.clear()
    yield
    ARMED.clear()


def on_lane() -> bool:
    """Called by a protected function's body: whether its caller is a stage lane."""
    return sys._getframe(2).f_code.co_filename.endswith("lanes.py")


class Status:
    def __init__(self, status_code: int, retry_after: str | None = None) -> None:
        self.status_code = status_code
        self.headers = {} if retry_after is None else {"Retry-After": retry_after}


def window(name: str) -> tuple[int, int]:
    snap = baldur.get_breaker(name).snapshot()
    return snap["window_calls"], snap["window_failures"]


def steady(func, calls: int = 3 * WINDOW) -> None:
    for _ in range(calls):
        func()


@pytest.mark.parametrize("kind", sorted(KNOBS))
def test_rs9_one_stage_runs_its_healthy_calls_on_the_lane_with_the_stage_s_figures(clock, kind):
    """RS-9: once the breaker's window is full and clean, every call of a call site with one
    stage goes through the lane, and the stage's figures are those the staged way keeps:
    no slot held, every request accepted, every call in the budget, the gate open."""
    ways: list[bool] = []

    @baldur.protected("svc", **QUIET, **KNOBS[kind])
    def svc() -> str:
        ways.append(on_lane())
        return "ok"

    steady(svc, 40)
    assert not ways[0] and all(ways[2 * WINDOW :]), ways
    held = stages_of(baldur.get_breaker("svc"))
    if kind == "bulkhead":
        assert held.bulkhead.in_flight() == 0 and held.bulkhead.waiting() == 0
    if kind == "throttle":
        assert held.throttle.counts() == (40, 40) and held.throttle.probability() == 0.0
    if kind == "budget":
        assert held.budget.left() == pytest.approx(0.2 * 40 + 10 * held.budget.min_per_second)
    if kind == "gate":
        assert held.gate.remaining() == 0.0
    if kind == "deadline":
        assert held is None and not ARMED  # no stage to hold; the knob arms nothing
    assert window("svc") == (WINDOW, 0)


def test_rs9_two_stages_or_a_deadline_knob_run_the_staged_way(clock):
    """RS-9: the lanes serve one stage alone; two stages, or one with a ``deadline``, take
    the staged way for every call (and keep working)."""
    ways: list[bool] = []

    def body() -> str:
        ways.append(on_lane())
        return "ok"

    two = baldur.protected("two", **QUIET, max_concurrent_calls=2, honor_retry_after=True)(body)
    timed = baldur.protected("timed", **QUIET, max_concurrent_calls=2, deadline=5.0)(body)
    steady(two)
    steady(timed)
    assert ways and not any(ways)


def test_rs4_a_failure_on_the_lane_gives_the_slot_back_and_the_fallback_answers(clock):
    """RS-4: a call that raises on the bulkhead's lane hands its slot back, counts as one
    failure and is answered by the fallback."""
    fail: list[bool] = []

    @baldur.protected("db", **QUIET, max_concurrent_calls=1, fallback=lambda: "fb")
    def db() -> str:
        assert on_lane() or not fail
        if fail:
            raise ConnectionError("down")
        return "ok"

    steady(db)
    fail.append(True)
    assert db() == "fb"
    assert window("db") == (WINDOW, 1)
    assert stages_of(baldur.get_breaker("db")).bulkhead.in_flight() == 0


def test_rs4_a_full_bulkhead_refuses_a_call_from_the_lane(clock):
    """RS-4: with its one slot taken by a call in progress, a call made inside it through
    another function of the service is refused (no wait) and answered by the fallback;
    the slot comes back after."""
    seen: list[object] = []

    @baldur.protected("db", **QUIET, max_concurrent_calls=1, fallback=lambda: "refused")
    def inner() -> str:
        return "inner ran"

    @baldur.protected("db", **QUIET, max_concurrent_calls=1)
    def outer(nest: bool = False) -> str:
        if nest:
            seen.append(on_lane())
            seen.append(inner())
        return "ok"

    steady(outer)
    steady(inner)
    assert outer(nest=True) == "ok"
    assert seen == [True, "refused"]
    assert stages_of(baldur.get_breaker("db")).bulkhead.in_flight() == 0


def test_rs5_the_budget_lane_counts_its_calls_and_retries_spend_them(clock):
    """RS-5: the budget's lane counts each call it runs, so the retries a budget allows grow
    with them: after 15 calls on the lane, ratio 0.5 (no floor) lets the first failing
    call retry (8 calls, room for 4), and over 20 failing calls the retries stay within
    half of the 35 calls; the others end on their first failure."""
    made: list[bool] = []
    fresh: list[bool] = []

    @baldur.protected("api", **QUIET, retry=AGAIN, retry_budget_ratio=0.5, retry_budget_min_per_second=0)
    def api() -> str:
        made.append(on_lane())
        if fresh:
            fresh.clear()
            raise ConnectionError("a first attempt fails")
        return "ok"

    steady(api)
    assert made[-1] is True
    made.clear()
    results = []
    for _ in range(20):
        fresh.append(True)
        try:
            results.append(api())
        except ConnectionError:
            results.append("failed")
    assert made[0] is True  # the first failing attempt ran on the lane
    assert results[0] == "ok"  # and the 16 calls counted made room for its retry
    retries = results.count("ok")
    assert len(made) == 20 + retries
    assert 1 <= retries <= 0.5 * 35
    assert stages_of(baldur.get_breaker("api")).budget.exhausted == 20 - retries


def test_rs5_the_budget_lane_stops_a_retry_when_the_budget_is_empty(clock):
    """RS-5: no retry left (ratio 0, no floor): the lane's failed first attempt is final,
    counted once, and answered by the fallback."""
    made: list[bool] = []
    down: list[bool] = []

    @baldur.protected(
        "api", **QUIET, retry=AGAIN, retry_budget_ratio=0, retry_budget_min_per_second=0, fallback=lambda: "fb"
    )
    def api() -> str:
        made.append(on_lane())
        if down:
            raise ConnectionError("down")
        return "ok"

    steady(api)
    made.clear()
    down.append(True)
    assert api() == "fb"
    assert made == [True]  # one attempt, made on the lane
    assert window("api") == (WINDOW, 1)
    assert stages_of(baldur.get_breaker("api")).budget.exhausted == 1


@pytest.mark.parametrize("raised", [False, True])
def test_rs3_a_429_answered_on_the_gate_lane_closes_the_gate(clock, raised):
    """RS-3: a 429 with Retry-After: 20 answered to a call on the gate's lane (returned, or
    raised as an error carrying the response) closes the gate: the next calls are refused
    without contact and answered by the fallback until the 20 s are over, then the lane
    runs the calls again."""
    answers: list[Status] = []
    ways: list[bool] = []

    class TooMany(Exception):
        def __init__(self) -> None:
            super().__init__("429")
            self.status_code = 429
            self.response = Status(429, "20")

    @baldur.protected("api", **QUIET, honor_retry_after=True, fallback=lambda: "later")
    def api() -> object:
        ways.append(on_lane())
        if answers:
            if raised:
                answers.pop()
                raise TooMany()
            return answers.pop()
        return Status(200)

    steady(api)
    answers.append(Status(429, "20"))
    first = api()
    assert ways[-1] is True
    assert first == "later" if raised else first.status_code == 429
    contacts = len(ways)
    clock.advance(19.5)
    assert api() == "later" and len(ways) == contacts
    clock.advance(0.6)
    assert api().status_code == 200 and len(ways) == contacts + 1


def test_rs6_the_throttle_lane_refuses_at_the_formula_s_rate(clock, monkeypatch):
    """RS-6: old failures (two calls of three) still in the throttle's window while the
    breaker's window has filled with successes: calls run on the lane, and each one is refused exactly when the
    injected random number drawn for it falls under max(0, (requests - K x accepts) /
    (requests + 1)) from the counts before it; no number is drawn while that is 0. A
    refusal contacts nothing and is no failure."""
    source = iter([(i * 7919 % 1000) / 1000 for i in range(100_000)])
    draws: list[float] = []

    def rand() -> float:
        draws.append(next(source))
        return draws[-1]

    monkeypatch.setattr(throttle_module, "default_rand", rand)
    ways: list[bool] = []
    failing = [True]

    @baldur.protected("api", **QUIET, adaptive_throttling_k=1.5, adaptive_throttling_window=60)
    def api() -> str:
        ways.append(on_lane())
        if failing and len(ways) % 3:
            raise ConnectionError("two calls of three fail")
        return "ok"

    for _ in range(60):  # their failures stay in the throttle's window
        try:
            api()
        except (ConnectionError, ThrottledError):
            pass
    failing.clear()
    throttle = stages_of(baldur.get_breaker("api")).throttle
    checked = refusals = 0
    for _ in range(400):
        clean = window("api") == (WINDOW, 0)
        requests, accepts = throttle.counts()
        p = max(0.0, (requests - 1.5 * accepts) / (requests + 1))
        contacts, drawn = len(ways), len(draws)
        try:
            api()
            refused = False
        except ThrottledError:
            refused = True
        if not clean:
            continue  # the staged way, until the breaker's window is clean again
        checked += 1
        if p == 0:
            assert len(draws) == drawn and not refused
        else:
            assert len(draws) == drawn + 1
            assert refused == (draws[-1] < p), (p, draws[-1], refused)
        assert len(ways) == contacts + (not refused)  # a refusal contacts nothing
        assert refused or ways[-1] is True  # an admitted call ran on the lane
        refusals += refused
    assert checked > 300 and refusals >= 10, (checked, refusals)
    assert window("api") == (WINDOW, 0)  # refusals are no failures


def test_rs9_a_reconfigured_breaker_s_lane_runs_on_the_new_bulkhead(clock):
    """RS-9, RS-8: after a reconfiguration the lane takes its slots from the new bulkhead
    (with the new limit); the old one holds none."""
    inside: list[tuple[int, bool]] = []

    @baldur.protected("db", **QUIET, max_concurrent_calls=1)
    def db() -> str:
        inside.append((stages_of(baldur.get_breaker("db")).bulkhead.in_flight(), on_lane()))
        return "ok"

    steady(db)
    breaker = baldur.get_breaker("db")
    old = stages_of(breaker).bulkhead
    breaker.reconfigure(dataclasses.replace(breaker.config, max_concurrent_calls=3))
    steady(db)
    new = stages_of(breaker).bulkhead
    assert new is not old and new.limit == 3
    assert inside[-1] == (1, True)  # the new bulkhead's slot, taken on the lane
    assert old.in_flight() == 0 and new.in_flight() == 0


def test_rs9_a_deadline_takes_calls_off_the_lane(clock):
    """RS-9, RS-2: inside ``baldur.deadline(...)`` a lane's call goes the staged way, so a
    deadline that has passed refuses it before contact."""
    ways: list[bool] = []

    @baldur.protected("db", **QUIET, max_concurrent_calls=2)
    def db() -> str:
        ways.append(on_lane())
        return "ok"

    steady(db)
    assert ways[-1] is True
    with baldur.deadline(1.0, clock=clock):
        db()
        assert ways[-1] is False
        clock.advance(2.0)
        with pytest.raises(DeadlineExceededError):
            db()


def test_rs9_a_retry_policy_leaves_the_lane_once_a_429_cooldown_was_seen(clock):
    """RS-9: a 429 cooldown gates a retry policy's first attempts; from the first one the
    call site runs the staged way, which waits the cooldown out before the attempt."""
    ways: list[bool] = []
    answers: list[Status] = []

    @baldur.protected("api", **QUIET, retry=AGAIN, max_concurrent_calls=2)
    def api() -> Status:
        ways.append(on_lane())
        return answers.pop() if answers else Status(200)

    steady(api)
    assert ways[-1] is True
    answers.append(Status(429, "1"))
    assert api().status_code == 200  # the 429, then a retry after its cooldown
    steady(api)
    assert not any(ways[-WINDOW:])


def test_rs9_nested_calls_through_the_same_breaker_count_as_the_plain_wrapper_counts(clock):
    """RS-9: the lane settles nested calls as the breaker's own wrapper does. An outer call
    whose nested call through the same breaker fails, and which then returns, leaves the
    same window behind a bulkhead's lane as behind the wrapper without a stage."""

    def scenario(name: str, knobs: dict[str, int]) -> tuple[int, int]:
        ways: list[bool] = []

        @baldur.protected(name, **QUIET, **knobs)
        def inner() -> str:
            raise ConnectionError("down")

        @baldur.protected(name, **QUIET, **knobs)
        def outer(nest: bool = True) -> str:
            ways.append(on_lane())
            try:
                if nest:
                    inner()
            except ConnectionError:
                return "recovered"
            return "ok"

        steady(lambda: outer(nest=False))
        ways.clear()
        assert outer() == "recovered"
        assert ways == [bool(knobs)]
        return window(name)

    assert scenario("lane", {"max_concurrent_calls": 4}) == scenario("plain", {})


def test_rs4_bulkhead_full_error_is_what_a_full_lane_raises_without_a_fallback(clock):
    """RS-4: without a fallback the refusal of a full bulkhead is raised from the lane."""

    @baldur.protected("db", **QUIET, max_concurrent_calls=1)
    def db(nest: bool = False) -> str:
        if nest:
            with pytest.raises(BulkheadFullError):
                db()
        return "ok"

    steady(db)
    assert db(nest=True) == "ok"


# ------------------------------------------------------------------ the deadline's lane
STEADY = RetryPolicy(max_attempts=5, backoff_initial=1.0, backoff_multiplier=1.0, jitter=0)


def test_rs2_rs9_code_run_by_a_call_on_the_deadline_lane_sees_the_time_left(clock):
    """RS-2, RS-9: a call on the deadline's lane carries its deadline in its frame: the code
    it runs in its thread reads the time left (and an HTTP timeout is clipped to it), the
    earlier of it and an enclosing deadline block's wins, and outside the call there is
    none; the process stays unarmed."""
    seen: list[tuple[bool, float | None, object]] = []

    @baldur.protected("pay", **QUIET, deadline=5.0)
    def pay(spend: float = 0.0) -> str:
        clock.advance(spend)
        seen.append((on_lane(), time_left(), clipped_timeout(10)))
        return "ok"

    steady(pay)
    seen.clear()
    pay(spend=2.0)
    assert seen == [(True, pytest.approx(3.0), pytest.approx(3.0))]
    assert time_left() is None and not ARMED
    ARMED.clear()
    with baldur.deadline(1.5, clock=clock):
        ARMED.clear()  # the block's deadline alone, with the lane still taken
        pay()
    assert seen[-1] == (True, pytest.approx(1.5), pytest.approx(1.5))


def test_rs2_rs9_a_first_attempt_failing_on_the_deadline_lane_retries_within_the_deadline(clock):
    """RS-2, RS-9: with 1 s backoffs and a 2.5 s ``deadline``, a call whose first attempt
    fails on the lane makes three attempts in all (t=0, 1, 2), no backoff runs past 2.5 s,
    and the last failure is the outcome, counted once."""
    attempts: list[tuple[float, bool]] = []
    down: list[bool] = []

    @baldur.protected("inventory", **QUIET, retry=STEADY, deadline=2.5)
    def fetch() -> str:
        if down:
            attempts.append((clock.monotonic(), on_lane()))
            raise ConnectionError("down")
        return "ok"

    steady(fetch)
    down.append(True)
    start = clock.monotonic()
    with pytest.raises(ConnectionError):
        fetch()
    assert [t - start for t, _ in attempts] == [0.0, 1.0, 2.0]
    assert attempts[0][1] is True  # the first attempt ran on the lane
    assert sum(clock.sleeps) <= 2.5
    assert window("inventory") == (WINDOW, 1)
    assert not ARMED


def test_rs2_a_nested_call_s_retries_stop_at_the_deadline_of_the_lane_call_around_it(clock):
    """RS-2: a protected call with a retry policy, made inside a call on the deadline's lane
    (2.5 s), stops retrying at that deadline: the time left is read off the outer call's
    frame."""
    attempts: list[float] = []

    @baldur.protected("inner", retry=STEADY)
    def inner() -> str:
        attempts.append(clock.monotonic())
        raise ConnectionError("down")

    @baldur.protected("outer", **QUIET, deadline=2.5)
    def outer(nest: bool = False) -> str:
        if nest:
            assert on_lane()
            try:
                inner()
            except ConnectionError:
                return "gave up"
        return "ok"

    steady(outer)
    start = clock.monotonic()
    assert outer(nest=True) == "gave up"
    assert [t - start for t in attempts] == [0.0, 1.0, 2.0]  # not the policy's five

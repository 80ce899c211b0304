"""CB-19: nested use of one breaker is one call.

A function protected by breaker X, called (directly or not) inside a call through X in the
same thread or asyncio task, makes one call with the outer one: one failure adds one to the
counts, one success one; in HALF_OPEN the nested call takes no second slot and is not
refused; a trial closes the breaker only when the dependency was really called and answered,
never on an inner fallback's value. Every scenario has a sync and an async twin.

(The HALF_OPEN case was a regression found by running aiobreaker's suite against ours, and
then bug 3 of issue 18: the inner call was refused, its fallback answered, and the outer
trial closed the breaker with zero calls to the dependency.)
"""

from __future__ import annotations

import asyncio

import pytest

import baldur_django as baldur

OPTS = {
    "failure_threshold": 3,
    "failure_rate_threshold": 0,
    "recovery_timeout": 5,
    "half_open_max_calls": 1,
    "sliding_window_size": 10,
    "minimum_calls": 1,
}


class Down(Exception):
    """The dependency's own failure."""


class Dependency:
    def __init__(self):
        self.calls = 0
        self.ok = True

    def __call__(self):
        self.calls += 1
        if not self.ok:
            raise Down("down")
        return "answer"


def sync_pair(name, dep, *, inner_fallback=False, **opts):
    options = {**OPTS, **opts}
    if inner_fallback:
        options["fallback"] = lambda: "fallback"

    @baldur.protected(name, **options)
    def inner():
        return dep()

    def outer():
        return baldur.protect(name, lambda: inner())

    return outer


def async_pair(name, dep, *, inner_fallback=False, **opts):
    options = {**OPTS, **opts}
    if inner_fallback:
        options["fallback"] = lambda: "fallback"

    @baldur.protected(name, **options)
    async def inner():
        await asyncio.sleep(0)
        return dep()

    async def outer():
        return await baldur.aprotect(name, lambda: inner())

    return outer


def run(style, outer):
    """Call *outer* once in the given style; returns its value or the exception raised."""
    try:
        return outer() if style == "sync" else asyncio.run(outer())
    except Exception as exc:  # the test looks at it
        return exc


def pair(style, name, dep, **kw):
    return (sync_pair if style == "sync" else async_pair)(name, dep, **kw)


def open_then_wait(breaker, clock):
    for _ in range(3):
        breaker.record_failure(breaker.acquire())
    assert breaker.state is baldur.CircuitState.OPEN
    clock.advance(5)


STYLES = ["sync", "async"]


@pytest.mark.parametrize("style", STYLES)
def test_cb19_nested_failure_adds_one(style, clock):
    """CB-19: in CLOSED one nested failure adds one to the consecutive count and the window."""
    dep = Dependency()
    dep.ok = False
    outer = pair(style, f"nest-fail-{style}", dep)
    assert isinstance(run(style, outer), Down)
    snap = baldur.get_breaker(f"nest-fail-{style}").snapshot()
    assert (snap["consecutive_failures"], snap["window_failures"], snap["window_calls"]) == (1, 1, 1)
    assert dep.calls == 1


@pytest.mark.parametrize("style", STYLES)
def test_cb19_nested_success_adds_one(style, clock):
    """CB-19: in CLOSED one nested success adds one to the window."""
    dep = Dependency()
    outer = pair(style, f"nest-ok-{style}", dep)
    assert run(style, outer) == "answer"
    snap = baldur.get_breaker(f"nest-ok-{style}").snapshot()
    assert (snap["window_calls"], snap["window_failures"]) == (1, 0)


@pytest.mark.parametrize("style", STYLES)
def test_cb19_inner_fallback_after_a_failure_is_one_failure(style, clock):
    """CB-19: a nested failure answered by the inner fallback is one failure, not a failure
    plus a success (the consecutive count is not reset by the fallback's value)."""
    dep = Dependency()
    dep.ok = False
    outer = pair(style, f"nest-fb-{style}", dep, inner_fallback=True)
    for expected in (1, 2):
        assert run(style, outer) == "fallback"
        snap = baldur.get_breaker(f"nest-fb-{style}").snapshot()
        assert (snap["consecutive_failures"], snap["window_failures"], snap["window_calls"]) == (
            expected,
            expected,
            expected,
        )
    assert run(style, outer) == "fallback"
    assert baldur.get_breaker(f"nest-fb-{style}").state is baldur.CircuitState.OPEN  # 3 = the threshold


@pytest.mark.parametrize("style", STYLES)
def test_cb19_half_open_inner_fallback_never_closes(style, clock, events):
    """CB-19 (issue 18, bug 3): HALF_OPEN with one slot, the dependency still down: the nested
    call is not refused and takes no second slot, the dependency is called once, the trial
    fails and the breaker reopens; the inner fallback still answers the caller."""
    name = f"nest-ho-{style}"
    dep = Dependency()
    outer = pair(style, name, dep, inner_fallback=True)
    breaker = baldur.get_breaker(name)
    open_then_wait(breaker, clock)
    dep.ok = False
    assert run(style, outer) == "fallback"
    assert dep.calls == 1  # the trial reached the dependency
    assert breaker.state is baldur.CircuitState.OPEN
    assert events.transitions()[-1] == ("half_open", "open", "half_open_failure")
    assert [t for t in events.transitions() if t[1] == "closed"] == []


@pytest.mark.parametrize("style", STYLES)
def test_cb19_half_open_nested_success_closes_once(style, clock, events):
    """CB-19: HALF_OPEN with one slot and a healthy dependency: the nested call is the trial's
    one call; it answers, and the breaker closes exactly once."""
    name = f"nest-close-{style}"
    dep = Dependency()
    outer = pair(style, name, dep)
    breaker = baldur.get_breaker(name)
    open_then_wait(breaker, clock)
    assert run(style, outer) == "answer"
    assert dep.calls == 1
    assert breaker.state is baldur.CircuitState.CLOSED
    assert [t for t in events.transitions() if t[1] == "closed"] == [("half_open", "closed", "half_open_success")]


@pytest.mark.parametrize("style", STYLES)
def test_cb19_half_open_two_slots_one_nested_call_is_one_trial(style, clock):
    """CB-19, CB-6: with two trial slots a nested success is one trial success, not two: the
    breaker stays HALF_OPEN after it and closes only on a second, separate call."""
    name = f"nest-two-{style}"
    dep = Dependency()
    outer = pair(style, name, dep, half_open_max_calls=2)
    breaker = baldur.get_breaker(name)
    open_then_wait(breaker, clock)
    assert run(style, outer) == "answer"
    snap = breaker.snapshot()
    assert (snap["state"], snap["half_open_successes"], snap["half_open_trials"]) == ("half_open", 1, 1)
    assert run(style, outer) == "answer"
    assert breaker.state is baldur.CircuitState.CLOSED


def test_cb19_different_breakers_nest_normally(clock):
    """CB-19, CB-10: an inner call refused by a different, open breaker is a failure of the
    outer dependency like any exception."""

    @baldur.circuit_breaker("inner-dep", **OPTS)
    def inner():
        return "ok"

    baldur.force_open_circuit("inner-dep", ttl_minutes=5)
    with pytest.raises(baldur.CircuitOpenError):
        baldur.protect("outer-dep", lambda: inner(), failure_threshold=1)
    assert baldur.get_breaker("outer-dep").snapshot()["state"] == "open"


def test_cb19_separate_calls_in_one_context_each_count(clock):
    """CB-19: two calls one after the other in the same thread are two calls (the nesting
    mark of the first never swallows the second's outcome)."""
    dep = Dependency()

    @baldur.protected("nest-seq", fallback=lambda: "fallback", **OPTS)
    def call():
        return dep()

    dep.ok = False
    assert call() == "fallback"
    dep.ok = True
    assert call() == "answer"
    snap = baldur.get_breaker("nest-seq").snapshot()
    assert (snap["window_calls"], snap["window_failures"], snap["consecutive_failures"]) == (2, 1, 0)

"""CB-10: a breaker never records its own CircuitOpenError as a failure of the dependency.

A function protected by breaker X and called again through X (``protect("x", lambda:
decorated())``) nests two admissions on one breaker. In HALF_OPEN with one trial slot the
outer call takes the slot and the inner one is refused (``half_open_full``). The outer
trial never reached the dependency: it gives its slot back instead of reopening the
breaker, so the path can still close it.

(Regression test, found by running aiobreaker's suite against ours: the refusal was
recorded as a failed trial, so nested use could never close the breaker.)
"""

from __future__ import annotations

import asyncio

import pytest

import baldur_django as baldur

OPTS = {
    "failure_threshold": 1,
    "failure_rate_threshold": 0,
    "recovery_timeout": 5,
    "half_open_max_calls": 1,
    "sliding_window_size": 10,
    "minimum_calls": 1,
}


def test_cb10_nested_refusal_gives_the_trial_slot_back(clock, events):
    """CB-10, CB-6: the inner refusal reaches the caller unchanged; the breaker stays
    HALF_OPEN with its slot free; a direct call then closes it."""

    @baldur.circuit_breaker("nested", **OPTS)
    def inner():
        return "ok"

    breaker = baldur.get_breaker("nested")
    breaker.record_failure(breaker.acquire())
    clock.advance(5)
    with pytest.raises(baldur.CircuitOpenError) as refused:
        baldur.protect("nested", lambda: inner())
    assert refused.value.reason == "half_open_full" and refused.value.service == "nested"
    snap = breaker.snapshot()
    assert snap["state"] == "half_open" and snap["half_open_trials"] == 0
    assert [t[:2] for t in events.transitions()] == [("closed", "open"), ("open", "half_open")]
    assert inner() == "ok"
    assert breaker.state is baldur.CircuitState.CLOSED


def test_cb10_nested_refusal_async(clock):
    """CB-10: the same through the async forms."""

    @baldur.aprotected("nested-async", **OPTS)
    async def inner():
        return "ok"

    breaker = baldur.get_breaker("nested-async")
    breaker.record_failure(breaker.acquire())
    clock.advance(5)

    async def scenario():
        with pytest.raises(baldur.CircuitOpenError):
            await baldur.aprotect("nested-async", lambda: inner())
        assert breaker.snapshot()["state"] == "half_open"
        assert await inner() == "ok"

    asyncio.run(scenario())
    assert breaker.state is baldur.CircuitState.CLOSED


def test_cb10_another_breakers_refusal_still_counts(clock):
    """CB-10: only a breaker's *own* refusal is not a failure; an inner call refused by a
    different, open breaker is a failure of the outer dependency like any exception."""

    @baldur.circuit_breaker("inner-dep", **OPTS)
    def inner():
        return "ok"

    baldur.force_open_circuit("inner-dep", ttl_minutes=5)
    with pytest.raises(baldur.CircuitOpenError):
        baldur.protect("outer-dep", lambda: inner(), failure_threshold=1)
    assert baldur.get_breaker("outer-dep").snapshot()["state"] == "open"

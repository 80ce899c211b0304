"""CB-16: the recovery timeout backs off on repeated opens without a close in between.

The k-th consecutive automatic open lasts ``min(recovery_timeout * factor**(k-1), max)``;
a close resets k; a forced open leaves k alone; k is stored capped. Driven by a FakeClock.
"""

from __future__ import annotations

import dataclasses

import pytest

import baldur_django as baldur
from baldur_django.core.rules import next_open, open_duration

OPTS = {
    "failure_threshold": 1,
    "failure_rate_threshold": 0,
    "recovery_timeout": 10,
    "half_open_max_calls": 1,
    "sliding_window_size": 10,
    "minimum_calls": 1,
}


def _configure(breaker, **extra):
    breaker.reconfigure(dataclasses.replace(breaker.config, **OPTS, **extra))


@pytest.fixture
def backoff():
    return {"recovery_backoff_factor": 2.0, "recovery_timeout_max": 35.0}


def _fail_probe(breaker, clock, wait):
    clock.advance(wait)
    permit = breaker.acquire()
    assert permit.trial
    breaker.record_failure(permit)


def _retry_after(breaker):
    with pytest.raises(baldur.CircuitOpenError) as rejected:
        breaker.acquire()
    return rejected.value.retry_after


def test_cb16_open_duration_doubles_to_the_cap_and_a_close_resets(backoff, clock, events):
    """CB-16: 10 s, 20 s, 35 s (capped), 35 s; retry_after, the snapshot and the lazy
    recovery follow; a closing round resets to 10 s."""
    breaker = baldur.get_breaker("backoff")
    _configure(breaker, **backoff)
    breaker.record_failure(breaker.acquire())
    assert _retry_after(breaker) == pytest.approx(10)
    expected = [20, 35, 35]
    wait = 10
    for k, seconds in enumerate(expected, start=2):
        _fail_probe(breaker, clock, wait)
        snap = breaker.snapshot()
        assert snap["state"] == "open" and snap["open_duration"] == pytest.approx(seconds)
        assert snap["consecutive_opens"] == min(k, 3)  # stored capped at the first value reaching 35
        assert snap["open_until"] == pytest.approx(snap["opened_at"] + seconds)
        assert _retry_after(breaker) == pytest.approx(seconds)
        clock.advance(seconds - 0.001)
        assert breaker.state is baldur.CircuitState.OPEN
        wait = 0.001
    clock.advance(0.001)
    trial = breaker.acquire()
    breaker.record_success(trial)
    assert breaker.snapshot()["consecutive_opens"] == 0
    breaker.record_failure(breaker.acquire())
    assert _retry_after(breaker) == pytest.approx(10)


def test_cb16_forced_open_keeps_k_and_a_release_continues_from_it(backoff, clock):
    """CB-16, OP-3: a forced open changes nothing; the failed trial after the release is
    the next consecutive open (k from before the force); a forced close resets k."""
    breaker = baldur.get_breaker("backoff-force")
    _configure(breaker, **backoff)
    breaker.record_failure(breaker.acquire())
    _fail_probe(breaker, clock, 10)  # k = 2 (20 s)
    breaker.force_open(ttl_minutes=1)
    assert breaker.snapshot()["consecutive_opens"] == 2
    breaker.release()
    _fail_probe(breaker, clock, 0)
    snap = breaker.snapshot()
    assert snap["consecutive_opens"] == 3 and snap["open_duration"] == pytest.approx(35)
    breaker.force_close(ttl_minutes=1)
    assert breaker.snapshot()["consecutive_opens"] == 0


def test_cb16_factor_one_is_off_but_k_still_counts(clock):
    """CB-16: with the default factor 1.0 every open lasts the recovery timeout, and k still
    counts the consecutive opens (a close resets it)."""
    breaker = baldur.get_breaker("no-backoff")
    _configure(breaker)
    breaker.reconfigure(dataclasses.replace(breaker.config, recovery_timeout=900, recovery_timeout_max=1000))
    breaker.record_failure(breaker.acquire())
    for k in range(2, 5):
        _fail_probe(breaker, clock, 900)
        assert _retry_after(breaker) == pytest.approx(900)
        assert breaker.snapshot()["consecutive_opens"] == k


def test_cb16_huge_factor_never_overflows():
    """CB-16: k stops at the first value whose duration reaches the cap, so no power overflows."""
    k, seconds = 0, 0.0
    for _ in range(50):
        k, seconds = next_open(k, 1.0, 1e308, 100.0)
    assert (k, seconds) == (2, 100.0)
    assert open_duration(10_000, 1.0, 1e308, 100.0) == 100.0
    assert next_open(0, 5.0, 1.0, 5.0) == (1, 5.0)
    assert next_open(1, 5.0, 1.0, 5.0) == (1, 5.0)  # the duration already reaches the cap: k stays
    assert next_open(7, 5.0, 1.0) == (8, 5.0)  # no cap: k keeps counting

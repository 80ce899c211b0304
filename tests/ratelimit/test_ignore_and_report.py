"""RL-7 ignore_exceptions and 429s, RL-9 record_rate_limit."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import httpx
import pytest
import requests

import baldur_django as baldur
from baldur_django.core.testing import FakeClock

from .helpers import cascade_totals, drive_async
from .upstream import http_date, too_many

NO_BACKOFF = baldur.RetryPolicy(max_attempts=3, backoff_initial=0, jitter=0)


def _nothing_recorded(service):
    breaker = baldur.get_breaker(service)
    snap = breaker.snapshot()
    assert (snap["consecutive_failures"], snap["window_calls"], snap["window_failures"]) == (0, 0, 0)
    assert snap["state"] == "closed"
    assert cascade_totals(breaker) == (0, 0)
    assert breaker.cooldown_remaining() == 0.0


def _raising(session, upstream, seen):
    def call():
        response = session.get(upstream.endpoint(), timeout=5)
        seen.append(response)
        response.raise_for_status()
        return response

    return call


# ---------------------------------------------------------------------------- RL-7
STAGES_SYNC = [
    pytest.param("protected-def", False, id="protected-def-breaker-stage"),
    pytest.param("protected-def", NO_BACKOFF, id="protected-def-retry-stage"),
    pytest.param("protect", False, id="protect-breaker-stage"),
    pytest.param("protect", NO_BACKOFF, id="protect-retry-stage"),
    pytest.param("circuit_breaker-def", False, id="circuit_breaker-def-breaker-stage"),
]
STAGES_ASYNC = [
    pytest.param(style, retry, id=f"{style}-{'retry' if retry else 'breaker'}-stage")
    for style in ("protected-async", "aprotected", "aprotect")
    for retry in (False, NO_BACKOFF)
] + [pytest.param("circuit_breaker-async", False, id="circuit_breaker-async-breaker-stage")]


@pytest.mark.parametrize("style, retry", STAGES_SYNC)
def test_rl7_ignored_429_exception_sync(style, retry, upstream, session, clock, cascade_of_one):
    """RL-7, CB-10: a raised 429 whose type is in ignore_exceptions is re-raised unchanged,
    is not retried, records nothing, feeds no cascade and starts no cooldown, at the breaker
    stage and the retry stage."""
    upstream.script("429,200")
    seen: list = []
    call = _raising(session, upstream, seen)
    options = {"ignore_exceptions": (requests.HTTPError,)}
    if retry:
        options["retry"] = retry
    with pytest.raises(requests.HTTPError) as info:
        if style == "protect":
            baldur.protect("svc", call, **options)
        elif style == "protected-def":
            baldur.protected("svc", **options)(call)()
        else:
            baldur.circuit_breaker("svc", **options)(call)()
    assert info.value.response is seen[0]
    assert upstream.hits == 1
    assert clock.sleeps == []
    _nothing_recorded("svc")


@pytest.mark.parametrize("style, retry", STAGES_ASYNC)
def test_rl7_ignored_429_exception_async(style, retry, upstream, clock, cascade_of_one):
    """RL-7: the same in every async form with httpx.HTTPStatusError ignored."""
    upstream.script("429,200")
    options = {"ignore_exceptions": (httpx.HTTPStatusError,)}
    if retry:
        options["retry"] = retry

    async def main():
        async with httpx.AsyncClient(timeout=5) as client:

            async def acall():
                response = await client.get(upstream.endpoint())
                response.raise_for_status()
                return response

            with pytest.raises(httpx.HTTPStatusError):
                await drive_async(style, "svc", acall, **options)

    asyncio.run(main())
    assert upstream.hits == 1
    _nothing_recorded("svc")


class QuotaRateLimitError(LookupError):
    """A 429 by its type name, and a LookupError by inheritance."""


@pytest.mark.parametrize("retry", [False, NO_BACKOFF], ids=["breaker-stage", "retry-stage"])
def test_rl7_ignore_matches_subclasses(retry, clock, cascade_of_one):
    """RL-7, CB-10: ignore_exceptions=(LookupError,) also removes a RateLimit-named subclass."""
    attempts = []

    def call():
        attempts.append(1)
        raise QuotaRateLimitError("429 Too Many Requests")

    with pytest.raises(QuotaRateLimitError):
        baldur.protect("svc", call, retry=retry, ignore_exceptions=(LookupError,))
    assert attempts == [1]
    _nothing_recorded("svc")


def test_rl7_non_matching_429_exception_still_counts(upstream, session, clock, cascade_of_one):
    """RL-7: an ignore list that does not match leaves the 429 counted and in the cascade."""
    upstream.script(too_many("4"))
    with pytest.raises(requests.HTTPError):
        baldur.protect("svc", _raising(session, upstream, []), ignore_exceptions=(KeyError,))
    snap = baldur.get_breaker("svc").snapshot()
    assert snap["consecutive_failures"] == 1 and snap["last_trigger"] == "rate_limit_cascade"
    assert baldur.get_breaker("svc").cooldown_remaining() == 4.0


@pytest.mark.parametrize("retry", [False, NO_BACKOFF], ids=["breaker-stage", "retry-stage"])
def test_rl7_returned_429_always_counted(retry, upstream, session, clock):
    """RL-7: ignore_exceptions=(Exception,) cannot hide a returned 429 response: it is a
    failure and a sighting (and under retry it is retried)."""
    upstream.script(too_many("0"))
    result = baldur.protect(
        "svc", lambda: session.get(upstream.endpoint(), timeout=5), retry=retry, ignore_exceptions=(Exception,)
    )
    assert result.status_code == 429
    attempts = 3 if retry else 1
    assert upstream.hits == attempts
    breaker = baldur.get_breaker("svc")
    assert breaker.snapshot()["consecutive_failures"] == 1
    assert cascade_totals(breaker) == (attempts, attempts)


def test_rl7_returned_429_always_counted_async(upstream, clock, cascade_of_one):
    """RL-7: the same for an async call returning an httpx 429 response."""
    upstream.script(too_many("6"))

    async def main():
        async with httpx.AsyncClient(timeout=5) as client:
            return await baldur.aprotect("svc", lambda: client.get(upstream.endpoint()), ignore_exceptions=(Exception,))

    assert asyncio.run(main()).status_code == 429
    snap = baldur.get_breaker("svc").snapshot()
    assert snap["state"] == "open" and snap["last_trigger"] == "rate_limit_cascade"
    assert baldur.get_breaker("svc").cooldown_remaining() == 6.0


def test_rl7_ignored_storm_never_opens(clock):
    """RL-7, RL-3: a storm made only of ignored 429 exceptions never reaches the cascade."""

    class TooManyRequestsError(Exception):
        pass

    @baldur.protected("svc", ignore_exceptions=(TooManyRequestsError,))
    def call(fail):
        if fail:
            raise TooManyRequestsError("429")
        return "ok"

    for n in range(60):
        try:
            call(n % 2 == 0)
        except TooManyRequestsError:
            pass
    breaker = baldur.get_breaker("svc")
    assert breaker.state is baldur.CircuitState.CLOSED
    assert cascade_totals(breaker)[1] == 0
    assert breaker.snapshot()["window_failures"] == 0


# ---------------------------------------------------------------------------- RL-9
def test_rl9_record_rate_limit_seconds(clock):
    """RL-9: record_rate_limit(service, retry_after=30) is a failure, a sighting counted as
    a call, and a 30-s cooldown."""
    baldur.record_rate_limit("payments", retry_after=30)
    breaker = baldur.get_breaker("payments")
    snap = breaker.snapshot()
    assert (snap["consecutive_failures"], snap["window_calls"], snap["window_failures"]) == (1, 1, 1)
    assert cascade_totals(breaker) == (1, 1)
    assert breaker.cooldown_remaining() == 30.0


@pytest.mark.parametrize(
    "retry_after, expected",
    [
        (None, 1.0),
        (0.25, 0.25),
        ("45", 45.0),
        ("later", 1.0),
        (-3, 1.0),
        (True, 1.0),
        (10**9, 3600.0),
        ("Wed, 21 Oct 2015 07:28:00 GMT", 1.0),  # in the past of the fake 2023 wall clock
    ],
)
def test_rl9_retry_after_forms(retry_after, expected, clock):
    """RL-9, RL-2: numbers and header strings; absent/invalid/negative/past use the default,
    huge values are capped."""
    baldur.record_rate_limit("payments", retry_after=retry_after)
    assert baldur.get_breaker("payments").cooldown_remaining() == pytest.approx(expected)


def test_rl9_http_date_relative_to_wall_clock(fresh_registry):
    """RL-9, RL-2: 'Wed, 21 Oct 2015 07:28:00 GMT' read at 07:27:00 that day is 60 s."""
    wall = datetime(2015, 10, 21, 7, 27, 0, tzinfo=UTC).timestamp()
    fresh_registry.clock = FakeClock(wall=wall)
    baldur.record_rate_limit("payments", retry_after="Wed, 21 Oct 2015 07:28:00 GMT")
    assert baldur.get_breaker("payments").cooldown_remaining() == pytest.approx(60.0)


def test_rl9_header_from_a_real_response(upstream, session, clock):
    """RL-9: a 429 seen outside any protected call (here a plain requests call) is reported
    with its HTTP-date Retry-After; a later retry-enabled call waits it out."""
    upstream.script(too_many(http_date(clock.wall() + 20)), "200")
    response = session.get(upstream.endpoint(), timeout=5)
    assert response.status_code == 429
    baldur.record_rate_limit("payments", retry_after=response.headers["Retry-After"])
    assert baldur.get_breaker("payments").cooldown_remaining() == pytest.approx(20.0)
    result = baldur.protect("payments", lambda: session.get(upstream.endpoint(), timeout=5), retry=NO_BACKOFF)
    assert result.status_code == 200
    assert clock.sleeps == [20.0]


def test_rl9_reports_count_as_calls_in_cascade(clock, env, events):
    """RL-9: each report is a call as well as a sighting: with threshold 2, min calls 2 and
    ratio 100 %, two reports alone open the breaker through the cascade."""
    env(
        BALDUR_CB_RATE_LIMIT_CASCADE_THRESHOLD=2,
        BALDUR_CB_RATE_LIMIT_CASCADE_MIN_CALLS=2,
        BALDUR_CB_RATE_LIMIT_CASCADE_MIN_RATIO=100,
    )
    baldur.record_rate_limit("payments")
    assert baldur.get_breaker("payments").state is baldur.CircuitState.CLOSED
    baldur.record_rate_limit("payments")
    assert events.transitions() == [("closed", "open", "rate_limit_cascade")]


def test_rl9_reports_reach_consecutive_threshold(clock, events):
    """RL-9: reports are breaker failures: five in a row open by the consecutive trigger."""
    for _ in range(5):
        baldur.record_rate_limit("payments")
    assert events.transitions() == [("closed", "open", "consecutive_failures")]


def test_rl9_in_half_open_is_a_failed_probe(clock, events):
    """RL-9, CB-6: in HALF_OPEN a report reopens the breaker (half_open_failure); in OPEN it
    only extends the cooldown."""
    baldur.force_open_circuit("payments", ttl_minutes=1)
    baldur.release_circuit("payments")
    breaker = baldur.get_breaker("payments")
    assert breaker.state is baldur.CircuitState.HALF_OPEN
    baldur.record_rate_limit("payments", retry_after=10)
    assert breaker.state is baldur.CircuitState.OPEN
    assert events.transitions()[-1][2] == "half_open_failure"
    before = len(events.transitions())
    baldur.record_rate_limit("payments", retry_after=40)
    assert breaker.state is baldur.CircuitState.OPEN
    assert len(events.transitions()) == before
    assert breaker.cooldown_remaining() == 40.0


def test_rl9_bad_service_name(clock):
    """RL-9, CB-12: an empty service name is a ConfigError naming the problem."""
    with pytest.raises(baldur.ConfigError, match="non-empty"):
        baldur.record_rate_limit("", retry_after=5)

"""RL-1 / RL-8: a 429 is recognised in every call style, from raised HTTP errors, returned
responses, exception type names and exception messages; overlapping status lists."""

from __future__ import annotations

import asyncio

import httpx
import pytest
import requests

import baldur_django as baldur
from baldur_django.core.classify import exception_is_rate_limit

from .helpers import (
    ASYNC_STYLES,
    SYNC_STYLES,
    cascade_totals,
    drive_async,
    raised_type,
    run_async_style,
    run_sync_style,
    sync_call,
)
from .upstream import too_many, unavailable

SYNC_KINDS = ("requests-raise", "requests-return", "httpx-raise", "httpx-return")
ASYNC_KINDS = ("httpx-raise", "httpx-return")


def _assert_sighting(service: str, upstream, cooldown: float) -> None:
    """One 429 reached the breaker stage: a failure, a cascade feed (the cascade-of-one
    settings open the breaker), the cooldown from Retry-After, one request upstream."""
    snap = baldur.get_breaker(service).snapshot()
    assert upstream.hits == 1
    assert snap["consecutive_failures"] == 1
    assert snap["window_failures"] == 1
    assert snap["state"] == "open"
    assert snap["last_trigger"] == "rate_limit_cascade"
    assert baldur.get_breaker(service).cooldown_remaining() == pytest.approx(cooldown)


# --------------------------------------------------------------- every call style
@pytest.mark.parametrize("kind", SYNC_KINDS)
@pytest.mark.parametrize("style", SYNC_STYLES)
def test_rl1_sync_styles_recognise_429(style, kind, upstream, session, client, clock, cascade_of_one):
    """RL-1, RL-2: protected(def) / protect / circuit_breaker(def) recognise a 429 from real
    requests and httpx, raised (HTTPError / HTTPStatusError) or returned (never raised)."""
    upstream.script(too_many("7"))
    seen: list = []
    call = sync_call(kind, upstream.endpoint(), session, client, seen)
    if kind.endswith("raise"):
        with pytest.raises(raised_type(kind)) as info:
            run_sync_style(style, "payments", call)
        assert info.value.response is seen[0]
        assert info.value.response.status_code == 429
    else:
        result = run_sync_style(style, "payments", call)
        assert result is seen[0]  # returned unchanged
        assert result.status_code == 429
        assert result.headers["Retry-After"] == "7"
    _assert_sighting("payments", upstream, 7.0)


@pytest.mark.parametrize("kind", ASYNC_KINDS)
@pytest.mark.parametrize("style", ASYNC_STYLES)
def test_rl1_async_styles_recognise_429(style, kind, upstream, clock, cascade_of_one):
    """RL-1, RL-2: protected(async def) / aprotected / aprotect / circuit_breaker(async def)
    recognise a 429 from a real httpx.AsyncClient, raised or returned."""
    upstream.script(too_many("7"))
    seen: list = []
    if kind == "httpx-raise":
        with pytest.raises(httpx.HTTPStatusError) as info:
            run_async_style(style, "payments", kind, upstream.endpoint(), seen)
        assert info.value.response is seen[0]
    else:
        result = run_async_style(style, "payments", kind, upstream.endpoint(), seen)
        assert result is seen[0]
        assert result.status_code == 429
    _assert_sighting("payments", upstream, 7.0)


@pytest.mark.parametrize("style", SYNC_STYLES)
def test_rl1_503_is_a_failure_but_not_a_sighting(style, upstream, session, client, clock, cascade_of_one):
    """RL-1 (negative), CB-11: a 503 (on the failure list only) is a failure, starts no
    cooldown and does not feed the cascade."""
    upstream.script(unavailable("30"))
    seen: list = []
    result = run_sync_style(style, "payments", sync_call("requests-return", upstream.endpoint(), session, client, seen))
    assert result.status_code == 503
    snap = baldur.get_breaker("payments").snapshot()
    assert snap["consecutive_failures"] == 1
    assert snap["state"] == "closed"
    assert baldur.get_breaker("payments").cooldown_remaining() == 0.0
    assert cascade_totals(baldur.get_breaker("payments")) == (1, 0)


@pytest.mark.parametrize("style", ASYNC_STYLES)
def test_rl1_async_200_is_a_success(style, upstream, clock, cascade_of_one):
    """RL-1 (negative): a 200 through every async style is a success, no sighting."""
    upstream.script("200")
    seen: list = []
    result = run_async_style(style, "payments", "httpx-raise", upstream.endpoint(), seen)
    assert result.status_code == 200
    snap = baldur.get_breaker("payments").snapshot()
    assert (snap["consecutive_failures"], snap["window_calls"], snap["window_failures"]) == (0, 1, 0)
    assert baldur.get_breaker("payments").cooldown_remaining() == 0.0


# ------------------------------------------------------ type names and message text
class RateLimitExceeded(Exception):
    pass


class TooManyRequestsError(Exception):
    pass


class ApiRATELIMITError(Exception):
    pass


class toomanyrequests(Exception):  # noqa: N801 - the lower-case name is the point
    pass


class QuotaRateLimitedError(RateLimitExceeded):  # a subclass of a matching type
    pass


class UpstreamError(Exception):
    pass


POSITIVE = [
    pytest.param(RateLimitExceeded("quota"), id="type-RateLimit"),
    pytest.param(TooManyRequestsError("nope"), id="type-TooManyRequests"),
    pytest.param(ApiRATELIMITError("x"), id="type-upper-case"),
    pytest.param(toomanyrequests("x"), id="type-lower-case"),
    pytest.param(QuotaRateLimitedError("x"), id="type-subclass"),
    pytest.param(UpstreamError("HTTP 429"), id="text-429-end"),
    pytest.param(UpstreamError("429 from upstream"), id="text-429-start"),
    pytest.param(UpstreamError("status=429; retry later"), id="text-429-punct"),
    pytest.param(UpstreamError("got a 429."), id="text-429-full-stop"),
    pytest.param(UpstreamError("Rate limit exceeded"), id="text-rate-limit"),
    pytest.param(UpstreamError("you hit the RATE LIMIT"), id="text-RATE-LIMIT"),
    pytest.param(UpstreamError("Too Many Requests"), id="text-too-many-requests"),
    pytest.param(UpstreamError("too many requests, slow down"), id="text-lower"),
]

NEGATIVE = [
    pytest.param(UpstreamError("code 4290"), id="text-4290"),
    pytest.param(UpstreamError("order 1429 failed"), id="text-1429"),
    pytest.param(UpstreamError("id 14290"), id="text-14290"),
    pytest.param(UpstreamError("took 0.429 s"), id="text-decimal-0.429"),
    pytest.param(UpstreamError("ratio 429.5"), id="text-decimal-429.5"),
    pytest.param(UpstreamError("internal server error"), id="text-plain"),
    pytest.param(UpstreamError("too many connections"), id="text-near-miss"),
    pytest.param(ValueError("bad value"), id="type-plain"),
]


@pytest.mark.parametrize("exc", POSITIVE)
def test_rl1_classifier_recognises(exc):
    """RL-1: type names containing RateLimit/TooManyRequests (any case) and messages with a
    whole-number 429, 'rate limit' or 'too many requests' are 429 sightings."""
    assert exception_is_rate_limit(exc, frozenset({429})) is True


@pytest.mark.parametrize("exc", NEGATIVE)
def test_rl1_classifier_rejects(exc):
    """RL-1: 429 inside a longer number (4290, 1429, 0.429, 429.5) and unrelated text are not."""
    assert exception_is_rate_limit(exc, frozenset({429})) is False


@pytest.mark.parametrize("exc", POSITIVE + NEGATIVE)
def test_rl1_raised_exception_through_breaker(exc, clock):
    """RL-1, RL-2: through circuit_breaker(def), every counted exception is a failure; only
    recognised 429s start the default cooldown."""

    @baldur.circuit_breaker("svc")
    def call():
        raise exc

    with pytest.raises(type(exc)):
        call()
    breaker = baldur.get_breaker("svc")
    assert breaker.snapshot()["consecutive_failures"] == 1
    expected = 1.0 if exception_is_rate_limit(exc, frozenset({429})) else 0.0
    assert breaker.cooldown_remaining() == expected


@pytest.mark.parametrize("style", ASYNC_STYLES)
def test_rl1_async_exception_text(style, clock):
    """RL-1: an async call raising 'Too Many Requests' text is a sighting in every async style."""

    async def acall():
        raise UpstreamError("upstream said: Too Many Requests")

    async def main():
        with pytest.raises(UpstreamError):
            await drive_async(style, "svc", acall)

    asyncio.run(main())
    assert baldur.get_breaker("svc").cooldown_remaining() == 1.0


def test_rl1_exception_with_retry_after_attribute(clock):
    """RL-1, RL-2: an SDK-style exception carrying ``retry_after`` sets the cooldown from it."""

    class SdkRateLimitError(Exception):
        def __init__(self):
            super().__init__("slow down")
            self.retry_after = 12

    with pytest.raises(SdkRateLimitError):
        baldur.protect("svc", lambda: (_ for _ in ()).throw(SdkRateLimitError()))
    assert baldur.get_breaker("svc").cooldown_remaining() == 12.0


def test_rl1_status_on_exception_response_counts_not_only_text(upstream, session, clock, env):
    """RL-1: an HTTPError whose response status is on the rate-limit list is a sighting even
    when neither its type name nor its text says so (custom list [418])."""
    env(BALDUR_MIDDLEWARE_RATE_LIMIT_CODES="[418]")
    upstream.script("418")

    def call():
        response = session.get(upstream.endpoint(), timeout=5)
        error = requests.HTTPError("teapot", response=response)
        raise error

    with pytest.raises(requests.HTTPError):
        baldur.protect("svc", call)
    assert baldur.get_breaker("svc").cooldown_remaining() == 1.0


# ------------------------------------------------------------------------- RL-8
@pytest.mark.parametrize("kind", SYNC_KINDS)
def test_rl8_status_on_both_lists_fails_and_feeds_cascade(kind, upstream, session, client, clock, env):
    """RL-8: with 503 on both lists, a 503 records a failure, starts the cooldown from its
    Retry-After and feeds the cascade (cascade-of-one settings open the breaker)."""
    env(
        BALDUR_MIDDLEWARE_CB_STATUS_CODES="[500,503]",
        BALDUR_MIDDLEWARE_RATE_LIMIT_CODES="[429,503]",
        BALDUR_CB_RATE_LIMIT_CASCADE_THRESHOLD=1,
        BALDUR_CB_RATE_LIMIT_CASCADE_MIN_CALLS=1,
    )
    upstream.script(unavailable("9"))
    seen: list = []
    call = sync_call(kind, upstream.endpoint(), session, client, seen)
    if kind.endswith("raise"):
        with pytest.raises(raised_type(kind)):
            baldur.protect("svc", call)
    else:
        assert baldur.protect("svc", call) is seen[0]
    snap = baldur.get_breaker("svc").snapshot()
    assert snap["consecutive_failures"] == 1
    assert snap["state"] == "open" and snap["last_trigger"] == "rate_limit_cascade"
    assert baldur.get_breaker("svc").cooldown_remaining() == 9.0


def test_rl8_failure_only_and_rate_limit_only_statuses(upstream, session, clock, env):
    """RL-8: with lists [500,503] / [429,503], a 500 is a failure without sighting and a 429
    is a failure with sighting; 2 sightings among 3 calls."""
    env(BALDUR_MIDDLEWARE_CB_STATUS_CODES="[500,503]", BALDUR_MIDDLEWARE_RATE_LIMIT_CODES="[429,503]")
    upstream.script("500,429,503")
    breaker = baldur.get_breaker("svc")
    first = baldur.protect("svc", lambda: session.get(upstream.endpoint(), timeout=5))
    assert first.status_code == 500 and breaker.cooldown_remaining() == 0.0
    for _ in range(2):
        baldur.protect("svc", lambda: session.get(upstream.endpoint(), timeout=5))
    assert breaker.snapshot()["consecutive_failures"] == 3
    assert cascade_totals(breaker) == (3, 2)
    assert breaker.cooldown_remaining() == 1.0


def test_rl8_overlap_under_retry_feeds_cascade_per_attempt(upstream, session, clock, env):
    """RL-8, RL-5: a 503 on both lists under retry is a sighting for that attempt; the call
    then succeeds and the breaker records one success."""
    env(BALDUR_MIDDLEWARE_CB_STATUS_CODES="[500,503]", BALDUR_MIDDLEWARE_RATE_LIMIT_CODES="[429,503]")
    upstream.script(unavailable("2"), "200")
    policy = baldur.RetryPolicy(max_attempts=3, backoff_initial=0, jitter=0)
    result = baldur.protect("svc", lambda: session.get(upstream.endpoint(), timeout=5), retry=policy)
    assert result.status_code == 200
    breaker = baldur.get_breaker("svc")
    assert cascade_totals(breaker) == (2, 1)
    assert clock.sleeps == [2.0]
    snap = breaker.snapshot()
    assert (snap["consecutive_failures"], snap["window_calls"], snap["window_failures"]) == (0, 1, 0)

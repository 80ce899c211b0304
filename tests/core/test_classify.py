"""Outcome classification (pure functions): CB-10, CB-11, RL-1, RL-2 (Retry-After), RL-8."""

from __future__ import annotations

import email.utils
from http import HTTPStatus

import httpx
import pytest
import requests

from baldur_django.core.classify import (
    FAILURE,
    RATE_LIMITED,
    SUCCESS,
    classify_status,
    exception_is_rate_limit,
    exception_status,
    parse_retry_after,
    retry_after_of,
    status_of,
)

FAILURES = frozenset({500, 502, 503, 504})
LIMITS = frozenset({429})
NOW = 1_700_000_000.0


class Obj:
    def __init__(self, **attrs):
        self.__dict__.update(attrs)


# ------------------------------------------------------------------ status_of


@pytest.mark.parametrize(
    "value,expected",
    [
        (Obj(status_code=503), 503),
        (Obj(status=500), 500),
        (Obj(status_code=HTTPStatus.TOO_MANY_REQUESTS), 429),
        (Obj(status_code=None, status=502), 502),
        (Obj(status_code=404, status=500), 404),  # status_code wins
        (Obj(status_code="503"), None),
        (Obj(status_code=True), None),
        (Obj(status_code=503.0), None),
        (Obj(), None),
        (503, None),
        ("503", None),
        ({"status_code": 503}, None),
        (None, None),
    ],
)
def test_cb11_status_of_reads_integer_status_code_then_status(value, expected):
    """CB-11: status_of reads an integer status_code, else status; anything else is no status."""
    assert status_of(value) == expected


def test_cb11_status_of_survives_a_raising_property():
    """CB-11: a status property that raises reads as no status (the call's value is not turned into an error)."""

    class Lazy:
        @property
        def status_code(self):
            raise RuntimeError("not read yet")

    assert status_of(Lazy()) is None


def test_cb11_status_of_real_client_responses():
    """CB-11: requests and httpx response objects are read by their status_code."""
    r = requests.models.Response()
    r.status_code = 502
    assert status_of(r) == 502
    assert status_of(httpx.Response(504)) == 504


# ------------------------------------------------------------- classify_status


@pytest.mark.parametrize(
    "code,expected",
    [
        (None, SUCCESS),
        (200, SUCCESS),
        (404, SUCCESS),
        (500, FAILURE),
        (504, FAILURE),
        (429, RATE_LIMITED),
        (501, SUCCESS),
    ],
)
def test_cb11_classify_status_against_the_two_lists(code, expected):
    """CB-11/CB-3: a status on the failure list fails, on the rate-limit list is a 429 sighting, else success."""
    assert classify_status(code, FAILURES, LIMITS) == expected


def test_rl8_lists_may_overlap():
    """RL-8: a status on both lists is a failure that also feeds the cascade (RATE_LIMITED)."""
    assert classify_status(503, FAILURES, frozenset({429, 503})) == RATE_LIMITED


# ------------------------------------------------------- exception_is_rate_limit


class RateLimitError(Exception):
    pass


class TooManyRequestsException(Exception):
    pass


class ApiRatelimitExceeded(RateLimitError):
    pass


@pytest.mark.parametrize(
    "exc",
    [
        RateLimitError("x"),
        TooManyRequestsException("x"),
        ApiRatelimitExceeded("subclass of a RateLimit type"),
        Exception("HTTP 429"),
        Exception("got a 429."),
        Exception("status=429, retry later"),
        Exception("Rate limit exceeded"),
        Exception("RATE-LIMIT hit"),
        Exception("Too Many Requests"),
    ],
    ids=repr,
)
def test_rl1_rate_limit_exceptions_are_recognised(exc):
    """RL-1: type names and messages that say 429 / rate limit / too many requests."""
    assert exception_is_rate_limit(exc, LIMITS)


@pytest.mark.parametrize(
    "exc",
    [
        Exception("error 4290"),
        Exception("id 14291"),
        Exception("took 0.429 seconds"),
        Exception("version 429.1"),
        ConnectionError("connection refused"),
        ValueError("rate of 5 per limit"),
    ],
    ids=repr,
)
def test_rl1_look_alikes_are_not_rate_limits(exc):
    """RL-1: 429 must be a whole number; unrelated messages are not rate limits."""
    assert not exception_is_rate_limit(exc, LIMITS)


def test_rl1_exception_carrying_a_429_response():
    """RL-1: requests HTTPError and httpx HTTPStatusError carrying a 429 response are rate limits;
    a 500 is not."""
    r429 = requests.models.Response()
    r429.status_code = 429
    assert exception_is_rate_limit(requests.HTTPError("boom", response=r429), LIMITS)
    request = httpx.Request("GET", "https://example.test/")
    err = httpx.HTTPStatusError("boom", request=request, response=httpx.Response(429, request=request))
    assert exception_is_rate_limit(err, LIMITS)
    assert exception_status(err) == 429
    err500 = httpx.HTTPStatusError("boom", request=request, response=httpx.Response(500, request=request))
    assert not exception_is_rate_limit(err500, LIMITS)


def test_rl1_unprintable_exception_is_not_an_error():
    """RL-1: an exception whose str() raises is simply not a rate limit."""

    class Unprintable(Exception):
        def __str__(self):
            raise RuntimeError("no")

    assert exception_is_rate_limit(Unprintable(), LIMITS) is False


# ---------------------------------------------------------------- Retry-After


@pytest.mark.parametrize(
    "value,expected",
    [
        (None, 1.0),
        (30, 30.0),
        (2.5, 2.5),
        ("120", 120.0),
        (" 0.5 ", 0.5),
        (b"7", 7.0),
        ("0", 0.0),
        (-5, 1.0),
        ("-5", 1.0),
        ("soon", 1.0),
        ("nan", 1.0),
        ("inf", 1.0),
        (True, 1.0),
        (99999, 3600.0),
    ],
    ids=repr,
)
def test_rl2_parse_retry_after_seconds(value, expected):
    """RL-2: delta-seconds (number or text); absent, invalid, negative -> default; capped."""
    assert parse_retry_after(value, default=1.0, cap=3600.0, now_wall=NOW) == pytest.approx(expected)


def test_rl2_parse_retry_after_http_date():
    """RL-2: an HTTP-date gives the seconds from now; a date in the past falls back to the default."""
    future = email.utils.formatdate(NOW + 90, usegmt=True)
    past = email.utils.formatdate(NOW - 90, usegmt=True)
    assert parse_retry_after(future, default=1.0, cap=3600.0, now_wall=NOW) == pytest.approx(90, abs=1)
    assert parse_retry_after(past, default=1.0, cap=3600.0, now_wall=NOW) == 1.0
    far = email.utils.formatdate(NOW + 86400, usegmt=True)
    assert parse_retry_after(far, default=1.0, cap=600.0, now_wall=NOW) == 600.0


def test_rl2_retry_after_of_responses_and_exceptions():
    """RL-2: Retry-After is read from a response's headers, an exception's response, or a retry_after attribute."""
    response = httpx.Response(429, headers={"Retry-After": "12"})
    assert retry_after_of(response) == "12"
    request = httpx.Request("GET", "https://example.test/")
    err = httpx.HTTPStatusError(
        "x", request=request, response=httpx.Response(429, headers={"retry-after": "3"}, request=request)
    )
    assert retry_after_of(err) == "3"
    sdk_error = RateLimitError("slow down")
    sdk_error.retry_after = 4.5
    assert retry_after_of(sdk_error) == 4.5
    assert retry_after_of(Obj(status_code=429)) is None
    assert retry_after_of(ConnectionError()) is None

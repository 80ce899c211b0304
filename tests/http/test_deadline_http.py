"""RS-2 for the HTTP adapters, against the real local server and the fake clock.

Issue 28's case: ``BreakerAdapter(retry=RetryPolicy(max_attempts=3, backoff_initial=0.1))``
against a 429 with ``Retry-After: 20`` under a 5 s request deadline must not hold the
request past 5 s. Waits go through the breakers' fake clock, so "how long the request was
held" is the sum of the waits (no real sleep).
"""

from __future__ import annotations

import asyncio

import httpx
import pytest
import requests
from django.test import RequestFactory
from requests.adapters import HTTPAdapter

import baldur_django as baldur
from baldur_django import RateLimitCooldownError, RetryPolicy
from baldur_django.contrib.httpx import AsyncBreakerTransport, BreakerTransport
from baldur_django.contrib.outbound import clipped_timeout, sequence_bound
from baldur_django.contrib.requests import BreakerAdapter
from baldur_django.middleware import RequestDeadlineMiddleware

ISSUE_POLICY = RetryPolicy(max_attempts=3, backoff_initial=0.1)


class RecordingAdapter(HTTPAdapter):
    """requests' own adapter, remembering the timeout of each send."""

    def __init__(self) -> None:
        super().__init__()
        self.timeouts: list[object] = []

    def send(self, request, stream=False, timeout=None, verify=True, cert=None, proxies=None):  # type: ignore[override]
        self.timeouts.append(timeout)
        return super().send(request, stream=stream, timeout=timeout, verify=verify, cert=cert, proxies=proxies)


def session_with(adapter: BreakerAdapter) -> requests.Session:
    session = requests.Session()
    session.mount("http://", adapter)
    return session


def through_middleware(settings, clock, view):
    """Run *view* as a request served by RequestDeadlineMiddleware with a 5 s deadline."""
    settings.BALDUR_REQUEST_DEADLINE_SECONDS = 5
    middleware = RequestDeadlineMiddleware(lambda request: view(), clock=clock)
    return middleware(RequestFactory().get("/"))


def test_rs2_issue_429_requests_adapter_never_holds_the_request_past_its_deadline(server, clock, settings):
    """RS-2 (issue 28): requests + 429 Retry-After: 20 under a 5 s request deadline: the
    retry stage does not wait out the 20 s; the request ends within its 5 s."""
    session = session_with(BreakerAdapter(retry=ISSUE_POLICY))
    start = clock.monotonic()

    def view():
        with pytest.raises(RateLimitCooldownError):
            session.get(server.url("/429?retry_after=20"))
        return "done"

    assert through_middleware(settings, clock, view) == "done"
    assert sum(clock.sleeps) <= 5 and clock.monotonic() - start <= 5
    assert server.count("/429") == 1


def test_rs2_issue_429_httpx_transport_never_holds_the_request_past_its_deadline(server, clock, settings):
    """RS-2 (issue 28): the same for httpx's BreakerTransport."""
    client = httpx.Client(transport=BreakerTransport(retry=ISSUE_POLICY))
    start = clock.monotonic()

    def view():
        with pytest.raises(RateLimitCooldownError):
            client.get(server.url("/429?retry_after=20"))
        return "done"

    assert through_middleware(settings, clock, view) == "done"
    assert sum(clock.sleeps) <= 5 and clock.monotonic() - start <= 5
    assert server.count("/429") == 1


def test_rs2_issue_429_async_httpx_transport_never_holds_the_request_past_its_deadline(server, clock):
    """RS-2 (issue 28): the same for AsyncBreakerTransport under ``async with baldur.deadline(5)``."""

    async def main() -> None:
        transport = AsyncBreakerTransport(retry=ISSUE_POLICY)
        async with httpx.AsyncClient(transport=transport) as client, baldur.deadline(5, clock=clock):
            try:
                await client.get(server.url("/429?retry_after=20"))
            except RateLimitCooldownError:
                refused.append(True)

    refused: list[bool] = []
    start = clock.monotonic()
    asyncio.run(main())
    assert refused == [True]
    assert sum(clock.sleeps) <= 5 and clock.monotonic() - start <= 5


def test_rs2_without_a_deadline_the_retry_sequence_ends_within_the_request_timeout(server, clock):
    """RS-2: with no deadline at all, a retry sequence never runs longer than the request's own
    timeout (the read timeout of a (connect, read) pair)."""
    session = session_with(BreakerAdapter(retry=ISSUE_POLICY))
    with pytest.raises(RateLimitCooldownError):
        session.get(server.url("/429?retry_after=20"), timeout=(1, 3))
    assert sum(clock.sleeps) <= 3
    client = httpx.Client(transport=BreakerTransport(retry=ISSUE_POLICY))
    clock.sleeps.clear()
    clock.advance(60)  # the first cooldown is over
    with pytest.raises(RateLimitCooldownError):
        client.get(server.url("/429?retry_after=20"), timeout=3)
    assert sum(clock.sleeps) <= 3


def test_rs2_adapter_passes_the_smaller_of_its_timeout_and_the_time_left(server, clock):
    """RS-2: each attempt's transport timeout is min(own timeout, time left)."""
    recording = RecordingAdapter()
    session = session_with(BreakerAdapter(adapter=recording))
    session.get(server.url("/ok"), timeout=10)
    with baldur.deadline(4, clock=clock):
        session.get(server.url("/ok"), timeout=10)
        session.get(server.url("/ok"), timeout=(2, 10))
        session.get(server.url("/ok"), timeout=1)
        session.get(server.url("/ok"))
    assert recording.timeouts == [10, 4, (2, 4), 1, 4]


def test_rs2_timeout_helpers():
    """RS-2: the sequence bound reads a total, the read part of a pair, httpx's read entry."""
    assert sequence_bound(3) == 3.0 and sequence_bound((1, 7)) == 7.0
    assert sequence_bound({"connect": 1, "read": 6, "write": 2, "pool": 1}) == 6.0
    assert sequence_bound(None) is None and sequence_bound((1, None)) is None
    assert clipped_timeout(5) == 5  # no deadline: unchanged
    with baldur.deadline(2):
        assert clipped_timeout({"connect": 5, "read": None})["read"] <= 2

"""CB-19, FAC-2, HC-3: an outbound client's breaker used inside a retrying call through the
same breaker counts the outer call's final outcome once, against a real local server."""

from __future__ import annotations

import asyncio

import httpx
import pytest
import requests

import baldur_django as baldur
from baldur_django.contrib.httpx import AsyncBreakerTransport
from baldur_django.contrib.requests import BreakerAdapter

FAST_RETRY = baldur.RetryPolicy(max_attempts=3, backoff_initial=0, jitter=0)


def counts(name):
    breaker = baldur.get_breaker(name)
    snap = breaker.snapshot()
    return snap["consecutive_failures"], snap["window_failures"], snap["window_calls"], breaker.metrics()["calls"]


@pytest.mark.parametrize("warm", [False, True], ids=["cold", "warm"])
def test_cb19_fac2_requests_adapter_under_retrying_decorator_is_one_failure(server, warm):
    """CB-19, FAC-2: ``BreakerAdapter("X")`` used inside ``@protected("X", retry=...)``: three
    503 answers (three attempts of one call) are one failure of breaker X, whether the call
    starts on an empty window or on a window full of successes (the lock-free healthy lane)."""
    name = f"nest-http-{warm}"
    session = requests.Session()
    session.mount("http://", BreakerAdapter(name, sliding_window_size=10))

    @baldur.protected(name, retry=FAST_RETRY, sliding_window_size=10)
    def fetch():
        return session.get(server.url("/status/503"), timeout=2)

    breaker = baldur.get_breaker(name)
    for _ in range(10 if warm else 0):
        breaker.record_success(breaker.acquire())
    assert fetch().status_code == 503
    assert server.count("/status/503") == 3
    consecutive, failures, calls, metrics = counts(name)
    assert (consecutive, failures, calls, metrics["failure"]) == (1, 1, 10 if warm else 1, 1)


def test_cb19_fac2_async_httpx_transport_under_retrying_decorator_is_one_failure(server):
    """CB-19, FAC-2: the async httpx transport inside a retrying ``async def`` protected by
    the same breaker: three 503 answers are one failure."""

    @baldur.protected("nest-httpx", retry=FAST_RETRY)
    async def fetch(client):
        return await client.get(server.url("/status/503"), timeout=2)

    async def main():
        transport = AsyncBreakerTransport("nest-httpx", transport=httpx.AsyncHTTPTransport())
        async with httpx.AsyncClient(transport=transport) as client:
            return await fetch(client)

    assert asyncio.run(main()).status_code == 503
    assert server.count("/status/503") == 3
    consecutive, failures, calls, metrics = counts("nest-httpx")
    assert (consecutive, failures, calls, metrics["failure"], metrics["success"]) == (1, 1, 1, 1, 0)

"""HC-1..HC-4 for httpx: ``BreakerTransport`` and ``AsyncBreakerTransport`` against a real
local HTTP server (no mocked transport)."""

from __future__ import annotations

import asyncio
import hashlib
import ssl

import httpx
import pytest

import baldur_django as baldur
from baldur_django import CircuitState, RetryPolicy
from baldur_django.contrib.httpx import (
    AsyncBreakerTransport,
    BreakerTransport,
    CircuitOpenTransportError,
    RateLimitCooldownTransportError,
)

from .server import pattern

FAST_RETRY = RetryPolicy(max_attempts=3, backoff_initial=0, jitter=0)
# One TLS context for every wrapped transport: building httpx's default one per transport
# reads the CA bundle each time (plain http:// is all these tests use).
TLS = ssl.create_default_context()


def http() -> httpx.HTTPTransport:
    return httpx.HTTPTransport(verify=TLS)


def ahttp() -> httpx.AsyncHTTPTransport:
    return httpx.AsyncHTTPTransport(verify=TLS)


def test_hc1_httpx_one_breaker_per_host(server, other_server):
    """HC-1: per-host breakers; one failing server leaves the other's requests alone."""
    with httpx.Client(transport=BreakerTransport(failure_threshold=2)) as client:
        for _ in range(2):
            assert client.get(server.url("/status/500")).status_code == 500
        assert baldur.get_breaker(server.name).state is CircuitState.OPEN
        assert client.get(other_server.url("/ok")).text == "ok"
        assert baldur.get_breaker(other_server.name).state is CircuitState.CLOSED


def test_hc1_httpx_refusal_before_any_socket(server):
    """HC-1, HC-2: an OPEN breaker raises CircuitOpenTransportError (an httpx.TransportError
    with service, reason, retry_after and the request) and the server sees no connection."""
    transport = BreakerTransport("payments-x", transport=http(), failure_threshold=1, recovery_timeout=30)
    with httpx.Client(transport=transport) as client:
        client.get(server.url("/status/503"))
    before = server.connections
    with (
        httpx.Client(transport=BreakerTransport("payments-x", transport=http())) as client,
        pytest.raises(httpx.TransportError) as caught,
    ):
        client.get(server.url("/ok"))
    error = caught.value
    assert isinstance(error, CircuitOpenTransportError) and isinstance(error, baldur.CircuitOpenError)
    assert (error.service, error.reason) == ("payments-x", "open")
    assert 0 < error.retry_after <= 30
    assert error.request.url == server.url("/ok")
    assert server.connections == before


def test_hc2_httpx_transport_errors_are_failures(server, refused_port):
    """HC-2: a refused connection and a read timeout are failures, raised as httpx's own."""
    with httpx.Client(transport=BreakerTransport(transport=http(), failure_threshold=5)) as client:
        with pytest.raises(httpx.ConnectError):
            client.get(f"http://127.0.0.1:{refused_port}/")
        with pytest.raises(httpx.ReadTimeout):
            client.get(server.url("/hang"), timeout=0.2)
    assert baldur.get_breaker(f"127.0.0.1:{refused_port}").snapshot()["consecutive_failures"] == 1
    assert baldur.get_breaker(server.name).snapshot()["consecutive_failures"] == 1


def test_hc2_httpx_429_cooldown_and_fallback(server):
    """HC-2, RL-6, FAC-4: a 429 starts the cooldown; the next retried request is refused
    without reaching the server; with a fallback the fallback's response is returned."""
    transport = BreakerTransport(transport=http(), retry=RetryPolicy(max_attempts=1, budget_seconds=1))
    with httpx.Client(transport=transport) as client:
        assert client.get(server.url("/429?retry_after=90")).status_code == 429
        with pytest.raises(RateLimitCooldownTransportError) as caught:
            client.get(server.url("/ok"))
    assert isinstance(caught.value, baldur.RateLimitCooldownError)
    assert server.count("/ok") == 0
    fallback = BreakerTransport(
        transport=http(),
        retry=RetryPolicy(max_attempts=1, budget_seconds=1),
        fallback=lambda request: httpx.Response(200, text="cached", request=request),
    )
    with httpx.Client(transport=fallback) as client:
        assert client.get(server.url("/ok")).text == "cached"
    assert server.count("/ok") == 0


def test_hc3_httpx_retries_idempotent_methods_and_replayable_bodies_only(server):
    """HC-3: GET retried (counted once, FAC-2); POST and a streamed PUT body sent once."""
    with httpx.Client(transport=BreakerTransport(transport=http(), retry=FAST_RETRY, failure_threshold=10)) as client:
        assert client.get(server.url("/status/503")).status_code == 503
        assert client.post(server.url("/status/503"), content=b"x").status_code == 503
        client.put(server.url("/status/503"), content=iter([b"a", b"b"]))
        client.put(server.url("/status/503"), content=b"ab")
    assert server.count("/status/503") == 3
    assert server.count("/status/503", "POST") == 1
    assert server.count("/status/503", "PUT") == 1 + 3
    assert baldur.get_breaker(server.name).snapshot()["consecutive_failures"] == 4


def test_hc2_httpx_stream_is_decided_at_the_headers(server):
    """HC-2: client.stream() gets the response before the server sent its body; the caller
    reads the large body intact afterwards."""
    size = 2 * 1024 * 1024
    with (
        httpx.Client(transport=BreakerTransport(transport=http())) as client,
        client.stream("GET", server.url(f"/stream?size={size}")) as response,
    ):
        assert response.status_code == 200
        assert not server.body_sent
        server.release.set()
        body = b"".join(response.iter_bytes())
    assert hashlib.sha256(body).digest() == hashlib.sha256(pattern(size)).digest()


class CountingTransport(httpx.HTTPTransport):
    """A real HTTPTransport that counts the lifecycle calls it receives."""

    def __init__(self) -> None:
        super().__init__(retries=0, verify=TLS)
        self.calls: list[str] = []

    def __enter__(self):
        self.calls.append("enter")
        return super().__enter__()

    def __exit__(self, *exc):
        self.calls.append("exit")
        return super().__exit__(*exc)

    def close(self) -> None:
        self.calls.append("close")
        super().close()


class CountingAsyncTransport(httpx.AsyncHTTPTransport):
    """A real AsyncHTTPTransport that counts the lifecycle calls it receives."""

    def __init__(self) -> None:
        super().__init__(retries=0, verify=TLS)
        self.calls: list[str] = []

    async def __aenter__(self):
        self.calls.append("aenter")
        return await super().__aenter__()

    async def __aexit__(self, *exc):
        self.calls.append("aexit")
        return await super().__aexit__(*exc)

    async def aclose(self) -> None:
        self.calls.append("aclose")
        await super().aclose()


def test_hc4_httpx_lifecycle_is_delegated(server):
    """HC-4: the client's context manager and close reach the wrapped transport."""
    inner = CountingTransport()
    transport = BreakerTransport(transport=inner)
    assert transport.transport is inner
    with httpx.Client(transport=transport) as client:
        assert client.get(server.url("/ok")).status_code == 200
    assert inner.calls == ["enter", "exit"]  # HTTPTransport.__exit__ closes its pool itself
    plain = CountingTransport()
    BreakerTransport(transport=plain).close()
    assert plain.calls == ["close"]


def test_hc1_async_transport_basics(server, other_server):
    """HC-1, HC-2, HC-4: the async transport keeps per-host breakers, refuses while OPEN
    without connecting, returns a coroutine fallback's value and closes its transport."""

    async def fallback(request):
        return httpx.Response(203, text="fallback", request=request)

    async def scenario():
        inner = CountingAsyncTransport()
        async with httpx.AsyncClient(transport=AsyncBreakerTransport(transport=inner, failure_threshold=1)) as client:
            assert (await client.get(server.url("/status/502"))).status_code == 502
            before = server.connections
            with pytest.raises(CircuitOpenTransportError):
                await client.get(server.url("/ok"))
            assert server.connections == before
            assert (await client.get(other_server.url("/ok"))).text == "ok"
        assert inner.calls == ["aenter", "aexit"]
        async with httpx.AsyncClient(transport=AsyncBreakerTransport(transport=ahttp(), fallback=fallback)) as client:
            return (await client.get(server.url("/ok"))).text

    assert asyncio.run(scenario()) == "fallback"
    assert baldur.get_breaker(other_server.name).state is CircuitState.CLOSED


def test_hc4_async_transport_never_blocks_the_loop_on_a_hung_store(fresh_registry, server, hung_redis):
    """HC-4, IN-7, ST-4: the breaker's shared store is a Redis that answers nothing until a
    ticker task on the same loop has ticked TICKS times during the hung call; the loop does
    tick (the consult runs off it; on the loop it would tick 0 times) and the request still
    completes under local judgement."""
    from baldur_django.core.stores.redis import RedisStore, connect
    from tests.hung_store import HANG_LIMIT, TICKS, TickWatch

    watch = TickWatch(RedisStore(connect(hung_redis.url(), socket_timeout=HANG_LIMIT)), hung_redis)
    fresh_registry.set_store(watch)

    # built before the loop runs: httpx loads its CA bundle (a blocking file read of its own) here
    client = httpx.AsyncClient(transport=AsyncBreakerTransport("hung-store", transport=ahttp()))

    async def scenario():
        async with client:
            response = await client.get(server.url("/ok"))
            return response.status_code

    assert asyncio.run(watch.run(scenario())) == 200
    assert watch.most_ticks_during_a_call() >= TICKS, f"store calls and the ticks during them: {watch.during}"
    assert hung_redis.released, "the store consult must have hung until the loop had ticked"


def test_hc2_httpx_client_errors_are_neither_success_nor_failure(fresh_registry):
    """HC-2: httpx's own refusal of a URL it cannot send (an unsupported scheme) reaches the
    caller unchanged and is recorded as neither outcome."""
    transport = BreakerTransport("odd-scheme", transport=http(), failure_threshold=1)
    with pytest.raises(httpx.UnsupportedProtocol):
        transport.handle_request(httpx.Request("GET", "ftp://127.0.0.1/file"))
    snapshot = baldur.get_breaker("odd-scheme").snapshot()
    assert (snapshot["state"], snapshot["window_calls"], snapshot["consecutive_failures"]) == ("closed", 0, 0)

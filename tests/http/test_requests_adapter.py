"""HC-1..HC-4 for requests: ``BreakerAdapter`` against a real local HTTP server.

Every behaviour here goes over real sockets to ``tests/http/server.py``; the server counts
the TCP connections it accepts, which is how "refused before any socket was opened" is
checked.
"""

from __future__ import annotations

import hashlib

import pytest
import requests

import baldur_django as baldur
from baldur_django import CircuitState, RetryPolicy
from baldur_django.contrib.requests import (
    BreakerAdapter,
    CircuitOpenRequestError,
    HTTPRetryPolicy,
    RateLimitCooldownRequestError,
    canned_response,
)

from .server import pattern

FAST_RETRY = RetryPolicy(max_attempts=3, backoff_initial=0, jitter=0)


def session_with(adapter: BreakerAdapter) -> requests.Session:
    session = requests.Session()
    session.mount("http://", adapter)
    return session


def test_hc1_one_breaker_per_host_and_port(server, other_server):
    """HC-1: service=None names one breaker per host: a failing server trips its own breaker,
    the other host's breaker stays CLOSED and its requests go through."""
    session = session_with(BreakerAdapter(failure_threshold=2))
    for _ in range(2):
        assert session.get(server.url("/status/503"), timeout=2).status_code == 503
    assert baldur.get_breaker(server.name).state is CircuitState.OPEN
    assert session.get(other_server.url("/ok"), timeout=2).text == "ok"
    assert baldur.get_breaker(other_server.name).state is CircuitState.CLOSED
    with pytest.raises(CircuitOpenRequestError):
        session.get(server.url("/ok"), timeout=2)


def test_hc1_names_are_lowercased_and_drop_the_default_port():
    """HC-1: the host is lowercased; the port is kept only when it is not the scheme's default."""
    adapter = BreakerAdapter()
    names = [
        adapter.breaker_name(requests.Request("GET", url).prepare())
        for url in (
            "http://API.Example.com/x",
            "http://api.example.com:80/x",
            "https://api.example.com:443/x",
            "https://api.example.com:8443/x",
            "http://[::1]:8080/x",
        )
    ]
    assert names == ["api.example.com", "api.example.com", "api.example.com", "api.example.com:8443", "[::1]:8080"]


def test_hc1_named_and_callable_services(server):
    """HC-1: a string names the one breaker; a callable of the request picks it per request."""
    session = requests.Session()
    session.mount(server.url("/status/"), BreakerAdapter("status-api", failure_threshold=1))
    session.mount("http://", BreakerAdapter(lambda request: "by-method-" + request.method.lower()))
    session.get(server.url("/status/500"), timeout=2)
    assert baldur.get_breaker("status-api").state is CircuitState.OPEN
    session.post(server.url("/echo"), data=b"x", timeout=2)
    assert baldur.get_breaker("by-method-post").snapshot()["window_calls"] == 1


def test_hc1_open_breaker_refuses_before_any_socket(server):
    """HC-1, HC-2: while OPEN the adapter raises CircuitOpenRequestError (a requests
    ConnectionError carrying service, reason and retry_after) and the server sees no
    connection at all."""
    session = session_with(BreakerAdapter(failure_threshold=1, recovery_timeout=30))
    session.get(server.url("/status/500"), timeout=2)
    before = server.connections
    session.close()  # no pooled connection left to reuse: a new request would have to connect
    with pytest.raises(requests.ConnectionError) as caught:
        session.get(server.url("/ok"), timeout=2)
    error = caught.value
    assert isinstance(error, CircuitOpenRequestError) and isinstance(error, baldur.CircuitOpenError)
    assert (error.service, error.reason) == (server.name, "open")
    assert 0 < error.retry_after <= 30
    assert error.request.url == server.url("/ok")
    assert server.connections == before
    assert server.count("/ok") == 0


def test_hc2_connection_errors_and_timeouts_are_failures_reraised_unchanged(server, refused_port):
    """HC-2: a refused connection and a read timeout count as failures and reach the caller
    as requests' own exceptions."""
    session = session_with(BreakerAdapter(failure_threshold=5))
    with pytest.raises(requests.ConnectionError) as refused:
        session.get(f"http://127.0.0.1:{refused_port}/", timeout=2)
    assert not isinstance(refused.value, baldur.CircuitOpenError)
    assert baldur.get_breaker(f"127.0.0.1:{refused_port}").snapshot()["consecutive_failures"] == 1
    with pytest.raises(requests.ReadTimeout):
        session.get(server.url("/hang"), timeout=0.2)
    assert baldur.get_breaker(server.name).snapshot()["consecutive_failures"] == 1


def test_hc2_responses_are_returned_unchanged_and_classified(server):
    """HC-2, CB-11: a 503 is returned as is (no exception) and counts as a failure; a 404
    is a success; a 200 resets the consecutive count."""
    session = session_with(BreakerAdapter(failure_threshold=3))
    response = session.get(server.url("/status/503"), timeout=2)
    assert (response.status_code, response.text) == (503, "status 503")
    snapshot = baldur.get_breaker(server.name).snapshot()
    assert (snapshot["consecutive_failures"], snapshot["window_failures"]) == (1, 1)
    assert session.get(server.url("/status/404"), timeout=2).status_code == 404
    snapshot = baldur.get_breaker(server.name).snapshot()
    assert (snapshot["consecutive_failures"], snapshot["window_calls"], snapshot["window_failures"]) == (0, 2, 1)


def test_hc2_client_errors_are_neither_success_nor_failure(server):
    """HC-2: an error of the client itself (here an invalid proxy URL, raised by the wrapped
    adapter before any I/O) reaches the caller unchanged and is recorded as neither outcome."""
    session = session_with(BreakerAdapter(failure_threshold=1))
    with pytest.raises(requests.exceptions.InvalidURL):
        session.get(server.url("/ok"), timeout=2, proxies={"http": "http://"})
    snapshot = baldur.get_breaker(server.name).snapshot()
    assert (snapshot["state"], snapshot["window_calls"], snapshot["consecutive_failures"]) == ("closed", 0, 0)
    assert server.connections == 0


def test_hc2_429_starts_the_cooldown_the_retry_stage_honours(server):
    """HC-2, RL-2, RL-6: a returned 429 with Retry-After is a failure and starts the cooldown;
    the next retried request is refused before it reaches the server, with an error that is
    also a requests ConnectionError."""
    session = session_with(BreakerAdapter(retry=RetryPolicy(max_attempts=1, budget_seconds=1), failure_threshold=10))
    response = session.get(server.url("/429?retry_after=120"), timeout=2)
    assert response.status_code == 429
    breaker = baldur.get_breaker(server.name)
    assert breaker.snapshot()["consecutive_failures"] == 1
    assert 100 < breaker.cooldown_remaining() <= 120
    with pytest.raises(RateLimitCooldownRequestError) as caught:
        session.get(server.url("/ok"), timeout=2)
    assert isinstance(caught.value, requests.ConnectionError) and isinstance(
        caught.value, baldur.RateLimitCooldownError
    )
    assert server.count("/ok") == 0


def test_hc2_fallback_gets_the_request_on_refusal_and_on_failure(server, refused_port):
    """HC-2, FAC-4: the fallback is called with the request when the breaker refuses and
    when the final outcome is a counted exception; never for a returned failure response."""
    seen = []

    def fallback(request):
        seen.append(request.url)
        return canned_response(request, content=b"from the fallback")

    session = session_with(BreakerAdapter(fallback=fallback, failure_threshold=2))
    assert session.get(server.url("/status/500"), timeout=2).status_code == 500  # a response: no fallback
    assert seen == []
    down = f"http://127.0.0.1:{refused_port}/x"
    assert session.get(down, timeout=2).text == "from the fallback"  # counted exception
    assert session.get(down, timeout=2).text == "from the fallback"  # second failure: trips
    assert baldur.get_breaker(f"127.0.0.1:{refused_port}").state is CircuitState.OPEN
    assert session.get(down, timeout=2).text == "from the fallback"  # refusal
    assert seen == [down, down, down]


def test_hc3_retries_idempotent_methods_only(server):
    """HC-3, FAC-2: GET is retried up to the policy's attempts and counted once; POST is sent
    once; an HTTPRetryPolicy naming POST retries it."""
    session = session_with(BreakerAdapter(retry=FAST_RETRY, failure_threshold=10))
    assert session.get(server.url("/status/503"), timeout=2).status_code == 503
    assert server.count("/status/503") == 3
    assert baldur.get_breaker(server.name).snapshot()["consecutive_failures"] == 1
    assert session.post(server.url("/status/503"), data=b"x", timeout=2).status_code == 503
    assert server.count("/status/503", "POST") == 1
    retry_post = HTTPRetryPolicy(max_attempts=2, backoff_initial=0, jitter=0, methods={"post"})
    session.mount("http://", BreakerAdapter(retry=retry_post))
    session.post(server.url("/status/503"), data=b"x", timeout=2)
    assert server.count("/status/503", "POST") == 3


def test_hc3_a_body_that_cannot_be_replayed_is_never_retried(server):
    """HC-3: a PUT whose body is a generator is sent once, even with a retry policy."""
    session = session_with(BreakerAdapter(retry=FAST_RETRY))
    session.put(server.url("/status/503"), data=(chunk for chunk in [b"a", b"b"]), timeout=2)
    assert server.count("/status/503", "PUT") == 1
    session.put(server.url("/status/503"), data=b"ab", timeout=2)
    assert server.count("/status/503", "PUT") == 4


def test_hc2_streamed_body_is_never_read_by_the_adapter(server):
    """HC-2: with stream=True the adapter returns at the headers, before the server even
    sends the body; the caller then reads the large body intact."""
    session = session_with(BreakerAdapter())
    size = 2 * 1024 * 1024
    response = session.get(server.url(f"/stream?size={size}"), stream=True, timeout=5)
    assert response.status_code == 200
    assert not server.body_sent, "the adapter must not have waited for (or read) the body"
    server.release.set()
    digest = hashlib.sha256()
    for chunk in response.iter_content(65536):
        digest.update(chunk)
    assert digest.hexdigest() == hashlib.sha256(pattern(size)).hexdigest()
    assert baldur.get_breaker(server.name).snapshot()["window_calls"] == 1


def test_hc4_lifecycle_and_settings_are_the_wrapped_adapters(server):
    """HC-4: close() closes the wrapped adapter's pools; its attributes (max_retries,
    poolmanager) show through; one adapter mounted on two prefixes shares its breakers."""
    inner = requests.adapters.HTTPAdapter(pool_maxsize=3, max_retries=0)
    adapter = BreakerAdapter(adapter=inner, failure_threshold=2)
    assert adapter.adapter is inner and adapter.max_retries is inner.max_retries
    assert adapter.poolmanager is inner.poolmanager
    session = requests.Session()
    session.mount(server.url("/status/"), adapter)
    session.mount(server.url("/ok"), adapter)
    session.get(server.url("/status/503"), timeout=2)
    session.get(server.url("/status/503"), timeout=2)
    with pytest.raises(CircuitOpenRequestError):
        session.get(server.url("/ok"), timeout=2)
    baldur.force_close_circuit(server.name)
    assert session.get(server.url("/ok"), timeout=2).ok
    assert len(inner.poolmanager.pools) == 1
    session.close()  # Session.close() -> adapter.close() -> inner.close()
    assert len(inner.poolmanager.pools) == 0


def test_hc1_forces_and_services_settings_apply_by_name(server, settings):
    """HC-1: the adapter's breakers are the registry's: BALDUR_SERVICES configures a host's
    breaker, and an operator's force refuses its requests."""
    settings.BALDUR_SERVICES = {server.name: {"failure_threshold": 1}}
    session = session_with(BreakerAdapter())
    session.get(server.url("/status/502"), timeout=2)
    assert baldur.get_breaker(server.name).state is CircuitState.OPEN
    baldur.force_close_circuit(server.name)
    assert session.get(server.url("/ok"), timeout=2).ok
    baldur.force_open_circuit(server.name, reason="maintenance")
    with pytest.raises(CircuitOpenRequestError):
        session.get(server.url("/ok"), timeout=2)


def test_cb18_predicates_apply_through_the_adapter(server, refused_port):
    """CB-18, HC-2: the decorators' predicates are per-adapter overrides too. A
    ``result_predicate`` marks a 200 whose body says so as a failure (the response still
    reaches the caller unchanged); ``ignore_exceptions`` given a callable makes a refused
    connection neither success nor failure, and the error still reaches the caller."""
    session = session_with(
        BreakerAdapter(
            "judged",
            failure_threshold=2,
            result_predicate=lambda response: response.text == "status 200",
        )
    )
    first = session.get(server.url("/status/200"), timeout=2)
    assert (first.status_code, first.text) == (200, "status 200")
    assert baldur.get_breaker("judged").snapshot()["consecutive_failures"] == 1
    session.get(server.url("/status/200"), timeout=2)
    assert baldur.get_breaker("judged").state is CircuitState.OPEN

    ignoring = session_with(
        BreakerAdapter(
            "tolerant",
            failure_threshold=1,
            ignore_exceptions=(lambda exc: isinstance(exc, requests.ConnectionError),),
        )
    )
    with pytest.raises(requests.ConnectionError):
        ignoring.get(f"http://127.0.0.1:{refused_port}/", timeout=2)
    snapshot = baldur.get_breaker("tolerant").snapshot()
    assert (snapshot["state"], snapshot["window_calls"], snapshot["consecutive_failures"]) == ("closed", 0, 0)

"""HC-1, CFG-3: bad input to the adapters is a ConfigError naming what was wrong; nothing is
sent and no breaker is created for it."""

from __future__ import annotations

import asyncio

import httpx
import pytest
import requests

import baldur_django as baldur
from baldur_django.contrib.httpx import AsyncBreakerTransport, BreakerTransport
from baldur_django.contrib.requests import BreakerAdapter, HTTPRetryPolicy


def test_hc1_hostless_url_is_refused_before_any_io(fresh_registry):
    """HC-1: a URL without a host names no breaker: ConfigError, no breaker, nothing sent."""
    request = requests.Request("GET", "http://127.0.0.1/").prepare()
    request.url = "http:///no-host"
    with pytest.raises(baldur.ConfigError, match="names no host"):
        BreakerAdapter().send(request)
    with pytest.raises(baldur.ConfigError, match="names no host"):
        BreakerTransport().handle_request(httpx.Request("GET", "http:///no-host"))
    with pytest.raises(baldur.ConfigError, match="names no host"):
        asyncio.run(AsyncBreakerTransport().handle_async_request(httpx.Request("GET", "http:///no-host")))
    assert fresh_registry.names() == []


def test_hc1_bad_port_is_a_config_error(fresh_registry):
    """HC-1: a port that is not a number cannot name a per-host breaker."""
    request = requests.Request("GET", "http://127.0.0.1/").prepare()
    request.url = "http://example.com:http/"
    with pytest.raises(baldur.ConfigError, match="cannot be read"):
        BreakerAdapter().send(request)
    assert fresh_registry.names() == []


@pytest.mark.parametrize(
    "service, message",
    [
        (lambda request: 42, "returned 42"),
        (lambda request: "", "returned ''"),
        (lambda request: 1 / 0, "raised ZeroDivisionError"),
    ],
    ids=["non-string", "empty", "raises"],
)
def test_hc1_bad_service_callable(fresh_registry, server, service, message):
    """HC-1: a service callable that returns a non-string (or nothing usable) or raises:
    ConfigError naming the callable's result; the server sees no connection."""
    session = requests.Session()
    session.mount("http://", BreakerAdapter(service))
    with pytest.raises(baldur.ConfigError, match=message):
        session.get(server.url("/ok"), timeout=2)
    with httpx.Client(transport=BreakerTransport(service)) as client, pytest.raises(baldur.ConfigError, match=message):
        client.get(server.url("/ok"))
    assert server.connections == 0
    assert fresh_registry.names() == []


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"retry": 3}, r"retry=3\): expected a baldur_django\.RetryPolicy"),
        ({"retry": {"max_attempts": 2}}, "expected a baldur_django.RetryPolicy"),
        ({"service": 7}, "service=7"),
        ({"service": ""}, "service=''"),
        ({"fallback": "nope"}, "fallback='nope'"),
        ({"failure_treshold": 3}, "unknown argument"),
        ({"failure_threshold": 0}, "failure_threshold"),
    ],
)
@pytest.mark.parametrize("wrapper", [BreakerAdapter, BreakerTransport, AsyncBreakerTransport])
def test_hc1_bad_arguments_fail_at_construction(fresh_registry, wrapper, kwargs, message):
    """HC-1, HC-3, CFG-3: a retry that is not a RetryPolicy, a bad service, fallback or
    override fails when the adapter is built, naming the argument; no breaker exists."""
    with pytest.raises(baldur.ConfigError, match=message) as caught:
        wrapper(**kwargs)
    assert wrapper.__name__ in str(caught.value)
    assert fresh_registry.names() == []


def test_hc3_bad_method_set():
    """HC-3: HTTPRetryPolicy(methods=...) wants a set of method names."""
    with pytest.raises(baldur.ConfigError, match="methods"):
        HTTPRetryPolicy(methods="POST")
    assert HTTPRetryPolicy(methods=["post", "Get"]).methods == frozenset({"POST", "GET"})


def test_hc1_wrapped_adapter_must_be_an_adapter():
    """HC-4: the wrapped adapter/transport must look like one."""
    with pytest.raises(baldur.ConfigError, match="adapter="):
        BreakerAdapter(adapter=object())
    with pytest.raises(baldur.ConfigError, match="transport="):
        BreakerTransport(transport=object())
    with pytest.raises(baldur.ConfigError, match="transport="):
        AsyncBreakerTransport(transport=httpx.HTTPTransport())

"""HC-1: the requests adapter and the httpx transports give one host one breaker name.

requests hands the adapter an internationalised host already in its IDNA ASCII form,
httpx reads it back as Unicode; both must land on the same (wire) spelling, with ports and
letter case treated alike. No request is sent: only the names are compared.
"""

from __future__ import annotations

import httpx
import pytest
import requests

from baldur_django.contrib.httpx import AsyncBreakerTransport, BreakerTransport
from baldur_django.contrib.outbound import canonical_host
from baldur_django.contrib.requests import BreakerAdapter

CASES = [
    ("https://bücher.example/books", "xn--bcher-kva.example"),
    ("https://BÜCHER.example/books", "xn--bcher-kva.example"),
    ("https://Bücher.Example:443/", "xn--bcher-kva.example"),
    ("https://bücher.example:8443/x?q=1", "xn--bcher-kva.example:8443"),
    ("http://bücher.example:80/", "xn--bcher-kva.example"),
    ("http://xn--bcher-kva.example:8080/", "xn--bcher-kva.example:8080"),
    ("https://API.Example.COM:8443/v1", "api.example.com:8443"),
    ("http://[::1]:8000/", "[::1]:8000"),
    ("https://例え.テスト/", "xn--r8jz45g.xn--zckzah"),
]


@pytest.mark.parametrize(("url", "expected"), CASES)
def test_hc1_requests_and_httpx_name_one_host_alike(url, expected):
    """HC-1: the same URL gives the same per-host breaker name through requests, httpx and
    httpx's async transport: the IDNA ASCII host, lowercased, with a non-default port."""
    through_requests = BreakerAdapter().breaker_name(requests.Request("GET", url).prepare())
    through_httpx = BreakerTransport().breaker_name(httpx.Request("GET", url))
    through_async = AsyncBreakerTransport().breaker_name(httpx.Request("GET", url))
    assert (through_requests, through_httpx, through_async) == (expected, expected, expected)


def test_hc1_canonical_host_keeps_a_name_idna_refuses():
    """HC-1: a host the IDNA rules refuse is kept, lowercased, rather than raising."""
    assert canonical_host("-Bü.Example") == "-bü.example"
    assert canonical_host("Plain.Example") == "plain.example"

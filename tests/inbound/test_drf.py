"""The DRF throttle bridge (IN-5, with IN-1..IN-3 through the middleware)."""

from __future__ import annotations

import pytest
from django.test import Client, RequestFactory
from rest_framework.request import Request
from rest_framework.throttling import AnonRateThrottle

from baldur_django.contrib.drf import BaldurAnonRateThrottle, BaldurThrottleMixin
from baldur_django.core.marks import is_marked
from baldur_django.core.registry import registry

from . import views


def counts(name):
    snap = registry.get(name, create=False).snapshot()
    return snap["window_calls"], snap["window_failures"], snap["consecutive_failures"]


def test_in5_drf_throttle_429s_never_count(site):
    """IN-5, IN-3: 429s from a Baldur DRF throttle are marked and never count, however many."""
    c = Client()
    assert [c.get("/api/items/").status_code for _ in range(3)] == [200, 200, 200]
    for _ in range(8):
        refused = c.get("/api/items/")
        assert refused.status_code == 429
        assert int(refused.headers["Retry-After"]) >= 1
        assert "X-RateLimit-Mode" not in refused.headers  # only the request mark tells
        assert refused.wsgi_request.baldur_rate_limited is True
    assert counts("api") == (3, 0, 0)
    assert registry.get("api").state.value == "closed"
    assert views.CALLS == ["/api/items/"] * 3


def test_in5_relayed_upstream_429_through_the_same_api_counts(site):
    """IN-5, IN-2: the same throttled API relaying an upstream 429 records a rate-limited failure."""
    c = Client()
    assert c.get("/api/items/?upstream=429").status_code == 429
    assert counts("api") == (1, 1, 1)
    assert c.get("/api/items/?upstream=503").status_code == 503
    assert counts("api") == (2, 2, 2)
    assert registry.get("api").snapshot()["cooldown_remaining"] > 0  # the 429 started a cooldown
    # the throttle's budget (3/min) is now spent: its refusals do not add to the count
    assert c.get("/api/items/").status_code == 200
    assert [c.get("/api/items/?upstream=429").status_code for _ in range(5)] == [429] * 5
    assert views.CALLS == ["/api/items/"] * 3
    assert counts("api") == (3, 2, 0)


@pytest.mark.django_db
def test_in5_user_throttle_refusals_are_marked(site):
    """IN-5: BaldurUserRateThrottle marks its refusals for an authenticated user."""
    from django.contrib.auth.models import User

    user = User.objects.create_user("ada", password="pw")
    c = Client()
    c.force_login(user)
    assert [c.get("/api/mine/").status_code for _ in range(4)] == [200, 200, 429, 429]
    assert counts("api") == (2, 0, 0)


def test_in5_scoped_throttle_refusals_are_marked(site):
    """IN-5: BaldurScopedRateThrottle marks its refusals."""
    c = Client()
    assert [c.get("/api/scoped/").status_code for _ in range(4)] == [200, 200, 429, 429]
    assert counts("api") == (2, 0, 0)


def test_in5_refusal_without_a_known_wait_still_says_retry_after_1(site):
    """IN-5: a refusal whose throttle cannot tell the wait carries Retry-After: 1."""
    c = Client()
    refused = c.get("/api/unknown-wait/?refuse=1")
    assert refused.status_code == 429
    assert refused.headers["Retry-After"] == "1"
    assert c.get("/api/unknown-wait/").status_code == 200
    assert counts("api") == (1, 0, 0)


class _Fixed(BaldurThrottleMixin, AnonRateThrottle):
    rate = "1/min"

    def __init__(self, inner_wait):
        super().__init__()
        self._inner_wait = inner_wait

    def allow_request(self, request, view):
        return super().allow_request(request, view)


@pytest.mark.parametrize("inner,expected", [(None, 1.0), (0, 1.0), (0.2, 1.0), (-3, 1.0), (7.5, 7.5)])
def test_in5_wait_is_at_least_one_second(monkeypatch, inner, expected):
    """IN-5: wait() is never below one second."""
    monkeypatch.setattr(AnonRateThrottle, "wait", lambda self: inner)
    assert _Fixed(inner).wait() == expected


def test_in5_allow_request_marks_the_underlying_http_request(site):
    """IN-5: a refusal marks request._request (DRF's Request keeps attribute writes to itself)."""
    throttle = BaldurAnonRateThrottle()
    throttle.rate = "1/min"
    throttle.num_requests, throttle.duration = throttle.parse_rate("1/min")
    http = RequestFactory().get("/api/items/")
    request = Request(http)
    assert throttle.allow_request(request, None) is True
    assert not is_marked(http)
    assert throttle.allow_request(request, None) is False
    assert is_marked(http)
    assert http.baldur_rate_limited is True
    assert 1.0 <= throttle.wait() <= 60.0

"""The test project's /api/ app under the test project's own inbound settings (IN-1..IN-5)."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.test import Client

from baldur_django.core.registry import registry
from testproject import settings as project


class _Upstream(BaseHTTPRequestHandler):
    status = 200

    def do_GET(self):  # noqa: N802 - http.server naming
        self.send_response(self.status)
        if self.status == 429:
            self.send_header("Retry-After", "7")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def upstream():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Upstream)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()
    _Upstream.status = 200


@pytest.fixture
def api(site, upstream):
    site(
        ROOT_URLCONF="tests.inbound.urls_testproject",
        MIDDLEWARE=project.MIDDLEWARE,
        BALDUR_DOMAIN_MAPPING=project.BALDUR_DOMAIN_MAPPING,
        BALDUR_RATE_LIMIT_RULES=project.BALDUR_RATE_LIMIT_RULES,
        PAYMENTS_URL=f"http://127.0.0.1:{upstream.server_port}",
        PAYMENTS_TIMEOUT=5.0,
    )
    return Client()


def counts():
    snap = registry.get("api", create=False).snapshot()
    return snap["window_calls"], snap["window_failures"], snap["consecutive_failures"]


def test_in1_project_settings_install_both_middlewares_in_order():
    """IN-1, IN-4: the breaker middleware comes first, the limiter right after authentication."""
    mw = project.MIDDLEWARE
    assert mw[0] == "baldur_django.middleware.CircuitBreakerMiddleware"
    auth = mw.index("django.contrib.auth.middleware.AuthenticationMiddleware")
    assert mw[auth + 1] == "baldur_django.middleware.RateLimitMiddleware"
    assert "testproject.api" in project.INSTALLED_APPS


def test_in5_project_quote_throttle_refusals_do_not_count(api):
    """IN-5: the API's DRF throttle refusals never reach the api breaker's counts."""
    assert [api.get("/api/quote/").status_code for _ in range(7)] == [200] * 5 + [429] * 2
    assert counts() == (5, 0, 0)


def test_in4_project_limited_endpoint(api):
    """IN-4, IN-3: the project's rule refuses the sixth request with the limiter headers, uncounted."""
    codes = [api.get("/api/limited/") for _ in range(6)]
    assert [r.status_code for r in codes] == [200] * 5 + [429]
    assert codes[-1].headers["X-RateLimit-Mode"] == "enforce"
    assert counts() == (5, 0, 0)


def test_in2_project_relayed_upstream_429s_trip_the_api_breaker(api, upstream):
    """IN-2: five 429s relayed from the payments service open the api breaker."""
    assert api.get("/api/payments-health/").status_code == 200
    _Upstream.status = 429
    for _ in range(5):
        reply = api.get("/api/payments-health/")
        assert (reply.status_code, reply.headers["Retry-After"]) == (429, "7")
    assert api.get("/api/breaker/").json()["state"] == "open"
    assert registry.names() == ["api"]

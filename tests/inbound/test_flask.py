"""BaldurFlask: one breaker per app when a service name is given, nothing otherwise (IN-6)."""

from __future__ import annotations

import pytest
from flask import Flask, Response

from baldur_django.contrib.flask import BaldurFlask
from baldur_django.core.errors import ConfigError
from baldur_django.core.registry import registry

STREAM = {"started": False}


def make_app(service_name=None, *, testing=False, extension=True) -> Flask:
    app = Flask("baldur_flask_test")
    app.testing = testing

    @app.get("/status/<int:code>")
    def status(code):
        return f"status {code}", code

    @app.get("/relay")
    def relay():
        return "upstream says slow down", 429, {"Retry-After": "30"}

    @app.get("/own")
    def own():
        return "our limiter", 429, {"X-RateLimit-Mode": "enforce", "X-RateLimit-Limit": "5"}

    @app.get("/limit-only")
    def limit_only():
        return "relayed with upstream's limit header", 429, {"X-RateLimit-Limit": "5"}

    @app.get("/shed")
    def shed():
        return "paused", 503, {"X-Baldur-Shed": "open"}

    @app.get("/boom")
    def boom():
        raise RuntimeError("flask view broke")

    @app.get("/stream")
    def stream():
        def body():
            STREAM["started"] = True
            yield "a"
            yield "b"

        return Response(body(), status=503)

    if extension:
        BaldurFlask(app, service_name=service_name)
    return app


def counts(name="shop"):
    snap = registry.get(name, create=False).snapshot()
    return snap["window_calls"], snap["window_failures"], snap["consecutive_failures"]


def test_in6_flask_records_every_response_against_the_service(clock):
    """IN-6: successes, failures and relayed 429s (with their Retry-After) count against the one breaker."""
    c = make_app("shop").test_client()
    assert c.get("/status/200").status_code == 200
    assert c.get("/status/404").status_code == 404
    assert counts() == (2, 0, 0)
    assert c.get("/status/502").status_code == 502
    assert counts() == (3, 1, 1)
    assert c.get("/relay").status_code == 429
    assert counts() == (4, 2, 2)
    assert registry.get("shop").snapshot()["cooldown_remaining"] == pytest.approx(30.0)
    assert registry.names() == ["shop"]


def test_in6_flask_leaves_out_only_the_package_s_own_answers():
    """IN-6, IN-3, IN-7: a 429 with X-RateLimit-Mode, one with X-RateLimit-Limit alone (the
    Django middleware's rule, now shared) and the shed 503 are not counted; a relayed 429 is."""
    c = make_app("shop").test_client()
    for _ in range(6):
        assert c.get("/own").status_code == 429
        assert c.get("/shed").status_code == 503
        assert c.get("/limit-only").status_code == 429
    assert counts() == (0, 0, 0)
    assert c.get("/relay").status_code == 429
    assert counts() == (1, 1, 1)


def test_in6_flask_five_relayed_429s_trip_and_open_passes_unrecorded(events):
    """IN-6, IN-2: five relayed 429s open the breaker; while open requests pass unrecorded."""
    c = make_app("shop").test_client()
    for _ in range(5):
        c.get("/relay")
    assert registry.get("shop").state.value == "open"
    assert events.transitions() == [("closed", "open", "consecutive_failures")]
    before = counts()
    assert c.get("/status/200").status_code == 200
    assert counts() == before


@pytest.mark.parametrize("testing", [False, True])
def test_in6_flask_view_exception_counts_once(testing):
    """IN-6: a raising view is one failure, whether Flask answers 500 or propagates it."""
    c = make_app("shop", testing=testing).test_client()
    if testing:
        with pytest.raises(RuntimeError, match="flask view broke"):
            c.get("/boom")
    else:
        assert c.get("/boom").status_code == 500
    assert counts() == (1, 1, 1)


def test_in6_flask_streaming_response_recorded_by_status_unread():
    """IN-6: a streamed response is recorded by its status before its body is read."""
    from werkzeug.test import EnvironBuilder

    STREAM["started"] = False
    app = make_app("shop")
    started = []
    environ = EnvironBuilder(path="/stream").get_environ()
    body = app.wsgi_app(environ, lambda status, headers, exc_info=None: started.append(status))
    assert started == ["503 SERVICE UNAVAILABLE"]
    assert STREAM["started"] is False
    assert counts() == (1, 1, 1)
    assert b"".join(body) == b"ab"
    assert STREAM["started"] is True
    body.close()


def test_in6_flask_without_a_service_name_records_nothing():
    """IN-6: no service name, no breaker and no hooks."""
    app = make_app(None)
    c = app.test_client()
    for path in ("/status/200", "/status/500", "/relay", "/own"):
        c.get(path)
    with pytest.raises(RuntimeError):
        app.testing = True
        c.get("/boom")
    assert registry.names() == []
    assert app.extensions["baldur"].service_name is None


def test_in6_flask_init_app_factory_pattern():
    """IN-6: BaldurFlask(service_name=...).init_app(app) works like passing the app."""
    baldur = BaldurFlask(service_name="factory")
    app = make_app(extension=False)
    baldur.init_app(app)
    assert app.extensions["baldur"] is baldur
    app.test_client().get("/status/503")
    assert counts("factory") == (1, 1, 1)


@pytest.mark.parametrize("bad", ["", "  ", 42, b"shop"])
def test_in6_flask_bad_service_name_is_a_config_error(bad):
    """IN-6: a service name must be a non-empty string (or None)."""
    with pytest.raises(ConfigError, match="service_name"):
        BaldurFlask(service_name=bad)

"""BaldurASGIMiddleware with Starlette: one breaker when named, nothing otherwise (IN-6)."""

from __future__ import annotations

import asyncio
import warnings

import httpx
import pytest
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse, StreamingResponse
from starlette.routing import Route

with warnings.catch_warnings():
    # Starlette 1.x suggests httpx2 for its TestClient; httpx still works and is what we install
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient

from baldur_django.contrib.asgi import BaldurASGIMiddleware
from baldur_django.core.errors import ConfigError
from baldur_django.core.registry import registry

STREAM = {"started": False}


async def status(request):
    code = int(request.path_params["code"])
    return PlainTextResponse(f"status {code}", status_code=code)


async def relay(request):
    return PlainTextResponse("upstream says slow down", status_code=429, headers={"Retry-After": "30"})


async def own(request):
    return PlainTextResponse("our limiter", status_code=429, headers={"X-RateLimit-Mode": "enforce"})


async def limit_only(request):
    return PlainTextResponse("relayed", status_code=429, headers={"X-RateLimit-Limit": "5"})


async def shed(request):
    return PlainTextResponse("paused", status_code=503, headers={"X-Baldur-Shed": "open"})


async def boom(request):
    raise RuntimeError("starlette view broke")


async def stream(request):
    async def body():
        STREAM["started"] = True
        yield b"a"
        yield b"b"

    return StreamingResponse(body(), status_code=503)


ROUTES = [
    Route("/status/{code:int}", status),
    Route("/relay", relay),
    Route("/own", own),
    Route("/limit-only", limit_only),
    Route("/shed", shed),
    Route("/boom", boom),
    Route("/stream", stream),
]


def added(service_name=None) -> Starlette:
    """Starlette app with the middleware added the usual way (inside ServerErrorMiddleware)."""
    app = Starlette(routes=ROUTES)
    app.add_middleware(BaldurASGIMiddleware, service_name=service_name)
    return app


def wrapped(service_name=None) -> BaldurASGIMiddleware:
    """The middleware wrapped around the whole app (outside ServerErrorMiddleware)."""
    return BaldurASGIMiddleware(Starlette(routes=ROUTES), service_name=service_name)


def counts(name="api"):
    snap = registry.get(name, create=False).snapshot()
    return snap["window_calls"], snap["window_failures"], snap["consecutive_failures"]


@pytest.mark.parametrize("build", [added, wrapped])
def test_in6_asgi_records_every_response_against_the_service(build, clock):
    """IN-6: successes, failures and relayed 429s (with Retry-After) count against the one breaker."""
    c = TestClient(build("api"), raise_server_exceptions=False)
    assert c.get("/status/200").status_code == 200
    assert c.get("/status/404").status_code == 404
    assert c.get("/nowhere").status_code == 404
    assert counts() == (3, 0, 0)
    assert c.get("/status/504").status_code == 504
    assert c.get("/relay").status_code == 429
    assert counts() == (5, 2, 2)
    assert registry.get("api").snapshot()["cooldown_remaining"] == pytest.approx(30.0)
    assert registry.names() == ["api"]


def test_in6_asgi_leaves_out_only_the_package_s_own_answers():
    """IN-6, IN-3, IN-7: a 429 with X-RateLimit-Mode, one with X-RateLimit-Limit alone (the
    Django middleware's rule, now shared) and the shed 503 are not counted; a relayed 429 is."""
    c = TestClient(added("api"))
    for _ in range(6):
        assert c.get("/own").status_code == 429
        assert c.get("/shed").status_code == 503
        assert c.get("/limit-only").status_code == 429
    assert counts() == (0, 0, 0)
    assert c.get("/relay").status_code == 429
    assert counts() == (1, 1, 1)


def test_in6_asgi_five_relayed_429s_trip_and_open_passes_unrecorded(events):
    """IN-6, IN-2: five relayed 429s open the breaker; while open, requests pass unrecorded."""
    c = TestClient(added("api"))
    for _ in range(5):
        c.get("/relay")
    assert events.transitions() == [("closed", "open", "consecutive_failures")]
    before = counts()
    assert c.get("/status/200").status_code == 200
    assert counts() == before


@pytest.mark.parametrize("build", [added, wrapped])
@pytest.mark.parametrize("raise_server_exceptions", [False, True])
def test_in6_asgi_exception_counts_once(build, raise_server_exceptions):
    """IN-6: a raising endpoint is one failure, whether the 500 is sent inside or outside the middleware."""
    c = TestClient(build("api"), raise_server_exceptions=raise_server_exceptions)
    if raise_server_exceptions:
        with pytest.raises(RuntimeError, match="starlette view broke"):
            c.get("/boom")
    else:
        assert c.get("/boom").status_code == 500
    assert counts() == (1, 1, 1)


def test_in6_asgi_streaming_recorded_by_status_unread():
    """IN-6: the outcome is taken from the response start; the body passes through untouched."""
    STREAM["started"] = False
    seen = []

    async def go():
        app = added("api")
        messages = iter([{"type": "http.request", "body": b"", "more_body": False}])

        async def receive():
            return next(messages, {"type": "http.disconnect"})

        async def send(message):
            if message["type"] == "http.response.start":
                seen.append(("start", STREAM["started"], counts()))
            else:
                seen.append(("body", message.get("body")))

        scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": "GET",
            "scheme": "http",
            "path": "/stream",
            "raw_path": b"/stream",
            "query_string": b"",
            "root_path": "",
            "headers": [],
            "server": ("t", 80),
            "client": ("127.0.0.1", 1),
        }
        await app(scope, receive, send)

    asyncio.run(go())
    assert seen[0] == ("start", False, (1, 1, 1))
    assert b"".join(part[1] or b"" for part in seen[1:]) == b"ab"


def test_in6_asgi_through_httpx_asgi_transport():
    """IN-6: the same recording through httpx's ASGI transport."""

    async def go():
        transport = httpx.ASGITransport(app=added("api"))
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as c:
            return [(await c.get(p)).status_code for p in ("/status/200", "/status/500", "/own", "/relay")]

    assert asyncio.run(go()) == [200, 500, 429, 429]
    assert counts() == (3, 2, 2)


@pytest.mark.parametrize("build", [added, wrapped])
def test_in6_asgi_without_a_service_name_records_nothing(build):
    """IN-6: no service name, no breaker."""
    with TestClient(build(None), raise_server_exceptions=False) as c:  # lifespan passes through
        for path in ("/status/200", "/status/500", "/relay", "/own", "/boom"):
            c.get(path)
    assert registry.names() == []


def _scope(path="/"):
    return {"type": "http", "method": "GET", "path": path, "headers": [], "query_string": b""}


def test_in6_asgi_cancelled_request_gives_the_trial_slot_back(clock):
    """IN-6: a BaseException (client gone) is not an outcome; a trial slot is returned."""
    breaker = registry.get("api")
    for _ in range(5):
        breaker.record_failure(breaker.acquire())
    clock.advance(60)

    async def cancelled(scope, receive, send):
        raise asyncio.CancelledError()

    async def silent(scope, receive, send):
        return None

    async def go(app):
        async def receive():
            return {"type": "http.disconnect"}

        async def send(message):
            pass

        await BaldurASGIMiddleware(app, "api")(_scope(), receive, send)

    with pytest.raises(asyncio.CancelledError):
        asyncio.run(go(cancelled))
    asyncio.run(go(silent))
    snap = breaker.snapshot()
    assert (snap["state"], snap["half_open_trials"]) == ("half_open", 0)


def test_in6_asgi_passes_other_scope_types_through():
    """IN-6: websocket and lifespan scopes are not recorded."""
    got = []

    async def app(scope, receive, send):
        got.append(scope["type"])

    async def noop(*a):
        return {}

    middleware = BaldurASGIMiddleware(app, "api")
    asyncio.run(middleware({"type": "websocket", "path": "/ws"}, noop, noop))
    asyncio.run(middleware({"type": "lifespan"}, noop, noop))
    assert got == ["websocket", "lifespan"]
    assert registry.names() == []


@pytest.mark.parametrize("bad", ["", 7, ["api"]])
def test_in6_asgi_bad_service_name_is_a_config_error(bad):
    """IN-6: a service name must be a non-empty string (or None)."""
    with pytest.raises(ConfigError, match="service_name"):
        BaldurASGIMiddleware(Starlette(), service_name=bad)


@pytest.mark.parametrize("build", [added, wrapped])
def test_in3_in7_a_starlette_view_s_mark_reaches_the_middleware(build):
    """IN-3, IN-7: a Starlette view that marks its request (mark_rate_limited) refuses with a
    plain 429: the middleware, inside or outside Starlette's own stack, leaves it out; the
    same 429 unmarked counts."""
    from baldur_django import mark_rate_limited

    async def refuse(request):
        if request.query_params.get("mark"):
            mark_rate_limited(request)
        return PlainTextResponse("app said no", status_code=429)

    app = build("api")
    inner = app.app if isinstance(app, BaldurASGIMiddleware) else app
    inner.router.routes.append(Route("/refuse", refuse))
    c = TestClient(app)
    assert c.get("/refuse?mark=1").status_code == 429
    assert counts() == (0, 0, 0)
    assert c.get("/refuse").status_code == 429
    assert counts() == (1, 1, 1)

"""IN-7: the four inbound shells admit and record through one policy (``core/inbound.py``).

The same scenarios run through Django's ``CircuitBreakerMiddleware`` in sync and in async
mode, the bare ``BaldurASGIMiddleware`` and the ``BaldurFlask`` extension, each filing
against a breaker called ``shop``; every shell must give the same outcome. The scenarios
marked "differed" are the ones where the shells disagreed before the policy was shared:

* a 429 carrying only ``X-RateLimit-Limit``: Django left it out (IN-3), ASGI and Flask
  counted it;
* a 429 from a request the application marked (``mark_rate_limited``): Django left it out,
  ASGI and Flask counted it (neither looked at a mark);
* a success status carrying ``X-Baldur-Shed``: Django counted a success, ASGI and Flask
  left it out (the header only marks the package's own 503);
* an exception escaping the application: ASGI and Flask counted one failure, Django gave
  the permit back uncounted;
* load shedding (``BALDUR_MIDDLEWARE_SHED_LOAD``): only Django answered the 503 with
  ``Retry-After`` and ``X-Baldur-Shed``; ASGI and Flask ran the application anyway;
* store I/O on an event loop: the ASGI middleware admitted and recorded on the loop
  (see ``test_inbound_off_loop.py``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from django.http import HttpResponse
from django.test import AsyncRequestFactory, RequestFactory, override_settings
from flask import Flask
from flask import request as flask_request

from baldur_django import mark_rate_limited
from baldur_django.contrib.asgi import BaldurASGIMiddleware
from baldur_django.contrib.flask import BaldurFlask
from baldur_django.core.registry import registry
from baldur_django.middleware import CircuitBreakerMiddleware

SERVICE = "shop"


@dataclass
class Behaviour:
    """What the application does with the one request of a scenario."""

    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    mark: bool = False
    raises: BaseException | None = None


@dataclass
class Answer:
    """What the client got: status and headers (lower-cased names), or the exception."""

    status: int | None
    headers: dict[str, str]
    error: BaseException | None = None


# ------------------------------------------------------------------ the four shells
def run_django_sync(behaviour: Behaviour, ran: list[bool]) -> Answer:
    def view(request: Any) -> Any:
        ran.append(True)
        if behaviour.mark:
            mark_rate_limited(request)
        if behaviour.raises is not None:
            raise behaviour.raises
        return HttpResponse("body", status=behaviour.status, headers=behaviour.headers)

    try:
        response = CircuitBreakerMiddleware(view)(RequestFactory().get("/orders/1"))
    except BaseException as error:
        return Answer(None, {}, error)
    return Answer(response.status_code, {k.lower(): v for k, v in response.headers.items()})


def run_django_async(behaviour: Behaviour, ran: list[bool]) -> Answer:
    async def view(request: Any) -> Any:
        ran.append(True)
        if behaviour.mark:
            mark_rate_limited(request)
        if behaviour.raises is not None:
            raise behaviour.raises
        return HttpResponse("body", status=behaviour.status, headers=behaviour.headers)

    middleware = CircuitBreakerMiddleware(view)

    async def go() -> Any:
        return await middleware(AsyncRequestFactory().get("/orders/1"))

    try:
        response = asyncio.run(go())
    except BaseException as error:
        return Answer(None, {}, error)
    return Answer(response.status_code, {k.lower(): v for k, v in response.headers.items()})


def run_asgi(behaviour: Behaviour, ran: list[bool]) -> Answer:
    from starlette.requests import Request

    async def app(scope: Any, receive: Any, send: Any) -> None:
        ran.append(True)
        if behaviour.mark:
            mark_rate_limited(Request(scope))  # a Starlette request marks its scope
        if behaviour.raises is not None:
            raise behaviour.raises
        headers = [(k.lower().encode(), v.encode()) for k, v in behaviour.headers.items()]
        await send({"type": "http.response.start", "status": behaviour.status, "headers": headers})
        await send({"type": "http.response.body", "body": b"body"})

    middleware = BaldurASGIMiddleware(app, service_name=SERVICE)
    sent: list[Any] = []
    scope = {"type": "http", "method": "GET", "path": "/orders/1", "headers": [], "query_string": b""}

    async def receive() -> Any:
        return {"type": "http.request", "body": b""}

    async def send(message: Any) -> None:
        sent.append(message)

    try:
        asyncio.run(middleware(scope, receive, send))
    except BaseException as error:
        return Answer(None, {}, error)
    start = next(m for m in sent if m["type"] == "http.response.start")
    return Answer(start["status"], {bytes(k).decode(): bytes(v).decode() for k, v in start["headers"]})


def run_flask(behaviour: Behaviour, ran: list[bool]) -> Answer:
    app = Flask("baldur_one_policy")
    app.testing = True  # exceptions propagate to the client (the extension's teardown sees them)

    @app.get("/orders/1")
    def view() -> Any:
        ran.append(True)
        if behaviour.mark:
            mark_rate_limited(flask_request)
        if behaviour.raises is not None:
            raise behaviour.raises
        return "body", behaviour.status, behaviour.headers

    BaldurFlask(app, service_name=SERVICE)
    try:
        response = app.test_client().get("/orders/1")
    except BaseException as error:
        return Answer(None, {}, error)
    return Answer(response.status_code, {k.lower(): v for k, v in response.headers.items()})


SHELLS: dict[str, Callable[[Behaviour, list[bool]], Answer]] = {
    "django-sync": run_django_sync,
    "django-async": run_django_async,
    "asgi": run_asgi,
    "flask": run_flask,
}


@pytest.fixture(params=list(SHELLS))
def shell(request, settings):
    """One of the four shells, every Django path filed against the ``shop`` breaker."""
    settings.BALDUR_DOMAIN_MAPPING = {"/orders/": SERVICE}
    return SHELLS[request.param]


def counts() -> tuple[int, int, int]:
    snap = registry.get(SERVICE).snapshot()
    return snap["window_calls"], snap["window_failures"], snap["consecutive_failures"]


# ------------------------------------------------------------------ recording
SCENARIOS = {
    "plain 200 is a success": (Behaviour(200), (1, 0, 0)),
    "404 is a success": (Behaviour(404), (1, 0, 0)),
    "500 is a failure": (Behaviour(500), (1, 1, 1)),
    "relayed 429 is a failure": (Behaviour(429, {"Retry-After": "30"}), (1, 1, 1)),
    "429 with X-RateLimit-Mode is the app's own": (Behaviour(429, {"X-RateLimit-Mode": "enforce"}), (0, 0, 0)),
    "differed: 429 with X-RateLimit-Limit alone is the app's own": (
        Behaviour(429, {"X-RateLimit-Limit": "5"}),
        (0, 0, 0),
    ),
    "differed: 429 from a marked request is the app's own": (Behaviour(429, mark=True), (0, 0, 0)),
    "marked request's 500 still counts": (Behaviour(500, mark=True), (1, 1, 1)),
    "the package's shed 503 is never counted": (Behaviour(503, {"X-Baldur-Shed": "open"}), (0, 0, 0)),
    "differed: a 200 carrying X-Baldur-Shed is still a success": (
        Behaviour(200, {"X-Baldur-Shed": "open"}),
        (1, 0, 0),
    ),
    "differed: an exception escaping the app is one failure": (
        Behaviour(raises=RuntimeError("app broke")),
        (1, 1, 1),
    ),
}


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_in7_every_shell_records_the_same_outcome(shell, clock, scenario):
    """IN-7, IN-1..IN-3, IN-6: one request through each shell leaves the same counts on the
    breaker; own answers (the shed 503, X-RateLimit-Mode/-Limit 429s, marked requests) are
    left out everywhere, and the response reaches the client unchanged."""
    behaviour, expected = SCENARIOS[scenario]
    ran: list[bool] = []
    answer = shell(behaviour, ran)
    assert ran == [True]
    if behaviour.raises is not None:
        assert answer.error is behaviour.raises
    else:
        assert answer.status == behaviour.status
    assert counts() == expected


def test_in7_every_shell_honours_retry_after_of_a_relayed_429(shell, clock):
    """IN-7, IN-2: a relayed 429's Retry-After starts the same cooldown in every shell."""
    shell(Behaviour(429, {"Retry-After": "30"}), [])
    assert registry.get(SERVICE).snapshot()["cooldown_remaining"] == pytest.approx(30.0)


def test_in7_a_cancelled_request_is_given_back_in_every_shell(shell, clock):
    """IN-7: a BaseException that is not an Exception (the client went away) is no outcome:
    a HALF_OPEN trial slot is given back, nothing is counted."""
    breaker = registry.get(SERVICE)
    for _ in range(5):
        breaker.record_failure(breaker.acquire())
    clock.advance(60)
    answer = shell(Behaviour(raises=KeyboardInterrupt()), [])
    assert isinstance(answer.error, KeyboardInterrupt)
    snap = breaker.snapshot()
    assert (snap["state"], snap["half_open_trials"]) == ("half_open", 0)


# ------------------------------------------------------------------ admission
def _trip(clock) -> None:
    breaker = registry.get(SERVICE)
    for _ in range(5):
        breaker.record_failure(breaker.acquire())
    assert breaker.state.value == "open"
    clock.advance(17.5)  # 42.5 s of the default 60 s recovery timeout left


def test_in7_refused_requests_run_unrecorded_in_every_shell(shell, clock):
    """IN-7, IN-1, IN-6: while the breaker refuses and load shedding is off, the request runs
    and its response is not recorded."""
    _trip(clock)
    before = registry.get(SERVICE).snapshot()
    ran: list[bool] = []
    assert shell(Behaviour(500), ran).status == 500
    assert ran == [True]
    after = registry.get(SERVICE).snapshot()
    assert (after["window_calls"], after["window_failures"]) == (before["window_calls"], before["window_failures"])


def test_in7_differed_every_shell_sheds_load_with_the_same_answer(shell, clock):
    """IN-7, IN-1 (differed: ASGI and Flask never shed): with BALDUR_MIDDLEWARE_SHED_LOAD on,
    a refused request gets the package's 503 with Retry-After (whole seconds, rounded up) and
    X-Baldur-Shed naming the reason, the application does not run, and nothing is counted."""
    _trip(clock)
    before = registry.get(SERVICE).snapshot()
    ran: list[bool] = []
    with override_settings(BALDUR_MIDDLEWARE_SHED_LOAD=True):
        answer = shell(Behaviour(200), ran)
    assert ran == []
    assert answer.status == 503
    assert answer.headers["retry-after"] == "43"
    assert answer.headers["x-baldur-shed"] == "open"
    assert answer.headers["content-type"].startswith("text/plain")
    after = registry.get(SERVICE).snapshot()
    assert (after["window_calls"], after["state"]) == (before["window_calls"], "open")


def test_in7_half_open_full_is_the_shed_reason_in_every_shell(shell, clock):
    """IN-7, IN-1: a HALF_OPEN breaker with its trials taken sheds with reason half_open_full."""
    _trip(clock)
    clock.advance(60)
    breaker = registry.get(SERVICE)
    trials = [breaker.acquire() for _ in range(breaker.config.half_open_max_calls)]
    assert all(trial.trial for trial in trials)
    with override_settings(BALDUR_MIDDLEWARE_SHED_LOAD=True):
        answer = shell(Behaviour(200), [])
    assert (answer.status, answer.headers["x-baldur-shed"], answer.headers["retry-after"]) == (
        503,
        "half_open_full",
        "1",
    )
    for trial in trials:
        breaker.record_ignored(trial)

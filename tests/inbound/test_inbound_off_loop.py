"""IN-7, ST-2, ST-4: the async inbound shells never run store I/O on the event loop.

The shared store is a "Redis" that accepts connections and answers nothing until a ticker
task on the same loop has ticked a few times during the hung call (``hung_redis`` and
``TickWatch`` of ``tests/hung_store.py``: ticks are counted, never timed). Requests go
through the bare ASGI middleware (issue 18, bug 4: it used to admit and record on the loop)
and through Django's async ``CircuitBreakerMiddleware``. The loop ticks while the store call
hangs (store I/O on the loop would let it tick 0 times) and the requests still get their
answers (local judgement, ST-4).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from baldur_django.contrib.asgi import BaldurASGIMiddleware
from baldur_django.core.registry import registry
from baldur_django.core.stores.memory import MemoryStore
from baldur_django.core.stores.redis import RedisStore, connect
from tests.hung_store import HANG_LIMIT, TICKS, TickWatch
from tests.stores.test_async_off_loop import LoopSpy

SERVICE = "checkout"


async def _asgi_request(middleware: Any) -> int:
    sent: list[Any] = []
    scope = {"type": "http", "method": "GET", "path": "/orders/1", "headers": [], "query_string": b""}

    async def receive() -> Any:
        return {"type": "http.request", "body": b""}

    async def send(message: Any) -> None:
        sent.append(message)

    await middleware(scope, receive, send)
    return int(next(m for m in sent if m["type"] == "http.response.start")["status"])


def asgi_shell(statuses: list[int]) -> Any:
    codes = iter(statuses)

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": next(codes), "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    middleware = BaldurASGIMiddleware(app, service_name=SERVICE)
    return lambda: _asgi_request(middleware)


def django_async_shell(statuses: list[int]) -> Any:
    from django.http import HttpResponse
    from django.test import AsyncRequestFactory

    from baldur_django.middleware import CircuitBreakerMiddleware

    codes = iter(statuses)

    async def view(request: Any) -> Any:
        return HttpResponse(status=next(codes))

    middleware = CircuitBreakerMiddleware(view)
    factory = AsyncRequestFactory()

    async def one() -> int:
        return int((await middleware(factory.get("/orders/1"))).status_code)

    return one


SHELLS = {"asgi": asgi_shell, "django-async": django_async_shell}


@pytest.fixture(params=list(SHELLS))
def shell(request, settings):
    settings.BALDUR_DOMAIN_MAPPING = {"/orders/": SERVICE}
    return SHELLS[request.param]


def test_in7_hung_redis_never_stalls_the_loop_under_the_inbound_shells(shell, hung_redis):
    """IN-7, ST-4 (issue 18 bug 4): a shared breaker's first-use consult waits on a Redis
    that answers nothing until the loop has ticked TICKS times during the call; concurrent
    requests through the shell all get the app's answer and the loop kept ticking while the
    admission's store call hung (on the loop it would have ticked 0 times)."""
    watch = TickWatch(RedisStore(connect(hung_redis.url(), socket_timeout=HANG_LIMIT)), hung_redis)
    registry.set_store(watch)
    one = shell([200, 200, 200, 200])

    async def requests() -> list[int]:
        return list(await asyncio.gather(one(), one(), one(), one()))

    assert asyncio.run(watch.run(requests())) == [200, 200, 200, 200]
    assert watch.most_ticks_during_a_call() >= TICKS, f"store calls and the ticks during them: {watch.during}"
    assert hung_redis.released, "the admission must have hung on the store until the loop had ticked"
    assert registry.get(SERVICE).snapshot()["store_available"] is False


def test_in7_every_store_operation_of_the_asgi_middleware_runs_off_the_loop(clock):
    """IN-7, ST-2: the ASGI middleware's first-use consult, a trip, a probe and the trial's
    outcome all reach the shared store from worker threads, never from the loop's thread."""
    spy = LoopSpy(MemoryStore(now=clock.wall))
    registry.set_store(spy)
    registry.get(SERVICE, {"failure_threshold": 1, "recovery_timeout": 5, "half_open_max_calls": 1})
    one = asgi_shell([503, 200])

    async def scenario() -> list[int]:
        first = await one()
        assert await asyncio.to_thread(spy.wait_for, "trip")
        clock.advance(5)
        second = await one()
        return [first, second]

    assert asyncio.run(scenario()) == [503, 200]
    assert {"load", "trip", "acquire_probe", "finish_probe"} <= set(spy.ops)
    assert spy.on_loop == []
    assert registry.get(SERVICE).state.value == "closed"

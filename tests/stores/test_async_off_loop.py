"""ST-2, ST-4, CB-9: an async caller never blocks its event loop on store I/O.

A shared breaker consults its store at first use, on its sync interval, for probes and for
trial outcomes. From an ``async def`` those round trips run in a worker thread: during a
Redis outage (an endpoint that accepts connections and never answers) a ticker task on
the same loop keeps ticking while the consult hangs (ticks counted, never timed: see
tests/hung_store.py), and the protected call still returns its value under local
judgement (ST-4).
"""

from __future__ import annotations

import asyncio
import threading

import pytest

import baldur_django as baldur
from baldur_django.core.breaker import core_of
from baldur_django.core.stores.memory import MemoryStore
from baldur_django.core.stores.redis import RedisStore, connect
from tests.hung_store import HANG_LIMIT, TICKS, TickWatch


def test_st4_hung_redis_never_blocks_the_event_loop(fresh_registry, hung_redis):
    """ST-2, ST-4: the first-use consult of an async call hits a Redis that never answers
    until the event loop has ticked TICKS times during the consult (tests/hung_store.py);
    the loop does tick (the consult runs off it) and the call still returns its value
    under local judgement."""
    watch = TickWatch(RedisStore(connect(hung_redis.url(), socket_timeout=HANG_LIMIT)), hung_redis)
    fresh_registry.set_store(watch)

    @baldur.aprotected("heartbeat")
    async def call() -> str:
        return "value"

    assert asyncio.run(watch.run(call())) == "value"
    assert watch.most_ticks_during_a_call() >= TICKS, f"store calls and the ticks during them: {watch.during}"
    assert hung_redis.released, "the consult must have hung until the loop had ticked"
    assert baldur.get_breaker("heartbeat").snapshot()["store_available"] is False


def test_st4_tick_watch_sees_a_blocking_consult(fresh_registry, hung_redis):
    """Meta-test of the watch above: the same consult made on the loop's thread (as the
    wrapper did before) blocks the ticker, so it sees no tick during the call; the hang
    ends only at the socket timeout."""
    watch = TickWatch(RedisStore(connect(hung_redis.url(), socket_timeout=0.25)), hung_redis)
    fresh_registry.set_store(watch)
    breaker = baldur.get_breaker("heartbeat-blocking")

    async def blocking() -> object:
        await asyncio.sleep(0)
        return core_of(breaker).acquire_slow()  # store I/O on the loop's own thread

    assert asyncio.run(watch.run(blocking())) is not None
    assert [op for op, _ in watch.during] == ["load"]
    assert watch.most_ticks_during_a_call() == 0 and watch.ticks >= 1
    assert not hung_redis.released


class LoopSpy:
    """Wraps a store; records whether any operation ran on a thread with a running event loop."""

    def __init__(self, inner):
        self.inner = inner
        self.backend = inner.backend
        self.on_loop: list[str] = []
        self.ops: list[str] = []
        self.finished: dict[str, threading.Event] = {}

    def wait_for(self, op: str) -> bool:
        return self.finished.setdefault(op, threading.Event()).wait(5)

    def __getattr__(self, op):
        target = getattr(self.inner, op)

        def call(*args, **kwargs):
            self.ops.append(op)
            try:
                asyncio.get_running_loop()
            except RuntimeError:
                pass
            else:
                self.on_loop.append(op)
            try:
                return target(*args, **kwargs)
            finally:
                self.finished.setdefault(op, threading.Event()).set()

        return call


@pytest.mark.parametrize("retry", [False, True], ids=["no-retry", "retry"])
def test_st2_every_store_operation_of_async_calls_runs_off_the_loop(fresh_registry, clock, retry):
    """ST-2, CB-6: first use, a trip, a probe and its outcome from async calls, with and
    without the retry stage (a trial is one attempt): each store operation ran, and none of
    them on the event loop's thread."""
    spy = LoopSpy(MemoryStore(now=clock.wall))
    fresh_registry.set_store(spy)
    failures = 3 if retry else 1  # the default retry policy makes 3 attempts
    outcomes = iter([RuntimeError("down")] * failures + ["up"])
    service = f"off-loop-{retry}"

    @baldur.aprotected(
        service,
        retry=retry,
        failure_threshold=1,
        failure_rate_threshold=0,
        recovery_timeout=5,
        half_open_max_calls=1,
        sliding_window_size=10,
        minimum_calls=1,
    )
    async def call() -> str:
        outcome = next(outcomes)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    async def scenario() -> None:
        with pytest.raises(RuntimeError):
            await call()  # first use consult, then a trip written to the store
        # the trip is already in force locally; its store write runs in the default executor
        assert await asyncio.to_thread(spy.wait_for, "trip")
        # a little past the recovery timeout: the retry stage's jittered sleeps leave the clock
        # at a fraction, and (t + 5) - t is not always 5.0 in floating point
        clock.advance(5.001)
        assert await call() == "up"  # probe acquired and its success written

    asyncio.run(scenario())
    assert {"load", "trip", "acquire_probe", "finish_probe"} <= set(spy.ops)
    assert spy.on_loop == []
    assert baldur.get_breaker(service).state is baldur.CircuitState.CLOSED


def test_st2_async_middleware_never_touches_the_store_on_the_loop(fresh_registry, clock, settings):
    """ST-2, IN-1: the async CircuitBreakerMiddleware's first-use consult, a trip, a probe and
    its outcome all reach the shared store from worker threads, never from the loop."""
    from django.http import HttpResponse
    from django.test import AsyncRequestFactory

    from baldur_django.middleware import CircuitBreakerMiddleware

    settings.BALDUR_SERVICES = {"default": {"failure_threshold": 1, "recovery_timeout": 5, "half_open_max_calls": 1}}
    spy = LoopSpy(MemoryStore(now=clock.wall))
    fresh_registry.set_store(spy)
    statuses = iter([503, 200])

    async def view(request):
        return HttpResponse(status=next(statuses))

    middleware = CircuitBreakerMiddleware(view)
    factory = AsyncRequestFactory()

    async def scenario() -> list[int]:
        first = await middleware(factory.get("/anything"))
        assert await asyncio.to_thread(spy.wait_for, "trip")
        clock.advance(5)
        second = await middleware(factory.get("/anything"))
        return [first.status_code, second.status_code]

    assert asyncio.run(scenario()) == [503, 200]
    assert {"load", "trip", "acquire_probe", "finish_probe"} <= set(spy.ops)
    assert spy.on_loop == []
    assert baldur.get_breaker("default").state is baldur.CircuitState.CLOSED

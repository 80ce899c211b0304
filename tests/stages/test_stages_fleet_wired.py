"""RS-3, RS-4: the service stages shared through a real Redis server (127.0.0.1:6379,
DB 5, a key prefix per test): the Retry-After gate learnt by a second worker, and the
fleet bulkhead of a decorated function across two processes.

Skipped when Redis is unreachable, except with CI=true where that is a failure.
"""

from __future__ import annotations

import multiprocessing
import socket
import uuid

import pytest

import baldur_django as baldur
from baldur_django.core.breaker import CircuitBreaker
from baldur_django.core.events import bus
from baldur_django.core.registry import registry
from baldur_django.core.stores.base import safe_key
from baldur_django.core.stores.redis import RedisStore, connect
from baldur_django.core.sync import StoreGuard
from baldur_django.core.testing import FakeClock
from baldur_django.core.wrappers import sync_wrapper
from tests.conftest import need_server
from tests.stages import wired_worker

URL = wired_worker.REDIS_URL
JOIN = 120.0


class Status:
    def __init__(self, status_code: int, retry_after: str | None = None) -> None:
        self.status_code = status_code
        self.headers = {} if retry_after is None else {"Retry-After": retry_after}


def _reachable() -> bool:
    try:
        with socket.create_connection(("127.0.0.1", 6379), timeout=0.5):
            return True
    except OSError:
        return False


@pytest.fixture
def prefix():
    """A key prefix of this test's own on DB 5; its keys are deleted afterwards."""
    need_server("Redis at 127.0.0.1:6379", _reachable())
    name = f"w-{uuid.uuid4().hex[:12]}"
    yield name
    client = connect(URL)
    for key in client.scan_iter(f"{name}*"):
        client.delete(key)
    client.close()


class Provider:
    """The rate-limited provider: its first answer is a 429 asking for 20 s of quiet."""

    def __init__(self) -> None:
        self.reached = 0

    def call(self) -> Status:
        self.reached += 1
        return Status(429, "20") if self.reached == 1 else Status(200)


def _second_worker(prefix: str, clock: FakeClock, provider: Provider):
    """Another worker's breaker "api" (a core of its own, its own clock) on the same store,
    and its protected call."""
    store = RedisStore(connect(URL, socket_timeout=5.0), prefix=prefix)
    guard = StoreGuard(store, interval=lambda: 60.0, publish=bus.publish, monotonic=clock.monotonic, wall=clock.wall)
    breaker = CircuitBreaker("api", baldur.get_breaker("api").config, clock=clock)
    breaker.use_store(guard)
    return sync_wrapper(breaker, provider.call, None, lambda: "quiet")


def test_rs3_one_call_reaches_the_provider_during_its_retry_after_across_two_workers(clock, prefix):
    """RS-3 (issue 28's scenario): two workers share a Redis store, honor_retry_after on.
    Worker A meets a 429 with Retry-After: 20 and writes the gate's end once; worker B
    learns it at its next read (its first call here) and refuses too. Over the 20 s, with
    both workers calling every second, the provider is reached once."""
    registry.set_store(RedisStore(connect(URL, socket_timeout=5.0), prefix=prefix))
    provider = Provider()
    call_a = baldur.protected("api", honor_retry_after=True, fallback=lambda: "quiet")(provider.call)
    other = FakeClock()
    call_b = _second_worker(prefix, other, provider)
    assert call_a().status_code == 429
    answers = []
    for _ in range(19):
        answers += [call_a(), call_b()]
        clock.advance(1)
        other.advance(1)
    assert provider.reached == 1
    assert answers == ["quiet"] * 38


def test_rs3_the_gate_s_end_is_written_once_per_answer(clock, prefix):
    """RS-3: the gate's end is one Redis key, written by the answer, not per call."""
    registry.set_store(RedisStore(connect(URL, socket_timeout=5.0), prefix=prefix))
    provider = Provider()
    call_a = baldur.protected("api", honor_retry_after=True, fallback=lambda: "quiet")(provider.call)
    call_a()
    client = connect(URL)
    key = f"{prefix}:gate:{{{safe_key('api')}}}"
    left = client.pttl(key)
    assert 15_000 < left <= 20_000
    client.set(key, "0", keepttl=True)  # a marker: a write per call would replace it
    for _ in range(5):
        assert call_a() == "quiet"
    assert client.get(key) == b"0"


def test_rs4_a_fleet_bulkhead_through_a_decorated_function_across_two_processes(prefix):
    """RS-4: bulkhead_scope="fleet", one slot: while a process holds it inside the
    decorated function, the same function in another process is refused (its fallback
    answers); once given back, the slot is free again."""
    ctx = multiprocessing.get_context("spawn")
    inside, release, out = ctx.Event(), ctx.Event(), ctx.Queue()
    holder = ctx.Process(target=wired_worker.hold_a_slot, args=(prefix, inside, release, out))
    holder.start()
    try:
        assert inside.wait(JOIN), "the holder never entered the function"
        caller = ctx.Process(target=wired_worker.try_a_call, args=(prefix, out))
        caller.start()
        caller.join(JOIN)
        assert out.get(timeout=JOIN) == ("caller", "refused")
    finally:
        release.set()
    assert out.get(timeout=JOIN) == ("holder", "held")
    holder.join(JOIN)
    client = connect(URL)
    assert client.zcard(f"{prefix}:{{{safe_key('pay')}}}:bulkhead") == 0  # the slot was given back

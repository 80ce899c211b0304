"""CB-12, HC-1, ST-2, EM-7: per-host breakers stay bounded when many hosts go idle.

10,000 hosts go through one ``BreakerAdapter`` (a fake transport: no sockets), then stay
idle for ``BALDUR_REGISTRY_IDLE_SECONDS`` on a FakeClock: the process's registry, the
adapter's routes and the Prometheus series shrink back; on the real Redis server the idle
records carry an expiry, and once aged past it (``PEXPIREAT`` in the past: the passing of
that much time to Redis) the keys and the registry set are gone. An OPEN or forced breaker
never leaves; a decorated function's breaker that left keeps working and comes back.
"""

from __future__ import annotations

import gc
import io
import threading

import pytest
import requests
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from requests.adapters import BaseAdapter
from requests.models import Response

import baldur_django as baldur
from baldur_django.contrib import prometheus
from baldur_django.contrib.outbound import timeout_bound
from baldur_django.contrib.requests import BreakerAdapter, CircuitOpenRequestError
from baldur_django.core.config import settings as baldur_settings
from baldur_django.core.lease import LEASE_MARGIN, call_bound, probe_lease
from baldur_django.core.registry import Registry
from baldur_django.core.stores.memory import MemoryStore
from baldur_django.core.stores.redis import RedisStore
from tests.stores.conftest import redis_client  # noqa: F401 - a fixture

HOSTS = 10_000
IDLE = 3600.0


class FakeTransport(BaseAdapter):
    """Answers every request with *status* at once; counts what it was sent."""

    def __init__(self, status: int = 200) -> None:
        super().__init__()
        self.status = status
        self.sent = 0

    def send(self, request, **kwargs):
        self.sent += 1
        response = Response()
        response.status_code = self.status
        response.request = request
        response.url = request.url
        response.raw = io.BytesIO(b"")
        return response

    def close(self) -> None:
        pass


@pytest.fixture
def idle_settings(monkeypatch):
    monkeypatch.setenv("BALDUR_REGISTRY_IDLE_SECONDS", str(IDLE))
    baldur_settings.reset()
    prometheus._tally.reset()
    yield
    prometheus._tally.reset()


def crawl(adapter: BreakerAdapter, hosts: int, *, timeout: float = 8.0) -> None:
    for i in range(hosts):
        adapter.send(requests.Request("GET", f"http://h{i}.example/").prepare(), timeout=timeout)


def idle_for(clock, registry, seconds: float) -> list[str]:
    """Let *seconds* pass with a sweep each minute (what a scrape a minute does); returns
    every name that left."""
    gone: list[str] = []
    step = 60.0
    passed = 0.0
    while passed < seconds:
        clock.advance(step)
        passed += step
        gone += registry.sweep()
    return gone


def series(scrape_registry: CollectorRegistry) -> int:
    text = generate_latest(scrape_registry).decode()
    return sum(len(family.samples) for family in text_string_to_metric_families(text))


def test_cb12_ten_thousand_idle_hosts_leave_the_registry_routes_and_metrics(clock, fresh_registry, idle_settings):
    """CB-12, HC-1, EM-7: 10,000 per-host breakers, then an idle hour: the registry, the
    adapter's routes and the scrape's series are back to what they were before the crawl."""
    scrape_registry = CollectorRegistry()
    prometheus.install(scrape_registry)
    before = series(scrape_registry)
    adapter = BreakerAdapter(adapter=FakeTransport(), max_hosts=HOSTS * 2)
    crawl(adapter, HOSTS)
    assert len(fresh_registry) == HOSTS
    assert len(adapter._breakers.entries) == HOSTS
    busy = series(scrape_registry)
    assert busy > HOSTS
    idle_for(clock, fresh_registry, IDLE + 120.0)
    gc.collect()
    assert len(fresh_registry) == 0
    assert len(adapter._breakers.entries) == 0
    # freed, all but the one this thread's context last recorded an outcome of (nested-call bookkeeping)
    assert len(fresh_registry.everyone()) <= 1
    assert series(scrape_registry) == before
    # a host used again gets a fresh breaker that works
    crawl(adapter, 1)
    assert fresh_registry.names() == ["h0.example"]


def test_cb12_a_used_breaker_stays_while_idle_ones_leave(clock, fresh_registry, idle_settings):
    """CB-12: a breaker used every few minutes never counts as idle; the others leave."""
    adapter = BreakerAdapter(adapter=FakeTransport())
    crawl(adapter, 5)
    for _ in range(70):  # 70 minutes, the first host called every 5 of them
        clock.advance(60.0)
        if _ % 5 == 0:
            crawl(adapter, 1)
        fresh_registry.sweep()
    assert fresh_registry.names() == ["h0.example"]


def test_cb12_with_no_look_after_the_crawl_the_hosts_leave_at_the_first_look_past_their_idle_time(
    clock, fresh_registry, idle_settings
):
    """CB-12 (issue 27, found by the incident rehearsal): hosts crawled, then nothing looks
    for idle breakers (no breaker made, no scrape) until the idle time and two sweep
    intervals have passed; the first look then lets every one go, as docs/incident.md
    promises: a breaker's idle time counts from its last call (to within a second), not
    from the first look that sees that call."""
    adapter = BreakerAdapter(adapter=FakeTransport())
    crawl(adapter, 5)
    clock.advance(IDLE + 2 * 60.0 + 1)
    fresh_registry.sweep()
    assert fresh_registry.names() == []


def test_cb12_a_call_just_before_an_unwatched_stretch_keeps_its_host(clock, fresh_registry, idle_settings):
    """CB-12: the idle time counts from a host's last call even when no look saw that call: a
    host called 10 s before the look stays, the hosts called an idle time ago leave; a
    minute later nothing more has left, and the kept host leaves once its own idle time
    has passed."""
    adapter = BreakerAdapter(adapter=FakeTransport())
    crawl(adapter, 3)
    clock.advance(IDLE + 60.0)
    crawl(adapter, 1)  # h0 again: its own creation-free call, no look since the crawl
    clock.advance(10.0)
    fresh_registry.sweep(now=True)
    assert fresh_registry.names() == ["h0.example"]
    clock.advance(60.0)
    fresh_registry.sweep(now=True)
    assert fresh_registry.names() == ["h0.example"]
    clock.advance(IDLE)
    fresh_registry.sweep(now=True)
    assert fresh_registry.names() == []


def test_cb12_open_and_forced_breakers_never_leave(clock, fresh_registry, idle_settings):
    """CB-12, OP-1: OPEN, forced-open and forced-closed breakers stay however long they are
    idle; only the CLOSED, unforced one leaves."""
    adapter = BreakerAdapter(adapter=FakeTransport(503), failure_threshold=1, recovery_timeout=10 * IDLE)
    with pytest.raises(CircuitOpenRequestError):
        for _ in range(2):
            adapter.send(requests.Request("GET", "http://down.example/").prepare(), timeout=8)
    baldur.force_open_circuit("held-open.example", ttl_minutes=1440)
    baldur.force_close_circuit("held-closed.example", ttl_minutes=1440)
    baldur.get_breaker("idle.example")
    idle_for(clock, fresh_registry, 2 * IDLE)
    assert fresh_registry.names() == ["down.example", "held-closed.example", "held-open.example"]
    assert baldur.get_breaker("down.example").state is baldur.CircuitState.OPEN


def test_cb12_a_decorated_functions_breaker_keeps_working_after_it_left(clock, fresh_registry, idle_settings):
    """CB-12, FAC-1: the breaker of a decorated function leaves when idle, but the function
    keeps using it; a lookup of its name finds the same object (so a force reaches the
    function), and a sweep that sees it used puts it back in the registry."""

    @baldur.protected("rarely-used")
    def call() -> str:
        return "ok"

    assert call() == "ok"
    idle_for(clock, fresh_registry, IDLE + 120.0)
    assert "rarely-used" not in fresh_registry.names()
    assert call() == "ok"  # still works, on its own breaker
    fresh_registry.sweep(now=True)
    assert fresh_registry.names() == ["rarely-used"]  # used since it left: back
    idle_for(clock, fresh_registry, IDLE + 120.0)
    assert "rarely-used" not in fresh_registry.names()
    baldur.force_open_circuit("rarely-used", ttl_minutes=5)  # the lookup finds the function's breaker
    assert baldur.get_breaker("rarely-used") is call.breaker
    with pytest.raises(baldur.CircuitOpenError):
        call()


def test_hc1_an_adapter_keeps_at_most_max_hosts_least_recently_used_leave_first(clock, fresh_registry, idle_settings):
    """HC-1: past its cap the adapter lets the least recently used CLOSED host go (from the
    registry too), never an OPEN one."""
    transport = FakeTransport()
    adapter = BreakerAdapter(adapter=transport, max_hosts=3, failure_threshold=1)

    def get(host: str) -> None:
        adapter.send(requests.Request("GET", f"http://{host}/").prepare(), timeout=8)

    transport.status = 503
    get("a.example")  # trips: OPEN
    transport.status = 200
    get("b.example")
    get("c.example")
    get("b.example")  # b is now more recent than c
    get("d.example")  # over the cap: a is OPEN and stays, c is the least recently used CLOSED one
    assert set(adapter._breakers.entries) == {"a.example", "b.example", "d.example"}
    assert fresh_registry.names() == ["a.example", "b.example", "d.example"]
    crawl(adapter, 50)
    assert len(adapter._breakers.entries) == 3
    assert "a.example" in adapter._breakers.entries


def test_hc1_max_hosts_setting_and_argument(monkeypatch):
    """HC-1: BALDUR_ADAPTER_MAX_HOSTS is the default cap; the argument wins; a bad one is refused."""
    monkeypatch.setenv("BALDUR_ADAPTER_MAX_HOSTS", "7")
    baldur_settings.reset()
    assert BreakerAdapter()._breakers.max_hosts == 7
    assert BreakerAdapter(max_hosts=2)._breakers.max_hosts == 2
    with pytest.raises(baldur.ConfigError, match="max_hosts"):
        BreakerAdapter(max_hosts=0)


@pytest.mark.redis
def test_st2_idle_records_expire_in_redis_and_leave_its_registry(clock, fresh_registry, idle_settings, redis_client):  # noqa: F811
    """ST-2, CB-12: on the real Redis server every idle CLOSED record carries an expiry of
    the idle time (an OPEN or forced one none); aged past it, the keys and the registry
    set's names are gone, while the OPEN and forced records stay."""
    prefix = redis_client.test_prefix
    store = RedisStore(redis_client, prefix=prefix, record_ttl=IDLE)
    fresh_registry.set_store(store)
    adapter = BreakerAdapter(adapter=FakeTransport(), max_hosts=HOSTS * 2)
    crawl(adapter, HOSTS)
    baldur.force_open_circuit("held-open.example", ttl_minutes=1440)
    baldur.get_breaker("h1.example").force_close(1440)
    keys = [key for key in redis_client.scan_iter(f"{prefix}:*", count=5000) if key.endswith(b":state")]
    assert len(keys) == HOSTS + 1
    pipe = redis_client.pipeline(transaction=False)
    for key in keys:
        pipe.pttl(key)
    ttls = dict(zip(keys, pipe.execute(), strict=True))
    assert ttls[store.key("held-open.example").encode()] == -1
    assert ttls[store.key("h1.example").encode()] == -1
    assert all(0 < ttl <= IDLE * 1000 for key, ttl in ttls.items() if ttl != -1)
    assert sum(ttl == -1 for ttl in ttls.values()) == 2
    # the idle time passes for Redis: every key with an expiry is past it
    pipe = redis_client.pipeline(transaction=False)
    for key, ttl in ttls.items():
        if ttl > 0:
            pipe.pexpireat(key, 1)
    pipe.execute()
    left = sorted(key for key in redis_client.scan_iter(f"{prefix}:*", count=5000) if key.endswith(b":state"))
    assert left == sorted([store.key("held-open.example").encode(), store.key("h1.example").encode()])
    # the registry set follows once its names are older than the idle time
    redis_client.zadd(store.registry_key, {name: 1.0 for name in store.names()})
    assert sorted(store.names()) == ["h1.example", "held-open.example"]


def test_st2_a_killed_trial_holder_frees_the_slot_within_the_request_timeout(clock, fresh_registry):
    """ST-2, HC-1: a trial through the adapter leases its shared slot for the request's
    timeout plus a margin (8 s + 1 s), not the 30 s setting: a worker killed mid-trial (its
    call never reports) blocks the next trial of another worker for 9 s only."""
    store = MemoryStore(now=clock.wall)
    fresh_registry.set_store(store)
    transport = FakeTransport(503)
    one_trial = {"failure_threshold": 1, "recovery_timeout": 10, "half_open_max_calls": 1}
    adapter = BreakerAdapter(adapter=transport, **one_trial)
    request = requests.Request("GET", "http://flaky.example/").prepare()
    adapter.send(request, timeout=(3, 5))  # 503: trips
    clock.advance(10.0)
    entered, killed = threading.Event(), threading.Event()
    transport.send = lambda *a, **k: (entered.set(), killed.wait(30))  # the trial hangs: its worker dies
    holder = threading.Thread(target=lambda: adapter.send(request, timeout=(3, 5)), daemon=True)
    holder.start()
    assert entered.wait(30)
    record = store.inspect("flaky.example").record
    assert list(record.probes.values()) == [clock.wall() + 8.0 + LEASE_MARGIN]
    other = Registry(clock=clock)  # another worker on the same store
    other.set_store(store)
    breaker = other.get("flaky.example", one_trial)
    clock.advance(8.0 + LEASE_MARGIN - 0.5)
    with pytest.raises(baldur.CircuitOpenError):
        breaker.acquire()
    clock.advance(1.0)  # a refused worker asks the store again after at most a second
    permit = breaker.acquire()  # the dead holder's lease ran out with its timeout
    assert permit.trial
    killed.set()
    holder.join(30)


def test_st2_without_a_known_bound_the_lease_is_the_setting(clock, fresh_registry):
    """ST-2: a trial with no known bound leases the setting's 30 s; call_bound() gives one
    to protect() and the decorators (the shorter of the two wins)."""
    store = MemoryStore(now=clock.wall)
    fresh_registry.set_store(store)
    breaker = baldur.get_breaker("svc")
    breaker.force_open(1)
    breaker.release()
    breaker.acquire()
    assert list(store.inspect("svc").record.probes.values()) == [clock.wall() + 30.0]
    with call_bound(4.0):
        breaker.acquire()  # a second slot of the round (three by default)
    assert sorted(store.inspect("svc").record.probes.values()) == [clock.wall() + 5.0, clock.wall() + 30.0]
    with call_bound(300.0):
        assert probe_lease(30.0) == 30.0  # a bound never lengthens the lease
    with call_bound(None):
        assert probe_lease(30.0) == 30.0


def test_hc1_timeout_bound_reads_every_client_spelling():
    """HC-1, ST-2: a number, a (connect, read) pair and httpx's phase mapping bound a call;
    anything unbounded or odd bounds nothing."""
    assert timeout_bound(8) == 8.0
    assert timeout_bound((3, 5)) == 8.0
    assert timeout_bound({"connect": 1.0, "read": 2.0, "write": 3.0, "pool": 4.0}) == 10.0
    for unbounded in (None, (3, None), {"connect": 1.0, "read": None}, "8", True, (), 0, -1.0):
        assert timeout_bound(unbounded) is None


def test_hc1_httpx_transports_give_the_request_timeout_to_the_trial_lease():
    """HC-1, ST-2: inside a request through the httpx transports the lease bound is the
    request's timeout phases summed plus the margin (sync and async)."""
    import asyncio

    import httpx

    from baldur_django.contrib.httpx import AsyncBreakerTransport, BreakerTransport

    seen: list[float] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(probe_lease(30.0))
        return httpx.Response(200)

    with httpx.Client(transport=BreakerTransport(transport=httpx.MockTransport(handler)), timeout=2.0) as client:
        client.get("http://sync.example/")

    async def main() -> None:
        transport = AsyncBreakerTransport(transport=httpx.MockTransport(handler))
        async with httpx.AsyncClient(transport=transport, timeout=httpx.Timeout(1.0, read=3.0)) as client:
            await client.get("http://async.example/")

    asyncio.run(main())
    assert seen == [4 * 2.0 + LEASE_MARGIN, 1.0 + 3.0 + 1.0 + 1.0 + LEASE_MARGIN]
    assert probe_lease(30.0) == 30.0  # nothing left behind

"""HC-5 (amended): the health view during an incident.

* an Emergency level, Level 3 included, reads "degraded" with 200 (a freeze must not take
  every instance out of rotation), and a level set or cleared by another process shows in
  the view within 1 s, in both directions (the level cache holds it 30 s otherwise);
* the view makes at most one batched store read, of the critical breakers only, however
  many breakers the process knows;
* the view answers whatever the store does: a read that hangs is waited for at most a
  short, configurable time, then the view answers from the process's own view and says so.

Time is a FakeClock; a hung store blocks on an Event the test controls; the view's read
timeout is made small so nothing waits long, and no test asserts a wall-clock bound.
"""

from __future__ import annotations

import json
import threading
import uuid

import pytest
import redis
from django.contrib.auth.models import AnonymousUser, User
from django.test import RequestFactory

from baldur_django.contrib import health
from baldur_django.contrib.health import reading
from baldur_django.core import emergency
from baldur_django.core.emergency import EmergencyMode, FileLevelBackend, MemoryLevelBackend, RedisLevelBackend
from baldur_django.core.registry import get_breaker
from baldur_django.core.stores.memory import MemoryStore
from baldur_django.core.stores.redis import RedisStore, connect
from tests.conftest import need_server
from tests.stores.conftest import reachable
from tests.stores.redis_tools import CommandCounter, counting_client

pytestmark = pytest.mark.django_db  # forces and levels write their audit rows

factory = RequestFactory()
REDIS_URL = "redis://127.0.0.1:6379/11"
SHORT = 0.05  # the read timeout the tests set: a hung read is given up quickly
DEFAULT_READ_TIMEOUT = reading.READ_TIMEOUT_SECONDS  # before any test changes it


@pytest.fixture(autouse=True)
def own_reader(monkeypatch):
    """A fresh one-read-at-a-time reader per test, so a read left hanging by one test is
    never the read another test waits for; and a read timeout long enough that a read that
    does answer is never given up on a loaded machine (the hung-store tests set it short)."""
    fresh = reading._Reader()
    monkeypatch.setattr(reading, "_reader", fresh)
    monkeypatch.setattr(reading, "READ_TIMEOUT_SECONDS", 30.0)
    yield fresh


@pytest.fixture
def fake_clock(clock):
    """The registry's FakeClock also drives the emergency level cache."""
    emergency.use_clock(clock)
    yield clock
    emergency.reset()


def call(staff=True):
    request = factory.get("/health/ready/")
    request.user = User(username="ops", is_staff=True, is_active=True) if staff else AnonymousUser()
    response = health.health_view(request)
    return response.status_code, json.loads(response.content)


class CountingStore:
    """A MemoryStore that records every operation it is asked for, with a bulk read."""

    def __init__(self, inner: MemoryStore) -> None:
        self.inner = inner
        self.backend = inner.backend
        self.calls: list[tuple[str, tuple]] = []

    def __getattr__(self, name):
        attr = getattr(self.inner, name)
        if not callable(attr):
            return attr

        def counted(*args, **kwargs):
            self.calls.append((name, args))
            return attr(*args, **kwargs)

        return counted

    def inspect_many(self, names, *, frozen=False):
        self.calls.append(("inspect_many", tuple(names)))
        return [self.inner.inspect(name, frozen=frozen) for name in names]


class HungStore(CountingStore):
    """Its bulk read blocks until the test opens *gate* (a stopped Redis)."""

    def __init__(self, inner: MemoryStore, gate: threading.Event) -> None:
        super().__init__(inner)
        self.gate = gate

    def inspect_many(self, names, *, frozen=False):
        self.calls.append(("inspect_many", tuple(names)))
        assert self.gate.wait(30), "the test never opened the gate"
        return [self.inner.inspect(name, frozen=frozen) for name in names]


# ------------------------------------------------------------------ emergency levels
@pytest.mark.parametrize("level", [1, 2, 3])
def test_hc5_every_emergency_level_is_degraded_200_never_down(fake_clock, level):
    """HC-5 amended: any Emergency level, Level 3 included, answers 200 "degraded" with the
    level in the body, to anonymous callers too; clearing it reads "ok" again."""
    emergency.set_level(level, minutes=5)
    assert call(staff=False) == (200, {"status": "degraded", "emergency_level": level})
    verdict = health.judge()
    assert verdict.http_status == 200 and f"Emergency Level {level} is in force" in verdict.reasons
    emergency.set_level(0)
    assert call(staff=False) == (200, {"status": "ok", "emergency_level": 0})


@pytest.fixture(params=["file", "redis"])
def level_backends(request, tmp_path):
    """Two backends on the same record: this process's and another process's."""
    if request.param == "file":
        path = tmp_path / "level.json"
        yield FileLevelBackend(path), FileLevelBackend(path)
        return
    need_server("Redis at 127.0.0.1:6379", reachable("127.0.0.1", 6379))
    prefix = f"hc5-{uuid.uuid4().hex[:10]}"
    clients = [redis.Redis.from_url(REDIS_URL) for _ in range(2)]
    yield RedisLevelBackend(clients[0], prefix), RedisLevelBackend(clients[1], prefix)
    clients[0].delete(f"{prefix}:{{emergency}}:level")
    for client in clients:
        client.close()


def test_hc5_level_change_elsewhere_shows_within_one_second_both_ways(fake_clock, level_backends):
    """HC-5 amended: a level set by another process (``baldur_emergency set 3``) shows in
    this process's view within 1 s, and so does clearing it, although the level cache
    (BALDUR_EMERGENCY_CACHE_SECONDS, 30 s) still holds the old level for everyone else."""
    mine, theirs = level_backends
    emergency.use_backend(mine)
    other = EmergencyMode(clock=fake_clock)
    other.use_backend(theirs)
    assert call() == (200, {"status": "ok", "emergency_level": 0, "breakers": {}, "critical": [], "store": "none"})

    other.set_level(3, minutes=10)
    fake_clock.advance(1.0)
    assert call(staff=False) == (200, {"status": "degraded", "emergency_level": 3})

    other.set_level(0)
    fake_clock.advance(1.0)
    assert call(staff=False) == (200, {"status": "ok", "emergency_level": 0})


def test_hc5_a_hung_level_backend_answers_with_the_level_last_read(fake_clock, monkeypatch):
    """HC-5: a level backend that does not answer (a stopped Redis) does not hold the view:
    it answers with the level it last read and says the read did not come back."""
    gate = threading.Event()

    class HungLevel(MemoryLevelBackend):
        def read(self):
            assert gate.wait(30)
            return super().read()

    backend = HungLevel()
    emergency.use_backend(backend)
    emergency.set_level(2, minutes=10)  # written (and cached) by this process
    fake_clock.advance(1.0)  # the view wants a fresh read now; it hangs
    monkeypatch.setattr(reading, "READ_TIMEOUT_SECONDS", SHORT)
    try:
        status, body = call()
        assert status == 200
        assert body["status"] == "degraded" and body["emergency_level"] == 2
        assert body["store"] == reading.NO_ANSWER
    finally:
        gate.set()
    assert health.judge(timeout=30).store != reading.NO_ANSWER  # the same read, now back


# ---------------------------------------------------------------- store round trips
def test_hc5_one_batched_read_of_the_critical_breakers_however_many_are_known(settings, clock):
    """HC-5 amended: with 500 breakers known (all shared through a store), a view makes
    exactly one store call, a batched read of the critical breakers, and reads their
    state as the fleet's record holds it (another worker forced one open)."""
    inner = MemoryStore(now=clock.wall)
    store = CountingStore(inner)
    from baldur_django.core.registry import registry

    registry.set_store(store)
    settings.BALDUR_HEALTH_CRITICAL_SERVICES = ["payments", "search"]
    for i in range(500):
        get_breaker(f"host-{i}.example")
    for name in ("payments", "search"):
        get_breaker(name)
    inner.force("payments", mode="open", ttl_seconds=600)  # decided by another worker

    for _ in range(3):
        store.calls.clear()
        status, body = call()
        assert store.calls == [("inspect_many", ("payments", "search"))]
        assert status == 503 and body["status"] == "down"
        assert body["breakers"]["payments"] == "open" and body["breakers"]["search"] == "closed"
        assert len(body["breakers"]) == 502 and body["store"] == reading.ANSWERED


def test_hc5_one_redis_round_trip_for_the_view_with_many_breakers(settings, clock):
    """HC-5 amended, on a real Redis: 300 shared breakers known, the view sends one
    pipelined round trip (the critical breakers' records) and nothing else."""
    need_server("Redis at 127.0.0.1:6379", reachable("127.0.0.1", 6379))
    from baldur_django.core.registry import registry

    counter = CommandCounter()
    prefix = f"hc5-{uuid.uuid4().hex[:10]}"
    client = counting_client(REDIS_URL, counter)
    registry.set_store(RedisStore(client, prefix=prefix))
    settings.BALDUR_HEALTH_CRITICAL_SERVICES = ["payments", "search", "email"]
    try:
        for i in range(300):
            get_breaker(f"host-{i}.example")
        # A first view sets up the pool's connection (HELLO, SELECT...) and loads the read's
        # script on a server that has not run it yet (a fresh machine's Redis answers NOSCRIPT
        # to the first EVALSHA); the second view shows the steady state.
        assert call()[0] == 200
        before = counter.snapshot()
        status, body = call()
        commands, trips = (a - b for a, b in zip(counter.snapshot(), before, strict=True))
        assert (status, body["status"], body["store"]) == (200, "ok", reading.ANSWERED)
        assert trips == 1, counter.names
        assert commands == 3, counter.names  # one EVALSHA per critical breaker, nothing else
    finally:
        admin = redis.Redis.from_url(REDIS_URL)
        keys = list(admin.scan_iter(f"{prefix}:*"))
        if keys:
            admin.delete(*keys)
        admin.close()


# ------------------------------------------------------------------- a hung store
def test_hc5_hung_store_answers_from_local_knowledge_and_says_so(settings, clock, monkeypatch):
    """HC-5 amended: the store's read blocks (the test holds it); the view still answers,
    from the process's own view (a critical breaker it knows OPEN: 503 "down"), says the
    store did not answer, and a second view while the read still hangs starts no second
    read. Once the store answers, the next view reads it again."""
    from baldur_django.core.registry import registry

    gate = threading.Event()
    inner = MemoryStore(now=clock.wall)
    store = HungStore(inner, gate)
    registry.set_store(store)
    settings.BALDUR_HEALTH_CRITICAL_SERVICES = ["payments"]
    monkeypatch.setattr(reading, "READ_TIMEOUT_SECONDS", SHORT)
    get_breaker("payments").force_open(10, reason="test")  # this process knows it OPEN
    get_breaker("search")
    try:
        status, body = call()
        assert status == 503 and body["status"] == "down"
        assert body["store"] == reading.NO_ANSWER
        assert body["breakers"] == {"payments": "open", "search": "closed"}
        assert call(staff=False) == (503, {"status": "down", "emergency_level": 0})
        assert [c for c in store.calls if c[0] == "inspect_many"] == [("inspect_many", ("payments",))]
    finally:
        gate.set()
    verdict = health.judge(timeout=30)  # waits for the read still out, which now returns
    assert verdict.store == reading.ANSWERED and verdict.breakers["payments"] == "open"


def test_hc5_a_failing_store_answers_from_local_knowledge(settings, clock):
    """HC-5: a store that raises on the read: the view answers from the process's own view
    and says the read failed."""
    from baldur_django.core.registry import registry
    from baldur_django.core.stores.base import StoreUnavailable

    class Broken(CountingStore):
        def inspect_many(self, names, *, frozen=False):
            raise StoreUnavailable("connection refused")

    registry.set_store(Broken(MemoryStore(now=clock.wall)))
    settings.BALDUR_HEALTH_CRITICAL_SERVICES = ["payments"]
    verdict = health.judge()
    assert (verdict.status, verdict.store, verdict.breakers) == ("ok", reading.FAILED, {"payments": "closed"})


def test_hc5_silent_redis_does_not_hold_the_view(settings, hung_redis, monkeypatch):
    """HC-5 amended, with a real socket that accepts and never answers (a SIGSTOPped Redis)
    and a 5 s socket timeout: the view answers, says the store did not answer, and judges
    from what the process knows."""
    from baldur_django.core.registry import registry

    registry.set_store(RedisStore(connect(hung_redis.url(), socket_timeout=5)))
    settings.BALDUR_HEALTH_CRITICAL_SERVICES = ["payments"]
    monkeypatch.setattr(reading, "READ_TIMEOUT_SECONDS", SHORT)
    status, body = call()
    assert (status, body["status"], body["store"]) == (200, "ok", reading.NO_ANSWER)
    assert body["breakers"] == {"payments": "closed"}


def test_hc5_the_read_timeout_is_a_module_setting_below_a_probe_timeout():
    """HC-5: the default read timeout leaves room under Kubernetes' 1 s probe timeout, and
    so does the level's freshness."""
    assert 0 < DEFAULT_READ_TIMEOUT < 1
    assert 0 < reading.LEVEL_MAX_AGE_SECONDS < 1


@pytest.mark.django_db(transaction=True)
def test_hc5_database_store_is_read_in_the_worker_thread(settings):
    """HC-5: with the database backend the view's read runs on the worker thread's own
    connection (closed afterwards) and reads the fleet's record."""
    from baldur_django.backends.database import DatabaseStore
    from baldur_django.core.registry import registry

    registry.set_store(DatabaseStore())
    settings.BALDUR_HEALTH_CRITICAL_SERVICES = ["payments"]
    DatabaseStore().force("payments", mode="open", ttl_seconds=600)  # another worker's force
    verdict = health.judge()
    assert (verdict.status, verdict.store, verdict.breakers) == ("down", reading.ANSWERED, {"payments": "open"})

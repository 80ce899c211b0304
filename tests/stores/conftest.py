"""Store fixtures: one contract, every backend (memory, fakeredis, real Redis, a Redis Cluster,
SQLite, PostgreSQL).

Time-based rules (recovery timeouts, leases, lapses) are driven without sleeping: the
memory store runs on a FakeClock, and for the servers whose own clock is authoritative
(Redis ``TIME``, the database's ``now``) :func:`age` shifts every timestamp of a stored
record back, which is exactly what the passing of that much time means to the rules.
"""

from __future__ import annotations

import json
import socket
import uuid

import pytest

from baldur_django.core.stores.base import decode, encode
from baldur_django.core.stores.memory import MemoryStore
from baldur_django.core.testing import FakeClock
from tests.conftest import IN_CI, need_server

REDIS_URL = "redis://127.0.0.1:6379/13"


def reachable(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


@pytest.fixture
def redis_client():
    """A client on the real Redis server's DB 13 plus a key prefix of this test's own; the
    test's keys are deleted afterwards (no FLUSHDB: other runs may share the server)."""
    need_server("Redis at 127.0.0.1:6379", reachable("127.0.0.1", 6379))
    from baldur_django.core.stores.redis import connect

    client = connect(REDIS_URL, socket_timeout=2.0)
    client.test_prefix = f"t-{uuid.uuid4().hex[:12]}"
    yield client
    for key in client.scan_iter(f"{client.test_prefix}:*"):
        client.delete(key)
    client.close()


@pytest.fixture
def cluster_client(redis_cluster):
    """A cluster client (``connect(url, cluster=True)``) on the session's local Redis Cluster,
    with a key prefix of this test's own (the cluster is private: nothing to clean up)."""
    from baldur_django.core.stores.redis import connect

    client = connect(redis_cluster.url, socket_timeout=2.0, cluster=True)
    client.test_prefix = f"t-{uuid.uuid4().hex[:12]}"
    yield client
    client.close()


def _shift(record_json, seconds: float):
    record = decode(record_json)
    for field in ("opened_at", "open_until", "force_expires_at", "updated_at"):
        value = getattr(record, field)
        if value is not None:
            setattr(record, field, value - seconds)
    record.probes = {token: until - seconds for token, until in record.probes.items()}
    return encode(record)


class Backend:
    """A store under test plus a way to let time pass for it."""

    def __init__(self, name, store, age):
        self.name = name
        self.store = store
        self._age = age

    def age(self, breaker: str, seconds: float) -> None:
        self._age(breaker, seconds)

    def __repr__(self) -> str:
        return self.name


def _memory():
    clock = FakeClock()
    store = MemoryStore(now=clock.wall)
    return Backend("memory", store, lambda name, s: clock.advance(s))


def _redis_backend(client, name="redis"):
    from baldur_django.core.stores.redis import RedisStore

    store = RedisStore(client, prefix=getattr(client, "test_prefix", "baldur"))

    def age(breaker, seconds):
        key = store.key(breaker)
        client.set(key, _shift(client.get(key), seconds))

    return Backend(name, store, age)


def _database(alias):
    from baldur_django.backends.database import DatabaseStore
    from baldur_django.backends.models import BreakerRecord
    from baldur_django.core.stores.base import safe_key

    store = DatabaseStore(alias=alias)

    def age(breaker, seconds):
        row = BreakerRecord.objects.using(alias).get(key=safe_key(breaker))
        row.record = _shift(row.record, seconds)
        row.save(update_fields=["record"])

    return Backend(f"database-{alias}", store, age)


def pytest_collection_modifyitems(config, items):
    """Give each store test exactly the databases its backend needs.

    Only the PostgreSQL variants ask for the ``pg`` alias, so the rest of the suite never
    depends on that server. When PostgreSQL is unreachable they are skipped locally, and
    under ``CI=true`` they run and fail (need_server).
    """
    pg_up = None
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        kind = params.get("backend") or params.get("shared_store")
        if kind == "sqlite":
            item.add_marker(pytest.mark.django_db)
        elif kind == "postgres":
            if pg_up is None:
                pg_up = reachable("127.0.0.1", 5432)
            if not pg_up and not IN_CI:
                item.add_marker(pytest.mark.skip(reason="PostgreSQL at 127.0.0.1:5432 is unreachable"))
                continue
            transaction = "shared_store" in params  # other processes must see committed rows
            item.add_marker(pytest.mark.django_db(databases=["default", "pg"], transaction=transaction))


@pytest.fixture(params=["memory", "fakeredis", "redis", "cluster", "sqlite", "postgres"])
def backend(request):
    """Each store backend in turn (ST-2 contract); ``cluster`` is the Redis store on a
    three-master Redis Cluster."""
    kind = request.param
    if kind == "memory":
        return _memory()
    if kind == "fakeredis":
        import fakeredis

        client = fakeredis.FakeRedis()
        return _redis_backend(client, "fakeredis")
    if kind == "redis":
        return _redis_backend(request.getfixturevalue("redis_client"))
    if kind == "cluster":
        return _redis_backend(request.getfixturevalue("cluster_client"), "cluster")
    if kind == "sqlite":
        return _database("default")
    need_server("PostgreSQL at 127.0.0.1:5432", reachable("127.0.0.1", 5432))
    return _database("pg")


def record_json(store, name):
    """The record as the store holds it, via a plain load (normalises, no transition)."""
    return json.loads(encode(store.load(name).record))

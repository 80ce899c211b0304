"""ST-5: a fleet task's read (inspect) or sweep of a name the store has no record of writes
nothing on Redis, as on the memory and database stores: no record is left behind without
a registry entry (which the registry prune would never find). A worker's load still writes
and registers.
"""

from __future__ import annotations

import pytest

from baldur_django.core.stores.redis import RedisStore

pytestmark = pytest.mark.redis


@pytest.fixture
def store(redis_client):
    return RedisStore(redis_client, prefix=redis_client.test_prefix)


def test_st5_inspect_and_sweep_of_an_unknown_name_write_no_record(store, redis_client):
    """ST-5: inspect, sweep and their batched forms read a missing record as a fresh CLOSED
    one and leave it missing."""
    assert store.inspect("ghost").record.state == "closed"
    assert store.sweep("ghost").result is False
    assert [a.record.version for a in store.inspect_many(["ghost", "ghost-2"])] == [0, 0]
    assert [a.result for a in store.sweep_many(["ghost", "ghost-3"])] == [False, False]
    for name in ("ghost", "ghost-2", "ghost-3"):
        assert redis_client.exists(store.key(name)) == 0, name
    assert store.names() == {}


def test_st5_load_of_an_unknown_name_still_writes_and_registers(store, redis_client):
    """ST-5: a worker's first use writes the fresh record and registers the name; inspect and
    sweep of a stored record keep writing it (a lapse they make is kept)."""
    assert store.load("used").record.state == "closed"
    assert redis_client.exists(store.key("used")) == 1
    assert "used" in store.names()
    store.force("used", mode="closed", ttl_seconds=600.0)
    assert store.inspect("used").record.forced == "closed"
    assert store.sweep("used").record.forced == "closed"
    assert redis_client.exists(store.key("used")) == 1

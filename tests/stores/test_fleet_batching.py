"""ST-5 at fleet scale: the sweep and the state sync read and move the records a batch per
round trip when the store has bulk methods (the Redis store's pipelines), with the same
outcome as one breaker at a time, and fall back to the per-name methods otherwise."""

from __future__ import annotations

import math

import pytest

from baldur_django.core import maintenance
from baldur_django.core.events import bus
from baldur_django.core.stores.memory import MemoryStore
from baldur_django.core.stores.redis import RedisStore
from baldur_django.core.testing import FakeClock, RecordingListener

COUNT = 1_100  # more than two batches


class CountingRedisStore(RedisStore):
    """A Redis store that counts its per-name and bulk reads."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.calls = {"inspect": 0, "sweep": 0, "inspect_many": 0, "sweep_many": 0}

    def inspect(self, name, *, frozen=False):
        self.calls["inspect"] += 1
        return super().inspect(name, frozen=frozen)

    def sweep(self, name, *, frozen=False):
        self.calls["sweep"] += 1
        return super().sweep(name, frozen=frozen)

    def inspect_many(self, names, *, frozen=False):
        self.calls["inspect_many"] += 1
        return super().inspect_many(names, frozen=frozen)

    def sweep_many(self, names, *, frozen=False):
        self.calls["sweep_many"] += 1
        return super().sweep_many(names, frozen=frozen)


@pytest.fixture
def events():
    listener = RecordingListener(bus)
    yield listener
    bus.unsubscribe(listener)


def test_st5_sweep_and_sync_batch_their_round_trips_on_redis(redis_client, fresh_registry, events):
    """ST-5: over 1,100 records the sweep makes one pipelined round trip per 500 records (no
    per-breaker call), moves every due OPEN record once with one event each, in name order,
    leaves the rest; sync_state reads them the same way."""
    store = CountingRedisStore(redis_client, prefix=redis_client.test_prefix)
    fresh_registry.set_store(store)
    try:
        pipe = redis_client.pipeline(transaction=False)
        for i in range(COUNT):
            pipe.zadd(store.registry_key, {f"svc-{i:04d}": 1.0e12})
        pipe.execute()
        due = [f"svc-{i:04d}" for i in range(0, COUNT, 7)]
        for name in due:
            store.trip(name, trigger="consecutive_failures", recovery_timeout=0.0)  # due at once
        store.trip("svc-0001", trigger="consecutive_failures", recovery_timeout=3600.0)  # not due
        store.force("svc-0002", mode="open", ttl_seconds=600.0, reason="maintenance")  # forced: left alone
        report = maintenance.recovery_sweep()
        batches = math.ceil(COUNT / maintenance.BATCH_SIZE)
        assert store.calls == {"inspect": 0, "sweep": 0, "inspect_many": 0, "sweep_many": batches}
        assert report.skipped is None and report.breakers == COUNT
        assert report.moved == due
        assert [e.service for e in events.events if e.kind == "state_changed"] == due
        assert store.inspect("svc-0001").record.state == "open"
        assert store.inspect("svc-0002").record.state == "open"
        assert maintenance.recovery_sweep().moved == []
        store.calls.update(inspect=0, sweep_many=0)
        report = maintenance.sync_state()
        assert report.breakers == COUNT
        assert store.calls == {"inspect": 0, "sweep": 0, "inspect_many": batches, "sweep_many": 0}
    finally:
        fresh_registry.set_store(None)


def test_st5_inspect_many_answers_like_inspect(redis_client):
    """ST-5: the bulk read gives, name by name and in order, what the per-name read gives."""
    store = RedisStore(redis_client, prefix=redis_client.test_prefix)
    store.trip("b", trigger="failure_rate", recovery_timeout=60.0)
    store.force("c", mode="closed", ttl_seconds=60.0, reason="why", actor="me")
    names = ["a", "b", "c", "a"]
    bulk = store.inspect_many(names)
    one = [store.inspect(name) for name in names]
    assert [a.record.to_dict() for a in bulk] == [a.record.to_dict() for a in one]
    assert store.inspect_many([]) == []
    assert store.sweep_many([]) == []


def test_st5_a_store_without_bulk_methods_is_read_one_name_at_a_time(fresh_registry, events):
    """ST-5: a store with only the per-name protocol (the memory store here) still gets every
    record swept, in name order, across batch boundaries."""
    clock = FakeClock()
    store = MemoryStore(now=clock.wall)
    assert not hasattr(store, "sweep_many")
    fresh_registry.set_store(store)
    try:
        names = [f"m-{i:04d}" for i in range(maintenance.BATCH_SIZE + 3)]
        for name in names:
            store.trip(name, trigger="consecutive_failures", recovery_timeout=10.0)
        clock.advance(11.0)
        report = maintenance.recovery_sweep()
        assert report.moved == names
        assert len([e for e in events.events if e.kind == "state_changed"]) == len(names)
    finally:
        fresh_registry.set_store(None)

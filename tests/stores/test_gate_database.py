"""RS-3 on the ``database`` state backend: the fleet's Retry-After gates kept in a table, on
the database clock, for SQLite and the real PostgreSQL server (the ``pg`` alias).

The store answers the fleet gate store protocol (``core/stages/fleet_gate.py``): one write
per answer asking for quiet, a later end always kept, one query reading any number of
services; a breaker sharing the database store gets the fleet's gate, and another worker
sharing the store refuses from its first call after it reads it.
"""

from __future__ import annotations

import time

import pytest

import baldur_django as baldur
from baldur_django import RateLimitCooldownError
from baldur_django.backends.database import DatabaseStore, db_now
from baldur_django.backends.models import GateEnd
from baldur_django.core.breaker import CircuitBreaker
from baldur_django.core.events import bus
from baldur_django.core.registry import registry
from baldur_django.core.stages.fleet_gate import FleetGate, GateStore, gate_ends
from baldur_django.core.stages.gate import RetryAfterGate
from baldur_django.core.stages.service import stages_of
from baldur_django.core.stores.base import safe_key
from baldur_django.core.sync import StoreGuard
from baldur_django.core.testing import FakeClock
from baldur_django.core.wrappers import sync_wrapper
from tests.stages.budget_helpers import run_threads
from tests.stages.race_tools import fast_switching

BACKENDS = ["sqlite", "postgres"]
ALIAS = {"sqlite": "default", "postgres": "pg"}


class Status:
    def __init__(self, status_code: int, retry_after: str | None = None) -> None:
        self.status_code = status_code
        self.headers = {} if retry_after is None else {"Retry-After": retry_after}


def store_for(backend: str) -> DatabaseStore:
    return DatabaseStore(alias=ALIAS[backend])


@pytest.mark.parametrize("backend", BACKENDS)
def test_rs3_database_gate_write_keeps_the_later_end_on_the_database_clock(backend):
    """RS-3: a write closes the service's gate for its seconds on the database clock; a
    later, shorter answer never shortens it; the read answers the seconds left."""
    store = store_for(backend)
    assert isinstance(store, GateStore)
    assert store.close_gate("api", 20.0) == pytest.approx(20.0, abs=0.5)
    row = GateEnd.objects.using(ALIAS[backend]).get(key=safe_key("api"))
    assert row.name == "api" and row.until == pytest.approx(db_now(ALIAS[backend]) + 20.0, abs=1.0)
    assert store.close_gate("api", 5.0) == pytest.approx(20.0, abs=1.0)  # the later end stays
    assert store.gates_left(["api"])["api"] == pytest.approx(20.0, abs=1.0)
    assert store.close_gate("api", 40.0) == pytest.approx(40.0, abs=0.5)
    assert GateEnd.objects.using(ALIAS[backend]).count() == 1


@pytest.mark.parametrize("backend", BACKENDS)
def test_rs3_database_gate_read_answers_the_closed_gates_only(backend):
    """RS-3: one read for many services answers the closed gates among them; an end that
    has passed, or a service never closed, is absent."""
    store = store_for(backend)
    store.close_gate("a", 30.0)
    store.close_gate("b", 10.0)
    now = db_now(ALIAS[backend])
    GateEnd.objects.using(ALIAS[backend]).create(key=safe_key("old"), name="old", until=now - 1.0)
    left = store.gates_left(["a", "b", "old", "never"])
    assert set(left) == {"a", "b"}
    assert left["a"] == pytest.approx(30.0, abs=1.0) and left["b"] == pytest.approx(10.0, abs=1.0)
    assert store.gates_left([]) == {}


@pytest.mark.parametrize("backend", BACKENDS)
def test_rs3_database_a_worker_learns_the_fleet_s_gate_from_the_table(backend):
    """RS-3: worker A meets a 429 asking for 20 s and writes it once; worker B, with a
    clock of its own, reads the table and refuses (reason retry_after, about 20 s left)."""
    store = store_for(backend)
    clock_a, clock_b = FakeClock(), FakeClock()
    clock_b.advance(1000.0)  # another process: another monotonic origin
    a = FleetGate(RetryAfterGate("api", clock_a, 60.0), store)
    b = FleetGate(RetryAfterGate("api", clock_b, 60.0), store)
    assert a.observe(Status(429, "20")) == 20.0
    b.check()  # not read yet: B's own gate is open
    b.close_until(gate_ends(store, ["api"], clock_b)["api"])
    with pytest.raises(RateLimitCooldownError) as refused:
        b.check()
    assert refused.value.reason == "retry_after"
    assert refused.value.retry_after == pytest.approx(20.0, abs=1.0)


def _second_worker(store: DatabaseStore, clock: FakeClock, provider):
    """Another worker's breaker "api" (a core of its own, its own clock) on the same store."""
    guard = StoreGuard(store, interval=lambda: 60.0, publish=bus.publish, monotonic=clock.monotonic, wall=clock.wall)
    breaker = CircuitBreaker("api", baldur.get_breaker("api").config, clock=clock)
    breaker.use_store(guard)
    return sync_wrapper(breaker, provider, None, lambda: "quiet")


@pytest.mark.parametrize("backend", BACKENDS)
def test_rs3_database_store_breakers_share_the_gate_written_once_per_answer(clock, backend):
    """RS-3 (issue 28's scenario on the database store): a breaker sharing the database
    store gets the fleet's gate; a 429 with Retry-After: 20 writes its end once (the calls
    refused after it write nothing), and another worker sharing the store refuses from
    its first call: the provider is reached once."""
    store = store_for(backend)
    registry.set_store(store)
    reached: list[int] = []

    def provider() -> Status:
        reached.append(1)
        return Status(429, "20") if len(reached) == 1 else Status(200)

    call_a = baldur.protected("api", honor_retry_after=True, fallback=lambda: "quiet")(provider)
    assert call_a().status_code == 429
    assert stages_of(baldur.get_breaker("api")).fleet_gate
    rows = GateEnd.objects.using(ALIAS[backend])
    marker = rows.get(key=safe_key("api")).until + 0.25
    rows.filter(key=safe_key("api")).update(until=marker)  # a write per call would replace it
    call_b = _second_worker(store, FakeClock(), provider)
    answers = []
    for _ in range(5):
        answers += [call_a(), call_b()]
        clock.advance(1)
    assert answers == ["quiet"] * 10 and len(reached) == 1
    assert rows.get(key=safe_key("api")).until == marker


# ------------------------------------------------------------------ concurrent writers
def _writers(store: DatabaseStore) -> float:
    """16 threads started together each close the gate three times, thread i asking for
    10 + i seconds; returns the seconds left of the stored end afterwards."""
    from django.db import connections

    def work(i: int) -> None:
        try:
            for _ in range(3):
                store.close_gate("api", 10.0 + i)
        finally:
            connections[store.alias].close()

    with fast_switching():
        run_threads(16, work, timeout=60.0)
    return store.gates_left(["api"])["api"]


@pytest.mark.parametrize("shared_store", ["postgres"])
def test_rs3_database_sixteen_threads_writing_at_once_keep_the_latest_end(shared_store):
    """RS-3, RS-10: 16 threads write the same service's gate at once on PostgreSQL, each
    asking for a different time: the stored end is the latest one asked for (25 s)."""
    assert _writers(DatabaseStore(alias="pg")) == pytest.approx(25.0, abs=1.0)


@pytest.mark.parametrize("shared_store", ["postgres"])
def test_rs3_database_meta_without_the_row_lock_a_later_end_is_lost(shared_store, monkeypatch):
    """RS-3 (meta): the same writers with the row lock taken away (``select_for_update``
    a no-op) and a thread switch between the read and the write: within a few rounds a
    shorter end overwrites the latest one."""
    from django.db.models.query import QuerySet

    original_save = GateEnd.save

    def slow_save(self, *args, **kwargs):
        time.sleep(0)  # another writer may read the row now (the race the lock prevents)
        return original_save(self, *args, **kwargs)

    monkeypatch.setattr(QuerySet, "select_for_update", lambda self, *a, **k: self)
    monkeypatch.setattr(GateEnd, "save", slow_save)
    store = DatabaseStore(alias="pg")
    for _ in range(10):
        GateEnd.objects.using("pg").all().delete()
        if _writers(store) < 24.0:
            return
    pytest.fail("without the row lock the latest end was kept in every round")

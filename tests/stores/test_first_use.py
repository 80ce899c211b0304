"""ST-2, ST-3: a process that has not read a breaker's shared record yet admits no call on its
own fresh CLOSED state while the first caller reads the record.

Real threads (``sys.setswitchinterval(1e-6)``, a start barrier) and asyncio tasks call one
breaker of a fresh "worker" (the process-wide registry, a store that is shared with a peer
worker). The first read of the record is held until every other caller has settled (was
refused, or reached the dependency), at most :data:`HOLD` seconds: a caller admitted on the
unread local state settles during the hold, a caller that waits for the read does not. The
dependency counts the calls that reach it and holds them until every caller has settled,
so a trial that would close the round cannot let later callers through.

Real processes through the requests adapter are in tests/http/test_shared_store.py.
"""

from __future__ import annotations

import asyncio
import sys
import threading

import pytest

import baldur_django as baldur
from baldur_django.core.breaker import CircuitBreaker
from baldur_django.core.clock import SYSTEM_CLOCK
from baldur_django.core.config import SettingsSource, build_config
from baldur_django.core.events import EventBus
from baldur_django.core.sync import StoreGuard
from tests.stores.conftest import _shift
from tests.stores.test_fleet import dep, shared_store  # noqa: F401 - fixtures

pytestmark = [pytest.mark.redis]

HOLD = 0.3  # seconds the first read is held at most (a bound, never a synchronisation)
THREADS = 16
TASKS = 200
MAX_CALLS = 2


class HeldFirstRead:
    """Wraps the worker's store: the first ``load`` answers once ``others_settled`` is set
    (or after :data:`HOLD` seconds); every other operation goes straight through."""

    def __init__(self, inner, others_settled: threading.Event) -> None:
        self.inner = inner
        self.backend = inner.backend
        self.others_settled = others_settled
        self.loads = 0
        self._lock = threading.Lock()

    def __getattr__(self, op):
        return getattr(self.inner, op)

    def load(self, name, **kwargs):
        answer = self.inner.load(name, **kwargs)
        with self._lock:
            self.loads += 1
            first = self.loads == 1
        if first:
            self.others_settled.wait(HOLD)
        return answer


class Callers:
    """Counts callers that settled; sets ``others`` at n - 1 and ``all`` at n."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.settled = 0
        self.reached = 0
        self.refused = 0
        self.lock = threading.Lock()
        self.others = threading.Event()
        self.all = threading.Event()

    def settle(self, *, reached: bool) -> None:
        with self.lock:
            self.settled += 1
            if reached:
                self.reached += 1
            else:
                self.refused += 1
            if self.settled >= self.n - 1:
                self.others.set()
            if self.settled >= self.n:
                self.all.set()


def peer(store, name: str) -> CircuitBreaker:
    """Another worker's breaker on the same store (its own guard and bus)."""
    bus = EventBus()
    source = SettingsSource(environ={"BALDUR_CB_SYNC_INTERVAL_SECONDS": "5"})
    config = build_config(
        name, {"failure_threshold": 1, "recovery_timeout": 30, "half_open_max_calls": MAX_CALLS}, source
    )
    breaker = CircuitBreaker(name, config, clock=SYSTEM_CLOCK, bus=bus)
    breaker.use_store(StoreGuard(store, lambda: 60.0, bus.publish, SYSTEM_CLOCK.monotonic, SYSTEM_CLOCK.wall))
    return breaker


def age(store, name: str, seconds: float) -> None:
    """Let *seconds* pass for the stored record (every timestamp shifted back)."""
    if store.backend == "redis":
        key = store.key(name)
        store.client.set(key, _shift(store.client.get(key), seconds))
        return
    from baldur_django.backends.models import BreakerRecord
    from baldur_django.core.stores.base import safe_key

    row = BreakerRecord.objects.using(store.alias).get(key=safe_key(name))
    row.record = _shift(row.record, seconds)
    row.save(update_fields=["record"])


def forced_open(store, name: str) -> list:
    peer(store, name).force_open(ttl_minutes=5, reason="outage", actor="operator")
    return []


def tripped(store, name: str) -> list:
    breaker = peer(store, name)
    breaker.record_failure(breaker.acquire())
    return []


def tripped_long_ago(store, name: str) -> list:
    tripped(store, name)
    age(store, name, 60)
    return []


def round_held_by_peer(store, name: str) -> list:
    tripped_long_ago(store, name)
    breaker = peer(store, name)
    held = [breaker.acquire() for _ in range(MAX_CALLS)]
    assert all(permit.trial for permit in held)
    return held  # the peer's trials stay in flight


SCENARIOS = {
    "forced_open": (forced_open, 0),
    "open": (tripped, 0),
    "open_past_timeout": (tripped_long_ago, MAX_CALLS),
    "half_open_round_held": (round_held_by_peer, 0),
}


def fresh_worker(fresh_registry, store, name: str, callers: Callers) -> HeldFirstRead:
    held = HeldFirstRead(store, callers.others)
    fresh_registry.set_store(held)
    fresh_registry.get(name, {"half_open_max_calls": MAX_CALLS, "recovery_timeout": 30})
    return held


@pytest.fixture
def switchy():
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(before)


def close_db_connections(store) -> None:
    if store.backend == "database":
        from django.db import connections

        connections.close_all()


@pytest.mark.parametrize("scenario", list(SCENARIOS))
@pytest.mark.parametrize("shared_store", ["redis", "postgres"], indirect=True)
def test_st3_fresh_worker_threads_obey_the_shared_record_from_the_first_call(
    fresh_registry,
    shared_store,  # noqa: F811 - the imported fixture
    scenario,
    switchy,
):
    """ST-2, ST-3: 16 threads make a fresh worker's first calls at once; none is admitted
    on the worker's unread local state: the record decides (no call when forced open or
    OPEN, exactly ``half_open_max_calls`` trials when its timeout is over, none when a
    peer holds the round's slots). The record is read once for all of them."""
    _, store = shared_store
    name = f"first-use-{scenario}"
    prepare, expected = SCENARIOS[scenario]
    prepare(store, name)
    callers = Callers(THREADS)
    held = fresh_worker(fresh_registry, store, name, callers)
    release = threading.Event()
    barrier = threading.Barrier(THREADS)

    def dependency() -> str:
        callers.settle(reached=True)
        release.wait(10)
        return "charged"

    def request() -> None:
        try:
            barrier.wait()
            try:
                baldur.protect(name, dependency)
            except baldur.CircuitOpenError:
                callers.settle(reached=False)
        finally:
            close_db_connections(store)

    threads = [threading.Thread(target=request) for _ in range(THREADS)]
    for thread in threads:
        thread.start()
    settled = callers.all.wait(10)
    release.set()
    for thread in threads:
        thread.join(10)
    assert settled, "every caller settles"
    assert callers.reached == expected, f"{callers.reached} of {THREADS} calls reached the dependency"
    assert held.loads == 1, "one read of the record serves every first caller"


@pytest.mark.parametrize("scenario", list(SCENARIOS))
@pytest.mark.parametrize("shared_store", ["redis"], indirect=True)
def test_st3_fresh_worker_tasks_obey_the_shared_record_from_the_first_call(
    fresh_registry,
    shared_store,  # noqa: F811 - the imported fixture
    scenario,
):
    """ST-2, ST-3: 200 asyncio tasks make a fresh worker's first calls at once; the record
    decides for all of them, as for threads (the read runs off the event loop)."""
    _, store = shared_store
    name = f"first-use-async-{scenario}"
    prepare, expected = SCENARIOS[scenario]
    prepare(store, name)
    callers = Callers(TASKS)
    fresh_worker(fresh_registry, store, name, callers)

    async def main() -> bool:
        start = asyncio.Event()
        release = asyncio.Event()

        async def dependency() -> str:
            callers.settle(reached=True)
            await release.wait()
            return "charged"

        async def request() -> None:
            await start.wait()
            try:
                await baldur.aprotect(name, dependency)
            except baldur.CircuitOpenError:
                callers.settle(reached=False)

        tasks = [asyncio.create_task(request()) for _ in range(TASKS)]
        await asyncio.sleep(0)  # every task waits on the start event
        start.set()
        settled = await asyncio.to_thread(callers.all.wait, 10)
        release.set()
        await asyncio.wait_for(asyncio.gather(*tasks), 10)
        return settled

    assert asyncio.run(main()), "every caller settles"
    assert callers.reached == expected, f"{callers.reached} of {TASKS} calls reached the dependency"

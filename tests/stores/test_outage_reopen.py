"""ST-4: a failed local trial's re-open is a trip, even when a store comes back empty.

A worker trips with the store up (the trip is written), the store goes away, the worker's
own probe fails and it re-opens locally, then the store comes back with nothing in it (a
restarted Redis, a wiped dict). The worker must not take that empty record as CLOSED while
its own open time runs: it writes its open back as a trip instead, and not a single call
reaches the dependency it knows is down. The same holds for an open adopted from the store
before the outage. Two stores: the memory store behind a switch (swapped for an empty one),
and a private ``redis-server`` killed and started again empty.
"""

from __future__ import annotations

import logging

import pytest

import baldur_django as baldur
from baldur_django.core.config import settings as baldur_settings
from baldur_django.core.stores.base import StoreUnavailable, decode
from baldur_django.core.stores.memory import MemoryStore
from baldur_django.core.stores.redis import RedisStore, connect
from tests.conftest import need_server
from tests.stores.redis_tools import REDIS_SERVER, RedisServer

LOGGER = "baldur.circuit_breaker"


class DependencyDown(Exception):
    """The protected dependency's own failure."""


class SwitchedStore:
    """A memory store that can be made unreachable, and replaced by an empty one."""

    backend = "memory"

    def __init__(self, clock):
        self.clock = clock
        self.inner = MemoryStore(now=clock.wall)
        self.down = False

    def wipe(self):
        self.inner = MemoryStore(now=self.clock.wall)

    def __getattr__(self, op):
        def call(*args, **kwargs):
            if self.down:
                raise StoreUnavailable("simulated outage")
            return getattr(self.inner, op)(*args, **kwargs)

        return call


class Outage:
    """Drives one store through up / down / back empty."""

    def __init__(self, store, down, up_empty, state):
        self.store, self.down, self.up_empty, self.state = store, down, up_empty, state


@pytest.fixture(params=["memory", "redis"])
def outage(request, fresh_registry, clock, monkeypatch):
    monkeypatch.setenv("BALDUR_CB_SYNC_INTERVAL_SECONDS", "2")
    monkeypatch.setenv("BALDUR_STORE_WARNING_INTERVAL_SECONDS", "30")
    baldur_settings.reset()
    if request.param == "memory":
        store = SwitchedStore(clock)

        def down():
            store.down = True

        def up_empty():
            store.wipe()
            store.down = False

        def state(name):
            return store.inner.raw(name).state

        fresh_registry.set_store(store)
        yield Outage(store, down, up_empty, state)
    else:
        need_server("redis-server binary (a private server is started)", REDIS_SERVER is not None)
        server = RedisServer().start()
        client = connect(server.url(), socket_timeout=0.5)
        store = RedisStore(client)
        fresh_registry.set_store(store)

        def state(name):
            return decode(client.get(store.key(name))).state

        yield Outage(store, server.kill, server.start, state)
        server.stop()
    fresh_registry.set_store(None)


def dependency_counting(name, **options):
    calls = []

    @baldur.circuit_breaker(name, failure_threshold=1, recovery_timeout=10, half_open_max_calls=1, **options)
    def dependency(ok: bool = True) -> str:
        calls.append(ok)
        if not ok:
            raise DependencyDown("down")
        return "ok"

    return dependency, calls


def test_st4_failed_local_trial_reopen_is_written_back_to_an_empty_store(outage, clock, events, caplog):
    """ST-4, CB-20: trip written; store down; the local probe fails and re-opens (announced,
    trigger half_open_failure); the store returns empty: zero calls reach the dependency
    while the worker's own open time runs, the re-open is pushed as a trip, and no
    transition anywhere has an unknown trigger."""
    dependency, calls = dependency_counting("reopen-empty")
    with pytest.raises(DependencyDown):
        dependency(ok=False)  # trip, written to the store
    assert outage.state("reopen-empty") == "open"
    outage.down()
    clock.advance(10.0)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        with pytest.raises(DependencyDown):
            dependency(ok=False)  # the local trial fails: re-open, judged locally
        assert len(calls) == 2
        assert events.transitions()[-1] == ("half_open", "open", "half_open_failure")
        outage.up_empty()
        for _ in range(19):  # 9.5 s of traffic inside the worker's own open time
            clock.advance(0.5)
            with pytest.raises(baldur.CircuitOpenError):
                dependency()
    assert len(calls) == 2  # not a single call reached the dependency
    assert outage.state("reopen-empty") == "open"  # the re-open was written back as a trip
    opened = [r.getMessage() for r in caplog.records if getattr(r, "event", None) == "circuit_breaker.opened"]
    assert opened == [
        "circuit_breaker.opened service=reopen-empty from=closed trigger=consecutive_failures",
        "circuit_breaker.opened service=reopen-empty from=half_open trigger=half_open_failure",
    ]
    adopted = [r for r in caplog.records if getattr(r, "event", None) == "circuit_breaker.store_adopted"]
    assert len(adopted) == 1, [r.getMessage() for r in adopted]  # ST-4: the rejoin says what it adopted
    assert adopted[0].getMessage().startswith("circuit_breaker.store_adopted service=reopen-empty state=open forced=-")
    assert adopted[0].to_state == "open" and adopted[0].from_state == "open"
    metrics = dependency.breaker.metrics()["transitions"]
    assert all(trigger != "unknown" for (_f, _t, trigger) in metrics), metrics
    assert all(t[2] for t in events.transitions())


def test_st4_open_adopted_before_the_outage_survives_an_empty_store(outage, clock, events):
    """ST-4: an open written to the store before it went away is not undone by the store
    coming back empty while that open time runs: zero calls reach the dependency."""
    dependency, calls = dependency_counting("adopted-empty")
    with pytest.raises(DependencyDown):
        dependency(ok=False)
    outage.down()
    clock.advance(2.0)
    with pytest.raises(baldur.CircuitOpenError):
        dependency()  # a consult fails: the worker judges alone, still OPEN
    outage.up_empty()
    for _ in range(15):  # up to 9.5 s after the trip
        clock.advance(0.5)
        with pytest.raises(baldur.CircuitOpenError):
            dependency()
    assert len(calls) == 1
    assert outage.state("adopted-empty") == "open"


def test_st4_a_peers_force_made_during_the_outage_is_adopted_and_logged(fresh_registry, clock, caplog, monkeypatch):
    """ST-4: while the store did not answer a worker, a peer forced the breaker open; when
    the store answers again the worker adopts the force, and the adoption is logged once
    with what was adopted (state, force, version) and the state it replaced."""
    monkeypatch.setenv("BALDUR_CB_SYNC_INTERVAL_SECONDS", "2")
    baldur_settings.reset()
    store = SwitchedStore(clock)
    fresh_registry.set_store(store)
    dependency, calls = dependency_counting("peer-forced")
    assert dependency() == "ok"  # first use: the record is read and adopted (no outage yet)
    store.down = True
    with caplog.at_level(logging.INFO, logger=LOGGER):
        clock.advance(2.5)
        assert dependency() == "ok"  # the consult fails: the worker judges alone, CLOSED
        store.inner.force("peer-forced", mode="open", ttl_seconds=600.0, reason="maintenance", actor="peer")
        store.down = False
        clock.advance(2.5)
        with pytest.raises(baldur.CircuitOpenError):
            dependency()  # the consult adopts the peer's force
        clock.advance(2.5)
        with pytest.raises(baldur.CircuitOpenError):
            dependency()  # a later consult is a plain one: not announced again
    assert len(calls) == 2
    version = store.inner.raw("peer-forced").version
    adopted = [r.getMessage() for r in caplog.records if getattr(r, "event", None) == "circuit_breaker.store_adopted"]
    assert adopted == [
        f"circuit_breaker.store_adopted service=peer-forced state=open forced=open version={version} was=closed"
    ]

"""ST-4/OP-4: the Redis store going away, for real, and coming back.

Three settings:

* a Redis URL on a port nothing listens on (connections are refused), with a FakeClock
  driving the breaker and the store guard, so sync intervals and the warning interval
  are exact;
* a private ``redis-server`` started by the test, SIGKILLed by its PID while several
  threads call through one shared breaker, then started again on the same port;
* ``SCRIPT FLUSH`` between two store operations (what a restarted or failed-over server
  looks like to a client holding script SHAs).

Store records use a private server or a key prefix of their own; nothing here touches
the shared server's databases 12-15. With ``CI=true`` a missing ``redis-server`` fails
these tests instead of skipping them.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import threading
import uuid

import pytest
import redis

import baldur_django as baldur
from baldur_django.core.config import settings as baldur_settings
from baldur_django.core.errors import BaldurError, CircuitOpenError, StoreError
from baldur_django.core.events import StateChanged, StoreProblem, bus
from baldur_django.core.stores.base import StoreUnavailable, decode
from baldur_django.core.stores.redis import RedisStore, connect
from tests.conftest import need_server
from tests.stores.redis_tools import REDIS_SERVER, Counter, RedisServer, counting_client, free_port, wait_for

pytestmark = [pytest.mark.redis, pytest.mark.timeout(60)]

LOGGER = "baldur.circuit_breaker"


class DependencyDown(Exception):
    """The protected dependency's own failure (the only thing that may count as one)."""


def lines(caplog, event):
    return [r for r in caplog.records if getattr(r, "event", None) == event]


@pytest.fixture
def dead_store(fresh_registry, clock, monkeypatch):
    """Every breaker shared through a RedisStore whose server does not exist (refused).

    The guard and the breakers run on the FakeClock; warning interval 30 s, sync 5 s.
    """
    monkeypatch.setenv("BALDUR_STORE_WARNING_INTERVAL_SECONDS", "30")
    monkeypatch.setenv("BALDUR_CB_SYNC_INTERVAL_SECONDS", "5")
    baldur_settings.reset()
    store = RedisStore(
        connect(f"redis://127.0.0.1:{free_port()}/11", socket_timeout=0.25), prefix=f"outage-{uuid.uuid4().hex[:8]}"
    )
    fresh_registry.set_store(store)
    yield store
    fresh_registry.set_store(None)


def test_st4_unreachable_store_sync_calls_judge_locally(dead_store, fresh_registry, clock, caplog):
    """ST-4/ST-3: with the store refusing connections, sync calls through @circuit_breaker raise
    no store exception, a store error is never counted as a dependency failure, failures still
    trip the breaker locally, the store is tried at most once per sync interval (not per call)
    and circuit_breaker.store_unavailable is logged exactly once per
    BALDUR_STORE_WARNING_INTERVAL_SECONDS (30 s here)."""
    calls = []

    @baldur.circuit_breaker("outage-sync", failure_threshold=3, recovery_timeout=600)
    def dependency(ok: bool = True) -> str:
        calls.append(ok)
        if not ok:
            raise DependencyDown("down")
        return "ok"

    breaker = dependency.breaker
    guard = fresh_registry.guard
    with caplog.at_level(logging.INFO, logger=LOGGER):
        for _ in range(120):  # 30 s of traffic in steps of 0.25 s: store tried at 0, 5, ..., 25
            assert dependency() == "ok"
            clock.advance(0.25)
        assert guard.failures == 6
        assert len(lines(caplog, "circuit_breaker.store_unavailable")) == 1
        snap = breaker.snapshot()
        assert snap["state"] == "closed" and snap["store_available"] is False
        assert snap["consecutive_failures"] == 0 and snap["window_failures"] == 0  # six store errors, zero failures
        assert snap["window_calls"] == 100  # window full of successes

        for _ in range(120):  # the next 30 s: one more warning, at exactly t = 30 s
            assert dependency() == "ok"
            clock.advance(0.25)
        assert guard.failures == 12
        warnings = lines(caplog, "circuit_breaker.store_unavailable")
        assert len(warnings) == 2
        assert all(r.levelno == logging.WARNING and r.service == "outage-sync" for r in warnings)
        assert "ConnectionError" in warnings[0].getMessage()

        for _ in range(2):  # t = 60 s: the first of these consults (warning 3), the store errors again
            with pytest.raises(DependencyDown):
                dependency(ok=False)
        assert guard.failures == 13
        assert len(lines(caplog, "circuit_breaker.store_unavailable")) == 3
        assert breaker.state.value == "closed"  # 2 < failure_threshold: no store error added to them
        with pytest.raises(DependencyDown):
            dependency(ok=False)
        with pytest.raises(CircuitOpenError) as info:
            dependency()
    assert info.value.reason == "open" and info.value.retry_after == pytest.approx(600.0)
    assert len(calls) == 243  # the rejected call never reached the dependency
    assert [r.getMessage().split()[0] for r in lines(caplog, "circuit_breaker.opened")] == ["circuit_breaker.opened"]
    assert lines(caplog, "circuit_breaker.store_recovered") == []
    assert guard.failures == 14  # the trip's write failed too ...
    assert len(lines(caplog, "circuit_breaker.store_unavailable")) == 3  # ... inside the interval: no new line


def test_st4_unreachable_store_async_calls_judge_locally(dead_store, fresh_registry, clock, caplog):
    """ST-4: the same through @protected on an async def: no store exception reaches the awaiting
    caller, store errors are not failures, a local trip still rejects, one warning per interval."""
    calls = []

    @baldur.protected("outage-async", failure_threshold=3, recovery_timeout=600)
    async def dependency(ok: bool = True) -> str:
        calls.append(ok)
        if not ok:
            raise DependencyDown("down")
        return "ok"

    async def traffic():
        for _ in range(80):  # 20 s: store tried at 0, 5, 10, 15
            assert await dependency() == "ok"
            clock.advance(0.25)
        snap = dependency.breaker.snapshot()
        assert snap["consecutive_failures"] == 0 and snap["window_failures"] == 0
        for _ in range(3):
            with pytest.raises(DependencyDown):
                await dependency(ok=False)
        with pytest.raises(CircuitOpenError):
            await dependency()

    with caplog.at_level(logging.INFO, logger=LOGGER):
        asyncio.run(traffic())
    assert fresh_registry.guard.failures == 6  # consults at 0, 5, 10, 15 and 20 s, and the trip's write
    assert len(lines(caplog, "circuit_breaker.store_unavailable")) == 1
    assert len(calls) == 83
    assert dependency.breaker.state.value == "open"


def test_st4_store_errors_in_half_open_do_not_count_and_probes_run_locally(dead_store, fresh_registry, clock):
    """ST-4/CB-6: while the store is unreachable the probe round is judged locally: a probe is
    admitted when the recovery timeout is up, and its success closes the breaker."""

    @baldur.circuit_breaker("outage-probe", failure_threshold=1, recovery_timeout=10, half_open_max_calls=1)
    def dependency(ok: bool = True) -> str:
        if not ok:
            raise DependencyDown("down")
        return "ok"

    with pytest.raises(DependencyDown):
        dependency(ok=False)
    with pytest.raises(CircuitOpenError):
        dependency()
    clock.advance(10.0)
    assert dependency() == "ok"  # the single trial, admitted without the store
    assert dependency.breaker.state.value == "closed"
    assert dependency.breaker.snapshot()["consecutive_failures"] == 0


def test_op4_force_while_store_unreachable_raises_store_error(dead_store, clock):
    """OP-4: an operator's force or release whose store write fails raises StoreError (a BaldurError)
    naming the breaker; the local state is left as it was."""

    @baldur.circuit_breaker("outage-force")
    def dependency() -> str:
        return "ok"

    assert dependency() == "ok"
    with pytest.raises(StoreError, match="outage-force") as info:
        baldur.force_open_circuit("outage-force", 10, reason="maintenance", actor="ops")
    assert isinstance(info.value, BaldurError)
    with pytest.raises(StoreError):
        baldur.force_close_circuit("outage-force", 10)
    with pytest.raises(StoreError):
        baldur.release_circuit("outage-force")
    snap = dependency.breaker.snapshot()
    assert snap["forced"] is None and snap["state"] == "closed"
    assert dependency() == "ok"


# ----------------------------------------------------------------- a real server, killed
@pytest.fixture
def private_redis():
    """A redis-server of this test's own on a free port; stopped at teardown."""
    need_server("redis-server binary (a private server is started)", REDIS_SERVER is not None, "install redis-server")
    server = RedisServer().start()
    yield server
    server.stop()


@pytest.fixture
def switchy():
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(old)


def test_st4_server_killed_mid_traffic_then_restarted(private_redis, fresh_registry, monkeypatch, caplog, switchy):
    """ST-4/OP-4: four threads call through one shared breaker; the Redis server is SIGKILLed
    mid-traffic. No store exception reaches any caller, the dependency's failures still trip the
    breaker locally, an operator force raises StoreError meanwhile; a new server on the same port
    then gets the trip pushed (OPEN, local trigger), the worker logs store_recovered once and
    rejoins: a peer's force written afterwards reaches it through its sync interval."""
    name = "outage-kill"
    monkeypatch.setenv("BALDUR_CB_SYNC_INTERVAL_SECONDS", "0.05")
    baldur_settings.reset()
    store = RedisStore(connect(private_redis.url(), socket_timeout=0.5))
    fresh_registry.set_store(store)
    failing = threading.Event()
    down, recovered, opened, rejected = threading.Event(), threading.Event(), threading.Event(), threading.Event()
    warm, stop = threading.Event(), threading.Event()
    start = threading.Barrier(5)
    unexpected: list[BaseException] = []
    tally = {"ok": 0, "failed": 0, "rejected": 0}
    tally_lock = threading.Lock()

    def listener(event):
        if isinstance(event, StoreProblem):
            (recovered if event.recovered else down).set()
        elif isinstance(event, StateChanged) and event.to_state == "open":
            opened.set()

    bus.subscribe(listener)
    try:

        @baldur.circuit_breaker(name, failure_threshold=3, recovery_timeout=600)
        def dependency() -> str:
            if failing.is_set():
                raise DependencyDown("down")
            return "ok"

        def caller():
            start.wait(10)
            done = 0
            while not stop.is_set():
                try:
                    dependency()
                    kind = "ok"
                except DependencyDown:
                    kind = "failed"
                except CircuitOpenError:
                    kind = "rejected"
                    rejected.set()
                except BaseException as exc:  # a store error reaching a caller: the bug this test hunts
                    unexpected.append(exc)
                    return
                with tally_lock:
                    tally[kind] += 1
                done += 1
                if done == 200:
                    warm.set()

        threads = [threading.Thread(target=caller, daemon=True) for _ in range(4)]
        for thread in threads:
            thread.start()
        with caplog.at_level(logging.INFO, logger=LOGGER):
            start.wait(10)
            assert warm.wait(10), "no traffic"
            assert store.inspect(name).record.state == "closed"  # first use registered the breaker
            private_redis.kill()  # SIGKILL, mid-traffic
            assert down.wait(10), "no consult noticed the outage"
            failing.set()
            assert opened.wait(10), "the failures never tripped the breaker locally"
            assert rejected.wait(10), "the local trip never rejected a call"
            with pytest.raises(StoreError, match=name):
                baldur.force_close_circuit(name, 5, reason="during the outage", actor="ops")
            snap = dependency.breaker.snapshot()
            assert snap["state"] == "open" and snap["forced"] is None and snap["store_available"] is False
            assert snap["last_trigger"] == "consecutive_failures"
            failing.clear()  # the dependency is fine again; the breaker stays OPEN (600 s)

            private_redis.start()  # a new, empty server on the same port
            assert recovered.wait(10), "the worker never noticed the store was back"
            peer = RedisStore(redis.Redis.from_url(private_redis.url(), socket_timeout=2.0))
            record = decode(wait_for(lambda: peer.client.get(store.key(name)), what="the pushed trip"))
            assert record.state == "open" and record.trigger == "consecutive_failures"
            assert record.forced is None

            # rejoined: a peer's force reaches the running worker on its next consult
            with tally_lock:
                ok_before = tally["ok"]  # frozen since the trip: every call is rejected
            peer.force(name, mode="closed", ttl_seconds=300.0, reason="known good", actor="peer")
            wait_for(lambda: tally["ok"] > ok_before, what="calls admitted under the peer's force")
            stop.set()
            for thread in threads:
                thread.join(10)
            snap = dependency.breaker.snapshot()
            assert snap["store_available"] is True and snap["forced"] == "closed" and snap["state"] == "closed"
            assert snap["shared_version"] == peer.inspect(name).record.version
    finally:
        stop.set()
        fresh_registry.set_store(None)

    assert unexpected == []
    assert tally["failed"] >= 3 and tally["rejected"] > 0
    assert len(lines(caplog, "circuit_breaker.store_unavailable")) == 1  # within one 60 s interval
    assert len(lines(caplog, "circuit_breaker.store_recovered")) == 1
    assert len(lines(caplog, "circuit_breaker.opened")) == 1  # the local trip, published once


# ----------------------------------------------------------------- NOSCRIPT
def test_st4_noscript_after_script_flush_reloads_silently(private_redis, fresh_registry, caplog):
    """ST-4: after SCRIPT FLUSH (a restarted or failed-over server) the next store operation
    gets NOSCRIPT, loads its script again and succeeds: no warning, no fallback to local
    judgement, for both the pipelined consult (load + registry touch) and a plain script call
    (the trip)."""
    counter = Counter()
    store = RedisStore(counting_client(private_redis.url(), counter))
    admin = redis.Redis.from_url(private_redis.url())
    fresh_registry.set_store(store)
    try:

        @baldur.circuit_breaker("noscript", failure_threshold=1, recovery_timeout=600)
        def dependency(ok: bool = True) -> str:
            if not ok:
                raise DependencyDown("down")
            return "ok"

        guard = fresh_registry.guard
        with caplog.at_level(logging.INFO, logger=LOGGER):
            assert dependency() == "ok"  # first use: consult through a pipeline
            load_sha = store._scripts["load"].sha
            trip_sha = store._scripts["trip"].sha
            assert admin.script_exists(load_sha) == [True]
            admin.script_flush()
            assert admin.script_exists(load_sha, trip_sha) == [False, False]

            dependency.breaker.sync()  # consult again: NOSCRIPT inside the pipeline -> loaded, rerun
            assert admin.script_exists(load_sha) == [True]
            assert guard.failures == 0 and guard.down is False

            admin.script_flush()
            loads_before = counter.names.get("script", 0)
            with pytest.raises(DependencyDown):
                dependency(ok=False)  # the trip: a direct EVALSHA -> NOSCRIPT -> SCRIPT LOAD -> EVALSHA
            assert counter.names.get("script", 0) == loads_before + 1
            assert admin.script_exists(trip_sha) == [True]
            assert guard.failures == 0 and guard.down is False
            record = decode(admin.get(store.key("noscript")))
            assert record.state == "open" and record.trigger == "consecutive_failures"
        assert [r for r in caplog.records if getattr(r, "event", "").startswith("circuit_breaker.store_")] == []
    finally:
        fresh_registry.set_store(None)


@pytest.mark.parametrize("missing", ["touch", "both"])
def test_st4_noscript_in_the_pipeline_never_runs_a_transition_twice(private_redis, missing):
    """ST-4/CB-14 (found by review of the chaos test's SCRIPT FLUSH fault): when only the
    registry touch of a pipelined operation meets NOSCRIPT (the flush landed between the two
    commands), the transition already ran: it is not run again, so its answer -- here the
    lapse of a force that ran out, which its caller must announce -- is the one returned."""
    store = RedisStore(connect(private_redis.url(), socket_timeout=2.0))
    admin = redis.Redis.from_url(private_redis.url())
    store.force("noscript-lapse", mode="open", ttl_seconds=60.0, reason="", actor=None)
    key = store.key("noscript-lapse")
    record = decode(admin.get(key))
    record.force_expires_at -= 61.0  # the force ran out a second ago (the store's clock counts)
    admin.set(key, json.dumps(record.to_dict()))
    admin.script_flush()
    if missing == "touch":
        admin.script_load(store._scripts["load"].script)  # the flush came after the transition ran
    answer = store.load("noscript-lapse")
    assert answer.lapsed == "open" and answer.record.state == "half_open"
    assert answer.record.version == record.version + 1  # lapsed once, not twice
    assert "noscript-lapse" in store.names()  # the registry touch was done too


# ----------------------------------------------------------------- other kinds of trouble
@pytest.fixture
def private_shared(private_redis, fresh_registry, clock, monkeypatch):
    """A factory: share every breaker through a RedisStore on the private server, with the
    given pool size and timeout; breakers and the guard on the FakeClock (sync 5 s)."""
    monkeypatch.setenv("BALDUR_CB_SYNC_INTERVAL_SECONDS", "5")
    baldur_settings.reset()

    def make(socket_timeout=0.5, max_connections=50):
        store = RedisStore(connect(private_redis.url(), socket_timeout=socket_timeout, max_connections=max_connections))
        fresh_registry.set_store(store)
        return store

    yield make
    fresh_registry.set_store(None)


def _protected(name, **overrides):
    @baldur.circuit_breaker(name, failure_threshold=3, recovery_timeout=600, **overrides)
    def dependency(ok: bool = True) -> str:
        if not ok:
            raise DependencyDown("down")
        return "ok"

    return dependency


def test_st4_read_only_replica_after_failover(private_redis, private_shared, fresh_registry, clock, caplog):
    """ST-4: the server turned into a read-only replica (what a failover leaves behind): script
    writes fail with READONLY, callers see none of it, trips are local; once it is a primary
    again the worker logs store_recovered and pushes the trip."""
    store = private_shared()
    dependency = _protected("outage-readonly")
    admin = redis.Redis.from_url(private_redis.url())
    with caplog.at_level(logging.INFO, logger=LOGGER):
        assert dependency() == "ok"
        admin.replicaof("127.0.0.1", free_port())  # a primary nobody can reach: stays read-only
        clock.advance(5.0)
        assert dependency() == "ok"
        warnings = lines(caplog, "circuit_breaker.store_unavailable")
        assert len(warnings) == 1 and "ReadOnlyError" in warnings[0].getMessage()
        for _ in range(3):
            with pytest.raises(DependencyDown):
                dependency(ok=False)
        with pytest.raises(CircuitOpenError):
            dependency()
        assert decode(admin.get(store.key("outage-readonly"))).state == "closed"  # nothing written
        admin.replicaof("NO", "ONE")
        clock.advance(5.0)
        with pytest.raises(CircuitOpenError):
            dependency()  # consult: the trip is pushed
    assert len(lines(caplog, "circuit_breaker.store_recovered")) == 1
    record = decode(admin.get(store.key("outage-readonly")))
    assert record.state == "open" and record.trigger == "consecutive_failures"


def test_st4_stalled_server_times_out_within_socket_timeout(
    private_redis, private_shared, fresh_registry, clock, caplog
):
    """ST-4: a server that accepts but never answers (SIGSTOP) costs a call at most about
    BALDUR_REDIS_SOCKET_TIMEOUT (0.2 s here) once per sync interval, never an exception; the
    calls between consults make no store call at all (counted, not timed)."""
    import os
    import signal
    import time

    private_shared(socket_timeout=0.2)
    dependency = _protected("outage-stalled")
    assert dependency() == "ok"
    os.kill(private_redis.pid, signal.SIGSTOP)
    try:
        clock.advance(5.0)
        with caplog.at_level(logging.INFO, logger=LOGGER):
            started = time.monotonic()
            assert dependency() == "ok"  # this one consults, and waits for the read timeout
            consult = time.monotonic() - started
            for _ in range(1000):
                assert dependency() == "ok"  # inside the interval: no store call
        assert 0.15 <= consult < 1.5
        warnings = lines(caplog, "circuit_breaker.store_unavailable")
        assert len(warnings) == 1 and "Timeout" in warnings[0].getMessage()
        assert fresh_registry.guard.failures == 1  # the 1000 calls made no store call (each would fail)
    finally:
        os.kill(private_redis.pid, signal.SIGCONT)


def test_st4_exhausted_pool_is_an_error_not_a_wait(private_redis, private_shared, fresh_registry, clock, caplog):
    """ST-4: with BALDUR_REDIS_MAX_CONNECTIONS connections all busy, a consult fails at once
    (redis-py's 'Too many connections') and the call is judged locally; no exception, no wait."""
    store = private_shared(max_connections=1)
    dependency = _protected("outage-pool")
    admin = redis.Redis.from_url(private_redis.url())
    holding = threading.Thread(target=lambda: store.client.blpop(["outage-pool:release"], timeout=10), daemon=True)
    holding.start()  # takes the pool's only connection, and keeps it until released
    try:
        wait_for(lambda: admin.info("clients")["blocked_clients"] >= 1, what="the pool's connection to be busy")
        with caplog.at_level(logging.INFO, logger=LOGGER):
            assert dependency() == "ok"  # first use: the consult finds no free connection
        assert len(lines(caplog, "circuit_breaker.store_unavailable")) == 1
        assert dependency.breaker.snapshot()["store_available"] is False
        with pytest.raises(StoreUnavailable) as exhausted:
            store.inspect("outage-pool")
        # by type: a ConnectionError in every redis-py (redis-py 8's MaxConnectionsError is one)
        assert isinstance(exhausted.value.__cause__, redis.ConnectionError)
    finally:
        admin.rpush("outage-pool:release", "go")
        holding.join(10)


def test_st4_trip_recovered_locally_during_outage_is_not_pushed(
    private_redis, private_shared, fresh_registry, clock, events
):
    """ST-4/CB-14: a worker that tripped during an outage and then recovered on its own (local
    probe succeeded) has no trip left to push: when the store returns it rejoins CLOSED, the
    shared record is not reopened, and no second 'opened' is published."""
    store = private_shared()

    @baldur.circuit_breaker("outage-stale", failure_threshold=1, recovery_timeout=10, half_open_max_calls=1)
    def dependency(ok: bool = True) -> str:
        if not ok:
            raise DependencyDown("down")
        return "ok"

    assert dependency() == "ok"
    private_redis.kill()
    clock.advance(5.0)
    with pytest.raises(DependencyDown):
        dependency(ok=False)  # local trip, not written
    clock.advance(10.0)
    assert dependency() == "ok"  # the local probe succeeds: CLOSED again
    assert dependency.breaker.state.value == "closed"
    private_redis.start()
    clock.advance(5.0)
    assert dependency() == "ok"  # consult after the outage
    assert store.inspect("outage-stale").record.state == "closed"
    assert [t for t in events.transitions() if t[1] == "open"] == [("closed", "open", "consecutive_failures")]

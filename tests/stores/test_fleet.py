"""ST-2/OP-4: real OS processes sharing one store (real Redis, real PostgreSQL).

The dependency counts the calls that reach it (keys on Redis DB 12), so it testifies
itself how many probes got through. Recovery timeouts and leases are short and real,
because the store's own clock is the one that counts (ST-2). Budget: under 60 s.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
import uuid

import pytest
import redis

from tests.conftest import need_server
from tests.stores import fleet_worker
from tests.stores.conftest import reachable

# a hang detector, not a speed goal: on a loaded 2-core machine one 8-process test took
# 99 s (3 CPU hogs running); the group's speed is watched by tests/budgets.py
pytestmark = [pytest.mark.multiprocess, pytest.mark.slow, pytest.mark.timeout(300)]

#: seconds a wait for something the fleet must do may take before the test fails: far more
#: than any step takes on a loaded machine (a passing run never waits it out)
PATIENCE = 60.0

NAME = "fleet-payments"  # per test, the record lives under a unique key prefix


def wait_for(predicate, timeout=PATIENCE, what="condition"):
    """Poll *predicate* until true (bounded); waiting for an observable condition, not a sleep."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


class Worker:
    def __init__(self, ctx, backend, **kwargs):
        self.commands = ctx.Queue()
        self.answers = ctx.Queue()
        self.process = ctx.Process(
            target=fleet_worker.main, args=(backend, NAME, self.commands, self.answers), kwargs=kwargs, daemon=True
        )
        self.process.start()

    def ready(self):
        kind, _pid = self.answers.get(timeout=60)
        assert kind == "ready"
        return self

    def send(self, command, arg=None):
        self.commands.put((command, arg))

    def recv(self, timeout=30):
        return self.answers.get(timeout=timeout)

    def stop(self):
        if self.process.is_alive():
            self.send("stop")
            self.process.join(5)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(5)


class Dependency:
    """The parent's view of the dependency's counters, under this test's own key prefix
    (no FLUSHDB: other test runs may share the server)."""

    def __init__(self, client, prefix):
        self.client = client
        self.prefix = prefix

    def k(self, key):
        return f"{self.prefix}:{key.removeprefix('dep:')}"

    def get(self, key):
        return self.client.get(self.k(key))

    def set(self, key, value):
        return self.client.set(self.k(key), value)

    def delete(self, *keys):
        return self.client.delete(*[self.k(key) for key in keys])

    def rpush(self, key, *values):
        return self.client.rpush(self.k(key), *values)

    def lrange(self, key, a, b):
        return self.client.lrange(self.k(key), a, b)


@pytest.fixture
def dep():
    need_server("Redis at 127.0.0.1:6379", reachable("127.0.0.1", 6379))
    client = redis.Redis.from_url(fleet_worker.DEP_URL)
    prefix = f"dep-{uuid.uuid4().hex[:12]}"
    yield Dependency(client, prefix)
    for key in client.scan_iter(f"{prefix}:*"):
        client.delete(key)


@pytest.fixture(params=["redis", "postgres"])
def shared_store(request, dep):
    """The parent's handle on the shared store the workers use (``cluster``, a Redis Cluster,
    only by indirect parametrization: tests/stores/test_cluster.py)."""
    if request.param == "cluster":
        from baldur_django.core.stores.redis import RedisStore, connect

        cluster = request.getfixturevalue("redis_cluster")
        client = connect(cluster.url, socket_timeout=2.0, cluster=True)
        store = RedisStore(client, prefix=f"fleet-{uuid.uuid4().hex[:12]}")
        store.url = cluster.url
        yield "cluster", store
        client.close()
        return
    if request.param == "redis":
        from baldur_django.core.stores.redis import RedisStore, connect

        client = connect("redis://127.0.0.1:6379/13", socket_timeout=2.0)
        prefix = f"fleet-{uuid.uuid4().hex[:12]}"
        yield "redis", RedisStore(client, prefix=prefix)
        for key in client.scan_iter(f"{prefix}:*"):
            client.delete(key)
        return
    need_server("PostgreSQL at 127.0.0.1:5432", reachable("127.0.0.1", 5432))
    from django.db import connections

    from baldur_django.backends.database import DatabaseStore

    os.environ["BALDUR_PG_NAME"] = connections["pg"].settings_dict["NAME"]
    try:
        yield "database", DatabaseStore(alias="pg")
    finally:
        os.environ.pop("BALDUR_PG_NAME", None)


@pytest.fixture
def spawn(shared_store, dep):
    backend, store = shared_store
    ctx = multiprocessing.get_context("spawn")
    started: list[Worker] = []

    def start(n, **kwargs):
        kwargs = {"prefix": getattr(store, "prefix", "baldur"), "dep": dep.prefix, **kwargs}
        if backend == "cluster":
            kwargs["store_url"] = store.url
        workers = [Worker(ctx, backend, **kwargs) for _ in range(n)]
        started.extend(workers)
        return [w.ready() for w in workers]

    yield start
    for worker in started:
        worker.stop()


@pytest.mark.parametrize("n", [2, 4, 8])
def test_st2_fleet_half_open_budget_over_rounds(n, spawn, shared_store, dep):
    """ST-2/CB-6: N processes together send at most half_open_max_calls probes per round,
    exactly that many when they all succeed, and the round closes the shared record."""
    _, store = shared_store
    half_open_budget_rounds(n, spawn, store, dep)


def half_open_budget_rounds(n, spawn, store, dep, rounds=3):
    """Start *n* workers and run *rounds* trip / probe / close rounds, asserting the fleet-wide
    probe budget in each (also run on a Redis Cluster by tests/stores/test_cluster.py)."""
    max_calls = 3
    # a probe lease that cannot lapse during the test (a lapsed lease frees its slot: a
    # fourth probe would be right, and this test's budget count wrong)
    workers = spawn(n, max_calls=max_calls, timeout=0.3, sync=0.2, lease=600.0)
    for round_no in range(rounds):
        dep.set("dep:mode", "fail")
        for w in workers:
            w.send("call_until_rejected")
        for w in workers:
            kind, _ = w.recv()
            assert kind == "rejected"
        assert store.inspect(NAME).record.state == "open"
        dep.set("dep:mode", "hold")
        dep.delete("dep:held", "dep:rejected", "dep:release", "dep:who")
        stop_key = f"stop:{round_no}"
        for w in workers:
            w.send("probe_until", dep.k(stop_key))
        wait_for(lambda: int(dep.get("dep:held") or 0) >= max_calls, what="the probes to arrive")
        record = store.inspect(NAME).record
        assert record.state == "half_open", (round_no, record, dep.get("dep:held"), dep.get("dep:calls"))
        # keep the round open while every worker keeps trying: the dependency sees no extra probe
        seen = int(dep.get("dep:rejected") or 0)
        wait_for(lambda: int(dep.get("dep:rejected") or 0) >= seen + 5 * n, what="traffic during the round")
        assert int(dep.get("dep:held")) == max_calls, dep.lrange("dep:who", 0, -1)
        dep.set("dep:mode", "ok")
        dep.rpush("dep:release", *["go"] * max_calls)
        wait_for(lambda: store.inspect(NAME).record.state == "closed", what="the round to close")
        dep.set(stop_key, 1)
        reports = [w.recv()[1] for w in workers]
        assert int(dep.get("dep:held")) == max_calls
        assert sum(r["admitted"] for r in reports) >= max_calls
        if n > max_calls:
            assert any(r["reasons"].get("half_open_full") for r in reports)


def test_st2_worker_killed_mid_probe_does_not_stick_the_fleet(spawn, shared_store, dep):
    """ST-2: the only probe's worker is killed (SIGKILL); its lease expires and the fleet recovers."""
    _, store = shared_store
    victim, *others = spawn(3, max_calls=1, lease=1.0, timeout=0.3, sync=0.2)
    dep.set("dep:mode", "fail")
    for w in [victim, *others]:
        w.send("call_until_rejected")
    for w in [victim, *others]:
        assert w.recv()[0] == "rejected"
    dep.set("dep:mode", "hold")
    victim.send("acquire_probe_and_hang")
    assert victim.recv() == ("probing", True)
    wait_for(lambda: int(dep.get("dep:held") or 0) == 1, what="the victim's probe")
    os.kill(victim.process.pid, signal.SIGKILL)
    victim.process.join(5)
    for w in others:
        w.send("probe_until", dep.k("stop:kill"))
    wait_for(lambda: int(dep.get("dep:held") or 0) == 2, timeout=15, what="a probe after the lease expired")
    dep.set("dep:mode", "ok")
    dep.rpush("dep:release", "go")
    wait_for(lambda: store.inspect(NAME).record.state == "closed", what="the fleet to close")
    dep.set("stop:kill", 1)
    for w in others:
        assert w.recv()[0] == "probed"


def test_op4_force_while_workers_trip(spawn, shared_store, dep, caplog):
    """OP-4: a force written while workers are tripping is never overwritten; they log
    trip_blocked and obey it; a process started later obeys a force on its first call; a running
    worker obeys a new force after its sync interval."""
    _, store = shared_store
    workers = spawn(3, sync=30.0)
    dep.set("dep:mode", "ok")
    for w in workers:
        w.send("call_n", 1)  # first use: CLOSED, adopted before the force
    for w in workers:
        assert w.recv()[1]["outcomes"] == ["ok"]
    store.force(NAME, mode="closed", ttl_seconds=600.0, reason="known good", actor="ops")
    dep.set("dep:mode", "fail")
    for w in workers:
        w.send("call_n", 10)
    for w in workers:
        report = w.recv()[1]
        assert "trip_blocked" in report["kinds"]
        assert report["outcomes"] == ["failed"] * 10  # obeys forced closed: nothing rejected
        assert report["forced"] == "closed"
    record = store.inspect(NAME).record
    assert record.forced == "closed" and record.state == "closed"

    store.force(NAME, mode="open", ttl_seconds=600.0, reason="maintenance", actor="ops")
    (late,) = spawn(1, sync=30.0)
    late.send("call_n", 1)
    assert late.recv()[1]["outcomes"] == ["rejected:open"]

    (running,) = spawn(1, sync=0.2)
    store.release(NAME)
    store.force(NAME, mode="closed", ttl_seconds=600.0, reason="", actor=None)
    dep.set("dep:mode", "ok")
    running.send("call_n", 1)
    assert running.recv()[1]["outcomes"] == ["ok"]
    store.force(NAME, mode="open", ttl_seconds=600.0, reason="", actor=None)
    running.send("call_until_rejected")
    kind, report = running.recv(timeout=15)
    assert kind == "rejected"  # it picked the force up on a consult and rejects

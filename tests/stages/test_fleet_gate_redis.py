"""RS-3: the fleet's Retry-After gate on the real Redis at 127.0.0.1:6379, database 7 (kept
for these tests), each test under a key prefix of its own that is deleted afterwards.
Locally an unreachable server skips; with CI=true it fails (tests/conftest.need_server).

One round trip per write (the script, already loaded), the later end wins across clients
and across 16 threads (and a meta-test: a plain GET-then-SET loses it), the key holds the
end on the store's clock and expires at it, and one round trip reads many services.
"""

from __future__ import annotations

import logging
import sys
import threading
import uuid

import pytest

from baldur_django.core.errors import RateLimitCooldownError
from baldur_django.core.stages.fleet_gate import FleetGate, RedisGateStore, gate_ends
from baldur_django.core.stages.gate import RetryAfterGate
from baldur_django.core.stores.base import StoreUnavailable, safe_key
from baldur_django.core.stores.redis import connect
from baldur_django.core.testing import FakeClock
from tests.conftest import need_server
from tests.stores.conftest import reachable
from tests.stores.redis_tools import Counter, counting_client, free_port, wait_for

URL = "redis://127.0.0.1:6379/7"


@pytest.fixture
def prefix():
    need_server("Redis at 127.0.0.1:6379", reachable("127.0.0.1", 6379))
    name = f"t-{uuid.uuid4().hex[:12]}"
    yield name
    client = connect(URL, socket_timeout=2.0)
    for key in client.scan_iter(f"{name}:*"):
        client.delete(key)
    client.close()


@pytest.fixture
def client(prefix):
    client = connect(URL, socket_timeout=2.0)
    yield client
    client.close()


def server_ms(client) -> int:
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


def test_rs3_redis_one_round_trip_per_write(client, prefix):
    counter = Counter()
    counted = counting_client(URL, counter)
    try:
        store = RedisGateStore(counted, prefix)
        store.close_gate("warm-up", 1.0)  # the first call may load the script (NOSCRIPT)
        before = counter.snapshot()
        assert store.close_gate("payments", 30.0) == pytest.approx(30.0, abs=0.01)
        commands, trips = counter.snapshot()
        assert (commands - before[0], trips - before[1]) == (1, 1)
        assert counter.names.get("evalsha", 0) >= 1
    finally:
        counted.close()


def test_rs3_redis_key_holds_the_end_on_the_store_clock_and_expires_at_it(client, prefix):
    store = RedisGateStore(client, prefix)
    key = store.key("payments")
    assert key == f"{prefix}:gate:{{{safe_key('payments')}}}"
    before = server_ms(client)
    store.close_gate("payments", 60.0)
    after = server_ms(client)
    end = int(client.get(key))
    assert before + 60_000 <= end <= after + 60_000
    ttl = client.pttl(key)
    assert abs(end - server_ms(client) - ttl) <= 5  # the key expires at the stored end (to a few ms)
    store.close_gate("brief", 1.0)
    wait_for(lambda: client.exists(store.key("brief")) == 0, timeout=10.0, what="the gate key to expire")


def test_rs3_redis_later_end_wins_across_two_clients(client, prefix):
    other = connect(URL, socket_timeout=2.0)
    try:
        a, b = RedisGateStore(client, prefix), RedisGateStore(other, prefix)
        assert a.close_gate("payments", 60.0) == pytest.approx(60.0, abs=0.01)
        assert b.close_gate("payments", 5.0) == pytest.approx(60.0, abs=0.05)  # answers the stored end
        assert client.pttl(a.key("payments")) > 59_000
        assert b.close_gate("payments", 90.0) == pytest.approx(90.0, abs=0.01)
        assert a.gates_left(["payments"]) == {"payments": pytest.approx(90.0, abs=0.05)}
    finally:
        other.close()


def test_rs3_redis_one_round_trip_reads_many_services(client, prefix):
    store = RedisGateStore(client, prefix)
    closed = {f"svc-{i}": 10.0 + i for i in range(0, 40, 2)}
    for name, seconds in closed.items():
        store.close_gate(name, seconds)
    names = [f"svc-{i}" for i in range(40)]
    counter = Counter()
    counted = counting_client(URL, counter)
    try:
        fake = FakeClock(start=500.0)
        reader = RedisGateStore(counted, prefix)
        counted.ping()  # the connection's own handshake is not the read's
        before = counter.snapshot()
        ends = gate_ends(reader, names, fake)
        commands, trips = counter.snapshot()
        assert (commands - before[0], trips - before[1]) == (40, 1)
        assert counter.names["pttl"] == 40
    finally:
        counted.close()
    assert set(ends) == set(closed)
    for name, seconds in closed.items():
        assert 500.0 + seconds - 0.5 < ends[name] <= 500.0 + seconds


def test_rs3_redis_a_worker_learns_the_fleets_gate(client, prefix):
    here_clock, there_clock = FakeClock(), FakeClock(start=5.0)
    store = RedisGateStore(client, prefix)
    here = FleetGate(RetryAfterGate("payments", here_clock, 3600.0), store)
    there = FleetGate(RetryAfterGate("payments", there_clock, 3600.0), store)
    response = type("Answer", (), {"status_code": 429, "headers": {"Retry-After": "120"}})()
    assert here.observe(response) == 120.0
    there.check()
    for name, end in gate_ends(store, ["payments"], there_clock).items():
        assert name == "payments"
        there.close_until(end)
    with pytest.raises(RateLimitCooldownError) as caught:
        there.check()
    assert caught.value.retry_after == pytest.approx(120.0, abs=0.5)


def concurrent_closes(store_for, threads: int = 16, closes: int = 5) -> tuple[float, float]:
    """*threads* real threads (one client each, one start barrier) each close the gate
    *closes* times with growing lengths, dealt round-robin so that all of them write their
    longest ones at about the same time; returns (longest asked, seconds left in the store
    afterwards). Lengths are 10 s apart, far more than the test runs, so the longest one's
    end is the latest."""
    clients = [connect(URL, socket_timeout=5.0) for _ in range(threads)]
    stores = [store_for(c) for c in clients]
    for s in stores:
        s.close_gate("warm-up", 0.5)
    clients[0].delete(stores[0].key("payments"))  # each round starts with the gate open
    lengths = [100.0 + 10 * i for i in range(threads * closes)]
    barrier = threading.Barrier(threads)

    def work(i: int) -> None:
        barrier.wait()
        for length in lengths[i::threads]:
            stores[i].close_gate("payments", length)

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        workers = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        return max(lengths), stores[0].gates_left(["payments"]).get("payments", 0.0)
    finally:
        sys.setswitchinterval(old)
        for c in clients:
            c.close()


def test_rs3_redis_sixteen_threads_writing_at_once_keep_the_latest_end(prefix):
    for _ in range(10):
        longest, left = concurrent_closes(lambda c: RedisGateStore(c, prefix))
        assert left == pytest.approx(longest, abs=1.0)


class ReadThenWriteStore(RedisGateStore):
    """The same write without the script: GET, compare in Python, SET (two round trips)."""

    def close_gate(self, service, seconds):
        key = self.key(service)
        now = server_ms(self.client)
        wanted = now + int(seconds * 1000)
        stored = self.client.get(key)
        if stored is None or int(stored) < wanted:
            self.client.set(key, wanted, px=wanted - now)
        return seconds


def test_rs3_redis_meta_the_race_test_catches_a_write_without_the_script(prefix):
    outcomes = [concurrent_closes(lambda c: ReadThenWriteStore(c, prefix)) for _ in range(10)]
    assert any(left < longest - 1.0 for longest, left in outcomes)


def test_rs3_redis_unreachable_the_local_gate_works_and_the_write_is_dropped(caplog):
    dead = connect(f"redis://127.0.0.1:{free_port()}/7", socket_timeout=0.5)
    try:
        store = RedisGateStore(dead, "baldur")
        with pytest.raises(StoreUnavailable):
            store.close_gate("payments", 1.0)
        with pytest.raises(StoreUnavailable):
            store.gates_left(["payments"])
        gate = FleetGate(RetryAfterGate("payments", FakeClock(), 3600.0), store)
        with caplog.at_level(logging.WARNING, logger="baldur.circuit_breaker"):
            gate.close_for(30)
            gate.close_for(40)
        assert [r.event for r in caplog.records if r.name == "baldur.circuit_breaker"] == [
            "circuit_breaker.store_unavailable"
        ]
        with pytest.raises(RateLimitCooldownError):
            gate.check()
    finally:
        dead.close()


def test_rs3_redis_cluster_writes_and_reads_gates_in_many_slots(redis_cluster):
    """On a Redis Cluster each gate key lives in its breaker's slot; the write is one script
    on one key and the read of many services one pipeline (one batch per master)."""
    cluster = connect(redis_cluster.url, socket_timeout=2.0, cluster=True)
    try:
        store = RedisGateStore(cluster, f"t-{uuid.uuid4().hex[:12]}")
        names = [f"svc-{i}" for i in range(12)]
        for i, name in enumerate(names[:6]):
            assert store.close_gate(name, 30.0 + i) == pytest.approx(30.0 + i, abs=0.05)
        assert store.close_gate("svc-0", 1.0) == pytest.approx(30.0, abs=0.05)  # the later end wins
        left = store.gates_left(names)
        assert set(left) == set(names[:6])
        assert left["svc-5"] == pytest.approx(35.0, abs=0.5)
    finally:
        cluster.close()

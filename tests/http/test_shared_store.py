"""HC-1, ST-2: two worker processes share the adapter's per-host breaker through the real Redis server."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from tests.conftest import need_server
from tests.stores.conftest import REDIS_URL, reachable

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.redis, pytest.mark.multiprocess]


class Peer:
    """One worker process (tests/http/peer.py), started at once so that both start together."""

    def __init__(self, prefix: str) -> None:
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        env.pop("DJANGO_SETTINGS_MODULE", None)
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.http.peer", REDIS_URL, prefix],
            cwd=ROOT,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def wait_ready(self) -> None:
        assert self.process.stdout.readline().strip() == "ready"

    def get(self, url: str) -> dict:
        self.process.stdin.write(url + "\n")
        self.process.stdin.flush()
        return json.loads(self.process.stdout.readline())

    def stop(self) -> None:
        self.process.stdin.close()
        assert self.process.wait(30) == 0


def test_hc1_one_process_trips_the_other_refuses(server):
    """HC-1, ST-2: process A's 503 opens the host's breaker in the shared Redis store;
    process B, which never saw a failure, refuses its first request before connecting."""
    need_server("Redis at 127.0.0.1:6379", reachable("127.0.0.1", 6379))
    prefix = f"t-{uuid.uuid4().hex[:12]}"
    from baldur_django.core.stores.redis import connect

    client = connect(REDIS_URL, socket_timeout=2.0)
    try:
        first, second = Peer(prefix), Peer(prefix)
        first.wait_ready()
        second.wait_ready()
        assert first.get(server.url("/status/503")) == {"status": 503}
        connections = server.connections
        assert second.get(server.url("/ok")) == {"refused": "open", "service": server.name}
        assert server.connections == connections
        assert server.count("/ok") == 0
        first.stop()
        second.stop()
    finally:
        for key in client.scan_iter(f"{prefix}:*"):
            client.delete(key)
        client.close()


def test_st3_fresh_processes_send_only_the_fleet_trials_through_the_adapter(server):
    """ST-2, ST-3: the host's record is OPEN past its recovery timeout; three fresh processes
    send 8 requests each at once through ``BreakerAdapter`` (``half_open_max_calls=2``).
    Only the fleet's 2 trials reach the upstream (held there until every other request was
    refused): no process admits a request on its own unread state."""
    need_server("Redis at 127.0.0.1:6379", reachable("127.0.0.1", 6379))
    from baldur_django.core.breaker import CircuitBreaker
    from baldur_django.core.clock import SYSTEM_CLOCK
    from baldur_django.core.config import SettingsSource, build_config
    from baldur_django.core.events import EventBus
    from baldur_django.core.stores.redis import RedisStore, connect
    from baldur_django.core.sync import StoreGuard
    from tests.stores.conftest import _shift

    prefix = f"t-{uuid.uuid4().hex[:12]}"
    client = connect(REDIS_URL, socket_timeout=2.0)
    store = RedisStore(client, prefix=prefix)
    processes, threads = 3, 8
    peers: list[subprocess.Popen] = []
    try:
        bus = EventBus()  # another worker's breaker: one failure opens the record
        config = build_config(server.name, {"failure_threshold": 1, "recovery_timeout": 30}, SettingsSource(environ={}))
        tripper = CircuitBreaker(server.name, config, bus=bus)
        tripper.use_store(StoreGuard(store, lambda: 60.0, bus.publish, SYSTEM_CLOCK.monotonic, SYSTEM_CLOCK.wall))
        tripper.record_failure(tripper.acquire())
        key = store.key(server.name)
        client.set(key, _shift(client.get(key), 60))  # its recovery timeout is over
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        env.pop("DJANGO_SETTINGS_MODULE", None)
        url = server.url("/hang")
        for _ in range(processes):
            peers.append(
                subprocess.Popen(
                    [sys.executable, "-m", "tests.http.burst_peer", REDIS_URL, prefix, url, str(threads)],
                    cwd=ROOT,
                    env=env,
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    text=True,
                )
            )
        for peer in peers:
            assert peer.stdout.readline().strip() == "ready"
        for peer in peers:
            peer.stdin.write("go\n")
            peer.stdin.flush()
        lines: list[dict] = []

        def read(peer: subprocess.Popen) -> None:
            for line in peer.stdout:
                lines.append(json.loads(line))

        readers = [threading.Thread(target=read, args=(peer,), daemon=True) for peer in peers]
        for reader in readers:
            reader.start()
        deadline = time.monotonic() + 30
        # every request was refused, or hangs at the upstream (polling observable counts, bounded)
        while sum("refused" in line for line in lines) + server.count("/hang") < processes * threads:
            assert time.monotonic() < deadline, f"requests unsettled: {lines}, {server.count('/hang')} at the upstream"
            time.sleep(0.01)
        reached = server.count("/hang")
        server.stop()  # the hanging trials end
        for peer in peers:
            peer.stdin.close()
            assert peer.wait(30) == 0
        for reader in readers:
            reader.join(10)
        assert len(lines) == processes * threads
        assert 1 <= reached <= 2, f"{reached} of {processes * threads} requests reached the upstream"
    finally:
        for peer in peers:
            if peer.poll() is None:
                peer.kill()
        for key in client.scan_iter(f"{prefix}:*"):
            client.delete(key)
        client.close()

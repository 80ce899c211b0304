"""HC-1, ST-2: two worker processes share the adapter's per-host breaker through the real Redis server."""

from __future__ import annotations

import json
import os
import subprocess
import sys
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

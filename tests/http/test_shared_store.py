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


def run_peer(prefix: str, url: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("DJANGO_SETTINGS_MODULE", None)
    done = subprocess.run(
        [sys.executable, "-m", "tests.http.peer", REDIS_URL, prefix, url],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_hc1_one_process_trips_the_other_refuses(server):
    """HC-1, ST-2: process A's 503 opens the host's breaker in the shared Redis store;
    process B, which never saw a failure, refuses its first request before connecting."""
    need_server("Redis at 127.0.0.1:6379", reachable("127.0.0.1", 6379))
    prefix = f"t-{uuid.uuid4().hex[:12]}"
    from baldur_django.core.stores.redis import connect

    client = connect(REDIS_URL, socket_timeout=2.0)
    try:
        assert run_peer(prefix, server.url("/status/503")) == {"status": 503}
        connections = server.connections
        assert run_peer(prefix, server.url("/ok")) == {"refused": "open", "service": server.name}
        assert server.connections == connections
        assert server.count("/ok") == 0
    finally:
        for key in client.scan_iter(f"{prefix}:*"):
            client.delete(key)
        client.close()

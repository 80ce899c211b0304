"""Fixtures of the Emergency Mode tests: a fake clock driving the level cache, peers, Redis."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from baldur_django.core import emergency
from baldur_django.core.testing import FakeClock
from tests.conftest import need_server
from tests.stores.conftest import reachable

ROOT = Path(__file__).resolve().parents[2]
REDIS_URL = "redis://127.0.0.1:6379/12"


@pytest.fixture
def em_clock():
    """A FakeClock driving Emergency Mode's cache and expiries in this process."""
    clock = FakeClock()
    emergency.use_clock(clock)
    return clock


@pytest.fixture
def memory_level(em_clock):
    """Emergency Mode on an in-process backend, driven by the fake clock."""
    backend = emergency.MemoryLevelBackend()
    emergency.use_backend(backend)
    return backend


@pytest.fixture
def redis_level():
    """A RedisLevelBackend on the real server (DB 12) under a key prefix of this test's own."""
    need_server("Redis at 127.0.0.1:6379", reachable("127.0.0.1", 6379))
    from baldur_django.core.stores.redis import connect

    client = connect(REDIS_URL, socket_timeout=2.0)
    prefix = f"em-{uuid.uuid4().hex[:12]}"
    backend = emergency.RedisLevelBackend(client, prefix=prefix)
    backend.prefix = prefix
    yield backend
    for key in client.scan_iter(f"{prefix}:*"):
        client.delete(key)
    client.close()


class Peer:
    """Another process reading/setting the level (tests/emergency/peer.py)."""

    def __init__(self, spec: str, **env_vars: str) -> None:
        env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
        env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
        env.update(env_vars)
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.emergency.peer", spec],
            cwd=ROOT,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.hello = self._answer()

    def _answer(self) -> dict:
        line = self.process.stdout.readline()
        if not line:
            raise AssertionError(f"peer died: {self.process.stderr.read()}")
        return json.loads(line)

    def ask(self, **command) -> dict:
        self.process.stdin.write(json.dumps(command) + "\n")
        self.process.stdin.flush()
        return self._answer()

    def close(self) -> None:
        if self.process.poll() is None:
            try:
                self.ask(op="quit")
            except (AssertionError, OSError, ValueError):
                pass
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)


@pytest.fixture
def peer():
    """Start peers with ``peer(spec, **env)``; every one is stopped at teardown."""
    started: list[Peer] = []

    def start(spec: str, **env_vars: str) -> Peer:
        started.append(Peer(spec, **env_vars))
        return started[-1]

    yield start
    for one in started:
        one.close()

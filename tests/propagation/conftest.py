"""Fixtures of the EM-6 tests: real Redis (DB 14), a channel of each test's own, peer processes.

Pub/sub channels are server-wide (databases do not separate them), so every test uses a
channel prefix of its own; nothing is written to any key. Peer processes
(:mod:`tests.propagation.peer`) are real OS processes running the core plus propagation.
"""

from __future__ import annotations

import json
import os
import queue
import socket
import subprocess
import sys
import threading
import uuid
from pathlib import Path

import pytest

from baldur_django.contrib import propagation
from tests.conftest import need_server
from tests.stores.conftest import reachable
from tests.stores.redis_tools import wait_for  # noqa: F401 - re-exported for the tests

REDIS_DB = 14
REDIS_URL = f"redis://127.0.0.1:6379/{REDIS_DB}"
ROOT = Path(__file__).resolve().parents[2]


def unique_prefix() -> str:
    return f"t-em6-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def redis_up():
    need_server("Redis at 127.0.0.1:6379", reachable("127.0.0.1", 6379))
    return REDIS_URL


@pytest.fixture
def prefix() -> str:
    """A channel prefix of this test's own."""
    return unique_prefix()


@pytest.fixture
def raw(redis_up):
    """A plain redis-py client on the test server, for publishing as a peer and listening."""
    import redis

    client = redis.Redis.from_url(REDIS_URL, socket_timeout=5)
    yield client
    client.close()


@pytest.fixture
def propagators():
    """``make(**kwargs)`` builds a Propagator (not started); every one is stopped afterwards,
    and the process-wide one is uninstalled."""
    made: list[propagation.Propagator] = []

    def make(**kwargs) -> propagation.Propagator:
        made.append(propagation.Propagator(**kwargs))
        return made[-1]

    yield make
    for instance in made:
        instance.stop(timeout=1.0)
    propagation.uninstall(timeout=1.0)


class Listener:
    """A test client subscribed to a channel: what was published there, in order."""

    def __init__(self, client, channel: str) -> None:
        self.client = client
        self.channel = channel
        self.pubsub = client.pubsub()
        self.pubsub.subscribe(channel)
        confirmed = self.pubsub.get_message(timeout=10)  # subscribed before anything is published
        assert confirmed is not None and confirmed["type"] == "subscribe", confirmed
        self.messages: list[dict] = []

    def drain(self) -> list[dict]:
        """Everything published on the channel up to now: publishes a sentinel and reads
        until it arrives (Redis delivers one channel's messages in order)."""
        token = uuid.uuid4().hex
        self.client.publish(self.channel, json.dumps({"sentinel": token}))
        while True:
            message = self.pubsub.get_message(timeout=10)
            assert message is not None, "the sentinel never arrived"
            data = json.loads(message["data"])
            if data.get("sentinel") == token:
                return self.messages
            if "sentinel" not in data:
                self.messages.append(data)

    def close(self) -> None:
        self.pubsub.close()


class Peer:
    """A peer worker process (``tests.propagation.peer``) driven by JSON lines."""

    def __init__(self, name: str, prefix: str, tmp: Path, health: float = 1.0, services=None) -> None:
        self.name = name
        env = {k: v for k, v in os.environ.items() if not k.startswith("BALDUR_")}
        env.update(
            PYTHONPATH=str(ROOT),
            BALDUR_REDIS_URL=REDIS_URL,
            BALDUR_EMERGENCY_STATE_FILE=str(tmp / f"{name}-level.json"),  # a level of its own
        )
        options = {"prefix": prefix, "health": health, "services": services or {}}
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.propagation.peer", json.dumps(options)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            cwd=str(ROOT),
            env=env,
        )
        self._lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        self.hello: dict | None = None

    def _read(self) -> None:
        for line in self.process.stdout:
            self._lines.put(line)
        self._lines.put("")

    def recv(self, timeout: float = 20.0) -> dict:
        try:
            line = self._lines.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"peer {self.name} said nothing for {timeout} s") from None
        assert line, f"peer {self.name} exited ({self.process.poll()})"
        return json.loads(line)

    def ready(self) -> dict:
        if self.hello is None:
            self.hello = self.recv(30)
            assert self.hello["ready"], f"peer {self.name} never subscribed"
        return self.hello

    def send(self, op: str, **fields) -> dict:
        self.process.stdin.write(json.dumps({"op": op, **fields}) + "\n")
        self.process.stdin.flush()
        return self.recv()

    def quit(self) -> None:
        if self.process.poll() is None:
            try:
                self.process.stdin.write(json.dumps({"op": "quit"}) + "\n")
                self.process.stdin.flush()
                self.process.wait(5)
            except (OSError, subprocess.TimeoutExpired):
                self.process.kill()
                self.process.wait(5)


@pytest.fixture(scope="module")
def trio(tmp_path_factory):
    """Three peer processes A, B, C on one channel of this module's own."""
    need_server("Redis at 127.0.0.1:6379", reachable("127.0.0.1", 6379))
    prefix = unique_prefix()
    tmp = tmp_path_factory.mktemp("em6-peers")
    peers = [Peer(name, prefix, tmp) for name in "ABC"]
    try:
        for peer in peers:
            peer.ready()
        yield prefix, peers
    finally:
        for peer in peers:
            peer.quit()


class HungServer:
    """A TCP server that accepts connections and reads what they send, but never answers:
    a Redis that hangs. ``received`` holds every byte read."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.received = b""
        self._lock = threading.Lock()
        self._conns: list[socket.socket] = []
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self._conns.append(conn)
            threading.Thread(target=self._drink, args=(conn,), daemon=True).start()

    def _drink(self, conn: socket.socket) -> None:
        while True:
            try:
                data = conn.recv(65536)
            except OSError:
                return
            if not data:
                return
            with self._lock:
                self.received += data

    def close(self) -> None:
        self._closed = True
        self.sock.close()
        for conn in self._conns:
            try:
                conn.close()
            except OSError:
                pass


@pytest.fixture
def hung_server():
    server = HungServer()
    yield server
    server.close()

"""Helpers for the shared-store proof tests: private redis-server processes and command counting.

* :class:`RedisServer` runs a throw-away ``redis-server`` on a free port, owned by the
  test (started, SIGKILLed and restarted by PID), so an outage can be real without
  disturbing the shared server other suites use.
* :func:`counting_client` builds a redis-py client with the same options as
  ``baldur_django.core.stores.redis.connect`` whose connections count what they send:
  commands and round trips (one write of a packed buffer = one round trip).
* :func:`commandstats` reads ``INFO commandstats`` as ``{command: calls}``.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from typing import Any

import redis

from benchmarks.stores import CommandCounter, counting_client  # noqa: F401 - re-exported

REDIS_SERVER = shutil.which("redis-server")


def server_command(port: int, *extra: str) -> list[str]:
    """The command line of a private test redis-server: loopback only, in the foreground,
    nothing written to disk; *extra* adds options (cluster mode, say)."""
    assert REDIS_SERVER is not None, "redis-server is not installed"
    quiet = ["--save", "", "--appendonly", "no", "--daemonize", "no", "--loglevel", "warning"]
    return [REDIS_SERVER, "--port", str(port), "--bind", "127.0.0.1", *extra, *quiet]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now (bind to 0, read, close)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for(predicate, timeout: float = 10.0, what: str = "condition", step: float = 0.01) -> Any:
    """Poll *predicate* until it returns a true value, at most *timeout* seconds.

    Waiting for an observable condition of another process (a server answering, a key
    expiring on the server's clock); never used to order threads of this process.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(step)


class RedisServer:
    """A private ``redis-server`` on 127.0.0.1:*port* (nothing saved to disk).

    Args:
        port: TCP port; :func:`free_port` when None.
    """

    def __init__(self, port: int | None = None) -> None:
        if REDIS_SERVER is None:
            raise RuntimeError("redis-server is not installed")
        self.port = port or free_port()
        self.process: subprocess.Popen | None = None

    def url(self, db: int = 0) -> str:
        return f"redis://127.0.0.1:{self.port}/{db}"

    def _answers(self) -> bool:
        try:
            client = redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=0.2, socket_connect_timeout=0.2)
            try:
                return bool(client.ping())
            finally:
                client.close()
        except (redis.RedisError, OSError):
            return False

    def start(self, timeout: float = 10.0) -> RedisServer:
        """Start the server and return once it answers PING (bounded by *timeout* seconds)."""
        assert self.process is None or self.process.poll() is not None, "already running"
        self.process = subprocess.Popen(
            server_command(self.port),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

        def up() -> bool:
            if self.process.poll() is not None:
                raise AssertionError(f"redis-server on port {self.port} exited with {self.process.returncode}")
            return self._answers()

        wait_for(up, timeout, f"redis-server on port {self.port} to answer PING")
        return self

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def kill(self) -> None:
        """SIGKILL the server by its PID and reap it: an abrupt outage."""
        if self.process is not None and self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGKILL)
            self.process.wait(10)

    def stop(self) -> None:
        """Terminate (then kill) the server if it still runs; for teardown."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(5)
        except subprocess.TimeoutExpired:
            self.kill()


# the benchmark's command counter is the one the tests use too
Counter = CommandCounter


def commandstats(client: redis.Redis) -> dict[str, int]:
    """``INFO commandstats`` as ``{"evalsha": calls, "get": calls, ...}`` (server-wide)."""
    stats = client.info("commandstats")
    return {key[len("cmdstat_") :]: int(value["calls"]) for key, value in stats.items() if key.startswith("cmdstat_")}


def delta(
    before: dict[str, int], after: dict[str, int], exclude: tuple[str, ...] = ("info", "config|resetstat")
) -> dict[str, int]:
    """Per-command growth between two :func:`commandstats` readings, without *exclude*."""
    out = {}
    for name, calls in after.items():
        grown = calls - before.get(name, 0)
        if grown and name not in exclude:
            out[name] = grown
    return out

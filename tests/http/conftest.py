"""Fixtures of the outbound-client tests: real local servers, never mocked transports."""

from __future__ import annotations

import pytest

from .server import TestServer, closed_port


@pytest.fixture
def server():
    """A real HTTP server on 127.0.0.1 (see tests/http/server.py)."""
    srv = TestServer()
    yield srv
    srv.stop()


@pytest.fixture
def other_server():
    """A second, independent server (another port: another per-host breaker)."""
    srv = TestServer()
    yield srv
    srv.stop()


@pytest.fixture
def refused_port():
    """A loopback port where connections are refused."""
    return closed_port()


@pytest.fixture
def silent_redis():
    """A local TCP server that accepts connections and never answers (a hung Redis)."""
    import socket
    import threading

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    listener.settimeout(0.05)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                continue
            held.append(conn)

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield listener.getsockname()[1]
    stop.set()
    thread.join(2)
    for conn in held:
        conn.close()
    listener.close()

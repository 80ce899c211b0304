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

"""Fixtures for the rate-limit tests: the scripted upstream, HTTP clients, settings via env."""

from __future__ import annotations

import time

import httpx
import pytest
import requests

from baldur_django.core.clock import SystemClock
from baldur_django.core.config import settings as baldur_settings

from .upstream import Upstream


@pytest.fixture
def upstream():
    """A started :class:`Upstream` (real HTTP on 127.0.0.1), stopped after the test."""
    server = Upstream().start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def env(monkeypatch):
    """``env(NAME=value, ...)`` sets ``BALDUR_*`` environment variables and drops the
    settings cache, so breakers created afterwards resolve them (CFG-1)."""

    def apply(**values):
        for name, value in values.items():
            monkeypatch.setenv(name, str(value))
        baldur_settings.reset()

    return apply


@pytest.fixture
def cascade_of_one(env):
    """Cascade settings under which a single 429 sighting opens the breaker: a cheap,
    behavioural probe that a sighting fed the cascade (RL-2 b)."""
    env(BALDUR_CB_RATE_LIMIT_CASCADE_THRESHOLD=1, BALDUR_CB_RATE_LIMIT_CASCADE_MIN_CALLS=1)


@pytest.fixture
def session():
    """A ``requests.Session`` closed after the test."""
    with requests.Session() as s:
        yield s


@pytest.fixture
def client():
    """An ``httpx.Client`` closed after the test."""
    with httpx.Client(timeout=5) as c:
        yield c


@pytest.fixture
def no_blocking_sleep(monkeypatch):
    """Make every blocking sleep raise, so an async wait that blocks the loop fails the test."""

    def refuse(seconds):
        raise AssertionError(f"blocking sleep({seconds!r}) inside an async call")

    monkeypatch.setattr(time, "sleep", refuse)
    monkeypatch.setattr(SystemClock, "sleep", staticmethod(refuse))

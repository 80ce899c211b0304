"""CB-1, ST-3, IN-7: ``ready_permit()`` hands out the CLOSED lock-free permit only when
``aacquire()`` would return that same permit at once; otherwise None (await aacquire)."""

from __future__ import annotations

import asyncio

import pytest

import baldur_django as baldur
from baldur_django.core.breaker import core_of
from baldur_django.core.registry import registry
from baldur_django.core.stores.memory import MemoryStore


def test_ready_permit_is_aacquires_permit_while_closed_and_none_once_open(clock):
    breaker = registry.get("ready-local", {"failure_threshold": 1})
    permit = asyncio.run(breaker.aacquire())
    breaker.record_success(permit)
    ready = core_of(breaker).ready_permit()
    assert ready is not None and ready is asyncio.run(breaker.aacquire())
    breaker.record_failure(breaker.acquire())  # trips (threshold 1)
    assert breaker.state == "open"
    assert core_of(breaker).ready_permit() is None


def test_ready_permit_is_none_when_a_shared_breakers_consult_is_due(clock, fresh_registry, monkeypatch):
    monkeypatch.setenv("BALDUR_CB_SYNC_INTERVAL_SECONDS", "5")
    fresh_registry.set_store(MemoryStore(now=clock.wall))
    breaker = registry.get("ready-shared")
    breaker.record_success(breaker.acquire())  # first use: consulted now
    assert core_of(breaker).ready_permit() is not None
    clock.advance(5.0)  # the next consult is due: the store must be read (off the loop)
    assert core_of(breaker).ready_permit() is None


def test_ready_permit_is_none_while_forced_open(clock):
    breaker = registry.get("ready-forced")
    breaker.record_success(breaker.acquire())
    breaker.force_open(ttl_minutes=1)
    assert core_of(breaker).ready_permit() is None
    with pytest.raises(baldur.CircuitOpenError):
        breaker.acquire()

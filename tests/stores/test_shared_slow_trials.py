"""CB-17 on a shared store: a slow trial fails the fleet's round only while the trigger is on.

Each breaker meets a real store (the memory store on a FakeClock, and the Redis store on the
real server, whose own clock is aged by shifting the record's timestamps back).
"""

from __future__ import annotations

import pytest

from baldur_django.core.breaker import CircuitBreaker
from baldur_django.core.config import SettingsSource, build_config
from baldur_django.core.events import EventBus
from baldur_django.core.sync import StoreGuard
from baldur_django.core.testing import FakeClock, RecordingListener
from tests.stores.conftest import _memory, _redis_backend

BASE = {
    "failure_threshold": 1,
    "failure_rate_threshold": 0,
    "recovery_timeout": 5,
    "half_open_max_calls": 1,
    "slow_call_duration": 1.0,
    "slow_call_rate_threshold": 50,
    "minimum_calls": 2,
}


@pytest.fixture(params=["memory", "redis"])
def shared(request):
    if request.param == "memory":
        return _memory()
    return _redis_backend(request.getfixturevalue("redis_client"))


def worker(backend, clock, **overrides):
    bus = EventBus()
    events = RecordingListener(bus)
    source = SettingsSource(environ={"BALDUR_CB_SYNC_INTERVAL_SECONDS": "5"})
    guard = StoreGuard(backend.store, lambda: 60.0, bus.publish, clock.monotonic, clock.wall)
    breaker = CircuitBreaker(
        "slow-shared", build_config("slow-shared", {**BASE, **overrides}, source), clock=clock, bus=bus
    )
    breaker.use_store(guard)
    return breaker, events


def open_then_probe(backend, breaker, clock):
    breaker.record_failure(breaker.acquire())
    assert backend.store.inspect("slow-shared").record.state == "open"
    backend.age("slow-shared", 6)
    clock.advance(6)
    trial = breaker.acquire()
    assert trial.trial and trial.token is not None  # the fleet's slot, from the store
    clock.advance(30)  # a very slow trial
    breaker.record_success(trial)


@pytest.mark.parametrize("off", [{"slow_call_rate_threshold": 0}, {"slow_call_duration": 0}])
def test_cb17_shared_trigger_off_slow_trial_closes(shared, off):
    """CB-17, ST-2: with the trigger off (rate threshold 0, or duration 0) a slow trial is a
    success for the shared round: the record closes, trigger half_open_success."""
    clock = FakeClock()
    breaker, _events = worker(shared, clock, **off)
    open_then_probe(shared, breaker, clock)
    record = shared.store.inspect("slow-shared").record
    assert (record.state, record.trigger) == ("closed", "half_open_success")
    assert breaker.state.value == "closed"


def test_cb17_shared_trigger_on_slow_trial_reopens(shared):
    """CB-17, ST-2: with the trigger on a slow trial fails the shared round (slow_call_rate)."""
    clock = FakeClock()
    breaker, _events = worker(shared, clock)
    open_then_probe(shared, breaker, clock)
    record = shared.store.inspect("slow-shared").record
    assert (record.state, record.trigger) == ("open", "slow_call_rate")

"""CB-16 on the shared stores: k (consecutive automatic opens) lives in the shared record,
updated atomically with the transition, so the whole fleet backs off together.
"""

from __future__ import annotations

import uuid

import pytest

from baldur_django.core.breaker import CircuitBreaker
from baldur_django.core.config import SettingsSource, build_config
from baldur_django.core.errors import CircuitOpenError
from baldur_django.core.events import EventBus
from baldur_django.core.sync import StoreGuard
from baldur_django.core.testing import FakeClock


def test_cb16_store_backs_off_reopens_and_resets_on_close(backend):
    """CB-16, ST-2: trip 10 s; a failed probe 20 s; another 35 s (cap), k stays 3; a forced
    open keeps k; a successful round closes and resets k."""
    store, name = backend.store, f"bo-{backend.name}"
    answer = store.trip(
        name, trigger="consecutive_failures", recovery_timeout=10.0, backoff_factor=2.0, recovery_timeout_max=35.0
    )
    record = answer.record
    assert (record.opens, record.open_until - record.opened_at) == (1, pytest.approx(10.0))
    for expected_k, seconds in ((2, 20.0), (3, 35.0), (3, 35.0)):
        backend.age(name, 40)
        token = uuid.uuid4().hex
        probe = store.acquire_probe(name, token=token, max_calls=1, lease_seconds=30.0)
        assert probe.result is True
        answer = store.finish_probe(
            name,
            token=token,
            version=probe.record.version,
            outcome="failure",
            max_calls=1,
            recovery_timeout=10.0,
            backoff_factor=2.0,
            recovery_timeout_max=35.0,
        )
        record = answer.record
        assert answer.result == "open" and record.trigger == "half_open_failure"
        assert (record.opens, record.open_until - record.opened_at) == (expected_k, pytest.approx(seconds))
    record = store.force(name, mode="open", ttl_seconds=60.0, reason="", actor=None).record
    assert record.opens == 3
    record = store.release(name).record
    assert record.state == "half_open" and record.opens == 3
    token = uuid.uuid4().hex
    probe = store.acquire_probe(name, token=token, max_calls=1, lease_seconds=30.0)
    answer = store.finish_probe(
        name,
        token=token,
        version=probe.record.version,
        outcome="success",
        max_calls=1,
        recovery_timeout=10.0,
        backoff_factor=2.0,
        recovery_timeout_max=35.0,
    )
    assert answer.result == "closed" and answer.record.opens == 0


def test_cb17_store_slow_trial_reopens_with_its_trigger(backend):
    """CB-17, ST-2: a slow trial fails the shared round with trigger slow_call_rate."""
    store, name = backend.store, f"slow-{backend.name}"
    store.trip(name, trigger="slow_call_rate", recovery_timeout=5.0)
    backend.age(name, 10)
    token = uuid.uuid4().hex
    probe = store.acquire_probe(name, token=token, max_calls=2, lease_seconds=30.0)
    answer = store.finish_probe(
        name, token=token, version=probe.record.version, outcome="slow", max_calls=2, recovery_timeout=5.0
    )
    assert answer.result == "open" and answer.record.trigger == "slow_call_rate"


def _worker(store, clock, name):
    config = build_config(
        name,
        {
            "failure_threshold": 1,
            "failure_rate_threshold": 0,
            "recovery_timeout": 10,
            "half_open_max_calls": 1,
            "sliding_window_size": 10,
            "minimum_calls": 1,
        },
        SettingsSource(environ={"BALDUR_CB_SYNC_INTERVAL_SECONDS": "0"}),
    )
    import dataclasses

    config = dataclasses.replace(config, recovery_backoff_factor=3.0, recovery_timeout_max=1000.0)
    breaker = CircuitBreaker(name, config, clock=clock, bus=EventBus())
    breaker.use_store(StoreGuard(store, lambda: 60.0, lambda e: None, clock.monotonic, clock.wall))
    return breaker


def test_cb16_k_is_fleet_wide(backend):
    """CB-16: worker A trips (10 s); worker B's failed probe reopens (30 s); A's next probe
    fails too (90 s): each worker continues from the k the other left in the record."""
    name = f"fleet-bo-{backend.name}"
    clock = FakeClock()
    a, b = _worker(backend.store, clock, name), _worker(backend.store, clock, name)
    a.record_failure(a.acquire())
    for worker, seconds in ((b, 30.0), (a, 90.0)):
        clock.advance(1000)
        backend.age(name, 1000)
        trial = worker.acquire()
        assert trial.trial
        worker.record_failure(trial)
        snap = worker.snapshot()
        assert snap["open_duration"] == pytest.approx(seconds)
        with pytest.raises(CircuitOpenError) as rejected:
            worker.acquire()
        assert rejected.value.retry_after == pytest.approx(seconds, abs=1.0)
    assert backend.store.inspect(name).record.opens == 3


def test_cb15_cb17_shared_breaker_slow_calls_trip_and_fail_the_fleet_round(backend):
    """CB-15, CB-17, ST-2: on every store, slow calls over a time window trip the shared
    record with trigger slow_call_rate, and a slow trial fails the fleet's round."""
    name = f"slow-fleet-{backend.name}"
    clock = FakeClock()
    config = build_config(
        name,
        {
            "sliding_window_type": "time",
            "sliding_window_seconds": 30,
            "minimum_calls": 2,
            "failure_rate_threshold": 0,
            "slow_call_duration": 1,
            "slow_call_rate_threshold": 100,
            "recovery_timeout": 10,
            "half_open_max_calls": 1,
        },
        SettingsSource(environ={"BALDUR_CB_SYNC_INTERVAL_SECONDS": "0"}),
    )
    breaker = CircuitBreaker(name, config, clock=clock, bus=EventBus())
    breaker.use_store(StoreGuard(backend.store, lambda: 60.0, lambda e: None, clock.monotonic, clock.wall))
    for _ in range(2):
        permit = breaker.acquire()
        clock.advance(2)
        breaker.record_success(permit)
    record = backend.store.inspect(name).record
    assert (record.state, record.trigger) == ("open", "slow_call_rate")
    clock.advance(1000)
    backend.age(name, 1000)
    trial = breaker.acquire()
    assert trial.trial
    clock.advance(3)
    breaker.record_success(trial)
    record = backend.store.inspect(name).record
    assert (record.state, record.trigger) == ("open", "slow_call_rate")

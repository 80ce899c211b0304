"""ST-2, CB-6: a shared breaker's snapshot reports the fleet's probing round as the record
holds it, on every store, exactly as a process-local breaker reports its own round.

(Regression test, found by running pybreaker's and aiobreaker's suites against ours:
adopting the record after a successful trial zeroed the local trial counts, so on the
Redis store ``half_open_successes`` read 0 while the record held 1.)
"""

from __future__ import annotations

from baldur_django.core.breaker import CircuitBreaker
from baldur_django.core.config import SettingsSource, build_config
from baldur_django.core.events import EventBus
from baldur_django.core.sync import StoreGuard
from baldur_django.core.testing import FakeClock

OVERRIDES = {
    "failure_threshold": 1,
    "failure_rate_threshold": 0,
    "recovery_timeout": 10,
    "half_open_max_calls": 3,
    "sliding_window_size": 10,
    "minimum_calls": 1,
}


def _breaker(name, clock, guard=None):
    config = build_config(name, OVERRIDES, SettingsSource(environ={"BALDUR_CB_SYNC_INTERVAL_SECONDS": "5"}))
    breaker = CircuitBreaker(name, config, clock=clock, bus=EventBus())
    if guard is not None:
        breaker.use_store(guard)
    return breaker


def _round(breaker, clock, age):
    breaker.record_failure(breaker.acquire())
    assert breaker.snapshot()["state"] == "open"
    clock.advance(10)
    age(10)
    first, second = breaker.acquire(), breaker.acquire()
    assert first.trial and second.trial
    breaker.record_success(first)
    return breaker.snapshot()


def test_st2_cb6_snapshot_counts_the_shared_round_like_a_local_one(backend):
    """ST-2, CB-6: after one successful trial of three (one more in flight), the snapshot of a
    breaker on each store reads half_open with 2 trials taken and 1 success, as the memory
    breaker does."""
    local_clock = FakeClock()
    local = _round(_breaker("round-local", local_clock), local_clock, lambda s: None)
    assert (local["state"], local["half_open_trials"], local["half_open_successes"]) == ("half_open", 2, 1)

    clock = FakeClock()
    name = f"round-{backend.name}"
    guard = StoreGuard(backend.store, lambda: 60.0, lambda event: None, clock.monotonic, clock.wall)
    shared = _round(_breaker(name, clock, guard), clock, lambda s: backend.age(name, s))
    assert shared["store_available"] is True
    assert (shared["state"], shared["half_open_trials"], shared["half_open_successes"]) == ("half_open", 2, 1)
    record = backend.store.inspect(name).record
    assert record.successes == 1 and len(record.probes) == 1

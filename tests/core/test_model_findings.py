"""Divergences between the breaker and the requirements found while extending the
reference model (``reference_model.py``) to CB-15..CB-17, each reduced to a minimal program.

Each was a strict ``xfail`` until the breaker was fixed; they now guard the fixes.
"""

from __future__ import annotations

import pytest

from baldur_django.core.breaker import CircuitBreaker
from baldur_django.core.config import SettingsSource, build_config
from baldur_django.core.events import EventBus
from baldur_django.core.testing import FakeClock


def test_cb16_k_counts_consecutive_opens_while_backoff_is_off():
    """CB-16: factor 1.0 (off), recovery_timeout 1 s, cap 600 s: a trip then a failed trial
    are two automatic opens without a close between them; every open lasts 1 s and the
    snapshot's ``consecutive_opens`` reads 2 (the model's minimal failing program)."""
    config = build_config(
        "k-off",
        {
            "failure_threshold": 1,
            "failure_rate_threshold": 0,
            "sliding_window_size": 1,
            "minimum_calls": 1,
            "recovery_timeout": 1,
            "half_open_max_calls": 1,
        },
        SettingsSource(environ={}),
    )
    assert (config.recovery_backoff_factor, config.recovery_timeout_max) == (1.0, 600.0)
    clock = FakeClock()
    breaker = CircuitBreaker("k-off", config, clock=clock, bus=EventBus())
    breaker.record_failure(breaker.acquire())  # open #1
    assert breaker.snapshot()["consecutive_opens"] == 1
    clock.advance(1)
    trial = breaker.acquire()
    assert trial.trial
    breaker.record_failure(trial)  # open #2, no close in between
    snap = breaker.snapshot()
    assert snap["state"] == "open" and snap["open_duration"] == 1
    assert snap["consecutive_opens"] == 2


def test_cb16_forced_open_snapshot_does_not_claim_a_stale_open_duration():
    """CB-16, OP-1: forced open for 1 minute on a CLOSED breaker whose recovery timeout is
    10 s: while forced, the snapshot's ``open_until`` is either unknown (None) or the force's
    own end, and ``open_duration`` is None or the force's 60 s, never the 10 s recovery
    timeout that does not apply to a forced open."""
    config = build_config(
        "forced-duration",
        {
            "failure_threshold": 1,
            "failure_rate_threshold": 0,
            "sliding_window_size": 1,
            "minimum_calls": 1,
            "recovery_timeout": 10,
            "half_open_max_calls": 1,
        },
        SettingsSource(environ={}),
    )
    clock = FakeClock()
    breaker = CircuitBreaker("forced-duration", config, clock=clock, bus=EventBus())
    breaker.force_open(ttl_minutes=1)
    snap = breaker.snapshot()
    assert snap["state"] == "open" and snap["forced"] == "open"
    assert snap["force_expires_at"] == pytest.approx(clock.wall() + 60)
    assert snap["open_duration"] in (None, pytest.approx(60))
    assert snap["open_until"] is None or snap["open_until"] == pytest.approx(snap["force_expires_at"])

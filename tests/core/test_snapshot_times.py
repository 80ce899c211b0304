"""Snapshot times read the same at every call, on the real clocks."""

from __future__ import annotations

import time

from baldur_django.core.breaker import CircuitBreaker
from baldur_django.core.config import build_config


def test_cb9_open_times_are_stable_across_reads_on_the_system_clock():
    """CB-9: an OPEN breaker's opened_at and open_until are Unix seconds that do not move
    from one snapshot to the next (the monotonic deadline is converted with the clocks'
    difference taken at the transition, not re-read at each snapshot), and they are the
    wall time of the open to within a few milliseconds."""
    breaker = CircuitBreaker("stable-times", build_config("stable-times", {"failure_threshold": 1}))
    before = time.time()
    breaker.record_failure(breaker.acquire())
    after = time.time()
    first = breaker.snapshot()
    reads = [breaker.snapshot() for _ in range(200)]
    assert first["state"] == "open"
    assert {(s["opened_at"], s["open_until"]) for s in reads} == {(first["opened_at"], first["open_until"])}
    assert before - 0.005 <= first["opened_at"] <= after + 0.005
    assert abs(first["open_until"] - first["opened_at"] - breaker.config.recovery_timeout) < 1e-5

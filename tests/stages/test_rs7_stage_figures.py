"""RS-7: each stage counts the calls it refuses, on its refusal path only, and a breaker's
snapshot shows its stages' configuration, live figures (slots in use, budget left, throttle
probability, the gate's end) and refusals by reason; a breaker without stages shows
nothing new."""

from __future__ import annotations

import asyncio

import pytest

import baldur_django as baldur
from baldur_django.core.breaker import core_of
from baldur_django.core.registry import registry
from baldur_django.core.stages.bulkhead import Bulkhead
from baldur_django.core.stages.figures import NO_COUNTS, stage_counts, stage_section
from baldur_django.core.stages.fleet_gate import FleetGate, MemoryGateStore
from baldur_django.core.stages.gate import RetryAfterGate
from baldur_django.core.stages.refusals import deadline_refusals
from baldur_django.core.stages.throttle import AdaptiveThrottle
from baldur_django.core.testing import FakeClock

from .refusing import refuse_each, staged

pytestmark = pytest.mark.usefixtures("clock")


class Status:
    """A returned HTTP-like answer."""

    def __init__(self, status_code: int, retry_after: str) -> None:
        self.status_code = status_code
        self.headers = {"Retry-After": retry_after}


# ------------------------------------------------------------------ the components' counts
def test_rs7_the_bulkhead_counts_its_refusals_and_nothing_else():
    """RS-7: admissions count nothing; each BulkheadFullError counts one."""
    bulkhead = Bulkhead("rs7-b", 1, 0.0, FakeClock())
    ticket = bulkhead.enter()
    assert bulkhead.refused() == 0
    for _ in range(3):
        with pytest.raises(baldur.BulkheadFullError):
            bulkhead.enter()
    bulkhead.leave(ticket)
    bulkhead.leave(bulkhead.enter())
    assert bulkhead.refused() == 3


def test_rs7_the_async_bulkhead_counts_its_refusals():
    """RS-7: the async entry counts its refusals the same way."""
    bulkhead = Bulkhead("rs7-ab", 1, 0.0, FakeClock())

    async def main() -> None:
        ticket = await bulkhead.aenter()
        with pytest.raises(baldur.BulkheadFullError):
            await bulkhead.aenter()
        bulkhead.leave(ticket)

    asyncio.run(main())
    assert bulkhead.refused() == 1


def test_rs7_the_gate_counts_its_refusals_a_fleet_gate_through_its_own():
    """RS-7: each refused check counts one; an open gate or a force-closed breaker counts
    nothing; a fleet gate reports its process gate's count and end."""
    clock = FakeClock()
    gate = RetryAfterGate("rs7-g", clock, 60.0)
    gate.check()
    gate.close_for(10.0)
    gate.check(forced_closed=True)
    for _ in range(2):
        with pytest.raises(baldur.RateLimitCooldownError):
            gate.check()
    assert gate.refused() == 2
    fleet = FleetGate(gate, MemoryGateStore(clock.wall))
    assert fleet.refused() == 2 and fleet.end() == gate.end() == clock.monotonic() + 10.0


def test_rs7_the_throttle_counts_its_refusals():
    """RS-7: admit() counts a refusal only when it answers False."""
    throttle = AdaptiveThrottle("rs7-t", 2.0, 10, FakeClock(), rand=lambda: 0.0)
    answers = [throttle.admit() for _ in range(4)]
    assert answers == [True, False, False, False]
    assert throttle.refused() == 3


def test_rs7_a_deadline_refusal_of_the_retry_engine_is_counted(clock):
    """RS-7: a cooldown waited out up to the deadline ends in DeadlineExceededError, counted
    for the breaker (which has no stage of its own)."""

    @baldur.protected("rs7-dl", retry=baldur.RetryPolicy(max_attempts=3, backoff_initial=0.1))
    def search() -> Status:
        return Status(429, "2")

    with baldur.deadline(2, clock=clock), pytest.raises(baldur.DeadlineExceededError):
        search()
    breaker = baldur.get_breaker("rs7-dl")
    assert deadline_refusals(core_of(breaker)) == 1
    assert stage_counts(breaker) == (0, 0, 1, 0, 0)


# ------------------------------------------------------------------ the snapshot
def test_rs7_snapshot_shows_each_stage_configuration_and_live_figures(clock):
    """RS-7: the snapshot's ``stages`` holds the knobs, the slots in use, the budget left,
    the throttle's probability, the gate's end (Unix seconds) and the refusals by reason."""
    breaker, held = staged("rs7-snap", retry_budget_ratio=0.5)
    refuse_each(breaker, held)
    stages = breaker.snapshot()["stages"]
    assert stages["deadline"] == 5.0
    gate = stages["retry_after_gate"]
    assert gate["scope"] == "worker" and gate["remaining"] == pytest.approx(30.0)
    assert gate["closed_until"] == pytest.approx(clock.wall() + 30.0)
    assert stages["bulkhead"] == {"scope": "worker", "limit": 2, "max_wait": 0.0, "in_flight": 1, "waiting": 0}
    budget = stages["retry_budget"]
    assert (budget["ratio"], budget["min_per_second"], budget["scope"]) == (0.5, 0.0, "worker")
    assert budget["left"] == pytest.approx(0.5) and budget["exhausted"] == 1  # 1 call: half a retry
    throttle = stages["adaptive_throttling"]
    assert (throttle["k"], throttle["window"], throttle["requests"], throttle["accepts"]) == (2.0, 60.0, 2, 0)
    assert throttle["probability"] == pytest.approx(2 / 3)
    assert stages["refused"] == {"bulkhead_full": 1, "throttled": 1, "deadline": 1, "retry_after": 1}


def test_rs7_snapshot_of_stages_not_built_yet_shows_their_configuration():
    """RS-7: before any call built the stages, the knobs show with empty figures."""
    breaker = registry.get("rs7-unbuilt", {"max_concurrent_calls": 4, "retry_budget_ratio": 0.1})
    stages = breaker.snapshot()["stages"]
    assert stages["bulkhead"]["in_flight"] == 0 and stages["bulkhead"]["limit"] == 4
    assert stages["retry_budget"]["left"] is None
    assert stages["retry_after_gate"] is None and stages["adaptive_throttling"] is None


def test_rs7_a_breaker_without_stages_has_no_stages_key():
    """RS-7: no stage, no deadline refusal: the snapshot is unchanged (no ``stages``)."""
    breaker = registry.get("rs7-none")
    breaker.record_success(breaker.acquire())
    assert "stages" not in breaker.snapshot()
    assert stage_section(breaker) is None and stage_counts(breaker) is NO_COUNTS

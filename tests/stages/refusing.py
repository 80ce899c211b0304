"""Breakers whose outbound stages refused calls, for the visibility tests (RS-7).

The stages are built as the calls build them (``service_stages``) and then driven through
their own methods, so the figures read back are the ones a real call would leave.
"""

from __future__ import annotations

from typing import Any

from baldur_django.core.breaker import CircuitBreaker, core_of
from baldur_django.core.errors import BulkheadFullError, RateLimitCooldownError
from baldur_django.core.registry import registry
from baldur_django.core.stages.refusals import count_deadline
from baldur_django.core.stages.service import ServiceStages, service_stages
from baldur_django.core.stages.throttle import AdaptiveThrottle

#: every stage on: a bulkhead of 2 (no wait), a budget with no retry to spare, a gate, and
#: throttling that refuses as soon as its formula allows (the random draw is always 0)
ALL_STAGES: dict[str, Any] = {
    "max_concurrent_calls": 2,
    "max_wait": 0.0,
    "retry_budget_ratio": 0.0,
    "retry_budget_min_per_second": 0.0,
    "honor_retry_after": True,
    "adaptive_throttling_k": 2.0,
    "adaptive_throttling_window": 60,
    "deadline": 5.0,
}


def staged(service: str, **overrides: Any) -> tuple[CircuitBreaker, ServiceStages]:
    """A breaker with every stage on (*overrides* on top of :data:`ALL_STAGES`) and its
    stages, built; the throttle's random draw is 0 (it refuses whenever it may)."""
    breaker = registry.get(service, {**ALL_STAGES, **overrides})
    held = service_stages(core_of(breaker))
    assert held is not None
    if held.throttle is not None:
        held.throttle = AdaptiveThrottle(service, held.throttle.k, held.throttle.window, held.clock, rand=lambda: 0.0)
    return breaker, held


def refuse_each(breaker: CircuitBreaker, held: ServiceStages) -> object:
    """One refusal of each reason, one retry the budget refuses, and one bulkhead slot
    left taken. Returns that slot's ticket."""
    assert held.bulkhead is not None and held.gate is not None
    assert held.throttle is not None and held.budget is not None
    ticket = held.bulkhead.enter()
    other = held.bulkhead.enter()
    try:
        held.bulkhead.enter()
    except BulkheadFullError:
        pass
    else:  # pragma: no cover - the bulkhead is full
        raise AssertionError("a third slot was given")
    held.bulkhead.leave(other)
    held.gate.close_for(30.0)
    try:
        held.gate.check()
    except RateLimitCooldownError:
        pass
    else:  # pragma: no cover
        raise AssertionError("the gate let a call through")
    assert held.throttle.admit()  # nothing counted yet: admitted
    assert not held.throttle.admit()  # 1 request, 0 accepts: p = 1/2, the draw 0 refuses
    held.budget.note_call()
    assert not held.budget.try_retry()
    count_deadline(core_of(breaker))
    return ticket

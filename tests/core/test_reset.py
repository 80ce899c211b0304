"""CB-13, CB-14, CB-20: ``breaker.reset()`` is announced like every other change of state.

The first test is pybreaker's and aiobreaker's ``test_transition_events``, ported: a
listener sees the breaker opened, half-opened and closed by explicit calls (here: an
operator's force open, a release, a reset), each as one event with its two states. It
was the one ported peer test that failed: the reset published nothing.
"""

from __future__ import annotations

import logging

import pytest

import baldur_django as baldur
from baldur_django import CircuitState
from baldur_django.core.events import Reset, bus
from baldur_django.core.stores.memory import MemoryStore


class Listener:
    """pybreaker's ``CircuitBreakerListener.state_change`` collector, on the event bus."""

    def __init__(self, service):
        self.service = service
        self.out = []

    def __call__(self, event):
        if event.service == self.service and getattr(event, "from_state", None) is not None:
            self.out.append((event.from_state, event.to_state))


@pytest.mark.parametrize("storage", ["memory", "shared"])
def test_cb14_ported_peer_transition_events(fresh_registry, clock, storage):
    """CB-14 (pybreaker/aiobreaker ``test_transition_events``): open, half-open and close by
    explicit calls are each announced once, with their states, locally and with a shared
    store alike."""
    if storage == "shared":
        fresh_registry.set_store(MemoryStore(now=clock.wall))
    listener = bus.subscribe(Listener("peer-events"))
    breaker = baldur.get_breaker("peer-events")
    assert breaker.state is CircuitState.CLOSED
    breaker.force_open(ttl_minutes=5)
    assert breaker.state is CircuitState.OPEN
    breaker.release()
    assert breaker.state is CircuitState.HALF_OPEN
    breaker.reset()
    assert breaker.state is CircuitState.CLOSED
    assert listener.out == [("closed", "open"), ("open", "half_open"), ("half_open", "closed")]


def test_cb14_reset_event_names_the_force_it_removed(clock, events):
    """CB-14: the Reset event carries the states and the force it cleared; a reset of a
    fresh breaker is announced too (CLOSED to CLOSED)."""
    breaker = baldur.get_breaker("reset-force")
    breaker.force_open(ttl_minutes=5, reason="outage")
    breaker.reset()
    breaker.reset()
    resets = [e for e in events.events if isinstance(e, Reset)]
    assert [(e.from_state, e.to_state, e.forced) for e in resets] == [
        ("open", "closed", "open"),
        ("closed", "closed", ""),
    ]
    assert breaker.snapshot()["forced"] is None
    assert breaker.metrics()["transitions"].get(("open", "closed", "reset")) == 1


def test_cb13_reset_is_logged(clock, caplog):
    """CB-13: a reset is logged on baldur.circuit_breaker as circuit_breaker.reset, with its
    states and trigger as record attributes."""
    with pytest.raises(OSError):
        baldur.protect("reset-log", _fail, failure_threshold=1)
    breaker = baldur.get_breaker("reset-log")
    with caplog.at_level(logging.INFO, logger="baldur.circuit_breaker"):
        breaker.reset()
    lines = [r for r in caplog.records if r.getMessage().startswith("circuit_breaker.reset")]
    assert len(lines) == 1
    assert (lines[0].service, lines[0].from_state, lines[0].to_state, lines[0].trigger) == (
        "reset-log",
        "open",
        "closed",
        "reset",
    )


def _fail():
    raise OSError("down")

"""CB-20: one legal-transition table; every transition carries a named trigger.

The breaker's single state-entry method checks each edge against
``baldur_django.core.states.TRANSITIONS``; an edge outside it is a programming error
(``IllegalTransition``, an ``AssertionError``), so any path that would take one fails the
suite wherever it runs. The scenarios below drive every kind of transition and look at
the triggers in events, logs and metrics.
"""

from __future__ import annotations

import logging
import pathlib

import pytest

import baldur_django as baldur
from baldur_django.core.breaker import CircuitBreaker, core_of
from baldur_django.core.config import SettingsSource, build_config
from baldur_django.core.events import EventBus
from baldur_django.core.log import LoggingListener
from baldur_django.core.states import (
    ANY_STATE,
    TRANSITIONS,
    CircuitState,
    IllegalTransition,
    Trigger,
    check_transition,
)
from baldur_django.core.testing import FakeClock, RecordingListener

C, OP, H = CircuitState.CLOSED, CircuitState.OPEN, CircuitState.HALF_OPEN
NAMED = {v for k, v in vars(Trigger).items() if k.isupper()}


def test_cb20_the_table_holds_exactly_the_four_automatic_edges():
    """CB-20: CLOSED->OPEN, OPEN->HALF_OPEN, HALF_OPEN->CLOSED, HALF_OPEN->OPEN, nothing else;
    forces, resets and adoption are the any-state triggers."""
    assert set(TRANSITIONS) == {(C, OP), (OP, H), (H, C), (H, OP)}
    assert TRANSITIONS[(C, OP)] == {"consecutive_failures", "failure_rate", "slow_call_rate", "rate_limit_cascade"}
    assert TRANSITIONS[(H, OP)] == {"half_open_failure", "slow_call_rate"}
    assert TRANSITIONS[(H, C)] == {"half_open_success"}
    assert TRANSITIONS[(OP, H)] == {"recovery_timeout", "released", "force_lapsed"}
    assert {"forced", "reset", "propagated", "adopted"} == ANY_STATE


@pytest.mark.parametrize(
    ("before", "after", "trigger"),
    [
        (C, H, "recovery_timeout"),  # CLOSED never goes straight to HALF_OPEN
        (OP, C, "half_open_success"),  # OPEN never closes without a trial round
        (C, OP, "half_open_failure"),  # a trial trigger on a CLOSED breaker
        (H, C, "consecutive_failures"),
        (C, OP, None),
        (OP, H, "unknown"),
    ],
)
def test_cb20_an_illegal_edge_is_caught(before, after, trigger):
    """CB-20: an edge outside the table, or one without a named trigger, is refused."""
    with pytest.raises(IllegalTransition):
        check_transition(before, after, trigger)
    assert issubclass(IllegalTransition, AssertionError)


def test_cb20_the_breaker_state_entry_refuses_an_illegal_edge(monkeypatch):
    """CB-20: the breaker applies a step's transition only after checking its edge: a step
    function that took an illegal edge (CLOSED -> HALF_OPEN) raises, and the breaker takes no
    new generation, counts no transition and announces nothing."""
    from baldur_django.core import steps

    def broken(record, event, now, timing=steps.NO_TIMING, frozen=False):
        before = record.state
        record.state, record.trigger, record.version = "half_open", Trigger.RECOVERY_TIMEOUT, record.version + 1
        return steps.Outcome(before)

    bus = EventBus()
    seen = RecordingListener(bus)
    breaker = CircuitBreaker("edge", build_config("edge", {}, SettingsSource(environ={})), clock=FakeClock(), bus=bus)
    core = core_of(breaker)
    monkeypatch.setattr(steps, "step", broken)
    with pytest.raises(IllegalTransition), core.lock:
        core.apply_step(steps.Trip("consecutive_failures"), core.mono(), [])
    assert core.generation == 0 and core.closed_permit is not None and core.closed_permit.generation == 0
    assert breaker.metrics()["transitions"] == {}
    assert seen.events == []


def test_cb20_every_transition_is_named_in_events_logs_and_metrics(caplog):
    """CB-20: trip, recovery, failed trial, successful round, force, release, lapse, peer
    adoption and reset: every event, log line and metric names its trigger."""
    clock = FakeClock()
    bus = EventBus()
    events = RecordingListener(bus)
    bus.subscribe(LoggingListener(lambda: "DEBUG"))
    opts = {"failure_threshold": 1, "recovery_timeout": 5, "half_open_max_calls": 1}
    breaker = CircuitBreaker("named", build_config("named", opts, SettingsSource(environ={})), clock=clock, bus=bus)
    with caplog.at_level(logging.DEBUG, logger="baldur.circuit_breaker"):
        breaker.record_failure(breaker.acquire())  # closed -> open
        clock.advance(5)
        breaker.record_failure(breaker.acquire())  # open -> half_open -> open
        clock.advance(5)
        breaker.record_success(breaker.acquire())  # -> half_open -> closed
        breaker.force_open(ttl_minutes=1)
        breaker.release()  # open -> half_open
        breaker.force_close(ttl_minutes=1)
        clock.advance(61)
        assert breaker.state is C  # the forced closed lapsed
        breaker.apply_peer("open")
        breaker.apply_peer("closed")
        breaker.reset()
    for event in events.events:
        trigger = getattr(event, "trigger", "n/a")
        assert trigger and trigger != "unknown", event
    assert all(t[2] in NAMED for t in events.transitions()), events.transitions()
    metrics = breaker.metrics()["transitions"]
    assert metrics and all(trigger in NAMED for (_f, _t, trigger) in metrics), metrics
    assert ("open", "half_open", "released") in metrics and ("half_open", "closed", "half_open_success") in metrics
    assert all("unknown" not in r.getMessage() for r in caplog.records)


def test_cb20_no_path_in_the_package_produces_an_unknown_trigger():
    """CB-20: no code in the core writes ``"unknown"`` as a trigger (the metrics once did)."""
    core = pathlib.Path(baldur.__file__).parent / "core"
    offenders = [
        f"{path.name}:{n}"
        for path in core.rglob("*.py")
        if path.name != "states.py"  # the table's check, which refuses the name
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if "unknown" in line and "trigger" in line
    ]
    assert offenders == []

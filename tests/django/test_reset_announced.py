"""CB-14, OP-8, EM-6: a reset reaches the listeners that announce changes of state.

The Django signal ``circuit_reset`` carries it (not the state signals, as for forces and
releases); Slack posts a reset that closed a breaker that was not CLOSED; cluster
propagation sends it on as a close.
"""

from __future__ import annotations

import pytest

import baldur_django as baldur
from baldur_django import signals
from baldur_django.contrib import propagation
from baldur_django.contrib.slack import SlackNotifier
from baldur_django.core.events import Reset


@pytest.fixture
def received():
    calls = []

    def receiver(sender, **kwargs):
        calls.append(kwargs)

    for signal in (signals.circuit_reset, signals.circuit_closed, signals.circuit_released):
        signal.connect(receiver, weak=False)
    yield calls
    for signal in (signals.circuit_reset, signals.circuit_closed, signals.circuit_released):
        signal.disconnect(receiver)


def test_cb14_reset_sends_circuit_reset_only(received):
    """CB-14: breaker.reset() sends circuit_reset once, with the states, the trigger and the
    force it removed, and no state signal."""
    breaker = baldur.get_breaker("signal-reset")
    breaker.force_open(ttl_minutes=5, reason="outage")
    breaker.reset()
    assert len(received) == 1
    kwargs = received[0]
    assert isinstance(kwargs["event"], Reset)
    assert {k: kwargs[k] for k in ("service", "from_state", "to_state", "trigger", "forced")} == {
        "service": "signal-reset",
        "from_state": "open",
        "to_state": "closed",
        "trigger": "reset",
        "forced": "open",
    }
    assert "circuit_reset" in signals.__all__


def test_op8_slack_posts_a_reset_that_closed_the_breaker():
    """OP-8: a reset out of OPEN is a close (trigger reset); a reset of a CLOSED breaker posts nothing."""
    text = SlackNotifier.message_for(Reset("pay", 1740837600.0, from_state="open", to_state="closed"))
    assert text is not None and "*pay* closed (trigger: reset)" in text
    assert SlackNotifier.message_for(Reset("pay", 0.0, from_state="closed", to_state="closed")) is None


def test_em6_a_reset_out_of_open_is_propagated_as_a_close():
    """EM-6: a reset that moved the breaker is this process's decision to close it."""
    assert propagation.decision_of(Reset("s", 1.0, from_state="open", to_state="closed")) == "closed"
    assert propagation.decision_of(Reset("s", 1.0, from_state="half_open", to_state="closed")) == "closed"
    assert propagation.decision_of(Reset("s", 1.0, from_state="closed", to_state="closed")) is None

"""Django signals for breaker events, bridged from the core's event bus (CB-14).

Receivers get keyword arguments ``service``, ``from_state``, ``to_state``, ``trigger``
and ``reason`` (those that apply), plus the core ``event`` object. The sender is the
:class:`~baldur_django.core.breaker.CircuitBreaker` class. A receiver that raises is
logged and never reaches the protected call (``send_robust``).
"""

from __future__ import annotations

import logging

from django.core.signals import setting_changed
from django.dispatch import Signal, receiver

from .core.breaker import CircuitBreaker
from .core.events import CallRejected, Event, ForceLapsed, Forced, Released, StateChanged

__all__ = [
    "circuit_opened",
    "circuit_half_opened",
    "circuit_closed",
    "circuit_forced",
    "circuit_released",
    "call_rejected",
    "bridge",
]

_log = logging.getLogger("baldur.signals")

circuit_opened = Signal()
circuit_half_opened = Signal()
circuit_closed = Signal()
circuit_forced = Signal()
circuit_released = Signal()
call_rejected = Signal()

_BY_STATE = {"open": circuit_opened, "half_open": circuit_half_opened, "closed": circuit_closed}


def _send(signal: Signal, event: Event, **kwargs) -> None:
    for handler, result in signal.send_robust(sender=CircuitBreaker, service=event.service, event=event, **kwargs):
        if isinstance(result, Exception):
            _log.error(
                "baldur signal receiver %r raised for %r", handler, event.service, exc_info=(type(result), result, result.__traceback__)
            )


def bridge(event: Event) -> None:
    """Event-bus listener that re-publishes core events as Django signals."""
    if isinstance(event, StateChanged):
        _send(_BY_STATE[event.to_state], event, from_state=event.from_state, to_state=event.to_state, trigger=event.trigger)
    elif isinstance(event, Forced):
        _send(circuit_forced, event, from_state=event.from_state, to_state=event.to_state, trigger="forced", reason=event.reason)
    elif isinstance(event, (Released, ForceLapsed)):
        trigger = "released" if isinstance(event, Released) else "force_lapsed"
        _send(circuit_released, event, from_state=event.from_state, to_state=event.to_state, trigger=trigger, reason=getattr(event, "reason", ""))
    elif isinstance(event, CallRejected):
        _send(call_rejected, event, reason=event.reason, from_state=event.state, to_state=event.state)


@receiver(setting_changed)
def _on_setting_changed(setting: str, **kwargs) -> None:
    from . import conf

    conf.reload(setting)

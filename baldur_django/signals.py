"""Django signals for breaker events, bridged from the core's event bus.

=======================  ===================================================================
signal                   sent when
=======================  ===================================================================
``circuit_opened``       a breaker went to OPEN on its own (a trigger or a failed probe)
``circuit_half_opened``  an OPEN breaker's recovery timeout ran out (probing starts)
``circuit_closed``       enough probes succeeded and the breaker closed
``circuit_forced``       an operator forced a breaker open or closed
``circuit_released``     a force was released by an operator or lapsed at the end of its TTL
``circuit_reset``        ``breaker.reset()`` put a breaker back to a fresh CLOSED one
``call_rejected``        a call was refused (or, under dry-run, would have been)
``emergency_level_...``  ``emergency_level_changed``: the Emergency Mode level changed
=======================  ===================================================================

Every receiver gets ``sender`` (the :class:`~baldur_django.core.breaker.CircuitBreaker`
class), ``service`` (the breaker's name) and ``event`` (the core event object), plus:

* transitions: ``from_state``, ``to_state`` (``"closed"``, ``"open"``, ``"half_open"``),
  ``trigger`` (``"consecutive_failures"``, ``"failure_rate"``, ``"rate_limit_cascade"``,
  ``"half_open_failure"``, ``"recovery_timeout"``, ``"half_open_success"`` ...) and ``dry_run``;
* ``circuit_forced``: ``from_state``, ``to_state``, ``trigger="forced"``, ``reason`` (the
  operator's text), ``mode`` (``"open"``/``"closed"``), ``ttl_minutes``, ``expires_at``
  (Unix seconds), ``actor``, ``dry_run``;
* ``circuit_released``: ``from_state``, ``to_state``, ``trigger`` (``"released"`` or
  ``"force_lapsed"``), ``reason``, ``previous`` (the force that ended), ``actor``;
* ``circuit_reset``: ``from_state``, ``to_state`` (``"closed"``), ``trigger="reset"``,
  ``forced`` (the force it removed, ``"open"``/``"closed"``, or None);
* ``call_rejected``: ``reason`` (``"open"``, ``"half_open_full"``, ``"frozen"`` or ``"cooldown"``),
  ``state`` (the breaker's state) and ``dry_run``.

``emergency_level_changed`` is about every breaker at once: its ``sender`` is the
:class:`~baldur_django.core.events.EmergencyLevelChanged` class and it carries ``level``,
``previous`` (the level in force before), ``source`` (``"manual"`` or ``"auto"``),
``actor``, plus ``reason``, ``expires_at`` (Unix seconds or None), ``action`` (``"set"``,
``"step_down"`` or ``"auto"``) and ``event``.

A force, a release and a reset are announced on ``circuit_forced`` / ``circuit_released`` /
``circuit_reset`` only (with their ``from_state`` and ``to_state``), not again on the state
signals.

Signals are sent synchronously in the thread (or task) that made the decision, after
the breaker's lock is released. A receiver that raises is logged on logger
``baldur.signals`` with its traceback; the other receivers still run and the protected
call returns or raises exactly what it would have without it.

This module also holds the ``setting_changed`` receiver that reloads ``BALDUR_*``
settings.
"""

from __future__ import annotations

import logging
from typing import Any

from django.core.signals import setting_changed
from django.dispatch import Signal, receiver

from .core.breaker import CircuitBreaker
from .core.events import (
    CallRejected,
    EmergencyLevelChanged,
    Event,
    Forced,
    ForceLapsed,
    Released,
    Reset,
    StateChanged,
)

__all__ = [
    "circuit_opened",
    "circuit_half_opened",
    "circuit_closed",
    "circuit_forced",
    "circuit_released",
    "circuit_reset",
    "call_rejected",
    "emergency_level_changed",
    "bridge",
]

_log = logging.getLogger("baldur.signals")

#: A breaker went OPEN on its own.
circuit_opened = Signal()
#: A breaker's recovery timeout elapsed: it now admits trial calls.
circuit_half_opened = Signal()
#: A breaker closed after successful trials.
circuit_closed = Signal()
#: An operator forced a breaker open or closed.
circuit_forced = Signal()
#: A force was released or lapsed.
circuit_released = Signal()
#: ``breaker.reset()`` put a breaker back to a fresh CLOSED one.
circuit_reset = Signal()
#: A call was rejected, or would have been under dry-run.
call_rejected = Signal()
#: The Emergency Mode level changed: kwargs ``level``, ``previous``, ``source``, ``actor``.
emergency_level_changed = Signal()

_BY_STATE = {"open": circuit_opened, "half_open": circuit_half_opened, "closed": circuit_closed}


def _send(signal: Signal, event: Event, **kwargs: Any) -> None:
    responses = signal.send_robust(sender=CircuitBreaker, service=event.service, event=event, **kwargs)
    for handler, result in responses:
        if isinstance(result, Exception):
            _log.error(
                "baldur_django signal receiver %s raised %s for service %r; the other receivers "
                "ran and the protected call is unaffected",
                getattr(handler, "__qualname__", repr(handler)),
                type(result).__name__,
                event.service,
                exc_info=(type(result), result, result.__traceback__),
                extra={"service": event.service, "receiver": repr(handler)},
            )


def bridge(event: Event) -> None:
    """Event-bus listener that re-publishes core events as Django signals.

    Subscribed once by ``BaldurDjangoConfig.ready()``. Events with no signal (a blocked
    trip, a store problem, a 429 storm) are ignored here; they are logged by the core.

    Args:
        event: a :class:`baldur_django.core.events.Event`.

    Never raises for a failing receiver (see :func:`_send`).
    """
    if isinstance(event, StateChanged):
        signal = _BY_STATE.get(event.to_state)
        if signal is not None:
            _send(
                signal,
                event,
                from_state=event.from_state,
                to_state=event.to_state,
                trigger=event.trigger,
                dry_run=event.dry_run,
            )
    elif isinstance(event, (Forced, Released, ForceLapsed)):
        _send_force_change(event)
    elif isinstance(event, Reset):
        _send(
            circuit_reset,
            event,
            from_state=event.from_state,
            to_state=event.to_state,
            trigger="reset",
            forced=event.forced or None,
        )
    elif isinstance(event, CallRejected):
        _send(call_rejected, event, reason=event.reason, state=event.state, dry_run=event.dry_run)
    elif isinstance(event, EmergencyLevelChanged):
        _send_emergency(event)


def _send_force_change(event: Forced | Released | ForceLapsed) -> None:
    """``circuit_forced`` for a force; ``circuit_released`` for a release or a lapse."""
    if isinstance(event, Forced):
        _send(
            circuit_forced,
            event,
            from_state=event.from_state,
            to_state=event.to_state,
            trigger="forced",
            reason=event.reason,
            mode=event.mode,
            ttl_minutes=event.ttl_minutes,
            expires_at=event.expires_at,
            actor=event.actor,
            dry_run=event.dry_run,
        )
    elif isinstance(event, Released):
        _send(
            circuit_released,
            event,
            from_state=event.from_state,
            to_state=event.to_state,
            trigger="released",
            reason=event.reason,
            previous=event.previous,
            actor=event.actor,
        )
    else:
        _send(
            circuit_released,
            event,
            from_state=event.from_state,
            to_state=event.to_state,
            trigger="force_lapsed",
            reason="",
            previous=event.previous,
            actor=None,
        )


def _send_emergency(event: EmergencyLevelChanged) -> None:
    responses = emergency_level_changed.send_robust(
        sender=EmergencyLevelChanged,
        event=event,
        level=event.level,
        previous=event.previous,
        source=event.source,
        actor=event.actor,
        reason=event.reason,
        expires_at=event.expires_at,
        action=event.action,
    )
    for handler, result in responses:
        if isinstance(result, Exception):
            _log.error(
                "baldur_django signal receiver %s raised %s for emergency level %d; the other receivers ran",
                getattr(handler, "__qualname__", repr(handler)),
                type(result).__name__,
                event.level,
                exc_info=(type(result), result, result.__traceback__),
                extra={"receiver": repr(handler)},
            )


# The OPEN hot path builds a rejection event only while someone listens for it.
bridge.wants_rejections = lambda: bool(call_rejected.receivers)  # type: ignore[attr-defined]


@receiver(setting_changed, dispatch_uid="baldur_django.signals.setting_changed")
def _on_setting_changed(setting: str, **kwargs: Any) -> None:
    """Apply a changed ``BALDUR_*`` setting at once, existing breakers included.

    Never raises: a bad value is logged (ERROR, logger ``baldur.config``) and every
    breaker keeps its previous configuration; the system checks explain the value.
    """
    if not setting.startswith("BALDUR_"):
        return
    from . import conf

    conf.reload_or_log(setting)

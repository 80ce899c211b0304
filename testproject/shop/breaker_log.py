"""An in-memory log of breaker transitions and rejections, fed by baldur's Django signals.

``GET /breakers/`` serves it, so a client (the demo) sees every transition in order,
including the short-lived HALF_OPEN step that polling the state could miss. The log is
per process and bounded (the last 500 transitions).
"""

from __future__ import annotations

import itertools
import threading
from collections import deque
from typing import Any

from baldur_django import signals

_lock = threading.Lock()
_seq = itertools.count(1)
_transitions: deque[dict[str, Any]] = deque(maxlen=500)
_rejections: dict[str, dict[str, int]] = {}


def _on_transition(
    sender: Any, service: str, from_state: str = "", to_state: str = "", trigger: str = "", **kwargs: Any
) -> None:
    event = kwargs.get("event")
    with _lock:
        _transitions.append(
            {
                "seq": next(_seq),
                "service": service,
                "from": from_state,
                "to": to_state,
                "trigger": trigger,
                "at": getattr(event, "at", None),
            }
        )


def _on_rejected(sender: Any, service: str, reason: str = "", **kwargs: Any) -> None:
    event = kwargs.get("event")
    if getattr(event, "dry_run", False):
        return
    with _lock:
        per_reason = _rejections.setdefault(service, {})
        per_reason[reason] = per_reason.get(reason, 0) + 1


_TRANSITION_SIGNALS = (
    signals.circuit_opened,
    signals.circuit_half_opened,
    signals.circuit_closed,
    signals.circuit_forced,
    signals.circuit_released,
)


def connect() -> None:
    """Connect the receivers (safe to call more than once)."""
    for signal in _TRANSITION_SIGNALS:
        signal.connect(_on_transition, dispatch_uid="shop-breaker-log")
    signals.call_rejected.connect(_on_rejected, dispatch_uid="shop-breaker-log")


def disconnect() -> None:
    """Disconnect the receivers (tests that install the shop app only for a while)."""
    for signal in _TRANSITION_SIGNALS:
        signal.disconnect(dispatch_uid="shop-breaker-log")
    signals.call_rejected.disconnect(dispatch_uid="shop-breaker-log")


def transitions(since: int = 0) -> list[dict[str, Any]]:
    """Transitions with ``seq`` greater than *since*, oldest first.

    Each entry: ``seq`` (int), ``service``, ``from``, ``to``, ``trigger`` (str) and ``at``
    (Unix seconds, float, or None).
    """
    with _lock:
        return [dict(entry) for entry in _transitions if entry["seq"] > since]


def rejections() -> dict[str, dict[str, int]]:
    """Calls the breakers rejected, per service and reason (``open``, ``half_open_full``...)."""
    with _lock:
        return {service: dict(reasons) for service, reasons in _rejections.items()}


def reset() -> None:
    """Forget everything logged so far (tests)."""
    with _lock:
        _transitions.clear()
        _rejections.clear()

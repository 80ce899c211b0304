"""Typed events and the in-process event bus.

The breaker publishes one event per transition, force, release, lapse, reset and rejection.
Logging, Django signals, Slack and metrics are listeners; a listener that raises is
logged and skipped, and never changes what a protected call returns or raises.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "Event",
    "StateChanged",
    "Forced",
    "Released",
    "ForceLapsed",
    "Reset",
    "CallRejected",
    "Retrying",
    "TripBlocked",
    "RateLimitStorm",
    "StoreProblem",
    "RecordAdopted",
    "EmergencyLevelChanged",
    "EventBus",
    "bus",
]

_log = logging.getLogger("baldur.events")


@dataclass(frozen=True)
class Event:
    """Base of every event. ``kind`` names it; ``at`` is Unix wall-clock seconds."""

    service: str
    at: float
    kind: str = field(init=False, default="event")


@dataclass(frozen=True)
class StateChanged(Event):
    """A transition decided by this process. ``trigger`` names its cause."""

    from_state: str = ""
    to_state: str = ""
    trigger: str = ""
    dry_run: bool = False
    kind: str = field(init=False, default="state_changed")


@dataclass(frozen=True)
class Forced(Event):
    """An operator force. ``mode`` is ``"open"`` or ``"closed"``; ``ttl_minutes`` its lifetime."""

    mode: str = ""
    from_state: str = ""
    to_state: str = ""
    ttl_minutes: float = 0.0
    expires_at: float = 0.0
    reason: str = ""
    actor: str | None = None
    dry_run: bool = False
    kind: str = field(init=False, default="forced")


@dataclass(frozen=True)
class Released(Event):
    """An operator release of a force (``previous`` was ``"open"`` or ``"closed"``)."""

    previous: str = ""
    from_state: str = ""
    to_state: str = ""
    actor: str | None = None
    reason: str = ""
    kind: str = field(init=False, default="released")


@dataclass(frozen=True)
class ForceLapsed(Event):
    """A force reached the end of its lifetime."""

    previous: str = ""
    from_state: str = ""
    to_state: str = ""
    kind: str = field(init=False, default="force_lapsed")


@dataclass(frozen=True)
class Reset(Event):
    """``CircuitBreaker.reset()`` put the breaker back to a fresh CLOSED one (trigger
    ``reset``). ``forced`` is the force it removed (``"open"``, ``"closed"``) or ``""``."""

    from_state: str = ""
    to_state: str = ""
    forced: str = ""
    kind: str = field(init=False, default="reset")


@dataclass(frozen=True)
class CallRejected(Event):
    """A call was rejected (or, in dry-run, would have been). ``retry_after``: seconds after
    which a call may be admitted again, or None when unknown."""

    reason: str = ""
    state: str = ""
    dry_run: bool = False
    retry_after: float | None = None
    kind: str = field(init=False, default="call_rejected")


@dataclass(frozen=True)
class Retrying(Event):
    """A protected call failed and will be tried again: ``attempt`` is the number of the
    attempt about to be made (2 for the first retry), after ``delay`` seconds of backoff."""

    attempt: int = 0
    delay: float = 0.0
    kind: str = field(init=False, default="retrying")


@dataclass(frozen=True)
class TripBlocked(Event):
    """A trip met a force in the shared store and was refused."""

    forced: str = ""
    trigger: str = ""
    kind: str = field(init=False, default="trip_blocked")


@dataclass(frozen=True)
class RateLimitStorm(Event):
    """The 429 cascade fired: ``count`` sightings among ``calls`` calls."""

    count: int = 0
    calls: int = 0
    rate: float = 0.0
    kind: str = field(init=False, default="rate_limit_storm")


@dataclass(frozen=True)
class StoreProblem(Event):
    """The shared store became unavailable (``recovered`` False) or answered again."""

    recovered: bool = False
    error: str = ""
    kind: str = field(init=False, default="store_problem")


@dataclass(frozen=True)
class RecordAdopted(Event):
    """This worker took the shared record again after the store had not answered it:
    what it adopted. ``state`` is the record's state; ``forced`` ``"open"``, ``"closed"`` or
    ``""``; ``version`` the record's version; ``local_state`` the worker's state before."""

    state: str = ""
    forced: str = ""
    version: int = 0
    local_state: str = ""
    kind: str = field(init=False, default="record_adopted")


@dataclass(frozen=True)
class EmergencyLevelChanged(Event):
    """The Emergency Mode level changed. ``service`` is ``""``: it concerns every breaker.

    ``action`` is ``"set"`` (an operator set it), ``"step_down"`` (one level lower) or
    ``"auto"`` (auto-activation); ``source`` is ``"manual"`` or ``"auto"``;
    ``expires_at`` is Unix seconds (None for level 0); ``minutes`` the lifetime given.
    """

    level: int = 0
    previous: int = 0
    source: str = "manual"
    actor: str | None = None
    reason: str = ""
    expires_at: float | None = None
    minutes: float | None = None
    action: str = "set"
    kind: str = field(init=False, default="emergency_level_changed")


Listener = Callable[[Event], Any]


class EventBus:
    """Synchronous publish/subscribe with contained listener errors.

    ``publish`` calls every listener in subscription order; an exception from one is
    logged on logger ``baldur.events`` and the next listener still runs.
    """

    def __init__(self) -> None:
        self._listeners: tuple[Listener, ...] = ()
        self._lock = threading.Lock()
        self._all_rejections = False
        self._rejection_probes: tuple[Callable[[], bool], ...] = ()

    def subscribe(self, listener: Listener) -> Listener:
        """Add *listener* (idempotent) and return it, so it can serve as a decorator.

        A listener may carry ``wants_rejections``: False (it ignores plain call rejections),
        or a callable answering whether it wants them right now. Without it, it gets them.
        """
        with self._lock:
            if listener not in self._listeners:
                self._listeners = (*self._listeners, listener)
            self._refresh()
        return listener

    def unsubscribe(self, listener: Listener) -> None:
        """Remove *listener* if present."""
        with self._lock:
            self._listeners = tuple(x for x in self._listeners if x != listener)
            self._refresh()

    def _refresh(self) -> None:
        wants = [getattr(x, "wants_rejections", True) for x in self._listeners]
        self._all_rejections = any(w is True for w in wants)
        self._rejection_probes = tuple(w for w in wants if callable(w))

    def wants_rejections(self) -> bool:
        """Whether any listener wants plain (non-dry-run) ``CallRejected`` events now.

        The OPEN hot path asks this before building an event nobody would read.
        """
        if self._all_rejections:
            return True
        for probe in self._rejection_probes:  # noqa: SIM110 - no generator on the OPEN hot path
            if probe():
                return True
        return False

    @property
    def listeners(self) -> tuple[Listener, ...]:
        return self._listeners

    def publish(self, event: Event) -> None:
        """Deliver *event* to every listener; never raises (except BaseExceptions)."""
        for listener in self._listeners:
            try:
                listener(event)
            except Exception:
                _log.exception("baldur event listener %r failed on %s for %r", listener, event.kind, event.service)


#: The process-wide bus the registry's breakers publish on.
bus = EventBus()

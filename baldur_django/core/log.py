"""The logging listener: events -> lines on logger ``baldur.circuit_breaker``.

Every message starts with the event name (``circuit_breaker.opened`` ...) and the record
carries ``event``, ``service``, ``from_state``, ``to_state`` and ``trigger`` as attributes,
so structured handlers can read them without parsing text.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from .events import (
    CallRejected,
    Event,
    Forced,
    ForceLapsed,
    RateLimitStorm,
    RecordAdopted,
    Released,
    StateChanged,
    StoreProblem,
    TripBlocked,
)

__all__ = ["logger", "log_event", "LoggingListener"]

logger = logging.getLogger("baldur.circuit_breaker")

_LEVELS = {
    "DEBUG": logging.DEBUG,
    "INFO": logging.INFO,
    "WARNING": logging.WARNING,
    "ERROR": logging.ERROR,
    "CRITICAL": logging.CRITICAL,
}


def log_event(level: int, event: str, service: str | None, message: str = "", *args: Any, **fields: Any) -> None:
    """Log one line whose message starts with *event*; *fields* become record attributes."""
    if not logger.isEnabledFor(level):
        return
    extra = {"event": event, "service": service, "from_state": None, "to_state": None, "trigger": None}
    extra.update(fields)
    text = f"{event} service=%s" + (f" {message}" if message else "")
    logger.log(level, text, service, *args, extra=extra)


class LoggingListener:
    """Turns bus events into log lines. ``level`` is a callable returning the level name.

    Transitions, forces, releases and lapses go out at the configured level
    (``BALDUR_EVENT_LOGGING_CB_LOG_LEVEL``); the step to HALF_OPEN is never logged;
    a 429-cascade open adds three warnings.
    """

    wants_rejections = False  # it logs dry-run rejections only, and those are always published

    def __init__(self, level: Callable[[], str]) -> None:
        self._level = level

    def __call__(self, event: Event) -> None:
        level = _LEVELS.get(self._level(), logging.WARNING)
        if isinstance(event, StateChanged):
            self._state(level, event)
        elif isinstance(event, Forced):
            log_event(
                level,
                f"circuit_breaker.forced_{event.mode}",
                event.service,
                "ttl_minutes=%s reason=%r actor=%s expires_at=%s%s",
                event.ttl_minutes,
                event.reason,
                event.actor,
                event.expires_at,
                " dry_run=true" if event.dry_run else "",
                from_state=event.from_state,
                to_state=event.to_state,
                trigger="forced",
                actor=event.actor,
                reason=event.reason,
                dry_run=event.dry_run,
            )
        elif isinstance(event, Released):
            log_event(
                level,
                "circuit_breaker.released",
                event.service,
                "previous=%s actor=%s",
                event.previous,
                event.actor,
                from_state=event.from_state,
                to_state=event.to_state,
                trigger="released",
                actor=event.actor,
            )
        elif isinstance(event, ForceLapsed):
            log_event(
                level,
                "circuit_breaker.force_lapsed",
                event.service,
                "previous=%s",
                event.previous,
                from_state=event.from_state,
                to_state=event.to_state,
                trigger="force_lapsed",
            )
        elif isinstance(event, TripBlocked):
            log_event(
                logging.WARNING,
                "circuit_breaker.trip_blocked",
                event.service,
                "forced=%s trigger=%s",
                event.forced,
                event.trigger,
                trigger=event.trigger,
            )
        elif isinstance(event, RateLimitStorm):
            log_event(
                logging.WARNING,
                "circuit_breaker.rate_limit_storm",
                event.service,
                "count=%d calls=%d rate=%.1f%%",
                event.count,
                event.calls,
                event.rate,
                trigger="rate_limit_cascade",
                count=event.count,
                rate=event.rate,
            )
        elif isinstance(event, CallRejected) and event.dry_run:
            log_event(
                logging.WARNING,
                "circuit_breaker.dry_run_reject",
                event.service,
                "reason=%s state=%s",
                event.reason,
                event.state,
                reason=event.reason,
            )
        elif isinstance(event, RecordAdopted):
            log_event(
                logging.INFO,
                "circuit_breaker.store_adopted",
                event.service,
                "state=%s forced=%s version=%d was=%s",
                event.state,
                event.forced or "-",
                event.version,
                event.local_state,
                to_state=event.state,
                from_state=event.local_state,
            )
        elif isinstance(event, StoreProblem):
            name = "circuit_breaker.store_recovered" if event.recovered else "circuit_breaker.store_unavailable"
            log_event(
                logging.INFO if event.recovered else logging.WARNING,
                name,
                event.service,
                "error=%s",
                event.error,
            )

    def _state(self, level: int, event: StateChanged) -> None:
        if event.to_state == "half_open":
            return  # published on the bus only
        name = "circuit_breaker.opened" if event.to_state == "open" else "circuit_breaker.closed"
        suffix = " dry_run=true" if event.dry_run else ""
        fields = dict(
            from_state=event.from_state, to_state=event.to_state, trigger=event.trigger, dry_run=event.dry_run
        )
        cascade = event.trigger == "rate_limit_cascade"
        if cascade:
            log_event(
                logging.WARNING,
                name,
                event.service,
                "from=%s trigger=%s" + suffix,
                event.from_state,
                event.trigger,
                **fields,
            )
            log_event(
                logging.WARNING,
                "circuit_breaker.auto_opened",
                event.service,
                "trigger=%s" + suffix,
                event.trigger,
                **fields,
            )
            if level == logging.WARNING:
                return  # the WARNING 'opened' line above is the state-change line too
        log_event(level, name, event.service, "from=%s trigger=%s" + suffix, event.from_state, event.trigger, **fields)

"""The logging listener: events -> lines on logger ``baldur.circuit_breaker``.

Every message starts with the event name (``circuit_breaker.opened`` ...) and the record
carries ``event``, ``service``, ``from_state``, ``to_state`` and ``trigger`` as attributes,
so structured handlers can read them without parsing text.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from .events import (
    CallRejected,
    Event,
    Forced,
    ForceLapsed,
    RateLimitStorm,
    RecordAdopted,
    Released,
    Reset,
    StateChanged,
    StoreProblem,
    TripBlocked,
)
from .names import show_name

__all__ = ["logger", "log_event", "LoggingListener"]

logger = logging.getLogger("baldur.circuit_breaker")

_LEVELS = {
    "DEBUG": logging.DEBUG,
    "INFO": logging.INFO,
    "WARNING": logging.WARNING,
    "ERROR": logging.ERROR,
    "CRITICAL": logging.CRITICAL,
}


def wall_time(seconds: float | None) -> str:
    """A wall-clock time (Unix seconds) as a log reader reads it: ISO 8601 in UTC, to the
    millisecond, for example ``2026-12-06T10:20:08.968Z``; ``-`` for None (no expiry)."""
    if seconds is None:
        return "-"
    stamp = datetime.fromtimestamp(seconds, tz=UTC)
    return stamp.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def log_event(level: int, event: str, service: str | None, message: str = "", *args: Any, **fields: Any) -> None:
    """Log one line whose message starts with *event*; *fields* become record attributes.

    The service name is shown with :func:`~baldur_django.core.names.show_name` (an odd
    name is quoted and escaped), so no name can start a line of its own; the record's
    ``service`` attribute keeps the name as it is.
    """
    if not logger.isEnabledFor(level):
        return
    extra = {"event": event, "service": service, "from_state": None, "to_state": None, "trigger": None}
    extra.update(fields)
    text = f"{event} service=%s" + (f" {message}" if message else "")
    logger.log(level, text, show_name(service), *args, extra=extra)


class LoggingListener:
    """Turns bus events into log lines. ``level`` is a callable returning the level name.

    Transitions, forces, releases, lapses and resets go out at the configured level
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
            return
        for kind, write in _WRITERS:
            if isinstance(event, kind):
                write(level, event)
                return

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


def _forced(level: int, event: Forced) -> None:
    log_event(
        level,
        f"circuit_breaker.forced_{event.mode}",
        event.service,
        "ttl_minutes=%s reason=%r actor=%s expires_at=%s%s",
        event.ttl_minutes,
        event.reason,
        show_name(event.actor),
        wall_time(event.expires_at),
        " dry_run=true" if event.dry_run else "",
        from_state=event.from_state,
        to_state=event.to_state,
        trigger="forced",
        actor=event.actor,
        expires_at=event.expires_at,
        reason=event.reason,
        dry_run=event.dry_run,
    )


def _released(level: int, event: Released) -> None:
    log_event(
        level,
        "circuit_breaker.released",
        event.service,
        "previous=%s actor=%s",
        event.previous,
        show_name(event.actor),
        from_state=event.from_state,
        to_state=event.to_state,
        trigger="released",
        actor=event.actor,
    )


def _reset(level: int, event: Reset) -> None:
    log_event(
        level,
        "circuit_breaker.reset",
        event.service,
        "from=%s forced=%s",
        event.from_state,
        event.forced or "-",
        from_state=event.from_state,
        to_state=event.to_state,
        trigger="reset",
    )


def _lapsed(level: int, event: ForceLapsed) -> None:
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


def _trip_blocked(level: int, event: TripBlocked) -> None:
    log_event(
        logging.WARNING,
        "circuit_breaker.trip_blocked",
        event.service,
        "forced=%s trigger=%s",
        event.forced,
        event.trigger,
        trigger=event.trigger,
    )


def _storm(level: int, event: RateLimitStorm) -> None:
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


def _dry_run_rejected(level: int, event: CallRejected) -> None:
    if not event.dry_run:
        return  # only the rejections dry-run let through are logged
    log_event(
        logging.WARNING,
        "circuit_breaker.dry_run_reject",
        event.service,
        "reason=%s state=%s",
        event.reason,
        event.state,
        reason=event.reason,
    )


def _adopted(level: int, event: RecordAdopted) -> None:
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


def _store_problem(level: int, event: StoreProblem) -> None:
    name = "circuit_breaker.store_recovered" if event.recovered else "circuit_breaker.store_unavailable"
    log_event(
        logging.INFO if event.recovered else logging.WARNING,
        name,
        event.service,
        "error=%s",
        event.error,
    )


#: The line writer of each other kind of event, tried in this order.
_WRITERS: tuple[tuple[type[Event], Callable[[int, Any], None]], ...] = (
    (Forced, _forced),
    (Released, _released),
    (ForceLapsed, _lapsed),
    (Reset, _reset),
    (TripBlocked, _trip_blocked),
    (RateLimitStorm, _storm),
    (CallRejected, _dry_run_rejected),
    (RecordAdopted, _adopted),
    (StoreProblem, _store_problem),
)

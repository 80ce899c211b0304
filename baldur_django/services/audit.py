"""The audit trail: one row per force, release, forget and emergency level change."""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import threading
from typing import Any

from ..core.events import EmergencyLevelChanged, Event, Forced, Released, bus
from ..core.maintenance import WATCHDOG_ACTOR
from .common import ACTOR_MAX, TASK_SOURCE, operator_context

_log = logging.getLogger("baldur.audit")


def _row_for(event: Event) -> dict[str, Any] | None:
    context = operator_context.get() or {}
    if isinstance(event, Forced):
        action = "open" if event.mode == "open" else "close"
        ttl: float | None = event.ttl_minutes
        expires = dt.datetime.fromtimestamp(event.expires_at, tz=dt.UTC) if event.expires_at else None
        reason = event.reason
    elif isinstance(event, Released):
        action, ttl, expires = "release", None, None
        reason = event.reason or context.get("reason", "")
    elif isinstance(event, EmergencyLevelChanged):
        return _emergency_row(event, context)
    else:
        return None
    return {
        "at": dt.datetime.fromtimestamp(event.at, tz=dt.UTC),
        "actor": (event.actor or "")[:ACTOR_MAX],
        "action": action,
        "service": event.service,
        "ttl_minutes": ttl,
        "expires_at": expires,
        "reason": reason or "",
        "source": context.get("source") or (TASK_SOURCE if event.actor == WATCHDOG_ACTOR else "api"),
        "from_state": event.from_state,
        "to_state": event.to_state,
        "dry_run": bool(getattr(event, "dry_run", False)),
    }


def _emergency_row(event: EmergencyLevelChanged, context: dict[str, str]) -> dict[str, Any]:
    expires = dt.datetime.fromtimestamp(event.expires_at, tz=dt.UTC) if event.expires_at else None
    source = context.get("source") or (TASK_SOURCE if event.source == "auto" else "api")
    return {
        "at": dt.datetime.fromtimestamp(event.at, tz=dt.UTC),
        "actor": (event.actor or "")[:ACTOR_MAX],
        "action": "level_step_down" if event.action == "step_down" else "level_set",
        "service": "",
        "ttl_minutes": event.minutes,
        "expires_at": expires,
        "reason": (context.get("reason", "") if event.action == "step_down" else event.reason) or "",
        "source": source,
        "from_state": f"level {event.previous}",
        "to_state": f"level {event.level}",
        "dry_run": False,
    }


def _save(row: dict[str, Any]) -> None:
    try:
        from django.db import transaction

        from ..models import BreakerAudit

        with transaction.atomic():  # a savepoint: a failure never poisons the caller's transaction
            BreakerAudit.objects.create(**row)
    except Exception:
        _log.exception(
            "baldur.audit_not_written service=%r action=%s: the action itself took effect",
            row.get("service"),
            row.get("action"),
        )


def _save_in_thread(row: dict[str, Any]) -> None:
    # The ORM refuses to run on an event loop's thread; an operator action is rare and
    # short, so a helper thread that the caller waits for is enough.
    def work() -> None:
        try:
            _save(row)
        finally:
            from django.db import connections

            connections.close_all()

    thread = threading.Thread(target=work, name="baldur-audit", daemon=True)
    thread.start()
    thread.join(10.0)


def write_audit_row(row: dict[str, Any]) -> None:
    """Write one audit row; off the event loop's thread when called from async code."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        _save(row)
    else:
        _save_in_thread(row)


def audit_listener(event: Event) -> None:
    """Bus listener: one :class:`~baldur_django.models.BreakerAudit` row per force, per
    release that changed something and per emergency level change, from any source.

    The ``source`` and a release's ``reason`` come from :func:`force`/:func:`release`;
    a call of the public API outside them is recorded as ``"api"``. Never raises: a
    database error is logged on logger ``baldur.audit`` and the force stands.
    """
    try:
        row = _row_for(event)
        if row is None:
            return
        write_audit_row(row)
    except Exception:
        _log.exception("baldur.audit_listener_failed service=%r", getattr(event, "service", None))


audit_listener.wants_rejections = False  # type: ignore[attr-defined]  # forces and releases only


def install_audit_listener() -> None:
    """Subscribe :func:`audit_listener` to the process-wide bus (idempotent). Called from
    ``BaldurDjangoConfig.ready()``."""
    bus.subscribe(audit_listener)


def uninstall_audit_listener() -> None:
    """Remove :func:`audit_listener` from the bus (tests)."""
    bus.unsubscribe(audit_listener)

"""Emergency Mode's level for the operator surfaces."""

from __future__ import annotations

import datetime as dt
from typing import Any

from .. import emergency as emergency_facade
from ..core import emergency as emergency_core
from .common import check_actor, check_reason, check_source, operator_context


def emergency_status(strict: bool = False) -> dict[str, Any]:
    """The Emergency Mode level after a fresh read.

    Args:
        strict: raise when the level cannot be read (commands) instead of returning the
            last level read with ``error`` set (pages).

    Returns:
        dict: as :func:`baldur_django.emergency.status` (``level``, ``expires_at``, ``reason``,
        ``actor``, ``source``, ``backend``, ``set_at``, ``frozen``, ``error``).

    Raises:
        BaldurError: only with *strict*, when the state could not be read.
    """
    return emergency_core.status(strict=strict)


def set_emergency_level(
    level: Any, minutes: Any = None, reason: str = "", actor: str | None = None, source: str = "api"
) -> dict[str, Any]:
    """Set the Emergency Mode level, audited with its *source*.

    Args:
        level: 0..3 (an int); 0 clears.
        minutes: lifetime in **minutes**, > 0 and <= 1440; None uses
            ``BALDUR_CB_MANUAL_OVERRIDE_TTL_MINUTES``.
        reason: free text (at most :data:`MAX_REASON_LENGTH` characters).
        actor: who asked.
        source: ``"admin"``, ``"command"`` or ``"api"``; stored in the audit row.

    Returns:
        dict: the status after the change.

    Raises:
        ConfigError: a bad argument; nothing written.
        BaldurError: the level could not be stored.
    """
    reason = check_reason(reason)
    actor = check_actor(actor)
    token = operator_context.set({"source": check_source(source), "reason": reason})
    try:
        return emergency_facade.set_level(level, minutes, reason=reason, actor=actor)
    finally:
        operator_context.reset(token)


def step_down_emergency(actor: str | None = None, source: str = "api") -> dict[str, Any]:
    """Lower the Emergency Mode level by one, audited with its *source*.

    Returns:
        dict: the status after the step, plus ``previous`` (the level before) and
        ``changed`` (False when the level was already 0: nothing written, no audit row).

    Raises:
        ConfigError: a bad actor or source.
        BaldurError: the state is unreadable or could not be stored.
    """
    actor = check_actor(actor)
    token = operator_context.set({"source": check_source(source), "reason": ""})
    try:
        previous = emergency_core.refresh()
        new = emergency_facade.step_down(actor=actor)
    finally:
        operator_context.reset(token)
    result = emergency_core.status()
    result.update(previous=previous, changed=new != previous)
    return result


#: What each emergency level means, for operator surfaces.
LEVEL_MEANINGS = {
    0: "normal operation",
    1: "recorded, no breaker behaviour changes",
    2: "recorded, no breaker behaviour changes",
    3: "freeze: no breaker trips, probes or closes on its own; forces still work",
}


def describe_emergency(status: dict[str, Any]) -> str:
    """One line for operators: ``"emergency level 3 (freeze: ...) until 2026-01-01 10:00:00 UTC,
    set by alice (manual): reason"``; ``"emergency level 0 (normal operation)"`` at 0."""
    level = int(status.get("level") or 0)
    text = f"emergency level {level} ({LEVEL_MEANINGS.get(level, '?')})"
    if level:
        expires = status.get("expires_at")
        if expires is not None:
            when = dt.datetime.fromtimestamp(expires, tz=dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
            text += f" until {when}"
        who = status.get("actor") or "?"
        text += f", set by {who} ({status.get('source', 'manual')})"
        if status.get("reason"):
            text += f": {status['reason']}"
    return text

"""Operator use cases, shared by the admin, the management commands and tasks (design habit 10).

Every operator surface is a thin shell over this module: it parses its own input, calls
one function here and formats the answer. Nothing here knows about HTTP or argparse.

* :func:`force` / :func:`release` -- force a breaker open or closed with a lifetime, or
  hand it back to automatic judgement (OP-1..OP-4), tagging the audit row with its source.
* :func:`status_rows` -- one snapshot dict per known breaker (OP-6, OP-7).
* :func:`config_report` -- every effective ``BALDUR_*`` value and where it came from (CFG-4).
* :func:`emergency_status` / :func:`set_emergency_level` / :func:`step_down_emergency` --
  Emergency Mode's level for the admin and ``baldur_emergency`` (EM-1, EM-3).
* :func:`install_audit_listener` -- the bus listener that writes :class:`BreakerAudit`
  rows for every force and release, and every emergency level change, from any source
  (OP-6, EM-1).
"""

from __future__ import annotations

import asyncio
import contextvars
import datetime as dt
import logging
import math
import threading
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from . import emergency as emergency_facade
from .core import emergency as emergency_core
from .core import registry as registry_module
from .core.breaker import validate_ttl
from .core.config import settings as settings  # re-exported: the commands read it
from .core.errors import BaldurError, ConfigError
from .core.events import EmergencyLevelChanged, Event, Forced, Released, bus
from .core.knobs import SECRETS
from .core.maintenance import WATCHDOG_ACTOR

__all__ = [
    "UnknownServiceError",
    "SOURCES",
    "MAX_REASON_LENGTH",
    "MEMORY_NOTICE",
    "backend_name",
    "is_shared_backend",
    "default_ttl_minutes",
    "validate_lifetime",
    "force",
    "release",
    "status_rows",
    "config_report",
    "emergency_status",
    "describe_emergency",
    "LEVEL_MEANINGS",
    "set_emergency_level",
    "step_down_emergency",
    "audit_listener",
    "install_audit_listener",
    "uninstall_audit_listener",
]

_log = logging.getLogger("baldur.audit")

#: Where an operator action came from; stored in ``BreakerAudit.source``.
SOURCES = ("admin", "command", "api")
#: The source of audit rows written for the package's own background tasks (meta-watchdog,
#: auto-activation).
TASK_SOURCE = "task"

#: Longest reason accepted with a force or release, in characters.
MAX_REASON_LENGTH = 1000

#: The first sentence every operator surface says on the memory backend (OP-6, OP-7).
MEMORY_NOTICE = (
    "BALDUR_STATE_BACKEND is 'memory': every process keeps its own breakers, so an operator tool "
    "sees and changes only the process it runs in."
)

_MODES = {"open": "open", "close": "closed", "closed": "closed"}
_SHARED = ("database", "redis")
_ACTOR_MAX = 150

# Set by force()/release() while they run, read by the audit listener on the same thread.
_context: contextvars.ContextVar[dict[str, str] | None] = contextvars.ContextVar(
    "baldur_operator_context", default=None
)


class UnknownServiceError(BaldurError, LookupError):
    """No breaker of that name is known here (OP-7). ``service`` holds the name asked for."""

    def __init__(self, service: str) -> None:
        self.service = service
        super().__init__(f"no circuit breaker named {service!r} is known here")


# --------------------------------------------------------------------------- backend
def backend_name() -> str:
    """The configured state backend: ``"memory"``, ``"database"`` or ``"redis"``.

    Raises:
        ConfigError: ``BALDUR_STATE_BACKEND`` holds an unknown name.
    """
    return str(settings.get("BALDUR_STATE_BACKEND"))


def is_shared_backend() -> bool:
    """True when breakers live in a store shared by every process (database or Redis).

    On the memory backend a force reaches only the process that makes it (OP-4, OP-7).
    """
    return backend_name() in _SHARED


def default_ttl_minutes() -> float:
    """The lifetime of a force given none, minutes (``BALDUR_CB_MANUAL_OVERRIDE_TTL_MINUTES``)."""
    return float(settings.get("BALDUR_CB_MANUAL_OVERRIDE_TTL_MINUTES"))


def validate_lifetime(ttl_minutes: Any) -> float:
    """Check a force lifetime (OP-1).

    Args:
        ttl_minutes: minutes, a number > 0 and <= 1440 (fractions allowed); None means
            :func:`default_ttl_minutes`.

    Returns:
        The lifetime in minutes as a float.

    Raises:
        ConfigError: not a number, NaN/infinite, <= 0 or above 1440.
    """
    return validate_ttl(ttl_minutes, default_ttl_minutes())


def _check_service(service: Any) -> str:
    if not isinstance(service, str) or not service:
        raise ConfigError(f"service={service!r}: a breaker name must be a non-empty string")
    return service


def _check_reason(reason: Any) -> str:
    if reason is None:
        return ""
    if not isinstance(reason, str):
        raise ConfigError(f"reason={reason!r}: expected text")
    if len(reason) > MAX_REASON_LENGTH:
        raise ConfigError(f"reason: {len(reason)} characters, at most {MAX_REASON_LENGTH} allowed")
    return reason


def _check_source(source: Any) -> str:
    if source not in SOURCES:
        raise ConfigError(f"source={source!r}: expected one of {', '.join(SOURCES)}")
    return str(source)


def _check_actor(actor: Any) -> str | None:
    if actor is None:
        return None
    if not isinstance(actor, str):
        raise ConfigError(f"actor={actor!r}: expected text or None")
    return actor[:_ACTOR_MAX]


# ---------------------------------------------------------------------------- forces
def force(
    service: str,
    mode: str,
    ttl_minutes: float | None = None,
    reason: str = "",
    actor: str | None = None,
    source: str = "api",
) -> dict[str, Any]:
    """Force breaker *service* open or closed for a lifetime (OP-1, OP-2, OP-4).

    Every argument is checked before anything is touched: bad input registers no
    breaker and writes nothing. Forcing a service not seen yet registers it (OP-1).

    Args:
        service: breaker name, a non-empty string.
        mode: ``"open"``, or ``"close"``/``"closed"``.
        ttl_minutes: lifetime in **minutes**, > 0 and <= 1440; None uses
            ``BALDUR_CB_MANUAL_OVERRIDE_TTL_MINUTES``.
        reason: free text (at most :data:`MAX_REASON_LENGTH` characters) for logs and audit.
        actor: who asked (admin user name, ``"command:<user>"``...); None when unknown.
        source: ``"admin"``, ``"command"`` or ``"api"``; stored in the audit row.

    Returns:
        The breaker's snapshot after the force (see :func:`status_rows`).

    Raises:
        ConfigError: bad mode, lifetime, reason, actor, source or name; nothing written.
        BaldurError: the shared store could not record the force (OP-4).
    """
    service = _check_service(service)
    kind = _MODES.get(mode) if isinstance(mode, str) else None
    if kind is None:
        raise ConfigError(f"mode={mode!r}: expected 'open' or 'close'")
    ttl = validate_lifetime(ttl_minutes)
    reason = _check_reason(reason)
    actor = _check_actor(actor)
    token = _context.set({"source": _check_source(source), "reason": reason})
    try:
        if kind == "open":
            registry_module.force_open_circuit(service, ttl_minutes=ttl, reason=reason, actor=actor)
        else:
            registry_module.force_close_circuit(service, ttl_minutes=ttl, reason=reason, actor=actor)
    finally:
        _context.reset(token)
    return registry_module.get_breaker(service).snapshot()


def release(service: str, actor: str | None = None, source: str = "api", reason: str = "") -> bool:
    """Hand breaker *service* back to automatic judgement (OP-3).

    A forced open goes straight to HALF_OPEN; a forced closed stays CLOSED with its counts.

    Args:
        service: breaker name.
        actor: who asked; None when unknown.
        source: ``"admin"``, ``"command"`` or ``"api"``.
        reason: free text recorded in the audit row.

    Returns:
        True when a force was removed; False when nothing was forced (no audit row), or,
        on the memory backend, when this process does not know the breaker (it is not
        registered by asking).

    Raises:
        ConfigError: bad name, actor, reason or source.
        BaldurError: the shared store could not record the release (OP-4).
    """
    service = _check_service(service)
    reason = _check_reason(reason)
    actor = _check_actor(actor)
    source = _check_source(source)
    if not is_shared_backend() and registry_module.registry.get(service, create=False) is None:
        return False
    token = _context.set({"source": source, "reason": reason})
    try:
        return bool(registry_module.release_circuit(service, actor=actor))
    finally:
        _context.reset(token)


# ---------------------------------------------------------------------------- status
def _store_names() -> list[str]:
    """Names in the shared store's registry; [] on the memory backend or when it cannot answer."""
    store = getattr(registry_module.registry, "store", None)
    if store is None:
        return []
    try:
        return [name for name in store.names() if isinstance(name, str) and name]
    except Exception as exc:  # ST-4: show what this process knows rather than fail
        _log.warning(
            "baldur.status_store_unavailable: the shared registry could not be read (%s); "
            "showing this process's breakers only",
            type(exc).__name__,
        )
        return []


def status_rows(service: str | None = None) -> list[dict[str, Any]]:
    """Snapshots of the known breakers, sorted by name (OP-6, OP-7).

    This is the one place that decides which breakers are "known": the breakers of this
    process's registry plus, with a shared store, every name in the store's registry
    (those are loaded into this process on first use, which adopts their shared record).

    Args:
        service: only this breaker; None for all.

    Returns:
        A list of snapshot dicts (keys as :meth:`CircuitBreaker.snapshot`: ``service``,
        ``state``, ``consecutive_failures``, ``window_calls``, ``window_failures``,
        ``opened_at``, ``forced``, ``force_expires_at`` (Unix seconds), ``force_reason``,
        ``force_actor``, ``dry_run_rejections``, ``backend``...). Reading them applies
        due lapses and recovery timeouts and never takes a trial slot.

    Raises:
        UnknownServiceError: *service* is given and not known here or in the shared store.
    """
    registry = registry_module.registry
    if service is not None:
        breaker = registry.get(service, create=False) if isinstance(service, str) and service else None
        if breaker is None and isinstance(service, str) and service in _store_names():
            breaker = registry.get(service)
        if breaker is None:
            raise UnknownServiceError(str(service))
        return [breaker.snapshot()]
    names = set(registry.names()) | set(_store_names())
    return [registry.get(name).snapshot() for name in sorted(names)]  # type: ignore[union-attr]  # create=True


# ------------------------------------------------------------------------- emergency
def emergency_status(strict: bool = False) -> dict[str, Any]:
    """The Emergency Mode level after a fresh read (EM-1).

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
    """Set the Emergency Mode level, audited with its *source* (EM-1, OP-6).

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
    reason = _check_reason(reason)
    actor = _check_actor(actor)
    token = _context.set({"source": _check_source(source), "reason": reason})
    try:
        return emergency_facade.set_level(level, minutes, reason=reason, actor=actor)
    finally:
        _context.reset(token)


def step_down_emergency(actor: str | None = None, source: str = "api") -> dict[str, Any]:
    """Lower the Emergency Mode level by one, audited with its *source* (EM-3, OP-6).

    Returns:
        dict: the status after the step, plus ``previous`` (the level before) and
        ``changed`` (False when the level was already 0: nothing written, no audit row).

    Raises:
        ConfigError: a bad actor or source.
        BaldurError: the state is unreadable or could not be stored.
    """
    actor = _check_actor(actor)
    token = _context.set({"source": _check_source(source), "reason": ""})
    try:
        previous = emergency_core.refresh()
        new = emergency_facade.step_down(actor=actor)
    finally:
        _context.reset(token)
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
            when = dt.datetime.fromtimestamp(expires, tz=dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
            text += f" until {when}"
        who = status.get("actor") or "?"
        text += f", set by {who} ({status.get('source', 'manual')})"
        if status.get("reason"):
            text += f": {status['reason']}"
    return text


# ---------------------------------------------------------------------------- config
_HIDDEN = SECRETS  # knobs marked secret in the knobs table
_URLS_WITH_PASSWORDS = {"BALDUR_REDIS_URL"}


def _jsonable(value: Any) -> Any:
    if isinstance(value, (frozenset, set)):
        return sorted((_jsonable(v) for v in value), key=repr)
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return str(value)


def _mask_password(url: str) -> str:
    try:
        parts = urlsplit(url)
        if parts.password:
            host = parts.hostname or ""
            if parts.port:
                host = f"{host}:{parts.port}"
            user = parts.username or ""
            return urlunsplit(parts._replace(netloc=f"{user}:***@{host}"))
    except ValueError:
        return "<hidden>"
    return url


def config_report() -> list[dict[str, Any]]:
    """Every ``BALDUR_*`` knob's effective value and where it came from (CFG-4).

    Returns:
        ``[{"name": str, "value": JSON-able, "source": "setting" | "env" | "default" |
        "error"}, ...]`` in the order of the defaults table. Secrets are not shown: the
        Slack webhook URL reads ``"<set, hidden>"`` and a Redis URL's password ``***``.
        An invalid value has source ``"error"`` and the error text as its value.
    """
    rows = []
    for name, value, source in settings.report():
        if name in _HIDDEN and value is not None:
            value = "<invalid, hidden>" if source == "error" else "<set, hidden>"
        elif name in _URLS_WITH_PASSWORDS and isinstance(value, str):
            value = "<invalid, hidden>" if source == "error" else _mask_password(value)
        rows.append({"name": name, "value": _jsonable(value), "source": source})
    return rows


# ----------------------------------------------------------------------------- audit
def _row_for(event: Event) -> dict[str, Any] | None:
    context = _context.get() or {}
    if isinstance(event, Forced):
        action = "open" if event.mode == "open" else "close"
        ttl: float | None = event.ttl_minutes
        expires = dt.datetime.fromtimestamp(event.expires_at, tz=dt.timezone.utc) if event.expires_at else None
        reason = event.reason
    elif isinstance(event, Released):
        action, ttl, expires = "release", None, None
        reason = event.reason or context.get("reason", "")
    elif isinstance(event, EmergencyLevelChanged):
        return _emergency_row(event, context)
    else:
        return None
    return {
        "at": dt.datetime.fromtimestamp(event.at, tz=dt.timezone.utc),
        "actor": (event.actor or "")[:_ACTOR_MAX],
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
    expires = dt.datetime.fromtimestamp(event.expires_at, tz=dt.timezone.utc) if event.expires_at else None
    source = context.get("source") or (TASK_SOURCE if event.source == "auto" else "api")
    return {
        "at": dt.datetime.fromtimestamp(event.at, tz=dt.timezone.utc),
        "actor": (event.actor or "")[:_ACTOR_MAX],
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

        from .models import BreakerAudit

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


def audit_listener(event: Event) -> None:
    """Bus listener: one :class:`~baldur_django.models.BreakerAudit` row per force, per
    release that changed something and per emergency level change, from any source (OP-6).

    The ``source`` and a release's ``reason`` come from :func:`force`/:func:`release`;
    a call of the public API outside them is recorded as ``"api"``. Never raises: a
    database error is logged on logger ``baldur.audit`` and the force stands.
    """
    try:
        row = _row_for(event)
        if row is None:
            return
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            _save(row)
        else:
            _save_in_thread(row)
    except Exception:
        _log.exception("baldur.audit_listener_failed service=%r", getattr(event, "service", None))


audit_listener.wants_rejections = False  # type: ignore[attr-defined]  # forces and releases only


def install_audit_listener() -> None:
    """Subscribe :func:`audit_listener` to the process-wide bus (idempotent). Called from
    ``BaldurDjangoConfig.ready()``. Implements OP-6."""
    bus.subscribe(audit_listener)


def uninstall_audit_listener() -> None:
    """Remove :func:`audit_listener` from the bus (tests)."""
    bus.unsubscribe(audit_listener)

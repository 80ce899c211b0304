"""Forcing a breaker open or closed, releasing it, forgetting it."""

from __future__ import annotations

import datetime as dt
import logging
from typing import Any

from ..core import registry as registry_module
from ..core.config import settings
from ..core.errors import ConfigError, StoreError
from ..core.names import name_problem
from .audit import write_audit_row
from .common import (
    BreakerForcedError,
    UnknownServiceError,
    check_actor,
    check_reason,
    check_service,
    check_source,
    is_shared_backend,
    operator_context,
    validate_lifetime,
)
from .names import check_known, closest_services, store_names, unknown_here
from .status import status_rows_for

_log = logging.getLogger("baldur.audit")

_MODES = {"open": "open", "close": "closed", "closed": "closed"}


def force(
    service: str,
    mode: str,
    ttl_minutes: float | None = None,
    reason: str = "",
    actor: str | None = None,
    source: str = "api",
    *,
    allow_new: bool = True,
) -> dict[str, Any]:
    """Force breaker *service* open or closed for a lifetime.

    Every argument is checked before anything is touched: bad input registers no
    breaker and writes nothing. Forcing a service not seen yet registers it,
    unless *allow_new* is False: then a name that no process or setting knows (see
    :func:`known_services`) is refused, so a typo cannot create a ghost breaker.

    Args:
        service: breaker name, a non-empty string.
        mode: ``"open"``, or ``"close"``/``"closed"``.
        ttl_minutes: lifetime in **minutes**, > 0 and <= 1440; None uses
            ``BALDUR_CB_MANUAL_OVERRIDE_TTL_MINUTES``.
        reason: free text (at most :data:`MAX_REASON_LENGTH` characters) for logs and audit.
        actor: who asked (admin user name, ``"command:<user>"``...); None when unknown.
        source: ``"admin"``, ``"command"`` or ``"api"``; stored in the audit row.
        allow_new: keyword only; False refuses a name nobody knows (``baldur_force``
            without ``--new``).

    Returns:
        The breaker's snapshot after the force (see :func:`status_rows`).

    Raises:
        ConfigError: bad mode, lifetime, reason, actor, source or name; nothing written.
        UnknownServiceError: *allow_new* is False and nobody knows *service*; nothing written.
        BaldurError: the shared store could not record the force, or (*allow_new*
            False) its registry could not be read.
    """
    service = check_service(service)
    kind = _MODES.get(mode) if isinstance(mode, str) else None
    if kind is None:
        raise ConfigError(f"mode={mode!r}: expected 'open' or 'close'")
    ttl = validate_lifetime(ttl_minutes)
    reason = check_reason(reason)
    actor = check_actor(actor)
    source = check_source(source)
    if not allow_new:
        check_known(service)
    token = operator_context.set({"source": source, "reason": reason})
    try:
        if kind == "open":
            registry_module.force_open_circuit(service, ttl_minutes=ttl, reason=reason, actor=actor)
        else:
            registry_module.force_close_circuit(service, ttl_minutes=ttl, reason=reason, actor=actor)
    finally:
        operator_context.reset(token)
    return registry_module.get_breaker(service).snapshot()


def release(
    service: str,
    actor: str | None = None,
    source: str = "api",
    reason: str = "",
    *,
    allow_unknown: bool = True,
) -> bool:
    """Hand breaker *service* back to automatic judgement.

    A forced open goes straight to HALF_OPEN; a forced closed stays CLOSED with its counts.
    A name that no process or setting knows is never registered by asking.

    Args:
        service: breaker name.
        actor: who asked; None when unknown.
        source: ``"admin"``, ``"command"`` or ``"api"``.
        reason: free text recorded in the audit row.
        allow_unknown: keyword only; False raises :class:`UnknownServiceError` for a name
            nobody knows instead of returning False (``baldur_force release``).

    Returns:
        True when a force was removed; False when nothing was forced (no audit row), or
        when nobody knows the breaker (on the memory backend: this process does not).

    Raises:
        ConfigError: bad name, actor, reason or source.
        UnknownServiceError: *allow_unknown* is False and nobody knows *service*.
        BaldurError: the shared store could not record the release, or could not
            tell whether it knows the name.
    """
    service = check_service(service)
    reason = check_reason(reason)
    actor = check_actor(actor)
    source = check_source(source)
    if registry_module.registry.get(service, create=False) is None:
        try:
            if is_shared_backend():
                check_known(service)
            else:
                unknown_here(service)
        except UnknownServiceError:
            if allow_unknown:
                return False
            raise
    token = operator_context.set({"source": source, "reason": reason})
    try:
        return bool(registry_module.release_circuit(service, actor=actor))
    finally:
        operator_context.reset(token)


def forget(service: str, actor: str | None = None, source: str = "api", reason: str = "") -> dict[str, Any]:
    """Remove breaker *service* from the shared record and registry, and from this process.

    For a name that should never have existed (a typo forced before ``--new`` was
    required) or a service that is gone. Refused while the breaker is forced (a force
    that lapsed is applied first). Audited with action ``forget``. A process still using
    the breaker registers it again, with a fresh record, on its next consult of the
    shared store; the check and the removal are two steps, so a force made in between
    by someone else is removed with the record.

    On the memory backend only this process's breaker is removed: every process keeps its
    own (the result's ``shared`` is False).

    Args:
        service: breaker name, registered in the shared store or in this process.
        actor: who asked; None when unknown.
        source: ``"admin"``, ``"command"`` or ``"api"``; stored in the audit row.
        reason: free text recorded in the audit row.

    Returns:
        dict: ``service``, ``state`` (the state it had), ``shared`` (True when the shared
        record and registry entry were removed).

    Raises:
        ConfigError: bad name, actor, reason or source; nothing changed.
        UnknownServiceError: neither the shared registry nor this process has the breaker;
            ``suggestions`` holds the closest registered names.
        BreakerForcedError: the breaker is forced; nothing changed.
        StoreError: the shared store could not be read or the removal not stored.
    """
    service = check_service(service)
    reason = check_reason(reason)
    actor = check_actor(actor)
    source = check_source(source)
    registry = registry_module.registry
    registered = set(registry.names()) | set(store_names(strict=True))
    if service not in registered:
        raise UnknownServiceError(service, closest_services(service, registered))
    if name_problem(service) is None:
        breaker = registry_module.get_breaker(service)
        breaker.sync()  # the shared record now, not as of the last consult: a fresh force must refuse
        snapshot = breaker.snapshot()  # lapses included
    else:  # a name stored before names were checked: no breaker can hold it, read its record
        snapshot = status_rows_for([service])[0]
    if snapshot.get("forced"):
        raise BreakerForcedError(service, str(snapshot["forced"]), snapshot.get("force_expires_at"))
    store = registry.store
    if store is not None:
        _remove_shared_record(store, service)
    registry.forget(service)
    _log.info("baldur.forgotten service=%r actor=%s source=%s", service, actor, source)
    _audit_forget(service, str(snapshot.get("state") or ""), actor, source, reason, registry.clock.wall())
    return {"service": service, "state": snapshot.get("state"), "shared": store is not None}


def _remove_shared_record(store: Any, service: str) -> None:
    try:
        store.reset(service)
    except Exception as exc:
        raise StoreError(
            f"the shared record of {service!r} could not be removed ({type(exc).__name__}: {exc}); "
            "nothing was forgotten"
        ) from exc


def _audit_forget(service: str, state: str, actor: str | None, source: str, reason: str, now: float) -> None:
    """The audit row of a forget (*now*: Unix seconds)."""
    write_audit_row(
        {
            "at": dt.datetime.fromtimestamp(now, tz=dt.UTC),
            "actor": actor or "",
            "action": "forget",
            "service": service,
            "ttl_minutes": None,
            "expires_at": None,
            "reason": reason,
            "source": source,
            "from_state": state,
            "to_state": "",
            "dry_run": bool(settings.get("BALDUR_DRY_RUN")),
        }
    )

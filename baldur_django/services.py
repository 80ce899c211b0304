"""Operator use cases, shared by the admin, the management commands and tasks .

Every operator surface is a thin shell over this module: it parses its own input, calls
one function here and formats the answer. Nothing here knows about HTTP or argparse.

* :func:`force` / :func:`release` -- force a breaker open or closed with a lifetime, or
  hand it back to automatic judgement, tagging the audit row with its source.
  :func:`known_services` / :func:`check_known` decide which names exist, so a typo
  creates no ghost breaker.
* :func:`forget` -- remove a breaker from the shared record and registry, audited.
* :func:`require_migrated` -- every operator command first makes sure ``migrate`` has
  created the package's tables.
* :func:`status_rows` -- one row per known breaker; :func:`status_page` one page
  of them for the admin, read from the store's records without creating breakers.
* :func:`config_report` -- every effective ``BALDUR_*`` value and where it came from.
* :func:`emergency_status` / :func:`set_emergency_level` / :func:`step_down_emergency` --
  Emergency Mode's level for the admin and ``baldur_emergency``.
* :func:`install_audit_listener` -- the bus listener that writes :class:`BreakerAudit`
  rows for every force and release, and every emergency level change, from any source.
"""

from __future__ import annotations

import asyncio
import contextvars
import datetime as dt
import difflib
import logging
import math
import threading
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from . import emergency as emergency_facade
from .core import emergency as emergency_core
from .core import registry as registry_module
from .core.breaker import validate_ttl
from .core.config import build_config
from .core.config import settings as settings  # re-exported: the commands read it
from .core.errors import BaldurError, ConfigError, StoreError
from .core.events import EmergencyLevelChanged, Event, Forced, ForceLapsed, Released, bus
from .core.knobs import SECRETS
from .core.maintenance import WATCHDOG_ACTOR
from .core.stores.base import Answer, Record

__all__ = [
    "UnknownServiceError",
    "BreakerForcedError",
    "NotMigratedError",
    "missing_tables",
    "require_migrated",
    "forget",
    "known_services",
    "closest_services",
    "check_known",
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
    "status_names",
    "status_page",
    "status_rows_for",
    "record_row",
    "PAGE_SIZE",
    "STATUS_BATCH",
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

#: The first sentence every operator surface says on the memory backend.
MEMORY_NOTICE = (
    "BALDUR_STATE_BACKEND is 'memory': every process keeps its own breakers, so an operator tool "
    "sees and changes only the process it runs in."
)

_MODES = {"open": "open", "close": "closed", "closed": "closed"}
_ACTOR_MAX = 150

# Set by force()/release() while they run, read by the audit listener on the same thread.
_context: contextvars.ContextVar[dict[str, str] | None] = contextvars.ContextVar(
    "baldur_operator_context", default=None
)


class UnknownServiceError(BaldurError, LookupError):
    """No breaker of that name is known here.

    Attributes:
        service (str): the name asked for.
        suggestions (list[str]): the closest known names (best first, at most three);
            the message names them.
    """

    def __init__(self, service: str, suggestions: list[str] | None = None) -> None:
        self.service = service
        self.suggestions = list(suggestions or [])
        text = f"no circuit breaker named {service!r} is known here"
        if self.suggestions:
            text += "; did you mean " + " or ".join(repr(name) for name in self.suggestions) + "?"
        super().__init__(text)


class BreakerForcedError(BaldurError):
    """The breaker is forced, so it cannot be forgotten. Release it first.

    Attributes:
        service (str): the breaker's name.
        forced (str): ``"open"`` or ``"closed"``.
    """

    def __init__(self, service: str, forced: str, expires_at: float | None = None) -> None:
        self.service = service
        self.forced = forced
        until = f" until {_utc(expires_at)}" if expires_at is not None else ""
        super().__init__(
            f"{service!r} is forced {forced}{until}: a forced breaker is not forgotten; "
            "release it first (baldur_force release, or the admin's Release action)"
        )


def _utc(timestamp: float) -> str:
    return dt.datetime.fromtimestamp(timestamp, tz=dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


class NotMigratedError(BaldurError):
    """The package's tables do not exist yet: ``manage.py migrate`` has not run.

    Attributes:
        missing (dict[str, list[str]]): database alias -> missing table names.
    """

    def __init__(self, missing: dict[str, list[str]]) -> None:
        self.missing = missing
        where = "; ".join(f"database {alias!r}: {', '.join(tables)}" for alias, tables in missing.items())
        super().__init__(
            f"the baldur_django tables do not exist yet ({where}). Run `python manage.py migrate` first, "
            "then this command again."
        )


# --------------------------------------------------------------------------- backend
def backend_name() -> str:
    """The configured state backend: ``"memory"``, ``"database"``, ``"redis"`` or a store class's dotted path.

    Raises:
        ConfigError: ``BALDUR_STATE_BACKEND`` holds an unknown name.
    """
    return str(settings.get("BALDUR_STATE_BACKEND"))


def is_shared_backend() -> bool:
    """True when breakers live in a store shared by every process (database, Redis, or a
    store class named by dotted path).

    On the memory backend a force reaches only the process that makes it.
    """
    return backend_name() != "memory"


def default_ttl_minutes() -> float:
    """The lifetime of a force given none, minutes (``BALDUR_CB_MANUAL_OVERRIDE_TTL_MINUTES``)."""
    return float(settings.get("BALDUR_CB_MANUAL_OVERRIDE_TTL_MINUTES"))


def validate_lifetime(ttl_minutes: Any) -> float:
    """Check a force lifetime.

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


# ------------------------------------------------------------------------ migrations
def missing_tables() -> dict[str, list[str]]:
    """The package's tables that do not exist, per database alias.

    The tables are those of the audit (:class:`~baldur_django.models.BreakerAudit`) and of
    the database store (shared records and fleet locks), each looked up in the database
    the routers send its writes to. A database that cannot be reached is not reported
    here: the command's own work then says what went wrong.

    Returns:
        dict[str, list[str]]: alias -> missing table names; empty when ``migrate`` has run.
    """
    from django.db import DatabaseError, connections, router

    from .models import BreakerAudit, BreakerLock, BreakerRecord

    existing: dict[str, set[str] | None] = {}
    missing: dict[str, list[str]] = {}
    for model in (BreakerAudit, BreakerRecord, BreakerLock):
        alias = router.db_for_write(model)
        if alias not in existing:
            try:
                existing[alias] = set(connections[alias].introspection.table_names())
            except DatabaseError:
                existing[alias] = None
        tables = existing[alias]
        table = model._meta.db_table  # noqa: SLF001, RUF100 - Django documents Model._meta as public API
        if tables is not None and table not in tables:
            missing.setdefault(alias, []).append(table)
    return missing


def require_migrated() -> None:
    """Refuse to go on before ``manage.py migrate`` has created the package's tables.

    Raises:
        NotMigratedError: some table is missing; the message says to run ``migrate``.
    """
    missing = missing_tables()
    if missing:
        raise NotMigratedError(missing)


# ---------------------------------------------------------------------------- forces
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
    service = _check_service(service)
    kind = _MODES.get(mode) if isinstance(mode, str) else None
    if kind is None:
        raise ConfigError(f"mode={mode!r}: expected 'open' or 'close'")
    ttl = validate_lifetime(ttl_minutes)
    reason = _check_reason(reason)
    actor = _check_actor(actor)
    source = _check_source(source)
    if not allow_new:
        check_known(service)
    token = _context.set({"source": source, "reason": reason})
    try:
        if kind == "open":
            registry_module.force_open_circuit(service, ttl_minutes=ttl, reason=reason, actor=actor)
        else:
            registry_module.force_close_circuit(service, ttl_minutes=ttl, reason=reason, actor=actor)
    finally:
        _context.reset(token)
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
    service = _check_service(service)
    reason = _check_reason(reason)
    actor = _check_actor(actor)
    source = _check_source(source)
    if registry_module.registry.get(service, create=False) is None:
        try:
            if is_shared_backend():
                check_known(service)
            else:
                _unknown_here(service)
        except UnknownServiceError:
            if allow_unknown:
                return False
            raise
    token = _context.set({"source": source, "reason": reason})
    try:
        return bool(registry_module.release_circuit(service, actor=actor))
    finally:
        _context.reset(token)


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
    service = _check_service(service)
    reason = _check_reason(reason)
    actor = _check_actor(actor)
    source = _check_source(source)
    registry = registry_module.registry
    registered = set(registry.names()) | set(_store_names(strict=True))
    if service not in registered:
        raise UnknownServiceError(service, closest_services(service, registered))
    breaker = registry_module.get_breaker(service)
    breaker.sync()  # the shared record now, not as of the last consult: a fresh force must refuse
    snapshot = breaker.snapshot()  # lapses included
    if snapshot.get("forced"):
        raise BreakerForcedError(service, str(snapshot["forced"]), snapshot.get("force_expires_at"))
    store = registry.store
    if store is not None:
        try:
            store.reset(service)
        except Exception as exc:
            raise StoreError(
                f"the shared record of {service!r} could not be removed ({type(exc).__name__}: {exc}); "
                "nothing was forgotten"
            ) from exc
    registry.forget(service)
    _log.info("baldur.forgotten service=%r actor=%s source=%s", service, actor, source)
    now = registry.clock.wall()
    _record(
        {
            "at": dt.datetime.fromtimestamp(now, tz=dt.timezone.utc),
            "actor": actor or "",
            "action": "forget",
            "service": service,
            "ttl_minutes": None,
            "expires_at": None,
            "reason": reason,
            "source": source,
            "from_state": str(snapshot.get("state") or ""),
            "to_state": "",
            "dry_run": bool(settings.get("BALDUR_DRY_RUN")),
        }
    )
    return {"service": service, "state": snapshot.get("state"), "shared": store is not None}


def _unknown_here(service: str) -> None:
    """Memory backend: only this process's breakers can be acted on."""
    raise UnknownServiceError(service, closest_services(service, set(registry_module.registry.names())))


# ---------------------------------------------------------------------------- status
def _store_names(strict: bool = False) -> list[str]:
    """Names in the shared store's registry; [] on the memory backend or when it cannot
    answer (with *strict*: a :class:`StoreError` then)."""
    store = getattr(registry_module.registry, "store", None)
    if store is None:
        return []
    try:
        return [name for name in store.names() if isinstance(name, str) and name]
    except Exception as exc:  # show what this process knows rather than fail
        if strict:
            raise StoreError(
                f"the shared registry of breakers could not be read ({type(exc).__name__}: {exc}); nothing was changed"
            ) from exc
        _log.warning(
            "baldur.status_store_unavailable: the shared registry could not be read (%s); "
            "showing this process's breakers only",
            type(exc).__name__,
        )
        return []


def known_services(*, strict: bool = False) -> set[str]:
    """Every breaker name that a process or a setting knows.

    That is the breakers of this process, the names in the shared store's registry (every
    process registers the breakers it uses there), the keys of ``BALDUR_SERVICES`` and the
    breaker names of ``BALDUR_DOMAIN_MAPPING``.

    Args:
        strict: raise when the shared registry cannot be read instead of leaving its
            names out (the answer would be incomplete).

    Returns:
        set[str]: the names.

    Raises:
        ConfigError: ``BALDUR_SERVICES`` or ``BALDUR_DOMAIN_MAPPING`` is invalid.
        StoreError: only with *strict*, when the shared registry could not be read.
    """
    names = set(registry_module.registry.names()) | set(_store_names(strict=strict))
    names.update(settings.get("BALDUR_SERVICES"))
    names.update(settings.get("BALDUR_DOMAIN_MAPPING").values())
    return names


def closest_services(service: str, known: set[str] | None = None) -> list[str]:
    """The known names closest to *service*, best first, at most three (``difflib``).

    Args:
        service: the name asked for.
        known: the names to choose from; None reads :func:`known_services`.

    Returns:
        list[str]: possibly empty.
    """
    pool = known_services() if known is None else known
    return difflib.get_close_matches(service, sorted(pool), n=3, cutoff=0.6)


def check_known(service: str) -> str:
    """Make sure a process or a setting knows breaker *service* before acting on it.

    Args:
        service: the breaker name.

    Returns:
        str: *service*, unchanged.

    Raises:
        ConfigError: *service* is not a non-empty string, or a setting it is checked
            against is invalid.
        UnknownServiceError: nobody knows the name; ``suggestions`` holds the closest
            known names.
        StoreError: the shared registry could not be read.
    """
    service = _check_service(service)
    known = known_services(strict=True)
    if service not in known:
        raise UnknownServiceError(service, closest_services(service, known))
    return service


def status_rows(service: str | None = None) -> list[dict[str, Any]]:
    """Rows of the known breakers, sorted by name.

    This is the one place that decides which breakers are "known": the breakers of this
    process's registry plus, with a shared store, every name in the store's registry.

    With *service*, the breaker is loaded into this process on first use (which adopts its
    shared record) and its :meth:`CircuitBreaker.snapshot` is returned. Without it, the rows
    come from :func:`status_rows_for` over every known name, read a batch of
    :data:`STATUS_BATCH` records per store round trip where the store can: a breaker this
    process does not hold is described from its shared record and is *not* created here
    (a fresh worker listing 10,000 breakers no longer builds 10,000 of them).

    Args:
        service: only this breaker; None for all.

    Returns:
        A list of row dicts (keys as :meth:`CircuitBreaker.snapshot`: ``service``,
        ``state``, ``consecutive_failures``, ``window_calls``, ``window_failures``,
        ``opened_at``, ``forced``, ``force_expires_at`` (Unix seconds), ``force_reason``,
        ``force_actor``, ``dry_run_rejections``, ``backend``..., plus ``from_record``; see
        :func:`record_row` for what a row read from a record cannot know). Reading them
        applies due lapses and recovery timeouts and never takes a trial slot.

    Raises:
        UnknownServiceError: *service* is given and not known here or in the shared store
            (``suggestions``: the closest names that are).
        ConfigError: a ``BALDUR_SERVICES`` entry is invalid (the configuration of a row
            read from a record is resolved from the settings).
    """
    registry = registry_module.registry
    if service is not None:
        breaker = registry.get(service, create=False) if isinstance(service, str) and service else None
        stored = _store_names() if breaker is None else []
        if breaker is None and isinstance(service, str) and service in stored:
            breaker = registry.get(service)
        if breaker is None:
            registered = set(registry.names()) | set(stored)
            raise UnknownServiceError(str(service), closest_services(str(service), registered))
        return [_held_row(breaker)]
    names = status_names()
    rows: list[dict[str, Any]] = []
    for start in range(0, len(names), STATUS_BATCH):
        rows.extend(status_rows_for(names[start : start + STATUS_BATCH]))
    return rows


#: Rows of one admin page (:func:`status_page`'s default *limit*).
PAGE_SIZE = 100
#: Records :func:`status_rows` reads per store round trip when the store has a bulk read.
STATUS_BATCH = 500


def status_names() -> list[str]:
    """Every known breaker name, sorted: this process's breakers plus the names in the
    shared store's registry. Reads the store's name registry only (one
    round trip on Redis); no record is read and no breaker is created.

    Returns:
        list[str]: the names, sorted; this process's names only when the store cannot
        answer (a warning is logged).
    """
    return sorted(set(registry_module.registry.names()) | set(_store_names()))


def status_page(offset: int = 0, limit: int = PAGE_SIZE) -> tuple[list[dict[str, Any]], int]:
    """One page of :func:`status_rows`, for the admin's breaker list.

    The names are sorted as in :func:`status_rows`; only the page's records are read, in
    one bulk store call where the store offers ``inspect_many`` (else one ``inspect`` per
    name of the page), and no breaker is created.

    Args:
        offset: rows to skip (an int >= 0).
        limit: rows to return at most (an int >= 1).

    Returns:
        tuple[list[dict], int]: the page's rows (as :func:`status_rows_for`) and the number
        of known breakers in all.

    Raises:
        ConfigError: *offset* or *limit* is not an int in range, or a ``BALDUR_SERVICES``
            entry is invalid.
    """
    if not isinstance(offset, int) or isinstance(offset, bool) or offset < 0:
        raise ConfigError(f"status page offset {offset!r}: must be an int >= 0")
    if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
        raise ConfigError(f"status page limit {limit!r}: must be an int >= 1")
    names = status_names()
    return status_rows_for(names[offset : offset + limit]), len(names)


def status_rows_for(names: list[str]) -> list[dict[str, Any]]:
    """The rows of breakers *names*, in that order, without creating any breaker.

    A breaker this process holds gives its :meth:`CircuitBreaker.snapshot`
    (``from_record`` False). Every other name is read from the shared store, all of them in
    one ``store.inspect_many(names, frozen=...)`` call when the store has it (the Redis
    store pipelines it: one round trip), else one ``store.inspect`` per name, and described
    by :func:`record_row` (``from_record`` True). A force that the read lapses is announced
    (``force_lapsed``), as a breaker adopting the record would. Callers decide which names
    are known (:func:`status_names`); a name the store has no record of reads as a fresh
    CLOSED record.

    Args:
        names: breaker names (non-empty strings); their number is the caller's batch size.

    Returns:
        list[dict]: one row per name. When the store cannot answer, a name this process
        does not hold gets the row of a fresh CLOSED record with ``store_available`` False
        (what a breaker created now would judge locally) and a warning is logged.

    Raises:
        ConfigError: a ``BALDUR_SERVICES`` entry is invalid.
    """
    registry = registry_module.registry
    held = {name: registry.get(name, create=False) for name in names}
    missing = [name for name in names if held[name] is None]
    store = registry.store
    answers: dict[str, Answer | None] = {}
    if missing:
        answers = dict(zip(missing, _inspect_many(store, missing), strict=True))
    configs = _RowConfigs(registry.source, registry.clock)
    backend = store.backend if store is not None else "memory"
    rows = []
    for name in names:
        breaker = held[name]
        if breaker is not None:
            rows.append(_held_row(breaker))
        else:
            rows.append(record_row(name, answers.get(name), configs.get(name), backend))
    return rows


def _held_row(breaker: Any) -> dict[str, Any]:
    row: dict[str, Any] = breaker.snapshot()
    row["from_record"] = False
    return row


def _inspect_many(store: Any, names: list[str]) -> list[Answer | None]:
    """The store's answers for *names* (None each when there is no store or it failed)."""
    if store is None:
        return [None] * len(names)
    frozen = emergency_core.frozen()
    try:
        many = getattr(store, "inspect_many", None)
        answers: list[Answer | None]
        if many is not None:
            answers = list(many(names, frozen=frozen))
        else:
            answers = [store.inspect(name, frozen=frozen) for name in names]
    except Exception as exc:  # show what can be shown rather than fail
        _log.warning(
            "baldur.status_store_unavailable: the shared records of %d breaker(s) could not be read (%s); "
            "showing them as a fresh breaker would judge them locally",
            len(names),
            type(exc).__name__,
        )
        return [None] * len(names)
    for name, answer in zip(names, answers, strict=True):
        if answer is not None and answer.lapsed is not None:  # this read lapsed it: announce
            bus.publish(
                ForceLapsed(
                    name, answer.now, previous=answer.lapsed, from_state=answer.lapsed, to_state=answer.record.state
                )
            )
    return answers


class _RowConfigs:
    """The settings' configuration of breakers this process does not hold, as the snapshot's
    ``config`` dict: built once for every name without a ``BALDUR_SERVICES`` entry (they
    all resolve alike), once per name with one."""

    def __init__(self, source: Any, clock: Any) -> None:
        self._source = source
        self._clock = clock
        self._services = source.get("BALDUR_SERVICES")
        self._default: dict[str, Any] | None = None

    def get(self, name: str) -> dict[str, Any]:
        if name in self._services:
            return self._build(name)
        if self._default is None:
            self._default = self._build(name)
        return dict(self._default)

    def _build(self, name: str) -> dict[str, Any]:
        config = build_config(name, {}, self._source, self._clock)
        return {key: getattr(config, key) for key in ROW_CONFIG_KEYS}


#: The keys of a row's ``config`` dict (as :meth:`CircuitBreaker.snapshot`'s).
ROW_CONFIG_KEYS = (
    "failure_threshold",
    "failure_rate_threshold",
    "sliding_window_size",
    "sliding_window_type",
    "sliding_window_seconds",
    "recovery_backoff_factor",
    "recovery_timeout_max",
    "slow_call_duration",
    "slow_call_rate_threshold",
    "minimum_calls",
    "recovery_timeout",
    "half_open_max_calls",
)


def record_row(name: str, answer: Answer | None, config: dict[str, Any], backend: str) -> dict[str, Any]:
    """The status row of breaker *name* built from its shared record, for a breaker this
    process does not hold.

    The keys are those of :meth:`CircuitBreaker.snapshot`. What the shared record holds is
    exact: ``state``, ``opened_at``, ``open_until``, ``open_duration`` (the backed-off
    length of the current or last open), ``consecutive_opens``, the force fields,
    ``half_open_trials`` (live trial leases of the whole fleet) and ``half_open_successes``,
    ``last_trigger`` (the trigger of the record's last open) and ``shared_version``.
    What a record does not hold, because it is each process's own, reads as zero:
    ``consecutive_failures``, ``window_calls``, ``window_failures``,
    ``window_slow_calls``, ``dry_run_rejections`` and ``cooldown_remaining`` are those of
    this process, which has made no call through the breaker. ``config`` is what the
    settings resolve for the name (``BALDUR_SERVICES`` and the global knobs); per-call
    overrides that a worker passed are not in the record and do not show.

    Args:
        name: the breaker name.
        answer: the store's answer of ``inspect``; None when it could not be read (the row
            of a fresh CLOSED record, ``store_available`` False).
        config: the ``config`` dict of the row.
        backend: the store's label (``"redis"``, ``"database"``...).

    Returns:
        dict: the row, with ``from_record`` True.
    """
    record = answer.record if answer is not None else Record()
    state = record.state
    forced = record.forced
    if state == "closed":
        open_until, open_duration = None, None
    elif forced == "open":
        open_until, open_duration = record.force_expires_at, None
    else:
        open_until = record.open_until if state == "open" else None
        known = record.open_until is not None and record.opened_at is not None
        open_duration = record.open_until - record.opened_at if known else None  # type: ignore[operator]
    half_open = state == "half_open"
    return {
        "service": name,
        "state": state,
        "consecutive_failures": 0,
        "window_calls": 0,
        "window_failures": 0,
        "window_slow_calls": 0,
        "opened_at": record.opened_at,
        "open_until": open_until,
        "open_duration": open_duration,
        "consecutive_opens": record.opens,
        "forced": forced,
        "force_expires_at": record.force_expires_at if forced else None,
        "force_reason": record.force_reason if forced else None,
        "force_actor": record.force_actor if forced else None,
        "half_open_trials": len(record.probes) if half_open else 0,
        "half_open_successes": record.successes if half_open else 0,
        "cooldown_remaining": 0.0,
        "dry_run_rejections": 0,
        "last_trigger": record.trigger,
        "backend": backend,
        "config": config,
        "store_available": answer is not None,
        "shared_version": record.version if answer is not None else -1,
        "from_record": True,
    }


# ------------------------------------------------------------------------- emergency
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
    reason = _check_reason(reason)
    actor = _check_actor(actor)
    token = _context.set({"source": _check_source(source), "reason": reason})
    try:
        return emergency_facade.set_level(level, minutes, reason=reason, actor=actor)
    finally:
        _context.reset(token)


def step_down_emergency(actor: str | None = None, source: str = "api") -> dict[str, Any]:
    """Lower the Emergency Mode level by one, audited with its *source*.

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
    """Every ``BALDUR_*`` knob's effective value and where it came from.

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


def _record(row: dict[str, Any]) -> None:
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
        _record(row)
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

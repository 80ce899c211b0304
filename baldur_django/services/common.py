"""What every operator use case shares: the errors, the checks of its arguments, the
backend it runs on, the migration check, and the context an action hands its audit row."""

from __future__ import annotations

import contextvars
import datetime as dt
from typing import Any

from ..core.breaker import validate_ttl
from ..core.config import settings
from ..core.errors import BaldurError, ConfigError

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
ACTOR_MAX = 150

# Set by force()/release() while they run, read by the audit listener on the same thread.
operator_context: contextvars.ContextVar[dict[str, str] | None] = contextvars.ContextVar(
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
        until = f" until {utc_text(expires_at)}" if expires_at is not None else ""
        super().__init__(
            f"{service!r} is forced {forced}{until}: a forced breaker is not forgotten; "
            "release it first (baldur_force release, or the admin's Release action)"
        )


def utc_text(timestamp: float) -> str:
    return dt.datetime.fromtimestamp(timestamp, tz=dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


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


def check_service(service: Any) -> str:
    if not isinstance(service, str) or not service:
        raise ConfigError(f"service={service!r}: a breaker name must be a non-empty string")
    return service


def check_reason(reason: Any) -> str:
    if reason is None:
        return ""
    if not isinstance(reason, str):
        raise ConfigError(f"reason={reason!r}: expected text")
    if len(reason) > MAX_REASON_LENGTH:
        raise ConfigError(f"reason: {len(reason)} characters, at most {MAX_REASON_LENGTH} allowed")
    return reason


def check_source(source: Any) -> str:
    if source not in SOURCES:
        raise ConfigError(f"source={source!r}: expected one of {', '.join(SOURCES)}")
    return str(source)


def check_actor(actor: Any) -> str | None:
    if actor is None:
        return None
    if not isinstance(actor, str):
        raise ConfigError(f"actor={actor!r}: expected text or None")
    return actor[:ACTOR_MAX]


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

    from ..models import BreakerAudit, BreakerLock, BreakerRecord

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

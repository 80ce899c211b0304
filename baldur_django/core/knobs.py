"""The one defaults table of every ``BALDUR_*`` knob.

Each row (:class:`Knob`) says everything about one knob: its name and default, how a raw
value is turned into a checked one, what it does and accepts, its system check id,
whether it is a secret, the per-call / ``BALDUR_SERVICES`` key that sets it for one
breaker, and whether it is reserved (validated, but its feature is not built yet). The
other tables (:data:`OVERRIDE_KEYS`, :data:`SERVICE_KEYS`, :data:`CHECK_IDS`,
:data:`SECRETS`, :data:`RESERVED`) are derived from the rows. The core (environment
variables), the Django settings object and the system checks all parse values with the
same rows, so a bad value reads the same everywhere.

The parsers live in :mod:`.knob_parsers`, the :class:`Knob` type and the rows of one
breaker and its traffic in :mod:`.knob_rows`; this module holds the other rows and
everything derived from all of them.
"""

from __future__ import annotations

import difflib
from typing import Any

from .errors import ConfigError
from .knob_parsers import (
    BOOL_ACCEPTS,
    MAX_LIFETIME_MINUTES,
    PERCENT,
    SECONDS,
    Parser,
    StoreChoice,
    choice,
    fail,
    flag,
    https_url,
    ignore_paths,
    is_exception_type,
    is_predicate,
    json_dict,
    log_level,
    number,
    optional,
    predicate_path,
    redis_url,
    service_names,
    text_value,
    validate_number,
)
from .knob_rows import BREAKER_ROWS, STAGE_ROWS, TRAFFIC_ROWS, Knob
from .names import name_problem, show_name

__all__ = [
    "MAX_LIFETIME_MINUTES",
    "Knob",
    "KNOBS",
    "OVERRIDE_KEYS",
    "SERVICE_KEYS",
    "PREDICATE_KEYS",
    "LOCAL_KEYS",
    "CHECK_IDS",
    "SECRETS",
    "RESERVED",
    "parse",
    "closest_knob",
    "validate_number",
    "check_service_overrides",
    "is_exception_type",
    "is_predicate",
]

_MISSING = object()


def check_service_overrides(where: str, overrides: dict[str, Any], from_env: bool = False) -> dict[str, Any]:
    """Validate a mapping of per-breaker overrides and return the parsed values.

    Args:
        where: prefix for messages, e.g. ``"BALDUR_SERVICES['payments']"`` or ``"protected('payments')"``.
        overrides: key -> raw value; keys must be in :data:`SERVICE_KEYS` or
            :data:`PREDICATE_KEYS` (the predicates are checked for their form only: a
            dotted path is imported later, when a breaker is built).

    Raises:
        ConfigError: an unknown key (naming the closest known one) or a bad value.
    """
    out: dict[str, Any] = {}
    for key, raw in overrides.items():
        parser = SERVICE_KEYS.get(key) or LOCAL_KEYS.get(key) or PREDICATE_KEYS.get(key)
        if parser is None:
            known = [*SERVICE_KEYS, *LOCAL_KEYS, *PREDICATE_KEYS]
            near = difflib.get_close_matches(str(key), known, n=1)
            hint = f"; did you mean {near[0]!r}?" if near else f"; known keys: {', '.join(known)}"
            raise ConfigError(f"{where}: unknown key {key!r}{hint}")
        out[key] = parser(f"{where}[{key!r}]", raw, from_env)
    return out


#: ``BALDUR_SERVICES`` keys (and per-call overrides) that hold predicates rather than a
#: knob's value, with the parser that checks their form. No global setting exists
#: for them: they are per breaker only.
PREDICATE_KEYS: dict[str, Parser] = {
    "ignore_exceptions": ignore_paths,
    "failure_predicate": predicate_path,
    "result_predicate": predicate_path,
}


#: ``BALDUR_SERVICES`` keys (and per-call overrides) that hold a value of one breaker
#: with no global setting behind them, with their parsers: ``deadline``, the seconds one
#: protected call may take in all (attempts, retry and cooldown waits). None: no deadline.
LOCAL_KEYS: dict[str, Parser] = {
    "deadline": optional(number(minimum=0, exclusive=True, unit=SECONDS)),
}


class _Services:
    """Parser of ``BALDUR_SERVICES``; ``accepts`` lists the keys an entry may set."""

    def __call__(self, name: str, value: Any, from_env: bool) -> dict[str, dict[str, Any]]:
        value = json_dict(name, value, from_env)
        out = {}
        for service, overrides in value.items():
            if name_problem(service) is not None:
                raise fail(name, value, f"{show_name(service, 60)} is not a breaker name: it {name_problem(service)}")
            if not isinstance(overrides, dict):
                raise fail(name, value, f"the entry for {service!r} must be a mapping of overrides")
            out[service] = check_service_overrides(f"{name}[{service!r}]", overrides, from_env)
        return out

    @property
    def accepts(self) -> str:
        return (
            "A dict mapping each service name to a dict of overrides; allowed keys: "
            + ", ".join([*SERVICE_KEYS, *LOCAL_KEYS, *PREDICATE_KEYS])
            + " (the last three as dotted import paths, such as 'myapp.breakers.is_outage')."
        )


_services = _Services()


_ROWS: list[Knob] = [
    *BREAKER_ROWS,
    Knob("BALDUR_SERVICES", {}, _services, "per-service overrides", "baldur.E022"),
    *TRAFFIC_ROWS,
    *STAGE_ROWS,
    # ------------------------------------------------------------ shared state
    Knob(
        "BALDUR_STATE_BACKEND",
        "memory",
        StoreChoice(("memory", "database", "redis")),
        "where breaker state lives",
        "baldur.E040",
    ),
    Knob(
        "BALDUR_REDIS_URL",
        None,
        redis_url,
        "Redis URL for the redis backend",
        "baldur.E041",
        accepts="A redis://host:6379/0 URL (rediss:// for TLS, unix:///path for a socket).",
    ),
    Knob(
        "BALDUR_REDIS_CACHE_ALIAS",
        "default",
        text_value(),
        "django-redis cache alias used when no URL is set",
        "baldur.E042",
        accepts="A key of CACHES whose backend is django-redis.",
    ),
    Knob(
        "BALDUR_REDIS_SOCKET_TIMEOUT",
        0.25,
        number(minimum=0, exclusive=True, unit=SECONDS),
        "connect and read timeout, seconds",
        "baldur.E043",
    ),
    Knob("BALDUR_REDIS_MAX_CONNECTIONS", 50, number(integer=True, minimum=1), "connection pool size", "baldur.E044"),
    Knob(
        "BALDUR_REDIS_CLUSTER",
        False,
        flag,
        "BALDUR_REDIS_URL names one node of a Redis Cluster",
        "baldur.E066",
        accepts=BOOL_ACCEPTS,
    ),
    Knob(
        "BALDUR_STORE_WARNING_INTERVAL_SECONDS",
        60,
        number(minimum=0, unit=SECONDS),
        "at most one store warning per interval, seconds",
        "baldur.E045",
    ),
    Knob(
        "BALDUR_CB_SYNC_INTERVAL_SECONDS",
        5,
        number(minimum=0, unit=SECONDS),
        "longest gap between consults of the shared record; 0 = events only",
        "baldur.E046",
    ),
    Knob(
        "BALDUR_CB_HALF_OPEN_PROBE_LEASE_SECONDS",
        30,
        number(minimum=0, exclusive=True, unit=SECONDS),
        "lease of one half-open probe, seconds",
        "baldur.E047",
    ),
    Knob(
        "BALDUR_REGISTRY_TTL_DAYS",
        7,
        number(minimum=0, exclusive=True, unit="days"),
        "registry entries unseen this long are pruned, days",
        "baldur.E048",
    ),
    Knob(
        "BALDUR_REGISTRY_IDLE_SECONDS",
        3600,
        number(minimum=0, unit=SECONDS),
        "an idle CLOSED, unforced breaker leaves the process and its shared record expires, seconds (0 = never)",
        "baldur.E076",
    ),
    Knob(
        "BALDUR_ADAPTER_MAX_HOSTS",
        1000,
        number(integer=True, minimum=1),
        "per-host breakers one HTTP adapter keeps; the least recently used CLOSED ones leave first",
        "baldur.E077",
    ),
    # ------------------------------------------------------------ Celery tasks
    Knob(
        "BALDUR_TASK_RECOVERY_SWEEP_SECONDS",
        10,
        number(minimum=0, exclusive=True, unit=SECONDS),
        "recovery_sweep interval, seconds",
        "baldur.E049",
    ),
    Knob(
        "BALDUR_TASK_STATE_SYNC_SECONDS",
        30,
        number(minimum=0, exclusive=True, unit=SECONDS),
        "sync_state interval, seconds",
        "baldur.E050",
    ),
    Knob(
        "BALDUR_TASK_EMERGENCY_CHECK_SECONDS",
        10,
        number(minimum=0, exclusive=True, unit=SECONDS),
        "emergency_check interval, seconds",
        "baldur.E051",
    ),
    Knob(
        "BALDUR_TASK_META_WATCHDOG_SECONDS",
        60,
        number(minimum=0, exclusive=True, unit=SECONDS),
        "meta_watchdog interval, seconds",
        "baldur.E067",
    ),
    # ------------------------------------------------------------ operators, logging, notifications
    Knob("BALDUR_DRY_RUN", False, flag, "observe only: never reject", "baldur.E052", accepts=BOOL_ACCEPTS),
    Knob(
        "BALDUR_EVENT_LOGGING_CB_LOG_LEVEL",
        "WARNING",
        log_level,
        "level of transition, force, release and lapse lines",
        "baldur.E053",
        accepts="A level name: DEBUG, INFO, WARNING, ERROR or CRITICAL.",
    ),
    Knob(
        "BALDUR_META_WATCHDOG_SLACK_WEBHOOK_URL",
        None,
        https_url,
        "Slack incoming webhook that gets every breaker's opens, closes, forces and resets, not only the "
        "meta-watchdog's (the name is historical)",
        "baldur.E054",
        accepts="The https:// URL Slack gave you for the incoming webhook.",
        secret=True,
    ),
    # ------------------------------------------------------------ watchdog, propagation, Emergency Mode
    Knob(
        "BALDUR_META_WATCHDOG_AUTO_RECOVERY_ENABLED",
        False,
        flag,
        "force-close breakers stuck OPEN",
        "baldur.E055",
        accepts=BOOL_ACCEPTS,
    ),
    Knob(
        "BALDUR_META_WATCHDOG_STUCK_OPEN_SECONDS",
        300,
        number(minimum=0, exclusive=True, unit=SECONDS),
        "OPEN this long counts as stuck, seconds",
        "baldur.E056",
    ),
    Knob(
        "BALDUR_CB_CLUSTER_STATE_PROPAGATION_ENABLED",
        False,
        flag,
        "publish OPEN/CLOSED decisions to peers over Redis pub/sub",
        "baldur.E057",
        accepts=BOOL_ACCEPTS,
    ),
    Knob("BALDUR_EMERGENCY_BACKEND", "file", choice("file", "redis"), "where the emergency level lives", "baldur.E058"),
    Knob(
        "BALDUR_EMERGENCY_STATE_FILE",
        None,
        text_value(optional=True),
        "file backend path; unset: a file of this project's own in the system temp directory",
        "baldur.E059",
        accepts="A file path the worker processes may write, or unset.",
    ),
    Knob(
        "BALDUR_EMERGENCY_CACHE_SECONDS",
        30,
        number(minimum=0, unit=SECONDS),
        "how long a process caches the level, seconds",
        "baldur.E060",
    ),
    Knob(
        "BALDUR_EMERGENCY_AUTO_ACTIVATION_ENABLED",
        False,
        flag,
        "declare Level 3 when most breakers are OPEN",
        "baldur.E061",
        accepts=BOOL_ACCEPTS,
    ),
    Knob(
        "BALDUR_EMERGENCY_AUTO_ACTIVATION_RATIO",
        70.0,
        number(minimum=0, maximum=100, unit=PERCENT),
        "OPEN percentage for auto-activation",
        "baldur.E062",
    ),
    Knob(
        "BALDUR_EMERGENCY_AUTO_ACTIVATION_MIN_BREAKERS",
        3,
        number(integer=True, minimum=1),
        "registered breakers needed",
        "baldur.E063",
    ),
    Knob(
        "BALDUR_EMERGENCY_AUTO_ACTIVATION_MINUTES",
        30,
        number(minimum=0, exclusive=True, unit="minutes"),
        "length of an automatic Level 3, minutes",
        "baldur.E064",
    ),
    Knob(
        "BALDUR_EMERGENCY_STABILIZATION_SECONDS",
        300,
        number(minimum=0, unit=SECONDS),
        "quiet time after a freeze ends, seconds",
        "baldur.E065",
    ),
    # ------------------------------------------------------------ health endpoint (contrib.health)
    Knob(
        "BALDUR_HEALTH_CRITICAL_SERVICES",
        [],
        service_names,
        "breakers whose OPEN state makes the health endpoint answer 503",
        "baldur.E072",
        accepts="A list of breaker names; in the environment 'payments,search' or '[\"payments\"]'.",
    ),
    Knob(
        "BALDUR_HEALTH_DETAILS",
        False,
        flag,
        "show every breaker's state to any caller of the health endpoint, not only to staff",
        "baldur.E073",
        accepts=BOOL_ACCEPTS,
    ),
    # ------------------------------------------------------------ OpenTelemetry (contrib.otel)
    Knob(
        "BALDUR_OTEL_ENABLED",
        False,
        flag,
        "report the breakers to OpenTelemetry (instruments and span events)",
        "baldur.E074",
        accepts=BOOL_ACCEPTS,
    ),
    Knob(
        "BALDUR_OTEL_SPANS",
        False,
        flag,
        "run each protected call in an OpenTelemetry span of its own",
        "baldur.E075",
        accepts=BOOL_ACCEPTS,
    ),
]

#: name -> :class:`Knob`; the single source of defaults.
KNOBS: dict[str, Knob] = {row.name: row for row in _ROWS}

# ------------------------------------------------------------------ derived from the rows

#: Per-call override / ``BALDUR_SERVICES`` key -> the global knob it overrides.
OVERRIDE_KEYS: dict[str, str] = {row.key: row.name for row in _ROWS if row.key is not None}

#: Keys a ``BALDUR_SERVICES`` entry (or a per-call override) may set, with the parser each uses.
SERVICE_KEYS: dict[str, Parser] = {row.key: row.parse for row in _ROWS if row.key is not None}

#: Knob name -> the system check id of a bad value (``baldur.E0xx``).
CHECK_IDS: dict[str, str] = {row.name: row.check_id for row in _ROWS}

#: Knobs whose value is never shown.
SECRETS: frozenset[str] = frozenset(row.name for row in _ROWS if row.secret)

#: Knobs that are read and validated but whose feature is not built yet (a value has no effect).
RESERVED: tuple[str, ...] = tuple(row.name for row in _ROWS if row.reserved)


def parse(name: str, value: Any = _MISSING, *, from_env: bool = False) -> Any:
    """Parse *value* for the knob *name* (its default when omitted). Raises ConfigError."""
    knob = KNOBS[name]
    return knob.coerce(knob.default if value is _MISSING else value, from_env)


def closest_knob(name: str) -> str | None:
    """Return the known knob a misspelt ``BALDUR_*`` name most likely meant, or None."""
    near = difflib.get_close_matches(name, KNOBS, n=1, cutoff=0.6)
    return near[0] if near else None

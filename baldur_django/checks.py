"""System checks for ``BALDUR_*`` settings and the limiter's cache.

Every bad value is an Error with a stable id per setting (``baldur.E010`` ...), a message
that starts with ``NAME=value`` and a hint saying what the setting is and what it accepts.
Ids, hint texts, secrets and reserved knobs all come from the rows of the knobs table.
Values are parsed by the same :mod:`baldur_django.core.knobs` validators the core uses, so
a check error and a :class:`~baldur_django.core.errors.ConfigError` read the same. The
Slack webhook URL is a secret and never appears in a message or a hint, and a password in
a Redis URL is masked.

Registered checks (all tagged ``baldur``, so ``manage.py check --tag baldur`` runs them):

* :func:`check_settings` - every knob, Django setting first, then the environment;
  ``minimum_calls`` against the window and ``recovery_timeout_max`` against the recovery
  timeout; reserved knobs (their feature is not built yet) that are set; misspelt
  ``BALDUR_*`` names (Django settings and environment variables) as warnings naming the
  closest known setting.
* :func:`check_rate_limit_cache` (also tagged ``caches``) - ``RateLimitMiddleware`` needs a
  cache alias that exists and is shared by every worker process.
* :func:`check_deployment` (``deploy=True``, ``manage.py check --deploy``) - the memory
  backend gives each worker process breakers of its own.
"""

from __future__ import annotations

import os
from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Error, Tags, Warning, register

from .conf import closest_setting, django_lookup, format_default, redact
from .core.config import MISSING, SettingsSource, import_reference
from .core.docpages import see, see_setting
from .core.errors import ConfigError
from .core.knobs import CHECK_IDS, KNOBS, PREDICATE_KEYS, RESERVED, is_exception_type, is_predicate

__all__ = ["Codes", "KNOB_IDS", "check_settings", "check_rate_limit_cache", "check_deployment"]

_PREFIX = "BALDUR_"
RATE_LIMIT_MIDDLEWARE = "baldur_django.middleware.RateLimitMiddleware"


class Codes:
    """Ids of the checks that are not about a single knob's value."""

    INVALID_VALUE = "baldur.E001"  # a knob without an id of its own in KNOB_IDS
    MINIMUM_ABOVE_WINDOW = "baldur.E002"
    SERVICE_MINIMUM_ABOVE_WINDOW = "baldur.E003"
    RATE_LIMIT_CACHE_MISSING = "baldur.E004"
    UNREADABLE_VALUE = "baldur.E005"  # a validator failed unexpectedly (a bug): still reported, never a traceback
    REDIS_NOT_CONFIGURED = "baldur.E006"
    RECOVERY_MAX_BELOW_TIMEOUT = "baldur.E007"
    SERVICE_RECOVERY_MAX_BELOW_TIMEOUT = "baldur.E008"
    PROPAGATION_WITHOUT_REDIS = "baldur.E009"
    UNKNOWN_SETTING = "baldur.E090"  # a BALDUR_* Django setting the package does not know (a typo)
    UNKNOWN_ENV = "baldur.W002"
    MINIMUM_FOLLOWS_WINDOW = "baldur.W003"
    MEMORY_BACKEND = "baldur.W004"
    RATE_LIMIT_CACHE_NOT_SHARED = "baldur.W005"
    RESERVED_SETTING = "baldur.W006"
    BACKOFF_CANNOT_GROW = "baldur.W007"
    REDIS_CLUSTER_WITHOUT_URL = "baldur.E070"
    REDIS_CLUSTER_BAD_URL = "baldur.E071"
    PROPAGATION_LIFTS_FORCES = "baldur.W010"
    PREDICATE_NOT_IMPORTABLE = "baldur.E080"  # a BALDUR_SERVICES predicate path that cannot be imported
    PREDICATE_NOT_CALLABLE = "baldur.E081"  # ... that names something that is not a function
    HEALTH_DETAILS_PUBLIC = "baldur.W011"


#: One fixed error id per knob (``baldur.E0xx``), so a log search or
#: ``SILENCED_SYSTEM_CHECKS`` entry keeps meaning the same setting when knobs are added.
#: Derived from the ``check_id`` of each row of the knobs table (never renumber; append).
KNOB_IDS: dict[str, str] = CHECK_IDS

# What a valid value looks like, per knob (derived from the knobs table).
_ACCEPTS: dict[str, str] = {name: knob.accepted_values() for name, knob in KNOBS.items()}


def _hint(name: str, from_env: bool) -> str:
    knob = KNOBS[name]
    accepts = _ACCEPTS.get(name, "")
    where = "the environment variable" if from_env else "the Django setting"
    text = f"{name}: {knob.help}; default {format_default(name)}."
    if accepts:
        text += " " + accepts
    text += f" Fix {where}, or remove it to use the default. {see_setting(name)}"
    return redact(text)


def _source() -> SettingsSource:
    # a private resolver: the checks never touch the process-wide cache
    return SettingsSource(lookup=django_lookup)


def _defined_settings() -> list[str]:
    return [name for name in dir(settings) if name.startswith(_PREFIX)]


@register("baldur")
def check_settings(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """Validate every ``BALDUR_*`` knob and flag misspelt names.

    Each knob is resolved as the package resolves it (Django setting, else environment
    variable, else default) and parsed by the core's validator.

    Returns:
        list[CheckMessage]: an Error per bad value (``KNOB_IDS[name]``), E002/W003 for
        ``BALDUR_CB_MINIMUM_CALLS`` above ``BALDUR_CB_SLIDING_WINDOW_SIZE`` (count-based
        window only), E003 for a ``BALDUR_SERVICES`` entry whose ``minimum_calls`` is
        above its count-based window, E007 for ``BALDUR_CB_RECOVERY_TIMEOUT_MAX`` set below
        ``BALDUR_CB_RECOVERY_TIMEOUT``, E008 for a ``BALDUR_SERVICES`` entry whose
        ``recovery_timeout_max`` is below its recovery timeout, W007 when a recovery
        backoff is asked for but the default cap is below the timeout, E090 for
        an unknown ``BALDUR_*`` Django setting, W002 for an unknown ``BALDUR_*``
        environment variable close to a known name, W006 for a reserved knob (feature not
        built yet) set to anything but its default, E006 for the redis backend with
        neither a URL nor a django-redis cache alias, E040 for a dotted-path
        ``BALDUR_STATE_BACKEND`` that cannot be imported or is not a store class, E070 for ``BALDUR_REDIS_CLUSTER``
        without ``BALDUR_REDIS_URL`` and E071 for a cluster URL that is a socket or names
        a database other than 0, E009 for cluster propagation switched on with
        neither a URL nor a django-redis cache alias, and W010 for cluster propagation on
        the memory backend, where a peer's CLOSED lifts an operator's force, E080
        for a ``BALDUR_SERVICES`` predicate path (``ignore_exceptions``,
        ``failure_predicate``, ``result_predicate``) that cannot be imported and E081 for
        one that names something that is not callable. Never raises.
    """
    messages: list[CheckMessage] = []
    source = _source()
    values: dict[str, Any] = {}
    for name in KNOBS:
        from_env = django_lookup(name) is MISSING and name in os.environ
        try:
            values[name] = source.get(name)
        except ConfigError as exc:
            text = redact(str(exc)) + (" (from the environment variable)" if from_env else "")
            messages.append(Error(text, hint=_hint(name, from_env), id=KNOB_IDS.get(name, Codes.INVALID_VALUE)))
        except Exception as exc:  # a validator bug must still read as a check, not a traceback
            shown = "value not shown" if KNOBS[name].secret else redact(type(exc).__name__ + ": " + str(exc))
            messages.append(
                Error(
                    f"{name} could not be read ({shown})",
                    hint=_hint(name, from_env) + " Please also report this as a baldur_django bug.",
                    id=Codes.UNREADABLE_VALUE,
                )
            )
    messages.extend(_check_minimum_calls(source, values))
    messages.extend(_check_recovery_timeout_max(source, values))
    messages.extend(_check_redis_backend(values))
    messages.extend(_check_store_class(values))
    messages.extend(_check_redis_cluster(values))
    messages.extend(_check_propagation(values))
    messages.extend(_check_reserved(values))
    messages.extend(_check_predicates(values))
    messages.extend(_check_unknown_names())
    return messages


_PREDICATE_HINTS = {
    "ignore_exceptions": "a list of dotted import paths, each naming an exception class (ignored with its "
    "subclasses) or a function f(exc) -> bool (True: ignored)",
    "failure_predicate": "the dotted import path of a function f(exc) -> bool: True counts the exception "
    "as a failure, False ignores it",
    "result_predicate": "the dotted import path of a function f(value) -> bool: True records the returned "
    "value as a failure",
}


def _check_predicates(values: dict[str, Any]) -> list[CheckMessage]:
    # the dotted paths of BALDUR_SERVICES are imported here, as the first breaker of
    # the service would import them, so a typo reads as a check error at startup
    services = values.get("BALDUR_SERVICES")
    if not isinstance(services, dict):
        return []  # a bad value was already reported
    out: list[CheckMessage] = []
    for service, entry in services.items():
        for key in PREDICATE_KEYS:
            if key not in entry:
                continue
            where = f"BALDUR_SERVICES[{service!r}][{key!r}]"
            hint = (
                f"{where} must be {_PREDICATE_HINTS[key]}, for example 'myapp.breakers.is_outage'. Check the "
                "spelling and that the module is importable from the project (on the Python path). "
                + see_setting("BALDUR_SERVICES")
            )
            items = entry[key] if key == "ignore_exceptions" else (entry[key],)
            for item in items:
                try:
                    value = import_reference(where, item)
                except ConfigError as exc:
                    out.append(Error(redact(str(exc)), hint=hint, id=Codes.PREDICATE_NOT_IMPORTABLE))
                    continue
                good = is_predicate(value) or (key == "ignore_exceptions" and is_exception_type(value))
                if not good:
                    what = "a class that is not an exception" if isinstance(value, type) else "not callable"
                    out.append(
                        Error(
                            f"{where}={item!r} names {value!r}, which is {what}",
                            hint=hint,
                            id=Codes.PREDICATE_NOT_CALLABLE,
                        )
                    )
    return out


def _is_defined(name: str) -> bool:
    """The knob is set as a Django setting or an environment variable (not left to its default)."""
    return django_lookup(name) is not MISSING or name in os.environ


def _check_reserved(values: dict[str, Any]) -> list[CheckMessage]:
    # a reserved knob is validated like any other, but its feature does not exist yet:
    # a value other than the default asks for something that will not happen
    out: list[CheckMessage] = []
    for name in RESERVED:
        if name not in values or not _is_defined(name):
            continue  # a bad value was already reported; an unset knob asks for nothing
        knob = KNOBS[name]
        value = values[name]
        if value == knob.coerce(knob.default):
            continue  # the default is what the package does anyway
        from_env = django_lookup(name) is MISSING
        shown = "(value not shown)" if knob.secret else f"={value!r}"
        out.append(
            Warning(
                redact(
                    f"{name}{shown} has no effect: the feature behind it is not built yet"
                    + (" (from the environment variable)" if from_env else "")
                ),
                hint=redact(
                    f"{name} ({knob.help}) is reserved: baldur_django already reads and validates it, but this "
                    f"version does not act on it. Remove it, or set it to its default {format_default(name)}, "
                    "to silence this warning. " + see_setting(name)
                ),
                id=Codes.RESERVED_SETTING,
            )
        )
    return out


def _redis_alias_problem(values: dict[str, Any]) -> str | None:
    """What keeps the package from reaching Redis when no URL is set: None when a URL is
    set, when the django-redis alias is usable, or when a bad value was already reported."""
    if values.get("BALDUR_REDIS_URL"):
        return None
    if values.get("BALDUR_REDIS_CLUSTER"):
        return None  # a cluster needs the URL whatever the alias: E070 says so
    if "BALDUR_REDIS_URL" not in values or "BALDUR_REDIS_CACHE_ALIAS" not in values:
        return None  # the bad value itself was already reported
    alias = values["BALDUR_REDIS_CACHE_ALIAS"]
    caches = getattr(settings, "CACHES", None) or {}
    backend = str((caches.get(alias) or {}).get("BACKEND", ""))
    if alias in caches and backend.startswith("django_redis."):
        return None
    problem = (
        "names no cache in CACHES" if alias not in caches else f"is a {backend or 'cache'}, not a django-redis cache"
    )
    return f"BALDUR_REDIS_CACHE_ALIAS={alias!r} {problem}"


def _check_store_class(values: dict[str, Any]) -> list[CheckMessage]:
    # a dotted BALDUR_STATE_BACKEND must import and name a store class; the class is
    # not called here (building a store may connect)
    from .backends import BUNDLED_BACKENDS, store_class

    path = values.get("BALDUR_STATE_BACKEND")
    if not isinstance(path, str) or path in BUNDLED_BACKENDS:
        return []
    try:
        store_class(path)
    except ConfigError as exc:
        from_env = django_lookup("BALDUR_STATE_BACKEND") is MISSING
        text = str(exc) + (" (from the environment variable)" if from_env else "")
        return [Error(text, hint=_hint("BALDUR_STATE_BACKEND", from_env), id=KNOB_IDS["BALDUR_STATE_BACKEND"])]
    return []


def _check_redis_backend(values: dict[str, Any]) -> list[CheckMessage]:
    # the redis backend needs a URL, or a django-redis cache whose connection it can borrow
    if values.get("BALDUR_STATE_BACKEND") != "redis":
        return []
    problem = _redis_alias_problem(values)
    if problem is None:
        return []
    return [
        Error(
            f"BALDUR_STATE_BACKEND='redis' without BALDUR_REDIS_URL, and {problem}",
            hint="Set BALDUR_REDIS_URL (for example redis://127.0.0.1:6379/0), or point BALDUR_REDIS_CACHE_ALIAS "
            "at a cache whose BACKEND is django_redis.cache.RedisCache.",
            id=Codes.REDIS_NOT_CONFIGURED,
        )
    ]


def _check_redis_cluster(values: dict[str, Any]) -> list[CheckMessage]:
    # a cluster is reached through BALDUR_REDIS_URL only (django-redis has no cluster client)
    if not values.get("BALDUR_REDIS_CLUSTER") or "BALDUR_REDIS_URL" not in values:
        return []  # off, or the URL's bad value was already reported
    url = values["BALDUR_REDIS_URL"]
    if not url:
        return [
            Error(
                "BALDUR_REDIS_CLUSTER=True without BALDUR_REDIS_URL",
                hint="Set BALDUR_REDIS_URL to one node of the Redis Cluster, for example "
                "redis://10.0.0.5:6379/0: the client discovers the others. A django-redis cache alias "
                "(BALDUR_REDIS_CACHE_ALIAS) cannot be used, its client does not speak the cluster protocol. "
                + see("Running a fleet", "Redis Cluster"),
                id=Codes.REDIS_CLUSTER_WITHOUT_URL,
            )
        ]
    from .core.stores.redis import ClusterClient

    try:
        ClusterClient(url)  # validates the URL; connects to nothing
    except ConfigError as exc:
        return [
            Error(
                redact(str(exc)),
                hint="A Redis Cluster is reached over TCP and has only database 0: use a redis:// or rediss:// "
                "URL of one node, such as redis://10.0.0.5:6379/0. " + see("Running a fleet", "Redis Cluster"),
                id=Codes.REDIS_CLUSTER_BAD_URL,
            )
        ]
    return []


def _check_propagation(values: dict[str, Any]) -> list[CheckMessage]:
    # propagation talks over Redis pub/sub whatever the state backend is
    if not values.get("BALDUR_CB_CLUSTER_STATE_PROPAGATION_ENABLED"):
        return []
    problem = _redis_alias_problem(values)
    if problem is not None:
        return [
            Error(
                f"BALDUR_CB_CLUSTER_STATE_PROPAGATION_ENABLED=True without BALDUR_REDIS_URL, and {problem}",
                hint="Cluster propagation publishes each OPEN and CLOSED decision on Redis pub/sub, whatever "
                "BALDUR_STATE_BACKEND is. Set BALDUR_REDIS_URL (for example redis://127.0.0.1:6379/0), or point "
                "BALDUR_REDIS_CACHE_ALIAS at a cache whose BACKEND is django_redis.cache.RedisCache.",
                id=Codes.PROPAGATION_WITHOUT_REDIS,
            )
        ]
    # The force hazard: on the memory backend a force exists only in the process that
    # received it (the admin page's worker, a call in code); its peers still judge on
    # their own, and the first of them to close publishes a CLOSED that lifts the force.
    # A shared store keeps the force in the shared record, where no peer's automatic
    # close can overrule it and from which a worker takes it back on its next call.
    if values.get("BALDUR_STATE_BACKEND") != "memory":
        return []
    return [
        Warning(
            "BALDUR_CB_CLUSTER_STATE_PROPAGATION_ENABLED=True with BALDUR_STATE_BACKEND='memory': a peer's CLOSED "
            "lifts a force held by one worker",
            hint="On the memory backend a force lives only in the process that received it. The other workers "
            "keep judging for themselves, and when one of them closes its breaker the CLOSED it publishes is "
            "applied over the force. To make forces hold, use the 'database' or 'redis' backend (the force is "
            "then kept in the shared record) or leave propagation off. Silence baldur.W010 if you never force "
            "breakers. " + see("Running a fleet", "Cluster propagation"),
            id=Codes.PROPAGATION_LIFTS_FORCES,
        )
    ]


def _check_minimum_calls(source: SettingsSource, values: dict[str, Any]) -> list[CheckMessage]:
    out: list[CheckMessage] = []
    window_name, minimum_name = "BALDUR_CB_SLIDING_WINDOW_SIZE", "BALDUR_CB_MINIMUM_CALLS"
    if window_name not in values or minimum_name not in values:
        return out  # the bad value itself was already reported
    window, minimum = values[window_name], values[minimum_name]
    window_type = values.get("BALDUR_CB_SLIDING_WINDOW_TYPE", "count")
    # a time window counts minimum_calls over its seconds: the window size does not bound it
    if window_type == "count" and minimum > window:
        if source.source(minimum_name) != "default":
            out.append(
                Error(
                    f"{minimum_name}={minimum!r} is above {window_name}={window!r}",
                    hint=(
                        f"The failure-rate trigger waits for {minimum_name} outcomes, but the window only "
                        f"holds {window_name}: it could never fire. Lower {minimum_name} to at most {window}."
                    ),
                    id=Codes.MINIMUM_ABOVE_WINDOW,
                )
            )
        else:
            out.append(
                Warning(
                    f"{minimum_name} (default {minimum!r}) is above {window_name}={window!r}",
                    hint=f"The rate trigger will wait for a full window of {window} outcomes. Set {minimum_name} "
                    f"to at most {window} to say so explicitly.",
                    id=Codes.MINIMUM_FOLLOWS_WINDOW,
                )
            )
    services = values.get("BALDUR_SERVICES")
    if isinstance(services, dict):
        for service, entry in services.items():
            if "minimum_calls" not in entry:
                continue  # a global minimum follows a narrower per-service window
            if entry.get("sliding_window_type", window_type) != "count":
                continue
            service_window = entry.get("sliding_window_size", window)
            if entry["minimum_calls"] > service_window:
                out.append(
                    Error(
                        f"BALDUR_SERVICES[{service!r}]: minimum_calls={entry['minimum_calls']!r} is above "
                        f"sliding_window_size={service_window!r}",
                        hint=f"Lower minimum_calls for {service!r} to at most {service_window}, or widen its window; "
                        "otherwise its failure-rate trigger could never fire.",
                        id=Codes.SERVICE_MINIMUM_ABOVE_WINDOW,
                    )
                )
    return out


def _check_recovery_timeout_max(source: SettingsSource, values: dict[str, Any]) -> list[CheckMessage]:
    # the backed-off open duration is capped at recovery_timeout_max; the rules
    # mirror build_config (an explicit cap below a timeout given as or less specifically
    # is an error, otherwise the cap follows the timeout)
    out: list[CheckMessage] = []
    timeout_name, cap_name = "BALDUR_CB_RECOVERY_TIMEOUT", "BALDUR_CB_RECOVERY_TIMEOUT_MAX"
    factor_name = "BALDUR_CB_RECOVERY_BACKOFF_FACTOR"
    if timeout_name not in values or cap_name not in values or factor_name not in values:
        return out  # the bad value itself was already reported
    timeout, cap, factor = values[timeout_name], values[cap_name], values[factor_name]
    if cap < timeout:
        if source.source(cap_name) != "default":
            out.append(
                Error(
                    f"{cap_name}={cap!r} is below {timeout_name}={timeout!r}",
                    hint=f"{cap_name} caps how long a breaker stays OPEN as the recovery timeout backs off "
                    f"({factor_name}); a cap below the timeout itself would shorten every open. "
                    f"Raise {cap_name} to at least {timeout:g}, or lower {timeout_name}.",
                    id=Codes.RECOVERY_MAX_BELOW_TIMEOUT,
                )
            )
        elif factor > 1:
            out.append(_backoff_cannot_grow(cap_name, cap, timeout_name, timeout, factor_name, factor))
    services = values.get("BALDUR_SERVICES")
    if isinstance(services, dict):
        for service, entry in services.items():
            entry_timeout = entry.get("recovery_timeout", timeout)
            entry_factor = entry.get("recovery_backoff_factor", factor)
            where = f"BALDUR_SERVICES[{service!r}]"
            if "recovery_timeout_max" in entry:
                if entry["recovery_timeout_max"] < entry_timeout:
                    out.append(
                        Error(
                            f"{where}: recovery_timeout_max={entry['recovery_timeout_max']!r} is below "
                            f"recovery_timeout={entry_timeout!r}",
                            hint=f"Raise recovery_timeout_max for {service!r} to at least {entry_timeout:g}, or "
                            "lower its recovery_timeout; a cap below the timeout would shorten every open.",
                            id=Codes.SERVICE_RECOVERY_MAX_BELOW_TIMEOUT,
                        )
                    )
            elif "recovery_timeout" in entry and cap < entry_timeout and entry_factor > 1:
                out.append(
                    _backoff_cannot_grow(
                        cap_name, cap, f"{where}['recovery_timeout']", entry_timeout, "the backoff factor", entry_factor
                    )
                )
    return out


def _backoff_cannot_grow(
    cap_name: str, cap: float, timeout_name: str, timeout: float, factor_name: str, factor: float
) -> CheckMessage:
    return Warning(
        f"{cap_name}={cap!r} is below {timeout_name}={timeout!r}, so {factor_name}={factor!r} cannot lengthen an open",
        hint=f"The cap follows the timeout: every open lasts {timeout:g} seconds and the recovery backoff does "
        f"nothing. Set {cap_name} above {timeout:g} to let it grow, or set the factor to 1.0 to say it is off.",
        id=Codes.BACKOFF_CANNOT_GROW,
    )


def _check_unknown_names() -> list[CheckMessage]:
    out: list[CheckMessage] = []
    for name in sorted(_defined_settings()):
        if name in KNOBS:
            continue
        near = closest_setting(name)
        out.append(
            Error(
                f"Unknown setting {name}" + (f"; did you mean {near}?" if near else ": baldur_django does not read it"),
                hint="A misspelt setting would silently leave the default in force, so it stops the start. Fix the "
                "name (every known one is listed on the Settings page of the documentation), or, if another tool "
                f"owns it, add '{Codes.UNKNOWN_SETTING}' to SILENCED_SYSTEM_CHECKS.",
                id=Codes.UNKNOWN_SETTING,
            )
        )
    for name in sorted(os.environ):
        if not name.startswith(_PREFIX) or name in KNOBS:
            continue
        near = closest_setting(name)
        if near is None:
            continue  # far from every knob: presumably some other tool's variable
        out.append(
            Warning(
                f"Unknown environment variable {name}; did you mean {near}?",
                hint="baldur_django ignores environment variables it does not know, so this value has no "
                "effect. Every known name is listed on the Settings reference page of the documentation.",
                id=Codes.UNKNOWN_ENV,
            )
        )
    return out


def _uses_rate_limit_middleware() -> bool:
    return any(entry == RATE_LIMIT_MIDDLEWARE for entry in getattr(settings, "MIDDLEWARE", None) or ())


# Backends whose counters are private to one process (or not kept at all).
_NOT_SHARED = {
    "django.core.cache.backends.locmem.LocMemCache": "keeps its counters inside each worker process",
    "django.core.cache.backends.dummy.DummyCache": "stores nothing, so no limit is ever reached",
    "django.core.cache.backends.filebased.FileBasedCache": "is not shared across hosts and its counters are not atomic",
}


@register(Tags.caches, "baldur")
def check_rate_limit_cache(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """The inbound limiter's cache must exist and be shared by every worker.

    Only when ``baldur_django.middleware.RateLimitMiddleware`` is in ``MIDDLEWARE``.

    Returns:
        list[CheckMessage]: E004 when ``BALDUR_RATE_LIMIT_CACHE_ALIAS`` names no cache in
        ``CACHES``; W005 when that cache is per process (locmem), a dummy cache, or the
        file-based cache. Never raises.
    """
    if not _uses_rate_limit_middleware():
        return []
    try:
        alias = _source().get("BALDUR_RATE_LIMIT_CACHE_ALIAS")
    except ConfigError:
        return []  # reported by check_settings
    caches = getattr(settings, "CACHES", None) or {}
    if alias not in caches:
        return [
            Error(
                f"BALDUR_RATE_LIMIT_CACHE_ALIAS={alias!r} names no cache in CACHES",
                hint=f"Add a {alias!r} entry to CACHES (a cache shared by every worker, such as Redis), "
                f"or point BALDUR_RATE_LIMIT_CACHE_ALIAS at an existing alias: {', '.join(map(repr, caches)) or 'none defined'}.",
                id=Codes.RATE_LIMIT_CACHE_MISSING,
            )
        ]
    backend = str((caches.get(alias) or {}).get("BACKEND", ""))
    problem = _NOT_SHARED.get(backend)
    if problem is None:
        return []
    return [
        Warning(
            f"BALDUR_RATE_LIMIT_CACHE_ALIAS={alias!r} uses {backend}, which {problem}",
            hint="RateLimitMiddleware counts requests in this cache; with several worker processes each would "
            "allow the full rate. Use a cache every worker shares (Redis or Memcached).",
            id=Codes.RATE_LIMIT_CACHE_NOT_SHARED,
        )
    ]


@register("baldur", deploy=True)
def check_deployment(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """``manage.py check --deploy``: warn that the memory backend is per process, and
    that the health endpoint shows its details to anyone.

    Returns:
        list[CheckMessage]: W004 when ``BALDUR_STATE_BACKEND`` is ``"memory"``. Silence it
        with ``SILENCED_SYSTEM_CHECKS = ["baldur.W004"]`` when you run one worker process.
        W011 when ``BALDUR_HEALTH_DETAILS`` is on.
    """
    messages: list[CheckMessage] = []
    try:
        details = _source().get("BALDUR_HEALTH_DETAILS")
    except ConfigError:
        details = False  # reported by check_settings
    if details:
        messages.append(
            Warning(
                "BALDUR_HEALTH_DETAILS=True: the health endpoint shows every breaker's state to anonymous callers",
                hint="Breaker names tell an outsider which dependencies you have and which are failing. Leave "
                "it off (staff users still see the details) unless the endpoint is reachable only from "
                "inside your network; then silence baldur.W011.",
                id=Codes.HEALTH_DETAILS_PUBLIC,
            )
        )
    try:
        backend = _source().get("BALDUR_STATE_BACKEND")
    except ConfigError:
        return messages  # reported by check_settings
    if backend != "memory":
        return messages
    messages.append(
        Warning(
            "BALDUR_STATE_BACKEND='memory': every worker process keeps breakers of its own",
            hint="Each worker must see its own failures before it trips, probes on its own, and forces or "
            "admin actions reach only the process that receives them. With several workers use "
            "'database' or 'redis'; with exactly one, silence baldur.W004.",
            id=Codes.MEMORY_BACKEND,
        )
    )
    return messages

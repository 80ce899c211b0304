"""System checks for ``BALDUR_*`` settings and the limiter's cache (CFG-3, IN-4).

Every bad value is an Error with a stable id per setting (``baldur.E010`` ...), a message
that starts with ``NAME=value`` and a hint saying what the setting is and what it accepts.
Values are parsed by the same :mod:`baldur_django.core.knobs` validators the core uses, so
a check error and a :class:`~baldur_django.core.errors.ConfigError` read the same. The
Slack webhook URL is a secret and never appears in a message or a hint, and a password in
a Redis URL is masked.

Registered checks (all tagged ``baldur``, so ``manage.py check --tag baldur`` runs them):

* :func:`check_settings` - every knob, Django setting first, then the environment;
  ``minimum_calls`` against the window; misspelt ``BALDUR_*`` names (Django settings and
  environment variables) as warnings naming the closest known setting.
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
from .core.config import MISSING, SettingsSource
from .core.errors import ConfigError
from .core.knobs import KNOBS, SERVICE_KEYS

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
    UNKNOWN_SETTING = "baldur.W001"
    UNKNOWN_ENV = "baldur.W002"
    MINIMUM_FOLLOWS_WINDOW = "baldur.W003"
    MEMORY_BACKEND = "baldur.W004"
    RATE_LIMIT_CACHE_NOT_SHARED = "baldur.W005"


#: One fixed error id per knob, so a log search or ``SILENCED_SYSTEM_CHECKS`` entry keeps
#: meaning the same setting when knobs are added (never renumber; append new ones).
KNOB_IDS: dict[str, str] = {
    "BALDUR_CB_FAILURE_THRESHOLD": "baldur.E010",
    "BALDUR_CB_FAILURE_RATE_THRESHOLD": "baldur.E011",
    "BALDUR_CB_SLIDING_WINDOW_SIZE": "baldur.E012",
    "BALDUR_CB_SLIDING_WINDOW_TYPE": "baldur.E013",
    "BALDUR_CB_SLIDING_WINDOW_SECONDS": "baldur.E014",
    "BALDUR_CB_MINIMUM_CALLS": "baldur.E015",
    "BALDUR_CB_RECOVERY_TIMEOUT": "baldur.E016",
    "BALDUR_CB_HALF_OPEN_MAX_CALLS": "baldur.E017",
    "BALDUR_CB_RECOVERY_BACKOFF_FACTOR": "baldur.E018",
    "BALDUR_CB_RECOVERY_TIMEOUT_MAX": "baldur.E019",
    "BALDUR_CB_SLOW_CALL_DURATION_SECONDS": "baldur.E020",
    "BALDUR_CB_SLOW_CALL_RATE_THRESHOLD": "baldur.E021",
    "BALDUR_SERVICES": "baldur.E022",
    "BALDUR_MIDDLEWARE_CB_STATUS_CODES": "baldur.E023",
    "BALDUR_MIDDLEWARE_RATE_LIMIT_CODES": "baldur.E024",
    "BALDUR_CB_RATE_LIMIT_CASCADE_THRESHOLD": "baldur.E025",
    "BALDUR_CB_RATE_LIMIT_CASCADE_WINDOW_SECONDS": "baldur.E026",
    "BALDUR_CB_RATE_LIMIT_CASCADE_MIN_RATIO": "baldur.E027",
    "BALDUR_CB_RATE_LIMIT_CASCADE_MIN_CALLS": "baldur.E028",
    "BALDUR_RATE_LIMIT_DEFAULT_COOLDOWN_SECONDS": "baldur.E029",
    "BALDUR_RATE_LIMIT_MAX_COOLDOWN_SECONDS": "baldur.E030",
    "BALDUR_MAX_COOLDOWN_WAIT_SECONDS": "baldur.E031",
    "BALDUR_CB_MANUAL_OVERRIDE_TTL_MINUTES": "baldur.E032",
    "BALDUR_DOMAIN_MAPPING": "baldur.E033",
    "BALDUR_DOMAIN_DEFAULT": "baldur.E034",
    "BALDUR_MIDDLEWARE_SHED_LOAD": "baldur.E035",
    "BALDUR_RATE_LIMIT_CACHE_ALIAS": "baldur.E036",
    "BALDUR_RATE_LIMIT_RULES": "baldur.E037",
    "BALDUR_RATE_LIMIT_TRUST_FORWARDED_FOR": "baldur.E038",
    "BALDUR_RATE_LIMIT_TRUSTED_PROXIES": "baldur.E039",
    "BALDUR_STATE_BACKEND": "baldur.E040",
    "BALDUR_REDIS_URL": "baldur.E041",
    "BALDUR_REDIS_CACHE_ALIAS": "baldur.E042",
    "BALDUR_REDIS_SOCKET_TIMEOUT": "baldur.E043",
    "BALDUR_REDIS_MAX_CONNECTIONS": "baldur.E044",
    "BALDUR_STORE_WARNING_INTERVAL_SECONDS": "baldur.E045",
    "BALDUR_CB_SYNC_INTERVAL_SECONDS": "baldur.E046",
    "BALDUR_CB_HALF_OPEN_PROBE_LEASE_SECONDS": "baldur.E047",
    "BALDUR_REGISTRY_TTL_DAYS": "baldur.E048",
    "BALDUR_TASK_RECOVERY_SWEEP_SECONDS": "baldur.E049",
    "BALDUR_TASK_STATE_SYNC_SECONDS": "baldur.E050",
    "BALDUR_TASK_EMERGENCY_CHECK_SECONDS": "baldur.E051",
    "BALDUR_DRY_RUN": "baldur.E052",
    "BALDUR_EVENT_LOGGING_CB_LOG_LEVEL": "baldur.E053",
    "BALDUR_META_WATCHDOG_SLACK_WEBHOOK_URL": "baldur.E054",
    "BALDUR_META_WATCHDOG_AUTO_RECOVERY_ENABLED": "baldur.E055",
    "BALDUR_META_WATCHDOG_STUCK_OPEN_SECONDS": "baldur.E056",
    "BALDUR_CB_CLUSTER_STATE_PROPAGATION_ENABLED": "baldur.E057",
    "BALDUR_EMERGENCY_BACKEND": "baldur.E058",
    "BALDUR_EMERGENCY_STATE_FILE": "baldur.E059",
    "BALDUR_EMERGENCY_CACHE_SECONDS": "baldur.E060",
    "BALDUR_EMERGENCY_AUTO_ACTIVATION_ENABLED": "baldur.E061",
    "BALDUR_EMERGENCY_AUTO_ACTIVATION_RATIO": "baldur.E062",
    "BALDUR_EMERGENCY_AUTO_ACTIVATION_MIN_BREAKERS": "baldur.E063",
    "BALDUR_EMERGENCY_AUTO_ACTIVATION_MINUTES": "baldur.E064",
    "BALDUR_EMERGENCY_STABILIZATION_SECONDS": "baldur.E065",
    "BALDUR_TASK_META_WATCHDOG_SECONDS": "baldur.E066",
}

# What a valid value looks like, for knobs where the table's one-line help is not enough.
_ACCEPTS: dict[str, str] = {
    "BALDUR_SERVICES": (
        "A dict mapping each service name to a dict of overrides; allowed keys: " + ", ".join(SERVICE_KEYS) + "."
    ),
    "BALDUR_MIDDLEWARE_CB_STATUS_CODES": "A list of HTTP status codes (100-599); in the environment '500,503' or '[500, 503]'.",
    "BALDUR_MIDDLEWARE_RATE_LIMIT_CODES": "A list of HTTP status codes (100-599); in the environment '429' or '[429]'.",
    "BALDUR_REDIS_URL": "A redis://host:6379/0 URL (rediss:// for TLS, unix:///path for a socket).",
    "BALDUR_RATE_LIMIT_RULES": (
        "A list of dicts such as {'path': '/api/', 'rate': '100/m', 'key': 'ip'}; "
        "rate is N/s, N/m or N/h; key is 'ip', 'user' or a dotted path."
    ),
    "BALDUR_CB_MANUAL_OVERRIDE_TTL_MINUTES": "A number of minutes above 0 and at most 1440 (24 hours).",
    "BALDUR_STATE_BACKEND": "One of 'memory', 'database' or 'redis'.",
    "BALDUR_EMERGENCY_BACKEND": "One of 'file' or 'redis'.",
    "BALDUR_CB_SLIDING_WINDOW_TYPE": "One of 'count' or 'time'.",
    "BALDUR_EVENT_LOGGING_CB_LOG_LEVEL": "A level name: DEBUG, INFO, WARNING, ERROR or CRITICAL.",
    "BALDUR_META_WATCHDOG_SLACK_WEBHOOK_URL": "The https:// URL Slack gave you for the incoming webhook.",
    "BALDUR_DOMAIN_MAPPING": "A dict mapping a path substring to a domain (breaker) name.",
}


def _hint(name: str, from_env: bool) -> str:
    knob = KNOBS[name]
    accepts = _ACCEPTS.get(name, "")
    where = "the environment variable" if from_env else "the Django setting"
    text = f"{name}: {knob.help}; default {format_default(name)}."
    if accepts:
        text += " " + accepts
    text += f" Fix {where}, or remove it to use the default. See docs/settings.md."
    return redact(text)


def _source() -> SettingsSource:
    # a private resolver: the checks never touch the process-wide cache
    return SettingsSource(lookup=django_lookup)


def _defined_settings() -> list[str]:
    return [name for name in dir(settings) if name.startswith(_PREFIX)]


@register("baldur")
def check_settings(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """Validate every ``BALDUR_*`` knob and flag misspelt names (CFG-1, CFG-3).

    Each knob is resolved as the package resolves it (Django setting, else environment
    variable, else default) and parsed by the core's validator.

    Returns:
        list[CheckMessage]: an Error per bad value (``KNOB_IDS[name]``), E002/W003 for
        ``BALDUR_CB_MINIMUM_CALLS`` above ``BALDUR_CB_SLIDING_WINDOW_SIZE``, E003 for a
        ``BALDUR_SERVICES`` entry whose ``minimum_calls`` is above its window, W001 for
        an unknown ``BALDUR_*`` Django setting, W002 for an unknown ``BALDUR_*``
        environment variable close to a known name, and E006 for the redis backend with
        neither a URL nor a django-redis cache alias. Never raises.
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
            shown = "value not shown" if "WEBHOOK" in name else redact(type(exc).__name__ + ": " + str(exc))
            messages.append(
                Error(
                    f"{name} could not be read ({shown})",
                    hint=_hint(name, from_env) + " Please also report this as a baldur_django bug.",
                    id=Codes.UNREADABLE_VALUE,
                )
            )
    messages.extend(_check_minimum_calls(source, values))
    messages.extend(_check_redis_backend(values))
    messages.extend(_check_unknown_names())
    return messages


def _check_redis_backend(values: dict[str, Any]) -> list[CheckMessage]:
    # the redis backend needs a URL, or a django-redis cache whose connection it can borrow
    if values.get("BALDUR_STATE_BACKEND") != "redis" or values.get("BALDUR_REDIS_URL"):
        return []
    if "BALDUR_REDIS_URL" not in values or "BALDUR_REDIS_CACHE_ALIAS" not in values:
        return []  # the bad value itself was already reported
    alias = values["BALDUR_REDIS_CACHE_ALIAS"]
    caches = getattr(settings, "CACHES", None) or {}
    backend = str((caches.get(alias) or {}).get("BACKEND", ""))
    if alias in caches and backend.startswith("django_redis."):
        return []
    problem = "names no cache in CACHES" if alias not in caches else f"is a {backend or 'cache'}, not a django-redis cache"
    return [
        Error(
            f"BALDUR_STATE_BACKEND='redis' without BALDUR_REDIS_URL, and BALDUR_REDIS_CACHE_ALIAS={alias!r} {problem}",
            hint="Set BALDUR_REDIS_URL (for example redis://127.0.0.1:6379/0), or point BALDUR_REDIS_CACHE_ALIAS "
            "at a cache whose BACKEND is django_redis.cache.RedisCache.",
            id=Codes.REDIS_NOT_CONFIGURED,
        )
    ]


def _check_minimum_calls(source: SettingsSource, values: dict[str, Any]) -> list[CheckMessage]:
    out: list[CheckMessage] = []
    window_name, minimum_name = "BALDUR_CB_SLIDING_WINDOW_SIZE", "BALDUR_CB_MINIMUM_CALLS"
    if window_name not in values or minimum_name not in values:
        return out  # the bad value itself was already reported
    window, minimum = values[window_name], values[minimum_name]
    if minimum > window:
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


def _check_unknown_names() -> list[CheckMessage]:
    out: list[CheckMessage] = []
    for name in sorted(_defined_settings()):
        if name in KNOBS:
            continue
        near = closest_setting(name)
        out.append(
            Warning(
                f"Unknown setting {name}" + (f"; did you mean {near}?" if near else ": baldur_django does not read it"),
                hint="baldur_django ignores settings it does not know, so this value has no effect. "
                "Every known setting is listed in docs/settings.md.",
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
                "effect. Every known name is listed in docs/settings.md.",
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
    """The inbound limiter's cache must exist and be shared by every worker (IN-4).

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
    """``manage.py check --deploy``: warn that the memory backend is per process (ST-1).

    Returns:
        list[CheckMessage]: W004 when ``BALDUR_STATE_BACKEND`` is ``"memory"``. Silence it
        with ``SILENCED_SYSTEM_CHECKS = ["baldur.W004"]`` when you run one worker process.
    """
    try:
        backend = _source().get("BALDUR_STATE_BACKEND")
    except ConfigError:
        return []  # reported by check_settings
    if backend != "memory":
        return []
    return [
        Warning(
            "BALDUR_STATE_BACKEND='memory': every worker process keeps breakers of its own",
            hint="Each worker must see its own failures before it trips, probes on its own, and forces or "
            "admin actions reach only the process that receives them. With several workers use "
            "'database' or 'redis'; with exactly one, silence baldur.W004.",
            id=Codes.MEMORY_BACKEND,
        )
    ]

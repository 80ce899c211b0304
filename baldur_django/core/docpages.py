"""Where the documentation explains a thing, named as a reader finds it.

Messages and check hints point at a page by its title and a section by its heading, never
at a file path of the repository: a user reads the built site, not the source tree.
"""

from __future__ import annotations

SETTINGS_PAGE = "Settings reference"

# The section of the settings page whose table lists each setting.
_SETTINGS_SECTIONS: dict[str, tuple[str, ...]] = {
    "Breaker triggers and recovery": (
        "BALDUR_CB_FAILURE_THRESHOLD",
        "BALDUR_CB_FAILURE_RATE_THRESHOLD",
        "BALDUR_CB_SLIDING_WINDOW_SIZE",
        "BALDUR_CB_SLIDING_WINDOW_TYPE",
        "BALDUR_CB_SLIDING_WINDOW_SECONDS",
        "BALDUR_CB_MINIMUM_CALLS",
        "BALDUR_CB_RECOVERY_TIMEOUT",
        "BALDUR_CB_HALF_OPEN_MAX_CALLS",
        "BALDUR_CB_RECOVERY_BACKOFF_FACTOR",
        "BALDUR_CB_RECOVERY_TIMEOUT_MAX",
        "BALDUR_CB_SLOW_CALL_DURATION_SECONDS",
        "BALDUR_CB_SLOW_CALL_RATE_THRESHOLD",
        "BALDUR_SERVICES",
    ),
    "What counts as a failure": (
        "BALDUR_MIDDLEWARE_CB_STATUS_CODES",
        "BALDUR_MIDDLEWARE_RATE_LIMIT_CODES",
    ),
    "Rate limits (HTTP 429)": (
        "BALDUR_CB_RATE_LIMIT_CASCADE_THRESHOLD",
        "BALDUR_CB_RATE_LIMIT_CASCADE_WINDOW_SECONDS",
        "BALDUR_CB_RATE_LIMIT_CASCADE_MIN_RATIO",
        "BALDUR_CB_RATE_LIMIT_CASCADE_MIN_CALLS",
        "BALDUR_RATE_LIMIT_DEFAULT_COOLDOWN_SECONDS",
        "BALDUR_RATE_LIMIT_MAX_COOLDOWN_SECONDS",
        "BALDUR_MAX_COOLDOWN_WAIT_SECONDS",
    ),
    "Operators, logging and notifications": (
        "BALDUR_CB_MANUAL_OVERRIDE_TTL_MINUTES",
        "BALDUR_DRY_RUN",
        "BALDUR_EVENT_LOGGING_CB_LOG_LEVEL",
        "BALDUR_META_WATCHDOG_SLACK_WEBHOOK_URL",
    ),
    "Inbound middleware": (
        "BALDUR_DOMAIN_MAPPING",
        "BALDUR_DOMAIN_DEFAULT",
        "BALDUR_MIDDLEWARE_SHED_LOAD",
        "BALDUR_RATE_LIMIT_CACHE_ALIAS",
        "BALDUR_RATE_LIMIT_RULES",
        "BALDUR_RATE_LIMIT_TRUST_FORWARDED_FOR",
        "BALDUR_RATE_LIMIT_TRUSTED_PROXIES",
    ),
    "Shared state": (
        "BALDUR_STATE_BACKEND",
        "BALDUR_REDIS_URL",
        "BALDUR_REDIS_CACHE_ALIAS",
        "BALDUR_REDIS_SOCKET_TIMEOUT",
        "BALDUR_REDIS_MAX_CONNECTIONS",
        "BALDUR_REDIS_CLUSTER",
        "BALDUR_STORE_WARNING_INTERVAL_SECONDS",
        "BALDUR_CB_SYNC_INTERVAL_SECONDS",
        "BALDUR_CB_HALF_OPEN_PROBE_LEASE_SECONDS",
        "BALDUR_REGISTRY_TTL_DAYS",
        "BALDUR_REGISTRY_IDLE_SECONDS",
        "BALDUR_ADAPTER_MAX_HOSTS",
    ),
    "Celery tasks": (
        "BALDUR_TASK_RECOVERY_SWEEP_SECONDS",
        "BALDUR_TASK_STATE_SYNC_SECONDS",
        "BALDUR_TASK_EMERGENCY_CHECK_SECONDS",
        "BALDUR_TASK_META_WATCHDOG_SECONDS",
    ),
    "Emergency Mode, meta-watchdog and propagation": (
        "BALDUR_META_WATCHDOG_AUTO_RECOVERY_ENABLED",
        "BALDUR_META_WATCHDOG_STUCK_OPEN_SECONDS",
        "BALDUR_CB_CLUSTER_STATE_PROPAGATION_ENABLED",
        "BALDUR_EMERGENCY_BACKEND",
        "BALDUR_EMERGENCY_STATE_FILE",
        "BALDUR_EMERGENCY_CACHE_SECONDS",
        "BALDUR_EMERGENCY_AUTO_ACTIVATION_ENABLED",
        "BALDUR_EMERGENCY_AUTO_ACTIVATION_RATIO",
        "BALDUR_EMERGENCY_AUTO_ACTIVATION_MIN_BREAKERS",
        "BALDUR_EMERGENCY_AUTO_ACTIVATION_MINUTES",
        "BALDUR_EMERGENCY_STABILIZATION_SECONDS",
    ),
    "Health endpoint": (
        "BALDUR_HEALTH_CRITICAL_SERVICES",
        "BALDUR_HEALTH_DETAILS",
    ),
    "OpenTelemetry": ("BALDUR_OTEL_ENABLED", "BALDUR_OTEL_SPANS"),
    "Outbound stages": (
        "BALDUR_REQUEST_DEADLINE_SECONDS",
        "BALDUR_REQUEST_DEADLINE_HEADER",
        "BALDUR_CB_HONOR_RETRY_AFTER",
        "BALDUR_BULKHEAD_MAX_CONCURRENT_CALLS",
        "BALDUR_BULKHEAD_MAX_WAIT",
        "BALDUR_BULKHEAD_SCOPE",
        "BALDUR_BULKHEAD_LEASE_SECONDS",
        "BALDUR_RETRY_BUDGET_RATIO",
        "BALDUR_RETRY_BUDGET_MIN_PER_SECOND",
        "BALDUR_RETRY_BUDGET_SCOPE",
        "BALDUR_ADAPTIVE_THROTTLING_K",
        "BALDUR_ADAPTIVE_THROTTLING_WINDOW",
    ),
    # a knob whose feature is not built yet (reserved) goes in a "Reserved for later
    # releases" section of its own; none is reserved today
}

_SECTION_OF = {name: section for section, names in _SETTINGS_SECTIONS.items() for name in names}


def see(page: str, section: str | None = None) -> str:
    """A pointer into the documentation, for the end of a message or hint.

    Args:
        page (str): the page's title, as its first heading reads.
        section (str | None): a heading on that page.

    Returns:
        str: for example ``See "Running a fleet", section "Redis Cluster", in the documentation.``
    """
    where = f'"{page}"' + (f', section "{section}"' if section else "")
    return f"See {where} in the documentation."


def see_setting(name: str) -> str:
    """The pointer to the settings page's section that lists setting *name*.

    Args:
        name (str): a ``BALDUR_*`` setting name; an unknown one points at the page alone.

    Returns:
        str: as :func:`see` returns.
    """
    return see(SETTINGS_PAGE, _SECTION_OF.get(name))

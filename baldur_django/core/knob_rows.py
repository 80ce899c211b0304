"""The knob type and the rows of the knobs table that shape one breaker and its traffic."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .knob_parsers import (
    BOOL_ACCEPTS,
    MAX_LIFETIME_MINUTES,
    PERCENT,
    SECONDS,
    STATUS_ACCEPTS,
    Parser,
    breaker_name,
    choice,
    domain_mapping,
    flag,
    header_name,
    number,
    optional,
    rate_rules,
    status_codes,
    text_value,
)


@dataclass(frozen=True)
class Knob:
    """One row of the defaults table: everything the package knows about one setting.

    Every other table (check ids, hint texts, per-call override names, ``BALDUR_SERVICES``
    keys, secrets, reserved settings) is derived from these rows, so a knob is described
    in exactly one place.

    Attributes:
        name (str): the Django setting and environment variable name.
        default: the value used when neither is defined.
        parse: ``parse(name, raw, from_env) -> value``; raises ConfigError naming *name*
            and the value.
        help (str): one line saying what the knob does (check hints, docs).
        check_id (str): the system check id of a bad value, ``baldur.E0xx``. Never
            renumbered, so a log search or ``SILENCED_SYSTEM_CHECKS`` keeps its meaning.
        accepts (str): what a valid value looks like, for hints and docs; empty when the
            parser describes itself (see :meth:`accepted_values`).
        secret (bool): the value is never shown (messages, hints, ``baldur_status --config``).
        key (str | None): the per-call override and ``BALDUR_SERVICES`` key that sets this
            knob for one breaker (it takes precedence over the global value), or None when it is global only.
        reserved (bool): known and validated, but the feature behind it is not built
            yet, so a value has no effect; a system check warns when it is set.
    """

    name: str
    default: Any
    parse: Parser
    help: str
    check_id: str
    accepts: str = ""
    secret: bool = False
    key: str | None = None
    reserved: bool = False

    def accepted_values(self) -> str:
        """What a valid value looks like: :attr:`accepts`, else the parser's own description."""
        return self.accepts or str(getattr(self.parse, "accepts", ""))

    def coerce(self, value: Any, from_env: bool = False) -> Any:
        """Parse and validate *value* for this knob. Raises ConfigError."""
        return self.parse(self.name, value, from_env)


#: The rows of one breaker's own knobs (each settable per breaker).
BREAKER_ROWS: list[Knob] = [
    # ------------------------------------------------------------ one breaker (per-call / BALDUR_SERVICES keys)
    Knob(
        "BALDUR_CB_FAILURE_THRESHOLD",
        5,
        number(integer=True, minimum=1),
        "consecutive failures that open a breaker",
        "baldur.E010",
        key="failure_threshold",
    ),
    Knob(
        "BALDUR_CB_FAILURE_RATE_THRESHOLD",
        50.0,
        number(minimum=0, maximum=100, unit=PERCENT),
        "failure percentage that opens a breaker; 0 disables",
        "baldur.E011",
        key="failure_rate_threshold",
    ),
    Knob(
        "BALDUR_CB_SLIDING_WINDOW_SIZE",
        100,
        number(integer=True, minimum=1),
        "outcomes in the count-based window",
        "baldur.E012",
        key="sliding_window_size",
    ),
    Knob(
        "BALDUR_CB_SLIDING_WINDOW_TYPE",
        "count",
        choice("count", "time"),
        "count-based window (last N outcomes) or time-based window (last N seconds)",
        "baldur.E013",
        key="sliding_window_type",
    ),
    Knob(
        "BALDUR_CB_SLIDING_WINDOW_SECONDS",
        60,
        number(integer=True, minimum=1, unit=SECONDS),
        "span of the time-based window, whole seconds",
        "baldur.E014",
        accepts="A whole number of seconds, at least 1: the time-based window counts outcomes in one-second "
        "buckets, so unlike the other *SECONDS settings it takes no fractions.",
        key="sliding_window_seconds",
    ),
    Knob(
        "BALDUR_CB_MINIMUM_CALLS",
        10,
        number(integer=True, minimum=1),
        "outcomes the window needs before the rate triggers apply",
        "baldur.E015",
        key="minimum_calls",
    ),
    Knob(
        "BALDUR_CB_RECOVERY_TIMEOUT",
        60,
        number(minimum=0, exclusive=True, unit=SECONDS),
        "seconds OPEN before a probe is allowed",
        "baldur.E016",
        key="recovery_timeout",
    ),
    Knob(
        "BALDUR_CB_HALF_OPEN_MAX_CALLS",
        3,
        number(integer=True, minimum=1),
        "trial calls per probing round",
        "baldur.E017",
        key="half_open_max_calls",
    ),
    Knob(
        "BALDUR_CB_RECOVERY_BACKOFF_FACTOR",
        1.0,
        number(minimum=1.0),
        "growth of the recovery timeout on repeated opens; 1 = off",
        "baldur.E018",
        key="recovery_backoff_factor",
    ),
    Knob(
        "BALDUR_CB_RECOVERY_TIMEOUT_MAX",
        600,
        number(minimum=0, exclusive=True, unit=SECONDS),
        "upper bound of the backed-off recovery timeout, seconds",
        "baldur.E019",
        key="recovery_timeout_max",
    ),
    Knob(
        "BALDUR_CB_SLOW_CALL_DURATION_SECONDS",
        0,
        number(minimum=0, unit=SECONDS),
        "calls lasting this long or longer are slow; 0 = off",
        "baldur.E020",
        key="slow_call_duration",
    ),
    Knob(
        "BALDUR_CB_SLOW_CALL_RATE_THRESHOLD",
        100.0,
        number(minimum=0, maximum=100, unit=PERCENT),
        "slow-call percentage that opens a breaker; 0 disables",
        "baldur.E021",
        key="slow_call_rate_threshold",
    ),
]

#: The rows of what counts as a failure, 429s, operators and the inbound middleware.
TRAFFIC_ROWS: list[Knob] = [
    # ------------------------------------------------------------ what counts as a failure; 429s
    Knob(
        "BALDUR_MIDDLEWARE_CB_STATUS_CODES",
        frozenset({500, 502, 503, 504}),
        status_codes,
        "statuses recorded as failures, by the inbound middleware, the requests/httpx adapters and "
        "protected calls that return a response alike (the name is historical)",
        "baldur.E023",
        accepts=STATUS_ACCEPTS.format(example="'500,503' or '[500, 503]'"),
    ),
    Knob(
        "BALDUR_MIDDLEWARE_RATE_LIMIT_CODES",
        frozenset({429}),
        status_codes,
        "statuses read as rate-limit answers, inbound and outbound alike (the name is historical)",
        "baldur.E024",
        accepts=STATUS_ACCEPTS.format(example="'429' or '[429]'"),
    ),
    Knob(
        "BALDUR_CB_RATE_LIMIT_CASCADE_THRESHOLD",
        10,
        number(integer=True, minimum=1),
        "429 sightings that can open a breaker",
        "baldur.E025",
    ),
    Knob(
        "BALDUR_CB_RATE_LIMIT_CASCADE_WINDOW_SECONDS",
        60,
        number(minimum=0, exclusive=True, unit=SECONDS),
        "span of the cascade window, seconds",
        "baldur.E026",
    ),
    Knob(
        "BALDUR_CB_RATE_LIMIT_CASCADE_MIN_RATIO",
        10.0,
        number(minimum=0, maximum=100, unit=PERCENT),
        "sightings as a percentage of calls",
        "baldur.E027",
    ),
    Knob(
        "BALDUR_CB_RATE_LIMIT_CASCADE_MIN_CALLS",
        20,
        number(integer=True, minimum=1),
        "calls the cascade window needs",
        "baldur.E028",
    ),
    Knob(
        "BALDUR_RATE_LIMIT_DEFAULT_COOLDOWN_SECONDS",
        1.0,
        number(minimum=0, unit=SECONDS),
        "cooldown when no valid Retry-After is given",
        "baldur.E029",
    ),
    Knob(
        "BALDUR_RATE_LIMIT_MAX_COOLDOWN_SECONDS",
        3600,
        number(minimum=0, exclusive=True, unit=SECONDS),
        "cap on any cooldown, seconds",
        "baldur.E030",
    ),
    Knob(
        "BALDUR_MAX_COOLDOWN_WAIT_SECONDS",
        60,
        number(minimum=0, unit=SECONDS),
        "longest cooldown the retry stage waits out, seconds",
        "baldur.E031",
    ),
    # ------------------------------------------------------------ operators
    Knob(
        "BALDUR_CB_MANUAL_OVERRIDE_TTL_MINUTES",
        90,
        number(minimum=0, maximum=MAX_LIFETIME_MINUTES, exclusive=True),
        "default force lifetime, minutes",
        "baldur.E032",
        accepts=f"A number of minutes above 0 and at most {MAX_LIFETIME_MINUTES} (24 hours).",
    ),
    # ------------------------------------------------------------ inbound middleware
    Knob(
        "BALDUR_DOMAIN_MAPPING",
        {},
        domain_mapping,
        "path substring -> domain breaker",
        "baldur.E033",
        accepts="A dict mapping a path substring to a domain (breaker) name.",
    ),
    Knob(
        "BALDUR_DOMAIN_DEFAULT",
        "default",
        breaker_name,
        "breaker for unmapped paths",
        "baldur.E034",
        accepts="A breaker name: at most 1,000 characters, no control characters, no whitespace at either end.",
    ),
    Knob(
        "BALDUR_MIDDLEWARE_SHED_LOAD",
        False,
        flag,
        "answer 503 while a domain's breaker denies admission",
        "baldur.E035",
        accepts=BOOL_ACCEPTS,
    ),
    Knob(
        "BALDUR_RATE_LIMIT_CACHE_ALIAS",
        "default",
        text_value(),
        "Django cache alias for the inbound limiter",
        "baldur.E036",
        accepts="A key of CACHES.",
    ),
    Knob(
        "BALDUR_RATE_LIMIT_RULES",
        [],
        rate_rules,
        "inbound rate-limit rules",
        "baldur.E037",
        accepts="A list of dicts such as {'path': '/api/', 'rate': '100/m', 'key': 'ip'}; "
        "rate is N/s, N/m or N/h; key is 'ip', 'user' or a dotted path.",
    ),
    Knob(
        "BALDUR_RATE_LIMIT_TRUST_FORWARDED_FOR",
        False,
        flag,
        "read the client IP from X-Forwarded-For",
        "baldur.E038",
        accepts=BOOL_ACCEPTS,
    ),
    Knob(
        "BALDUR_RATE_LIMIT_TRUSTED_PROXIES",
        1,
        number(integer=True, minimum=1),
        "X-Forwarded-For entry from the right that is the client",
        "baldur.E039",
    ),
]


#: The rows of the outbound stages: deadlines, the Retry-After gate, the bulkhead, the retry
#: budget and adaptive throttling. Every one is off by default. A stage whose machinery is
#: not built yet has its rows marked ``reserved`` (validated; a system check warns that a
#: value has no effect).
STAGE_ROWS: list[Knob] = [
    Knob(
        "BALDUR_REQUEST_DEADLINE_SECONDS",
        None,
        optional(number(minimum=0, exclusive=True, unit=SECONDS)),
        "deadline RequestDeadlineMiddleware gives each request, seconds; caps the header's value",
        "baldur.E100",
    ),
    Knob(
        "BALDUR_REQUEST_DEADLINE_HEADER",
        None,
        optional(header_name),
        "request header whose value (seconds) RequestDeadlineMiddleware reads as the request's deadline",
        "baldur.E101",
    ),
    Knob(
        "BALDUR_CB_HONOR_RETRY_AFTER",
        False,
        flag,
        "after a 429 or 503 with Retry-After, refuse every call to the service until then",
        "baldur.E102",
        accepts=BOOL_ACCEPTS,
        key="honor_retry_after",
    ),
    Knob(
        "BALDUR_BULKHEAD_MAX_CONCURRENT_CALLS",
        None,
        optional(number(integer=True, minimum=1)),
        "bulkhead: calls of one service in flight at most; unset = off",
        "baldur.E103",
        key="max_concurrent_calls",
    ),
    Knob(
        "BALDUR_BULKHEAD_MAX_WAIT",
        0.0,
        number(minimum=0, unit=SECONDS),
        "seconds a call may wait for a free bulkhead slot; 0 = refused at once",
        "baldur.E104",
        key="max_wait",
    ),
    Knob(
        "BALDUR_BULKHEAD_SCOPE",
        "worker",
        choice("worker", "fleet"),
        "the bulkhead counts the calls of one worker process, or of every process sharing the Redis store",
        "baldur.E105",
        key="bulkhead_scope",
    ),
    Knob(
        "BALDUR_BULKHEAD_LEASE_SECONDS",
        60,
        number(minimum=0, exclusive=True, unit=SECONDS),
        "lease of one fleet bulkhead slot, seconds: a killed process's slots come back after it",
        "baldur.E106",
    ),
    Knob(
        "BALDUR_RETRY_BUDGET_RATIO",
        None,
        optional(number(minimum=0)),
        "retry budget: retries at most this share of a service's calls over 10 s; unset = off",
        "baldur.E107",
        key="retry_budget_ratio",
    ),
    Knob(
        "BALDUR_RETRY_BUDGET_MIN_PER_SECOND",
        10,
        number(minimum=0),
        "retries the budget allows per second on top of its ratio",
        "baldur.E108",
        key="retry_budget_min_per_second",
    ),
    Knob(
        "BALDUR_RETRY_BUDGET_SCOPE",
        "worker",
        choice("worker", "fleet"),
        "the retry budget counts one worker process's calls, or the fleet's through the Redis store",
        "baldur.E109",
        key="retry_budget_scope",
    ),
    Knob(
        "BALDUR_ADAPTIVE_THROTTLING_K",
        None,
        optional(number(minimum=1)),
        "adaptive throttling's multiplier of accepted calls; unset = off",
        "baldur.E110",
        key="adaptive_throttling_k",
    ),
    Knob(
        "BALDUR_ADAPTIVE_THROTTLING_WINDOW",
        120,
        number(minimum=0, exclusive=True, unit=SECONDS),
        "span adaptive throttling counts requests and accepts over, seconds",
        "baldur.E111",
        key="adaptive_throttling_window",
    ),
]

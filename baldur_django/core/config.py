"""Settings resolution with provenance, and the frozen per-breaker configuration.

Resolution order for every knob: an injected lookup (the Django layer passes
``django.conf.settings``) -> the environment variable of the same name -> the default
of :data:`baldur_django.core.knobs.KNOBS`. Each resolved value remembers where it came
from. Precedence for one breaker: per-call override > ``BALDUR_SERVICES[name]``
> global knob.
"""

from __future__ import annotations

import importlib
import os
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .classify import Classifier
from .clock import SYSTEM_CLOCK, Clock
from .errors import ConfigError
from .knobs import (
    KNOBS,
    LOCAL_KEYS,
    OVERRIDE_KEYS,
    PREDICATE_KEYS,
    check_service_overrides,
    is_exception_type,
    is_predicate,
)

__all__ = [
    "SettingsSource",
    "BreakerConfig",
    "build_config",
    "MISSING",
    "settings",
    "OVERRIDE_KEYS",
    "OVERRIDE_NAMES",
    "import_reference",
    "service_predicates",
]


class _Missing:
    __slots__ = ()

    def __repr__(self) -> str:
        return "MISSING"


MISSING: Any = _Missing()

# OVERRIDE_KEYS (per-call override name -> global knob it overrides) is derived from the
# rows of the defaults table; re-exported here, where the resolution uses it.

#: Every keyword a decorator or call accepts as a per-call override: the knobs' keys plus
#: the predicates (``ignore_exceptions``, ``failure_predicate``, ``result_predicate``).
OVERRIDE_NAMES: tuple[str, ...] = (*OVERRIDE_KEYS, *LOCAL_KEYS, *PREDICATE_KEYS)


class SettingsSource:
    """Resolves ``BALDUR_*`` knobs: lookup -> environment -> default, with provenance.

    Args:
        lookup: ``callable(name) -> value`` returning :data:`MISSING` when the setting is
            not defined (the Django layer passes one reading ``django.conf.settings``).
        environ: mapping of environment variables (``os.environ`` by default).

    Values are parsed once and cached until :meth:`reset`. ``version`` grows on every
    reset so breakers can notice a change.
    """

    def __init__(self, lookup: Callable[[str], Any] | None = None, environ: Mapping[str, str] | None = None) -> None:
        self._lookup = lookup
        self._environ = environ
        self._cache: dict[str, tuple[Any, str]] = {}
        self._lock = threading.Lock()
        self.version = 0
        #: ``(version, clock, config)``: the configuration of a breaker with no override and
        #: no ``BALDUR_SERVICES`` entry, built at that settings version (see :func:`build_config`).
        self.default_memo: tuple[int, Clock | None, BreakerConfig] | None = None

    def set_lookup(self, lookup: Callable[[str], Any] | None) -> None:
        """Install (or remove) the settings lookup and drop every cached value."""
        self._lookup = lookup
        self.reset()

    def reset(self) -> None:
        """Forget cached values; the next read resolves them again."""
        with self._lock:
            self._cache = {}
            self.version += 1

    def _resolve(self, name: str) -> tuple[Any, str]:
        knob = KNOBS[name]
        if self._lookup is not None:
            value = self._lookup(name)
            if value is not MISSING:
                return knob.coerce(value, from_env=False), "setting"
        environ = os.environ if self._environ is None else self._environ
        if name in environ:
            return knob.coerce(environ[name], from_env=True), "env"
        return knob.coerce(knob.default, from_env=False), "default"

    def get(self, name: str) -> Any:
        """Return the parsed value of knob *name*.

        Raises:
            KeyError: *name* is not a known knob.
            ConfigError: the configured value is invalid (names the setting and value).
        """
        return self._hit(name)[0]

    def _hit(self, name: str) -> tuple[Any, str]:
        # one read of the cache, so a concurrent reset() can never leave us without a value
        hit = self._cache.get(name)
        if hit is None:
            hit = self._resolve(name)
            self._cache[name] = hit
        return hit

    __getitem__ = get

    def source(self, name: str) -> str:
        """Where the value of *name* came from: ``"setting"``, ``"env"`` or ``"default"``.

        Raises:
            KeyError: *name* is not a known knob.
            ConfigError: the configured value is invalid.
        """
        return self._hit(name)[1]

    def report(self) -> list[tuple[str, Any, str]]:
        """Every knob as ``(name, value, source)``; invalid values are reported as the error text."""
        rows = []
        for name in KNOBS:
            try:
                rows.append((name, self.get(name), self.source(name)))
            except ConfigError as exc:
                rows.append((name, f"<invalid: {exc}>", "error"))
        return rows


#: The process-wide settings source used by the registry and the facade.
settings = SettingsSource()


@dataclass(frozen=True)
class BreakerConfig:
    """Everything one breaker needs, resolved and validated. Times are seconds.

    Built by :func:`build_config`; immutable, so a breaker swaps the whole object when
    settings change. The fields ``failure_threshold`` to ``slow_call_rate_threshold``
    can be set per call and per ``BALDUR_SERVICES`` entry; the others are global.

    Attributes:
        failure_threshold (int): consecutive failures that open the breaker.
        failure_rate_threshold (float): percent, 0 disables.
        sliding_window_size (int): outcomes in the count-based window.
        sliding_window_type (str): ``"count"`` or ``"time"``.
        sliding_window_seconds (int): span of the time-based window, whole seconds.
        minimum_calls (int): outcomes the window needs before either rate trigger applies.
        recovery_timeout (float): seconds OPEN before a probe; the first open's length.
        half_open_max_calls (int): trials per probing round.
        recovery_backoff_factor (float): growth of the open duration per consecutive
            open, at least 1.0; 1.0 = off.
        recovery_timeout_max (float): seconds, the cap of that duration; never below
            ``recovery_timeout``.
        slow_call_duration (float): seconds a call must last to be slow; 0 = off.
        slow_call_rate_threshold (float): slow percentage that opens; 0 disables.
        ignore_exceptions (tuple): exception types and ``callable(exc) -> bool`` mixed,
            counted as neither outcome.
        failure_predicate: ``callable(exc) -> bool`` deciding which other exceptions are
            failures (the rest are ignored), or None: every one is.
        result_predicate: ``callable(value) -> bool`` marking a returned value as a
            failure, or None.
        warning_interval (float): seconds between two ``circuit_breaker.predicate_failed``
            lines of this breaker (``BALDUR_STORE_WARNING_INTERVAL_SECONDS``).
        deadline (float | None): seconds one protected call may take in all (attempts,
            retry and cooldown waits); None: no deadline of its own.
        honor_retry_after (bool): a 429/503 with Retry-After refuses every call until then.
        max_concurrent_calls (int | None): the bulkhead's limit; None: no bulkhead.
        max_wait (float): seconds a call may wait for a bulkhead slot.
        bulkhead_scope (str): ``"worker"`` or ``"fleet"``.
        bulkhead_lease (float): seconds a fleet bulkhead slot is leased for.
        retry_budget_ratio (float | None): retries as a share of calls; None: no budget.
        retry_budget_min_per_second (float): retries per second allowed on top of the ratio.
        retry_budget_scope (str): ``"worker"`` or ``"fleet"``.
        adaptive_throttling_k (float | None): adaptive throttling's K; None: off.
        adaptive_throttling_window (float): seconds adaptive throttling counts over.
        clock: the clock that throttle reads (None: the system clock).
        classifier (Classifier): built from the fields above; judges every outcome.
        plain_types (frozenset[type]): returned types needing no judgement (empty while a
            ``result_predicate`` is set): the hot path's shortcut.
    """

    failure_threshold: int = 5
    failure_rate_threshold: float = 50.0
    sliding_window_size: int = 100
    minimum_calls: int = 10
    recovery_timeout: float = 60.0
    half_open_max_calls: int = 3
    ignore_exceptions: tuple[Any, ...] = ()
    failure_codes: frozenset[int] = frozenset({500, 502, 503, 504})
    rate_limit_codes: frozenset[int] = frozenset({429})
    cascade_threshold: int = 10
    cascade_window: float = 60.0
    cascade_min_ratio: float = 10.0
    cascade_min_calls: int = 20
    default_cooldown: float = 1.0
    max_cooldown: float = 3600.0
    max_cooldown_wait: float = 60.0
    dry_run: bool = False
    log_level: str = "WARNING"
    sync_interval: float = 5.0
    probe_lease: float = 30.0
    default_ttl_minutes: float = 90.0
    overrides: Mapping[str, Any] = field(default_factory=dict)
    sliding_window_type: str = "count"
    sliding_window_seconds: int = 60
    recovery_backoff_factor: float = 1.0
    recovery_timeout_max: float = 600.0
    slow_call_duration: float = 0.0
    slow_call_rate_threshold: float = 100.0
    failure_predicate: Callable[[BaseException], Any] | None = None
    result_predicate: Callable[[Any], Any] | None = None
    warning_interval: float = 60.0
    deadline: float | None = None
    honor_retry_after: bool = False
    max_concurrent_calls: int | None = None
    max_wait: float = 0.0
    bulkhead_scope: str = "worker"
    bulkhead_lease: float = 60.0
    retry_budget_ratio: float | None = None
    retry_budget_min_per_second: float = 10.0
    retry_budget_scope: str = "worker"
    adaptive_throttling_k: float | None = None
    adaptive_throttling_window: float = 120.0
    clock: Clock | None = field(default=None, compare=False, repr=False)
    classifier: Classifier = field(init=False, compare=False, repr=False)
    plain_types: frozenset[type] = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        classifier = Classifier(
            ignore=tuple(self.ignore_exceptions),
            failure_predicate=self.failure_predicate,
            result_predicate=self.result_predicate,
            failure_codes=self.failure_codes,
            rate_limit_codes=self.rate_limit_codes,
            warning_interval=self.warning_interval,
            monotonic=(self.clock or SYSTEM_CLOCK).monotonic,
        )
        object.__setattr__(self, "classifier", classifier)
        object.__setattr__(self, "plain_types", classifier.plain_types)


def _check_ignore(where: str, value: Any) -> tuple[Any, ...]:
    if value is None:
        return ()
    if is_exception_type(value) or is_predicate(value):
        value = (value,)
    if isinstance(value, (str, bytes)):
        raise ConfigError(
            f"{where}: ignore_exceptions={value!r} must be exception types and callables(exc) -> bool "
            "(dotted paths are for BALDUR_SERVICES)"
        )
    try:
        items = tuple(value)
    except TypeError:
        raise ConfigError(
            f"{where}: ignore_exceptions={value!r} must be a tuple of exception types and callables(exc) -> bool"
        ) from None
    for item in items:
        if not (is_exception_type(item) or is_predicate(item)):
            raise ConfigError(
                f"{where}: ignore_exceptions={value!r}: {item!r} is neither an exception type nor a callable(exc) -> bool"
            )
    return items


def _check_predicate(where: str, key: str, value: Any) -> Any:
    if not is_predicate(value):
        what = "a class" if isinstance(value, type) else "not callable"
        raise ConfigError(
            f"{where}: {key}={value!r} is {what}; expected a function taking the "
            f"{'exception' if key == 'failure_predicate' else 'returned value'} and returning a bool"
        )
    return value


def validate_overrides(service: str, overrides: Mapping[str, Any]) -> dict[str, Any]:
    """Check per-call overrides for breaker *service*; returns them parsed.

    ``ignore_exceptions`` takes exception types and callables mixed; ``failure_predicate``
    and ``result_predicate`` a callable. None means "not given".

    Raises:
        ConfigError: unknown name or bad value, naming both.
    """
    where = f"breaker {service!r}"
    plain = {k: v for k, v in overrides.items() if k not in PREDICATE_KEYS and v is not None}
    out = check_service_overrides(where, plain)
    if overrides.get("ignore_exceptions") is not None:
        out["ignore_exceptions"] = _check_ignore(where, overrides["ignore_exceptions"])
    for key in ("failure_predicate", "result_predicate"):
        if overrides.get(key) is not None:
            out[key] = _check_predicate(where, key, overrides[key])
    return out


def import_reference(where: str, path: str) -> Any:
    """Import the object a dotted path names (``"myapp.breakers.is_outage"``).

    Args:
        where: what the path was given as, for the message
            (``"BALDUR_SERVICES['payments']['failure_predicate']"``).
        path: ``module.attribute``; nested attributes (``module.Class.method``) work too.

    Raises:
        ConfigError: the path cannot be imported, naming *where*, the path and the reason.
    """
    module_name, _, attribute = path.rpartition(".")
    trail = [attribute]
    while module_name:
        try:
            value: Any = importlib.import_module(module_name)
        except ImportError as exc:
            if exc.name is not None and not module_name.startswith(exc.name):
                # the module exists but an import inside it failed: report that, not a miss
                raise ConfigError(f"{where}={path!r} cannot be imported: {exc}") from None
            module_name, _, parent = module_name.rpartition(".")
            trail.insert(0, parent)
            continue
        except Exception as exc:  # the module raised while importing
            raise ConfigError(f"{where}={path!r} cannot be imported: {type(exc).__name__}: {exc}") from None
        for name in trail:
            try:
                value = getattr(value, name)
            except AttributeError:
                raise ConfigError(
                    f"{where}={path!r} cannot be imported: {value.__name__ if hasattr(value, '__name__') else value!r} "
                    f"has no attribute {name!r}"
                ) from None
        return value
    raise ConfigError(f"{where}={path!r} cannot be imported: no module of that path exists")


def service_predicates(service: str, entry: Mapping[str, Any]) -> dict[str, Any]:
    """The predicates of one ``BALDUR_SERVICES`` entry, dotted paths imported.

    Args:
        service: the entry's service name.
        entry: the parsed entry (see :data:`baldur_django.core.knobs.PREDICATE_KEYS`).

    Returns:
        ``{key: value}`` for the predicate keys present: ``ignore_exceptions`` as a tuple of
        exception types and callables, the two others as callables.

    Raises:
        ConfigError: a path that cannot be imported, or that names something that is not
            callable (not an exception class or a callable, for ``ignore_exceptions``); the
            message names the key (``BALDUR_SERVICES['payments']['failure_predicate']``).
    """
    out: dict[str, Any] = {}
    for key in PREDICATE_KEYS:
        if key not in entry:
            continue
        where = f"BALDUR_SERVICES[{service!r}][{key!r}]"
        if key == "ignore_exceptions":
            items = []
            for item in entry[key]:
                value = import_reference(where, item)
                if not (is_exception_type(value) or is_predicate(value)):
                    raise ConfigError(
                        f"{where}: {item!r} names {value!r}, which is neither an exception class nor a callable"
                    )
                items.append(value)
            out[key] = tuple(items)
        else:
            raw = entry[key]
            value = import_reference(where, raw)
            if not is_predicate(value):
                raise ConfigError(
                    f"{where}={raw!r} names {value!r}, which is not a function (not callable, or a class)"
                )
            out[key] = value
    return out


def build_config(
    service: str, overrides: Mapping[str, Any], source: SettingsSource | None = None, clock: Clock | None = None
) -> BreakerConfig:
    """Resolve the configuration of breaker *service*.

    Each of the per-breaker fields comes from the per-call override, else the service's
    ``BALDUR_SERVICES`` entry, else the global knob. Two pairs must agree:

    * with a count window, ``minimum_calls`` at most ``sliding_window_size`` (a time
      window counts ``minimum_calls`` over its seconds, so any value is fine);
    * ``recovery_timeout_max`` at least ``recovery_timeout``.

    When the pair disagrees and the bound (the window, the timeout) was given more
    specifically than the value it bounds, or that value is the table's default, the
    value follows the bound (``minimum_calls`` is lowered to the window, the cap raised
    to the timeout). Otherwise the configuration is contradictory and refused.

    Args:
        service: the breaker's name.
        overrides: already validated per-call overrides (see :func:`validate_overrides`).
        source: settings to read (the process-wide :data:`settings` by default).
        clock: the breaker's clock (the throttle of its predicate-error log reads it).

    The predicates come from the per-call override, else the ``BALDUR_SERVICES``
    entry, whose dotted paths are imported here, on the first build (:func:`service_predicates`).

    Returns:
        A frozen :class:`BreakerConfig`.

    Raises:
        ConfigError: a bad setting; an explicitly given ``minimum_calls`` above a
            ``sliding_window_size`` given at the same or a less specific level; an
            explicitly given ``recovery_timeout_max`` below a ``recovery_timeout`` given
            at the same or a less specific level. The message names both values and
            where each came from; a predicate path that cannot be imported or
            names no callable.
    """
    s = source or settings
    if overrides:
        return _build(service, overrides, s, clock)
    # No override: unless BALDUR_SERVICES has an entry for *service*, the configuration
    # depends on the settings and the clock only, so every such breaker shares one frozen
    # object, built once per settings version. reset() (every settings change)
    # bumps the version; the version is read before the build, so a build that raced
    # with a reset is stored under the old version and never served after it. A bad
    # setting raises on every build, as it did, since nothing is stored then.
    version = s.version
    if service in s.get("BALDUR_SERVICES"):
        return _build(service, overrides, s, clock)
    memo = s.default_memo  # one read: a tuple, replaced whole
    if memo is not None and memo[0] == version and memo[1] is clock:
        return memo[2]
    config = _build(service, overrides, s, clock)
    s.default_memo = (version, clock, config)
    return config


def _build(service: str, overrides: Mapping[str, Any], s: SettingsSource, clock: Clock | None) -> BreakerConfig:
    """:func:`build_config` without the memo: every value resolved again."""
    per_service = s.get("BALDUR_SERVICES").get(service, {})
    predicates = service_predicates(service, per_service)
    predicates.update({key: overrides[key] for key in PREDICATE_KEYS if overrides.get(key) is not None})
    values, level, origin = _resolve(service, overrides, per_service, s)
    _reconcile(service, values, level, origin)
    return BreakerConfig(
        failure_threshold=values["failure_threshold"],
        failure_rate_threshold=values["failure_rate_threshold"],
        sliding_window_size=values["sliding_window_size"],
        minimum_calls=values["minimum_calls"],
        recovery_timeout=values["recovery_timeout"],
        half_open_max_calls=values["half_open_max_calls"],
        ignore_exceptions=predicates.get("ignore_exceptions", ()),
        failure_predicate=predicates.get("failure_predicate"),
        result_predicate=predicates.get("result_predicate"),
        warning_interval=s.get("BALDUR_STORE_WARNING_INTERVAL_SECONDS"),
        clock=clock,
        failure_codes=s.get("BALDUR_MIDDLEWARE_CB_STATUS_CODES"),
        rate_limit_codes=s.get("BALDUR_MIDDLEWARE_RATE_LIMIT_CODES"),
        cascade_threshold=s.get("BALDUR_CB_RATE_LIMIT_CASCADE_THRESHOLD"),
        cascade_window=s.get("BALDUR_CB_RATE_LIMIT_CASCADE_WINDOW_SECONDS"),
        cascade_min_ratio=s.get("BALDUR_CB_RATE_LIMIT_CASCADE_MIN_RATIO"),
        cascade_min_calls=s.get("BALDUR_CB_RATE_LIMIT_CASCADE_MIN_CALLS"),
        default_cooldown=s.get("BALDUR_RATE_LIMIT_DEFAULT_COOLDOWN_SECONDS"),
        max_cooldown=s.get("BALDUR_RATE_LIMIT_MAX_COOLDOWN_SECONDS"),
        max_cooldown_wait=s.get("BALDUR_MAX_COOLDOWN_WAIT_SECONDS"),
        dry_run=s.get("BALDUR_DRY_RUN"),
        log_level=s.get("BALDUR_EVENT_LOGGING_CB_LOG_LEVEL"),
        sync_interval=s.get("BALDUR_CB_SYNC_INTERVAL_SECONDS"),
        probe_lease=s.get("BALDUR_CB_HALF_OPEN_PROBE_LEASE_SECONDS"),
        default_ttl_minutes=s.get("BALDUR_CB_MANUAL_OVERRIDE_TTL_MINUTES"),
        overrides=dict(overrides),
        sliding_window_type=values["sliding_window_type"],
        sliding_window_seconds=values["sliding_window_seconds"],
        recovery_backoff_factor=values["recovery_backoff_factor"],
        recovery_timeout_max=values["recovery_timeout_max"],
        slow_call_duration=values["slow_call_duration"],
        slow_call_rate_threshold=values["slow_call_rate_threshold"],
        deadline=overrides.get("deadline", per_service.get("deadline")),
        bulkhead_lease=s.get("BALDUR_BULKHEAD_LEASE_SECONDS"),
        **{key: values[key] for key in _STAGE_KEYS},
    )


#: The stage knobs resolved like the breaker's own (per call > ``BALDUR_SERVICES`` > setting).
_STAGE_KEYS = (
    "honor_retry_after",
    "max_concurrent_calls",
    "max_wait",
    "bulkhead_scope",
    "retry_budget_ratio",
    "retry_budget_min_per_second",
    "retry_budget_scope",
    "adaptive_throttling_k",
    "adaptive_throttling_window",
)


def _resolve(
    service: str, overrides: Mapping[str, Any], per_service: Mapping[str, Any], s: SettingsSource
) -> tuple[dict[str, Any], dict[str, int], dict[str, str]]:
    """Every per-breaker value, ``(values, level, origin)``: the value, how specifically it
    was given (3 per-call, 2 ``BALDUR_SERVICES``, 1 global setting or env var, 0 the table's
    default) and where it came from, in words."""
    values: dict[str, Any] = {}
    level: dict[str, int] = {}
    origin: dict[str, str] = {}
    for key, knob in OVERRIDE_KEYS.items():
        if key in overrides:
            values[key], level[key], origin[key] = overrides[key], 3, "per-call argument"
        elif key in per_service:
            values[key], level[key], origin[key] = per_service[key], 2, f"BALDUR_SERVICES[{service!r}]"
        else:
            values[key] = s.get(knob)
            explicit = s.source(knob) != "default"
            level[key], origin[key] = (1, knob) if explicit else (0, f"default of {knob}")
    return values, level, origin


def _reconcile(service: str, values: dict[str, Any], level: dict[str, int], origin: dict[str, str]) -> None:
    """Make values that bound each other agree: the less specific one follows the other, and
    two given as specifically raise ConfigError."""

    def given(key: str) -> str:
        return f"{key}={values[key]!r} (from {origin[key]})"

    def conflict(small: str, big: str) -> bool:
        # *small* below *big* is an error when *small* was given explicitly, at least as
        # specifically as *big*; otherwise *small* follows *big* (the caller adjusts it)
        return level[small] > 0 and level[small] >= level[big]

    if values["sliding_window_type"] == "count" and values["minimum_calls"] > values["sliding_window_size"]:
        # a count window can never hold more than its size (a time window has no
        # such bound: minimum_calls is counted over its seconds)
        if conflict("minimum_calls", "sliding_window_size"):
            raise ConfigError(
                f"breaker {service!r}: minimum_calls={values['minimum_calls']!r} is above "
                f"sliding_window_size={values['sliding_window_size']!r} "
                f"(minimum_calls from {origin['minimum_calls']}, "
                f"sliding_window_size from {origin['sliding_window_size']})"
            )
        # the window was narrowed more specifically than minimum_calls (or minimum_calls
        # is the default): the gate follows the window
        values["minimum_calls"] = values["sliding_window_size"]
    if values["recovery_timeout_max"] < values["recovery_timeout"]:
        # the cap of the backed-off open duration below the first open's length
        if conflict("recovery_timeout_max", "recovery_timeout"):
            raise ConfigError(
                f"breaker {service!r}: {given('recovery_timeout_max')} is below {given('recovery_timeout')}; "
                "the cap of the backed-off recovery timeout cannot be shorter than the timeout itself"
            )
        # a timeout given more specifically than the cap (or a default cap): the cap
        # follows, so an open never lasts less than recovery_timeout
        values["recovery_timeout_max"] = float(values["recovery_timeout"])

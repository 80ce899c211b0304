"""The one defaults table of every ``BALDUR_*`` knob, with parsers and validators.

Each row (:class:`Knob`) says everything about one knob: its name and default, how a raw
value is turned into a checked one, what it does and accepts, its system check id,
whether it is a secret, the per-call / ``BALDUR_SERVICES`` key that sets it for one
breaker, and whether it is reserved (validated, but its feature is not built yet). The
other tables (:data:`OVERRIDE_KEYS`, :data:`SERVICE_KEYS`, :data:`CHECK_IDS`,
:data:`SECRETS`, :data:`RESERVED`) are derived from the rows. The core (environment
variables), the Django settings object and the system checks all parse values with the
same rows, so a bad value reads the same everywhere.
"""

from __future__ import annotations

import difflib
import json
import math
import os
import re
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

from .errors import ConfigError

__all__ = [
    "MAX_LIFETIME_MINUTES",
    "Knob",
    "KNOBS",
    "OVERRIDE_KEYS",
    "SERVICE_KEYS",
    "PREDICATE_KEYS",
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

#: The longest lifetime, in minutes, of an operator's force and of an Emergency Mode level
#: (24 hours): a force or a level nobody renews always ends within a day.
MAX_LIFETIME_MINUTES = 1440

_MISSING = object()

#: ``parser(name, raw value, from_env) -> parsed value``; raises ConfigError naming *name*.
Parser = Callable[[str, Any, bool], Any]


def _fail(name: str, value: Any, why: str) -> ConfigError:
    return ConfigError(f"{name}={value!r}: {why}")


def validate_number(
    name: str,
    value: Any,
    *,
    integer: bool = False,
    minimum: float | None = None,
    maximum: float | None = None,
    min_exclusive: bool = False,
    from_env: bool = False,
) -> float | int:
    """Check that *value* is a finite number within bounds and return it.

    Args:
        name: the setting or argument name used in the error message.
        value: the raw value (a string when it comes from the environment).
        integer: require a whole number.
        minimum / maximum: inclusive bounds (``minimum`` exclusive when ``min_exclusive``).
        from_env: accept strings such as ``"5"`` or ``"0.5"``.

    Returns:
        The value as ``int`` (when ``integer``) or ``float``.

    Raises:
        ConfigError: non-numeric, boolean, infinite, NaN, fractional where a whole
            number is due, or out of bounds.
    """
    raw = value
    if isinstance(value, bool):
        raise _fail(name, raw, "a boolean is not a number")
    if isinstance(value, str) and from_env:
        text = value.strip()
        try:
            value = int(text) if integer else float(text)
        except ValueError:
            try:
                value = float(text)
            except ValueError:
                raise _fail(name, raw, "expected a number") from None
    if not isinstance(value, (int, float)):
        raise _fail(name, raw, "expected a number")
    if isinstance(value, float) and not math.isfinite(value):
        raise _fail(name, raw, "must be a finite number")
    if integer:
        if isinstance(value, float):
            if not value.is_integer():
                raise _fail(name, raw, "expected a whole number")
            value = int(value)
    else:
        try:
            value = float(value)
        except OverflowError:  # an int too large for a float (10**400)
            raise _fail(name, raw, "is too large") from None
    if minimum is not None:
        if min_exclusive and value <= minimum:
            raise _fail(name, raw, f"must be greater than {minimum:g}")
        if not min_exclusive and value < minimum:
            raise _fail(name, raw, f"must be at least {minimum:g}")
    if maximum is not None and value > maximum:
        raise _fail(name, raw, f"must be at most {maximum:g}")
    return int(value) if integer else float(value)


@dataclass(frozen=True)
class _Number:
    """Parser of a number within bounds; ``accepts`` describes it for hints and docs."""

    integer: bool = False
    minimum: float | None = None
    maximum: float | None = None
    exclusive: bool = False
    unit: str = ""

    def __call__(self, name: str, value: Any, from_env: bool) -> Any:
        return validate_number(
            name,
            value,
            integer=self.integer,
            minimum=self.minimum,
            maximum=self.maximum,
            min_exclusive=self.exclusive,
            from_env=from_env,
        )

    @property
    def accepts(self) -> str:
        what = "A whole number" if self.integer else "A number"
        if self.unit == _PERCENT:
            what = "A percentage"
        elif self.unit:
            what += f" of {self.unit}"
        bounds = []
        if self.minimum is not None:
            bounds.append(f"{'above' if self.exclusive else 'at least'} {self.minimum:g}")
        if self.maximum is not None:
            bounds.append(f"at most {self.maximum:g}")
        text = what + (", " + " and ".join(bounds) if bounds else "")
        if not self.integer:
            text += " (fractions allowed)"
        return text + "."


def _num(
    integer: bool = False,
    minimum: float | None = None,
    maximum: float | None = None,
    exclusive: bool = False,
    unit: str = "",
) -> _Number:
    return _Number(integer, minimum, maximum, exclusive, unit)


_SECONDS = "seconds"
_PERCENT = "percent"

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def _bool(name: str, value: Any, from_env: bool) -> bool:
    if isinstance(value, bool):
        return value
    if from_env and isinstance(value, str):
        low = value.strip().lower()
        if low in _TRUE:
            return True
        if low in _FALSE:
            return False
    raise _fail(name, value, "expected a boolean (true/false)")


def _text(allow_empty: bool = False, optional: bool = False) -> Parser:
    def parser(name: str, value: Any, from_env: bool) -> Any:
        if value is None and optional:
            return None
        if not isinstance(value, str):
            raise _fail(name, value, "expected a string")
        if not value.strip():
            if optional:
                return None
            if not allow_empty:
                raise _fail(name, value, "must not be empty")
        return value

    return parser


@dataclass(frozen=True)
class _Choice:
    """Parser of one of a few words (any case); ``accepts`` lists them."""

    choices: tuple[str, ...]

    def __call__(self, name: str, value: Any, from_env: bool) -> str:
        if isinstance(value, str) and value.strip().lower() in self.choices:
            return value.strip().lower()
        raise _fail(name, value, f"expected one of {', '.join(self.choices)}")

    @property
    def accepts(self) -> str:
        quoted = [repr(c) for c in self.choices]
        return "One of " + ", ".join(quoted[:-1]) + " or " + quoted[-1] + "."


def _choice(*choices: str) -> _Choice:
    return _Choice(choices)


_DOTTED_PATH = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)+")


@dataclass(frozen=True)
class _StoreChoice(_Choice):
    """Parser of ``BALDUR_STATE_BACKEND``: a bundled backend's name (any case) or the dotted
    path of a store class. Only the path's form is checked here; importing it is the
    Django layer's job (``baldur_django.backends.store_class`` and its system check)."""

    def __call__(self, name: str, value: Any, from_env: bool) -> str:
        if isinstance(value, str) and _DOTTED_PATH.fullmatch(value.strip()):
            return value.strip()
        if isinstance(value, str) and value.strip().lower() in self.choices:
            return value.strip().lower()
        raise _fail(name, value, f"expected one of {', '.join(self.choices)}, or the dotted path of a store class")

    @property
    def accepts(self) -> str:
        return (
            super().accepts[:-1] + ", or the dotted path of a store class such as 'myproject.stores.MyStore' "
            "(see docs/stores.md)."
        )


def _json_or_csv(name: str, value: Any, from_env: bool) -> Any:
    if from_env and isinstance(value, str):
        text = value.strip()
        if text.startswith("[") or text.startswith("{"):
            try:
                return json.loads(text)
            except json.JSONDecodeError as exc:
                raise _fail(name, value, f"malformed JSON ({exc.msg})") from None
        return [part.strip() for part in text.split(",") if part.strip()]
    return value


def _status_codes(name: str, value: Any, from_env: bool) -> frozenset[int]:
    raw = value  # messages show what the user wrote, not the parsed form
    value = _json_or_csv(name, value, from_env)
    if isinstance(value, (str, bytes, dict)) or not hasattr(value, "__iter__"):
        raise _fail(name, raw, "expected a list of HTTP status codes such as [500, 502]")
    codes = set()
    for item in value:
        try:
            code = validate_number(name, item, integer=True, from_env=from_env)
        except ConfigError:
            raise _fail(name, raw, f"{item!r} is not an HTTP status code") from None
        if not 100 <= code <= 599:
            raise _fail(name, raw, f"{code} is not an HTTP status code (100-599)")
        codes.add(int(code))
    return frozenset(codes)


def _json_dict(name: str, value: Any, from_env: bool) -> dict[Any, Any]:
    if from_env and isinstance(value, str):
        try:
            value = json.loads(value) if value.strip() else {}
        except json.JSONDecodeError as exc:
            raise _fail(name, value, f"malformed JSON ({exc.msg})") from None
    if not isinstance(value, dict):
        raise _fail(name, value, "expected a mapping (a JSON object in the environment)")
    return value


def _json_list(name: str, value: Any, from_env: bool) -> list[Any]:
    if from_env and isinstance(value, str):
        try:
            value = json.loads(value) if value.strip() else []
        except json.JSONDecodeError as exc:
            raise _fail(name, value, f"malformed JSON ({exc.msg})") from None
    if not isinstance(value, (list, tuple)):
        raise _fail(name, value, "expected a list (a JSON array in the environment)")
    return list(value)


def _service_names(name: str, value: Any, from_env: bool) -> list[str]:
    raw = value
    value = _json_or_csv(name, value, from_env)
    if isinstance(value, (str, bytes, dict)) or not isinstance(value, (list, tuple, set, frozenset)):
        raise _fail(name, raw, "expected a list of breaker names such as ['payments']")
    names = []
    for item in value:
        if not isinstance(item, str) or not item:
            raise _fail(name, raw, f"{item!r} is not a breaker name (a non-empty string)")
        if item not in names:
            names.append(item)
    return names


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
        parser = SERVICE_KEYS.get(key) or PREDICATE_KEYS.get(key)
        if parser is None:
            known = [*SERVICE_KEYS, *PREDICATE_KEYS]
            near = difflib.get_close_matches(str(key), known, n=1)
            hint = f"; did you mean {near[0]!r}?" if near else f"; known keys: {', '.join(known)}"
            raise ConfigError(f"{where}: unknown key {key!r}{hint}")
        out[key] = parser(f"{where}[{key!r}]", raw, from_env)
    return out


# ------------------------------------------------------------------ predicates
# module.attribute, at least one dot; every part an identifier
_DOTTED = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)+$")


def is_exception_type(value: Any) -> bool:
    """True for a class deriving from ``BaseException``."""
    return isinstance(value, type) and issubclass(value, BaseException)


def is_predicate(value: Any) -> bool:
    """True for a callable that is not a class (calling ``KeyError(exc)`` judges nothing)."""
    return callable(value) and not isinstance(value, type)


def _predicate(name: str, value: Any, from_env: bool) -> str:
    """A ``failure_predicate``/``result_predicate`` of ``BALDUR_SERVICES``: the dotted import
    path of a function, kept as text and imported when a breaker is built."""
    if isinstance(value, str) and _DOTTED.match(value.strip()):
        return value.strip()
    shown = "a dotted import path" if isinstance(value, str) else "given as its dotted import path (a string)"
    raise _fail(name, value, f"expected the function {shown}, such as 'myapp.breakers.is_outage'")


def _ignore(name: str, value: Any, from_env: bool) -> tuple[str, ...]:
    """``ignore_exceptions`` of ``BALDUR_SERVICES``: a dotted import path or a list of them,
    each naming an exception class or a function ``f(exc) -> bool``; imported when a breaker
    is built."""
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, (list, tuple)):
        raise _fail(name, value, "expected a list of dotted import paths such as ['myapp.errors.NotFound']")
    for item in items:
        if not (isinstance(item, str) and _DOTTED.match(item.strip())):
            raise _fail(name, value, f"{item!r} is not a dotted import path such as 'myapp.errors.NotFound'")
    return tuple(item.strip() for item in items)


#: ``BALDUR_SERVICES`` keys (and per-call overrides) that hold predicates rather than a
#: knob's value, with the parser that checks their form. No global setting exists
#: for them: they are per breaker only.
PREDICATE_KEYS: dict[str, Parser] = {
    "ignore_exceptions": _ignore,
    "failure_predicate": _predicate,
    "result_predicate": _predicate,
}


class _Services:
    """Parser of ``BALDUR_SERVICES``; ``accepts`` lists the keys an entry may set."""

    def __call__(self, name: str, value: Any, from_env: bool) -> dict[str, dict[str, Any]]:
        value = _json_dict(name, value, from_env)
        out = {}
        for service, overrides in value.items():
            if not isinstance(service, str) or not service:
                raise _fail(name, value, f"service names must be non-empty strings, got {service!r}")
            if not isinstance(overrides, dict):
                raise _fail(name, value, f"the entry for {service!r} must be a mapping of overrides")
            out[service] = check_service_overrides(f"{name}[{service!r}]", overrides, from_env)
        return out

    @property
    def accepts(self) -> str:
        return (
            "A dict mapping each service name to a dict of overrides; allowed keys: "
            + ", ".join([*SERVICE_KEYS, *PREDICATE_KEYS])
            + " (the last three as dotted import paths, such as 'myapp.breakers.is_outage')."
        )


_services = _Services()


def _domain_mapping(name: str, value: Any, from_env: bool) -> dict[str, str]:
    value = _json_dict(name, value, from_env)
    for key, domain in value.items():
        if not isinstance(key, str) or not key or not isinstance(domain, str) or not domain:
            raise _fail(
                name, value, f"entries map a non-empty path substring to a domain name, got {key!r}: {domain!r}"
            )
    return dict(value)


_URL_PASSWORD = re.compile(r"(?P<head>[a-zA-Z][a-zA-Z0-9+.-]*://[^:/@\s]*):[^@/\s]+@")


def _hide_password(url: str) -> str:
    """*url* with the password of any ``user:password@`` part masked (messages never leak it)."""
    return _URL_PASSWORD.sub(lambda m: m.group("head") + ":***@", url)


def _redis_url(name: str, value: Any, from_env: bool) -> str | None:
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    if not isinstance(value, str):
        raise _fail(name, value, "expected a URL string")
    shown = _hide_password(value)
    parsed = urlparse(value.strip())
    if parsed.scheme not in ("redis", "rediss", "unix"):
        raise _fail(name, shown, "expected redis://, rediss:// or unix:// URL")
    try:
        parsed.port  # noqa: B018 - raises on a bad port
    except ValueError:
        raise _fail(name, shown, "the port is not a number between 0 and 65535") from None
    if parsed.scheme != "unix" and not parsed.hostname:
        raise _fail(name, shown, "the URL names no host")
    if parsed.scheme == "unix" and not parsed.path:
        raise _fail(name, shown, "the unix:// URL names no socket path")
    if parsed.scheme != "unix":
        db = parsed.path.strip("/")
        if db and not db.isdigit():
            # redis-py would fail later with a bare int() error deep inside
            raise _fail(name, shown, f"the database number {db!r} in the path is not a whole number")
    return value.strip()


def _https_url(name: str, value: Any, from_env: bool) -> str | None:
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    if not isinstance(value, str):
        raise _fail(name, "<hidden>", "expected a URL string")
    parsed = urlparse(value.strip())
    # never echo the value: a webhook URL is a secret
    if parsed.scheme.lower() == "http":
        raise ConfigError(
            f"{name}: a plain http:// URL would send the webhook's secret in clear; an https:// URL is required "
            "(value not shown)"
        )
    if parsed.scheme.lower() != "https" or not parsed.hostname:
        raise ConfigError(f"{name}: expected an https:// URL (value not shown)")
    return value.strip()


_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def _log_level(name: str, value: Any, from_env: bool) -> str:
    if isinstance(value, str) and value.strip().upper() in _LEVELS:
        return value.strip().upper()
    if isinstance(value, int) and not isinstance(value, bool) and value in (10, 20, 30, 40, 50):
        return _LEVELS[value // 10 - 1]
    raise _fail(name, value, f"expected a log level: {', '.join(_LEVELS)}")


def _rules(name: str, value: Any, from_env: bool) -> list[dict[str, Any]]:
    value = _json_list(name, value, from_env)
    rules = []
    for i, rule in enumerate(value):
        if not isinstance(rule, dict):
            raise _fail(name, value, f"rule {i} must be a mapping with 'path', 'rate' and 'key'")
        unknown = set(rule) - {"path", "rate", "key"}
        if unknown:
            raise _fail(name, value, f"rule {i} has unknown keys {sorted(unknown)}")
        path = rule.get("path", "")
        if not isinstance(path, str):
            raise _fail(name, value, f"rule {i}: 'path' must be a string")
        rate = rule.get("rate")
        if not isinstance(rate, str) or "/" not in rate:
            raise _fail(name, value, f"rule {i}: 'rate' must look like '10/m' (N per s, m or h)")
        count, _, unit = rate.partition("/")
        if not count.strip().isdigit() or int(count) < 1 or unit.strip() not in ("s", "m", "h"):
            raise _fail(name, value, f"rule {i}: 'rate' {rate!r} must look like '10/m' (N per s, m or h)")
        key = rule.get("key", "ip")
        if not isinstance(key, str) or not key:
            raise _fail(name, value, f"rule {i}: 'key' must be 'ip', 'user' or a dotted path")
        rules.append({"path": path, "rate": rate.replace(" ", ""), "key": key})
    return rules


_BOOL_ACCEPTS = "True or False (in the environment: true/false, 1/0, yes/no or on/off)."
_STATUS_ACCEPTS = "A list of HTTP status codes (100-599); in the environment {example}."


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


def _default_emergency_file() -> str:
    return os.path.join(tempfile.gettempdir(), "baldur_emergency_state.json")


_ROWS: list[Knob] = [
    # ------------------------------------------------------------ one breaker (per-call / BALDUR_SERVICES keys)
    Knob(
        "BALDUR_CB_FAILURE_THRESHOLD",
        5,
        _num(integer=True, minimum=1),
        "consecutive failures that open a breaker",
        "baldur.E010",
        key="failure_threshold",
    ),
    Knob(
        "BALDUR_CB_FAILURE_RATE_THRESHOLD",
        50.0,
        _num(minimum=0, maximum=100, unit=_PERCENT),
        "failure percentage that opens a breaker; 0 disables",
        "baldur.E011",
        key="failure_rate_threshold",
    ),
    Knob(
        "BALDUR_CB_SLIDING_WINDOW_SIZE",
        100,
        _num(integer=True, minimum=1),
        "outcomes in the count-based window",
        "baldur.E012",
        key="sliding_window_size",
    ),
    Knob(
        "BALDUR_CB_SLIDING_WINDOW_TYPE",
        "count",
        _choice("count", "time"),
        "count-based window (last N outcomes) or time-based window (last N seconds)",
        "baldur.E013",
        key="sliding_window_type",
    ),
    Knob(
        "BALDUR_CB_SLIDING_WINDOW_SECONDS",
        60,
        _num(integer=True, minimum=1, unit=_SECONDS),
        "span of the time-based window, whole seconds",
        "baldur.E014",
        accepts="A whole number of seconds, at least 1: the time-based window counts outcomes in one-second "
        "buckets, so unlike the other *_SECONDS settings it takes no fractions.",
        key="sliding_window_seconds",
    ),
    Knob(
        "BALDUR_CB_MINIMUM_CALLS",
        10,
        _num(integer=True, minimum=1),
        "outcomes the window needs before the rate triggers apply",
        "baldur.E015",
        key="minimum_calls",
    ),
    Knob(
        "BALDUR_CB_RECOVERY_TIMEOUT",
        60,
        _num(minimum=0, exclusive=True, unit=_SECONDS),
        "seconds OPEN before a probe is allowed",
        "baldur.E016",
        key="recovery_timeout",
    ),
    Knob(
        "BALDUR_CB_HALF_OPEN_MAX_CALLS",
        3,
        _num(integer=True, minimum=1),
        "trial calls per probing round",
        "baldur.E017",
        key="half_open_max_calls",
    ),
    Knob(
        "BALDUR_CB_RECOVERY_BACKOFF_FACTOR",
        1.0,
        _num(minimum=1.0),
        "growth of the recovery timeout on repeated opens; 1 = off",
        "baldur.E018",
        key="recovery_backoff_factor",
    ),
    Knob(
        "BALDUR_CB_RECOVERY_TIMEOUT_MAX",
        600,
        _num(minimum=0, exclusive=True, unit=_SECONDS),
        "upper bound of the backed-off recovery timeout, seconds",
        "baldur.E019",
        key="recovery_timeout_max",
    ),
    Knob(
        "BALDUR_CB_SLOW_CALL_DURATION_SECONDS",
        0,
        _num(minimum=0, unit=_SECONDS),
        "calls lasting this long or longer are slow; 0 = off",
        "baldur.E020",
        key="slow_call_duration",
    ),
    Knob(
        "BALDUR_CB_SLOW_CALL_RATE_THRESHOLD",
        100.0,
        _num(minimum=0, maximum=100, unit=_PERCENT),
        "slow-call percentage that opens a breaker; 0 disables",
        "baldur.E021",
        key="slow_call_rate_threshold",
    ),
    Knob("BALDUR_SERVICES", {}, _services, "per-service overrides", "baldur.E022"),
    # ------------------------------------------------------------ what counts as a failure; 429s
    Knob(
        "BALDUR_MIDDLEWARE_CB_STATUS_CODES",
        frozenset({500, 502, 503, 504}),
        _status_codes,
        "statuses recorded as failures",
        "baldur.E023",
        accepts=_STATUS_ACCEPTS.format(example="'500,503' or '[500, 503]'"),
    ),
    Knob(
        "BALDUR_MIDDLEWARE_RATE_LIMIT_CODES",
        frozenset({429}),
        _status_codes,
        "statuses read as rate-limit answers",
        "baldur.E024",
        accepts=_STATUS_ACCEPTS.format(example="'429' or '[429]'"),
    ),
    Knob(
        "BALDUR_CB_RATE_LIMIT_CASCADE_THRESHOLD",
        10,
        _num(integer=True, minimum=1),
        "429 sightings that can open a breaker",
        "baldur.E025",
    ),
    Knob(
        "BALDUR_CB_RATE_LIMIT_CASCADE_WINDOW_SECONDS",
        60,
        _num(minimum=0, exclusive=True, unit=_SECONDS),
        "span of the cascade window, seconds",
        "baldur.E026",
    ),
    Knob(
        "BALDUR_CB_RATE_LIMIT_CASCADE_MIN_RATIO",
        10.0,
        _num(minimum=0, maximum=100, unit=_PERCENT),
        "sightings as a percentage of calls",
        "baldur.E027",
    ),
    Knob(
        "BALDUR_CB_RATE_LIMIT_CASCADE_MIN_CALLS",
        20,
        _num(integer=True, minimum=1),
        "calls the cascade window needs",
        "baldur.E028",
    ),
    Knob(
        "BALDUR_RATE_LIMIT_DEFAULT_COOLDOWN_SECONDS",
        1.0,
        _num(minimum=0, unit=_SECONDS),
        "cooldown when no valid Retry-After is given",
        "baldur.E029",
    ),
    Knob(
        "BALDUR_RATE_LIMIT_MAX_COOLDOWN_SECONDS",
        3600,
        _num(minimum=0, exclusive=True, unit=_SECONDS),
        "cap on any cooldown, seconds",
        "baldur.E030",
    ),
    Knob(
        "BALDUR_MAX_COOLDOWN_WAIT_SECONDS",
        60,
        _num(minimum=0, unit=_SECONDS),
        "longest cooldown the retry stage waits out, seconds",
        "baldur.E031",
    ),
    # ------------------------------------------------------------ operators
    Knob(
        "BALDUR_CB_MANUAL_OVERRIDE_TTL_MINUTES",
        90,
        _num(minimum=0, maximum=MAX_LIFETIME_MINUTES, exclusive=True),
        "default force lifetime, minutes",
        "baldur.E032",
        accepts=f"A number of minutes above 0 and at most {MAX_LIFETIME_MINUTES} (24 hours).",
    ),
    # ------------------------------------------------------------ inbound middleware
    Knob(
        "BALDUR_DOMAIN_MAPPING",
        {},
        _domain_mapping,
        "path substring -> domain breaker",
        "baldur.E033",
        accepts="A dict mapping a path substring to a domain (breaker) name.",
    ),
    Knob(
        "BALDUR_DOMAIN_DEFAULT",
        "default",
        _text(),
        "breaker for unmapped paths",
        "baldur.E034",
        accepts="A non-empty string.",
    ),
    Knob(
        "BALDUR_MIDDLEWARE_SHED_LOAD",
        False,
        _bool,
        "answer 503 while a domain's breaker denies admission",
        "baldur.E035",
        accepts=_BOOL_ACCEPTS,
    ),
    Knob(
        "BALDUR_RATE_LIMIT_CACHE_ALIAS",
        "default",
        _text(),
        "Django cache alias for the inbound limiter",
        "baldur.E036",
        accepts="A key of CACHES.",
    ),
    Knob(
        "BALDUR_RATE_LIMIT_RULES",
        [],
        _rules,
        "inbound rate-limit rules",
        "baldur.E037",
        accepts="A list of dicts such as {'path': '/api/', 'rate': '100/m', 'key': 'ip'}; "
        "rate is N/s, N/m or N/h; key is 'ip', 'user' or a dotted path.",
    ),
    Knob(
        "BALDUR_RATE_LIMIT_TRUST_FORWARDED_FOR",
        False,
        _bool,
        "read the client IP from X-Forwarded-For",
        "baldur.E038",
        accepts=_BOOL_ACCEPTS,
    ),
    Knob(
        "BALDUR_RATE_LIMIT_TRUSTED_PROXIES",
        1,
        _num(integer=True, minimum=1),
        "X-Forwarded-For entry from the right that is the client",
        "baldur.E039",
    ),
    # ------------------------------------------------------------ shared state
    Knob(
        "BALDUR_STATE_BACKEND",
        "memory",
        _StoreChoice(("memory", "database", "redis")),
        "where breaker state lives",
        "baldur.E040",
    ),
    Knob(
        "BALDUR_REDIS_URL",
        None,
        _redis_url,
        "Redis URL for the redis backend",
        "baldur.E041",
        accepts="A redis://host:6379/0 URL (rediss:// for TLS, unix:///path for a socket).",
    ),
    Knob(
        "BALDUR_REDIS_CACHE_ALIAS",
        "default",
        _text(),
        "django-redis cache alias used when no URL is set",
        "baldur.E042",
        accepts="A key of CACHES whose backend is django-redis.",
    ),
    Knob(
        "BALDUR_REDIS_SOCKET_TIMEOUT",
        0.25,
        _num(minimum=0, exclusive=True, unit=_SECONDS),
        "connect and read timeout, seconds",
        "baldur.E043",
    ),
    Knob("BALDUR_REDIS_MAX_CONNECTIONS", 50, _num(integer=True, minimum=1), "connection pool size", "baldur.E044"),
    Knob(
        "BALDUR_REDIS_CLUSTER",
        False,
        _bool,
        "BALDUR_REDIS_URL names one node of a Redis Cluster",
        "baldur.E066",
        accepts=_BOOL_ACCEPTS,
    ),
    Knob(
        "BALDUR_STORE_WARNING_INTERVAL_SECONDS",
        60,
        _num(minimum=0, unit=_SECONDS),
        "at most one store warning per interval, seconds",
        "baldur.E045",
    ),
    Knob(
        "BALDUR_CB_SYNC_INTERVAL_SECONDS",
        5,
        _num(minimum=0, unit=_SECONDS),
        "longest gap between consults of the shared record; 0 = events only",
        "baldur.E046",
    ),
    Knob(
        "BALDUR_CB_HALF_OPEN_PROBE_LEASE_SECONDS",
        30,
        _num(minimum=0, exclusive=True, unit=_SECONDS),
        "lease of one half-open probe, seconds",
        "baldur.E047",
    ),
    Knob(
        "BALDUR_REGISTRY_TTL_DAYS",
        7,
        _num(minimum=0, exclusive=True, unit="days"),
        "registry entries unseen this long are pruned, days",
        "baldur.E048",
    ),
    # ------------------------------------------------------------ Celery tasks
    Knob(
        "BALDUR_TASK_RECOVERY_SWEEP_SECONDS",
        10,
        _num(minimum=0, exclusive=True, unit=_SECONDS),
        "recovery_sweep interval, seconds",
        "baldur.E049",
    ),
    Knob(
        "BALDUR_TASK_STATE_SYNC_SECONDS",
        30,
        _num(minimum=0, exclusive=True, unit=_SECONDS),
        "sync_state interval, seconds",
        "baldur.E050",
    ),
    Knob(
        "BALDUR_TASK_EMERGENCY_CHECK_SECONDS",
        10,
        _num(minimum=0, exclusive=True, unit=_SECONDS),
        "emergency_check interval, seconds",
        "baldur.E051",
    ),
    Knob(
        "BALDUR_TASK_META_WATCHDOG_SECONDS",
        60,
        _num(minimum=0, exclusive=True, unit=_SECONDS),
        "meta_watchdog interval, seconds",
        "baldur.E067",
    ),
    # ------------------------------------------------------------ operators, logging, notifications
    Knob("BALDUR_DRY_RUN", False, _bool, "observe only: never reject", "baldur.E052", accepts=_BOOL_ACCEPTS),
    Knob(
        "BALDUR_EVENT_LOGGING_CB_LOG_LEVEL",
        "WARNING",
        _log_level,
        "level of transition, force, release and lapse lines",
        "baldur.E053",
        accepts="A level name: DEBUG, INFO, WARNING, ERROR or CRITICAL.",
    ),
    Knob(
        "BALDUR_META_WATCHDOG_SLACK_WEBHOOK_URL",
        None,
        _https_url,
        "Slack incoming webhook for open/close posts",
        "baldur.E054",
        accepts="The https:// URL Slack gave you for the incoming webhook.",
        secret=True,
    ),
    # ------------------------------------------------------------ watchdog, propagation, Emergency Mode
    Knob(
        "BALDUR_META_WATCHDOG_AUTO_RECOVERY_ENABLED",
        False,
        _bool,
        "force-close breakers stuck OPEN",
        "baldur.E055",
        accepts=_BOOL_ACCEPTS,
    ),
    Knob(
        "BALDUR_META_WATCHDOG_STUCK_OPEN_SECONDS",
        300,
        _num(minimum=0, exclusive=True, unit=_SECONDS),
        "OPEN this long counts as stuck, seconds",
        "baldur.E056",
    ),
    Knob(
        "BALDUR_CB_CLUSTER_STATE_PROPAGATION_ENABLED",
        False,
        _bool,
        "publish OPEN/CLOSED decisions to peers over Redis pub/sub",
        "baldur.E057",
        accepts=_BOOL_ACCEPTS,
    ),
    Knob(
        "BALDUR_EMERGENCY_BACKEND", "file", _choice("file", "redis"), "where the emergency level lives", "baldur.E058"
    ),
    Knob(
        "BALDUR_EMERGENCY_STATE_FILE",
        _default_emergency_file(),
        _text(),
        "file backend path",
        "baldur.E059",
        accepts="A file path the worker processes may write.",
    ),
    Knob(
        "BALDUR_EMERGENCY_CACHE_SECONDS",
        30,
        _num(minimum=0, unit=_SECONDS),
        "how long a process caches the level, seconds",
        "baldur.E060",
    ),
    Knob(
        "BALDUR_EMERGENCY_AUTO_ACTIVATION_ENABLED",
        False,
        _bool,
        "declare Level 3 when most breakers are OPEN",
        "baldur.E061",
        accepts=_BOOL_ACCEPTS,
    ),
    Knob(
        "BALDUR_EMERGENCY_AUTO_ACTIVATION_RATIO",
        70.0,
        _num(minimum=0, maximum=100, unit=_PERCENT),
        "OPEN percentage for auto-activation",
        "baldur.E062",
    ),
    Knob(
        "BALDUR_EMERGENCY_AUTO_ACTIVATION_MIN_BREAKERS",
        3,
        _num(integer=True, minimum=1),
        "registered breakers needed",
        "baldur.E063",
    ),
    Knob(
        "BALDUR_EMERGENCY_AUTO_ACTIVATION_MINUTES",
        30,
        _num(minimum=0, exclusive=True, unit="minutes"),
        "length of an automatic Level 3, minutes",
        "baldur.E064",
    ),
    Knob(
        "BALDUR_EMERGENCY_STABILIZATION_SECONDS",
        300,
        _num(minimum=0, unit=_SECONDS),
        "quiet time after a freeze ends, seconds",
        "baldur.E065",
    ),
    # ------------------------------------------------------------ health endpoint (contrib.health)
    Knob(
        "BALDUR_HEALTH_CRITICAL_SERVICES",
        [],
        _service_names,
        "breakers whose OPEN state makes the health endpoint answer 503",
        "baldur.E072",
        accepts="A list of breaker names; in the environment 'payments,search' or '[\"payments\"]'.",
    ),
    Knob(
        "BALDUR_HEALTH_DETAILS",
        False,
        _bool,
        "show every breaker's state to any caller of the health endpoint, not only to staff",
        "baldur.E073",
        accepts=_BOOL_ACCEPTS,
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

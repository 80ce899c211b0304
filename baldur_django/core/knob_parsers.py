"""The parsers and validators of the knobs table: each turns a raw setting or
environment value into a checked one, or raises :class:`ConfigError` naming the knob."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

from .errors import ConfigError
from .names import name_problem, show_name

#: ``parser(name, raw value, from_env) -> parsed value``; raises ConfigError naming *name*.
Parser = Callable[[str, Any, bool], Any]


#: The longest lifetime, in minutes, of an operator's force and of an Emergency Mode level
#: (24 hours): a force or a level nobody renews always ends within a day.
MAX_LIFETIME_MINUTES = 1440


def fail(name: str, value: Any, why: str) -> ConfigError:
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
    checked = _as_number(name, value, integer, from_env)
    _check_bounds(name, value, checked, minimum, maximum, min_exclusive)
    return int(checked) if integer else float(checked)


def _from_text(name: str, value: str, integer: bool) -> float | int:
    """The number an environment string spells (an int first when *integer*)."""
    text = value.strip()
    try:
        return int(text) if integer else float(text)
    except ValueError:
        try:
            return float(text)
        except ValueError:
            raise fail(name, value, "expected a number") from None


def _as_number(name: str, raw: Any, integer: bool, from_env: bool) -> float | int:
    """*raw* as a finite int (when *integer*) or float; raises ConfigError otherwise."""
    if isinstance(raw, bool):
        raise fail(name, raw, "a boolean is not a number")
    value = _from_text(name, raw, integer) if isinstance(raw, str) and from_env else raw
    if not isinstance(value, (int, float)):
        raise fail(name, raw, "expected a number")
    if isinstance(value, float) and not math.isfinite(value):
        raise fail(name, raw, "must be a finite number")
    if integer:
        if isinstance(value, float):
            if not value.is_integer():
                raise fail(name, raw, "expected a whole number")
            value = int(value)
        return value
    try:
        return float(value)
    except OverflowError:  # an int too large for a float (10**400)
        raise fail(name, raw, "is too large") from None


def _check_bounds(
    name: str, raw: Any, value: float, minimum: float | None, maximum: float | None, min_exclusive: bool
) -> None:
    if minimum is not None:
        if min_exclusive and value <= minimum:
            raise fail(name, raw, f"must be greater than {minimum:g}")
        if not min_exclusive and value < minimum:
            raise fail(name, raw, f"must be at least {minimum:g}")
    if maximum is not None and value > maximum:
        raise fail(name, raw, f"must be at most {maximum:g}")


@dataclass(frozen=True)
class Number:
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
        if self.unit == PERCENT:
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


def number(
    integer: bool = False,
    minimum: float | None = None,
    maximum: float | None = None,
    exclusive: bool = False,
    unit: str = "",
) -> Number:
    return Number(integer, minimum, maximum, exclusive, unit)


SECONDS = "seconds"
PERCENT = "percent"


@dataclass(frozen=True)
class Optional:
    """Parser of a value that may be left unset: None (or, from the environment, an empty
    string) stays None; anything else goes to *parser*."""

    parser: Parser

    def __call__(self, name: str, value: Any, from_env: bool) -> Any:
        if value is None or (from_env and isinstance(value, str) and not value.strip()):
            return None
        return self.parser(name, value, from_env)

    @property
    def accepts(self) -> str:
        inner = str(getattr(self.parser, "accepts", "")).rstrip(".")
        return f"{inner}, or None (unset: off)."


def optional(parser: Parser) -> Optional:
    return Optional(parser)


_HEADER_TOKEN = re.compile(r"[A-Za-z0-9!#$%&'*+.^_`|~-]+")


def header_name(name: str, value: Any, from_env: bool) -> str:
    """An HTTP header name (a token: letters, digits, hyphens and a few marks)."""
    if not isinstance(value, str) or not _HEADER_TOKEN.fullmatch(value.strip()):
        raise fail(name, value, "expected an HTTP header name such as 'X-Request-Deadline'")
    return value.strip()


header_name.accepts = "An HTTP header name such as 'X-Request-Deadline'."  # type: ignore[attr-defined]

TRUE_WORDS = {"1", "true", "yes", "on"}
FALSE_WORDS = {"0", "false", "no", "off", ""}


def flag(name: str, value: Any, from_env: bool) -> bool:
    if isinstance(value, bool):
        return value
    if from_env and isinstance(value, str):
        low = value.strip().lower()
        if low in TRUE_WORDS:
            return True
        if low in FALSE_WORDS:
            return False
    raise fail(name, value, "expected a boolean (true/false)")


def text_value(allow_empty: bool = False, optional: bool = False) -> Parser:
    def parser(name: str, value: Any, from_env: bool) -> Any:
        if value is None and optional:
            return None
        if not isinstance(value, str):
            raise fail(name, value, "expected a string")
        if not value.strip():
            if optional:
                return None
            if not allow_empty:
                raise fail(name, value, "must not be empty")
        return value

    return parser


@dataclass(frozen=True)
class Choice:
    """Parser of one of a few words (any case); ``accepts`` lists them."""

    choices: tuple[str, ...]

    def __call__(self, name: str, value: Any, from_env: bool) -> str:
        if isinstance(value, str) and value.strip().lower() in self.choices:
            return value.strip().lower()
        raise fail(name, value, f"expected one of {', '.join(self.choices)}")

    @property
    def accepts(self) -> str:
        quoted = [repr(c) for c in self.choices]
        return "One of " + ", ".join(quoted[:-1]) + " or " + quoted[-1] + "."


def choice(*choices: str) -> Choice:
    return Choice(choices)


DOTTED_PATH = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)+")


@dataclass(frozen=True)
class StoreChoice(Choice):
    """Parser of ``BALDUR_STATE_BACKEND``: a bundled backend's name (any case) or the dotted
    path of a store class. Only the path's form is checked here; importing it is the
    Django layer's job (``baldur_django.backends.store_class`` and its system check)."""

    def __call__(self, name: str, value: Any, from_env: bool) -> str:
        if isinstance(value, str) and DOTTED_PATH.fullmatch(value.strip()):
            return value.strip()
        if isinstance(value, str) and value.strip().lower() in self.choices:
            return value.strip().lower()
        raise fail(name, value, f"expected one of {', '.join(self.choices)}, or the dotted path of a store class")

    @property
    def accepts(self) -> str:
        return (
            super().accepts[:-1] + ", or the dotted path of a store class such as 'myproject.stores.MyStore' "
            '(see "Shared stores", section "Writing a store of your own", in the documentation).'
        )


def json_or_csv(name: str, value: Any, from_env: bool) -> Any:
    if from_env and isinstance(value, str):
        text = value.strip()
        if text.startswith("[") or text.startswith("{"):
            try:
                return json.loads(text)
            except json.JSONDecodeError as exc:
                raise fail(name, value, f"malformed JSON ({exc.msg})") from None
        return [part.strip() for part in text.split(",") if part.strip()]
    return value


def status_codes(name: str, value: Any, from_env: bool) -> frozenset[int]:
    raw = value  # messages show what the user wrote, not the parsed form
    value = json_or_csv(name, value, from_env)
    if isinstance(value, (str, bytes, dict)) or not hasattr(value, "__iter__"):
        raise fail(name, raw, "expected a list of HTTP status codes such as [500, 502]")
    codes = set()
    for item in value:
        try:
            code = validate_number(name, item, integer=True, from_env=from_env)
        except ConfigError:
            raise fail(name, raw, f"{item!r} is not an HTTP status code") from None
        if not 100 <= code <= 599:
            raise fail(name, raw, f"{code} is not an HTTP status code (100-599)")
        codes.add(int(code))
    return frozenset(codes)


def json_dict(name: str, value: Any, from_env: bool) -> dict[Any, Any]:
    if from_env and isinstance(value, str):
        try:
            value = json.loads(value) if value.strip() else {}
        except json.JSONDecodeError as exc:
            raise fail(name, value, f"malformed JSON ({exc.msg})") from None
    if not isinstance(value, dict):
        raise fail(name, value, "expected a mapping (a JSON object in the environment)")
    return value


def json_list(name: str, value: Any, from_env: bool) -> list[Any]:
    if from_env and isinstance(value, str):
        try:
            value = json.loads(value) if value.strip() else []
        except json.JSONDecodeError as exc:
            raise fail(name, value, f"malformed JSON ({exc.msg})") from None
    if not isinstance(value, (list, tuple)):
        raise fail(name, value, "expected a list (a JSON array in the environment)")
    return list(value)


def service_names(name: str, value: Any, from_env: bool) -> list[str]:
    raw = value
    value = json_or_csv(name, value, from_env)
    if isinstance(value, (str, bytes, dict)) or not isinstance(value, (list, tuple, set, frozenset)):
        raise fail(name, raw, "expected a list of breaker names such as ['payments']")
    names = []
    for item in value:
        if name_problem(item) is not None:
            raise fail(name, raw, f"{show_name(item, 60)} is not a breaker name: it {name_problem(item)}")
        if item not in names:
            names.append(item)
    return names


# ------------------------------------------------------------------ predicates
# module.attribute, at least one dot; every part an identifier
DOTTED = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)+$")


def is_exception_type(value: Any) -> bool:
    """True for a class deriving from ``BaseException``."""
    return isinstance(value, type) and issubclass(value, BaseException)


def is_predicate(value: Any) -> bool:
    """True for a callable that is not a class (calling ``KeyError(exc)`` judges nothing)."""
    return callable(value) and not isinstance(value, type)


def predicate_path(name: str, value: Any, from_env: bool) -> str:
    """A ``failure_predicate``/``result_predicate`` of ``BALDUR_SERVICES``: the dotted import
    path of a function, kept as text and imported when a breaker is built."""
    if isinstance(value, str) and DOTTED.match(value.strip()):
        return value.strip()
    shown = "a dotted import path" if isinstance(value, str) else "given as its dotted import path (a string)"
    raise fail(name, value, f"expected the function {shown}, such as 'myapp.breakers.is_outage'")


def ignore_paths(name: str, value: Any, from_env: bool) -> tuple[str, ...]:
    """``ignore_exceptions`` of ``BALDUR_SERVICES``: a dotted import path or a list of them,
    each naming an exception class or a function ``f(exc) -> bool``; imported when a breaker
    is built."""
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, (list, tuple)):
        raise fail(name, value, "expected a list of dotted import paths such as ['myapp.errors.NotFound']")
    for item in items:
        if not (isinstance(item, str) and DOTTED.match(item.strip())):
            raise fail(name, value, f"{item!r} is not a dotted import path such as 'myapp.errors.NotFound'")
    return tuple(item.strip() for item in items)


def domain_mapping(name: str, value: Any, from_env: bool) -> dict[str, str]:
    value = json_dict(name, value, from_env)
    for key, domain in value.items():
        if not isinstance(key, str) or not key or name_problem(domain) is not None:
            raise fail(
                name,
                value,
                f"entries map a non-empty path substring to a domain (breaker) name, got {key!r}: {domain!r}",
            )
    return dict(value)


def breaker_name(name: str, value: Any, from_env: bool) -> str:
    if name_problem(value) is not None:
        raise fail(name, value, f"not a breaker name: it {name_problem(value)}")
    return str(value)


URL_PASSWORD = re.compile(r"(?P<head>[a-zA-Z][a-zA-Z0-9+.-]*://[^:/@\s]*):[^@/\s]+@")


def hide_password(url: str) -> str:
    """*url* with the password of any ``user:password@`` part masked (messages never leak it)."""
    return URL_PASSWORD.sub(lambda m: m.group("head") + ":***@", url)


def redis_url(name: str, value: Any, from_env: bool) -> str | None:
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    if not isinstance(value, str):
        raise fail(name, value, "expected a URL string")
    shown = hide_password(value)
    parsed = urlparse(value.strip())
    if parsed.scheme not in ("redis", "rediss", "unix"):
        raise fail(name, shown, "expected redis://, rediss:// or unix:// URL")
    try:
        parsed.port  # noqa: B018 - raises on a bad port
    except ValueError:
        raise fail(name, shown, "the port is not a number between 0 and 65535") from None
    if parsed.scheme != "unix" and not parsed.hostname:
        raise fail(name, shown, "the URL names no host")
    if parsed.scheme == "unix" and not parsed.path:
        raise fail(name, shown, "the unix:// URL names no socket path")
    if parsed.scheme != "unix":
        db = parsed.path.strip("/")
        if db and not db.isdigit():
            # redis-py would fail later with a bare int() error deep inside
            raise fail(name, shown, f"the database number {db!r} in the path is not a whole number")
    return value.strip()


def https_url(name: str, value: Any, from_env: bool) -> str | None:
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    if not isinstance(value, str):
        raise fail(name, "<hidden>", "expected a URL string")
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


LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def log_level(name: str, value: Any, from_env: bool) -> str:
    if isinstance(value, str) and value.strip().upper() in LOG_LEVELS:
        return value.strip().upper()
    if isinstance(value, int) and not isinstance(value, bool) and value in (10, 20, 30, 40, 50):
        return LOG_LEVELS[value // 10 - 1]
    raise fail(name, value, f"expected a log level: {', '.join(LOG_LEVELS)}")


def rate_rules(name: str, value: Any, from_env: bool) -> list[dict[str, Any]]:
    value = json_list(name, value, from_env)
    rules = []
    for i, rule in enumerate(value):
        if not isinstance(rule, dict):
            raise fail(name, value, f"rule {i} must be a mapping with 'path', 'rate' and 'key'")
        unknown = set(rule) - {"path", "rate", "key"}
        if unknown:
            raise fail(name, value, f"rule {i} has unknown keys {sorted(unknown)}")
        path = rule.get("path", "")
        if not isinstance(path, str):
            raise fail(name, value, f"rule {i}: 'path' must be a string")
        rate = rule.get("rate")
        if not isinstance(rate, str) or "/" not in rate:
            raise fail(name, value, f"rule {i}: 'rate' must look like '10/m' (N per s, m or h)")
        count, _, unit = rate.partition("/")
        if not count.strip().isdigit() or int(count) < 1 or unit.strip() not in ("s", "m", "h"):
            raise fail(name, value, f"rule {i}: 'rate' {rate!r} must look like '10/m' (N per s, m or h)")
        key = rule.get("key", "ip")
        if not isinstance(key, str) or not key:
            raise fail(name, value, f"rule {i}: 'key' must be 'ip', 'user' or a dotted path")
        rules.append({"path": path, "rate": rate.replace(" ", ""), "key": key})
    return rules


BOOL_ACCEPTS = "True or False (in the environment: true/false, 1/0, yes/no or on/off)."
STATUS_ACCEPTS = "A list of HTTP status codes (100-599); in the environment {example}."

"""Outcome classification: exceptions, returned responses, 429 sightings, Retry-After.

Pure functions, no I/O, plus :class:`Classifier`, the one object that judges a breaker's
outcomes with its configured predicates.
"""

from __future__ import annotations

import math
import re
import threading
import time
from collections.abc import Callable
from datetime import UTC
from email.utils import parsedate_to_datetime
from typing import Any

from .errors import CircuitOpenError, ConfigError
from .log import logger
from .names import show_name

__all__ = [
    "SUCCESS",
    "FAILURE",
    "RATE_LIMITED",
    "NO_PREDICATE_TYPES",
    "Classifier",
    "split_ignore",
    "status_of",
    "classify_status",
    "exception_is_rate_limit",
    "exception_status",
    "retry_after_of",
    "parse_retry_after",
]

SUCCESS = 0
FAILURE = 1
RATE_LIMITED = 2  # a failure that is also a 429 sighting

# Types whose instances never carry a status code: skip attribute lookups for them.
PLAIN_TYPES = frozenset({type(None), bool, int, float, str, bytes, dict, list, tuple, set, frozenset})

#: What a breaker with a ``result_predicate`` treats as plain: nothing, so every returned
#: value goes to the classifier. See :attr:`Classifier.plain_types`.
NO_PREDICATE_TYPES: frozenset[type] = frozenset()

_RATE_NAME = re.compile(r"ratelimit|toomanyrequests", re.IGNORECASE)
# "429" as a whole number: not part of a longer integer (4290, 1429) nor of a decimal
# (0.429, 429.5); a full stop that ends a sentence ("got a 429.") still matches.
_RATE_TEXT = re.compile(r"(?<!\d)(?<!\d\.)429(?!\d|\.\d)|rate[ _-]?limit|too many requests", re.IGNORECASE)


def status_of(value: Any) -> int | None:
    """Return the integer HTTP status of a returned object, or None.

    Reads ``status_code`` first, then ``status``; only real integers count
    (``HTTPStatus`` members included, booleans and strings not).
    """
    if type(value) in PLAIN_TYPES:
        return None
    try:
        code = getattr(value, "status_code", None)
        if code is None:
            code = getattr(value, "status", None)
    except Exception:  # a property that raises must not turn a returned value into an error
        return None
    if isinstance(code, int) and not isinstance(code, bool):
        return int(code)
    return None


def classify_status(code: int | None, failure_codes: frozenset[int], rate_limit_codes: frozenset[int]) -> int:
    """SUCCESS, FAILURE or RATE_LIMITED for a returned status; the lists overlap freely."""
    if code is None:
        return SUCCESS
    if code in rate_limit_codes:
        return RATE_LIMITED
    if code in failure_codes:
        return FAILURE
    return SUCCESS


def _response_of(exc: BaseException) -> Any:
    # requests.HTTPError and httpx.HTTPStatusError both carry ``.response``
    try:
        return getattr(exc, "response", None)
    except Exception:  # httpx raises RuntimeError when the attribute was never set
        return None


def exception_status(exc: BaseException) -> int | None:
    """The status of the response an exception carries (requests, httpx), or None."""
    response = _response_of(exc)
    if response is None:
        return None
    return status_of(response)


def exception_is_rate_limit(exc: BaseException, rate_limit_codes: frozenset[int]) -> bool:
    """True when *exc* is a 429 sighting.

    The type name (or a base class name) contains ``RateLimit``/``TooManyRequests``; the
    message contains ``429`` as a whole number, "rate limit" or "too many requests"; or
    the exception carries a response whose status is on *rate_limit_codes*. When the
    exception carries a response with a status, that status decides over the message
    (an ``HTTPError`` for a 500 whose URL holds ``/429`` is not a sighting).
    """
    for klass in type(exc).__mro__:
        if klass is Exception or klass is BaseException or klass is object:
            break
        if _RATE_NAME.search(klass.__name__):
            return True
    code = exception_status(exc)
    if code is not None:
        return code in rate_limit_codes
    try:
        text = str(exc)
    except Exception:
        return False
    return bool(_RATE_TEXT.search(text))


def _header(container: Any, name: str) -> Any:
    if container is None:
        return None
    headers = getattr(container, "headers", None)
    if headers is not None:
        try:
            value = headers.get(name)
        except Exception:
            value = None
        if value is not None:
            return value
    return None


def retry_after_of(obj: Any) -> Any:
    """The raw ``Retry-After`` carried by a response or by an exception's response, or None.

    Also honours a ``retry_after`` attribute on exceptions (several SDKs set one).
    """
    value = _header(obj, "Retry-After")
    if value is not None:
        return value
    if isinstance(obj, BaseException):
        value = _header(_response_of(obj), "Retry-After")
        if value is not None:
            return value
        value = getattr(obj, "retry_after", None)
        if isinstance(value, (int, float, str)) and not isinstance(value, bool):
            return value
    return None


def parse_retry_after(value: Any, *, default: float, cap: float, now_wall: float) -> float:
    """Turn a Retry-After value into a cooldown in seconds.

    Args:
        value: a number of seconds, a delta-seconds string (``"120"``, ``"0.5"``), an
            HTTP-date string, or None.
        default: seconds used when *value* is absent, invalid or negative.
        cap: the largest cooldown returned, seconds.
        now_wall: current Unix time, seconds (for HTTP-dates).

    Returns:
        The cooldown in seconds, between 0 and *cap*.
    """
    seconds: float | None = None
    if isinstance(value, bool):
        seconds = None
    elif isinstance(value, (int, float)):
        seconds = float(value)
    elif isinstance(value, bytes):
        value = value.decode("latin-1", "replace")
    if isinstance(value, str):
        text = value.strip()
        try:
            seconds = float(text)
        except ValueError:
            try:
                when = parsedate_to_datetime(text)
            except (TypeError, ValueError, IndexError, OverflowError):
                when = None
            if when is not None:
                if when.tzinfo is None:
                    when = when.replace(tzinfo=UTC)
                try:
                    seconds = when.timestamp() - now_wall
                except (OverflowError, OSError, ValueError):
                    seconds = None
    if seconds is None or not math.isfinite(seconds) or seconds < 0:
        seconds = default
    return min(seconds, cap)


# --------------------------------------------------------------------- predicates
#: ``(counted, rate_limited)`` answers of :meth:`Classifier.exception`.
_IGNORED = (False, False)
_COUNTED = (True, False)
_RATE_LIMITED = (True, True)


def split_ignore(items: tuple[Any, ...]) -> tuple[tuple[type[BaseException], ...], tuple[Callable[[Any], Any], ...]]:
    """Split an ``ignore_exceptions`` tuple into its exception types and its callables.

    Args:
        items: exception types and ``callable(exc) -> bool`` mixed, already validated.

    Returns:
        ``(types, callables)``, each in the order given.
    """
    types = tuple(item for item in items if isinstance(item, type) and issubclass(item, BaseException))
    checks = tuple(item for item in items if not (isinstance(item, type) and issubclass(item, BaseException)))
    return types, checks


def predicate_name(predicate: Any) -> str:
    """How a log line names a predicate: its module and qualified name, else its repr."""
    name = getattr(predicate, "__qualname__", None)
    module = getattr(predicate, "__module__", None)
    if isinstance(name, str):
        return f"{module}.{name}" if isinstance(module, str) else name
    return repr(predicate)


class _Throttle:
    """At most one ``circuit_breaker.predicate_failed`` line per *interval* seconds on the
    monotonic clock; the calls left out meanwhile are counted into the next line."""

    __slots__ = ("interval", "monotonic", "_next", "_suppressed", "_lock")

    def __init__(self, interval: float, monotonic: Callable[[], float]) -> None:
        self.interval = interval
        self.monotonic = monotonic
        self._next = -math.inf
        self._suppressed = 0
        self._lock = threading.Lock()

    def report(self, service: str | None, role: str, predicate: Any, error: Exception) -> None:
        now = self.monotonic()
        with self._lock:
            if now < self._next:
                self._suppressed += 1
                return
            self._next = now + self.interval
            suppressed, self._suppressed = self._suppressed, 0
        logger.warning(
            "circuit_breaker.predicate_failed service=%s predicate=%s role=%s error=%s: %s "
            "(the call counts as a failure; %d more since the last line)",
            show_name(service),
            predicate_name(predicate),
            role,
            type(error).__name__,
            error,
            suppressed,
            exc_info=(type(error), error, error.__traceback__),
            extra={
                "event": "circuit_breaker.predicate_failed",
                "service": service,
                "from_state": None,
                "to_state": None,
                "trigger": None,
                "predicate": predicate_name(predicate),
                "role": role,
                "suppressed": suppressed,
            },
        )


class Classifier:
    """Judges the outcomes of one breaker's calls: what counts as a failure, what is ignored,
    what is a 429 sighting.

    Built from the breaker's configuration (:class:`~baldur_django.core.config.BreakerConfig`
    builds one), immutable apart from the throttle of its error log. The order of the
    questions asked of an exception:

    1. a ``BaseException`` that is not an ``Exception`` is never a failure;
    2. an instance of an exception *type* listed in ``ignore_exceptions`` is ignored, 429s
       included;
    3. the breaker's own :class:`CircuitOpenError` (nested use) is ignored, and
       so is the package's :class:`ConfigError` (a misuse of the call, such as a factory
       that returns no awaitable: the dependency never answered);
    4. a 429 sighting is a rate-limited failure, before any predicate runs;
    5. a *callable* of ``ignore_exceptions`` that returns true makes it ignored;
    6. ``failure_predicate(exc)``, when set, decides: true is a failure, false ignored;
    7. anything else is a failure.

    A returned value: a status on the rate-limit list is a rate-limited failure, one on the
    failure list a failure; else ``result_predicate(value)``, when set, marks it a
    failure. A predicate that raises makes the outcome a failure and is logged as
    ``circuit_breaker.predicate_failed`` (at most once per *warning_interval* seconds);
    the call's own value or exception is untouched. Predicates should be quick pure
    functions: with a retry policy the first attempt's failed value may be judged twice
    (once to see whether the sequence is over, once by the retry plan).

    Args:
        ignore (tuple): exception types and ``callable(exc) -> bool`` mixed.
        failure_predicate: ``callable(exc) -> bool`` or None.
        result_predicate: ``callable(value) -> bool`` or None.
        failure_codes (frozenset[int]): statuses recorded as failures.
        rate_limit_codes (frozenset[int]): statuses read as 429s.
        warning_interval (float): seconds between two predicate-error lines.
        monotonic: the monotonic clock of the throttle (seconds).

    Attributes:
        plain_types (frozenset[type]): return types that need no judging (no status code
            to read and no ``result_predicate``); empty while a ``result_predicate`` is set.
        ignore_types (tuple): the exception types of ``ignore_exceptions``.
    """

    __slots__ = (
        "ignore_types",
        "ignore_checks",
        "failure_predicate",
        "result_predicate",
        "failure_codes",
        "rate_limit_codes",
        "plain_types",
        "_judges",
        "_throttle",
    )

    def __init__(
        self,
        *,
        ignore: tuple[Any, ...] = (),
        failure_predicate: Callable[[BaseException], Any] | None = None,
        result_predicate: Callable[[Any], Any] | None = None,
        failure_codes: frozenset[int] = frozenset({500, 502, 503, 504}),
        rate_limit_codes: frozenset[int] = frozenset({429}),
        warning_interval: float = 60.0,
        monotonic: Callable[[], float] | None = None,
    ) -> None:
        self.ignore_types, self.ignore_checks = split_ignore(tuple(ignore))
        self.failure_predicate = failure_predicate
        self.result_predicate = result_predicate
        self.failure_codes = failure_codes
        self.rate_limit_codes = rate_limit_codes
        self.plain_types = PLAIN_TYPES if result_predicate is None else NO_PREDICATE_TYPES
        self._judges = bool(self.ignore_checks) or failure_predicate is not None
        self._throttle = _Throttle(warning_interval, monotonic or time.monotonic)

    def exception(self, exc: BaseException, service: str | None = None) -> tuple[bool, bool]:
        """``(counted, rate_limited)`` for an exception the call raised (see the class docstring).

        Args:
            exc: what the call raised.
            service: the breaker's name: its own CircuitOpenError is not counted,
                nor a ConfigError (a misuse), and the predicate-error line names it.

        Never raises for a predicate's error: that outcome is a counted failure.
        """
        if not isinstance(exc, Exception):
            return _IGNORED
        types = self.ignore_types
        if types and isinstance(exc, types):
            return _IGNORED
        if exc.__class__ is CircuitOpenError and exc.service == service:
            return _IGNORED
        if exc.__class__ is ConfigError:  # a misuse of the call: the dependency never answered
            return _IGNORED
        if exception_is_rate_limit(exc, self.rate_limit_codes):
            return _RATE_LIMITED
        if self._judges:
            return self._judge(exc, service)
        return _COUNTED

    def _judge(self, exc: Exception, service: str | None) -> tuple[bool, bool]:
        predicate: Any = None
        role = "ignore_exceptions"
        try:
            for predicate in self.ignore_checks:
                if predicate(exc):
                    return _IGNORED
            predicate = self.failure_predicate
            if predicate is not None:
                role = "failure_predicate"
                return _COUNTED if predicate(exc) else _IGNORED
        except Exception as error:
            self._throttle.report(service, role, predicate, error)
        return _COUNTED

    def result(self, value: Any, service: str | None = None) -> int:
        """``SUCCESS``, ``FAILURE`` or ``RATE_LIMITED`` for a returned value.

        *service* names the breaker in the predicate-error line. Never raises for a predicate's error: that outcome is a failure.
        """
        if type(value) in PLAIN_TYPES:
            kind = SUCCESS
        else:
            kind = classify_status(status_of(value), self.failure_codes, self.rate_limit_codes)
        predicate = self.result_predicate
        if kind != SUCCESS or predicate is None:
            return kind
        try:
            return FAILURE if predicate(value) else SUCCESS
        except Exception as error:
            self._throttle.report(service, "result_predicate", predicate, error)
            return FAILURE

"""Outcome classification: exceptions, returned responses, 429 sightings, Retry-After.

Pure functions, no I/O. Implements CB-10, CB-11, RL-1, RL-2 (Retry-After parsing), RL-8.
"""

from __future__ import annotations

import math
import re
from datetime import timezone
from email.utils import parsedate_to_datetime
from typing import Any

__all__ = [
    "SUCCESS",
    "FAILURE",
    "RATE_LIMITED",
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

_RATE_NAME = re.compile(r"ratelimit|toomanyrequests", re.IGNORECASE)
# "429" as a whole number: not part of a longer integer (4290, 1429) nor of a decimal
# (0.429, 429.5); a full stop that ends a sentence ("got a 429.") still matches.
_RATE_TEXT = re.compile(r"(?<!\d)(?<!\d\.)429(?!\d|\.\d)|rate[ _-]?limit|too many requests", re.IGNORECASE)


def status_of(value: Any) -> int | None:
    """Return the integer HTTP status of a returned object, or None.

    Reads ``status_code`` first, then ``status`` (CB-11); only real integers count
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
    """SUCCESS, FAILURE or RATE_LIMITED for a returned status; the lists overlap freely (RL-8)."""
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
    """True when *exc* is a 429 by the rules of RL-1.

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
    """Turn a Retry-After value into a cooldown in seconds (RL-2).

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
                    when = when.replace(tzinfo=timezone.utc)
                try:
                    seconds = when.timestamp() - now_wall
                except (OverflowError, OSError, ValueError):
                    seconds = None
    if seconds is None or not math.isfinite(seconds) or seconds < 0:
        seconds = default
    return min(seconds, cap)

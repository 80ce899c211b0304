"""The Retry-After gate of one service, in one worker process.

A dependency that answers 429 (or another status on the rate-limit list) or 503 with a
``Retry-After`` header asks for quiet until then. The gate remembers that moment and,
until it has passed, every call to the service is refused before anything is contacted
with :class:`~baldur_django.core.errors.RateLimitCooldownError` (reason ``"retry_after"``,
``retry_after`` = seconds left).

* **The later end wins.** Each answer can only push the end later: a later, shorter
  ``Retry-After`` never reopens the gate early.
* **Capped.** No end lies further ahead than ``max_seconds`` from the moment the gate is
  closed (the package's ``BALDUR_RATE_LIMIT_MAX_COOLDOWN_SECONDS``).
* **Cheap when open.** :meth:`RetryAfterGate.check` reads the end and the clock and
  compares them: no lock, no allocation. Only closing takes a short lock, so that two
  answers arriving together keep the later end.
* **Precedence.** A force-closed breaker ignores the gate (``check(forced_closed=True)``
  never refuses); the emergency levels do not touch it (level 3 freezes the breaker's own
  decisions, not the dependency's request for quiet).

Detection reuses :mod:`..classify` (:func:`~..classify.status_of`,
:func:`~..classify.exception_is_rate_limit`, :func:`~..classify.retry_after_of`,
:func:`~..classify.parse_retry_after`): the same rules as the rate-limit cooldown, with
503 added. A value that is not a usable number of seconds or HTTP date (garbage, a
negative number, a date already past) closes nothing.
"""

from __future__ import annotations

import itertools
import math
from threading import Lock
from typing import Any

from ..classify import exception_is_rate_limit, exception_status, parse_retry_after, retry_after_of, status_of
from ..clock import Clock
from ..errors import ConfigError, RateLimitCooldownError
from .budget import count_of

__all__ = ["RetryAfterGate", "UNAVAILABLE", "gate_seconds"]

#: The status that closes the gate besides the rate-limit list: Service Unavailable.
UNAVAILABLE = 503
#: What :func:`parse_retry_after` answers for a value it cannot use (never a real cooldown).
_UNUSABLE = -1.0
_NEVER = -math.inf
_DEFAULT_CODES = frozenset({429})


def _check_seconds(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        raise ConfigError(f"{name} must be a number of seconds, got {value!r}")
    return float(value)


def gate_seconds(outcome: object, *, rate_limit_codes: frozenset[int], cap: float, now_wall: float) -> float | None:
    """The seconds an outcome asks the gate to stay closed, or None when it asks nothing.

    Args:
        outcome: an exception raised by the call, or the value it returned.
        rate_limit_codes: the statuses that mean "rate limited" (429 by default); 503
            counts as well.
        cap: the longest closure, seconds.
        now_wall: current Unix time, seconds (to read an HTTP date).

    Returns:
        Seconds (0 to *cap*) when *outcome* is a rate-limit sighting or a 503 answer that
        carries a usable ``Retry-After`` (delta-seconds or an HTTP date); otherwise None.
    """
    if isinstance(outcome, BaseException):
        hit = exception_is_rate_limit(outcome, rate_limit_codes) or exception_status(outcome) == UNAVAILABLE
    else:
        code = status_of(outcome)
        hit = code is not None and (code == UNAVAILABLE or code in rate_limit_codes)
    if not hit:
        return None
    raw = retry_after_of(outcome)
    if raw is None:
        return None
    seconds = parse_retry_after(raw, default=_UNUSABLE, cap=cap, now_wall=now_wall)
    return None if seconds < 0 else seconds


class RetryAfterGate:
    """The Retry-After gate of *service* in this process.

    Args:
        service: the breaker's name (carried by the refusal).
        clock: the time source (:mod:`..clock`); its ``monotonic`` places the end, its
            ``wall`` reads HTTP dates.
        max_seconds: the longest closure, seconds (> 0; the package passes
            ``BALDUR_RATE_LIMIT_MAX_COOLDOWN_SECONDS``).
        rate_limit_codes: statuses that mean "rate limited" (429 by default; the package
            passes ``BALDUR_MIDDLEWARE_RATE_LIMIT_CODES``); 503 always closes too.

    Raises:
        ConfigError: *max_seconds* is not a positive number, or *rate_limit_codes* is not
            a set of integers.

    Attributes:
        until (float): the monotonic time (seconds) the gate opens at; in the past (minus
            infinity at first) while it is open. Only grows, under the gate's lock; a fast
            lane reads it lock-free and refuses nothing itself (it sends a call through
            :meth:`check` whenever ``until`` is ahead of its clock).
    """

    __slots__ = ("service", "max_seconds", "rate_limit_codes", "_clock", "until", "_lock", "_refused")

    def __init__(
        self,
        service: str,
        clock: Clock,
        max_seconds: float,
        *,
        rate_limit_codes: frozenset[int] = _DEFAULT_CODES,
    ) -> None:
        seconds = _check_seconds("max_seconds", max_seconds)
        if not seconds > 0:
            raise ConfigError(f"max_seconds must be more than 0 seconds, got {max_seconds!r}")
        codes = frozenset(rate_limit_codes)
        if not all(isinstance(c, int) and not isinstance(c, bool) for c in codes):
            raise ConfigError(f"rate_limit_codes must hold HTTP status integers, got {rate_limit_codes!r}")
        self.service = service
        self.max_seconds = seconds
        self.rate_limit_codes = codes
        self._clock = clock
        self.until = _NEVER  # monotonic seconds; in the past while the gate is open
        self._lock = Lock()
        self._refused = itertools.count()  # stepped on the refusal path only (one atomic next())

    def __repr__(self) -> str:
        return f"<RetryAfterGate {self.service!r} remaining={self.remaining():.3f}s>"

    # ------------------------------------------------------------------ reading
    def check(self, *, forced_closed: bool = False) -> None:
        """Refuse the call while the gate is closed.

        Args:
            forced_closed: the breaker is forced closed by an operator; then the gate is
                ignored and nothing is refused.

        Raises:
            RateLimitCooldownError: the gate is closed (reason ``"retry_after"``,
                ``remaining`` / ``retry_after`` = seconds until it opens).
        """
        now = self._clock.monotonic()
        end = self.until
        if end <= now or forced_closed:
            return
        next(self._refused)
        raise RateLimitCooldownError(self.service, end - now, reason="retry_after")

    def remaining(self) -> float:
        """Seconds until the gate opens; 0.0 while it is open."""
        return max(0.0, self.until - self._clock.monotonic())

    def refused(self) -> int:
        """The calls :meth:`check` refused since the gate was made."""
        return count_of(self._refused)

    def end(self) -> float | None:
        """The monotonic time (seconds, this process's clock) the gate opens at, or None
        while it is open."""
        end = self.until
        return end if end > self._clock.monotonic() else None

    # ------------------------------------------------------------------ closing
    def close_until(self, until: float) -> float:
        """Keep the gate closed until the monotonic time *until* (seconds), at most
        ``max_seconds`` from now; an end earlier than the current one changes nothing.

        Returns:
            Seconds until the gate opens after this call (0.0 when it stays open).

        Raises:
            ConfigError: *until* is not a number (NaN included).
        """
        until = _check_seconds("until", until)
        with self._lock:
            self.until = max(self.until, min(until, self._clock.monotonic() + self.max_seconds))
        return self.remaining()

    def close_for(self, seconds: float) -> float:
        """Keep the gate closed for *seconds* from now (capped at ``max_seconds``); a
        shorter closure than the current one changes nothing.

        Returns:
            Seconds until the gate opens after this call.

        Raises:
            ConfigError: *seconds* is not a number (NaN included).
        """
        seconds = _check_seconds("seconds", seconds)
        return self.close_until(self._clock.monotonic() + seconds)

    def observe(self, outcome: object) -> float | None:
        """Close the gate when *outcome* asks for quiet (see :func:`gate_seconds`).

        Args:
            outcome: the exception the call raised, or the value it returned.

        Returns:
            The seconds the answer asked for (capped at ``max_seconds``), or None when it
            asked nothing (the gate is untouched).
        """
        seconds = gate_seconds(
            outcome, rate_limit_codes=self.rate_limit_codes, cap=self.max_seconds, now_wall=self._clock.wall()
        )
        if seconds is not None:
            self.close_for(seconds)
        return seconds

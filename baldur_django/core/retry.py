"""Retry policy and the no-I/O plan both runners follow (FAC-3, RL-6).

The plan decides; the sync and async runners only sleep and call. Backoff is
exponential with a random jitter fraction and an optional total budget.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Any, Callable

from .errors import CircuitOpenError, ConfigError, RateLimitCooldownError

__all__ = ["RetryPolicy", "RetryPlan", "coerce_retry"]


def _number(name: str, value: Any, *, minimum: float, allow_none: bool = False, maximum: float | None = None) -> Any:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConfigError(f"RetryPolicy {name}={value!r}: expected a finite number")
    if value < minimum or (maximum is not None and value > maximum):
        bound = f"between {minimum:g} and {maximum:g}" if maximum is not None else f"at least {minimum:g}"
        raise ConfigError(f"RetryPolicy {name}={value!r}: must be {bound}")
    return value


@dataclass(frozen=True)
class RetryPolicy:
    """How the retry stage retries one protected call (FAC-3).

    Args:
        max_attempts (int): attempts in all, the first included (>= 1).
        backoff_initial (float): seconds before the second attempt.
        backoff_max (float): ceiling of any single backoff, seconds.
        backoff_multiplier (float): growth per attempt (>= 1).
        jitter (float): random fraction (0..1) added or removed from each backoff.
        budget_seconds (float | None): total time the sequence may take, waits included;
            it also bounds how long a 429 cooldown is waited out (RL-6).
        retry_on (tuple[type[BaseException], ...]): exception types worth retrying. Ignored
            exceptions, :class:`CircuitOpenError` and :class:`RateLimitCooldownError` are
            never retried; returned failure or rate-limit responses always are.

    Raises:
        ConfigError: any value out of range.
    """

    max_attempts: int = 3
    backoff_initial: float = 0.1
    backoff_max: float = 2.0
    backoff_multiplier: float = 2.0
    jitter: float = 0.1
    budget_seconds: float | None = None
    retry_on: tuple[type[BaseException], ...] = field(default=(Exception,))

    def __post_init__(self) -> None:
        if isinstance(self.max_attempts, bool) or not isinstance(self.max_attempts, int) or self.max_attempts < 1:
            raise ConfigError(f"RetryPolicy max_attempts={self.max_attempts!r}: must be a whole number >= 1")
        _number("backoff_initial", self.backoff_initial, minimum=0)
        _number("backoff_max", self.backoff_max, minimum=0)
        _number("backoff_multiplier", self.backoff_multiplier, minimum=1)
        _number("jitter", self.jitter, minimum=0, maximum=1)
        budget = _number("budget_seconds", self.budget_seconds, minimum=0, allow_none=True)
        if budget is not None and budget <= 0:
            raise ConfigError(f"RetryPolicy budget_seconds={budget!r}: must be greater than 0")
        retry_on = self.retry_on
        if isinstance(retry_on, type):
            retry_on = (retry_on,)
            object.__setattr__(self, "retry_on", retry_on)
        if not isinstance(retry_on, tuple) or not all(isinstance(t, type) and issubclass(t, BaseException) for t in retry_on):
            raise ConfigError(f"RetryPolicy retry_on={self.retry_on!r}: must be a tuple of exception types")

    def backoff(self, attempt: int, rand: Callable[[], float] = random.random) -> float:
        """Seconds to wait after failed attempt number *attempt* (1-based), jitter applied."""
        base = min(self.backoff_max, self.backoff_initial * self.backoff_multiplier ** (attempt - 1))
        if self.jitter:
            base *= 1.0 + self.jitter * (2.0 * rand() - 1.0)
        return max(0.0, base)


def coerce_retry(retry: Any) -> RetryPolicy | None:
    """``False``/None -> None, ``True`` -> ``RetryPolicy()``, a policy -> itself. Raises ConfigError."""
    if retry is None or retry is False:
        return None
    if retry is True:
        return RetryPolicy()
    if isinstance(retry, RetryPolicy):
        return retry
    raise ConfigError(f"retry={retry!r}: expected True, False or a RetryPolicy")


_NEVER_RETRIED = (CircuitOpenError, RateLimitCooldownError)


class RetryPlan:
    """The decisions of one retry sequence, with no I/O (design habit 5).

    Args:
        policy: the policy.
        now: monotonic seconds at the start of the sequence.
    """

    __slots__ = ("policy", "attempts", "deadline")

    def __init__(self, policy: RetryPolicy, now: float) -> None:
        self.policy = policy
        self.attempts = 0
        self.deadline = None if policy.budget_seconds is None else now + policy.budget_seconds

    def allowed_wait(self, now: float, max_cooldown_wait: float) -> float:
        """Longest cooldown this attempt may wait out: the budget left, else *max_cooldown_wait* (RL-6)."""
        if self.deadline is None:
            return max_cooldown_wait
        return max(0.0, self.deadline - now)

    def retryable(self, exc: BaseException) -> bool:
        """True when *exc* (a counted failure) is of a type worth another attempt."""
        return isinstance(exc, self.policy.retry_on) and not isinstance(exc, _NEVER_RETRIED)

    def next_wait(self, now: float) -> float | None:
        """Backoff before the next attempt, or None when the sequence must stop here."""
        if self.attempts >= self.policy.max_attempts:
            return None
        wait = self.policy.backoff(self.attempts)
        if self.deadline is not None and now + wait >= self.deadline:
            return None
        return wait

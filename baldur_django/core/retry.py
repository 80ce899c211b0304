"""The retry engine: a policy, and one plan that takes every decision of a retry sequence.

In the spirit of tenacity's ``iter()``, :func:`retry_plan` is a generator that yields
*steps* and receives each attempt's outcome through ``send()``:

- :data:`ATTEMPT`: call the dependency once, then send back :class:`Raised` or
  :class:`Returned`;
- :class:`Sleep`: wait ``seconds`` (``time.sleep`` or ``await asyncio.sleep``), then
  resume the plan with ``next()``;
- :class:`Refuse`: the sequence ends refused (a :class:`RateLimitCooldownError`);
- :class:`Done`: the sequence ends with a value to return or an exception to raise.

The plan never sleeps and never calls or awaits the dependency: it reads the breaker's
clock, cooldown and state generation, and reports to it through the breaker's own
recording methods (each attempt to the 429 cascade, the final outcome to the triggers),
exactly as an un-retried call is recorded. The two interpreters in
:mod:`baldur_django.core.runner` only carry the steps out, so the sync and async call
styles share every decision.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .classify import RATE_LIMITED, SUCCESS, retry_after_of
from .errors import CircuitOpenError, ConfigError, RateLimitCooldownError

if TYPE_CHECKING:
    from .breaker import CircuitBreaker, Permit
    from .config import BreakerConfig

__all__ = [
    "RetryPolicy",
    "coerce_retry",
    "retry_plan",
    "Attempt",
    "ATTEMPT",
    "Sleep",
    "Refuse",
    "Done",
    "Raised",
    "Returned",
    "Step",
    "Outcome",
    "exception_outcome",
    "result_kind",
    "settled",
]


def _number(
    name: str, value: Any, *, minimum: float, allow_none: bool = False, maximum: float | None = None
) -> float | None:
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
    """How the retry stage retries one protected call.

    Args:
        max_attempts (int): attempts in all, the first included (>= 1).
        backoff_initial (float): seconds before the second attempt.
        backoff_max (float): ceiling of any single backoff, seconds.
        backoff_multiplier (float): growth per attempt (>= 1).
        jitter (float): random fraction (0..1) added or removed from each backoff.
        budget_seconds (float | None): total time the sequence may take, waits included;
            it also bounds how long a 429 cooldown is waited out.
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
        if not isinstance(retry_on, tuple) or not all(
            isinstance(t, type) and issubclass(t, BaseException) for t in retry_on
        ):
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


# ---------------------------------------------------------------------------- steps
class Attempt:
    """Step: call the dependency once and send the outcome back. Use the :data:`ATTEMPT` instance."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "ATTEMPT"


#: The one :class:`Attempt` step (interpreters compare with ``is``).
ATTEMPT = Attempt()


@dataclass(frozen=True, slots=True)
class Sleep:
    """Step: wait *seconds* (float, > 0), then resume the plan with ``next()``."""

    seconds: float


@dataclass(frozen=True, slots=True)
class Refuse:
    """Last step: the next attempt is refused; *error* goes to the fallback or is raised.

    The plan has already recorded what had to be recorded.
    """

    error: RateLimitCooldownError


@dataclass(frozen=True, slots=True)
class Done:
    """Last step: the sequence is over and its final outcome recorded.

    Attributes:
        value: what to return when *error* is None (a success, or the last failure
            response unchanged).
        error: the exception to raise, or None.
        fallback: True when a fallback may replace *error* (a counted exception);
            False for an ignored exception, which is re-raised unchanged.
    """

    value: Any = None
    error: BaseException | None = None
    fallback: bool = False


Step = Attempt | Sleep | Refuse | Done


@dataclass(frozen=True, slots=True)
class Raised:
    """Outcome sent to the plan: the attempt raised *error* (any ``BaseException``)."""

    error: BaseException


@dataclass(frozen=True, slots=True)
class Returned:
    """Outcome sent to the plan: the attempt returned *value*."""

    value: Any


Outcome = Raised | Returned


# ------------------------------------------------------------------- classification
def exception_outcome(config: BreakerConfig, exc: BaseException, service: str | None = None) -> tuple[bool, bool]:
    """``(counted, rate_limited)`` for an exception from the dependency.

    Args:
        config: the breaker's configuration (``ignore_exceptions``, ``rate_limit_codes``).
        exc: what the call raised.
        service: the breaker's name: its own :class:`CircuitOpenError` (nested use of one
            breaker) never reached the dependency, so it is not counted and a trial gives
            its slot back.

    Returns:
        ``counted`` is False for an ignored type, a ``BaseException`` that is not an
        ``Exception``, the breaker's own refusal, or what a predicate ignores;
        ``rate_limited`` is True for a counted 429 sighting. The config's classifier
        decides (:class:`baldur_django.core.classify.Classifier`).
    """
    return config.classifier.exception(exc, service)


def result_kind(config: BreakerConfig, result: Any, service: str | None = None) -> int:
    """``SUCCESS``, ``FAILURE`` or ``RATE_LIMITED`` for a returned value."""
    return config.classifier.result(result, service)


def settled(breaker: CircuitBreaker, permit: Permit, result: Any) -> bool:
    """End the sequence on *result* if it is a success: True once it is recorded.

    A success is always the final outcome; recording it also counts its attempt
    in the cascade. The runners call this after an inline first attempt, and the
    plan after every later one, so the rule lives here once.

    Returns:
        True when *result* was a success (now recorded), False for a failure or rate-limit
        response (nothing recorded: the plan takes it from there).
    """
    config = breaker.config
    if type(result) in config.plain_types or config.classifier.result(result, breaker.name) == SUCCESS:
        breaker.record_success(permit)
        return True
    return False


# ----------------------------------------------------------------------------- plan
def retry_plan(
    breaker: CircuitBreaker,
    permit: Permit,
    policy: RetryPolicy,
    start: float,
    first: Outcome | None = None,
) -> Generator[Step, Outcome | None, None]:
    """The decisions of one retry sequence, as a generator of steps.

    Drive it with ``step = next(plan)``; after :data:`ATTEMPT` send the outcome
    (``plan.send(Raised(exc))`` or ``plan.send(Returned(value))``), after a :class:`Sleep`
    call ``next(plan)``; stop at :class:`Refuse` or :class:`Done`.

    What it decides:

    - before every attempt (the first included), the cooldown gate: wait out the
      cooldown, re-read after every wait (an extension meanwhile is waited out too);
      refuse with :class:`RateLimitCooldownError` when it outlasts the allowed wait (the
      budget left, else ``config.max_cooldown_wait``), or in dry-run count the refusal and
      go on;
    - after every attempt: an ignored exception ends the sequence unrecorded; each
      other attempt is counted in the cascade and a 429 starts the cooldown;
      a success ends it; a failure is retried while it is of a retried kind, the
      breaker has not changed state since admission, attempts remain (a trial has
      one) and the backoff fits in the budget. The backoff is followed by the gate,
      so a cooldown costs ``max(backoff, cooldown)``, never their sum;
    - the final outcome: the last attempt that reached the dependency, recorded once.

    Args:
        breaker: the breaker that admitted the call.
        permit: its permit (``permit.trial`` makes the sequence one attempt).
        policy: the retry policy.
        start: monotonic seconds when the sequence began: the budget counts from here
            (read only when the policy has a budget).
        first: the outcome of a first attempt already made (it passed the gate: no cooldown
            at *start*), or None to gate and make the first attempt through the plan.

    Yields:
        :data:`ATTEMPT`, :class:`Sleep`, then one :class:`Refuse` or :class:`Done`.
    """
    now = breaker.clock.monotonic
    deadline = None if policy.budget_seconds is None else start + policy.budget_seconds
    limit = 1 if permit.trial else policy.max_attempts
    attempts = 0
    # The last attempt that reached the dependency. While the sequence goes on it is a
    # failure (a success ends it), so that is what ending the sequence records.
    last_error: BaseException | None = None
    last_value: Any = None
    last_rate_limited = False
    outcome = first
    while True:
        if outcome is None:
            # ---- the gate before an attempt, read again after every wait
            while True:
                if attempts and permit.generation != breaker.generation:
                    # the breaker changed state since admission (a trip): no further attempt
                    yield _give_up(breaker, permit, last_rate_limited, last_error, last_value)
                    return
                remaining = breaker.cooldown_remaining()
                if remaining <= 0:
                    break
                config = breaker.config
                allowed = config.max_cooldown_wait if deadline is None else max(0.0, deadline - now())
                if remaining <= allowed:
                    yield Sleep(remaining)
                    continue
                if config.dry_run:
                    breaker.note_dry_run_refusal(remaining)  # counted and logged, never refused
                    break
                # the refused attempt is recorded nowhere; the last one made is final
                refusal = RateLimitCooldownError(breaker.name, remaining)
                if attempts:
                    breaker.record_failure(permit, rate_limited=last_rate_limited, count_attempt=False)
                    if last_error is not None:
                        refusal.__cause__ = last_error  # chained from the last attempt's exception
                else:
                    breaker.record_ignored(permit)  # nothing reached the dependency (a trial's slot comes back)
                yield Refuse(refusal)
                return
            outcome = yield ATTEMPT
            if outcome is None:
                raise TypeError("retry_plan: send the outcome of the attempt (Raised or Returned)")
        attempts += 1
        # ---- judge the attempt
        if isinstance(outcome, Raised):
            error = outcome.error
            counted, rate_limited = exception_outcome(breaker.config, error, breaker.name)
            if not counted:
                breaker.record_ignored(permit)  # neither success nor failure, never retried
                yield Done(error=error, fallback=False)
                return
            retried = isinstance(error, policy.retry_on) and not isinstance(error, _NEVER_RETRIED)
            retry_after = retry_after_of(error) if rate_limited else None
            last_error, last_value = error, None
        else:
            value = outcome.value
            kind = result_kind(breaker.config, value, breaker.name)  # asked once per attempt
            if kind == SUCCESS:
                breaker.record_success(permit)  # what settled() does
                yield Done(value=value)
                return
            rate_limited = kind == RATE_LIMITED
            retried = True  # returned failure and rate-limit responses are always retried
            retry_after = retry_after_of(value) if rate_limited else None
            last_error, last_value = None, value
        last_rate_limited = rate_limited
        breaker.note_attempt(rate_limited=rate_limited, retry_after=retry_after)  # a 429 starts the cooldown
        # ---- another attempt?
        wait: float | None = None
        if retried and permit.generation == breaker.generation and attempts < limit:
            wait = policy.backoff(attempts)
            if deadline is not None and now() + wait >= deadline:
                wait = None
        if wait is None:
            yield _give_up(breaker, permit, rate_limited, last_error, last_value)
            return
        if wait > 0:
            yield Sleep(wait)
        outcome = None


def _give_up(
    breaker: CircuitBreaker, permit: Permit, rate_limited: bool, error: BaseException | None, value: Any
) -> Done:
    """Record the last (failed) attempt as the final outcome and build the Done step:
    its exception, which a fallback may replace, or its response, returned unchanged."""
    breaker.record_failure(permit, rate_limited=rate_limited, count_attempt=False)
    if error is None:
        return Done(value=value)
    return Done(error=error, fallback=True)

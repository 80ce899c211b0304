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
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

from .classify import RATE_LIMITED, SUCCESS, retry_after_of
from .errors import CallRefusedError, CircuitOpenError, ConfigError, DeadlineExceededError, RateLimitCooldownError
from .events import CallRejected, Retrying, bus
from .nesting import Mark, settled_elsewhere
from .retry_target import RetryPermit, RetryTarget
from .stages.deadline import in_force as deadline_in_force
from .stages.refusals import count_deadline

if TYPE_CHECKING:
    from .config import BreakerConfig

#: A breaker's permit type (the plan hands the breaker back its own permit).
_P = TypeVar("_P", bound=RetryPermit)


class RetryAllowance(Protocol):
    """What the plan asks before each retry (a retry budget of :mod:`.stages.budget`)."""

    def try_retry(self) -> bool:
        """Spend one retry; False when none is left."""
        ...


__all__ = [
    "RetryPolicy",
    "RetryAllowance",
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
    """Last step: the next attempt is refused; *error* goes to the fallback or is raised:
    a :class:`RateLimitCooldownError` (a cooldown outlasts the wait allowed) or a
    :class:`DeadlineExceededError` (the call's deadline has passed).

    The plan has already recorded what had to be recorded.
    """

    error: CallRefusedError


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


def settled(breaker: RetryTarget[_P], permit: _P, result: Any, mark: Mark | None = None) -> bool:
    """End the sequence on *result* if it is a success: True once it is recorded.

    A success is always the final outcome; recording it also counts its attempt
    in the cascade. The runners call this after an inline first attempt, and the
    plan after every later one, so the rule lives here once.

    Args:
        mark: the breaker's record number when the call began, for a call that may be
            nested in another through the same breaker (then the outer call records, and
            this one does not); None records the success in any case.

    Returns:
        True when *result* was a success (now recorded), False for a failure or rate-limit
        response (nothing recorded: the plan takes it from there).
    """
    config = breaker.config
    if type(result) in config.plain_types or config.classifier.result(result, breaker.name) == SUCCESS:
        if mark is None or (not breaker.healthy_success(permit) and not settled_elsewhere(breaker, permit, mark)):
            breaker.record_success(permit)
        return True
    return False


# ----------------------------------------------------------------------------- plan
def retry_plan(
    breaker: RetryTarget[_P],
    permit: _P,
    policy: RetryPolicy,
    start: float,
    first: Outcome | None = None,
    budget: RetryAllowance | None = None,
) -> Generator[Step, Outcome | None, None]:
    """The decisions of one retry sequence, as a generator of steps.

    Drive it with ``step = next(plan)``; after :data:`ATTEMPT` send the outcome
    (``plan.send(Raised(exc))`` or ``plan.send(Returned(value))``), after a :class:`Sleep`
    call ``next(plan)``; stop at :class:`Refuse` or :class:`Done`. What it decides:

    - before every attempt (the first included), the cooldown gate: wait out the
      cooldown, re-read after every wait (an extension meanwhile is waited out too);
      refuse with :class:`RateLimitCooldownError` when it outlasts the allowed wait (the
      budget left, else ``config.max_cooldown_wait``; never past the call's deadline, the
      current one when the plan starts), or in dry-run count the refusal and go on; past
      the deadline, refuse with :class:`DeadlineExceededError`;
    - after every attempt: an ignored exception ends the sequence unrecorded; each
      other attempt is counted in the cascade and a 429 starts the cooldown;
      a success ends it; a failure is retried while it is of a retried kind, the
      breaker has not changed state since admission, attempts remain (a trial has
      one), the backoff ends within the budget and the deadline and *budget* allows it;
      the gate follows it (a cooldown costs the larger of both);
    - the final outcome: the last attempt that reached the dependency, recorded once.

    Args:
        breaker: the breaker that admitted the call.
        permit: its permit (``permit.trial`` makes the sequence one attempt).
        policy: the retry policy.
        start: monotonic seconds the sequence began at (read with the policy's budget).
        first: the outcome of a first attempt already made (it passed the gate: no cooldown
            at *start*), or None to gate and make the first attempt through the plan.
        budget: a retry budget (``try_retry()`` before each retry), or None.

    Yields:
        :data:`ATTEMPT`, :class:`Sleep`, then one :class:`Refuse` or :class:`Done`.
    """
    sequence = _Sequence(breaker, permit, policy, start, budget)
    outcome = first
    while True:
        if outcome is None:
            if not (yield from sequence.gate()):
                return  # the gate yielded the last step
            outcome = yield ATTEMPT
            if outcome is None:
                raise TypeError("retry_plan: send the outcome of the attempt (Raised or Returned)")
        verdict = sequence.judge(outcome)
        if isinstance(verdict, Done):
            yield verdict
            return
        wait = sequence.wait_after(retried=verdict)
        if wait is None:
            yield sequence.give_up()
            return
        sequence.announce(wait)
        if wait > 0:
            yield Sleep(wait)
        outcome = None


class _Sequence(Generic[_P]):
    """The state of one retry sequence: the attempts made so far and the last one that
    reached the dependency. While the sequence goes on that last attempt is a failure (a
    success ends it), so it is what ending the sequence records."""

    __slots__ = (
        "breaker",
        "permit",
        "policy",
        "now",
        "deadline",
        "call_deadline",
        "limit",
        "attempts",
        "error",
        "value",
        "rate_limited",
        "budget",
    )

    def __init__(
        self, breaker: RetryTarget[_P], permit: _P, policy: RetryPolicy, start: float, budget: RetryAllowance | None
    ) -> None:
        self.breaker = breaker
        self.budget = budget
        self.permit = permit
        self.policy = policy
        self.now = breaker.clock.monotonic
        self.deadline = None if policy.budget_seconds is None else start + policy.budget_seconds
        # the call's deadline, moved onto the breaker's clock; the budget's end is the
        # earlier of the two
        found = deadline_in_force()
        self.call_deadline = None if found is None else self.now() + found.left()
        if self.call_deadline is not None and (self.deadline is None or self.call_deadline < self.deadline):
            self.deadline = self.call_deadline
        self.limit = 1 if permit.trial else policy.max_attempts
        self.attempts = 0
        self.error: BaseException | None = None
        self.value: Any = None
        self.rate_limited = False

    def gate(self) -> Generator[Step, Outcome | None, bool]:
        """The gate before an attempt, read again after every wait: yields the
        :class:`Sleep` steps, then returns True when the attempt may go, else yields the
        last step (:class:`Refuse` or :class:`Done`) and returns False."""
        breaker = self.breaker
        while True:
            if self.attempts and self.permit.generation != breaker.generation:
                yield self.give_up()  # the breaker changed state since admission (a trip): no further attempt
                return False
            remaining = breaker.cooldown_remaining()
            if self.call_deadline is not None and self.now() >= self.call_deadline:
                count_deadline(breaker)  # the refusal path only
                yield self.refuse(remaining, DeadlineExceededError(breaker.name))
                return False
            if remaining <= 0:
                return True
            config = breaker.config
            allowed = config.max_cooldown_wait if self.deadline is None else max(0.0, self.deadline - self.now())
            if self.call_deadline is not None:  # the budget's end may be the deadline: cap the wait too
                allowed = min(allowed, self.call_deadline - self.now())
            if remaining <= allowed:
                yield Sleep(remaining)
                continue
            if config.dry_run:
                breaker.note_dry_run_refusal(remaining)  # counted and logged, never refused
                return True
            yield self.refuse(remaining)
            return False

    def refuse(self, remaining: float, refusal: CallRefusedError | None = None) -> Refuse:
        """The cooldown outlasts the allowed wait (or *refusal*: the deadline has passed):
        the refused attempt is recorded nowhere; the last one made, if any, is final."""
        if refusal is None:
            refusal = RateLimitCooldownError(self.breaker.name, remaining)
        if bus.wants_rejections():
            bus.publish(
                CallRejected(
                    refusal.service, self.breaker.clock.wall(), reason=refusal.reason, retry_after=refusal.retry_after
                )
            )
        if self.attempts:
            self.breaker.record_failure(self.permit, rate_limited=self.rate_limited, count_attempt=False)
            if self.error is not None:
                refusal.__cause__ = self.error  # chained from the last attempt's exception
        else:
            self.breaker.record_ignored(self.permit)  # nothing reached the dependency (a trial's slot comes back)
        return Refuse(refusal)

    def judge(self, outcome: Outcome) -> Done | bool:
        """Count one attempt. Returns the final step when it ends the sequence (a success or
        an ignored exception), else whether its kind of failure is worth another attempt."""
        self.attempts += 1
        breaker = self.breaker
        if isinstance(outcome, Raised):
            error = outcome.error
            counted, rate_limited = exception_outcome(breaker.config, error, breaker.name)
            if not counted:
                breaker.record_ignored(self.permit)  # neither success nor failure, never retried
                return Done(error=error, fallback=False)
            retried = isinstance(error, self.policy.retry_on) and not isinstance(error, _NEVER_RETRIED)
            retry_after = retry_after_of(error) if rate_limited else None
            self.error, self.value = error, None
        else:
            value = outcome.value
            kind = result_kind(breaker.config, value, breaker.name)  # asked once per attempt
            if kind == SUCCESS:
                breaker.record_success(self.permit)  # what settled() does
                return Done(value=value)
            rate_limited = kind == RATE_LIMITED
            retried = True  # returned failure and rate-limit responses are always retried
            retry_after = retry_after_of(value) if rate_limited else None
            self.error, self.value = None, value
        self.rate_limited = rate_limited
        breaker.note_attempt(rate_limited=rate_limited, retry_after=retry_after)  # a 429 starts the cooldown
        return retried

    def wait_after(self, *, retried: bool) -> float | None:
        """The backoff before another attempt, or None when there is none: the failure is
        not retried, the breaker changed state since admission, no attempt is left (a trial
        has one), the backoff does not fit in the budget, or the retry budget is spent."""
        if not retried or self.permit.generation != self.breaker.generation or self.attempts >= self.limit:
            return None
        wait = self.policy.backoff(self.attempts)
        if self.deadline is not None and self.now() + wait >= self.deadline:
            return None
        if self.budget is not None and not self.budget.try_retry():
            return None
        return wait

    def announce(self, wait: float) -> None:
        """Tell the bus's listeners (tracing) that another attempt follows in *wait* seconds;
        a retry is never on the success path."""
        if bus.listeners:
            breaker = self.breaker
            bus.publish(Retrying(breaker.name, breaker.clock.wall(), attempt=self.attempts + 1, delay=wait))

    def give_up(self) -> Done:
        """Record the last (failed) attempt as the final outcome and build the Done step:
        its exception, which a fallback may replace, or its response, returned unchanged."""
        self.breaker.record_failure(self.permit, rate_limited=self.rate_limited, count_attempt=False)
        if self.error is None:
            return Done(value=self.value)
        return Done(error=self.error, fallback=True)

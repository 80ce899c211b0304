"""Carrying out one protected call: breaker outside, retry inside, fallback last.

Two small interpreters share every decision: :func:`run_sync` sleeps with the clock's
``sleep`` and :func:`run_async` with ``asyncio.sleep`` (or the clock's ``asleep``), so
the waits of an async call never block its event loop. Implements FAC-2, FAC-3, FAC-4,
CB-6 (a trial is one attempt), CB-10, CB-11, RL-1, RL-2, RL-5, RL-6, RL-7.
"""

from __future__ import annotations

import asyncio
from typing import Any, Awaitable, Callable

from .breaker import CircuitBreaker, Permit
from .classify import (
    PLAIN_TYPES,
    RATE_LIMITED,
    SUCCESS,
    classify_status,
    exception_is_rate_limit,
    retry_after_of,
    status_of,
)
from .errors import CircuitOpenError, RateLimitCooldownError
from .retry import RetryPlan, RetryPolicy

__all__ = ["settle_exception", "settle_result", "settle_status", "call_fallback", "acall_fallback", "run_sync", "run_async"]


def classify_exception(breaker: CircuitBreaker, exc: BaseException) -> tuple[bool, bool]:
    """``(counted, rate_limited)`` for an exception from the dependency (CB-10, RL-1, RL-7).

    The breaker's own :class:`CircuitOpenError` (nested use of one breaker) never reached
    the dependency: not counted, so a trial gives its slot back (CB-10).
    """
    cfg = breaker.config
    if not isinstance(exc, Exception) or (cfg.ignore_exceptions and isinstance(exc, cfg.ignore_exceptions)):
        return False, False
    if exc.__class__ is CircuitOpenError and exc.service == breaker.name:
        return False, False
    return True, exception_is_rate_limit(exc, cfg.rate_limit_codes)


def settle_exception(breaker: CircuitBreaker, permit: Permit, exc: BaseException) -> bool:
    """Record the outcome of a single attempt that raised; True when it counted as a failure."""
    counted, rate_limited = classify_exception(breaker, exc)
    if not counted:
        breaker.record_ignored(permit)
        return False
    if rate_limited:
        breaker.record_failure(permit, rate_limited=True, retry_after=retry_after_of(exc))
    else:
        breaker.record_failure(permit)
    return True


def settle_result(breaker: CircuitBreaker, permit: Permit, result: Any) -> None:
    """Record a returned value: a status on either list is a failure, else a success (CB-11)."""
    if type(result) in PLAIN_TYPES:
        breaker.record_success(permit)
        return
    cfg = breaker.config
    # Fast lane for the usual HTTP response (requests, httpx, Django): a plain int status
    # on neither list is a success, recorded through the lock-free healthy path.
    try:
        code = result.status_code
    except Exception:
        code = None
    if code.__class__ is int and code not in cfg.failure_codes and code not in cfg.rate_limit_codes:
        if permit is breaker._healthy_permit:
            cascade = breaker._cascade
            if breaker._mono() < cascade.bucket_end:
                next(cascade.counter)
                return
        breaker.record_success(permit)
        return
    kind = classify_status(status_of(result), cfg.failure_codes, cfg.rate_limit_codes)
    if kind == SUCCESS:
        breaker.record_success(permit)
    elif kind == RATE_LIMITED:
        breaker.record_failure(permit, rate_limited=True, retry_after=retry_after_of(result))
    else:
        breaker.record_failure(permit)


def settle_status(
    breaker: CircuitBreaker,
    permit: Permit,
    status: Any,
    retry_after: Callable[[], Any],
    own: Callable[[int, int | None], bool],
) -> str:
    """Record an HTTP response known by its status (the inbound middlewares, IN-1..IN-3, IN-6).

    Args:
        status: the integer status (anything else reads as no status: a success).
        retry_after: returns the response's raw ``Retry-After`` (read only for a 429).
        own: ``own(kind, status)`` is True for the package's or the application's own
            answers (load shedding, its 429s), which are never recorded.

    Returns:
        ``"success"``, ``"failure"``, ``"rate_limited"`` or ``"ignored"``.
    """
    code = status if isinstance(status, int) and not isinstance(status, bool) else None
    config = breaker.config
    kind = classify_status(code, config.failure_codes, config.rate_limit_codes)
    if own(kind, code):
        breaker.record_ignored(permit)
        return "ignored"
    if kind == SUCCESS:
        breaker.record_success(permit)
        return "success"
    if kind == RATE_LIMITED:
        breaker.record_failure(permit, rate_limited=True, retry_after=retry_after())
        return "rate_limited"
    breaker.record_failure(permit)
    return "failure"


def call_fallback(fallback: Callable[..., Any], args: tuple, kwargs: dict, error: BaseException) -> Any:
    """Run *fallback* with the call's own arguments; its errors are chained from *error* (FAC-4)."""
    try:
        return fallback(*args, **kwargs)
    except Exception as fallback_error:
        raise fallback_error from error


async def acall_fallback(fallback: Callable[..., Any], args: tuple, kwargs: dict, error: BaseException) -> Any:
    """Async :func:`call_fallback`: a coroutine function (or an awaitable result) is awaited."""
    try:
        value = fallback(*args, **kwargs)
        if asyncio.iscoroutine(value) or isinstance(value, asyncio.Future):
            value = await value
        return value
    except Exception as fallback_error:
        raise fallback_error from error


class _Attempt:
    """What one attempt produced, as the retry stage sees it."""

    __slots__ = ("exc", "result", "failed", "rate_limited", "retry_after")

    def __init__(self) -> None:
        self.exc: BaseException | None = None
        self.result: Any = None
        self.failed = False
        self.rate_limited = False
        self.retry_after: Any = None


def _judge_exception(breaker: CircuitBreaker, exc: BaseException) -> _Attempt | None:
    """None for an ignored exception (it ends the sequence uncounted), else the attempt."""
    counted, rate_limited = classify_exception(breaker, exc)
    if not counted:
        return None
    attempt = _Attempt()
    attempt.exc = exc
    attempt.failed = True
    attempt.rate_limited = rate_limited
    attempt.retry_after = retry_after_of(exc) if rate_limited else None
    breaker.note_attempt(rate_limited=rate_limited, retry_after=attempt.retry_after)
    return attempt


def _judge_result(breaker: CircuitBreaker, result: Any) -> _Attempt:
    attempt = _Attempt()
    attempt.result = result
    if type(result) not in PLAIN_TYPES:
        cfg = breaker.config
        kind = classify_status(status_of(result), cfg.failure_codes, cfg.rate_limit_codes)
        if kind != SUCCESS:
            attempt.failed = True
            attempt.rate_limited = kind == RATE_LIMITED
            attempt.retry_after = retry_after_of(result) if attempt.rate_limited else None
    breaker.note_attempt(rate_limited=attempt.rate_limited, retry_after=attempt.retry_after)
    return attempt


def _record_final(breaker: CircuitBreaker, permit: Permit, last: _Attempt) -> None:
    # FAC-2: the breaker sees only the sequence's final outcome; attempts were already
    # counted in the cascade one by one (RL-5).
    if last.failed:
        breaker.record_failure(permit, rate_limited=last.rate_limited, count_attempt=False)
    else:
        breaker.record_success(permit, count_attempt=False)


def _may_retry(plan: RetryPlan, last: _Attempt, breaker: CircuitBreaker, permit: Permit) -> bool:
    if not last.failed:
        return False
    if last.exc is not None and not plan.retryable(last.exc):
        return False
    # the breaker changed state since this call was admitted (a trip): stop hammering
    return permit.generation == breaker._gen


def _refusal(breaker: CircuitBreaker, permit: Permit, last: _Attempt | None, remaining: float) -> RateLimitCooldownError:
    # RL-6: the refused attempt is recorded nowhere; earlier attempts' last outcome is final
    error = RateLimitCooldownError(breaker.name, remaining)
    if last is None:
        breaker.record_ignored(permit)
    else:
        _record_final(breaker, permit, last)
        if last.exc is not None:
            error.__cause__ = last.exc
    return error


_GO, _WAIT, _REFUSE, _STOP = "go", "wait", "refuse", "stop"


def _gate(breaker: CircuitBreaker, plan: RetryPlan, permit: Permit, last: _Attempt | None) -> tuple[str, Any]:
    """Before each attempt (RL-6): stop if the breaker moved on, wait out the cooldown, or refuse.

    Re-read after every wait, so a cooldown extended meanwhile is waited out again.
    """
    if last is not None and permit.generation != breaker._gen:
        return _STOP, None  # the breaker tripped during the wait: no further attempt
    remaining = breaker.cooldown_remaining()
    if remaining <= 0:
        return _GO, None
    if remaining > plan.allowed_wait(breaker._clock.monotonic(), breaker.config.max_cooldown_wait):
        if breaker.config.dry_run:
            breaker.note_dry_run_refusal(remaining)  # OP-5: counted and logged, never refused
            return _GO, None
        return _REFUSE, _refusal(breaker, permit, last, remaining)
    return _WAIT, remaining


def _finish(breaker: CircuitBreaker, permit: Permit, last: _Attempt) -> tuple[bool, Any]:
    """Record the final outcome; ``(raised, value_or_exception)``."""
    _record_final(breaker, permit, last)
    if last.exc is None:
        return False, last.result
    return True, last.exc


def run_sync(
    breaker: CircuitBreaker,
    permit: Permit,
    policy: RetryPolicy,
    func: Callable[..., Any],
    args: tuple,
    kwargs: dict,
    fallback: Callable[..., Any] | None,
) -> Any:
    """Run *func* under an admitted *permit* with retries (a trial gets a one-attempt policy).

    Returns the final value (a failure response unchanged, FAC-3) or the fallback's.

    Raises:
        RateLimitCooldownError: a cooldown outlasted the allowed wait and no fallback.
        Exception: the final counted exception, or an ignored one, when no fallback applies.
    """
    clock = breaker._clock
    plan = RetryPlan(policy, clock.monotonic())
    last: _Attempt | None = None
    while True:
        step, value = _gate(breaker, plan, permit, last)
        while step == _WAIT:
            clock.sleep(value)
            step, value = _gate(breaker, plan, permit, last)
        if step == _REFUSE:
            if fallback is None:
                raise value
            return call_fallback(fallback, args, kwargs, value)
        if step == _STOP:
            raised, outcome = _finish(breaker, permit, last)  # type: ignore[arg-type]
            break
        plan.attempts += 1
        try:
            result = func(*args, **kwargs)
        except BaseException as exc:
            judged = _judge_exception(breaker, exc)
            if judged is None:
                breaker.record_ignored(permit)
                raise
            last = judged
        else:
            last = _judge_result(breaker, result)
        wait = plan.next_wait(clock.monotonic()) if _may_retry(plan, last, breaker, permit) else None
        if wait is None:
            raised, outcome = _finish(breaker, permit, last)
            break
        if wait > 0:
            clock.sleep(wait)
    if not raised:
        return outcome
    if fallback is None:
        raise outcome
    return call_fallback(fallback, args, kwargs, outcome)


async def run_async(
    breaker: CircuitBreaker,
    permit: Permit,
    policy: RetryPolicy,
    factory: Callable[..., Awaitable[Any]],
    args: tuple,
    kwargs: dict,
    fallback: Callable[..., Any] | None,
) -> Any:
    """The async twin of :func:`run_sync`; waits with ``asyncio.sleep`` (FAC-3, RL-6)."""
    clock = breaker._clock
    asleep = getattr(clock, "asleep", None) or asyncio.sleep
    plan = RetryPlan(policy, clock.monotonic())
    last: _Attempt | None = None
    while True:
        step, value = _gate(breaker, plan, permit, last)
        while step == _WAIT:
            await asleep(value)
            step, value = _gate(breaker, plan, permit, last)
        if step == _REFUSE:
            if fallback is None:
                raise value
            return await acall_fallback(fallback, args, kwargs, value)
        if step == _STOP:
            raised, outcome = _finish(breaker, permit, last)  # type: ignore[arg-type]
            break
        plan.attempts += 1
        try:
            result = await factory(*args, **kwargs)
        except BaseException as exc:
            judged = _judge_exception(breaker, exc)
            if judged is None:
                breaker.record_ignored(permit)
                raise
            last = judged
        else:
            last = _judge_result(breaker, result)
        wait = plan.next_wait(clock.monotonic()) if _may_retry(plan, last, breaker, permit) else None
        if wait is None:
            raised, outcome = _finish(breaker, permit, last)
            break
        if wait > 0:
            await asleep(wait)
    if not raised:
        return outcome
    if fallback is None:
        raise outcome
    return await acall_fallback(fallback, args, kwargs, outcome)


def guard_rejection(fallback: Callable[..., Any] | None, args: tuple, kwargs: dict, error: CircuitOpenError) -> Any:
    """Fallback for a rejection (FAC-4), or re-raise it."""
    if fallback is None:
        raise error
    return call_fallback(fallback, args, kwargs, error)

"""Carrying out one protected call: breaker outside, retry inside, fallback last.

Every decision of a retry sequence is taken by the plan in :mod:`.retry`; the two
interpreters here only carry its steps out: :func:`run_sync` calls the function and waits
with the clock's ``sleep``, :func:`run_async` awaits it and waits with ``asyncio.sleep``
(or the clock's ``asleep``), so the waits of an async call never block its event loop.
"""

from __future__ import annotations

import asyncio
import types
from collections.abc import Awaitable, Callable
from typing import Any

from .calls import BreakerCore
from .classify import RATE_LIMITED, SUCCESS, classify_status, retry_after_of, status_of
from .errors import awaitable_refused, is_awaitable
from .nesting import Mark, outer_of, recorded_since, settled_elsewhere
from .permit import Permit
from .retry import (
    ATTEMPT,
    Done,
    Outcome,
    Raised,
    Refuse,
    RetryPolicy,
    Returned,
    Sleep,
    Step,
    exception_outcome,
    result_kind,
    retry_plan,
    settled,
)
from .stages.service import budget_of

__all__ = [
    "settle_exception",
    "settle_result",
    "settle_raised",
    "asettle_raised",
    "settle_returned",
    "settled_elsewhere",
    "settle_status",
    "call_fallback",
    "acall_fallback",
    "run_sync",
    "run_async",
    "continue_sync",
    "continue_async",
]


_COROUTINE = types.CoroutineType


def settle_exception(breaker: BreakerCore, permit: Permit, exc: BaseException) -> bool:
    """Record the outcome of a single attempt that raised; True when it counted as a failure."""
    counted, rate_limited = exception_outcome(breaker.config, exc, breaker.name)
    if not counted:
        breaker.record_ignored(permit)
        return False
    if rate_limited:
        breaker.record_failure(permit, rate_limited=True, retry_after=retry_after_of(exc))
    else:
        breaker.record_failure(permit)
    return True


def settle_result(breaker: BreakerCore, permit: Permit, result: Any) -> None:
    """Record a returned value: a status on either list is a failure, and so is a value the
    ``result_predicate`` marks; else a success."""
    if type(result) in breaker.plain_types:  # empty while a result_predicate is set
        breaker.record_success(permit)
        return
    cfg = breaker.config
    if cfg.result_predicate is None:
        # Fast lane for the usual HTTP response (requests, httpx, Django): a plain int
        # status on neither list is a success, recorded through the lock-free healthy path.
        try:
            code = result.status_code
        except Exception:
            code = None
        if type(code) is int and code not in cfg.failure_codes and code not in cfg.rate_limit_codes:
            if not breaker.healthy_success(permit):
                breaker.record_success(permit)
            return
        kind = classify_status(status_of(result), cfg.failure_codes, cfg.rate_limit_codes)
    else:
        kind = cfg.classifier.result(result, breaker.name)
    if kind == SUCCESS:
        breaker.record_success(permit)
    elif kind == RATE_LIMITED:
        breaker.record_failure(permit, rate_limited=True, retry_after=retry_after_of(result))
    else:
        breaker.record_failure(permit)


def _fail_outer(breaker: BreakerCore, outer: tuple[Permit, Mark], exc: BaseException, rate_limited: bool) -> bool:
    """A nested call failed and its fallback answers: the outer call never got the
    dependency's answer, so its outcome is this failure, recorded once on its permit.
    Returns True when it recorded (False: the outer call's outcome was recorded already)."""
    permit, mark = outer
    if recorded_since(breaker, mark):
        return False
    if rate_limited:
        breaker.record_failure(permit, rate_limited=True, retry_after=retry_after_of(exc))
    else:
        breaker.record_failure(permit)
    return True


def settle_raised(breaker: BreakerCore, permit: Permit, mark: Mark, exc: BaseException, answered: bool) -> bool:
    """Record that the call admitted by *permit* (begun at record number *mark*) ended by
    raising *exc*, as :func:`settle_exception` does, unless its outcome is not its own to
    record (:func:`settled_elsewhere`).

    Args:
        answered: a fallback answers the caller when *exc* is a counted failure. A nested
            call's failure answered that way is the outer call's failure (recorded on the
            outer call's permit, once).

    Returns:
        True when *exc* counts as a failure (whoever records it).
    """
    if recorded_since(breaker, mark):
        return exception_outcome(breaker.config, exc, breaker.name)[0]
    outer = outer_of(breaker, permit, mark)
    if outer is None:
        return settle_exception(breaker, permit, exc)
    counted, rate_limited = exception_outcome(breaker.config, exc, breaker.name)
    if counted and answered:
        _fail_outer(breaker, outer, exc, rate_limited)
    return counted


async def asettle_raised(breaker: BreakerCore, permit: Permit, mark: Mark, exc: BaseException, answered: bool) -> bool:
    """:func:`settle_raised` for a coroutine: the stack is read on the event loop's thread,
    and a shared breaker's trial outcome is written from a worker thread."""
    if recorded_since(breaker, mark):
        return exception_outcome(breaker.config, exc, breaker.name)[0]
    outer = outer_of(breaker, permit, mark)
    if outer is None:
        if not permit.trial:
            return settle_exception(breaker, permit, exc)
        counted = bool(await breaker.off_loop(settle_exception, breaker, permit, exc))
        breaker.note_recorded()
        return counted
    counted, rate_limited = exception_outcome(breaker.config, exc, breaker.name)
    if counted and answered and not recorded_since(breaker, outer[1]):
        await breaker.off_loop(_fail_outer, breaker, outer, exc, rate_limited)
        breaker.note_recorded()
    return counted


def settle_returned(breaker: BreakerCore, permit: Permit, mark: Mark, result: Any) -> None:
    """Record the value the call admitted by *permit* returned, as :func:`settle_result`
    does, unless its outcome is not its own to record (:func:`settled_elsewhere`). A
    success on the lock-free healthy lane is counted there without asking."""
    kind = SUCCESS if type(result) in breaker.plain_types else result_kind(breaker.config, result, breaker.name)
    if kind == SUCCESS and breaker.healthy_success(permit):
        return
    if settled_elsewhere(breaker, permit, mark):
        return
    if kind == SUCCESS:
        breaker.record_success(permit)
    elif kind == RATE_LIMITED:
        breaker.record_failure(permit, rate_limited=True, retry_after=retry_after_of(result))
    else:
        breaker.record_failure(permit)


def settle_status(
    breaker: BreakerCore,
    permit: Permit,
    status: Any,
    retry_after: Callable[[], Any],
    own: Callable[[int, int | None], bool],
) -> str:
    """Record an HTTP response known by its status (the inbound middlewares).

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


def call_fallback(
    fallback: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], error: BaseException
) -> Any:
    """Run *fallback* with the call's own arguments; its errors are chained from *error*.

    A synchronous call's fallback that returns an awaitable (an ``async def`` one the
    decorator could not see as such) raises ConfigError: the caller would get a coroutine
    nobody awaits."""
    try:
        value = fallback(*args, **kwargs)
        if value.__class__ is _COROUTINE or is_awaitable(value):
            raise awaitable_refused(f"the fallback {getattr(fallback, '__qualname__', fallback)!r}", value)
        return value
    except Exception as fallback_error:
        raise fallback_error from error


async def acall_fallback(
    fallback: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], error: BaseException
) -> Any:
    """Async :func:`call_fallback`: a coroutine function (or an awaitable result) is awaited."""
    try:
        value = fallback(*args, **kwargs)
        if asyncio.iscoroutine(value) or isinstance(value, asyncio.Future):
            value = await value
        return value
    except Exception as fallback_error:
        raise fallback_error from error


def _ending(step: Step, fallback: Callable[..., Any] | None) -> tuple[Any, BaseException | None]:
    """How a finished sequence ends: ``(value, None)`` returns *value*;
    ``(None, error)`` hands *error* to the fallback. Raises the error itself when no
    fallback applies (none given, or an ignored exception)."""
    if isinstance(step, Done):
        if step.error is None:
            return step.value, None
        if fallback is None or not step.fallback:
            raise step.error
        return None, step.error
    if isinstance(step, Refuse):
        if fallback is None:
            raise step.error
        return None, step.error
    raise TypeError(f"retry plan ended on {step!r}")


def _first_settled(breaker: BreakerCore, permit: Permit, result: Any, mark: Mark) -> bool:
    """True when the first attempt's returned *result* ends the call: a success (recorded
    here), or a failure response a nested call recorded (no retry, nothing more recorded)."""
    if type(result) in breaker.plain_types:  # settled()'s first test, inlined: no status to read
        if not breaker.healthy_success(permit) and not settled_elsewhere(breaker, permit, mark):
            breaker.record_success(permit)
        return True
    return settled(breaker, permit, result, mark) or settled_elsewhere(breaker, permit, mark)


def run_sync(
    breaker: BreakerCore,
    permit: Permit,
    policy: RetryPolicy,
    func: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    fallback: Callable[..., Any] | None,
    mark: Mark | None = None,
) -> Any:
    """Run *func* under an admitted *permit* with retries, carrying out :func:`.retry_plan`'s steps.

    Args:
        breaker: the breaker that admitted the call.
        permit: its permit (a trial makes one attempt).
        policy: the retry policy.
        func, args, kwargs: the call, made once per attempt.
        fallback: called with *args*/*kwargs* on a refusal or a final counted exception.
        mark: the call's mark (see :mod:`.nesting`; None: the breaker's record number now):
            a call nested in another through the same breaker makes one attempt and
            records nothing.

    Returns:
        The final value (a failure response unchanged) or the fallback's.

    Raises:
        RateLimitCooldownError: a cooldown outlasted the allowed wait and no fallback.
        Exception: the final counted exception, or an ignored one, when no fallback applies.
    """
    # The happy path: with no cooldown to gate it the plan would let the
    # first attempt through at once, so it runs inline, and a success ends the sequence
    # here (settled()): no generator is built. The plan starts on a failed attempt, with
    # its outcome, or at once under a cooldown. The clock is read only when it matters: a
    # cooldown was ever set in this process (cooldown_until is 0.0 until then) or the
    # budget needs the start time.
    until = breaker.cooldown_until
    start = breaker.clock.monotonic() if until or policy.budget_seconds is not None else 0.0
    first: Outcome | None = None
    if mark is None:
        mark = breaker.record_mark()
    # a call nested in another through this breaker passes no gate and makes one attempt:
    # the outer call's retry stage is the one that retries
    if until <= start or outer_of(breaker, permit, mark) is not None:
        try:
            result = func(*args, **kwargs)
        except BaseException as exc:
            if settled_elsewhere(breaker, permit, mark):
                answered = fallback is not None and not permit.dry_run
                if settle_raised(breaker, permit, mark, exc, answered) and fallback is not None:
                    return call_fallback(fallback, args, kwargs, exc)
                raise
            first = Raised(exc)
        else:
            if _first_settled(breaker, permit, result, mark):
                return result
            first = Returned(result)
    return continue_sync(breaker, permit, policy, func, args, kwargs, fallback, start, first)


def _recorded_end(
    breaker: BreakerCore,
    outcome: Outcome,
    fallback: Callable[..., Any] | None,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> Any:
    """End a retry sequence whose outcome a nested call recorded already (its fallback
    answered a failure): no further attempt, nothing more recorded; the attempt's value is
    returned, or its exception raised or answered by *fallback* when it counts."""
    if isinstance(outcome, Returned):
        return outcome.value
    error = outcome.error
    if fallback is not None and exception_outcome(breaker.config, error, breaker.name)[0]:
        return call_fallback(fallback, args, kwargs, error)
    raise error


def continue_sync(
    breaker: BreakerCore,
    permit: Permit,
    policy: RetryPolicy,
    func: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    fallback: Callable[..., Any] | None,
    start: float,
    first: Outcome | None,
) -> Any:
    """The rest of :func:`run_sync` once the first attempt's *first* outcome is known (or
    None: the plan makes every attempt). The wrappers of :mod:`.hotpath` make the first
    attempt themselves when nothing gates it (no cooldown ever set, no budget, not a
    trial: *start* is then 0.0, as :func:`run_sync` would have it) and call this only when
    it did not succeed. Same return value and errors as :func:`run_sync`."""
    mark = breaker.record_mark()
    plan = retry_plan(breaker, permit, policy, start, first, budget_of(breaker))
    step = next(plan)
    while True:
        if step is ATTEMPT:
            outcome: Outcome
            try:
                outcome = Returned(func(*args, **kwargs))
            except BaseException as exc:
                outcome = Raised(exc)
            if recorded_since(breaker, mark):  # a nested call recorded this call's outcome
                plan.close()
                return _recorded_end(breaker, outcome, fallback, args, kwargs)
            step = plan.send(outcome)
        elif isinstance(step, Sleep):
            breaker.clock.sleep(step.seconds)
            step = next(plan)
        else:
            break
    plan.close()
    value, error = _ending(step, fallback)
    if error is None or fallback is None:
        return value
    return call_fallback(fallback, args, kwargs, error)


async def _recording(breaker: BreakerCore, permit: Permit, fn: Callable[..., Any], *args: Any) -> Any:
    """Run ``fn(*args)``, which may record *permit*'s outcome: a shared breaker's trial
    outcome is a store write, made from a worker thread so the event loop never waits on
    the store; anything else inline."""
    if permit.trial and breaker.shared:
        return await asyncio.to_thread(fn, *args)
    return fn(*args)


async def _afirst_settled(breaker: BreakerCore, permit: Permit, result: Any, mark: Mark) -> bool:
    """:func:`_first_settled` for a coroutine: a shared trial's outcome is recorded off the
    loop; the nesting stack is read here, on the loop's thread."""
    if type(result) in breaker.plain_types:  # settled()'s first test, inlined
        if not breaker.healthy_success(permit) and not settled_elsewhere(breaker, permit, mark):
            await _recording(breaker, permit, breaker.record_success, permit)
        return True
    if settled_elsewhere(breaker, permit, mark):
        return True
    return bool(await _recording(breaker, permit, settled, breaker, permit, result))


async def run_async(
    breaker: BreakerCore,
    permit: Permit,
    policy: RetryPolicy,
    factory: Callable[..., Awaitable[Any]],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    fallback: Callable[..., Any] | None,
    mark: Mark | None = None,
) -> Any:
    """The async interpreter of :func:`.retry_plan`: awaits each attempt, waits with
    ``asyncio.sleep`` (or the clock's ``asleep``). Same arguments, return
    value and errors as :func:`run_sync`; a coroutine-function fallback is awaited."""
    until = breaker.cooldown_until  # the happy path: see run_sync
    start = breaker.clock.monotonic() if until or policy.budget_seconds is not None else 0.0
    first: Outcome | None = None
    if mark is None:
        mark = breaker.record_mark()
    if until <= start or outer_of(breaker, permit, mark) is not None:  # as in run_sync
        try:
            result = await factory(*args, **kwargs)
        except BaseException as exc:
            if settled_elsewhere(breaker, permit, mark):
                answered = fallback is not None and not permit.dry_run
                if await asettle_raised(breaker, permit, mark, exc, answered) and fallback is not None:
                    return await acall_fallback(fallback, args, kwargs, exc)
                raise
            first = Raised(exc)
        else:
            if await _afirst_settled(breaker, permit, result, mark):
                return result
            first = Returned(result)
    return await continue_async(breaker, permit, policy, factory, args, kwargs, fallback, start, first)


async def continue_async(
    breaker: BreakerCore,
    permit: Permit,
    policy: RetryPolicy,
    factory: Callable[..., Awaitable[Any]],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    fallback: Callable[..., Any] | None,
    start: float,
    first: Outcome | None,
) -> Any:
    """The async :func:`continue_sync`: the rest of :func:`run_async` after its first attempt.
    The plan records outcomes as it advances, so a shared breaker's trial advances it off
    the event loop (see :func:`_recording`)."""
    mark = breaker.record_mark()
    plan = retry_plan(breaker, permit, policy, start, first, budget_of(breaker))
    step = await _recording(breaker, permit, next, plan)
    while True:
        if step is ATTEMPT:
            outcome: Outcome
            try:
                outcome = Returned(await factory(*args, **kwargs))
            except BaseException as exc:
                outcome = Raised(exc)
            if recorded_since(breaker, mark):  # as in continue_sync
                plan.close()
                error = outcome.error if isinstance(outcome, Raised) else None
                if (
                    error is not None
                    and fallback is not None
                    and exception_outcome(breaker.config, error, breaker.name)[0]
                ):
                    return await acall_fallback(fallback, args, kwargs, error)
                return _recorded_end(breaker, outcome, None, args, kwargs)
            step = await _recording(breaker, permit, plan.send, outcome)
        elif isinstance(step, Sleep):
            clock = breaker.clock
            asleep = getattr(clock, "asleep", None) or asyncio.sleep
            await asleep(step.seconds)
            step = await _recording(breaker, permit, next, plan)
        else:
            break
    plan.close()
    value, error = _ending(step, fallback)
    if error is None or fallback is None:
        return value
    return await acall_fallback(fallback, args, kwargs, error)

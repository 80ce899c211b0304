"""The wrappers a protected function runs through, built over a breaker's core.

Each builder returns a closure that reads the core's hot-path fields lock-free (see
:class:`~baldur_django.core.machine.Machine`): one field read to admit on the CLOSED
healthy lane, no lock and no Python call of its own to record a healthy success. Every
other case goes to the runner (``runner.py``), the retry engine (``retry.py``) or the
nesting rules (``nesting.py``), imported here directly.
"""

from __future__ import annotations

import dataclasses
import inspect
import operator
import weakref
from collections.abc import Awaitable, Callable
from typing import Any, cast

from .breaker import CircuitBreaker, core_of
from .calls import BreakerCore
from .errors import CircuitOpenError, awaitable_refused, is_awaitable, new_open_error
from .nesting import Mark, amarked, marked, nest_mark, recorded_since, register
from .permit import Permit, enter_trial, leave_trial, trial_in_progress
from .retry import Outcome, Raised, RetryPolicy, Returned, settled
from .runner import (
    acall_fallback,
    asettle_raised,
    call_fallback,
    continue_async,
    continue_sync,
    run_async,
    run_sync,
    settle_raised,
    settle_result,
    settle_returned,
    settled_elsewhere,
)
from .stages.deadline import ARMED
from .stages.deadline import current as current_deadline
from .stages.pipeline import Pipeline, build_pipeline
from .states import Reason

__all__ = [
    "sync_wrapper",
    "async_wrapper",
    "build_wrapper",
    "build_awrapper",
    "build_inline",
    "build_ainline",
    "trial_policy",
    "discard",
    "SLOW",
    "REFUSED",
    "NOT_PLAIN",
    "run_staged",
    "arun_staged",
    "deadline_around",
]

# The wrappers reach the retry stage only while ``retrying`` (a policy is set): these are
# run_sync/run_async/continue_sync/continue_async typed for the wrappers' optional policy.
_run_sync = cast("Callable[..., Any]", run_sync)
_run_async = cast("Callable[..., Awaitable[Any]]", run_async)
_continue_sync = cast("Callable[..., Any]", continue_sync)
_continue_async = cast("Callable[..., Awaitable[Any]]", continue_async)

#: a breaker's own wrapper -> the staged wrapper that runs its calls under a deadline
#: (built on the first such call; it goes with the wrapper)
_staged: weakref.WeakKeyDictionary[Callable[..., Any], Callable[..., Any]] = weakref.WeakKeyDictionary()

#: reads the breaker core of a wrapper's frame from its locals (the closure's ``core``)
_core_of = operator.itemgetter("core")

# A def or lambda whose code has none of these flags is neither a coroutine function nor
# a generator function of any kind: exactly what inspect finds out for protect().
NOT_PLAIN = inspect.CO_COROUTINE | inspect.CO_GENERATOR | inspect.CO_ASYNC_GENERATOR | inspect.CO_ITERABLE_COROUTINE
SLOW = object()  # a route's plain path did not apply: run the full wrapper
REFUSED = object()  # the call was a coroutine or generator function: go the full way


def discard(value: Any) -> None:
    """Close a coroutine or generator that a refused function returned, before any of its
    body ran: no "never awaited" warning, nothing else happened."""
    close = getattr(value, "close", None)
    if close is not None:
        close()


def deadline_around(core: BreakerCore) -> bool:
    """True when a deadline is current that a staged call of *core* did not enter: the call
    must go the staged way (see :mod:`.stages.pipeline`)."""
    found = current_deadline()
    return found is not None and found.owner is not core


def trial_policy(policy: RetryPolicy | None) -> RetryPolicy:
    """*policy* made one attempt, for trials (still gated by the cooldown); None stays None."""
    return cast(RetryPolicy, None if policy is None else dataclasses.replace(policy, max_attempts=1))


def run_trial(
    core: BreakerCore, permit: Permit, wrapper: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """Run a HALF_OPEN trial: the wrapper is entered again with the trial marked as running
    in this thread, so it and every call nested in it through the same breaker use this
    one permit. A trial that recorded nothing (its outcome was dropped on the healthy lane
    after a state change) gives its slot back."""
    mark = core.record_mark()
    token = enter_trial(core, permit)
    try:
        return wrapper(*args, **kwargs)
    finally:
        leave_trial(token)
        if not recorded_since(core, mark):
            core.give_back(permit)  # its outcome, if any, was counted where it landed


async def arun_trial(
    core: BreakerCore,
    permit: Permit,
    wrapper: Callable[..., Awaitable[Any]],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> Any:
    """The async :func:`run_trial` (the mark lives in this task's context)."""
    mark = core.record_mark()
    token = enter_trial(core, permit)
    try:
        return await wrapper(*args, **kwargs)
    finally:
        leave_trial(token)
        if not recorded_since(core, mark):
            await core.off_loop(core.give_back, permit)


def build_wrapper(
    core: BreakerCore,
    func: Callable[..., Any],
    policy: RetryPolicy | None,
    fallback: Any,
) -> Callable[..., Any]:
    """The wrapper of a ``def`` protected by this breaker (built here because it reads the
    hot-path fields lock-free; see :mod:`baldur_django.core.hotpath`): one attribute read
    to admit, no lock to record a healthy success.

    Args:
        func: the protected function.
        policy: the retry policy, or None for no retry stage (a trial makes one attempt).
        fallback: called with the call's arguments when the breaker rejects or the call
            fails, or None.

    While a deadline another wrapper of this breaker did not enter is current (read only
    once a deadline was ever set in the process, :data:`.stages.deadline.ARMED`), the call
    goes the staged way instead (:func:`run_staged`).

    Returns:
        A function with *func*'s signature.
    """
    # Every variable a closure uses is a cell of its own (40 bytes each, per wrapper): the
    # wrapper keeps cells for what the CLOSED healthy path reads (the core, the call, the
    # policy, the clock, the cascade), and reaches everything the slower branches need
    # through the core (its fields are slots: one specialised read each) or this module
    # (a trial's one-attempt policy is made per trial: trials are rare).
    cascade = core.cascade
    monotonic = core.mono

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if ARMED and deadline_around(core):  # (ARMED: a deadline was ever set) run it staged
            return run_staged(wrapper, core, func, policy, fallback, args, kwargs)
        # admitted on the healthy lane, the call runs unmarked: its mark is the record
        # number alone (see core/nesting.py); any other call is admitted below
        permit = core.quiet_permit
        if permit is None or (core.timed and monotonic() >= core.sync_due):
            until = core.reject_until
            if until:  # acquire_slow()'s lock-free OPEN rejection, inlined (see core/hotpath.py)
                now = monotonic()
                if now < until and now < core.sync_due and not core.bus.wants_rejections():
                    next(core.blocked_open)  # an itertools.count, one atomic step
                    if fallback is None:
                        # raised unnamed: a local holding it would tie this frame and the
                        # error's traceback into a cycle that only the GC frees
                        raise new_open_error(core.name, Reason.OPEN, until - now)
                    return call_fallback(fallback, args, kwargs, new_open_error(core.name, Reason.OPEN, until - now))
            outer = trial_in_progress(core)
            if outer is not None:
                permit = outer  # nested in this breaker's trial: no second slot, no refusal
            else:
                if fallback is None:
                    permit = core.acquire()
                else:
                    try:
                        permit = core.acquire()
                    except CircuitOpenError as rejection:
                        return call_fallback(fallback, args, kwargs, rejection)
                if permit.trial:
                    return run_trial(core, permit, wrapper, args, kwargs)
            if permit.trial or permit is core.healthy_permit:
                mark: Mark = core.seq
            else:  # off the healthy lane the call runs under a Nest of its own
                nested = nest_mark(core, permit)
                if nested is None:
                    return marked(core, permit, wrapper, args, kwargs)
                mark = nested
        else:
            mark = core.seq
        retrying = policy is not None and not permit.dry_run
        if retrying and (permit.trial or policy.budget_seconds is not None or core.cooldown_until):  # type: ignore[union-attr]  # retrying: a policy
            plan = trial_policy(policy) if permit.trial else policy
            return _run_sync(core, permit, plan, func, args, kwargs, fallback, mark)
        # With a retry policy and nothing to gate the first attempt, _run_sync() would make it at
        # once (start=0.0): it is made here; the engine takes over only when it did not succeed.
        try:
            result = func(*args, **kwargs)
        except BaseException as exc:
            # a nested call is one attempt of its outer call: never a retry stage of its own
            if not retrying or settled_elsewhere(core, permit, mark):
                answered = fallback is not None and not permit.dry_run
                if settle_raised(core, permit, mark, exc, answered) and answered:
                    return call_fallback(fallback, args, kwargs, exc)
                raise
            first: Outcome = Raised(exc)
        else:
            plain = core.plain_types  # the configuration's, swapped whole on reconfigure
            if type(result) not in plain:
                # settle_result()'s response lane, inlined: a plain int status on neither
                # list is a success like a plain value; anything else is classified there
                # (everything, while a result_predicate is set: *plain* is then empty).
                try:
                    code = result.status_code if plain else None  # a result_predicate: no status read
                except Exception:
                    code = None
                config = core.config
                if type(code) is not int or code in config.failure_codes or code in config.rate_limit_codes:
                    if not retrying:
                        settle_returned(core, permit, mark, result)
                        return result
                    if settled(core, permit, result, mark) or settled_elsewhere(core, permit, mark):
                        return result  # a success, or a nested call's failure response (not retried)
                    return _continue_sync(core, permit, policy, func, args, kwargs, fallback, 0.0, Returned(result))
            # healthy_success() inlined: the hottest lines of the package
            if permit is core.healthy_permit and monotonic() < cascade.bucket_end:
                next(cascade.counter)
            elif not settled_elsewhere(core, permit, mark):
                core.record_success(permit)
            return result
        return _continue_sync(core, permit, policy, func, args, kwargs, fallback, 0.0, first)

    register(wrapper.__code__, _core_of)  # its frames run calls (see core/nesting.py)
    return wrapper


def build_awrapper(
    core: BreakerCore,
    func: Callable[..., Awaitable[Any]],
    policy: RetryPolicy | None,
    fallback: Any,
) -> Callable[..., Awaitable[Any]]:
    """The wrapper of an ``async def``: the same steps as :meth:`build_wrapper`, awaiting
    the call; a shared breaker's slow paths (store I/O) run in a worker thread.

    Returns:
        A coroutine function with *func*'s signature.
    """
    cascade = core.cascade  # the cells kept, as in build_wrapper
    monotonic = core.mono

    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        if ARMED and deadline_around(core):  # as in build_wrapper
            return await arun_staged(wrapper, core, func, policy, fallback, args, kwargs)
        permit = core.quiet_permit  # as in build_wrapper
        if permit is None or (core.timed and monotonic() >= core.sync_due):
            until = core.reject_until
            if until:  # acquire_slow()'s lock-free OPEN rejection, inlined (see core/hotpath.py)
                now = monotonic()
                if now < until and now < core.sync_due and not core.bus.wants_rejections():
                    next(core.blocked_open)  # an itertools.count, one atomic step
                    if fallback is None:
                        raise new_open_error(core.name, Reason.OPEN, until - now)  # unnamed: see sync_wrapper
                    return await acall_fallback(
                        fallback, args, kwargs, new_open_error(core.name, Reason.OPEN, until - now)
                    )
            outer = trial_in_progress(core)
            if outer is not None:
                permit = outer  # nested in this breaker's trial
            else:
                if fallback is None:
                    permit = await core.aacquire()
                else:
                    try:
                        permit = await core.aacquire()
                    except CircuitOpenError as rejection:
                        return await acall_fallback(fallback, args, kwargs, rejection)
                if permit.trial:
                    return await arun_trial(core, permit, wrapper, args, kwargs)
            if permit.trial or permit is core.healthy_permit:  # the call's mark, as in build_wrapper
                mark: Mark = core.seq
            else:
                nested = nest_mark(core, permit)
                if nested is None:
                    return await amarked(core, permit, wrapper, args, kwargs)
                mark = nested
        else:
            mark = core.seq
        retrying = policy is not None and not permit.dry_run
        if retrying and (permit.trial or policy.budget_seconds is not None or core.cooldown_until):  # type: ignore[union-attr]  # retrying: a policy
            plan = trial_policy(policy) if permit.trial else policy
            return await _run_async(core, permit, plan, func, args, kwargs, fallback, mark)
        try:  # the first attempt of a retry sequence too, as in sync_wrapper
            result = await func(*args, **kwargs)
        except BaseException as exc:
            if not retrying or settled_elsewhere(core, permit, mark):  # as in build_wrapper
                answered = fallback is not None and not permit.dry_run
                # a shared round's outcome is a store write, made off the loop
                if await asettle_raised(core, permit, mark, exc, answered) and answered:
                    return await acall_fallback(fallback, args, kwargs, exc)
                raise
            first: Outcome = Raised(exc)
        else:
            if permit.trial:  # never retrying here: a trial with a policy went to run_async
                if not settled_elsewhere(core, permit, mark):  # the stack is read on the loop
                    await core.off_loop(settle_result, core, permit, result)
                    core.note_recorded()
                return result
            plain = core.plain_types  # as in build_wrapper
            if type(result) not in plain:  # the response lane, as in build_wrapper
                try:
                    code = result.status_code if plain else None  # a result_predicate: no status read
                except Exception:
                    code = None
                config = core.config
                if type(code) is not int or code in config.failure_codes or code in config.rate_limit_codes:
                    if not retrying:
                        settle_returned(core, permit, mark, result)
                        return result
                    if settled(core, permit, result, mark) or settled_elsewhere(core, permit, mark):
                        return result  # as in build_wrapper
                    return await _continue_async(
                        core, permit, policy, func, args, kwargs, fallback, 0.0, Returned(result)
                    )
            if permit is core.healthy_permit and monotonic() < cascade.bucket_end:
                next(cascade.counter)
            elif not settled_elsewhere(core, permit, mark):
                core.record_success(permit)
            return result
        return await _continue_async(core, permit, policy, func, args, kwargs, fallback, 0.0, first)

    register(wrapper.__code__, _core_of)  # its frames run calls (see core/nesting.py)
    return wrapper


def build_inline(core: BreakerCore) -> Callable[[Callable[[], Any]], Any]:
    """``inline(call)``: :func:`~baldur_django.core.hotpath.protect`'s plain CLOSED path
    (no retry stage, no fallback) for a process-local breaker, reading the hot-path fields
    lock-free as the wrappers do. Returns the call's value, or ``SLOW`` when the
    plain path does not apply (the caller runs its full wrapper), or ``REFUSED``
    when *call* turned out to be a coroutine or generator function (nothing recorded,
    the caller's full way raises the ConfigError). While a deadline is current, every call
    answers ``SLOW`` (the full wrapper runs it the staged way).
    """
    slow = SLOW  # returned by every call of a shared breaker: kept as a cell
    cascade = core.cascade  # the other cells kept, as in build_wrapper
    monotonic = core.mono

    def inline(call: Callable[[], Any]) -> Any:
        permit = core.quiet_permit
        if permit is None or core.timed or (ARMED and current_deadline() is not None):
            return slow  # off the healthy lane the full wrapper marks the call (core/nesting.py)
        mark = core.seq  # as in build_wrapper
        try:
            result = call()
        except BaseException as exc:
            if not call.__code__.co_flags & NOT_PLAIN:
                settle_raised(core, permit, mark, exc, False)
                raise
            return REFUSED
        if type(result) in core.plain_types:  # the configuration's, as in build_wrapper
            if permit is core.healthy_permit and monotonic() < cascade.bucket_end:
                next(cascade.counter)
            elif not settled_elsewhere(core, permit, mark):
                core.record_success(permit)
            return result
        if not call.__code__.co_flags & NOT_PLAIN:
            if is_awaitable(result):  # a lambda around an async def: refused, nothing recorded
                raise awaitable_refused(f"protect({core.name!r})'s call", result)
            settle_returned(core, permit, mark, result)  # the response lane too
            return result
        discard(result)
        return REFUSED

    register(inline.__code__, _core_of)  # its frames run calls (see core/nesting.py)
    return inline


def build_ainline(
    core: BreakerCore,
) -> tuple[
    Callable[[], tuple[Permit, int] | None],
    Callable[[Permit, int, Any], None],
    Callable[[Permit, int, BaseException], None],
]:
    """``(admit, succeeded, failed)``: :func:`~baldur_django.core.hotpath.aprotect`'s plain
    CLOSED path for a process-local breaker, in three plain calls around the caller's own
    ``await`` (an extra coroutine per call would cost more than the path itself).

    ``admit()`` returns ``(permit, mark)`` when the plain path applies, else None (the
    caller runs its full wrapper); ``succeeded(permit, mark, result)`` and
    ``failed(permit, mark, exc)`` record the outcome, the healthy lane lock-free, and
    nothing when a nested call through this breaker settled the call already; as
    :func:`build_inline`, nothing is admitted while a deadline is current.
    """
    cascade = core.cascade  # the cells kept, as in build_wrapper
    monotonic = core.mono

    def admit() -> tuple[Permit, int] | None:
        permit = core.quiet_permit
        if permit is None or core.timed or (ARMED and current_deadline() is not None):
            return None  # as in build_inline
        return permit, core.seq

    def succeeded(permit: Permit, mark: int, result: Any) -> None:
        if type(result) in core.plain_types:  # as in build_wrapper
            if permit is core.healthy_permit and monotonic() < cascade.bucket_end:
                next(cascade.counter)
            elif not settled_elsewhere(core, permit, mark):
                core.record_success(permit)
        else:
            settle_returned(core, permit, mark, result)

    def failed(permit: Permit, mark: int, exc: BaseException) -> None:
        settle_raised(core, permit, mark, exc, False)

    return admit, succeeded, failed


def sync_wrapper(
    breaker: CircuitBreaker, func: Callable[..., Any], policy: RetryPolicy | None, fallback: Any
) -> Callable[..., Any]:
    """The wrapper of a ``def``: one attribute read to admit, no lock to record a healthy
    success (built by :func:`build_wrapper`). When the breaker's configuration turns on an
    outbound stage (:func:`.stages.pipeline.build_pipeline`), the stages run around and
    inside it (:class:`.stages.pipeline.Pipeline`).

    Args:
        breaker: the breaker (its strategy may change later; the object does not).
        func: the protected function.
        policy: the retry policy, or None for no retry stage.
        fallback: called with the call's arguments when the breaker rejects, a stage
            refuses or the call fails, or None.

    Returns:
        A function with *func*'s signature.
    """
    core = core_of(breaker)
    pipeline = build_pipeline(breaker.config, breaker.name)
    if pipeline is None:
        return build_wrapper(core, func, policy, fallback)
    return _staged_def(core, func, policy, fallback, pipeline)


def async_wrapper(
    breaker: CircuitBreaker, func: Callable[..., Awaitable[Any]], policy: RetryPolicy | None, fallback: Any
) -> Callable[..., Awaitable[Any]]:
    """The wrapper of an ``async def``: the same steps as :func:`sync_wrapper`, awaiting
    the call; a shared breaker's slow paths (store I/O) run in a worker thread.

    Returns:
        A coroutine function with *func*'s signature.
    """
    core = core_of(breaker)
    pipeline = build_pipeline(breaker.config, breaker.name)
    if pipeline is None:
        return build_awrapper(core, func, policy, fallback)
    return _staged_async(core, func, policy, fallback, pipeline)


def _staged_def(
    core: BreakerCore, func: Callable[..., Any], policy: RetryPolicy | None, fallback: Any, pipeline: Pipeline
) -> Callable[..., Any]:
    def build(attempt: Callable[..., Any]) -> Callable[..., Any]:
        return build_wrapper(core, attempt, policy, fallback)

    return pipeline.around(core, func, build, fallback, policy=policy)


def _staged_async(
    core: BreakerCore,
    func: Callable[..., Awaitable[Any]],
    policy: RetryPolicy | None,
    fallback: Any,
    pipeline: Pipeline,
) -> Callable[..., Awaitable[Any]]:
    def build(attempt: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
        return build_awrapper(core, attempt, policy, fallback)

    return pipeline.aaround(core, func, build, fallback, retrying=policy is not None)


def run_staged(
    wrapper: Callable[..., Any],
    core: BreakerCore,
    func: Callable[..., Any],
    policy: RetryPolicy | None,
    fallback: Any,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> Any:
    """Run one call of *wrapper* (a breaker's own wrapper of a ``def``, without stages of its
    own) under the current deadline: the deadline stage around a wrapper of the same call."""
    staged = _staged.get(wrapper)
    if staged is None:
        staged = _staged[wrapper] = _staged_def(core, func, policy, fallback, Pipeline(core.name, None))
    return staged(*args, **kwargs)


async def arun_staged(
    wrapper: Callable[..., Any],
    core: BreakerCore,
    func: Callable[..., Awaitable[Any]],
    policy: RetryPolicy | None,
    fallback: Any,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> Any:
    """The async :func:`run_staged` (an attempt still running at the deadline is cancelled)."""
    staged = _staged.get(wrapper)
    if staged is None:
        staged = _staged[wrapper] = _staged_async(core, func, policy, fallback, Pipeline(core.name, None))
    return await staged(*args, **kwargs)

"""The lock-free hot path of a protected call, in one place.

The wrappers that ``protected``, ``circuit_breaker``, ``protect`` and their async forms
return are built here, and only here (and in ``runner.settle_result``'s response lane,
which goes through :func:`healthy_success`) do the package's callers read the breaker's
hot-path attributes. What they read, and why each read is safe without the lock:

* ``breaker._fast_permit``: the CLOSED permit while admission needs no lock and no clock
  (CLOSED, unforced, and for a shared store, before its next consult). Read once per
  call; a trip racing with the read can only hand out a permit whose generation is
  already stale, and a stale outcome is dropped (CB-8).
* ``breaker._timed`` / ``breaker._sync_due``: a shared breaker's hot-path permit expires
  at its next consult (ST-3); a local breaker never reads the clock here.
* ``breaker._healthy_permit``: set while a success would change nothing but the cascade
  count (window full, no failure in it). Every path that records a failure or changes
  state clears it first (``CircuitBreaker._invalidate``), so the lock-free success
  linearises at its single read of this attribute.
* ``breaker._cascade.counter``: the newest cascade bucket counts calls with
  ``next()`` on an ``itertools.count``, one atomic C call; rolling to a new second
  (``bucket_end``) takes the lock in ``record_success``.

Everything else goes through two breaker methods bound when the wrapper is built:
``breaker.acquire_slow`` (admission off the fast lane) and ``breaker.record_success``.
A shared breaker's store I/O never runs on an event loop (a Redis or database outage
would otherwise freeze every coroutine of the worker for the socket timeout): the async
wrapper hands a shared breaker's slow admission and its trials' outcomes to a worker
thread, and a trip decided on the loop's thread is written to the store from the
default executor (``StoreSync.push_trip``).

Implements CB-8, CB-9 (lock-free parts), ST-3 (no round trip on the CLOSED hot path).
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable
from typing import Any, cast

from .breaker import CircuitBreaker, Permit
from .classify import PLAIN_TYPES
from .errors import CircuitOpenError
from .retry import RetryPolicy
from .runner import acall_fallback, call_fallback, run_async, run_sync, settle_exception, settle_result

__all__ = ["sync_wrapper", "async_wrapper", "healthy_success", "off_loop", "aacquire", "asettle"]


def healthy_success(breaker: CircuitBreaker, permit: Permit) -> bool:
    """Count a success on the lock-free healthy lane when it applies (see the module
    docstring); True when counted, False when the caller must ``record_success``."""
    if permit is breaker._healthy_permit:
        cascade = breaker._cascade
        if breaker._mono() < cascade.bucket_end:
            next(cascade.counter)
            return True
    return False


async def off_loop(breaker: CircuitBreaker, fn: Callable[..., Any], *args: Any) -> Any:
    """Run ``fn(*args)`` so that a shared store's I/O never blocks the running event loop:
    in a worker thread for a shared breaker, inline for a process-local one (no I/O)."""
    if breaker._timed:
        return await asyncio.to_thread(fn, *args)
    return fn(*args)


async def aacquire(breaker: CircuitBreaker) -> Permit:
    """:meth:`CircuitBreaker.acquire` for coroutines (the inbound async middleware): the
    lock-free paths run inline; a shared breaker's admission that may reach its store runs in
    a worker thread, so the event loop never waits on store I/O.

    Returns:
        A permit. Raises CircuitOpenError as ``acquire`` does.
    """
    permit = breaker._fast_permit
    if permit is not None and not (breaker._timed and breaker._mono() >= breaker._sync_due):
        return permit
    if breaker._timed:
        now = breaker._mono()
        if not (now < breaker._reject_until and now < breaker._sync_due):  # else a lock-free rejection
            return cast(Permit, await asyncio.to_thread(breaker.acquire_slow))
    return breaker.acquire_slow()


async def asettle(breaker: CircuitBreaker, permit: Permit, fn: Callable[..., Any], *args: Any) -> Any:
    """Record an outcome from a coroutine: a shared breaker's trial outcome is a store write,
    made from a worker thread; everything else inline (no I/O)."""
    if permit.trial:
        return await off_loop(breaker, fn, *args)
    return fn(*args)


def _trial_policy(policy: RetryPolicy | None) -> RetryPolicy:
    # a trial is one attempt (CB-6), still gated by the cooldown (RL-6)
    return cast(RetryPolicy, None if policy is None else dataclasses.replace(policy, max_attempts=1))


def sync_wrapper(
    breaker: CircuitBreaker, func: Callable[..., Any], policy: RetryPolicy | None, fallback: Any
) -> Callable[..., Any]:
    """The wrapper of a ``def``: one attribute read to admit, no lock to record a healthy success.

    Args:
        breaker: the breaker (its strategy may change later; the object does not).
        func: the protected function.
        policy: the retry policy, or None for no retry stage.
        fallback: called with the call's arguments when the breaker rejects or the call
            fails (FAC-4), or None.

    Returns:
        A function with *func*'s signature.
    """
    cascade = breaker._cascade
    monotonic = breaker._mono
    acquire_slow = breaker.acquire_slow
    record_success = breaker.record_success
    trial_policy = _trial_policy(policy)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        permit = breaker._fast_permit
        if permit is None or (breaker._timed and monotonic() >= breaker._sync_due):
            if fallback is None:
                permit = acquire_slow()
            else:
                try:
                    permit = acquire_slow()
                except CircuitOpenError as rejection:
                    return call_fallback(fallback, args, kwargs, rejection)
        if policy is not None and not permit.dry_run:
            return run_sync(breaker, permit, trial_policy if permit.trial else policy, func, args, kwargs, fallback)
        try:
            result = func(*args, **kwargs)
        except BaseException as exc:
            if settle_exception(breaker, permit, exc) and fallback is not None and not permit.dry_run:
                return call_fallback(fallback, args, kwargs, exc)
            raise
        if type(result) in PLAIN_TYPES:
            # healthy_success() inlined: the hottest lines of the package
            if permit is breaker._healthy_permit and monotonic() < cascade.bucket_end:
                next(cascade.counter)
            else:
                record_success(permit)
        else:
            settle_result(breaker, permit, result)
        return result

    return wrapper


def async_wrapper(
    breaker: CircuitBreaker, func: Callable[..., Awaitable[Any]], policy: RetryPolicy | None, fallback: Any
) -> Callable[..., Awaitable[Any]]:
    """The wrapper of an ``async def``: the same steps as :func:`sync_wrapper`, awaiting
    the call; a shared breaker's slow paths (store I/O) run in a worker thread.

    Returns:
        A coroutine function with *func*'s signature.
    """
    cascade = breaker._cascade
    monotonic = breaker._mono
    record_success = breaker.record_success
    trial_policy = _trial_policy(policy)

    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        permit = breaker._fast_permit
        if permit is None or (breaker._timed and monotonic() >= breaker._sync_due):
            if fallback is None:
                permit = await aacquire(breaker)
            else:
                try:
                    permit = await aacquire(breaker)
                except CircuitOpenError as rejection:
                    return await acall_fallback(fallback, args, kwargs, rejection)
        if policy is not None and not permit.dry_run:
            return await run_async(breaker, permit, trial_policy if permit.trial else policy, func, args, kwargs, fallback)
        try:
            result = await func(*args, **kwargs)
        except BaseException as exc:
            if permit.trial:  # a shared round's outcome is a store write
                counted = await off_loop(breaker, settle_exception, breaker, permit, exc)
            else:
                counted = settle_exception(breaker, permit, exc)
            if counted and fallback is not None and not permit.dry_run:
                return await acall_fallback(fallback, args, kwargs, exc)
            raise
        if permit.trial:
            await off_loop(breaker, settle_result, breaker, permit, result)
        elif type(result) in PLAIN_TYPES:
            if permit is breaker._healthy_permit and monotonic() < cascade.bucket_end:
                next(cascade.counter)
            else:
                record_success(permit)
        else:
            settle_result(breaker, permit, result)
        return result

    return wrapper

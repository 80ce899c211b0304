"""The lock-free hot path of a protected call, in one place.

The wrappers that ``protected``, ``circuit_breaker``, ``protect`` and their async forms
return are asked for here, and ``protect``/``aprotect`` themselves live here. The closures
that read the hot-path fields of a breaker's core (:class:`~baldur_django.core.machine.Machine`)
are built by ``wrappers.py``. What the closures read, and why each read is safe without
the lock:

* ``core.fast_permit``: the CLOSED permit while admission needs no lock and no clock
  (CLOSED, unforced, and for a shared store, before its next consult). Read once per
  call; a trip racing with the read can only hand out a permit whose generation is
  already stale, and a stale outcome is dropped.
* ``core.timed`` / ``core.sync_due``: a shared breaker's hot-path permit expires
  at its next consult; a local breaker never reads the clock for admission.
* ``core.reject_until``: while OPEN (or forced open), the monotonic deadline before
  which the breaker rejects without its lock, else 0.0; every transition clears it first
  (``Machine.invalidate``). The wrappers raise that rejection themselves, as
  ``acquire_slow`` would (same test, same error, built in C by ``new_open_error``), and
  go to ``acquire_slow`` whenever a listener wants the rejection event. They count it
  with ``next()`` on ``core.blocked_open`` (an ``itertools.count``, atomic).
* ``core.healthy_permit``: set while a success would change nothing but the cascade
  count (window full, no failure in it). Every path that records a failure or changes
  state clears it first (``Machine.invalidate``), so the lock-free success
  linearises at its single read of this attribute.
* ``core.cascade.counter``: the newest cascade bucket counts calls with
  ``next()`` on an ``itertools.count``, one atomic C call; rolling to a new second
  (``bucket_end``, read against the monotonic clock) takes the lock in ``record_success``.
* ``core.plain_types``: the set of returned types recorded as successes without being
  judged, bound once per wrapper (a closure read, like the global it replaced). Its
  contents follow the configuration (empty while a ``result_predicate`` is set);
  a reader racing with a refill sees the old types, the new ones or none, and a value
  that misses the set only takes the response lane, which judges it properly.
* ``core.cooldown_until``: 0.0 until this process ever saw a 429 cooldown. With a
  retry policy, no cooldown, no budget and no trial, the retry plan would make the first
  attempt at once: the wrappers make it themselves and hand over to the engine
  (``runner.continue_sync``/``continue_async``) only when it did not succeed. A cooldown
  set while that attempt runs is read by the next call, as ``run_sync`` reads it.

Everything else goes through breaker methods bound when the wrapper is built:
``core.acquire_slow`` (admission off the fast lane), ``core.record_success`` and
the bus's ``wants_rejections``. A shared breaker's store I/O never runs on an event loop
(a Redis or database outage would otherwise freeze every coroutine of the worker for the
socket timeout): the async wrapper hands a shared breaker's slow admission and its
trials' outcomes to a worker thread, and a trip decided on the loop's thread is written
to the store from the default executor (``StoreSync.push_trip``).

* ``core.quiet_permit``: the CLOSED permit while ``fast_permit`` and
  ``healthy_permit`` both hold it, else None; the wrappers admit with it (one read, as
  before). A call admitted with it runs unmarked; every other call is admitted in the
  slow branch and runs under a Nest of its own (:mod:`.nesting`), so that calls nested
  in it through the same breaker record nothing.
* ``core.seq``: the number of outcomes counted off the healthy lane, read when a call
  begins (its mark on the healthy lane). No context variable is set on that lane.

A slow branch of the wrappers (``if permit is None or ...``) is where anything that must
see every call goes: ``protect``/``aprotect`` run their call inline only when a wrapper
would skip that branch for a process-local breaker (``quiet_permit`` set, not
``timed``), and send every other call through the full wrapper.
"""

from __future__ import annotations

import inspect
import sys
import types
from collections.abc import Awaitable, Callable
from typing import Any

from .calls import BreakerCore
from .errors import ConfigError
from .nesting import register
from .permit import Permit
from .retry import RetryPolicy
from .routes import NO_ROUTE, Route, aprotect_route, aroutes, knob_aroutes, knob_routes, protect_route, routes
from .states import Reason
from .wrappers import (
    NOT_PLAIN,
    REFUSED,
    SLOW,
    async_wrapper,
    discard,
    sync_wrapper,
)

__all__ = [
    "sync_wrapper",
    "async_wrapper",
    "protect",
    "aprotect",
    "Route",
    "routes",
    "knob_routes",
    "aroutes",
    "knob_aroutes",
    "aacquire",
    "asettle",
]

OPEN = Reason.OPEN


async def aacquire(core: BreakerCore) -> Permit:
    """:meth:`BreakerCore.acquire` for coroutines (the inbound async middleware).

    Returns:
        A permit. Raises CircuitOpenError as ``acquire`` does.
    """
    return await core.aacquire()


async def asettle(core: BreakerCore, permit: Permit, fn: Callable[..., Any], *args: Any) -> Any:
    """Record an outcome from a coroutine: a shared breaker's trial outcome is a store write,
    made from a worker thread; everything else inline (no I/O)."""
    if permit.trial:
        return await core.off_loop(fn, *args)
    return fn(*args)


# ------------------------------------------------------------- protect() / aprotect()
# A view calls protect(name, fn) on every request. Deciding everything again per call (the
# async and generator checks through inspect, the registry validating the overrides, a
# new wrapper) cost ten times the protected call itself. The first call with given
# arguments goes the full way (routes.protect_route) and leaves a Route: the
# breaker, the arguments it checked, and wrappers built once over trampolines that take
# the call as an argument. A later call that matches it (checked below, each test
# commented) has nothing left to decide. On the plain CLOSED path it then makes the call
# itself, as the decorator's wrapper would: the same reads, in the same order, and the
# same settle functions; every other case goes through the route's full wrapper.
# (Thread safety of the routes: see core/routes.py.)

_FUNCTION = types.FunctionType
# aprotect() takes coroutine functions as factories: it refuses generators only.
_GENERATORS = inspect.CO_GENERATOR | inspect.CO_ASYNC_GENERATOR | inspect.CO_ITERABLE_COROUTINE
# From Python 3.12, inspect.markcoroutinefunction() makes a plain def a coroutine function.
_MARKS = sys.version_info >= (3, 12)
_COROUTINE = types.CoroutineType
_GENERATOR = types.GeneratorType


def protect(
    service: str,
    call: Callable[[], Any],
    *,
    retry: bool | RetryPolicy = False,
    fallback: Callable[[], Any] | None = None,
    **overrides: Any,
) -> Any:
    """Run ``call()`` once under the breaker for *service*, with optional retry and fallback.

    A call with the same *service*, *retry* object and overrides as an earlier one reuses what
    it checked and built (keep a :class:`RetryPolicy` in a constant, not one per call).

    Args:
        service: breaker name.
        call: a zero-argument callable (a lambda around the real call).
        retry: as for :func:`protected`.
        fallback: as for :func:`protected`, but it takes no arguments.
        **overrides: breaker overrides, as for :func:`protected`.

    Returns:
        What ``call()`` (or the fallback) returned.

    Raises:
        ConfigError: bad option; a coroutine function as *call* or *fallback*; ``call()``
            or the fallback returned an awaitable (``lambda: fetch()`` of an ``async def``:
            use :func:`aprotect`). Nothing is recorded for such a misuse.
        CircuitOpenError: the breaker rejects and no fallback applies (likewise
            RateLimitCooldownError, and the call's own exception).
    """
    try:  # a subscript, cheaper than .get(); a miss, or a name that is not even hashable,
        route = (knob_routes if overrides else routes)[service]  # goes the full way (it says why)
    except (KeyError, TypeError):
        route = NO_ROUTE  # its retry is no caller's: the checks below fail at once
    if (
        retry is route.retry  # the very object that was checked: nothing to re-check
        and type(call) is _FUNCTION  # a def or lambda: callable; its code flags are read below
        and (
            not overrides  # (a route of the table without overrides has none)
            # one override, the very value object that was checked (a call site's constant)
            or (len(overrides) == 1 and overrides.get(route.key, route) is route.value)
            or _same_overrides(overrides, route)
        )
        and not (_MARKS and hasattr(call, "_is_coroutine_marker"))
    ):
        if fallback is not None:
            return _with_fallback(route, service, call, retry, fallback, overrides)
        # sync_wrapper's CLOSED path without a retry stage or fallback, run by the breaker's
        # closure (a route with a retry stage answers SLOW). A coroutine or generator function
        # (refused: the full way raises the ConfigError) is caught after the call, off the
        # plain path: calling one runs none of its body, it only makes the coroutine or
        # generator (closed unused) or fails to bind its arguments. Nothing is recorded for
        # it, so it is as if it had been refused before the call.
        result = route.fast(call)
        if result is not SLOW:
            if result is not REFUSED:
                return result
        elif not call.__code__.co_flags & NOT_PLAIN:
            return route.run(call)  # anything but the plain CLOSED path: the full wrapper
    return _through_new_route(service, call, retry, fallback, overrides)


def _through_new_route(
    service: str, call: Callable[[], Any], retry: Any, fallback: Any, overrides: dict[str, Any]
) -> Any:
    """:func:`protect` when no stored route matched: every check, then the call through the
    route they settled. It takes the plain path when it can, as a matched call does, so a
    healthy service's route never builds its full wrapper."""
    route = protect_route(service, call, retry, fallback, overrides)
    if fallback is not None:
        return route.run_fallback(call, fallback)
    if type(call) is _FUNCTION:
        result = route.fast(call)  # never REFUSED: protect_route refused such calls
        if result is not SLOW:
            return result
    return route.run(call)


def _same_overrides(overrides: dict[str, Any], route: Route) -> bool:
    """True when *overrides* validate exactly as the route's did: the same names with equal
    values of the very same types (so ``True`` never passes for ``1``, nor a ``Decimal``
    for a float)."""
    return overrides == route.overrides and [*map(type, overrides.values())] == route.kinds


def _with_fallback(
    route: Route, service: str, call: Callable[[], Any], retry: Any, fallback: Any, overrides: dict[str, Any]
) -> Any:
    """:func:`protect` with a *fallback*, once its route matched: the route's full wrapper,
    unless the call or the fallback is a coroutine or generator function (the full way
    refuses it)."""
    if (
        callable(fallback)
        and not call.__code__.co_flags & NOT_PLAIN
        and not (type(fallback) is _FUNCTION and fallback.__code__.co_flags & NOT_PLAIN)
    ):
        return route.run_fallback(call, fallback)
    return protect_route(service, call, retry, fallback, overrides).run_fallback(call, fallback)


async def aprotect(
    service: str,
    factory: Callable[[], Awaitable[Any]],
    *,
    retry: bool | RetryPolicy = False,
    fallback: Callable[[], Any] | None = None,
    **overrides: Any,
) -> Any:
    """Await ``factory()`` under the breaker for *service*; *factory* makes a fresh awaitable
    per attempt (so retries work). A coroutine-function fallback is awaited. Calls with the
    same arguments reuse what the first one checked and built, as for :func:`protect`.

    Raises:
        ConfigError: *factory* is not callable; otherwise as :func:`protect`.
    """
    try:  # as in protect()
        route = (knob_aroutes if overrides else aroutes)[service]
    except (KeyError, TypeError):
        route = NO_ROUTE
    if (
        retry is route.retry  # the checks of protect(); generators are caught as there
        and type(factory) is _FUNCTION
        and (
            not overrides
            or (len(overrides) == 1 and overrides.get(route.key, route) is route.value)
            or _same_overrides(overrides, route)
        )
    ):
        if fallback is not None:
            return await _awith_fallback(route, service, factory, retry, fallback, overrides)
        else:
            afast = route.afast
            admitted = afast[0]()  # None off the plain path (and for a route with a retry stage)
            if admitted is None:
                if not factory.__code__.co_flags & _GENERATORS:
                    return await route.run(factory)
            else:
                # async_wrapper's CLOSED path (never a trial here) with acall_wrapper's
                # attempt, inlined around the breaker's closures. A generator function
                # (refused, as in protect()) makes a generator, not a coroutine: it is caught
                # there, before anything of it ran, and the full way below raises the
                # ConfigError.
                permit, mark = admitted
                try:
                    value = factory()
                    refused = value.__class__ is not _COROUTINE and _refused(service, factory, value)
                    if not refused:
                        result = await value
                except BaseException as exc:
                    if not factory.__code__.co_flags & _GENERATORS:
                        afast[2](permit, mark, exc)
                        raise
                else:
                    if not refused:
                        afast[1](permit, mark, result)
                        return result
                    discard(value)
    route = aprotect_route(service, factory, retry, fallback, overrides)
    return await (route.run(factory) if fallback is None else route.run_fallback(factory, fallback))


async def _awith_fallback(
    route: Route, service: str, factory: Callable[[], Any], retry: Any, fallback: Any, overrides: dict[str, Any]
) -> Any:
    """:func:`aprotect` with a *fallback*, once its route matched: the route's full wrapper,
    unless the factory is a generator function or the fallback not callable (the full way
    refuses them)."""
    if callable(fallback) and not factory.__code__.co_flags & _GENERATORS:
        return await route.run_fallback(factory, fallback)
    return await aprotect_route(service, factory, retry, fallback, overrides).run_fallback(factory, fallback)


def _refused(service: str, factory: Callable[[], Any], value: Any) -> bool:
    """For what *factory* returned when it is not a coroutine: True when *factory* is a
    generator function (refused: the full way raises its ConfigError), False for an awaitable.

    Raises:
        ConfigError: *value* is not awaitable (a misuse: nothing is recorded).
    """
    if factory.__code__.co_flags & _GENERATORS:
        return True
    if not inspect.isawaitable(value):
        raise ConfigError(f"aprotect({service!r}) needs a factory of awaitables; it returned {type(value).__name__}")
    return False


def _route_breaker(local: dict[str, Any]) -> Any:
    """The breaker of an :func:`aprotect` frame (its route's), for core/nesting.py."""
    return getattr(local.get("route"), "core", None)


# aprotect() awaits the call itself on the plain CLOSED path: its frame runs the call there
register(aprotect.__code__, _route_breaker)

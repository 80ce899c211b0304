"""The lock-free hot path of a protected call, in one place.

The wrappers that ``protected``, ``circuit_breaker``, ``protect`` and their async forms
return are asked for here, and ``protect``/``aprotect`` themselves live here. The closures
that read the breaker's hot-path attributes are built by the breaker's own module
(``CircuitBreaker.build_wrapper``, ``build_awrapper``, ``build_inline``,
``build_ainline``), so those attributes stay private to it; this module hands them the
runner's and retry engine's functions as one :data:`ENGINE` (no import circle). What the
closures read, and why each read is safe without the lock:

* ``breaker._fast_permit``: the CLOSED permit while admission needs no lock and no clock
  (CLOSED, unforced, and for a shared store, before its next consult). Read once per
  call; a trip racing with the read can only hand out a permit whose generation is
  already stale, and a stale outcome is dropped.
* ``breaker._timed`` / ``breaker._sync_due``: a shared breaker's hot-path permit expires
  at its next consult; a local breaker never reads the clock for admission.
* ``breaker._reject_until``: while OPEN (or forced open), the monotonic deadline before
  which the breaker rejects without its lock, else 0.0; every transition clears it first
  (``CircuitBreaker._invalidate``). The wrappers raise that rejection themselves, as
  ``acquire_slow`` would (same test, same error, built in C by ``new_open_error``), and
  go to ``acquire_slow`` whenever a listener wants the rejection event. They count it
  with ``next()`` on ``breaker._blocked_open`` (an ``itertools.count``, atomic).
* ``breaker._healthy_permit``: set while a success would change nothing but the cascade
  count (window full, no failure in it). Every path that records a failure or changes
  state clears it first (``CircuitBreaker._invalidate``), so the lock-free success
  linearises at its single read of this attribute.
* ``breaker._cascade.counter``: the newest cascade bucket counts calls with
  ``next()`` on an ``itertools.count``, one atomic C call; rolling to a new second
  (``bucket_end``, read against the monotonic clock) takes the lock in ``record_success``.
* ``breaker.plain_types``: the set of returned types recorded as successes without being
  judged, bound once per wrapper (a closure read, like the global it replaced). Its
  contents follow the configuration (empty while a ``result_predicate`` is set);
  a reader racing with a refill sees the old types, the new ones or none, and a value
  that misses the set only takes the response lane, which judges it properly.
* ``breaker._cooldown_until``: 0.0 until this process ever saw a 429 cooldown. With a
  retry policy, no cooldown, no budget and no trial, the retry plan would make the first
  attempt at once: the wrappers make it themselves and hand over to the engine
  (``runner.continue_sync``/``continue_async``) only when it did not succeed. A cooldown
  set while that attempt runs is read by the next call, as ``run_sync`` reads it.

Everything else goes through breaker methods bound when the wrapper is built:
``breaker.acquire_slow`` (admission off the fast lane), ``breaker.record_success`` and
the bus's ``wants_rejections``. A shared breaker's store I/O never runs on an event loop
(a Redis or database outage would otherwise freeze every coroutine of the worker for the
socket timeout): the async wrapper hands a shared breaker's slow admission and its
trials' outcomes to a worker thread, and a trip decided on the loop's thread is written
to the store from the default executor (``StoreSync.push_trip``).

* ``breaker._quiet_permit``: the CLOSED permit while ``_fast_permit`` and
  ``_healthy_permit`` both hold it, else None; the wrappers admit with it (one read, as
  before). A call admitted with it runs unmarked; every other call is admitted in the
  slow branch and runs under a Nest of its own (:mod:`.nesting`), so that calls nested
  in it through the same breaker record nothing.
* ``breaker._seq``: the number of outcomes counted off the healthy lane, read when a call
  begins (its mark on the healthy lane). No context variable is set on that lane.

A slow branch of the wrappers (``if permit is None or ...``) is where anything that must
see every call goes: ``protect``/``aprotect`` run their call inline only when a wrapper
would skip that branch for a process-local breaker (``_quiet_permit`` set, not
``_timed``), and send every other call through the full wrapper.
"""

from __future__ import annotations

import dataclasses
import inspect
import sys
import types
from collections.abc import Awaitable, Callable
from typing import Any, cast

from .breaker import CircuitBreaker, Engine, Permit, enter_trial, leave_trial, recorded_since
from .errors import ConfigError, awaitable_refused, is_awaitable
from .nesting import amarked, marked, nest_mark, register
from .registry import registry
from .retry import Raised, RetryPolicy, Returned, exception_outcome, settled
from .runner import (
    acall_fallback,
    asettle_raised,
    call_fallback,
    continue_async,
    continue_sync,
    run_async,
    run_sync,
    settle_exception,
    settle_raised,
    settle_result,
    settle_returned,
    settled_elsewhere,
)
from .states import Reason

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
    "call_wrappers",
    "acall_wrappers",
    "healthy_success",
    "off_loop",
    "aacquire",
    "asettle",
]

OPEN = Reason.OPEN


def healthy_success(breaker: CircuitBreaker, permit: Permit) -> bool:
    """Count a success on the lock-free healthy lane when it applies; True when counted,
    False when the caller must ``record_success`` (:meth:`CircuitBreaker.healthy_success`)."""
    return breaker.healthy_success(permit)


async def off_loop(breaker: CircuitBreaker, fn: Callable[..., Any], *args: Any) -> Any:
    """Run ``fn(*args)`` so that a shared store's I/O never blocks the running event loop:
    in a worker thread for a shared breaker, inline for a process-local one (no I/O)."""
    return await breaker.off_loop(fn, *args)


async def aacquire(breaker: CircuitBreaker) -> Permit:
    """:meth:`CircuitBreaker.acquire` for coroutines (the inbound async middleware); see
    :meth:`CircuitBreaker.aacquire`.

    Returns:
        A permit. Raises CircuitOpenError as ``acquire`` does.
    """
    return await breaker.aacquire()


async def asettle(breaker: CircuitBreaker, permit: Permit, fn: Callable[..., Any], *args: Any) -> Any:
    """Record an outcome from a coroutine: a shared breaker's trial outcome is a store write,
    made from a worker thread; everything else inline (no I/O)."""
    if permit.trial:
        return await off_loop(breaker, fn, *args)
    return fn(*args)


def _trial(
    breaker: CircuitBreaker, permit: Permit, wrapper: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """Run a HALF_OPEN trial: the wrapper is entered again with the trial marked as running
    in this thread, so it and every call nested in it through the same breaker use this
    one permit. A trial that recorded nothing (its outcome was dropped on the
    healthy lane after a state change) gives its slot back."""
    mark = breaker.record_mark()
    token = enter_trial(breaker, permit)
    try:
        return wrapper(*args, **kwargs)
    finally:
        leave_trial(token)
        if not recorded_since(breaker, mark):
            breaker.give_back(permit)  # its outcome, if any, was counted where it landed


async def _atrial(
    breaker: CircuitBreaker,
    permit: Permit,
    wrapper: Callable[..., Awaitable[Any]],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> Any:
    """The async :func:`_trial` (the mark lives in this task's context)."""
    mark = breaker.record_mark()
    token = enter_trial(breaker, permit)
    try:
        return await wrapper(*args, **kwargs)
    finally:
        leave_trial(token)
        if not recorded_since(breaker, mark):
            await off_loop(breaker, breaker.give_back, permit)


def _trial_policy(policy: RetryPolicy | None) -> RetryPolicy:
    # a trial is one attempt, still gated by the cooldown
    return cast(RetryPolicy, None if policy is None else dataclasses.replace(policy, max_attempts=1))


def sync_wrapper(
    breaker: CircuitBreaker, func: Callable[..., Any], policy: RetryPolicy | None, fallback: Any
) -> Callable[..., Any]:
    """The wrapper of a ``def``: one attribute read to admit, no lock to record a healthy
    success (built by :meth:`CircuitBreaker.build_wrapper` over :data:`ENGINE`).

    Args:
        breaker: the breaker (its strategy may change later; the object does not).
        func: the protected function.
        policy: the retry policy, or None for no retry stage.
        fallback: called with the call's arguments when the breaker rejects or the call
            fails, or None.

    Returns:
        A function with *func*'s signature.
    """
    return breaker.build_wrapper(func, policy, _trial_policy(policy), fallback, ENGINE)


def async_wrapper(
    breaker: CircuitBreaker, func: Callable[..., Awaitable[Any]], policy: RetryPolicy | None, fallback: Any
) -> Callable[..., Awaitable[Any]]:
    """The wrapper of an ``async def``: the same steps as :func:`sync_wrapper`, awaiting
    the call; a shared breaker's slow paths (store I/O) run in a worker thread.

    Returns:
        A coroutine function with *func*'s signature.
    """
    return breaker.build_awrapper(func, policy, _trial_policy(policy), fallback, ENGINE)


# ------------------------------------------------------------- protect() / aprotect()
# A view calls protect(name, fn) on every request. Deciding everything again per call (the
# async and generator checks through inspect, the registry validating the overrides, a
# new wrapper) cost ten times the protected call itself. The first call with given
# arguments goes the full way (decorators.protect_route) and leaves a Route: the
# breaker, the arguments it checked, and wrappers built once over trampolines that take
# the call as an argument. A later call that matches it (checked below, each test
# commented) has nothing left to decide. On the plain CLOSED path it then makes the call
# itself, as the decorator's wrapper would: the same reads, in the same order, and the
# same settle functions; every other case goes through the route's full wrapper.
#
# Thread safety: a Route is built whole, then stored with one dict assignment (atomic
# under the GIL), and never changed. Two threads missing at once each build one over the
# registry's breaker (one per name, created under the registry's lock); the last store
# wins, which is harmless. registry.clear() (tests) empties the route tables with the
# breakers, and a route stored by a call that raced with it is taken back
# (decorators._stored_route), so no call after the clear uses a dropped breaker.

_FUNCTION = types.FunctionType
# A def or lambda whose code has none of these flags is neither a coroutine function nor
# a generator function of any kind: exactly what inspect finds out for protect().
_NOT_PLAIN = inspect.CO_COROUTINE | inspect.CO_GENERATOR | inspect.CO_ASYNC_GENERATOR | inspect.CO_ITERABLE_COROUTINE
# aprotect() takes coroutine functions as factories: it refuses generators only.
_GENERATORS = inspect.CO_GENERATOR | inspect.CO_ASYNC_GENERATOR | inspect.CO_ITERABLE_COROUTINE
# From Python 3.12, inspect.markcoroutinefunction() makes a plain def a coroutine function.
_MARKS = sys.version_info >= (3, 12)
_COROUTINE = types.CoroutineType
_GENERATOR = types.GeneratorType


def _fallback_second(call: Callable[[], Any], fallback: Callable[[], Any]) -> Any:
    return fallback()


_SLOW = object()  # a route's plain path did not apply: run the full wrapper
_REFUSED = object()  # the call was a coroutine or generator function: go the full way

#: ``(protect_route, aprotect_route)``, installed by :mod:`.decorators` when it is imported
#: (it imports this module; this one never imports it back: no import circle).
_builders: list[Callable[..., Route]] = []


def install_route_builders(protect_route: Callable[..., Route], aprotect_route: Callable[..., Route]) -> None:
    """Give :func:`protect`/:func:`aprotect` the functions that build a route on a miss."""
    _builders[:] = [protect_route, aprotect_route]


def _discard(value: Any) -> None:
    """Close a coroutine or generator that a refused function returned, before any of its
    body ran: no "never awaited" warning, nothing else happened."""
    close = getattr(value, "close", None)
    if close is not None:
        close()


class Route:
    """What one full ``protect``/``aprotect`` call settled for its service, reused by the
    calls that match it (see the comment above). Never changed once stored.

    Attributes:
        breaker: the registry's breaker for the service.
        retry: the ``retry`` argument object that was checked (compared with ``is``).
        policy: the :class:`RetryPolicy` it stands for, or None.
        overrides: the overrides that were checked, and ``kinds`` their types: a later
            call matches with equal values of the very same types (so ``True`` never
            passes for ``1``); ``key``/``value`` the one override and its value object,
            when there is exactly one.
        run: ``run(call)``: the full wrapper, no fallback.
        run_fallback: ``run_fallback(call, fallback)``: the full wrapper with *fallback*.
        inline: True when the plain CLOSED path may run inline (no retry stage).
        fast, afast: that path for ``protect``/``aprotect`` (:meth:`CircuitBreaker.build_inline`),
            or None.
    """

    __slots__ = (
        "breaker",
        "retry",
        "policy",
        "overrides",
        "kinds",
        "key",
        "value",
        "run",
        "run_fallback",
        "inline",
        "fast",
        "afast",
    )

    def __init__(
        self,
        breaker: CircuitBreaker,
        retry: Any,
        policy: RetryPolicy | None,
        overrides: dict[str, Any],
        wrappers: tuple[Callable[..., Any], Callable[..., Any]],
    ) -> None:
        self.breaker = breaker
        self.retry = retry
        self.policy = policy
        self.overrides = dict(overrides)
        self.kinds = [*map(type, overrides.values())]  # a list: compared with a list per call
        self.key: Any = None  # str, or None (then no call matches through key/value)
        self.value: Any = None
        if len(overrides) == 1:
            ((self.key, self.value),) = overrides.items()
        self.run, self.run_fallback = wrappers
        self.inline = policy is None
        # the plain CLOSED path, built by the breaker (it reads the hot-path fields): only
        # without a retry stage; a route serves protect() or aprotect(), so both are built
        self.fast = breaker.build_inline(ENGINE) if self.inline else None
        self.afast = breaker.build_ainline(ENGINE) if self.inline else None


#: service -> the :class:`Route` of ``protect`` calls without overrides / with overrides,
#: and the same for ``aprotect`` (written by ``decorators._stored_route``).
routes: dict[str, Route] = {}
knob_routes: dict[str, Route] = {}
aroutes: dict[str, Route] = {}
knob_aroutes: dict[str, Route] = {}
registry.name_caches.extend((routes, knob_routes, aroutes, knob_aroutes))


def _same_overrides(overrides: dict[str, Any], route: Route) -> bool:
    """True when *overrides* validate exactly as the route's did: the same names with equal
    values of the very same types (so ``True`` never passes for ``1``, nor a ``Decimal``
    for a float)."""
    return overrides == route.overrides and [*map(type, overrides.values())] == route.kinds


def call_wrappers(breaker: CircuitBreaker, policy: RetryPolicy | None) -> tuple[Callable[..., Any], Callable[..., Any]]:
    """The full wrappers of a ``protect()`` route, built once per breaker and policy.

    Returns:
        ``(run, run_fallback)``: ``run(call)`` does what ``sync_wrapper(breaker, call,
        policy, None)()`` does; ``run_fallback(call, fallback)`` the same with *fallback*
        (called without arguments) as the fallback.
    """
    what = f"protect({breaker.name!r})'s call"

    def attempt(call: Callable[[], Any], fallback: Any = None) -> Any:
        # a callable that hands back an awaitable (``lambda: fetch()`` of an async def) is
        # refused: the breaker would judge the call before it ran (nothing is recorded)
        value = call()
        kind = value.__class__
        if (kind is _COROUTINE or hasattr(kind, "__await__") or kind is _GENERATOR) and is_awaitable(value):
            raise awaitable_refused(what, value)
        return value

    return sync_wrapper(breaker, attempt, policy, None), sync_wrapper(breaker, attempt, policy, _fallback_second)


def acall_wrappers(
    breaker: CircuitBreaker, policy: RetryPolicy | None, service: str
) -> tuple[Callable[..., Awaitable[Any]], Callable[..., Awaitable[Any]]]:
    """The full wrappers of an ``aprotect()`` route: as :func:`call_wrappers`, over
    :func:`async_wrapper`; each attempt awaits ``factory()``.

    Raises (when awaited):
        ConfigError: the factory returned something that is not awaitable (a misuse:
            nothing is recorded, and a trial gives its slot back).
    """

    async def attempt(factory: Callable[[], Any], fallback: Any = None) -> Any:
        value = factory()
        if value.__class__ is not _COROUTINE and not inspect.isawaitable(value):
            raise ConfigError(
                f"aprotect({service!r}) needs a factory of awaitables; it returned {type(value).__name__}"
            )
        return await value

    return async_wrapper(breaker, attempt, policy, None), async_wrapper(breaker, attempt, policy, _fallback_second)


def protect(
    service: str,
    call: Callable[[], Any],
    *,
    retry: bool | RetryPolicy = False,
    fallback: Callable[[], Any] | None = None,
    **overrides: Any,
) -> Any:
    """Run ``call()`` once under the breaker for *service*, with optional retry and fallback.

    A call with the same *service*, *retry* object and overrides as an earlier one reuses
    what that one checked and built, so this costs little more than a decorated call;
    keep a :class:`RetryPolicy` in a constant rather than building one per call.

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
        route = None
    if (
        route is not None
        and retry is route.retry  # the very object that was checked: nothing to re-check
        and type(call) is _FUNCTION  # a def or lambda: callable; its code flags are read below
        and (
            not overrides  # (a route of the table without overrides has none)
            # one override, the very value object that was checked (a call site's constant)
            or (len(overrides) == 1 and overrides.get(route.key, route) is route.value)
            # _same_overrides, inlined (no Python call per check)
            or (overrides == route.overrides and [*map(type, overrides.values())] == route.kinds)
        )
        and not (_MARKS and hasattr(call, "_is_coroutine_marker"))
    ):
        if fallback is None:
            fast = route.fast
            # sync_wrapper's CLOSED path without a retry stage or fallback, run by the
            # breaker's closure. A coroutine or generator function (refused: the full way
            # below raises the ConfigError) is caught after the call, off the plain path:
            # calling one runs none of its body, it only makes the coroutine or generator
            # (closed unused) or fails to bind its arguments. Nothing is recorded for it, so
            # it is as if it had been refused before the call.
            result = _SLOW if fast is None else fast(call)
            if result is not _SLOW:
                if result is not _REFUSED:
                    return result
            elif not call.__code__.co_flags & _NOT_PLAIN:
                return route.run(call)  # anything but the plain CLOSED path: the full wrapper
        elif (
            callable(fallback)
            and not call.__code__.co_flags & _NOT_PLAIN
            # a coroutine-function fallback goes the full way, which refuses it
            and not (type(fallback) is _FUNCTION and fallback.__code__.co_flags & _NOT_PLAIN)
        ):
            return route.run_fallback(call, fallback)
    route = _builders[0](service, call, retry, fallback, overrides)  # decorators.protect_route
    return route.run(call) if fallback is None else route.run_fallback(call, fallback)


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
        route = None
    if (
        route is not None
        and retry is route.retry  # the checks of protect(); generators are caught as there
        and type(factory) is _FUNCTION
        and (
            not overrides
            or (len(overrides) == 1 and overrides.get(route.key, route) is route.value)
            # _same_overrides, inlined (no Python call per check)
            or (overrides == route.overrides and [*map(type, overrides.values())] == route.kinds)
        )
    ):
        if fallback is None:
            afast = route.afast
            admitted = None if afast is None else afast[0]()
            if afast is not None and admitted is not None:
                # async_wrapper's CLOSED path (never a trial here) with acall_wrappers'
                # attempt, inlined around the breaker's closures. A generator function
                # (refused, as in protect()) makes a generator, not a coroutine: it is caught
                # there, before anything of it ran, and the full way below raises the
                # ConfigError.
                permit, mark = admitted
                refused = None
                try:
                    value = factory()
                    if value.__class__ is not _COROUTINE and factory.__code__.co_flags & _GENERATORS:
                        refused = value
                    else:
                        if value.__class__ is not _COROUTINE and not inspect.isawaitable(value):
                            raise ConfigError(
                                f"aprotect({service!r}) needs a factory of awaitables; it returned {type(value).__name__}"
                            )
                        result = await value
                except BaseException as exc:
                    if not factory.__code__.co_flags & _GENERATORS:
                        afast[2](permit, mark, exc)
                        raise
                else:
                    if refused is None:
                        afast[1](permit, mark, result)
                        return result
                    _discard(refused)
            elif not factory.__code__.co_flags & _GENERATORS:
                return await route.run(factory)
        elif callable(fallback) and not factory.__code__.co_flags & _GENERATORS:
            return await route.run_fallback(factory, fallback)
    route = _builders[1](service, factory, retry, fallback, overrides)  # decorators.aprotect_route
    return await (route.run(factory) if fallback is None else route.run_fallback(factory, fallback))


def _route_breaker(local: dict[str, Any]) -> Any:
    """The breaker of an :func:`aprotect` frame (its route's), for core/nesting.py."""
    return getattr(local.get("route"), "breaker", None)


# aprotect() awaits the call itself on the plain CLOSED path: its frame runs the call there
register(aprotect.__code__, _route_breaker)


#: What the wrappers a breaker builds call (:class:`~baldur_django.core.breaker.Engine`).
ENGINE = Engine(
    run_sync=run_sync,
    continue_sync=continue_sync,
    run_async=run_async,
    continue_async=continue_async,
    settle_exception=settle_exception,
    settle_result=settle_result,
    settle_raised=settle_raised,
    asettle_raised=asettle_raised,
    settle_returned=settle_returned,
    settled_elsewhere=settled_elsewhere,
    nest_mark=nest_mark,
    marked=marked,
    amarked=amarked,
    settled=settled,
    call_fallback=call_fallback,
    acall_fallback=acall_fallback,
    exception_outcome=exception_outcome,
    trial=_trial,
    atrial=_atrial,
    raised=Raised,
    returned=Returned,
    discard=_discard,
    slow=_SLOW,
    refused=_REFUSED,
    not_plain=_NOT_PLAIN,
)

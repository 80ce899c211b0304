"""The public facade: ``protected``, ``aprotected``, ``protect``, ``aprotect``, ``circuit_breaker``.

``protected`` and ``circuit_breaker`` look at what they decorate and return a real
``def`` or ``async def`` wrapper (``functools.wraps`` metadata kept, so
``inspect.iscoroutinefunction`` holds for async). Generators are refused: wrap the
call that produces the data instead. Implements FAC-1..FAC-4, CB-6, CB-10, CB-11.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any, TypeVar

from . import hotpath
from .breaker import CircuitBreaker
from .config import OVERRIDE_NAMES
from .errors import ConfigError
from .hotpath import (
    Route,
    acall_wrappers,
    aprotect,
    async_wrapper,
    call_wrappers,
    install_route_builders,
    protect,
    sync_wrapper,
)
from .registry import registry
from .retry import RetryPolicy, coerce_retry

__all__ = ["protected", "aprotected", "protect", "aprotect", "circuit_breaker"]

F = TypeVar("F", bound=Callable[..., Any])

_OVERRIDE_NAMES = OVERRIDE_NAMES  # derived from the rows of the knobs table


def _breaker(service: str, overrides: dict[str, Any]) -> CircuitBreaker:
    unknown = set(overrides) - set(_OVERRIDE_NAMES)
    if unknown:
        raise ConfigError(
            f"breaker {service!r}: unknown argument(s) {sorted(unknown)}; known: {', '.join(_OVERRIDE_NAMES)}"
        )
    given = {k: v for k, v in overrides.items() if v is not None}
    # no overrides: use (or create) the breaker without claiming a configuration
    return registry.get(service, given or None)  # type: ignore[return-value]  # create=True: never None


def _check_fallback(service: str, fallback: Any) -> None:
    if fallback is not None and not callable(fallback):
        raise ConfigError(f"breaker {service!r}: fallback={fallback!r} is not callable")


def _refuse_generators(func: Callable[..., Any]) -> None:
    if not callable(func):
        raise ConfigError(f"{func!r} is not callable")
    if inspect.isgeneratorfunction(func) or inspect.isasyncgenfunction(func):
        name = getattr(func, "__qualname__", repr(func))
        raise ConfigError(
            f"cannot protect generator function {name!r}: its body runs after the call returns; "
            "protect the call that produces the data instead"
        )


def _is_async(func: Callable[..., Any]) -> bool:
    while isinstance(func, functools.partial):
        func = func.func
    if inspect.iscoroutinefunction(func):
        return True
    call = getattr(func, "__call__", None)  # noqa: B004 - async callable objects
    return call is not None and not inspect.isfunction(func) and inspect.iscoroutinefunction(call)


def _decorate(
    service: str, func: F, policy: RetryPolicy | None, fallback: Any, overrides: dict[str, Any], force_async: bool
) -> F:
    _refuse_generators(func)
    breaker = _breaker(service, overrides)
    if force_async or _is_async(func):
        if force_async and not _is_async(func):
            name = getattr(func, "__qualname__", repr(func))
            raise ConfigError(f"aprotected({service!r}) needs an async def; {name!r} is not one")
        wrapper = async_wrapper(breaker, func, policy, fallback)
    else:
        wrapper = sync_wrapper(breaker, func, policy, fallback)
    functools.update_wrapper(wrapper, func)
    wrapper.breaker = breaker  # type: ignore[attr-defined]  # an attribute on the function object
    return wrapper  # type: ignore[return-value]  # same signature as func (update_wrapper)


def protected(
    service: str,
    *,
    retry: bool | RetryPolicy = False,
    fallback: Callable[..., Any] | None = None,
    failure_threshold: int | None = None,
    failure_rate_threshold: float | None = None,
    sliding_window_size: int | None = None,
    minimum_calls: int | None = None,
    recovery_timeout: float | None = None,
    half_open_max_calls: int | None = None,
    ignore_exceptions: tuple[type[BaseException], ...] | None = None,
    sliding_window_type: str | None = None,
    sliding_window_seconds: int | None = None,
    recovery_backoff_factor: float | None = None,
    recovery_timeout_max: float | None = None,
    slow_call_duration: float | None = None,
    slow_call_rate_threshold: float | None = None,
) -> Callable[[F], F]:
    """Decorate a ``def`` or ``async def`` with breaker, retry and fallback (FAC-1..FAC-4).

    Args:
        service: breaker name (CB-12).
        retry: False (default), True for ``RetryPolicy()``, or a :class:`RetryPolicy`.
        fallback: called with the call's own arguments when the breaker rejects, the
            cooldown refuses, or the final outcome is a counted exception; a coroutine
            function is awaited in the async form.
        failure_threshold: per-call override: consecutive failures that open the breaker.
        failure_rate_threshold: per-call override: failure percentage (0-100) that opens it.
        sliding_window_size: per-call override: calls kept in the failure-rate window.
        minimum_calls: per-call override: window calls needed before the rate counts.
        recovery_timeout: per-call override: seconds (float allowed) OPEN waits before probing.
        half_open_max_calls: per-call override: trial calls per probing round.
        ignore_exceptions: per-call override: exception types counted as neither outcome.
        sliding_window_type: per-call override: ``"count"`` or ``"time"`` (CB-15).
        sliding_window_seconds: per-call override: span of the time window, whole seconds (CB-15).
        recovery_backoff_factor: per-call override: growth of the open duration per
            consecutive open, 1.0 = off (CB-16).
        recovery_timeout_max: per-call override: cap of the backed-off open duration, seconds (CB-16).
        slow_call_duration: per-call override: seconds from which a call is slow, 0 = off (CB-17).
        slow_call_rate_threshold: per-call override: slow percentage that opens (CB-17).

    Returns:
        A decorator; the wrapped function returns what the call (or fallback) returns.

    Raises:
        ConfigError: at decoration time for a bad override, a generator function, or a
            non-callable fallback.
        CircuitOpenError, RateLimitCooldownError: at call time when no fallback applies.
    """
    policy = coerce_retry(retry)
    _check_fallback(service, fallback)
    overrides = dict(
        failure_threshold=failure_threshold,
        failure_rate_threshold=failure_rate_threshold,
        sliding_window_size=sliding_window_size,
        minimum_calls=minimum_calls,
        recovery_timeout=recovery_timeout,
        half_open_max_calls=half_open_max_calls,
        ignore_exceptions=ignore_exceptions,
        sliding_window_type=sliding_window_type,
        sliding_window_seconds=sliding_window_seconds,
        recovery_backoff_factor=recovery_backoff_factor,
        recovery_timeout_max=recovery_timeout_max,
        slow_call_duration=slow_call_duration,
        slow_call_rate_threshold=slow_call_rate_threshold,
    )
    _breaker(service, overrides)  # validate and register now, not at first call

    def decorate(func: F) -> F:
        return _decorate(service, func, policy, fallback, overrides, force_async=False)

    return decorate


def aprotected(service: str, **options: Any) -> Callable[[F], F]:
    """Explicit async form of :func:`protected`; the decorated function must be ``async def``.

    Raises:
        ConfigError: the function is not a coroutine function, or a bad option.
    """
    retry = options.pop("retry", False)
    fallback = options.pop("fallback", None)
    policy = coerce_retry(retry)
    _check_fallback(service, fallback)
    _breaker(service, options)

    def decorate(func: F) -> F:
        return _decorate(service, func, policy, fallback, options, force_async=True)

    return decorate


def circuit_breaker(service: str, **overrides: Any) -> Callable[[F], F]:
    """Breaker only (no retry, no fallback) for a ``def`` or ``async def`` (FAC-1).

    Args:
        service: breaker name.
        **overrides: ``failure_threshold``, ``failure_rate_threshold``,
            ``sliding_window_size``, ``minimum_calls``, ``recovery_timeout`` (seconds),
            ``half_open_max_calls``, ``ignore_exceptions``.

    Raises:
        ConfigError: bad override or a generator function (at decoration time).
        CircuitOpenError: at call time while the breaker rejects.
    """
    _breaker(service, overrides)

    def decorate(func: F) -> F:
        return _decorate(service, func, None, None, overrides, force_async=False)

    return decorate


# ------------------------------------------------------------- protect() / aprotect()
# protect and aprotect live in hotpath (their per-call fast path reads the breaker's
# hot-path attributes); a call they cannot match with a stored route comes here first.

# Overrides of these types can be matched by value (equal values of one of these types
# validate alike); a route with any other (a list of exceptions, a Decimal...) is not
# stored, so such calls are checked every time.
_EXACT = frozenset({int, float, tuple, type(None)})


def _stored_route(
    table: dict[str, Route],
    service: str,
    breaker: CircuitBreaker,
    retry: Any,
    policy: RetryPolicy | None,
    overrides: dict[str, Any],
    build: Callable[[], tuple[Callable[..., Any], Callable[..., Any]]],
) -> Route:
    """The route for a call whose every check passed: the stored route's wrappers when its
    breaker and policy are the same, else new ones; stored when later calls can match it.

    Args:
        table: the route table of the call style, one without overrides, one with.
    """
    route = table.get(service)
    if route is not None and route.breaker is breaker and route.policy == policy:
        wrappers = (route.run, route.run_fallback)
    else:
        wrappers = build()
    route = Route(breaker, retry, policy, overrides, wrappers)
    if type(service) is str and all(kind in _EXACT for kind in route.kinds):
        table[service] = route  # one assignment: readers see the old route or this one, whole
        if registry.get(service, create=False) is not breaker:
            table.pop(service, None)  # registry.clear() ran meanwhile: its breaker is gone
    return route


def protect_route(service: str, call: Callable[[], Any], retry: Any, fallback: Any, overrides: dict[str, Any]) -> Route:
    """Every check of ``protect()``, in its order, then the route to run *call* through.

    Raises:
        ConfigError: a coroutine function, a generator function or a non-callable *call*,
            a non-callable *fallback*, a bad override or a bad *retry*.
    """
    if _is_async(call):
        raise ConfigError(f"protect({service!r}) got a coroutine function; use aprotect() for async calls")
    _refuse_generators(call)
    _check_fallback(service, fallback)
    breaker = _breaker(service, overrides)
    policy = coerce_retry(retry)
    table = hotpath.knob_routes if overrides else hotpath.routes
    return _stored_route(table, service, breaker, retry, policy, overrides, lambda: call_wrappers(breaker, policy))


def aprotect_route(
    service: str, factory: Callable[[], Any], retry: Any, fallback: Any, overrides: dict[str, Any]
) -> Route:
    """Every check of ``aprotect()``, in its order, then the route to await *factory* through.

    Raises:
        ConfigError: a generator function or a non-callable *factory*, a non-callable
            *fallback*, a bad override or a bad *retry*.
    """
    _refuse_generators(factory)
    _check_fallback(service, fallback)
    breaker = _breaker(service, overrides)
    policy = coerce_retry(retry)
    table = hotpath.knob_aroutes if overrides else hotpath.aroutes
    return _stored_route(
        table, service, breaker, retry, policy, overrides, lambda: acall_wrappers(breaker, policy, service)
    )


install_route_builders(protect_route, aprotect_route)  # protect()/aprotect() build routes on a miss

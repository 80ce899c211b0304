"""The public facade: ``protected``, ``aprotected``, ``protect``, ``aprotect``, ``circuit_breaker``.

``protected`` and ``circuit_breaker`` look at what they decorate and return a real
``def`` or ``async def`` wrapper (``functools.wraps`` metadata kept, so
``inspect.iscoroutinefunction`` holds for async). Generators are refused: wrap the
call that produces the data instead.
"""

from __future__ import annotations

import functools
import inspect
import sys
from collections.abc import Callable
from typing import Any, TypeVar

from .breaker import CircuitBreaker
from .config import OVERRIDE_NAMES, SettingsSource, build_config, validate_overrides
from .errors import ConfigError
from .hotpath import aprotect, protect
from .names import check_name
from .registry import registry
from .retry import RetryPolicy, coerce_retry
from .routes import breaker_for, check_fallback, is_async, refuse_async_fallback, refuse_generators
from .stages import figures as _figures  # noqa: F401 - adds the stages' section to snapshots
from .wrappers import async_wrapper, sync_wrapper

__all__ = ["protected", "aprotected", "protect", "aprotect", "circuit_breaker"]

F = TypeVar("F", bound=Callable[..., Any])

_OVERRIDE_NAMES = OVERRIDE_NAMES  # derived from the rows of the knobs table
_KNOWN = frozenset(OVERRIDE_NAMES)
_CODE_GENERATORS = inspect.CO_GENERATOR | inspect.CO_ASYNC_GENERATOR
# From Python 3.12, inspect.markcoroutinefunction() makes a plain def a coroutine function:
# a function carrying its marker is left to inspect.
_MARKS = sys.version_info >= (3, 12)

#: ``wrap(service, wrapper) -> wrapper``, applied to the wrapper of every function
#: decorated from now on (a ``def`` stays a ``def``, an ``async def`` an ``async def``), or
#: None: nothing stands between the caller and the breaker. Read once per decoration,
#: never per call; :mod:`baldur_django.contrib.otel` sets it while ``BALDUR_OTEL_SPANS``
#: is on (one span per protected call).
wrap_calls: Callable[[str, Callable[..., Any]], Callable[..., Any]] | None = None


def _validate_arguments(service: str, overrides: dict[str, Any]) -> None:
    """The checks of :func:`_breaker` that depend on the decorator's own arguments only (the
    name and the overrides), none on a setting: a mistake there is refused at decoration."""
    check_name(service)
    if not overrides:
        return
    unknown = overrides.keys() - _KNOWN
    if unknown:
        raise ConfigError(
            f"breaker {service!r}: unknown argument(s) {sorted(unknown)}; known: {', '.join(_OVERRIDE_NAMES)}"
        )
    given = {k: v for k, v in overrides.items() if v is not None}
    if given:  # nothing given: nothing to validate
        validate_overrides(service, given)


def _register(service: str, overrides: dict[str, Any]) -> CircuitBreaker | None:
    """Validate the arguments (raises) and register the breaker now; None when a *setting*
    is bad: the decorated function then resolves its breaker at its first call and
    raises the ConfigError there, while ``manage.py check`` reports the setting with its id."""
    if overrides:
        _validate_arguments(service, overrides)
    try:
        if not overrides:  # circuit_breaker(name): the breaker's constructor checks a new name
            return registry.get(service)
        return breaker_for(service, overrides)
    except ConfigError:
        check_name(service)  # a bad name is the decorator's own mistake: raised now, never deferred
        if _fails_on_defaults(service, overrides):
            raise  # the arguments contradict each other (minimum_calls above their own window)
        return None


def _fails_on_defaults(service: str, overrides: dict[str, Any]) -> bool:
    """True when the overrides cannot make a configuration even with every setting at its
    default: the mistake is in the decorator's arguments, not in a setting."""
    given = {k: v for k, v in overrides.items() if v is not None}
    try:
        build_config(service, validate_overrides(service, given), SettingsSource(lookup=None, environ={}))
    except ConfigError:
        return True
    return False


def _deferred(
    service: str, func: Callable[..., Any], policy: RetryPolicy | None, fallback: Any, overrides: dict[str, Any]
) -> Callable[..., Any]:
    """A wrapper for a function decorated while a setting was bad: each call tries to
    build the breaker (raising the setting's ConfigError while it is still bad); the first
    that succeeds builds the real wrapper, which every later call goes through."""
    built: list[Callable[..., Any]] = []
    deferred: Any = None

    def resolve() -> Callable[..., Any]:
        if not built:
            breaker = breaker_for(service, overrides)
            make = async_wrapper if is_async(func) else sync_wrapper
            built.append(make(breaker, func, policy, fallback))
            deferred.breaker = breaker  # as _decorate sets it
        return built[0]

    async def deferred_async(*args: Any, **kwargs: Any) -> Any:
        return await resolve()(*args, **kwargs)

    def deferred_sync(*args: Any, **kwargs: Any) -> Any:
        return resolve()(*args, **kwargs)

    deferred = deferred_async if is_async(func) else deferred_sync
    return deferred  # type: ignore[no-any-return]  # one of the two functions above


def _decorate(
    service: str,
    func: F,
    policy: RetryPolicy | None,
    fallback: Any,
    overrides: dict[str, Any],
    force_async: bool,
    registered: CircuitBreaker | None = None,
) -> F:
    """Wrap *func*. *registered*: the breaker the decorator factory registered for the same
    arguments (validated then); used while the registry still holds it, else (a bad
    setting at that time, or the registry forgot it since) everything is done again."""
    refuse_generators(func)
    asynchronous = is_async(func)
    if force_async and not asynchronous:
        name = getattr(func, "__qualname__", repr(func))
        raise ConfigError(f"aprotected({service!r}) needs an async def; {name!r} is not one")
    if not asynchronous and fallback is not None:
        refuse_async_fallback(f"breaker {service!r}", fallback)
    if registered is not None and registry.holds(service, registered):
        breaker: CircuitBreaker | None = registered
    else:
        breaker = _register(service, overrides)
    if breaker is None:  # a bad setting: never raised at import time
        deferred = _deferred(service, func, policy, fallback, overrides)
        functools.update_wrapper(deferred, func)
        return deferred  # type: ignore[return-value]  # same signature as func (update_wrapper)
    if asynchronous:
        wrapper = async_wrapper(breaker, func, policy, fallback)
    else:
        wrapper = sync_wrapper(breaker, func, policy, fallback)
    if wrap_calls is not None:
        wrapper = wrap_calls(service, wrapper)
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
    ignore_exceptions: tuple[type[BaseException] | Callable[[BaseException], bool], ...] | None = None,
    failure_predicate: Callable[[BaseException], bool] | None = None,
    result_predicate: Callable[[Any], bool] | None = None,
    sliding_window_type: str | None = None,
    sliding_window_seconds: int | None = None,
    recovery_backoff_factor: float | None = None,
    recovery_timeout_max: float | None = None,
    slow_call_duration: float | None = None,
    slow_call_rate_threshold: float | None = None,
    deadline: float | None = None,
    honor_retry_after: bool | None = None,
    max_concurrent_calls: int | None = None,
    max_wait: float | None = None,
    bulkhead_scope: str | None = None,
    retry_budget_ratio: float | None = None,
    retry_budget_min_per_second: float | None = None,
    retry_budget_scope: str | None = None,
    adaptive_throttling_k: float | None = None,
    adaptive_throttling_window: float | None = None,
) -> Callable[[F], F]:
    """Decorate a ``def`` or ``async def`` with breaker, retry and fallback.

    Args:
        service: breaker name.
        retry: False (default), True for ``RetryPolicy()``, or a :class:`RetryPolicy`.
        fallback: called with the call's own arguments when the breaker rejects, the cooldown refuses, or
            the final outcome is a counted exception; a coroutine function is awaited in the async form.
        failure_threshold: per-call override: consecutive failures that open the breaker.
        failure_rate_threshold: per-call override: failure percentage (0-100) that opens it.
        sliding_window_size: per-call override: calls kept in the failure-rate window.
        minimum_calls: per-call override: window calls needed before the rate counts.
        recovery_timeout: per-call override: seconds (float allowed) OPEN waits before probing.
        half_open_max_calls: per-call override: trial calls per probing round.
        ignore_exceptions: per-call override: exception types, and callables(exc) -> bool returning True,
            counted as neither outcome.
        failure_predicate: per-call override: callable(exc) -> bool; an exception it answers False for is
            ignored (neither outcome). Asked after the 429 test and after ``ignore_exceptions``; one that
            raises makes the call a failure.
        result_predicate: per-call override: callable(value) -> bool; True records the returned value as a
            failure (returned unchanged, never a fallback).
        sliding_window_type: per-call override: ``"count"`` or ``"time"``.
        sliding_window_seconds: per-call override: span of the time window, whole seconds.
        recovery_backoff_factor: per-call override: growth of the open duration per consecutive open,
            1.0 = off.
        recovery_timeout_max: per-call override: cap of the backed-off open duration, seconds.
        slow_call_duration: per-call override: seconds from which a call is slow, 0 = off.
        slow_call_rate_threshold: per-call override: slow percentage that opens.
        deadline: per-call: seconds the whole call may take (attempts and waits); an attempt due after it
            is refused with DeadlineExceededError, an async one running at it cancelled (a failure).
        honor_retry_after: per-call override: the Retry-After gate (see docs/outbound-stages.md).
        max_concurrent_calls: per-call override: the bulkhead's limit of calls in flight.
        max_wait: per-call override: seconds a call may wait for a bulkhead slot.
        bulkhead_scope: per-call override: ``"worker"`` or ``"fleet"``.
        retry_budget_ratio: per-call override: retries as a share of the calls.
        retry_budget_min_per_second: per-call override: retries per second on top of the ratio.
        retry_budget_scope: per-call override: ``"worker"`` or ``"fleet"``.
        adaptive_throttling_k: per-call override: adaptive throttling's K.
        adaptive_throttling_window: per-call override: seconds adaptive throttling counts over.

    Returns:
        A decorator; the wrapped function returns what the call (or fallback) returns.

    Raises:
        ConfigError: at decoration time for a bad override, a generator function, a non-callable
            fallback, or an ``async def`` fallback for a ``def`` (at call time, a sync fallback that returns
            an awaitable). A bad ``BALDUR_*`` setting is raised by each call, never at decoration (import) time.
        CircuitOpenError, RateLimitCooldownError, DeadlineExceededError: at call time when no
            fallback applies.
    """
    # the per-call overrides: every parameter but the first three, in their order
    overrides = {name: value for name, value in locals().items() if name in _KNOWN}
    return _decorator(service, retry, fallback, overrides, is_async=False)


def aprotected(service: str, **options: Any) -> Callable[[F], F]:
    """Explicit async form of :func:`protected`; the decorated function must be ``async def``.

    Raises:
        ConfigError: the function is not a coroutine function, or a bad option.
    """
    retry = options.pop("retry", False)
    fallback = options.pop("fallback", None)
    return _decorator(service, retry, fallback, options, is_async=True)


def _decorator(
    service: str, retry: Any, fallback: Any, overrides: dict[str, Any], *, is_async: bool
) -> Callable[[F], F]:
    """The decorator of :func:`protected` / :func:`aprotected`: checks *retry*, *fallback* and
    *overrides* now, and registers the breaker now unless a setting is bad."""
    policy = coerce_retry(retry)
    check_fallback(service, fallback)
    registered = _register(service, overrides)

    def decorate(func: F) -> F:
        return _decorate(service, func, policy, fallback, overrides, is_async, registered)

    return decorate


def circuit_breaker(service: str, **overrides: Any) -> Callable[[F], F]:
    """Breaker only (no retry, no fallback) for a ``def`` or ``async def``.

    Args:
        service: breaker name.
        **overrides: ``failure_threshold``, ``failure_rate_threshold``,
            ``sliding_window_size``, ``minimum_calls``, ``recovery_timeout`` (seconds),
            ``half_open_max_calls``, ``ignore_exceptions``, ``failure_predicate``,
            ``result_predicate``, and the time-window, backoff and slow-call knobs, as for :func:`protected`.

    Raises:
        ConfigError: bad override or a generator function (at decoration time).
        CircuitOpenError: at call time while the breaker rejects.
    """
    registered = _register(service, overrides)

    def decorate(func: F) -> F:
        return _decorate(service, func, None, None, overrides, False, registered)

    return decorate


# ------------------------------------------------------------- protect() / aprotect()
# protect and aprotect live in hotpath (their per-call fast path reads the breaker's
# hot-path attributes); a call they cannot match with a stored route comes here first.

"""The routes of ``protect()``/``aprotect()``: every check of a first call, and what it leaves
for the later calls with the same arguments.

A view calls ``protect(name, fn)`` on every request. Deciding everything again per call (the
async and generator checks through inspect, the registry validating the overrides, a new
wrapper) cost ten times the protected call itself. The first call with given arguments goes
the full way (:func:`protect_route`) and leaves a :class:`Route`: the breaker, the arguments
it checked, and wrappers built once over trampolines that take the call as an argument.
``hotpath.protect`` matches later calls against it.

Thread safety: a Route is built whole, then stored with one dict assignment (atomic under
the GIL), and never changed. Two threads missing at once each build one over the registry's
breaker (one per name, created under the registry's lock); the last store wins, which is
harmless. ``registry.clear()`` (tests) empties the route tables with the breakers, and a
route stored by a call that raced with it is taken back (:func:`_stored_route`), so no call
after the clear uses a dropped breaker.
"""

from __future__ import annotations

import functools
import inspect
import sys
import types
from collections.abc import Awaitable, Callable
from typing import Any

from .breaker import CircuitBreaker, core_of
from .config import OVERRIDE_NAMES
from .errors import ConfigError, awaitable_refused, is_awaitable
from .registry import registry
from .retry import RetryPolicy, coerce_retry
from .stages.pipeline import build_pipeline
from .wrappers import SLOW, async_wrapper, build_ainline, build_inline, sync_wrapper

__all__ = [
    "Route",
    "NO_ROUTE",
    "routes",
    "knob_routes",
    "aroutes",
    "knob_aroutes",
    "call_wrapper",
    "acall_wrapper",
    "protect_route",
    "aprotect_route",
    "breaker_for",
    "is_async",
    "refuse_generators",
    "check_fallback",
    "refuse_async_fallback",
]

_KNOWN = frozenset(OVERRIDE_NAMES)
_CODE_GENERATORS = inspect.CO_GENERATOR | inspect.CO_ASYNC_GENERATOR
# From Python 3.12, inspect.markcoroutinefunction() makes a plain def a coroutine function:
# a function carrying its marker is left to inspect.
_MARKS = sys.version_info >= (3, 12)
_COROUTINE = types.CoroutineType
_GENERATOR = types.GeneratorType


def breaker_for(service: str, overrides: dict[str, Any]) -> CircuitBreaker:
    """The registry's breaker for *service* with *overrides* (None values left out).

    Raises:
        ConfigError: an unknown override, a bad value, or a bad setting.
    """
    unknown = overrides.keys() - _KNOWN
    if unknown:
        raise ConfigError(
            f"breaker {service!r}: unknown argument(s) {sorted(unknown)}; known: {', '.join(OVERRIDE_NAMES)}"
        )
    given = {k: v for k, v in overrides.items() if v is not None}
    # no overrides: use (or create) the breaker without claiming a configuration
    return registry.get(service, given or None)  # type: ignore[return-value]  # create=True: never None


def check_fallback(service: str, fallback: Any) -> None:
    """Raise ConfigError when *fallback* is given but not callable."""
    if fallback is not None and not callable(fallback):
        raise ConfigError(f"breaker {service!r}: fallback={fallback!r} is not callable")


def refuse_async_fallback(what: str, fallback: Any) -> None:
    """A synchronous call's fallback must be synchronous: an ``async def`` one would hand
    the caller its coroutine, never awaited."""
    if fallback is not None and is_async(fallback):
        name = getattr(fallback, "__qualname__", repr(fallback))
        raise ConfigError(
            f"{what}: fallback {name!r} is an async def, but the protected call is synchronous and could "
            "never await it; give a def, or protect an async def (aprotect() / @aprotected)"
        )


def _plain_flags(func: Any) -> int | None:
    """The code flags of a plain ``def`` or lambda, which inspect would read as well; None
    for anything else (a partial, a method, a callable object, a marked function), which
    is then asked of inspect."""
    if type(func) is types.FunctionType and not (_MARKS and hasattr(func, "_is_coroutine_marker")):
        return func.__code__.co_flags
    return None


def refuse_generators(func: Callable[..., Any]) -> None:
    """Raise ConfigError when *func* is not callable or is a generator function of any kind."""
    flags = _plain_flags(func)
    if flags is not None and not flags & _CODE_GENERATORS:
        return  # a plain function, not a generator function (what the tests below find)
    if not callable(func):
        raise ConfigError(f"{func!r} is not callable")
    if inspect.isgeneratorfunction(func) or inspect.isasyncgenfunction(func):
        name = getattr(func, "__qualname__", repr(func))
        raise ConfigError(
            f"cannot protect generator function {name!r}: its body runs after the call returns; "
            "protect the call that produces the data instead"
        )


def is_async(func: Callable[..., Any]) -> bool:
    """True for a coroutine function (a partial of one, an object whose ``__call__`` is one)."""
    flags = _plain_flags(func)
    if flags is not None:
        return bool(flags & inspect.CO_COROUTINE)  # inspect.iscoroutinefunction's test
    while isinstance(func, functools.partial):
        func = func.func
    if inspect.iscoroutinefunction(func):
        return True
    call = getattr(func, "__call__", None)  # noqa: B004 - async callable objects
    return call is not None and not inspect.isfunction(func) and inspect.iscoroutinefunction(call)


def _fallback_second(call: Callable[[], Any], fallback: Callable[[], Any]) -> Any:
    return fallback()


def _full_way(call: Callable[[], Any]) -> Any:
    """A route's plain path when it has none (a retry stage): the call goes the full way."""
    return SLOW


def _not_admitted() -> None:
    return None


def _never(*args: Any) -> None:  # pragma: no cover - never called: nothing is admitted
    return None


#: ``afast`` of a route without a plain path: admits nothing, so the call goes the full way.
_AFULL_WAY = (_not_admitted, _never, _never)


class Route:
    """What one full ``protect``/``aprotect`` call settled for its service, reused by the
    calls that match it (see the comment above). Stored whole; the only later change is its
    full wrappers, built on the first call that needs them (most routes of a healthy
    service never do, and they are most of a route's memory).

    Attributes:
        breaker: the registry's breaker for the service.
        retry: the ``retry`` argument object that was checked (compared with ``is``).
        policy: the :class:`RetryPolicy` it stands for, or None.
        overrides: the overrides that were checked, and ``kinds`` their types: a later
            call matches with equal values of the very same types (so ``True`` never
            passes for ``1``); ``key``/``value`` the one override and its value object,
            when there is exactly one.
        service: the service name the call gave.
        asynchronous: True for an ``aprotect`` route, False for a ``protect`` route.
        run: ``run(call)``: the full wrapper, no fallback.
        run_fallback: ``run_fallback(call, fallback)``: the full wrapper with *fallback*.
        built_run, built_fallback: those two wrappers once built, else None (until then
            ``run`` and ``run_fallback`` are methods that build them).
        inline: True when the plain CLOSED path may run inline (no retry stage).
        fast, afast: that path for ``protect``/``aprotect``
            (:func:`~baldur_django.core.wrappers.build_inline`), built for the route's own
            call style only; otherwise stand-ins that always send the call the full way
            (``fast`` answers ``SLOW``, ``afast``'s admission None).
        core: the breaker's core (what calls nested in this route's frames are matched by).
    """

    __slots__ = (
        "breaker",
        "retry",
        "policy",
        "overrides",
        "kinds",
        "key",
        "value",
        "service",
        "asynchronous",
        "run",
        "run_fallback",
        "built_run",
        "built_fallback",
        "inline",
        "fast",
        "afast",
        "core",
    )

    def __init__(
        self,
        breaker: CircuitBreaker,
        retry: Any,
        policy: RetryPolicy | None,
        overrides: dict[str, Any],
        service: str,
        asynchronous: bool,
        built: tuple[Callable[..., Any] | None, Callable[..., Any] | None] = (None, None),
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
        self.service = service
        self.asynchronous = asynchronous
        self.built_run, self.built_fallback = built
        self.run: Callable[..., Any] = self.built_run or self._first_run
        self.run_fallback: Callable[..., Any] = self.built_fallback or self._first_run_fallback
        # the plain CLOSED path, built by the breaker (it reads the hot-path fields): only
        # without a retry stage or any other stage
        self.inline = policy is None and build_pipeline(breaker.config, breaker.name) is None
        core = self.core = core_of(breaker)
        self.fast = build_inline(core) if self.inline and not asynchronous else _full_way
        self.afast = build_ainline(core) if self.inline and asynchronous else _AFULL_WAY

    def build(self, with_fallback: bool) -> Callable[..., Any]:
        """A new full wrapper of this route, *with_fallback* or without."""
        if self.asynchronous:
            return acall_wrapper(self.breaker, self.policy, self.service, with_fallback)
        return call_wrapper(self.breaker, self.policy, with_fallback)

    # The first call that needs a full wrapper builds it. Two threads that both come first
    # both build one; either serves (the same breaker and policy).
    def _first_run(self, call: Callable[[], Any]) -> Any:
        run = self.built_run
        if run is None:
            run = self.built_run = self.run = self.build(False)
        return run(call)

    def _first_run_fallback(self, call: Callable[[], Any], fallback: Any) -> Any:
        run = self.built_fallback
        if run is None:
            run = self.built_fallback = self.run_fallback = self.build(True)
        return run(call, fallback)


class _NoRoute:
    """What ``protect``/``aprotect`` match a call against when no route is stored: its
    ``retry`` is an object no caller holds, so no call matches it."""

    __slots__ = ()
    retry = object()


#: The route of a service no call stored one for yet (see :class:`_NoRoute`).
NO_ROUTE: Any = _NoRoute()

#: service -> the :class:`Route` of ``protect`` calls without overrides / with overrides,
#: and the same for ``aprotect`` (written by :func:`_stored_route`).
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


def call_wrapper(breaker: CircuitBreaker, policy: RetryPolicy | None, with_fallback: bool) -> Callable[..., Any]:
    """A full wrapper of a ``protect()`` route, built when a call first needs it.

    Returns:
        ``run(call)``, which does what ``sync_wrapper(breaker, call, policy, None)()`` does;
        with *with_fallback*, ``run(call, fallback)``, the same with *fallback* (called
        without arguments) as the fallback.
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

    return sync_wrapper(breaker, attempt, policy, _fallback_second if with_fallback else None)


def acall_wrapper(
    breaker: CircuitBreaker, policy: RetryPolicy | None, service: str, with_fallback: bool
) -> Callable[..., Awaitable[Any]]:
    """A full wrapper of an ``aprotect()`` route: as :func:`call_wrapper`, over
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

    return async_wrapper(breaker, attempt, policy, _fallback_second if with_fallback else None)


# Overrides of these types can be matched by value (equal values of one of these types
# validate alike); a route with any other (a list of exceptions, a Decimal...) is not
# stored, so such calls are checked every time.
_EXACT = frozenset({int, float, tuple, type(None), types.FunctionType})  # a function equals only itself


def _stored_route(
    table: dict[str, Route],
    service: str,
    breaker: CircuitBreaker,
    retry: Any,
    policy: RetryPolicy | None,
    overrides: dict[str, Any],
    asynchronous: bool,
) -> Route:
    """The route for a call whose every check passed: the stored route's wrappers when its
    breaker and policy are the same, else new ones; stored when later calls can match it.

    Args:
        table: the route table of the call style, one without overrides, one with.
    """
    route = table.get(service)
    built: tuple[Callable[..., Any] | None, Callable[..., Any] | None] = (None, None)
    if route is not None and route.breaker is breaker and route.policy == policy:
        built = (route.built_run, route.built_fallback)
    route = Route(breaker, retry, policy, overrides, service, asynchronous, built)
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
    if is_async(call):
        raise ConfigError(f"protect({service!r}) got a coroutine function; use aprotect() for async calls")
    refuse_generators(call)
    check_fallback(service, fallback)
    refuse_async_fallback(f"protect({service!r})", fallback)
    breaker = breaker_for(service, overrides)
    policy = coerce_retry(retry)
    table = knob_routes if overrides else routes
    return _stored_route(table, service, breaker, retry, policy, overrides, asynchronous=False)


def aprotect_route(
    service: str, factory: Callable[[], Any], retry: Any, fallback: Any, overrides: dict[str, Any]
) -> Route:
    """Every check of ``aprotect()``, in its order, then the route to await *factory* through.

    Raises:
        ConfigError: a generator function or a non-callable *factory*, a non-callable
            *fallback*, a bad override or a bad *retry*.
    """
    refuse_generators(factory)
    check_fallback(service, fallback)
    breaker = breaker_for(service, overrides)
    policy = coerce_retry(retry)
    table = knob_aroutes if overrides else aroutes
    return _stored_route(table, service, breaker, retry, policy, overrides, asynchronous=True)

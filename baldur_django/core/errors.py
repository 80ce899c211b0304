"""Errors raised by baldur_django. Every one derives from :class:`BaldurError`."""

from __future__ import annotations

import functools
import inspect
import types
from typing import Any

__all__ = [
    "BaldurError",
    "ConfigError",
    "CallRefusedError",
    "CircuitOpenError",
    "RateLimitCooldownError",
    "BulkheadFullError",
    "ThrottledError",
    "DeadlineExceededError",
    "StoreError",
    "new_open_error",
    "is_awaitable",
    "awaitable_refused",
]


class BaldurError(Exception):
    """Base class of every error the package raises."""


class ConfigError(BaldurError, ValueError):
    """A setting or an argument has a bad value, or the package was used the wrong way.

    The message names the setting (or argument) and the offending value. Raised during a
    protected call, it is the caller's mistake, never the dependency's answer: the breaker
    records neither a success nor a failure for it.
    """


class StoreError(BaldurError):
    """The shared store could not carry out an operator's request.

    Automatic paths never raise it: they fall back to local judgement.
    """


class CallRefusedError(BaldurError):
    """A call was refused before it reached the dependency: nothing was sent, and the refusal
    is not counted as the dependency's failure. Every refusal of the package derives from it,
    so ``except CallRefusedError`` answers them all; a ``fallback=`` answers them too.

    Attributes:
        service (str): the breaker's name.
        reason (str): why, in one word (``"open"``, ``"half_open_full"``, ``"frozen"``,
            ``"cooldown"``, ...).
        retry_after (float | None): seconds after which a call may be admitted again, or
            None when unknown.
    """

    service: str
    reason: str
    retry_after: float | None


class CircuitOpenError(CallRefusedError):
    """The breaker refused the call without invoking it.

    Attributes:
        service (str): the breaker's name.
        reason (str): ``"open"`` (OPEN or forced open), ``"half_open_full"`` (every
            trial slot of the probing round is taken) or ``"frozen"`` (Emergency Level 3).
        retry_after (float | None): seconds until the breaker admits a probe (OPEN), until
            the force lapses (forced open), or None when unknown.
    """

    def __init__(self, service: str, reason: str = "open", retry_after: float | None = None) -> None:
        # the message is built only when shown: rejecting is a hot path
        self.service = service
        self.reason = reason
        self.retry_after = retry_after

    def __getattr__(self, name: str) -> Any:
        # Only for an attribute the instance lacks: one built by new_open_error() (no
        # __init__ ran) has its three values in ``args`` alone.
        index = _FIELDS.get(name)
        if index is None or len(self.args) <= index:
            raise AttributeError(name)
        return self.args[index]

    def __str__(self) -> str:
        hint = "" if self.retry_after is None else f"; retry in {self.retry_after:.3f}s"
        return f"circuit {self.service!r} rejected the call ({self.reason}{hint})"

    def __repr__(self) -> str:
        return f"CircuitOpenError({self.service!r}, {self.reason!r}, {self.retry_after!r})"

    def __reduce__(
        self,
    ) -> tuple[
        type[CircuitOpenError], tuple[str, str, float | None]
    ]:  # keep pickling (multiprocessing, Celery results) working
        return (type(self), (self.service, self.reason, self.retry_after))


_FIELDS = {"service": 0, "reason": 1, "retry_after": 2}

#: ``new_open_error(service, reason, retry_after)`` builds a :class:`CircuitOpenError`
#: like ``CircuitOpenError(service, reason, retry_after)`` (all three positional, so
#: ``args`` is the same) in C alone: ``BaseException.__new__`` stores the arguments in
#: ``args`` and skips the Python ``__init__``, whose frame was a third of the cost of a
#: lock-free rejection; the attributes are then read from ``args`` (``__getattr__``).
new_open_error = functools.partial(BaseException.__new__, CircuitOpenError)


class RateLimitCooldownError(CallRefusedError):
    """An attempt was refused because the service's 429 cooldown outlasts the allowed wait.

    Attributes:
        service (str): the breaker's name.
        reason (str): ``"cooldown"``.
        remaining (float): seconds left on the cooldown when the attempt was refused.
        retry_after (float): the same seconds as ``remaining``, under the name every refusal
            shares.
    """

    def __init__(self, service: str, remaining: float, reason: str = "cooldown") -> None:
        self.service = service
        self.remaining = remaining
        self.retry_after = remaining
        self.reason = reason
        why = "asked for quiet with Retry-After" if reason == "retry_after" else "is cooling down after a 429"
        super().__init__(f"service {service!r} {why}; {remaining:.3f}s remaining")

    def __reduce__(self) -> tuple[type[RateLimitCooldownError], tuple[str, float, str]]:
        return (type(self), (self.service, self.remaining, self.reason))


class _StageRefusal(CallRefusedError):
    """A refusal by one of the load-aware stages; its ``reason`` is fixed by the subclass."""

    reason = ""
    _what = ""

    def __init__(self, service: str, retry_after: float | None = None) -> None:
        self.service = service
        self.retry_after = retry_after
        hint = "" if retry_after is None else f"; retry in {retry_after:.3f}s"
        super().__init__(f"call to {service!r} refused: {self._what}{hint}")

    def __reduce__(self) -> tuple[type[_StageRefusal], tuple[str, float | None]]:
        return (type(self), (self.service, self.retry_after))


class BulkheadFullError(_StageRefusal):
    """Every bulkhead slot of the service stayed taken for the whole allowed wait.

    Attributes:
        service (str): the breaker's name.
        reason (str): ``"bulkhead_full"``.
        retry_after (float | None): None (a slot may free up at any moment).
    """

    reason = "bulkhead_full"
    _what = "too many calls in flight"


class ThrottledError(_StageRefusal):
    """Adaptive throttling refused the call: the service has been rejecting most requests,
    so this client sheds some of its own load before sending.

    Attributes:
        service (str): the breaker's name.
        reason (str): ``"throttled"``.
        retry_after (float | None): None.
    """

    reason = "throttled"
    _what = "adaptive throttling is shedding load"


class DeadlineExceededError(_StageRefusal):
    """The call's deadline had passed before an attempt could start: nothing was sent, and
    it is not counted as the dependency's failure.

    Attributes:
        service (str): the breaker's name.
        reason (str): ``"deadline"``.
        retry_after (float | None): None.
    """

    reason = "deadline"
    _what = "its deadline has passed"


_COROUTINE = types.CoroutineType
_GENERATOR = types.GeneratorType


def is_awaitable(value: Any) -> bool:
    """True when *value* can be awaited (a coroutine, a future, a task, any object with
    ``__await__``, or a generator-based coroutine), as :func:`inspect.isawaitable` says,
    with the common answers first."""
    kind = value.__class__
    if kind is _COROUTINE or hasattr(kind, "__await__"):
        return True
    return kind is _GENERATOR and bool(value.gi_code.co_flags & inspect.CO_ITERABLE_COROUTINE)


def awaitable_refused(what: str, value: Any) -> ConfigError:
    """The error for a synchronous call that handed back an awaitable (*what* names it:
    ``"protect('payments')'s call"``). A coroutine or generator *value* is closed first,
    before any of its body ran, so it never warns "never awaited".

    Returns:
        ConfigError: to raise; the breaker records nothing for it.
    """
    close = getattr(value, "close", None) if value.__class__ in (_COROUTINE, _GENERATOR) else None
    if close is not None:
        close()
    return ConfigError(
        f"{what} returned an awaitable ({type(value).__name__}), which a synchronous call cannot wait for: "
        "the breaker would judge the call before it ran. Await it in an async def protected with "
        "aprotect() or @aprotected, or return its result."
    )

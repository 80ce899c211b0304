"""Errors raised by baldur_django. Every one derives from :class:`BaldurError`."""

from __future__ import annotations

import functools
from typing import Any

__all__ = ["BaldurError", "ConfigError", "CircuitOpenError", "RateLimitCooldownError", "StoreError", "new_open_error"]


class BaldurError(Exception):
    """Base class of every error the package raises."""


class ConfigError(BaldurError, ValueError):
    """A setting or an argument has a bad value.

    The message names the setting (or argument) and the offending value.
    """


class StoreError(BaldurError):
    """The shared store could not carry out an operator's request.

    Automatic paths never raise it: they fall back to local judgement.
    """


class CircuitOpenError(BaldurError):
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


class RateLimitCooldownError(BaldurError):
    """An attempt was refused because the service's 429 cooldown outlasts the allowed wait.

    Attributes:
        service (str): the breaker's name.
        remaining (float): seconds left on the cooldown when the attempt was refused.
    """

    def __init__(self, service: str, remaining: float) -> None:
        self.service = service
        self.remaining = remaining
        super().__init__(f"service {service!r} is cooling down after a 429; {remaining:.3f}s remaining")

    def __reduce__(self) -> tuple[type[RateLimitCooldownError], tuple[str, float]]:
        return (type(self), (self.service, self.remaining))

"""Request marks: "this request was refused by the application's own rate limiter" (IN-3).

An app-side limiter (the DRF throttle bridge, ``RateLimitMiddleware``, a hand-written
check) marks the request it refused; the circuit-breaker middleware then leaves that
request's 429 out of every count. Plain Python: a mark is one attribute on the request
object, so this module imports nothing, and ``import baldur_django`` (which re-exports
:func:`mark_rate_limited`) works in a process without Django.
"""

from __future__ import annotations

from typing import Any

__all__ = ["MARK_ATTRIBUTE", "mark_rate_limited", "is_marked"]

#: Attribute set on the underlying ``HttpRequest`` by :func:`mark_rate_limited`.
MARK_ATTRIBUTE = "baldur_rate_limited"


def _underlying(request: Any) -> Any:
    # DRF's Request forwards attribute reads to the HttpRequest but keeps writes on
    # itself, and middleware only ever sees the HttpRequest: always use the inner one.
    inner = getattr(request, "_request", None)
    return inner if inner is not None else request


def mark_rate_limited(request: Any) -> None:
    """Mark *request* as refused by the application's own rate limiter. Implements IN-3.

    The circuit-breaker middleware then leaves the request's 429 out of every count.

    Args:
        request: a Django ``HttpRequest`` or a DRF ``Request`` (the mark is set on the
            underlying ``HttpRequest``, the object middleware sees); any object that
            accepts attributes.

    Returns:
        None.

    Raises:
        AttributeError: *request* does not accept attributes (``__slots__``, a builtin).
    """
    setattr(_underlying(request), MARK_ATTRIBUTE, True)


def is_marked(request: Any) -> bool:
    """Whether :func:`mark_rate_limited` was called for *request*. Implements IN-3.

    Args:
        request: a Django ``HttpRequest`` or a DRF ``Request`` (or any object).

    Returns:
        bool: True only when the mark is set (on the request or its underlying ``HttpRequest``).
    """
    return getattr(_underlying(request), MARK_ATTRIBUTE, False) is True

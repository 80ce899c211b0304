"""Request marks: "this request was refused by the application's own rate limiter".

An app-side limiter (the DRF throttle bridge, ``RateLimitMiddleware``, a hand-written
check) marks the request it refused; the circuit-breaker middleware then leaves that
request's 429 out of every count. Plain Python: a mark is one attribute on the request
object (or one key of an ASGI scope), so this module imports nothing, and
``import baldur_django`` (which re-exports :func:`mark_rate_limited`) works in a process
without Django.
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


def _scope_of(target: Any) -> Any:
    # An ASGI scope (a dict), or the scope a Starlette/FastAPI Request wraps: the bare
    # ASGI middleware sees the scope, never the framework's request object.
    if isinstance(target, dict):
        return target
    scope = getattr(target, "scope", None)
    return scope if isinstance(scope, dict) else None


def mark_rate_limited(request: Any) -> None:
    """Mark *request* as refused by the application's own rate limiter.

    The circuit-breaker middleware then leaves the request's 429 out of every count.

    Args:
        request: a Django ``HttpRequest`` or a DRF ``Request`` (the mark is set on the
            underlying ``HttpRequest``, the object middleware sees); a Flask request; an
            ASGI scope (a dict) or a Starlette/FastAPI ``Request`` (the mark is also
            written into its scope, which the bare ASGI middleware sees); any object
            that accepts attributes.

    Returns:
        None.

    Raises:
        AttributeError: *request* does not accept attributes (``__slots__``, a builtin).
    """
    target = _underlying(request)
    scope = _scope_of(target)
    if scope is not None:
        scope[MARK_ATTRIBUTE] = True
    if scope is not target:
        setattr(target, MARK_ATTRIBUTE, True)


def is_marked(request: Any) -> bool:
    """Whether :func:`mark_rate_limited` was called for *request*.

    Args:
        request: a Django ``HttpRequest`` or a DRF ``Request``, an ASGI scope, or any object.

    Returns:
        bool: True only when the mark is set (on the request, its underlying
        ``HttpRequest``, or its ASGI scope).
    """
    target = _underlying(request)
    if getattr(target, MARK_ATTRIBUTE, False) is True:
        return True
    scope = _scope_of(target)
    return scope is not None and scope.get(MARK_ATTRIBUTE) is True

"""ASGI middleware for Starlette, FastAPI and any other ASGI app (IN-6).

Works without Django: only the core is imported, and settings come from ``BALDUR_*``
environment variables (or their defaults)::

    from starlette.applications import Starlette
    from baldur_django.contrib.asgi import BaldurASGIMiddleware

    app = Starlette(routes=[...])
    app.add_middleware(BaldurASGIMiddleware, service_name="checkout-api")
    # or: app = BaldurASGIMiddleware(app, service_name="checkout-api")

With a ``service_name`` every HTTP response is recorded against that one breaker, the
way the Django middleware records a domain's responses (IN-1, IN-2); without one the
middleware records nothing.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from ..core.breaker import CircuitBreaker, Permit
from ..core.classify import RATE_LIMITED
from ..core.errors import CircuitOpenError, ConfigError
from ..core.registry import registry
from ..core.runner import settle_status

__all__ = ["BaldurASGIMiddleware", "record_status"]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

#: Header on the package's own load-shedding 503 (see ``baldur_django.middleware``).
SHED_HEADER = "x-baldur-shed"
#: Header on the package's own 429s (see ``baldur_django.limiter``).
MODE_HEADER = "x-ratelimit-mode"


def check_service_name(service_name: Any) -> str | None:
    """Return *service_name* when it is None or a non-empty string; else raise ConfigError."""
    if service_name is None:
        return None
    if not isinstance(service_name, str) or not service_name.strip():
        raise ConfigError(f"service_name={service_name!r}: expected a non-empty string or None")
    return service_name


def record_status(breaker: CircuitBreaker, permit: Permit, status: Any, header: Callable[[str], Any]) -> str:
    """Record one response, known by its status and headers, on *breaker* (IN-6).

    A status on the breaker's rate-limit list records a failure that also feeds the
    cascade and the cooldown (``Retry-After`` is honoured), unless the response carries
    ``X-RateLimit-Mode`` (the package's own 429): then nothing is recorded. A status on
    the failure list records a failure, anything else a success. The package's own
    load-shedding 503 (``X-Baldur-Shed``) is never recorded.

    Args:
        breaker: the service's breaker.
        permit: from ``breaker.acquire()``.
        status: the integer HTTP status.
        header: ``name -> value or None``, case-insensitive.

    Returns:
        ``"success"``, ``"failure"``, ``"rate_limited"`` or ``"ignored"``.
    """

    def own(kind: int, code: int | None) -> bool:
        if header(SHED_HEADER) is not None:
            return True
        return (kind == RATE_LIMITED or code == 429) and header(MODE_HEADER) is not None

    return settle_status(breaker, permit, status, lambda: header("retry-after"), own)


def _asgi_header(raw: Any) -> Callable[[str], Any]:
    def header(name: str) -> Any:
        wanted = name.lower().encode("latin-1")
        for key, value in raw or ():
            if bytes(key).lower() == wanted:
                return bytes(value).decode("latin-1")
        return None

    return header


class BaldurASGIMiddleware:
    """Record an ASGI app's HTTP responses against one breaker (IN-6).

    The breaker is asked for admission before the app runs. When it refuses (OPEN, or
    HALF_OPEN with its trials taken) the request still runs and nothing is recorded.
    The outcome is taken from the ``http.response.start`` message (status and
    headers; the body is passed through untouched, so streaming is not affected). An
    exception escaping the app before any response started counts as one failure (an
    ``Exception``) or as nothing (``CancelledError`` and other ``BaseException``).
    WebSocket and lifespan traffic passes through unrecorded.

    Args:
        app: the ASGI application to wrap.
        service_name: breaker name (str); None records nothing.

    Raises:
        ConfigError: *service_name* is neither None nor a non-empty string.
    """

    def __init__(self, app: ASGIApp, service_name: str | None = None) -> None:
        self.app = app
        self.service_name = check_service_name(service_name)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.service_name is None or scope.get("type") != "http":
            await self.app(scope, receive, send)
            return
        breaker = registry.get(self.service_name)
        assert breaker is not None
        try:
            permit = breaker.acquire()
        except CircuitOpenError:
            await self.app(scope, receive, send)
            return
        recorded = False

        async def send_and_record(message: Message) -> None:
            nonlocal recorded
            if not recorded and message.get("type") == "http.response.start":
                recorded = True
                record_status(breaker, permit, message.get("status"), _asgi_header(message.get("headers")))
            await send(message)

        try:
            await self.app(scope, receive, send_and_record)
        except Exception:
            if not recorded:
                recorded = True
                breaker.record_failure(permit)
            raise
        except BaseException:
            if not recorded:
                recorded = True
                breaker.record_ignored(permit)
            raise
        if not recorded:
            breaker.record_ignored(permit)  # the app answered nothing

"""ASGI middleware for Starlette, FastAPI and any other ASGI app.

Works without Django: only the core is imported, and settings come from ``BALDUR_*``
environment variables (or their defaults)::

    from starlette.applications import Starlette
    from baldur_django.contrib.asgi import BaldurASGIMiddleware

    app = Starlette(routes=[...])
    app.add_middleware(BaldurASGIMiddleware, service_name="checkout-api")
    # or: app = BaldurASGIMiddleware(app, service_name="checkout-api")

With a ``service_name`` every HTTP response is recorded against that one breaker, the
way the Django middleware records a domain's responses; without one the
middleware records nothing.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from ..core import inbound
from ..core.breaker import CircuitBreaker, Permit
from ..core.inbound import ShedAnswer
from ..core.names import check_name
from ..core.registry import registry

__all__ = ["BaldurASGIMiddleware", "RawHeaders", "record_status", "check_service_name"]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

#: Header on the package's own load-shedding 503 (``core.inbound.SHED_HEADER``).
SHED_HEADER = inbound.SHED_HEADER.lower()
#: Header on the package's own 429s (``core.inbound.MODE_HEADER``).
MODE_HEADER = inbound.MODE_HEADER.lower()


def check_service_name(service_name: Any) -> str | None:
    """Return *service_name* when it is None or a non-empty string; else raise ConfigError.

    Args:
        service_name: the value given to the middleware or the extension.

    Returns:
        str | None: *service_name*.

    Raises:
        ConfigError: *service_name* is neither None nor a valid breaker name (see
            :func:`baldur_django.core.names.check_name`).
    """
    if service_name is None:
        return None
    return check_name(service_name, "service_name")


class RawHeaders:
    """Case-insensitive ``get`` over an ASGI message's raw ``[(name, value), ...]`` bytes.

    Args:
        raw: the message's ``headers`` (an iterable of byte pairs), or None.
    """

    __slots__ = ("raw",)

    def __init__(self, raw: Any) -> None:
        self.raw = raw

    def get(self, name: str, default: Any = None) -> Any:
        """The first value of header *name* (str, Latin-1 decoded), or *default*."""
        wanted = name.lower().encode("latin-1")
        for key, value in self.raw or ():
            if bytes(key).lower() == wanted:
                return bytes(value).decode("latin-1")
        return default


class _Getter:
    __slots__ = ("get",)

    def __init__(self, get: Callable[[str], Any]) -> None:
        self.get = get


def record_status(breaker: CircuitBreaker, permit: Permit, status: Any, header: Callable[[str], Any]) -> str:
    """Record one response, known by its status and headers, on *breaker*.

    The inbound policy's rules (:func:`baldur_django.core.inbound.record`): a status on
    the rate-limit list records a failure that also feeds the cascade and the cooldown
    (``Retry-After`` honoured), unless the response carries ``X-RateLimit-Mode`` or
    ``X-RateLimit-Limit`` (the application's own 429); a status on the failure list
    records a failure, anything else a success; the package's own load-shedding 503
    (``X-Baldur-Shed``) is never recorded.

    Args:
        breaker: the service's breaker.
        permit: from ``breaker.acquire()``.
        status: the integer HTTP status.
        header: ``name -> value or None``, case-insensitive.

    Returns:
        str: ``"success"``, ``"failure"``, ``"rate_limited"`` or ``"ignored"``.
    """
    return inbound.record(breaker, permit, status, _Getter(header))


async def _send_shed(answer: ShedAnswer, send: Send) -> None:
    headers = [(name.lower().encode("latin-1"), value.encode("latin-1")) for name, value in answer.headers]
    headers.append((b"content-length", str(len(answer.body)).encode("latin-1")))
    await send({"type": "http.response.start", "status": answer.status, "headers": headers})
    await send({"type": "http.response.body", "body": answer.body, "more_body": False})


class BaldurASGIMiddleware:
    """Record an ASGI app's HTTP responses against one breaker.

    A thin shell over the inbound policy (:mod:`baldur_django.core.inbound`), the one
    Django's middleware and the Flask extension use. The breaker is asked for admission
    before the app runs. When it refuses (OPEN, or HALF_OPEN with its trials taken) the
    request still runs and nothing is recorded, unless ``BALDUR_MIDDLEWARE_SHED_LOAD`` is
    on: then the app is skipped and a 503 with ``Retry-After`` and ``X-Baldur-Shed`` is
    answered. The outcome is taken from the ``http.response.start`` message (status and
    headers; the body is passed through untouched, so streaming is not affected). A 429
    is left out when it carries ``X-RateLimit-Mode`` or ``X-RateLimit-Limit``, or when the
    app marked the request (``baldur_django.mark_rate_limited(request)`` on a Starlette
    request or on the scope). An exception escaping the app before any response started
    counts as one failure (an ``Exception``) or as nothing (``CancelledError`` and other
    ``BaseException``). WebSocket and lifespan traffic passes through unrecorded.

    Every store operation (a shared breaker's consult, probe or trial outcome) runs in a
    worker thread, never on the event loop: a hung store delays no other request.

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
        permit = await inbound.aadmit(breaker)
        if permit is None:
            await self.app(scope, receive, send)
            return
        if isinstance(permit, ShedAnswer):
            await _send_shed(permit, send)
            return
        admitted: Permit = permit
        recorded = False

        async def send_and_record(message: Message) -> None:
            nonlocal recorded
            if not recorded and message.get("type") == "http.response.start":
                recorded = True
                await inbound.arecord(
                    breaker, admitted, message.get("status"), RawHeaders(message.get("headers")), scope
                )
            await send(message)

        try:
            await self.app(scope, receive, send_and_record)
        except BaseException as error:
            if not recorded:
                recorded = True
                await inbound.arecord_exception(breaker, admitted, error)
            raise
        if not recorded:
            await inbound.arelease(breaker, admitted)  # the app answered nothing

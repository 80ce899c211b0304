"""A circuit breaker inside httpx: :class:`BreakerTransport` and :class:`AsyncBreakerTransport`.

::

    import httpx
    from baldur_django.contrib.httpx import AsyncBreakerTransport, BreakerTransport

    client = httpx.Client(transport=BreakerTransport())            # one breaker per host
    aclient = httpx.AsyncClient(transport=AsyncBreakerTransport("payments"))

Each wraps another transport (default ``httpx.HTTPTransport()`` /
``httpx.AsyncHTTPTransport()``) and puts every request through a breaker before any
network I/O, with the rules of :mod:`baldur_django.contrib.requests`: transport errors and
timeouts are failures, re-raised unchanged; responses come back unchanged and are judged
at their headers (a streamed body is the caller's); a refusal raises
:class:`CircuitOpenTransportError`, both a :class:`baldur_django.CircuitOpenError` and an
``httpx.TransportError``. The async transport never runs a shared store's I/O on the event
loop: admission and trial outcomes of a shared breaker go to a worker thread, as for
``aprotect()``.
"""

from __future__ import annotations

from types import TracebackType
from typing import Any

import httpx

from ..core.errors import CircuitOpenError, ConfigError, RateLimitCooldownError
from .outbound import IDEMPOTENT_METHODS, Breakers, HTTPRetryPolicy, NotAnOutcome, clipped_timeout

__all__ = [
    "BreakerTransport",
    "AsyncBreakerTransport",
    "CircuitOpenTransportError",
    "RateLimitCooldownTransportError",
    "HTTPRetryPolicy",
    "IDEMPOTENT_METHODS",
]

# Errors of the client itself: neither a success nor a failure. TooManyRedirects
# is the Client's own, never a transport's.
_CLIENT_ERRORS = (httpx.UnsupportedProtocol, httpx.InvalidURL, httpx.LocalProtocolError, httpx.TooManyRedirects)


class CircuitOpenTransportError(CircuitOpenError, httpx.TransportError):
    """The breaker refused the request; nothing was sent.

    Both a :class:`baldur_django.CircuitOpenError` and an ``httpx.TransportError``, so an
    existing ``except httpx.TransportError`` (or ``httpx.RequestError``) keeps catching it.

    Attributes:
        service (str): the breaker's name.
        reason (str): ``"open"``, ``"half_open_full"`` or ``"frozen"``.
        retry_after (float | None): seconds until a probe is admitted, or None.
        request (httpx.Request): the refused request (httpx raises RuntimeError when unset).
    """

    def __init__(
        self,
        service: str,
        reason: str = "open",
        retry_after: float | None = None,
        *,
        request: httpx.Request | None = None,
    ) -> None:
        CircuitOpenError.__init__(self, service, reason, retry_after)
        httpx.TransportError.__init__(self, CircuitOpenError.__str__(self), request=request)
        self.args = (service, reason, retry_after)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.service!r}, {self.reason!r}, {self.retry_after!r})"


class RateLimitCooldownTransportError(RateLimitCooldownError, httpx.TransportError):
    """The retry stage refused an attempt during a 429 cooldown, or the Retry-After gate
    refused the request; nothing was sent.

    Both a :class:`baldur_django.RateLimitCooldownError` and an ``httpx.TransportError``.

    Attributes:
        service (str): the breaker's name.
        remaining (float): seconds of cooldown left.
        reason (str): ``"cooldown"`` (the retry stage) or ``"retry_after"`` (the gate).
    """

    def __init__(
        self, service: str, remaining: float, reason: str = "cooldown", *, request: httpx.Request | None = None
    ) -> None:
        RateLimitCooldownError.__init__(self, service, remaining, reason)
        message = str(self)
        httpx.TransportError.__init__(self, message, request=request)
        self.args = (message,)


def _url_parts(request: httpx.Request) -> tuple[str, str | None, str | None, int | None]:
    url = request.url
    return str(url), url.scheme, url.host, url.port


def _replayable(request: httpx.Request) -> bool:
    # bytes (or no body) are held in a ByteStream; a generator or a file is read once
    return isinstance(request.stream, httpx.ByteStream)


def _refusal(error: BaseException, request: httpx.Request) -> BaseException | None:
    """The transport's own refusal error for the engine's *error*, or None to keep *error*."""
    if type(error) is CircuitOpenError:
        return CircuitOpenTransportError(error.service, error.reason, error.retry_after, request=request)
    if type(error) is RateLimitCooldownError:
        return RateLimitCooldownTransportError(error.service, error.remaining, error.reason, request=request)
    return None


class BreakerTransport(httpx.BaseTransport):
    """An httpx transport that puts every request through a breaker.

    Args:
        service (str | Callable[[httpx.Request], str] | None): the breaker's name; a
            callable of the request returning it; or None (default) for one breaker per
            host (``"api.example.com"``, ``"api.example.com:8443"`` for a port that is not
            the scheme's default; lowercased).
        transport: the transport to wrap (default a new ``httpx.HTTPTransport()``); its pools,
            proxies, ``verify``/``cert`` and limits are used as they are.
        retry (RetryPolicy | bool | None): the retry stage: only for GET,
            HEAD, OPTIONS, PUT, DELETE and TRACE unless the policy is an
            :class:`HTTPRetryPolicy` naming other methods, and never for a streamed request
            body. True means ``RetryPolicy()``.
        fallback (Callable[[httpx.Request], Any] | None): called with the request when the
            breaker or the cooldown refuses, or the final outcome is a counted exception;
            its value (an ``httpx.Response``) is returned instead.
        max_hosts (int | None): per-host breakers this transport keeps at most (None:
            ``BALDUR_ADAPTER_MAX_HOSTS``); the least recently used CLOSED ones leave first.
        **overrides: the decorators' per-call knobs, for every breaker this transport uses.

    Raises:
        ConfigError: a bad argument, naming it (nothing is created).
    """

    def __init__(
        self,
        service: Any = None,
        transport: httpx.BaseTransport | None = None,
        retry: Any = None,
        fallback: Any = None,
        max_hosts: int | None = None,
        **overrides: Any,
    ) -> None:
        if transport is not None and not callable(getattr(transport, "handle_request", None)):
            raise ConfigError(f"BreakerTransport(transport={transport!r}): expected an httpx.BaseTransport")
        self._breakers = Breakers("BreakerTransport", service, retry, fallback, overrides, max_hosts=max_hosts)
        self._transport = httpx.HTTPTransport() if transport is None else transport

    @property
    def transport(self) -> httpx.BaseTransport:
        """The wrapped transport."""
        return self._transport

    def breaker_name(self, request: httpx.Request) -> str:
        """The name of the breaker *request* goes through. Raises ConfigError as
        :meth:`handle_request` does."""
        url = request.url
        return self._breakers.named(request, (url.scheme, url.netloc), lambda: _url_parts(request))

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        """Send *request* through its breaker and the wrapped transport.

        Returns:
            The wrapped transport's response, unchanged and unread, or the fallback's value.

        Raises:
            CircuitOpenTransportError: the breaker refused (no fallback); nothing was sent.
            RateLimitCooldownTransportError: a cooldown outlasted the retry stage's wait.
            DeadlineExceededError: the deadline passed before an attempt; nothing was sent.
            ConfigError: no breaker can be named for the request; nothing was sent.
            httpx.TransportError: the wrapped transport's own error, unchanged.
        """
        breakers = self._breakers
        entry = breakers.entry(self.breaker_name(request))
        route = breakers.route(entry, request.method, _replayable(request))
        transport = self._transport
        previous: list[httpx.Response] = []

        def attempt() -> httpx.Response:
            while previous:  # a failure response the retry stage replaces: release it
                previous.pop().close()
            timeout = request.extensions.get("timeout")
            clipped = clipped_timeout(timeout)  # never past the deadline, if any
            if clipped is not timeout:
                request.extensions["timeout"] = clipped
            try:
                response = transport.handle_request(request)
            except _CLIENT_ERRORS as exc:
                raise NotAnOutcome(exc) from None
            finally:
                if clipped is not timeout:
                    request.extensions["timeout"] = timeout
            previous.append(response)
            return response

        fallback = breakers.fallback
        bounds = breakers.enter_bounds(route, request.extensions.get("timeout"))  # a trial's lease, the retries
        try:
            if fallback is None:
                return route.run(attempt)  # type: ignore[no-any-return]
            return route.run_fallback(attempt, lambda: fallback(request))  # type: ignore[no-any-return]
        except NotAnOutcome as carried:
            error: BaseException = carried.error
        except (CircuitOpenError, RateLimitCooldownError) as exc:
            refusal = _refusal(exc, request)
            if refusal is None:
                raise
            raise refusal from exc.__cause__
        finally:
            breakers.leave_bounds(bounds)
        raise error

    def close(self) -> None:
        """Close the wrapped transport."""
        self._transport.close()

    def __enter__(self) -> BreakerTransport:
        self._transport.__enter__()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None = None,
        exc_value: BaseException | None = None,
        traceback: TracebackType | None = None,
    ) -> None:
        self._transport.__exit__(exc_type, exc_value, traceback)

    def __repr__(self) -> str:
        service = self._breakers.service
        return (
            f"<BreakerTransport service={'per host' if service is None else service!r} transport={self._transport!r}>"
        )


class AsyncBreakerTransport(httpx.AsyncBaseTransport):
    """The async :class:`BreakerTransport`: a shared store's I/O never runs on the event loop.

    Args:
        service (str | Callable[[httpx.Request], str] | None): the breaker's name; a
            callable of the request returning it; or None (default) for one breaker per
            host (``"api.example.com"``, ``"api.example.com:8443"`` for a port that is not
            the scheme's default; lowercased).
        transport: the transport to wrap (default a new ``httpx.AsyncHTTPTransport()``); its pools,
            proxies, ``verify``/``cert`` and limits are used as they are.
        retry (RetryPolicy | bool | None): the retry stage: only for GET,
            HEAD, OPTIONS, PUT, DELETE and TRACE unless the policy is an
            :class:`HTTPRetryPolicy` naming other methods, and never for a streamed request
            body. True means ``RetryPolicy()``.
        fallback (Callable[[httpx.Request], Any] | None): called with the request when the
            breaker or the cooldown refuses, or the final outcome is a counted exception;
            its value (an ``httpx.Response``; a coroutine is awaited) is returned instead.
        max_hosts (int | None): per-host breakers this transport keeps at most (None:
            ``BALDUR_ADAPTER_MAX_HOSTS``); the least recently used CLOSED ones leave first.
        **overrides: the decorators' per-call knobs, for every breaker this transport uses.

    Raises:
        ConfigError: a bad argument, naming it (nothing is created).
    """

    def __init__(
        self,
        service: Any = None,
        transport: httpx.AsyncBaseTransport | None = None,
        retry: Any = None,
        fallback: Any = None,
        max_hosts: int | None = None,
        **overrides: Any,
    ) -> None:
        if transport is not None and not callable(getattr(transport, "handle_async_request", None)):
            raise ConfigError(f"AsyncBreakerTransport(transport={transport!r}): expected an httpx.AsyncBaseTransport")
        self._breakers = Breakers(
            "AsyncBreakerTransport", service, retry, fallback, overrides, is_async=True, max_hosts=max_hosts
        )
        self._transport = httpx.AsyncHTTPTransport() if transport is None else transport

    @property
    def transport(self) -> httpx.AsyncBaseTransport:
        """The wrapped transport."""
        return self._transport

    def breaker_name(self, request: httpx.Request) -> str:
        """The name of the breaker *request* goes through."""
        url = request.url
        return self._breakers.named(request, (url.scheme, url.netloc), lambda: _url_parts(request))

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        """Send *request* through its breaker and the wrapped transport; same results and
        errors as :meth:`BreakerTransport.handle_request`."""
        breakers = self._breakers
        entry = breakers.entry(self.breaker_name(request))
        route = breakers.route(entry, request.method, _replayable(request))
        transport = self._transport
        previous: list[httpx.Response] = []

        async def attempt() -> httpx.Response:
            while previous:
                await previous.pop().aclose()
            timeout = request.extensions.get("timeout")
            clipped = clipped_timeout(timeout)  # never past the deadline, if any
            if clipped is not timeout:
                request.extensions["timeout"] = clipped
            try:
                response = await transport.handle_async_request(request)
            except _CLIENT_ERRORS as exc:
                raise NotAnOutcome(exc) from None
            finally:
                if clipped is not timeout:
                    request.extensions["timeout"] = timeout
            previous.append(response)
            return response

        fallback = breakers.fallback
        bounds = breakers.enter_bounds(route, request.extensions.get("timeout"))  # a trial's lease, the retries
        try:
            if fallback is None:
                return await route.run(attempt)  # type: ignore[no-any-return]
            return await route.run_fallback(attempt, lambda: fallback(request))  # type: ignore[no-any-return]
        except NotAnOutcome as carried:
            error: BaseException = carried.error
        except (CircuitOpenError, RateLimitCooldownError) as exc:
            refusal = _refusal(exc, request)
            if refusal is None:
                raise
            raise refusal from exc.__cause__
        finally:
            breakers.leave_bounds(bounds)
        raise error

    async def aclose(self) -> None:
        """Close the wrapped transport."""
        await self._transport.aclose()

    async def __aenter__(self) -> AsyncBreakerTransport:
        await self._transport.__aenter__()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None = None,
        exc_value: BaseException | None = None,
        traceback: TracebackType | None = None,
    ) -> None:
        await self._transport.__aexit__(exc_type, exc_value, traceback)

    def __repr__(self) -> str:
        service = self._breakers.service
        return (
            f"<AsyncBreakerTransport service={'per host' if service is None else service!r} "
            f"transport={self._transport!r}>"
        )

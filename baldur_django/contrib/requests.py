"""A circuit breaker inside requests: mount :class:`BreakerAdapter` on a session.

::

    import requests
    from baldur_django.contrib.requests import BreakerAdapter

    session = requests.Session()
    session.mount("https://", BreakerAdapter())              # one breaker per host
    session.mount("https://api.payments.example/", BreakerAdapter("payments"))

Every request passes its breaker before any socket is opened. Connection errors and
timeouts count as failures and are re-raised unchanged; responses come back unchanged and
are judged by their status like any protected call's return value (the failure list, a
429 with its ``Retry-After``); a refusal raises :class:`CircuitOpenRequestError`, which is
both a :class:`baldur_django.CircuitOpenError` and a ``requests.ConnectionError``. The
breakers are the registry's, so ``BALDUR_SERVICES``, forces, Emergency Mode, a shared
store and the metrics apply to them by name.
"""

from __future__ import annotations

import io
import json as jsonlib
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import requests
from requests.adapters import BaseAdapter, HTTPAdapter
from requests.models import PreparedRequest, Response

from ..core.errors import CircuitOpenError, ConfigError, RateLimitCooldownError
from .outbound import IDEMPOTENT_METHODS, Breakers, HTTPRetryPolicy, NotAnOutcome, clipped_timeout

__all__ = [
    "BreakerAdapter",
    "CircuitOpenRequestError",
    "RateLimitCooldownRequestError",
    "HTTPRetryPolicy",
    "IDEMPOTENT_METHODS",
    "canned_response",
]

# Errors of the client itself, raised before anything reached the dependency: neither a
# success nor a failure. A redirect loop is requests.Session's, never an adapter's.
_CLIENT_ERRORS = (
    requests.exceptions.InvalidURL,  # InvalidProxyURL included
    requests.exceptions.InvalidSchema,
    requests.exceptions.MissingSchema,
    requests.exceptions.InvalidHeader,
    requests.exceptions.URLRequired,
    requests.exceptions.TooManyRedirects,
    requests.exceptions.UnrewindableBodyError,
)

_REPLAYABLE = (type(None), bytes, str, bytearray)


class CircuitOpenRequestError(CircuitOpenError, requests.ConnectionError):
    """The breaker refused the request; nothing was sent.

    Both a :class:`baldur_django.CircuitOpenError` and a ``requests.ConnectionError``, so
    an existing ``except requests.RequestException`` keeps catching it.

    Attributes:
        service (str): the breaker's name.
        reason (str): ``"open"``, ``"half_open_full"`` or ``"frozen"``.
        retry_after (float | None): seconds until a probe is admitted, or None.
        request (PreparedRequest | None): the refused request.
        response (None): never a response.
    """

    def __init__(
        self,
        service: str,
        reason: str = "open",
        retry_after: float | None = None,
        *,
        request: PreparedRequest | None = None,
    ) -> None:
        CircuitOpenError.__init__(self, service, reason, retry_after)
        self.args = (service, reason, retry_after)
        self.request = request
        self.response = None

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.service!r}, {self.reason!r}, {self.retry_after!r})"


class RateLimitCooldownRequestError(RateLimitCooldownError, requests.ConnectionError):
    """The retry stage refused an attempt during a 429 cooldown, or the Retry-After gate
    refused the request; nothing was sent.

    Both a :class:`baldur_django.RateLimitCooldownError` and a ``requests.ConnectionError``.

    Attributes:
        service (str): the breaker's name.
        remaining (float): seconds of cooldown left.
        reason (str): ``"cooldown"`` (the retry stage) or ``"retry_after"`` (the gate).
        request (PreparedRequest | None): the refused request.
        response (None): never a response.
    """

    def __init__(
        self, service: str, remaining: float, reason: str = "cooldown", *, request: PreparedRequest | None = None
    ) -> None:
        RateLimitCooldownError.__init__(self, service, remaining, reason)
        self.request = request
        self.response = None


def canned_response(
    request: PreparedRequest,
    status_code: int = 200,
    *,
    content: bytes = b"",
    json: Any = None,
    headers: dict[str, str] | None = None,
) -> Response:
    """Build a ``requests.Response`` for a fallback to return.

    Args:
        request: the request the fallback was called with.
        status_code: the response's status.
        content: the body, bytes (ignored when *json* is given).
        json: an object to send as a JSON body (sets ``Content-Type``).
        headers: response headers.

    Returns:
        A response the session treats like one from the network (``.text``, ``.json()``,
        hooks and cookies work).
    """
    response = Response()
    response.status_code = status_code
    response.request = request
    response.url = request.url or ""
    response.headers.update(headers or {})
    if json is not None:
        content = jsonlib.dumps(json).encode()
        response.headers.setdefault("Content-Type", "application/json")
    response.raw = io.BytesIO(content)
    response.encoding = "utf-8"
    response.reason = "Fallback"
    return response


def _url_parts(request: PreparedRequest) -> tuple[str, str | None, str | None, int | None]:
    url = request.url or ""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise ConfigError(f"BreakerAdapter: the URL {url!r} cannot be read ({exc})") from None
    return url, parts.scheme, parts.hostname, port


class BreakerAdapter(BaseAdapter):
    """A requests transport adapter that puts every request through a breaker.

    Args:
        service (str | Callable[[PreparedRequest], str] | None): the breaker's name; a
            callable of the request returning it; or None (default) for one breaker per
            host: ``"api.example.com"``, ``"api.example.com:8443"`` when the port is not
            the scheme's default (lowercased).
        retry (RetryPolicy | bool | None): the retry stage (the decorators' engine): only for GET, HEAD, OPTIONS, PUT, DELETE and TRACE unless the policy
            is an :class:`HTTPRetryPolicy` naming other methods, and never for a body that
            cannot be sent again (a file or a generator). True means ``RetryPolicy()``.
        fallback (Callable[[PreparedRequest], Any] | None): called with the request when
            the breaker refuses, the cooldown refuses or the final outcome is a counted
            exception; its value is returned instead (a ``requests.Response``, so the
            session can go on with it). Never called for a returned response.
        adapter (BaseAdapter | None): the adapter to wrap (default a new
            ``requests.adapters.HTTPAdapter()``); its pools, proxies and TLS settings are
            used as they are.
        max_hosts (int | None): per-host breakers this adapter keeps at most (None:
            ``BALDUR_ADAPTER_MAX_HOSTS``); the least recently used CLOSED ones leave first.
        **overrides: the decorators' per-call knobs (``failure_threshold``,
            ``recovery_timeout`` in seconds, ``ignore_exceptions``...), for every breaker
            this adapter uses.

    Raises:
        ConfigError: a bad argument, naming it (nothing is created).
    """

    def __init__(
        self,
        service: Any = None,
        *,
        retry: Any = None,
        fallback: Any = None,
        adapter: BaseAdapter | None = None,
        max_hosts: int | None = None,
        **overrides: Any,
    ) -> None:
        super().__init__()
        if adapter is not None and not callable(getattr(adapter, "send", None)):
            raise ConfigError(f"BreakerAdapter(adapter={adapter!r}): expected a requests transport adapter")
        self._breakers = Breakers("BreakerAdapter", service, retry, fallback, overrides, max_hosts=max_hosts)
        self._adapter: BaseAdapter = HTTPAdapter() if adapter is None else adapter

    @property
    def adapter(self) -> BaseAdapter:
        """The wrapped adapter."""
        return self._adapter

    def breaker_name(self, request: PreparedRequest) -> str:
        """The name of the breaker *request* goes through.

        Raises:
            ConfigError: a host-less URL, or a service callable that raised or returned
                something other than a non-empty string.
        """
        url = request.url or ""
        scheme, _, rest = url.partition("://")
        # the authority, up to the first "/", "?" or "#" (the parsed URL is cached by it)
        authority = rest.partition("/")[0].partition("?")[0].partition("#")[0]
        return self._breakers.named(request, (scheme, authority), lambda: _url_parts(request))

    def send(
        self,
        request: PreparedRequest,
        stream: bool = False,
        timeout: Any = None,
        verify: Any = True,
        cert: Any = None,
        proxies: Any = None,
    ) -> Response:
        """Send *request* through its breaker and the wrapped adapter.

        Args:
            request: the prepared request.
            stream: passed to the wrapped adapter unchanged, like the next four.
            timeout: seconds (or a ``(connect, read)`` pair), or None; bounds a half-open
                trial's lease in a shared store (their sum plus a second), each attempt at
                most the time a deadline leaves; no deadline: a retry sequence ends within it.
            verify: TLS verification (bool or a CA bundle path).
            cert: the client certificate, or None.
            proxies: scheme -> proxy URL, or None.

        Returns:
            The wrapped adapter's response, unchanged (body unread), or the fallback's value.

        Raises:
            CircuitOpenRequestError: the breaker refused (no fallback); nothing was sent.
            RateLimitCooldownRequestError: a cooldown outlasted the retry stage's wait.
            DeadlineExceededError: the deadline passed before an attempt; nothing was sent.
            ConfigError: no breaker can be named for the request; nothing was sent.
            requests.RequestException: the wrapped adapter's own error, unchanged.
        """
        breakers = self._breakers
        name = self.breaker_name(request)
        entry = breakers.entry(name)
        route = breakers.route(entry, request.method, isinstance(request.body, _REPLAYABLE))
        options = {"stream": stream, "timeout": timeout, "verify": verify, "cert": cert, "proxies": proxies}
        attempt = _attempts(self._adapter, request, options)
        fallback = breakers.fallback
        bounds = breakers.enter_bounds(route, timeout)  # a trial's lease and the retries follow it
        try:
            if fallback is None:
                return route.run(attempt)  # type: ignore[no-any-return]
            return route.run_fallback(attempt, lambda: fallback(request))  # type: ignore[no-any-return]
        except NotAnOutcome as carried:
            error: Exception = carried.error
        except CircuitOpenError as refusal:
            if type(refusal) is not CircuitOpenError:
                raise
            raise CircuitOpenRequestError(
                refusal.service, refusal.reason, refusal.retry_after, request=request
            ) from None
        except RateLimitCooldownError as refusal:
            if type(refusal) is not RateLimitCooldownError:
                raise
            raise RateLimitCooldownRequestError(
                refusal.service, refusal.remaining, refusal.reason, request=request
            ) from refusal.__cause__
        finally:
            breakers.leave_bounds(bounds)
        raise error

    def close(self) -> None:
        """Close the wrapped adapter (its connection pools)."""
        self._adapter.close()

    def __getattr__(self, name: str) -> Any:
        # everything else is the wrapped adapter's: poolmanager, max_retries,
        # proxy_manager, init_poolmanager(), cert_verify()...
        if name.startswith("__") or name in ("_adapter", "_breakers"):
            raise AttributeError(name)
        return getattr(self._adapter, name)

    def __repr__(self) -> str:
        service = self._breakers.service
        return f"<BreakerAdapter service={'per host' if service is None else service!r} adapter={self._adapter!r}>"


def _attempts(adapter: BaseAdapter, request: PreparedRequest, options: dict[str, Any]) -> Callable[[], Response]:
    """One attempt of *request* through *adapter*, as often as the retry stage calls it."""
    previous: list[Response] = []

    def attempt() -> Response:
        # a failure response that the retry stage sends again is closed first: its
        # pooled connection is released, and nobody else will ever read it
        while previous:
            previous.pop().close()
        timeout = options["timeout"]
        clipped = clipped_timeout(timeout)  # never past the deadline, if any
        try:
            if clipped is timeout:
                response = adapter.send(request, **options)
            else:
                response = adapter.send(request, **{**options, "timeout": clipped})
        except _CLIENT_ERRORS as exc:
            raise NotAnOutcome(exc) from None
        previous.append(response)
        return response

    return attempt

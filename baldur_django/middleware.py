"""Django middlewares of the inbound side (IN-1..IN-4).

``CircuitBreakerMiddleware`` files every response against the breaker of the request
path's domain; ``RateLimitMiddleware`` is the package's own fixed-window limiter. Both
are sync- and async-capable (``sync_capable = async_capable = True``), so Django runs
them in whichever mode the chain around them has and never adapts the chain for them.

Suggested order in ``MIDDLEWARE``: ``CircuitBreakerMiddleware`` near the top (it sees
what the whole stack answered, including the 500 Django makes of a view exception), then
Django's own middleware, then ``RateLimitMiddleware`` after ``AuthenticationMiddleware``
(its ``user`` key needs ``request.user``).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from typing import Any

from asgiref.sync import iscoroutinefunction, markcoroutinefunction, sync_to_async

from .conf import baldur_settings
from .core.breaker import CircuitBreaker, Permit
from .core.classify import RATE_LIMITED, SUCCESS, retry_after_of
from .core.errors import CircuitOpenError
from .core.hotpath import aacquire, asettle
from .core.marks import is_marked, mark_rate_limited
from .core.registry import registry
from .core.runner import settle_status
from .limiter import LIMIT_HEADER, MODE_HEADER, RateLimiter, rate_limited_response

__all__ = [
    "CircuitBreakerMiddleware",
    "RateLimitMiddleware",
    "SHED_HEADER",
    "domain_for",
    "is_shed",
    "own_rate_limit",
    "record_response",
    "shed_response",
]

#: Header on the 503 the circuit-breaker middleware answers with while shedding load;
#: its value is the denial reason (``open``, ``half_open_full``, ``frozen``).
SHED_HEADER = "X-Baldur-Shed"


# ------------------------------------------------------------------ domain mapping
#: Most paths remembered by :func:`domain_for` before its memo starts over.
MEMO_SIZE = 4096
#: Longer paths are matched every time, never remembered (bounds the memo's memory).
MEMO_PATH_LENGTH = 200


class _Routes:
    """``BALDUR_DOMAIN_MAPPING`` sorted once per settings version (CFG-2), plus a bounded
    memo of path -> domain (a memo entry holds a name from the settings, never a new one)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # (settings version, ((substring, domain), ...) longest first, default domain, memo)
        self._table: tuple[int, tuple[tuple[str, str], ...], str, dict[str, str]] = (-1, (), "default", {})

    def domain(self, path: str) -> str:
        version, entries, default, memo = self._table
        current = baldur_settings.version
        if version != current:
            with self._lock:
                mapping = baldur_settings.get("BALDUR_DOMAIN_MAPPING")
                default = baldur_settings.get("BALDUR_DOMAIN_DEFAULT")
                ordered = sorted(enumerate(mapping.items()), key=lambda item: (-len(item[1][0]), item[0]))
                entries = tuple(pair for _, pair in ordered)
                memo = {}
                self._table = (current, entries, default, memo)
        found = memo.get(path)
        if found is not None:
            return found
        found = default
        for substring, domain in entries:
            if substring in path:
                found = domain
                break
        if len(path) <= MEMO_PATH_LENGTH:
            if len(memo) >= MEMO_SIZE:
                memo.clear()
            memo[path] = found
        return found


_routes = _Routes()


def domain_for(path: str) -> str:
    """The domain (breaker name) of a request path (IN-1).

    The longest ``BALDUR_DOMAIN_MAPPING`` key that occurs in *path* wins; among keys of
    equal length the one listed first wins; no match gives ``BALDUR_DOMAIN_DEFAULT``.
    Only names from those two settings can come back, so no request can make up a new
    breaker name.

    Args:
        path: the request path (``request.path``).

    Raises:
        ConfigError: either setting is invalid.
    """
    return _routes.domain(path)


# ------------------------------------------------------------- recording outcomes
def _header(response: Any, name: str) -> Any:
    headers = getattr(response, "headers", None)
    if headers is None:
        return None
    try:
        return headers.get(name)
    except Exception:
        return None


def own_rate_limit(request: Any, response: Any, *, mode_only: bool = False) -> bool:
    """Whether a rate-limit answer came from the application itself. Implements IN-3, IN-6.

    Call it only for a response whose status is a rate-limit status; it does not look
    at the status.

    Args:
        request: the request (None outside Django); a marked request counts as own
            (:func:`baldur_django.mark_rate_limited`).
        response: any object with a ``headers`` mapping.
        mode_only: look only at ``X-RateLimit-Mode`` (the Flask and ASGI middlewares),
            not at ``X-RateLimit-Limit`` or the request mark.

    Returns:
        bool: True when the answer carries ``X-RateLimit-Mode`` (or, unless *mode_only*,
        ``X-RateLimit-Limit`` or the request is marked).
    """
    if _header(response, MODE_HEADER) is not None:
        return True
    if mode_only:
        return False
    if _header(response, LIMIT_HEADER) is not None:
        return True
    return request is not None and is_marked(request)


def is_shed(response: Any) -> bool:
    """Whether *response* is the 503 this middleware answers with while shedding load (IN-1).

    Args:
        response: any object with a ``headers`` mapping.

    Returns:
        bool: True when it carries ``X-Baldur-Shed``.
    """
    return _header(response, SHED_HEADER) is not None


def record_response(breaker: CircuitBreaker, permit: Permit, request: Any, response: Any) -> str:
    """Classify *response* and record it on *breaker* against *permit* (IN-1..IN-3).

    A status on ``BALDUR_MIDDLEWARE_RATE_LIMIT_CODES`` records a failure that also
    feeds the 429 cascade and the cooldown (IN-2), unless the application produced it
    itself (``X-RateLimit-Mode`` / ``X-RateLimit-Limit`` header, or a marked request;
    IN-3): then nothing is recorded. A status on ``BALDUR_MIDDLEWARE_CB_STATUS_CODES``
    records a failure; any other status a success. The package's own load-shedding 503
    is never recorded. Only ``status_code`` and headers are read, never the body.

    Returns:
        ``"success"``, ``"failure"``, ``"rate_limited"`` or ``"ignored"``.
    """

    def own(kind: int, status: int | None) -> bool:
        if (kind != SUCCESS or status == 503) and is_shed(response):
            return True
        return (kind == RATE_LIMITED or status == 429) and own_rate_limit(request, response)

    status = getattr(response, "status_code", None)
    # Fast lane for the common answer: a plain int status on neither list, and neither 429
    # nor 503 (the two statuses whose own-answer headers are looked at), is a success.
    # settle_status() reaches the same record_success() after classifying the status and
    # asking own(); this skips that detour (and building its two closures) per request.
    if status.__class__ is int and status != 429 and status != 503:
        config = breaker.config
        if status not in config.failure_codes and status not in config.rate_limit_codes:
            breaker.record_success(permit)
            return "success"
    return settle_status(breaker, permit, status, lambda: retry_after_of(response), own)


def shed_response(error: CircuitOpenError) -> Any:
    """The 503 answered instead of running the view while load shedding is on (IN-1).

    ``Retry-After`` is the breaker's own estimate rounded up to whole seconds, at least
    1 (1 when unknown); the ``X-Baldur-Shed`` header names the reason and marks the
    answer as the package's own, so no Baldur layer counts it.
    """
    from django.http import HttpResponse

    wait = error.retry_after
    seconds = 1 if wait is None or not math.isfinite(wait) else max(1, math.ceil(wait))
    response = HttpResponse(
        "Service temporarily unavailable: this part of the site is paused to let a failing dependency recover.\n",
        status=503,
        content_type="text/plain; charset=utf-8",
    )
    response.headers["Retry-After"] = str(seconds)
    response.headers[SHED_HEADER] = str(error.reason)
    return response


class CircuitBreakerMiddleware:
    """Files every response against the breaker of the request path's domain (IN-1..IN-3).

    Before the view runs the domain's breaker is asked for admission. When it refuses
    (OPEN, or HALF_OPEN with every trial taken) the request still goes through and its
    response is not recorded, unless ``BALDUR_MIDDLEWARE_SHED_LOAD`` is on: then the view
    is skipped and a 503 with ``Retry-After`` is answered, which is never counted.

    After the view, the response is classified by :func:`record_response`. A view
    exception arrives here as the 500 response Django's handler made of it, so it is
    counted once. Streaming responses are classified by status only; their content is
    never read, buffered or wrapped.

    Args:
        get_response: the next handler in Django's chain (sync or async).

    Settings: ``BALDUR_DOMAIN_MAPPING``, ``BALDUR_DOMAIN_DEFAULT``,
    ``BALDUR_MIDDLEWARE_SHED_LOAD``, ``BALDUR_MIDDLEWARE_CB_STATUS_CODES``,
    ``BALDUR_MIDDLEWARE_RATE_LIMIT_CODES`` (read per request, so ``override_settings``
    applies at once).
    """

    sync_capable = True
    async_capable = True

    def __init__(self, get_response: Callable[[Any], Any]) -> None:
        if get_response is None:
            raise ValueError("CircuitBreakerMiddleware needs get_response")
        self.get_response = get_response
        self.async_mode = iscoroutinefunction(get_response)
        if self.async_mode:
            markcoroutinefunction(self)

    def _admit(self, request: Any) -> tuple[CircuitBreaker, Permit | None, Any]:
        breaker = registry.get(domain_for(request.path))
        assert breaker is not None
        try:
            return breaker, breaker.acquire(), None
        except CircuitOpenError as exc:
            return breaker, None, self._refused(exc)

    @staticmethod
    def _refused(error: CircuitOpenError) -> Any:
        return shed_response(error) if baldur_settings.get("BALDUR_MIDDLEWARE_SHED_LOAD") else None

    def __call__(self, request: Any) -> Any:
        if self.async_mode:
            return self.__acall__(request)
        breaker, permit, early = self._admit(request)
        if early is not None:
            return early
        if permit is None:
            return self.get_response(request)
        try:
            response = self.get_response(request)
        except BaseException:
            # Django turns exceptions into responses below us; whatever still escapes
            # (KeyboardInterrupt, a broken handler) gives a trial slot back uncounted.
            breaker.record_ignored(permit)
            raise
        record_response(breaker, permit, request, response)
        return response

    async def __acall__(self, request: Any) -> Any:
        # a shared store's round trips (a due consult, a probe, a trial's outcome) run in a
        # worker thread: the event loop never waits on store I/O (ST-2)
        breaker = registry.get(domain_for(request.path))
        assert breaker is not None
        try:
            permit = await aacquire(breaker)
        except CircuitOpenError as exc:
            early = self._refused(exc)
            return early if early is not None else await self.get_response(request)
        try:
            response = await self.get_response(request)
        except BaseException:  # CancelledError: the client went away
            await asettle(breaker, permit, breaker.record_ignored, permit)
            raise
        await asettle(breaker, permit, record_response, breaker, permit, request, response)
        return response


# ---------------------------------------------------------------------- limiter
class RateLimitMiddleware:
    """The package's own inbound rate limiter (IN-4), see :class:`~baldur_django.limiter.RateLimiter`.

    Rules come from ``BALDUR_RATE_LIMIT_RULES`` (``{"path": substring, "rate": "N/s|m|h",
    "key": "ip" | "user" | dotted path}``); counters live in the cache
    ``BALDUR_RATE_LIMIT_CACHE_ALIAS``. A refused request gets a 429 with ``Retry-After``,
    ``X-RateLimit-Limit``, ``X-RateLimit-Remaining`` and ``X-RateLimit-Mode`` and is
    marked (:func:`baldur_django.mark_rate_limited`), so the circuit-breaker middleware
    never counts it (IN-3). Admitted responses get no rate-limit headers: a 429 relayed
    from upstream through an admitted request must still count.

    Args:
        get_response: the next handler in Django's chain (sync or async).
        limiter: the :class:`RateLimiter` to use (tests inject one with a fake clock).

    Raises:
        ConfigError: on a request, when ``BALDUR_RATE_LIMIT_RULES`` is invalid or a key
            function cannot be imported (the system checks report it at startup).
    """

    sync_capable = True
    async_capable = True

    def __init__(self, get_response: Callable[[Any], Any], limiter: RateLimiter | None = None) -> None:
        if get_response is None:
            raise ValueError("RateLimitMiddleware needs get_response")
        self.get_response = get_response
        self.limiter = limiter if limiter is not None else RateLimiter()
        self.async_mode = iscoroutinefunction(get_response)
        if self.async_mode:
            markcoroutinefunction(self)

    def _refuse(self, request: Any, refusal: Any) -> Any:
        mark_rate_limited(request)
        return rate_limited_response(refusal)

    def __call__(self, request: Any) -> Any:
        if self.async_mode:
            return self.__acall__(request)
        rules = self.limiter.matching(request.path)
        if rules:
            refusal = self.limiter.check(request, rules)
            if refusal is not None:
                return self._refuse(request, refusal)
        return self.get_response(request)

    async def __acall__(self, request: Any) -> Any:
        rules = self.limiter.matching(request.path)
        if rules:
            # Cache calls block, so they run in a worker thread. A "user" or custom key may
            # touch the ORM (a lazy request.user), which must run in the thread Django
            # keeps for it; plain "ip" keys need no database and run in parallel.
            main_thread = any(rule.key != "ip" for rule in rules)
            refusal = await sync_to_async(self.limiter.check, thread_sensitive=main_thread)(request, rules)
            if refusal is not None:
                return self._refuse(request, refusal)
        return await self.get_response(request)

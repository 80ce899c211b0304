"""Django middlewares of the inbound side.

``CircuitBreakerMiddleware`` files every response against the breaker of the request
path's domain; ``RateLimitMiddleware`` is the package's own fixed-window limiter;
``RequestDeadlineMiddleware`` gives each request a deadline that every protected call
made while serving it respects. All three are sync- and async-capable (``sync_capable = async_capable = True``), so Django runs
them in whichever mode the chain around them has and never adapts the chain for them.

Suggested order in ``MIDDLEWARE``: ``CircuitBreakerMiddleware`` near the top (it sees
what the whole stack answered, including the 500 Django makes of a view exception), then
Django's own middleware, then ``RateLimitMiddleware`` after ``AuthenticationMiddleware``
(its ``user`` key needs ``request.user``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from asgiref.sync import iscoroutinefunction, markcoroutinefunction, sync_to_async

from .core import inbound
from .core.breaker import CircuitBreaker, Permit
from .core.classify import RATE_LIMITED
from .core.clock import SYSTEM_CLOCK, Clock
from .core.config import settings as baldur_settings
from .core.errors import CircuitOpenError
from .core.inbound import SHED_HEADER, ShedAnswer, aserve, record, serve
from .core.inbound import domain_for as domain_for
from .core.log import log_event
from .core.marks import mark_rate_limited
from .core.stages.deadline import enter, header_seconds, leave, request_seconds
from .limiter import RateLimiter, rate_limited_response

__all__ = [
    "CircuitBreakerMiddleware",
    "RateLimitMiddleware",
    "RequestDeadlineMiddleware",
    "SHED_HEADER",
    "domain_for",
    "is_shed",
    "own_rate_limit",
    "record_response",
    "shed_response",
]

# ``domain_for`` and ``SHED_HEADER`` live in the core inbound policy
# (``baldur_django.core.inbound``), shared with the ASGI and Flask shells.


# ------------------------------------------------------------- recording outcomes
def own_rate_limit(request: Any, response: Any) -> bool:
    """Whether a rate-limit answer came from the application itself.

    Call it only for a response whose status is a rate-limit status; it does not look
    at the status. The same rule as every inbound shell's (``core.inbound.own_answer``).

    Args:
        request: the request (or None); a marked request counts as own
            (:func:`baldur_django.mark_rate_limited`).
        response: any object with a ``headers`` mapping.

    Returns:
        bool: True when the answer carries ``X-RateLimit-Mode`` or ``X-RateLimit-Limit``,
        or the request is marked.
    """
    return inbound.own_answer(RATE_LIMITED, 429, _headers(response), request)


def is_shed(response: Any) -> bool:
    """Whether *response* is the 503 the package answers with while shedding load.

    Args:
        response: any object with a ``headers`` mapping.

    Returns:
        bool: True when it carries ``X-Baldur-Shed``.
    """
    return _headers(response).get(SHED_HEADER) is not None


class _NoHeaders:
    @staticmethod
    def get(name: str) -> Any:
        return None


_NO_HEADERS = _NoHeaders()


def _headers(response: Any) -> Any:
    headers = getattr(response, "headers", None)
    return _NO_HEADERS if headers is None else headers


def record_response(breaker: CircuitBreaker, permit: Permit, request: Any, response: Any) -> str:
    """Classify *response* and record it on *breaker* against *permit*.

    The rules are the inbound policy's (:func:`baldur_django.core.inbound.record`): a
    status on ``BALDUR_MIDDLEWARE_RATE_LIMIT_CODES`` records a failure that also feeds the
    429 cascade and the cooldown, unless the application produced it itself
    (``X-RateLimit-Mode`` / ``X-RateLimit-Limit`` header, or a marked request); a
    status on ``BALDUR_MIDDLEWARE_CB_STATUS_CODES`` records a failure; any other status a
    success. The package's own load-shedding 503 is never recorded. Only
    ``status_code`` and headers are read, never the body.

    Args:
        breaker: the domain's breaker.
        permit: from ``breaker.acquire()``.
        request: the request (for its mark), or None.
        response: the response (``status_code`` and ``headers``).

    Returns:
        str: ``"success"``, ``"failure"``, ``"rate_limited"`` or ``"ignored"``.
    """
    return record(breaker, permit, getattr(response, "status_code", None), _headers(response), request)


def shed_response(error: CircuitOpenError | ShedAnswer) -> Any:
    """The 503 answered instead of running the view while load shedding is on.

    ``Retry-After`` is the breaker's own estimate rounded up to whole seconds, at least
    1 (1 when unknown); the ``X-Baldur-Shed`` header names the reason and marks the
    answer as the package's own, so no Baldur layer counts it.

    Args:
        error: the refusal, or the policy's :class:`~baldur_django.core.inbound.ShedAnswer`.

    Returns:
        django.http.HttpResponse: the 503.
    """
    from django.http import HttpResponse

    answer = error if isinstance(error, ShedAnswer) else inbound.shed_answer(error)
    response = HttpResponse(answer.body, status=answer.status)
    for name, value in answer.headers:
        response.headers[name] = value
    return response


class CircuitBreakerMiddleware:
    """Files every response against the breaker of the request path's domain.

    A thin shell over the inbound policy (:mod:`baldur_django.core.inbound`), the
    one the ASGI and Flask shells use. Before the view runs the domain's breaker is
    asked for admission. When it refuses (OPEN, or HALF_OPEN with every trial taken) the
    request still goes through and its response is not recorded, unless
    ``BALDUR_MIDDLEWARE_SHED_LOAD`` is on: then the view is skipped and a 503 with
    ``Retry-After`` is answered, which is never counted.

    After the view, the response is classified by :func:`record_response`. A view
    exception arrives here as the 500 response Django's handler made of it, so it is
    counted once. Streaming responses are classified by status only; their content is
    never read, buffered or wrapped. In async mode every store operation (a due
    consult, a probe, a trial's outcome) runs in a worker thread.

    Args:
        get_response: the next handler in Django's chain (sync or async).

    Raises:
        ValueError: *get_response* is None.

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

    def __call__(self, request: Any) -> Any:
        # Django turns view exceptions into responses below us; whatever still escapes
        # is one failure (an Exception) or gives the permit back (anything else).
        if self.async_mode:
            return aserve(request.path, self.get_response, request, shed_response)  # Django awaits it
        return serve(request.path, self.get_response, request, shed_response)

    async def __acall__(self, request: Any) -> Any:
        """The async form (Django's naming, as ``MiddlewareMixin``); ``__call__`` returns
        the same coroutine in async mode."""
        return await aserve(request.path, self.get_response, request, shed_response)


# ---------------------------------------------------------------------- limiter
class RateLimitMiddleware:
    """The package's own inbound rate limiter, see :class:`~baldur_django.limiter.RateLimiter`.

    Rules come from ``BALDUR_RATE_LIMIT_RULES`` (``{"path": substring, "rate": "N/s|m|h",
    "key": "ip" | "user" | dotted path}``); counters live in the cache
    ``BALDUR_RATE_LIMIT_CACHE_ALIAS``. A refused request gets a 429 with ``Retry-After``,
    ``X-RateLimit-Limit``, ``X-RateLimit-Remaining`` and ``X-RateLimit-Mode`` and is
    marked (:func:`baldur_django.mark_rate_limited`), so the circuit-breaker middleware
    never counts it. Admitted responses get no rate-limit headers: a 429 relayed
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


# -------------------------------------------------------------------- deadlines
class RequestDeadlineMiddleware:
    """Gives each request a deadline: every protected call made while it is served gets at
    most the time left (its retries, backoffs and cooldown waits stop there; an attempt
    that would start after it is refused with ``DeadlineExceededError``).

    The deadline is ``BALDUR_REQUEST_DEADLINE_SECONDS`` from the request's arrival, or the
    seconds in the request header named by ``BALDUR_REQUEST_DEADLINE_HEADER`` (capped by
    the first setting when both are set). A header value that is not a positive number is
    ignored, and logged once per process (``circuit_breaker.deadline_header_ignored``).
    Neither setting set: the request has no deadline of its own. Put it near the top of
    ``MIDDLEWARE``; the deadline lives in a context variable, so it follows the request
    into ``sync_to_async`` threads and asyncio tasks.

    Args:
        get_response: the next handler in Django's chain (sync or async).
        clock: the clock the deadline is read on (tests pass a fake one).

    Raises:
        ValueError: *get_response* is None.
        ConfigError: on a request, when one of the two settings is invalid.
    """

    sync_capable = True
    async_capable = True
    _warned = threading.Event()  # one log line per process for a bad header value

    def __init__(self, get_response: Callable[[Any], Any], clock: Clock | None = None) -> None:
        if get_response is None:
            raise ValueError("RequestDeadlineMiddleware needs get_response")
        self.get_response = get_response
        self.clock = clock or SYSTEM_CLOCK
        self.async_mode = iscoroutinefunction(get_response)
        if self.async_mode:
            markcoroutinefunction(self)

    def seconds(self, request: Any) -> float | None:
        """The deadline of *request*, seconds from now, or None for none."""
        setting = baldur_settings.get("BALDUR_REQUEST_DEADLINE_SECONDS")
        name = baldur_settings.get("BALDUR_REQUEST_DEADLINE_HEADER")
        header = None
        if name is not None:
            raw = request.headers.get(name)
            if raw is not None:
                header = header_seconds(raw)
                if header is None and not self._warned.is_set():
                    self._warned.set()
                    log_event(
                        logging.WARNING,
                        "circuit_breaker.deadline_header_ignored",
                        None,
                        "header=%s value=%r: not a positive number of seconds (logged once)",
                        name,
                        str(raw)[:100],
                    )
        return request_seconds(setting, header)

    def __call__(self, request: Any) -> Any:
        if self.async_mode:
            return self.__acall__(request)
        seconds = self.seconds(request)
        if seconds is None:
            return self.get_response(request)
        token = enter(seconds, self.clock)
        try:
            return self.get_response(request)
        finally:
            leave(token)

    async def __acall__(self, request: Any) -> Any:
        seconds = self.seconds(request)
        if seconds is None:
            return await self.get_response(request)
        token = enter(seconds, self.clock)
        try:
            return await self.get_response(request)
        finally:
            leave(token)

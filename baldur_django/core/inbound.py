"""The inbound policy: admission and recording for any web framework.

Django's ``CircuitBreakerMiddleware`` (sync and async), the bare ASGI middleware
(``contrib/asgi.py``) and the Flask extension (``contrib/flask.py``) are thin shells over
this module: each turns its framework's request and response into the few values read
here (a breaker, a status, a headers object, the request for its mark) and renders the
load-shedding answer in its framework's own type. What counts, what is left out and what
the package answers itself is decided here, once:

* **Admission** (:func:`admit`, :func:`aadmit`): the breaker is asked for a permit. A
  refusal (OPEN, HALF_OPEN with its trials taken, held OPEN by Level 3) lets the request
  run unrecorded, or, with ``BALDUR_MIDDLEWARE_SHED_LOAD`` on, returns a :class:`ShedAnswer`:
  a 503 with ``Retry-After`` (whole seconds, at least 1) and ``X-Baldur-Shed`` naming the
  reason.
* **Recording** (:func:`record`, :func:`arecord`): a status on the breaker's rate-limit
  list is a failure that feeds the 429 cascade and the cooldown (``Retry-After``
  honoured); a status on its failure list is a failure; anything else a success. Never
  counted: the package's own 503 (a failure or 503 status carrying ``X-Baldur-Shed``) and
  the application's own 429s (a rate-limit or 429 status carrying ``X-RateLimit-Mode`` or
  ``X-RateLimit-Limit``, or from a request marked with
  :func:`baldur_django.mark_rate_limited`).
* **Exceptions** (:func:`record_exception`, :func:`arecord_exception`): an ``Exception``
  that escapes the application before it answered is one failure; anything else
  (``CancelledError``, ``KeyboardInterrupt``) gives the permit back uncounted, as does an
  application that answered nothing (:func:`release`).

The async forms never run store I/O on the event loop: a shared breaker's admission that
may consult its store (first use, a due consult, a probe) and a trial's outcome (a store
write) run in a worker thread (``asyncio.to_thread``, through ``core/hotpath``'s
``aacquire``/``asettle``); the CLOSED lock-free permit and a process-local breaker's
bookkeeping stay inline. A trip decided on the loop's thread is written to the store from
the default executor (see ``core/hotpath``).

For frameworks whose handler returns a response object (Django), :func:`serve` and
:func:`aserve` do all of it in one frame: find the domain's breaker, admit, run the
handler, record. They apply exactly the rules above (the plain-success lane inline, every
other answer through :func:`record`) and exist because this runs on every request.

Domains: :func:`breaker_for` maps a request path to its breaker through
``BALDUR_DOMAIN_MAPPING`` (longest matching substring, ties by mapping order) or
``BALDUR_DOMAIN_DEFAULT``; only names from those settings can come back, so no request can
create a breaker. The answer is remembered per path (bounded), and forgotten when a setting
changes or the registry is cleared.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from .breaker import CircuitBreaker, Permit, core_of
from .classify import RATE_LIMITED, SUCCESS, classify_status
from .config import settings
from .errors import CircuitOpenError, ConfigError
from .hotpath import asettle
from .marks import is_marked
from .registry import registry

__all__ = [
    "SHED_HEADER",
    "MODE_HEADER",
    "LIMIT_HEADER",
    "SHED_BODY",
    "Headers",
    "ShedAnswer",
    "admit",
    "aadmit",
    "refused",
    "shed_answer",
    "record",
    "arecord",
    "record_exception",
    "arecord_exception",
    "release",
    "arelease",
    "own_answer",
    "breaker_for",
    "domain_for",
    "serve",
    "aserve",
]

#: Header on the package's own load-shedding 503; its value is the refusal reason
#: (``open``, ``half_open_full``, ``frozen``).
SHED_HEADER = "X-Baldur-Shed"
#: Header on the package's own 429s (``RateLimitMiddleware``); other limiters set it too.
MODE_HEADER = "X-RateLimit-Mode"
#: Header of a rate-limit answer the application produced itself.
LIMIT_HEADER = "X-RateLimit-Limit"
#: Body of the load-shedding 503 (plain text, UTF-8).
SHED_BODY = b"Service temporarily unavailable: this part of the site is paused to let a failing dependency recover.\n"
SHED_CONTENT_TYPE = "text/plain; charset=utf-8"

# outcomes, as the record functions return them
SUCCESS_OUTCOME = "success"
FAILURE_OUTCOME = "failure"
RATE_LIMITED_OUTCOME = "rate_limited"
IGNORED_OUTCOME = "ignored"


class Headers(Protocol):
    """What the policy reads of a response's headers: a case-insensitive ``get``
    (Django's ``HttpResponse.headers``, Werkzeug's ``Headers``, ``contrib.asgi``'s view of
    the raw ASGI list)."""

    def get(self, name: str, /) -> Any: ...  # pragma: no cover - a protocol


class ShedAnswer:
    """The 503 a shell answers instead of running the application while load shedding is on.

    Attributes:
        status (int): 503.
        reason (str): the refusal reason (``open``, ``half_open_full``, ``frozen``).
        retry_after (int): whole seconds until admission may return, at least 1.
        headers (tuple[tuple[str, str], ...]): ``Retry-After``, ``X-Baldur-Shed`` and
            ``Content-Type``, in that order.
        body (bytes): a short plain-text explanation.
    """

    __slots__ = ("status", "reason", "retry_after", "headers", "body")

    def __init__(self, reason: str, retry_after: int) -> None:
        self.status = 503
        self.reason = reason
        self.retry_after = retry_after
        self.headers = (
            ("Retry-After", str(retry_after)),
            (SHED_HEADER, reason),
            ("Content-Type", SHED_CONTENT_TYPE),
        )
        self.body = SHED_BODY

    def __repr__(self) -> str:
        return f"ShedAnswer(reason={self.reason!r}, retry_after={self.retry_after})"


# ------------------------------------------------------------------ admission
def shed_answer(error: CircuitOpenError) -> ShedAnswer:
    """The load-shedding answer for a refusal.

    Args:
        error: the refusal raised by ``breaker.acquire()``; its ``retry_after`` (seconds,
            or None when unknown) is rounded up to whole seconds, at least 1.

    Returns:
        ShedAnswer: the 503 to send.
    """
    wait = error.retry_after
    seconds = 1 if wait is None or not math.isfinite(wait) else max(1, math.ceil(wait))
    return ShedAnswer(str(error.reason), seconds)


def refused(error: CircuitOpenError) -> ShedAnswer | None:
    """What a shell does with a refused request: None lets it run unrecorded; a
    :class:`ShedAnswer` when ``BALDUR_MIDDLEWARE_SHED_LOAD`` is on.

    Args:
        error: the refusal raised by ``breaker.acquire()``.

    Raises:
        ConfigError: ``BALDUR_MIDDLEWARE_SHED_LOAD`` is invalid.
    """
    return shed_answer(error) if settings.get("BALDUR_MIDDLEWARE_SHED_LOAD") else None


def admit(breaker: CircuitBreaker) -> Permit | ShedAnswer | None:
    """Ask *breaker* to admit one inbound request.

    Args:
        breaker: the domain's (or service's) breaker.

    Returns:
        A :class:`Permit` (run the request, then :func:`record` its response); a
        :class:`ShedAnswer` (answer it instead of running the request); or None (run the
        request and record nothing).

    Raises:
        ConfigError: ``BALDUR_MIDDLEWARE_SHED_LOAD`` is invalid (only on a refusal).
    """
    try:
        return breaker.acquire()
    except CircuitOpenError as error:
        return refused(error)


async def aadmit(breaker: CircuitBreaker) -> Permit | ShedAnswer | None:
    """:func:`admit` for a coroutine: a shared breaker's admission that may reach its store
    runs in a worker thread, so the event loop never waits on store I/O.

    Args:
        breaker: the domain's (or service's) breaker.

    Returns:
        As :func:`admit`.

    Raises:
        ConfigError: as :func:`admit`.
    """
    try:
        return await breaker.aacquire()
    except CircuitOpenError as error:
        return refused(error)


# ------------------------------------------------------------------ recording
def own_answer(kind: int, status: int | None, headers: Headers, request: Any) -> bool:
    """Whether a response is the package's or the application's own answer, never counted.

    Args:
        kind: the status's classification (``core.classify``'s ``SUCCESS``, ``FAILURE``
            or ``RATE_LIMITED``).
        status: the integer status, or None.
        headers: the response's headers (case-insensitive ``get``).
        request: the request, for its mark (:func:`baldur_django.mark_rate_limited`), or
            None.

    Returns:
        bool: True for the load-shedding 503 (``X-Baldur-Shed`` on a failure or 503
        status) and for the application's own 429s (``X-RateLimit-Mode`` or
        ``X-RateLimit-Limit`` on a rate-limit or 429 status, or a marked request).
    """
    if (kind != SUCCESS or status == 503) and _header(headers, SHED_HEADER) is not None:
        return True
    if kind == RATE_LIMITED or status == 429:
        if _header(headers, MODE_HEADER) is not None or _header(headers, LIMIT_HEADER) is not None:
            return True
        return request is not None and is_marked(request)
    return False


def _header(headers: Headers, name: str) -> Any:
    try:
        return headers.get(name)
    except Exception:  # a headers object that cannot answer is read as "absent"
        return None


def record(breaker: CircuitBreaker, permit: Permit, status: Any, headers: Headers, request: Any = None) -> str:
    """Classify one response and record it on *breaker* against *permit*.

    Only the status and, for a failure, 429 or 503 status, the headers are read; never
    the body (streaming is unaffected).

    Args:
        breaker: the breaker that admitted the request.
        permit: from :func:`admit`.
        status: the integer HTTP status (anything else reads as no status: a success).
        headers: the response's headers (case-insensitive ``get``).
        request: the request, for its mark, or None.

    Returns:
        str: ``"success"``, ``"failure"``, ``"rate_limited"`` or ``"ignored"``.
    """
    # The common answer: a plain int status on neither list, neither 429 nor 503 (the two
    # statuses whose own-answer headers are read even off the lists), is a success.
    if status.__class__ is int and status != 429 and status != 503:
        config = breaker.config
        if status not in config.failure_codes and status not in config.rate_limit_codes:
            breaker.record_success(permit)
            return SUCCESS_OUTCOME
    code = status if isinstance(status, int) and not isinstance(status, bool) else None
    config = breaker.config
    kind = classify_status(code, config.failure_codes, config.rate_limit_codes)
    if own_answer(kind, code, headers, request):
        breaker.record_ignored(permit)
        return IGNORED_OUTCOME
    if kind == SUCCESS:
        breaker.record_success(permit)
        return SUCCESS_OUTCOME
    if kind == RATE_LIMITED:
        breaker.record_failure(permit, rate_limited=True, retry_after=_header(headers, "Retry-After"))
        return RATE_LIMITED_OUTCOME
    breaker.record_failure(permit)
    return FAILURE_OUTCOME


async def arecord(breaker: CircuitBreaker, permit: Permit, status: Any, headers: Headers, request: Any = None) -> str:
    """:func:`record` for a coroutine: a trial's outcome (a shared store's write) runs in a
    worker thread, everything else inline (no I/O; a trip's store write goes to the
    default executor).

    Returns:
        str: as :func:`record`.
    """
    if permit.trial:
        return str(await asettle(core_of(breaker), permit, record, breaker, permit, status, headers, request))
    return record(breaker, permit, status, headers, request)


def record_exception(breaker: CircuitBreaker, permit: Permit, error: BaseException) -> str:
    """Record an exception that escaped the application before it answered.

    Args:
        breaker: the breaker that admitted the request.
        permit: from :func:`admit`.
        error: the exception.

    Returns:
        str: ``"failure"`` for an ``Exception`` (counted once); ``"ignored"`` for any
        other ``BaseException`` (the client went away, an interrupt): the permit, a trial
        slot included, is given back uncounted.
    """
    if isinstance(error, Exception):
        breaker.record_failure(permit)
        return FAILURE_OUTCOME
    breaker.record_ignored(permit)
    return IGNORED_OUTCOME


async def arecord_exception(breaker: CircuitBreaker, permit: Permit, error: BaseException) -> str:
    """:func:`record_exception` for a coroutine (a trial's outcome off the loop).

    Returns:
        str: as :func:`record_exception`.
    """
    return str(await asettle(core_of(breaker), permit, record_exception, breaker, permit, error))


def release(breaker: CircuitBreaker, permit: Permit) -> None:
    """Give *permit* back uncounted: the application answered nothing.

    Args:
        breaker: the breaker that admitted the request.
        permit: from :func:`admit`.
    """
    breaker.record_ignored(permit)


async def arelease(breaker: CircuitBreaker, permit: Permit) -> None:
    """:func:`release` for a coroutine (a trial slot's store write off the loop)."""
    await asettle(core_of(breaker), permit, breaker.record_ignored, permit)


# -------------------------------------------------------------------- domains
#: Most paths remembered by :func:`breaker_for` before its memo starts over.
MEMO_SIZE = 4096
#: Longer paths are matched every time, never remembered (bounds the memo's memory).
MEMO_PATH_LENGTH = 200

_Table = tuple[int, tuple[tuple[str, str], ...], str, dict[str, CircuitBreaker]]

# (settings version, ((substring, domain), ...) longest first, default domain, path memo).
# A new settings version and registry.clear() each start a new table with a new
# memo; the old memo is never written again, so a request racing with the change cannot
# leave a stale entry behind. The memo holds only breakers named by the settings.
_table: _Table = (-1, (), "default", {})
_table_lock = threading.Lock()
# emptied by registry.clear() with the breakers: the next request starts a new table
_alive: dict[str, bool] = {}
registry.name_caches.append(_alive)


def _current() -> _Table:
    global _table
    table = _table
    version = settings.version
    if table[0] == version and _alive:
        return table
    with _table_lock:
        mapping = settings.get("BALDUR_DOMAIN_MAPPING")
        default = settings.get("BALDUR_DOMAIN_DEFAULT")
        ordered = sorted(enumerate(mapping.items()), key=lambda item: (-len(item[1][0]), item[0]))
        table = (version, tuple(pair for _, pair in ordered), default, {})
        _table = table
        _alive[""] = True
    return table


def domain_for(path: str) -> str:
    """The domain (breaker name) of a request path.

    The longest ``BALDUR_DOMAIN_MAPPING`` key that occurs in *path* wins; among keys of
    equal length the one listed first wins; no match gives ``BALDUR_DOMAIN_DEFAULT``.
    Only names from those two settings can come back, so no request can make up a new
    breaker name.

    Args:
        path: the request path.

    Returns:
        str: the breaker name.

    Raises:
        ConfigError: either setting is invalid.
    """
    _, entries, default, _ = _current()
    for substring, domain in entries:
        if substring in path:
            return domain
    return default


def _breaker_of(path: str) -> CircuitBreaker:
    _, entries, domain, memo = _current()
    for substring, name in entries:
        if substring in path:
            domain = name
            break
    breaker = registry.get(domain)
    assert breaker is not None
    if len(path) <= MEMO_PATH_LENGTH:
        if len(memo) >= MEMO_SIZE:
            memo.clear()
        memo[path] = breaker
    return breaker


_log = logging.getLogger("baldur.inbound")
_warned_version: list[int] = [-1]  # the settings version last warned about


def _lookup(path: str) -> CircuitBreaker | None:
    """The breaker of *path* (as :func:`_breaker_of`), or None when an inbound setting is
    invalid (a domain that is no valid breaker name, say): the request is then served
    without a breaker rather than lost, and a warning is logged once per settings version
    (the system checks report the setting at start)."""
    try:
        return _breaker_of(path)
    except ConfigError as exc:
        version = settings.version
        if _warned_version[0] != version:
            _warned_version[0] = version
            _log.warning(
                "baldur.inbound_unprotected: requests are served without a breaker until the setting is fixed: %s", exc
            )
        return None


def breaker_for(path: str) -> CircuitBreaker:
    """The breaker of a request path's domain: ``registry.get(domain_for(path))``,
    remembered per path (a bounded memo, started over when a setting changes or the
    registry is cleared).

    Args:
        path: the request path.

    Returns:
        CircuitBreaker: the domain's breaker (created on first use; only names from the
        settings, so no request can create a breaker of its own).

    Raises:
        ConfigError: ``BALDUR_DOMAIN_MAPPING`` or ``BALDUR_DOMAIN_DEFAULT`` is invalid.
    """
    table = _table
    if table[0] == settings.version and _alive:
        found = table[3].get(path)
        if found is not None:
            return found
    return _breaker_of(path)


# ------------------------------------------------- frameworks with response objects
def serve(
    path: str, handler: Callable[[Any], Any], request: Any, render: Callable[[ShedAnswer], Any] | None = None
) -> Any:
    """Run one request through its domain's breaker: admit, call *handler*, record.

    For frameworks whose handler returns a response object with ``status_code`` and
    ``headers`` (Django). The same rules as :func:`admit`, :func:`record` and
    :func:`record_exception`, in one frame (this runs on every request: the common
    answer, admitted and plain, costs one admission and one recorded success).

    Args:
        path: the request path (names the domain, :func:`breaker_for`).
        handler: ``handler(request) -> response``.
        request: the request, passed to *handler* and read for its mark.
        render: turns a :class:`ShedAnswer` into the framework's response; None returns
            the answer itself.

    Returns:
        The handler's response, or the rendered :class:`ShedAnswer` (the handler did not
        run).

    Raises:
        BaseException: whatever *handler* raises (an ``Exception`` counts once as a
        failure, anything else gives the permit back).

    An invalid inbound setting (``BALDUR_DOMAIN_MAPPING``, ``BALDUR_DOMAIN_DEFAULT``) does
    not fail the request: it is served without a breaker, and a warning is logged once.
    """
    table = _table
    breaker = table[3].get(path) if table[0] == settings.version and _alive else None
    if breaker is None:
        breaker = _lookup(path)
        if breaker is None:
            return handler(request)
    core = core_of(breaker)  # the per-request steps go to the breaker's core directly
    try:
        permit = core.acquire()
    except CircuitOpenError as error:
        answer = refused(error)
        if answer is None:
            return handler(request)
        return answer if render is None else render(answer)
    try:
        response = handler(request)
    except BaseException as error:
        record_exception(breaker, permit, error)
        raise
    status = response.status_code
    if status.__class__ is int and status != 429 and status != 503:
        config = core.config
        if status not in config.failure_codes and status not in config.rate_limit_codes:
            core.record_success(permit)
            return response
    record(breaker, permit, status, response.headers, request)
    return response


async def aserve(
    path: str,
    handler: Callable[[Any], Awaitable[Any]],
    request: Any,
    render: Callable[[ShedAnswer], Any] | None = None,
) -> Any:
    """:func:`serve` for an async handler: every store operation (a shared breaker's due
    consult, a probe, a trial's outcome) runs in a worker thread, never on the loop.

    Args:
        path: the request path.
        handler: ``await handler(request) -> response``.
        request: the request.
        render: as for :func:`serve`.

    Returns:
        As :func:`serve`.

    Raises:
        BaseException: as :func:`serve` (``CancelledError`` gives the permit back).
    """
    table = _table
    breaker = table[3].get(path) if table[0] == settings.version and _alive else None
    if breaker is None:
        breaker = _lookup(path)
        if breaker is None:
            return await handler(request)
    core = core_of(breaker)
    permit = core.ready_permit()  # the CLOSED lock-free permit: no coroutine to await
    if permit is None:
        try:
            permit = await core.aacquire()
        except CircuitOpenError as error:
            answer = refused(error)
            if answer is None:
                return await handler(request)
            return answer if render is None else render(answer)
    try:
        response = await handler(request)
    except BaseException as error:  # CancelledError: the client went away
        await arecord_exception(breaker, permit, error)
        raise
    status = response.status_code
    if permit.trial:  # a shared store's write: off the loop
        await asettle(core_of(breaker), permit, record, breaker, permit, status, response.headers, request)
        return response
    if status.__class__ is int and status != 429 and status != 503:
        config = core.config
        if status not in config.failure_codes and status not in config.rate_limit_codes:
            core.record_success(permit)
            return response
    record(breaker, permit, status, response.headers, request)  # no I/O: a trip's write goes to the executor
    return response

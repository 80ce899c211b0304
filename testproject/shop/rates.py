"""The shop's client for an exchange-rates API (``GET PAYMENTS_URL/rate``), four ways.

Each *client* is a ``requests.Session`` with its own ``BreakerAdapter``, so the demo can
show the same lookup with and without the outbound stages:

``retry``
    The documentation's retry example as written, ``BreakerAdapter(retry=RetryPolicy(
    max_attempts=3, backoff_initial=0.1))``, with a 10 s request timeout. A 429 with
    ``Retry-After`` is waited out before each further attempt, so the web request that made
    the call is held for the provider's cooldowns.
``plain``
    The same service (breaker ``rates``) from a call site that does not retry: every
    lookup goes to the provider, whatever Retry-After it asked for.
``guarded`` and ``guarded_plain``
    The same two call sites on a service with ``honor_retry_after`` on (``BALDUR_SERVICES``
    in the settings): after a 429 with ``Retry-After``, every call to the service is
    refused at once until then. The request's deadline (set by
    ``RequestDeadlineMiddleware`` from the ``X-Request-Deadline`` header the demo sends)
    stops any wait past it.
``pool``
    No stage: a hanging service holds one request thread per call for the whole timeout.
``bulkhead``
    ``max_concurrent_calls=2, max_wait=0.0``: at most two calls in flight in this process;
    the next is refused at once (``BulkheadFullError``) and answered by the fallback, so
    the other request threads stay free.

:func:`lookup` never raises for the provider's failure or a refusal: it answers from a
fallback (``"served_by": "fallback"``) that says whether the call was refused before
anything was sent (``rejected``) and why (``reason``: the refusal's reason, or what the
provider did).
"""

from __future__ import annotations

from typing import Any

import requests
from django.conf import settings

import baldur_django as baldur
from baldur_django import RetryPolicy
from baldur_django.contrib.requests import BreakerAdapter

from .models import Order

#: The documentation's retry example, per breaker name below.
DOCS_RETRY = {"max_attempts": 3, "backoff_initial": 0.1}
#: The rate lookups' request timeout, seconds, in the 429 scenario (long enough that the
#: provider's Retry-After fits in it, as in most clients' settings).
RETRY_TIMEOUT = 10.0


def _session(adapter: BreakerAdapter) -> requests.Session:
    session = requests.Session()
    session.mount("http://", adapter)
    session.mount("https://", adapter)
    return session


_RETRY = RetryPolicy(**DOCS_RETRY)

#: client name -> (breaker name, session, request timeout in seconds or None: PAYMENTS_TIMEOUT).
#: ``plain`` and ``guarded_plain`` are a second call site of the same two services that does
#: not retry; ``rates_guarded`` has ``honor_retry_after`` on in ``BALDUR_SERVICES`` (settings).
CLIENTS: dict[str, tuple[str, requests.Session, float | None]] = {
    "retry": ("rates", _session(BreakerAdapter("rates", retry=_RETRY)), RETRY_TIMEOUT),
    "plain": ("rates", _session(BreakerAdapter("rates")), RETRY_TIMEOUT),
    "guarded": ("rates_guarded", _session(BreakerAdapter("rates_guarded", retry=_RETRY)), RETRY_TIMEOUT),
    "guarded_plain": ("rates_guarded", _session(BreakerAdapter("rates_guarded")), RETRY_TIMEOUT),
    "pool": ("rates_pool", _session(BreakerAdapter("rates_pool")), None),
    "bulkhead": (
        "rates_bulkhead",
        _session(BreakerAdapter("rates_bulkhead", max_concurrent_calls=2, max_wait=0.0)),
        None,
    ),
}


def _failure(exc: BaseException) -> str:
    """What the provider did, in a few words."""
    response = getattr(exc, "response", None)
    if response is not None and getattr(response, "status_code", None) is not None:
        return f"HTTP {response.status_code}"
    if isinstance(exc, requests.Timeout):
        return "timeout"
    return type(exc).__name__


def lookup(client: str, order: Order) -> dict[str, Any]:
    """The exchange rate for *order* through *client* (a key of :data:`CLIENTS`).

    Returns:
        ``{"status": "rated", "served_by": "upstream", "rejected": False, "rate": float}``,
        or from the fallback ``{"status": "unpriced", "served_by": "fallback", "rejected":
        bool, "reason": str}`` (``rejected``: a stage or the breaker refused before
        anything was sent; ``reason``: the refusal's reason, such as ``"retry_after"``,
        ``"cooldown"``, ``"bulkhead_full"``, ``"deadline"``, ``"open"``, or what the
        provider did: ``"HTTP 429"``, ``"timeout"``). Both carry ``"breaker"`` (the name)
        and ``"breaker_state"``.

    Raises:
        KeyError: *client* is not a key of :data:`CLIENTS`.
    """
    name, session, timeout = CLIENTS[client]
    url = settings.PAYMENTS_URL.rstrip("/") + "/rate"
    answer: dict[str, Any]
    try:
        response = session.get(
            url, params={"order": order.pk}, timeout=settings.PAYMENTS_TIMEOUT if timeout is None else timeout
        )
        response.raise_for_status()
        answer = {"status": "rated", "served_by": "upstream", "rejected": False, "rate": response.json()["rate"]}
    except baldur.CallRefusedError as refusal:  # nothing was sent
        answer = {"status": "unpriced", "served_by": "fallback", "rejected": True, "reason": refusal.reason}
    except (requests.RequestException, ValueError, KeyError) as exc:
        answer = {"status": "unpriced", "served_by": "fallback", "rejected": False, "reason": _failure(exc)}
    return {**answer, "breaker": name, "breaker_state": baldur.get_breaker(name).state.value}

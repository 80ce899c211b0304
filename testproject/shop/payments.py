"""The shop's client for the payments service.

:func:`charge` sends the charge through :data:`protected_session`, a ``requests.Session``
whose transport adapter is ``BreakerAdapter("payments")``: the breaker counts the
service's failures (a 5xx answer, a timeout, a refused connection) and, once it is OPEN,
the adapter refuses before any connection is made; :func:`charge` then answers from
:func:`queue_for_later`. :func:`charge_unprotected` is the same call through a plain
session, with no breaker, for comparison.

Both take the :class:`~testproject.shop.models.Order` and a fresh :class:`ChargeAttempt`,
which records whether the request reached the service; the fallback receives the
same arguments, so it can tell a fast rejection from a failed call.
"""

from __future__ import annotations

from typing import Any

import requests
from django.conf import settings
from django.db.models import F

from baldur_django.contrib.requests import BreakerAdapter, CircuitOpenRequestError

from .models import Order

SERVICE = "payments"

#: Every payments call of :func:`charge` goes through the ``payments`` breaker, inside the
#: HTTP client: refused while OPEN without a connection, 5xx and timeouts counted.
protected_session = requests.Session()
protected_session.mount("http://", BreakerAdapter(SERVICE))
protected_session.mount("https://", BreakerAdapter(SERVICE))
#: The same client without a breaker, for :func:`charge_unprotected`.
plain_session = requests.Session()


class ChargeAttempt:
    """What happened during one charge attempt.

    Attributes:
        reached_upstream (bool): True once the protected body ran (the breaker let it through).
        error (str): short description of the upstream failure, "" when none.
    """

    __slots__ = ("reached_upstream", "error")

    def __init__(self) -> None:
        self.reached_upstream = False
        self.error = ""


def _describe(exc: BaseException) -> str:
    response = getattr(exc, "response", None)
    if response is not None and getattr(response, "status_code", None) is not None:
        return f"payments answered HTTP {response.status_code}"
    if isinstance(exc, requests.Timeout):
        return f"payments did not answer within {settings.PAYMENTS_TIMEOUT:g} s"
    if isinstance(exc, requests.ConnectionError):
        return "payments refused the connection"
    return f"{type(exc).__name__}: {exc}"[:200]


def charge_unprotected(
    order: Order, attempt: ChargeAttempt, session: requests.Session = plain_session
) -> dict[str, Any]:
    """POST the charge to ``PAYMENTS_URL/charge`` and mark the order paid.

    Args:
        order: the order to charge.
        attempt: filled in as the call proceeds.
        session: the client to send it with (:data:`plain_session`: no breaker).

    Returns:
        ``{"status": "paid", "served_by": "upstream", "rejected": False, "charge_id": str}``.

    Raises:
        requests.RequestException: the service failed (HTTP 4xx/5xx, timeout after
            ``PAYMENTS_TIMEOUT`` seconds, connection refused).
        ValueError: the service answered something that is not JSON.
    """
    attempt.reached_upstream = True
    url = settings.PAYMENTS_URL.rstrip("/") + "/charge"
    try:
        response = session.post(
            url,
            json={"order": order.pk, "amount_cents": order.amount_cents},
            timeout=settings.PAYMENTS_TIMEOUT,
        )
        response.raise_for_status()
        body = response.json()
    except CircuitOpenRequestError:
        attempt.reached_upstream = False  # refused by the breaker: nothing was sent
        raise
    except (requests.RequestException, ValueError) as exc:
        attempt.error = _describe(exc)
        raise
    charge_id = str(body.get("charge_id", ""))[:64]
    Order.objects.filter(pk=order.pk).update(status=Order.PAID, charge_id=charge_id, last_error="")
    return {"status": "paid", "served_by": "upstream", "rejected": False, "charge_id": charge_id}


def queue_for_later(order: Order, attempt: ChargeAttempt) -> dict[str, Any]:
    """Fallback: park the order as ``queued`` for a later attempt.

    Returns:
        ``{"status": "queued", "served_by": "fallback", "rejected": bool, "reason": str}``;
        ``rejected`` is True when the breaker refused the call, so the payments service
        was never contacted.
    """
    rejected = not attempt.reached_upstream
    reason = "payments circuit is open: not called" if rejected else (attempt.error or "payments call failed")
    Order.objects.filter(pk=order.pk).update(status=Order.QUEUED, last_error=reason[:200])
    return {"status": "queued", "served_by": "fallback", "rejected": rejected, "reason": reason}


def charge(order: Order, attempt: ChargeAttempt) -> dict[str, Any]:
    """:func:`charge_unprotected` through :data:`protected_session` (the ``payments``
    breaker), with :func:`queue_for_later` answering whenever the charge did not go
    through. Never raises for an upstream failure or a refusal."""
    try:
        return charge_unprotected(order, attempt, protected_session)
    except (requests.RequestException, ValueError):
        return queue_for_later(order, attempt)


def count_attempt(order: Order) -> None:
    """Add one to the order's attempt counter."""
    Order.objects.filter(pk=order.pk).update(attempts=F("attempts") + 1)

"""The shop's client for the payments service.

:func:`charge` is the protected call: ``@baldur.protected("payments", fallback=...)``
counts its failures (an HTTP error status, a timeout, a refused connection) and, once
the breaker is OPEN, answers from :func:`queue_for_later` without contacting the
service. :func:`charge_unprotected` is the same call with no breaker, for comparison.

Both take the :class:`~testproject.shop.models.Order` and a fresh :class:`ChargeAttempt`,
which records whether the request reached the service; the fallback receives the
same arguments (FAC-4), so it can tell a fast rejection from a failed call.
"""

from __future__ import annotations

from typing import Any

import requests
from django.conf import settings
from django.db.models import F

import baldur_django as baldur

from .models import Order

SERVICE = "payments"


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


def charge_unprotected(order: Order, attempt: ChargeAttempt) -> dict[str, Any]:
    """POST the charge to ``PAYMENTS_URL/charge`` and mark the order paid.

    Args:
        order: the order to charge.
        attempt: filled in as the call proceeds.

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
        response = requests.post(
            url,
            json={"order": order.pk, "amount_cents": order.amount_cents},
            timeout=settings.PAYMENTS_TIMEOUT,
        )
        response.raise_for_status()
        body = response.json()
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


@baldur.protected(SERVICE, fallback=queue_for_later)
def charge(order: Order, attempt: ChargeAttempt) -> dict[str, Any]:
    """:func:`charge_unprotected` behind the ``payments`` breaker, with :func:`queue_for_later`
    as fallback. Never raises for an upstream failure: the fallback answers instead."""
    return charge_unprotected(order, attempt)


def count_attempt(order: Order) -> None:
    """Add one to the order's attempt counter."""
    Order.objects.filter(pk=order.pk).update(attempts=F("attempts") + 1)

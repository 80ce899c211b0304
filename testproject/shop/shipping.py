"""The shop's client for shipping quotes: one carrier per host, one breaker per host.

:func:`quotes` asks every carrier in ``settings.SHIPPING_CARRIERS`` for a quote through
:data:`session`, a ``requests.Session`` whose transport adapter is ``BreakerAdapter()``
with no service name: the adapter keeps one breaker per host, named after it
(``"127.0.0.1:8766"``), so a carrier that fails trips its own breaker only. Once that
breaker is OPEN the adapter refuses before any connection to that host is made, while
the other carrier's breaker stays CLOSED and its quotes keep coming. The breakers
use the package's defaults (5 failures in a row open one; 60 s before a trial call).
"""

from __future__ import annotations

from typing import Any

import requests
from django.conf import settings

import baldur_django as baldur
from baldur_django.contrib.requests import BreakerAdapter, CircuitOpenRequestError

from .models import Order

#: One adapter for both schemes: a breaker per host, created on the first request to it.
adapter = BreakerAdapter()
session = requests.Session()
session.mount("http://", adapter)
session.mount("https://", adapter)


def breaker_name(url: str) -> str:
    """The name of the breaker a request to *url* goes through (the host, with its port
    when it is not the scheme's default).

    Raises:
        ConfigError: *url* has no host.
    """
    return adapter.breaker_name(requests.Request("GET", url).prepare())


def quote(carrier: str, base_url: str, order: Order) -> dict[str, Any]:
    """One carrier's quote for *order*, through :data:`session`.

    Args:
        carrier (str): the carrier's name (a key of ``SHIPPING_CARRIERS``).
        base_url (str): its base URL; the quote is ``GET base_url/quote``.
        order: the order to ship.

    Returns:
        ``{"status": "quoted", "price_cents": int, "days": int, ...}`` or ``{"status":
        "unavailable", "rejected": bool, "reason": str, ...}`` (``rejected``: the host's
        breaker refused, nothing was sent). Both carry ``"breaker"`` (the host's breaker
        name) and ``"breaker_state"`` (its state after the call). Never raises for a
        failing carrier.
    """
    url = base_url.rstrip("/") + "/quote"
    name = breaker_name(url)
    answer: dict[str, Any]
    try:
        response = session.get(
            url, params={"order": order.pk, "amount_cents": order.amount_cents}, timeout=settings.SHIPPING_TIMEOUT
        )
        response.raise_for_status()
        body = response.json()
        answer = {
            "status": "quoted",
            "rejected": False,
            "price_cents": int(body.get("price_cents", 0)),
            "days": int(body.get("days", 0)),
            "quote_id": str(body.get("quote_id", ""))[:64],
        }
    except CircuitOpenRequestError:
        answer = {"status": "unavailable", "rejected": True, "reason": f"breaker {name} is open: not called"}
    except requests.HTTPError as exc:
        answer = {
            "status": "unavailable",
            "rejected": False,
            "reason": f"{carrier} answered HTTP {exc.response.status_code}",
        }
    except requests.Timeout:
        answer = {
            "status": "unavailable",
            "rejected": False,
            "reason": f"{carrier} did not answer within {settings.SHIPPING_TIMEOUT:g} s",
        }
    except (requests.RequestException, ValueError) as exc:
        answer = {"status": "unavailable", "rejected": False, "reason": f"{type(exc).__name__}: {exc}"[:200]}
    return {"carrier": carrier, **answer, "breaker": name, "breaker_state": baldur.get_breaker(name).state.value}


def quotes(order: Order) -> dict[str, Any]:
    """Every carrier's quote for *order* and the cheapest one.

    Returns:
        ``{"quotes": {carrier: quote(...)}, "best": carrier | None}``; ``best`` is None
        when no carrier quoted.
    """
    found = {name: quote(name, url, order) for name, url in settings.SHIPPING_CARRIERS.items()}
    quoted = [q for q in found.values() if q["status"] == "quoted"]
    best = min(quoted, key=lambda q: q["price_cents"])["carrier"] if quoted else None
    return {"quotes": found, "best": best}

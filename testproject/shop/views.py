"""Views of the shop.

``/orders/<id>/charge/`` charges through the ``payments`` breaker (fallback: queue the
order); ``/orders/<id>/charge-unprotected/`` makes the same call with no breaker;
``/orders/<id>/shipping-quotes/`` asks every carrier for a quote, one breaker per host;
``/orders/<id>/rate/<client>/`` looks up an exchange rate through one of the rate
clients (``testproject.shop.rates``: with and without the outbound stages);
``/breakers/`` is a JSON view of every known breaker plus the transition log;
``/emergency/`` is the Emergency Mode level as this process sees it; ``/`` is a page
listing what to visit. The JSON endpoints are CSRF-exempt: they are a demo
API driven by scripts and ``curl``, with no cookie-based login behind them.
"""

from __future__ import annotations

import json
from typing import Any

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import redirect, render
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET, require_http_methods

import baldur_django as baldur
from baldur_django import emergency as baldur_emergency
from baldur_django.core.registry import registry

from . import breaker_log, payments, rates, shipping
from .models import Order

MAX_ORDERS_PER_REQUEST = 1000
MAX_AMOUNT_CENTS = 10_000_000


def _error(status: int, message: str, **extra: Any) -> JsonResponse:
    return JsonResponse({"error": message, **extra}, status=status)


def _order_or_error(order_id: int) -> Order | JsonResponse:
    order = Order.objects.filter(pk=order_id).first()
    if order is None:
        return _error(404, f"no order with id {order_id}")
    if order.status == Order.PAID:
        return _error(409, f"order {order_id} is already paid", order=order.as_dict())
    return order


def _breaker_state() -> str:
    return baldur.get_breaker(payments.SERVICE).state.value


def home(request: HttpRequest) -> HttpResponse:
    """Front page: what to visit, the latest orders with charge links, the breaker state."""
    context = {
        "orders": Order.objects.all()[:10],
        "breaker": baldur.get_breaker(payments.SERVICE).snapshot(),
        "payments_url": settings.PAYMENTS_URL,
        "payments_timeout": settings.PAYMENTS_TIMEOUT,
    }
    return render(request, "shop/home.html", context)


@csrf_exempt
@require_http_methods(["GET", "POST"])
def orders(request: HttpRequest) -> HttpResponse:
    """``GET``: the latest 50 orders as JSON. ``POST``: create orders.

    The POST body is JSON ``{"count": int 1..1000 (default 1), "amount_cents": int
    1..10000000 (default 1999)}`` and answers 201 ``{"ids": [...]}``; an HTML form post
    with the same fields redirects to ``/``. Bad values answer 400 naming the field.
    """
    if request.method == "GET":
        return JsonResponse({"orders": [order.as_dict() for order in Order.objects.all()[:50]]})
    is_json = request.content_type == "application/json"
    if is_json:
        try:
            data = json.loads(request.body or b"{}")
        except ValueError:
            return _error(400, "body is not valid JSON")
        if not isinstance(data, dict):
            return _error(400, "body must be a JSON object")
    else:
        data = request.POST
    fields = {"count": (1, 1, MAX_ORDERS_PER_REQUEST), "amount_cents": (1999, 1, MAX_AMOUNT_CENTS)}
    values = {}
    for name, (default, low, high) in fields.items():
        raw = data.get(name, default)
        if raw in ("", None):
            raw = default
        try:
            if isinstance(raw, (bool, float)):
                raise ValueError
            value = int(raw)
        except (TypeError, ValueError):
            return _error(400, f"{name}={raw!r}: expected a whole number from {low} to {high}")
        if not low <= value <= high:
            return _error(400, f"{name}={value}: expected a whole number from {low} to {high}")
        values[name] = value
    created = Order.objects.bulk_create(Order(amount_cents=values["amount_cents"]) for _ in range(values["count"]))
    ids = [order.pk for order in created]
    if is_json:
        return JsonResponse({"ids": ids}, status=201)
    return redirect("shop:home")


@csrf_exempt
@require_http_methods(["GET", "POST"])
def charge(request: HttpRequest, order_id: int) -> HttpResponse:
    """Charge an order through the ``payments`` breaker.

    Answers 200 ``{"status": "paid", "served_by": "upstream", ...}`` when the payments
    service accepted it, 202 ``{"status": "queued", "served_by": "fallback",
    "rejected": bool, "reason": str, ...}`` when the fallback parked it (``rejected`` is
    True when the breaker refused to call the service). Every answer carries
    ``"breaker"``: the breaker's state after the call. 404 unknown order, 409 already paid.
    """
    order = _order_or_error(order_id)
    if isinstance(order, JsonResponse):
        return order
    payments.count_attempt(order)
    result = payments.charge(order, payments.ChargeAttempt())
    status = 200 if result["status"] == "paid" else 202
    return JsonResponse({"order": order.pk, **result, "breaker": _breaker_state()}, status=status)


@csrf_exempt
@require_http_methods(["GET", "POST"])
def charge_unprotected(request: HttpRequest, order_id: int) -> HttpResponse:
    """The same charge with no breaker: 200 when paid, 502 ``{"status": "error",
    "served_by": "error", "error": str}`` when the payments service failed."""
    order = _order_or_error(order_id)
    if isinstance(order, JsonResponse):
        return order
    payments.count_attempt(order)
    attempt = payments.ChargeAttempt()
    try:
        result = payments.charge_unprotected(order, attempt)
    except Exception:  # the upstream's failure is this view's answer, not a crash
        Order.objects.filter(pk=order.pk).update(last_error=attempt.error[:200] or "payments call failed")
        return JsonResponse(
            {"order": order.pk, "status": "error", "served_by": "error", "rejected": False, "error": attempt.error},
            status=502,
        )
    return JsonResponse({"order": order.pk, **result}, status=200)


@require_GET
def shipping_quotes(request: HttpRequest, order_id: int) -> HttpResponse:
    """Shipping quotes for an order from every carrier (``SHIPPING_CARRIERS``), each
    through its host's own breaker (``shipping.session``: ``BreakerAdapter()`` with no
    service name).

    Answers 200 ``{"order": id, "quotes": {carrier: {"status": "quoted" | "unavailable",
    "rejected": bool, "breaker": "host:port", "breaker_state": str, ...}}, "best": carrier}``
    when at least one carrier quoted, 503 with the same body (``best`` None) when none
    did; 404 for an unknown order. A failing carrier only costs its own quote.
    """
    order = Order.objects.filter(pk=order_id).first()
    if order is None:
        return _error(404, f"no order with id {order_id}")
    result = shipping.quotes(order)
    return JsonResponse({"order": order.pk, **result}, status=200 if result["best"] else 503)


@require_GET
def rate(request: HttpRequest, order_id: int, client: str) -> HttpResponse:
    """An exchange rate for an order through the rate client *client* (``retry``,
    ``guarded``, ``pool`` or ``bulkhead``, see ``testproject.shop.rates``).

    Answers 200 ``{"status": "rated", "served_by": "upstream", ...}`` or 202 ``{"status":
    "unpriced", "served_by": "fallback", "rejected": bool, "reason": str, ...}``; 404 for an
    unknown order or client.
    """
    if client not in rates.CLIENTS:
        return _error(404, f"no rate client {client!r}: expected one of {', '.join(rates.CLIENTS)}")
    order = Order.objects.filter(pk=order_id).first()
    if order is None:
        return _error(404, f"no order with id {order_id}")
    result = rates.lookup(client, order)
    return JsonResponse({"order": order.pk, **result}, status=200 if result["status"] == "rated" else 202)


@require_GET
def breakers(request: HttpRequest) -> HttpResponse:
    """Every breaker this process knows (``get_breaker(name).snapshot()``), the breaker
    transitions logged since ``?since=SEQ`` (default 0: all kept), the rejections per
    service and reason (``open``, ``half_open_full``, ``frozen``), and the Emergency Mode
    level this process sees (``emergency_level``, read before the snapshots)."""
    raw_since = request.GET.get("since", "0")
    try:
        since = int(raw_since)
    except ValueError:
        return _error(400, f"since={raw_since!r}: expected a whole number")
    names = sorted(set(registry.names()) | set(getattr(settings, "BALDUR_SERVICES", {})) | {payments.SERVICE})
    level = baldur_emergency.get_level()
    return JsonResponse(
        {
            "emergency_level": level,
            "breakers": {name: baldur.get_breaker(name).snapshot() for name in names},
            "transitions": breaker_log.transitions(since),
            "rejections": breaker_log.rejections(),
        }
    )


@require_GET
def emergency(request: HttpRequest) -> HttpResponse:
    """The Emergency Mode level as this process's breakers see it: ``{"level": int 0..3,
    "frozen": bool}`` (``emergency.get_level()``, through the process cache of
    ``BALDUR_EMERGENCY_CACHE_SECONDS``). Touches no breaker, so polling it never moves one
    (the demo waits here for a level set by ``manage.py baldur_emergency`` in another
    process to reach the server)."""
    level = baldur_emergency.get_level()
    return JsonResponse({"level": level, "frozen": level >= 3})

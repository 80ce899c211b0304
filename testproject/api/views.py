"""Views of the inbound-side demo API, mounted under ``/api/``.

With the test project's settings every response here is filed against the ``api`` breaker
by ``CircuitBreakerMiddleware`` (``BALDUR_DOMAIN_MAPPING = {"/api/": "api"}``):

``GET /api/quote/``
    A DRF view throttled by :class:`QuoteThrottle` (5 per minute per client). Its 429s are
    the app's own refusals: the throttle marks them and the breaker never counts them.
``GET /api/payments-health/``
    Relays the payments service's ``/health`` answer: its status, and ``Retry-After`` when
    there is one; 502 when the service cannot be reached. A 429 or 5xx relayed from
    upstream counts against the ``api`` breaker.
``GET /api/limited/``
    Limited by ``RateLimitMiddleware`` (``BALDUR_RATE_LIMIT_RULES``: 5 per minute per IP).
    The limiter's 429s carry ``X-RateLimit-*`` headers and never count.
``GET /api/breaker/``
    The ``api`` breaker's snapshot, to watch the above.
"""

from __future__ import annotations

import urllib.error
import urllib.request

from django.conf import settings
from django.http import HttpRequest, JsonResponse
from rest_framework.renderers import JSONRenderer
from rest_framework.response import Response
from rest_framework.views import APIView

import baldur_django as baldur
from baldur_django.contrib.drf import BaldurAnonRateThrottle
from baldur_django.middleware import domain_for


class QuoteThrottle(BaldurAnonRateThrottle):
    """Five quotes per minute per client; refusals are marked for the breaker."""

    rate = "5/min"


class QuoteView(APIView):
    """``GET /api/quote/``: a throttled DRF endpoint."""

    authentication_classes: list = []
    permission_classes: list = []
    renderer_classes = [JSONRenderer]
    throttle_classes = [QuoteThrottle]

    def get(self, request):
        return Response({"quote": "Keep calm and let the breaker trip."})


def payments_health(request: HttpRequest) -> JsonResponse:
    """``GET /api/payments-health/``: relay the payments service's health answer."""
    url = settings.PAYMENTS_URL.rstrip("/") + "/health"
    try:
        with urllib.request.urlopen(url, timeout=settings.PAYMENTS_TIMEOUT) as reply:
            status, retry_after = reply.status, reply.headers.get("Retry-After")
    except urllib.error.HTTPError as exc:
        status, retry_after = exc.code, exc.headers.get("Retry-After")
    except (urllib.error.URLError, OSError) as exc:
        return JsonResponse({"upstream": url, "error": str(exc)}, status=502)
    response = JsonResponse({"upstream": url, "status": status}, status=status)
    if retry_after is not None:
        response.headers["Retry-After"] = retry_after
    return response


def limited(request: HttpRequest) -> JsonResponse:
    """``GET /api/limited/``: an endpoint under a ``BALDUR_RATE_LIMIT_RULES`` rule."""
    return JsonResponse({"ok": True})


def breaker(request: HttpRequest) -> JsonResponse:
    """``GET /api/breaker/``: the snapshot of this path's domain breaker."""
    return JsonResponse(baldur.get_breaker(domain_for(request.path)).snapshot())

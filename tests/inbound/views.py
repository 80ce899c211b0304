"""Views for the inbound-side tests (sync and async, every status the middleware sorts)."""

from __future__ import annotations

import asyncio

from django.http import HttpResponse, StreamingHttpResponse
from rest_framework.authentication import SessionAuthentication
from rest_framework.response import Response
from rest_framework.throttling import BaseThrottle
from rest_framework.views import APIView

from baldur_django import mark_rate_limited
from baldur_django.contrib.drf import (
    BaldurAnonRateThrottle,
    BaldurScopedRateThrottle,
    BaldurThrottleMixin,
    BaldurUserRateThrottle,
)

#: Paths of the views that ran, in order (tests read it to see whether a view was called).
CALLS: list[str] = []
#: Set by the streaming generator when its body is first read.
STREAM = {"started": False}


def _relay(request, *, upstream: int = 429) -> HttpResponse:
    """A 429 as if relayed from upstream; query flags add the own-limiter marks."""
    response = HttpResponse("upstream says slow down", status=upstream)
    if "retry_after" in request.GET:
        response.headers["Retry-After"] = request.GET["retry_after"]
    if "mode" in request.GET:
        response.headers["X-RateLimit-Mode"] = "enforce"
    if "limit" in request.GET:
        response.headers["X-RateLimit-Limit"] = "10"
    if "mark" in request.GET:
        mark_rate_limited(request)
    return response


def status(request, code: int) -> HttpResponse:
    CALLS.append(request.path)
    return HttpResponse(f"status {code}", status=code)


async def astatus(request, code: int) -> HttpResponse:
    CALLS.append(request.path)
    await asyncio.sleep(0)
    return HttpResponse(f"status {code}", status=code)


def relay(request) -> HttpResponse:
    CALLS.append(request.path)
    return _relay(request)


async def arelay(request) -> HttpResponse:
    CALLS.append(request.path)
    await asyncio.sleep(0)
    return _relay(request)


def boom(request) -> HttpResponse:
    CALLS.append(request.path)
    raise RuntimeError("the view broke")


async def aboom(request) -> HttpResponse:
    CALLS.append(request.path)
    await asyncio.sleep(0)
    raise RuntimeError("the async view broke")


def stream(request, code: int) -> StreamingHttpResponse:
    CALLS.append(request.path)

    def body():
        STREAM["started"] = True
        yield b"chunk one\n"
        yield b"chunk two\n"

    return StreamingHttpResponse(body(), status=code)


# ------------------------------------------------------------------------ DRF views
class ThreePerMinute(BaldurAnonRateThrottle):
    rate = "3/min"


class TwoPerMinuteUser(BaldurUserRateThrottle):
    rate = "2/min"


class BurstScoped(BaldurScopedRateThrottle):
    THROTTLE_RATES = {"burst": "2/min"}


class RefusesOnFlag(BaseThrottle):
    """A plain DRF throttle whose wait() is unknown (None): refuses ``?refuse=1``."""

    def allow_request(self, request, view):
        return not request.query_params.get("refuse")


class AlwaysRefuses(BaldurThrottleMixin, RefusesOnFlag):
    """The mixin goes in front of the throttle whose allow_request it wraps."""


class ThrottledApi(APIView):
    """A DRF endpoint with a throttle; ``?upstream=N`` relays status N from 'upstream'."""

    authentication_classes: list = []
    permission_classes: list = []
    throttle_classes = [ThreePerMinute]

    def get(self, request):
        CALLS.append(request.path)
        upstream = request.query_params.get("upstream")
        if upstream:
            return Response({"detail": "from upstream"}, status=int(upstream))
        return Response({"ok": True})


class UserThrottledApi(ThrottledApi):
    authentication_classes = [SessionAuthentication]
    throttle_classes = [TwoPerMinuteUser]


class ScopedApi(ThrottledApi):
    throttle_classes = [BurstScoped]
    throttle_scope = "burst"


class UnknownWaitApi(ThrottledApi):
    throttle_classes = [AlwaysRefuses]

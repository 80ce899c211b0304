"""The incident site's routes, views and two middlewares.

``health/`` (the readiness view), ``metrics``, ``admin/``, and the harness's own:

* ``call/<service>``: one POST to the upstream's ``/charge`` through a ``BreakerAdapter``
  named *service* (timeout ``INCIDENT_CALL_TIMEOUT``): 200 on the upstream's 200, 503 with
  ``{"refused": ...}`` when the breaker refuses, 502 when the upstream failed;
* ``hosts?start=S&count=N``: N GETs of ``/quote``, host ``127.x.y.z`` number S.. S+N-1,
  through one per-host ``BreakerAdapter()`` (the upstream listens on 0.0.0.0);
* ``warm?count=N&prefix=P``: N breakers ``P<i>`` made and called once (a no-op call);
* ``names`` (POST ``via=decorator|protect|adapter``, ``name``): whether that entry point takes
  *name*, and the name of the breaker it used (a host's is made safe by the adapter).

Every answer carries ``X-Pid`` (the worker's process id).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any

import requests
from django.conf import settings
from django.contrib import admin
from django.contrib.auth.models import User
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.urls import path
from django.views.decorators.csrf import csrf_exempt
from requests.adapters import BaseAdapter
from requests.models import PreparedRequest, Response

from baldur_django import CircuitOpenError, circuit_breaker, protect
from baldur_django.contrib import health, prometheus
from baldur_django.contrib.requests import BreakerAdapter
from baldur_django.core.errors import ConfigError
from baldur_django.core.registry import registry

prometheus.install()

_lock = threading.Lock()
_sessions: dict[str, requests.Session] = {}
_PID = str(os.getpid())


def worker_pid(get_response: Callable[[HttpRequest], Any]) -> Callable[[HttpRequest], Any]:
    """Middleware: every answer says which worker process made it (``X-Pid``)."""

    def middleware(request: HttpRequest) -> Any:
        response = get_response(request)
        response["X-Pid"] = str(os.getpid())
        return response

    return middleware


def operator_login(get_response: Callable[[HttpRequest], Any]) -> Callable[[HttpRequest], Any]:
    """Middleware: a request with ``X-Incident-Operator: 1`` is an (unsaved) superuser's."""

    def middleware(request: HttpRequest) -> Any:
        if request.headers.get("X-Incident-Operator") == "1":
            request.user = User(username="incident", is_staff=True, is_superuser=True, is_active=True)
        return get_response(request)

    return middleware


def _session(key: str, make: Callable[[], BreakerAdapter]) -> requests.Session:
    with _lock:
        session = _sessions.get(key)
        if session is None:
            session = _sessions[key] = requests.Session()
            session.mount("http://", make())
        return session


@csrf_exempt
def call(request: HttpRequest, service: str) -> JsonResponse:
    session = _session("service:" + service, lambda: BreakerAdapter(service))
    try:
        answer = session.post(settings.INCIDENT_UPSTREAM + "/charge", json={}, timeout=settings.INCIDENT_CALL_TIMEOUT)
    except CircuitOpenError as exc:
        return JsonResponse({"refused": exc.reason, "pid": os.getpid()}, status=503)
    except requests.RequestException as exc:
        return JsonResponse({"failed": type(exc).__name__, "pid": os.getpid()}, status=502)
    return JsonResponse({"upstream": answer.status_code, "pid": os.getpid()}, status=200 if answer.ok else 502)


def hosts(request: HttpRequest) -> JsonResponse:
    start, count = int(request.GET.get("start", "0")), int(request.GET.get("count", "1"))
    port = settings.INCIDENT_UPSTREAM.rsplit(":", 1)[1]
    session = _session("hosts", BreakerAdapter)
    statuses: dict[str, int] = {}
    for number in range(start, start + count):
        address = f"127.1.{number // 250}.{number % 250 + 1}"  # distinct for number < 64,000
        try:
            key = str(session.get(f"http://{address}:{port}/quote", timeout=2).status_code)
        except requests.RequestException as exc:
            key = type(exc).__name__
        statuses[key] = statuses.get(key, 0) + 1
    return JsonResponse({"statuses": statuses, "breakers": len(registry.names()), "pid": os.getpid()})


def warm(request: HttpRequest) -> JsonResponse:
    count, prefix = int(request.GET.get("count", "0")), request.GET.get("prefix", "host-")
    for number in range(count):
        protect(f"{prefix}{number}", lambda: None)
    return JsonResponse({"breakers": len(registry.names()), "pid": os.getpid()})


def _try_decorator(name: str) -> str:
    circuit_breaker(name)(lambda: None)()
    return name


def _try_protect(name: str) -> str:
    protect(name, lambda: None)
    return name


class _Answering(BaseAdapter):
    """A transport that answers 200 at once: the name check is all that is tried."""

    def send(self, request: PreparedRequest, *args: Any, **kwargs: Any) -> Response:
        response = Response()
        response.status_code, response.request, response.url = 200, request, request.url or ""
        return response

    def close(self) -> None:
        pass


def _try_adapter(name: str) -> str:
    prepared = requests.Request("GET", "http://placeholder/quote").prepare()
    prepared.url = f"http://{name}/quote"  # past requests' own URL checks: the adapter decides
    adapter = BreakerAdapter(adapter=_Answering())
    adapter.send(prepared, timeout=1)
    return adapter.breaker_name(prepared)


_ENTRY_POINTS = {"decorator": _try_decorator, "protect": _try_protect, "adapter": _try_adapter}


@csrf_exempt
def names(request: HttpRequest) -> JsonResponse:
    """POST ``via``, ``name``: whether that entry point takes *name*, and the breaker it made."""
    name = request.POST.get("name", "")
    try:
        used = _ENTRY_POINTS[request.POST.get("via", "protect")](name)
    except ConfigError as exc:
        return JsonResponse({"refused": True, "error": type(exc).__name__, "message": str(exc)})
    except Exception as exc:
        return JsonResponse({"refused": False, "error": type(exc).__name__, "message": str(exc)[:300]})
    return JsonResponse({"refused": False, "breaker": used, "registered": used in registry.names()})


def ping(request: HttpRequest) -> HttpResponse:
    return HttpResponse("pong")


urlpatterns = [
    path("health/", health.health_view),
    path("metrics", prometheus.metrics_view),
    path("admin/", admin.site.urls),
    path("call/<str:service>", call),
    path("hosts", hosts),
    path("warm", warm),
    path("names", names),
    path("ping", ping),
]

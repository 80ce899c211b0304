"""Flask and ASGI middlewares with no Django at all (IN-6), in a fresh interpreter."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent(
    """
    import asyncio, sys, warnings

    import baldur_django
    import baldur_django.core.marks  # mark_rate_limited's home imports no Django either
    from baldur_django.contrib.asgi import BaldurASGIMiddleware
    from baldur_django.contrib.flask import BaldurFlask
    from flask import Flask
    from starlette.applications import Starlette
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from starlette.testclient import TestClient

    app = Flask("plain")

    @app.get("/fail")
    def fail():
        return "down", 502

    BaldurFlask(app, service_name="flask-svc")
    client = app.test_client()
    for _ in range(2):
        assert client.get("/fail").status_code == 502

    async def relay(request):
        return PlainTextResponse("slow down", status_code=429)

    asgi = BaldurASGIMiddleware(Starlette(routes=[Route("/relay", relay)]), service_name="asgi-svc")
    tc = TestClient(asgi)
    for _ in range(2):
        assert tc.get("/relay").status_code == 429

    states = {name: baldur_django.get_breaker(name).state.value for name in ("flask-svc", "asgi-svc")}
    loaded = sorted(m for m in sys.modules if m == "django" or m.startswith("django."))
    print(states, loaded)
    assert states == {"flask-svc": "open", "asgi-svc": "open"}, states
    assert loaded == [], loaded
    print("NO-DJANGO-OK")
    """
)


def test_in6_flask_and_asgi_work_without_django_settings_or_imports():
    """IN-6, CFG-1: both middlewares run in a process that never imports Django; env settings apply."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DJANGO_") and not k.startswith("BALDUR_")}
    env["BALDUR_CB_FAILURE_THRESHOLD"] = "2"  # read from the environment: two failures trip
    env["PYTHONPATH"] = str(ROOT)
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "NO-DJANGO-OK" in done.stdout

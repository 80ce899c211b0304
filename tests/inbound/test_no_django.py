"""Flask and ASGI middlewares with no Django at all (IN-6), in a fresh interpreter."""

from __future__ import annotations

import json
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


IMPORT_ONLY = textwrap.dedent(
    """
    import json, sys

    before = set(sys.modules)
    import baldur_django

    added = sorted(set(sys.modules) - before)
    outside = [
        name for name in added
        if not (name == "baldur_django" or name == "baldur_django.core" or name.startswith("baldur_django.core."))
        and name.split(".")[0] not in sys.stdlib_module_names
    ]
    print(json.dumps({"outside": outside, "package": [n for n in added if n.startswith("baldur_django")]}))
    """
)


def test_import_baldur_django_loads_only_the_core():
    """Issue 9 item 4, section 0, CFG-1: ``import baldur_django`` in a fresh interpreter with no
    DJANGO_SETTINGS_MODULE loads ``baldur_django``, ``baldur_django.core.*`` and the standard
    library only: no Django layer module (``conf``, ``limiter``, ``middleware``...), no Django, no
    third-party package. ``mark_rate_limited`` comes from ``baldur_django.core.marks``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DJANGO_") and not k.startswith("BALDUR_")}
    env["PYTHONPATH"] = str(ROOT)
    done = subprocess.run(
        [sys.executable, "-c", IMPORT_ONLY], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["outside"] == []
    assert "baldur_django.core.marks" in report["package"]
    assert not {"baldur_django.conf", "baldur_django.limiter", "baldur_django.middleware"} & set(report["package"])

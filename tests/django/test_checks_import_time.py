"""CFG-3: a bad setting never crashes ``manage.py check`` when the URLconf imports decorated code.

The README's pattern (and the test project's) decorates functions at module level with
``@baldur.protected``; Django imports them while the URL checks run. A bad ``BALDUR_*``
setting must then read as the system check's error id with its hint and exit status 1,
never as a traceback from the decorator; the decorated function raises ``ConfigError``
when it is called, and works once the setting is fixed.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from django.test import override_settings

import baldur_django as baldur
from baldur_django import ConfigError

ROOT = Path(__file__).resolve().parents[2]

#: (the typo as a line of settings.py, the check id it must produce, words its hint must hold)
TYPOS = [
    ('BALDUR_SERVICES = {"payments": {"failure_treshold": 2}}', "baldur.E022", "allowed keys"),
    ("BALDUR_CB_FAILURE_RATE_THRESHOLD = 150", "baldur.E011", "at most 100"),
    ("BALDUR_CB_SLIDING_WINDOW_SECONDS = 1.5", "baldur.E014", "whole number of seconds"),
    ('BALDUR_STATE_BACKEND = "mongo"', "baldur.E040", "'memory', 'database' or 'redis'"),
]

VIEWS = """
import baldur_django as baldur
from django.http import JsonResponse


@baldur.protected("payments")
def charge(order_id):
    return {"charged": order_id}


@baldur.aprotected("payments", fallback=lambda order_id: {"queued": order_id})
async def charge_async(order_id):
    return {"charged": order_id}


@baldur.circuit_breaker("recs", failure_threshold=3)
def recommendations(user_id):
    return [user_id]


def charge_view(request):
    return JsonResponse(charge(1))
"""


def make_project(root: Path, setting: str) -> Path:
    """A minimal Django project whose URLconf imports a module with decorated functions."""
    (root / "shop").mkdir()
    (root / "shop" / "__init__.py").write_text("")
    (root / "shop" / "views.py").write_text(VIEWS)
    (root / "urls.py").write_text(
        "from django.urls import path\nfrom shop import views\nurlpatterns = [path('charge/', views.charge_view)]\n"
    )
    (root / "settings.py").write_text(
        textwrap.dedent(
            """\
            SECRET_KEY = "tests-only"
            INSTALLED_APPS = ["django.contrib.contenttypes", "django.contrib.auth", "baldur_django"]
            DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}}
            ROOT_URLCONF = "urls"
            USE_TZ = True
            """
        )
        + setting
        + "\n"
    )
    (root / "manage.py").write_text(
        "import os, sys\n"
        "os.environ.setdefault('DJANGO_SETTINGS_MODULE', 'settings')\n"
        "from django.core.management import execute_from_command_line\n"
        "execute_from_command_line(sys.argv)\n"
    )
    return root


def _env(project: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BALDUR_", "DJANGO_"))}
    env["PYTHONPATH"] = os.pathsep.join([str(project), str(ROOT)])
    return env


MISSPELT = "BALDUR_CB_FAILURE_TRESHOLD = 3"
SILENCED = MISSPELT + '\nSILENCED_SYSTEM_CHECKS = ["baldur.E090"]'
# what a WSGI server (gunicorn, uvicorn) does at start: no management command, no system checks
WSGI_START = "from django.core.wsgi import get_wsgi_application; get_wsgi_application(); print('started')"

RUNS = [(setting, "check") for setting, _, _ in TYPOS] + [
    ("BALDUR_CB_FAILURE_RATE_THRESHOLD = 150", "migrate"),
    (MISSPELT, "check"),
    (MISSPELT, "wsgi"),
    ("BALDUR_CB_FAILURE_RATE_THRESHOLD = 150", "wsgi"),
    (SILENCED, "wsgi"),
    ("", "wsgi"),
]


@pytest.fixture(scope="module")
def reports(tmp_path_factory) -> dict[tuple[str, str], tuple[int, str]]:
    """(setting, command) -> (exit status, stdout + stderr) of `manage.py COMMAND` in a fresh
    project holding that setting. The processes run side by side (one Django start-up each)."""
    started = {}
    for setting, command in RUNS:
        project = make_project(tmp_path_factory.mktemp("cfg3"), setting)
        if command == "wsgi":
            args = [sys.executable, "-c", WSGI_START]
        else:
            args = [sys.executable, "manage.py", command] + (["--noinput"] if command == "migrate" else [])
        env = _env(project) | ({"DJANGO_SETTINGS_MODULE": "settings"} if command == "wsgi" else {})
        started[(setting, command)] = subprocess.Popen(
            args, cwd=project, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
    out = {}
    for key, process in started.items():
        output, _ = process.communicate(timeout=180)
        out[key] = (process.returncode, output)
    return out


@pytest.mark.parametrize(("setting", "check_id", "hint"), TYPOS, ids=[t[1] for t in TYPOS])
def test_cfg3_check_reports_the_id_when_the_urlconf_imports_decorated_code(reports, setting, check_id, hint):
    """CFG-3: `manage.py check` with a typo and a URLconf importing a module-level
    `@protected`: the error id and its hint, exit status 1, no traceback."""
    status, output = reports[(setting, "check")]
    assert status == 1, output
    assert f"({check_id})" in output, output
    assert "HINT:" in output and hint in output, output
    assert "Traceback" not in output, output
    assert "SystemCheckError" in output  # Django's own report, not an exception from the package
    assert output.count("(baldur.E") == 1, output  # that setting's error, nothing else


def test_cfg3_migrate_reports_the_id_too(reports):
    """CFG-3: `migrate` runs the same checks first: the error id, exit 1, no traceback."""
    status, output = reports[("BALDUR_CB_FAILURE_RATE_THRESHOLD = 150", "migrate")]
    assert status == 1, output
    assert "(baldur.E011)" in output and "Traceback" not in output, output


def test_cfg3_misspelt_setting_makes_check_exit_1(reports):
    """CFG-3: a misspelt BALDUR_* Django setting stops `manage.py check` (exit 1) with its id and
    the closest known name, as Django's own report rather than a traceback."""
    status, output = reports[(MISSPELT, "check")]
    assert status == 1, output
    assert "(baldur.E090)" in output and "did you mean BALDUR_CB_FAILURE_THRESHOLD?" in output, output
    assert "SystemCheckError" in output and "Traceback" not in output, output


@pytest.mark.parametrize("setting", [MISSPELT, "BALDUR_CB_FAILURE_RATE_THRESHOLD = 150"], ids=["misspelt", "bad-value"])
def test_cfg3_a_server_does_not_start_on_a_bad_setting(reports, setting):
    """CFG-3: a WSGI server never runs the system checks, so the app itself refuses to start on a
    setting they reject: ImproperlyConfigured naming the id and the hint, before any request."""
    status, output = reports[(setting, "wsgi")]
    assert status != 0 and "started" not in output.splitlines(), output  # (3.13's traceback quotes the source)
    assert "ImproperlyConfigured" in output and "stop the start" in output, output
    assert ("baldur.E090" if setting == MISSPELT else "baldur.E011") in output and "HINT:" in output, output


@pytest.mark.parametrize("setting", ["", SILENCED], ids=["good", "silenced"])
def test_cfg3_a_server_starts_on_good_or_silenced_settings(reports, setting):
    """CFG-3: good settings start; a check id in SILENCED_SYSTEM_CHECKS does not stop the start."""
    status, output = reports[(setting, "wsgi")]
    assert status == 0 and "started" in output.splitlines(), output


@pytest.mark.parametrize(
    "bad",
    [
        {"BALDUR_SERVICES": {"payments": {"failure_treshold": 2}}},
        {"BALDUR_CB_FAILURE_RATE_THRESHOLD": 150},
        {"BALDUR_CB_SLIDING_WINDOW_SECONDS": 1.5},
    ],
    ids=["services", "rate", "window-seconds"],
)
def test_cfg3_decorating_never_raises_calling_does(bad):
    """CFG-3: under a bad setting every decorator returns a wrapper (no ConfigError at import
    time); calling it raises the setting's ConfigError, the function body never runs, and
    once the setting is fixed the same wrapper works. (A bad BALDUR_STATE_BACKEND set after
    start-up leaves the installed store in place, so it is covered by the subprocess runs.)"""
    ran = []
    name = next(iter(bad))
    with override_settings(**bad):

        @baldur.protected("cfg3-sync")
        def charge(order_id):
            ran.append(order_id)
            return order_id

        @baldur.circuit_breaker("cfg3-breaker", failure_threshold=2)
        def recs(user_id):
            ran.append(user_id)
            return user_id

        with pytest.raises(ConfigError, match=name):
            charge(1)
        with pytest.raises(ConfigError, match=name):
            recs(2)
        assert ran == []
        assert not hasattr(charge, "breaker")
    assert charge(3) == 3 and recs(4) == 4
    assert ran == [3, 4]
    assert charge.breaker is baldur.get_breaker("cfg3-sync")
    assert charge.__name__ == "charge"


def test_cfg3_async_decorators_defer_too():
    """CFG-3: `aprotected` and `protected` on an async def stay coroutine functions under a
    bad setting; awaiting them raises the ConfigError, the fallback never answers it."""
    import asyncio
    import inspect

    with override_settings(BALDUR_CB_FAILURE_RATE_THRESHOLD=150):

        @baldur.aprotected("cfg3-async", fallback=lambda order_id: "fallback")
        async def charge(order_id):
            return order_id

        @baldur.protected("cfg3-async-2")
        async def refund(order_id):
            return order_id

        assert inspect.iscoroutinefunction(charge) and inspect.iscoroutinefunction(refund)
        with pytest.raises(ConfigError, match="BALDUR_CB_FAILURE_RATE_THRESHOLD"):
            asyncio.run(charge(1))
        with pytest.raises(ConfigError, match="BALDUR_CB_FAILURE_RATE_THRESHOLD"):
            asyncio.run(refund(1))
    assert asyncio.run(charge(5)) == 5 and asyncio.run(refund(6)) == 6


def test_cfg3_a_bad_argument_is_still_refused_at_decoration():
    """CFG-3, FAC-1: the decorator's own arguments are code, not settings: a bad override
    or an unknown argument is refused when decorating, as before."""
    with pytest.raises(ConfigError, match="failure_threshold"):
        baldur.protected("cfg3-args", failure_threshold=0)
    with pytest.raises(ConfigError, match="unknown argument"):
        baldur.circuit_breaker("cfg3-args", failure_treshold=2)
    with pytest.raises(ConfigError, match="must not be empty"):
        baldur.protected("")
    # also while a setting is bad
    with override_settings(BALDUR_CB_FAILURE_RATE_THRESHOLD=150), pytest.raises(ConfigError, match="failure_thr"):
        baldur.protected("cfg3-args", failure_threshold=0)

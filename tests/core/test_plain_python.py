"""The core works in a plain Python process configured from environment variables, and
never imports Django (section 0, CFG-1, CFG-3; design habit 2).

Each behavioural test runs a fresh interpreter with ``DJANGO_SETTINGS_MODULE`` removed
from its environment, so nothing pytest-django set up can leak in.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import baldur_django

PACKAGE = Path(baldur_django.__file__).resolve().parent
CORE = PACKAGE / "core"
REPO = PACKAGE.parent

FRAMEWORKS = {"django", "rest_framework", "celery", "flask", "prometheus_client", "starlette", "fastapi"}


def run_plain(script: str, **env_vars: str) -> dict:
    """Run *script* in a fresh interpreter without Django settings; it prints one JSON line last."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("BALDUR_")}
    env.pop("DJANGO_SETTINGS_MODULE", None)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env.update(env_vars)
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)],
        env=env,
        cwd=str(REPO),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, f"subprocess failed:\nSTDOUT:\n{proc.stdout}\nSTDERR:\n{proc.stderr}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_plain_python_decorators_work_from_env_without_django():
    """Section 0/CFG-1: with no DJANGO_SETTINGS_MODULE, `import baldur_django` and every core
    module load without importing Django; the decorators work and BALDUR_* env vars apply."""
    result = run_plain(
        """
        import asyncio, json, os, pkgutil, importlib, sys
        assert "DJANGO_SETTINGS_MODULE" not in os.environ
        import baldur_django as baldur
        after_package = "django" in sys.modules
        import baldur_django.core as core
        for info in pkgutil.walk_packages(core.__path__, "baldur_django.core."):
            importlib.import_module(info.name)
        after_core = "django" in sys.modules

        @baldur.protected("plain", fallback=lambda *a: "fallback")
        def charge(order_id):
            raise ConnectionError("down")

        @baldur.circuit_breaker("plain-async")
        async def fetch():
            return "fetched"

        first = [charge(1), charge(2)]
        state = baldur.get_breaker("plain").state.value
        rejected = charge(3)
        from baldur_django.core.config import settings
        baldur.force_open_circuit("forced", ttl_minutes=1)
        print(json.dumps({
            "after_package": after_package,
            "after_core": after_core,
            "after_use": "django" in sys.modules,
            "first": first,
            "state": state,
            "rejected": rejected,
            "threshold": baldur.get_breaker("plain").config.failure_threshold,
            "source": settings.source("BALDUR_CB_FAILURE_THRESHOLD"),
            "async": asyncio.run(fetch()),
            "forced": baldur.get_breaker("forced").snapshot()["forced"],
        }))
        """,
        BALDUR_CB_FAILURE_THRESHOLD="2",
    )
    assert result["after_package"] is False
    assert result["after_core"] is False
    assert result["after_use"] is False
    assert result["first"] == ["fallback", "fallback"]
    assert result["state"] == "open"  # two failures: the env threshold of 2 took effect
    assert result["rejected"] == "fallback"
    assert result["threshold"] == 2
    assert result["source"] == "env"
    assert result["async"] == "fetched"
    assert result["forced"] == "open"


def test_plain_python_works_when_django_cannot_be_imported():
    """Section 0: the core does not even need Django installed: with every framework import
    blocked, the package and its core load and a protected call works."""
    script = """
    import importlib, json, pkgutil, sys
    BLOCKED = %r
    class Block:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in BLOCKED:
                raise ImportError("blocked in this test: " + name)
            return None
    sys.meta_path.insert(0, Block())
    import baldur_django as baldur
    import baldur_django.core as core
    for info in pkgutil.walk_packages(core.__path__, "baldur_django.core."):
        importlib.import_module(info.name)
    @baldur.circuit_breaker("blocked")
    def ok():
        return 42
    print(json.dumps({"value": ok(), "state": baldur.get_breaker("blocked").state.value}))
    """
    result = run_plain(script % sorted(FRAMEWORKS))
    assert result == {"value": 42, "state": "closed"}


def test_plain_python_bad_env_value_is_a_clear_config_error():
    """CFG-3: in a plain process a bad BALDUR_* env var fails with a ConfigError naming it and the
    value: when the decorated function is called, never when it is decorated (import time)."""
    result = run_plain(
        """
        import json
        import baldur_django as baldur
        func = baldur.circuit_breaker("x")(lambda: 1)
        try:
            func()
        except baldur.ConfigError as exc:
            print(json.dumps({"error": str(exc), "type": type(exc).__name__}))
        else:
            print(json.dumps({"error": None}))
        """,
        BALDUR_CB_FAILURE_THRESHOLD="lots",
    )
    assert result["type"] == "ConfigError"
    assert "BALDUR_CB_FAILURE_THRESHOLD" in result["error"] and "lots" in result["error"]


def test_plain_python_services_json_from_env():
    """CFG-1: BALDUR_SERVICES as JSON in the environment of a plain process."""
    result = run_plain(
        """
        import json
        import baldur_django as baldur
        print(json.dumps({
            "pay": baldur.get_breaker("pay").config.failure_threshold,
            "other": baldur.get_breaker("other").config.failure_threshold,
        }))
        """,
        BALDUR_SERVICES='{"pay": {"failure_threshold": 3}}',
        BALDUR_CB_FAILURE_THRESHOLD="8",
    )
    assert result == {"pay": 3, "other": 8}


# ----------------------------------------------------------------- static check


def imported_modules(path: Path) -> set[tuple[str, int]]:
    """Top-level names of every absolute import in *path* (static, plus import_module("x") calls)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found: set[tuple[str, int]] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                found.add((alias.name.split(".")[0], node.lineno))
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0 and node.module:
                found.add((node.module.split(".")[0], node.lineno))
        elif isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            if name in ("import_module", "__import__") and node.args:
                arg = node.args[0]
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                    found.add((arg.value.split(".")[0], node.lineno))
    return found


def test_core_never_imports_frameworks_statically():
    """Section 0/design habit 2: no file under baldur_django/core imports Django, DRF, Celery,
    Flask, Starlette or prometheus_client; redis only in core/stores/redis.py."""
    files = sorted(CORE.rglob("*.py"))
    assert len(files) >= 10
    offences = []
    for path in files:
        rel = path.relative_to(PACKAGE).as_posix()
        for module, line in imported_modules(path):
            if module in FRAMEWORKS:
                offences.append(f"{rel}:{line} imports {module}")
            elif module == "redis" and rel != "core/stores/redis.py":
                offences.append(f"{rel}:{line} imports redis (only core/stores/redis.py may)")
    assert offences == []


def test_static_check_catches_a_django_import(tmp_path):
    """The static checker itself: it does see `import django`, `from rest_framework...` and import_module("celery")."""
    sample = tmp_path / "sample.py"
    sample.write_text(
        "import os\nimport django.conf\nfrom rest_framework import views\nimport importlib\n"
        "def f():\n    importlib.import_module('celery.app')\n    from . import sibling\n"
    )
    modules = {name for name, _ in imported_modules(sample)}
    assert {"django", "rest_framework", "celery"} <= modules
    assert "sibling" not in modules


@pytest.mark.parametrize("module", ["baldur_django", "baldur_django.core.errors"])
def test_import_needs_no_django_settings(module):
    """Section 0: importing the package (or a core module) needs no Django settings at all."""
    result = run_plain(
        f"""
        import json, sys
        import {module}
        print(json.dumps({{"django": "django" in sys.modules}}))
        """
    )
    assert result == {"django": False}

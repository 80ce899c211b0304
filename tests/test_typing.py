"""The whole package type-checks with ``mypy --strict`` (DESIGN habit 2, issue 18).

The settings live in pyproject.toml (``[tool.mypy]``): the whole ``baldur_django`` package,
the oldest supported Python, strict mode, and narrow exceptions for the optional
dependencies that ship no types (DRF, celery, django-redis). A developer running plain
``mypy`` in the repository gets exactly this check. mypy's incremental cache
(``.mypy_cache/``, git-ignored) keeps a repeated run to a few seconds; a cold run (a fresh
clone) takes about 15 s of CPU.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def test_the_package_type_checks_strictly():
    """Issue 18: ``mypy --strict`` finds no error anywhere in ``baldur_django`` (a wrong
    annotation in the core or the Django layer fails here)."""
    pytest.importorskip("mypy")
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", "pyproject.toml", "--strict", "baldur_django"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    modules = sum(1 for _ in (REPO / "baldur_django").rglob("*.py"))
    assert f"no issues found in {modules} source files" in done.stdout, done.stdout

"""The pure-Python core type-checks with ``mypy --strict`` (DESIGN habit 2).

The settings live in pyproject.toml (``[tool.mypy]``): the files checked (the core), the
oldest supported Python, strict mode. A developer running plain ``mypy`` in the repository
gets exactly this check. mypy's incremental cache (``.mypy_cache/``, git-ignored) keeps
repeated runs at about a second; a cold run takes ten to twenty.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def test_core_type_checks_strictly():
    """``mypy --strict`` finds no error in ``baldur_django/core`` (a wrong annotation fails here)."""
    pytest.importorskip("mypy")
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", "pyproject.toml", "--strict", "baldur_django/core"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "no issues found" in done.stdout, done.stdout

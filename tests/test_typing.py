"""The pure-Python core type-checks with mypy (DESIGN habit 2)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def test_core_type_checks():
    """mypy finds no error in ``baldur_django/core`` (a regression in its annotations fails here)."""
    pytest.importorskip("mypy")
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--ignore-missing-imports", "--cache-dir", "/dev/null", "baldur_django/core"],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]

"""The code base passes ruff's lint rules and is ruff-formatted (settings: ``[tool.ruff]``
in pyproject.toml). Fix findings with ``ruff check --fix`` / ``ruff format``."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PATHS = ["baldur_django", "tests", "benchmarks", "testproject"]


def _ruff(*args: str) -> subprocess.CompletedProcess[str]:
    """Run the ruff binary of the installed ``ruff`` package (the dev extra pins its version)."""
    pytest.importorskip("ruff")
    from ruff.__main__ import find_ruff_bin

    return subprocess.run(
        [find_ruff_bin(), *args, "--no-cache", *PATHS], cwd=REPO, capture_output=True, text=True, timeout=120
    )


def test_ruff_lint_finds_nothing():
    """``ruff check`` reports no finding (the rule set and its justified ignores: pyproject.toml)."""
    done = _ruff("check", "--output-format", "concise")
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]


def test_code_is_ruff_formatted():
    """``ruff format --check`` would change no file."""
    done = _ruff("format", "--check")
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]

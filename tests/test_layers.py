"""The dependency rule of DESIGN.md, checked by import-linter (contracts in pyproject.toml):
the core imports no framework, and imports point inward (wiring > contrib > Django layer > core)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_import_contracts_are_kept():
    """Section 0: ``baldur_django.core`` imports nothing from Django (or any framework)."""
    linter = shutil.which("lint-imports", path=str(Path(sys.executable).parent)) or shutil.which("lint-imports")
    assert linter, "import-linter is part of the dev extra"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([linter], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "2 kept, 0 broken" in done.stdout

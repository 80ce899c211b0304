"""Packaging: the built wheel carries what an installed package needs beyond its .py files."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_wheel_ships_py_typed_lua_and_templates(tmp_path):
    """The wheel holds the py.typed marker (type checkers read the package's annotations only with
    it), every Lua script of the Redis store, and the admin templates."""
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--disable-pip-version-check", "--no-deps", "-w", tmp_path, ROOT],
        check=True,
        capture_output=True,
        timeout=240,
    )
    (wheel,) = tmp_path.glob("baldur_django-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "baldur_django/py.typed" in names
    scripts = {p.relative_to(ROOT).as_posix() for p in (ROOT / "baldur_django/core/stores/lua").glob("*.lua")}
    assert scripts and scripts <= names, sorted(scripts - names)
    templates = {p.relative_to(ROOT).as_posix() for p in (ROOT / "baldur_django/templates").rglob("*.html")}
    assert templates and templates <= names, sorted(templates - names)
    assert not any(name.startswith(("tests/", "testproject/")) for name in names)

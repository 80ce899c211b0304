"""The suite runs the Django it claims to: under tox, the one the env names (a ``django42`` env
once installed 4.2 and then ran 5.2, because the dev extra's dependencies pulled it up); in any
run, a version inside the range of the ``django`` extra."""

from __future__ import annotations

import os
import re
from pathlib import Path

import django
from packaging.specifiers import SpecifierSet

ROOT = Path(__file__).resolve().parent.parent


def django_extra() -> SpecifierSet:
    """The range the ``django`` extra of pyproject.toml admits (``Django>=4.2,<7``)."""
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    match = re.search(r'^django = \["Django([^"]+)"\]', text, re.MULTILINE)
    assert match, "pyproject.toml has no django extra"
    return SpecifierSet(match.group(1))


def test_the_running_django_is_the_one_the_env_names():
    expected = os.environ.get("BALDUR_EXPECT_DJANGO")  # set by every tox env (tox.ini)
    running = django.VERSION[:2]
    if expected:
        major, minor = (int(part) for part in expected.split("."))
        assert running == (major, minor), (
            f"this env names Django {expected} but runs {django.get_version()}: a dependency replaced it"
        )
    assert django.get_version() in django_extra(), (
        f"Django {django.get_version()} is outside the django extra's range {django_extra()}"
    )

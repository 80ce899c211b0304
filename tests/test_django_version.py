"""The suite runs the Django it claims to, and the matrix is stated the same way everywhere.

Every tox env and every ``./dev test`` leg sets ``BALDUR_EXPECT_DJANGO`` (tox.ini from the env's
name, ``./dev`` from the Django its constraints file pins): a run whose Django differs fails here,
as an env once did that installed one Django and then ran another because a dependency of the
dev extra pulled it up. Under ``CI=true`` the variable must be set: ``.ci/run`` goes through
``./dev``. The static checks tie tox.ini, the constraints files and pyproject.toml's classifiers
and ranges together, so that adding a leg or an env in one place and not the others fails.
"""

from __future__ import annotations

import configparser
import os
import re
from pathlib import Path

import django
import pytest
from packaging.specifiers import SpecifierSet
from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
#: Django releases and the oldest Python each supports, for the pairs the matrix may hold
DJANGO_NEEDS_PYTHON = {"5.2": (3, 10), "6.0": (3, 12), "6.1": (3, 12)}


def django_extra() -> SpecifierSet:
    """The range the ``django`` extra of pyproject.toml admits (``Django>=5.2,<6.2``)."""
    match = re.search(r'^django = \["Django([^"]+)"\]', PYPROJECT, re.MULTILINE)
    assert match, "pyproject.toml has no django extra"
    return SpecifierSet(match.group(1))


def classifiers(prefix: str) -> set[str]:
    """The versions named by pyproject.toml's classifiers that start with *prefix*."""
    return set(re.findall(rf'"{re.escape(prefix)} :: (\d+\.\d+)"', PYPROJECT))


def tox_envs() -> list[tuple[str, str, str]]:
    """``(env name, python "3.12", django "6.0")`` for every env of tox.ini's envlist."""
    parser = configparser.ConfigParser(interpolation=None)
    parser.read(ROOT / "tox.ini", encoding="utf-8")
    names = [name.strip() for name in parser["tox"]["envlist"].replace("\n", ",").split(",") if name.strip()]
    envs = []
    for name in names:
        match = re.fullmatch(r"py3(\d+)-django(\d)(\d)", name)
        assert match, f"tox env {name!r} is not named pyXY-djangoAB"
        envs.append((name, f"3.{match.group(1)}", f"{match.group(2)}.{match.group(3)}"))
    return envs


def pinned_django(constraints: Path) -> Version:
    """The Django release a ``constraints/tested-*.txt`` file pins (``Django==X.Y.Z``)."""
    match = re.search(r"^django==(\S+)$", constraints.read_text(encoding="utf-8"), re.MULTILINE | re.IGNORECASE)
    assert match, f"{constraints.name} pins no Django"
    return Version(match.group(1))


def test_the_running_django_is_the_one_the_env_names():
    expected = os.environ.get("BALDUR_EXPECT_DJANGO")  # set by every tox env and ./dev test leg
    if IN_CI:
        assert expected, "CI=true but BALDUR_EXPECT_DJANGO is unset: run the suite through ./dev test or tox"
    running = django.VERSION[:2]
    if expected:
        major, minor = (int(part) for part in expected.split("."))
        assert running == (major, minor), (
            f"this env names Django {expected} but runs {django.get_version()}: a dependency replaced it"
        )
    assert django.get_version() in django_extra(), (
        f"Django {django.get_version()} is outside the django extra's range {django_extra()}"
    )


def test_every_tox_env_pins_and_expects_the_django_it_names():
    tox_ini = (ROOT / "tox.ini").read_text(encoding="utf-8")
    envs = tox_envs()
    assert envs, "tox.ini lists no env"
    for name, python, version in envs:
        factor = "django" + version.replace(".", "")
        assert f"{factor}: BALDUR_EXPECT_DJANGO = {version}\n" in tox_ini, f"{name}: no BALDUR_EXPECT_DJANGO"
        assert f"{factor}: PIP_CONSTRAINT = {{toxinidir}}/constraints/{factor}.txt\n" in tox_ini, name
        text = (ROOT / "constraints" / f"{factor}.txt").read_text(encoding="utf-8")
        assert re.search(rf"^Django>={re.escape(version)},<", text, re.MULTILINE), (
            f"{factor}.txt pins no Django {version}"
        )
        assert tuple(int(p) for p in python.split(".")) >= DJANGO_NEEDS_PYTHON[version], (
            f"{name}: Django {version} does not support Python {python}"
        )


def test_the_matrix_is_the_one_pyproject_states():
    envs = tox_envs()
    assert {python for _, python, _ in envs} == classifiers("Programming Language :: Python")
    assert {version for _, _, version in envs} == classifiers("Framework :: Django")
    oldest = min(classifiers("Programming Language :: Python"), key=Version)
    assert f'requires-python = ">={oldest}"' in PYPROJECT
    for version in classifiers("Framework :: Django"):
        assert f"{version}.0" in django_extra(), f"Django {version} is outside the django extra"
    # every pair Django supports is an env
    expected = {
        (f"3.{minor}", version)
        for version, needs in DJANGO_NEEDS_PYTHON.items()
        if version in classifiers("Framework :: Django")
        for minor in range(11, 14)
        if (3, minor) >= needs
    }
    assert {(python, version) for _, python, version in envs} == expected


@pytest.mark.parametrize("constraints", sorted((ROOT / "constraints").glob("tested-*.txt")), ids=lambda path: path.stem)
def test_each_tested_constraints_file_pins_a_supported_django(constraints):
    pinned = pinned_django(constraints)
    assert pinned in django_extra(), f"{constraints.name} pins Django {pinned}, outside {django_extra()}"
    assert not re.search(r"^baldur", constraints.read_text(encoding="utf-8"), re.MULTILINE | re.IGNORECASE), (
        f"{constraints.name} pins the project itself"
    )
    leg = re.fullmatch(r"tested-py3(\d+)(?:-django(\d)(\d))?", constraints.stem)
    assert leg, f"{constraints.name} is not named tested-pyXY[-djangoAB].txt"
    if leg.group(2):
        assert (pinned.major, pinned.minor) == (int(leg.group(2)), int(leg.group(3))), constraints.name

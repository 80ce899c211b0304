"""Reproducible installs: each tested constraints file pins every package the dev extra names."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
LEGS = sorted((ROOT / "constraints").glob("tested-*.txt"))


def _pins(path: Path) -> dict[str, str]:
    pins = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            pins[re.sub(r"[-_.]+", "-", name).lower()] = version
    return pins


@pytest.mark.parametrize("path", LEGS, ids=[p.stem for p in LEGS])
def test_each_leg_pins_every_dev_requirement(path):
    """A package named by the dev extra but missing from a leg's constraints would install at
    whatever version is newest that day, so a fresh machine would not get what CI tested."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    pins = _pins(path)
    missing = []
    for text in extras["dev"]:
        requirement = Requirement(text)
        if requirement.marker is not None and not requirement.marker.evaluate():
            continue
        name = re.sub(r"[-_.]+", "-", requirement.name).lower()
        if name not in pins:
            missing.append(name)
        elif not requirement.specifier.contains(pins[name], prereleases=True):
            missing.append(f"{name}=={pins[name]} outside {requirement.specifier}")
    assert not missing, f"{path.name} lacks: {missing}"

"""The durations the README, ``./dev``'s help and the demo's ``--help`` state agree.

Each figure is measured on a fresh clone and written down by hand in three places; an
earlier version said 15 s in one place and 35 s in another for the same run. This test
fails as soon as one place is changed without the others.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _seconds(pattern: str, text: str, where: str) -> int:
    found = re.search(pattern, text)
    assert found, f"{where}: no duration matching {pattern!r}"
    return int(found.group(1))


def test_demo_durations_agree_in_readme_dev_and_demo_help():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    dev = (REPO / "dev").read_text(encoding="utf-8")
    demo_help = subprocess.run(
        [sys.executable, "-m", "testproject.demo", "--help"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    demo_help = " ".join(demo_help.split())  # argparse wraps the help text
    full = {
        "README": _seconds(r"the scripted demo, about (\d+) s", readme, "README"),
        "dev": _seconds(r"about (\d+) s, --short", dev, "dev"),
        "demo --help": _seconds(r"the full run takes about (\d+) s", demo_help, "demo --help"),
    }
    short = {
        "README": _seconds(r"\./dev demo --short: about (\d+) s", readme, "README"),
        "dev": _seconds(r"--short: about (\d+) s", dev, "dev"),
        "demo --help": _seconds(r"short hang phases \(about (\d+) s", demo_help, "demo --help"),
    }
    assert len(set(full.values())) == 1, full
    assert len(set(short.values())) == 1, short
    assert short["README"] < full["README"]


def test_suite_duration_agrees_in_readme_and_dev():
    readme = " ".join((REPO / "README.md").read_text(encoding="utf-8").split())
    dev = (REPO / "dev").read_text(encoding="utf-8")
    stated = {
        "README": _seconds(r"runs every test \(about (\d+) minutes on two cores", readme, "README"),
        "dev": _seconds(r"the whole test suite \(about (\d+) minutes on two cores", dev, "dev"),
    }
    assert len(set(stated.values())) == 1, stated
    assert stated["README"] <= 6  # the suite's own limit on two cores

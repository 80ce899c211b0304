"""The quickstart's Django steps, run as written: a project made by ``startproject`` from the
page's own blocks passes ``check`` and ``migrate``, its view answers as the page shows, and the
page's management commands print what it shows, so docs/quickstart.md cannot drift from the code.

The page is read in order from step 2 to the step before "Protect calls in other shapes": a
```bash block runs line by line in a shell (``python`` and ``django-admin`` are the running
interpreter's), a ```python block whose first line is ``# mysite/<file>.py`` is written into the
project (settings blocks are added to the generated settings; a list with a ``# ...`` line keeps
the generated entries in its place), and in a ```console block each ``$ python manage.py ...``
runs for real and its output is compared with the lines the page shows under it. The page's
``curl`` loop is answered by Django's test client in a separate process, so no server is needed.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from baldur_django.core.knobs import KNOBS

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "docs" / "quickstart.md"
FIRST_STEP, END_STEP = "## 2. ", "## 7. "

BLOCK = re.compile(r"^```(\w+)\n(.*?)^```", re.S | re.M)
FILE_HEADER = re.compile(r"# (mysite/[\w/]+\.py)\n")
LIST = re.compile(r"^(\w+) = \[\n(.*?)^\]\n", re.S | re.M)
CURL_LOOP = re.compile(r"for i in ([\d ]+); do curl .*?(https?://\S+); done")
TIMESTAMP = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC")

pytestmark = pytest.mark.timeout(120)


def django_steps(text: str) -> list[tuple[str, str]]:
    """``(language, body)`` of each fenced block of the page's Django steps, in order."""
    part = text[text.index(FIRST_STEP) : text.index(END_STEP)]
    return [(match.group(1), match.group(2)) for match in BLOCK.finditer(part)]


def merge_settings(generated: str, block: str) -> str:
    """The generated settings with the page's block added; a ``NAME = [ # ... ]`` list in the
    block replaces the generated one, with the generated entries where the ``# ...`` is."""
    for match in LIST.finditer(block):
        name, body = match.groups()
        if "# ..." not in body:
            continue
        old = re.search(rf"^{name} = \[\n(.*?)^\]\n", generated, re.S | re.M)
        assert old, f"startproject's settings have no {name} list to extend"
        merged = re.sub(r"^ *# \.\.\.\n", lambda _: old.group(1), body, flags=re.M)
        generated = generated.replace(old.group(0), f"{name} = [\n{merged}]\n")
        block = block.replace(match.group(0), "")
    return generated + "\n" + block


def normalise(line: str) -> str:
    """A printed line with its times and column padding taken out."""
    return " ".join(TIMESTAMP.sub("<time>", line).split())


def assert_prints(command: str, shown: list[str], printed: str) -> None:
    """Each line the page shows is printed, in order (a line ending in ``...`` is a prefix)."""
    actual = [normalise(line) for line in printed.splitlines() if line.strip()]
    at = 0
    for line in (line for line in shown if line.strip()):
        want = normalise(line)
        prefix = want.endswith("...")
        want = want.rstrip(".").rstrip() if prefix else want
        for index in range(at, len(actual)):
            if actual[index] == want or (prefix and actual[index].startswith(want)):
                at = index + 1
                break
        else:
            pytest.fail(f"`{command}` did not print {line!r} (in the page's order); it printed:\n{printed}")


class Project:
    """The project the page builds, in a temporary directory, run with this interpreter."""

    def __init__(self, base: Path, payments_port: int) -> None:
        self.base = base
        self.cwd = base
        self.payments_port = payments_port
        bin_dir = str(Path(sys.executable).parent)
        self.env = {
            k: v
            for k, v in os.environ.items()
            if k != "DJANGO_SETTINGS_MODULE" and k not in KNOBS and k != "PYTHONPATH"
        }
        self.env.update(PYTHONPATH=str(ROOT), PATH=bin_dir + os.pathsep + os.environ.get("PATH", ""))

    def shell(self, script: str) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            ["bash", "-c", script], cwd=self.cwd, env=self.env, capture_output=True, text=True, timeout=60
        )
        manage = sorted(self.base.glob("**/manage.py"))
        if manage:
            self.cwd = manage[0].parent
        return done

    def write(self, relative: str, body: str) -> None:
        path = self.cwd / relative
        if path.name == "settings.py":
            merged = merge_settings(path.read_text(encoding="utf-8"), body)
            if "PAYMENTS_URL = " in body:
                # The page points PAYMENTS_URL at a port where nothing listens; make sure of it.
                merged += f'\nPAYMENTS_URL = "http://127.0.0.1:{self.payments_port}"\n'
            body = merged
        path.write_text(body, encoding="utf-8")

    def get(self, paths: list[str]) -> list[str]:
        """``<body> <status>`` for each path, as the page's curl loop prints them."""
        script = (
            "import django, json\ndjango.setup()\n"
            "from django.test.utils import setup_test_environment\nsetup_test_environment()\n"
            "from django.test import Client\nclient = Client()\n"
            f"for path in {paths!r}:\n"
            "    response = client.get(path)\n"
            "    print(json.dumps([response.content.decode(), response.status_code]))\n"
        )
        env = dict(self.env, DJANGO_SETTINGS_MODULE="mysite.settings")
        done = subprocess.run(
            [sys.executable, "-c", script], cwd=self.cwd, env=env, capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0, done.stderr
        return [f"{body} {status}" for body, status in map(json.loads, done.stdout.splitlines())]


def run_console(project: Project, body: str) -> None:
    """Run each ``$ `` command of a console block and compare it with the lines shown under it."""
    commands: list[tuple[str, list[str]]] = []
    for line in body.splitlines():
        if line.startswith("$ "):
            commands.append((line[2:], []))
        elif commands:
            commands[-1][1].append(line)
    for command, shown in commands:
        loop = CURL_LOOP.search(command)
        if loop:
            numbers, url = loop.groups()
            path = "/" + url.split("://", 1)[1].split("/", 1)[1]
            printed = "\n".join(project.get([path.replace("$i", n) for n in numbers.split()]))
            assert_prints(command, shown, printed)
            continue
        assert command.startswith("python manage.py "), f"the test does not know how to run `{command}`"
        done = project.shell(command)
        failing = any(line.startswith("ERRORS:") for line in shown)
        assert (done.returncode == 1) if failing else (done.returncode == 0), (
            f"`{command}` exited {done.returncode}:\n{done.stdout}{done.stderr}"
        )
        assert "Traceback" not in done.stderr, done.stderr
        assert_prints(command, shown, done.stdout + done.stderr)


def build(project: Project, text: str) -> list[str]:
    """Follow the page's Django steps in ``project``; the commands run, in order."""
    ran = []
    for language, body in django_steps(text):
        header = FILE_HEADER.match(body)
        if language == "python" and header:
            project.write(header.group(1), body)
            ran.append(f"write {header.group(1)}")
        elif language == "bash":
            done = project.shell("set -e\n" + body)
            assert done.returncode == 0, f"the page's commands failed:\n{body}\n{done.stdout}{done.stderr}"
            ran += [line for line in body.splitlines() if line.strip()]
        elif language == "console":
            run_console(project, body)
            ran += [line[2:] for line in body.splitlines() if line.startswith("$ ")]
    return ran


@pytest.fixture
def closed_port():
    """A loopback port that is bound but not listening: a connection to it is refused at once."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield sock.getsockname()[1]


def test_quickstart_django_steps_build_a_project_that_works(tmp_path, closed_port):
    """CFG-3, OP-7: a project built from the quickstart's Django steps migrates and checks clean,
    its protected view fails twice and is then refused by the open breaker (as the page shows),
    baldur_status and baldur_force print what the page shows, and the page's typo gets the
    check's error id and hint with exit status 1."""
    ran = build(Project(tmp_path, closed_port), QUICKSTART.read_text(encoding="utf-8"))
    for needed in (
        "django-admin startproject mysite .",
        "python manage.py migrate",
        "python manage.py check",
        "write mysite/payments.py",
        "write mysite/views.py",
        "write mysite/urls.py",
        "python manage.py baldur_status",
    ):
        assert needed in ran, f"the quickstart no longer does {needed!r}"
    assert any(step.startswith("for i in") for step in ran), "the quickstart no longer calls its view"
    assert any(step.startswith("python manage.py baldur_force open") for step in ran)


def test_assert_prints_catches_a_line_the_command_did_not_print():
    """Docs: the comparison fails on a changed line or order, and ignores times, padding and blank lines."""
    printed = "backend: database\nSERVICE   STATE\npayments  OPEN   2026-12-02 06:54:42 UTC\n"
    assert_prints("status", ["backend: database", "", "payments OPEN 2025-03-01 14:00:00 UTC"], printed)
    assert_prints("check", ["SERVICE STATE ..."], printed)
    for shown in (["payments  CLOSED"], ["SERVICE STATE", "backend: database"]):
        with pytest.raises(pytest.fail.Exception, match="did not print"):
            assert_prints("status", shown, printed)


def test_merge_settings_keeps_the_generated_entries():
    """Docs: a ``# ...`` line in a settings block stands for what startproject generated."""
    generated = 'A = 1\nINSTALLED_APPS = [\n    "x",\n    "y",\n]\n'
    merged = merge_settings(generated, 'INSTALLED_APPS = [\n    # ...\n    "baldur_django",\n]\nB = 2\n')
    namespace: dict[str, object] = {}
    exec(merged, namespace)
    assert namespace["INSTALLED_APPS"] == ["x", "y", "baldur_django"]
    assert namespace["A"] == 1 and namespace["B"] == 2

"""``./dev serve PORT`` as a real process tree (the autoreloader and the server it runs as
its child): the admin gets its stylesheet, and SIGINT stops every process of the tree.

The server is started the way a script or ``./dev serve &`` starts it, with SIGINT
ignored on entry (a shell without job control does that to its children): the case where
SIGINT used to stop nothing."""

from __future__ import annotations

import http.client
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]

START_SECONDS = 60  # migrate + the reloader's first start, on a busy two-core machine
STOP_SECONDS = 10


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def get(port: int, path: str) -> tuple[int, str, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        return response.status, response.getheader("Content-Type", ""), response.read()
    finally:
        conn.close()


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def members(pgid: int) -> list[int]:
    """Pids whose process group is *pgid* (read from /proc), zombies excluded."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[2]) == pgid and fields[0] != "Z":
            found.append(int(entry.name))
    return found


@pytest.fixture(scope="module")
def dev_serve(tmp_path_factory):
    """One ``./dev serve`` for the module; the SIGINT test, last in the file, stops it."""
    tmp_path = tmp_path_factory.mktemp("serve")
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("DJANGO_SETTINGS_MODULE", "PAYMENTS_URL")}
    env["TESTPROJECT_DB"] = str(tmp_path / "serve.sqlite3")
    log = open(tmp_path / "serve.log", "w+", encoding="utf-8")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        ["./dev", "serve", str(port)],
        cwd=REPO,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # its own process group: we can find and clean up all of it
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),  # as a script starts it
    )
    try:
        deadline = time.monotonic() + START_SECONDS
        while True:
            assert proc.poll() is None, (
                f"./dev serve exited with {proc.returncode}:\n{(tmp_path / 'serve.log').read_text()}"
            )
            try:
                if get(port, "/")[0] == 200:
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline, (
                "./dev serve did not answer in time:\n" + (tmp_path / "serve.log").read_text()
            )
            time.sleep(0.2)  # polling a starting server, bounded by the deadline
        yield proc, port, tmp_path / "serve.log"
    finally:
        if group_alive(proc.pid):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        log.close()


def test_admin_static_files_are_served(dev_serve):
    """The admin renders with its styles: ``/static/admin/css/base.css`` answers 200 with
    CSS (``django.contrib.staticfiles`` is installed, runserver serves it under DEBUG)."""
    _, port, _ = dev_serve
    status, content_type, body = get(port, "/static/admin/css/base.css")
    assert status == 200
    assert content_type.startswith("text/css")
    assert b"body" in body and len(body) > 1000
    status, _, login = get(port, "/admin/login/")
    assert status == 200
    assert b"/static/admin/css/base.css" in login


def test_sigint_stops_the_reloader_and_its_child(dev_serve):
    """One SIGINT to ``./dev serve`` (the reloader's pid) ends the reloader and the server
    child it started, within a deadline, although SIGINT was ignored when it started."""
    proc, port, log = dev_serve
    tree = members(proc.pid)
    assert proc.pid in tree and len(tree) >= 2, f"expected the reloader and its server child, got {tree}"
    os.kill(proc.pid, signal.SIGINT)
    proc.wait(timeout=STOP_SECONDS)
    deadline = time.monotonic() + STOP_SECONDS
    while members(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.05)  # waiting for the orphaned child to go, bounded by the deadline
    assert members(proc.pid) == [], f"still running after SIGINT: {members(proc.pid)}\n{log.read_text()}"
    with pytest.raises(OSError):
        get(port, "/")

"""Processes and plumbing for the incident rehearsal (``benchmarks.incident``): a Redis
server of the run's own, the fake upstream, the incident site under gunicorn or uvicorn,
one-shot HTTP requests and management commands.

Every process here is started by the harness and ended by it, by its own process id.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PYTHON = sys.executable
BIN = Path(PYTHON).parent
SETTINGS = "benchmarks.incident_site.settings"


def free_port() -> int:
    """A TCP port nothing listens on right now (the kernel's pick)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def loadavg() -> str:
    """``/proc/loadavg``'s three averages, as text."""
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def wait_for(check: Any, timeout: float, what: str, pause: float = 0.05) -> Any:
    """Call *check* until it returns something truthy; RuntimeError after *timeout* seconds."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = check()
        except OSError:
            value = None
        if value:
            return value
        if time.monotonic() > deadline:
            raise RuntimeError(f"gave up waiting for {what} after {timeout} s")
        time.sleep(pause)


@dataclass
class Answer:
    """One HTTP exchange: status, X-Pid, body (text), seconds taken, sent and received at (time.time())."""

    status: int
    pid: int
    body: str
    seconds: float
    sent: float
    received: float

    def json(self) -> Any:
        return json.loads(self.body)


def request(
    port: int,
    path: str,
    *,
    method: str = "GET",
    headers: dict[str, str] | None = None,
    body: str | None = None,
    timeout: float = 60.0,
) -> Answer:
    """One request on a new connection to 127.0.0.1:*port*; status 0 when it failed."""
    sent, started = time.time(), time.perf_counter()
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        connection.request(method, path, body=body, headers=headers or {})
        response = connection.getresponse()
        text = response.read().decode("utf-8", "replace")
        status, pid = response.status, int(response.headers.get("X-Pid") or 0)
    except (OSError, http.client.HTTPException) as exc:
        status, pid, text = 0, 0, f"{type(exc).__name__}: {exc}"
    finally:
        connection.close()
    return Answer(status, pid, text, time.perf_counter() - started, sent, time.time())


class RedisServer:
    """A redis-server of the run's own on a free port, no persistence (a restart is empty)."""

    def __init__(self, port: int | None = None) -> None:
        self.port = port or free_port()
        self.process: subprocess.Popen[bytes] | None = None
        self.start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        command = [
            "redis-server",
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--daemonize",
            "no",
            "--loglevel",
            "warning",
        ]
        self.process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for(self.ping, 10, f"redis-server on port {self.port}")

    def client(self, timeout: float = 1.0) -> Any:
        import redis

        return redis.Redis.from_url(self.url, socket_timeout=timeout, socket_connect_timeout=timeout)

    def ping(self) -> bool:
        try:
            return bool(self.client(0.5).ping())
        except Exception:
            return False

    def signal(self, signum: int) -> None:
        assert self.process is not None
        os.kill(self.process.pid, signum)

    def kill(self) -> None:
        """SIGKILL: gone at once, with everything it held."""
        if self.process is not None and self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGCONT)
            self.process.kill()
            self.process.wait()

    def stop(self) -> None:
        self.kill()


class Upstream:
    """``testproject.upstream`` on 0.0.0.0 (so every 127.x.y.z reaches it), switchable."""

    def __init__(self, hang_seconds: float = 30.0) -> None:
        self.process = subprocess.Popen(
            [PYTHON, "-m", "testproject.upstream", "--host", "0.0.0.0", "--port", "0", "--quiet"],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            cwd=str(ROOT),
            env=_environment({}),
            text=True,
        )
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        self.port = int(line.strip().rsplit(":", 1)[1])
        self.control("mode", {"mode": "ok", "hang_seconds": hang_seconds})

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def control(self, what: str, body: dict[str, Any] | None = None) -> Any:
        answer = request(
            self.port,
            f"/control/{what}",
            method="GET" if what == "stats" else "POST",
            body=json.dumps(body or {}),
            headers={"Content-Type": "application/json"},
        )
        return answer.json() if answer.status == 200 else answer.body

    def mode(self, mode: str) -> None:
        self.control("mode", {"mode": mode})

    def stats(self) -> dict[str, Any]:
        return dict(self.control("stats"))

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            self.process.wait(10)


def _environment(extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BALDUR_", "INCIDENT_", "DJANGO_"))}
    env.update(PYTHONPATH=str(ROOT) + os.pathsep + env.get("PYTHONPATH", ""), DJANGO_SETTINGS_MODULE=SETTINGS)
    env.update(extra)
    return env


@dataclass
class Site:
    """The incident site's environment: its Redis, upstream, database file and knobs."""

    redis: RedisServer
    upstream: Upstream
    knobs: dict[str, str] = field(default_factory=dict)
    log: str = ""

    def __post_init__(self) -> None:
        handle, self.db = tempfile.mkstemp(prefix="incident-", suffix=".sqlite3")
        os.close(handle)
        handle, self.log = tempfile.mkstemp(prefix="incident-", suffix=".log")
        os.close(handle)
        manage(self, ["migrate", "-v0"], check=True)

    def env(self) -> dict[str, str]:
        return _environment(
            {
                "INCIDENT_REDIS_URL": self.redis.url,
                "INCIDENT_UPSTREAM": self.upstream.url,
                "INCIDENT_DB": self.db,
                "INCIDENT_LOG": self.log,
                **self.knobs,
            }
        )

    def cleanup(self) -> None:
        for name in (self.db, self.log):
            try:
                os.unlink(name)
            except OSError:
                pass


def manage(site: Site, arguments: list[str], *, check: bool = False) -> subprocess.CompletedProcess[str]:
    """``python -m django ARGUMENTS`` with the site's settings; text output captured."""
    done = subprocess.run(
        [PYTHON, "-m", "django", *arguments], cwd=str(ROOT), env=site.env(), capture_output=True, text=True, timeout=120
    )
    if check and done.returncode:
        raise RuntimeError(f"django {' '.join(arguments)} exited {done.returncode}: {done.stderr[-2000:]}")
    return done


class Server:
    """The incident site under ``gunicorn`` (sync workers) or ``uvicorn`` (``--workers``)."""

    def __init__(self, site: Site, kind: str = "gunicorn", workers: int = 4, timeout: int = 30) -> None:
        self.kind, self.workers, self.port = kind, workers, free_port()
        if kind == "gunicorn":
            command = [
                str(BIN / "gunicorn"),
                "-w",
                str(workers),
                "-b",
                f"127.0.0.1:{self.port}",
                "--timeout",
                str(timeout),
                "--no-control-socket",
                "benchmarks.incident_site.wsgi:application",
            ]
        else:
            command = [
                str(BIN / "uvicorn"),
                "--workers",
                str(workers),
                "--port",
                str(self.port),
                "--no-access-log",
                "--log-level",
                "warning",
                "benchmarks.incident_site.asgi:application",
            ]
        handle, self.log = tempfile.mkstemp(prefix=f"incident-{kind}-", suffix=".log")
        self.output = os.fdopen(handle, "w")
        self.process = subprocess.Popen(
            command, cwd=str(ROOT), env=site.env(), stdout=self.output, stderr=subprocess.STDOUT, start_new_session=True
        )
        wait_for(lambda: request(self.port, "/ping", timeout=2).status == 200, 60, f"{kind} on port {self.port}")
        self.pids = self.find_workers()

    def find_workers(self, timeout: float = 30.0) -> set[int]:
        """The worker process ids, as seen in answers (every worker has answered once)."""
        seen: set[int] = set()

        def enough() -> bool:
            seen.add(request(self.port, "/ping", timeout=5).pid)
            seen.discard(0)
            return len(seen) >= self.workers

        wait_for(enough, timeout, f"all {self.workers} workers to answer", pause=0.01)
        return seen

    def get(self, path: str, **options: Any) -> Answer:
        return request(self.port, path, **options)

    def log_text(self) -> str:
        self.output.flush()
        return Path(self.log).read_text(errors="replace")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.output.close()
        try:
            os.unlink(self.log)
        except OSError:
            pass


def rss_kb(pid: int) -> int:
    """A process's resident set, KB (0 when it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0

"""EM-7 with real processes: prometheus_client's multiprocess mode under a pre-forking
server (``tests/metrics/mp_server.py``, the gunicorn ``--preload`` pattern).

Cost: about 4 s (one server with three workers, one short script).
"""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import textwrap
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector

from . import mp_server
from .conftest import parse

pytestmark = pytest.mark.multiprocess

ROOT = Path(__file__).resolve().parents[2]
WORKERS = 3
CALLS = "baldur_circuit_breaker_calls_total"
BLOCKED = "baldur_circuit_breaker_blocked_requests_total"
TRANSITIONS = "baldur_circuit_breaker_transitions_total"
STATE = "baldur_circuit_breaker_state"


def _env(directory: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env["PROMETHEUS_MULTIPROC_DIR"] = str(directory)
    return env


class Server:
    """The pre-forking server in a process of its own; its stdout lines are queued."""

    def __init__(self, directory: Path) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.metrics.mp_server", str(WORKERS)],
            cwd=ROOT,
            env=_env(directory),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: queue.Queue[str] = queue.Queue()
        self.errors: list[str] = []  # stderr, read all along so the pipe never fills
        threading.Thread(target=self._pump, daemon=True).start()
        threading.Thread(target=lambda: self.errors.extend(self.proc.stderr), daemon=True).start()
        ready = self.line("ready", timeout=30).split()
        self.port, self.parent, self.workers = int(ready[1]), int(ready[2]), [int(p) for p in ready[3:]]

    def _pump(self) -> None:
        for line in self.proc.stdout:
            self.lines.put(line.strip())

    def line(self, prefix: str, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                self.stop()
                raise AssertionError(f"no {prefix!r} line from the server; stderr: {self.stderr()}") from None
            if line.startswith(prefix):
                return line

    def stderr(self) -> str:
        return "".join(self.errors)[-3000:]

    def get(self, path: str) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/{path}", timeout=10) as response:
            return response.read().decode()

    def scrape(self) -> dict:
        return parse(self.get("metrics"))

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)  # the parent stops its workers, then exits
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)


def _series(samples: dict, name: str) -> dict[tuple, float]:
    """``{label values (sorted by label name, service first): value}`` of one family."""
    found = {}
    for (sample, labels), value in samples.items():
        if sample == name:
            labels = dict(labels)
            found[(labels.pop("service"), *(labels[k] for k in sorted(labels)))] = value
    return found


def _expected(oks: int, fails: int, cycles: int) -> dict[str, dict[tuple, float]]:
    """What the host must report: each /cycle is a forced open, 3 rejections, a release and
    a successful trial that closes; the parent did PARENT_OKS + PARENT_CYCLES of its own."""
    oks += mp_server.PARENT_OKS
    cycles += mp_server.PARENT_CYCLES
    zero = {"failure": 0, "ignored": 0, "rate_limited": 0, "success": 0}
    calls = {("svc", k): float(v) for k, v in {**zero, "success": oks, "failure": fails}.items()}
    calls.update({("cyc", k): float(v) for k, v in {**zero, "success": cycles}.items()})
    blocked = {(s, r): 0.0 for s in ("svc", "cyc") for r in ("open", "half_open_full", "frozen")}
    blocked[("cyc", "open")] = 3.0 * cycles
    transitions = {  # labels sorted: from_state, to_state, trigger
        ("cyc", "closed", "open", "forced"): float(cycles),
        ("cyc", "open", "half_open", "released"): float(cycles),
        ("cyc", "half_open", "closed", "half_open_success"): float(cycles),
    }
    exported = {name: {k: v for k, v in series.items() if v} for name, series in ((CALLS, calls), (BLOCKED, blocked))}
    return {**exported, TRANSITIONS: transitions}  # a series that never counted anything is absent


def _reported(samples: dict) -> dict[str, dict[tuple, float]]:
    return {name: _series(samples, name) for name in (CALLS, BLOCKED, TRANSITIONS)}


def test_em7_a_scrape_through_any_worker_reports_the_hosts_sums(tmp_path):
    """EM-7: under a pre-forking server with PROMETHEUS_MULTIPROC_DIR, a scrape landing on
    any worker reports the sums of every process (calls, rejections, transitions) within
    about a second of the calls; the parent's pre-fork counts are counted once, not once
    per child; the state gauge is per live process; a worker that exits cleanly keeps its
    counts in the sums, and its gauge goes with ``mark_process_dead``."""
    server = Server(tmp_path)
    try:
        requests = ["ok/3"] * 12 + ["fail/2"] * 6 + ["cycle"] * 6
        with ThreadPoolExecutor(max_workers=WORKERS) as pool:  # concurrent: the requests spread
            answers = list(pool.map(server.get, requests))
        done = time.monotonic()
        served = {int(answer.split()[0]) for answer in answers}
        assert served <= set(server.workers)
        assert len(served) >= 2, f"every request landed on one worker: {answers}"
        expected = _expected(oks=36, fails=12, cycles=6)
        deadline = done + 10
        while True:
            samples = server.scrape()
            reported = _reported(samples)
            if reported == expected or time.monotonic() > deadline:
                break
        latency = time.monotonic() - done
        assert reported == expected
        assert latency < 2.0, f"the host's sums took {latency:.2f}s to reach a scrape"

        states = _series(samples, STATE)  # liveall: one series per live process and service
        pids = {int(labels[1]) for labels in states}
        assert served <= pids <= {server.parent, *server.workers}
        assert set(states.values()) == {0.0}

        leaving = sorted(served)[0]
        os.kill(leaving, signal.SIGTERM)  # a clean exit: its last counts are written at exit
        assert server.line(f"exited {leaving}", timeout=10) == f"exited {leaving} 0"
        samples = server.scrape()
        assert _reported(samples) == expected  # the exited worker's counts are still in the sums
        assert leaving not in {int(labels[1]) for labels in _series(samples, STATE)}
    finally:
        server.stop()
    assert server.proc.returncode == 0, server.stderr()


def test_em7_a_clean_exit_writes_the_last_counts(tmp_path):
    """EM-7: counts made after the flusher's last pass reach the directory at a clean exit
    (``atexit``): here the flusher thread never gets a pass in."""
    script = textwrap.dedent(
        """
        from baldur_django.contrib import prometheus
        prometheus.FLUSH_SECONDS = 3600  # the thread sleeps through this script
        prometheus.install()
        from baldur_django.core.registry import registry
        breaker = registry.get("exiting")
        for _ in range(5):
            breaker.record_success(breaker.acquire())
        breaker.record_failure(breaker.acquire())
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, env=_env(tmp_path), capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(tmp_path))
    samples = parse(generate_latest(registry).decode())
    assert samples[(CALLS, frozenset({"service": "exiting", "outcome": "success"}.items()))] == 5
    assert samples[(CALLS, frozenset({"service": "exiting", "outcome": "failure"}.items()))] == 1

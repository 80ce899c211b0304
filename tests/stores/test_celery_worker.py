"""ST-5, EM-4: the fleet tasks run by real Celery workers (Redis broker), on the Redis store.

Two worker processes are started for the module (``celery -A tests.stores.celery_app
worker --pool=solo``), each on a queue of its own, with Redis DB 10 as broker and result
backend and the Redis store on DB 11 (``tests/stores/celery_settings.py``; records and
locks under a key prefix unique to this run). The test process plays the rest of the
fleet: it writes records through its own RedisStore, lets time pass for them by shifting
their timestamps back (the store's clock is Redis ``TIME``), sends the tasks by name and
reads their summaries from the result backend.

Overlap is forced, not hoped for: worker A's run is held inside the task body (after it
took the fleet lock) at a gate in Redis that only the test opens, while worker B runs the
same task. Budget: the module under 30 s; the workers are terminated (then killed) by PID
at teardown.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import pytest
import redis

from baldur_django.core.stores.base import safe_key
from baldur_django.core.stores.redis import RedisStore, connect
from tests.conftest import need_server
from tests.stores.conftest import _shift, reachable
from tests.stores.redis_tools import wait_for

pytestmark = [pytest.mark.celery, pytest.mark.redis, pytest.mark.slow, pytest.mark.timeout(60)]

ROOT = Path(__file__).resolve().parents[2]
BROKER_URL = "redis://127.0.0.1:6379/10"
STORE_URL = "redis://127.0.0.1:6379/11"
TASK = "baldur_django.tasks."


class Worker:
    """One ``celery worker`` subprocess; its output is collected by a reader thread."""

    def __init__(self, queue: str, prefix: str, emergency_file: str) -> None:
        self.queue = queue
        self.lines: list[str] = []
        self.ready = threading.Event()
        env = dict(os.environ)
        env.update(
            DJANGO_SETTINGS_MODULE="tests.stores.celery_settings",
            BALDUR_TEST_STORE_PREFIX=prefix,
            BALDUR_TEST_STORE_URL=STORE_URL,
            BALDUR_TEST_BROKER_URL=BROKER_URL,
            BALDUR_EMERGENCY_STATE_FILE=emergency_file,
            BALDUR_EMERGENCY_AUTO_ACTIVATION_ENABLED="true",
            PYTHONPATH=str(ROOT) + os.pathsep + env.get("PYTHONPATH", ""),
        )
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "celery",
                "-A",
                "tests.stores.celery_app",
                "worker",
                "--pool=solo",
                "--concurrency=1",
                "-Q",
                queue,
                "-n",
                f"{queue}@%h",
                "--without-gossip",
                "--without-mingle",
                "--without-heartbeat",
                "-l",
                "INFO",
            ],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.process.stdout:
            self.lines.append(line.rstrip())
            if " ready." in line:
                self.ready.set()

    def wait_ready(self, timeout: float = 25.0) -> None:
        if not self.ready.wait(timeout):
            tail = "\n".join(self.lines[-30:])
            raise AssertionError(
                f"celery worker for {self.queue} not ready after {timeout} s (exit code {self.process.poll()}):\n{tail}"
            )

    def terminate(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()

    def stop(self) -> None:
        self.terminate()
        if self.process.poll() is None:
            try:
                self.process.wait(5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)


class Fleet:
    """The test's side: its own store handle, a Celery client, and the two workers."""

    def __init__(self, prefix: str, queues: tuple[str, str]) -> None:
        from celery import Celery

        self.prefix = prefix
        self.client = connect(STORE_URL, socket_timeout=2.0)
        self.store = RedisStore(self.client, prefix=prefix)
        self.gate = f"{prefix}:gate"
        self.queues = queues
        self.app = Celery("baldur_tests_client", broker=BROKER_URL, backend=BROKER_URL)
        self.app.conf.update(result_expires=600, broker_connection_retry_on_startup=True)

    def send(self, task: str, worker: int = 0):
        return self.app.send_task(TASK + task, queue=self.queues[worker])

    def run(self, task: str, worker: int = 0, timeout: float = 15.0) -> dict:
        return self.send(task, worker).get(timeout=timeout)

    def age(self, name: str, seconds: float) -> None:
        """Let *seconds* pass for the record of *name* (shift its timestamps back)."""
        key = self.store.key(name)
        self.client.set(key, _shift(self.client.get(key), seconds))

    def lock_key(self, job: str) -> str:
        return f"{self.prefix}:lock:{{{safe_key('task:' + job)}}}"


@pytest.fixture(scope="module")
def fleet():
    need_server("Redis at 127.0.0.1:6379", reachable("127.0.0.1", 6379))
    run = uuid.uuid4().hex[:10]
    prefix = f"celerytest-{run}"
    queues = (f"baldur-test-{run}-a", f"baldur-test-{run}-b")
    started = time.monotonic()
    state_dir = tempfile.mkdtemp(prefix="baldur-celery-emergency-")
    emergency_file = os.path.join(state_dir, "level.json")
    workers = [Worker(queue, prefix, emergency_file) for queue in queues]
    fleet = Fleet(prefix, queues)
    fleet.emergency_file = emergency_file
    try:
        for worker in workers:
            worker.wait_ready()
        fleet.workers = workers
        yield fleet
    finally:
        for worker in workers:
            worker.terminate()  # both at once, then wait (and kill) each
        for worker in workers:
            worker.stop()
        for key in fleet.client.scan_iter(f"{prefix}:*"):
            fleet.client.delete(key)
        broker = redis.Redis.from_url(BROKER_URL)
        for queue in queues:
            broker.delete(queue, f"_kombu.binding.{queue}", f"_kombu.binding_permanent.{queue}")
        fleet.app.close()
        shutil.rmtree(state_dir, ignore_errors=True)
    assert time.monotonic() - started < 30.0, "ST-5 celery group over its 30 s budget"


def test_st5_recovery_sweep_moves_a_due_record_to_half_open(fleet):
    """ST-5: recovery_sweep through a real worker moves an OPEN record past its recovery timeout
    to HALF_OPEN in the shared store; a forced-open one and a not-yet-due one stay OPEN."""
    store = fleet.store
    for name in ("sweep-due", "sweep-early", "sweep-forced"):
        store.load(name)  # first use in some worker: registered
    store.trip("sweep-due", trigger="consecutive_failures", recovery_timeout=5.0)
    store.trip("sweep-early", trigger="failure_rate", recovery_timeout=3600.0)
    store.force("sweep-forced", mode="open", ttl_seconds=600.0, reason="maintenance", actor="ops")
    fleet.age("sweep-due", 6.0)
    summary = fleet.run("recovery_sweep")
    assert summary["job"] == "recovery_sweep" and summary["skipped"] is None
    assert summary["moved"] == ["sweep-due"]
    assert store.inspect("sweep-due").record.state == "half_open"
    assert store.inspect("sweep-due").record.trigger == "recovery_timeout"
    assert store.inspect("sweep-early").record.state == "open"
    assert store.inspect("sweep-forced").record.state == "open"
    assert fleet.run("recovery_sweep", worker=1)["moved"] == []  # once for the fleet


def test_st5_sync_state_lapses_an_expired_force(fleet):
    """ST-5/OP-3: sync_state through a real worker lapses a force whose lifetime is over (a forced
    open lapses to HALF_OPEN) and reports it once."""
    store = fleet.store
    store.force("sync-lapsing", mode="open", ttl_seconds=60.0, reason="maintenance", actor="ops")
    store.force("sync-holding", mode="closed", ttl_seconds=3600.0, reason="known good", actor="ops")
    fleet.age("sync-lapsing", 61.0)
    summary = fleet.run("sync_state")
    assert summary["skipped"] is None and summary["lapsed"] == ["sync-lapsing"]
    record = store.inspect("sync-lapsing").record
    assert record.state == "half_open" and record.forced is None and record.trigger == "force_lapsed"
    assert store.inspect("sync-holding").record.forced == "closed"
    assert fleet.run("sync_state", worker=1)["lapsed"] == []


def test_st5_emergency_check_returns_its_counts(fleet):
    """ST-5/EM-4 input: emergency_check through a real worker counts the registered breakers and
    the OPEN ones in the shared store."""
    store = fleet.store
    store.load("census-open")
    store.trip("census-open", trigger="consecutive_failures", recovery_timeout=3600.0)
    names = store.names()
    expected_open = sum(store.inspect(name).record.state == "open" for name in names)
    summary = fleet.run("emergency_check")
    assert summary["skipped"] is None
    assert summary["breakers"] == len(names) >= 1
    assert summary["open"] == expected_open >= 1


def test_st5_overlapping_runs_second_skips_locked(fleet):
    """ST-5: worker A's recovery_sweep is held inside its body (holding the fleet lock) while
    worker B runs recovery_sweep: B's run finds the lock held and returns skipped='locked';
    A's run then completes and releases the lock."""
    client, gate = fleet.client, fleet.gate
    client.delete(f"{gate}:inside", f"{gate}:release")
    client.set(f"{gate}:hold", 1)
    first = fleet.send("recovery_sweep", worker=0)
    try:
        inside = client.blpop([f"{gate}:inside"], timeout=15)
        assert inside is not None, "worker A never reached the task body"
        client.delete(f"{gate}:hold")
        assert client.exists(fleet.lock_key("recovery_sweep"))  # A holds the fleet lock
        second = fleet.run("recovery_sweep", worker=1)
        assert second["skipped"] == "locked" and second["breakers"] == 0
    finally:
        client.delete(f"{gate}:hold")
        client.rpush(f"{gate}:release", "go")
    result = first.get(timeout=15)
    assert result["skipped"] is None and result["breakers"] >= 1
    assert not client.exists(fleet.lock_key("recovery_sweep"))  # released by its holder
    assert fleet.run("recovery_sweep", worker=1)["skipped"] is None


def test_st5_lock_of_a_crashed_run_blocks_until_it_expires(fleet):
    """ST-5: a lock left by a run that crashed (written directly, 1.5 s to live) makes runs skip
    while it lives; once Redis expires it, the next run goes ahead."""
    key = fleet.lock_key("sync_state")
    assert fleet.client.set(key, "crashed-run", px=1500, nx=True)
    summary = fleet.run("sync_state")
    assert summary["skipped"] == "locked"
    assert fleet.client.get(key) == b"crashed-run"  # a skipping run never touches another's lock
    wait_for(lambda: not fleet.client.exists(key), timeout=5, what="the crashed run's lock to expire")
    assert fleet.run("sync_state", worker=1)["skipped"] is None


def test_em4_emergency_check_declares_level_3_in_a_real_worker(fleet):
    """EM-4: a real worker runs tasks.emergency_check once; the shared emergency record already
    holds one check over the threshold (an earlier run, 10 s ago), the store now has at least
    70 % of its breakers OPEN: this run is the second consecutive check and declares Level 3
    (source "auto") in the shared state file."""
    from baldur_django.core import emergency

    store = fleet.store
    names = store.names()
    open_now = sum(store.inspect(name).record.state == "open" for name in names)
    extra = max(3, -(-(7 * len(names) - 10 * open_now) // 3) + 1)  # enough new OPEN breakers for >= 70 %
    for i in range(extra):
        name = f"em4-down-{i}"
        store.load(name)
        store.trip(name, trigger="consecutive_failures", recovery_timeout=3600.0)
    backend = emergency.FileLevelBackend(fleet.emergency_file)
    backend.update(lambda current: emergency.LevelState(check_at=time.time() - 10.0, check_streak=1))
    summary = fleet.run("emergency_check")
    assert summary["skipped"] is None, summary
    assert summary["emergency"]["over"] and summary["emergency"]["declared"], summary
    state = backend.read()
    assert state.level == 3 and state.source == "auto" and state.actor == "auto-activation"
    assert state.expires_at == pytest.approx(time.time() + 30 * 60, abs=60)
    backend.update(lambda current: emergency.LevelState())  # leave the workers unfrozen

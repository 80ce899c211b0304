"""A seeded chaos test of the fleet protocol: real processes, a real (private) Redis, real faults.

**What runs.** The controller (this test's process) starts its own ``redis-server`` on a
free port (append-only file, ``appendfsync always``; never the shared 127.0.0.1:6379),
a flaky TCP *target* standing in for the protected dependency, and ``WORKERS`` worker
processes (``multiprocessing`` spawn; ``tests/stores/chaos_worker.py``). Each worker
calls every breaker of ``BREAKERS`` (RedisStore, sync interval ``SYNC`` s, probe lease
``LEASE`` s, recovery timeout ``RECOVERY`` s) from one thread per breaker, and runs the
fleet jobs of ``core.maintenance`` (recovery sweep, state sync, emergency check; lock
lifetime ``JOB_TTL`` s, some store operations of a run delayed by up to ``JOB_SLOW`` s).
The target fails each breaker's calls during seeded failing phases and holds trials up to
0.3 s; it records every request with its arrival time, and for a trial whether it was
admitted by the store (a lease token) and in which probing round.

A ``random.Random(seed)`` draws the fault schedule up front: SIGKILL a worker and start
a new incarnation; restart Redis keeping its data (SIGKILL + restart on the same port:
scripts lost, so NOSCRIPT) or losing it (the append-only file deleted: a wipe), also after
an outage of ``OUTAGE`` seconds (``outage_wipe``, twice per run at fixed points);
``SCRIPT FLUSH``; pause Redis (SIGSTOP, SIGCONT 0.1-1.6 s later, asynchronously, so
operator actions and kills also land during a pause); force a breaker open or closed
with a 0.8-3 s lifetime, or release it, through a breaker of the controller (the
operator API). Kills often pick the worker whose shared probe is in flight at the
target. After ``BALDUR_CHAOS_SECONDS`` (default 18) the faults stop, every force is
released, the target heals, and the fleet must converge.

Every call, rejection, trial admission, trial finish, transition/force/lapse event, and
every store operation of every fleet-job run is logged by the workers with ``time.time()``
(one host, one clock; Redis ``TIME`` reads the same clock). A monitor thread reads the
raw records (``GET``, which normalises nothing) every 20 ms.

**Invariants checked afterwards.**

1. *Probe budget (ST-2, CB-6).* A probing round is one store record version of a
   HALF_OPEN record, named ``(version, opened_at)`` (``opened_at`` tells rounds apart
   across a wipe, where versions start again). A probe is *shared* when the store
   admitted it (it holds a lease token); those are the probes made "while the store is
   up". Probes admitted by a worker's own judgement while its store did not answer
   (ST-4) are per-worker by the spec and are not counted. Per round, the shared probes
   that reach the target number at most ``half_open_max_calls`` plus the number of them
   whose slot was freed by its lease rather than settled: those whose finish was not
   answered before the lease expired (worker killed, store paused or restarted). That
   bound is exact: when the last probe of the round is admitted, every settled one still
   holds its slot (live or as a success).
2. *No stuck HALF_OPEN after a prober died (ST-2).* For each shared probe whose worker was
   SIGKILLed before it finished, the monitor sees its round end (the record leaves that
   HALF_OPEN version: closed, reopened, forced, wiped) by the lease expiry + recovery
   timeout + sync interval + probe retry + 1.5 s, plus the time the store was down.
3. *Forces (OP-2, OP-4).* While a force the controller stored is live (from its answer to
   the next operator action on that breaker, its lifetime, or a wipe), every monitor
   sample of the record carries that force with its state (open or closed): nothing
   automatic overwrites it. Workers obey it one sync interval (+0.5 s) after it was
   stored unless a store fault came in between (then ST-4 local judgement rules):
   forced open, no call reaches the target; forced closed, no call is rejected. A force
   that lapses is announced (``force_lapsed``) at most once fleet-wide, and exactly once
   when no store fault surrounds its expiry.
4. *No store exception reaches a caller (ST-4).* Callers see only CircuitOpenError or the
   target's own error; fleet jobs never raise. An operator action may raise StoreError
   during an outage (OP-4) and nothing else.
5. *A fleet job never runs twice at once (ST-5).* For each job, the runs that took the lock
   are active from the lock's answer to the answer of their last store operation (to
   the kill, for one cut short); no two overlap. Exception: a wipe between them (the
   store lost the lock itself).
6. *Convergence.* Once the faults stop and the target is healthy, every record is CLOSED
   and unforced within 10 s and every worker ends CLOSED and unforced.
7. *Workers follow the record (ST-3).* No rejection while the record has been CLOSED, and
   no CLOSED admission while it has been OPEN (unforced, one version, every monitor
   sample) for a sync interval + trial hold + socket timeout + 0.5 s and stays so 0.2 s
   after, with no store fault in or just before that window.

8. *A worker's own OPEN holds (ST-4).* When a worker trips, or re-opens after a failed
   trial, while its store does not answer (its event says ``down``), none of its calls on
   that breaker reaches the target for the recovery timeout, whatever the store holds
   then: in particular not after Redis came back empty. Two things outrank the worker's
   own judgement: an operator's force or release on that breaker around that time (OP-2,
   the window is exempt), and a probe the store admitted in a HALF_OPEN round it holds
   (a newer shared decision than the worker's open, which ST-4 lets it adopt). Besides
   the drawn faults, every run has two outages at fixed points (30 % and 65 % of the
   chaos time) that keep Redis down for ``OUTAGE`` seconds, then bring it back empty,
   while every breaker's calls fail (from 0.7 s before until ``TAIL`` seconds after): the breakers trip
   into Redis, re-open locally after failed local trials, and meet an empty store.
9. *An empty store is no reason to close (ST-4).* When a worker's store operation (a
   consult, a probe request, a trial's outcome, the sweep of a state read) answers with a
   fresh CLOSED record (version 0: Redis came back without its data) while the worker's
   breaker holds OPEN or HALF_OPEN, the worker's next call admitted as CLOSED on that
   breaker comes after a close decided since that read: a trial round some worker closed
   (its ``state_changed`` to closed), the record seen CLOSED at a version above 0, or an
   operator's force or release on that breaker. The workers log each such read (``empty``).
   Besides the two outages of invariant 8, every run has a third, short one at 85 % of the
   chaos time (Redis down under ``RECOVERY``, then back empty; the breakers' calls fail from
   0.7 s before until Redis is back): the workers still hold the open they wrote when they
   read the empty store.

What cannot be checked, and why (docs/fleet.md, "Limits that remain"): a command sent
before a pause may be applied by the server after the client gave up on it, so a job's
late write can land after its lock expired (the history only shows the client's side);
a wipe loses the jobs' locks (runs around a wipe are not compared); a run stalled for more
than half its lock's lifetime between its check and its write could overlap the next one
(``JOB_SLOW`` stays below that margin).

Replay: the seed is printed (``chaos seed=...``) and in every failure message;
``BALDUR_CHAOS_SEED=<n>`` replays the same fault schedule and target phases (thread and
process timing still differ). ``BALDUR_CHAOS_SECONDS=<s>`` runs longer. Budget: about
25-30 s by default.
"""

from __future__ import annotations

import bisect
import json
import multiprocessing
import os
import random
import shutil
import signal
import socketserver
import subprocess
import threading
import time
import uuid
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest
import redis

import baldur_django as baldur
from baldur_django.core.errors import StoreError
from baldur_django.core.events import bus
from baldur_django.core.stores.base import StoreUnavailable, decode
from baldur_django.core.stores.redis import RedisStore, connect
from tests.conftest import need_server
from tests.stores import chaos_worker
from tests.stores.redis_tools import REDIS_SERVER, free_port, wait_for

pytestmark = [
    pytest.mark.slow,
    pytest.mark.multiprocess,
    pytest.mark.redis,
    pytest.mark.timeout(300),
    pytest.mark.django_db,  # the operator actions write audit rows (OP-6)
]

WORKERS = 4
BREAKERS = {  # name -> per-call overrides (one breaker per half_open_max_calls 1, 2, 3)
    f"chaos-{letter}": {
        "failure_threshold": 2,
        "failure_rate_threshold": 0,
        "recovery_timeout": 0.4,
        "half_open_max_calls": calls,
    }
    for letter, calls in (("a", 1), ("b", 2), ("c", 3))
}
RECOVERY = 0.4
SYNC = 0.3
LEASE = 1.0
SOCKET_TIMEOUT = 0.2
JOB_TTL = 1.0
JOB_SLOW = 0.4  # < JOB_TTL / 2: the lock's renewal margin covers it (see invariant 5)
IDLE = 12  # registered names nobody calls: jobs that walk the registry run long enough to renew
TRIAL_HOLD = 0.3  # < LEASE: a live probe never outlives its lease
SLACK = 0.5  # scheduling slack on a busy 2-core machine, seconds
DEFAULT_SECONDS = 18.0
OUTAGE = (0.8, 1.1)  # seconds Redis stays down before an outage_wipe brings it back empty (> RECOVERY + hold)
SHORT_OUTAGE = (0.0, 0.15)  # seconds Redis stays down in the third outage_wipe (< RECOVERY)
TAIL = 2.0  # seconds the target keeps failing after an outage_wipe: the fleet meets the empty store re-opening


# --------------------------------------------------------------------------- plumbing
class ChaosRedis:
    """The test's own redis-server (append-only file, fsync always) on a free port.

    ``kill`` + ``start`` is a restart that keeps the data; ``wipe`` deletes the data
    directory between the two. ``pause``/``resume`` are SIGSTOP/SIGCONT.
    """

    def __init__(self, directory: Path) -> None:
        self.port = free_port()
        self.dir = directory
        self.process: subprocess.Popen | None = None

    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def _answers(self) -> bool:
        client = redis.Redis(port=self.port, socket_timeout=0.2, socket_connect_timeout=0.2)
        try:
            return bool(client.ping())
        except (redis.RedisError, OSError):
            return False
        finally:
            client.close()

    def start(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        args = [REDIS_SERVER, "--port", str(self.port), "--bind", "127.0.0.1", "--save", ""]
        args += ["--appendonly", "yes", "--appendfsync", "always", "--dir", str(self.dir)]
        args += ["--daemonize", "no", "--loglevel", "warning"]
        self.process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

        def up() -> bool:
            assert self.process is not None
            if self.process.poll() is not None:
                raise AssertionError(f"redis-server exited with {self.process.returncode}")
            return self._answers()

        wait_for(up, 10.0, "the chaos redis-server to answer PING")

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGCONT)  # a stopped process dies only once continued
            os.kill(self.process.pid, signal.SIGKILL)
            self.process.wait(10)

    def wipe(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)

    def pause(self) -> None:
        assert self.process is not None
        os.kill(self.process.pid, signal.SIGSTOP)

    def resume(self) -> None:
        assert self.process is not None
        os.kill(self.process.pid, signal.SIGCONT)


class Target(socketserver.ThreadingTCPServer):
    """The flaky dependency: one JSON line in, ``ok``/``fail`` out; records every request."""

    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 256

    def __init__(self, failing: dict[str, list[tuple[float, float]]], seed: int) -> None:
        self.failing = failing  # breaker -> absolute [start, end) failing intervals
        self.seed = seed
        self.arrivals: list[dict[str, Any]] = []
        self.inflight: dict[str, dict[str, Any]] = {}  # requests arrived and not answered yet
        self.lock = threading.Lock()
        super().__init__(("127.0.0.1", 0), TargetHandler)

    def fails(self, breaker: str, at: float) -> bool:
        return any(start <= at < end for start, end in self.failing.get(breaker, ()))


class TargetHandler(socketserver.StreamRequestHandler):
    def handle(self) -> None:
        line = self.rfile.readline()
        at = time.time()
        request = json.loads(line)
        server: Target = self.server  # type: ignore[assignment]
        fail = server.fails(request["b"], at)
        with server.lock:
            server.arrivals.append({**request, "at": at, "fail": fail})
            server.inflight[request["id"]] = request
        hold = random.Random(f"{server.seed}-{request['id']}").uniform(0, TRIAL_HOLD if request["trial"] else 0.02)
        try:
            time.sleep(hold)  # the dependency's own latency
            self.wfile.write(b"fail\n" if fail else b"ok\n")
        finally:
            with server.lock:
                server.inflight.pop(request["id"], None)


def draw_schedule(rng: random.Random, seconds: float) -> tuple[list[tuple[float, str, dict]], dict]:
    """The fault schedule (offset seconds, action, params) and the target's failing phases
    (breaker -> [(start, end)] offsets): everything the seed decides."""
    actions = ["kill", "restart", "wipe", "flush", "pause", "force", "force", "release"]
    weights = [3, 1, 1, 1, 1, 2, 1, 2]  # fewer pauses than before the fixed outages came
    schedule = []
    t = 1.0
    while True:
        t += rng.uniform(0.25, 1.0)
        if t >= seconds:
            break
        action = rng.choices(actions, weights)[0]
        params: dict[str, Any] = {}
        if action == "kill":
            params = {"worker": rng.randrange(WORKERS), "restart_after": rng.uniform(0.0, 0.6)}
            params["prober"] = rng.random() < 0.6  # rather the worker of a shared probe in flight
        elif action == "pause":
            params = {"seconds": rng.choice([rng.uniform(0.1, 0.5), rng.uniform(1.0, 1.6)])}
        elif action == "force":
            params = {"b": rng.choice(sorted(BREAKERS)), "mode": rng.choice(["open", "closed"])}
            params["ttl"] = rng.uniform(0.8, 3.0)
        elif action == "release":
            params = {"b": rng.choice(sorted(BREAKERS))}
        schedule.append((t, action, params))
    # invariant 8 needs "a local re-open, then a wipe" every run: two outages that end in a wipe
    # at fixed points, besides the drawn ones
    # (in place of the server faults drawn around them, so the store is still up often enough
    # for invariant 7 to have windows to check)
    outages = [(seconds * share, {"down": rng.uniform(*OUTAGE)}) for share in (0.3, 0.65)]
    # invariant 9 needs "an open written to Redis, then Redis back empty within that open time":
    # a third, short outage (workers still hold the open they wrote when the store answers again)
    outages.append((seconds * 0.85, {"down": rng.uniform(*SHORT_OUTAGE), "short": True}))
    server = ("restart", "wipe", "flush", "pause")
    schedule = [
        entry
        for entry in schedule
        if entry[1] not in server or not any(t - 1.5 <= entry[0] <= t + p["down"] + 1.5 for t, p in outages)
    ]
    schedule += [(t, "outage_wipe", p) for t, p in outages]
    schedule.sort(key=lambda entry: entry[0])
    phases = {}
    for name in sorted(BREAKERS):
        spans, t, failing = [], 0.0, False
        while t < seconds:
            length = rng.uniform(0.3, 2.5) if failing else rng.uniform(0.5, 3.0)
            if failing:
                spans.append((t, min(t + length, seconds)))
            t += length
            failing = not failing
        # every breaker's calls fail from just before an outage until after Redis is back: the breakers
        # trip (written to Redis), their local trials fail while Redis is down (local re-opens)
        # and for TAIL seconds after it is back, so the fleet meets the empty store while re-opening
        # (the short one's failures end when Redis is back: the opens the workers wrote before it
        # are what they hold when they read the empty store)
        spans += [
            (t - 0.7, t + p["down"] + (0.0 if p.get("short") else TAIL))
            for t, action, p in schedule
            if action == "outage_wipe"
        ]
        phases[name] = spans
    return schedule, phases


def read_logs(directory: Path) -> list[dict[str, Any]]:
    """Every worker line, tagged with its worker and incarnation (a torn last line is skipped)."""
    lines = []
    for path in sorted(directory.glob("w*.jsonl")):
        wid, inc = path.stem[1:].split("-")
        for raw in path.read_text().splitlines():
            try:
                entry = json.loads(raw)
            except ValueError:
                continue  # a line cut by SIGKILL
            entry["w"], entry["inc"] = int(wid), int(inc)
            lines.append(entry)
    return lines


def overlaps(a0: float, a1: float, b0: float, b1: float) -> bool:
    return a0 <= b1 and b0 <= a1


# ----------------------------------------------------------------------------- the run
@pytest.fixture
def chaos_seed() -> int:
    raw = os.environ.get("BALDUR_CHAOS_SEED")
    seed = int(raw) if raw else random.SystemRandom().randrange(2**31)
    print(f"chaos seed={seed} (replay: BALDUR_CHAOS_SEED={seed})")
    return seed


@pytest.fixture
def chaos_target(chaos_seed):
    """The flaky target, serving from a thread; shut down at teardown."""
    target = Target({}, chaos_seed)
    threading.Thread(target=target.serve_forever, name="target", daemon=True).start()
    yield target
    target.shutdown()
    target.server_close()


@pytest.fixture
def chaos_redis(tmp_path):
    """The test's own redis-server; killed at teardown whatever happened."""
    need_server("redis-server binary (the chaos test starts its own)", REDIS_SERVER is not None)
    server = ChaosRedis(tmp_path / "redis")
    try:
        server.start()
        yield server
    finally:
        server.kill()


def test_st2_st4_st5_op4_chaos_fleet_protocol(
    chaos_seed, chaos_redis, chaos_target, tmp_path, fresh_registry, monkeypatch
):
    """ST-2, ST-4, ST-5, CB-6, OP-2, OP-4: the fleet protocol under seeded faults keeps the
    invariants of the module docstring."""
    seed = chaos_seed
    seconds = float(os.environ.get("BALDUR_CHAOS_SECONDS") or DEFAULT_SECONDS)
    rng = random.Random(seed)
    schedule, phases = draw_schedule(rng, seconds)
    server = chaos_redis
    prefix = f"chaos-{uuid.uuid4().hex[:8]}"
    log_dir = tmp_path / "logs"
    log_dir.mkdir()
    stop_file = tmp_path / "stop"
    monkeypatch.setenv("BALDUR_CB_SYNC_INTERVAL_SECONDS", str(SYNC))
    monkeypatch.setenv("BALDUR_CB_HALF_OPEN_PROBE_LEASE_SECONDS", str(LEASE))
    from baldur_django.core.config import settings as baldur_settings

    baldur_settings.reset()
    env = {
        "BALDUR_STATE_BACKEND": "redis",
        "BALDUR_REDIS_URL": server.url(),
        "BALDUR_CB_SYNC_INTERVAL_SECONDS": SYNC,
        "BALDUR_CB_HALF_OPEN_PROBE_LEASE_SECONDS": LEASE,
        "BALDUR_REDIS_SOCKET_TIMEOUT": SOCKET_TIMEOUT,
        "BALDUR_TASK_RECOVERY_SWEEP_SECONDS": JOB_TTL,
        "BALDUR_TASK_STATE_SYNC_SECONDS": JOB_TTL,
        "BALDUR_TASK_EMERGENCY_CHECK_SECONDS": JOB_TTL,
        "BALDUR_STORE_WARNING_INTERVAL_SECONDS": 5,
    }
    origin = time.time() + 2.0  # schedule offsets count from here (workers started by then)
    failing = {b: [(origin + s, origin + e) for s, e in spans] for b, spans in phases.items()}
    target = chaos_target
    target.failing = failing
    cfg = {
        "seed": seed,
        "env": env,
        "redis_url": server.url(),
        "prefix": prefix,
        "log_dir": str(log_dir),
        "stop_file": str(stop_file),
        "target": list(target.server_address),
        "breakers": BREAKERS,
        "job_slow": JOB_SLOW,
    }

    # the controller's operator handle: its own breakers on the same store (OP-4 path)
    operator_store = RedisStore(connect(server.url(), socket_timeout=0.3), prefix=prefix)
    fresh_registry.set_store(operator_store)
    for name, overrides in BREAKERS.items():
        fresh_registry.get(name, overrides)

    def register_idle() -> None:
        for i in range(IDLE):
            operator_store.load(f"chaos-idle-{i}")

    register_idle()
    controller_events: list[dict[str, Any]] = []

    def on_event(event: Any) -> None:
        data = {k: v for k, v in vars(event).items() if k not in ("service", "at", "kind")}
        controller_events.append(
            {"k": "ev", "t": time.time(), "at": event.at, "b": event.service, "kind": event.kind, **data}
        )

    on_event.wants_rejections = False  # type: ignore[attr-defined]
    bus.subscribe(on_event)

    clog: list[dict[str, Any]] = []  # the controller's own history
    ctx = multiprocessing.get_context("spawn")
    procs: dict[int, Any] = {}
    incarnation = defaultdict(int)

    def start_worker(wid: int) -> None:
        inc = incarnation[wid]
        incarnation[wid] += 1
        process = ctx.Process(target=chaos_worker.main, args=(wid, inc, cfg), daemon=True)
        process.start()
        procs[wid] = (process, inc)
        clog.append({"k": "start", "w": wid, "inc": inc, "t": time.time()})

    samples: list[dict[str, Any]] = []
    monitor_stop = threading.Event()

    def monitor() -> None:
        client = redis.Redis(port=server.port, socket_timeout=0.1, socket_connect_timeout=0.1)
        names = sorted(BREAKERS)
        keys = [operator_store.key(n) for n in names]
        while not monitor_stop.is_set():
            sent = time.time()
            try:
                values = client.mget(keys)
            except (redis.RedisError, OSError):
                values = None
            done = time.time()
            if values is not None:
                for name, raw in zip(names, values, strict=True):
                    rec = decode(raw)
                    samples.append(
                        {
                            "b": name,
                            "ts": sent,
                            "te": done,
                            "state": rec.state,
                            "v": rec.version,
                            "oa": rec.opened_at,
                            "forced": rec.forced,
                            "fexp": rec.force_expires_at,
                            "raw": raw is not None,
                        }
                    )
            monitor_stop.wait(0.02)
        client.close()

    pause_thread: threading.Thread | None = None

    def wait_pause() -> None:
        nonlocal pause_thread
        if pause_thread is not None:
            pause_thread.join()
            pause_thread = None

    def operator(action: str, name: str, **kw: Any) -> None:
        entry = {"k": action, "b": name, "ts": time.time(), **kw}
        try:
            if action == "force":
                fn = baldur.force_open_circuit if kw["mode"] == "open" else baldur.force_close_circuit
                fn(name, ttl_minutes=kw["ttl"] / 60.0, reason="chaos", actor="chaos")
            else:
                entry["released"] = baldur.release_circuit(name, actor="chaos")
            entry["ok"] = True
        except StoreError as exc:  # OP-4: allowed during an outage, and said loudly
            entry["ok"], entry["e"] = False, str(exc)[:200]
        except BaseException as exc:  # anything else is a bug
            entry["ok"], entry["e"], entry["leak"] = False, f"{type(exc).__name__}: {exc}", True
        entry["te"] = time.time()
        clog.append(entry)

    try:
        for wid in range(WORKERS):
            start_worker(wid)
        threading.Thread(target=monitor, name="monitor", daemon=True).start()
        for offset, action, params in schedule:
            delay = origin + offset - time.time()
            if delay > 0:
                time.sleep(delay)  # the schedule's clock, not synchronisation
            if action in ("restart", "wipe", "outage_wipe", "flush", "pause"):
                wait_pause()  # one server fault at a time
            now = time.time()
            if action == "kill":
                victim = params["worker"]
                if params["prober"]:
                    with target.lock:
                        probing = sorted(r["id"] for r in target.inflight.values() if r["trial"] and r["shared"])
                    if probing:
                        victim = int(probing[params["worker"] % len(probing)].split(".")[0])
                params["worker"] = victim
                process, inc = procs[victim]
                os.kill(process.pid, signal.SIGKILL)
                process.join(5)
                clog.append({"k": "kill", "w": victim, "inc": inc, "t": now})
                time.sleep(params["restart_after"])
                start_worker(victim)
            elif action == "outage_wipe":
                server.kill()
                time.sleep(params["down"])  # the schedule's clock: Redis stays down this long
                server.wipe()
                server.start()
                register_idle()
                clog.append({"k": "fault", "kind": "wipe", "ts": now, "te": time.time(), "outage": True})
            elif action in ("restart", "wipe"):
                server.kill()
                if action == "wipe":
                    server.wipe()
                server.start()
                if action == "wipe":
                    register_idle()
                clog.append({"k": "fault", "kind": action, "ts": now, "te": time.time()})
            elif action == "flush":
                redis.Redis(port=server.port, socket_timeout=1.0).script_flush()
                clog.append({"k": "fault", "kind": "flush", "ts": now, "te": time.time()})
            elif action == "pause":
                server.pause()

                def resume_later(started: float = now, length: float = params["seconds"]) -> None:
                    time.sleep(length)
                    server.resume()
                    clog.append({"k": "fault", "kind": "pause", "ts": started, "te": time.time()})

                pause_thread = threading.Thread(target=resume_later, daemon=True)
                pause_thread.start()
            elif action == "force":
                operator("force", params["b"], mode=params["mode"], ttl=params["ttl"])
            elif action == "release":
                operator("release", params["b"])
        wait_pause()
        time.sleep(max(0.0, origin + seconds - time.time()))  # the target's last failing phase ends
        chaos_end = time.time()
        # quiet: no more faults, the target is healthy, every force goes
        for name in sorted(BREAKERS):
            wait_for(lambda n=name: operator("release", n) or clog[-1]["ok"], 10.0, f"the release of {name}")
        quiet_start = time.time()

        def all_closed() -> bool:
            try:
                records = [operator_store.inspect(n).record for n in BREAKERS]
            except StoreUnavailable:  # a slow answer on a loaded machine: not converged yet
                return False
            return all(r.state == "closed" and r.forced is None for r in records)

        # converged: every record CLOSED and unforced, and still so a while later (a wipe makes
        # them read CLOSED at once, while workers' local trips may still be pushed)
        converged = None
        stable_since = None
        while time.time() < quiet_start + 10.0:
            if all_closed():
                stable_since = stable_since or time.time()
                if time.time() - stable_since >= 3 * SYNC + SLACK:
                    converged = stable_since
                    break
            else:
                stable_since = None
            time.sleep(0.05)  # polling the store, bounded by the 10 s above
        stop_file.touch()
        for process, _inc in procs.values():
            process.join(15)
    finally:
        stop_file.touch()
        monitor_stop.set()
        for process, _inc in procs.values():
            if process.is_alive():
                process.kill()
                process.join(5)
        bus.unsubscribe(on_event)

    lines = read_logs(log_dir)
    history = {
        "seed": seed,
        "clog": clog,
        "samples": samples,
        "arrivals": target.arrivals,
        "events": controller_events,
        "chaos_end": chaos_end,
        "quiet_start": quiet_start,
        "converged": converged,
        "last": {wid: inc for wid, (_process, inc) in procs.items()},
    }
    (log_dir / "controller.json").write_text(json.dumps(history))
    report = analyse(lines, **history)
    stats = report["stats"]
    print(json.dumps(stats))
    print("violations per invariant:", json.dumps(Counter(v["invariant"] for v in report["violations"])))
    # the run exercised what it checks (a broken setup must not pass for want of history)
    assert stats["calls"] >= 200 and stats["shared_rounds"] >= 3 and stats["job_runs"] >= 10, stats
    assert stats["follow_checked"] >= 100, stats
    assert stats["local_open_then_wipe"] >= 1, stats  # invariant 8 met the case it is about
    if sum(1 for e in clog if e["k"] == "force" and e["ok"]) >= 3:
        assert stats["forces_checked"] >= 1, stats
    assert not report["violations"], (
        f"chaos seed={seed}: {len(report['violations'])} violations (logs in {log_dir}); first ones:\n"
        + "\n".join(json.dumps(v)[:600] for v in report["violations"][:15])
    )


# ----------------------------------------------------------------------------- analysis
def analyse(lines, *, seed, clog, samples, arrivals, events, chaos_end, quiet_start, converged, last):
    """Check the history against the module docstring's invariants; returns violations and stats.

    *lines* are the workers' log lines; the rest is the controller's record (controller.json
    in the log directory): *last* maps each worker to its last incarnation."""
    controller_events = events
    violations: list[dict[str, Any]] = []

    def bad(invariant: str, **detail: Any) -> None:
        violations.append({"invariant": invariant, **detail})

    by_kind = defaultdict(list)
    for entry in lines:
        by_kind[entry["k"]].append(entry)
    faults = [(e["ts"], e["te"], e["kind"]) for e in clog if e["k"] == "fault" and e["kind"] != "flush"]
    wipes = [(e["ts"], e["te"]) for e in clog if e["k"] == "fault" and e["kind"] == "wipe"]
    kills = {(e["w"], e["inc"]): e["t"] for e in clog if e["k"] == "kill"}
    ops = [e for e in clog if e["k"] in ("force", "release")]

    def fault_between(a: float, b: float) -> bool:
        return any(overlaps(a, b, s, e) for s, e, _ in faults)

    # a forced open keeps every call from the target for its lifetime; a failed attempt too,
    # since its write may still land when a paused server resumes (the operator was told it failed)
    def forced_open_between(name: str, a: float, b: float) -> bool:
        return any(
            e["k"] == "force" and e["mode"] == "open" and e["b"] == name and overlaps(a, b, e["ts"], e["te"] + e["ttl"])
            for e in ops
        )

    # 4. no store exception reaches a caller; jobs never raise; operators raise only StoreError
    for entry in by_kind["leak"]:
        bad("4 exception reached a caller", **entry)
    for entry in ops:
        if entry.get("leak"):
            bad("4 operator action raised something other than StoreError", **entry)

    # 1. probe budget per round
    finishes = defaultdict(list)
    for entry in by_kind["fin"]:
        finishes[entry["tok"]].append(entry)
    rounds = defaultdict(list)
    for arrival in arrivals:
        if arrival["trial"] and arrival["shared"]:
            version, opened_at, _now, _expiry = arrival["rnd"]
            rounds[(arrival["b"], version, opened_at)].append(arrival)
    for (name, version, opened_at), probes in rounds.items():
        freed = 0
        for probe in probes:
            expiry = probe["rnd"][3]
            settled = any(
                f["ok"] and f["o"] in ("success", "failure", "slow") and f["te"] < expiry
                for f in finishes[probe["tok"]]
            )
            freed += not settled
        allowed = BREAKERS[name]["half_open_max_calls"] + freed
        if len(probes) > allowed:
            bad(
                "1 probe budget",
                b=name,
                round=[version, opened_at],
                probes=len(probes),
                allowed=allowed,
                ids=[p["id"] for p in probes],
            )

    # 2. a killed prober never sticks the fleet in HALF_OPEN: its round ends in time
    done_ids = {e["id"] for e in by_kind["call"]}
    grace = RECOVERY + SYNC + min(1.0, LEASE) + 1.5
    orphans = 0
    for adm in by_kind["adm"]:
        if adm["tok"] is None or adm["id"] in done_ids or (adm["w"], adm["inc"]) not in kills:
            continue
        killed = kills[(adm["w"], adm["inc"])]
        version, opened_at, _now, expiry = adm["rnd"]
        deadline = expiry + grace
        for _ in range(50):  # the time the store was down does not count: extend until stable
            down = sum(min(e, deadline) - max(s, killed) for s, e, _ in faults if overlaps(killed, deadline, s, e))
            if expiry + grace + down <= deadline:
                break
            deadline = expiry + grace + down
        if deadline > chaos_end:
            continue
        orphans += 1
        ended = any(
            s["b"] == adm["b"]
            and killed < s["ts"]
            and s["te"] <= deadline
            and (s["state"] != "half_open" or s["v"] != version or s["oa"] != opened_at)
            for s in samples
        )
        # a stored force or a wipe ends the round too (the monitor may not have sampled it)
        ended = ended or any(
            e["k"] == "force" and e["ok"] and e["b"] == adm["b"] and adm["t"] < e["te"] <= deadline for e in ops
        )
        ended = ended or any(adm["t"] < s <= deadline for s, _ in wipes)
        if not ended:
            bad("2 HALF_OPEN stuck after the prober died", probe=adm, killed=killed, deadline=deadline)

    # 3. forces: never overwritten by an automatic decision; obeyed; lapses announced once
    events = [e for e in by_kind["ev"]] + controller_events
    lapses = defaultdict(list)
    for e in events:
        if e["kind"] == "force_lapsed":
            lapses[e["b"]].append(e)
    forces_checked = 0
    for i, force in enumerate(ops):
        if force["k"] != "force" or not force["ok"]:
            continue
        name, mode = force["b"], force["mode"]
        later = [e["ts"] for e in ops[i + 1 :] if e["b"] == name]
        expiry = force["ts"] + force["ttl"]
        end = min([expiry, *later, *[s for s, _ in wipes if s > force["te"]]]) - 0.05
        start = force["te"]
        if end <= start:
            continue
        if any(not e["ok"] and e["b"] == name and force["ts"] - 2.0 <= e["ts"] <= force["te"] for e in ops):
            continue  # an operator's failed write still queued in a paused server may land after this one
        forces_checked += 1
        want = "open" if mode == "open" else "closed"
        for s in samples:
            if s["b"] == name and s["ts"] >= start and s["te"] <= end and (s["forced"] != mode or s["state"] != want):
                bad("3 live force overwritten", b=name, force=force, sample=s)
                break
        obey_from = start + SYNC + SLACK
        if mode == "open":
            for a in arrivals:
                if a["b"] == name and obey_from <= a["t0"] <= end and not fault_between(start, a["ta"]):
                    bad("3 forced open but a call reached the target", b=name, force=force, call=a)
                    break
        else:
            for r in by_kind["rej"]:
                if r["b"] == name and obey_from <= r["t"] <= end and not fault_between(start, r["t"]):
                    bad("3 forced closed but a call was rejected", b=name, force=force, rejection=r)
                    break
        # lapse announcements of a force that ran out (not superseded, not wiped)
        if (later and min(later) < expiry + 0.05) or any(force["ts"] <= s <= expiry + 2.0 for s, _ in wipes):
            continue
        if fault_between(expiry - SYNC - SLACK, expiry + SYNC + SLACK + 1.0):
            continue  # workers judging alone lapse it each (ST-4), or the lapsing answer was lost
        horizon = min([*later, chaos_end + 30.0])
        told = [e for e in lapses[name] if e.get("previous") == mode and expiry - 0.1 <= e["at"] <= horizon]
        if len(told) > 1:
            bad("3 force lapse announced more than once", b=name, force=force, events=told)
        elif not told and horizon > expiry + 2.0:
            bad("3 force lapse never announced", b=name, force=force)

    # 7. workers follow the shared record within a sync interval (ST-3): no rejection while the
    # record has been CLOSED (and no CLOSED admission while it has been OPEN) for longer and
    # stays so a moment after, with the store up all that time
    stale = followed = 0
    window = SYNC + SLACK + TRIAL_HOLD + SOCKET_TIMEOUT
    per_breaker = defaultdict(list)
    for sample in samples:
        per_breaker[sample["b"]].append(sample)
    starts = {b: [x["ts"] for x in xs] for b, xs in per_breaker.items()}

    def steady(name: str, a: float, b: float, state: str) -> bool:
        """The record was *state*, unforced, at one version, in every sample of [a, b] (>= 10 of them)."""
        xs = per_breaker[name][bisect.bisect_left(starts[name], a) : bisect.bisect_right(starts[name], b)]
        if len(xs) < 10 or xs[0]["ts"] > a + 0.1 or xs[-1]["te"] < b - 0.1:
            return False
        return all(x["state"] == state and x["forced"] is None and x["v"] == xs[0]["v"] for x in xs)

    for r in by_kind["rej"]:  # the decision fell between t and te
        t = r["t"]
        if r["te"] > chaos_end or fault_between(t - window - SYNC, r["te"]):
            continue
        followed += 1
        if steady(r["b"], t - window, r["te"] + 0.2, "closed"):
            stale += 1
            bad("7 rejected while the shared record was CLOSED", rejection=r)
    for a in arrivals:  # the admission fell between t0 and ta
        t = a["t0"]
        if a["trial"] or a["ta"] > chaos_end or fault_between(t - window - SYNC, a["ta"]):
            continue
        followed += 1
        if steady(a["b"], t - window, a["ta"] + 0.2, "open"):
            stale += 1
            bad("7 a CLOSED call admitted while the shared record was OPEN", call=a)

    # 5. one run of a fleet job at a time
    runs: dict[str, dict[str, Any]] = {}
    begun = defaultdict(set)
    for entry in by_kind["opb"]:
        begun[entry["run"]].add(entry["ts"])
    for entry in sorted(by_kind["op"], key=lambda e: e["ts"]):
        run = runs.setdefault(entry["run"], {"run": entry["run"], "w": entry["w"], "inc": entry["inc"], "body": []})
        begun[entry["run"]].discard(entry["ts"])
        if entry["op"] == "lock":
            run["job"] = entry["a"][0]
            run["start"] = entry["te"] if entry["ok"] and entry["r"] else None
        elif entry["op"] not in ("extend", "unlock"):
            run["body"].append(entry["te"])
    intervals = defaultdict(list)
    for name, run in runs.items():
        if run.get("start") is None:
            continue
        end = max(run["body"], default=run["start"])
        if begun[name]:  # an operation begun but never answered: the worker was killed mid-call
            end = max(end, kills.get((run["w"], run["inc"]), chaos_end + 30.0))
        intervals[run["job"]].append((run["start"], end, name))
    for job, spans in intervals.items():
        spans.sort()
        for i, (a0, a1, ra) in enumerate(spans):
            for b0, b1, rb in spans[i + 1 :]:
                if b0 > a1:
                    break  # sorted by start: no later run starts before this one ended
                if not any(overlaps(a0, b1, s, e) for s, e in wipes):
                    bad("5 fleet job ran twice at once", job=job, first=[ra, a0, a1], second=[rb, b0, b1])

    # 6. convergence
    if converged is None:
        bad("6 the fleet did not converge to CLOSED within 10 s of the quiet phase", quiet_start=quiet_start)
    finals = {(e["w"], e["inc"], e["b"]): e for e in by_kind["final"]}
    for wid, inc in last.items():
        for name in BREAKERS:
            final = finals.get((wid, inc, name))
            if final is None:
                bad("6 a worker did not report its final state", w=wid, inc=inc, b=name)
            elif converged is not None and (final["state"] != "closed" or final["forced"] is not None):
                bad("6 a worker did not end CLOSED", **final)

    # 8. a worker's own OPEN (a trip or a failed trial's re-open made while its store did not
    # answer) keeps its calls from the target for that open time, whatever the store then
    # holds (ST-4): a Redis restarted empty must not let one call through
    local_opens, local_open_wipes = 0, 0
    sent_by = defaultdict(list)  # (worker, incarnation, breaker) -> admission times of its calls
    for arrival in arrivals:
        if arrival["trial"] and arrival["shared"]:
            continue  # a probe the store's own HALF_OPEN round admitted: a newer shared decision (ST-4)
        wid, inc = arrival["id"].split(".")[:2]
        sent_by[(int(wid), int(inc), arrival["b"])].append(arrival["ta"])
    for times in sent_by.values():
        times.sort()
    recorded = defaultdict(list)  # (worker, incarnation, breaker) -> (t1, te) of each call recorded
    for call in by_kind["call"]:
        recorded[(call["w"], call["inc"], call["b"])].append((call["t1"], call["te"]))
    for entry in by_kind["ev"]:
        if entry["kind"] != "state_changed" or entry.get("to_state") != "open" or not entry.get("down"):
            continue
        # the open time runs from the outcome that caused it: the breaker reads its clock when
        # the call's outcome is recorded (t1), before the store call that then fails; the event
        # (``at``) comes after that store call. The open lasts RECOVERY (backoff is off).
        key = (entry["w"], entry["inc"], entry["b"])
        start = max([t1 for t1, te in recorded[key] if t1 <= entry["at"] <= te], default=entry["at"])
        end = start + RECOVERY - 0.02
        if any(
            o["b"] == entry["b"] and overlaps(start - SYNC - SLACK, end, o["ts"], o["te"] + o.get("ttl", 0.0))
            for o in ops
        ):
            continue  # an operator's force or release outranks the worker's own judgement (OP-2)
        local_opens += 1
        if any(ws <= start <= we for ws, we in wipes):
            local_open_wipes += 1  # re-opened while Redis was down, and it came back empty
        times = sent_by[key]
        leaked = times[bisect.bisect_right(times, entry["at"]) : bisect.bisect_left(times, end)]
        if leaked:
            bad(
                "8 a call reached the target while the worker's own open time ran",
                w=entry["w"],
                inc=entry["inc"],
                b=entry["b"],
                opened=start,
                trigger=entry.get("trigger"),
                calls=len(leaked),
                first=leaked[0],
            )

    # 9. a store that came back empty is no reason to close (ST-4): once a worker read a fresh
    # CLOSED record (version 0: the store lost its data) while its breaker held OPEN or HALF_OPEN,
    # its next call admitted as CLOSED on that breaker needs a close decided after that read:
    # a round closed by some worker (its state_changed to closed), the record seen CLOSED at a
    # version above 0 again, or an operator's force or release on the breaker around that time
    admitted_closed = defaultdict(list)  # (worker, incarnation, breaker) -> sorted admission times
    for arrival in arrivals:
        if not arrival["trial"]:
            wid, inc = arrival["id"].split(".")[:2]
            admitted_closed[(int(wid), int(inc), arrival["b"])].append(arrival["ta"])
    for times in admitted_closed.values():
        times.sort()
    closes = defaultdict(list)  # breaker -> times a close was decided or seen in the store
    for e in events:
        if e["kind"] == "state_changed" and e.get("to_state") == "closed":
            closes[e["b"]].append(e["at"])
    for sample in samples:
        if sample["state"] == "closed" and sample["v"] > 0:
            closes[sample["b"]].append(sample["ts"])
    empties = 0
    for entry in by_kind["empty"]:
        times = admitted_closed[(entry["w"], entry["inc"], entry["b"])]
        later = times[bisect.bisect_right(times, entry["te"]) :]
        if not later or later[0] > chaos_end:
            continue
        empties += 1
        ta = later[0]
        if any(entry["ts"] <= t <= ta for t in closes[entry["b"]]):
            continue
        if any(o["b"] == entry["b"] and overlaps(entry["ts"] - SYNC - SLACK, ta, o["ts"], o["te"]) for o in ops):
            continue  # an operator's force or release decides for the fleet (OP-2)
        bad(
            "9 a call admitted as CLOSED after the store came back empty, with no close decided",
            w=entry["w"],
            inc=entry["inc"],
            b=entry["b"],
            read=entry,
            admitted=ta,
        )

    stats = {
        "seed": seed,
        "local_opens_checked": local_opens,
        "empty_reads": len(by_kind["empty"]),
        "empty_reads_checked": empties,
        "local_open_then_wipe": local_open_wipes,
        "calls": len(by_kind["call"]),
        "rejections": len(by_kind["rej"]),
        "arrivals": len(arrivals),
        "shared_rounds": len(rounds),
        "shared_probes": sum(len(p) for p in rounds.values()),
        "local_trials": sum(1 for a in arrivals if a["trial"] and not a["shared"]),
        "orphans_checked": orphans,
        "follow_checked": followed,
        "stale": stale,
        "forces_checked": forces_checked,
        "job_runs": sum(len(s) for s in intervals.values()),
        "kills": len(kills),
        "faults": [e["kind"] for e in clog if e["k"] == "fault"],
        "operator_failures": sum(1 for e in ops if not e["ok"]),
        "events": len(events),
    }
    return {"violations": violations, "stats": stats}


if __name__ == "__main__":  # re-check a kept history: python -m tests.stores.test_chaos LOG_DIR
    import sys

    directory = Path(sys.argv[1])
    kept = json.loads((directory / "controller.json").read_text())
    kept["last"] = {int(w): inc for w, inc in kept["last"].items()}
    result = analyse(read_logs(directory), **kept)
    print(json.dumps(result["stats"]))
    for violation in result["violations"]:
        print(json.dumps(violation)[:600])

"""The incident rehearsal: six scenarios of an incident, end to end, with real servers.

``python -m benchmarks --incident [SCENARIO ...] [--quick] [--json FILE]`` (or
``python -m benchmarks.incident``) runs, each against processes of its own (a
``redis-server`` on a free port, never the shared one; the fake upstream
``testproject.upstream``; the site ``benchmarks.incident_site`` under gunicorn with 4 sync
workers or uvicorn with 2):

* ``level``: Level 3 declared with every breaker CLOSED and the upstream healthy; the
  health view's answers on every worker while ``baldur_emergency set 3`` then ``set 0`` run;
* ``hung-store``: the health view's latency at 3,000 breakers per worker, on a healthy
  Redis and on one stopped with SIGSTOP;
* ``hosts``: 10,000 hosts through a per-host ``BreakerAdapter()``, then idle: RSS, Redis
  keys, ``/metrics`` and the admin list, before and after the (shortened) idle time, twice;
  ``hosts-uncapped`` once with the adapter's cap raised to 20,000;
* ``empty-store``: Redis killed while three breakers are OPEN, an empty one started 2.3 s
  before their open time ends; calls that reached the dead upstream, in 10 runs;
* ``trial-kill``: trials hanging on the upstream, every worker SIGKILLed, the upstream
  healthy again: time to the first success;
* ``names``: control-character and over-long names at every entry point, and the log.

Each prints its figures with ``/proc/loadavg`` and PASS or FAIL. Not a test: the suite
runs only a smoke of the ``names`` scenario. Results: ``docs/incident.md``.
"""

from __future__ import annotations

import argparse
import json
import math
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from .incident_tools import Answer, RedisServer, Server, Site, Upstream, loadavg, manage, rss_kb

LEVEL_KEY = "baldur:{emergency}:level"


def percentile(values: list[float], q: float) -> float:
    """The *q*-th percentile (0-100) of *values*, nearest rank; nan when empty."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[max(1, math.ceil(q / 100 * len(ordered))) - 1]


def spread(values: list[float]) -> dict[str, float]:
    """p50, p90, p99 and max of *values* (seconds), in milliseconds."""
    return {name: round(percentile(values, q) * 1000, 1) for name, q in (("p50", 50), ("p90", 90), ("p99", 99))} | {
        "max": round(max(values, default=math.nan) * 1000, 1),
        "n": len(values),
    }


class Poller:
    """Threads sending one request after another to *path*, keeping every :class:`Answer`."""

    def __init__(self, server: Server, path: str, *, threads: int = 2, pause: float = 0.02, **options: Any) -> None:
        self.answers: list[Answer] = []
        self.stopping = threading.Event()
        self.lock = threading.Lock()

        def loop() -> None:
            while not self.stopping.is_set():
                answer = server.get(path, **options)
                with self.lock:
                    self.answers.append(answer)
                self.stopping.wait(pause)

        self.threads = [threading.Thread(target=loop, daemon=True) for _ in range(threads)]
        for thread in self.threads:
            thread.start()

    def since(self, start: float, end: float = math.inf) -> list[Answer]:
        with self.lock:
            return [a for a in self.answers if start <= a.sent < end]

    def stop(self) -> list[Answer]:
        self.stopping.set()
        for thread in self.threads:
            thread.join(30)
        return self.answers


@contextmanager
def environment(knobs: dict[str, str], kind: str = "gunicorn", workers: int = 4) -> Iterator[tuple[Site, Server]]:
    """A Redis, an upstream, the site's database and a server; all ended on the way out."""
    redis, upstream = RedisServer(), Upstream()
    site = server = None
    try:
        site = Site(redis, upstream, knobs)
        server = Server(site, kind, workers)
        yield site, server
    finally:
        if server is not None:
            server.stop()
        upstream.stop()
        redis.stop()
        if site is not None:
            site.cleanup()


# ------------------------------------------------------------------ level


def _watch_level(site: Site, stop: threading.Event, changes: list[tuple[float, bytes | None]]) -> None:
    client, last = site.redis.client(), b"?"
    while not stop.is_set():
        value = client.get(LEVEL_KEY)
        if value != last:
            changes.append((time.time(), value))
            last = value
        time.sleep(0.002)


def _level_change(poller: Poller, pids: set[int], level: int, written: float, until: float) -> dict[str, Any]:
    answers = [a for a in poller.since(written, until) if a.status]
    first_fresh: dict[int, float] = {}
    last_stale: dict[int, float] = {}
    for answer in answers:
        if answer.json().get("emergency_level") == level:
            first_fresh.setdefault(answer.pid, answer.received - written)
        else:
            last_stale[answer.pid] = max(last_stale.get(answer.pid, 0.0), answer.sent - written)
    return {
        "level": level,
        "answers": len(answers),
        "workers_fresh": len(set(first_fresh) & pids),
        "slowest_worker_fresh_s": round(max(first_fresh.values(), default=math.nan), 3),
        "latest_stale_request_sent_s": round(max(last_stale.values(), default=0.0), 3),
        "statuses": _count(f"{a.status} {a.json().get('status')}" for a in answers),
        # answers that show a level but not 200 "degraded" (0 expected)
        "level_not_degraded": sum(
            1
            for a in answers
            if a.json().get("emergency_level") and (a.status, a.json().get("status")) != (200, "degraded")
        ),
    }


def _count(items: Any) -> dict[str, int]:
    counts: dict[str, int] = {}
    for item in items:
        counts[str(item)] = counts.get(str(item), 0) + 1
    return counts


def _level_verdict(changes: list[dict[str, Any]], workers: int) -> bool:
    """Every worker showed each change within 1 s; no 503; every answer showing a level was degraded."""
    return all(
        c["workers_fresh"] == workers
        and c["slowest_worker_fresh_s"] < 1.0
        and not c["level_not_degraded"]
        and not any(key.startswith("503") for key in c["statuses"])
        for c in changes
    )


def run_level(kind: str, workers: int, settle: float = 3.0) -> dict[str, Any]:
    """Level 3 then 0 on a healthy fleet: the health view's answers on every worker."""
    critical = "svc-a,svc-b,svc-c"
    with environment({"INCIDENT_CRITICAL": critical}, kind, workers) as (site, server):
        for service in critical.split(","):
            for _ in range(2 * workers):
                server.get(f"/call/{service}", method="POST")
        health = Poller(server, "/health/", threads=2 * workers, pause=0.02)
        calls = Poller(server, "/call/svc-a", threads=1, pause=0.05, method="POST")
        stop, changes = threading.Event(), []
        watcher = threading.Thread(target=_watch_level, args=(site, stop, changes), daemon=True)
        watcher.start()
        time.sleep(1.0)
        baseline_end = time.time()
        commands, windows = [], []
        for level in (3, 0):
            began = time.time()
            done = manage(site, ["baldur_emergency", "set", str(level), "--reason", "incident rehearsal"])
            commands.append({"level": level, "exit": done.returncode, "seconds": round(time.time() - began, 2)})
            written = next((at for at, _ in reversed(changes) if at >= began), time.time())
            time.sleep(settle)
            windows.append((level, written, time.time()))
        stop.set()
        watcher.join()
        health.stop()
        calls.stop()
        changes_found = [_level_change(health, server.pids, level, at, until) for level, at, until in windows]
        baseline = _count(f"{a.status} {a.json().get('status')}" for a in health.since(0, baseline_end) if a.status)
        level3 = [a for a in calls.since(windows[0][1], windows[1][1])]
        result = {
            "server": f"{kind} {workers} workers",
            "workers": len(server.pids),
            "baseline": baseline,
            "commands": commands,
            "changes": changes_found,
            "protected_calls_under_level_3": _count(a.status for a in level3),
            "loadavg": loadavg(),
        }
    result["pass"] = _level_verdict(changes_found, workers)
    return result


def scenario_level(quick: bool) -> dict[str, Any]:
    runs = [run_level("gunicorn", 4)] + ([] if quick else [run_level("uvicorn", 2)])
    return {"runs": runs, "pass": all(run["pass"] for run in runs)}


# ------------------------------------------------------------------ hung store


def _warm(server: Server, count: int, prefix: str) -> None:
    done: set[int] = set()
    deadline = time.monotonic() + 300
    while done != server.pids and time.monotonic() < deadline:
        answer = server.get(f"/warm?count={count}&prefix={prefix}", timeout=120)
        if answer.status == 200 and answer.json()["breakers"] >= count:
            done.add(answer.pid)


def _health_phase(server: Server, seconds: float, threads: int) -> dict[str, Any]:
    began = time.time()
    poller = Poller(server, "/health/", threads=threads, pause=0.1, timeout=60)
    time.sleep(seconds)
    answers = poller.stop()
    return {
        "latency_ms": spread([a.seconds for a in answers]),
        "statuses": _count(f"{a.status} {a.json().get('status') if a.status else a.body[:40]}" for a in answers),
        "workers": len({a.pid for a in answers} - {0}),
        "started": began,
    }


def scenario_hung_store(quick: bool, breakers: int = 3000) -> dict[str, Any]:
    """The health view at *breakers* breakers per worker: healthy Redis, then SIGSTOPped."""
    seconds = 8.0 if quick else 30.0
    critical = ",".join(f"crit-{i}" for i in range(5))
    with environment({"INCIDENT_CRITICAL": critical}) as (site, server):
        _warm(server, breakers, "host-")
        _warm(server, 5, "crit-")
        healthy = _health_phase(server, seconds, threads=2)
        healthy["loadavg"] = loadavg()
        site.redis.signal(signal.SIGSTOP)
        try:
            stopped = _health_phase(server, seconds, threads=4)
            stopped["loadavg"] = loadavg()
            detail = server.get("/health/", headers={"X-Incident-Operator": "1"}, timeout=60)
            stopped["store_field"] = detail.json().get("store") if detail.status else detail.body
            stopped["detail_seconds"] = round(detail.seconds, 3)
        finally:
            site.redis.signal(signal.SIGCONT)
        after = _health_phase(server, 3.0, threads=2)
        log = server.log_text()
    result = {
        "breakers_per_worker": breakers,
        "critical": 5,
        "healthy_redis": healthy,
        "redis_sigstopped": stopped,
        "after_sigcont": after,
        "worker_timeouts": log.count("WORKER TIMEOUT"),
    }
    result["pass"] = (
        healthy["latency_ms"]["max"] < 1000
        and stopped["latency_ms"]["max"] < 1000
        and not result["worker_timeouts"]
        and all(k.startswith("200") for phase in (healthy, stopped, after) for k in phase["statuses"])
    )
    return result


# ------------------------------------------------------------------ many hosts


def _metrics(server: Server, rounds: int = 8) -> dict[str, Any]:
    seen: dict[int, tuple[int, float]] = {}
    for _ in range(rounds):
        answer = server.get("/metrics", timeout=60)
        previous = seen.get(answer.pid, (0, 0.0))
        seen[answer.pid] = (max(previous[0], len(answer.body)), max(previous[1], answer.seconds))
    return {
        "largest_kb": round(max(size for size, _ in seen.values()) / 1024, 1),
        "slowest_ms": round(max(took for _, took in seen.values()) * 1000, 1),
        "workers_scraped": len(seen),
    }


def _snapshot(site: Site, server: Server) -> dict[str, Any]:
    client = site.redis.client()
    breakers: dict[int, int] = {}
    for _ in range(4 * len(server.pids)):
        answer = server.get("/warm?count=0")
        breakers[answer.pid] = answer.json()["breakers"]
    admin = [server.get("/admin/baldur_django/breaker/", headers={"X-Incident-Operator": "1"}) for _ in range(3)]
    return {
        "breakers_per_worker": sorted(breakers.values()),
        "rss_mb_per_worker": sorted(round(rss_kb(pid) / 1024, 1) for pid in server.pids),
        "redis_keys": int(client.dbsize()),
        "redis_registry_names": int(client.zcard("baldur:registry")),
        "some_names": [name.decode() for name in client.zrange("baldur:registry", 0, 4)],
        "metrics": _metrics(server),
        "admin_ms": round(min(a.seconds for a in admin) * 1000, 1),
        "admin_status": admin[-1].status,
        "admin_kb": round(len(admin[-1].body) / 1024, 1),
        "loadavg": loadavg(),
    }


def _drive_hosts(server: Server, start: int, count: int, batch: int = 100) -> dict[str, Any]:
    starts = iter(range(start, start + count, batch))
    lock, statuses = threading.Lock(), []

    def work() -> None:
        while True:
            with lock:
                first = next(starts, None)
            if first is None:
                return
            answer = server.get(f"/hosts?start={first}&count={batch}", timeout=120)
            with lock:
                statuses.append(answer.json()["statuses"] if answer.status == 200 else {str(answer.status): batch})

    began = time.monotonic()
    threads = [threading.Thread(target=work) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    total: dict[str, int] = {}
    for part in statuses:
        for key, value in part.items():
            total[key] = total.get(key, 0) + value
    return {"hosts": count, "seconds": round(time.monotonic() - began, 1), "upstream_statuses": total}


def _idle(server: Server, seconds: float, scrape_every: float) -> None:
    """*seconds* without a call; a scrape of every worker each *scrape_every* s (0: none), as
    Prometheus would: a scrape is when a worker looks for idle breakers."""
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        time.sleep(min(left, scrape_every or left))
        if scrape_every:
            _metrics(server, rounds=3 * len(server.pids))


def scenario_hosts(
    quick: bool, idle: float = 60.0, scrape_every: float = 5.0, max_hosts: int = 1000, rounds: int = 2
) -> dict[str, Any]:
    """10,000 hosts through a per-host adapter (at most *max_hosts* kept per worker), then
    *idle* seconds without a call; *rounds* times."""
    hosts, rounds = (2000, 1) if quick else (10_000, rounds)
    idle = 20.0 if quick else idle
    result: dict[str, Any] = {"idle_seconds": idle, "scrape_every_s": scrape_every, "hosts_per_round": hosts}
    result |= {"max_hosts": max_hosts, "rounds": []}
    knobs = {"INCIDENT_IDLE_SECONDS": str(idle), "INCIDENT_MAX_HOSTS": str(max_hosts)}
    with environment(knobs) as (site, server):
        result["before"] = _snapshot(site, server)
        for number in range(rounds):
            driven = _drive_hosts(server, number * hosts, hosts)
            busy = _snapshot(site, server)
            _idle(server, idle + 2 * idle / 60 + scrape_every + 1, scrape_every)
            _metrics(server, rounds=4 * len(server.pids))
            result["rounds"].append({"driven": driven, "after_hosts": busy, "after_idle": _snapshot(site, server)})
    last, before = result["rounds"][-1]["after_idle"], result["before"]
    result["pass"] = (
        max(last["breakers_per_worker"]) <= max(before["breakers_per_worker"])
        and last["redis_keys"] <= before["redis_keys"] + 1  # the registry set itself
        and last["metrics"]["largest_kb"] < 1.5 * before["metrics"]["largest_kb"] + 1
        and last["admin_ms"] < 3 * before["admin_ms"] + 50
        and all(max(r["after_hosts"]["breakers_per_worker"]) <= max_hosts for r in result["rounds"])
    )
    return result


# ------------------------------------------------------------------ command line

SCENARIOS: dict[str, Callable[[bool], dict[str, Any]]] = {
    "level": scenario_level,
    "hung-store": scenario_hung_store,
    "hosts": scenario_hosts,
    "hosts-uncapped": lambda quick: scenario_hosts(quick, max_hosts=20_000, rounds=1),
}


def _more() -> None:
    from .incident_more import MORE

    SCENARIOS.update(MORE)


def main(argv: list[str] | None = None, *, quick: bool | None = None, json_file: str | None = None) -> int:
    """Run the chosen scenarios (all by default); returns 0 when every one passed, 1 if not."""
    _more()
    parser = argparse.ArgumentParser(prog="python -m benchmarks --incident", description=__doc__.splitlines()[0])
    parser.add_argument("scenarios", nargs="*", help=f"some of: {', '.join(SCENARIOS)} (default all)")
    parser.add_argument("--quick", action="store_true", help="shorter runs (noisier figures)")
    parser.add_argument("--json", metavar="FILE", default=None)
    args = parser.parse_args(argv or [])
    chosen = args.scenarios or list(SCENARIOS)
    unknown = [name for name in chosen if name not in SCENARIOS]
    if unknown:
        parser.error(f"unknown scenario(s) {unknown}; known: {', '.join(SCENARIOS)}")
    quick = args.quick if quick is None else quick
    results: dict[str, Any] = {}
    for name in chosen:
        print(f"scenario {name} ... (loadavg {loadavg()})", file=sys.stderr, flush=True)
        began = time.monotonic()
        results[name] = SCENARIOS[name](quick)
        results[name]["elapsed_s"] = round(time.monotonic() - began, 1)
        results[name]["date"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
        verdict = "PASS" if results[name]["pass"] else "FAIL"
        print(f"{name}: {verdict}\n{json.dumps(results[name], indent=2, default=str)}", flush=True)
    target = json_file or args.json
    if target:
        with open(target, "w", encoding="utf-8") as handle:
            json.dump(results, handle, indent=2, default=str)
    return 0 if all(r["pass"] for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

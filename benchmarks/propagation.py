"""Cluster propagation benchmark: how fast one worker's decision reaches its peers.

``python -m benchmarks --propagation [--quick]`` (or ``python -m benchmarks.propagation``)
starts ``workers`` real worker processes (4), each with one breaker ``flip`` and cluster
propagation on the same Redis server (``redis://127.0.0.1:6379/10`` unless ``--redis-url``
says otherwise; a channel of the run's own, no key is written). It then makes ``flips``
decisions (100), one at a time, taking turns among the workers:

* an even flip is an OPEN: the deciding worker records one failure (threshold 1);
* an odd flip is a CLOSED: the deciding worker waits out its recovery timeout (0.05 s) and
  closes with one successful trial (``half_open_success``).

Every worker records the Unix time of each transition of ``flip`` in its own
``StateChanged`` event: the decider's own one, and the peers' ``propagated`` ones. The delay
of a peer is its time minus the decider's (one host, one clock); the delay of a flip is
that of its last peer. The run also counts the messages on the channel: one per decision,
none echoed. Each worker opens its publishing connection (one message no peer acts on)
before the first flip, so the first decision does not also time a connection setup.
Goal (printed PASS/MISS): p99 of the flip delay under 100 ms on one host.
Results and method: ``docs/performance.md``, section "Cluster propagation".

Not a test: no figure is asserted anywhere (``tests/propagation`` runs a tiny smoke of it).
"""

from __future__ import annotations

import json
import math
import os
import queue
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "PropagationSettings",
    "PROPAGATION_DEFAULT",
    "PROPAGATION_QUICK",
    "PropagationResult",
    "PropagationVerdict",
    "bench_propagation",
    "evaluate",
    "format_propagation",
    "to_json",
    "percentile",
    "main",
]

DEFAULT_URL = "redis://127.0.0.1:6379/10"
GOAL_P99_SECONDS = 0.100
SERVICE = "flip"
ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class PropagationSettings:
    """How much to measure.

    Attributes:
        workers: worker processes (one decides a flip, the others apply it).
        flips: decisions, alternately OPEN and CLOSED.
        recovery: the breakers' recovery timeout, seconds (how long a CLOSED decision waits).
        redis_url: the Redis server (pub/sub ignores the database, the channel name does not).
    """

    workers: int = 4
    flips: int = 100
    recovery: float = 0.05
    redis_url: str = DEFAULT_URL


PROPAGATION_DEFAULT = PropagationSettings()
PROPAGATION_QUICK = PropagationSettings(flips=30)


@dataclass
class PropagationResult:
    """Delays in seconds: one per peer per flip, and one per flip (its slowest peer)."""

    settings: PropagationSettings
    peer_delays: list[float] = field(default_factory=list)
    flip_delays: list[float] = field(default_factory=list)
    messages: int = 0
    redis_version: str = "?"
    elapsed: float = 0.0


@dataclass(frozen=True)
class PropagationVerdict:
    text: str
    value: str
    status: str


def percentile(values: list[float], q: float) -> float:
    """The *q*-th percentile (0-100) of *values*, nearest rank; nan when empty."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


# ------------------------------------------------------------------ the worker process


def _worker(options: dict[str, Any]) -> None:
    """One worker: a breaker, propagation, and one JSON line per transition of the breaker."""
    import logging

    from baldur_django.contrib import propagation
    from baldur_django.core.events import StateChanged, bus
    from baldur_django.core.registry import registry

    logging.getLogger("baldur").setLevel(logging.CRITICAL + 1)  # the flips are on purpose
    lock = threading.Lock()

    def say(**fields: Any) -> None:
        with lock:
            sys.stdout.write(json.dumps(fields) + "\n")
            sys.stdout.flush()

    def listener(event: Any) -> None:
        if isinstance(event, StateChanged) and event.service == SERVICE and event.to_state in ("open", "closed"):
            say(kind="transition", to=event.to_state, trigger=event.trigger, at=event.at)

    breaker = registry.get(
        SERVICE,
        {
            "failure_threshold": 1,
            "failure_rate_threshold": 0,
            "recovery_timeout": options["recovery"],
            "half_open_max_calls": 1,
        },
    )
    bus.subscribe(listener)
    propagator = propagation.install(prefix=options["prefix"])
    # the publisher connects on its first message: open that connection before measuring
    # (a message about a breaker no peer has, which they ignore)
    propagator.enqueue("bench-warm-up", "closed")
    ok = propagator.wait_connected(20) and propagator.flush(20) and propagator.published == 1
    say(kind="ready", ok=ok, pid=os.getpid())
    for line in sys.stdin:
        op = line.strip()
        if op == "open":
            breaker.record_failure(breaker.acquire())
        elif op == "close":
            deadline = time.monotonic() + 10
            while breaker.state.value != "half_open" and time.monotonic() < deadline:
                time.sleep(0.002)  # the recovery timeout running out; not part of the delay
            breaker.record_success(breaker.acquire())
        elif op == "quit":
            break
    propagator.flush(5)
    propagation.uninstall()


class _Worker:
    def __init__(self, index: int, settings: PropagationSettings, prefix: str) -> None:
        self.index = index
        env = {k: v for k, v in os.environ.items() if not k.startswith("BALDUR_")}
        env.update(
            PYTHONPATH=str(ROOT) + os.pathsep + env.get("PYTHONPATH", ""),
            BALDUR_REDIS_URL=settings.redis_url,
        )
        options = {"prefix": prefix, "recovery": settings.recovery}
        self.process = subprocess.Popen(
            # run as a script: the worker needs neither the benchmarks package nor its contenders
            [sys.executable, str(Path(__file__).resolve()), "--worker", json.dumps(options)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=str(ROOT),
            env=env,
        )
        self.lines: queue.Queue[dict[str, Any]] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.put(json.loads(line))
        self.lines.put({"kind": "exit"})

    def next(self, timeout: float = 20.0) -> dict[str, Any]:
        try:
            message = self.lines.get(timeout=timeout)
        except queue.Empty:
            raise RuntimeError(f"worker {self.index} said nothing for {timeout} s") from None
        if message["kind"] == "exit":
            raise RuntimeError(f"worker {self.index} exited ({self.process.poll()})")
        return message

    def send(self, op: str) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(op + "\n")
        self.process.stdin.flush()

    def close(self) -> None:
        if self.process.poll() is None:
            try:
                self.send("quit")
                self.process.wait(10)
            except (OSError, subprocess.TimeoutExpired):
                self.process.kill()
                self.process.wait(5)


# ------------------------------------------------------------------ the run


def bench_propagation(
    settings: PropagationSettings = PROPAGATION_DEFAULT, progress: Callable[[str], Any] | None = None
) -> PropagationResult:
    """Run the benchmark (see the module docstring) and return its figures.

    Raises:
        redis.ConnectionError: Redis is unreachable.
        RuntimeError: a worker stopped answering.
    """
    import redis

    from baldur_django.contrib.propagation import channel_name

    if settings.workers < 2 or settings.flips < 1:
        raise ValueError("the benchmark needs at least 2 workers and 1 flip")
    client = redis.Redis.from_url(settings.redis_url, socket_timeout=10)
    result = PropagationResult(settings, redis_version=str(client.info("server").get("redis_version", "?")))
    db = int(client.connection_pool.connection_kwargs.get("db") or 0)
    prefix = f"bench-propagation-{uuid.uuid4().hex[:10]}"
    channel = channel_name(prefix, db)
    listener = client.pubsub()
    listener.subscribe(channel)
    if listener.get_message(timeout=10) is None:
        raise RuntimeError("could not subscribe to the benchmark's channel")
    workers = [_Worker(i, settings, prefix) for i in range(settings.workers)]
    started = time.monotonic()
    try:
        for worker in workers:
            hello = worker.next(30)
            if not hello.get("ok"):
                raise RuntimeError(f"worker {worker.index} could not subscribe")
        if progress:
            progress(f"{settings.flips} flips across {settings.workers} worker processes")
        for flip in range(settings.flips):
            state = "open" if flip % 2 == 0 else "closed"
            decider = workers[flip % len(workers)]
            decider.send("open" if state == "open" else "close")
            decided = decider.next()
            if decided.get("to") != state or decided.get("trigger") == "propagated":
                raise RuntimeError(f"flip {flip}: the decider reported {decided}")
            delays = []
            for peer in workers:
                if peer is decider:
                    continue
                applied = peer.next()
                if applied.get("to") != state or applied.get("trigger") != "propagated":
                    raise RuntimeError(f"flip {flip}: worker {peer.index} reported {applied}")
                delays.append(applied["at"] - decided["at"])
            result.peer_delays.extend(delays)
            result.flip_delays.append(max(delays))
        token = uuid.uuid4().hex
        client.publish(channel, json.dumps({"sentinel": token}))
        while True:
            message = listener.get_message(timeout=10)
            if message is None:
                raise RuntimeError("the sentinel never came back")
            if message["type"] != "message":
                continue
            data = json.loads(message["data"])
            if data.get("sentinel") == token:
                break
            if data.get("service") == SERVICE:
                result.messages += 1
    finally:
        for worker in workers:
            worker.close()
        listener.close()
        client.close()
    result.elapsed = time.monotonic() - started
    return result


def evaluate(result: PropagationResult) -> PropagationVerdict:
    """PASS/MISS of the goal: p99 of the flip delay (decision to the last peer) under 100 ms."""
    p99 = percentile(result.flip_delays, 99)
    return PropagationVerdict(
        "p99 decision -> every peer applied < 100 ms",
        f"{p99 * 1000:.1f} ms",
        "PASS" if p99 < GOAL_P99_SECONDS else "MISS",
    )


def _ms(value: float) -> str:
    return f"{value * 1000:8.2f} ms"


def format_propagation(result: PropagationResult) -> str:
    """The report as text: percentiles of both delays, the message count, the verdict."""
    s = result.settings
    out = [
        f"Cluster propagation: Redis {result.redis_version} at {s.redis_url}; {s.workers} worker processes; "
        f"{s.flips} flips (OPEN and CLOSED in turn); {result.elapsed:.1f} s",
        "",
        f"{'delay':<40}{'p50':>12}{'p90':>12}{'p99':>12}{'max':>12}",
    ]
    for label, values in (
        ("decision -> one peer applied", result.peer_delays),
        ("decision -> every peer applied (a flip)", result.flip_delays),
    ):
        out.append(
            f"{label:<40}"
            + "".join(f"{_ms(percentile(values, q)):>12}" for q in (50, 90, 99))
            + f"{_ms(max(values) if values else math.nan):>12}"
        )
    out += [
        "",
        f"messages on the channel: {result.messages} for {s.flips} decisions (one each, nothing echoed)",
        "",
    ]
    verdict = evaluate(result)
    out.append(f"goal: {verdict.text}: {verdict.value} {verdict.status}")
    return "\n".join(out)


def to_json(result: PropagationResult) -> dict[str, Any]:
    """Every figure as plain data (seconds)."""
    return {
        "settings": asdict(result.settings),
        "redis_version": result.redis_version,
        "flips": len(result.flip_delays),
        "messages": result.messages,
        "peer_delays": result.peer_delays,
        "flip_delays": result.flip_delays,
        "percentiles": {
            "peer": {str(q): percentile(result.peer_delays, q) for q in (50, 90, 99)},
            "flip": {str(q): percentile(result.flip_delays, q) for q in (50, 90, 99)},
        },
        "verdict": asdict(evaluate(result)),
    }


def main(
    argv: list[str] | None = None,
    *,
    quick: bool | None = None,
    json_file: str | None = None,
    redis_url: str | None = None,
) -> int:
    """``python -m benchmarks.propagation [--quick] [--redis-url URL] [--json FILE]``; the exit code."""
    from .cli import run_redis_bench

    return run_redis_bench(
        argv,
        prog="python -m benchmarks.propagation",
        description="cluster propagation benchmark",
        default_url=DEFAULT_URL,
        settings=(PROPAGATION_DEFAULT, PROPAGATION_QUICK),
        bench=bench_propagation,
        render=format_propagation,
        as_json=to_json,
        quick=quick,
        json_file=json_file,
        redis_url=redis_url,
    )


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--worker":
        _worker(json.loads(sys.argv[2]))
    else:
        sys.exit(main(sys.argv[1:]))

"""Worker process for the fleet tests: one breaker on a shared store, driven by commands.

Run in real OS processes (multiprocessing, spawn). The "dependency" is a few Redis keys
on DB 12 that count the calls that reach it, so the dependency itself testifies how many
probes got through. The parent sends commands on a queue; the worker answers on another.
"""

from __future__ import annotations

import os
import time

DEP_URL = "redis://127.0.0.1:6379/12"
THREADS = 4  # callers per worker process in the probing phase
HOLD = 600  # seconds a held call waits for its release: longer than any fleet test may run


def _breaker(
    backend: str,
    name: str,
    sync: float,
    lease: float,
    max_calls: int,
    timeout: float,
    prefix: str,
    store_url: str | None = None,
):
    from baldur_django.core.breaker import CircuitBreaker
    from baldur_django.core.clock import SYSTEM_CLOCK as clock
    from baldur_django.core.config import SettingsSource, build_config
    from baldur_django.core.events import EventBus
    from baldur_django.core.log import LoggingListener
    from baldur_django.core.sync import StoreGuard
    from baldur_django.core.testing import RecordingListener

    if backend in ("redis", "cluster"):  # cluster: a Redis Cluster node's URL in store_url
        from baldur_django.core.stores.redis import RedisStore, connect

        client = connect(store_url or "redis://127.0.0.1:6379/13", socket_timeout=2.0, cluster=backend == "cluster")
        store = RedisStore(client, prefix=prefix)
    else:
        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
        import django

        django.setup()
        from baldur_django.backends.database import DatabaseStore

        store = DatabaseStore(alias="pg")
    bus = EventBus()
    events = RecordingListener(bus)
    bus.subscribe(LoggingListener(lambda: "WARNING"))
    environ = {
        "BALDUR_CB_SYNC_INTERVAL_SECONDS": str(sync),
        "BALDUR_CB_HALF_OPEN_PROBE_LEASE_SECONDS": str(lease),
    }
    config = build_config(
        name,
        {
            "failure_threshold": 1,
            "recovery_timeout": timeout,
            "half_open_max_calls": max_calls,
            "failure_rate_threshold": 0,
        },
        SettingsSource(environ=environ),
    )
    guard = StoreGuard(store, lambda: 60.0, bus.publish, clock.monotonic, clock.wall)
    breaker = CircuitBreaker(name, config, clock=clock, bus=bus)
    breaker.use_store(guard)
    return breaker, events


def dependency(client, dep: str, permit=None) -> str:
    """The protected call: counts itself, then fails, succeeds or holds as the parent says.

    *dep* prefixes the dependency's keys (``<dep>:calls``, ``:mode``, ``:held``, ``:release``).
    """
    client.incr(f"{dep}:calls")
    mode = (client.get(f"{dep}:mode") or b"ok").decode()
    if mode == "fail":
        raise ConnectionError("dependency down")
    if mode == "hold":
        client.incr(f"{dep}:held")
        client.rpush(f"{dep}:who", f"pid={os.getpid()} permit={permit!r}")
        if client.blpop([f"{dep}:release"], timeout=HOLD) is None:
            raise TimeoutError("never released")
    return "ok"


def main(
    backend: str,
    name: str,
    commands,
    answers,
    sync: float = 0.2,
    lease: float = 30.0,
    max_calls: int = 3,
    timeout: float = 0.3,
    prefix: str = "baldur",
    dep: str = "dep",
    store_url: str | None = None,
) -> None:
    import redis

    from baldur_django.core.errors import CircuitOpenError

    client = redis.Redis.from_url(DEP_URL)
    breaker, events = _breaker(backend, name, sync, lease, max_calls, timeout, prefix, store_url)
    answers.put(("ready", os.getpid()))
    while True:
        command, arg = commands.get()
        if command == "stop":
            answers.put(("stopped", None))
            return
        if command == "call_until_rejected":
            # phase 1: keep calling the (failing) dependency until the breaker rejects
            calls = 0
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                try:
                    permit = breaker.acquire()
                except CircuitOpenError:
                    break
                calls += 1
                try:
                    dependency(client, dep)
                except Exception:
                    breaker.record_failure(permit)
                else:
                    breaker.record_success(permit)
            answers.put(("rejected", {"calls": calls, "kinds": events.kinds()}))
        elif command == "probe_until":
            # phase 2: THREADS callers per process attempt calls until the parent sets the stop key
            import threading

            lock = threading.Lock()
            tally = {"admitted": 0, "rejected": 0, "reasons": {}}

            def caller():
                try:
                    keep_calling(redis.Redis.from_url(DEP_URL))
                finally:
                    if backend == "database":
                        # this thread's own connection: closed now, not when the garbage
                        # collector gets to it (every round starts THREADS new threads, and
                        # PostgreSQL refuses clients past max_connections: store trouble)
                        from django.db import connections

                        connections.close_all()

            def keep_calling(own):
                deadline = time.monotonic() + HOLD  # only if the parent is gone
                while time.monotonic() < deadline and not own.exists(arg):
                    try:
                        permit = breaker.acquire()
                    except CircuitOpenError as exc:
                        with lock:
                            tally["rejected"] += 1
                            tally["reasons"][exc.reason] = tally["reasons"].get(exc.reason, 0) + 1
                        own.incr(f"{dep}:rejected")
                        time.sleep(0.01)  # pacing of the traffic, not synchronisation
                        continue
                    with lock:
                        tally["admitted"] += 1
                    try:
                        dependency(own, dep, permit=permit)
                    except Exception:
                        breaker.record_failure(permit)
                    else:
                        breaker.record_success(permit)

            threads = [threading.Thread(target=caller) for _ in range(THREADS)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            answers.put(("probed", {**tally, "state": breaker.state.value, "kinds": events.kinds()}))
        elif command == "call_n":
            outcomes = []
            for _ in range(arg):
                try:
                    permit = breaker.acquire()
                except CircuitOpenError as exc:
                    outcomes.append("rejected:" + exc.reason)
                    continue
                try:
                    dependency(client, dep)
                except Exception:
                    breaker.record_failure(permit)
                    outcomes.append("failed")
                else:
                    breaker.record_success(permit)
                    outcomes.append("ok")
            answers.put(
                (
                    "called",
                    {
                        "outcomes": outcomes,
                        "kinds": events.kinds(),
                        "forced": breaker.forced,
                        "state": breaker.state.value,
                    },
                )
            )
        elif command == "acquire_probe_and_hang":
            permit = None
            deadline = time.monotonic() + 10
            while permit is None and time.monotonic() < deadline:
                try:
                    permit = breaker.acquire()
                except CircuitOpenError:
                    time.sleep(0.01)
            answers.put(("probing", bool(permit and permit.trial)))
            dependency(client, dep)  # holds until killed

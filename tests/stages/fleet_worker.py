"""Process bodies for the fleet bulkhead tests (multiprocessing, spawn), and a non-atomic
stand-in for the slot script used by the meta-test.

The calls a worker makes are metered on the Redis server itself: ``INCR`` of a meter key
when a call starts (its answer is the number of calls in flight in the whole fleet at that
moment) and ``DECR`` when it ends; each worker reports the largest answer it saw.
"""

from __future__ import annotations

import time
from typing import Any

from baldur_django.core.clock import SYSTEM_CLOCK

REDIS_URL = "redis://127.0.0.1:6379/7"  # the fleet bulkhead tests' own DB
FOREVER = 600.0  # seconds a holder waits to be killed: longer than any test runs


class NonAtomicScript:
    """The slot script's steps as separate commands, each its own round trip: another
    process can take the last slot between the count and the add (the window is widened
    by a 2 ms pause, as a slower network would)."""

    def __init__(self, client: Any) -> None:
        self.client = client

    def __call__(self, keys: list[str], args: list[Any]) -> int:
        client, key = self.client, keys[0]
        mode, token, limit, lease_ms = args
        seconds, micros = client.time()
        now_ms = seconds * 1000 + micros // 1000
        client.zremrangebyscore(key, "-inf", now_ms)
        if mode == "give":
            return int(client.zrem(key, token))
        if client.zcard(key) >= int(limit):
            return 0
        time.sleep(0.002)  # a slower network between the count and the add: a wider window
        client.zadd(key, {token: now_ms + int(lease_ms)})
        client.pexpire(key, int(lease_ms))
        return 1


class NonAtomicClient:
    """A client whose ``register_script`` hands out :class:`NonAtomicScript`."""

    def __init__(self, client: Any) -> None:
        self.client = client

    def register_script(self, text: str) -> NonAtomicScript:
        return NonAtomicScript(self.client)


def fleet(prefix: str, service: str, limit: int, max_wait: float, lease: float, atomic: bool = True) -> Any:
    from baldur_django.core.stages.fleet_bulkhead import FleetBulkhead
    from baldur_django.core.stores.redis import connect

    client = connect(REDIS_URL, socket_timeout=5.0)
    return FleetBulkhead(
        service, limit, max_wait, lease, client if atomic else NonAtomicClient(client), SYSTEM_CLOCK, prefix=prefix
    ), client


def hammer(prefix: str, service: str, limit: int, calls: int, atomic: bool, start: Any, out: Any) -> None:
    """Wait for *start*, then make *calls* calls through the fleet bulkhead (a long wait);
    put (most in flight seen, calls made, errors) on *out*."""
    bulkhead, client = fleet(prefix, service, limit, 120.0, 60.0, atomic)
    meter = f"{prefix}:meter"
    most = made = 0
    errors: list[str] = []
    start.wait(60)
    for _ in range(calls):
        try:
            ticket = bulkhead.enter()
        except Exception as exc:
            errors.append(repr(exc))
            continue
        try:
            most = max(most, int(client.incr(meter)))
            made += 1
            client.decr(meter)
        finally:
            bulkhead.leave(ticket)
    out.put((most, made, errors))


def hold(prefix: str, service: str, limit: int, lease: float, slots: int, taken: Any) -> None:
    """Take *slots* fleet slots, set *taken*, then wait to be killed without giving them back."""
    bulkhead, _ = fleet(prefix, service, limit, 0.0, lease)
    tickets = [bulkhead.enter() for _ in range(slots)]
    taken.set()
    time.sleep(FOREVER)  # never the test's synchronisation: the test SIGKILLs this process
    for ticket in tickets:
        bulkhead.leave(ticket)

"""Process bodies for the wired-stage race tests (multiprocessing, spawn): functions protected
by ``@baldur.protected`` whose breaker shares its state, and its fleet stages, through the
Redis store on the race tests' own DB.

Calls in flight across the fleet are metered on the Redis server itself (``INCR`` of a meter
key as a call starts: its answer is the number in flight in the whole fleet then; ``DECR``
as it ends), as in tests/stages/fleet_worker.py.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

REDIS_URL = "redis://127.0.0.1:6379/6"  # the wired race tests' own DB
FOREVER = 600.0  # seconds a holder waits to be killed: longer than any test runs
FLEET_LIMIT = 2
RATIO, PER_SECOND = 0.2, 1.0  # the fleet retry budget's knobs


def share(prefix: str, lease: float | None = None) -> Any:
    """Share this process's breakers through the Redis store under *prefix*; with *lease*,
    ``BALDUR_BULKHEAD_LEASE_SECONDS`` is set to it first. Returns the store's client."""
    if lease is not None:
        os.environ["BALDUR_BULKHEAD_LEASE_SECONDS"] = str(lease)
    from baldur_django.core.config import settings
    from baldur_django.core.registry import registry
    from baldur_django.core.stores.redis import RedisStore, connect

    settings.reset()
    client = connect(REDIS_URL, socket_timeout=5.0)
    registry.set_store(RedisStore(client, prefix=prefix))
    return client


def crowd(prefix: str, atomic: bool, calls: int, start: Any, out: Any) -> None:
    """Wait for *start*, then make *calls* calls of a function protected by a fleet bulkhead
    of ``FLEET_LIMIT`` slots (a long wait); put (most in flight seen in the fleet, calls
    made, errors) on *out*. Not *atomic*: the slot script's steps are sent one by one
    (``fleet_worker.NonAtomicScript``), as the meta-test needs."""
    import baldur_django as baldur
    from tests.stages.fleet_worker import NonAtomicScript

    client = share(prefix)
    if not atomic:  # the fleet bulkhead registers its script on the store's client when built
        client.register_script = lambda text: NonAtomicScript(client)
    meter = f"{prefix}:meter"
    seen = [0]

    @baldur.protected("pay", max_concurrent_calls=FLEET_LIMIT, max_wait=120, bulkhead_scope="fleet")
    def pay() -> None:
        seen[0] = max(seen[0], int(client.incr(meter)))
        client.decr(meter)

    made = 0
    errors: list[str] = []
    start.wait(60)
    for _ in range(calls):
        try:
            pay()
            made += 1
        except Exception as exc:
            errors.append(repr(exc))
    out.put((seen[0], made, errors))


def hold(prefix: str, lease: float, slots: int, taken: Any) -> None:
    """Take *slots* of 3 fleet slots, each by a thread inside a protected function that never
    returns; set *taken* once all are inside, then wait to be SIGKILLed."""
    import baldur_django as baldur

    share(prefix, lease)
    inside = threading.Semaphore(0)
    never = threading.Event()

    @baldur.protected("pay", max_concurrent_calls=3, bulkhead_scope="fleet")
    def pay() -> None:
        inside.release()
        never.wait(FOREVER)  # the test SIGKILLs this process

    for _ in range(slots):
        threading.Thread(target=pay, daemon=True).start()
    for _ in range(slots):
        inside.acquire(timeout=60)
    taken.set()
    never.wait(FOREVER)


def retries_dropped(client: Any) -> None:
    """Make the fleet retry budget's flush script (registered on *client* when the budget is
    built) add this process's calls but not its retries: the fleet sums calls only, so no
    process learns of another's retries (the meta-test's broken budget)."""
    register = client.register_script

    def register_script(text: str) -> Any:
        script = register(text)
        if "add_retries" not in text:
            return script
        return lambda keys, args: script(keys=keys, args=[args[0], 0, *args[2:]])

    client.register_script = register_script


def spend(prefix: str, role: str, calls: int, summed: bool, start: Any, out: Any) -> None:
    """One of four processes sharing a fleet retry budget through a protected function with
    one retry: a "call" process's calls succeed at once, a "retry" process's first attempt
    fails and the retry succeeds when the budget allows it. Each call takes about 0.5 ms (the
    remote call's own time), so the run spans several flush intervals. Not *summed*: the
    flush adds no retries (:func:`retries_dropped`). Puts (role, monotonic times of the
    retries made, calls made) on *out*."""
    import baldur_django as baldur

    client = share(prefix)
    if not summed:
        retries_dropped(client)
    retries: list[float] = []
    first = [True]

    @baldur.protected(
        "pay",
        retry=baldur.RetryPolicy(max_attempts=2, backoff_initial=0, jitter=0),
        retry_budget_ratio=RATIO,
        retry_budget_min_per_second=PER_SECOND,
        retry_budget_scope="fleet",
        failure_threshold=10**6,
        failure_rate_threshold=0,
        fallback=lambda: "failed",
    )
    def pay() -> str:
        time.sleep(0.0005)  # the remote call's own time, not a synchronisation
        if role == "retry" and first[0]:
            first[0] = False
            raise ConnectionError("the first attempt fails")
        if not first[0]:
            retries.append(time.monotonic())
        return "ok"

    start.wait(60)
    for _ in range(calls):
        first[0] = True
        pay()
    out.put((role, retries, calls))

"""The Retry-After gate shared by every worker process through the store.

A worker that meets an answer asking for quiet closes its own gate
(:class:`~.gate.RetryAfterGate`) and writes the end to the shared store once, for that
answer (never per call). Other workers learn of it when they next read the store - a
breaker's consult of its shared record, or a propagation listener - with
:func:`gate_ends`, one round trip for any number of services, and close their own gates
until then; a write can also be announced (``FleetGate(..., announce=)``) for a
propagation channel to pass on at once. The per-call check stays the local, lock-free
one: no store I/O on a call.

The store side is a tiny protocol, :class:`GateStore`, with two implementations here and
a third in the Django layer (the ``database`` backend's store keeps the ends in a table,
on the database clock, with a row lock per write):

* :class:`MemoryGateStore` - a dict under a lock, for tests and the memory backend;
* :class:`RedisGateStore` - one key per service, ``<prefix>:gate:{<name>}`` (the hash tag
  is the breaker's own, so on a Redis Cluster the key lives in the slot of the breaker's
  record). The key holds the end in Unix milliseconds of the store's clock and expires at
  it. A write is one ``EVALSHA`` of ``gate_close.lua``, which reads Redis ``TIME``, keeps
  the later end and sets the expiry: the workers' own clocks never matter. A read is one
  pipeline of ``PTTL`` commands (the time left, measured by the store), one round trip
  (on a cluster: one per node holding some of the keys).

While the store is unreachable the local gate still works: the write is dropped and
``circuit_breaker.store_unavailable`` is logged once per service until a write succeeds
again. Store errors are recognised by type (:func:`~..stores.redis.store_errors`).
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable, Iterable, Sequence
from importlib import resources
from typing import Any, Protocol, runtime_checkable

from ..clock import Clock
from ..errors import ConfigError
from ..log import log_event
from ..stores.base import StoreUnavailable, safe_key
from .gate import RetryAfterGate

__all__ = ["GateStore", "MemoryGateStore", "RedisGateStore", "FleetGate", "gate_ends"]


@runtime_checkable
class GateStore(Protocol):
    """Where the fleet's Retry-After gates are kept. Times are seconds.

    Both methods raise :class:`~..stores.base.StoreUnavailable` when the store does not answer.
    """

    def close_gate(self, service: str, seconds: float) -> float:
        """Keep *service*'s gate closed at least *seconds* from now (store clock), keeping
        a later end already stored; one round trip. Returns the seconds left until the
        stored end after the write."""
        ...

    def gates_left(self, services: Sequence[str]) -> dict[str, float]:
        """Seconds left of each closed gate among *services* (the open ones are absent);
        one round trip for all of them."""
        ...


class MemoryGateStore:
    """:class:`GateStore` in this process: ends in a dict, every operation under one lock.

    Args:
        now: the store's clock, seconds (a FakeClock's ``monotonic`` in tests; default
            :func:`time.monotonic`).
    """

    def __init__(self, now: Callable[[], float] | None = None) -> None:
        import time

        self._now = now or time.monotonic
        self._lock = threading.Lock()
        self._ends: dict[str, float] = {}

    def close_gate(self, service: str, seconds: float) -> float:
        with self._lock:
            now = self._now()
            end = max(self._ends.get(service, now), now + seconds)
            if end > now:
                self._ends[service] = end
            return end - now

    def gates_left(self, services: Sequence[str]) -> dict[str, float]:
        with self._lock:
            now = self._now()
            found = {}
            for service in services:
                end = self._ends.get(service)
                if end is None:
                    continue
                if end > now:
                    found[service] = end - now
                else:  # expired: forget it, as a key expires on Redis
                    del self._ends[service]
            return found


class RedisGateStore:
    """:class:`GateStore` on Redis (see the module's text for the keys and the script).

    Args:
        client: a redis-py client (``stores.redis.connect(url)``, a django-redis
            connection, or a cluster client); typed ``Any`` as in the Redis store.
        prefix: key prefix (``"baldur"``).
    """

    def __init__(self, client: Any, prefix: str = "baldur") -> None:
        self.client = client
        self.prefix = prefix
        text = resources.files("baldur_django.core.stores").joinpath("lua", "gate_close.lua").read_text("utf-8")
        self._close = client.register_script(text)

    def key(self, service: str) -> str:
        """The gate key of *service*: ``<prefix>:gate:{<safe name>}``."""
        return f"{self.prefix}:gate:{{{safe_key(service)}}}"

    def close_gate(self, service: str, seconds: float) -> float:
        from ..stores.redis import store_errors

        try:
            left_ms = self._close(keys=[self.key(service)], args=[repr(float(seconds))])
        except store_errors() as exc:
            raise StoreUnavailable(f"redis gate write failed: {type(exc).__name__}: {exc}") from exc
        return max(0.0, int(left_ms) / 1000.0)

    def gates_left(self, services: Sequence[str]) -> dict[str, float]:
        from ..stores.redis import store_errors

        if not services:
            return {}
        try:
            pipe = self.client.pipeline(transaction=False)
            for service in services:
                pipe.pttl(self.key(service))
            answers = pipe.execute()
        except store_errors() as exc:
            raise StoreUnavailable(f"redis gate read failed: {type(exc).__name__}: {exc}") from exc
        # PTTL: -2 no key (open), -1 a key without expiry (never written by the script: ignored)
        return {s: int(ms) / 1000.0 for s, ms in zip(services, answers, strict=True) if int(ms) > 0}


def gate_ends(store: GateStore, names: Iterable[str], clock: Clock) -> dict[str, float]:
    """Where the fleet's closed gates end, in this process's monotonic clock; one round trip.

    Args:
        store: the shared gate store.
        names: the services to look up.
        clock: this process's clock; the store's "seconds left" are added to its
            ``monotonic()`` read after the answer arrived (so the end is never early).

    Returns:
        ``{service: monotonic end, seconds}`` for each closed gate among *names*; hand each
        to :meth:`RetryAfterGate.close_until`.

    Raises:
        StoreUnavailable: the store did not answer.
    """
    left = store.gates_left(list(names))
    if not left:
        return {}
    now = clock.monotonic()
    return {service: now + seconds for service, seconds in left.items()}


class FleetGate:
    """A service's Retry-After gate that also tells the fleet.

    Same calls as :class:`RetryAfterGate` (the stage runs either): :meth:`check` and
    :meth:`remaining` are the local gate's (no I/O); :meth:`observe` and :meth:`close_for`
    close the local gate and write the end to the store once; :meth:`close_until` only
    closes the local gate (for an end learned from the store with :func:`gate_ends`).

    Args:
        gate: this process's gate of the service.
        store: the shared gate store.
        announce: called as ``announce(service, seconds_left)`` after each write the store
            took (seconds left of the stored end), so that a propagation channel can tell
            the other workers at once; None: they learn at their next read. It must not
            block (a queue's ``put_nowait``); its exceptions are not caught.
    """

    __slots__ = ("gate", "store", "service", "announce", "_lock", "_warned")

    def __init__(
        self, gate: RetryAfterGate, store: GateStore, *, announce: Callable[[str, float], None] | None = None
    ) -> None:
        self.gate = gate
        self.store = store
        self.announce = announce
        self.service = gate.service
        self._lock = threading.Lock()
        self._warned = False

    def __repr__(self) -> str:
        return f"<FleetGate {self.service!r} remaining={self.gate.remaining():.3f}s>"

    def check(self, *, forced_closed: bool = False) -> None:
        """:meth:`RetryAfterGate.check` (raises ``RateLimitCooldownError`` while closed)."""
        self.gate.check(forced_closed=forced_closed)

    def remaining(self) -> float:
        """Seconds until this process's gate opens (0.0 while open)."""
        return self.gate.remaining()

    def refused(self) -> int:
        """The calls this process's gate refused since it was made."""
        return self.gate.refused()

    def end(self) -> float | None:
        """:meth:`RetryAfterGate.end`: the monotonic time this process's gate opens at, or None."""
        return self.gate.end()

    def close_until(self, until: float) -> float:
        """Close this process's gate until the monotonic time *until* (seconds); no store
        write. Returns the seconds left."""
        return self.gate.close_until(until)

    def close_for(self, seconds: float) -> float:
        """Close the gate for *seconds* here and in the store (one write; store I/O).

        Returns:
            Seconds until this process's gate opens: a later end another worker stored
            is adopted from the write's answer.

        Raises:
            ConfigError: *seconds* is not a number.
        """
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or math.isnan(seconds):
            raise ConfigError(f"seconds must be a number of seconds, got {seconds!r}")
        seconds = min(float(seconds), self.gate.max_seconds)
        self.gate.close_for(seconds)
        self.publish(seconds)
        return self.gate.remaining()

    def observe(self, outcome: object) -> float | None:
        """:meth:`RetryAfterGate.observe`, plus one store write when the gate was asked to
        close (store I/O then; never on an ordinary answer).

        Returns:
            The seconds the answer asked for (capped), or None.
        """
        seconds = self.gate.observe(outcome)
        if seconds is not None:
            self.publish(seconds)
        return seconds

    def publish(self, seconds: float) -> bool:
        """Write "closed for *seconds* from now" to the store (one round trip) and adopt a
        later end the store answers with.

        Returns:
            True when written; False when the store did not answer (the write is dropped;
            the first drop since the last good write logs ``circuit_breaker.store_unavailable``).
        """
        if seconds <= 0:
            return True
        try:
            left = self.store.close_gate(self.service, seconds)
        except StoreUnavailable as exc:
            self._dropped(seconds, exc)
            return False
        self._warned = False
        if left > seconds:
            self.gate.close_for(left)
        if self.announce is not None:
            self.announce(self.service, left)
        return True

    def _dropped(self, seconds: float, exc: StoreUnavailable) -> None:
        with self._lock:
            first, self._warned = not self._warned, True
        if first:
            log_event(
                logging.WARNING,
                "circuit_breaker.store_unavailable",
                self.service,
                "retry_after_gate_write_dropped seconds=%.3f error=%s",
                seconds,
                exc,
                error=str(exc),
            )

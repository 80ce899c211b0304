"""The fleet bulkhead: at most N calls of a service in flight across every process that
shares one Redis server.

Slots are leases: a sorted set (key ``<prefix>:{<safe name>}:bulkhead``, the breaker's own
hash tag) of slot token -> end of its lease on the Redis clock. One script
(``core/stores/lua/bulkhead.lua``) drops the leases that have ended and takes or gives back
a slot, atomically, so taking a slot is one round trip and giving it back is one more. A
process that dies holding slots loses them when their leases end (``lease_seconds``); a
call that runs longer than its lease loses its slot the same way, so the lease should
outlast the slowest call.

A call that finds every slot leased asks again after 5 ms, then after twice the previous
pause each time, at most 100 ms apart (:data:`FIRST_POLL_SECONDS`,
:data:`MAX_POLL_SECONDS`), until ``max_wait`` (or the caller's ``timeout``) is spent.

While Redis cannot be reached (any error of :func:`~..stores.redis.store_errors`, matched
by type), each worker keeps to a per-worker :class:`~.bulkhead.Bulkhead` of the same limit,
logs ``circuit_breaker.bulkhead_store_unavailable`` once, asks Redis again after
:data:`STORE_RETRY_SECONDS` and logs ``circuit_breaker.bulkhead_store_recovered`` when it
answers. From ``async def`` every round trip runs in a worker thread
(``asyncio.to_thread``), never on the event loop.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
import threading
import uuid
from collections.abc import Callable, Coroutine
from importlib import resources
from typing import Any

from ..clock import Clock
from ..errors import BulkheadFullError, ConfigError
from ..log import log_event
from ..stores.base import safe_key
from ..stores.redis import store_errors
from .budget import count_of
from .bulkhead import Bulkhead, allowed_wait

__all__ = ["FleetBulkhead", "FIRST_POLL_SECONDS", "MAX_POLL_SECONDS", "STORE_RETRY_SECONDS", "script_text"]

#: The first pause (seconds) before a waiting call asks for a slot again; each pause doubles.
FIRST_POLL_SECONDS = 0.005
#: The longest pause (seconds) between two asks of a waiting call.
MAX_POLL_SECONDS = 0.1
#: Seconds a worker keeps to its own limit after Redis failed, before it asks Redis again.
STORE_RETRY_SECONDS = 1.0

_TAKE, _GIVE = "take", "give"


def script_text() -> str:
    """The source of the slot script, ``core/stores/lua/bulkhead.lua``."""
    lua = resources.files("baldur_django.core.stores").joinpath("lua").joinpath("bulkhead.lua")
    return lua.read_text(encoding="utf-8")


def _check_lease(seconds: Any) -> float:
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not math.isfinite(seconds):
        raise ConfigError(f"lease_seconds={seconds!r}: a lease is a finite number of seconds of at least 0.001")
    if seconds < 0.001:
        raise ConfigError(f"lease_seconds={seconds!r}: a lease is a finite number of seconds of at least 0.001")
    return float(seconds)


class _Lease:
    """A slot taken by :meth:`FleetBulkhead.enter`: a leased token, or (while Redis is
    unreachable) a ticket of the worker's own bulkhead."""

    __slots__ = ("owner", "token", "local")

    def __init__(self, owner: FleetBulkhead, token: str | None, local: object = None) -> None:
        self.owner = owner
        self.token = token
        self.local = local

    def __repr__(self) -> str:
        where = "worker" if self.local is not None else "fleet"
        return f"<fleet bulkhead ticket {self.owner.service!r} {where} held={self.token is not None}>"


class _Claim:
    """One ask for a slot from ``async def``, run in a worker thread: whichever of the thread
    and a cancelled task comes second gives back a slot the ask took."""

    __slots__ = ("lock", "abandoned", "taken")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.abandoned = False
        self.taken = False


class FleetBulkhead:
    """At most *limit* calls of a service in flight across the processes sharing *client*'s
    Redis server.

    Args:
        service (str): the breaker's name, carried by the refusals.
        limit (int): the number of slots in the whole fleet, at least 1.
        max_wait (float): seconds a call may wait for a slot; 0: refused at once when every
            slot is leased.
        lease_seconds (float): seconds a slot stays taken when its holder never gives it
            back (a killed process); at least 0.001.
        client: a redis-py client (``stores.redis.connect(url)``), a cluster one included.
        clock (Clock): measures the waits and paces the asks (``monotonic``, ``sleep``).
        prefix (str): the key prefix, as the Redis store's (``"baldur"``).

    Raises:
        ConfigError: *limit*, *max_wait* or *lease_seconds* is out of range.

    Same use as :class:`~.bulkhead.Bulkhead`: one :meth:`leave` (or :meth:`aleave`) per
    ticket, on every way out of the call; a second one changes nothing.
    """

    def __init__(
        self,
        service: str,
        limit: int,
        max_wait: float,
        lease_seconds: float,
        client: Any,
        clock: Clock,
        *,
        prefix: str = "baldur",
    ) -> None:
        self.local = Bulkhead(service, limit, max_wait, clock)  # also checks limit and max_wait
        self.service = service
        self.limit = self.local.limit
        self.max_wait = self.local.max_wait
        self.lease_seconds = _check_lease(lease_seconds)
        self.clock = clock
        self.key = f"{prefix}:{{{safe_key(service)}}}:bulkhead"
        self._lease_ms = max(1, round(self.lease_seconds * 1000))
        self._script = client.register_script(script_text())
        self._errors = store_errors()
        self._lock = threading.Lock()
        self._held = 0  # fleet slots this process holds
        self._retry_at: float | None = None  # None: Redis answers; else when to ask it again
        self._refused = itertools.count()  # fleet refusals, stepped on the refusal path only

    def __repr__(self) -> str:
        return f"<FleetBulkhead {self.service!r} limit={self.limit} here={self.in_flight()}>"

    def in_flight(self) -> int:
        """The number of slots this process holds now: fleet leases plus, while Redis is
        unreachable, slots of its own bulkhead."""
        return self._held + self.local.in_flight()

    def refused(self) -> int:
        """The calls refused with :class:`BulkheadFullError` since the bulkhead was made,
        those its own bulkhead refused while Redis was unreachable included."""
        return count_of(self._refused) + self.local.refused()

    def store_available(self) -> bool:
        """False while this worker keeps to its own limit because Redis failed."""
        return self._retry_at is None

    def enter(self, *, timeout: float | None = None) -> object:
        """Take a slot of the fleet, blocking this thread while every slot is leased.

        Args:
            timeout (float | None): seconds this call may wait at most; the wait is the
                smaller of it and ``max_wait`` (None: ``max_wait``).

        Returns:
            A ticket for :meth:`leave`.

        Raises:
            BulkheadFullError: no slot came free within the wait.
        """
        wait = allowed_wait(self.max_wait, timeout)
        if self._keep_local():
            return _Lease(self, None, self.local.enter(timeout=wait))
        clock = self.clock
        deadline = clock.monotonic() + wait
        token = uuid.uuid4().hex
        pause = FIRST_POLL_SECONDS
        while True:
            taken = self._run(_TAKE, token)
            if taken:
                return self._leased(token)
            remaining = deadline - clock.monotonic()
            if taken is None:
                return _Lease(self, None, self.local.enter(timeout=max(0.0, remaining)))
            if remaining <= 0:
                next(self._refused)
                raise BulkheadFullError(self.service)
            clock.sleep(min(pause, remaining))
            pause = min(pause * 2, MAX_POLL_SECONDS)

    async def aenter(self, *, timeout: float | None = None) -> object:
        """Take a slot of the fleet without blocking the event loop (each ask runs in a
        worker thread; the pauses between asks are awaited).

        Args:
            timeout (float | None): seconds this call may wait at most; the wait is the
                smaller of it and ``max_wait`` (None: ``max_wait``).

        Returns:
            A ticket for :meth:`leave` or :meth:`aleave`.

        Raises:
            BulkheadFullError: no slot came free within the wait.
            asyncio.CancelledError: the task was cancelled; a slot its ask took meanwhile
                is given back.
        """
        wait = allowed_wait(self.max_wait, timeout)
        if self._keep_local():
            return _Lease(self, None, await self.local.aenter(timeout=wait))
        clock = self.clock
        deadline = clock.monotonic() + wait
        token = uuid.uuid4().hex
        pause = FIRST_POLL_SECONDS
        asleep: Callable[[float], Coroutine[Any, Any, None]] = getattr(clock, "asleep", None) or asyncio.sleep
        while True:
            taken = await self._ask_off_loop(token)
            if taken:
                return self._leased(token)
            remaining = deadline - clock.monotonic()
            if taken is None:
                return _Lease(self, None, await self.local.aenter(timeout=max(0.0, remaining)))
            if remaining <= 0:
                next(self._refused)
                raise BulkheadFullError(self.service)
            await asleep(min(pause, remaining))
            pause = min(pause * 2, MAX_POLL_SECONDS)

    def leave(self, ticket: object) -> None:
        """Give the slot of *ticket* back: one round trip for a fleet slot (a failure is
        logged once and the lease simply ends). Idempotent per ticket.

        Raises:
            ConfigError: *ticket* is not one of this bulkhead's tickets.
        """
        token = self._surrender(ticket)
        if token is not None:
            self._run(_GIVE, token)

    async def aleave(self, ticket: object) -> None:
        """:meth:`leave` for ``async def``: the round trip runs in a worker thread, and runs
        even when the task is cancelled while it waits for one (the lease is given back, not
        left to end)."""
        token = self._surrender(ticket)
        if token is not None:
            give = asyncio.get_running_loop().run_in_executor(None, self._run, _GIVE, token)
            await asyncio.shield(give)

    def _surrender(self, ticket: object) -> str | None:
        """Mark *ticket* given back; the token whose lease must be given back, if any."""
        if type(ticket) is not _Lease or ticket.owner is not self:
            raise ConfigError(f"ticket={ticket!r}: not a ticket of the fleet bulkhead of {self.service!r}")
        if ticket.local is not None:
            self.local.leave(ticket.local)
            return None
        with self._lock:
            token = ticket.token
            if token is None:
                return None
            ticket.token = None
            self._held -= 1
        return token

    def _leased(self, token: str) -> _Lease:
        with self._lock:
            self._held += 1
        return _Lease(self, token)

    async def _ask_off_loop(self, token: str) -> int | None:
        """One ask for a slot in a worker thread; a cancelled task gives back what it took."""
        claim = _Claim()
        loop = asyncio.get_running_loop()
        try:
            return await asyncio.to_thread(self._ask_for, claim, token)
        except BaseException:
            with claim.lock:
                claim.abandoned = True
                taken = claim.taken
            if taken:  # the ask took a slot the task will never use
                loop.run_in_executor(None, self._run, _GIVE, token)
            raise

    def _ask_for(self, claim: _Claim, token: str) -> int | None:
        """Run in a worker thread: take a slot, unless the asking task is gone by then."""
        taken = self._run(_TAKE, token)
        with claim.lock:
            if not claim.abandoned:
                claim.taken = bool(taken)
                return taken
        if taken:
            self._run(_GIVE, token)
        return 0

    def _run(self, mode: str, token: str) -> int | None:
        """One round trip of the slot script: its answer (1 or 0), None when Redis failed."""
        try:
            answer = int(self._script(keys=[self.key], args=[mode, token, self.limit, self._lease_ms]))
        except self._errors as exc:
            self._store_failed(exc)
            return None
        if self._retry_at is not None:
            self._store_answered()
        return answer

    def _keep_local(self) -> bool:
        retry_at = self._retry_at
        return retry_at is not None and self.clock.monotonic() < retry_at

    def _store_failed(self, exc: BaseException) -> None:
        with self._lock:
            first = self._retry_at is None
            self._retry_at = self.clock.monotonic() + STORE_RETRY_SECONDS
        if first:
            log_event(
                logging.WARNING,
                "circuit_breaker.bulkhead_store_unavailable",
                self.service,
                "limit=%d per worker error=%s",
                self.limit,
                f"{type(exc).__name__}: {exc}",
            )

    def _store_answered(self) -> None:
        with self._lock:
            was_down = self._retry_at is not None
            self._retry_at = None
        if was_down:
            log_event(
                logging.INFO, "circuit_breaker.bulkhead_store_recovered", self.service, "limit=%d fleet", self.limit
            )

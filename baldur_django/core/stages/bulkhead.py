"""The per-worker bulkhead: at most N calls of a service in flight in this process.

Threads and asyncio tasks (on any number of event loops) share one count. A call past the
limit waits for a slot, first come first served: a slot given back goes straight to the
longest waiter (no newcomer takes it first), so no waiter starves. A thread waits on a lock
of its own; a task awaits a future that the releasing thread resolves through its loop's
``call_soon_threadsafe``, so the event loop never blocks.

The count's lock is held only to read and change the count and the queue of waiters, never
while the caller's function runs.
"""

from __future__ import annotations

import asyncio
import math
import threading
from collections import deque
from typing import Any

from ..clock import Clock
from ..errors import BulkheadFullError, ConfigError

__all__ = ["Bulkhead", "POLL_SECONDS", "check_limit", "check_wait", "allowed_wait"]

#: A waiter reads the clock again at least this often (seconds), so a wait measured on an
#: injected clock ends when that clock says so, even though nothing wakes the waiter.
POLL_SECONDS = 0.05

_WAITING, _GRANTED, _GONE = 0, 1, 2


def check_limit(limit: Any, name: str = "limit") -> int:
    """*limit* as the number of slots.

    Args:
        limit: a whole number of at least 1 (a bool is refused).
        name: the argument's name, shown in the error.

    Returns:
        The limit, an int.

    Raises:
        ConfigError: *limit* is not a whole number of at least 1.
    """
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise ConfigError(f"{name}={limit!r}: the number of slots is a whole number of at least 1")
    return limit


def check_wait(seconds: Any, name: str = "max_wait") -> float:
    """*seconds* as a wait: a finite number of seconds, 0 or more.

    Raises:
        ConfigError: *seconds* is not a number, is negative, infinite or NaN.
    """
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not math.isfinite(seconds) or seconds < 0:
        raise ConfigError(f"{name}={seconds!r}: a wait is a finite number of seconds, 0 or more")
    return float(seconds)


def allowed_wait(max_wait: float, timeout: float | None) -> float:
    """Seconds a call may wait for a slot: *max_wait*, or *timeout* when that is smaller."""
    return max_wait if timeout is None else min(max_wait, timeout)


class _Ticket:
    """One slot taken by :meth:`Bulkhead.enter`; ``held`` turns False when it is given back."""

    __slots__ = ("owner", "held")

    def __init__(self, owner: Bulkhead) -> None:
        self.owner = owner
        self.held = True

    def __repr__(self) -> str:
        return f"<bulkhead ticket {self.owner.service!r} held={self.held}>"


class _ThreadWaiter:
    """A waiting thread: it blocks on its own lock, which the slot's giver releases."""

    __slots__ = ("state", "lock")

    def __init__(self) -> None:
        self.state = _WAITING
        self.lock = threading.Lock()
        self.lock.acquire()

    def wake(self) -> bool:
        self.lock.release()
        return True


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class _TaskWaiter:
    """A waiting task: it awaits a future of its loop, resolved from whichever thread gives
    the slot."""

    __slots__ = ("state", "loop", "future")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.state = _WAITING
        self.loop = loop
        self.future: asyncio.Future[None] = loop.create_future()

    def wake(self) -> bool:
        """Resolve the future on its loop; False when the loop is closed (nobody will hear it)."""
        try:
            self.loop.call_soon_threadsafe(_resolve, self.future)
        except RuntimeError:
            return False
        return True


_Waiter = _ThreadWaiter | _TaskWaiter


class Bulkhead:
    """At most *limit* calls of a service in flight in this process.

    Args:
        service (str): the breaker's name, carried by the refusals.
        limit (int): the number of slots, at least 1.
        max_wait (float): seconds a call may wait for a slot; 0: refused at once when every
            slot is taken.
        clock (Clock): measures the waits (``clock.monotonic()``).

    Raises:
        ConfigError: *limit* or *max_wait* is out of range (the message names it).

    Every :meth:`enter` / :meth:`aenter` that returns a ticket must be matched by one
    :meth:`leave` of that ticket, on every way out of the call (return, exception,
    cancellation); a second :meth:`leave` of the same ticket changes nothing.
    """

    __slots__ = ("service", "limit", "max_wait", "clock", "_lock", "_count", "_waiters")

    def __init__(self, service: str, limit: int, max_wait: float, clock: Clock) -> None:
        self.service = service
        self.limit = check_limit(limit)
        self.max_wait = check_wait(max_wait)
        self.clock = clock
        self._lock = threading.Lock()
        self._count = 0  # slots taken, counting those handed to a waiter that has not woken yet
        self._waiters: deque[_Waiter] = deque()

    def __repr__(self) -> str:
        return f"<Bulkhead {self.service!r} {self._count}/{self.limit} waiting={len(self._waiters)}>"

    def in_flight(self) -> int:
        """The number of slots taken now (0 to ``limit``)."""
        return self._count

    def waiting(self) -> int:
        """The number of calls waiting for a slot now."""
        return len(self._waiters)

    def enter(self, *, timeout: float | None = None) -> object:
        """Take a slot, waiting (blocking this thread) while every slot is taken.

        Args:
            timeout (float | None): seconds this call may wait at most; the wait is the
                smaller of it and ``max_wait`` (None: ``max_wait``).

        Returns:
            A ticket for :meth:`leave`.

        Raises:
            BulkheadFullError: no slot came free within the wait.
        """
        with self._lock:
            if self._count < self.limit:  # never true while anyone waits: see _hand_on
                self._count += 1
                return _Ticket(self)
            wait = allowed_wait(self.max_wait, timeout)
            waiter = _ThreadWaiter() if wait > 0 else None
            if waiter is not None:
                self._waiters.append(waiter)
        if waiter is None:
            raise BulkheadFullError(self.service)
        return self._wait_in_thread(waiter, wait)

    async def aenter(self, *, timeout: float | None = None) -> object:
        """Take a slot, waiting without blocking the event loop while every slot is taken.

        Args:
            timeout (float | None): seconds this call may wait at most; the wait is the
                smaller of it and ``max_wait`` (None: ``max_wait``).

        Returns:
            A ticket for :meth:`leave`.

        Raises:
            BulkheadFullError: no slot came free within the wait.
            asyncio.CancelledError: the task was cancelled while it waited; it holds no slot.
        """
        with self._lock:
            if self._count < self.limit:  # never true while anyone waits: see _hand_on
                self._count += 1
                return _Ticket(self)
            wait = allowed_wait(self.max_wait, timeout)
            waiter = _TaskWaiter(asyncio.get_running_loop()) if wait > 0 else None
            if waiter is not None:
                self._waiters.append(waiter)
        if waiter is None:
            raise BulkheadFullError(self.service)
        return await self._wait_in_task(waiter, wait)

    def leave(self, ticket: object) -> None:
        """Give the slot of *ticket* back (to the longest waiter, if any). Idempotent: a
        ticket already given back changes nothing.

        Raises:
            ConfigError: *ticket* is not one of this bulkhead's tickets.
        """
        if type(ticket) is not _Ticket or ticket.owner is not self:
            raise ConfigError(f"ticket={ticket!r}: not a ticket of the bulkhead of {self.service!r}")
        with self._lock:
            if not ticket.held:
                return
            ticket.held = False
            if not self._waiters:
                self._count -= 1
                return
        self._hand_on()

    def _hand_on(self) -> None:
        """Pass one taken slot on: to the longest waiter, or back to the free ones. Called
        without the lock. A slot is freed only when nobody waits, so the count is below the
        limit only while the queue is empty: a newcomer never takes a slot before a waiter."""
        while True:
            with self._lock:
                if not self._waiters:
                    self._count -= 1
                    return
                waiter = self._waiters.popleft()
                waiter.state = _GRANTED
            if waiter.wake():
                return
            with self._lock:  # its loop is closed: it will never run again, so the slot moves on
                waiter.state = _GONE

    def _settle(self, waiter: _Waiter, keep: bool) -> bool:
        """End a wait: True when the waiter holds a slot and *keep* is true; a slot it holds
        without *keep* (cancelled, interrupted) is passed on."""
        with self._lock:
            state = waiter.state
            waiter.state = _GONE
            if state == _WAITING:
                self._waiters.remove(waiter)
        if state != _GRANTED:
            return False
        if keep:
            return True
        self._hand_on()
        return False

    def _wait_in_thread(self, waiter: _ThreadWaiter, wait: float) -> object:
        clock = self.clock
        deadline = clock.monotonic() + wait
        try:
            while True:
                remaining = deadline - clock.monotonic()
                if remaining <= 0 or waiter.lock.acquire(timeout=min(remaining, POLL_SECONDS)):
                    break
        except BaseException:
            self._settle(waiter, keep=False)
            raise
        if self._settle(waiter, keep=True):
            return _Ticket(self)
        raise BulkheadFullError(self.service)

    async def _wait_in_task(self, waiter: _TaskWaiter, wait: float) -> object:
        clock = self.clock
        deadline = clock.monotonic() + wait
        future = waiter.future
        try:
            while not future.done():
                remaining = deadline - clock.monotonic()
                if remaining <= 0:
                    break
                await asyncio.wait((future,), timeout=min(remaining, POLL_SECONDS))
        except BaseException:  # cancelled (or closed): give back a slot it was handed meanwhile
            self._settle(waiter, keep=False)
            raise
        if self._settle(waiter, keep=True):
            return _Ticket(self)
        raise BulkheadFullError(self.service)

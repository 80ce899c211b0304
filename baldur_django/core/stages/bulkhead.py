"""The per-worker bulkhead: at most N calls of a service in flight in this process.

Threads and asyncio tasks (on any number of event loops) share one count. A call past the
limit waits for a slot, first come first served: a slot given back goes straight to the
longest waiter (no newcomer takes it first), so no waiter starves. A thread waits on a lock
of its own; a task awaits a future that the releasing thread resolves through its loop's
``call_soon_threadsafe``, so the event loop never blocks.

A call that finds a free slot and nobody waiting takes no lock at all (see the comment above
:class:`Bulkhead`); the lock guards the queue of waiters only, and is never held while the
caller's function runs.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import queue
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

from ..clock import Clock
from ..errors import BulkheadFullError, ConfigError
from .budget import count_of

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


# Why the path without the lock is sound. The free slots are tokens in a SimpleQueue, whose
# ``get_nowait`` and ``put`` are each one atomic step, so the queue alone keeps the number in
# flight at ``limit`` or below: nothing is counted, a token is either in the queue or held.
# The lock guards only the queue of waiters, and two rules make the hand-off safe:
# - A waiter joins the queue and then, under the same lock, slots are handed out (``_grant``)
#   from the front. A caller giving a slot back puts its token in the free queue first and
#   only then looks for waiters, handing out under the lock when it sees one. Whichever of
#   the two steps comes last sees the other, so a token never sits free while a waiter
#   sleeps (no lost wake-up).
# - A caller takes a token without the lock only when it sees nobody waiting. Once a waiter
#   is queued every newcomer queues behind it, and handing out always starts at the front,
#   so the token freed while someone waits goes to the longest waiter (first come, first
#   served). A newcomer that looked before the waiter queued was there first.
# A ticket is a new one-item list holding its bulkhead (the cheapest fresh object; the token
# itself cannot be the ticket, as a second give-back after the token was taken again would
# free the new holder's slot). Giving it back removes that item with one atomic
# ``list.remove``, so a second give-back, from any thread, finds it empty and does nothing.

_SLOT = True  # the token of a free slot; every slot's is the same, the ticket tells calls apart


def _refusal(bulkhead: Bulkhead, ticket: object) -> ConfigError:
    return ConfigError(f"ticket={ticket!r}: not a ticket of the bulkhead of {bulkhead.service!r}")


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

    __slots__ = ("service", "limit", "max_wait", "clock", "_lock", "_free", "_take", "_give", "_waiters", "_refused")

    def __init__(self, service: str, limit: int, max_wait: float, clock: Clock) -> None:
        self.service = service
        self.limit = check_limit(limit)
        self.max_wait = check_wait(max_wait)
        self.clock = clock
        self._lock = threading.Lock()
        self._free: queue.SimpleQueue[bool] = queue.SimpleQueue()
        for _ in range(self.limit):
            self._free.put(_SLOT)
        self._take = self._free.get_nowait
        self._give = self._free.put
        self._waiters: deque[_Waiter] = deque()
        self._refused = itertools.count()  # stepped on the refusal path only (one atomic next())

    def __repr__(self) -> str:
        return f"<Bulkhead {self.service!r} {self.in_flight()}/{self.limit} waiting={len(self._waiters)}>"

    def in_flight(self) -> int:
        """The number of slots taken now (0 to ``limit``), counting those handed to a
        waiter that has not resumed yet."""
        return self.limit - self._free.qsize()

    def waiting(self) -> int:
        """The number of calls waiting for a slot now."""
        return len(self._waiters)

    def refused(self) -> int:
        """The calls refused with :class:`BulkheadFullError` since the bulkhead was made."""
        return count_of(self._refused)

    def _full(self) -> BulkheadFullError:
        """Count one refusal and build it (the refusal path only)."""
        next(self._refused)
        return BulkheadFullError(self.service)

    def try_enter(self) -> object | None:
        """Take a free slot without waiting: a ticket for :meth:`leave`, or None when every
        slot is taken or a call is waiting for one (then :meth:`enter` queues up behind it)."""
        if self._waiters:
            return None
        try:
            self._take()
        except queue.Empty:
            return None
        return [self]

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
        if not self._waiters:
            try:
                self._take()
            except queue.Empty:
                pass
            else:
                return [self]
        wait = allowed_wait(self.max_wait, timeout)
        waiter = self._queue_up(wait, None)
        if type(waiter) is _ThreadWaiter:
            return self._wait_in_thread(waiter, wait)
        return waiter

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
        if not self._waiters:
            try:
                self._take()
            except queue.Empty:
                pass
            else:
                return [self]
        wait = allowed_wait(self.max_wait, timeout)
        waiter = self._queue_up(wait, asyncio.get_running_loop())
        if type(waiter) is _TaskWaiter:
            return await self._wait_in_task(waiter, wait)
        return waiter

    def lane_steps(self) -> tuple[Callable[[], object], Callable[[bool], None], deque[Any], Callable[[], None]]:
        """``(take, put, waiters, grant)``: the lock-free steps of :meth:`try_enter` and
        :meth:`leave` for a fast lane that inlines them. ``take()`` takes a free slot or
        raises ``queue.Empty`` (take only while ``waiters`` is empty); ``put(True)`` gives
        one back, and then ``grant()`` is due whenever ``waiters`` is not empty."""
        return self._take, self._give, self._waiters, self._grant

    def leave(self, ticket: object) -> None:
        """Give the slot of *ticket* back (to the longest waiter, if any). Idempotent: a
        ticket already given back changes nothing.

        Raises:
            ConfigError: *ticket* is not one of this bulkhead's tickets.
        """
        if type(ticket) is not list:
            raise _refusal(self, ticket)
        try:
            ticket.remove(self)
        except ValueError:
            if ticket:  # another bulkhead's ticket, or not a ticket at all
                raise _refusal(self, ticket) from None
            return  # given back already
        self._give(_SLOT)
        if self._waiters:
            self._grant()

    def _queue_up(self, wait: float, loop: asyncio.AbstractEventLoop | None) -> object:
        """Under the lock: a free slot's ticket when nobody waits, else a new waiter at the
        back of the queue (a thread's when *loop* is None, else a task's on *loop*).

        Raises:
            BulkheadFullError: every slot is taken (or promised to a waiter) and *wait* is 0.
        """
        with self._lock:
            if not self._waiters:
                try:
                    self._take()
                except queue.Empty:
                    pass
                else:
                    return [self]
            if wait <= 0:
                raise self._full()
            waiter: _Waiter = _ThreadWaiter() if loop is None else _TaskWaiter(loop)
            self._waiters.append(waiter)
            self._grant_locked()
        return waiter

    def _pass_on(self) -> None:
        """Put a held slot back among the free ones, then hand it out if anyone waits (the
        order :meth:`leave` keeps too: put first, look second)."""
        self._give(_SLOT)
        if self._waiters:
            self._grant()

    def _grant(self) -> None:
        with self._lock:
            self._grant_locked()

    def _grant_locked(self) -> None:
        """Hand free slots to the waiters, longest waiter first, while both last. Called
        with the lock held."""
        waiters = self._waiters
        while waiters:
            try:
                self._take()
            except queue.Empty:
                return
            waiter = waiters.popleft()
            waiter.state = _GRANTED
            if not waiter.wake():  # its loop is closed: it will never run again
                waiter.state = _GONE
                self._give(_SLOT)

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
        self._pass_on()
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
            return [self]
        raise self._full()

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
            return [self]
        raise self._full()

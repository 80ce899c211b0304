"""Client-side adaptive throttling, as Google's SRE book describes it.

Over the last ``window`` seconds the worker counts *requests* (every call the application
made, the refused ones included) and *accepts* (calls that succeeded). While the breaker
is CLOSED, a call is refused with probability::

    max(0, (requests - k * accepts) / (requests + 1))

so a healthy service (accepts close to requests) is never throttled, and a service that
succeeds for fewer than one call in ``k`` sheds the excess locally, before it costs the
service anything. The probability is computed from the counts before the call is counted.

Counts live in one-second buckets in a ring (the current second of the monotonic clock and
the ones before it, ``ceil(window)`` in all): O(1) per call, memory O(window). The current
second's requests and accepts are ``itertools.count`` objects, so a call is counted without
a lock (``next()`` is one atomic C call); the lock is taken once a second, to close the
current second. A request or accept counted by a thread that read the current second just
before another thread closed it may be missed: a handful at most, at a second's edge. The
random draw is made only when the probability is above 0.
"""

from __future__ import annotations

import itertools
import math
import random
import threading
from collections.abc import Callable

from ..clock import Clock
from .budget import checked_number, count_of

__all__ = ["AdaptiveThrottle", "Second", "default_rand"]

_floor = math.floor
_NEVER = -(1 << 62)  # "no second seen yet"

#: The random source of a throttle built without ``rand`` (as the service stages build
#: theirs), read when it is built: a test replaces it with a seeded one
#: (``random.Random(7).random``) to seed the throttles of decorated functions.
default_rand: Callable[[], float] = random.random


class Second:
    """The current second's counts, and the window's totals before it.

    ``requests`` and ``accepts`` are ``itertools.count`` objects: ``next()`` on one is a
    single atomic C call, so a call is counted without a lock. ``base_requests`` and
    ``base_accepts`` are the totals of the window's earlier seconds, fixed when this second
    began, so one read of the throttle's current :class:`Second` gives a consistent view.
    ``free`` is how many requests of this second pass without any chance of a refusal,
    whatever this second's accepts: ``floor(k * base_accepts - base_requests)`` (below 0
    when the earlier seconds alone already ask for the dice). A request numbered at most
    ``free`` in its second is admitted with one comparison; any later one is weighed with
    the exact counts (:meth:`AdaptiveThrottle.refuses`).

    Args:
        end (float): the monotonic second at which this one ends.
        base_requests (int): requests of the window's earlier seconds.
        base_accepts (int): accepts of the window's earlier seconds.
        k (float): the throttle's multiplier K.
    """

    __slots__ = ("end", "requests", "accepts", "base_requests", "base_accepts", "free")

    def __init__(self, end: float, base_requests: int, base_accepts: int, k: float) -> None:
        self.end = end
        self.requests = itertools.count()
        self.accepts = itertools.count()
        self.base_requests = base_requests
        self.base_accepts = base_accepts
        self.free = _floor(k * base_accepts - base_requests)


class AdaptiveThrottle:
    """Adaptive throttling of one service in this worker (threads and asyncio tasks share it).

    Args:
        service (str): the service name.
        k (float): the multiplier K, greater than 0 (2.0 is the SRE book's choice: up to
            twice as many requests as accepts pass before any is refused; below 1 even a
            healthy service is throttled).
        window (float): seconds of history, at least 1 (rounded up to whole seconds).
        clock (Clock): time source; its ``monotonic()`` seconds place the counts.
        rand (Callable[[], float] | None): uniform random numbers in [0, 1); injectable so
            a test can seed it (``random.Random(7).random``); None: :data:`default_rand`
            as it is when the throttle is built.

    Raises:
        ConfigError: *k* or *window* is not a finite number in range (the message names
            ``adaptive_throttling_k`` / ``adaptive_throttling_window``).

    Attributes:
        live (Second): the current second; replaced (never changed in place, but for its
            counters) when a second ends. A fast lane reads it lock-free:
            one read gives a consistent view, and a second that has ended
            (``now >= live.end``) is rolled by :meth:`admit` or :meth:`accepted`.
    """

    __slots__ = (
        "service", "k", "window", "_now", "_rand", "_lock", "live", "_head", "_requests", "_accepts", "_refused",
    )  # fmt: skip

    def __init__(
        self, service: str, k: float, window: float, clock: Clock, rand: Callable[[], float] | None = None
    ) -> None:
        self.service = service
        self.k = checked_number("adaptive_throttling_k", k, minimum=0.0, above=True)
        self.window = checked_number("adaptive_throttling_window", window, minimum=1.0)
        self._now = clock.monotonic
        self._rand = default_rand if rand is None else rand
        self._lock = threading.Lock()  # taken once a second, to close the current second
        seconds = math.ceil(self.window)
        self._requests = [0] * seconds  # per closed second of the window (the current one: 0)
        self._accepts = [0] * seconds
        self._head = _NEVER  # the current second
        self.live = Second(float("-inf"), 0, 0, self.k)  # ended before any call: the first one rolls
        self._refused = itertools.count()  # stepped when admit() refuses, never on an admission

    def admit(self) -> bool:
        """Count one request and decide whether it may go ahead.

        Returns:
            bool: True to let the call through; False to refuse it (the caller raises
            ``ThrottledError``). The request is counted either way.
        """
        now = self._now()
        live = self.live
        if now >= live.end:
            live = self._roll(now)
        n = next(live.requests)  # this second's requests before this one
        return n <= live.free or not self.refuses(live, n)

    def refuses(self, live: Second, n: int) -> bool:
        """Weigh a request counted already as number *n* of the second *live*, past its
        ``free`` requests: the exact counts, and the dice when there is an excess. When
        *live* has ended meanwhile, the window as of now decides (the request stays counted
        in *live*).

        Returns:
            bool: True when the request is refused (counted among the refusals), with
            probability ``max(0, (requests - k * accepts) / (requests + 1))`` over the
            requests before it.
        """
        now = self._now()
        if now >= live.end:  # weighed against the window as of now (counted where it was)
            live = self._roll(now)
            n = count_of(live.requests)
        requests = live.base_requests + n
        excess = requests - self.k * (live.base_accepts + count_of(live.accepts))
        if excess <= 0 or self._rand() >= excess / (requests + 1):
            return False
        next(self._refused)
        return True

    def refused(self) -> int:
        """The calls :meth:`admit` refused since the throttle was made."""
        return count_of(self._refused)

    def accepted(self) -> None:
        """Count one accept: a call this throttle admitted has succeeded."""
        now = self._now()
        live = self.live
        if now >= live.end:
            live = self._roll(now)
        next(live.accepts)

    def probability(self) -> float:
        """The probability the next call is refused, ``max(0, (requests - k * accepts) /
        (requests + 1))`` over the window as of now; changes nothing."""
        requests, accepts = self.counts()
        return max(0.0, (requests - self.k * accepts) / (requests + 1))

    def counts(self) -> tuple[int, int]:
        """``(requests, accepts)`` in the window as of now."""
        now = self._now()
        live = self.live
        if now >= live.end:
            live = self._roll(now)
        return (
            live.base_requests + count_of(live.requests),
            live.base_accepts + count_of(live.accepts),
        )

    def _roll(self, now: float) -> Second:
        """Close the current second and start the one of *now* (under the lock, once a
        second); the seconds that left the window leave the totals. Returns the new one."""
        with self._lock:
            live = self.live
            if now < live.end:
                return live  # another thread rolled first
            second = _floor(now)
            n = len(self._requests)
            requests = live.base_requests + count_of(live.requests)
            accepts = live.base_accepts + count_of(live.accepts)
            if self._head != _NEVER:
                i = self._head % n
                self._requests[i] = requests - live.base_requests
                self._accepts[i] = accepts - live.base_accepts
            if second - self._head >= n:
                self._requests = [0] * n
                self._accepts = [0] * n
                requests = accepts = 0
            else:
                for s in range(self._head + 1, second + 1):
                    j = s % n
                    requests -= self._requests[j]
                    accepts -= self._accepts[j]
                    self._requests[j] = self._accepts[j] = 0
            self._head = second
            self.live = live = Second(float(second + 1), requests, accepts, self.k)
            return live

    def __repr__(self) -> str:
        return f"AdaptiveThrottle({self.service!r}, k={self.k:g}, window={self.window:g})"

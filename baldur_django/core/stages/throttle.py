"""Client-side adaptive throttling, as Google's SRE book describes it.

Over the last ``window`` seconds the worker counts *requests* (every call the application
made, the refused ones included) and *accepts* (calls that succeeded). While the breaker
is CLOSED, a call is refused with probability::

    max(0, (requests - k * accepts) / (requests + 1))

so a healthy service (accepts close to requests) is never throttled, and a service that
succeeds for fewer than one call in ``k`` sheds the excess locally, before it costs the
service anything. The probability is computed from the counts before the call is counted.

Counts live in one-second buckets in a ring (the current second of the monotonic clock and
the ones before it, ``ceil(window)`` in all): O(1) per call, memory O(window). Every count
is taken under one short lock; the random draw is made outside it, and only when the
probability is above 0.
"""

from __future__ import annotations

import math
import random
import threading
from collections.abc import Callable

from ..clock import Clock
from .budget import checked_number

__all__ = ["AdaptiveThrottle", "RequestCounts"]

_floor = math.floor
_NEVER = -(1 << 62)  # "no second seen yet"


class RequestCounts:
    """Requests and accepts of the last ``seconds`` seconds, in one-second buckets.

    ``requests`` and ``accepts`` are the window's totals as of the latest :meth:`advance`.
    Plain data: the owner holds its lock around every method.

    Args:
        seconds (int): buckets in the ring, at least 1.
    """

    __slots__ = ("seconds", "requests", "accepts", "_requests", "_accepts", "_head", "_idx")

    def __init__(self, seconds: int) -> None:
        self.seconds = seconds
        self.requests = 0
        self.accepts = 0
        self._requests = [0] * seconds
        self._accepts = [0] * seconds
        self._head = _NEVER  # the newest second reached
        self._idx = 0  # its bucket

    def advance(self, now: float) -> None:
        """Move the window to monotonic time *now* (seconds), emptying the buckets of the
        seconds that left it; at most ``seconds`` steps whatever the gap."""
        second = _floor(now)
        head = self._head
        if second <= head:
            return
        n = self.seconds
        if second - head >= n:
            if self.requests or self.accepts:
                self._requests = [0] * n
                self._accepts = [0] * n
                self.requests = self.accepts = 0
        else:
            requests, accepts = self._requests, self._accepts
            for s in range(head + 1, second + 1):
                j = s % n
                self.requests -= requests[j]
                self.accepts -= accepts[j]
                requests[j] = accepts[j] = 0
        self._head = second
        self._idx = second % n

    def add_request(self) -> None:
        """Count one request in the newest second."""
        self._requests[self._idx] += 1
        self.requests += 1

    def add_accept(self) -> None:
        """Count one accept in the newest second."""
        self._accepts[self._idx] += 1
        self.accepts += 1


class AdaptiveThrottle:
    """Adaptive throttling of one service in this worker (threads and asyncio tasks share it).

    Args:
        service (str): the service name.
        k (float): the multiplier K, greater than 0 (2.0 is the SRE book's choice: up to
            twice as many requests as accepts pass before any is refused; below 1 even a
            healthy service is throttled).
        window (float): seconds of history, at least 1 (rounded up to whole seconds).
        clock (Clock): time source; its ``monotonic()`` seconds place the counts.
        rand (Callable[[], float]): uniform random numbers in [0, 1); injectable so a test
            can seed it (``random.Random(7).random``).

    Raises:
        ConfigError: *k* or *window* is not a finite number in range (the message names
            ``adaptive_throttling_k`` / ``adaptive_throttling_window``).
    """

    __slots__ = ("service", "k", "window", "_now", "_rand", "_lock", "_counts")

    def __init__(
        self, service: str, k: float, window: float, clock: Clock, rand: Callable[[], float] = random.random
    ) -> None:
        self.service = service
        self.k = checked_number("adaptive_throttling_k", k, minimum=0.0, above=True)
        self.window = checked_number("adaptive_throttling_window", window, minimum=1.0)
        self._now = clock.monotonic
        self._rand = rand
        self._lock = threading.Lock()
        self._counts = RequestCounts(math.ceil(self.window))

    def admit(self) -> bool:
        """Count one request and decide whether it may go ahead.

        Returns:
            bool: True to let the call through; False to refuse it (the caller raises
            ``ThrottledError``). The request is counted either way.
        """
        now = self._now()
        counts = self._counts
        with self._lock:
            counts.advance(now)
            requests = counts.requests
            excess = requests - self.k * counts.accepts
            counts.add_request()
        if excess <= 0:
            return True
        return self._rand() >= excess / (requests + 1)

    def accepted(self) -> None:
        """Count one accept: a call this throttle admitted has succeeded."""
        now = self._now()
        counts = self._counts
        with self._lock:
            counts.advance(now)
            counts.add_accept()

    def probability(self) -> float:
        """The probability the next call is refused, ``max(0, (requests - k * accepts) /
        (requests + 1))`` over the window as of now; changes nothing."""
        now = self._now()
        counts = self._counts
        with self._lock:
            counts.advance(now)
            requests = counts.requests
            return max(0.0, (requests - self.k * counts.accepts) / (requests + 1))

    def counts(self) -> tuple[int, int]:
        """``(requests, accepts)`` in the window as of now."""
        now = self._now()
        with self._lock:
            self._counts.advance(now)
            return self._counts.requests, self._counts.accepts

    def __repr__(self) -> str:
        return f"AdaptiveThrottle({self.service!r}, k={self.k:g}, window={self.window:g})"

"""Count-based sliding window of outcomes, plus the per-second call buckets of the cascade.

Plain data with no locking: the breaker holds its lock around every mutation.
"""

from __future__ import annotations

import itertools
from collections import deque

__all__ = ["CountWindow", "SecondBuckets"]


class CountWindow:
    """The last ``size`` recorded outcomes, as a ring of failure flags (CB-3).

    ``calls`` is how many outcomes the window holds (at most ``size``), ``failures`` how
    many of them failed. While the window holds no failure every slot is a success, so
    a success only has to grow ``calls``: the common healthy case touches no slot.
    """

    __slots__ = ("size", "calls", "failures", "_ring", "_pos")

    def __init__(self, size: int) -> None:
        self.size = size
        self.calls = 0
        self.failures = 0
        self._ring = bytearray(size)
        self._pos = 0

    def add(self, failed: bool) -> None:
        """Record one outcome (True for a failure), evicting the oldest when full."""
        if not failed and not self.failures:
            if self.calls < self.size:
                self.calls += 1
            return
        pos = self._pos
        ring = self._ring
        if self.calls == self.size:
            if ring[pos]:
                self.failures -= 1
        else:
            self.calls += 1
        if failed:
            ring[pos] = 1
            self.failures += 1
        else:
            ring[pos] = 0
        pos += 1
        self._pos = 0 if pos == self.size else pos

    def clear(self) -> None:
        """Forget every outcome (CB-7)."""
        if self.failures:
            self._ring = bytearray(self.size)
        self.calls = 0
        self.failures = 0
        self._pos = 0

    def rate_reached(self, threshold: float, minimum_calls: int) -> bool:
        """True when the window holds ``minimum_calls`` outcomes and ``failures/calls`` >= threshold %."""
        return threshold > 0 and self.calls >= minimum_calls and self.failures * 100.0 >= threshold * self.calls


def _count_of(counter: "itertools.count[int]") -> int:
    # itertools.count has no public getter; its repr is "count(N)" on every CPython 3.
    return int(repr(counter)[6:-1])


class SecondBuckets:
    """Calls and 429 sightings in per-second buckets over a time window (RL-3).

    The newest bucket counts its calls with an ``itertools.count``: ``next()`` on it is
    one atomic C call, so the breaker's healthy CLOSED path can count a call without
    taking its lock. Rolling to a new second happens under the breaker's lock; an old
    bucket keeps its counter, so an increment that races a roll still lands in the
    second it belongs to. Cost per call does not grow with traffic.
    """

    __slots__ = ("span", "bucket_end", "counter", "sightings", "_old", "_seen")

    def __init__(self, span: float) -> None:
        self.span = span
        self.bucket_end = float("-inf")  # monotonic second at which the newest bucket ends
        self.counter = itertools.count()
        self.sightings = 0
        self._old: deque[tuple[float, itertools.count[int], int]] = deque()  # (end, calls, sightings)
        self._seen: deque[float] = deque()  # exact times of the sightings (rare: a deque is cheap)

    def add(self, now: float, sighting: bool) -> None:
        """Count one call at monotonic time *now* (and a sighting when *sighting*). Caller holds the lock."""
        if now >= self.bucket_end:
            self._roll(now)
        next(self.counter)
        if sighting:
            self.sightings += 1
            self._seen.append(now)

    def _roll(self, now: float) -> None:
        self._old.append((self.bucket_end, self.counter, self.sightings))
        self.bucket_end = float(int(now) + 1)
        self.counter = itertools.count()
        self.sightings = 0
        horizon = now - self.span
        old = self._old
        while old and old[0][0] <= horizon:
            old.popleft()

    def totals(self, now: float) -> tuple[int, int]:
        """``(calls, sightings)`` in ``(now - span, now]``: sightings exactly, calls from the
        per-second buckets that overlap the window (up to one second more)."""
        horizon = now - self.span
        seen = self._seen
        while seen and seen[0] <= horizon:
            seen.popleft()
        calls = _count_of(self.counter) if self.bucket_end > horizon else 0
        for end, counter, _ in self._old:
            if end > horizon:
                calls += _count_of(counter)
        return calls, len(seen)

    def clear(self) -> None:
        self._old.clear()
        self._seen.clear()
        self.bucket_end = float("-inf")
        self.counter = itertools.count()
        self.sightings = 0

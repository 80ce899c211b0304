"""The breaker's sliding windows of outcomes, plus the per-second call buckets of the cascade.

Two windows feed the rate triggers, with one interface:

* :class:`CountWindow` holds the last ``size`` recorded outcomes;
* :class:`TimeWindow` holds the outcomes of the last ``seconds`` seconds, in per-second buckets.

Both count ``calls``, ``failures`` and ``slow`` outcomes and answer :meth:`rate_reached`
and :meth:`slow_rate_reached`. Every method takes a monotonic ``now`` where time matters
(the count window ignores it), so the breaker drives either one the same way:
``add(failed, slow, now)`` to record, ``advance(now)`` before reading the counts.

Plain data with no locking: the breaker holds its lock around every mutation.
"""

from __future__ import annotations

import itertools
import math
import sys

__all__ = ["CountWindow", "TimeWindow", "SecondBuckets"]


class CountWindow:
    """The last ``size`` recorded outcomes, as two rings of bits.

    ``calls`` is how many outcomes the window holds (at most ``size``), ``failures`` how
    many of them failed, ``slow`` how many were slow (a slow failure counts in both) and
    ``marked`` how many were failed or slow. Slot ``i`` of the ring is bit ``i`` of two
    ints, one for "failed" and one for "slow" (resilience4j keeps a ring of bits the same
    way): a window of clean successes holds two zeros, which cost no memory of their own,
    whatever its size, and a marked window of 100 holds two ints of about 40 bytes each.
    While no outcome is marked every slot is a clean success, so a clean success only has
    to grow ``calls``: the common healthy case touches no slot.

    Args:
        size (int): outcomes the window holds, at least 1.
    """

    __slots__ = ("size", "calls", "failures", "slow", "marked", "_fails", "_slows", "_pos")

    def __init__(self, size: int) -> None:
        self.size = size
        self.calls = 0
        self.failures = 0
        self.slow = 0
        self.marked = 0
        self._fails = 0  # bit i set: the outcome in slot i failed
        self._slows = 0  # bit i set: the outcome in slot i was slow
        self._pos = 0  # the slot the next outcome goes to (the oldest once the window is full)

    def add(self, failed: bool, slow: bool = False, now: float = 0.0) -> None:
        """Record one outcome, evicting the oldest when the window is full.

        Args:
            failed (bool): the call failed.
            slow (bool): the call was slow.
            now (float): ignored; accepted so both windows are driven alike.
        """
        if not (failed or slow or self.marked):
            if self.calls < self.size:
                self.calls += 1
            return
        pos = self._pos
        bit = 1 << pos
        fails = self._fails
        slows = self._slows
        if self.calls == self.size:
            # evict the oldest outcome; while the window is filling, the slot is still clean
            if fails & bit:
                fails ^= bit
                self.failures -= 1
                self.marked -= 1
                if slows & bit:
                    slows ^= bit
                    self.slow -= 1
            elif slows & bit:
                slows ^= bit
                self.slow -= 1
                self.marked -= 1
        else:
            self.calls += 1
        if failed:
            fails |= bit
            self.failures += 1
            self.marked += 1
            if slow:
                slows |= bit
                self.slow += 1
        elif slow:
            slows |= bit
            self.slow += 1
            self.marked += 1
        self._fails = fails
        self._slows = slows
        pos += 1
        self._pos = 0 if pos == self.size else pos

    def advance(self, now: float) -> None:
        """Nothing to do: a count window does not age (present so both windows read alike)."""

    def clear(self) -> None:
        """Forget every outcome."""
        self._fails = 0
        self._slows = 0
        self.calls = 0
        self.failures = 0
        self.slow = 0
        self.marked = 0
        self._pos = 0

    def rate_reached(self, threshold: float, minimum_calls: int) -> bool:
        """Whether the failure rate trips.

        Args:
            threshold (float): percent, 0-100; 0 disables the trigger.
            minimum_calls (int): outcomes the window must hold first.

        Returns:
            bool: True when the window holds at least ``minimum_calls`` outcomes and
            ``failures / calls`` is at least ``threshold`` percent.
        """
        return threshold > 0 and self.calls >= minimum_calls and self.failures * 100.0 >= threshold * self.calls

    def slow_rate_reached(self, threshold: float, minimum_calls: int) -> bool:
        """Whether the slow-call rate trips.

        Args:
            threshold (float): percent, 0-100; 0 disables the trigger.
            minimum_calls (int): outcomes the window must hold first.

        Returns:
            bool: True when the window holds at least ``minimum_calls`` outcomes and
            ``slow / calls`` is at least ``threshold`` percent.
        """
        return threshold > 0 and self.calls >= minimum_calls and self.slow * 100.0 >= threshold * self.calls


_floor = math.floor  # the second of a clock reading (a float: its C fast path)
_NEVER = -(1 << 62)  # "no second seen yet": further in the past than any window reaches


class TimeWindow:
    """The outcomes of the last ``seconds`` seconds, in per-second buckets.

    An outcome belongs to the whole second (of the monotonic clock) in which the call
    completed, and leaves the window with that second: at time ``now`` the window holds
    the seconds ``floor(now) - seconds + 1`` to ``floor(now)``. One bucket per second in
    a ring, so memory is O(``seconds``) and recording costs the same at any traffic; a
    bucket is emptied before it is reused for a new second, and a quiet spell of
    ``seconds`` or more empties the whole window. An outcome reported with a ``now`` a
    little behind the newest second (a thread that read the clock before another took
    the lock) lands in its own second's bucket, or is dropped when that second has
    already left the window.

    ``calls``, ``failures`` and ``slow`` are the totals as of the latest ``now`` passed to
    :meth:`add` or :meth:`advance`: call ``advance(now)`` before reading them.

    Args:
        seconds (int): span of the window, a whole number of seconds, at least 1.

    Raises:
        ValueError: *seconds* is not an ``int`` of at least 1 (booleans refused).
    """

    __slots__ = ("seconds", "size", "calls", "failures", "slow", "_calls", "_failures", "_slow", "_head", "_idx")

    def __init__(self, seconds: int) -> None:
        if isinstance(seconds, bool) or not isinstance(seconds, int) or seconds < 1:
            raise ValueError(f"TimeWindow seconds={seconds!r}: expected a whole number of seconds, at least 1")
        self.seconds = seconds
        self.size = seconds  # the span, in seconds (calls are not bounded by it)
        self.calls = 0
        self.failures = 0
        self.slow = 0
        self._calls = [0] * seconds
        self._failures = [0] * seconds
        self._slow = [0] * seconds
        self._head = _NEVER  # the newest second the window has reached
        self._idx = 0  # its bucket

    def add(self, failed: bool, slow: bool = False, now: float = 0.0) -> None:
        """Record one outcome completed at monotonic time *now*.

        Args:
            failed (bool): the call failed.
            slow (bool): the call was slow.
            now (float): monotonic seconds, the breaker's clock reading.
        """
        second = _floor(now)
        head = self._head
        if second == head:
            i = self._idx
        elif second > head:
            i = self._roll(second)
        elif head - second < self.seconds:
            i = second % self.seconds  # a late outcome: its second is still in the window
        else:
            return  # its second has already left the window
        self._calls[i] += 1
        self.calls += 1
        if failed:
            self._failures[i] += 1
            self.failures += 1
        if slow:
            self._slow[i] += 1
            self.slow += 1

    def advance(self, now: float) -> None:
        """Move the window to monotonic time *now*, dropping the seconds that left it.

        Costs one step per second elapsed since the last call, at most ``seconds`` steps,
        whatever the traffic. A *now* behind the newest second changes nothing.

        Args:
            now (float): monotonic seconds.
        """
        second = _floor(now)
        if second > self._head:
            self._roll(second)

    def _roll(self, second: int) -> int:
        """Make *second* (newer than the newest) the newest second; return its bucket."""
        n = self.seconds
        gap = second - self._head
        i = second % n
        if gap == 1:  # the common case: one second later, one bucket to reuse
            c = self._calls[i]
            if c:
                self.calls -= c
                self.failures -= self._failures[i]
                self.slow -= self._slow[i]
                self._calls[i] = self._failures[i] = self._slow[i] = 0
        elif gap >= n:
            if self.calls:  # a quiet spell as long as the window: nothing in it survives
                self._calls = [0] * n
                self._failures = [0] * n
                self._slow = [0] * n
                self.calls = self.failures = self.slow = 0
        else:
            calls, failures, slow = self._calls, self._failures, self._slow
            for s in range(self._head + 1, second + 1):
                j = s % n
                c = calls[j]
                if c:  # a bucket without calls holds no failure or slow outcome either
                    self.calls -= c
                    self.failures -= failures[j]
                    self.slow -= slow[j]
                    calls[j] = failures[j] = slow[j] = 0
        self._head = second
        self._idx = i
        return i

    def clear(self) -> None:
        """Forget every outcome."""
        if self.calls:
            n = self.seconds
            self._calls = [0] * n
            self._failures = [0] * n
            self._slow = [0] * n
        self.calls = self.failures = self.slow = 0

    def rate_reached(self, threshold: float, minimum_calls: int) -> bool:
        """Whether the failure rate over the window trips.

        Reads the totals as of the latest ``now`` (see :meth:`advance`).

        Args:
            threshold (float): percent, 0-100; 0 disables the trigger.
            minimum_calls (int): outcomes the window's seconds must hold first.

        Returns:
            bool: True when the window holds at least ``minimum_calls`` outcomes and
            ``failures / calls`` is at least ``threshold`` percent.
        """
        return threshold > 0 and self.calls >= minimum_calls and self.failures * 100.0 >= threshold * self.calls

    def slow_rate_reached(self, threshold: float, minimum_calls: int) -> bool:
        """Whether the slow-call rate over the window trips.

        Args:
            threshold (float): percent, 0-100; 0 disables the trigger.
            minimum_calls (int): outcomes the window's seconds must hold first.

        Returns:
            bool: True when the window holds at least ``minimum_calls`` outcomes and
            ``slow / calls`` is at least ``threshold`` percent.
        """
        return threshold > 0 and self.calls >= minimum_calls and self.slow * 100.0 >= threshold * self.calls


def _count_of(counter: itertools.count[int]) -> int:
    # itertools.count has no public getter; its repr is "count(N)" on every CPython 3.
    return int(repr(counter)[6:-1])


_NO_BUCKET = float("-inf")  # bucket_end after a clear, until the next roll
# bucket_end of a window that has never rolled: before any negative monotonic time, like
# _NO_BUCKET, but told apart from it because nothing can have stepped its placeholder
# counter (the lock-free healthy lane opens only after a locked call has rolled)
_NEVER_ROLLED = -sys.float_info.max
_Bucket = tuple[float, "itertools.count[int]", int]  # (end, calls, sightings) of a past second


class SecondBuckets:
    """Calls and 429 sightings in per-second buckets over a time window.

    The newest bucket counts its calls with an ``itertools.count``: ``next()`` on it is
    one atomic C call, so the breaker's healthy CLOSED path can count a call without
    taking its lock. Rolling to a new second happens under the breaker's lock; an old
    bucket keeps its counter, so an increment that races a roll still lands in the
    second it belongs to. Cost per call does not grow with traffic.

    :meth:`total` is every call ever counted, for the metrics: a bucket that leaves
    the window, or is cleared, adds its count to ``retired``. A cleared bucket is read
    only at a roll at least a second later, so an increment racing the clear still counts.
    """

    __slots__ = ("span", "bucket_end", "counter", "sightings", "retired", "_old", "_seen", "_gone")

    def __init__(self, span: float) -> None:
        self.span = span
        self.bucket_end = _NEVER_ROLLED  # monotonic second at which the newest bucket ends
        self.counter = itertools.count()
        self.sightings = 0
        self.retired = 0  # calls of the buckets that left the window or were cleared
        # Plain lists, oldest first, made on first use: until then each is the shared empty
        # tuple. An empty deque is about 760 bytes (its first 64-slot block) and an empty
        # list 56; a breaker at rest needs neither. Each holds at most a window of seconds.
        self._old: list[_Bucket] | tuple[()] = ()  # (end, calls, sightings)
        self._seen: list[float] | tuple[()] = ()  # exact times of the sightings (rare)
        self._gone: list[tuple[float, itertools.count[int]]] | tuple[()] = ()  # cleared, not yet retired

    def add(self, now: float, sighting: bool) -> None:
        """Count one call at monotonic time *now* (and a sighting when *sighting*). Caller holds the lock."""
        if now >= self.bucket_end:
            self._roll(now)
        next(self.counter)
        if sighting:
            self.sightings += 1
            if isinstance(self._seen, list):
                self._seen.append(now)
            else:
                self._seen = [now]

    def _roll(self, now: float) -> None:
        old = self._old
        end = self.bucket_end
        if end != _NEVER_ROLLED and (end != _NO_BUCKET or _count_of(self.counter)):
            # (the placeholder after a clear is kept only if a healthy-lane step raced the
            # clear into it: its count must reach total())
            bucket = (self.bucket_end, self.counter, self.sightings)
            if isinstance(old, list):
                old.append(bucket)
            else:
                self._old = old = [bucket]
        self.bucket_end = float(int(now) + 1)
        self.counter = itertools.count()
        self.sightings = 0
        horizon = now - self.span
        gone = 0
        for end, counter, _ in old:
            if end > horizon:
                break
            self.retired += _count_of(counter)
            gone += 1
        if gone and isinstance(old, list):
            del old[:gone]
        if self._gone:
            self._retire(now)

    def _retire(self, now: float) -> None:
        """Fold the cleared buckets whose second ended a second or more before *now* into
        ``retired`` (a healthy-lane increment racing the clear has landed by then)."""
        keep = []
        for end, counter in self._gone:
            if end + 1.0 <= now:
                self.retired += _count_of(counter)
            else:
                keep.append((end, counter))
        self._gone = keep

    def totals(self, now: float) -> tuple[int, int]:
        """``(calls, sightings)`` in ``(now - span, now]``: sightings exactly, calls from the
        per-second buckets that overlap the window (up to one second more)."""
        horizon = now - self.span
        seen = self._seen
        if isinstance(seen, list) and seen and seen[0] <= horizon:
            gone = 1
            while gone < len(seen) and seen[gone] <= horizon:
                gone += 1
            del seen[:gone]
        calls = _count_of(self.counter) if self.bucket_end > horizon else 0
        for end, counter, _ in self._old:
            if end > horizon:
                calls += _count_of(counter)
        return calls, len(seen)

    def total(self) -> int:
        """Every call counted since this object was made, cleared buckets included.
        Caller holds the lock; only grows."""
        calls = self.retired + _count_of(self.counter)
        for _, counter, _ in self._old:
            calls += _count_of(counter)
        for _, counter in self._gone:
            calls += _count_of(counter)
        return calls

    def clear(self) -> None:
        """Forget the window (a trip, a reset); the calls stay in :meth:`total`."""
        end = self.bucket_end
        gone = self._gone if isinstance(self._gone, list) else []
        gone.append((end, self.counter))
        gone.extend((end, counter) for _, counter, _ in self._old)
        self._gone = gone
        self._old = ()
        self._seen = ()
        self.bucket_end = float("-inf")
        self.counter = itertools.count()
        self.sightings = 0

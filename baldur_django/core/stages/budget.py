"""The retry budget of one worker: retries allowed as a share of the calls, plus a floor.

Over the last :data:`WINDOW_SECONDS` seconds (the current second of the monotonic clock and
the nine before it) a service's retries stay within ``ratio * calls + min_per_second * 10``.
A call is counted by :meth:`RetryBudget.note_call` when its first attempt begins; each retry
the retry stage wants is asked for with :meth:`RetryBudget.try_retry`, which spends one or
answers False when the budget is spent. A call that is not retried because of that is the
retry stage's business; the budget only keeps the ``exhausted`` count (read when metrics
are collected, nothing is called per refusal) and logs ``circuit_breaker.retry_budget_exhausted``
at most once per window per service.

Counting is O(1) per call whatever the traffic: one-second buckets in a ring. The current
second's calls are counted by an ``itertools.count`` (``next()`` is one atomic C call), so
:meth:`RetryBudget.note_call` takes no lock except once a second, when the ring rolls; a
retry is decided and spent under a short lock, so two threads never both spend the last
retry. A call counted by a thread that read the clock just before another rolled the ring
may be missed: the budget then allows slightly fewer retries, never more.

The building blocks (:class:`CallCounts`, :class:`Exhaustion`, :func:`checked_number`) are
shared with the fleet-wide budget (:mod:`.fleet_budget`).
"""

from __future__ import annotations

import itertools
import logging
import math
import threading
from typing import Any

from ..clock import Clock
from ..errors import ConfigError
from ..log import log_event

__all__ = [
    "WINDOW_SECONDS",
    "EXHAUSTED_EVENT",
    "RetryBudget",
    "CallCounts",
    "Exhaustion",
    "checked_number",
    "count_of",
    "room",
]

#: Span of the budget's window, seconds (a whole number: one bucket per second).
WINDOW_SECONDS = 10
#: The log line written when a retry is refused (at most once per window per service).
EXHAUSTED_EVENT = "circuit_breaker.retry_budget_exhausted"

_floor = math.floor
_NEVER = -(1 << 62)  # "no second seen yet": further back than any window reaches
_SLACK = 1e-9  # 0.29 * 100 is 28.999999999999996: the exact boundary is inside the budget


def checked_number(knob: str, value: Any, *, minimum: float, above: bool = False) -> float:
    """*value* as a float, or a :class:`ConfigError` naming *knob* and the value.

    Args:
        knob (str): the knob's name as the user wrote it (``retry_budget_ratio``).
        value (Any): the value given; an ``int`` or ``float``, not a ``bool``, finite.
        minimum (float): the smallest value allowed.
        above (bool): the value must be greater than *minimum*, not equal to it.

    Returns:
        float: the value.

    Raises:
        ConfigError: not a finite number, or below (at) *minimum*.
    """
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ConfigError(f"{knob}={value!r}: expected a finite number")
    if value < minimum or (above and value == minimum):
        bound = f"greater than {minimum:g}" if above else f"at least {minimum:g}"
        raise ConfigError(f"{knob}={value!r}: expected a number {bound}")
    return float(value)


def room(ratio: float, floor: float, calls: int, retries: int) -> float:
    """Retries a window of *calls* calls and *retries* retries still allows: ``ratio * calls
    + floor - retries``, a hair more so that the exact boundary counts as inside (``0.29 * 100``
    is ``28.999999999999996``). One more retry fits when it is at least 1."""
    return ratio * calls + floor - retries + _SLACK


def count_of(counter: itertools.count[int]) -> int:
    """What an ``itertools.count`` started at 0 has counted (it has no getter; its repr is
    ``count(N)`` on every CPython 3)."""
    return int(repr(counter)[6:-1])


class CallCounts:
    """Calls and retries of the last :data:`WINDOW_SECONDS` seconds, in one-second buckets.

    :meth:`note_call` takes *lock* only when the second changes; every other method expects
    the caller to hold *lock*. ``spent`` is the retries in the window as of the latest
    :meth:`advance`; :meth:`window_calls` the calls. ``total_retries`` and
    :meth:`total_calls` count since the object was made (what a fleet budget sends).

    Args:
        lock (threading.Lock): the owner's lock.
    """

    __slots__ = ("lock", "live", "head", "idx", "calls", "retries", "closed", "spent", "total_closed", "total_retries")

    def __init__(self, lock: threading.Lock) -> None:
        self.lock = lock
        #: (monotonic second at which the current bucket ends, its call counter); read as one
        #: tuple so a call never pairs one second's end with another's counter
        self.live: tuple[float, itertools.count[int]] = (float("-inf"), itertools.count())
        self.head = _NEVER  # the newest second reached
        self.idx = 0  # its bucket
        self.calls = [0] * WINDOW_SECONDS  # calls of the closed seconds (the current one: 0)
        self.retries = [0] * WINDOW_SECONDS
        self.closed = 0  # calls of the closed seconds in the window
        self.spent = 0  # retries in the window
        self.total_closed = 0  # calls of every second closed so far
        self.total_retries = 0

    def note_call(self, now: float) -> None:
        """Count one call at monotonic time *now* (seconds). Takes the lock only to roll."""
        end, counter = self.live
        if now < end:
            next(counter)
            return
        with self.lock:
            self.advance(now)
            next(self.live[1])

    def advance(self, now: float) -> None:
        """Move the window to monotonic time *now* (seconds): close the current second and
        empty the buckets of the seconds that left. Caller holds the lock."""
        second = _floor(now)
        head = self.head
        if second <= head:
            return
        counted = count_of(self.live[1])
        self.calls[self.idx] = counted
        self.closed += counted
        self.total_closed += counted
        if second - head >= WINDOW_SECONDS:
            self.calls = [0] * WINDOW_SECONDS
            self.retries = [0] * WINDOW_SECONDS
            self.closed = self.spent = 0
        else:
            calls, retries = self.calls, self.retries
            for s in range(head + 1, second + 1):
                j = s % WINDOW_SECONDS
                self.closed -= calls[j]
                self.spent -= retries[j]
                calls[j] = retries[j] = 0
        self.head = second
        self.idx = second % WINDOW_SECONDS
        self.live = (float(second + 1), itertools.count())

    def window_calls(self) -> int:
        """Calls in the window as of the latest :meth:`advance`. Caller holds the lock."""
        return self.closed + count_of(self.live[1])

    def total_calls(self) -> int:
        """Calls counted since the object was made. Caller holds the lock."""
        return self.total_closed + count_of(self.live[1])

    def add_retry(self) -> None:
        """Count one retry in the newest second. Caller holds the lock."""
        self.retries[self.idx] += 1
        self.spent += 1
        self.total_retries += 1


class Exhaustion:
    """How often a service's budget refused a retry, and its rate-limited log line.

    ``count`` only grows (read it when metrics are collected). :meth:`note` is called under
    the owner's lock; :meth:`log` outside it.

    Args:
        service (str): the service name.
    """

    __slots__ = ("service", "count", "_logged_at")

    def __init__(self, service: str) -> None:
        self.service = service
        self.count = 0
        self._logged_at = float("-inf")

    def note(self, now: float) -> bool:
        """Count one refusal at monotonic time *now* (seconds).

        Returns:
            bool: True when the log line is due (none in the last :data:`WINDOW_SECONDS`).
        """
        self.count += 1
        if now - self._logged_at < WINDOW_SECONDS:
            return False
        self._logged_at = now
        return True

    def log(self, scope: str, ratio: float, min_per_second: float, calls: int, retries: int) -> None:
        """Write the ``circuit_breaker.retry_budget_exhausted`` line (WARNING)."""
        log_event(
            logging.WARNING,
            EXHAUSTED_EVENT,
            self.service,
            "scope=%s ratio=%g min_per_second=%g calls=%d retries=%d",
            scope,
            ratio,
            min_per_second,
            calls,
            retries,
            scope=scope,
            calls=calls,
            retries=retries,
        )


class RetryBudget:
    """The retry budget of one service in this worker (threads and asyncio tasks share it).

    Over the last 10 s, retries stay within ``ratio * calls + min_per_second * 10``.

    Args:
        service (str): the service name (log lines).
        ratio (float): retries allowed per call, at least 0 (``0.2``: one retry per five calls).
        min_per_second (float): retries allowed per second whatever the traffic, at least 0.
        clock (Clock): time source; its ``monotonic()`` seconds place calls and retries.

    Raises:
        ConfigError: *ratio* or *min_per_second* is not a finite number of at least 0 (the
            message names ``retry_budget_ratio`` / ``retry_budget_min_per_second``).

    Attributes:
        counts (CallCounts): the calls and retries of the window. A fast lane counts a call
            lock-free as :meth:`note_call` does: ``end, counter = counts.live``, then
            ``next(counter)`` while its clock reads before ``end``, else ``note_call()``.
    """

    scope = "worker"
    __slots__ = ("service", "ratio", "min_per_second", "floor", "_now", "_lock", "counts", "_exhaustion")

    def __init__(self, service: str, ratio: float, min_per_second: float, clock: Clock) -> None:
        self.service = service
        self.ratio = checked_number("retry_budget_ratio", ratio, minimum=0.0)
        self.min_per_second = checked_number("retry_budget_min_per_second", min_per_second, minimum=0.0)
        self.floor = self.min_per_second * WINDOW_SECONDS  # retries of the window beyond the share
        self._now = clock.monotonic
        self._lock = threading.Lock()
        self.counts = CallCounts(self._lock)
        self._exhaustion = Exhaustion(service)

    @property
    def exhausted(self) -> int:
        """Retries refused since the budget was made (only grows)."""
        return self._exhaustion.count

    def note_call(self) -> None:
        """Count one call of the service (its first attempt is beginning)."""
        self.counts.note_call(self._now())

    def try_retry(self) -> bool:
        """Spend one retry if the budget has one.

        Returns:
            bool: True when a retry was spent (the caller may retry); False when the
            budget is exhausted (``exhausted`` grew, and the log line was written unless
            it was in the last 10 s).
        """
        now = self._now()
        counts = self.counts
        with self._lock:
            counts.advance(now)
            calls = counts.window_calls()
            if room(self.ratio, self.floor, calls, counts.spent) >= 1:
                counts.add_retry()
                return True
            due = self._exhaustion.note(now)
            spent = counts.spent
        if due:
            self._exhaustion.log(self.scope, self.ratio, self.min_per_second, calls, spent)
        return False

    def left(self) -> float:
        """Retries the budget allows now (0.0 when exhausted); spends nothing."""
        now = self._now()
        counts = self.counts
        with self._lock:
            counts.advance(now)
            return max(0.0, self.ratio * counts.window_calls() + self.floor - counts.spent)

    def __repr__(self) -> str:
        return f"RetryBudget({self.service!r}, ratio={self.ratio:g}, min_per_second={self.min_per_second:g})"

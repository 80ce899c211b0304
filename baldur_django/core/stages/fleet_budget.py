"""The retry budget of one service across every process sharing a Redis server.

The budget is the per-worker one's (:mod:`.budget`): over the last 10 s, retries stay within
``ratio * calls + min_per_second * 10``, but with the calls and retries of the whole fleet.
No call goes to Redis. Each process counts its own calls and retries in memory, and a
background thread sends them in batches: at most every :data:`FLUSH_SECONDS` seconds, one
script adds what this process counted since its last flush to the service's per-second
fleet counts (a hash whose fields are ``c<second>`` and ``r<second>``, seconds of Redis
``TIME``, fields older than the window dropped, the key expiring after two windows of
silence) and answers the fleet's totals over the window. Until the next answer the process
decides from those totals plus its own counts since.

The flushes keep a beat: every process flushes at the same moments, the multiples of
:data:`FLUSH_SECONDS` of the wall clock, and reads the totals again :data:`SETTLE_SECONDS`
later, once the other processes' flushes of that beat have landed (the read sends
nothing). So the totals a process decides by hold every process's counts up to the last
beat, and what it has not seen is what the others made since: the fleet's retries stay
within the budget plus the others' retries of one flush interval (and the settle time).
Without the beat a process could also miss what the others made before their last
flush, while it read: two intervals' worth.

Before its first answer, when the last answer is older than :data:`STALE_SECONDS` (the
flusher was held up, or the process was idle), and while Redis does not answer, a process
decides from its own counts alone, as a per-worker budget would; it logs
``circuit_breaker.retry_budget_store_unavailable`` once when Redis stops answering and
``circuit_breaker.retry_budget_store_recovered`` once when it answers again.

One flusher thread per process serves every fleet budget; it starts with the first call
and stops when no budget is left. A forked child (gunicorn ``--preload``, Celery prefork)
starts from empty counts (its parent's are its parent's to send) and starts its own
flusher at its first call.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

from ..clock import Clock
from ..log import log_event
from ..stores.base import safe_key
from ..stores.redis import store_errors
from .budget import WINDOW_SECONDS, CallCounts, Exhaustion, checked_number, room

__all__ = ["FleetRetryBudget", "FLUSH_SECONDS", "SETTLE_SECONDS", "STALE_SECONDS", "flush_all", "refresh_all"]

#: Seconds between two flushes of one process (its counts reach the fleet this often); the
#: flushes fall on the multiples of it of the wall clock.
FLUSH_SECONDS = 0.5
#: Seconds after a beat's flush at which a process reads the fleet's totals again.
SETTLE_SECONDS = 0.1
#: Fleet totals older than this (seconds) are not trusted: the process decides alone.
STALE_SECONDS = 4 * FLUSH_SECONDS

_log = logging.getLogger("baldur.circuit_breaker")

#: KEYS[1] the service's hash; ARGV: calls and retries to add, the window (seconds), the
#: time to use instead of Redis TIME ("" in production). Answers {calls, retries} in the
#: window. Fields: "c<second>" and "r<second>"; those that left the window are dropped.
_SCRIPT = """
local now
if ARGV[4] ~= '' then
  now = math.floor(tonumber(ARGV[4]))
else
  now = tonumber(redis.call('TIME')[1])
end
local window = tonumber(ARGV[3])
local add_calls, add_retries = tonumber(ARGV[1]), tonumber(ARGV[2])
if add_calls > 0 then redis.call('HINCRBY', KEYS[1], 'c' .. now, add_calls) end
if add_retries > 0 then redis.call('HINCRBY', KEYS[1], 'r' .. now, add_retries) end
local fields = redis.call('HGETALL', KEYS[1])
local calls, retries = 0, 0
for i = 1, #fields, 2 do
  local second = tonumber(string.sub(fields[i], 2))
  if second == nil or second <= now - window then
    redis.call('HDEL', KEYS[1], fields[i])
  elseif string.sub(fields[i], 1, 1) == 'c' then
    calls = calls + tonumber(fields[i + 1])
  else
    retries = retries + tonumber(fields[i + 1])
  end
end
if #fields > 0 then redis.call('EXPIRE', KEYS[1], 2 * window) end
return {calls, retries}
"""


class FleetRetryBudget:
    """The retry budget of one service summed over every process sharing a Redis server.

    The methods of the per-worker budget, with no Redis command on any of them; the
    flusher thread (or :meth:`flush`) does the one round trip per flush.

    Args:
        service (str): the service name.
        ratio (float): retries allowed per call of the fleet, at least 0.
        min_per_second (float): retries allowed per second to the whole fleet, at least 0.
        clock (Clock): time source; its ``monotonic()`` seconds place this process's counts
            and age the fleet's totals (the fleet's seconds are Redis ``TIME``'s).
        client (Any): a redis-py client (``stores.redis.connect(url)``, a cluster client, or
            ``django_redis.get_redis_connection``); no command is sent until the first flush.
        prefix (str): key prefix; the service's key is ``<prefix>:retry_budget:{<name>}``.
        background (bool): flush from the process's flusher thread (False: only when
            :meth:`flush` is called, for tests and for callers with a loop of their own).
        store_clock (Callable[[], float] | None): tests only: Unix seconds the script uses
            instead of Redis ``TIME``. Leave it None.

    Raises:
        ConfigError: *ratio* or *min_per_second* is not a finite number of at least 0.

    Attributes:
        counts (CallCounts): this process's calls and retries, read and stepped as
            :class:`~.budget.RetryBudget`'s are.
    """

    scope = "fleet"

    def __init__(
        self,
        service: str,
        ratio: float,
        min_per_second: float,
        clock: Clock,
        client: Any,
        *,
        prefix: str = "baldur",
        background: bool = True,
        store_clock: Callable[[], float] | None = None,
    ) -> None:
        self.service = service
        self.ratio = checked_number("retry_budget_ratio", ratio, minimum=0.0)
        self.min_per_second = checked_number("retry_budget_min_per_second", min_per_second, minimum=0.0)
        self.floor = self.min_per_second * WINDOW_SECONDS
        self.key = f"{prefix}:retry_budget:{{{safe_key(service)}}}"
        self.background = background
        self._now = clock.monotonic
        self._script = client.register_script(_SCRIPT)  # sends nothing yet
        self._store_clock = store_clock
        self._exhaustion = Exhaustion(service)
        self._down = False  # the last flush failed (flusher only)
        self._start()
        _EVERY.add(self)

    def _start(self) -> None:
        """Empty counts and fresh locks (at creation, and in a forked child)."""
        self._lock = threading.Lock()
        self._flush_lock = threading.Lock()  # one flush at a time
        self.counts = CallCounts(self._lock)
        #: (fleet calls, fleet retries, monotonic time read) of the last answer, or None
        self._fleet: tuple[int, int, float] | None = None
        self._sent = (0, 0)  # this process's (calls, retries) totals the fleet has had
        self._busy_at = float("-inf")  # the last flush that had counts to send
        self._joined = False  # known to this process's flusher

    @property
    def exhausted(self) -> int:
        """Retries this process was refused since the budget was made (only grows)."""
        return self._exhaustion.count

    def note_call(self) -> None:
        """Count one call of the service (its first attempt is beginning). No I/O."""
        counts = self.counts
        end, counter = counts.live
        now = self._now()
        if now < end:
            next(counter)
            return
        counts.note_call(now)  # a new second: once a second at most
        if not self._joined:
            self._join()

    def try_retry(self) -> bool:
        """Spend one retry if the fleet's budget, as this process knows it, has one. No I/O.

        Returns:
            bool: True when a retry was spent; False when the budget is exhausted
            (``exhausted`` grew; the log line is written at most once per 10 s).
        """
        if not self._joined:
            self._join()
        now = self._now()
        counts = self.counts
        with self._lock:
            counts.advance(now)
            calls, retries = self._view(now)
            if room(self.ratio, self.floor, calls, retries) >= 1:
                counts.add_retry()
                return True
            due = self._exhaustion.note(now)
        if due:
            self._exhaustion.log(self.scope, self.ratio, self.min_per_second, calls, retries)
        return False

    def left(self) -> float:
        """Retries the fleet's budget allows now, as this process knows it; spends nothing."""
        now = self._now()
        with self._lock:
            self.counts.advance(now)
            calls, retries = self._view(now)
        return max(0.0, self.ratio * calls + self.floor - retries)

    def using_fleet(self) -> bool:
        """Whether decisions use the fleet's totals now (False: this process's counts alone)."""
        now = self._now()
        with self._lock:
            return self._fresh(now)

    def _fresh(self, now: float) -> bool:
        fleet = self._fleet
        return fleet is not None and now - fleet[2] < STALE_SECONDS

    def _view(self, now: float) -> tuple[int, int]:
        """(calls, retries) to judge by. Caller holds the lock."""
        counts = self.counts
        fleet = self._fleet
        if fleet is None or not self._fresh(now):
            return counts.window_calls(), counts.spent
        sent_calls, sent_retries = self._sent
        return fleet[0] + counts.total_calls() - sent_calls, fleet[1] + counts.total_retries - sent_retries

    def _join(self) -> None:
        self._joined = True
        if self.background:
            _FLUSHER.join(self)

    def flush(self) -> bool:
        """Send this process's counts since the last flush and read the fleet's totals back:
        one Redis round trip (does I/O; never raises for store trouble).

        Returns:
            bool: True when Redis answered; False when it did not (the counts are dropped,
            and decisions use this process's counts until a flush succeeds).
        """
        with self._flush_lock:
            with self._lock:
                calls, retries = self.counts.total_calls(), self.counts.total_retries
                sent_calls, sent_retries = self._sent
            try:
                totals = self._ask(calls - sent_calls, retries - sent_retries)
            except store_errors() as exc:
                with self._lock:
                    self._sent = (calls, retries)
                    self._fleet = None
                self._store_trouble(exc)
                return False
            read_at = self._now()
            with self._lock:
                self._sent = (calls, retries)
                self._fleet = (totals[0], totals[1], read_at)
            self._store_trouble(None)
            return True

    def _ask(self, calls: int, retries: int) -> tuple[int, int]:
        """One round trip: add *calls* and *retries* to the fleet's counts of this second and
        answer the fleet's (calls, retries) over the window. Raises the store's errors."""
        pinned = "" if self._store_clock is None else repr(float(self._store_clock()))
        answer = self._script(keys=[self.key], args=[calls, retries, WINDOW_SECONDS, pinned])
        return int(answer[0]), int(answer[1])

    def refresh(self) -> bool:
        """Read the fleet's totals again without sending anything: one Redis round trip
        (does I/O; never raises for store trouble). This process's counts since its last
        flush stay its own until the next one.

        Returns:
            bool: True when Redis answered (False changes nothing).
        """
        with self._flush_lock:
            try:
                totals = self._ask(0, 0)
            except store_errors():
                return False  # the next flush logs the outage
            read_at = self._now()
            with self._lock:
                self._fleet = (totals[0], totals[1], read_at)
            return True

    def flush_if_due(self) -> bool:
        """Flush when there are counts to send, or there were some in the last 10 s (the
        fleet's totals are still wanted); a budget idle longer costs Redis nothing.

        Returns:
            bool: whether a flush was made (I/O).
        """
        now = self._now()
        with self._lock:
            pending = (self.counts.total_calls(), self.counts.total_retries) != self._sent
        if pending:
            self._busy_at = now
        elif now - self._busy_at >= WINDOW_SECONDS:
            return False
        self.flush()
        return True

    def _store_trouble(self, exc: BaseException | None) -> None:
        """Log the first failed flush of an outage, and the first success after one."""
        if exc is not None and not self._down:
            self._down = True
            log_event(
                logging.WARNING,
                "circuit_breaker.retry_budget_store_unavailable",
                self.service,
                "error=%s counting=worker",
                f"{type(exc).__name__}: {exc}",
            )
        elif exc is None and self._down:
            self._down = False
            log_event(logging.INFO, "circuit_breaker.retry_budget_store_recovered", self.service, "counting=fleet")

    def after_fork(self) -> None:
        """In a forked child: start from empty counts with fresh locks (the parent's counts
        are sent by the parent); the child's flusher starts at its first call."""
        self._start()

    def __repr__(self) -> str:
        return f"FleetRetryBudget({self.service!r}, ratio={self.ratio:g}, min_per_second={self.min_per_second:g})"


class _Flusher:
    """The process's flusher thread: :meth:`flush_if_due` on every fleet budget in use when
    it starts, then on every beat (see the module's text), each followed by a read of the
    totals of the budgets it flushed. Started by the first budget that joins; ends when
    none is left (budgets are held weakly)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.budgets: weakref.WeakSet[FleetRetryBudget] = weakref.WeakSet()
        self.thread: threading.Thread | None = None

    def join(self, budget: FleetRetryBudget) -> None:
        with self.lock:
            self.budgets.add(budget)
            if self.thread is None:
                self.thread = threading.Thread(target=self._run, name="baldur-retry-budget", daemon=True)
                self.thread.start()

    def _run(self) -> None:
        flush_all(self.budgets)  # a process joining the fleet learns its totals at once
        while True:
            time.sleep(FLUSH_SECONDS - time.time() % FLUSH_SECONDS)  # to the next beat
            with self.lock:
                if not self.budgets:
                    self.thread = None
                    return
            flushed = flush_all(self.budgets)
            time.sleep(SETTLE_SECONDS)
            refresh_all(flushed)

    def after_fork_in_child(self) -> None:
        self.lock = threading.Lock()
        self.thread = None  # the parent's thread is not in the child
        self.budgets = weakref.WeakSet()
        for budget in list(_EVERY):
            try:
                budget.after_fork()
            except Exception:  # pragma: no cover - never fail a fork
                _log.exception("circuit_breaker.retry_budget_fork_failed service=%s", budget.service)


def flush_all(budgets: weakref.WeakSet[FleetRetryBudget]) -> list[FleetRetryBudget]:
    """:meth:`FleetRetryBudget.flush_if_due` on each of *budgets*; an error in one is logged
    and the others still flush. Returns the budgets that flushed."""
    flushed = []
    for budget in list(budgets):
        try:
            if budget.flush_if_due():
                flushed.append(budget)
        except Exception:
            _log.exception("circuit_breaker.retry_budget_flush_failed service=%s", budget.service)
    return flushed


def refresh_all(budgets: list[FleetRetryBudget]) -> None:
    """:meth:`FleetRetryBudget.refresh` on each of *budgets*; an error in one is logged and
    the others still read."""
    for budget in budgets:
        try:
            budget.refresh()
        except Exception:
            _log.exception("circuit_breaker.retry_budget_flush_failed service=%s", budget.service)


_EVERY: weakref.WeakSet[FleetRetryBudget] = weakref.WeakSet()  # every fleet budget of the process
_FLUSHER = _Flusher()
if hasattr(os, "register_at_fork"):  # POSIX
    os.register_at_fork(after_in_child=_FLUSHER.after_fork_in_child)

"""The breaker's state and its transitions: the part every other part of a breaker works on.

A :class:`Machine` holds all of one breaker's mutable state in slots and the primitives that
change it under its one short ``threading.Lock``: entering a state in a new generation,
opening with a backed-off duration, closing, lapsing a force, the recovery timeout, and the
event outbox that delivers what was decided after the lock is released, once per
transition. A :class:`~baldur_django.core.breaker.CircuitBreaker` builds one (as its
:class:`~baldur_django.core.calls.BreakerCore`) and hands it to its other parts: the
admission and recording of calls (``calls.py``), the store seam (``shared.py``), the
hot-path wrappers (``wrappers.py``), metrics reading (``readings.py``) and operator control
(``control.py``).

The lock-free fast paths read five fields (``fast_permit``, ``healthy_permit``,
``quiet_permit``, ``reject_until``, ``sync_due``) plus the cascade counter. The rule that
keeps them sound: every path that records a failure or changes state calls
:meth:`Machine.invalidate` first, which clears the hot-path permits before anything else is
touched.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Collection, MutableSequence
from typing import Any

from . import rules
from .clock import Clock
from .config import BreakerConfig
from .configs import shared_config
from .emergency import frozen
from .events import Event, EventBus, ForceLapsed, StateChanged
from .names import check_name
from .nesting import RECORDED
from .permit import Permit
from .rules import next_open
from .states import CircuitState, Reason, Trigger, check_transition
from .sync import LOCAL, LocalSync, StoreGuard, StoreSync
from .window import CountWindow, SecondBuckets, TimeWindow

__all__ = ["Machine", "STATES"]

CLOSED = CircuitState.CLOSED
OPEN = CircuitState.OPEN
HALF_OPEN = CircuitState.HALF_OPEN

#: A shared record's state name -> the state.
STATES = {"closed": CLOSED, "open": OPEN, "half_open": HALF_OPEN}

#: Taken only to make a breaker's delivery lock on its first delivery (:meth:`Machine.publish`).
_DRAIN_MADE = threading.Lock()


class Machine:
    """One breaker's mutable state and the transitions that change it (state lock held
    unless a method says otherwise).

    The fields the lock-free paths read, each re-derived under the lock:

    * ``fast_permit``: the CLOSED permit while admission needs no lock and no clock (CLOSED
      and unforced), else None. Read once by the hot path, so a trip racing with it can
      only hand out a permit whose generation is already stale.
    * ``healthy_permit``: the CLOSED permit while a success would change nothing but the
      cascade count (window full, no failure in it), else None; cleared by
      :meth:`invalidate` before any failure is recorded or the state changes, so the
      lock-free healthy path linearises at its single read of this field.
    * ``quiet_permit``: the CLOSED permit while it is both of the above; the wrappers admit
      with it, and a call admitted with it runs unmarked (see ``nesting.py``).
    * ``timing_permit``: while the slow-call trigger is on, every admitted call carries its
      own permit stamped with the admission time; this is the CLOSED permit to copy it from.
    * ``reject_until``: monotonic deadline before which OPEN (or forced open) rejects
      without the lock; 0.0 whenever anything else holds.
    * ``sync_due``: monotonic time at which a shared breaker must consult its store again
      (``inf`` for a process-local one); ``timed`` is True while that deadline applies.
    * ``plain_types``: returned types recorded as successes without being judged (the
      configuration's, swapped whole on reconfiguration; empty with a result predicate).
    * ``seq``: outcomes counted off the healthy lane, read when a call begins so a call
      around a nested one through the same breaker records nothing more.

    Times: ``*_until``, ``sync_due`` and ``force_until`` are monotonic seconds;
    ``opened_at`` and ``force_expires_at`` are Unix seconds.
    """

    # Slots, not an instance dict: a breaker holds some fifty fields, more than CPython's
    # shared-key instance dicts take, so each one would carry a 1.6 KB dict of its own.
    # ``__dict__`` stays as the last slot, created only when something sets a field not
    # listed here (a test's spy); ``__weakref__`` because sync guards hold breakers weakly.
    __slots__ = (
        "name", "config", "clock", "mono", "bus", "lock", "sync", "timed", "state", "generation",
        "closed_permit", "fast_permit", "healthy_permit", "quiet_permit", "timing_permit",
        "reject_until", "sync_due", "consecutive", "window", "lanes", "plain_types", "timing",
        "cascade", "cooldown_until", "opened_at", "open_until", "open_seconds", "opens",
        "trials", "trial_successes", "forced", "force_until", "force_expires_at",
        "force_reason", "force_actor", "last_trigger", "seq", "dry_run_rejections",
        "m_failure", "m_rate_limited", "m_ignored", "m_uncounted", "m_noted",
        "blocked_open", "blocked_half_open", "blocked_frozen", "transitions", "inherited",
        "outbox", "drain", "drainer", "__dict__", "__weakref__",
    )  # fmt: skip

    def __init__(self, name: str, config: BreakerConfig, clock: Clock, bus: EventBus) -> None:
        check_name(name)
        config = shared_config(config)
        self.name = name
        self.config = config
        self.clock = clock
        self.mono: Callable[[], float] = clock.monotonic
        self.bus = bus
        self.lock = threading.Lock()
        self.sync: LocalSync | StoreSync = LOCAL
        self.timed = False
        self.state = CLOSED
        self.generation = 0
        self.closed_permit: Permit | None = Permit(0)
        self.fast_permit: Permit | None = self.closed_permit
        self.healthy_permit: Permit | None = None
        self.quiet_permit: Permit | None = None
        self.timing_permit: Permit | None = None
        self.reject_until = 0.0
        self.sync_due = float("inf")
        self.consecutive = 0
        self.window: CountWindow | TimeWindow = _window_for(config)
        self.lanes = True  # successes may skip the window: count window, no call timing
        self.plain_types: frozenset[type] = config.plain_types
        self.timing = False  # the slow-call trigger is on; set by configure_lanes()
        self.cascade = SecondBuckets(config.cascade_window)
        self.cooldown_until = 0.0
        self.opened_at: float | None = None
        self.open_until = 0.0
        self.open_seconds = config.recovery_timeout  # how long the current open lasts
        self.opens = 0  # consecutive automatic opens since the last close
        self.trials = 0  # slots taken in the current probing round
        self.trial_successes = 0
        self.forced: str | None = None  # "open" | "closed"
        self.force_until = 0.0
        self.force_expires_at: float | None = None
        self.force_reason = ""
        self.force_actor: str | None = None
        self.last_trigger: str | None = None
        self.seq = 0
        self.dry_run_rejections = 0
        self.init_metrics()
        # Events are queued here under the state lock, in the order the transitions were
        # decided, and delivered after it is released by whichever thread drains first.
        # A list, not a deque: append() and pop(0) are each one atomic C call as well, and
        # an empty list is 56 bytes where an empty deque takes a 64-slot block.
        self.outbox: list[Event] = []
        self.drain: threading.Lock | None = None  # made by the first delivery
        self.drainer: int | None = None  # thread delivering events right now
        self.configure_lanes()
        self.refresh_fast()

    def init_metrics(self) -> None:
        """The counts behind :meth:`metrics`. Nothing is added to the CLOSED healthy
        lane: its successes are the cascade's calls that are not counted here as anything
        else. The one count stepped without the lock, the OPEN rejection's, is an
        ``itertools.count`` (one atomic ``next()``); every other count is a plain int,
        changed only under the state lock (ints cost nothing per breaker, a count object
        56 bytes, and a fleet may hold many thousands of breakers)."""
        self.m_failure = 0  # final outcomes, counted or not in the cascade (lock held)
        self.m_rate_limited = 0  # (lock held)
        self.m_ignored = 0  # (lock held)
        self.m_uncounted = 0  # successes the cascade did not count: dry-run, retry-noted (lock held)
        self.m_noted = 0  # cascade calls that are not successes (lock held)
        # Rejections by reason: the lock-free OPEN rejection steps ``_blocked_open`` (the
        # locked ones too, so one count holds them all); the two others are locked paths.
        self.blocked_open = itertools.count()
        self.blocked_half_open = 0  # (lock held)
        self.blocked_frozen = 0  # (lock held)
        #: (from, to, trigger) -> count, made by the first transition (lock held)
        self.transitions: dict[tuple[str, str, str], int] | None = None
        self.inherited: dict[str, Any] | None = None  # the counts a forked child started from

    def mark(self) -> None:
        """An outcome was counted (lock held): number it, and note it for this thread or
        task, so a call around a nested one through this breaker records nothing more."""
        self.seq += 1
        RECORDED.set((self, self.seq))

    def count_blocked(self, reason: str) -> None:
        """one rejection for *reason* on a locked path (lock held)."""
        if reason == Reason.OPEN:
            next(self.blocked_open)  # the count the lock-free rejection steps too
        elif reason == Reason.HALF_OPEN_FULL:
            self.blocked_half_open += 1
        else:
            self.blocked_frozen += 1

    def count_failure(self, rate_limited: bool) -> None:
        """one final failed outcome (lock held)."""
        if rate_limited:
            self.m_rate_limited += 1
        else:
            self.m_failure += 1

    def refresh_fast(self) -> None:
        """Recompute the hot-path permit after a state or force change (lock held). With the
        slow-call trigger on, the CLOSED permit becomes the one admission copies."""
        fast = (
            self.closed_permit
            if self.state is CLOSED and self.forced is None and (not self.timed or self.mono() < self.sync_due)
            else None
        )
        self.quiet_permit = None
        if self.timing:
            self.fast_permit, self.timing_permit = None, fast
        else:
            self.fast_permit, self.timing_permit = fast, None
            if fast is not None and fast is self.healthy_permit:
                self.quiet_permit = fast

    def configure_lanes(self) -> None:
        """Whether successes may skip the window (lock held, or in __init__): only with the
        count window and no call timing, where a success in a clean full window changes
        nothing. A time window must count every success.

        Calls are timed only while the slow-call trigger is on: a duration and a rate
        threshold both above 0. With either at 0 nothing is ever slow, in any state."""
        cfg = self.config
        self.timing = cfg.slow_call_duration > 0 and cfg.slow_call_rate_threshold > 0
        self.lanes = cfg.sliding_window_type == "count" and not self.timing
        if not self.lanes:
            self.quiet_permit = self.healthy_permit = None
        self.plain_types = cfg.plain_types  # empty while a result_predicate judges every value

    def invalidate(self) -> None:
        """Clear what the lock-free paths read, before any failure is recorded or any state
        changes (lock held). Every mutating path calls this first; see the module docstring."""
        self.quiet_permit = None
        self.healthy_permit = None
        self.reject_until = 0.0

    def enter(
        self,
        target: CircuitState,
        trigger: str,
        events: MutableSequence[Event] | None,
        *,
        adopted: bool = False,
    ) -> float:
        """Move to *target* in a new generation (lock held): the single place a state
        changes, for local decisions and adoption alike. Appends ``StateChanged`` to
        *events* unless it is None (adoption of a peer's decision publishes nothing).

        The edge is checked against the legal-transition table first
        (:func:`~baldur_django.core.states.check_transition`); *adopted* marks a state taken
        over from a shared record, legal from any state.

        Returns:
            The wall-clock time of the transition (Unix seconds).

        Raises:
            IllegalTransition: the edge is not in the table (a programming error).
        """
        before = self.state
        check_transition(before, target, trigger, adopted=adopted)
        self.invalidate()
        if target is not before:
            key = (before.value, target.value, trigger)
            transitions = self.transitions
            if transitions is None:
                transitions = self.transitions = {}
            transitions[key] = transitions.get(key, 0) + 1
        self.generation += 1
        self.trials = 0
        self.trial_successes = 0
        self.state = target
        self.last_trigger = trigger
        if target is CLOSED:
            self.closed_permit = Permit(self.generation)
            self.opened_at = None
            self.opens = 0  # any close resets the backoff
        else:
            self.closed_permit = None
        self.refresh_fast()
        wall = self.clock.wall()
        if events is not None:
            events.append(
                StateChanged(
                    self.name,
                    wall,
                    from_state=before.value,
                    to_state=target.value,
                    trigger=trigger,
                    dry_run=self.config.dry_run,
                )
            )
        return wall

    def hold_open_until(self, until: float) -> None:
        """OPEN rejects lock-free until *until* (monotonic), unless dry-run lets everything through."""
        if not self.config.dry_run:
            self.reject_until = until

    def to_open(self, now: float, trigger: str, events: MutableSequence[Event]) -> None:
        """Open (lock held). An automatic open counts one more consecutive open and lasts its
        backed-off duration; a forced open leaves the count alone."""
        self.opened_at = self.enter(OPEN, trigger, events)
        if trigger != Trigger.FORCED:
            cfg = self.config
            self.opens, self.open_seconds = next_open(
                self.opens, cfg.recovery_timeout, cfg.recovery_backoff_factor, cfg.recovery_timeout_max
            )
        self.open_until = now + self.open_seconds
        if self.forced is None:
            self.hold_open_until(self.open_until)
        self.cascade.clear()

    def to_half_open(self, trigger: str, events: MutableSequence[Event] | None) -> None:
        self.enter(HALF_OPEN, trigger, events)

    def to_closed(self, trigger: str, events: MutableSequence[Event] | None, *, clear: bool = True) -> None:
        self.enter(CLOSED, trigger, events)
        if clear:
            self.consecutive = 0
            self.window.clear()

    def evaluate(self, now: float, events: MutableSequence[Event]) -> None:
        """Apply a lapsed force and the recovery timeout (lazy transitions).

        With a shared store that answers, the store decides both (its operations
        normalise the record first); locally only while it is down.
        """
        if not self.sync.local_judgement():
            return
        if self.forced is not None and now >= self.force_until:
            previous = self.forced
            before = self.state
            self.clear_force()
            if rules.lapse_target(previous, frozen=frozen()) is not None:
                self.to_half_open(Trigger.FORCE_LAPSED, None)
            elif previous == "open":  # a lapsed forced open stays OPEN until the level drops
                self.open_until = now
            else:
                self.refresh_fast()
            events.append(
                ForceLapsed(
                    self.name,
                    self.clock.wall(),
                    previous=previous,
                    from_state=before.value,
                    to_state=self.state.value,
                )
            )
        if self.state is OPEN and rules.recovery_due(
            state="open", forced=self.forced, now=now, open_until=self.open_until, frozen=frozen()
        ):
            self.to_half_open(Trigger.RECOVERY_TIMEOUT, events)

    def clear_force(self) -> None:
        self.invalidate()
        self.forced = None
        self.force_until = 0.0
        self.force_expires_at = None
        self.force_reason = ""
        self.force_actor = None

    def use_store(self, guard: StoreGuard | None) -> None:
        """Share this breaker's state through *guard*'s store, or go back to process-local
        state (None). The breaker object stays the same: functions decorated before the
        store was configured keep working. Local counts are kept; a shared breaker's
        next call consults the store (first use)."""
        with self.lock:
            self.invalidate()
            if guard is None:
                self.sync = LOCAL
                self.timed = False
                self.sync_due = float("inf")
            else:
                self.sync = StoreSync(guard)
                self.timed = True
                self.sync_due = float("-inf")
            self.refresh_fast()

    def reconfigure(self, config: BreakerConfig) -> None:
        """Swap in a new configuration. A new window size restarts the window."""
        config = shared_config(config)
        with self.lock:
            self.invalidate()  # re-derived by the next locked admission and success
            old = self.config
            if (config.sliding_window_type, config.sliding_window_size, config.sliding_window_seconds) != (
                old.sliding_window_type,
                old.sliding_window_size,
                old.sliding_window_seconds,
            ):
                self.window = _window_for(config)
            if config.cascade_window != self.cascade.span:
                self.cascade.span = config.cascade_window
            self.config = config
            self.configure_lanes()
            self.refresh_fast()

    def publish(self, events: Collection[Event] = ()) -> None:
        """Deliver queued events in order (state lock NOT held, no I/O of its own); *events*
        not yet queued are queued first. A listener that touches this breaker while being
        called queues what that produces; the outer delivery loop hands it on after the
        current event has reached every listener."""
        outbox = self.outbox
        if events is not outbox and events:
            outbox.extend(events)
        if not outbox or self.drainer == threading.get_ident():
            return
        publish = self.bus.publish
        drain = self.drain
        if drain is None:
            with _DRAIN_MADE:
                drain = self.drain
                if drain is None:
                    drain = self.drain = threading.Lock()
        with drain:
            self.drainer = threading.get_ident()
            try:
                while True:
                    try:
                        event = outbox.pop(0)
                    except IndexError:
                        return
                    publish(event)
            finally:
                self.drainer = None


def _window_for(config: BreakerConfig) -> CountWindow | TimeWindow:
    """The sliding window *config* asks for: the last N outcomes, or the last N seconds."""
    if config.sliding_window_type == "time":
        return TimeWindow(config.sliding_window_seconds)
    return CountWindow(config.sliding_window_size)

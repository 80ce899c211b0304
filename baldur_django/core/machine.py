"""The breaker's state and its transitions: the part every other part of a breaker works on.

A :class:`Machine` holds all of one breaker's mutable state in slots. Its state proper is a
:class:`~baldur_django.core.stores.base.Record` (a machine is one), changed only by
:func:`~baldur_django.core.steps.step`, the function the stores apply too:
:meth:`Machine.apply_step` runs it under the one short ``threading.Lock`` and applies the
outcome (a new generation, the CLOSED permit, the transition's check, count and event, the
lock-free fields). The event outbox delivers what was decided after the lock is released,
once per transition. A :class:`~baldur_django.core.breaker.CircuitBreaker` builds one (as its
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

from . import steps
from .clock import Clock
from .config import BreakerConfig
from .configs import shared_config
from .emergency import frozen
from .events import Event, EventBus, ForceLapsed, StateChanged
from .names import check_name
from .nesting import RECORDED
from .permit import Permit
from .states import CircuitState, Reason, check_transition
from .stores.base import Record
from .sync import LOCAL, LocalSync, StoreGuard, StoreSync
from .window import CountWindow, SecondBuckets, TimeWindow

__all__ = ["Machine", "STATES"]

#: ``sync_due`` of a process-local breaker: one float shared by all of them.
_NEVER = float("inf")
_FIRST_EPOCH = object()  # every breaker's epoch until its first change (compared per breaker only)

CLOSED = CircuitState.CLOSED
OPEN = CircuitState.OPEN
HALF_OPEN = CircuitState.HALF_OPEN

#: A shared record's state name -> the state.
STATES = {"closed": CLOSED, "open": OPEN, "half_open": HALF_OPEN}

#: Taken only to make a breaker's delivery lock on its first delivery (:meth:`Machine.publish`).
_DRAIN_MADE = threading.Lock()

#: The probes of a breaker that never probed: one shared empty mapping (the steps never
#: change a record's probes in place, they replace them).
_NO_PROBES: dict[str, float] = {}

#: Tokens of this process's own trial slots (a store's tokens are uuid hex).
_TOKENS = itertools.count(1)


def local_token() -> str:
    """A fresh token for a trial slot taken in this process's own record."""
    return f"local-{next(_TOKENS)}"


class Machine(Record):
    """One breaker's mutable state and the transitions that change it (state lock held
    unless a method says otherwise).

    A machine *is* a :class:`~baldur_django.core.stores.base.Record`: its state, version
    (the generation permits are stamped with), force, open times, backoff count and probing
    round are the record's fields, in the breaker's monotonic seconds, and only
    :func:`~baldur_django.core.steps.step` changes them (:meth:`apply_step`). Readings convert
    the times to Unix seconds.

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
    * ``epoch``: an object replaced (after the change it stands for) whenever the
      configuration or the store link changes, or a 429 cooldown first starts or is reset:
      the stage lanes (``stages/lanes.py``) run only on a route built in the current epoch,
      one identity test per call.

    Times: every time is monotonic seconds (``opened_at``, ``open_until``,
    ``force_expires_at``, ``updated_at``, lease expiries, ``reject_until``, ``sync_due``).
    """

    # Slots, not an instance dict: a breaker holds some fifty fields, more than CPython's
    # shared-key instance dicts take, so each one would carry a 1.6 KB dict of its own.
    # ``__dict__`` stays as the last slot, created only when something sets a field not
    # listed here (a test's spy); ``__weakref__`` because sync guards hold breakers weakly.
    __slots__ = (
        "name", "config", "clock", "mono", "bus", "lock", "sync", "timed", "generation",
        "closed_permit", "fast_permit", "healthy_permit", "quiet_permit", "timing_permit",
        "reject_until", "sync_due", "consecutive", "window", "lanes", "plain_types", "timing",
        "cascade", "cooldown_until", "seq", "dry_run_rejections", "wall_offset",
        "m_failure", "m_rate_limited", "m_ignored", "m_uncounted", "m_noted",
        "blocked_open", "blocked_half_open", "blocked_frozen", "transitions", "inherited",
        "outbox", "drain", "drainer", "epoch", "__dict__", "__weakref__",
    )  # fmt: skip

    state: CircuitState  # the record's state, always the enum member here
    __eq__ = object.__eq__  # a breaker is equal to itself only, and hashable
    __hash__ = object.__hash__

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r} {self.state.value} v{self.version}>"

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
        # the record (see the class docstring)
        self.state = CLOSED
        self.version = 0
        self.opened_at = None
        self.open_until = None
        self.trigger = None
        self.forced = None  # "open" | "closed"
        self.force_expires_at = None
        self.force_reason = ""
        self.force_actor = None
        self.probes = _NO_PROBES
        self.successes = 0
        self.updated_at = None
        self.opens = 0  # consecutive automatic opens since the last close
        self.generation = 0  # = version, re-derived after each step
        self.closed_permit: Permit | None = Permit(0)
        self.fast_permit: Permit | None = self.closed_permit
        self.healthy_permit: Permit | None = None
        self.quiet_permit: Permit | None = None
        self.timing_permit: Permit | None = None
        self.reject_until = 0.0
        self.sync_due = _NEVER
        self.consecutive = 0
        self.window: CountWindow | TimeWindow = _window_for(config)
        self.lanes = True  # successes may skip the window: count window, no call timing
        self.plain_types: frozenset[type] = config.plain_types
        self.timing = False  # the slow-call trigger is on; set by configure_lanes()
        self.cascade = SecondBuckets(config.cascade_window)
        self.cooldown_until = 0.0
        self.epoch = _FIRST_EPOCH  # see the class docstring (shared until it first changes)
        self.seq = 0
        self.dry_run_rejections = 0
        self.wall_offset: float | None = None  # Unix minus monotonic seconds, at the last new version
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

    def step_timing(self) -> steps.Timing:
        """The open timing of this breaker's configuration (seconds)."""
        cfg = self.config
        return steps.Timing(cfg.recovery_timeout, cfg.recovery_backoff_factor, cfg.recovery_timeout_max)

    def apply_step(
        self, event: steps.Event, now: float, events: MutableSequence[Event] | None, *, adopted: bool = False
    ) -> steps.Outcome:
        """Run :func:`~baldur_django.core.steps.step` on this breaker's own record (lock held)
        and apply what it did: the single place a state changes, for local decisions and
        adoption alike.

        Args:
            event (steps.Event): what happened.
            now (float): the breaker's monotonic clock (seconds).
            events: where a ``StateChanged`` goes when the step moved the state (None:
                announced otherwise, by a force, release, reset, lapse or adoption's own event).
            adopted (bool): a state taken over from a shared record, legal from any state.

        Returns:
            steps.Outcome: the step's outcome.

        Raises:
            IllegalTransition: the edge is not in the legal-transition table (a programming error).
        """
        before = self.state
        version = self.version
        self.quiet_permit = self.healthy_permit = None  # the lock-free lanes stop before the record changes
        outcome = steps.step(self, event, now, self.step_timing(), frozen())
        if self.version != version or self.state != before:
            self.wall_offset = self.clock.wall() - now
            self.applied(before, outcome, None if outcome.lapsed is not None else events, adopted)
        return outcome

    def applied(
        self, before: CircuitState, outcome: steps.Outcome, events: MutableSequence[Event] | None, adopted: bool
    ) -> None:
        """Re-derive what follows from a step that made a new version (lock held): the
        generation and CLOSED permit, the transition's count, check and event, the counts
        a close clears, the lock-free OPEN deadline and the hot-path permits."""
        target = STATES[self.state]
        trigger = self.trigger or ""
        if target is not before:
            check_transition(before, target, trigger, adopted=adopted)  # before anything is applied
        self.invalidate()
        self.state = target
        self.generation = self.version
        self.closed_permit = Permit(self.version) if target is CLOSED else None
        if target is not before:
            key = (before.value, target.value, trigger)
            transitions = self.transitions
            if transitions is None:
                transitions = self.transitions = {}
            transitions[key] = transitions.get(key, 0) + 1
            if target is CLOSED:
                self.consecutive = 0
                self.window.clear()
            elif target is OPEN:
                self.cascade.clear()
            if events is not None:
                events.append(
                    StateChanged(
                        self.name,
                        self.clock.wall(),
                        from_state=before.value,
                        to_state=target.value,
                        trigger=trigger,
                        dry_run=self.config.dry_run,
                    )
                )
        if target is OPEN:
            self.hold_open_until(self.deadline())
        self.refresh_fast()

    def deadline(self) -> float:
        """Monotonic time until which an OPEN breaker refuses calls: a forced open's end, else
        the end of its open time (0.0 when it has none)."""
        until = self.force_expires_at if self.forced == "open" else self.open_until
        return 0.0 if until is None else until

    def force_until(self) -> float:
        """Monotonic end of the force held (0.0 when none)."""
        until = self.force_expires_at
        return 0.0 if until is None else until

    def unix(self, mono: float | None) -> float | None:
        """A monotonic time of this breaker as Unix seconds (None stays None). The clocks'
        difference is the one taken when the record last changed, so the same time reads the
        same at every call (a difference read now would move with each read by the time
        between the two clock reads)."""
        if mono is None:
            return None
        offset = self.wall_offset
        if offset is None:
            offset = self.clock.wall() - self.mono()
        return mono + offset

    def hold_open_until(self, until: float) -> None:
        """OPEN rejects lock-free until *until* (monotonic), unless dry-run lets everything through."""
        if not self.config.dry_run:
            self.reject_until = until

    def evaluate(self, now: float, events: MutableSequence[Event]) -> None:
        """Apply a lapsed force and the recovery timeout (lazy transitions): a
        :class:`~baldur_django.core.steps.Sweep` step.

        With a shared store that answers, the store decides both (its operations
        normalise the record first); locally only while it is down.
        """
        if not self.sync.local_judgement() or (self.forced is None and self.state is not OPEN):
            return  # nothing can lapse or recover
        before = self.state
        outcome = self.apply_step(steps.Sweep(), now, events)
        if outcome.lapsed is not None:
            events.append(
                ForceLapsed(
                    self.name,
                    self.clock.wall(),
                    previous=outcome.lapsed,
                    from_state=before.value,
                    to_state=self.state.value,
                )
            )

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
                self.sync_due = _NEVER
            else:
                self.sync = StoreSync(guard)
                self.timed = True
                self.sync_due = float("-inf")
            self.epoch = object()  # after the link it stands for
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
            self.epoch = object()  # after the configuration it stands for
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

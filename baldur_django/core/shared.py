"""The store seam of a breaker: what ``sync.py`` reads of its state and how a store's
answer is adopted.

``sync.py`` changes nothing of a breaker directly: it reads a :class:`View`, schedules the
next consult, and hands store answers to :meth:`SharedMachine.apply` /
:meth:`SharedMachine.apply_probe`, which adopt them under the state lock. These are the
methods of :class:`~baldur_django.core.sync.SyncTarget`.
"""

from __future__ import annotations

from collections.abc import Collection, MutableSequence
from dataclasses import replace

from . import steps
from .events import Event, ForceLapsed
from .machine import STATES, Machine
from .permit import Permit, View
from .states import CircuitState, Trigger
from .stores.base import Answer
from .sync import StoreSync

__all__ = ["SharedMachine"]

CLOSED = CircuitState.CLOSED
OPEN = CircuitState.OPEN
HALF_OPEN = CircuitState.HALF_OPEN


class SharedMachine(Machine):
    """A :class:`~baldur_django.core.machine.Machine` that can follow a shared store's record."""

    __slots__ = ()

    def settle(self, events: Collection[Event] = ()) -> None:
        """After a locked section (state lock NOT held): write a trip the strategy left
        pending to the shared store (store I/O), then deliver the queued events."""
        if self.sync.pending is not None:
            self.sync.push_trip(self)
        self.publish(events)

    def view(self, *, locked: bool = False) -> View:
        """The state a store strategy decides on; *locked* reads it under the state lock."""
        if locked:
            with self.lock:
                return self._view()
        return self._view()

    def _view(self) -> View:
        until = self.open_until
        return View(self.state, self.forced, self.force_until(), 0.0 if until is None else until, self.sync_due)

    def schedule(self, deadline: float, *, refresh: bool = False) -> None:
        """Set when a shared breaker consults its store next (monotonic seconds). With
        *refresh* the hot-path permit is re-derived under the state lock (not held by the caller)."""
        if not refresh:
            self.sync_due = deadline
            return
        with self.lock:
            self.sync_due = deadline
            self.refresh_fast()

    def apply(
        self, answer: Answer, *, force: bool = False, first: Collection[Event] = (), announced: bool = False
    ) -> None:
        """Make the local state follow a store *answer* (state lock taken here, not held by the
        caller), then deliver *first* and what the adoption published.

        Args:
            answer (Answer): what one store operation returned.
            force (bool): adopt it even when its version is the one already adopted (the
                answer to this worker's own write: a trip, a force, a release).
            first (Collection[Event]): events to deliver before the adoption's own.
            announced (bool): the transition the answer records was already announced by
                this worker (a trip's own events, in *first* or published when it was
                decided): the adoption moves the local state without a second event.
        """
        events: list[Event] = list(first)
        with self.lock:
            self.adopt(answer, self.mono(), events, force=force, announced=announced)
            self.refresh_fast()
        self.publish(events)

    def apply_probe(self, answer: Answer, token: str, now: float) -> Permit | None:
        """Adopt the answer to a probe request and build the permit it grants: a trial
        permit holding *token* when the store gave a slot, the CLOSED permit when the record
        turned out CLOSED, else None (no slot). Takes the state lock; publishes afterwards."""
        events: list[Event] = []
        permit: Permit | None = None
        with self.lock:
            self.adopt(answer, self.mono(), events)
            started = now if self.timing else None  # timed calls carry their admission time
            if answer.result:  # the adopted round already counts this probe
                permit = Permit(self.generation, trial=True, token=token, started=started)
            elif self.state is CLOSED:
                permit = self.closed_permit if started is None else Permit(self.generation, started=started)
        self.publish(events)
        return permit

    def held_open(self) -> str | None:
        """The trigger to write an automatic open back with, while this process holds one
        (OPEN or HALF_OPEN, not forced): the open's own trigger, or ``"adopted"`` in
        HALF_OPEN (the round's trigger names no open). None while CLOSED or forced.

        A shared store that answers with an empty or older CLOSED record is never taken
        over such a state, whether the open time still runs or a probe is due."""
        with self.lock:
            if self.forced is None:
                if self.state is OPEN:
                    return self.trigger or Trigger.ADOPTED
                if self.state is HALF_OPEN:
                    return Trigger.ADOPTED
        return None

    def open_timing(self) -> tuple[float, float, float]:
        """``(recovery_timeout, backoff factor, cap)`` in seconds, for the store's open."""
        cfg = self.config
        return cfg.recovery_timeout, cfg.recovery_backoff_factor, cfg.recovery_timeout_max

    # ------------------------------------------------------------------ adoption
    def adopt(
        self,
        answer: Answer,
        now: float,
        events: MutableSequence[Event],
        *,
        force: bool = False,
        announced: bool = False,
    ) -> None:
        """Make the local state follow the shared record of a store *answer* (lock held).

        Publishes only what this worker's own store operation decided (``answer.moved``,
        ``answer.lapsed``); a state adopted from a peer's decision publishes nothing.
        """
        record = answer.record
        if answer.lapsed is not None:
            events.append(
                ForceLapsed(
                    self.name,
                    self.clock.wall(),
                    previous=answer.lapsed,
                    from_state=self.state.value,
                    to_state=record.state,
                )
            )
        adopt = steps.Adopt(record, now - answer.now, answer.now)  # store time -> this process's monotonic time
        if not self._news(adopt, now, force):
            return
        version = self.version
        announce = answer.moved and answer.lapsed is None and not announced
        self.apply_step(adopt, now, events if announce else None, adopted=True)
        if self.version == version:  # CLOSED stays CLOSED: the force may have changed all the same
            self.invalidate()
            self.refresh_fast()

    def _news(self, adopt: steps.Adopt, now: float, force: bool) -> bool:
        """False when *record* brings nothing to adopt (lock held): the version already
        adopted (unless this worker's own judgement during an outage left it elsewhere; then
        it follows the record again), or a CLOSED record read before a local trip waiting
        for its push (the push settles it). A process-local breaker adopts every answer."""
        sync = self.sync
        if not isinstance(sync, StoreSync):
            return True
        record = adopt.record
        same = STATES[record.state] is self.state and record.forced == self.forced
        if record.version == sync.version and not force and (same or sync.pending is not None):
            if self.state is HALF_OPEN:  # the round's counts only
                self.apply_step(replace(adopt, round_only=True), now, None)
            return False
        if not force and sync.pending is not None and record.state == "closed" and record.forced is None:
            return False
        sync.version = record.version
        sync.next_probe = float("-inf")
        return True

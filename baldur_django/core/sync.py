"""How a breaker meets its store: the strategy a breaker's core holds (:class:`~baldur_django.core.sync_target.SyncTarget`).

A breaker takes every decision itself (``breaker.py``); what changes with a shared store
(database or Redis) is only *when it reads or writes the shared record* and whether it
may judge alone. That is this module's job, at these moments:

============================  =========================================================
hook                          moment
============================  =========================================================
``consult``                   first use in the process, and every sync interval
``push_trip``                 a local trigger fired: the store decides who publishes
``acquire_probe``             the local timer says a probe is due
``finish_probe``              each trial outcome (and a trial's slot given back)
``store_force`` /             an operator's force, release or reset (errors raise:
``store_release`` /           an operator's act never fails silently)
``store_reset``
``sweep``                     a read of an OPEN breaker past its recovery timeout
============================  =========================================================

:class:`LocalSync` does no I/O: every hook answers "decide locally".
:class:`StoreSync` runs the hook as one store operation through a :class:`StoreGuard`
and hands the answer to the breaker (``breaker.apply``), which adopts it. The strategy
reads the breaker only through :meth:`SyncTarget.view` and sets only when it consults
next (:meth:`SyncTarget.schedule`): one class's state is changed by its own module. Store I/O happens
only in the methods above, never under the breaker's state lock, and every method
that may do I/O says so in its name or docstring. ``registry.set_store()`` swaps the
strategy a breaker holds (``breaker.use_store``); the breaker object stays the same, so
functions decorated at import time keep working.

Store trouble never reaches a caller: the guard turns it into ``None`` and the
breaker falls back to its own judgement; ``circuit_breaker.store_unavailable`` is
logged at most once per interval per store, ``circuit_breaker.store_recovered`` once
when the store answers again, and a trip made meanwhile is pushed then (refused when
forced). Operator forces are the exception: their store errors raise
:class:`StoreError`.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import uuid
from collections.abc import Callable, MutableSequence
from typing import TYPE_CHECKING, Any

from .emergency import frozen
from .errors import StoreError
from .events import Event, RecordAdopted, StoreProblem, TripBlocked
from .lease import probe_lease
from .rules import recovery_due
from .states import CircuitState
from .stores.base import BLOCKED, TRIPPED, Answer, StateStore

if TYPE_CHECKING:  # pragma: no cover
    from .permit import Permit
    from .sync_target import SyncTarget

__all__ = ["StoreGuard", "LocalSync", "StoreSync", "LOCAL"]


_NEVER = float("inf")
#: Seconds a caller waits for another caller's first read of a breaker's shared record
#: before it is judged locally. The read itself is bounded by the store's own timeout
#: (a quarter of a second on Redis by default); this only bounds a read that hangs anyway.
FIRST_READ_WAIT = 2.0
_CLOSED = CircuitState.CLOSED
_OPEN = CircuitState.OPEN
_HALF_OPEN = CircuitState.HALF_OPEN


def _timing(breaker: SyncTarget) -> dict[str, float]:
    """The open timing of *breaker* as the store protocol's keyword arguments (seconds)."""
    recovery_timeout, backoff_factor, recovery_timeout_max = breaker.open_timing()
    return {
        "recovery_timeout": recovery_timeout,
        "backoff_factor": backoff_factor,
        "recovery_timeout_max": recovery_timeout_max,
    }


class StoreGuard:
    """Calls a store, turning every error into ``None`` plus rate-limited warnings.

    One guard per store per process: ``circuit_breaker.store_unavailable`` is published at
    most once per ``interval`` seconds, ``circuit_breaker.store_recovered`` once when the
    store answers again.

    Args:
        store (StateStore): the store.
        interval (Callable[[], float]): seconds between two unavailability warnings
            (``BALDUR_STORE_WARNING_INTERVAL_SECONDS``).
        publish (Callable[[Event], None]): where the StoreProblem events go.
        monotonic, wall (Callable[[], float]): clock functions (seconds).
    """

    def __init__(
        self,
        store: StateStore,
        interval: Callable[[], float],
        publish: Callable[[Event], None],
        monotonic: Callable[[], float],
        wall: Callable[[], float],
    ) -> None:
        self.store = store
        self._interval = interval
        self._publish = publish
        self._mono = monotonic
        self._wall = wall
        self._lock = threading.Lock()
        self.down = False
        self._warned_at: float | None = None
        self.failures = 0

    def call(self, service: str, op: str, **kwargs: Any) -> Answer | None:
        """Run ``store.<op>(service, **kwargs)`` (store I/O); None when the store did not answer.

        The store protocol takes everything but the name as keyword arguments."""
        try:
            answer: Answer = getattr(self.store, op)(service, **kwargs)
        except Exception as exc:  # any store error, never the caller's problem
            self._failed(service, exc)
            return None
        if self.down:
            self._recovered(service)
        return answer

    def _failed(self, service: str, exc: BaseException) -> None:
        now = self._mono()
        with self._lock:
            self.failures += 1
            self.down = True
            due = self._warned_at is None or now - self._warned_at >= self._interval()
            if due:
                self._warned_at = now
        if due:
            self._publish(StoreProblem(service, self._wall(), recovered=False, error=describe(exc)))

    def _recovered(self, service: str) -> None:
        with self._lock:
            if not self.down:
                return
            self.down = False
            self._warned_at = None
        self._publish(StoreProblem(service, self._wall(), recovered=True))


def describe(exc: BaseException) -> str:
    """``"Type: message"`` of *exc*, at most 300 characters (for logs and StoreError texts)."""
    text = f"{type(exc).__name__}: {exc}"
    return text if len(text) <= 300 else text[:297] + "..."


class LocalSync:
    """Process-local breakers: no store, every decision local, no I/O.

    Stateless, so one instance (:data:`LOCAL`) serves every breaker.
    """

    backend = "memory"
    #: The hot-path permit never expires on a timer (no sync interval to honour).
    timed = False
    #: Nothing waits to be written after a locked section.
    pending: str | None = None
    #: Nothing to read before the first call: the local state is the whole state.
    known = True

    def serial(self) -> contextlib.AbstractContextManager[None]:
        """Orders this breaker's store round trips; nothing to order locally."""
        return contextlib.nullcontext()

    def first_use(self, breaker: SyncTarget) -> None:
        """Never called (:attr:`known` is True)."""

    def local_judgement(self) -> bool:
        """True: lapses, recovery and trial slots are decided on local state."""
        return True

    def shares_probes(self) -> bool:
        """False: the half-open allowance is this process's own."""
        return False

    def probe_due(self, breaker: SyncTarget, now: float) -> bool:
        """False: local admission takes local trial slots."""
        return False

    def consult(self, breaker: SyncTarget, now: float) -> None:
        """Nothing to read."""

    def refresh(self, breaker: SyncTarget, now: float) -> None:
        """Nothing to read before a state read."""

    def trip_decided(
        self, breaker: SyncTarget, trigger: str, held: list[Event], events: MutableSequence[Event]
    ) -> None:
        """A local trip is final: its events are published at once."""
        events.extend(held)

    def push_trip(self, breaker: SyncTarget) -> None:
        """Never called: nothing is ever pending locally."""

    def acquire_probe(self, breaker: SyncTarget, now: float) -> Permit | None:
        """Never called (``probe_due`` is False)."""
        return None

    def finish_probe(self, breaker: SyncTarget, permit: Permit, outcome: str) -> bool:
        """False: the breaker settles the trial locally."""
        return False

    def store_force(self, breaker: SyncTarget, mode: str, ttl_seconds: float, reason: str, actor: str | None) -> None:
        """None: the force is applied locally."""
        return None

    def store_release(self, breaker: SyncTarget) -> None:
        """None: the release is applied locally."""
        return None

    def store_reset(self, breaker: SyncTarget) -> None:
        """None: the reset is applied locally."""
        return None

    def after_peer(self, breaker: SyncTarget) -> None:
        """Nothing to do: a peer's decision adopted locally is the whole state."""

    def extra_snapshot(self) -> dict[str, Any]:
        """No shared fields."""
        return {}


#: The strategy of every process-local breaker.
LOCAL = LocalSync()


class StoreSync:
    """A breaker's link to a shared store. One per breaker.

    Args:
        guard (StoreGuard): the guard of the configured store (one per store per process).

    Bookkeeping kept here, not on the breaker: the record version last adopted, when a
    probe may next be asked for, a trip waiting for the store's verdict, a trip made
    while the store was down, and the record version each probe token was admitted in.
    """

    timed = True

    def __init__(self, guard: StoreGuard) -> None:
        self.guard = guard
        self.backend: str = guard.store.backend
        self.version = -1  # record version last adopted; -1 = never consulted
        self.next_probe = float("-inf")
        self.pending: str | None = None  # trigger of a local trip not yet written to the store
        self._held: list[Event] = []  # that trip's events, published if the store says we decided it
        self._unpushed: str | None = None  # a trip decided while the store was down
        self._probe_versions: dict[str, int] = {}
        self._outage = False  # a store call for this breaker went unanswered since the last adoption
        #: True once the shared record was read (or the read went unanswered): until then the
        #: local state is a fresh CLOSED that says nothing, and no call may be admitted on it.
        self.known = False
        # Lets one caller read the record the first time while the others wait for it (see
        # first_use); reentrant, so a listener of that read's events calling this breaker
        # from the same thread goes on instead of waiting for itself.
        self._gate = threading.RLock()
        self._reading = False
        # Serialises this process's store round trips for one breaker, so answers are
        # adopted in the order the store produced them (never a stale one over a newer).
        # Never held across the user's call; the state lock is taken inside it, never around it.
        self._io = threading.RLock()
        # Guards the trip bookkeeping above (pending, _held, _unpushed); taken inside the
        # breaker's state lock by trip_decided(), never around it.
        self._mutex = threading.Lock()

    def serial(self) -> contextlib.AbstractContextManager[bool]:
        """Hold while a store operation and its adoption must not interleave with another's."""
        return self._io

    def _call(self, breaker: SyncTarget, op: str, **kwargs: Any) -> Answer | None:
        """Store I/O through the guard; an unanswered call marks an outage for this breaker."""
        answer = self.guard.call(breaker.name, op, **kwargs)
        if answer is None:
            self._outage = True
        return answer

    def _rejoined(self, breaker: SyncTarget, answer: Answer, was: CircuitState) -> None:
        """After an adoption: the first one since an outage is announced with what was
        adopted (logged as ``circuit_breaker.store_adopted``)."""
        if not self._outage:
            return
        self._outage = False
        record = answer.record
        breaker.publish(
            [
                RecordAdopted(
                    breaker.name,
                    breaker.clock.wall(),
                    state=record.state,
                    forced=record.forced or "",
                    version=record.version,
                    local_state=was.value,
                )
            ]
        )

    # ----------------------------------------------------------- judgement
    def local_judgement(self) -> bool:
        """True only while the store is unreachable (the worker judges alone)."""
        return self.guard.down

    def shares_probes(self) -> bool:
        """True while the store answers: the half-open allowance is fleet-wide."""
        return not self.guard.down

    def probe_due(self, breaker: SyncTarget, now: float) -> bool:
        """True when the store must be asked for a probe slot (or to lapse a due force).

        While the store is down, only for an OPEN, unforced breaker whose open time is over:
        one attempt before the worker's own trial (the store may be back, and empty), not
        one per call (the breaker goes half-open on its own if nothing answers)."""
        if self.guard.down:
            view = breaker.view()
            return view.state is _OPEN and view.forced is None and now >= view.open_until and not frozen()
        if frozen():  # no probe while Level 3 holds
            return False
        view = breaker.view()
        if view.state is _HALF_OPEN:
            return now >= self.next_probe
        if view.state is _OPEN:
            return now >= (view.force_until if view.forced == "open" else view.open_until)
        return view.forced == "closed" and now >= view.force_until

    # ------------------------------------------------------------- consults
    def _schedule(self, breaker: SyncTarget, deadline: float) -> None:
        breaker.schedule(deadline)

    def first_use(self, breaker: SyncTarget) -> None:
        """Store I/O, once per breaker and process: read the shared record before any call is
        admitted, so a process started later obeys the record from its first call.

        One caller reads; callers arriving meanwhile wait for that read (at most
        :data:`FIRST_READ_WAIT` seconds, the read itself being bounded by the store's own
        timeout) and are then judged on what it adopted. A caller whose wait runs out is
        judged locally, as during a store outage. The gate is held only around the read,
        never while a protected call runs; coroutines reach this from a worker thread.

        Args:
            breaker (SyncTarget): the breaker whose record is read.

        Returns:
            None. Raises nothing: store trouble becomes local judgement.
        """
        if not self._gate.acquire(timeout=FIRST_READ_WAIT):
            return
        try:
            if not self.known and not self._reading:
                self._reading = True
                try:
                    self.consult(breaker, breaker.clock.monotonic())
                finally:
                    self._reading = False
        finally:
            self._gate.release()

    def consult(self, breaker: SyncTarget, now: float) -> None:
        """Store I/O: read the shared record (first use, sync interval) and adopt it; a trip
        made during an outage is pushed first."""
        interval = breaker.config.sync_interval
        retry_at = now + (interval if interval > 0 else 1.0)
        due = now + (interval if interval > 0 else _NEVER)
        first = not self.known
        if not first:
            # Later consults are scheduled before the read, so concurrent callers go on with
            # the state last adopted instead of all reading. The first one is scheduled only
            # after its adoption: until then the hot-path permit stays off.
            self._schedule(breaker, due)
        try:
            self._consult(breaker, now, retry_at)
        finally:
            if first:
                self.known = True
                if breaker.view().sync_due < now:
                    breaker.schedule(due, refresh=True)

    def _consult(self, breaker: SyncTarget, now: float, retry_at: float) -> None:
        if self._unpushed is not None:
            undone = breaker.view(locked=True).state is _CLOSED
            if undone:
                self._unpushed = None  # the outage trip was undone locally: nothing to push
            else:
                if not self._write_trip(breaker, self._unpushed, []):
                    self._schedule(breaker, retry_at)
                return
        with self._io:
            was = breaker.view().state
            answer = self._call(breaker, "load", frozen=frozen())
            if answer is None:
                breaker.schedule(retry_at, refresh=True)  # try again later
            elif not self._forgot(breaker, answer, now):
                breaker.apply(answer)
                self._rejoined(breaker, answer, was)

    def _forgot(self, breaker: SyncTarget, answer: Answer, now: float) -> bool:
        """The store answered with a CLOSED, unforced record older than the one this
        worker last adopted, or one never written (version 0, even when this worker adopted
        version 0 before the trip: a server restarted empty, a failover that lost writes) while
        the worker holds an automatic OPEN or HALF_OPEN (open time running or over). Checked
        for every answer read from the store (consult, sweep, probe request, trial outcome).
        The record is not taken as CLOSED: the open is written back as a trip, and the
        answer to that is adopted (a fresh open time; no call reaches the dependency the
        worker knows is down). True when it was handled (written back, or the write failed
        and waits for the next consult)."""
        record = answer.record
        if record.state != "closed" or record.forced is not None:
            return False
        if record.version >= self.version and record.version > 0:
            return False  # a close the fleet decided; a record never written (version 0) is none
        trigger = breaker.held_open()  # (under the state lock: a trip decided by now is pending by now)
        if trigger is None:
            return False
        if record.version >= self.version and self.pending is not None:
            return False  # this worker's own trip is on its way to the store: its write announces it
        if not self._write_trip(breaker, trigger, []):
            self._unpushed = trigger
            interval = breaker.config.sync_interval
            self._schedule(breaker, now + (interval if interval > 0 else 1.0))
        return True

    def refresh(self, breaker: SyncTarget, now: float) -> None:
        """Store I/O before a state read: consult when due or when a force lapse is due, then
        sweep an OPEN record past its recovery timeout (the recovery timeout, on a shared store)."""
        view = breaker.view()
        if not self.known:
            self.first_use(breaker)
            now = breaker.clock.monotonic()
        elif now >= view.sync_due or (view.forced is not None and now >= view.force_until):
            self.consult(breaker, now)
        view = breaker.view(locked=True)
        due = recovery_due(state=view.state, forced=view.forced, now=now, open_until=view.open_until, frozen=frozen())
        if due and not self.guard.down:
            self._run(breaker, "sweep", frozen=False)

    def _run(self, breaker: SyncTarget, op: str, **kwargs: Any) -> Answer | None:
        """Store I/O: one guarded operation, adopted by the breaker; events delivered."""
        with self._io:
            was = breaker.view().state
            answer = self._call(breaker, op, **kwargs)
            if answer is not None and not self._forgot(breaker, answer, breaker.clock.monotonic()):
                breaker.apply(answer)
                self._rejoined(breaker, answer, was)
        return answer

    # ----------------------------------------------------------------- trips
    def trip_decided(
        self, breaker: SyncTarget, trigger: str, held: list[Event], events: MutableSequence[Event]
    ) -> None:
        """A local trigger fired (state lock held): hold its events until the store says
        who decided it; :meth:`push_trip` runs once the lock is released."""
        with self._mutex:
            self.pending = trigger
            self._held = held

    def push_trip(self, breaker: SyncTarget) -> None:
        """Store I/O after the lock is released: write the pending trip. TRIPPED -> this worker
        publishes; BLOCKED -> ``trip_blocked``; ALREADY -> a peer decided, nothing
        published; no answer -> the local decision stands and is pushed later.

        On a thread running an event loop the write goes to the loop's default executor,
        so no coroutine waits on the store; the trip is already in force locally."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self._push_now(breaker)
        else:
            loop.run_in_executor(None, self._push_now, breaker)

    def _push_now(self, breaker: SyncTarget) -> None:
        # The pending trip is taken with the store round trips held (_io): until its write
        # is answered, a consult running in another thread still sees it pending and keeps
        # the local OPEN rather than adopting the older CLOSED record (whose adoption, undone
        # by the trip's own answer, announced the same open a second time).
        with self._io:
            with self._mutex:
                trigger, self.pending = self.pending, None
                held, self._held = self._held, []
            if trigger is not None and not self._write_trip(breaker, trigger, held):
                with self._mutex:
                    self._unpushed = trigger
                breaker.publish(held)

    def _write_trip(self, breaker: SyncTarget, trigger: str, held: list[Event]) -> bool:
        events: list[Event] = []
        with self._io:
            was = breaker.view().state
            answer = self._call(breaker, "trip", trigger=trigger, **_timing(breaker), frozen=frozen())
            if answer is None:
                return False
            self._unpushed = None
            if answer.result == TRIPPED:
                events.extend(held)
            elif answer.result == BLOCKED:
                events.append(
                    TripBlocked(breaker.name, breaker.clock.wall(), forced=answer.record.forced or "", trigger=trigger)
                )
            # the trip's events (held now, or published when the store did not answer)
            # announce it: the adoption of the record it made announces nothing more
            breaker.apply(answer, force=True, first=events, announced=True)
            self._rejoined(breaker, answer, was)
        return True

    # ---------------------------------------------------------------- probes
    def acquire_probe(self, breaker: SyncTarget, now: float) -> Permit | None:
        """Store I/O: ask the store for one of the fleet's probe slots.

        Returns:
            A trial permit (or the CLOSED permit when the record turned out CLOSED), or
            None: no slot, or no answer (the breaker then decides locally).
        """
        token = uuid.uuid4().hex
        cfg = breaker.config
        permit: Permit | None = None
        with self._io:
            was = breaker.view().state
            answer = self._call(
                breaker,
                "acquire_probe",
                token=token,
                max_calls=cfg.half_open_max_calls,
                lease_seconds=probe_lease(cfg.probe_lease),
                frozen=frozen(),
            )
            if answer is not None:
                # an empty store's CLOSED answer is not adopted: the open is written back
                if not self._forgot(breaker, answer, now):
                    if answer.result:  # the adopted round will count this probe
                        self._probe_versions[token] = answer.record.version
                    permit = breaker.apply_probe(answer, token, now)
                    self._rejoined(breaker, answer, was)
                if permit is None:
                    self.next_probe = now + min(1.0, cfg.probe_lease)
        return permit

    def finish_probe(self, breaker: SyncTarget, permit: Permit, outcome: str) -> bool:
        """Store I/O: settle a trial ``"success"``, ``"failure"`` or ``"abandon"`` in the shared
        round. Returns False when the breaker must settle it locally (a slot of its own
        record, not the store's; store down)."""
        if permit.token not in self._probe_versions or self.guard.down:
            return False
        cfg = breaker.config
        version = self._probe_versions.pop(permit.token, self.version)
        answer = self._run(
            breaker,
            "finish_probe",
            token=permit.token,
            version=version,
            outcome=outcome,
            max_calls=cfg.half_open_max_calls,
            **_timing(breaker),
            frozen=frozen(),
        )
        return answer is not None or outcome == "abandon"

    # ---------------------------------------------------------------- forces
    def _operator(self, breaker: SyncTarget, op: str, **kwargs: Any) -> Answer:
        try:
            answer: Answer = getattr(self.guard.store, op)(breaker.name, frozen=frozen(), **kwargs)
        except Exception as exc:  # a force never fails silently
            what = "reset" if op == "clear" else op
            raise StoreError(f"could not store the {what} of {breaker.name!r}: {describe(exc)}") from exc
        return answer

    def store_force(self, breaker: SyncTarget, mode: str, ttl_seconds: float, reason: str, actor: str | None) -> Answer:
        """Store I/O: write an operator's force. Raises StoreError when the store fails."""
        self.consult(breaker, breaker.clock.monotonic())  # so from_state is the shared state, not a stale local view
        return self._operator(breaker, "force", mode=mode, ttl_seconds=ttl_seconds, reason=reason, actor=actor)

    def store_release(self, breaker: SyncTarget) -> Answer:
        """Store I/O: remove a force from the record. Raises StoreError when the store fails."""
        self.consult(breaker, breaker.clock.monotonic())
        return self._operator(breaker, "release")

    def store_reset(self, breaker: SyncTarget) -> Answer:
        """Store I/O: put the shared record back to a fresh CLOSED one (the store's ``clear``),
        so every worker adopts the reset. Raises StoreError when the store fails, as a force does."""
        self.consult(breaker, breaker.clock.monotonic())
        answer = self._operator(breaker, "clear")
        with self._mutex:  # a trip still waiting for its write is undone by the reset
            self.pending, self._held, self._unpushed = None, [], None
        return answer

    def after_peer(self, breaker: SyncTarget) -> None:
        """A peer's decision was adopted from cluster propagation (state lock held).

        The shared record stays the authority: the next admission consults it and adopts
        it whatever its version (a force held there comes back at once), with no I/O here."""
        self.version = -1
        self.next_probe = float("-inf")
        breaker.schedule(float("-inf"))  # the breaker re-derives its hot-path permit itself

    def extra_snapshot(self) -> dict[str, Any]:
        """``store_available`` and ``shared_version`` for the snapshot."""
        return {"store_available": not self.guard.down, "shared_version": self.version}

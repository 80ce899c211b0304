"""A breaker whose state is shared through a store (database or Redis), so a fleet agrees.

The local state machine stays the source of every *decision about this worker's own
traffic*; the shared record is consulted only at the moments ST-3 lists: first use,
a local trip, a due probe, each trial outcome, a force, and at most every
``BALDUR_CB_SYNC_INTERVAL_SECONDS``. CLOSED calls and OPEN rejections inside those
bounds touch no store (one clock read and one attribute compare on top of the memory
path).

What a worker adopts from the store it does not publish (CB-14): events come only from
the worker whose store operation made the transition (``Answer.moved``/``lapsed``).

Store trouble (ST-4) never reaches a caller: the worker falls back to its local
judgement, :class:`StoreGuard` logs ``circuit_breaker.store_unavailable`` at most once per
interval per store, and when the store answers again the worker logs
``circuit_breaker.store_recovered``, pushes the trip it made meanwhile (refused when
forced) and adopts the shared record. Operator forces are the exception: their store
errors raise :class:`StoreError` (OP-4).

Implements ST-2, ST-3, ST-4, OP-4, CB-14 (shared part).
"""

from __future__ import annotations

import contextlib
import threading
import uuid
from typing import Any, Callable, MutableSequence

from .breaker import CLOSED, HALF_OPEN, OPEN, CircuitBreaker, Permit, validate_ttl
from .errors import CircuitOpenError, StoreError
from .events import (
    CallRejected,
    Event,
    ForceLapsed,
    Forced,
    Released,
    StateChanged,
    StoreProblem,
    TripBlocked,
)
from .states import Reason
from .stores.base import BLOCKED, TRIPPED, Answer, StateStore

__all__ = ["SharedCircuitBreaker", "StoreGuard"]


class StoreGuard:
    """Calls a store, turning every error into ``None`` plus rate-limited warnings (ST-4).

    One guard per store per process: ``circuit_breaker.store_unavailable`` is published at
    most once per ``interval`` seconds, ``circuit_breaker.store_recovered`` once when the
    store answers again.

    Args:
        store: the store.
        interval: seconds between two unavailability warnings (``BALDUR_STORE_WARNING_INTERVAL_SECONDS``).
        publish: where the StoreProblem events go.
        monotonic / wall: clock functions.
    """

    def __init__(self, store: StateStore, interval: Callable[[], float], publish: Callable[[Event], None],
                 monotonic: Callable[[], float], wall: Callable[[], float]) -> None:
        self.store = store
        self._interval = interval
        self._publish = publish
        self._mono = monotonic
        self._wall = wall
        self._lock = threading.Lock()
        self.down = False
        self._warned_at: float | None = None
        self.failures = 0

    def call(self, service: str, op: str, *args: Any) -> Answer | None:
        """Run ``store.<op>(service, *args)``; None when the store did not answer."""
        try:
            answer = getattr(self.store, op)(service, *args)
        except Exception as exc:  # ST-4: any store error, never the caller's problem
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
            self._publish(StoreProblem(service, self._wall(), recovered=False, error=_describe(exc)))

    def _recovered(self, service: str) -> None:
        with self._lock:
            if not self.down:
                return
            self.down = False
            self._warned_at = None
        self._publish(StoreProblem(service, self._wall(), recovered=True))


def _describe(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}"
    return text if len(text) <= 300 else text[:297] + "..."


class SharedCircuitBreaker(CircuitBreaker):
    _timed = True  # the hot-path permit holds until the next consult is due

    """:class:`CircuitBreaker` backed by a shared store (ST-2, ST-3, ST-4).

    Args:
        name, config, clock, bus: as for :class:`CircuitBreaker`.
        guard: the :class:`StoreGuard` of the configured store.
    """

    def __init__(self, name: str, config: Any, *, guard: StoreGuard, **kwargs: Any) -> None:
        super().__init__(name, config, **kwargs)
        self._guard = guard
        self.backend = guard.store.backend
        self._fast_permit = None  # the first call consults the store (ST-3: first use)
        self._version = -1  # record version last adopted; -1 = never consulted
        self._next_sync = float("-inf")
        self._next_probe = float("-inf")
        self._held: list[Event] = []  # events of a local trip awaiting the store's verdict
        self._pending_trip: str | None = None  # trigger of a trip not yet written to the store
        self._unpushed_trip: str | None = None  # trip decided while the store was down
        self._probe_versions: dict[str, int] = {}  # probe token -> record version it was admitted in
        # Serialises this process's store round trips for this breaker, so answers are
        # adopted in the order the store produced them (never a stale one over a newer).
        # Never held across the user's call; the state lock is taken inside it, never around it.
        self._io = threading.RLock()

    # ------------------------------------------------------------- admission
    def _acquire_slow(self) -> Permit:
        now = self._mono()
        until = self._reject_until
        if now < until and now < self._next_sync:
            raise self._reject_fast(now, until)  # ST-3: OPEN rejection, no round trip
        permit = self._closed_permit
        if permit is not None and self._forced is None and now < self._next_sync:
            return permit  # ST-3: CLOSED hot path, no round trip
        if now >= self._next_sync:
            self._consult(now)
        with self._lock:
            state = self._state
            if state is CLOSED:
                if self._forced == "closed" and now >= self._force_until:
                    pass  # lapse due: fall through to the local evaluation below
                else:
                    return self._closed_permit  # type: ignore[return-value]
        if self._guard.down:
            return super()._acquire_slow()  # ST-4: local judgement
        return self._admit_shared(now)

    def _admit_shared(self, now: float) -> Permit:
        reason = Reason.OPEN
        retry_after: float | None = None
        with self._lock:
            state = self._state
            due = (state is HALF_OPEN and now >= self._next_probe) or (
                state is OPEN and now >= (self._force_until if self._forced == "open" else self._open_until)
            ) or (state is CLOSED)
        if due:
            token = uuid.uuid4().hex
            cfg = self.config
            events = self._outbox
            permit: Permit | None = None
            with self._io:
                answer = self._guard.call(self.name, "acquire_probe", token, cfg.half_open_max_calls, cfg.probe_lease)
                if answer is not None:
                    with self._lock:
                        self._adopt(answer, self._mono(), events)
                        if answer.result:
                            self._trials += 1
                            self._probe_versions[token] = answer.record.version
                            permit = Permit(self._gen, trial=True, token=token)
                        elif self._state is CLOSED:
                            permit = self._closed_permit
                        else:
                            self._next_probe = now + min(1.0, cfg.probe_lease)
            if answer is None:
                return super()._acquire_slow()  # ST-4: local judgement
            self._publish(events)
            if permit is not None:
                return permit
        with self._lock:
            state = self._state
            if state is HALF_OPEN:
                reason = Reason.HALF_OPEN_FULL
            elif self._forced == "open":
                retry_after = max(0.0, self._force_until - now)
            else:
                retry_after = max(0.0, self._open_until - now)
            dry = self.config.dry_run
            if dry:
                self.dry_run_rejections += 1
        wall = self._clock.wall()
        if dry:
            self._publish([CallRejected(self.name, wall, reason=reason, state=state.value, dry_run=True)])
            return Permit(self._gen, dry_run=True)
        if self._bus.wants_rejections():
            self._publish([CallRejected(self.name, wall, reason=reason, state=state.value)])
        raise CircuitOpenError(self.name, reason, retry_after)

    # --------------------------------------------------------------- consults
    def _refresh_fast(self) -> None:
        """The hot-path permit, for CLOSED and unforced until the next consult is due (ST-3):
        while it is set, a shared breaker's CLOSED call costs what a memory one does."""
        self._fast_permit = (
            self._closed_permit
            if self._state is CLOSED and self._forced is None and self._mono() < self._next_sync
            else None
        )

    def _schedule_sync(self, deadline: float) -> None:
        self._next_sync = deadline
        self._sync_due = deadline

    def _consult(self, now: float) -> None:
        """Read the shared record (first use, sync interval), pushing an outage trip first."""
        interval = self.config.sync_interval
        retry_at = now + (interval if interval > 0 else 1.0)
        self._schedule_sync(now + (interval if interval > 0 else float("inf")))
        if self._unpushed_trip is not None:
            with self._lock:
                recovered = self._state is CLOSED
            if recovered:
                self._unpushed_trip = None  # the outage trip was undone locally: nothing to push
            else:
                if not self._push_trip(self._unpushed_trip):
                    self._schedule_sync(retry_at)
                return
        events = self._outbox
        with self._io:
            answer = self._guard.call(self.name, "load")
            if answer is None:
                self._schedule_sync(retry_at)  # try again later
                with self._lock:
                    self._refresh_fast()
                return
            with self._lock:
                self._adopt(answer, self._mono(), events)
                self._refresh_fast()
        self._publish(events)

    def _push_trip(self, trigger: str) -> bool:
        """Write a trip decided during an outage (ST-4); a force in the store refuses it."""
        events = self._outbox
        with self._io:
            answer = self._guard.call(self.name, "trip", trigger, self.config.recovery_timeout)
            if answer is None:
                return False
            self._unpushed_trip = None
            with self._lock:
                if answer.result == BLOCKED:
                    events.append(TripBlocked(self.name, self._clock.wall(), forced=answer.record.forced or "", trigger=trigger))
                self._adopt(answer, self._mono(), events, force=True)
        self._publish(events)
        return True

    def sync(self) -> None:
        """Consult the shared record now, whatever the sync interval says."""
        self._consult(self._mono())

    # -------------------------------------------------------------- adoption
    def _adopt(self, answer: Answer, now: float, events: MutableSequence[Event], *, force: bool = False) -> None:
        """Make the local state follow the shared record (lock held). Publishes only the
        transitions this worker's own operation made (``moved``/``lapsed``)."""
        record = answer.record
        if answer.lapsed is not None:
            events.append(
                ForceLapsed(self.name, self._clock.wall(), previous=answer.lapsed, from_state=self._state.value, to_state=record.state)
            )
        if record.version == self._version and not force:
            return
        self._version = record.version
        offset = now - answer.now  # store time -> this process's monotonic time
        before = self._state
        if record.forced is not None:
            self._forced = record.forced
            self._force_until = (record.force_expires_at or answer.now) + offset
            self._force_expires_at = record.force_expires_at
            self._force_reason = record.force_reason
            self._force_actor = record.force_actor
        else:
            self._clear_force()
        target = {"closed": CLOSED, "open": OPEN, "half_open": HALF_OPEN}[record.state]
        if target is not before or target is not CLOSED:
            self._new_generation()
        self._state = target
        self._last_trigger = record.trigger
        if target is CLOSED:
            if before is not CLOSED:
                self._consecutive = 0
                self._window.clear()
            if self._closed_permit is None or self._closed_permit.generation != self._gen:
                self._closed_permit = Permit(self._gen)
            self._opened_at = None
        else:
            self._closed_permit = None
            self._opened_at = record.opened_at
            if record.open_until is not None:
                self._open_until = record.open_until + offset
            if target is OPEN and not self.config.dry_run:
                self._reject_until = self._force_until if record.forced == "open" else self._open_until
        self._refresh_fast()
        self._next_probe = float("-inf")
        if answer.moved and answer.lapsed is None and record.state != before.value:
            events.append(
                StateChanged(self.name, self._clock.wall(), from_state=before.value, to_state=record.state,
                             trigger=record.trigger or "", dry_run=self.config.dry_run)
            )

    # ----------------------------------------------------------------- trips
    def _trip(self, now: float, trigger: str, events: MutableSequence[Event]) -> None:
        # Stop local traffic at once; the store decides who publishes (see _publish).
        held: list[Event] = []
        self._to_open(now, trigger, held)
        self._held = held
        self._pending_trip = trigger

    def _publish(self, events: Any = ()) -> None:
        with self._lock:
            trigger, self._pending_trip = self._pending_trip, None
            held, self._held = self._held, []
        if trigger is not None:
            # the store decides who publishes a local trip: TRIPPED -> us, BLOCKED -> trip_blocked,
            # ALREADY -> nobody (a peer decided it); unreachable -> our local decision stands (ST-4)
            with self._io:
                answer = self._guard.call(self.name, "trip", trigger, self.config.recovery_timeout)
                with self._lock:
                    if answer is None:
                        self._unpushed_trip = trigger
                        self._outbox.extend(held)
                    else:
                        if answer.result == TRIPPED:
                            self._outbox.extend(held)
                        elif answer.result == BLOCKED:
                            self._outbox.append(
                                TripBlocked(self.name, self._clock.wall(), forced=answer.record.forced or "", trigger=trigger)
                            )
                        self._adopt(answer, self._mono(), self._outbox, force=True)
        super()._publish(events)

    # ---------------------------------------------------------------- trials
    def _record_trial(self, permit: Permit, ok: bool, now: float) -> None:
        if permit.token is None or self._guard.down:
            return super()._record_trial(permit, ok, now)
        self._finish(permit, "success" if ok else "failure")

    def record_ignored(self, permit: Permit) -> None:
        if permit.trial and permit.token is not None and not self._guard.down:
            self._finish(permit, "abandon")
            return
        super().record_ignored(permit)

    def _finish(self, permit: Permit, outcome: str) -> None:
        cfg = self.config
        events = self._outbox
        with self._io:
            answer = self._guard.call(
                self.name, "finish_probe", permit.token, self._version_for(permit), outcome, cfg.half_open_max_calls,
                cfg.recovery_timeout,
            )
            if answer is not None:
                with self._lock:
                    self._adopt(answer, self._mono(), events)
        if answer is None:
            if outcome != "abandon":
                super()._record_trial(permit, outcome == "success", self._mono())
            return
        self._publish(events)

    @contextlib.contextmanager
    def _lock_after_store(self, op: str, *args: Any):
        """Run an operator's store operation (errors raise StoreError, OP-4), then hold the lock."""
        try:
            answer = getattr(self._guard.store, op)(self.name, *args)
        except Exception as exc:  # OP-4: a force never fails silently
            raise StoreError(f"could not store the {op} of {self.name!r}: {_describe(exc)}") from exc
        with self._lock:
            yield answer

    def _version_for(self, permit: Permit) -> int:
        return self._probe_versions.pop(permit.token, self._version)  # type: ignore[arg-type]

    def report_rate_limit(self, retry_after: Any = None) -> None:
        """RL-9 on a shared store: while the fleet probes (HALF_OPEN), a 429 seen outside a
        protected call fails the shared round like a failed probe, when a slot is free."""
        if self.state is HALF_OPEN and not self._guard.down:
            try:
                permit = self._admit_shared(self._mono())
            except CircuitOpenError:
                self.note_attempt(rate_limited=True, retry_after=retry_after)  # no free slot: a sighting only
                return
            self.record_failure(permit, rate_limited=True, retry_after=retry_after)
            return
        super().report_rate_limit(retry_after)

    # ---------------------------------------------------------------- reading
    @property
    def state(self):  # type: ignore[override]
        now = self._mono()
        if now >= self._next_sync or (self._forced is not None and now >= self._force_until):
            self._consult(now)
        with self._lock:
            state = self._state
            due = state is OPEN and self._forced is None and now >= self._open_until
        if due and not self._guard.down:
            events = self._outbox
            with self._io:
                answer = self._guard.call(self.name, "sweep")
                if answer is not None:
                    with self._lock:
                        self._adopt(answer, self._mono(), events)
            self._publish(events)
        return super().state

    def snapshot(self) -> dict[str, Any]:
        self.state  # noqa: B018 - consult and sweep first
        snap = super().snapshot()
        snap["store_available"] = not self._guard.down
        snap["shared_version"] = self._version
        return snap

    # ----------------------------------------------------------------- forces
    def _force(self, mode: str, ttl_minutes: float | None, reason: str, actor: str | None) -> None:
        ttl = validate_ttl(ttl_minutes, self.config.default_ttl_minutes)
        self._consult(self._mono())  # so from_state is the shared state, not a stale local view
        events = self._outbox
        with self._io, self._lock_after_store("force", mode, ttl * 60.0, reason or "", actor) as answer:
            before = self._state
            self._adopt(answer, self._mono(), [], force=True)
            events.append(
                Forced(self.name, self._clock.wall(), mode=mode, from_state=before.value, to_state=self._state.value,
                       ttl_minutes=ttl, expires_at=self._force_expires_at or 0.0, reason=reason or "", actor=actor,
                       dry_run=self.config.dry_run)
            )
        super()._publish(events)

    def release(self, actor: str | None = None, reason: str = "") -> bool:
        self._consult(self._mono())  # so from_state is the shared state, not a stale local view
        events = self._outbox
        with self._io, self._lock_after_store("release") as answer:
            before = self._state
            if answer.lapsed is not None:
                events.append(ForceLapsed(self.name, self._clock.wall(), previous=answer.lapsed, from_state=before.value,
                                          to_state=answer.record.state))
            self._adopt(answer, self._mono(), [], force=True)
            if answer.result is not None:
                events.append(Released(self.name, self._clock.wall(), previous=answer.result, from_state=before.value,
                                       to_state=self._state.value, actor=actor, reason=reason))
        super()._publish(events)
        return answer.result is not None

    def _evaluate(self, now: float, events: MutableSequence[Event]) -> None:
        # Lapses and recovery are decided by store operations (they normalise first);
        # locally only while the store is down.
        if self._guard.down:
            super()._evaluate(now, events)


def attach(breaker: CircuitBreaker, guard: StoreGuard) -> SharedCircuitBreaker:
    """Turn an existing breaker into a shared one in place (decorators keep their reference).

    Local counts are kept; the first call consults the store (ST-3: first use).
    """
    if isinstance(breaker, SharedCircuitBreaker):
        breaker._guard = guard
        breaker.backend = guard.store.backend
        breaker._next_sync = breaker._sync_due = float("-inf")
        breaker._version = -1
        return breaker
    with breaker._lock:
        breaker.__class__ = SharedCircuitBreaker
        shared: SharedCircuitBreaker = breaker  # type: ignore[assignment]
        shared._guard = guard
        shared.backend = guard.store.backend
        shared._version = -1
        shared._next_sync = shared._sync_due = float("-inf")
        shared._next_probe = float("-inf")
        shared._held = []
        shared._pending_trip = None
        shared._unpushed_trip = None
        shared._probe_versions = {}
        shared._io = threading.RLock()
        shared._fast_permit = None
    return shared


def detach(breaker: CircuitBreaker) -> CircuitBreaker:
    """Turn a shared breaker back into a process-local one (backend set to memory)."""
    if not isinstance(breaker, SharedCircuitBreaker):
        return breaker
    with breaker._lock:
        breaker.__class__ = CircuitBreaker  # type: ignore[assignment]
        breaker.backend = "memory"
        breaker._sync_due = float("inf")
        breaker._refresh_fast()
    return breaker

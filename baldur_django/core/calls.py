"""Calls through a breaker: admission, and the recording of each call's outcome.

:class:`BreakerCore` is the whole internal breaker: the state and transitions of
:class:`~baldur_django.core.machine.Machine`, the store seam of
:class:`~baldur_django.core.shared.SharedMachine`, and here the ask-then-record steps.
``acquire()`` either raises :class:`CircuitOpenError` or returns a :class:`Permit` stamped
with the state generation; the caller runs its own code with no lock held and reports back
with ``record_success`` / ``record_failure`` / ``record_ignored``. An outcome whose
generation is no longer current is dropped. The runner, the retry engine, the hot-path
wrappers and the inbound shells work on this object; users hold the
:class:`~baldur_django.core.breaker.CircuitBreaker` that owns it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, MutableSequence
from typing import Any, cast

from . import rules, steps
from .classify import parse_retry_after
from .emergency import frozen
from .errors import CircuitOpenError, new_open_error
from .events import CallRejected, Event, RateLimitStorm
from .machine import local_token
from .nesting import RECORDED
from .permit import Permit
from .shared import SharedMachine
from .states import CircuitState, Reason, Trigger

__all__ = ["BreakerCore"]

CLOSED = CircuitState.CLOSED
OPEN = CircuitState.OPEN
HALF_OPEN = CircuitState.HALF_OPEN


class BreakerCore(SharedMachine):
    """One breaker's state, transitions and call steps, as its parts and the package's own
    modules use them (users call the :class:`~baldur_django.core.breaker.CircuitBreaker`)."""

    __slots__ = ()

    def acquire(self) -> Permit:
        """Ask to make one call.

        Returns:
            A :class:`Permit` to pass to one of the ``record_*`` methods.

        Raises:
            CircuitOpenError: OPEN (``reason="open"``, ``retry_after`` seconds until a probe
                or until a force lapses) or HALF_OPEN with every trial slot taken
                (``reason="half_open_full"``). Never raised in dry-run.
        """
        permit = self.fast_permit
        if permit is not None and not (self.timed and self.mono() >= self.sync_due):
            return permit
        return self.acquire_slow()

    def acquire_slow(self, *, metered: bool = True) -> Permit:
        """Admission when the lock-free CLOSED permit does not apply (the second of the two
        methods the hot path binds; :meth:`acquire` is the whole of the first).

        May read or write the shared record (a due consult or a due probe).

        Args:
            metered: False when the admission is not a request (a 429 report looking for
                a probe slot): a rejection is then not counted as blocked.

        Returns:
            A permit. Raises CircuitOpenError as :meth:`acquire` does.
        """
        now = self.mono()
        base = self.timing_permit
        if base is not None and now < self.sync_due:
            # CLOSED with the slow-call trigger on; lock-free for the same reason as
            # the hot path's permit (a racing trip leaves this copy's generation stale)
            return Permit(base.generation, started=now)
        until = self.reject_until
        if now < until and now < self.sync_due:
            raise self._reject_fast(now, until, metered)  # no lock, no round trip
        sync = self.sync
        if now >= self.sync_due:
            if sync.known:
                sync.consult(self, now)
            else:  # no call is admitted on a local state the shared record never set
                sync.first_use(self)
                now = self.mono()
        if sync.probe_due(self, now):
            permit = sync.acquire_probe(self, now)
            if permit is not None:
                return permit
        return self._admit(now, metered)

    def ready_permit(self) -> Permit | None:
        """The CLOSED lock-free permit when it may be used now, else None (no lock, no I/O).

        For an async caller that wants to skip awaiting :meth:`aacquire` on the hot path:
        a permit returned here is the one :meth:`aacquire` would return at once; None means
        "await :meth:`aacquire`" (it decides, off the loop where the store may be reached).

        Returns:
            The CLOSED permit, or None. Raises nothing.
        """
        permit = self.fast_permit
        if permit is not None and not (self.timed and self.mono() >= self.sync_due):
            return permit
        return None

    async def aacquire(self) -> Permit:
        """:meth:`acquire` for coroutines: the lock-free paths run inline; a shared breaker's
        admission that may reach its store runs in a worker thread, so the event loop never
        waits on store I/O.

        Returns:
            A permit. Raises CircuitOpenError as :meth:`acquire` does.
        """
        permit = self.ready_permit()
        if permit is not None:
            return permit
        if self.timed:
            now = self.mono()
            if not (now < self.reject_until and now < self.sync_due):  # else a lock-free rejection
                return cast(Permit, await asyncio.to_thread(self.acquire_slow))
        return self.acquire_slow()

    async def off_loop(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run ``fn(*args)`` so that a shared store's I/O never blocks the running event loop:
        in a worker thread for a shared breaker, inline for a process-local one (no I/O)."""
        if self.timed:
            return await asyncio.to_thread(fn, *args)
        return fn(*args)

    def read_state(self) -> CircuitState:
        """The state now, a due force lapse and recovery timeout applied (no store I/O)."""
        if self.fast_permit is not None:
            return CLOSED
        events = self.outbox
        with self.lock:
            self.evaluate(self.mono(), events)
            state = self.state
        self.publish(events)
        return state

    def refresh(self) -> CircuitState:
        """Store I/O when due: consult the shared record (when a consult or a force lapse is
        due) and sweep an OPEN record past its recovery timeout; then :meth:`read_state`, with
        a trip left pending written back first. Process-local: just :meth:`read_state`."""
        self.sync.refresh(self, self.mono())
        if self.sync.pending is not None:
            self.settle(())
        return self.read_state()

    @property
    def shared(self) -> bool:
        """True while the breaker meets a shared store (its slow paths may do store I/O, so
        coroutines run them off the event loop)."""
        return self.timed

    def healthy_success(self, permit: Permit) -> bool:
        """Count a success on the lock-free healthy lane when it applies (the window full and
        clean, the cascade's second not over); True when counted, False when the caller must
        :meth:`record_success`."""
        if permit is self.healthy_permit:
            cascade = self.cascade
            if self.mono() < cascade.bucket_end:
                next(cascade.counter)
                return True
        return False

    def record_mark(self) -> int:
        """The number of outcomes counted so far off the lock-free healthy lane: read when a
        call begins, and given to :func:`recorded_since` before its outcome is recorded."""
        return self.seq

    def note_recorded(self) -> None:
        """Note in this thread or task that an outcome of this breaker was counted elsewhere
        (a worker thread recording a trial for a coroutine), as :meth:`_mark` does."""
        with self.lock:
            RECORDED.set((self, self.seq))

    def _reject_fast(self, now: float, until: float, metered: bool = True) -> CircuitOpenError:
        """OPEN inside its deadline: the rejection needs no lock. The event is built
        only when a listener wants plain rejections."""
        if metered:
            next(self.blocked_open)
        if self.bus.wants_rejections():
            self.publish([CallRejected(self.name, self.clock.wall(), Reason.OPEN, OPEN.value, False, until - now)])
        return new_open_error(self.name, Reason.OPEN, until - now)  # C alone, no Python __init__

    def _admit(self, now: float, metered: bool = True) -> Permit:
        """The one admission decision (lock held inside): CLOSED passes, HALF_OPEN takes a
        local trial slot when this process judges alone, anything else is rejected with
        its reason, or let through and counted in dry-run."""
        events = self.outbox
        with self.lock:
            self.evaluate(now, events)
            state = self.state
            permit, reason, retry_after = self._decide(now, state)
            if permit is None:
                if self.config.dry_run:
                    self.dry_run_rejections += 1
                    permit = Permit(self.generation, dry_run=True)
                    events.append(
                        CallRejected(self.name, self.clock.wall(), reason=reason, state=state.value, dry_run=True)
                    )
                elif metered:
                    self.count_blocked(reason)
        if permit is None:
            if self.bus.wants_rejections():
                events.append(CallRejected(self.name, self.clock.wall(), reason, state.value, False, retry_after))
            self.settle(events)
            raise CircuitOpenError(self.name, reason, retry_after)
        if events:
            self.settle(events)
        return permit

    def _decide(self, now: float, state: CircuitState) -> tuple[Permit | None, str, float | None]:
        """``(permit, reason, retry_after)`` for one admission in *state* (lock held): a permit,
        or None with the reason of the refusal and the seconds until a probe (or None)."""
        started = now if self.timing else None
        if state is CLOSED:
            return (self.closed_permit if started is None else Permit(self.generation, started=started)), "", None
        if state is HALF_OPEN:
            # the fleet's slots are the store's while it answers: none here
            max_calls = self.config.half_open_max_calls if self.sync.local_judgement() else 0
            token = local_token()
            outcome = self.apply_step(steps.AcquireProbe(token, max_calls, float("inf")), now, None)
            if outcome.reason is not None:
                return None, outcome.reason, None  # frozen, or half_open_full
            return Permit(self.generation, trial=True, started=started, token=token), "", None
        until = self.deadline()
        if rules.open_refusal(forced=self.forced, now=now, until=until, frozen=frozen()) == Reason.FROZEN:
            return None, Reason.FROZEN, None  # held OPEN past its recovery timeout
        self.hold_open_until(until)
        return None, Reason.OPEN, max(0.0, until - now)

    def record_success(self, permit: Permit, *, count_attempt: bool = True) -> None:
        """Record that the call admitted by *permit* succeeded.

        Args:
            permit: from :meth:`acquire`.
            count_attempt: also count the call in the 429 cascade window (False when the
                retry stage already counted each attempt with :meth:`note_attempt`).
        """
        if permit is self.healthy_permit:
            # Healthy CLOSED, without the lock: this success changes nothing but one
            # cascade call, counted by an atomic next(); rolling to a new second locks.
            if not count_attempt:
                with self.lock:
                    self.m_uncounted += 1  # a success the cascade does not count
                return
            cascade = self.cascade
            if self.mono() < cascade.bucket_end:
                next(cascade.counter)
                return
        if permit is self.closed_permit:
            lock = self.lock
            lock.acquire()
            try:
                if permit is self.closed_permit and self.lanes and not self.window.marked:  # type: ignore[union-attr]  # lanes: a CountWindow
                    self.consecutive = 0
                    window = self.window
                    if window.calls < window.size:
                        window.calls += 1
                    if window.calls == window.size:
                        self.healthy_permit = permit
                        self.quiet_permit = permit if permit is self.fast_permit else None
                    if count_attempt:
                        now = self.mono()
                        self.cascade.add(now, False)
                        if now >= self.sync_due:
                            self.quiet_permit = self.fast_permit = None  # a shared store's consult is due
                    else:
                        self.m_uncounted += 1
                    self.mark()
                    return
            finally:
                lock.release()
        self._record(permit, ok=True, count_attempt=count_attempt)

    def record_failure(
        self,
        permit: Permit,
        *,
        rate_limited: bool = False,
        retry_after: Any = None,
        count_attempt: bool = True,
    ) -> None:
        """Record that the call admitted by *permit* failed.

        Args:
            permit: from :meth:`acquire`.
            rate_limited: the failure was a 429 sighting; also feeds the cascade
                and starts the cooldown when *count_attempt*.
            retry_after: the raw ``Retry-After`` (seconds or header text) for the cooldown.
            count_attempt: False when the retry stage already noted each attempt.
        """
        if permit.dry_run:
            with self.lock:
                self.count_failure(rate_limited)  # a call let through by dry-run counts
            return
        if count_attempt and rate_limited:
            self.note_attempt(rate_limited=True, retry_after=retry_after, evaluate=False)
            count_attempt = False
        self._record(permit, ok=False, count_attempt=count_attempt, rate_limited=rate_limited)

    def record_ignored(self, permit: Permit) -> None:
        """The call ended in an ignored exception, a ``BaseException`` that is not an
        ``Exception``, or never reached the dependency: neither success nor failure. A trial
        gives its slot back; with a shared store, to the fleet's round."""
        with self.lock:
            self.m_ignored += 1
        self.give_back(permit)

    def give_back(self, permit: Permit) -> None:
        """Return the trial slot *permit* holds without recording an outcome.

        For a trial whose call ended without its outcome reaching the locked path (a success
        taken by the healthy lane after a state change counted itself there): the slot comes
        back, with a shared store to the fleet's round, and no outcome is counted twice. A
        permit that is not a trial is left alone.
        """
        if not permit.trial:
            return
        with self.lock:
            self.mark()  # settled, for a call around a nested one
        if self.sync.finish_probe(self, permit, "abandon"):
            return
        event = steps.FinishProbe(permit.token, permit.generation, "abandon", self.config.half_open_max_calls)
        with self.lock:
            self.apply_step(event, self.mono(), None)

    def _record(self, permit: Permit, *, ok: bool, count_attempt: bool, rate_limited: bool = False) -> None:
        """One outcome off the lanes (a failure comes only from :meth:`record_failure`, and
        is counted here as its final outcome)."""
        if permit.dry_run:  # record_failure() counted a dry-run failure already
            if ok:
                with self.lock:
                    self.m_uncounted += 1  # a success outside the cascade's count
            return
        now = self.mono()
        started = permit.started
        # only while the slow-call trigger is on (a duration and a rate threshold, both > 0)
        slow = started is not None and self.timing and now - started >= self.config.slow_call_duration
        if permit.trial:
            with self.lock:
                self._count_outcome(ok, count_attempt, rate_limited, now)
            self._record_trial(permit, ok and not slow, now, slow)
            return
        events = self.outbox
        with self.lock:
            self._count_outcome(ok, count_attempt, rate_limited, now)
            if now >= self.sync_due:
                self.quiet_permit = self.fast_permit = None  # a shared store's consult is due
            if permit.generation == self.generation and self.state is CLOSED:  # else stale: dropped
                self._closed_outcome(ok, slow, now, events)
            if rate_limited and self.state is CLOSED:
                self.check_cascade(now, events)
        self.settle(events)

    def _count_outcome(self, ok: bool, count_attempt: bool, rate_limited: bool, now: float) -> None:
        """Number one outcome and count it for the metrics and the cascade (lock held)."""
        self.mark()
        if ok:
            self.m_uncounted += not count_attempt  # a success outside the cascade's count
        else:
            self.count_failure(rate_limited)
        if count_attempt:
            self.cascade.add(now, False)
            if not ok:
                self.m_noted += 1  # a cascade call that is not a success

    def _closed_outcome(self, ok: bool, slow: bool, now: float, events: MutableSequence[Event]) -> None:
        """A current CLOSED outcome (lock held): the counts, then the triggers (none while forced)."""
        window = self.window
        if ok and not slow:
            self.consecutive = 0
            window.add(False, False, now)
            if self.lanes and not window.marked and window.calls == window.size:  # type: ignore[union-attr]  # lanes: a CountWindow
                healthy = self.healthy_permit = self.closed_permit
                self.quiet_permit = healthy if healthy is self.fast_permit else None
        else:
            self.invalidate()
            self.consecutive = 0 if ok else self.consecutive + 1  # a slow success is still a success
            window.add(not ok, slow, now)
        if self.forced is None:
            trigger = self._closed_trigger(now, failed=not ok)
            if trigger is not None:
                self.trip(now, trigger, events)

    def _record_trial(self, permit: Permit, ok: bool, now: float, slow: bool = False) -> None:
        """A trial's outcome: N successes close, one failure reopens; stale ones drop.
        A slow trial is a failed one, reopening with trigger ``slow_call_rate``.
        With a shared store the fleet's round decides (one store operation)."""
        outcome = "slow" if slow else ("success" if ok else "failure")
        if self.sync.finish_probe(self, permit, outcome):
            return
        events = self.outbox
        event = steps.FinishProbe(permit.token, permit.generation, outcome, self.config.half_open_max_calls)
        with self.lock:
            held: list[Event] = []
            if self.apply_step(event, now, held).result == "open":
                # a re-open is a trip like any other: with a shared store it is
                # queued for write-back, and pushed once the store answers again
                self.sync.trip_decided(self, self.trigger or rules.trial_trigger(outcome), held, events)
            else:
                events.extend(held)
        self.settle(events)

    def note_attempt(self, *, rate_limited: bool = False, retry_after: Any = None, evaluate: bool = True) -> None:
        """Count one attempt at the dependency in the cascade window.

        A 429 sighting (*rate_limited*) also starts or extends the cooldown from
        *retry_after* and may open the breaker through the cascade.
        Outcomes for the breaker's own triggers are recorded separately.
        """
        now = self.mono()
        events = self.outbox
        with self.lock:
            self.cascade.add(now, rate_limited)
            self.m_noted += 1  # an attempt, never a success of its own
            if rate_limited:
                cfg = self.config
                seconds = parse_retry_after(
                    retry_after, default=cfg.default_cooldown, cap=cfg.max_cooldown, now_wall=self.clock.wall()
                )
                until = now + seconds
                if until > self.cooldown_until:
                    first = not self.cooldown_until
                    self.cooldown_until = until
                    if first:
                        self.epoch = object()  # retry policies' first attempts are gated from now on
                if evaluate and self.state is CLOSED:
                    self.check_cascade(now, events)
        self.settle(events)

    def report_rate_limit(self, retry_after: Any = None) -> None:
        """A 429 seen outside any protected call: a sighting counted as a call, a
        cooldown, and a failure of the current state (CLOSED: a recorded failure;
        HALF_OPEN: a failed probe; OPEN: nothing more). While a fleet probes through a
        shared store, the failure takes one of the round's slots (none free: a sighting only).
        """
        state = self.refresh()  # applies a due recovery timeout first
        if state is HALF_OPEN and self.sync.shares_probes():
            try:
                permit = self.acquire_slow(metered=False)
            except CircuitOpenError:
                with self.lock:
                    self.m_rate_limited += 1  # a rate-limited call all the same
                self.note_attempt(rate_limited=True, retry_after=retry_after)
                return
            self.record_failure(permit, rate_limited=True, retry_after=retry_after)
            return
        with self.lock:
            state, gen = self.state, self.generation
            if state is OPEN:
                self.m_rate_limited += 1
        if state is OPEN:
            self.note_attempt(rate_limited=True, retry_after=retry_after)
            return
        permit = Permit(gen, trial=state is HALF_OPEN)
        if state is CLOSED and self.closed_permit is not None and self.closed_permit.generation == gen:
            permit = self.closed_permit
        self.record_failure(permit, rate_limited=True, retry_after=retry_after)

    def note_dry_run_refusal(self, remaining: float) -> None:
        """Dry-run: a cooldown refusal that did not happen; counted and logged."""
        with self.lock:
            self.dry_run_rejections += 1
        self.publish(
            [CallRejected(self.name, self.clock.wall(), reason="cooldown", state=self.state.value, dry_run=True)]
        )

    def cooldown_remaining(self) -> float:
        """Seconds left on this service's 429 cooldown in this process (0.0 when none)."""
        remaining = self.cooldown_until - self.mono()
        return remaining if remaining > 0 else 0.0

    def _closed_trigger(self, now: float, *, failed: bool) -> str | None:
        """The trigger one recorded CLOSED outcome fires, or None (lock held): the consecutive
        count, then the rates over the window, the failure rate before the
        slow-call rate (gated by ``minimum_calls`` whatever the failure-rate setting).
        The order is :func:`rules.closed_trigger`'s."""
        cfg = self.config
        window = self.window
        if failed and self.consecutive >= cfg.failure_threshold:
            rate = slow = False  # decided already: the rates need not be read
        else:
            window.advance(now)
            rate = window.rate_reached(cfg.failure_rate_threshold, cfg.minimum_calls)
            slow = self.timing and window.slow_rate_reached(cfg.slow_call_rate_threshold, cfg.minimum_calls)
        return rules.closed_trigger(
            failed=failed,
            consecutive=self.consecutive,
            failure_threshold=cfg.failure_threshold,
            rate_reached=rate,
            slow_rate_reached=slow,
        )

    def check_cascade(self, now: float, events: MutableSequence[Event]) -> None:
        """Trip on the 429 cascade when :func:`rules.cascade_rate` says so (lock held)."""
        cfg = self.config
        calls, sightings = self.cascade.totals(now)
        rate = rules.cascade_rate(
            state=self.state.value,
            forced=self.forced,
            calls=calls,
            sightings=sightings,
            threshold=cfg.cascade_threshold,
            min_calls=cfg.cascade_min_calls,
            min_ratio=cfg.cascade_min_ratio,
        )
        if rate is not None:
            events.append(RateLimitStorm(self.name, self.clock.wall(), count=sightings, calls=calls, rate=rate))
            self.trip(now, Trigger.RATE_LIMIT_CASCADE, events)

    def trip(self, now: float, trigger: str, events: MutableSequence[Event]) -> None:
        """An automatic trigger fired (lock held): a :class:`~baldur_django.core.steps.Trip`
        step opens at once for this process's traffic (unless Level 3 or a force holds it);
        the strategy decides when the events are published (a shared store first asks
        the store who decided the trip)."""
        held: list[Event] = []
        if self.apply_step(steps.Trip(trigger), now, held).result == rules.TRIPPED:
            self.sync.trip_decided(self, trigger, held, events)

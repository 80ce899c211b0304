"""The breaker state machine: ask permission, then record the outcome.

``acquire()`` either raises :class:`CircuitOpenError` or returns a :class:`Permit`
stamped with the state generation; the caller runs its own code with no lock held and
reports back with ``record_success`` / ``record_failure`` / ``record_ignored``. An outcome
whose generation is no longer current is dropped. Every mutation happens under
one short ``threading.Lock``; events are published after it is released, once per
transition.

A breaker holds one strategy for meeting a shared store (``sync.py``): :data:`LOCAL`
for process-local breakers, a :class:`StoreSync` once ``registry.set_store()`` (or
:meth:`CircuitBreaker.use_store`) gives it one. The decisions below are written once
and the strategy's hooks say when the shared record is read or written.

The lock-free fast paths live in :mod:`baldur_django.core.hotpath` and read five
attributes of this class (``_fast_permit``, ``_healthy_permit``, ``_quiet_permit``,
``_reject_until``, ``_sync_due``) plus the cascade counter. The rule that keeps them sound: every path that
records a failure or changes state goes through :meth:`CircuitBreaker._invalidate`
first, which clears the hot-path permits before anything else is touched.
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import itertools
import math
import operator
import threading
import weakref
from collections.abc import Awaitable, Callable, Collection, MutableSequence
from typing import TYPE_CHECKING, Any, NamedTuple, cast

from . import rules
from .classify import parse_retry_after
from .clock import SYSTEM_CLOCK, Clock
from .config import BreakerConfig
from .emergency import frozen
from .errors import CircuitOpenError, ConfigError, awaitable_refused, is_awaitable, new_open_error
from .events import (
    CallRejected,
    Event,
    EventBus,
    Forced,
    ForceLapsed,
    RateLimitStorm,
    Released,
    Reset,
    StateChanged,
    TripBlocked,
)
from .events import bus as default_bus
from .knobs import MAX_LIFETIME_MINUTES
from .names import check_name
from .nesting import RECORDED, Mark, entering, recorded_since, register
from .rules import next_open
from .states import CircuitState, Reason, Trigger, check_transition
from .stores.base import Answer, Record
from .sync import LOCAL, LocalSync, StoreGuard, StoreSync
from .window import CountWindow, SecondBuckets, TimeWindow, _count_of

if TYPE_CHECKING:  # pragma: no cover
    from .retry import Outcome, RetryPolicy

__all__ = [
    "Permit",
    "CircuitBreaker",
    "validate_ttl",
    "recorded_since",
    "trial_in_progress",
    "enter_trial",
    "leave_trial",
    "PEER_APPLIED",
    "PEER_UNCHANGED",
    "PEER_BLOCKED",
    "PEER_LIFTED",
    "METRIC_COUNTS",
]

CLOSED = CircuitState.CLOSED
OPEN = CircuitState.OPEN
HALF_OPEN = CircuitState.HALF_OPEN

# What CircuitBreaker.apply_peer did with a peer's decision.
PEER_APPLIED = "applied"  # the breaker moved to the peer's state
PEER_UNCHANGED = "unchanged"  # it was in that state already
PEER_BLOCKED = "blocked"  # an OPEN met a local forced closed (like a trip meeting a force)
PEER_LIFTED = "lifted"  # a CLOSED was applied over a local forced open (the documented hazard)

#: ``(group, key)`` of each count :meth:`CircuitBreaker.metric_values` returns, in its
#: order: the keys of :meth:`CircuitBreaker.metrics`' ``calls`` and ``blocked`` dicts.
METRIC_COUNTS: tuple[tuple[str, str], ...] = (
    ("calls", "success"),
    ("calls", "failure"),
    ("calls", "ignored"),
    ("calls", "rate_limited"),
    ("blocked", Reason.OPEN),
    ("blocked", Reason.HALF_OPEN_FULL),
    ("blocked", Reason.FROZEN),
)


# Nested use of one breaker is one call: the record-number context variable, the Nest
# marks and the stack walk that finds an outer call live in nesting.py; _TRIAL is set
# only while a HALF_OPEN trial runs (never on the CLOSED hot path).
#: ``(breaker, permit)``: the trial this thread or task is running through a breaker.
_TRIAL: contextvars.ContextVar[tuple[Any, Permit] | None] = contextvars.ContextVar("baldur_trial", default=None)


#: reads the breaker of a wrapper's frame from its locals (the closure's ``self``)
_self_of = operator.itemgetter("self")


def trial_in_progress(breaker: CircuitBreaker) -> Permit | None:
    """The permit this thread or task already holds for *breaker*, or None: a trial's (a
    call nested in a trial runs on it, neither taking a slot nor refused), or the one a call
    entered again under its Nest was admitted with (see core/nesting.py)."""
    running = _TRIAL.get()
    if running is not None and running[0] is breaker:
        return running[1]
    admitted: Permit | None = entering(breaker)  # a call entered again under its Nest keeps its permit
    return admitted


def enter_trial(breaker: CircuitBreaker, permit: Permit) -> contextvars.Token[tuple[Any, Permit] | None]:
    """Mark *permit*'s trial as running in this thread or task; pass the token to :func:`leave_trial`."""
    return _TRIAL.set((breaker, permit))


def leave_trial(token: contextvars.Token[tuple[Any, Permit] | None]) -> None:
    """End what :func:`enter_trial` marked."""
    _TRIAL.reset(token)


class Permit:
    """Permission for one call, stamped with the breaker's state generation.

    Attributes:
        generation (int): the breaker's generation when the call was admitted.
        trial (bool): True for a HALF_OPEN probe.
        dry_run (bool): True when dry-run let through a call it would have rejected; its
            outcome is never recorded.
        token (str | None): a shared store's probe lease, for trials.
        started (float | None): monotonic admission time (seconds) while the slow-call
            trigger is on: the outcome is slow when it comes that long after.
    """

    __slots__ = ("generation", "trial", "dry_run", "token", "started")

    def __init__(
        self,
        generation: int,
        trial: bool = False,
        dry_run: bool = False,
        token: str | None = None,
        started: float | None = None,
    ) -> None:
        self.generation = generation
        self.trial = trial
        self.dry_run = dry_run
        self.token = token  # a shared store's probe lease, for trials
        self.started = started  # monotonic admission time, while the slow-call trigger is on

    def __repr__(self) -> str:
        kind = "trial" if self.trial else ("dry-run" if self.dry_run else "closed")
        return f"<Permit {kind} gen={self.generation}>"


def validate_ttl(ttl_minutes: Any, default: float) -> float:
    """Check a force lifetime in minutes (``None`` -> *default*). Raises ConfigError."""
    if ttl_minutes is None:
        ttl_minutes = default
    if isinstance(ttl_minutes, bool) or not isinstance(ttl_minutes, (int, float)):
        raise ConfigError(f"ttl_minutes={ttl_minutes!r}: expected a number of minutes")
    if not math.isfinite(ttl_minutes) or ttl_minutes <= 0 or ttl_minutes > MAX_LIFETIME_MINUTES:
        raise ConfigError(
            f"ttl_minutes={ttl_minutes!r}: must be greater than 0 and at most {MAX_LIFETIME_MINUTES} minutes"
        )
    return float(ttl_minutes)


class Engine(NamedTuple):
    """The functions of the runner and the retry engine that the wrappers a breaker builds
    call (:meth:`CircuitBreaker.build_wrapper`): handed in by ``core/hotpath.py``, so this
    module imports neither of them (no import circle inside ``core/``)."""

    run_sync: Callable[..., Any]
    continue_sync: Callable[..., Any]
    run_async: Callable[..., Awaitable[Any]]
    continue_async: Callable[..., Awaitable[Any]]
    settle_exception: Callable[..., bool]
    settle_result: Callable[..., None]
    settle_raised: Callable[..., bool]
    asettle_raised: Callable[..., Awaitable[bool]]
    settle_returned: Callable[..., None]
    settled_elsewhere: Callable[..., bool]
    nest_mark: Callable[..., Any]
    marked: Callable[..., Any]
    amarked: Callable[..., Awaitable[Any]]
    settled: Callable[..., bool]
    call_fallback: Callable[..., Any]
    acall_fallback: Callable[..., Awaitable[Any]]
    exception_outcome: Callable[..., tuple[bool, bool]]
    trial: Callable[..., Any]
    atrial: Callable[..., Awaitable[Any]]
    raised: Callable[[BaseException], Any]
    returned: Callable[[Any], Any]
    discard: Callable[[Any], None]
    slow: object
    refused: object
    not_plain: int


class View(NamedTuple):
    """What a breaker's store strategy reads of its state (``CircuitBreaker.view``).

    Attributes:
        state (CircuitState): the local state.
        forced (str | None): the force held locally.
        force_until (float): monotonic deadline of that force (seconds).
        open_until (float): monotonic end of the current automatic open (seconds).
        sync_due (float): monotonic time of the next due consult of the store (seconds).
    """

    state: CircuitState
    forced: str | None
    force_until: float
    open_until: float
    sync_due: float


class CircuitBreaker:
    """One named breaker with consecutive, failure-rate and 429-cascade triggers.

    Args:
        name (str): the service name; any non-empty string.
        config (BreakerConfig): resolved configuration (times in seconds).
        clock (Clock): time source; tests pass a ``FakeClock``.
        bus (EventBus): where events are published (the process-wide bus by default).

    Raises:
        ConfigError: *name* is empty or not a string.
    """

    # Slots, not an instance dict: a breaker holds some fifty fields, more than CPython's
    # shared-key instance dicts take, so each breaker used to carry a 1.6 KB dict of its own
    # (memory per breaker: a fleet may hold many thousands). ``__dict__`` stays as the last slot, created only when
    # something sets an attribute that is not listed here (a test's spy, a subclass's
    # field); ``__weakref__`` because the Prometheus collector holds breakers weakly.
    __slots__ = (
        "name",
        "config",
        "plain_types",
        "dry_run_rejections",
        "_clock",
        "_mono",
        "_bus",
        "_lock",
        "_sync",
        "_timed",
        "_state",
        "_gen",
        "_closed_permit",
        "_fast_permit",
        "_healthy_permit",
        "_quiet_permit",
        "_reject_until",
        "_sync_due",
        "_consecutive",
        "_window",
        "_lanes",
        "_timing_permit",
        "_timing",
        "_cascade",
        "_cooldown_until",
        "_opened_at",
        "_open_until",
        "_open_seconds",
        "_opens",
        "_trials",
        "_trial_successes",
        "_forced",
        "_force_until",
        "_force_expires_at",
        "_force_reason",
        "_force_actor",
        "_last_trigger",
        "_seq",
        "_m_failure",
        "_m_rate_limited",
        "_m_ignored",
        "_m_uncounted",
        "_m_noted",
        "_blocked_open",
        "_blocked_half_open",
        "_blocked_frozen",
        "_transitions",
        "_inherited",
        "_outbox",
        "_drain",
        "_drainer",
        "__dict__",
        "__weakref__",
    )

    def __init__(
        self,
        name: str,
        config: BreakerConfig,
        *,
        clock: Clock = SYSTEM_CLOCK,
        bus: EventBus = default_bus,
    ) -> None:
        check_name(name)
        config = shared_config(config)
        self.name = name
        self.config = config
        self._clock = clock
        self._mono: Callable[[], float] = clock.monotonic
        self._bus = bus
        self._lock = threading.Lock()
        self._sync: LocalSync | StoreSync = LOCAL
        #: True when the hot-path permit expires at ``_sync_due`` (a shared store's sync interval).
        self._timed = False
        self._state = CLOSED
        self._gen = 0
        self._closed_permit: Permit | None = Permit(0)
        # The CLOSED permit while admission needs no lock and no clock (CLOSED and
        # unforced), else None. Read once by the hot path, so a trip racing with it can
        # only hand out a permit whose generation is already stale.
        self._fast_permit: Permit | None = self._closed_permit
        # The CLOSED permit while a success would change nothing but the cascade count
        # (window full, no failure in it), else None. Cleared by _invalidate() before
        # any failure is recorded or the state changes, so the lock-free healthy path
        # linearises at its single read of this attribute.
        self._healthy_permit: Permit | None = None
        # The CLOSED permit while it is both of the above (admission lock-free and the
        # healthy lane open), else None: the wrappers admit with it, and a call admitted
        # with it runs unmarked (see core/nesting.py). Cleared with either of them.
        self._quiet_permit: Permit | None = None
        # Monotonic deadline before which OPEN (or forced open) rejects without the lock;
        # 0.0 whenever anything else holds. Cleared first by every transition.
        self._reject_until = 0.0
        # Monotonic time at which a shared breaker must consult its store again: the
        # locked paths drop the hot-path permit then. inf = never (local breakers).
        self._sync_due = float("inf")
        self._consecutive = 0
        self._window: CountWindow | TimeWindow = _window_for(config)
        # Successes may skip the window (lock-free healthy lane, locked clean-success lane)
        # only with the count window and no call timing; see _configure_lanes().
        self._lanes = True
        #: Returned types the wrappers record as successes without judging them: the
        #: config's ``plain_types`` (a frozenset shared by every breaker), swapped whole by
        #: _configure_lanes() and read once per call; empty while a result_predicate is set.
        self.plain_types: frozenset[type] = config.plain_types
        # While the slow-call trigger is on every admitted call carries its own
        # permit stamped with the admission time: this is the CLOSED permit to copy it
        # from (lock-free, like _fast_permit, which is then None), else None.
        self._timing_permit: Permit | None = None
        self._timing = False  # the slow-call trigger is on; set by _configure_lanes()
        self._cascade = SecondBuckets(config.cascade_window)
        self._cooldown_until = 0.0
        self._opened_at: float | None = None  # wall clock
        self._open_until = 0.0  # monotonic
        self._open_seconds = config.recovery_timeout  # how long the current open lasts
        self._opens = 0  # consecutive automatic opens since the last close
        self._trials = 0  # slots taken in the current probing round
        self._trial_successes = 0
        self._forced: str | None = None  # "open" | "closed"
        self._force_until = 0.0  # monotonic
        self._force_expires_at: float | None = None  # wall clock
        self._force_reason = ""
        self._force_actor: str | None = None
        self._last_trigger: str | None = None
        self._seq = 0  # outcomes counted off the healthy lane (lock held), so a nested call's outcome is seen
        self.dry_run_rejections = 0
        self._init_metrics()
        # Events are queued here under the state lock, in the order the transitions were
        # decided, and delivered after it is released by whichever thread drains first:
        # listeners see transitions in order and never run under the state lock.
        # A list, not a deque: append() and pop(0) are each one atomic C call as well, and
        # an empty list is 56 bytes where an empty deque takes a 64-slot block (760 bytes);
        # the queue is rarely longer than the one transition being delivered.
        self._outbox: list[Event] = []
        # The delivery lock, made by the first delivery (under a module lock, so two threads
        # delivering first at once still share one): most breakers never deliver anything.
        self._drain: threading.Lock | None = None
        self._drainer: int | None = None  # thread delivering events right now
        self._configure_lanes()
        self._refresh_fast()

    # ------------------------------------------------------------------ reading
    def __repr__(self) -> str:
        return f"<CircuitBreaker {self.name!r} {self._state.value}>"

    @property
    def backend(self) -> str:
        """Where the state is shared: ``"memory"`` (this process only), ``"database"`` or ``"redis"``."""
        return self._sync.backend

    @property
    def state(self) -> CircuitState:
        """Current :class:`CircuitState`. Evaluates lapses and the recovery timeout.

        With a shared store this may read the shared record (when a consult is
        due, or to sweep an OPEN record past its timeout).
        """
        if self._fast_permit is not None and not (self._timed and self._mono() >= self._sync_due):
            return CLOSED
        now = self._mono()
        self._sync.refresh(self, now)
        events = self._outbox
        with self._lock:
            self._evaluate(now, events)
            state = self._state
        self._settle(events)
        return state

    @property
    def forced(self) -> str | None:
        """``"open"``, ``"closed"`` or None; a lapsed force reads None."""
        self.state  # noqa: B018 - evaluates a lapse
        return self._forced

    def snapshot(self) -> dict[str, Any]:
        """A dict of the breaker's state and counts (the keys are part of the public contract). Never takes a trial slot."""
        self.state  # noqa: B018 - consult, sweep and evaluate first
        events = self._outbox
        with self._lock:
            now = self._mono()
            self._evaluate(now, events)
            self._window.advance(now)
            snap = {
                "service": self.name,
                "state": self._state.value,
                "consecutive_failures": self._consecutive,
                "window_calls": self._window.calls,
                "window_failures": self._window.failures,
                "window_slow_calls": self._window.slow,
                "opened_at": self._opened_at,
                **self._open_fields(),
                "consecutive_opens": self._opens,
                "forced": self._forced,
                "force_expires_at": self._force_expires_at if self._forced else None,
                "force_reason": self._force_reason if self._forced else None,
                "force_actor": self._force_actor if self._forced else None,
                "half_open_trials": self._trials if self._state is HALF_OPEN else 0,
                "half_open_successes": self._trial_successes if self._state is HALF_OPEN else 0,
                "cooldown_remaining": max(0.0, self._cooldown_until - self._mono()),
                "dry_run_rejections": self.dry_run_rejections,
                "last_trigger": self._last_trigger,
                "backend": self.backend,
                "config": {
                    "failure_threshold": self.config.failure_threshold,
                    "failure_rate_threshold": self.config.failure_rate_threshold,
                    "sliding_window_size": self.config.sliding_window_size,
                    "sliding_window_type": self.config.sliding_window_type,
                    "sliding_window_seconds": self.config.sliding_window_seconds,
                    "recovery_backoff_factor": self.config.recovery_backoff_factor,
                    "recovery_timeout_max": self.config.recovery_timeout_max,
                    "slow_call_duration": self.config.slow_call_duration,
                    "slow_call_rate_threshold": self.config.slow_call_rate_threshold,
                    "minimum_calls": self.config.minimum_calls,
                    "recovery_timeout": self.config.recovery_timeout,
                    "half_open_max_calls": self.config.half_open_max_calls,
                },
            }
            snap.update(self._sync.extra_snapshot())
        self._settle(events)
        return snap

    # ------------------------------------------------------------------ metrics
    def _init_metrics(self) -> None:
        """The counts behind :meth:`metrics`. Nothing is added to the CLOSED healthy
        lane: its successes are the cascade's calls that are not counted here as anything
        else. The one count stepped without the lock, the OPEN rejection's, is an
        ``itertools.count`` (one atomic ``next()``); every other count is a plain int,
        changed only under the state lock (ints cost nothing per breaker, a count object
        56 bytes, and a fleet may hold many thousands of breakers)."""
        self._m_failure = 0  # final outcomes, counted or not in the cascade (lock held)
        self._m_rate_limited = 0  # (lock held)
        self._m_ignored = 0  # (lock held)
        self._m_uncounted = 0  # successes the cascade did not count: dry-run, retry-noted (lock held)
        self._m_noted = 0  # cascade calls that are not successes (lock held)
        # Rejections by reason: the lock-free OPEN rejection steps ``_blocked_open`` (the
        # locked ones too, so one count holds them all); the two others are locked paths.
        self._blocked_open = itertools.count()
        self._blocked_half_open = 0  # (lock held)
        self._blocked_frozen = 0  # (lock held)
        #: (from, to, trigger) -> count, made by the first transition (lock held)
        self._transitions: dict[tuple[str, str, str], int] | None = None
        self._inherited: dict[str, Any] | None = None  # the counts a forked child started from

    def _metric_counts(self) -> dict[str, Any]:
        """Raw cumulative counts (lock held, or the only thread of a forked child)."""
        return {
            "calls": {
                "success": self._cascade.total() - self._m_noted + self._m_uncounted,
                "failure": self._m_failure,
                "ignored": self._m_ignored,
                "rate_limited": self._m_rate_limited,
            },
            "blocked": {
                Reason.OPEN: _count_of(self._blocked_open),
                Reason.HALF_OPEN_FULL: self._blocked_half_open,
                Reason.FROZEN: self._blocked_frozen,
            },
            "transitions": dict(self._transitions or ()),
        }

    def metrics(self) -> dict[str, Any]:
        """What this process's breaker counted, for Prometheus. Never takes a trial
        slot and never reads a shared store: a shared breaker reports the state this
        process last adopted; a local one evaluates its recovery timeout first, as
        :attr:`state` does.

        Returns:
            dict: ``state`` (a :class:`CircuitState`); ``calls``: final outcomes by
            ``success``, ``failure``, ``ignored``, ``rate_limited`` (a call with retries is
            one call; a 429 reported by ``record_rate_limit`` is a ``rate_limited`` call;
            a call let through by dry-run counts too); ``blocked``: rejections by reason
            (``open``, ``half_open_full``, ``frozen``; dry-run rejects nothing);
            ``transitions``: ``{(from_state, to_state, trigger): count}`` for every state
            change of this process's breaker, adopted ones included (every trigger is
            named, ``reset`` after :meth:`reset`, ``adopted`` for a shared record
            that names none). Counts start at 0
            in a process, a forked child included, and never decrease.
        """
        events = self._outbox
        with self._lock:
            self._evaluate(self._mono(), events)
            state = self._state
            counts = self._metric_counts()
        self._publish(events)
        inherited = self._inherited
        if inherited is not None:
            for group in ("calls", "blocked", "transitions"):
                base = inherited[group]
                mine = counts[group]
                for key, value in base.items():
                    if key in mine:
                        mine[key] = max(0, mine[key] - value)
        counts["state"] = state
        return counts

    def metric_values(self) -> tuple[CircuitState, tuple[int, ...], tuple[tuple[tuple[str, str, str], int], ...]]:
        """:meth:`metrics` as tuples, for a scrape over thousands of breakers: the
        same counts, read the same way, returned without the nested dicts.

        Returns:
            tuple: ``(state, counts, transitions)``. ``state``: a :class:`CircuitState`, as
            :meth:`metrics` reads it. ``counts``: seven ints in the order of
            :data:`METRIC_COUNTS` (calls ``success``, ``failure``, ``ignored``,
            ``rate_limited``; blocked ``open``, ``half_open_full``, ``frozen``).
            ``transitions``: ``((from_state, to_state, trigger), count)`` pairs, ``()``
            while this process saw no state change. Counts start at 0 in a process and
            never decrease.
        """
        events = self._outbox
        with self._lock:
            self._evaluate(self._mono(), events)
            state = self._state
            raw = self._metric_counts()
        if events:
            self._publish(events)
        calls, blocked, moved = raw["calls"], raw["blocked"], raw["transitions"]
        counts = (
            calls["success"],
            calls["failure"],
            calls["ignored"],
            calls["rate_limited"],
            blocked[Reason.OPEN],
            blocked[Reason.HALF_OPEN_FULL],
            blocked[Reason.FROZEN],
        )
        transitions = tuple(moved.items()) if moved else ()
        inherited = self._inherited
        if inherited is not None:  # a forked child: what the parent counted is the parent's
            base = [inherited[group].get(key, 0) for group, key in METRIC_COUNTS]
            counts = tuple(max(0, value - before) for value, before in zip(counts, base, strict=True))
            was = inherited["transitions"]
            transitions = tuple((key, max(0, value - was.get(key, 0))) for key, value in transitions)
        return state, counts, transitions

    def after_fork(self) -> None:
        """In a child just forked (one thread): its counts start from what it inherited."""
        self._inherited = self._metric_counts()

    def _open_fields(self) -> dict[str, float | None]:
        """The snapshot's ``open_until`` (Unix s, when the OPEN breaker admits a probe) and
        ``open_duration`` (s, the backed-off length of the current or last open). A
        forced open ends with its force (``open_until`` = its expiry, no automatic duration)."""
        if self._state is CLOSED:
            return {"open_until": None, "open_duration": None}
        if self._forced == "open":
            return {"open_until": self._force_expires_at, "open_duration": None}
        until = self._opened_at + self._open_seconds if self._state is OPEN and self._opened_at else None
        return {"open_until": until, "open_duration": self._open_seconds}

    # ---------------------------------------------------------------- admission
    def acquire(self) -> Permit:
        """Ask to make one call.

        Returns:
            A :class:`Permit` to pass to one of the ``record_*`` methods.

        Raises:
            CircuitOpenError: OPEN (``reason="open"``, ``retry_after`` seconds until a probe
                or until a force lapses) or HALF_OPEN with every trial slot taken
                (``reason="half_open_full"``). Never raised in dry-run.
        """
        permit = self._fast_permit
        if permit is not None and not (self._timed and self._mono() >= self._sync_due):
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
        now = self._mono()
        base = self._timing_permit
        if base is not None and now < self._sync_due:
            # CLOSED with the slow-call trigger on; lock-free for the same reason as
            # the hot path's permit (a racing trip leaves this copy's generation stale)
            return Permit(base.generation, started=now)
        until = self._reject_until
        if now < until and now < self._sync_due:
            raise self._reject_fast(now, until, metered)  # no lock, no round trip
        sync = self._sync
        if now >= self._sync_due:
            if sync.known:
                sync.consult(self, now)
            else:  # no call is admitted on a local state the shared record never set
                sync.first_use(self)
                now = self._mono()
        if sync.probe_due(self, now):
            permit = sync.acquire_probe(self, now)
            if permit is not None:
                return permit
        return self._admit(now, metered)

    def timing_start(self, now: float) -> float | None:
        """The admission time to stamp on a permit (monotonic seconds), or None while the
        slow-call trigger is off (then nothing is slow, in any state)."""
        return now if self._timing else None

    # ------------------------------------------------------- the hot path's closures
    def build_wrapper(
        self,
        func: Callable[..., Any],
        policy: RetryPolicy | None,
        trial_policy: RetryPolicy | None,
        fallback: Any,
        engine: Engine,
    ) -> Callable[..., Any]:
        """The wrapper of a ``def`` protected by this breaker (built here because it reads the
        hot-path fields lock-free; see :mod:`baldur_django.core.hotpath`): one attribute read
        to admit, no lock to record a healthy success.

        Args:
            func: the protected function.
            policy: the retry policy, or None for no retry stage.
            trial_policy: *policy* made one attempt, for trials.
            fallback: called with the call's arguments when the breaker rejects or the call
                fails, or None.
            engine: the runner's and retry engine's functions (no import circle).

        Returns:
            A function with *func*'s signature.
        """
        # Every variable a closure uses is a cell of its own (40 bytes each, per wrapper): the
        # wrapper keeps cells for what the CLOSED healthy path reads (the breaker, the call,
        # the policy, the clock, the cascade), and reaches everything the slower branches
        # need through the breaker (its fields are slots: one specialised read each) or the
        # one *engine* (memory per breaker: a fleet may hold many thousands).
        cascade = self._cascade
        monotonic = self._mono
        budgeted = policy is not None and policy.budget_seconds is not None

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            # admitted on the healthy lane, the call runs unmarked: its mark is the record
            # number alone (see core/nesting.py); any other call is admitted below
            permit = self._quiet_permit
            if permit is None or (self._timed and monotonic() >= self._sync_due):
                until = self._reject_until
                if until:  # acquire_slow()'s lock-free OPEN rejection, inlined (see core/hotpath.py)
                    now = monotonic()
                    if now < until and now < self._sync_due and not self._bus.wants_rejections():
                        next(self._blocked_open)  # an itertools.count, one atomic step
                        if fallback is None:
                            # raised unnamed: a local holding it would tie this frame and the
                            # error's traceback into a cycle that only the GC frees
                            raise new_open_error(self.name, Reason.OPEN, until - now)
                        return engine.call_fallback(
                            fallback, args, kwargs, new_open_error(self.name, Reason.OPEN, until - now)
                        )
                outer = trial_in_progress(self)
                if outer is not None:
                    permit = outer  # nested in this breaker's trial: no second slot, no refusal
                else:
                    if fallback is None:
                        permit = self.acquire()
                    else:
                        try:
                            permit = self.acquire()
                        except CircuitOpenError as rejection:
                            return engine.call_fallback(fallback, args, kwargs, rejection)
                    if permit.trial:
                        return engine.trial(self, permit, wrapper, args, kwargs)
                if permit.trial or permit is self._healthy_permit:
                    mark: Mark = self._seq
                else:  # off the healthy lane the call runs under a Nest of its own
                    mark = engine.nest_mark(self, permit)
                    if mark is None:
                        return engine.marked(self, permit, wrapper, args, kwargs)
            else:
                mark = self._seq
            retrying = policy is not None and not permit.dry_run
            if retrying and (permit.trial or budgeted or self._cooldown_until):
                return engine.run_sync(
                    self, permit, trial_policy if permit.trial else policy, func, args, kwargs, fallback, mark
                )
            # With a retry policy and nothing to gate the first attempt, run_sync() would make
            # it at once with start=0.0: it is made here, and the engine takes over only when
            # it did not succeed (continue_sync).
            try:
                result = func(*args, **kwargs)
            except BaseException as exc:
                # a nested call is one attempt of its outer call: never a retry stage of its own
                if not retrying or engine.settled_elsewhere(self, permit, mark):
                    answered = fallback is not None and not permit.dry_run
                    if engine.settle_raised(self, permit, mark, exc, answered) and answered:
                        return engine.call_fallback(fallback, args, kwargs, exc)
                    raise
                first: Outcome = engine.raised(exc)
            else:
                plain = self.plain_types  # the configuration's, swapped whole on reconfigure
                if type(result) not in plain:
                    # settle_result()'s response lane, inlined: a plain int status on neither
                    # list is a success like a plain value; anything else is classified there
                    # (everything, while a result_predicate is set: *plain* is then empty).
                    try:
                        code = result.status_code if plain else None  # a result_predicate: no status read
                    except Exception:
                        code = None
                    config = self.config
                    if type(code) is not int or code in config.failure_codes or code in config.rate_limit_codes:
                        if not retrying:
                            engine.settle_returned(self, permit, mark, result)
                            return result
                        if engine.settled(self, permit, result, mark) or engine.settled_elsewhere(self, permit, mark):
                            return result  # a success, or a nested call's failure response (not retried)
                        return engine.continue_sync(
                            self, permit, policy, func, args, kwargs, fallback, 0.0, engine.returned(result)
                        )
                # healthy_success() inlined: the hottest lines of the package
                if permit is self._healthy_permit and monotonic() < cascade.bucket_end:
                    next(cascade.counter)
                elif not engine.settled_elsewhere(self, permit, mark):
                    self.record_success(permit)
                return result
            return engine.continue_sync(self, permit, policy, func, args, kwargs, fallback, 0.0, first)

        register(wrapper.__code__, _self_of)  # its frames run calls (see core/nesting.py)
        return wrapper

    def build_awrapper(
        self,
        func: Callable[..., Awaitable[Any]],
        policy: RetryPolicy | None,
        trial_policy: RetryPolicy | None,
        fallback: Any,
        engine: Engine,
    ) -> Callable[..., Awaitable[Any]]:
        """The wrapper of an ``async def``: the same steps as :meth:`build_wrapper`, awaiting
        the call; a shared breaker's slow paths (store I/O) run in a worker thread.

        Returns:
            A coroutine function with *func*'s signature.
        """
        cascade = self._cascade  # the cells kept, as in build_wrapper
        monotonic = self._mono
        budgeted = policy is not None and policy.budget_seconds is not None

        async def wrapper(*args: Any, **kwargs: Any) -> Any:
            permit = self._quiet_permit  # as in build_wrapper
            if permit is None or (self._timed and monotonic() >= self._sync_due):
                until = self._reject_until
                if until:  # acquire_slow()'s lock-free OPEN rejection, inlined (see core/hotpath.py)
                    now = monotonic()
                    if now < until and now < self._sync_due and not self._bus.wants_rejections():
                        next(self._blocked_open)  # an itertools.count, one atomic step
                        if fallback is None:
                            raise new_open_error(self.name, Reason.OPEN, until - now)  # unnamed: see sync_wrapper
                        return await engine.acall_fallback(
                            fallback, args, kwargs, new_open_error(self.name, Reason.OPEN, until - now)
                        )
                outer = trial_in_progress(self)
                if outer is not None:
                    permit = outer  # nested in this breaker's trial
                else:
                    if fallback is None:
                        permit = await self.aacquire()
                    else:
                        try:
                            permit = await self.aacquire()
                        except CircuitOpenError as rejection:
                            return await engine.acall_fallback(fallback, args, kwargs, rejection)
                    if permit.trial:
                        return await engine.atrial(self, permit, wrapper, args, kwargs)
                if permit.trial or permit is self._healthy_permit:  # the call's mark, as in build_wrapper
                    mark: Mark = self._seq
                else:
                    mark = engine.nest_mark(self, permit)
                    if mark is None:
                        return await engine.amarked(self, permit, wrapper, args, kwargs)
            else:
                mark = self._seq
            retrying = policy is not None and not permit.dry_run
            if retrying and (permit.trial or budgeted or self._cooldown_until):
                return await engine.run_async(
                    self, permit, trial_policy if permit.trial else policy, func, args, kwargs, fallback, mark
                )
            try:  # the first attempt of a retry sequence too, as in sync_wrapper
                result = await func(*args, **kwargs)
            except BaseException as exc:
                if not retrying or engine.settled_elsewhere(self, permit, mark):  # as in build_wrapper
                    answered = fallback is not None and not permit.dry_run
                    # a shared round's outcome is a store write, made off the loop
                    if await engine.asettle_raised(self, permit, mark, exc, answered) and answered:
                        return await engine.acall_fallback(fallback, args, kwargs, exc)
                    raise
                first: Outcome = engine.raised(exc)
            else:
                if permit.trial:  # never retrying here: a trial with a policy went to run_async
                    if not engine.settled_elsewhere(self, permit, mark):  # the stack is read on the loop
                        await self.off_loop(engine.settle_result, self, permit, result)
                        self.note_recorded()
                    return result
                plain = self.plain_types  # as in build_wrapper
                if type(result) not in plain:  # the response lane, as in build_wrapper
                    try:
                        code = result.status_code if plain else None  # a result_predicate: no status read
                    except Exception:
                        code = None
                    config = self.config
                    if type(code) is not int or code in config.failure_codes or code in config.rate_limit_codes:
                        if not retrying:
                            engine.settle_returned(self, permit, mark, result)
                            return result
                        if engine.settled(self, permit, result, mark) or engine.settled_elsewhere(self, permit, mark):
                            return result  # as in build_wrapper
                        return await engine.continue_async(
                            self, permit, policy, func, args, kwargs, fallback, 0.0, engine.returned(result)
                        )
                if permit is self._healthy_permit and monotonic() < cascade.bucket_end:
                    next(cascade.counter)
                elif not engine.settled_elsewhere(self, permit, mark):
                    self.record_success(permit)
                return result
            return await engine.continue_async(self, permit, policy, func, args, kwargs, fallback, 0.0, first)

        register(wrapper.__code__, _self_of)  # its frames run calls (see core/nesting.py)
        return wrapper

    def build_inline(self, engine: Engine) -> Callable[[Callable[[], Any]], Any]:
        """``inline(call)``: :func:`~baldur_django.core.hotpath.protect`'s plain CLOSED path
        (no retry stage, no fallback) for a process-local breaker, reading the hot-path fields
        lock-free as the wrappers do. Returns the call's value, or ``engine.slow`` when the
        plain path does not apply (the caller runs its full wrapper), or ``engine.refused``
        when *call* turned out to be a coroutine or generator function (nothing recorded,
        the caller's full way raises the ConfigError). A nested call through the same breaker is one call, as in the wrappers.
        """
        slow = engine.slow  # returned by every call of a shared breaker: kept as a cell
        cascade = self._cascade  # the other cells kept, as in build_wrapper
        monotonic = self._mono

        def inline(call: Callable[[], Any]) -> Any:
            permit = self._quiet_permit
            if permit is None or self._timed:
                return slow  # off the healthy lane the full wrapper marks the call (core/nesting.py)
            mark = self._seq  # as in build_wrapper
            try:
                result = call()
            except BaseException as exc:
                if not call.__code__.co_flags & engine.not_plain:
                    engine.settle_raised(self, permit, mark, exc, False)
                    raise
                return engine.refused
            if type(result) in self.plain_types:  # the configuration's, as in build_wrapper
                if permit is self._healthy_permit and monotonic() < cascade.bucket_end:
                    next(cascade.counter)
                elif not engine.settled_elsewhere(self, permit, mark):
                    self.record_success(permit)
                return result
            if not call.__code__.co_flags & engine.not_plain:
                if is_awaitable(result):  # a lambda around an async def: refused, nothing recorded
                    raise awaitable_refused(f"protect({self.name!r})'s call", result)
                engine.settle_returned(self, permit, mark, result)  # the response lane too
                return result
            engine.discard(result)
            return engine.refused

        register(inline.__code__, _self_of)  # its frames run calls (see core/nesting.py)
        return inline

    def build_ainline(
        self, engine: Engine
    ) -> tuple[
        Callable[[], tuple[Permit, int] | None],
        Callable[[Permit, int, Any], None],
        Callable[[Permit, int, BaseException], None],
    ]:
        """``(admit, succeeded, failed)``: :func:`~baldur_django.core.hotpath.aprotect`'s plain
        CLOSED path for a process-local breaker, in three plain calls around the caller's own
        ``await`` (an extra coroutine per call would cost more than the path itself).

        ``admit()`` returns ``(permit, mark)`` when the plain path applies, else None (the
        caller runs its full wrapper); ``succeeded(permit, mark, result)`` and
        ``failed(permit, mark, exc)`` record the outcome, the healthy lane lock-free, and
        nothing when a nested call through this breaker settled the call already.
        """
        cascade = self._cascade  # the cells kept, as in build_wrapper
        monotonic = self._mono

        def admit() -> tuple[Permit, int] | None:
            permit = self._quiet_permit
            if permit is None or self._timed:
                return None  # as in build_inline
            return permit, self._seq

        def succeeded(permit: Permit, mark: int, result: Any) -> None:
            if type(result) in self.plain_types:  # as in build_wrapper
                if permit is self._healthy_permit and monotonic() < cascade.bucket_end:
                    next(cascade.counter)
                elif not engine.settled_elsewhere(self, permit, mark):
                    self.record_success(permit)
            else:
                engine.settle_returned(self, permit, mark, result)

        def failed(permit: Permit, mark: int, exc: BaseException) -> None:
            engine.settle_raised(self, permit, mark, exc, False)

        return admit, succeeded, failed

    def ready_permit(self) -> Permit | None:
        """The CLOSED lock-free permit when it may be used now, else None (no lock, no I/O).

        For an async caller that wants to skip awaiting :meth:`aacquire` on the hot path:
        a permit returned here is the one :meth:`aacquire` would return at once; None means
        "await :meth:`aacquire`" (it decides, off the loop where the store may be reached).

        Returns:
            The CLOSED permit, or None. Raises nothing.
        """
        permit = self._fast_permit
        if permit is not None and not (self._timed and self._mono() >= self._sync_due):
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
        if self._timed:
            now = self._mono()
            if not (now < self._reject_until and now < self._sync_due):  # else a lock-free rejection
                return cast(Permit, await asyncio.to_thread(self.acquire_slow))
        return self.acquire_slow()

    async def off_loop(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run ``fn(*args)`` so that a shared store's I/O never blocks the running event loop:
        in a worker thread for a shared breaker, inline for a process-local one (no I/O)."""
        if self._timed:
            return await asyncio.to_thread(fn, *args)
        return fn(*args)

    # ------------------------------------------------ the store strategy's seam
    # sync.py changes nothing of a breaker directly: it reads a View, schedules the next
    # consult, and hands store answers to apply() / apply_probe(), which adopt them here.
    @property
    def clock(self) -> Clock:
        """The breaker's time source (monotonic and wall seconds)."""
        return self._clock

    def view(self, *, locked: bool = False) -> View:
        """The state a store strategy decides on; *locked* reads it under the state lock."""
        if locked:
            with self._lock:
                return View(self._state, self._forced, self._force_until, self._open_until, self._sync_due)
        return View(self._state, self._forced, self._force_until, self._open_until, self._sync_due)

    def schedule(self, deadline: float, *, refresh: bool = False) -> None:
        """Set when a shared breaker consults its store next (monotonic seconds). With
        *refresh* the hot-path permit is re-derived under the state lock (not held by the caller)."""
        if not refresh:
            self._sync_due = deadline
            return
        with self._lock:
            self._sync_due = deadline
            self._refresh_fast()

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
        with self._lock:
            self._adopt(answer, self._mono(), events, force=force, announced=announced)
            self._refresh_fast()
        self._publish(events)

    def apply_probe(self, answer: Answer, token: str, now: float) -> Permit | None:
        """Adopt the answer to a probe request and build the permit it grants: a trial
        permit holding *token* when the store gave a slot, the CLOSED permit when the record
        turned out CLOSED, else None (no slot). Takes the state lock; publishes afterwards."""
        events: list[Event] = []
        permit: Permit | None = None
        with self._lock:
            self._adopt(answer, self._mono(), events)
            started = self.timing_start(now)  # timed calls
            if answer.result:  # the adopted round already counts this probe
                permit = Permit(self._gen, trial=True, token=token, started=started)
            elif self._state is CLOSED:
                permit = self._closed_permit if started is None else Permit(self._gen, started=started)
        self._publish(events)
        return permit

    def publish(self, events: Collection[Event]) -> None:
        """Deliver *events* in order after the state lock was released."""
        self._publish(events)

    @property
    def generation(self) -> int:
        """The state generation: a new one with every transition (an outcome admitted
        in an older generation is dropped)."""
        return self._gen

    @property
    def shared(self) -> bool:
        """True while the breaker meets a shared store (its slow paths may do store I/O, so
        coroutines run them off the event loop)."""
        return self._timed

    @property
    def cooldown_deadline(self) -> float:
        """Monotonic end of this process's 429 cooldown (seconds); 0.0 until a cooldown was
        ever set, which the retry stage reads to skip the clock."""
        return self._cooldown_until

    def healthy_success(self, permit: Permit) -> bool:
        """Count a success on the lock-free healthy lane when it applies (the window full and
        clean, the cascade's second not over); True when counted, False when the caller must
        :meth:`record_success`."""
        if permit is self._healthy_permit:
            cascade = self._cascade
            if self._mono() < cascade.bucket_end:
                next(cascade.counter)
                return True
        return False

    def record_mark(self) -> int:
        """The number of outcomes counted so far off the lock-free healthy lane: read when a
        call begins, and given to :func:`recorded_since` before its outcome is recorded."""
        return self._seq

    def _mark(self) -> None:
        """An outcome was counted (lock held): number it, and note it for this thread or
        task, so a call around a nested one through this breaker records nothing more."""
        self._seq += 1
        RECORDED.set((self, self._seq))

    def note_recorded(self) -> None:
        """Note in this thread or task that an outcome of this breaker was counted elsewhere
        (a worker thread recording a trial for a coroutine), as :meth:`_mark` does."""
        with self._lock:
            RECORDED.set((self, self._seq))

    def held_open(self) -> str | None:
        """The trigger to write an automatic open back with, while this process holds one
        (OPEN or HALF_OPEN, not forced): the open's own trigger, or ``"adopted"`` in
        HALF_OPEN (the round's trigger names no open). None while CLOSED or forced.

        A shared store that answers with an empty or older CLOSED record is never taken
        over such a state, whether the open time still runs or a probe is due."""
        with self._lock:
            if self._forced is None:
                if self._state is OPEN:
                    return self._last_trigger or Trigger.ADOPTED
                if self._state is HALF_OPEN:
                    return Trigger.ADOPTED
        return None

    def _reject_fast(self, now: float, until: float, metered: bool = True) -> CircuitOpenError:
        """OPEN inside its deadline: the rejection needs no lock. The event is built
        only when a listener wants plain rejections."""
        if metered:
            next(self._blocked_open)
        if self._bus.wants_rejections():
            self._publish([CallRejected(self.name, self._clock.wall(), Reason.OPEN, OPEN.value, False, until - now)])
        return new_open_error(self.name, Reason.OPEN, until - now)  # C alone, no Python __init__

    def _admit(self, now: float, metered: bool = True) -> Permit:
        """The one admission decision (lock held inside): CLOSED passes, HALF_OPEN takes a
        local trial slot when this process judges alone, anything else is rejected with
        its reason, or let through and counted in dry-run."""
        events = self._outbox
        permit: Permit | None = None
        reason = Reason.OPEN
        retry_after: float | None = None
        with self._lock:
            self._evaluate(now, events)
            state = self._state
            timing = self._timing
            if state is CLOSED:
                permit = Permit(self._gen, started=now) if timing else self._closed_permit
            elif state is HALF_OPEN:
                # the fleet's slots are the store's while it answers: none here
                max_calls = self.config.half_open_max_calls
                taken = self._trials if self._sync.local_judgement() else max_calls
                refusal = rules.probe_refusal(
                    state=state.value, forced=self._forced, taken=taken, max_calls=max_calls, frozen=frozen()
                )
                if refusal is None:
                    self._trials += 1
                    permit = Permit(self._gen, trial=True, started=now if timing else None)
                else:
                    reason = refusal  # frozen or half_open_full
            else:
                until = self._force_until if self._forced == "open" else self._open_until
                if now >= until and self._forced is None and frozen():
                    reason = Reason.FROZEN  # held OPEN past its recovery timeout
                else:
                    retry_after = max(0.0, until - now)
                    self._hold_open_until(until)
            if permit is None:
                if self.config.dry_run:
                    self.dry_run_rejections += 1
                    permit = Permit(self._gen, dry_run=True)
                    events.append(
                        CallRejected(self.name, self._clock.wall(), reason=reason, state=state.value, dry_run=True)
                    )
                elif metered:
                    self._count_blocked(reason)
        if permit is None:
            if self._bus.wants_rejections():
                events.append(CallRejected(self.name, self._clock.wall(), reason, state.value, False, retry_after))
            self._settle(events)
            raise CircuitOpenError(self.name, reason, retry_after)
        if events:
            self._settle(events)
        return permit

    def _count_blocked(self, reason: str) -> None:
        """One rejection for *reason* on a locked path (lock held)."""
        if reason == Reason.OPEN:
            next(self._blocked_open)  # the count the lock-free rejection steps too
        elif reason == Reason.HALF_OPEN_FULL:
            self._blocked_half_open += 1
        else:
            self._blocked_frozen += 1

    # ---------------------------------------------------------------- recording
    def record_success(self, permit: Permit, *, count_attempt: bool = True) -> None:
        """Record that the call admitted by *permit* succeeded.

        Args:
            permit: from :meth:`acquire`.
            count_attempt: also count the call in the 429 cascade window (False when the
                retry stage already counted each attempt with :meth:`note_attempt`).
        """
        if permit is self._healthy_permit:
            # Healthy CLOSED, without the lock: this success changes nothing but one
            # cascade call, counted by an atomic next(); rolling to a new second locks.
            if not count_attempt:
                with self._lock:
                    self._m_uncounted += 1  # a success the cascade does not count
                return
            cascade = self._cascade
            if self._mono() < cascade.bucket_end:
                next(cascade.counter)
                return
        if permit is self._closed_permit:
            lock = self._lock
            lock.acquire()
            try:
                if permit is self._closed_permit and self._lanes and not self._window.marked:  # type: ignore[union-attr]  # _lanes: a CountWindow
                    self._consecutive = 0
                    window = self._window
                    if window.calls < window.size:
                        window.calls += 1
                    if window.calls == window.size:
                        self._healthy_permit = permit
                        self._quiet_permit = permit if permit is self._fast_permit else None
                    if count_attempt:
                        now = self._mono()
                        self._cascade.add(now, False)
                        if now >= self._sync_due:
                            self._quiet_permit = self._fast_permit = None  # a shared store's consult is due
                    else:
                        self._m_uncounted += 1
                    self._mark()
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
            with self._lock:
                self._count_failure(rate_limited)  # a call let through by dry-run counts
            return
        if count_attempt and rate_limited:
            self.note_attempt(rate_limited=True, retry_after=retry_after, evaluate=False)
            count_attempt = False
        self._record(permit, ok=False, count_attempt=count_attempt, rate_limited=rate_limited)

    def record_ignored(self, permit: Permit) -> None:
        """The call ended in an ignored exception, a ``BaseException`` that is not an
        ``Exception``, or never reached the dependency: neither success nor failure. A trial
        gives its slot back; with a shared store, to the fleet's round."""
        with self._lock:
            self._m_ignored += 1
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
        with self._lock:
            self._mark()  # settled, for a call around a nested one
        if self._sync.finish_probe(self, permit, "abandon"):
            return
        with self._lock:
            if permit.generation == self._gen and self._state is HALF_OPEN and self._trials > 0:
                self._trials -= 1

    def _count_failure(self, rate_limited: bool) -> None:
        """One final failed outcome (lock held)."""
        if rate_limited:
            self._m_rate_limited += 1
        else:
            self._m_failure += 1

    def _record(self, permit: Permit, *, ok: bool, count_attempt: bool, rate_limited: bool = False) -> None:
        """One outcome off the lanes (a failure comes only from :meth:`record_failure`, and
        is counted here as its final outcome)."""
        if permit.dry_run:  # record_failure() counted a dry-run failure already
            if ok:
                with self._lock:
                    self._m_uncounted += 1  # a success outside the cascade's count
            return
        uncounted = ok and not count_attempt  # a success outside the cascade's count
        now = self._mono()
        started = permit.started
        # only while the trigger is on (a duration and a rate threshold, both > 0)
        slow = started is not None and self._timing and now - started >= self.config.slow_call_duration
        if permit.trial:
            with self._lock:
                self._mark()
                if ok:
                    self._m_uncounted += uncounted
                else:
                    self._count_failure(rate_limited)
                if count_attempt:
                    self._cascade.add(now, False)
                    if not ok:
                        self._m_noted += 1
            self._record_trial(permit, ok and not slow, now, slow)
            return
        events = self._outbox
        with self._lock:
            self._mark()
            if ok:
                self._m_uncounted += uncounted
            else:
                self._count_failure(rate_limited)
            if count_attempt:
                self._cascade.add(now, False)
                if not ok:
                    self._m_noted += 1  # a cascade call that is not a success
            if now >= self._sync_due:
                self._quiet_permit = self._fast_permit = None  # a shared store's consult is due
            if permit.generation != self._gen:
                pass  # stale outcome, dropped
            elif self._state is CLOSED:
                if ok and not slow:
                    self._consecutive = 0
                    self._window.add(False, False, now)
                    if self._lanes and not self._window.marked and self._window.calls == self._window.size:  # type: ignore[union-attr]  # _lanes: a CountWindow
                        healthy = self._healthy_permit = self._closed_permit
                        self._quiet_permit = healthy if healthy is self._fast_permit else None
                else:
                    self._invalidate()
                    if ok:
                        self._consecutive = 0  # a slow success is still a success
                    else:
                        self._consecutive += 1
                    self._window.add(not ok, slow, now)
                if self._forced is None:
                    trigger = self._closed_trigger(now, failed=not ok)
                    if trigger is not None:
                        self._trip(now, trigger, events)
            if rate_limited and self._state is CLOSED:
                self._check_cascade(now, events)
        self._settle(events)

    def _record_trial(self, permit: Permit, ok: bool, now: float, slow: bool = False) -> None:
        """A trial's outcome: N successes close, one failure reopens; stale ones drop.
        A slow trial is a failed one, reopening with trigger ``slow_call_rate``.
        With a shared store the fleet's round decides (one store operation)."""
        outcome = "slow" if slow else ("success" if ok else "failure")
        if self._sync.finish_probe(self, permit, outcome):
            return
        events = self._outbox
        with self._lock:
            if permit.generation == self._gen and self._state is HALF_OPEN:
                verdict = rules.trial_verdict(
                    successes=self._trial_successes,
                    max_calls=self.config.half_open_max_calls,
                    outcome=outcome,
                    frozen=frozen(),
                )
                if verdict == rules.GIVE_BACK:
                    self._trials -= 1  # no close, no reopen while frozen; the slot goes back
                elif verdict == rules.COUNT:
                    self._trial_successes += 1
                elif verdict == rules.CLOSE:
                    self._trial_successes += 1
                    self._to_closed(Trigger.HALF_OPEN_SUCCESS, events)
                else:
                    # a re-open is a trip like any other: with a shared store it is
                    # queued for write-back, and pushed once the store answers again
                    self._trip(now, rules.trial_trigger(outcome), events, reopen=True)
        self._settle(events)

    def note_attempt(self, *, rate_limited: bool = False, retry_after: Any = None, evaluate: bool = True) -> None:
        """Count one attempt at the dependency in the cascade window.

        A 429 sighting (*rate_limited*) also starts or extends the cooldown from
        *retry_after* and may open the breaker through the cascade.
        Outcomes for the breaker's own triggers are recorded separately.
        """
        now = self._mono()
        events = self._outbox
        with self._lock:
            self._cascade.add(now, rate_limited)
            self._m_noted += 1  # an attempt, never a success of its own
            if rate_limited:
                cfg = self.config
                seconds = parse_retry_after(
                    retry_after, default=cfg.default_cooldown, cap=cfg.max_cooldown, now_wall=self._clock.wall()
                )
                until = now + seconds
                if until > self._cooldown_until:
                    self._cooldown_until = until
                if evaluate and self._state is CLOSED:
                    self._check_cascade(now, events)
        self._settle(events)

    def report_rate_limit(self, retry_after: Any = None) -> None:
        """A 429 seen outside any protected call: a sighting counted as a call, a
        cooldown, and a failure of the current state (CLOSED: a recorded failure;
        HALF_OPEN: a failed probe; OPEN: nothing more). While a fleet probes through a
        shared store, the failure takes one of the round's slots (none free: a sighting only).
        """
        state = self.state  # applies a due recovery timeout first
        if state is HALF_OPEN and self._sync.shares_probes():
            try:
                permit = self.acquire_slow(metered=False)
            except CircuitOpenError:
                with self._lock:
                    self._m_rate_limited += 1  # a rate-limited call all the same
                self.note_attempt(rate_limited=True, retry_after=retry_after)
                return
            self.record_failure(permit, rate_limited=True, retry_after=retry_after)
            return
        with self._lock:
            state, gen = self._state, self._gen
            if state is OPEN:
                self._m_rate_limited += 1
        if state is OPEN:
            self.note_attempt(rate_limited=True, retry_after=retry_after)
            return
        permit = Permit(gen, trial=state is HALF_OPEN)
        if state is CLOSED and self._closed_permit is not None and self._closed_permit.generation == gen:
            permit = self._closed_permit
        self.record_failure(permit, rate_limited=True, retry_after=retry_after)

    def note_dry_run_refusal(self, remaining: float) -> None:
        """Dry-run: a cooldown refusal that did not happen; counted and logged."""
        with self._lock:
            self.dry_run_rejections += 1
        self._publish(
            [CallRejected(self.name, self._clock.wall(), reason="cooldown", state=self._state.value, dry_run=True)]
        )

    def cooldown_remaining(self) -> float:
        """Seconds left on this service's 429 cooldown in this process (0.0 when none)."""
        remaining = self._cooldown_until - self._mono()
        return remaining if remaining > 0 else 0.0

    # ------------------------------------------------------------------ triggers
    def _closed_trigger(self, now: float, *, failed: bool) -> str | None:
        """The trigger one recorded CLOSED outcome fires, or None (lock held): the consecutive
        count, then the rates over the window, the failure rate before the
        slow-call rate (gated by ``minimum_calls`` whatever the failure-rate setting).
        The order is :func:`rules.closed_trigger`'s."""
        cfg = self.config
        window = self._window
        if failed and self._consecutive >= cfg.failure_threshold:
            rate = slow = False  # decided already: the rates need not be read
        else:
            window.advance(now)
            rate = window.rate_reached(cfg.failure_rate_threshold, cfg.minimum_calls)
            slow = self._timing and window.slow_rate_reached(cfg.slow_call_rate_threshold, cfg.minimum_calls)
        return rules.closed_trigger(
            failed=failed,
            consecutive=self._consecutive,
            failure_threshold=cfg.failure_threshold,
            rate_reached=rate,
            slow_rate_reached=slow,
        )

    def _check_cascade(self, now: float, events: MutableSequence[Event]) -> None:
        if self._forced is not None or self._state is not CLOSED:
            return
        cfg = self.config
        calls, sightings = self._cascade.totals(now)
        if sightings < cfg.cascade_threshold or calls < cfg.cascade_min_calls:
            return
        rate = sightings * 100.0 / calls
        if rate < cfg.cascade_min_ratio:
            return
        events.append(RateLimitStorm(self.name, self._clock.wall(), count=sightings, calls=calls, rate=rate))
        self._trip(now, Trigger.RATE_LIMIT_CASCADE, events)

    # --------------------------------------------------------------- transitions
    def _refresh_fast(self) -> None:
        """Recompute the hot-path permit after a state or force change (lock held). With the
        slow-call trigger on, the CLOSED permit becomes the one admission copies."""
        fast = (
            self._closed_permit
            if self._state is CLOSED and self._forced is None and (not self._timed or self._mono() < self._sync_due)
            else None
        )
        self._quiet_permit = None
        if self._timing:
            self._fast_permit, self._timing_permit = None, fast
        else:
            self._fast_permit, self._timing_permit = fast, None
            if fast is not None and fast is self._healthy_permit:
                self._quiet_permit = fast

    def _configure_lanes(self) -> None:
        """Whether successes may skip the window (lock held, or in __init__): only with the
        count window and no call timing, where a success in a clean full window changes
        nothing. A time window must count every success.

        Calls are timed only while the slow-call trigger is on: a duration and a rate
        threshold both above 0. With either at 0 nothing is ever slow, in any state."""
        cfg = self.config
        self._timing = cfg.slow_call_duration > 0 and cfg.slow_call_rate_threshold > 0
        self._lanes = cfg.sliding_window_type == "count" and not self._timing
        if not self._lanes:
            self._quiet_permit = self._healthy_permit = None
        self.plain_types = cfg.plain_types  # empty while a result_predicate judges every value

    def _invalidate(self) -> None:
        """Clear what the lock-free paths read, before any failure is recorded or any state
        changes (lock held). Every mutating path calls this first; see the module docstring."""
        self._quiet_permit = None
        self._healthy_permit = None
        self._reject_until = 0.0

    def _trip(self, now: float, trigger: str, events: MutableSequence[Event], *, reopen: bool = False) -> None:
        """An automatic trigger fired (lock held): open at once for this process's traffic;
        the strategy decides when the events are published (a shared store first asks
        the store who decided the trip)."""
        if reopen:
            if frozen():
                return  # Level 3 holds it (the trial's verdict already said so)
        elif rules.trip_verdict(state=self._state.value, forced=self._forced, frozen=frozen()) != rules.TRIPPED:
            return  # Level 3 holds every automatic decision; a force refuses it
        held: list[Event] = []
        self._to_open(now, trigger, held)
        self._sync.trip_decided(self, trigger, held, events)

    def open_timing(self) -> tuple[float, float, float]:
        """``(recovery_timeout, backoff factor, cap)`` in seconds, for the store's open."""
        cfg = self.config
        return cfg.recovery_timeout, cfg.recovery_backoff_factor, cfg.recovery_timeout_max

    def _enter(
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

        The edge is checked against the legal-transition table first (:func:`~baldur_django.core.states.check_transition`); *adopted* marks a state taken
        over from a shared record, legal from any state.

        Returns:
            The wall-clock time of the transition (Unix seconds).

        Raises:
            IllegalTransition: the edge is not in the table (a programming error).
        """
        before = self._state
        check_transition(before, target, trigger, adopted=adopted)
        self._invalidate()
        if target is not before:
            key = (before.value, target.value, trigger)
            transitions = self._transitions
            if transitions is None:
                transitions = self._transitions = {}
            transitions[key] = transitions.get(key, 0) + 1
        self._gen += 1
        self._trials = 0
        self._trial_successes = 0
        self._state = target
        self._last_trigger = trigger
        if target is CLOSED:
            self._closed_permit = Permit(self._gen)
            self._opened_at = None
            self._opens = 0  # any close resets the backoff
        else:
            self._closed_permit = None
        self._refresh_fast()
        wall = self._clock.wall()
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

    def _hold_open_until(self, until: float) -> None:
        """OPEN rejects lock-free until *until* (monotonic), unless dry-run lets everything through."""
        if not self.config.dry_run:
            self._reject_until = until

    def _to_open(self, now: float, trigger: str, events: MutableSequence[Event]) -> None:
        """Open (lock held). An automatic open counts one more consecutive open and lasts its
        backed-off duration; a forced open leaves the count alone."""
        self._opened_at = self._enter(OPEN, trigger, events)
        if trigger != Trigger.FORCED:
            self._opens, self._open_seconds = next_open(self._opens, *self.open_timing())
        self._open_until = now + self._open_seconds
        if self._forced is None:
            self._hold_open_until(self._open_until)
        self._cascade.clear()

    def _to_half_open(self, trigger: str, events: MutableSequence[Event] | None) -> None:
        self._enter(HALF_OPEN, trigger, events)

    def _to_closed(self, trigger: str, events: MutableSequence[Event] | None, *, clear: bool = True) -> None:
        self._enter(CLOSED, trigger, events)
        if clear:
            self._consecutive = 0
            self._window.clear()

    def _evaluate(self, now: float, events: MutableSequence[Event]) -> None:
        """Apply a lapsed force and the recovery timeout (lazy transitions).

        With a shared store that answers, the store decides both (its operations
        normalise the record first); locally only while it is down.
        """
        if not self._sync.local_judgement():
            return
        if self._forced is not None and now >= self._force_until:
            previous = self._forced
            before = self._state
            self._clear_force()
            if rules.lapse_target(previous, frozen=frozen()) is not None:
                self._to_half_open(Trigger.FORCE_LAPSED, None)
            elif previous == "open":  # a lapsed forced open stays OPEN until the level drops
                self._open_until = now
            else:
                self._refresh_fast()
            events.append(
                ForceLapsed(
                    self.name,
                    self._clock.wall(),
                    previous=previous,
                    from_state=before.value,
                    to_state=self._state.value,
                )
            )
        if self._state is OPEN and rules.recovery_due(
            state="open", forced=self._forced, now=now, open_until=self._open_until, frozen=frozen()
        ):
            self._to_half_open(Trigger.RECOVERY_TIMEOUT, events)

    def _clear_force(self) -> None:
        self._invalidate()
        self._forced = None
        self._force_until = 0.0
        self._force_expires_at = None
        self._force_reason = ""
        self._force_actor = None

    # ------------------------------------------------------------------ adoption
    def _adopt(
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
        sync = self._sync
        if answer.lapsed is not None:
            events.append(
                ForceLapsed(
                    self.name,
                    self._clock.wall(),
                    previous=answer.lapsed,
                    from_state=self._state.value,
                    to_state=record.state,
                )
            )
        if isinstance(sync, StoreSync):
            # Same version: nothing new, unless this worker's own judgement during an outage
            # left it elsewhere; then it follows the record again (a local trip still
            # waiting for its push keeps its state: the push settles it).
            same = _STATES[record.state] is self._state and record.forced == self._forced
            if record.version == sync.version and not force and (same or sync.pending is not None):
                self._count_round(record)
                return
            if not force and sync.pending is not None and record.state == "closed" and record.forced is None:
                return  # a local trip waits for its push (read before it): the push settles it
            sync.version = record.version
            sync.next_probe = float("-inf")
        offset = now - answer.now  # store time -> this process's monotonic time
        before = self._state
        self._invalidate()
        if record.forced is not None:
            self._forced = record.forced
            self._force_until = (record.force_expires_at or answer.now) + offset
            self._force_expires_at = record.force_expires_at
            self._force_reason = record.force_reason
            self._force_actor = record.force_actor
        else:
            self._clear_force()
        target = _STATES[record.state]
        announce = answer.moved and answer.lapsed is None and target is not before and not announced
        trigger = record.trigger or Trigger.ADOPTED
        if target is not before or target is not CLOSED:
            self._enter(target, trigger, events if announce else None, adopted=True)
        else:  # CLOSED stays CLOSED: a record that never opened names no trigger to show
            if record.trigger is not None:
                self._last_trigger = record.trigger
            self._refresh_fast()
        if target is CLOSED:
            if before is not CLOSED:
                self._consecutive = 0
                self._window.clear()
        else:
            self._opened_at = record.opened_at
            if record.open_until is not None:
                self._open_until = record.open_until + offset
                if record.opened_at is not None and record.forced != "open":
                    self._open_seconds = record.open_until - record.opened_at
        self._opens = record.opens
        if target is OPEN:
            self._hold_open_until(self._force_until if record.forced == "open" else self._open_until)
        self._count_round(record)

    def _count_round(self, record: Record) -> None:
        """A shared HALF_OPEN round's counts as the record holds them: trials taken (in
        flight plus succeeded) and successes, as a memory breaker counts its own (lock held)."""
        if self._state is HALF_OPEN:
            self._trial_successes = record.successes
            self._trials = len(record.probes) + record.successes

    # -------------------------------------------------------------------- forces
    def force_open(self, ttl_minutes: float | None = None, reason: str = "", actor: str | None = None) -> None:
        """Hold the breaker OPEN for *ttl_minutes* minutes.

        Args:
            ttl_minutes: lifetime in minutes, > 0 and <= 1440; None uses
                ``BALDUR_CB_MANUAL_OVERRIDE_TTL_MINUTES``.
            reason: free text for logs and the audit.
            actor: who forced it (a user name, ``"command"``...).

        Raises:
            ConfigError: bad lifetime; nothing changes.
            StoreError: a shared store could not store the force.
        """
        self._force("open", ttl_minutes, reason, actor)

    def force_close(self, ttl_minutes: float | None = None, reason: str = "", actor: str | None = None) -> None:
        """Hold the breaker CLOSED for *ttl_minutes* minutes; failures are still recorded.

        Raises:
            ConfigError: bad lifetime; nothing changes.
            StoreError: a shared store could not store the force.
        """
        self._force("closed", ttl_minutes, reason, actor)

    def _force(self, mode: str, ttl_minutes: float | None, reason: str, actor: str | None) -> None:
        ttl = validate_ttl(ttl_minutes, self.config.default_ttl_minutes)
        reason = reason or ""
        events = self._outbox
        with self._sync.serial():
            answer = self._sync.store_force(self, mode, ttl * 60.0, reason, actor)
            now = self._mono()
            wall = self._clock.wall()
            with self._lock:
                if answer is None:
                    self._evaluate(now, events)
                before = self._state
                if answer is None:
                    self._apply_force(mode, now, wall, ttl, reason, actor)
                else:
                    self._adopt(answer, now, [], force=True)
                events.append(
                    Forced(
                        self.name,
                        wall,
                        mode=mode,
                        from_state=before.value,
                        to_state=self._state.value,
                        ttl_minutes=ttl,
                        expires_at=self._force_expires_at or 0.0,
                        reason=reason,
                        actor=actor,
                        dry_run=self.config.dry_run,
                    )
                )
        self._settle(events)

    def _apply_force(self, mode: str, now: float, wall: float, ttl: float, reason: str, actor: str | None) -> None:
        """A process-local force (lock held): the transition it implies publishes no
        ``StateChanged`` of its own (the ``Forced`` event says it all)."""
        self._invalidate()
        self._forced = mode
        self._force_until = now + ttl * 60.0
        self._force_expires_at = wall + ttl * 60.0
        self._force_reason = reason
        self._force_actor = actor
        if mode == "open":
            if self._state is not OPEN:
                self._to_open(now, Trigger.FORCED, [])
            else:
                self._enter(OPEN, Trigger.FORCED, None)
                self._opened_at = self._opened_at or wall
            self._hold_open_until(self._force_until)
        elif self._state is not CLOSED:
            self._to_closed(Trigger.FORCED, None)
        self._refresh_fast()

    def release(self, actor: str | None = None, reason: str = "") -> bool:
        """Hand the breaker back to automatic judgement.

        A forced open goes straight to HALF_OPEN; a forced closed stays CLOSED with its
        counts, and the next outcome evaluates the triggers.

        Returns:
            True when a force was removed, False when nothing was forced (a no-op).

        Raises:
            StoreError: a shared store could not store the release.
        """
        events = self._outbox
        with self._sync.serial():
            answer = self._sync.store_release(self)
            now = self._mono()
            with self._lock:
                before = self._state
                if answer is None:
                    self._evaluate(now, events)
                    before = self._state
                    previous = self._forced
                    if previous is not None:
                        self._clear_force()
                        if rules.release_target(previous) is not None:
                            self._to_half_open(Trigger.RELEASED, None)
                        else:
                            self._refresh_fast()
                else:
                    previous = answer.result
                    if answer.lapsed is not None:
                        events.append(
                            ForceLapsed(
                                self.name,
                                self._clock.wall(),
                                previous=answer.lapsed,
                                from_state=before.value,
                                to_state=answer.record.state,
                            )
                        )
                    self._adopt(answer, now, [], force=True)
                if previous is not None:
                    events.append(
                        Released(
                            self.name,
                            self._clock.wall(),
                            previous=previous,
                            from_state=before.value,
                            to_state=self._state.value,
                            actor=actor,
                            reason=reason,
                        )
                    )
        self._settle(events)
        return previous is not None

    # -------------------------------------------------------------- peers
    def apply_peer(self, state: str) -> str:
        """Adopt a peer worker's OPEN or CLOSED decision received through cluster propagation.

        Local adoption, with no threshold of its own and no store I/O: the deciding worker
        already wrote any shared store. The transition goes through the usual machinery and
        is published on this process's bus with trigger ``propagated`` (the propagation
        listener never sends such a transition on again, so peers cannot echo each other).
        Applied during Emergency Level 3 too: catching up with a decision taken elsewhere
        is not a new automatic decision.

        * ``"open"``: a CLOSED or HALF_OPEN breaker opens for its own (backed-off) recovery
          duration. A breaker forced closed refuses it as it refuses a trip: nothing
          changes and a ``TripBlocked`` event (``circuit_breaker.trip_blocked``, trigger
          ``propagated``) is published.
        * ``"closed"``: an OPEN or HALF_OPEN breaker closes with its counts cleared,
          a forced open included: the force is lifted (the documented hazard of cluster propagation).

        With a shared store the shared record stays the authority: the breaker's next
        admission consults it, so a force held there is taken back at once.

        Args:
            state (str): ``"open"`` or ``"closed"``.

        Returns:
            str: :data:`PEER_APPLIED`, :data:`PEER_UNCHANGED` (already in that state; a
            forced closed breaker stays forced), :data:`PEER_BLOCKED` (OPEN met a forced
            closed) or :data:`PEER_LIFTED` (CLOSED applied over a forced open).

        Raises:
            ConfigError: *state* is neither ``"open"`` nor ``"closed"``.
        """
        if state not in ("open", "closed"):
            raise ConfigError(f"state={state!r}: a peer's decision is 'open' or 'closed'")
        events = self._outbox
        now = self._mono()
        with self._lock:
            self._evaluate(now, events)
            current = self._state
            if state == "open":
                if current is OPEN:
                    outcome = PEER_UNCHANGED
                elif self._forced == "closed":
                    outcome = PEER_BLOCKED
                    events.append(
                        TripBlocked(self.name, self._clock.wall(), forced="closed", trigger=Trigger.PROPAGATED)
                    )
                else:
                    outcome = PEER_APPLIED
                    self._to_open(now, Trigger.PROPAGATED, events)
            elif current is CLOSED:
                outcome = PEER_UNCHANGED
            else:
                outcome = PEER_APPLIED
                if self._forced is not None:
                    outcome = PEER_LIFTED
                    self._clear_force()
                self._to_closed(Trigger.PROPAGATED, events)
            if outcome in (PEER_APPLIED, PEER_LIFTED):
                self._sync.after_peer(self)
                self._refresh_fast()
        self._settle(events)
        return outcome

    # ------------------------------------------------------------ configuration
    def use_store(self, guard: StoreGuard | None) -> None:
        """Share this breaker's state through *guard*'s store, or go back to process-local
        state (None). The breaker object stays the same: functions decorated before the
        store was configured keep working. Local counts are kept; a shared breaker's
        next call consults the store (first use)."""
        with self._lock:
            self._invalidate()
            if guard is None:
                self._sync = LOCAL
                self._timed = False
                self._sync_due = float("inf")
            else:
                self._sync = StoreSync(guard)
                self._timed = True
                self._sync_due = float("-inf")
            self._refresh_fast()

    def sync(self) -> None:
        """Consult the shared record now, whatever the sync interval says (no-op locally)."""
        self._sync.consult(self, self._mono())

    def reconfigure(self, config: BreakerConfig) -> None:
        """Swap in a new configuration. A new window size restarts the window."""
        config = shared_config(config)
        with self._lock:
            self._invalidate()  # re-derived by the next locked admission and success
            old = self.config
            if (config.sliding_window_type, config.sliding_window_size, config.sliding_window_seconds) != (
                old.sliding_window_type,
                old.sliding_window_size,
                old.sliding_window_seconds,
            ):
                self._window = _window_for(config)
            if config.cascade_window != self._cascade.span:
                self._cascade.span = config.cascade_window
            self.config = config
            self._configure_lanes()
            self._refresh_fast()

    def reset(self) -> None:
        """Return to a fresh CLOSED breaker: counts, 429 cooldown, backoff and any force
        cleared (for tests and operator tooling), whatever the state was.

        With a shared store the shared record is reset too (one store operation), so every
        worker follows at its next consult; a trip of this worker still waiting to be
        written is dropped. Publishes a :class:`~baldur_django.core.events.Reset` event,
        logged as ``circuit_breaker.reset`` and sent as the Django signal ``circuit_reset``.

        Raises:
            StoreError: a shared store could not store the reset; nothing changed.
        """
        events = self._outbox
        with self._sync.serial():
            answer = self._sync.store_reset(self)
            now = self._mono()
            with self._lock:
                if answer is None:
                    self._evaluate(now, events)  # a lapse due now is announced first
                before = self._state
                previous = self._forced if answer is None else answer.result
                if answer is not None:
                    self._adopt(answer, now, [], force=True)  # the record's version: not adopted again
                self._clear_force()
                self._enter(CLOSED, Trigger.RESET, None)  # a new generation: calls in flight are stale
                self._consecutive = 0
                self._window.clear()
                self._cascade.clear()
                self._cooldown_until = 0.0
                self.dry_run_rejections = 0
                events.append(
                    Reset(
                        self.name,
                        self._clock.wall(),
                        from_state=before.value,
                        to_state=CLOSED.value,
                        forced=previous or "",
                    )
                )
        self._settle(events)

    # ------------------------------------------------------------------- events
    def _settle(self, events: Collection[Event] = ()) -> None:
        """After a locked section (state lock NOT held): write a trip the strategy left
        pending to the shared store (store I/O), then deliver the queued events."""
        if self._sync.pending is not None:
            self._sync.push_trip(self)
        self._publish(events)

    def _publish(self, events: Collection[Event] = ()) -> None:
        """Deliver queued events in order (state lock NOT held, no I/O of its own); *events*
        not yet queued are queued first. A listener that touches this breaker while being
        called queues what that produces; the outer delivery loop hands it on after the
        current event has reached every listener."""
        outbox = self._outbox
        if events is not outbox and events:
            outbox.extend(events)
        if not outbox or self._drainer == threading.get_ident():
            return
        publish = self._bus.publish
        drain = self._drain
        if drain is None:
            with _DRAIN_MADE:
                drain = self._drain
                if drain is None:
                    drain = self._drain = threading.Lock()
        with drain:
            self._drainer = threading.get_ident()
            try:
                while True:
                    try:
                        event = outbox.pop(0)
                    except IndexError:
                        return
                    publish(event)
            finally:
                self._drainer = None


_STATES = {"closed": CLOSED, "open": OPEN, "half_open": HALF_OPEN}

#: Taken only to make a breaker's delivery lock on its first delivery (_publish).
_DRAIN_MADE = threading.Lock()

# ------------------------------------------------------------ shared configurations
# A BreakerConfig with its classifier is some 2 KB; a worker's breakers mostly share one
# effective configuration (memory per breaker: a fleet may hold many thousands). BreakerConfig is a frozen
# dataclass and nothing changes one after it was built, so breakers whose configurations
# are equal field for field (of the same types, the same clock object, the same
# overrides) can hold one object. A configuration with a predicate is never shared: its
# classifier's throttle of ``circuit_breaker.predicate_failed`` lines is per breaker.
_CONFIG_VALUES = operator.attrgetter(
    *(f.name for f in dataclasses.fields(BreakerConfig) if f.compare and f.name != "overrides")
)
_SHARED_CONFIGS: weakref.WeakValueDictionary[tuple[Any, ...], BreakerConfig] = weakref.WeakValueDictionary()
_SHARED_LOCK = threading.Lock()


def shared_config(config: BreakerConfig) -> BreakerConfig:
    """The configuration object to hold for *config*: an equal one some live breaker holds
    already, else *config* itself (remembered, weakly, for the next breakers).

    Args:
        config (BreakerConfig): a resolved configuration.

    Returns:
        BreakerConfig: *config* or an equal, immutable object: every field (``clock``
        included, by identity) and every override (with its type) the same. A
        configuration with ``failure_predicate``, ``result_predicate`` or a callable in
        ``ignore_exceptions`` comes back as itself (its log throttle is its breaker's own).
    """
    if _LAST_SHARED() is config:  # the same object again (a memoised build): nothing to look up
        return config
    if config.failure_predicate is not None or config.result_predicate is not None or config.classifier.ignore_checks:
        return config
    values = _CONFIG_VALUES(config)
    try:
        key = (
            values,
            tuple(map(type, values)),
            tuple((name, type(value), value) for name, value in sorted(config.overrides.items())),
            id(config.clock),  # the config holds the clock, so the id is not reused while it lives
        )
        hash(key)
    except TypeError:  # an unhashable value (an override of a type no knob produces)
        return config
    with _SHARED_LOCK:
        known = _SHARED_CONFIGS.get(key)
        if known is None:
            known = _SHARED_CONFIGS[key] = config
        _note_shared(known)
    return known


def _no_config() -> BreakerConfig | None:
    return None


_LAST_SHARED: Callable[[], BreakerConfig | None] = _no_config  # a weak reference to the last one handed out


def _note_shared(config: BreakerConfig) -> None:
    global _LAST_SHARED
    _LAST_SHARED = weakref.ref(config)


def _window_for(config: BreakerConfig) -> CountWindow | TimeWindow:
    """The sliding window *config* asks for: the last N outcomes, or the last N seconds."""
    if config.sliding_window_type == "time":
        return TimeWindow(config.sliding_window_seconds)
    return CountWindow(config.sliding_window_size)

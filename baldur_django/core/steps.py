"""One state machine, applied once: :func:`step` computes every transition of a breaker.

Every change of a breaker's state, local or shared, is one call of :func:`step` on a
:class:`~baldur_django.core.stores.base.Record`:

* the local breaker (``core/machine.py``) *is* a record (its state fields are the record's,
  its times the breaker's monotonic seconds) and applies each step's :class:`Outcome` under
  its state lock (new permits, events, the hot-path fields);
* the memory and database stores run :func:`run` (a store operation named by a string) on
  the record they load, inside their lock or transaction, and write it back;
* the Redis store's Lua scripts (``stores/lua/``) are the one other copy of these rules.

An event is one of the small frozen classes below. :func:`step` normalises the record first
(a force past its lifetime lapses; expired probe leases go), then applies the event with
the verdicts of :mod:`~baldur_django.core.rules`. It does no I/O, reads no clock and no
emergency level: the time ``now`` (store-clock Unix seconds for a stored record, monotonic
seconds for a breaker's own), the open timing and ``frozen`` (Emergency Level 3) are its
arguments.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from . import rules
from .stores.base import Answer, Record

__all__ = [
    "Timing",
    "Observe",
    "Sweep",
    "Trip",
    "AcquireProbe",
    "FinishProbe",
    "Force",
    "Release",
    "Clear",
    "Peer",
    "Adopt",
    "StuckOpen",
    "Prune",
    "Event",
    "Outcome",
    "step",
    "run",
    "prunable",
    "NO_TIMING",
]


@dataclass(frozen=True, slots=True)
class Timing:
    """How long automatic opens last: the *opens*-th consecutive one lasts
    ``min(recovery_timeout * factor**(opens-1), cap)`` seconds."""

    recovery_timeout: float
    factor: float = 1.0
    cap: float = math.inf


#: The timing of steps that open nothing automatically (forces, releases, reads).
NO_TIMING = Timing(0.0)


@dataclass(frozen=True, slots=True)
class Observe:
    """A read: only the normalisation (a force past its lifetime lapses, expired leases go)."""


@dataclass(frozen=True, slots=True)
class Sweep:
    """The recovery timeout: an unforced OPEN past ``open_until`` moves to HALF_OPEN."""


@dataclass(frozen=True, slots=True)
class Trip:
    """An automatic trigger fired on a call outcome: ``consecutive_failures``,
    ``failure_rate``, ``slow_call_rate`` or ``rate_limit_cascade`` (the caller's window and
    counters say which; :func:`~baldur_django.core.rules.closed_trigger`,
    :func:`~baldur_django.core.rules.cascade_rate`)."""

    trigger: str


@dataclass(frozen=True, slots=True)
class AcquireProbe:
    """A probe request: the recovery timeout first, then one of the round's *max_calls*
    slots for *token*, held until ``now + lease_seconds``."""

    token: str
    max_calls: int
    lease_seconds: float


@dataclass(frozen=True, slots=True)
class FinishProbe:
    """A trial's *outcome* (``success``, ``failure``, ``slow``, ``abandon``) in round
    *version*. *token* None: a failure seen without a slot (a 429 reported outside any call
    while HALF_OPEN), which fails the round like a trial's."""

    token: str | None
    version: int
    outcome: str
    max_calls: int


@dataclass(frozen=True, slots=True)
class Force:
    """An operator holds the breaker ``"open"`` or ``"closed"`` for *ttl_seconds*."""

    mode: str
    ttl_seconds: float
    reason: str = ""
    actor: str | None = None


@dataclass(frozen=True, slots=True)
class Release:
    """An operator removes the force held."""


@dataclass(frozen=True, slots=True)
class Clear:
    """A reset: back to a fresh CLOSED record, whatever it held."""


@dataclass(frozen=True, slots=True)
class Peer:
    """A peer worker's propagated ``"open"`` or ``"closed"`` decision."""

    state: str


@dataclass(frozen=True, slots=True)
class Adopt:
    """A breaker takes over a shared store's *record* (the store computed its transition):
    its times move by *offset* seconds (store clock -> the breaker's), a missing force
    expiry counts as *store_now*. *round_only*: the version is the one already adopted,
    only the probing round's counts are taken."""

    record: Record
    offset: float
    store_now: float
    round_only: bool = False


@dataclass(frozen=True, slots=True)
class StuckOpen:
    """The watchdog's question: has the record been OPEN at least *stuck_after* seconds?"""

    stuck_after: float


@dataclass(frozen=True, slots=True)
class Prune:
    """The registry prune's question: may the record be forgotten?"""


Event = Observe | Sweep | Trip | AcquireProbe | FinishProbe | Force | Release | Clear | Peer | Adopt | StuckOpen | Prune


@dataclass(slots=True)
class Outcome:
    """What one step did to its record (changed in place).

    Attributes:
        before (str): the state before the step.
        result: the event's answer: ``TRIPPED``/``BLOCKED``/``ALREADY`` for :class:`Trip`;
            True/False for :class:`AcquireProbe`; ``"closed"``, ``"open"`` or None for
            :class:`FinishProbe`; the force removed (or None) for :class:`Release` and
            :class:`Clear`; True when it moved for :class:`Sweep`; a
            :data:`~baldur_django.core.rules.PEER_APPLIED`-style verdict for :class:`Peer`;
            seconds open or None for :class:`StuckOpen`; a bool for :class:`Prune`.
        lapsed (str | None): the force the normalisation lapsed, if any (announced once).
        reason (str | None): why a probe request was refused (``"open"``, ``"frozen"``,
            ``"half_open_full"``), else None.
    """

    before: str
    result: object = None
    lapsed: str | None = None
    reason: str | None = None

    def moved(self, record: Record) -> bool:
        """True when the step changed *record*'s state."""
        return record.state != self.before


def step(record: Record, event: Event, now: float, timing: Timing = NO_TIMING, frozen: bool = False) -> Outcome:
    """Apply *event* to *record* (changed in place): every transition of a breaker.

    Args:
        record (Record): the state, changed in place.
        event (Event): what happened.
        now (float): the current time in the record's seconds (store-clock Unix seconds for
            a stored record, monotonic seconds for a breaker's own).
        timing (Timing): the open timing (seconds) for steps that may open automatically.
        frozen (bool): Emergency Level 3 holds every automatic step: no trip, no probe, no
            recovery, a trial only gives its slot back, a lapsed forced open stays OPEN.

    Returns:
        Outcome: the state before, the event's answer, the force lapsed. Raises nothing for
        a known event; ValueError for an unknown one (a programming error).
    """
    outcome = Outcome(record.state)
    if isinstance(event, (StuckOpen, Prune)):  # questions: the record is read as stored
        outcome.result = _question(record, event, now)
    elif isinstance(event, Adopt):  # the store normalised its record already
        _adopt(record, event)
    else:
        outcome.lapsed = rules.normalise(record, now, frozen)
        _change(record, event, now, timing, frozen, outcome)
    return outcome


def _change(record: Record, event: Event, now: float, timing: Timing, frozen: bool, outcome: Outcome) -> None:
    """The event itself, on a normalised record."""
    if isinstance(event, Sweep):
        outcome.result = rules.op_sweep(record, now, frozen)
    elif isinstance(event, Trip):
        outcome.result = rules.op_trip(
            record, now, event.trigger, timing.recovery_timeout, timing.factor, timing.cap, frozen=frozen
        )
    elif isinstance(event, (AcquireProbe, FinishProbe)):
        _probe(record, event, now, timing, frozen, outcome)
    elif isinstance(event, Force):
        rules.op_force(record, now, event.mode, event.ttl_seconds, event.reason, event.actor)
    elif isinstance(event, Release):
        outcome.result = rules.op_release(record, now)
    elif isinstance(event, Clear):
        outcome.result = rules.op_clear(record, now)
    elif isinstance(event, Peer):
        outcome.result = rules.op_peer(record, now, event.state, timing.recovery_timeout, timing.factor, timing.cap)
    elif not isinstance(event, Observe):
        raise ValueError(f"unknown event {event!r}")


def _probe(record: Record, event: Event, now: float, timing: Timing, frozen: bool, outcome: Outcome) -> None:
    if isinstance(event, AcquireProbe):
        admitted, _, outcome.reason = rules.op_acquire_probe(
            record, now, event.token, event.max_calls, event.lease_seconds, frozen=frozen
        )
        outcome.result = admitted
    elif isinstance(event, FinishProbe):
        outcome.result = rules.op_finish_probe(
            record,
            now,
            event.token,
            event.version,
            event.outcome,
            event.max_calls,
            timing.recovery_timeout,
            timing.factor,
            timing.cap,
            frozen=frozen,
        )


def _adopt(record: Record, event: Adopt) -> None:
    """Take over the store's record (see :class:`Adopt`): a new version unless a CLOSED
    record meets a CLOSED one (then only a trigger the record names is taken)."""
    shared, offset = event.record, event.offset
    if not event.round_only:
        if shared.forced is None:
            rules.unforce(record)
        else:
            record.forced = shared.forced
            expires = shared.force_expires_at
            record.force_expires_at = (expires if expires is not None else event.store_now) + offset
            record.force_reason = shared.force_reason
            record.force_actor = shared.force_actor
        if shared.state != record.state or shared.state != "closed":
            record.version += 1
            record.state = shared.state
            record.trigger = shared.trigger or "adopted"
            record.probes = {}
            record.successes = 0
            record.updated_at = event.store_now + offset
        elif shared.trigger is not None:
            record.trigger = shared.trigger
        if shared.state == "closed":
            record.opened_at = record.open_until = None
        else:
            record.opened_at = None if shared.opened_at is None else shared.opened_at + offset
            if shared.open_until is not None:
                record.open_until = shared.open_until + offset
        record.opens = shared.opens
    if record.state == "half_open":  # the fleet's round: its leases in the breaker's seconds
        record.successes = shared.successes
        record.probes = {token: until + offset for token, until in shared.probes.items()}


def _question(record: Record, event: Event, now: float) -> object:
    if isinstance(event, StuckOpen):
        return rules.stuck_open_for(record, now, event.stuck_after)
    return rules.prunable(record)


def prunable(record: Record) -> bool:
    """Only a CLOSED, unforced record may be forgotten by the registry prune (the
    :class:`Prune` step's answer)."""
    return bool(step(record, Prune(), 0.0).result)


def stuck_open_for(record: Record, now: float, stuck_after: float) -> float | None:
    """The seconds an OPEN *record* has been open when that is at least *stuck_after*
    seconds (the watchdog's rule, the :class:`StuckOpen` step's answer), else None."""
    seconds = step(record, StuckOpen(stuck_after), now).result
    return None if seconds is None else float(seconds)  # type: ignore[arg-type]


def _event(op: str, args: tuple[object, ...]) -> tuple[Event, Timing]:
    """A store operation's name and positional arguments as an event and its timing."""
    if op in ("load", "inspect"):
        return Observe(), NO_TIMING
    if op == "trip":
        trigger, *rest = args
        return Trip(str(trigger)), Timing(*rest)  # type: ignore[arg-type]
    if op == "acquire_probe":
        return AcquireProbe(*args), NO_TIMING  # type: ignore[arg-type]
    if op == "finish_probe":
        token, version, outcome, max_calls, *rest = args
        return FinishProbe(token, version, outcome, max_calls), Timing(*rest)  # type: ignore[arg-type]
    if op == "force":
        return Force(*args), NO_TIMING  # type: ignore[arg-type]
    if op == "release":
        return Release(), NO_TIMING
    if op == "clear":
        return Clear(), NO_TIMING
    if op == "sweep":
        return Sweep(), NO_TIMING
    raise ValueError(f"unknown store operation {op!r}")


def run(op: str, record: Record, now: float, *args: object, frozen: bool = False) -> Answer:
    """A store operation: the :func:`step` of the event *op* names, as an :class:`Answer`.

    Args:
        op (str): ``load``, ``inspect``, ``trip``, ``acquire_probe``, ``finish_probe``,
            ``force``, ``release``, ``clear`` or ``sweep``.
        record (Record): the stored record, changed in place.
        now (float): the store clock (Unix seconds).
        *args: the operation's arguments in the store protocol's order (seconds).
        frozen (bool): Emergency Level 3.

    Raises:
        ValueError: an unknown *op* (a programming error).
    """
    event, timing = _event(op, args)
    outcome = step(record, event, now, timing, frozen)
    return Answer(
        record=record, now=now, result=outcome.result, lapsed=outcome.lapsed, moved=record.state != outcome.before
    )

"""The verdicts of every transition, as pure functions (no I/O, no locking, no clock).

:func:`~baldur_django.core.steps.step` is the one function that applies them: the local
breaker (``core/machine.py``), the memory and database stores all run it, and it runs
``normalise`` first, then one ``op_*`` function below, each built from the same verdicts.
Callers also read the verdicts directly where they decide no transition: which trigger
one outcome fires (:func:`closed_trigger`, :func:`cascade_rate`) before a ``Trip`` step,
and why an OPEN breaker refuses a call (:func:`open_refusal`).

The Redis store's Lua scripts (``stores/lua/``) are the one other copy of these rules.
Every input is an argument: the current time ``now`` (store-clock Unix seconds for a
record, the breaker's monotonic seconds for the breaker), configuration values, and
``frozen`` (Emergency Level 3), which the caller reads; nothing here imports
emergency, a clock or a store.
"""

from __future__ import annotations

import math

from .stores.base import ALREADY, BLOCKED, TRIPPED, Record

__all__ = [
    "TRIPPED",
    "BLOCKED",
    "ALREADY",
    "CLOSE",
    "REOPEN",
    "GIVE_BACK",
    "COUNT",
    "trip_verdict",
    "closed_trigger",
    "trial_verdict",
    "trial_trigger",
    "recovery_due",
    "lapse_target",
    "release_target",
    "probe_refusal",
    "open_refusal",
    "cascade_rate",
    "peer_verdict",
    "PEER_APPLIED",
    "PEER_UNCHANGED",
    "PEER_BLOCKED",
    "PEER_LIFTED",
    "open_duration",
    "next_open",
    "normalise",
    "op_trip",
    "op_acquire_probe",
    "op_finish_probe",
    "op_force",
    "op_release",
    "op_clear",
    "op_sweep",
    "prunable",
    "stuck_open_for",
    "op_peer",
    "unforce",
]

#: What a trial's outcome does to its probing round (:func:`trial_verdict`).
CLOSE = "close"  # the round is complete: HALF_OPEN -> CLOSED (trigger half_open_success)
REOPEN = "reopen"  # a failed (or slow) trial: HALF_OPEN -> OPEN
GIVE_BACK = "give_back"  # the slot goes back, nothing else (abandoned, or frozen)
COUNT = "count"  # one more success of the round, not yet enough to close

#: What a peer's propagated decision does to a breaker (:func:`peer_verdict`).
PEER_APPLIED = "applied"  # the breaker moves to the peer's state
PEER_UNCHANGED = "unchanged"  # it is in that state already
PEER_BLOCKED = "blocked"  # an OPEN met a local forced closed (like a trip meeting a force)
PEER_LIFTED = "lifted"  # a CLOSED is applied over a local forced open (the documented hazard)


# ----------------------------------------------------------------------------- verdicts
def trip_verdict(*, state: str, forced: str | None, frozen: bool, reopen: bool = False) -> str:
    """Whether an automatic trigger may open the breaker now.

    Args:
        state (str): ``"closed"``, ``"open"`` or ``"half_open"``.
        forced (str | None): the force held, if any.
        frozen (bool): Emergency Level 3 holds every automatic decision.
        reopen (bool): the open is a failed trial's re-open (its round's verdict was
            :data:`REOPEN`): only Level 3 holds it.

    Returns:
        str: ``TRIPPED`` (open it), ``BLOCKED`` (a force refuses it) or ``ALREADY`` (not
        CLOSED any more, or frozen: nothing to do).
    """
    if frozen:
        return ALREADY
    if reopen:
        return TRIPPED
    if forced is not None:
        return BLOCKED
    if state != "closed":
        return ALREADY
    return TRIPPED


def closed_trigger(
    *, failed: bool, consecutive: int, failure_threshold: int, rate_reached: bool, slow_rate_reached: bool
) -> str | None:
    """Which trigger one recorded CLOSED outcome fires, or None.

    The consecutive count first, then the failure rate, then the slow-call rate: when the
    two rates cross on one outcome the trigger is ``failure_rate``.
    """
    if failed and consecutive >= failure_threshold:
        return "consecutive_failures"
    if rate_reached:
        return "failure_rate"
    if slow_rate_reached:
        return "slow_call_rate"
    return None


def trial_verdict(*, successes: int, max_calls: int, outcome: str, frozen: bool) -> str:
    """What one trial's *outcome* does to its round.

    Args:
        successes (int): successes of the round before this outcome.
        max_calls (int): ``half_open_max_calls``: successes that close the breaker.
        outcome (str): ``"success"``, ``"failure"``, ``"slow"`` (a slow trial fails its
            round while the slow-call trigger is on) or ``"abandon"`` (the trial never
            reached the dependency, or ended in an ignored exception).
        frozen (bool): Level 3: no close, no reopen; the slot goes back.

    Returns:
        str: :data:`CLOSE`, :data:`COUNT`, :data:`REOPEN` or :data:`GIVE_BACK`.
    """
    if frozen or outcome == "abandon":
        return GIVE_BACK
    if outcome == "success":
        return CLOSE if successes + 1 >= max_calls else COUNT
    return REOPEN


def trial_trigger(outcome: str) -> str:
    """The trigger of a re-open after a failed trial: ``slow_call_rate`` for a slow one,
    else ``half_open_failure``."""
    return "slow_call_rate" if outcome == "slow" else "half_open_failure"


def recovery_due(*, state: str, forced: str | None, now: float, open_until: float | None, frozen: bool) -> bool:
    """True when an OPEN, unforced breaker's recovery timeout has passed: it moves to
    HALF_OPEN with trigger ``recovery_timeout``. Never while frozen."""
    return state == "open" and forced is None and open_until is not None and now >= open_until and not frozen


def lapse_target(previous: str, *, frozen: bool) -> str | None:
    """The state a lapsed force leaves behind: a forced open goes to HALF_OPEN, unless
    Level 3 holds it OPEN; a forced closed stays CLOSED (None: no state change)."""
    return "half_open" if previous == "open" and not frozen else None


def release_target(previous: str) -> str | None:
    """The state a release leaves behind: HALF_OPEN after a forced open, else no change."""
    return "half_open" if previous == "open" else None


def probe_refusal(*, state: str, forced: str | None, taken: int, max_calls: int, frozen: bool) -> str | None:
    """Why a probe request is refused, or None when it takes a slot.

    Args:
        state (str): the state after the recovery timeout was applied.
        forced (str | None): the force held, if any.
        taken (int): slots of the round already taken (in flight plus succeeded).
        max_calls (int): ``half_open_max_calls``.
        frozen (bool): Level 3: no probe.

    Returns:
        str | None: ``"frozen"``, ``"half_open_full"``, ``"open"`` (not HALF_OPEN, or
        forced), or None.
    """
    if state != "half_open" or forced is not None:
        return "open"
    if frozen:
        return "frozen"
    if taken >= max_calls:
        return "half_open_full"
    return None


def open_refusal(*, forced: str | None, now: float, until: float, frozen: bool) -> str:
    """Why an OPEN breaker refuses a call: ``"frozen"`` while Emergency Level 3 holds an
    automatic open past its recovery timeout (*until*, in the caller's seconds), else
    ``"open"`` (the open time runs, or a force holds it)."""
    if now >= until and forced is None and frozen:
        return "frozen"
    return "open"


def cascade_rate(
    *,
    state: str,
    forced: str | None,
    calls: int,
    sightings: int,
    threshold: int,
    min_calls: int,
    min_ratio: float,
) -> float | None:
    """Whether the 429 cascade trips an unforced CLOSED breaker: the share of rate-limited
    answers among the window's *calls*, in percent, when it trips, else None.

    Args:
        state, forced: the breaker's state value and force (only an unforced CLOSED trips).
        calls, sightings: attempts and 429 sightings in the cascade window.
        threshold, min_calls: the fewest sightings and calls that can trip.
        min_ratio: the share of sightings (percent) that trips.
    """
    if forced is not None or state != "closed" or sightings < threshold or calls < min_calls:
        return None
    rate = sightings * 100.0 / calls
    return rate if rate >= min_ratio else None


def peer_verdict(*, state: str, forced: str | None, peer: str) -> str:
    """What a peer worker's propagated ``"open"`` or ``"closed"`` decision does to a breaker
    in *state* (a state value) holding *forced*: :data:`PEER_APPLIED`,
    :data:`PEER_UNCHANGED` (already there), :data:`PEER_BLOCKED` (an OPEN meets a forced
    closed, as a trip does) or :data:`PEER_LIFTED` (a CLOSED over a force, which it lifts).
    Applied under Emergency Level 3 too: catching up with a decision taken elsewhere is not
    a new automatic decision."""
    if peer == "open":
        if state == "open":
            return PEER_UNCHANGED
        return PEER_BLOCKED if forced == "closed" else PEER_APPLIED
    if state == "closed":
        return PEER_UNCHANGED
    return PEER_APPLIED if forced is None else PEER_LIFTED


def open_duration(opens: int, recovery_timeout: float, factor: float, cap: float = math.inf) -> float:
    """Seconds the *opens*-th consecutive automatic open lasts.

    ``min(recovery_timeout * factor**(opens-1), cap)``; with a factor of 1.0 (backoff off)
    every open lasts the recovery timeout. Never overflows: a product past the float range
    is *cap*.
    """
    if opens <= 1 or factor == 1.0:
        return min(recovery_timeout, cap)
    try:
        seconds = recovery_timeout * factor ** (opens - 1)
    except OverflowError:
        return cap
    return min(seconds, cap)


def next_open(opens: int, recovery_timeout: float, factor: float, cap: float = math.inf) -> tuple[int, float]:
    """``(opens, seconds)`` after one more automatic open.

    The count goes up by one per automatic open since the last close and stops at the first
    value whose duration reaches *cap*, so its power never overflows.
    """
    if opens < 1 or open_duration(opens, recovery_timeout, factor, cap) < cap:
        opens += 1
    return opens, open_duration(opens, recovery_timeout, factor, cap)


def _bump(record: Record, state: str, now: float, trigger: str | None) -> None:
    record.state = state
    record.version += 1
    record.probes = {}
    record.successes = 0
    record.trigger = trigger
    record.updated_at = now
    if state == "closed":
        record.opens = 0  # any close resets the backoff


def _open(record: Record, now: float, trigger: str, recovery_timeout: float, factor: float, cap: float) -> None:
    """An automatic open: one more consecutive open, lasting its backed-off duration."""
    _bump(record, "open", now, trigger)
    record.opens, seconds = next_open(record.opens, recovery_timeout, factor, cap)
    record.opened_at = now
    record.open_until = now + seconds


def normalise(record: Record, now: float, frozen: bool = False) -> str | None:
    """Lapse an expired force and drop expired probe leases. Returns the lapsed force or None.

    While Level 3 holds (*frozen*) a lapsed forced open stays OPEN, due for a probe as
    soon as the level drops."""
    lapsed = None
    if record.forced is not None and record.force_expires_at is not None and now >= record.force_expires_at:
        lapsed = record.forced
        record.forced = None
        record.force_expires_at = None
        record.force_reason = ""
        record.force_actor = None
        target = lapse_target(lapsed, frozen=frozen)
        if target is not None:
            _bump(record, target, now, "force_lapsed")
        else:
            # a new version even when the state stays: workers holding the force adopt its end
            record.version += 1
            if lapsed == "open":
                record.open_until = now
            record.updated_at = now
    if record.probes:
        record.probes = {token: until for token, until in record.probes.items() if until > now}
    return lapsed


def op_trip(
    record: Record,
    now: float,
    trigger: str,
    recovery_timeout: float,
    factor: float = 1.0,
    cap: float = math.inf,
    *,
    frozen: bool = False,
) -> str:
    """An automatic trigger fired: ``TRIPPED``, ``BLOCKED`` or ``ALREADY`` (see :func:`trip_verdict`)."""
    verdict = trip_verdict(state=record.state, forced=record.forced, frozen=frozen)
    if verdict == TRIPPED:
        _open(record, now, trigger, recovery_timeout, factor, cap)
    return verdict


def op_sweep(record: Record, now: float, frozen: bool = False) -> bool:
    """OPEN (unforced) past ``open_until`` -> HALF_OPEN; True when it moved."""
    if recovery_due(state=record.state, forced=record.forced, now=now, open_until=record.open_until, frozen=frozen):
        _bump(record, "half_open", now, "recovery_timeout")
        return True
    return False


def op_acquire_probe(
    record: Record, now: float, token: str, max_calls: int, lease_seconds: float, *, frozen: bool = False
) -> tuple[bool, bool, str | None]:
    """Returns ``(admitted, moved, refusal)`` (see :func:`probe_refusal`). The probes are
    never changed in place (a breaker's fresh record shares one empty mapping)."""
    moved = op_sweep(record, now, frozen)
    taken = len(record.probes) + record.successes
    refusal = probe_refusal(state=record.state, forced=record.forced, taken=taken, max_calls=max_calls, frozen=frozen)
    if refusal is not None:
        return False, moved, refusal
    record.probes = {**record.probes, token: now + lease_seconds}
    record.updated_at = now
    return True, moved, None


def op_finish_probe(
    record: Record,
    now: float,
    token: str | None,
    version: int,
    outcome: str,
    max_calls: int,
    recovery_timeout: float,
    factor: float = 1.0,
    cap: float = math.inf,
    *,
    frozen: bool = False,
) -> str | None:
    """Returns the transition made (``"closed"``, ``"open"``) or None. *outcome* is
    ``"success"``, ``"failure"``, ``"slow"`` (a slow trial fails the round) or
    ``"abandon"``; see :func:`trial_verdict`. A *token* of None is a failure seen without a
    slot of the round (a breaker's 429 reported outside any call)."""
    if record.version != version or record.state != "half_open":
        return None  # stale: a newer round
    if token is not None:
        if token not in record.probes:
            return None  # the lease expired and the slot went to another worker
        record.probes = {held: until for held, until in record.probes.items() if held != token}
    elif outcome == "success" or outcome == "abandon":
        return None  # only a failure counts without a slot
    record.updated_at = now
    verdict = trial_verdict(successes=record.successes, max_calls=max_calls, outcome=outcome, frozen=frozen)
    if verdict == COUNT:
        record.successes += 1
    elif verdict == CLOSE:
        record.successes += 1
        _bump(record, "closed", now, "half_open_success")
        record.opened_at = None
        record.open_until = None
        return "closed"
    elif verdict == REOPEN:
        _open(record, now, trial_trigger(outcome), recovery_timeout, factor, cap)
        return "open"
    return None


def op_force(record: Record, now: float, mode: str, ttl_seconds: float, reason: str, actor: str | None) -> None:
    target = "open" if mode == "open" else "closed"
    if record.state != target:
        _bump(record, target, now, "forced")
        if target == "open":
            record.opened_at = now
            record.open_until = now + ttl_seconds
        else:
            record.opened_at = None
            record.open_until = None
    else:
        record.version += 1
        record.probes = {}
        record.successes = 0
        record.updated_at = now
    record.forced = mode
    record.force_expires_at = now + ttl_seconds
    record.force_reason = reason or ""
    record.force_actor = actor


def op_release(record: Record, now: float) -> str | None:
    previous = record.forced
    if previous is None:
        return None
    record.forced = None
    record.force_expires_at = None
    record.force_reason = ""
    record.force_actor = None
    target = release_target(previous)
    if target is not None:
        _bump(record, target, now, "released")
    else:
        record.version += 1  # the state stays CLOSED, but workers holding the force must see it end
        record.updated_at = now
    return previous


def op_clear(record: Record, now: float) -> str | None:
    """An explicit reset (``CircuitBreaker.reset()``): back to a fresh CLOSED record whatever
    it held: the force, the probing round and the backoff count are cleared, and a new
    version makes every worker adopt it. Applies while frozen too (an operator's act, like
    a force). Returns the force it removed, or None."""
    previous = record.forced
    record.forced = None
    record.force_expires_at = None
    record.force_reason = ""
    record.force_actor = None
    _bump(record, "closed", now, "reset")  # the round and the backoff count go with it
    record.opened_at = None
    record.open_until = None
    return previous


def op_peer(
    record: Record, now: float, peer: str, recovery_timeout: float, factor: float = 1.0, cap: float = math.inf
) -> str:
    """A peer's propagated ``"open"`` or ``"closed"`` decision (see :func:`peer_verdict`): an
    OPEN opens for one more backed-off automatic duration, a CLOSED closes (lifting a force
    it meets). Applied while frozen too. Returns the verdict."""
    verdict = peer_verdict(state=record.state, forced=record.forced, peer=peer)
    if verdict in (PEER_APPLIED, PEER_LIFTED):
        if peer == "open":
            _open(record, now, "propagated", recovery_timeout, factor, cap)
        else:
            unforce(record)
            _bump(record, "closed", now, "propagated")
            record.opened_at = None
            record.open_until = None
    return verdict


def unforce(record: Record) -> None:
    """Clear the force fields of *record* (no version of its own)."""
    record.forced = None
    record.force_expires_at = None
    record.force_reason = ""
    record.force_actor = None


def stuck_open_for(record: Record, now: float, stuck_after: float) -> float | None:
    """The seconds an OPEN *record* has been open when that is at least *stuck_after*
    (the watchdog's rule: such a breaker is forced closed), else None. A forced open counts
    from its last force (a re-force stamps ``updated_at``), an automatic one from its open;
    times are the store clock's Unix seconds."""
    if record.state != "open":
        return None
    if record.forced == "open":
        times = [t for t in (record.opened_at, record.updated_at) if t is not None]
        since = max(times) if times else None
    else:
        since = record.opened_at
    if since is None or now - since < stuck_after:
        return None
    return now - since


def prunable(record: Record) -> bool:
    """Only a CLOSED, unforced record may be forgotten by the registry prune."""
    return record.state == "closed" and record.forced is None

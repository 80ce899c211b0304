"""The transitions of the shared record as pure functions (no I/O, no locking).

The memory and database stores run these inside their lock or transaction; the Redis
store's Lua scripts implement the same rules, and one contract test suite holds all
three to them. Each function mutates *record* in place and returns the operation's
result; ``normalise`` runs first in every operation.
"""

from __future__ import annotations

import math

from .base import ALREADY, BLOCKED, TRIPPED, Answer, Record

__all__ = [
    "open_duration",
    "next_open",
    "normalise",
    "op_trip",
    "op_acquire_probe",
    "op_finish_probe",
    "op_force",
    "op_release",
    "op_sweep",
    "run",
]


def open_duration(opens: int, recovery_timeout: float, factor: float, cap: float = math.inf) -> float:
    """Seconds the *opens*-th consecutive automatic open lasts (CB-16).

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
    """``(opens, seconds)`` after one more automatic open (CB-16).

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
        record.opens = 0  # any close resets the backoff (CB-16)


def _open(record: Record, now: float, trigger: str, recovery_timeout: float, factor: float, cap: float) -> None:
    """An automatic open: one more consecutive open, lasting its backed-off duration (CB-16)."""
    _bump(record, "open", now, trigger)
    record.opens, seconds = next_open(record.opens, recovery_timeout, factor, cap)
    record.opened_at = now
    record.open_until = now + seconds


def normalise(record: Record, now: float, frozen: bool = False) -> str | None:
    """Lapse an expired force and drop expired probe leases. Returns the lapsed force or None.

    While Level 3 holds (*frozen*, EM-2) a lapsed forced open stays OPEN, due for a probe as
    soon as the level drops."""
    lapsed = None
    if record.forced is not None and record.force_expires_at is not None and now >= record.force_expires_at:
        lapsed = record.forced
        record.forced = None
        record.force_expires_at = None
        record.force_reason = ""
        record.force_actor = None
        if lapsed == "open" and not frozen:
            _bump(record, "half_open", now, "force_lapsed")
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
    record: Record, now: float, trigger: str, recovery_timeout: float, factor: float = 1.0, cap: float = math.inf
) -> str:
    if record.forced is not None:
        return BLOCKED
    if record.state != "closed":
        return ALREADY
    _open(record, now, trigger, recovery_timeout, factor, cap)
    return TRIPPED


def op_sweep(record: Record, now: float) -> bool:
    """OPEN (unforced) past ``open_until`` -> HALF_OPEN; True when it moved."""
    if record.state == "open" and record.forced is None and record.open_until is not None and now >= record.open_until:
        _bump(record, "half_open", now, "recovery_timeout")
        return True
    return False


def op_acquire_probe(record: Record, now: float, token: str, max_calls: int, lease_seconds: float) -> tuple[bool, bool]:
    """Returns ``(admitted, moved)``."""
    moved = op_sweep(record, now)
    if record.state != "half_open" or record.forced is not None:
        return False, moved
    if len(record.probes) + record.successes >= max_calls:
        return False, moved
    record.probes[token] = now + lease_seconds
    record.updated_at = now
    return True, moved


def op_finish_probe(
    record: Record,
    now: float,
    token: str,
    version: int,
    outcome: str,
    max_calls: int,
    recovery_timeout: float,
    factor: float = 1.0,
    cap: float = math.inf,
) -> str | None:
    """Returns the transition made (``"closed"``, ``"open"``) or None. *outcome* is
    ``"success"``, ``"failure"``, ``"slow"`` (a slow trial fails the round, CB-17) or
    ``"abandon"``."""
    if record.version != version or record.state != "half_open" or token not in record.probes:
        return None  # stale: a newer round, or the lease expired and the slot went to another worker
    del record.probes[token]
    record.updated_at = now
    if outcome == "success":
        record.successes += 1
        if record.successes >= max_calls:
            _bump(record, "closed", now, "half_open_success")
            record.opened_at = None
            record.open_until = None
            return "closed"
    elif outcome in ("failure", "slow"):
        trigger = "slow_call_rate" if outcome == "slow" else "half_open_failure"
        _open(record, now, trigger, recovery_timeout, factor, cap)
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
    if previous == "open":
        _bump(record, "half_open", now, "released")
    else:
        record.version += 1  # the state stays CLOSED, but workers holding the force must see it end
        record.updated_at = now
    return previous


def prunable(record: Record) -> bool:
    """Only a CLOSED, unforced record may be forgotten by the registry prune (ST-5)."""
    return record.state == "closed" and record.forced is None


def run(op: str, record: Record, now: float, *args: object, frozen: bool = False) -> Answer:
    """Normalise *record* then apply operation *op*; returns the :class:`Answer`.

    *frozen* (Level 3, EM-2) holds every automatic step: no trip (``ALREADY``), no probe, no
    sweep, and a trial's outcome only gives its slot back."""
    before = record.state
    lapsed = normalise(record, now, frozen)
    result: object = None
    # *args arrive untyped through the op-name dispatch (the typed StateStore methods call
    # run()), hence the arg-type ignores below
    if op in ("load", "inspect"):
        pass
    elif frozen and op in ("trip", "acquire_probe", "sweep"):
        result = ALREADY if op == "trip" else False
    elif op == "trip":
        result = op_trip(record, now, *args)  # type: ignore[arg-type]
    elif op == "acquire_probe":
        result, _ = op_acquire_probe(record, now, *args)  # type: ignore[arg-type]
    elif op == "finish_probe":
        if frozen:
            args = (*args[:2], "abandon", *args[3:])
        result = op_finish_probe(record, now, *args)  # type: ignore[arg-type]
    elif op == "force":
        op_force(record, now, *args)  # type: ignore[arg-type]
    elif op == "release":
        result = op_release(record, now)
    elif op == "sweep":
        result = op_sweep(record, now)
    else:  # pragma: no cover - programming error
        raise ValueError(f"unknown store operation {op!r}")
    return Answer(record=record, now=now, result=result, lapsed=lapsed, moved=record.state != before)

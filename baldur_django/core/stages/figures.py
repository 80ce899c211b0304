"""What a breaker's outbound stages show: their configuration and live figures, and the
counts the metrics export.

Everything here is read when someone looks (a snapshot, a status page, a scrape); nothing
runs per call. No figure needs store I/O: a fleet bulkhead reports the slots this process
holds, a fleet retry budget what this process last learnt from its flushes, a gate the end
this process knows.

* :func:`stage_section`: the ``stages`` section of a breaker's snapshot, or None for a
  breaker with no stage configured and no call refused for its deadline (then the
  snapshot has no such key: nothing changes for a breaker without stages);
* :func:`stage_counts`: the refusals by reason and the retries the budget refused, in the
  order of :data:`STAGE_COUNTS`, for the metrics;
* :func:`in_flight`: the bulkhead's slots in use in this process, or None.

Importing the module adds the ``stages`` section to :meth:`CircuitBreaker.snapshot`.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

from ..breaker import CircuitBreaker, core_of
from ..readings import SNAPSHOT_SECTIONS
from .refusals import deadline_refusals
from .service import ServiceStages, stages_of, wants_stages

__all__ = [
    "STAGE_COUNTS",
    "STAGE_REASONS",
    "NO_COUNTS",
    "stage_section",
    "stage_counts",
    "in_flight",
    "stage_reading",
]

#: The refusal reasons of the stages, in the order of :func:`stage_counts`.
STAGE_REASONS = ("bulkhead_full", "throttled", "deadline", "retry_after")
#: ``(group, key)`` of each count :func:`stage_counts` returns: the refusals by reason
#: (group ``blocked``, as the breaker's own), then the retries the budget refused.
STAGE_COUNTS: tuple[tuple[str, str], ...] = (
    *(("blocked", reason) for reason in STAGE_REASONS),
    ("retry_budget", "exhausted"),
)
NO_COUNTS: tuple[int, ...] = (0,) * len(STAGE_COUNTS)


def _raw(held: ServiceStages) -> tuple[int, int, int, int]:
    """The counts *held*'s objects keep: bulkhead_full, throttled, retry_after, exhausted."""
    bulkhead, throttle, gate, budget = held.bulkhead, held.throttle, held.gate, held.budget
    return (
        0 if bulkhead is None else bulkhead.refused(),
        0 if throttle is None else throttle.refused(),
        0 if gate is None else gate.refused(),
        0 if budget is None else int(budget.exhausted),
    )


class _Seen:
    """The counts of a breaker's earlier stage holders (a new configuration builds new
    objects, counting from 0): carried, so the breaker's counts never go down."""

    __slots__ = ("holder", "last", "carried")

    def __init__(self) -> None:
        self.holder = 0  # id() of the holder read last
        self.last = (0, 0, 0, 0)  # its counts then
        self.carried = (0, 0, 0, 0)  # the counts of the holders before it


_seen: weakref.WeakKeyDictionary[object, _Seen] = weakref.WeakKeyDictionary()
_seen_lock = threading.Lock()


def _held_counts(core: object, held: ServiceStages | None) -> tuple[int, int, int, int]:
    seen = _seen.get(core)
    if held is None:
        if seen is None:
            return (0, 0, 0, 0)
        return tuple(a + b for a, b in zip(seen.carried, seen.last, strict=True))  # type: ignore[return-value]
    raw = _raw(held)
    with _seen_lock:
        if seen is None:
            seen = _seen[core] = _Seen()
        if seen.holder != id(held):
            if seen.holder:
                seen.carried = tuple(a + b for a, b in zip(seen.carried, seen.last, strict=True))  # type: ignore[assignment]
            seen.holder = id(held)
        seen.last = raw
        carried = seen.carried
    return tuple(a + b for a, b in zip(carried, raw, strict=True))  # type: ignore[return-value]


def stage_counts(breaker: CircuitBreaker) -> tuple[int, ...]:
    """What *breaker*'s stages counted in this process, in the order of
    :data:`STAGE_COUNTS`: calls refused as ``bulkhead_full``, ``throttled``,
    ``deadline``, ``retry_after``, then retries the budget refused. Every count only grows
    (a reconfigured breaker's new stages add to what the old ones counted). No store I/O,
    no lock held for long.

    Returns:
        tuple[int, ...]: five counts; :data:`NO_COUNTS` (the same object) for a breaker
        that counted none.
    """
    return _counts_of(core_of(breaker), stages_of(breaker))


def _counts_of(core: object, held: ServiceStages | None) -> tuple[int, ...]:
    deadline = deadline_refusals(core)
    if held is None and core not in _seen:
        return NO_COUNTS if not deadline else (0, 0, deadline, 0, 0)
    bulkhead, throttled, retry_after, exhausted = _held_counts(core, held)
    if not (bulkhead or throttled or deadline or retry_after or exhausted):
        return NO_COUNTS
    return (bulkhead, throttled, deadline, retry_after, exhausted)


def in_flight(breaker: CircuitBreaker) -> int | None:
    """The bulkhead slots *breaker*'s calls hold in this process now, or None when it has
    no bulkhead (or no call has built it yet)."""
    held = stages_of(breaker)
    if held is None or held.bulkhead is None:
        return None
    return int(held.bulkhead.in_flight())


def stage_reading(breaker: CircuitBreaker) -> tuple[tuple[int, ...], int | None]:
    """:func:`stage_counts` and :func:`in_flight` of *breaker* in one look (what a scrape
    reads per breaker).

    Returns:
        tuple: ``(counts, in_flight)``.
    """
    held = stages_of(breaker)
    slots = None if held is None or held.bulkhead is None else int(held.bulkhead.in_flight())
    return _counts_of(core_of(breaker), held), slots


# ------------------------------------------------------------------ the snapshot's section
def _gate(held: ServiceStages | None, wall: float) -> dict[str, Any]:
    gate = None if held is None else held.gate
    left = 0.0 if gate is None else float(gate.remaining())
    return {
        "scope": "fleet" if held is not None and held.fleet_gate else "worker",
        "remaining": left,
        "closed_until": wall + left if left > 0 else None,
    }


def _bulkhead(config: Any, held: ServiceStages | None) -> dict[str, Any]:
    bulkhead = None if held is None else held.bulkhead
    waiting = getattr(bulkhead, "waiting", None)  # the worker bulkhead's queue
    return {
        "scope": config.bulkhead_scope,
        "limit": config.max_concurrent_calls,
        "max_wait": config.max_wait,
        "in_flight": 0 if bulkhead is None else int(bulkhead.in_flight()),
        "waiting": int(waiting()) if callable(waiting) else None,
    }


def _budget(config: Any, held: ServiceStages | None) -> dict[str, Any]:
    budget = None if held is None else held.budget
    return {
        "scope": config.retry_budget_scope,
        "ratio": config.retry_budget_ratio,
        "min_per_second": config.retry_budget_min_per_second,
        "left": None if budget is None else float(budget.left()),
        "exhausted": 0 if budget is None else int(budget.exhausted),
    }


def _throttle(config: Any, held: ServiceStages | None) -> dict[str, Any]:
    throttle = None if held is None else held.throttle
    requests, accepts = (0, 0) if throttle is None else throttle.counts()
    return {
        "k": config.adaptive_throttling_k,
        "window": config.adaptive_throttling_window,
        "probability": 0.0 if throttle is None else float(throttle.probability()),
        "requests": requests,
        "accepts": accepts,
    }


def stage_section(breaker: CircuitBreaker) -> dict[str, Any] | None:
    """The configuration and live figures of *breaker*'s stages, for its snapshot and the
    status pages. No store I/O.

    Returns:
        None for a breaker with no stage configured that never refused a call for its
        deadline; else a dict: ``deadline`` (the knob, seconds, or None), and for each of
        ``retry_after_gate``, ``bulkhead``, ``retry_budget``, ``adaptive_throttling``
        None when off, else its knobs and figures: the gate's ``scope``, ``remaining``
        (seconds) and ``closed_until`` (Unix seconds, None while open); the bulkhead's
        ``scope``, ``limit``, ``max_wait`` (seconds), ``in_flight`` (slots this process
        holds) and ``waiting`` (None for a fleet bulkhead); the budget's ``scope``,
        ``ratio``, ``min_per_second``, ``left`` (retries available now; None before the
        first call built it) and ``exhausted``; the throttle's ``k``, ``window`` (seconds),
        ``probability`` (of refusing the next call) and its window's ``requests`` and
        ``accepts``. ``refused``: the calls refused in this process by reason
        (``bulkhead_full``, ``throttled``, ``deadline``, ``retry_after``).
    """
    config = breaker.config
    counts = stage_counts(breaker)
    if not wants_stages(config) and config.deadline is None and counts is NO_COUNTS:
        return None
    held = stages_of(breaker)
    return {
        "deadline": config.deadline,
        "retry_after_gate": _gate(held, core_of(breaker).clock.wall()) if config.honor_retry_after else None,
        "bulkhead": _bulkhead(config, held) if config.max_concurrent_calls is not None else None,
        "retry_budget": _budget(config, held) if config.retry_budget_ratio is not None else None,
        "adaptive_throttling": _throttle(config, held) if config.adaptive_throttling_k is not None else None,
        "refused": dict(zip(STAGE_REASONS, counts, strict=False)),
    }


def _add_section(breaker: CircuitBreaker, snap: dict[str, Any]) -> None:
    section = stage_section(breaker)
    if section is not None:
        snap["stages"] = section


SNAPSHOT_SECTIONS.append(_add_section)

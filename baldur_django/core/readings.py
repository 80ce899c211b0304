"""Reading what a breaker counted, for the breaker's ``metrics()`` and the Prometheus
collector: final outcomes, rejections by reason and state changes, per process.

Nothing here reads a shared store: a shared breaker reports the state this process last
adopted; a local one evaluates its recovery timeout first.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .machine import Machine
from .rules import open_duration
from .states import CircuitState, Reason
from .window import _count_of

CLOSED = CircuitState.CLOSED
OPEN = CircuitState.OPEN
HALF_OPEN = CircuitState.HALF_OPEN

__all__ = ["snapshot", "metrics", "metric_values", "after_fork", "METRIC_COUNTS", "SNAPSHOT_SECTIONS"]

#: What other modules add to a breaker's snapshot: each is called as ``section(breaker,
#: snap)`` after the breaker's own keys are read and may add keys (the outbound stages'
#: figures, added by :mod:`.stages.figures` when it is imported). No store I/O.
SNAPSHOT_SECTIONS: list[Callable[[Any, dict[str, Any]], None]] = []

#: ``(group, key)`` of each count :func:`metric_values` returns, in its order: the keys of
#: :func:`metrics`' ``calls`` and ``blocked`` dicts.
METRIC_COUNTS: tuple[tuple[str, str], ...] = (
    ("calls", "success"),
    ("calls", "failure"),
    ("calls", "ignored"),
    ("calls", "rate_limited"),
    ("blocked", Reason.OPEN),
    ("blocked", Reason.HALF_OPEN_FULL),
    ("blocked", Reason.FROZEN),
)


def _metric_counts(core: Machine) -> dict[str, Any]:
    """Raw cumulative counts (lock held, or the only thread of a forked child)."""
    return {
        "calls": {
            "success": core.cascade.total() - core.m_noted + core.m_uncounted,
            "failure": core.m_failure,
            "ignored": core.m_ignored,
            "rate_limited": core.m_rate_limited,
        },
        "blocked": {
            Reason.OPEN: _count_of(core.blocked_open),
            Reason.HALF_OPEN_FULL: core.blocked_half_open,
            Reason.FROZEN: core.blocked_frozen,
        },
        "transitions": dict(core.transitions or ()),
    }


def metrics(core: Machine) -> dict[str, Any]:
    """What this process's breaker counted, for Prometheus. Never takes a trial
    slot and never reads a shared store: a shared breaker reports the state this
    process last adopted; a local one evaluates its recovery timeout first, as
    the breaker's ``state`` does.

    Returns:
        dict: ``state`` (a :class:`CircuitState`); ``calls``: final outcomes by
        ``success``, ``failure``, ``ignored``, ``rate_limited`` (a call with retries is
        one call; a 429 reported by ``record_rate_limit`` is a ``rate_limited`` call;
        a call let through by dry-run counts too); ``blocked``: rejections by reason
        (``open``, ``half_open_full``, ``frozen``; dry-run rejects nothing);
        ``transitions``: ``{(from_state, to_state, trigger): count}`` for every state
        change of this process's breaker, adopted ones included (every trigger is
        named: ``reset`` after :meth:`~baldur_django.core.breaker.CircuitBreaker.reset`, ``adopted`` for a shared record
        that names none). Counts start at 0
        in a process, a forked child included, and never decrease.
    """
    events = core.outbox
    with core.lock:
        core.evaluate(core.mono(), events)
        state = core.state
        counts = _metric_counts(core)
    core.publish(events)
    inherited = core.inherited
    if inherited is not None:
        for group in ("calls", "blocked", "transitions"):
            base = inherited[group]
            mine = counts[group]
            for key, value in base.items():
                if key in mine:
                    mine[key] = max(0, mine[key] - value)
    counts["state"] = state
    return counts


def metric_values(core: Machine) -> tuple[CircuitState, tuple[int, ...], tuple[tuple[tuple[str, str, str], int], ...]]:
    """:func:`metrics` as tuples, for a scrape over thousands of breakers: the
    same counts, read the same way, returned without the nested dicts.

    Returns:
        tuple: ``(state, counts, transitions)``. ``state``: a :class:`CircuitState`, as
        :func:`metrics` reads it. ``counts``: seven ints in the order of
        :data:`METRIC_COUNTS` (calls ``success``, ``failure``, ``ignored``,
        ``rate_limited``; blocked ``open``, ``half_open_full``, ``frozen``).
        ``transitions``: ``((from_state, to_state, trigger), count)`` pairs, ``()``
        while this process saw no state change. Counts start at 0 in a process and
        never decrease.
    """
    events = core.outbox
    with core.lock:
        core.evaluate(core.mono(), events)
        state = core.state
        raw = _metric_counts(core)
    if events:
        core.publish(events)
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
    inherited = core.inherited
    if inherited is not None:  # a forked child: what the parent counted is the parent's
        base = [inherited[group].get(key, 0) for group, key in METRIC_COUNTS]
        counts = tuple(max(0, value - before) for value, before in zip(counts, base, strict=True))
        was = inherited["transitions"]
        transitions = tuple((key, max(0, value - was.get(key, 0))) for key, value in transitions)
    return state, counts, transitions


def after_fork(core: Machine) -> None:
    """In a child just forked (one thread): its counts start from what it inherited."""
    core.inherited = _metric_counts(core)


def snapshot(core: Machine) -> dict[str, Any]:
    """The breaker's state and counts as a dict (no store I/O; never takes a trial slot)."""
    events = core.outbox
    with core.lock:
        now = core.mono()
        core.evaluate(now, events)
        core.window.advance(now)
        snap = {
            "service": core.name,
            "state": core.state.value,
            "consecutive_failures": core.consecutive,
            "window_calls": core.window.calls,
            "window_failures": core.window.failures,
            "window_slow_calls": core.window.slow,
            "opened_at": core.unix(core.opened_at) if core.state is not CLOSED else None,
            **_open_fields(core),
            "consecutive_opens": core.opens,
            "forced": core.forced,
            "force_expires_at": core.unix(core.force_expires_at) if core.forced else None,
            "force_reason": core.force_reason if core.forced else None,
            "force_actor": core.force_actor if core.forced else None,
            "half_open_trials": len(core.probes) + core.successes if core.state is HALF_OPEN else 0,
            "half_open_successes": core.successes if core.state is HALF_OPEN else 0,
            "cooldown_remaining": max(0.0, core.cooldown_until - core.mono()),
            "dry_run_rejections": core.dry_run_rejections,
            "last_trigger": core.trigger,
            "backend": core.sync.backend,
            "config": {
                "failure_threshold": core.config.failure_threshold,
                "failure_rate_threshold": core.config.failure_rate_threshold,
                "sliding_window_size": core.config.sliding_window_size,
                "sliding_window_type": core.config.sliding_window_type,
                "sliding_window_seconds": core.config.sliding_window_seconds,
                "recovery_backoff_factor": core.config.recovery_backoff_factor,
                "recovery_timeout_max": core.config.recovery_timeout_max,
                "slow_call_duration": core.config.slow_call_duration,
                "slow_call_rate_threshold": core.config.slow_call_rate_threshold,
                "minimum_calls": core.config.minimum_calls,
                "recovery_timeout": core.config.recovery_timeout,
                "half_open_max_calls": core.config.half_open_max_calls,
            },
        }
        snap.update(core.sync.extra_snapshot())
    core.publish(events)
    return snap


def _open_fields(core: Machine) -> dict[str, float | None]:
    """The snapshot's ``open_until`` (Unix s, when the OPEN breaker admits a probe) and
    ``open_duration`` (s, the backed-off length of the current or last open). A
    forced open ends with its force (``open_until`` = its expiry, no automatic duration)."""
    if core.state is CLOSED:
        return {"open_until": None, "open_duration": None}
    if core.forced == "open":
        return {"open_until": core.unix(core.force_expires_at), "open_duration": None}
    cfg = core.config
    seconds = open_duration(core.opens, cfg.recovery_timeout, cfg.recovery_backoff_factor, cfg.recovery_timeout_max)
    # the monotonic deadline as Unix time: a lapse held by Level 3 ends it early
    until = core.unix(core.open_until) if core.state is OPEN else None
    return {"open_until": until, "open_duration": seconds}

"""What the Prometheus export reads: the series' names, and the tally that turns readings
of this process's breakers into counter series that never go down (see
:mod:`baldur_django.contrib.prometheus`). Needs no prometheus_client."""

from __future__ import annotations

import logging
import operator
import os
import threading
import time
import weakref
from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import Any

from ..core import emergency
from ..core.breaker import core_of
from ..core.names import show_name
from ..core.readings import METRIC_COUNTS, metric_values
from ..core.registry import registry as _breakers
from ..core.stages.figures import NO_COUNTS, STAGE_COUNTS, stage_counts, stage_reading
from ..core.states import CircuitState

log = logging.getLogger("baldur.metrics")

# Names as a scrape shows them (the counters without their ``_total`` suffix, as
# prometheus_client names counter families), with help texts and label names.
CALLS = "baldur_circuit_breaker_calls"
BLOCKED = "baldur_circuit_breaker_blocked_requests"
TRANSITIONS = "baldur_circuit_breaker_transitions"
STATE = "baldur_circuit_breaker_state"
EMERGENCY_LEVEL = "baldur_emergency_level"
RETRY_BUDGET_EXHAUSTED = "baldur_retry_budget_exhausted"
BULKHEAD_IN_FLIGHT = "baldur_bulkhead_in_flight"

HELP = {
    CALLS: "Calls through a circuit breaker by final outcome (success, failure, ignored, rate_limited).",
    BLOCKED: (
        "Requests a circuit breaker or its stages refused, by reason (open, half_open_full, frozen, "
        "bulkhead_full, throttled, deadline, retry_after)."
    ),
    TRANSITIONS: "State changes of a circuit breaker, by from_state, to_state and trigger.",
    STATE: "Circuit breaker state: 0 closed, 1 open, 2 half_open.",
    EMERGENCY_LEVEL: "Emergency Mode level in force: 0 normal to 3 (every breaker frozen).",
    RETRY_BUDGET_EXHAUSTED: "Retries a service's retry budget refused (the attempt's own outcome was final).",
    BULKHEAD_IN_FLIGHT: "Bulkhead slots a service's calls hold in this process now.",
}
LABELS: dict[str, tuple[str, ...]] = {
    CALLS: ("service", "outcome"),
    BLOCKED: ("service", "reason"),
    TRANSITIONS: ("service", "from_state", "to_state", "trigger"),
    STATE: ("service",),
    EMERGENCY_LEVEL: (),
    RETRY_BUDGET_EXHAUSTED: ("service",),
    BULKHEAD_IN_FLIGHT: ("service",),
}
COUNTERS = (CALLS, BLOCKED, TRANSITIONS, RETRY_BUDGET_EXHAUSTED)
STATE_VALUES = {CircuitState.CLOSED: 0, CircuitState.OPEN: 1, CircuitState.HALF_OPEN: 2}

#: A transition's labels: ``(from_state, to_state, trigger)``.
Transition = tuple[str, str, str]


class Warnings:
    """One warning, then at most one a minute (a scrape or flush that keeps failing)."""

    def __init__(self) -> None:
        self._last = float("-inf")

    def warn(self, message: str, *args: Any) -> None:
        now = time.monotonic()
        if now - self._last >= 60.0:
            self._last = now
            log.warning(message, *args, exc_info=True)


WARNINGS = Warnings()


# ------------------------------------------------------------------------ readings
# The family and the label values after ``service`` of each count a reading gives: those of
# readings.metric_values(), then the stages' (figures.stage_counts()), in their order.
_FAMILY_OF = {"calls": CALLS, "blocked": BLOCKED, "retry_budget": RETRY_BUDGET_EXHAUSTED}
_ALL_COUNTS = METRIC_COUNTS + STAGE_COUNTS
COUNT_FAMILY = tuple(_FAMILY_OF[group] for group, _ in _ALL_COUNTS)
COUNT_LABELS: tuple[tuple[str, ...], ...] = tuple(
    () if group == "retry_budget" else (key,) for group, key in _ALL_COUNTS
)
ZEROS: tuple[int, ...] = (0,) * len(_ALL_COUNTS)
NO_TRANSITIONS: Mapping[Transition, int] = MappingProxyType({})


class Series:
    """The counter series of one service: what every breaker registered under its name
    in this process counted, summed (a replaced breaker's counts stay in them).

    ``totals`` and ``transitions`` are replaced as a whole, never changed in place, by
    the thread folding a reading (under the tally's lock): a reader outside the lock
    reads each attribute once and sees one consistent value, and an unchanged series
    keeps the very same objects (the flusher compares identities). Every value only grows.
    """

    __slots__ = ("ref", "seen", "seen_transitions", "base", "base_transitions", "totals", "transitions")

    def __init__(self, breaker: Any) -> None:
        self.ref: weakref.ref[Any] = weakref.ref(breaker)
        self.seen = ZEROS  # the current breaker's highest reading
        self.seen_transitions: dict[Transition, int] = {}
        self.base = ZEROS  # what the breakers it replaced counted
        self.base_transitions: Mapping[Transition, int] = NO_TRANSITIONS
        self.totals = ZEROS  # base + seen
        self.transitions: Mapping[Transition, int] = NO_TRANSITIONS  # base + seen

    def replace(self, breaker: Any) -> None:
        """A new breaker under the name (the registry cleared): its counts add to these."""
        self.ref = weakref.ref(breaker)
        self.base, self.base_transitions = self.totals, self.transitions
        self.seen, self.seen_transitions = ZEROS, {}

    def fold(self, counts: tuple[int, ...], transitions: tuple[tuple[Transition, int], ...]) -> None:
        """Keep the highest of each count (two readers may fold out of order)."""
        seen = self.seen
        if counts != seen:
            highest = tuple(map(max, counts, seen))
            if highest != seen:
                self.seen = highest
                base = self.base
                self.totals = highest if base is ZEROS else tuple(map(operator.add, base, highest))
        if transitions:
            mine = self.seen_transitions
            changed = False
            for key, value in transitions:
                if value > mine.get(key, 0):
                    mine[key] = value
                    changed = True
            if changed:
                merged = dict(self.base_transitions)
                for key, value in mine.items():
                    merged[key] = merged.get(key, 0) + value
                self.transitions = MappingProxyType(merged)


class View:
    """One reading of every breaker of the process.

    Attributes:
        series: service -> :class:`Series`, for every service a breaker of this process
            ever had (a forgotten breaker's counts stay exported).
        states: ``(service, state gauge value 0/1/2)`` of each breaker registered now.
        level: the emergency level (0..3).
        in_flight: ``(service, bulkhead slots held in this process)`` of each breaker
            registered now that has a bulkhead.
    """

    __slots__ = ("series", "states", "level", "in_flight")

    def __init__(
        self,
        series: dict[str, Series],
        states: list[tuple[str, int]],
        level: int,
        in_flight: list[tuple[str, int]] | None = None,
    ) -> None:
        self.series = series
        self.states = states
        self.level = level
        self.in_flight = [] if in_flight is None else in_flight


class Tally:
    """Turns readings of the breakers into counter series that never go down.

    A breaker's counts only grow, but two readers (a scrape and the flusher) may fold
    their readings out of order, and a breaker may be replaced under its name (the
    registry cleared): each series keeps the highest value seen per breaker, and a
    replaced breaker's last counts are carried into its successor's series.
    """

    def __init__(self) -> None:
        self.reset()
        _breakers.watchers.add(self)  # told when idle breakers leave the registry

    def let_go(self, gone: dict[str, Any]) -> None:
        """Idle breakers left the registry: their series go too, so an idle fleet of per-host
        breakers does not keep a series each. One that comes back starts its series again
        from its own counts, which never went down."""
        with self.lock:
            for name, breaker in gone.items():
                entry = self._series.get(name)
                if entry is not None and entry.ref() in (breaker, None):
                    del self._series[name]

    def reset(self) -> None:
        """Forget everything (a forked child: its breakers' counts restart at zero; the
        lock is new, as another thread of the parent may have held the old one)."""
        self.lock = threading.Lock()
        self._series: dict[str, Series] = {}

    def read(self) -> View:
        """Read every breaker of the process and the emergency level (idle breakers are let
        go first, at most once per sweep interval). Never raises."""
        try:
            _breakers.sweep()
        except Exception:  # a bad idle setting: read what is there
            WARNINGS.warn("metrics.sweep_failed: idle breakers were not let go")
        readings = []
        states = []
        slots = []
        for breaker in _breakers:
            try:
                state, counts, transitions = metric_values(core_of(breaker))
                stage, held = stage_reading(breaker)
                counts += stage if stage is NO_COUNTS else _since_fork(breaker, stage)
            except Exception:
                WARNINGS.warn(
                    "metrics.read_failed service=%s: its series are left out of this reading", show_name(breaker.name)
                )
                continue
            readings.append((breaker, counts, transitions))
            states.append((breaker.name, STATE_VALUES.get(state, 0)))
            if held is not None:
                slots.append((breaker.name, held))
        try:
            level = int(emergency.current_level())
        except Exception:  # current_level() never raises; belt and braces
            WARNINGS.warn("metrics.read_failed: the emergency level could not be read")
            level = 0
        with self.lock:
            self._fold(readings)
            series = dict(self._series)
        return View(series, states, level, slots)

    def _fold(self, readings: Iterable[tuple[Any, tuple[int, ...], tuple[tuple[Transition, int], ...]]]) -> None:
        known = self._series
        width = len(ZEROS)
        for breaker, counts, transitions in readings:
            if len(counts) < width:  # metric_values() alone: the stages counted nothing
                counts += NO_COUNTS
            entry = known.get(breaker.name)
            if entry is None:
                entry = known[breaker.name] = Series(breaker)
            elif entry.ref() is not breaker:
                entry.replace(breaker)
            elif not transitions and counts == entry.seen:
                continue  # nothing new (an idle breaker)
            entry.fold(counts, transitions)


#: breaker -> the stage counts it had when this process was forked (a child's are its own)
_stage_base: weakref.WeakKeyDictionary[Any, tuple[int, ...]] = weakref.WeakKeyDictionary()


def _since_fork(breaker: Any, counts: tuple[int, ...]) -> tuple[int, ...]:
    """*counts* (the stages' counts of *breaker*) less what a forked child's parent had
    counted."""
    base = _stage_base.get(breaker)
    if base is None:
        return counts
    return tuple(max(0, now - before) for now, before in zip(counts, base, strict=True))


def _after_fork_in_child() -> None:
    """A forked child counts from zero: its tally forgets, and the stages' counts it
    inherited are noted, to be left out of its readings."""
    TALLY.reset()
    _stage_base.clear()
    for breaker in _breakers:
        try:
            counts = stage_counts(breaker)
        except Exception:  # pragma: no cover - never fail a fork
            continue
        if counts is not NO_COUNTS:
            _stage_base[breaker] = counts


TALLY = Tally()
if hasattr(os, "register_at_fork"):  # POSIX: a forked child's breakers count from zero, so does its tally
    os.register_at_fork(after_in_child=_after_fork_in_child)

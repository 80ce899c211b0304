"""Fleet-wide maintenance on the shared store: the bodies of the Celery tasks (ST-5).

Each job runs under an expiring lock in the shared store, so it runs at most once at a
time across the fleet: a run that finds the lock held skips, and a crashed run's lock
expires on its own. The task (not a worker) that makes a transition publishes it
(CB-14). On the memory backend there is nothing shared: the jobs log that and return.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Callable

from .conf import baldur_settings
from .core.events import ForceLapsed, StateChanged, bus
from .core.log import log_event
from .core.registry import registry
from .core.stores.base import StoreUnavailable

__all__ = ["RunReport", "recovery_sweep", "sync_state", "emergency_check", "run_locked"]

_log = logging.getLogger("baldur.tasks")


@dataclass
class RunReport:
    """What one run did. ``skipped`` says why nothing ran (``"locked"``, ``"memory backend"``,
    ``"store unavailable"``)."""

    job: str
    skipped: str | None = None
    moved: list[str] = field(default_factory=list)
    lapsed: list[str] = field(default_factory=list)
    pruned: list[str] = field(default_factory=list)
    breakers: int = 0
    open: int = 0


def run_locked(job: str, ttl_seconds: float, body: Callable[[Any, RunReport], None]) -> RunReport:
    """Run *body(store, report)* under the fleet lock *job* (expires after *ttl_seconds*)."""
    report = RunReport(job)
    store = registry.store
    if store is None:
        _log.info("baldur %s: the memory backend has nothing shared to act on", job)
        report.skipped = "memory backend"
        return report
    try:
        token = store.lock(f"task:{job}", ttl_seconds)
    except StoreUnavailable as exc:
        _log.warning("baldur %s: store unavailable (%s); skipped", job, exc)
        report.skipped = "store unavailable"
        return report
    if token is None:
        _log.info("baldur %s: another run holds the fleet lock; skipped", job)
        report.skipped = "locked"
        return report
    try:
        body(store, report)
    except StoreUnavailable as exc:
        _log.warning("baldur %s: store unavailable mid-run (%s)", job, exc)
        report.skipped = "store unavailable"
    finally:
        try:
            store.unlock(f"task:{job}", token)
        except StoreUnavailable:
            pass  # it expires on its own
    return report


def _sweep(store: Any, report: RunReport) -> None:
    for name in sorted(store.names()):
        answer = store.sweep(name)
        report.breakers += 1
        if answer.lapsed is not None:
            report.lapsed.append(name)
            bus.publish(ForceLapsed(name, answer.now, previous=answer.lapsed, from_state="open", to_state=answer.record.state))
        if answer.result:
            report.moved.append(name)
            bus.publish(StateChanged(name, answer.now, from_state="open", to_state="half_open", trigger="recovery_timeout"))


def recovery_sweep() -> RunReport:
    """OPEN records past their recovery timeout -> HALF_OPEN, once for the fleet (ST-5).

    Forced records are left alone. Returns a :class:`RunReport`.
    """
    return run_locked("recovery_sweep", baldur_settings.get("BALDUR_TASK_RECOVERY_SWEEP_SECONDS"), _sweep)


def _sync(store: Any, report: RunReport) -> None:
    now = None
    for name in sorted(store.names()):
        answer = store.inspect(name)
        now = answer.now
        report.breakers += 1
        if answer.lapsed is not None:
            report.lapsed.append(name)
            bus.publish(
                ForceLapsed(name, answer.now, previous=answer.lapsed, from_state=answer.lapsed, to_state=answer.record.state)
            )
    if now is not None:
        horizon = now - baldur_settings.get("BALDUR_REGISTRY_TTL_DAYS") * 86400.0
        report.pruned = store.prune(horizon)


def sync_state() -> RunReport:
    """Lapse expired forces fleet-wide (one ``force_lapsed`` each) and prune registry entries
    unseen for ``BALDUR_REGISTRY_TTL_DAYS`` days (ST-5). Returns a :class:`RunReport`."""
    return run_locked("sync_state", baldur_settings.get("BALDUR_TASK_STATE_SYNC_SECONDS"), _sync)


def _census(store: Any, report: RunReport) -> None:
    for name in store.names():
        report.breakers += 1
        if store.inspect(name).record.state == "open":
            report.open += 1
    log_event(logging.DEBUG, "circuit_breaker.emergency_check", None, "breakers=%d open=%d", report.breakers, report.open)


def emergency_check() -> RunReport:
    """Count registered and OPEN breakers in the shared store; the input of Emergency Mode's
    auto-activation (EM-4, not built yet: this run only counts and logs at debug level)."""
    return run_locked("emergency_check", baldur_settings.get("BALDUR_TASK_EMERGENCY_CHECK_SECONDS"), _census)

"""Fleet-wide jobs on the shared store, as plain functions: what the Celery tasks run.

* :func:`recovery_sweep` -- OPEN records past their recovery timeout -> HALF_OPEN, once for
  the fleet; during Level 3 it moves nothing and logs
  ``circuit_breaker.recovery_sweep_blocked`` with the number of OPEN breakers it held.
* :func:`sync_state` -- lapses expired forces (one ``force_lapsed`` each) and prunes registry
  entries unseen for ``BALDUR_REGISTRY_TTL_DAYS``.
* :func:`emergency_check` -- counts registered and OPEN breakers and hands the counts to
  Emergency Mode's auto-activation rule.
* :func:`meta_watchdog` -- force-closes breakers stuck OPEN.

Each job runs under an expiring lock in the shared store, so it runs at most once at a time
across the fleet. The lock carries an owner token: only its owner extends or releases it;
its lifetime is the job's interval; a run that finds it held skips; a failed acquire
(store trouble) skips rather than run unlocked; and before every write a run checks that it
still owns the lock (renewing it once half its lifetime has passed since it last knew), so a
run that lost it stops before writing. The job (not a worker) that makes a transition
publishes it; that includes lapsing a force that ran out, which any job's read of a
record may do (reads normalise the record), so every job announces the lapses it made. On the memory backend there is nothing shared: the jobs log that and
return. Nothing here imports Django.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

from . import emergency, steps
from .clock import Clock
from .config import settings
from .errors import BaldurError
from .events import ForceLapsed, StateChanged, bus
from .log import log_event
from .registry import force_close_circuit, registry
from .stores.base import Answer, StateStore, StoreUnavailable

__all__ = [
    "RunReport",
    "FleetLock",
    "LockLost",
    "WATCHDOG_ACTOR",
    "run_locked",
    "recovery_sweep",
    "sync_state",
    "emergency_check",
    "meta_watchdog",
]

_log = logging.getLogger("baldur.tasks")

#: The actor the meta-watchdog's forces carry in logs, events and the audit.
WATCHDOG_ACTOR = "meta-watchdog"


class LockLost(Exception):
    """The run no longer owns its fleet lock (it expired and another run took it)."""


@dataclass
class RunReport:
    """What one run did. ``skipped`` says why nothing (more) ran: ``"locked"``,
    ``"memory backend"``, ``"store unavailable"``, ``"lock lost"``, ``"disabled"``,
    ``"level 3"``."""

    job: str
    skipped: str | None = None
    moved: list[str] = field(default_factory=list)
    lapsed: list[str] = field(default_factory=list)
    pruned: list[str] = field(default_factory=list)
    closed: list[str] = field(default_factory=list)
    breakers: int = 0
    open: int = 0
    held: int = 0
    emergency: dict[str, Any] | None = None

    def as_dict(self) -> dict[str, Any]:
        """A JSON-able summary (what the Celery tasks return)."""
        return asdict(self)


class FleetLock:
    """An owned fleet lock: ``ensure()`` before each write.

    Args:
        store: the shared store.
        name: the lock's name.
        ttl: its lifetime, seconds.
        token: the owner token :meth:`StateStore.lock` returned.
        clock: monotonic time source; *started* is when the acquire began.
    """

    def __init__(self, store: StateStore, name: str, ttl: float, token: str, clock: Clock, started: float) -> None:
        self.store, self.name, self.ttl, self.token, self.clock = store, name, ttl, token, clock
        self._known_until = started + ttl / 2.0

    def ensure(self) -> None:
        """Return if this run still owns the lock; else raise :class:`LockLost`.

        Within half the lifetime of the last acquire or renewal it is known to be held;
        after that the lock is renewed (owner only) and a refusal means it was lost.
        """
        now = self.clock.monotonic()
        if now < self._known_until:
            return
        try:
            owned = self.store.extend(self.name, token=self.token, ttl_seconds=self.ttl)
        except StoreUnavailable as exc:
            raise LockLost(f"could not renew the lock: {exc}") from exc
        if not owned:
            raise LockLost("the lock expired and is no longer ours")
        self._known_until = now + self.ttl / 2.0


def _shared_store() -> StateStore | None:
    if not registry.store_configured:
        builder = getattr(registry, "_store_from_settings", None)
        if builder is not None:  # plain-Python process: build the store from the environment
            builder()
    return registry.store


def run_locked(job: str, ttl_seconds: float, body: Callable[[StateStore, RunReport, FleetLock], None]) -> RunReport:
    """Run ``body(store, report, lock)`` under the fleet lock ``task:<job>``.

    Args:
        job: the job's name.
        ttl_seconds: the lock's lifetime (the job's interval), seconds.
        body: the work; calls ``lock.ensure()`` before each write.

    Returns:
        The :class:`RunReport` (``skipped`` set when it did not run or stopped early).
    """
    report = RunReport(job)
    store = _shared_store()
    if store is None:
        _log.info("baldur %s: the memory backend has nothing shared to act on", job)
        report.skipped = "memory backend"
        return report
    clock = registry.clock
    name = f"task:{job}"
    started = clock.monotonic()
    try:
        token = store.lock(name, ttl_seconds=ttl_seconds)
    except StoreUnavailable as exc:
        _log.warning("baldur %s: store unavailable (%s); skipped", job, exc)
        report.skipped = "store unavailable"
        return report
    if token is None:
        _log.info("baldur %s: another run holds the fleet lock; skipped", job)
        report.skipped = "locked"
        return report
    lock = FleetLock(store, name, ttl_seconds, token, clock, started)
    try:
        body(store, report, lock)
    except LockLost as exc:
        _log.warning("baldur %s: lost the fleet lock mid-run (%s); stopped before writing", job, exc)
        report.skipped = "lock lost"
    except StoreUnavailable as exc:
        _log.warning("baldur %s: store unavailable mid-run (%s)", job, exc)
        report.skipped = "store unavailable"
    finally:
        try:
            store.unlock(name, token=token)
        except StoreUnavailable:
            pass  # it expires on its own
    return report


def _announce_lapse(report: RunReport, name: str, answer: Answer) -> None:
    """Publish the ``force_lapsed`` of a force that *answer*'s operation lapsed in the store:
    the job that lapsed it is the one that announces it, whichever job that is."""
    if answer.lapsed is None:
        return
    report.lapsed.append(name)
    bus.publish(
        ForceLapsed(name, answer.now, previous=answer.lapsed, from_state=answer.lapsed, to_state=answer.record.state)
    )


def _inspect(store: StateStore, report: RunReport, lock: FleetLock, name: str) -> Answer:
    """Read one record for a job. Reading normalises it, which lapses a force that ran out
    (a write): so the run checks it still owns its lock first and announces the lapse."""
    lock.ensure()
    answer = store.inspect(name, frozen=emergency.frozen())
    _announce_lapse(report, name, answer)
    return answer


#: Records a job reads or sweeps per round trip when the store offers bulk methods
#: (``inspect_many``/``sweep_many``, e.g. the Redis store's pipelines).
BATCH_SIZE = 500


def _batches(names: list[str]) -> Iterator[list[str]]:
    for start in range(0, len(names), BATCH_SIZE):
        yield names[start : start + BATCH_SIZE]


def _each(
    store: StateStore, report: RunReport, lock: FleetLock, op: str, names: list[str]
) -> Iterator[tuple[str, Answer]]:
    """``(name, answer)`` of *op* (``"inspect"`` or ``"sweep"``) over *names*, in order.

    A store with the bulk method (``inspect_many``/``sweep_many``, e.g. the Redis store's
    pipelines) answers a batch of :data:`BATCH_SIZE` per round trip; any other store, such as
    a third-party one, is asked one name at a time. Either way the run checks it still owns
    its lock before each store call (a read lapses forces that ran out, a sweep moves
    records: both may write), and lapses are announced as the answers come.
    """
    frozen = emergency.frozen()
    many: Callable[..., list[Answer]] | None = getattr(store, f"{op}_many", None)
    if many is None:
        one: Callable[..., Answer] = getattr(store, op)
        for name in names:
            lock.ensure()
            answer = one(name, frozen=frozen)
            _announce_lapse(report, name, answer)
            yield name, answer
        return
    for batch in _batches(names):
        lock.ensure()
        for name, answer in zip(batch, many(batch, frozen=frozen), strict=True):
            _announce_lapse(report, name, answer)
            yield name, answer


# ------------------------------------------------------------------------------ sweep
def _sweep(store: StateStore, report: RunReport, lock: FleetLock) -> None:
    names = sorted(store.names())
    if emergency.refresh() >= emergency.FREEZE_LEVEL:
        for _, answer in _each(store, report, lock, "inspect", names):
            report.breakers += 1
            if answer.record.state == "open":
                report.held += 1
        log_event(
            logging.WARNING,
            "circuit_breaker.recovery_sweep_blocked",
            None,
            "held=%d level=3",
            report.held,
            held=report.held,
        )
        return
    for name, answer in _each(store, report, lock, "sweep", names):
        report.breakers += 1
        if answer.result:
            report.moved.append(name)
            bus.publish(
                StateChanged(name, answer.now, from_state="open", to_state="half_open", trigger="recovery_timeout")
            )


def recovery_sweep() -> RunReport:
    """OPEN records past their recovery timeout -> HALF_OPEN, once for the fleet.

    Forced records are left alone. During Level 3 nothing moves: the run counts the OPEN
    breakers it held (``report.held``) and logs ``circuit_breaker.recovery_sweep_blocked``.

    Returns:
        RunReport.
    """
    return run_locked("recovery_sweep", settings.get("BALDUR_TASK_RECOVERY_SWEEP_SECONDS"), _sweep)


# ------------------------------------------------------------------------------- sync
def _sync(store: StateStore, report: RunReport, lock: FleetLock) -> None:
    now = None
    for _, answer in _each(store, report, lock, "inspect", sorted(store.names())):
        now = answer.now
        report.breakers += 1
    if now is not None:
        lock.ensure()
        horizon = now - settings.get("BALDUR_REGISTRY_TTL_DAYS") * 86400.0
        report.pruned = store.prune(older_than=horizon)


def sync_state() -> RunReport:
    """Lapse expired forces fleet-wide (one ``force_lapsed`` each) and prune registry entries
    unseen for ``BALDUR_REGISTRY_TTL_DAYS`` days.

    Returns:
        RunReport.
    """
    return run_locked("sync_state", settings.get("BALDUR_TASK_STATE_SYNC_SECONDS"), _sync)


# -------------------------------------------------------------------------- emergency
_memory_notice_given = False


def _census(store: StateStore, report: RunReport, lock: FleetLock) -> None:
    for _, answer in _each(store, report, lock, "inspect", list(store.names())):
        report.breakers += 1
        if answer.record.state == "open":
            report.open += 1
    log_event(
        logging.DEBUG, "circuit_breaker.emergency_check", None, "breakers=%d open=%d", report.breakers, report.open
    )
    lock.ensure()
    try:
        report.emergency = emergency.record_check(report.breakers, report.open)
    except BaldurError as exc:
        report.skipped = "emergency state unavailable"
        report.emergency = {"error": str(exc)}


def emergency_check() -> RunReport:
    """One auto-activation check: count the registered and OPEN (forced open included) breakers in the
    shared store, then apply :func:`baldur_django.core.emergency.record_check`.

    A store it cannot read declares nothing and logs ``emergency.check_skipped``; so does an
    emergency state it cannot read or write. The memory backend has no fleet to judge and
    declares nothing (said once per process).

    Returns:
        RunReport: ``breakers``, ``open`` and ``emergency`` (the rule's summary dict).
    """
    global _memory_notice_given
    report = run_locked("emergency_check", settings.get("BALDUR_TASK_EMERGENCY_CHECK_SECONDS"), _census)
    if report.skipped == "memory backend":
        if not _memory_notice_given:
            _memory_notice_given = True
            emergency.logger.info(
                "emergency.check_skipped the memory backend has no fleet to judge: auto-activation declares nothing",
                extra={"event": "emergency.check_skipped", "why": "memory backend"},
            )
    elif report.skipped in ("store unavailable", "emergency state unavailable", "lock lost"):
        if report.skipped == "store unavailable":
            report.breakers = report.open = 0
        emergency.logger.warning(
            "emergency.check_skipped %s; nothing declared",
            report.skipped if report.emergency is None else f"{report.skipped} ({report.emergency.get('error')})",
            extra={"event": "emergency.check_skipped", "why": report.skipped},
        )
    return report


# ------------------------------------------------------------------------- watchdog
def _watchdog(store: StateStore, report: RunReport, lock: FleetLock) -> None:
    stuck_after = float(settings.get("BALDUR_META_WATCHDOG_STUCK_OPEN_SECONDS"))
    for name in sorted(store.names()):
        answer = _inspect(store, report, lock, name)
        report.breakers += 1
        record = answer.record
        if record.state != "open":
            continue
        report.open += 1
        held = steps.stuck_open_for(record, answer.now, stuck_after)
        if held is None:
            continue
        if emergency.refresh() >= emergency.FREEZE_LEVEL:
            report.skipped = "level 3"
            return
        lock.ensure()
        try:
            force_close_circuit(
                name,
                ttl_minutes=None,
                reason=f"meta-watchdog: OPEN for {held:.0f} s (stuck)",
                actor=WATCHDOG_ACTOR,
            )
        except BaldurError as exc:
            _log.warning("baldur meta_watchdog: could not force %r closed: %s", name, exc)
            continue
        report.closed.append(name)


def meta_watchdog() -> RunReport:
    """Force-close breakers stuck OPEN, when ``BALDUR_META_WATCHDOG_AUTO_RECOVERY_ENABLED``.

    A breaker OPEN for ``BALDUR_META_WATCHDOG_STUCK_OPEN_SECONDS`` -- operator-forced or not,
    counted from when it last entered OPEN or was forced open -- is forced closed for the
    manual-override lifetime with actor ``meta-watchdog`` (event trigger ``forced``). This
    lifts operators' forces: that is the documented hazard. Nothing happens during Level 3.

    Returns:
        RunReport: ``closed`` lists the breakers it forced closed; ``skipped`` is
        ``"disabled"`` when the knob is off, ``"level 3"`` during a freeze.
    """
    if not settings.get("BALDUR_META_WATCHDOG_AUTO_RECOVERY_ENABLED"):
        return RunReport("meta_watchdog", skipped="disabled")
    if emergency.refresh() >= emergency.FREEZE_LEVEL:
        _log.info("baldur meta_watchdog: Level 3 is in force; no breaker is touched")
        return RunReport("meta_watchdog", skipped="level 3")
    return run_locked("meta_watchdog", settings.get("BALDUR_TASK_META_WATCHDOG_SECONDS"), _watchdog)

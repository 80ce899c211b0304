"""ST-5: the fleet jobs behind the Celery tasks (baldur_django.core.maintenance), their lock, and the beat schedule."""

from __future__ import annotations

import threading

import pytest

from baldur_django.core import maintenance
from baldur_django.core.events import bus
from baldur_django.core.stores.memory import MemoryStore
from baldur_django.core.testing import FakeClock, RecordingListener


@pytest.fixture
def shared(fresh_registry):
    clock = FakeClock()
    store = MemoryStore(now=clock.wall)
    fresh_registry.set_store(store)
    events = RecordingListener(bus)
    yield store, clock, events
    bus.unsubscribe(events)
    fresh_registry.set_store(None)


def test_st5_memory_backend_has_nothing_to_act_on(caplog, fresh_registry):
    """ST-5: on the memory backend every job logs that it has nothing shared and returns."""
    fresh_registry.set_store(None)
    with caplog.at_level("INFO", logger="baldur.tasks"):
        for job in (maintenance.recovery_sweep, maintenance.sync_state, maintenance.emergency_check):
            assert job().skipped == "memory backend"
    assert sum("nothing shared" in r.getMessage() for r in caplog.records) == 3


def test_st5_recovery_sweep_moves_due_records_once(shared):
    """ST-5: the sweep moves OPEN records past their timeout to HALF_OPEN once, leaves forced ones, publishes once."""
    store, clock, events = shared
    store.trip("a", trigger="consecutive_failures", recovery_timeout=10.0)
    store.trip("b", trigger="failure_rate", recovery_timeout=100.0)
    store.force("c", mode="open", ttl_seconds=600.0, reason="maintenance", actor=None)
    clock.advance(11.0)
    report = maintenance.recovery_sweep()
    assert report.moved == ["a"] and report.breakers == 3
    assert store.raw("a").state == "half_open" and store.raw("b").state == "open" and store.raw("c").state == "open"
    assert events.transitions() == [("open", "half_open", "recovery_timeout")]
    assert maintenance.recovery_sweep().moved == []


def test_st5_sync_state_lapses_forces_once_and_prunes(shared):
    """ST-5: sync_state lapses each expired force with one force_lapsed, and prunes registry
    entries unseen for BALDUR_REGISTRY_TTL_DAYS, keeping recent, OPEN and forced ones."""
    store, clock, events = shared
    store.load("ancient")
    store.trip("ancient-but-open", trigger="consecutive_failures", recovery_timeout=30 * 86400.0)
    store.force("held", mode="closed", ttl_seconds=9 * 24 * 60 * 60.0, reason="", actor=None)
    clock.advance(8 * 86400.0)  # past the 7-day registry TTL for all three
    store.load("recent")
    store.force("lapsing", mode="open", ttl_seconds=60.0, reason="", actor=None)
    report = maintenance.sync_state()
    assert report.pruned == ["ancient"]
    assert set(store.names()) == {"ancient-but-open", "held", "recent", "lapsing"}
    assert report.lapsed == []
    clock.advance(61.0)
    report = maintenance.sync_state()
    assert report.lapsed == ["lapsing"] and store.raw("lapsing").state == "half_open"
    assert [e.kind for e in events.events].count("force_lapsed") == 1
    assert maintenance.sync_state().lapsed == []


def test_st5_task_reads_do_not_keep_entries_alive(shared):
    """ST-5: the tasks' own reads do not count as use: an idle entry is still pruned."""
    store, clock, _events = shared
    store.load("idle")
    for _ in range(3):
        clock.advance(3 * 86400.0)
        maintenance.sync_state()
        maintenance.recovery_sweep()
    assert "idle" not in store.names()


def test_st5_overlapping_runs_one_skips(shared):
    """ST-5: two runs forced to overlap: the second finds the fleet lock held and skips."""
    store, clock, _events = shared
    store.trip("a", trigger="consecutive_failures", recovery_timeout=1.0)
    clock.advance(2.0)
    inside, release = threading.Event(), threading.Event()
    real_names = store.names

    def slow_names():
        inside.set()
        assert release.wait(10)
        return real_names()

    store.names = slow_names
    result = {}
    first = threading.Thread(target=lambda: result.setdefault("first", maintenance.recovery_sweep()))
    first.start()
    assert inside.wait(10)
    store.names = real_names
    second = maintenance.recovery_sweep()
    release.set()
    first.join(10)
    assert second.skipped == "locked"
    assert result["first"].skipped is None and result["first"].moved == ["a"]
    assert maintenance.recovery_sweep().skipped is None  # the lock was released


def test_st5_lock_left_by_a_crashed_run_expires(shared):
    """ST-5: a lock whose holder crashed blocks runs only until it expires."""
    store, clock, _events = shared
    assert store.lock("task:recovery_sweep", ttl_seconds=10.0)  # a run that never unlocks
    assert maintenance.recovery_sweep().skipped == "locked"
    clock.advance(10.0)
    assert maintenance.recovery_sweep().skipped is None


def test_st5_beat_schedule_intervals_and_expiry(settings):
    """ST-5: BEAT_SCHEDULE has one entry per task, intervals from settings, expires = interval."""
    settings.BALDUR_TASK_RECOVERY_SWEEP_SECONDS = 7
    from baldur_django.tasks import BEAT_SCHEDULE

    assert set(BEAT_SCHEDULE) == {
        "baldur-recovery-sweep",
        "baldur-sync-state",
        "baldur-emergency-check",
        "baldur-meta-watchdog",
    }
    sweep = BEAT_SCHEDULE["baldur-recovery-sweep"]
    assert sweep["task"] == "baldur_django.tasks.recovery_sweep"
    assert sweep["schedule"] == 7.0 and sweep["options"]["expires"] == 7.0
    assert BEAT_SCHEDULE["baldur-sync-state"]["schedule"] == 30.0


def test_st5_emergency_check_counts(shared, caplog):
    """ST-5/EM-4 input: emergency_check counts registered and OPEN breakers and logs at debug."""
    store, _clock, _events = shared
    store.trip("a", trigger="consecutive_failures", recovery_timeout=100.0)
    store.load("b")
    with caplog.at_level("DEBUG", logger="baldur.circuit_breaker"):
        report = maintenance.emergency_check()
    assert (report.breakers, report.open) == (2, 1)
    assert any(r.event == "circuit_breaker.emergency_check" and r.levelname == "DEBUG" for r in caplog.records)


@pytest.mark.parametrize("first", ["emergency_check", "meta_watchdog", "recovery_sweep_frozen"])
def test_st5_a_force_lapsed_by_any_job_is_announced_once(shared, first, monkeypatch):
    """ST-5/CB-14 (found while writing the chaos test's lapse invariant): whichever job first
    reads a record whose force ran out lapses it in the store, so that job announces it: one
    force_lapsed for the fleet, not zero (a later sync_state finds nothing left to lapse)."""
    from baldur_django.core import emergency
    from baldur_django.core.config import settings as baldur_settings

    store, clock, events = shared
    store.force("held", mode="closed", ttl_seconds=60.0, reason="", actor=None)
    clock.advance(61.0)
    if first == "meta_watchdog":
        monkeypatch.setenv("BALDUR_META_WATCHDOG_AUTO_RECOVERY_ENABLED", "true")
        baldur_settings.reset()
        report = maintenance.meta_watchdog()
    elif first == "recovery_sweep_frozen":
        monkeypatch.setattr(emergency, "refresh", lambda: emergency.FREEZE_LEVEL)
        report = maintenance.recovery_sweep()
    else:
        report = maintenance.emergency_check()
    assert report.lapsed == ["held"]
    assert maintenance.sync_state().lapsed == []
    lapses = [e for e in events.events if e.kind == "force_lapsed"]
    assert [(e.service, e.previous, e.to_state) for e in lapses] == [("held", "closed", "closed")]

"""EM-5: the meta-watchdog force-closes breakers stuck OPEN (off by default, never during Level 3).

The shared store is the in-process MemoryStore on a FakeClock that also drives the
breakers and Emergency Mode, so "stuck for 300 s" is exact. Audit rows come from the
audit listener ``ready()`` installed.
"""

from __future__ import annotations

import pytest

from baldur_django import signals
from baldur_django.core import emergency, maintenance
from baldur_django.core.events import Forced
from baldur_django.core.stores.memory import MemoryStore
from baldur_django.core.testing import FakeClock

pytestmark = pytest.mark.django_db


@pytest.fixture
def watched(fresh_registry, monkeypatch, events):
    clock = FakeClock()
    fresh_registry.clock = clock
    store = MemoryStore(now=clock.wall)
    fresh_registry.set_store(store)
    emergency.use_clock(clock)
    emergency.use_backend(emergency.MemoryLevelBackend())
    monkeypatch.setenv("BALDUR_META_WATCHDOG_AUTO_RECOVERY_ENABLED", "true")
    emergency.mode.source.reset()
    yield store, clock
    fresh_registry.set_store(None)


def _audit(**filters):
    from baldur_django.models import BreakerAudit

    return list(BreakerAudit.objects.filter(**filters).order_by("id").values())


def test_em5_stuck_breaker_is_force_closed_and_audited(watched, events):
    """EM-5: a breaker OPEN for BALDUR_META_WATCHDOG_STUCK_OPEN_SECONDS (300) is forced closed for
    the manual-override lifetime, with actor meta-watchdog in the audit and trigger "forced" on
    the signal; one OPEN for less is left alone."""
    store, clock = watched
    store.load("stuck")
    store.trip("stuck", trigger="consecutive_failures", recovery_timeout=3600.0)
    clock.advance(200.0)
    store.load("recent")
    store.trip("recent", trigger="consecutive_failures", recovery_timeout=3600.0)
    clock.advance(99.0)
    assert maintenance.meta_watchdog().closed == []
    received = []
    signals.circuit_forced.connect(lambda **kw: received.append(kw), weak=False, dispatch_uid="em5-test")
    try:
        clock.advance(1.0)
        report = maintenance.meta_watchdog()
    finally:
        signals.circuit_forced.disconnect(dispatch_uid="em5-test")
    assert report.closed == ["stuck"] and report.open == 2
    record = store.raw("stuck")
    assert record.state == "closed" and record.forced == "closed"
    assert record.force_actor == "meta-watchdog"
    assert record.force_expires_at == pytest.approx(clock.wall() + 90 * 60)
    assert store.raw("recent").state == "open"
    forced = [e for e in events.events if isinstance(e, Forced)]
    assert [(e.service, e.mode, e.actor) for e in forced] == [("stuck", "closed", "meta-watchdog")]
    assert received and received[0]["trigger"] == "forced" and received[0]["actor"] == "meta-watchdog"
    (row,) = _audit(service="stuck")
    assert (row["actor"], row["action"], row["source"], row["ttl_minutes"]) == ("meta-watchdog", "close", "task", 90.0)


def test_em5_an_operators_force_open_is_lifted_counted_from_the_force(watched):
    """EM-5 (the hazard): a forced-open breaker is stuck too; the time counts from when it was
    forced open, not from an earlier trip."""
    store, clock = watched
    store.load("held")
    store.trip("held", trigger="consecutive_failures", recovery_timeout=3600.0)
    clock.advance(250.0)
    store.force("held", mode="open", ttl_seconds=600.0, reason="maintenance", actor="alice")
    clock.advance(299.0)
    assert maintenance.meta_watchdog().closed == []  # 549 s OPEN, but forced 299 s ago
    clock.advance(1.0)
    assert maintenance.meta_watchdog().closed == ["held"]
    assert store.raw("held").forced == "closed"


def test_em5_not_during_level_3(watched):
    """EM-5: during Level 3 the watchdog touches nothing; after a step down it acts."""
    store, clock = watched
    store.load("stuck")
    store.trip("stuck", trigger="consecutive_failures", recovery_timeout=3600.0)
    clock.advance(301.0)
    emergency.set_level(3, minutes=30)
    report = maintenance.meta_watchdog()
    assert report.skipped == "level 3" and report.closed == []
    assert store.raw("stuck").state == "open"
    emergency.step_down()
    assert maintenance.meta_watchdog().closed == ["stuck"]


def test_em5_disabled_by_default(watched, monkeypatch):
    """EM-5: without BALDUR_META_WATCHDOG_AUTO_RECOVERY_ENABLED nothing is touched."""
    store, clock = watched
    monkeypatch.delenv("BALDUR_META_WATCHDOG_AUTO_RECOVERY_ENABLED")
    emergency.mode.source.reset()
    store.load("stuck")
    store.trip("stuck", trigger="consecutive_failures", recovery_timeout=3600.0)
    clock.advance(1000.0)
    assert maintenance.meta_watchdog().skipped == "disabled"
    assert store.raw("stuck").state == "open" and _audit() == []


def test_em5_beat_entry(settings):
    """EM-5/ST-5: the watchdog has its own beat entry; interval BALDUR_TASK_META_WATCHDOG_SECONDS, expires = interval."""
    settings.BALDUR_TASK_META_WATCHDOG_SECONDS = 45
    from baldur_django.tasks import BEAT_SCHEDULE

    entry = BEAT_SCHEDULE["baldur-meta-watchdog"]
    assert entry == {"task": "baldur_django.tasks.meta_watchdog", "schedule": 45.0, "options": {"expires": 45.0}}
    check = BEAT_SCHEDULE["baldur-emergency-check"]
    assert (
        check["task"] == "baldur_django.tasks.emergency_check"
        and check["options"]["expires"] == check["schedule"] == 10.0
    )

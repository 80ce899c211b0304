"""EM-4 auto-activation and EM-2's recovery-sweep hold, over every shared store (memory
reference, fakeredis, real Redis, SQLite, PostgreSQL), plus ST-5's owned lock.

The breakers live in the store under test; the emergency level lives in an in-process
level backend whose record plays the shared state, and a FakeClock drives the time
between checks (the store's own clock decides nothing here but recovery timeouts, which
the tests set far away or move with ``backend.age``).
"""

from __future__ import annotations

import logging

import pytest

from baldur_django.core import emergency, maintenance
from baldur_django.core.events import EmergencyLevelChanged, bus
from baldur_django.core.stores.base import StoreUnavailable
from baldur_django.core.testing import FakeClock, RecordingListener

FAR = 3600.0 * 24


@pytest.fixture
def fleet_store(backend, fresh_registry):
    """The store under test, installed as the registry's shared store."""
    fresh_registry.set_store(backend.store)
    yield backend
    fresh_registry.set_store(None)


@pytest.fixture
def level(monkeypatch):
    """Emergency Mode on an in-process backend with a FakeClock; auto-activation enabled."""
    clock = FakeClock()
    emergency.use_clock(clock)
    backend = emergency.MemoryLevelBackend()
    emergency.use_backend(backend)
    monkeypatch.setenv("BALDUR_EMERGENCY_AUTO_ACTIVATION_ENABLED", "true")
    emergency.mode.source.reset()
    backend.clock = clock
    return backend


def _open(store, *names, forced=False):
    for name in names:
        store.load(name)
        if forced:
            store.force(name, mode="open", ttl_seconds=600.0, reason="maintenance", actor="ops")
        else:
            store.trip(name, trigger="consecutive_failures", recovery_timeout=FAR)


def _closed(store, *names):
    for name in names:
        store.load(name)


def _check(level, seconds=10.0):
    level.clock.advance(seconds)
    return maintenance.emergency_check()


def _records(caplog, event):
    return [r for r in caplog.records if getattr(r, "event", None) == event]


def test_em4_two_consecutive_checks_declare_level_3(fleet_store, level, caplog):
    """EM-4: 3 of 4 registered breakers OPEN (one forced open) on two consecutive checks ->
    Level 3 for BALDUR_EMERGENCY_AUTO_ACTIVATION_MINUTES, source "auto", logged with the counts."""
    store = fleet_store.store
    _open(store, "a", "b")
    _open(store, "c", forced=True)
    _closed(store, "d")
    events = RecordingListener(bus)
    try:
        first = _check(level)
        assert first.skipped is None and (first.breakers, first.open) == (4, 3)
        assert first.emergency["over"] and first.emergency["streak"] == 1 and not first.emergency["declared"]
        assert emergency.current_level() == 0
        with caplog.at_level(logging.WARNING, logger="baldur.emergency"):
            second = _check(level)
    finally:
        bus.unsubscribe(events)
    assert second.emergency["declared"] and second.emergency["level"] == 3
    assert emergency.current_level() == 3 and emergency.frozen()
    status = emergency.status()
    assert status["source"] == "auto" and status["actor"] == "auto-activation"
    assert status["expires_at"] == pytest.approx(level.clock.wall() + 30 * 60)
    (line,) = _records(caplog, "emergency.auto_activated")
    assert (line.open, line.registered) == (3, 4) and "open=3 registered=4" in line.getMessage()
    (change,) = [e for e in events.events if isinstance(e, EmergencyLevelChanged)]
    assert (change.level, change.previous, change.source, change.action) == (3, 0, "auto", "auto")
    third = _check(level)
    assert not third.emergency["declared"] and third.emergency["note"] == "level 3 already in force"


def test_em4_thresholds_ratio_and_minimum_breakers(fleet_store, level):
    """EM-4: 2 of 4 OPEN (50 % < 70 %) never declares; 2 of 2 OPEN is 100 % but under the
    minimum of 3 registered breakers."""
    store = fleet_store.store
    _open(store, "a", "b")
    for _ in range(3):
        report = _check(level)
        assert report.emergency["over"] is False
    _closed(store, "c", "d")
    for _ in range(3):
        report = _check(level)
        assert (report.breakers, report.open) == (4, 2) and not report.emergency["over"]
    assert emergency.current_level() == 0


def test_em4_minimum_breakers_gate(fleet_store, level):
    """EM-4: every breaker OPEN but fewer than BALDUR_EMERGENCY_AUTO_ACTIVATION_MIN_BREAKERS: nothing."""
    _open(fleet_store.store, "a", "b")
    for _ in range(3):
        report = _check(level)
    assert report.emergency["ratio"] == 100.0 and not report.emergency["over"]
    assert emergency.current_level() == 0


def test_em4_checks_must_be_consecutive(fleet_store, level):
    """EM-4: over, under, over is not two consecutive checks; a check long after the previous one
    (more than 2.5 intervals) starts a new streak."""
    store = fleet_store.store
    _open(store, "a", "b", "c")
    _closed(store, "d")
    assert _check(level).emergency["streak"] == 1
    store.force("a", mode="closed", ttl_seconds=600.0, reason="", actor=None)  # 2 of 4 now
    assert _check(level).emergency["streak"] == 0
    store.release("a")
    store.trip("a", trigger="consecutive_failures", recovery_timeout=FAR)
    assert _check(level).emergency["streak"] == 1
    stale = _check(level, seconds=26.0)
    assert stale.emergency["streak"] == 1 and not stale.emergency["declared"]
    assert _check(level).emergency["declared"]


def test_em4_a_second_scheduler_neither_doubles_nor_a_restart_loses_a_check(fleet_store, level):
    """EM-4: the previous check lives in the shared record: a duplicate run in the same interval
    (a second beat scheduler) changes nothing, and a worker that restarts (its cache gone)
    still counts the check before it."""
    store = fleet_store.store
    _open(store, "a", "b", "c")
    assert _check(level).emergency["streak"] == 1
    duplicate = _check(level, seconds=1.0)
    assert duplicate.emergency["note"].startswith("duplicate") and duplicate.emergency["streak"] == 1
    assert emergency.current_level() == 0
    emergency.mode._forget()  # a restarted worker: nothing cached in the process
    assert _check(level, seconds=9.0).emergency["declared"]


@pytest.mark.parametrize("ending", ["step_down", "expiry"])
def test_em4_stabilization_after_a_freeze_ends(ending, fleet_store, level, monkeypatch):
    """EM-4: after a freeze ends (step down or expiry) nothing is declared again until
    BALDUR_EMERGENCY_STABILIZATION_SECONDS (300) have passed, whatever the ratio."""
    monkeypatch.setenv("BALDUR_EMERGENCY_AUTO_ACTIVATION_MINUTES", "1")
    emergency.mode.source.reset()
    store = fleet_store.store
    _open(store, "a", "b", "c")
    _check(level)
    assert _check(level).emergency["declared"]
    if ending == "step_down":
        assert emergency.step_down(actor="alice") == 2
    else:
        level.clock.advance(60.0)  # the automatic level's minute runs out
        assert emergency.current_level() == 0
    ended_at = level.clock.wall()
    notes = []
    while level.clock.wall() - ended_at < 290.0:
        report = _check(level)
        assert not report.emergency["declared"]
        notes.append(report.emergency["note"])
    assert notes[-1].startswith("stabilizing")
    report = _check(level)
    assert report.emergency["declared"], report.emergency
    assert emergency.current_level() == 3


def test_em4_never_lowers_an_operators_level(fleet_store, level):
    """EM-4: with an operator's Level 3 in force (short expiry) the check declares nothing and
    leaves the operator's record alone; an operator's Level 1 may be raised to 3."""
    store = fleet_store.store
    _open(store, "a", "b", "c")
    emergency.set_level(3, minutes=2, actor="alice", reason="ours")
    before = emergency.status()
    for _ in range(3):
        assert not _check(level).emergency["declared"]
    after = emergency.status()
    assert (after["source"], after["actor"], after["expires_at"]) == ("manual", "alice", before["expires_at"])
    emergency.set_level(1, minutes=60, actor="alice")
    level.clock.advance(400.0)  # going 3 -> 1 ended the freeze; wait out the stabilization
    _check(level)
    report = _check(level)
    assert report.emergency["declared"] and emergency.current_level() == 3


def test_em4_disabled_by_default_touches_nothing(fleet_store, level, monkeypatch):
    """EM-4: with BALDUR_EMERGENCY_AUTO_ACTIVATION_ENABLED off, checks count but never write or declare."""
    monkeypatch.delenv("BALDUR_EMERGENCY_AUTO_ACTIVATION_ENABLED")
    emergency.mode.source.reset()
    _open(fleet_store.store, "a", "b", "c")
    for _ in range(3):
        report = _check(level)
        assert report.open == 3 and report.emergency["enabled"] is False and not report.emergency["declared"]
    assert level.read() == emergency.LevelState()


class DownOnNames:
    """A store whose registry cannot be read."""

    def __init__(self, inner):
        self.inner = inner

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def names(self):
        raise StoreUnavailable("registry read failed: connection refused")


def test_em4_unreadable_store_declares_nothing_and_logs_check_skipped(fleet_store, level, fresh_registry, caplog):
    """EM-4: a store whose registry cannot be read: emergency.check_skipped, nothing declared,
    the streak untouched."""
    store = fleet_store.store
    _open(store, "a", "b", "c")
    assert _check(level).emergency["streak"] == 1
    fresh_registry.set_store(DownOnNames(store))
    with caplog.at_level(logging.WARNING, logger="baldur.emergency"):
        report = _check(level)
    assert report.skipped == "store unavailable" and report.emergency is None and report.breakers == 0
    assert len(_records(caplog, "emergency.check_skipped")) == 1
    assert level.read().check_streak == 1 and emergency.current_level() == 0


def test_em4_memory_backend_declares_nothing_and_says_so_once(fresh_registry, level, caplog, monkeypatch):
    """EM-4: on the memory backend there is no fleet to judge: skipped, said once per process."""
    monkeypatch.setattr(maintenance, "_memory_notice_given", False)
    fresh_registry.set_store(None)
    with caplog.at_level(logging.INFO, logger="baldur.emergency"):
        for _ in range(3):
            assert _check(level).skipped == "memory backend"
    assert len(_records(caplog, "emergency.check_skipped")) == 1
    assert emergency.current_level() == 0


def test_em2_recovery_sweep_holds_during_level_3(fleet_store, level, caplog):
    """EM-2: during Level 3 the sweep moves nothing and logs recovery_sweep_blocked with the
    number of OPEN breakers it held; after a step down it moves them."""
    store = fleet_store.store
    _closed(store, "a", "b", "c")
    store.trip("a", trigger="consecutive_failures", recovery_timeout=5.0)
    store.trip("b", trigger="consecutive_failures", recovery_timeout=5.0)
    fleet_store.age("a", 6.0)
    fleet_store.age("b", 6.0)
    emergency.set_level(3, minutes=10)
    with caplog.at_level(logging.WARNING, logger="baldur.circuit_breaker"):
        report = maintenance.recovery_sweep()
    assert report.moved == [] and report.held == 2 and report.breakers == 3
    assert store.inspect("a").record.state == "open"
    (line,) = _records(caplog, "circuit_breaker.recovery_sweep_blocked")
    assert line.held == 2 and line.levelname == "WARNING"
    emergency.step_down()
    assert maintenance.recovery_sweep().moved == ["a", "b"]


# ------------------------------------------------------------------------- ST-5 lock
def test_st5_lock_owner_token_two_competing_holders(backend):
    """ST-5: only the lock's owner extends or releases it: after A's lock expired and B took it,
    A can neither extend nor release it, while B can; a held lock refuses a second acquire."""
    store = backend.store
    a = store.lock("task:job", ttl_seconds=30.0)
    assert a and store.lock("task:job", ttl_seconds=30.0) is None
    assert store.extend("task:job", token=a, ttl_seconds=30.0) is True
    assert store.extend("task:job", token="not-the-owner", ttl_seconds=30.0) is False
    assert store.unlock("task:job", token="not-the-owner") is False
    _expire_lock(backend, "task:job")
    b = store.lock("task:job", ttl_seconds=30.0)
    assert b and b != a
    assert store.extend("task:job", token=a, ttl_seconds=30.0) is False
    assert store.unlock("task:job", token=a) is False
    assert store.lock("task:job", ttl_seconds=30.0) is None  # still B's
    assert store.extend("task:job", token=b, ttl_seconds=30.0) is True
    assert store.unlock("task:job", token=b) is True
    assert store.lock("task:job", ttl_seconds=30.0)


def _expire_lock(backend, name):
    """Let the lock's lifetime pass (each store's own way of telling time)."""
    store = backend.store
    if backend.name == "memory":
        backend.age(name, 31.0)
    elif backend.name in ("redis", "fakeredis", "cluster"):
        from baldur_django.core.stores.base import safe_key

        store.client.delete(f"{store.prefix}:lock:{{{safe_key(name)}}}")
    else:
        from baldur_django.backends.models import BreakerLock

        BreakerLock.objects.using(store.alias).filter(name=name).update(expires_at=0.0)


def test_st5_a_run_that_lost_its_lock_stops_before_writing(fresh_registry):
    """ST-5: the sweep's lock expires mid-run and another run takes it: the first run's next
    write is refused (it stops, skipped="lock lost") and the other run's lock is untouched."""
    from baldur_django.core.stores.memory import MemoryStore

    clock = FakeClock()
    fresh_registry.clock = clock
    store = MemoryStore(now=clock.wall)
    fresh_registry.set_store(store)
    for name in ("a", "b", "c"):
        store.trip(name, trigger="consecutive_failures", recovery_timeout=1.0)
    clock.advance(2.0)
    real_sweep = store.sweep
    taken = {}

    def sweep_then_lose_the_lock(name, **kwargs):
        answer = real_sweep(name, **kwargs)
        if name == "a":
            clock.advance(11.0)  # past the 10 s lifetime: it expires and another run takes it
            taken["token"] = store.lock("task:recovery_sweep", ttl_seconds=10.0)
        return answer

    store.sweep = sweep_then_lose_the_lock
    report = maintenance.recovery_sweep()
    assert report.skipped == "lock lost" and report.moved == ["a"]
    assert store.raw("b").state == "open" and store.raw("c").state == "open"
    assert taken["token"] and store.extend("task:recovery_sweep", token=taken["token"], ttl_seconds=10.0)


def test_st5_a_failed_acquire_never_runs_unlocked(fresh_registry):
    """ST-5: a lock the store cannot take (store trouble) skips the run: nothing is written."""
    from baldur_django.core.stores.memory import MemoryStore

    store = MemoryStore()
    store.trip("a", trigger="consecutive_failures", recovery_timeout=0.001)

    def broken_lock(name, ttl_seconds):
        raise StoreUnavailable("lock failed")

    store.lock = broken_lock
    fresh_registry.set_store(store)
    report = maintenance.recovery_sweep()
    assert report.skipped == "store unavailable" and report.moved == []
    assert store.raw("a").state == "open"

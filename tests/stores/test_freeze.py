"""EM-2, EM-3: Level 3 freezes every automatic decision of a breaker, on every store.

Table-driven over (state, forced, level) with a FakeClock, for a process-local breaker and
for breakers sharing each store (memory, fakeredis, real Redis, SQLite, PostgreSQL):

* no trip (failures are still recorded), the cascade counts but opens nothing;
* no probe: an OPEN breaker past its recovery timeout rejects with reason ``frozen``
  (before its timeout: ``open``); HALF_OPEN admits no trial (``frozen``);
* no close: a trial that ends during the freeze decides nothing;
* a forced open whose lifetime lapses during Level 3 stays OPEN until the level drops;
* forces and releases still work; a decision already taken elsewhere is still adopted;
* levels 1 and 2 change nothing; dry-run still never rejects;
* EM-3: after the level drops, held breakers probe again, and the next failure trips a
  breaker already over its threshold while a success in between resets the count.
"""

from __future__ import annotations

import dataclasses

import pytest

from baldur_django.core import emergency
from baldur_django.core.breaker import CircuitBreaker
from baldur_django.core.config import SettingsSource, build_config
from baldur_django.core.errors import CircuitOpenError
from baldur_django.core.events import EventBus
from baldur_django.core.sync import StoreGuard
from baldur_django.core.testing import FakeClock, RecordingListener
from tests.conftest import need_server
from tests.stores import conftest

OVERRIDES = {
    "failure_threshold": 2,
    "failure_rate_threshold": 0,
    "recovery_timeout": 10,
    "half_open_max_calls": 1,
    "sliding_window_size": 10,
    "minimum_calls": 1,
}
KINDS = ["local", "memory", "fakeredis", "redis", "sqlite", "postgres"]


def make_backend(kind, request):
    """The store of *kind* (as the ``backend`` fixture builds it), or None for a local breaker."""
    if kind == "local":
        return None
    if kind == "memory":
        return conftest._memory()
    if kind == "fakeredis":
        import fakeredis

        return conftest._redis_backend(fakeredis.FakeRedis(), "fakeredis")
    if kind == "redis":
        return conftest._redis_backend(request.getfixturevalue("redis_client"))
    if kind == "sqlite":
        return conftest._database("default")
    need_server("PostgreSQL at 127.0.0.1:5432", conftest.reachable("127.0.0.1", 5432))
    return conftest._database("pg")


class Rig:
    """One breaker (local or on a store), its clock, its events and a way to age the store."""

    def __init__(self, kind, request, name, sync_interval="0"):
        self.clock = FakeClock()
        emergency.use_clock(self.clock)
        emergency.use_backend(emergency.MemoryLevelBackend())
        self.name = name
        self.backend = make_backend(kind, request)
        config = build_config(
            name, OVERRIDES, SettingsSource(environ={"BALDUR_CB_SYNC_INTERVAL_SECONDS": sync_interval})
        )
        self.bus = EventBus()
        self.events = RecordingListener(self.bus)
        self.breaker = CircuitBreaker(name, config, clock=self.clock, bus=self.bus)
        if self.backend is not None:
            store = self.backend.store
            self.breaker.use_store(
                StoreGuard(store, lambda: 60.0, lambda e: None, self.clock.monotonic, self.clock.wall)
            )

    def advance(self, seconds):
        self.clock.advance(seconds)
        if self.backend is not None:
            self.backend.age(self.name, seconds)

    def fail(self, times=1):
        for _ in range(times):
            self.breaker.record_failure(self.breaker.acquire())

    def rejection(self):
        with pytest.raises(CircuitOpenError) as rejected:
            self.breaker.acquire()
        return rejected.value

    def state(self):
        return self.breaker.snapshot()["state"]


@pytest.fixture
def rig(request, shared_store):
    made = Rig(shared_store, request, f"freeze-{shared_store}-{request.node.name[:60]}")
    yield made
    emergency.reset()


@pytest.fixture(autouse=True)
def _level_reset():
    yield
    emergency.reset()


on_every_store = pytest.mark.parametrize("shared_store", KINDS)


def freeze(level=3):
    emergency.set_level(level, minutes=60, reason="test", actor="tester")


@pytest.mark.parametrize("level", [1, 2, 3])
@on_every_store
def test_em2_closed_over_threshold_trips_only_below_level_3(rig, level):
    """EM-2: at Level 3 failures past the threshold open nothing but are counted; levels 1
    and 2 change nothing."""
    freeze(level)
    rig.fail(3 if level == 3 else 2)
    snap = rig.breaker.snapshot()
    if level == 3:
        assert snap["state"] == "closed" and snap["consecutive_failures"] == 3 and snap["window_failures"] == 3
        assert rig.events.transitions() == []
    else:
        assert snap["state"] == "open" and rig.events.transitions()[0][:2] == ("closed", "open")


@on_every_store
def test_em2_open_is_held_past_its_timeout_with_reason_frozen(rig):
    """EM-2, EM-3: before the timeout a frozen OPEN rejects with ``open``, after it with
    ``frozen`` (no retry_after) and reads OPEN; stepping down lets it probe and close."""
    rig.fail(2)
    freeze()
    early = rig.rejection()
    assert early.reason == "open" and early.retry_after == pytest.approx(10)
    rig.advance(11)
    held = rig.rejection()
    assert held.reason == "frozen" and held.retry_after is None
    assert rig.state() == "open"
    assert emergency.step_down() == 2
    trial = rig.breaker.acquire()
    assert trial.trial
    rig.breaker.record_success(trial)
    assert rig.state() == "closed"


@on_every_store
def test_em2_half_open_admits_no_trial_and_a_trial_in_flight_decides_nothing(rig):
    """EM-2: HALF_OPEN rejects new trials with ``frozen``; a trial admitted before the freeze
    that succeeds during it does not close; after the step down the breaker probes again."""
    rig.fail(2)
    rig.advance(11)
    trial = rig.breaker.acquire()
    assert trial.trial
    freeze()
    assert rig.rejection().reason == "frozen"
    rig.breaker.record_success(trial)
    assert rig.state() == "half_open"
    assert rig.breaker.snapshot()["half_open_successes"] == 0  # decided nothing
    emergency.set_level(0)
    again = rig.breaker.acquire()
    assert again.trial
    rig.breaker.record_success(again)
    assert rig.state() == "closed"


@on_every_store
def test_em2_forced_open_lapsing_during_level_3_stays_open(rig):
    """EM-2: the force lapses but the breaker stays OPEN (rejecting ``frozen``) until the level
    drops; then it probes at once."""
    rig.breaker.force_open(ttl_minutes=1)
    freeze()
    rig.advance(61)
    assert rig.state() == "open" and rig.breaker.snapshot()["forced"] is None
    assert rig.rejection().reason == "frozen"
    emergency.set_level(0)
    assert rig.breaker.acquire().trial


@on_every_store
def test_em2_forces_and_releases_still_work(rig):
    """EM-2: operators act during a freeze: force open, force close, release."""
    freeze()
    rig.breaker.force_open(ttl_minutes=5)
    assert rig.state() == "open"
    rig.breaker.force_close(ttl_minutes=5)
    assert rig.state() == "closed"
    assert rig.breaker.release() is True
    rig.fail(3)
    assert rig.state() == "closed"  # automatic again, still frozen


@on_every_store
def test_em3_after_the_step_down_the_next_failure_trips_and_a_success_resets(rig):
    """EM-3: a breaker already over its threshold trips on the next failure after the level
    drops; a success in between resets the count first."""
    freeze()
    rig.fail(3)
    emergency.set_level(0)
    rig.fail(1)
    assert rig.state() == "open"
    other = Rig("local", None, "freeze-em3-reset")
    emergency.use_clock(rig.clock)
    freeze()
    other.fail(3)
    emergency.set_level(0)
    other.breaker.record_success(other.breaker.acquire())
    other.fail(1)
    assert other.state() == "closed" and other.breaker.snapshot()["consecutive_failures"] == 1


def test_em2_cascade_counts_but_opens_nothing():
    """EM-2, RL-3: a 429 storm during Level 3 is counted but opens nothing; once the level
    drops the next sighting opens the breaker through the cascade."""
    rig = Rig("local", None, "freeze-cascade")
    config = dataclasses.replace(rig.breaker.config, failure_threshold=1000, cascade_threshold=3, cascade_min_calls=3)
    rig.breaker.reconfigure(config)
    freeze()
    for _ in range(5):
        rig.breaker.record_failure(rig.breaker.acquire(), rate_limited=True, retry_after=0)
    assert rig.state() == "closed"
    emergency.set_level(0)
    rig.breaker.record_failure(rig.breaker.acquire(), rate_limited=True, retry_after=0)
    assert rig.state() == "open" and rig.breaker.snapshot()["last_trigger"] == "rate_limit_cascade"
    emergency.reset()


def test_em2_dry_run_never_rejects_while_frozen():
    """EM-2, OP-5: a frozen OPEN breaker in dry-run still lets calls through (counted)."""
    rig = Rig("local", None, "freeze-dry")
    rig.breaker.reconfigure(dataclasses.replace(rig.breaker.config, dry_run=True))
    rig.fail(2)
    freeze()
    rig.advance(11)
    permit = rig.breaker.acquire()
    assert permit.dry_run and rig.breaker.snapshot()["dry_run_rejections"] == 1
    emergency.reset()


@pytest.mark.parametrize("shared_store", ["memory", "fakeredis", "redis", "sqlite", "postgres"])
def test_em2_a_decision_taken_elsewhere_is_still_adopted(shared_store, request):
    """EM-2: a force written by another process reaches a frozen worker on its next consult."""
    rig = Rig(shared_store, request, f"freeze-adopt-{shared_store}", sync_interval="5")
    rig.breaker.record_success(rig.breaker.acquire())
    freeze()
    rig.backend.store.force(rig.name, mode="open", ttl_seconds=300.0, reason="peer", actor="ops")
    rig.advance(6)  # the next sync-interval consult
    assert rig.state() == "open" and rig.breaker.snapshot()["forced"] == "open"
    assert rig.rejection().reason == "open"
    emergency.reset()

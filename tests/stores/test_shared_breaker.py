"""ST-2/ST-3/ST-4/OP-4/CB-14: breakers of several "workers" sharing one store.

Each worker is a breaker with its own event bus and store guard over the same store,
as separate processes would have; the memory store and a FakeClock make every
time-based rule exact. Real processes and real servers are in test_fleet.py.
"""

from __future__ import annotations

import logging

import pytest

from baldur_django.core.breaker import CircuitBreaker
from baldur_django.core.config import SettingsSource, build_config
from baldur_django.core.errors import CircuitOpenError, StoreError
from baldur_django.core.events import EventBus
from baldur_django.core.log import LoggingListener
from baldur_django.core.stores.base import StoreUnavailable
from baldur_django.core.stores.memory import MemoryStore
from baldur_django.core.sync import StoreGuard
from baldur_django.core.testing import FakeClock, RecordingListener


class CountingStore:
    """Wraps a store, counting calls per operation; can be switched off to simulate an outage."""

    def __init__(self, inner):
        self.inner = inner
        self.backend = "memory"
        self.calls: dict[str, int] = {}
        self.down = False

    def __getattr__(self, op):
        target = getattr(self.inner, op)

        def call(*args, **kwargs):
            self.calls[op] = self.calls.get(op, 0) + 1
            if self.down:
                raise StoreUnavailable("simulated outage")
            return target(*args, **kwargs)

        return call

    def total(self):
        return sum(self.calls.values())


@pytest.fixture
def fleet():
    clock = FakeClock()
    store = CountingStore(MemoryStore(now=clock.wall))

    def worker(name="pay", sync=5.0, **overrides):
        bus = EventBus()
        events = RecordingListener(bus)
        environ = {"BALDUR_CB_SYNC_INTERVAL_SECONDS": str(sync), "BALDUR_STORE_WARNING_INTERVAL_SECONDS": "60"}
        source = SettingsSource(environ=environ)
        guard = StoreGuard(store, lambda: 60.0, bus.publish, clock.monotonic, clock.wall)
        config = build_config(
            name, {"failure_threshold": 3, "recovery_timeout": 10, "half_open_max_calls": 2, **overrides}, source
        )
        breaker = CircuitBreaker(name, config, clock=clock, bus=bus)
        breaker.use_store(guard)
        breaker.events = events
        breaker.bus = bus
        return breaker

    worker.clock = clock
    worker.store = store
    return worker


def fail(breaker, times=1):
    for _ in range(times):
        breaker.record_failure(breaker.acquire())


def test_st3_closed_calls_make_no_round_trip(fleet):
    """ST-3: after the first-use consult, CLOSED calls touch the store at most once per sync interval."""
    worker = fleet(sync=5.0)
    worker.record_success(worker.acquire())
    after_first_use = fleet.store.total()
    assert after_first_use == 1  # the first use consults the shared record
    for _ in range(10_000):
        worker.record_success(worker.acquire())
    assert fleet.store.total() == after_first_use
    fleet.clock.advance(5.0)
    worker.record_success(worker.acquire())
    assert fleet.store.total() == after_first_use + 1


def test_st3_open_rejections_make_no_round_trip(fleet):
    """ST-3: while OPEN and inside the recovery timeout, rejections are local."""
    worker = fleet(sync=0)
    fail(worker, 3)
    before = fleet.store.total()
    for _ in range(1000):
        with pytest.raises(CircuitOpenError):
            worker.acquire()
    assert fleet.store.total() == before


def test_st2_peers_adopt_a_trip_without_publishing_it(fleet):
    """ST-2/CB-14: worker A trips; worker B adopts OPEN on its next consult and publishes nothing."""
    a, b = fleet(), fleet()
    b.record_success(b.acquire())
    fail(a, 3)
    assert a.events.transitions() == [("closed", "open", "consecutive_failures")]
    fleet.clock.advance(5.0)  # B's sync interval
    with pytest.raises(CircuitOpenError) as info:
        b.acquire()
    assert info.value.reason == "open"
    assert info.value.retry_after == pytest.approx(5.0)
    assert b.events.transitions() == []


def test_st2_fleet_wide_half_open_budget(fleet):
    """ST-2/CB-6: three workers together admit half_open_max_calls probes, and the round closes fleet-wide."""
    workers = [fleet() for _ in range(3)]
    fail(workers[0], 3)
    fleet.clock.advance(10.0)
    permits, rejected = [], 0
    for worker in workers * 2:
        try:
            permits.append((worker, worker.acquire()))
        except CircuitOpenError as exc:
            assert exc.reason == "half_open_full"
            rejected += 1
    assert len(permits) == 2 and all(p.trial for _, p in permits)
    assert rejected == 4
    for worker, permit in permits:
        worker.record_success(permit)
    assert fleet.store.inner.raw("pay").state == "closed"
    closes = [w for w in workers if ("half_open", "closed", "half_open_success") in w.events.transitions()]
    assert len(closes) == 1  # published once, by the worker whose outcome closed it


def test_op4_trip_meets_force_and_is_blocked(fleet, caplog):
    """OP-4: a worker that has not seen a force yet trips into it; the store refuses, the worker
    adopts the force and logs circuit_breaker.trip_blocked."""
    a, b = fleet(), fleet()
    a.bus.subscribe(LoggingListener(lambda: "WARNING"))
    a.record_success(a.acquire())  # first use before the force
    b.force_close(30, "known good", "ops")
    with caplog.at_level(logging.WARNING, logger="baldur.circuit_breaker"):
        fail(a, 3)
    assert [r.event for r in caplog.records] == ["circuit_breaker.trip_blocked"]
    assert a.state.value == "closed" and a.forced == "closed"
    assert fleet.store.inner.raw("pay").forced == "closed"
    assert a.events.kinds() == ["trip_blocked"]
    fail(a, 10)  # forced closed: failures are recorded, nothing trips
    assert a.snapshot()["consecutive_failures"] >= 10 and a.state.value == "closed"


def test_op4_force_reaches_a_running_worker_within_the_sync_interval(fleet):
    """OP-4: B obeys A's force open on its first consult after the sync interval; a new worker at once."""
    a, b = fleet(sync=5.0), fleet(sync=5.0)
    b.record_success(b.acquire())
    a.force_open(10, "maintenance", "alice")
    b.record_success(b.acquire())  # still inside B's interval: B answers from its own view
    fleet.clock.advance(5.0)
    with pytest.raises(CircuitOpenError) as info:
        b.acquire()
    assert info.value.retry_after == pytest.approx(595.0)
    late = fleet()
    with pytest.raises(CircuitOpenError):
        late.acquire()


def test_op3_force_lapses_once_for_the_fleet(fleet):
    """OP-3/ST-5: a lapsed forced open goes HALF_OPEN, and only one worker publishes force_lapsed."""
    a, b = fleet(sync=1.0), fleet(sync=1.0)
    b.record_success(b.acquire())
    a.force_open(1, "", None)
    fleet.clock.advance(61.0)
    assert a.refresh().value == "half_open"  # the consult a state read used to make
    assert b.refresh().value == "half_open"
    lapses = [e for w in (a, b) for e in w.events.events if e.kind == "force_lapsed"]
    assert len(lapses) == 1


def test_op4_force_store_failure_raises_and_changes_nothing(fleet):
    """OP-4: an operator's force whose store write fails raises a clear BaldurError."""
    a = fleet()
    fleet.store.down = True
    with pytest.raises(StoreError, match="could not store the force"):
        a.force_open(10, "", None)
    assert a.forced is None and a.state.value == "closed"


def test_st4_outage_local_judgement_and_rejoin(fleet, caplog):
    """ST-4: during an outage no store error reaches the caller, trips still happen locally,
    one warning is logged per interval; on recovery the trip is pushed and the worker rejoins."""
    a = fleet(sync=1.0)
    a.bus.subscribe(LoggingListener(lambda: "WARNING"))
    a.record_success(a.acquire())
    fleet.store.down = True
    with caplog.at_level(logging.INFO, logger="baldur.circuit_breaker"):
        fleet.clock.advance(1.0)
        for _ in range(50):
            a.record_success(a.acquire())
            fleet.clock.advance(0.1)
        fail(a, 3)
        assert a.state.value == "open"
        with pytest.raises(CircuitOpenError):
            a.acquire()
        unavailable = [r for r in caplog.records if r.event == "circuit_breaker.store_unavailable"]
        assert len(unavailable) == 1
        fleet.store.down = False
        fleet.clock.advance(1.0)
        with pytest.raises(CircuitOpenError):
            a.acquire()  # consult: pushes the outage trip, adopts the shared OPEN
    events = [r.event for r in caplog.records]
    assert "circuit_breaker.store_recovered" in events
    assert fleet.store.inner.raw("pay").state == "open"
    assert fleet.store.inner.raw("pay").trigger == "consecutive_failures"


def test_st4_outage_trip_pushed_on_recovery_is_refused_by_a_force(fleet):
    """ST-4/OP-4: a trip made during an outage meets a force written meanwhile and is refused."""
    a, b = fleet(sync=1.0), fleet(sync=1.0)
    a.record_success(a.acquire())
    fleet.store.down = True
    fail(a, 3)
    fleet.store.down = False
    b.force_close(30, "", "ops")
    fleet.clock.advance(1.0)
    a.record_success(a.acquire())  # consult: push refused, force adopted, call admitted
    assert a.forced == "closed"
    assert "trip_blocked" in a.events.kinds()


def test_st2_worker_start_never_resets_the_shared_record(fleet):
    """ST-2: a worker that starts reads the record; it never writes a fresh one over it."""
    a = fleet()
    fail(a, 3)
    version = fleet.store.inner.raw("pay").version
    newcomer = fleet()
    with pytest.raises(CircuitOpenError):
        newcomer.acquire()
    assert fleet.store.inner.raw("pay").version == version
    assert fleet.store.inner.raw("pay").state == "open"


def test_st2_dead_probe_lease_expires(fleet):
    """ST-2: a probe whose worker died holds its slot only for the lease."""
    a, b = fleet(half_open_max_calls=1), fleet(half_open_max_calls=1)
    fail(a, 3)
    fleet.clock.advance(10.0)
    a.acquire()  # A "dies" holding the only probe
    with pytest.raises(CircuitOpenError) as info:
        b.acquire()
    assert info.value.reason == "half_open_full"
    fleet.clock.advance(31.0)  # BALDUR_CB_HALF_OPEN_PROBE_LEASE_SECONDS = 30
    permit = b.acquire()
    assert permit.trial
    b.record_success(permit)
    assert fleet.store.inner.raw("pay").state == "closed"


def test_cb8_stale_trial_outcome_after_fleet_moved_on(fleet):
    """CB-8: a trial outcome arriving after the record moved on is dropped by the store."""
    a, b = fleet(half_open_max_calls=1), fleet(half_open_max_calls=1)
    fail(a, 3)
    fleet.clock.advance(10.0)
    permit = a.acquire()
    b.force_open(5, "", None)
    a.record_success(permit)
    assert fleet.store.inner.raw("pay").state == "open"
    assert fleet.store.inner.raw("pay").forced == "open"


def test_rl9_reported_429_fails_the_fleet_round(fleet):
    """RL-9/ST-2: a 429 reported with record_rate_limit while the fleet probes reopens the
    shared record (like a failed probe), so the fleet's round fails, not just this worker's view."""
    a, b = fleet(), fleet()
    fail(a, 3)
    fleet.clock.advance(10.0)
    assert b.refresh().value == "half_open" and fleet.store.inner.raw("pay").state == "half_open"
    b.report_rate_limit("5")
    record = fleet.store.inner.raw("pay")
    assert record.state == "open" and record.trigger == "half_open_failure"
    assert b.cooldown_remaining() == 5.0
    fleet.clock.advance(5.0)
    with pytest.raises(CircuitOpenError):
        a.acquire()  # A's next consult adopts the reopened record


@pytest.mark.parametrize("end", ["release", "lapse"])
def test_op3_peer_end_of_forced_closed_reaches_a_running_worker(fleet, end):
    """OP-3/OP-4/ST-3 (found by the chaos test): when another process releases a forced closed,
    or it lapses in the store, a worker that had adopted it drops it on its next consult: its
    failures trip it again, and its CLOSED calls are back on the hot path (no store round trip
    per call). The store's record version changes with the force, so the consult adopts it."""
    worker = fleet(sync=5.0, failure_threshold=2)
    worker.record_success(worker.acquire())  # first use: consults
    fleet.store.force("pay", mode="closed", ttl_seconds=60.0, reason="known good", actor="ops")
    fleet.clock.advance(5.0)
    worker.record_success(worker.acquire())  # sync interval: adopts the force
    assert worker.forced == "closed"
    if end == "release":
        assert fleet.store.release("pay").result == "closed"  # an operator in another process
        fleet.clock.advance(5.0)
    else:
        fleet.clock.advance(60.0)
    worker.record_success(worker.acquire())  # the next consult
    assert worker.forced is None
    calls = fleet.store.total()
    for _ in range(20):
        worker.record_success(worker.acquire())
    assert fleet.store.total() == calls  # hot path again: no round trip per call
    fail(worker, 2)
    assert worker.state.value == "open"  # automatic judgement is back
    assert fleet.store.inner.raw("pay").state == "open"


def test_st4_local_round_of_an_outage_yields_to_the_shared_record(fleet):
    """ST-4/ST-3 (found reviewing the chaos test's convergence failures): a worker that went
    HALF_OPEN and closed on its own judgement during an outage, while the shared record stayed
    OPEN at the same version, follows the record again on its next consult. Before, the
    consult saw an unchanged version and kept the local CLOSED: the worker sent ordinary calls
    to a dependency the fleet held OPEN until some peer changed the record."""
    w = fleet(sync=5.0, failure_threshold=1, recovery_timeout=10, half_open_max_calls=1)
    w.record_success(w.acquire())
    fail(w)  # the trip is written: the record is OPEN
    assert fleet.store.inner.raw("pay").state == "open"
    fleet.store.down = True
    fleet.clock.advance(10.0)
    trial = w.acquire()  # the store does not answer: a local trial (ST-4)
    assert trial.trial and trial.token not in fleet.store.inner.raw("pay").probes  # a slot of its own record
    fleet.store.down = False
    w.sync()  # the store answers again; the record is still OPEN, same version
    w.record_success(trial)  # the local trial's outcome: local judgement would close
    fleet.clock.advance(5.0)
    permit = w.acquire()  # the next consult follows the shared record (due for a probe)
    assert permit.trial and permit.token is not None  # a shared probe, not a CLOSED call
    assert fleet.store.inner.raw("pay").state == "half_open"

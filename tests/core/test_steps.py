"""ST-2, CB-1..CB-6, CB-16, OP-1..OP-3, EM-2: one state machine, applied once.

``steps.step(record, event, now, timing, frozen)`` computes every transition of a breaker:
one unit test per event kind below, then the meta checks that the local breaker, the memory
store and the database store really go through it (a step function that raises makes each
of their transitions fail).
"""

from __future__ import annotations

import math

import pytest

from baldur_django.core import emergency, steps
from baldur_django.core.breaker import CircuitBreaker, core_of
from baldur_django.core.config import SettingsSource, build_config
from baldur_django.core.control import PEER_APPLIED, PEER_BLOCKED, PEER_LIFTED, PEER_UNCHANGED
from baldur_django.core.errors import CircuitOpenError
from baldur_django.core.events import EventBus
from baldur_django.core.stores.base import ALREADY, BLOCKED, TRIPPED, Record
from baldur_django.core.stores.memory import MemoryStore
from baldur_django.core.testing import FakeClock

T = steps.Timing(10.0, 2.0, 35.0)


def opened(now: float = 100.0, **fields: object) -> Record:
    record = Record()
    steps.step(record, steps.Trip("consecutive_failures"), now, T)
    for name, value in fields.items():
        setattr(record, name, value)
    return record


# ---------------------------------------------------------------------- one test per event
def test_cb1_step_trip_opens_a_closed_record_for_its_backed_off_time():
    """CB-1/CB-16: a Trip opens CLOSED for the backed-off duration; a force blocks it; Level 3
    and a record already open answer ALREADY."""
    record = Record()
    out = steps.step(record, steps.Trip("failure_rate"), 50.0, T)
    assert (out.result, out.before, record.state, record.trigger) == (TRIPPED, "closed", "open", "failure_rate")
    assert (record.opened_at, record.open_until, record.opens, record.version) == (50.0, 60.0, 1, 1)
    assert steps.step(record, steps.Trip("failure_rate"), 51.0, T).result == ALREADY
    forced = Record(forced="closed", force_expires_at=1e9)
    assert steps.step(forced, steps.Trip("slow_call_rate"), 1.0, T).result == BLOCKED
    assert steps.step(Record(), steps.Trip("rate_limit_cascade"), 1.0, T, frozen=True).result == ALREADY


def test_cb5_step_sweep_is_the_recovery_timeout():
    """CB-5: an unforced OPEN past open_until moves to HALF_OPEN; not before, not frozen."""
    record = opened()
    assert steps.step(record, steps.Sweep(), 109.9, T).result is False
    assert steps.step(record, steps.Sweep(), 110.0, T, frozen=True).result is False
    out = steps.step(record, steps.Sweep(), 110.0, T)
    assert (
        out.result is True and out.moved(record) and (record.state, record.trigger) == ("half_open", "recovery_timeout")
    )


def test_cb6_step_acquire_probe_takes_slots_up_to_max_calls():
    """CB-6: probe requests take the round's slots; refusals say why."""
    record = opened()
    out = steps.step(record, steps.AcquireProbe("a", 2, 5.0), 110.0, T)
    assert out.result is True and record.state == "half_open" and record.probes == {"a": 115.0}
    assert steps.step(record, steps.AcquireProbe("b", 2, 5.0), 111.0, T).result is True
    full = steps.step(record, steps.AcquireProbe("c", 2, 5.0), 111.0, T)
    assert (full.result, full.reason) == (False, "half_open_full")
    frozen = steps.step(record, steps.AcquireProbe("c", 2, 5.0), 111.0, T, frozen=True)
    assert frozen.reason == "frozen"
    assert steps.step(opened(), steps.AcquireProbe("d", 2, 5.0), 101.0, T).reason == "open"
    # expired leases give their slot back
    assert steps.step(record, steps.AcquireProbe("e", 2, 5.0), 116.0, T).result is True


def test_cb6_step_finish_probe_counts_closes_reopens_and_drops_stale_rounds():
    """CB-6/CB-16: N successes close (backoff reset); a failure or slow trial reopens backed
    off; an abandon or Level 3 gives the slot back; a stale round or token is ignored; a
    slotless failure (a 429 outside a call) fails the round."""
    record = opened()
    steps.step(record, steps.AcquireProbe("a", 2, 1e9), 110.0, T)
    steps.step(record, steps.AcquireProbe("b", 2, 1e9), 110.0, T)
    version = record.version
    assert steps.step(record, steps.FinishProbe("a", version - 1, "success", 2), 111.0, T).result is None
    assert steps.step(record, steps.FinishProbe("zz", version, "success", 2), 111.0, T).result is None
    assert steps.step(record, steps.FinishProbe("a", version, "success", 2), 111.0, T).result is None
    assert record.successes == 1
    assert steps.step(record, steps.FinishProbe("b", version, "failure", 2), 112.0, T, frozen=True).result is None
    assert record.probes == {} and record.state == "half_open"
    steps.step(record, steps.AcquireProbe("c", 2, 1e9), 112.0, T)
    out = steps.step(record, steps.FinishProbe("c", version, "success", 2), 113.0, T)
    assert out.result == "closed" and (record.state, record.opens, record.trigger) == ("closed", 0, "half_open_success")
    slow = opened(opens=1)
    steps.step(slow, steps.Sweep(), 110.0, T)
    steps.step(slow, steps.AcquireProbe("s", 1, 1e9), 110.0, T)
    out = steps.step(slow, steps.FinishProbe("s", slow.version, "slow", 1), 111.0, T)
    assert out.result == "open" and (slow.trigger, slow.opens, slow.open_until) == ("slow_call_rate", 2, 131.0)
    slotless = opened()
    steps.step(slotless, steps.Sweep(), 110.0, T)
    assert steps.step(slotless, steps.FinishProbe(None, slotless.version, "abandon", 1), 111.0, T).result is None
    assert steps.step(slotless, steps.FinishProbe(None, slotless.version, "failure", 1), 111.0, T).result == "open"


def test_op1_step_force_holds_the_state_and_keeps_the_trigger_of_the_same_state():
    """OP-1: a force holds either state; a force over the state held already is no transition."""
    record = opened()
    steps.step(record, steps.Force("open", 60.0, "why", "ops"), 101.0, T)
    assert (record.state, record.trigger, record.opened_at, record.open_until) == (
        "open",
        "consecutive_failures",
        100.0,
        110.0,
    )
    assert (record.forced, record.force_expires_at, record.force_reason, record.force_actor) == (
        "open",
        161.0,
        "why",
        "ops",
    )
    closed = Record()
    steps.step(closed, steps.Force("closed", 60.0), 1.0, T)
    assert (closed.state, closed.version, closed.trigger, closed.forced) == ("closed", 1, None, "closed")
    steps.step(closed, steps.Force("open", 60.0), 2.0, T)
    assert (closed.state, closed.trigger, closed.open_until, closed.opens) == ("open", "forced", 62.0, 0)


def test_op2_step_lapse_of_a_force_during_any_step():
    """OP-2/EM-2: a force past its lifetime lapses at the next step: a forced open to
    HALF_OPEN, or held OPEN with open_until = the lapse time under Level 3."""
    record = Record()
    steps.step(record, steps.Force("open", 60.0), 0.0, T)
    out = steps.step(record, steps.Observe(), 60.0, T)
    assert out.lapsed == "open" and (record.state, record.trigger) == ("half_open", "force_lapsed")
    held = Record()
    steps.step(held, steps.Force("open", 60.0), 0.0, T)
    out = steps.step(held, steps.Sweep(), 70.0, T, frozen=True)
    assert out.lapsed == "open" and (held.state, held.open_until, held.forced) == ("open", 70.0, None)


def test_op3_step_release_and_clear():
    """OP-3: a release ends a force (forced open -> HALF_OPEN); a clear (reset) is a fresh
    CLOSED record in a new version whatever it held."""
    record = Record()
    steps.step(record, steps.Force("open", 60.0), 0.0, T)
    assert steps.step(record, steps.Release(), 1.0, T).result == "open" and record.state == "half_open"
    assert steps.step(record, steps.Release(), 2.0, T).result is None
    record = opened(opens=3)
    steps.step(record, steps.Force("open", 60.0), 101.0, T)
    version = record.version
    assert steps.step(record, steps.Clear(), 102.0, T, frozen=True).result == "open"
    assert (record.state, record.forced, record.opens, record.trigger, record.version) == (
        "closed",
        None,
        0,
        "reset",
        version + 1,
    )


@pytest.mark.parametrize(
    ("start", "peer", "verdict", "state"),
    [
        ("closed", "open", PEER_APPLIED, "open"),
        ("open", "open", PEER_UNCHANGED, "open"),
        ("forced_closed", "open", PEER_BLOCKED, "closed"),
        ("open", "closed", PEER_APPLIED, "closed"),
        ("forced_open", "closed", PEER_LIFTED, "closed"),
        ("closed", "closed", PEER_UNCHANGED, "closed"),
    ],
)
def test_cb4_step_peer_decision(start, peer, verdict, state):
    """CB-4: a peer's propagated decision: applied, unchanged, blocked by a forced closed, or
    lifting a forced open; applied while frozen too."""
    record = opened() if start == "open" else Record()
    if start.startswith("forced_"):
        steps.step(record, steps.Force(start.removeprefix("forced_"), 600.0), 100.0, T)
    out = steps.step(record, steps.Peer(peer), 101.0, T, frozen=True)
    assert (out.result, record.state) == (verdict, state)
    if verdict in (PEER_APPLIED, PEER_LIFTED):
        assert record.trigger == "propagated" and record.forced is None


def test_st2_step_adopt_takes_a_store_record_in_the_breakers_seconds():
    """ST-2: adoption takes the store's record with its times moved into the breaker's
    clock, in a new version; a CLOSED record over CLOSED only takes the trigger it names."""
    shared = opened(now=1_000_000.0)
    shared.forced, shared.force_expires_at = "open", 1_000_100.0
    mine = Record()
    steps.step(mine, steps.Adopt(shared, -999_000.0, 1_000_001.0), 1001.0)
    assert (mine.state, mine.version, mine.opened_at, mine.open_until) == ("open", 1, 1000.0, 1010.0)
    assert (mine.forced, mine.force_expires_at, mine.trigger, mine.opens) == ("open", 1100.0, "consecutive_failures", 1)
    closed = Record()
    steps.step(closed, steps.Adopt(Record(version=7, trigger="reset"), 0.0, 5.0), 5.0)
    assert (closed.version, closed.trigger) == (0, "reset")


def test_op4_step_stuck_open_and_prune_questions_change_nothing():
    """The watchdog's stuck-open rule and the prune rule are questions of the same function."""
    record = opened()
    before = Record(**record.to_dict())
    assert steps.step(record, steps.StuckOpen(300.0), 399.0).result is None
    assert steps.step(record, steps.StuckOpen(300.0), 400.0).result == 300.0
    assert steps.step(record, steps.Prune(), 400.0).result is False
    assert record == before
    assert steps.prunable(Record()) and steps.stuck_open_for(record, 500.0, 300.0) == 400.0


def test_st2_step_run_names_every_store_operation_and_refuses_others():
    """ST-2: the store operations are steps; an unknown one is a programming error."""
    for op, args in (("load", ()), ("inspect", ()), ("sweep", ()), ("release", ()), ("clear", ())):
        assert steps.run(op, Record(), 1.0, *args).record.state == "closed"
    assert steps.run("trip", Record(), 1.0, "failure_rate", 10.0, 1.0, math.inf).result == TRIPPED
    with pytest.raises(ValueError, match="unknown store operation"):
        steps.run("explode", Record(), 1.0)
    with pytest.raises(ValueError, match="unknown event"):
        steps.step(Record(), object(), 1.0)  # type: ignore[arg-type]


# ---------------------------------------------------------------------- the meta checks
class StepCalled(Exception):
    pass


def _breaker(clock: FakeClock) -> CircuitBreaker:
    config = build_config(
        "meta", {"failure_threshold": 1, "recovery_timeout": 5.0, "half_open_max_calls": 1}, SettingsSource(environ={})
    )
    return CircuitBreaker("meta", config, clock=clock, bus=EventBus())


@pytest.fixture
def broken_step(monkeypatch):
    """Makes every call of the one step function raise."""

    def arm():
        def broken(*args, **kwargs):
            raise StepCalled

        monkeypatch.setattr(steps, "step", broken)

    return arm


@pytest.mark.parametrize(
    "transition",
    ["trip", "recovery", "probe", "trial", "force_open", "force_close", "release", "reset", "peer", "lapse"],
)
def test_st2_every_breaker_transition_goes_through_the_step_function(transition, broken_step):
    """ST-2: with the step function broken, each kind of breaker transition fails, so none is
    computed anywhere else (the CLOSED success lane, which decides nothing, still works)."""
    emergency.reset()
    clock = FakeClock()
    breaker = _breaker(clock)
    core = core_of(breaker)
    if transition in ("recovery", "probe", "trial"):
        breaker.record_failure(breaker.acquire())
        clock.advance(5.0)
    if transition == "trial":
        trial = breaker.acquire()
    if transition in ("release", "lapse"):
        breaker.force_open(1.0)
    if transition == "lapse":
        clock.advance(60.0)
    broken_step()
    action = {
        "trip": lambda: breaker.record_failure(breaker.acquire()),
        "recovery": lambda: breaker.state,
        "probe": breaker.acquire,
        "trial": lambda: breaker.record_success(trial),
        "force_open": lambda: breaker.force_open(1.0),
        "force_close": lambda: breaker.force_close(1.0),
        "release": breaker.release,
        "reset": breaker.reset,
        "peer": lambda: breaker.apply_peer("open"),
        "lapse": lambda: breaker.state,
    }[transition]
    with pytest.raises(StepCalled):
        action()
    assert core.lock.acquire(blocking=False)  # the lock was released on the way out
    core.lock.release()


def test_st2_the_memory_store_goes_through_the_step_function(broken_step):
    """ST-2: every record operation of the memory store is a step."""
    store = MemoryStore(now=lambda: 1000.0)
    store.load("meta")  # a registered CLOSED record, for prune
    broken_step()
    for op, kwargs in (
        ("load", {}),
        ("sweep", {}),
        ("trip", {"trigger": "failure_rate", "recovery_timeout": 5.0}),
        ("force", {"mode": "open", "ttl_seconds": 60.0}),
        ("release", {}),
        ("clear", {}),
        ("acquire_probe", {"token": "t", "max_calls": 1, "lease_seconds": 5.0}),
    ):
        with pytest.raises(StepCalled):
            getattr(store, op)("meta", **kwargs)
    with pytest.raises(StepCalled):
        store.prune(older_than=math.inf)


def test_st2_a_breaker_is_a_record():
    """ST-2: the breaker's state is the stores' Record type, its times monotonic seconds."""
    clock = FakeClock()
    breaker = _breaker(clock)
    core = core_of(breaker)
    assert isinstance(core, Record)
    breaker.record_failure(breaker.acquire())
    assert (core.state, core.opened_at, core.open_until, core.opens) == (
        "open",
        clock.monotonic(),
        clock.monotonic() + 5.0,
        1,
    )
    assert core.generation == core.version == 1
    with pytest.raises(CircuitOpenError):
        breaker.acquire()

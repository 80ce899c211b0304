"""The store contract suite, importable: the tests every store passes, for your store too.

The bundled stores (memory, Redis, the Django database) run exactly these tests in the
project's own suite. A third-party store class (``BALDUR_STATE_BACKEND =
"myproject.stores.MyStore"``) runs them by subclassing :class:`StoreContract` in a pytest
module and providing one fixture, ``store_under_test``::

    import pytest

    from baldur_django.core.stores.contract import StoreContract, StoreUnderTest
    from baldur_django.core.testing import FakeClock
    from myproject.stores import MyStore


    class TestMyStore(StoreContract):
        @pytest.fixture
        def store_under_test(self):
            clock = FakeClock()
            store = MyStore(now=clock.wall)  # an empty store for each test
            yield StoreUnderTest(store, age=lambda name, seconds: clock.advance(seconds))

The fixture gives a store that holds nothing yet (a new instance, or a key prefix of the
test's own) plus ``age(name, seconds)``, which lets *seconds* of store time pass for the
record of breaker *name*. A store that takes a clock advances it; a store whose server
keeps the time (Redis ``TIME``, a database's ``now``) can move the record's stored times
back instead, which :func:`shifted` does for a :class:`~.base.Record`.

pytest collects the subclass (its name starts with ``Test``), never this base class. Every
test speaks only the store protocol of :mod:`baldur_django.core.stores.base`; each test's
docstring says what it checks. ``docs/stores.md`` explains the protocol.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

import pytest

from .base import ALREADY, BLOCKED, TRIPPED, Answer, Record, StateStore

__all__ = ["StoreContract", "StoreUnderTest", "shifted"]

NAME = "payments"


@dataclass
class StoreUnderTest:
    """What the ``store_under_test`` fixture gives the contract suite.

    Attributes:
        store: an empty store (no records, no registry entries, no locks).
        age: ``age(name, seconds)`` lets *seconds* (float) of store time pass for the
            record of breaker *name* (and for its probe leases and force).
    """

    store: StateStore
    age: Callable[[str, float], None]


def shifted(record: Record, seconds: float) -> Record:
    """A copy of *record* with every stored time moved *seconds* into the past: to the rules,
    exactly as if that much time had passed (for stores whose server keeps the clock).

    Args:
        record: the record as stored.
        seconds: how much time passes, seconds.

    Returns:
        The shifted copy (``opened_at``, ``open_until``, ``force_expires_at``,
        ``updated_at`` and every probe lease).
    """

    def back(value: float | None) -> float | None:
        return None if value is None else value - seconds

    return replace(
        record,
        opened_at=back(record.opened_at),
        open_until=back(record.open_until),
        force_expires_at=back(record.force_expires_at),
        updated_at=back(record.updated_at),
        probes={token: until - seconds for token, until in record.probes.items()},
    )


class StoreContract:
    """The behaviour every store implementation must show; subclass it as ``Test...``.

    Override the ``store_under_test`` fixture (see the module docstring).
    """

    @pytest.fixture
    def store_under_test(self) -> Iterator[StoreUnderTest]:
        """Override: an empty store plus a way to let time pass for one record."""
        raise NotImplementedError(
            "a StoreContract subclass must define a store_under_test fixture returning a StoreUnderTest"
        )
        yield  # pragma: no cover

    # ------------------------------------------------------------------ records and trips
    def test_st2_missing_record_reads_as_fresh_closed(self, store_under_test: StoreUnderTest) -> None:
        """A record that was never written reads as a fresh CLOSED breaker and registers the name."""
        store = store_under_test.store
        answer = store.load(NAME)
        assert answer.record.state == "closed"
        assert answer.record.forced is None
        assert answer.lapsed is None and answer.moved is False
        assert NAME in store.names()

    def test_st2_trip_is_written_once(self, store_under_test: StoreUnderTest) -> None:
        """The first trip is TRIPPED and moves the record; a second is ALREADY and changes nothing."""
        store = store_under_test.store
        first = store.trip(NAME, trigger="consecutive_failures", recovery_timeout=30.0)
        assert first.result == TRIPPED and first.moved
        assert first.record.state == "open" and first.record.trigger == "consecutive_failures"
        assert first.record.open_until == pytest.approx(first.now + 30.0, abs=0.01)
        second = store.trip(NAME, trigger="failure_rate", recovery_timeout=30.0)
        assert second.result == ALREADY and not second.moved
        assert second.record.version == first.record.version
        assert second.record.trigger == "consecutive_failures"

    def test_op4_trip_meeting_a_force_is_refused(self, store_under_test: StoreUnderTest) -> None:
        """A trip that meets a force (either direction) is refused atomically; the force survives."""
        store = store_under_test.store
        store.force(NAME, mode="closed", ttl_seconds=600.0, reason="known good", actor="ops")
        answer = store.trip(NAME, trigger="consecutive_failures", recovery_timeout=30.0)
        assert answer.result == BLOCKED
        assert answer.record.state == "closed" and answer.record.forced == "closed"
        store.force("other", mode="open", ttl_seconds=600.0, reason="maintenance", actor=None)
        answer = store.trip("other", trigger="failure_rate", recovery_timeout=30.0)
        assert answer.result == BLOCKED and answer.record.forced == "open"

    def test_cb16_consecutive_opens_back_off_up_to_the_cap(self, store_under_test: StoreUnderTest) -> None:
        """Each reopen lasts backoff_factor times the previous, at most recovery_timeout_max
        seconds; the count stops at the cap and a close resets it."""
        store, age = store_under_test.store, store_under_test.age

        def opened_for(record: Record) -> tuple[int, float]:
            assert record.open_until is not None and record.opened_at is not None
            return record.opens, round(record.open_until - record.opened_at, 3)

        def finish(token: str, version: int, outcome: str) -> Answer:
            return store.finish_probe(
                NAME,
                token=token,
                version=version,
                outcome=outcome,
                max_calls=1,
                recovery_timeout=10.0,
                backoff_factor=2.0,
                recovery_timeout_max=35.0,
            )

        trip = store.trip(
            NAME, trigger="consecutive_failures", recovery_timeout=10.0, backoff_factor=2.0, recovery_timeout_max=35.0
        )
        assert opened_for(trip.record) == (1, 10.0)
        for token, expected in zip("abc", ((2, 20.0), (3, 35.0), (3, 35.0)), strict=True):
            age(NAME, 40.0)
            probe = store.acquire_probe(NAME, token=token, max_calls=1, lease_seconds=30.0)
            assert probe.result is True
            assert opened_for(finish(token, probe.record.version, "failure").record) == expected
        age(NAME, 40.0)
        probe = store.acquire_probe(NAME, token="d", max_calls=1, lease_seconds=30.0)
        closed = finish("d", probe.record.version, "success")
        assert closed.result == "closed" and closed.record.opens == 0

    # ------------------------------------------------------------------ the half-open round
    def test_st2_probe_round_admits_at_most_max_and_closes_after_max_successes(
        self, store_under_test: StoreUnderTest
    ) -> None:
        """A probing round admits max_calls probes fleet-wide; max_calls successes close it."""
        store, age = store_under_test.store, store_under_test.age
        store.trip(NAME, trigger="consecutive_failures", recovery_timeout=10.0)
        early = store.acquire_probe(NAME, token="t0", max_calls=2, lease_seconds=30.0)
        assert early.result is False and early.record.state == "open"
        age(NAME, 11.0)
        first = store.acquire_probe(NAME, token="t1", max_calls=2, lease_seconds=30.0)
        assert first.result is True and first.moved and first.record.state == "half_open"
        second = store.acquire_probe(NAME, token="t2", max_calls=2, lease_seconds=30.0)
        third = store.acquire_probe(NAME, token="t3", max_calls=2, lease_seconds=30.0)
        assert second.result is True and third.result is False
        version = second.record.version
        done1 = store.finish_probe(
            NAME, token="t1", version=version, outcome="success", max_calls=2, recovery_timeout=10.0
        )
        assert done1.result is None and done1.record.state == "half_open"
        # a finished probe's slot is not handed out again in the same round
        assert store.acquire_probe(NAME, token="t4", max_calls=2, lease_seconds=30.0).result is False
        done2 = store.finish_probe(
            NAME, token="t2", version=version, outcome="success", max_calls=2, recovery_timeout=10.0
        )
        assert done2.result == "closed" and done2.moved and done2.record.state == "closed"

    def test_st2_failed_probe_reopens_and_restarts_the_timer(self, store_under_test: StoreUnderTest) -> None:
        """One failed trial reopens the record with a fresh recovery timeout."""
        store, age = store_under_test.store, store_under_test.age
        store.trip(NAME, trigger="consecutive_failures", recovery_timeout=10.0)
        age(NAME, 11.0)
        probe = store.acquire_probe(NAME, token="t1", max_calls=3, lease_seconds=30.0)
        answer = store.finish_probe(
            NAME, token="t1", version=probe.record.version, outcome="failure", max_calls=3, recovery_timeout=10.0
        )
        assert answer.result == "open" and answer.record.trigger == "half_open_failure"
        assert answer.record.open_until == pytest.approx(answer.now + 10.0, abs=0.01)

    def test_cb17_slow_trial_reopens_with_its_trigger(self, store_under_test: StoreUnderTest) -> None:
        """A slow trial fails the round, with trigger slow_call_rate."""
        store, age = store_under_test.store, store_under_test.age
        store.trip(NAME, trigger="slow_call_rate", recovery_timeout=5.0)
        age(NAME, 6.0)
        probe = store.acquire_probe(NAME, token="t1", max_calls=2, lease_seconds=30.0)
        answer = store.finish_probe(
            NAME, token="t1", version=probe.record.version, outcome="slow", max_calls=2, recovery_timeout=5.0
        )
        assert answer.result == "open" and answer.record.trigger == "slow_call_rate"

    def test_cb10_abandoned_probe_gives_its_slot_back(self, store_under_test: StoreUnderTest) -> None:
        """A probe that never reached the dependency gives its slot back."""
        store, age = store_under_test.store, store_under_test.age
        store.trip(NAME, trigger="consecutive_failures", recovery_timeout=1.0)
        age(NAME, 2.0)
        probe = store.acquire_probe(NAME, token="t1", max_calls=1, lease_seconds=30.0)
        assert store.acquire_probe(NAME, token="t2", max_calls=1, lease_seconds=30.0).result is False
        store.finish_probe(
            NAME, token="t1", version=probe.record.version, outcome="abandon", max_calls=1, recovery_timeout=1.0
        )
        assert store.acquire_probe(NAME, token="t3", max_calls=1, lease_seconds=30.0).result is True

    def test_st2_expired_lease_frees_the_slot(self, store_under_test: StoreUnderTest) -> None:
        """A worker that dies mid-probe cannot stick the fleet: its lease expires."""
        store, age = store_under_test.store, store_under_test.age
        store.trip(NAME, trigger="consecutive_failures", recovery_timeout=1.0)
        age(NAME, 2.0)
        dead = store.acquire_probe(NAME, token="dead-worker", max_calls=1, lease_seconds=5.0)
        assert dead.result is True
        assert store.acquire_probe(NAME, token="t2", max_calls=1, lease_seconds=5.0).result is False
        age(NAME, 6.0)
        assert store.acquire_probe(NAME, token="t3", max_calls=1, lease_seconds=5.0).result is True
        # the dead worker's late outcome is stale and ignored
        late = store.finish_probe(
            NAME, token="dead-worker", version=dead.record.version, outcome="failure", max_calls=1, recovery_timeout=1.0
        )
        assert late.result is None and late.record.state == "half_open"

    def test_cb8_stale_version_outcome_is_ignored(self, store_under_test: StoreUnderTest) -> None:
        """A trial outcome from an older round never moves the record."""
        store, age = store_under_test.store, store_under_test.age
        store.trip(NAME, trigger="consecutive_failures", recovery_timeout=1.0)
        age(NAME, 2.0)
        probe = store.acquire_probe(NAME, token="t1", max_calls=1, lease_seconds=30.0)
        store.force(NAME, mode="open", ttl_seconds=60.0, reason="", actor=None)
        answer = store.finish_probe(
            NAME, token="t1", version=probe.record.version, outcome="success", max_calls=1, recovery_timeout=1.0
        )
        assert answer.result is None and answer.record.state == "open" and answer.record.forced == "open"

    # ------------------------------------------------------------------ forces
    def test_op2_forced_open_never_probes_and_lapses_to_half_open(self, store_under_test: StoreUnderTest) -> None:
        """No probe while forced open, even past the recovery timeout; a lapse goes to HALF_OPEN once."""
        store, age = store_under_test.store, store_under_test.age
        store.force(NAME, mode="open", ttl_seconds=60.0, reason="maintenance", actor="alice")
        age(NAME, 30.0)
        refused = store.acquire_probe(NAME, token="t1", max_calls=3, lease_seconds=30.0)
        assert refused.result is False and refused.record.forced == "open"
        assert store.sweep(NAME).result is False
        age(NAME, 31.0)
        lapse = store.load(NAME)
        assert lapse.lapsed == "open" and lapse.record.state == "half_open" and lapse.record.forced is None
        again = store.load(NAME)
        assert again.lapsed is None  # exactly one caller is told

    def test_op3_forced_closed_lapse_returns_to_automatic_closed(self, store_under_test: StoreUnderTest) -> None:
        """A forced closed that lapses stays CLOSED, unforced."""
        store, age = store_under_test.store, store_under_test.age
        store.force(NAME, mode="closed", ttl_seconds=60.0, reason="", actor=None)
        age(NAME, 61.0)
        answer = store.trip(NAME, trigger="consecutive_failures", recovery_timeout=5.0)
        assert answer.lapsed == "closed"
        assert answer.result == TRIPPED  # automatic again: the trip goes through

    def test_op3_release(self, store_under_test: StoreUnderTest) -> None:
        """Release of forced open -> HALF_OPEN; release of an unforced record returns None."""
        store = store_under_test.store
        assert store.release(NAME).result is None
        store.force(NAME, mode="open", ttl_seconds=60.0, reason="", actor=None)
        answer = store.release(NAME)
        assert answer.result == "open" and answer.record.state == "half_open" and answer.moved
        assert store.release(NAME).result is None

    def test_clear_resets_to_a_fresh_closed_record(self, store_under_test: StoreUnderTest) -> None:
        """``clear`` (a breaker's reset) leaves a CLOSED, unforced record with no round,
        no open times and no backoff count, in a new version, from any state: backed-off
        OPEN, forced open, HALF_OPEN with a probe out, even while frozen."""
        store = store_under_test.store
        store.trip(NAME, trigger="consecutive_failures", recovery_timeout=5.0, backoff_factor=2.0)
        before = store.load(NAME).record
        answer = store.clear(NAME)
        record = answer.record
        assert answer.result is None and answer.moved and record.version > before.version
        assert (record.state, record.trigger, record.opens, record.opened_at, record.open_until) == (
            "closed",
            "reset",
            0,
            None,
            None,
        )
        store.force(NAME, mode="open", ttl_seconds=60.0, reason="outage", actor="ops")
        answer = store.clear(NAME, frozen=True)
        assert answer.result == "open" and answer.record.state == "closed"
        assert (answer.record.forced, answer.record.force_expires_at, answer.record.force_actor) == (None, None, None)
        store.force(NAME, mode="open", ttl_seconds=60.0, reason="", actor=None)
        store.release(NAME)
        assert store.acquire_probe(NAME, token="t1", max_calls=2, lease_seconds=30.0).result is True
        answer = store.clear(NAME)
        assert answer.record.state == "closed" and answer.record.probes == {} and answer.record.successes == 0
        again = store.clear(NAME)  # already fresh: still a new version, nothing else moves
        assert not again.moved and again.record.version == answer.record.version + 1

    def test_op3_end_of_forced_closed_is_a_new_version(self, store_under_test: StoreUnderTest) -> None:
        """A forced closed that is released or lapses stays CLOSED but gets a new
        record version, so workers that adopted the force see it end (they adopt by version)."""
        store, age = store_under_test.store, store_under_test.age
        forced = store.force(NAME, mode="closed", ttl_seconds=60.0, reason="", actor=None).record
        released = store.release(NAME)
        assert released.result == "closed" and released.record.state == "closed"
        assert released.record.forced is None and released.record.version > forced.version
        forced = store.force(NAME, mode="closed", ttl_seconds=60.0, reason="", actor=None).record
        age(NAME, 61.0)
        lapsed = store.load(NAME)
        assert lapsed.lapsed == "closed" and lapsed.record.state == "closed"
        assert lapsed.record.forced is None and lapsed.record.version > forced.version
        assert store.load(NAME).record.version == lapsed.record.version  # once

    def test_op1_force_keeps_reason_actor_and_expiry(self, store_under_test: StoreUnderTest) -> None:
        """A force carries its lifetime, reason and actor in the shared record."""
        store = store_under_test.store
        answer = store.force(NAME, mode="open", ttl_seconds=90.0, reason="db migration ✓", actor="bob")
        record = store.load(NAME).record
        assert record.forced == "open" and record.force_reason == "db migration ✓" and record.force_actor == "bob"
        assert record.force_expires_at == pytest.approx(answer.now + 90.0, abs=0.01)

    # ------------------------------------------------------------------ Level 3 (frozen=True)
    def test_em2_frozen_holds_every_automatic_step(self, store_under_test: StoreUnderTest) -> None:
        """With frozen=True no trip, no probe, no sweep, and a trial only gives its slot back."""
        store, age = store_under_test.store, store_under_test.age
        held = store.trip(NAME, trigger="consecutive_failures", recovery_timeout=10.0, frozen=True)
        assert held.result == ALREADY and held.record.state == "closed" and not held.moved
        store.trip(NAME, trigger="consecutive_failures", recovery_timeout=10.0)
        age(NAME, 11.0)
        assert store.acquire_probe(NAME, token="t0", max_calls=1, lease_seconds=30.0, frozen=True).result is False
        swept = store.sweep(NAME, frozen=True)
        assert swept.result is False and swept.record.state == "open"
        probe = store.acquire_probe(NAME, token="t1", max_calls=1, lease_seconds=30.0)
        assert probe.result is True and probe.record.state == "half_open"
        finished = store.finish_probe(
            NAME,
            token="t1",
            version=probe.record.version,
            outcome="success",
            max_calls=1,
            recovery_timeout=10.0,
            frozen=True,
        )
        assert finished.result is None and finished.record.state == "half_open"
        assert finished.record.probes == {} and finished.record.successes == 0  # the slot is back, nothing decided

    def test_em2_forced_open_lapsing_while_frozen_stays_open(self, store_under_test: StoreUnderTest) -> None:
        """A forced open whose lifetime ends during Level 3 stays OPEN (unforced, due at
        once) until the level drops; then a probe request moves it to HALF_OPEN."""
        store, age = store_under_test.store, store_under_test.age
        store.force(NAME, mode="open", ttl_seconds=60.0, reason="", actor=None, frozen=True)
        age(NAME, 61.0)
        lapse = store.load(NAME, frozen=True)
        assert lapse.lapsed == "open" and lapse.record.state == "open" and lapse.record.forced is None
        assert lapse.record.open_until == pytest.approx(lapse.now, abs=0.01)
        probe = store.acquire_probe(NAME, token="t1", max_calls=1, lease_seconds=30.0)
        assert probe.result is True and probe.record.state == "half_open"

    def test_em2_forces_and_releases_work_while_frozen(self, store_under_test: StoreUnderTest) -> None:
        """An operator's force and release still work during Level 3."""
        store = store_under_test.store
        forced = store.force(NAME, mode="open", ttl_seconds=60.0, reason="", actor=None, frozen=True)
        assert forced.record.state == "open" and forced.record.forced == "open"
        released = store.release(NAME, frozen=True)
        assert released.result == "open" and released.record.state == "half_open"

    # ------------------------------------------------------------------ fleet tasks
    def test_st5_sweep_moves_only_due_unforced_open_records(self, store_under_test: StoreUnderTest) -> None:
        """The recovery sweep moves OPEN past its timeout to HALF_OPEN, once."""
        store, age = store_under_test.store, store_under_test.age
        store.trip(NAME, trigger="consecutive_failures", recovery_timeout=10.0)
        assert store.sweep(NAME).result is False
        age(NAME, 11.0)
        first = store.sweep(NAME)
        assert first.result is True and first.record.state == "half_open"
        assert store.sweep(NAME).result is False

    def test_st5_lock_is_exclusive_and_owned(self, store_under_test: StoreUnderTest) -> None:
        """A fleet lock is held by one token at a time; extend and unlock need the token."""
        store = store_under_test.store
        token = store.lock("recovery_sweep", ttl_seconds=30.0)
        assert token
        assert store.lock("recovery_sweep", ttl_seconds=30.0) is None
        assert store.extend("recovery_sweep", token="not-the-token", ttl_seconds=30.0) is False
        assert store.extend("recovery_sweep", token=token, ttl_seconds=30.0) is True
        assert store.unlock("recovery_sweep", token="not-the-token") is False
        assert store.unlock("recovery_sweep", token=token) is True
        assert store.extend("recovery_sweep", token=token, ttl_seconds=30.0) is False
        assert store.lock("recovery_sweep", ttl_seconds=30.0)

    def test_st5_prune_forgets_unseen_names(self, store_under_test: StoreUnderTest) -> None:
        """Registry entries last seen before a time are pruned, newer ones kept."""
        store = store_under_test.store
        first = store.load("old").now
        assert store.prune(older_than=first - 60.0) == []
        assert "old" in store.names()
        last = store.load("fresh").now
        assert set(store.prune(older_than=last + 1.0)) == {"old", "fresh"}
        assert store.names() == {}

    def test_st5_prune_keeps_open_and_forced_records(self, store_under_test: StoreUnderTest) -> None:
        """Pruning never forgets a record that is OPEN or forced, however long unseen."""
        store = store_under_test.store
        store.trip("tripped", trigger="consecutive_failures", recovery_timeout=30.0)
        store.force("held", mode="closed", ttl_seconds=600.0, reason="", actor=None)
        last = store.load("idle").now
        assert set(store.prune(older_than=last + 1.0)) == {"idle"}
        assert store.load("tripped").record.state == "open"
        assert store.load("held").record.forced == "closed"

    def test_st5_inspect_does_not_register(self, store_under_test: StoreUnderTest) -> None:
        """A fleet task's read (inspect) does not make an unknown name look used."""
        answer = store_under_test.store.inspect("ghost")
        assert answer.record.state == "closed"
        assert "ghost" not in store_under_test.store.names()

    def test_st2_reset_forgets_the_record(self, store_under_test: StoreUnderTest) -> None:
        """Reset deletes a breaker's record; the next read is a fresh CLOSED record."""
        store = store_under_test.store
        store.trip(NAME, trigger="consecutive_failures", recovery_timeout=30.0)
        store.reset(NAME)
        assert store.load(NAME).record.state == "closed"

    # ------------------------------------------------------------------ names
    @pytest.mark.parametrize("name", ["a b c", "x:y:z", "{tag}", "é" * 10, "n" * 300, "n" * 299 + "m"])
    def test_cb12_odd_names_never_collide(self, store_under_test: StoreUnderTest, name: str) -> None:
        """Long or odd names get their own record and never break a key."""
        store = store_under_test.store
        store.trip(name, trigger="consecutive_failures", recovery_timeout=30.0)
        assert store.load(name).record.state == "open"
        assert store.load(name + "-other").record.state == "closed"
        assert name in store.names()

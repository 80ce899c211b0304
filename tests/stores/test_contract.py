"""ST-2 / OP-4 / CB-12: one contract that every store backend passes.

Runs on memory, fakeredis (Lua through lupa), the real Redis server, SQLite and the
real PostgreSQL server. Each test speaks only the store protocol.
"""

from __future__ import annotations

import pytest

from baldur_django.core.stores.base import ALREADY, BLOCKED, TRIPPED, decode, safe_key

NAME = "payments"


def test_st2_missing_record_reads_as_fresh_closed(backend):
    """ST-2: a record that was never written reads as a fresh CLOSED breaker and registers the name."""
    answer = backend.store.load(NAME)
    assert answer.record.state == "closed"
    assert answer.record.forced is None
    assert answer.lapsed is None and answer.moved is False
    assert NAME in backend.store.names()


def test_st2_trip_is_written_once(backend):
    """ST-2: the first trip is TRIPPED and moves the record; a second is ALREADY and changes nothing."""
    first = backend.store.trip(NAME, trigger="consecutive_failures", recovery_timeout=30.0)
    assert first.result == TRIPPED and first.moved
    assert first.record.state == "open" and first.record.trigger == "consecutive_failures"
    assert first.record.open_until == pytest.approx(first.now + 30.0, abs=0.01)
    second = backend.store.trip(NAME, trigger="failure_rate", recovery_timeout=30.0)
    assert second.result == ALREADY and not second.moved
    assert second.record.version == first.record.version
    assert second.record.trigger == "consecutive_failures"


def test_op4_trip_meeting_a_force_is_refused(backend):
    """OP-4: a trip that meets a force (either direction) is refused atomically; the force survives."""
    backend.store.force(NAME, mode="closed", ttl_seconds=600.0, reason="known good", actor="ops")
    answer = backend.store.trip(NAME, trigger="consecutive_failures", recovery_timeout=30.0)
    assert answer.result == BLOCKED
    assert answer.record.state == "closed" and answer.record.forced == "closed"
    backend.store.force("other", mode="open", ttl_seconds=600.0, reason="maintenance", actor=None)
    answer = backend.store.trip("other", trigger="failure_rate", recovery_timeout=30.0)
    assert answer.result == BLOCKED and answer.record.forced == "open"


def test_st2_probe_round_admits_at_most_max_and_closes_after_max_successes(backend):
    """ST-2/CB-6: a probing round admits max_calls probes fleet-wide; max_calls successes close it."""
    backend.store.trip(NAME, trigger="consecutive_failures", recovery_timeout=10.0)
    early = backend.store.acquire_probe(NAME, token="t0", max_calls=2, lease_seconds=30.0)
    assert early.result is False and early.record.state == "open"
    backend.age(NAME, 11.0)
    first = backend.store.acquire_probe(NAME, token="t1", max_calls=2, lease_seconds=30.0)
    assert first.result is True and first.moved and first.record.state == "half_open"
    second = backend.store.acquire_probe(NAME, token="t2", max_calls=2, lease_seconds=30.0)
    third = backend.store.acquire_probe(NAME, token="t3", max_calls=2, lease_seconds=30.0)
    assert second.result is True and third.result is False
    version = second.record.version
    done1 = backend.store.finish_probe(
        NAME, token="t1", version=version, outcome="success", max_calls=2, recovery_timeout=10.0
    )
    assert done1.result is None and done1.record.state == "half_open"
    # a finished probe's slot is not handed out again in the same round
    assert backend.store.acquire_probe(NAME, token="t4", max_calls=2, lease_seconds=30.0).result is False
    done2 = backend.store.finish_probe(
        NAME, token="t2", version=version, outcome="success", max_calls=2, recovery_timeout=10.0
    )
    assert done2.result == "closed" and done2.moved and done2.record.state == "closed"


def test_st2_failed_probe_reopens_and_restarts_the_timer(backend):
    """CB-6: one failed trial reopens the record with a fresh recovery timeout."""
    backend.store.trip(NAME, trigger="consecutive_failures", recovery_timeout=10.0)
    backend.age(NAME, 11.0)
    probe = backend.store.acquire_probe(NAME, token="t1", max_calls=3, lease_seconds=30.0)
    answer = backend.store.finish_probe(
        NAME, token="t1", version=probe.record.version, outcome="failure", max_calls=3, recovery_timeout=10.0
    )
    assert answer.result == "open" and answer.record.trigger == "half_open_failure"
    assert answer.record.open_until == pytest.approx(answer.now + 10.0, abs=0.01)


def test_st2_abandoned_probe_gives_its_slot_back(backend):
    """CB-10: a probe that never reached the dependency gives its slot back."""
    backend.store.trip(NAME, trigger="consecutive_failures", recovery_timeout=1.0)
    backend.age(NAME, 2.0)
    probe = backend.store.acquire_probe(NAME, token="t1", max_calls=1, lease_seconds=30.0)
    assert backend.store.acquire_probe(NAME, token="t2", max_calls=1, lease_seconds=30.0).result is False
    backend.store.finish_probe(
        NAME, token="t1", version=probe.record.version, outcome="abandon", max_calls=1, recovery_timeout=1.0
    )
    assert backend.store.acquire_probe(NAME, token="t3", max_calls=1, lease_seconds=30.0).result is True


def test_st2_expired_lease_frees_the_slot(backend):
    """ST-2: a worker that dies mid-probe cannot stick the fleet: its lease expires."""
    backend.store.trip(NAME, trigger="consecutive_failures", recovery_timeout=1.0)
    backend.age(NAME, 2.0)
    dead = backend.store.acquire_probe(NAME, token="dead-worker", max_calls=1, lease_seconds=5.0)
    assert dead.result is True
    assert backend.store.acquire_probe(NAME, token="t2", max_calls=1, lease_seconds=5.0).result is False
    backend.age(NAME, 6.0)
    assert backend.store.acquire_probe(NAME, token="t3", max_calls=1, lease_seconds=5.0).result is True
    # the dead worker's late outcome is stale and ignored
    late = backend.store.finish_probe(
        NAME, token="dead-worker", version=dead.record.version, outcome="failure", max_calls=1, recovery_timeout=1.0
    )
    assert late.result is None and late.record.state == "half_open"


def test_st2_stale_version_outcome_is_ignored(backend):
    """CB-8: a trial outcome from an older round never moves the record."""
    backend.store.trip(NAME, trigger="consecutive_failures", recovery_timeout=1.0)
    backend.age(NAME, 2.0)
    probe = backend.store.acquire_probe(NAME, token="t1", max_calls=1, lease_seconds=30.0)
    backend.store.force(NAME, mode="open", ttl_seconds=60.0, reason="", actor=None)
    answer = backend.store.finish_probe(
        NAME, token="t1", version=probe.record.version, outcome="success", max_calls=1, recovery_timeout=1.0
    )
    assert answer.result is None and answer.record.state == "open" and answer.record.forced == "open"


def test_op2_forced_open_never_probes_and_lapses_to_half_open(backend):
    """OP-2/OP-3: no probe while forced open, even past the recovery timeout; a lapse goes to HALF_OPEN once."""
    backend.store.force(NAME, mode="open", ttl_seconds=60.0, reason="maintenance", actor="alice")
    backend.age(NAME, 30.0)
    refused = backend.store.acquire_probe(NAME, token="t1", max_calls=3, lease_seconds=30.0)
    assert refused.result is False and refused.record.forced == "open"
    assert backend.store.sweep(NAME).result is False
    backend.age(NAME, 31.0)
    lapse = backend.store.load(NAME)
    assert lapse.lapsed == "open" and lapse.record.state == "half_open" and lapse.record.forced is None
    again = backend.store.load(NAME)
    assert again.lapsed is None  # exactly one caller is told


def test_op3_forced_closed_lapse_returns_to_automatic_closed(backend):
    """OP-3: a forced closed that lapses stays CLOSED, unforced."""
    backend.store.force(NAME, mode="closed", ttl_seconds=60.0, reason="", actor=None)
    backend.age(NAME, 61.0)
    answer = backend.store.trip(NAME, trigger="consecutive_failures", recovery_timeout=5.0)
    assert answer.lapsed == "closed"
    assert answer.result == TRIPPED  # automatic again: the trip goes through


def test_op3_release(backend):
    """OP-3: release of forced open -> HALF_OPEN; release of an unforced record returns None."""
    assert backend.store.release(NAME).result is None
    backend.store.force(NAME, mode="open", ttl_seconds=60.0, reason="", actor=None)
    answer = backend.store.release(NAME)
    assert answer.result == "open" and answer.record.state == "half_open" and answer.moved
    assert backend.store.release(NAME).result is None


def test_op3_end_of_forced_closed_is_a_new_version(backend):
    """OP-3/ST-3 (found by the chaos test): a forced closed that is released or lapses stays
    CLOSED but gets a new record version, so workers that adopted the force see it end (they
    adopt by version)."""
    forced = backend.store.force(NAME, mode="closed", ttl_seconds=60.0, reason="", actor=None).record
    released = backend.store.release(NAME)
    assert released.result == "closed" and released.record.state == "closed"
    assert released.record.forced is None and released.record.version > forced.version
    forced = backend.store.force(NAME, mode="closed", ttl_seconds=60.0, reason="", actor=None).record
    backend.age(NAME, 61.0)
    lapsed = backend.store.load(NAME)
    assert lapsed.lapsed == "closed" and lapsed.record.state == "closed"
    assert lapsed.record.forced is None and lapsed.record.version > forced.version
    assert backend.store.load(NAME).record.version == lapsed.record.version  # once


def test_op1_force_keeps_reason_actor_and_expiry(backend):
    """OP-1: a force carries its lifetime, reason and actor in the shared record."""
    answer = backend.store.force(NAME, mode="open", ttl_seconds=90.0, reason="db migration ✓", actor="bob")
    record = backend.store.load(NAME).record
    assert record.forced == "open" and record.force_reason == "db migration ✓" and record.force_actor == "bob"
    assert record.force_expires_at == pytest.approx(answer.now + 90.0, abs=0.01)


def test_st5_sweep_moves_only_due_unforced_open_records(backend):
    """ST-5: the recovery sweep moves OPEN past its timeout to HALF_OPEN, once."""
    backend.store.trip(NAME, trigger="consecutive_failures", recovery_timeout=10.0)
    assert backend.store.sweep(NAME).result is False
    backend.age(NAME, 11.0)
    first = backend.store.sweep(NAME)
    assert first.result is True and first.record.state == "half_open"
    assert backend.store.sweep(NAME).result is False


def test_st5_lock_is_exclusive_and_expires(backend):
    """ST-5: a fleet lock is held by one token at a time; unlock needs the token."""
    token = backend.store.lock("recovery_sweep", ttl_seconds=30.0)
    assert token
    assert backend.store.lock("recovery_sweep", ttl_seconds=30.0) is None
    assert backend.store.unlock("recovery_sweep", token="not-the-token") is False
    assert backend.store.unlock("recovery_sweep", token=token) is True
    assert backend.store.lock("recovery_sweep", ttl_seconds=30.0)


@pytest.mark.parametrize("name", ["a b c", "x:y:z", "{tag}", "é" * 10, "n" * 300, "n" * 299 + "m"])
def test_cb12_odd_names_never_collide(backend, name):
    """CB-12: long or odd names get their own record and never break a key."""
    backend.store.trip(name, trigger="consecutive_failures", recovery_timeout=30.0)
    assert backend.store.load(name).record.state == "open"
    assert backend.store.load(name + "-other").record.state == "closed"
    assert name in backend.store.names()


def test_cb12_safe_key_is_injective_and_tame():
    """CB-12: keys have no braces, spaces or colons, and near-identical names differ."""
    a, b = safe_key("n" * 300), safe_key("n" * 299 + "m")
    assert a != b
    for key in (a, safe_key("{x} y:z")):
        assert not set(key) & set("{} :")


def test_st2_corrupt_record_reads_as_fresh_closed():
    """ST-2: garbage in the store reads as a fresh CLOSED record."""
    for raw in (b"\x00garbage", "[]", '{"state": "exploded", "version": 1}', '{"state": "open"}', None):
        assert decode(raw).state == "closed"


def test_st5_prune_forgets_unseen_names(backend):
    """ST-5: registry entries last seen before a time are pruned, newer ones kept."""
    first = backend.store.load("old").now
    assert backend.store.prune(older_than=first - 60.0) == []
    assert "old" in backend.store.names()
    last = backend.store.load("fresh").now
    assert set(backend.store.prune(older_than=last + 1.0)) == {"old", "fresh"}
    assert backend.store.names() == {}


def test_st5_prune_keeps_open_and_forced_records(backend):
    """ST-5: pruning never forgets a record that is OPEN or forced, however long unseen."""
    backend.store.trip("tripped", trigger="consecutive_failures", recovery_timeout=30.0)
    backend.store.force("held", mode="closed", ttl_seconds=600.0, reason="", actor=None)
    last = backend.store.load("idle").now
    assert set(backend.store.prune(older_than=last + 1.0)) == {"idle"}
    assert backend.store.load("tripped").record.state == "open"
    assert backend.store.load("held").record.forced == "closed"


def test_st5_inspect_does_not_register(backend):
    """ST-5: a fleet task's read (inspect) does not make an unknown name look used."""
    answer = backend.store.inspect("ghost")
    assert answer.record.state == "closed"
    assert "ghost" not in backend.store.names()

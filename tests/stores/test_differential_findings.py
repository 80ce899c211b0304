"""ST-2, EM-2, OP-1: the divergences between the Lua scripts and the Python rules that the
differential test (test_differential_lua.py) found, each pinned by a focused test on the
Redis store (real server and fakeredis) next to the memory store, the reference."""

from __future__ import annotations

import pytest

from baldur_django.core.stores.memory import MemoryStore
from baldur_django.core.stores.redis import RedisStore

NOW = 1_764_654_757.123_456_7  # 17 significant digits, as Redis TIME plus arithmetic gives


@pytest.fixture(params=["memory", "fakeredis", "redis"])
def pinned(request):
    """A store whose clock reads NOW: the memory store's own clock, the Redis scripts' pinned one."""
    if request.param == "memory":
        return MemoryStore(now=lambda: NOW)
    if request.param == "fakeredis":
        import fakeredis

        return RedisStore(fakeredis.FakeRedis(), prefix="findings", clock=lambda: NOW)
    client = request.getfixturevalue("redis_client")
    return RedisStore(client, prefix=client.test_prefix, clock=lambda: NOW)


def test_st2_stored_times_keep_full_precision(pinned):
    """ST-2 (differential finding 1): a record's times survive the store exactly. Lua's cjson
    wrote numbers with 14 significant digits, so Redis rounded every store-clock time to
    0.1 ms (1764654757.1234567 became 1764654757.1235) while the rules keep the double."""
    answer = pinned.trip("p", trigger="consecutive_failures", recovery_timeout=30.0)
    assert answer.now == NOW
    assert answer.record.opened_at == NOW and answer.record.updated_at == NOW
    assert answer.record.open_until == NOW + 30.0
    probe_free = pinned.load("p").record
    assert probe_free.opened_at == NOW and probe_free.open_until == NOW + 30.0


def test_op1_an_empty_actor_is_kept_as_given(pinned):
    """OP-1 (differential finding 2): a force with actor "" keeps "" (the rules' record); the
    Redis store used "" on the wire for "no actor" and stored None."""
    assert pinned.force("a", mode="open", ttl_seconds=60.0, reason="", actor="").record.force_actor == ""
    assert pinned.force("b", mode="open", ttl_seconds=60.0, reason="", actor=None).record.force_actor is None
    assert pinned.force("c", mode="closed", ttl_seconds=60.0, reason="", actor="ops").record.force_actor == "ops"
    assert pinned.load("a").record.force_actor == ""


def test_em2_a_frozen_trip_meeting_a_force_is_held_not_blocked(pinned):
    """EM-2, OP-4 (differential finding 3): during Level 3 a trip is held (``already``) whether
    or not a force holds the record, as the rules decide; the Lua script answered
    ``blocked`` for a forced record (so the worker logged trip_blocked for a trip that the
    freeze had already stopped)."""
    pinned.force("f", mode="closed", ttl_seconds=60.0, reason="", actor=None)
    held = pinned.trip("f", trigger="failure_rate", recovery_timeout=5.0, frozen=True)
    assert held.result == "already" and held.record.forced == "closed"
    assert pinned.trip("f", trigger="failure_rate", recovery_timeout=5.0).result == "blocked"

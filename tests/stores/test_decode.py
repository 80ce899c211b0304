"""ST-2: how a stored record is read (``decode`` in ``core/stores/base.py``; the Redis store's
``_record.lua`` copies the rule, and test_differential_records.py holds the two together).

A field of the wrong type or with an impossible value makes the whole record corrupt, and a
corrupt record reads as a fresh CLOSED one (version 0), as a missing or unreadable one does.
A field that is absent or null takes its default; unknown fields are ignored.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from baldur_django.core.steps import run
from baldur_django.core.stores.base import Record, decode, encode
from baldur_django.core.stores.redis import RedisStore

FRESH = Record()

#: A record every field of which is set to a value of the right type.
FULL: dict[str, Any] = {
    "state": "half_open",
    "version": 7,
    "opened_at": 1_764_000_000.25,
    "open_until": 1_764_000_030.25,
    "trigger": "failure_rate",
    "forced": "open",
    "force_expires_at": 1_764_000_090.5,
    "force_reason": "maintenance",
    "force_actor": "ops",
    "probes": {"a": 1_764_000_100.0, "b": 1_764_000_101},
    "successes": 1,
    "updated_at": 1_764_000_000.75,
    "opens": 3,
}


def _with(**fields: Any) -> str:
    return json.dumps({**FULL, **fields})


def test_st2_a_well_formed_record_reads_back_field_by_field():
    """ST-2: every field of a well-formed record is kept (each one has its check)."""
    assert decode(json.dumps(FULL)).to_dict() == FULL
    assert decode(encode(decode(json.dumps(FULL)))).to_dict() == FULL


CORRUPT = [
    pytest.param(None, id="missing"),
    pytest.param("", id="empty_text"),
    pytest.param("{oops", id="not_json"),
    pytest.param(b"\xff\xfe", id="not_utf8"),
    pytest.param("[" * 100_000, id="nested_too_deep"),
    pytest.param("null", id="json_null"),
    pytest.param('"closed"', id="json_string"),
    pytest.param("42", id="json_number"),
    pytest.param("[1, 2]", id="json_array"),
    pytest.param("{}", id="empty_object"),
    pytest.param('{"state": "open"}', id="no_version"),
    pytest.param('{"version": 3}', id="no_state"),
    pytest.param(_with(state=None), id="state_null"),
    pytest.param(_with(version=None), id="version_null"),
    pytest.param(_with(state="OPEN"), id="unknown_state"),
    pytest.param(_with(state=1), id="state_number"),
    pytest.param(_with(version="3"), id="version_text"),
    pytest.param(_with(version=True), id="version_true"),
    pytest.param(_with(version=3.5), id="version_fraction"),
    pytest.param(_with(version=-1), id="version_negative"),
    pytest.param(_with(version=2**53), id="version_above_2_53"),
    pytest.param('{"state": "open", "version": NaN}', id="version_nan"),
    pytest.param('{"state": "open", "version": Infinity}', id="version_infinite"),
    pytest.param(_with(opens=2.5), id="opens_fraction"),
    pytest.param(_with(opens=-2), id="opens_negative"),
    pytest.param(_with(opens=True), id="opens_true"),
    pytest.param(_with(successes="1"), id="successes_text"),
    pytest.param(_with(successes=0.5), id="successes_fraction"),
    pytest.param(_with(open_until="soon"), id="open_until_text"),
    pytest.param(_with(opened_at=True), id="opened_at_true"),
    pytest.param(_with(force_expires_at=[1]), id="force_expiry_list"),
    pytest.param(_with(updated_at={"t": 1}), id="updated_at_object"),
    pytest.param(_with(trigger=["x"]), id="trigger_list"),
    pytest.param(_with(forced="sideways"), id="forced_unknown_mode"),
    pytest.param(_with(forced=True), id="forced_true"),
    pytest.param(_with(force_reason=3), id="force_reason_number"),
    pytest.param(_with(force_actor=7), id="force_actor_number"),
    pytest.param(_with(probes=[1_764_000_100.0]), id="probes_list"),
    pytest.param(_with(probes="a"), id="probes_text"),
    pytest.param(_with(probes={"a": "soon"}), id="probe_lease_text"),
    pytest.param(_with(probes={"a": True}), id="probe_lease_true"),
    pytest.param(_with(probes={"a": None}), id="probe_lease_null"),
    pytest.param(_with(probes={"a": {"until": 1.0}}), id="probe_lease_object"),
]


@pytest.mark.parametrize("raw", CORRUPT)
def test_st2_a_corrupt_record_reads_as_a_fresh_closed_record(raw):
    """ST-2: a record that is not one, or has a field of the wrong type or an impossible
    value, reads as a fresh CLOSED record, and reading it never raises."""
    assert decode(raw) == FRESH


def test_st2_a_whole_number_written_as_a_float_reads_as_that_integer():
    """ST-2: ``3.0`` is the number 3 (the Lua's numbers are all doubles: it cannot tell them apart)."""
    record = decode(_with(version=3.0, successes=1.0, opens=2.0))
    assert (record.version, record.successes, record.opens) == (3, 1, 2)
    assert all(type(value) is int for value in (record.version, record.successes, record.opens))
    assert decode(_with(version=2**53 - 1)).version == 2**53 - 1


DEFAULTED = [
    pytest.param({"probes": None}, {"probes": {}}, id="probes_null"),
    pytest.param({"probes": []}, {"probes": {}}, id="probes_empty_list"),
    pytest.param({"successes": None}, {"successes": 0}, id="successes_null"),
    pytest.param({"opens": None}, {"opens": 0}, id="opens_null"),
    pytest.param({"force_reason": None}, {"force_reason": ""}, id="force_reason_null"),
    pytest.param({"force_actor": None, "trigger": None}, {"force_actor": None, "trigger": None}, id="text_null"),
    pytest.param({"open_until": 5}, {"open_until": 5}, id="time_as_integer"),
    pytest.param({"extra": [1], "k": 3}, {}, id="unknown_fields"),
]


@pytest.mark.parametrize(("fields", "expected"), DEFAULTED)
def test_st2_null_or_absent_fields_take_their_default(fields, expected):
    """ST-2: a null field reads as its default, as an absent one does (an older release's
    record); unknown fields are ignored."""
    record = decode(_with(**fields))
    assert record.to_dict() == {**FULL, **expected}


def test_st2_a_legacy_record_keeps_what_it_has():
    """ST-2: a record written before the backoff count, the round count and the actor reads
    with their defaults."""
    record = decode('{"state": "open", "version": 4, "open_until": 12.5, "trigger": "failure_rate"}')
    assert record == Record(state="open", version=4, open_until=12.5, trigger="failure_rate")


def test_st2_a_dict_is_read_by_the_same_rule():
    """ST-2: decode() of an already parsed dict checks it as it checks text."""
    assert decode(dict(FULL)).to_dict() == FULL
    assert decode({**FULL, "opens": -1}) == FRESH


NOW = 1_764_000_000.0  # before every time of FULL: nothing lapses or expires when it is read

LUA_CASES = [
    *CORRUPT,
    pytest.param(json.dumps(FULL), id="full"),
    pytest.param(_with(version=3.0, successes=1.0, opens=2.0), id="whole_floats"),
    *[pytest.param(_with(**case.values[0]), id=case.id) for case in DEFAULTED],
]


@pytest.mark.redis
@pytest.mark.parametrize("raw", LUA_CASES)
def test_st2_the_lua_reads_every_shape_as_decode_does(redis_client, raw):
    """ST-2: the Redis store's Lua (``_record.lua``) reads each shape above as decode() does:
    its inspect of the stored text answers the record the rules give for decode()'s reading,
    and the registry prune forgets it exactly when that record is CLOSED and unforced."""
    store = RedisStore(redis_client, prefix=redis_client.test_prefix, clock=lambda: NOW)
    if raw is not None:
        redis_client.set(store.key("r"), raw)
    expected = run("inspect", decode(raw), NOW).record
    assert store.inspect("r").record == expected
    redis_client.zadd(store.registry_key, {"r": 1.0})
    forgotten = store.prune(older_than=2.0) == ["r"]
    assert forgotten == (expected.state == "closed" and expected.forced is None)

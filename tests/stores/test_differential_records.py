"""ST-2, ST-5: legacy and corrupt records read alike on the memory store and the Lua on Redis
(a differential test from stored records the rules never wrote).

A record written by an older release (fields missing: ``opens``, ``successes``,
``force_actor``, ``updated_at``), with fields of an unexpected type or value, or not a record
at all, is put in both stores as raw text. Then:

* ``test_differential_record_decodes_alike``: random sequences of store operations (the
  generator of the Lua differential test) start from it; after every step both stores
  give the same record and answer, or both refuse the step (an exception on both sides:
  the memory store's Python error, the Lua's script error);
* ``test_differential_record_prunes_alike``: the registry prune meets it first: both forget
  it or both keep it.

A case where the two differ is an ``xfail(strict=True)`` saying how; each reason names the
smallest sequence (the record, then one operation).

Replay: the seed is printed and in every failure message; ``BALDUR_DIFFERENTIAL_SEED=<n>``
replays it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any

import pytest

from baldur_django.core.stores.base import Answer
from baldur_django.core.stores.memory import MemoryStore
from tests.stores.differential import (
    QueuedRedisStore,
    history,
    new_sequence,
    same_answer,
    seed_from_env,
    show,
    store_event,
)

pytestmark = pytest.mark.redis

SEQUENCES_PER_RECORD = 30
BACKOFF = {"recovery_timeout": 1.0, "backoff_factor": 2.0, "recovery_timeout_max": math.inf}


def _record(now: float, **fields: Any) -> str:
    return json.dumps(fields)


def _legacy_open(now: float) -> str:  # before the backoff count, the round counts and the actor
    return _record(now, state="open", version=4, opened_at=now - 2.0, open_until=now + 3.0, trigger="failure_rate")


def _open(now: float, **fields: Any) -> str:
    base = {"state": "open", "version": 4, "opened_at": now - 2.0, "open_until": now + 3.0, "trigger": "x"}
    return json.dumps({**base, **fields})


def _half_open(now: float, **fields: Any) -> str:
    base = {"state": "half_open", "version": 5, "probes": {"a": now + 100.0}, "successes": 1, "opens": 2}
    return json.dumps({**base, **fields})


RECORDS: dict[str, Callable[[float], str]] = {
    "empty_text": lambda now: "",
    "not_json": lambda now: "{oops",
    "json_null": lambda now: "null",
    "json_string": lambda now: '"closed"',
    "json_number": lambda now: "42",
    "json_array": lambda now: "[1, 2]",
    "empty_object": lambda now: "{}",
    "no_version": lambda now: '{"state": "open"}',
    "version_text": lambda now: '{"state": "open", "version": "3"}',
    "unknown_state": lambda now: '{"state": "OPEN", "version": 3}',
    "closed_without_version": lambda now: '{"state": "closed"}',
    "legacy_open": _legacy_open,
    "legacy_half_open": lambda now: _record(now, state="half_open", version=5, probes={"a": now + 100.0}),
    "legacy_forced_open": lambda now: _record(
        now, state="open", version=2, forced="open", force_expires_at=now + 4.0, force_reason="r", opened_at=now
    ),
    "extra_fields": lambda now: _open(now, k=3, extra={"x": [1]}),
    "opens_whole_float": lambda now: _half_open(now, opens=2.0),
    "opens_true": lambda now: _half_open(now, opens=True),
    "probes_null": lambda now: _half_open(now, probes=None),
    "forced_unknown_mode": lambda now: _open(now, forced="sideways", force_expires_at=now + 1.0),
    "times_as_text": lambda now: _open(now, open_until="soon"),
    "version_float": lambda now: _open(now, version=3.0),
    "version_true": lambda now: _open(now, version=True),
    "opens_fraction": lambda now: _half_open(now, opens=2.5),
    "opens_negative": lambda now: _half_open(now, opens=-2),
    "successes_text": lambda now: _half_open(now, successes="1"),
    "probes_list": lambda now: _half_open(now, probes=[now + 100.0]),
    "probe_lease_text": lambda now: _half_open(now, probes={"a": "soon"}),
}

#: How the two stores read a record differently (the smallest sequence: the record, then ``load``
#: unless said otherwise).
DECODE_DIVERGENT: dict[str, str] = {
    "times_as_text": "OPEN with open_until 'soon', then sweep during Level 3: the Lua skips the recovery check "
    "while frozen and answers; the memory store compares the time first and raises TypeError (unfrozen, both refuse)",
    "version_float": "version 3.0: the memory store refuses it (a fresh CLOSED record: not an int), the Lua "
    "accepts any number and reads the OPEN record",
    "version_true": "version true: the memory store accepts it (a bool is an int) and reads the OPEN record "
    "(version true), the Lua refuses it (a fresh CLOSED record)",
    "opens_fraction": "opens 2.5 on a HALF_OPEN record, then finish_probe failure (factor 2, timeout 1 s): the "
    "memory store reads 0 opens and reopens for 1 s; the Lua keeps 2.5 and reopens for 2**2.5 = 5.66 s",
    "opens_negative": "opens -2 on a HALF_OPEN record, then finish_probe failure: the memory store reads 0 and "
    "counts 1 open; the Lua keeps -2 and stores -1 (read back as 0)",
    "successes_text": "successes '1': the memory store keeps the text (the round's count then raises TypeError), "
    "the Lua reads 0",
    "probes_list": "probes as a list [t]: the memory store drops them; the Lua keeps a probe named '1' that "
    "holds a trial slot until t",
    "probe_lease_text": "a probe lease 'soon': the memory store raises TypeError while dropping expired leases, "
    "the Lua drops the lease",
}

_PRUNE = (
    "prune.lua judges the raw JSON, the memory store the decoded record: the memory store forgets {}, the Lua keeps it"
)

#: How the two stores prune a record differently (the smallest sequence: the record, then ``prune``).
PRUNE_DIVERGENT: dict[str, str] = {
    "json_array": _PRUNE.format("[1, 2] (it reads as a fresh CLOSED record)"),
    "empty_object": _PRUNE.format("{} (a fresh CLOSED record to it; no state 'closed' to the Lua)"),
    "no_version": _PRUNE.format('{"state": "open"} (refused by both when read: a fresh CLOSED record)'),
    "version_text": _PRUNE.format('{"state": "open", "version": "3"} (refused by both when read)'),
    "unknown_state": _PRUNE.format('{"state": "OPEN", "version": 3} (refused by both when read)'),
    "version_float": _PRUNE.format("an OPEN record with version 3.0 (which it refuses to read)"),
}


def _cases(divergent: dict[str, str]) -> list[Any]:
    return [
        pytest.param(key, id=key, marks=pytest.mark.xfail(strict=True, reason=divergent[key]))
        if key in divergent
        else pytest.param(key, id=key)
        for key in RECORDS
    ]


class RawMemoryStore(MemoryStore):
    """The memory store with a way to put raw text in place of a record (registered, as a
    record some worker wrote)."""

    def write_raw(self, name: str, raw: str) -> None:
        with self._lock:
            self._records[name] = raw
            self._seen[name] = self._now()


@pytest.fixture
def differential_seed() -> int:
    return seed_from_env()


@pytest.fixture
def pair(redis_client):
    current = {"now": 0.0}
    memory = RawMemoryStore(now=lambda: current["now"])
    lua = QueuedRedisStore(redis_client, prefix=redis_client.test_prefix, clock=lambda: current["now"])
    return current, memory, lua


def _call(store: Any, op: str, name: str, kwargs: dict[str, Any]) -> Any:
    try:
        return getattr(store, op)(name, **kwargs)
    except Exception as exc:  # the memory store refusing: compared with the Lua's script error
        return exc


@pytest.mark.parametrize("key", _cases(DECODE_DIVERGENT))
def test_differential_record_decodes_alike(pair, differential_seed, key):
    """ST-2: from a legacy or corrupt record, every step of random sequences gives the same
    record and answer on both stores, or both refuse it."""
    current, memory, lua = pair
    seed = differential_seed
    sent: list[tuple[Any, int, Any]] = []
    for index in range(SEQUENCES_PER_RECORD):
        seq = new_sequence(index, seed)
        current["now"] = seq.now
        raw = RECORDS[key](seq.now)
        memory.write_raw(seq.name, raw)
        lua.queue_raw(seq.name, raw)
        seq.steps.append({"raw": raw, "now": seq.now})
        sent.append((seq, 0, True))
        last: Answer | None = None
        # every sequence reads the record first; one in three then fails the trial of token "a"
        # (the probe of the half-open records), a reopen that backs off from the stored count,
        # and one in three sweeps it during Level 3
        fail_a = {"token": "a", "version": 5, "outcome": "failure", "max_calls": 3, **BACKOFF}
        script: list[Any] = [("load", {})] + ([("finish_probe", fail_a)] if index % 3 == 0 else [])
        if index % 3 == 1:
            script.append(("sweep", {"frozen": True}))  # a Level 3 reader's sweep
        for _ in range(seq.rng.randint(2, 10)):
            event = script.pop(0) if script else store_event(seq, last)
            if event is None:
                continue
            op, kwargs = event
            current["now"] = seq.now
            kwargs = {"frozen": seq.frozen, **kwargs}
            answer = _call(memory, op, seq.name, kwargs)
            getattr(lua, op)(seq.name, **kwargs)
            if isinstance(answer, Answer):
                last = answer
                seq.versions.append(answer.record.version)
            seq.steps.append({"op": op, "now": seq.now, **kwargs})
            sent.append((seq, len(seq.steps) - 1, answer))
    for (seq, step, ref), got in zip(sent, lua.flush(), strict=True):
        same = ref == got if isinstance(ref, bool) else same_answer(ref, got)
        if not same:
            pytest.fail(
                f"the two stores read record {key!r} differently (seed={seed}, sequence {seq.index}, step {step}; "
                f"replay with BALDUR_DIFFERENTIAL_SEED={seed}).\nsteps:\n{history(seq.steps[: step + 1])}\n"
                f"memory: {show(ref)}\nlua:    {show(got)}"
            )


@pytest.mark.parametrize("key", _cases(PRUNE_DIVERGENT))
def test_differential_record_prunes_alike(pair, key):
    """ST-5: the registry prune forgets a stored legacy or corrupt record on both stores, or
    keeps it on both (how each then reads it is the other test's)."""
    current, memory, lua = pair
    current["now"] = 1_764_654_757.123_456_7
    raw = RECORDS[key](current["now"])
    memory.write_raw("p", raw)
    lua.queue_raw("p", raw)
    forgotten = "p" in memory.prune(older_than=math.inf)
    lua.queue_prune("p")
    written, pruned = lua.flush()
    assert written is True
    assert forgotten == pruned, f"record {raw!r}: the memory store forgot it: {forgotten}, the Lua: {pruned}"

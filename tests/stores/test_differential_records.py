"""ST-2, ST-5: legacy and corrupt records read alike on the memory store and the Lua on Redis
(a differential test from stored records the rules never wrote).

A record written by an older release (fields missing: ``opens``, ``successes``,
``force_actor``, ``updated_at``), with fields of an unexpected type or value, or not a record
at all, is put in both stores as raw text. Then:

* ``test_differential_record_decodes_alike``: random sequences of store operations (the
  generator of the Lua differential test) start from it; after every step both stores
  give the same record and answer (neither store refuses a step: the memory store raising,
  or the Lua's script error, fails the test);
* ``test_differential_record_prunes_alike``: the registry prune meets it first: both forget
  it or both keep it;
* ``test_differential_record_adopted_alike``: a breaker sharing its state through the memory
  store reads it first: the breaker's own record (its core is a ``Record``, changed by the
  same ``steps.step``) takes what both stores read, or, for a corrupt record, stays the fresh
  CLOSED record both stores read it as.

Both stores read a record by one rule (``decode`` in ``core/stores/base.py``, copied in
``core/stores/lua/_record.lua``): a field of the wrong type or with an impossible value makes
the whole record corrupt, and a corrupt record reads as a fresh CLOSED one; the prune judges
the record as read. ``tests/stores/test_decode.py`` has the rule shape by shape.

Replay: the seed is printed and in every failure message; ``BALDUR_DIFFERENTIAL_SEED=<n>``
replays it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any

import pytest

from baldur_django.core.breaker import CircuitBreaker, core_of
from baldur_django.core.config import SettingsSource, build_config
from baldur_django.core.events import EventBus
from baldur_django.core.stores.base import Answer, Record
from baldur_django.core.stores.memory import MemoryStore
from baldur_django.core.sync import StoreGuard
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
    "probe_lease_true": lambda now: _half_open(now, probes={"a": True}),
    "probes_empty_list": lambda now: _half_open(now, probes=[]),
    "probes_nested": lambda now: _half_open(now, probes={"a": {"until": now + 100.0}}),
    "version_huge": lambda now: _open(now, version=2**53),
    "version_negative": lambda now: _open(now, version=-1),
    "successes_fraction": lambda now: _half_open(now, successes=0.5),
    "successes_null": lambda now: _half_open(now, successes=None),
    "force_reason_null": lambda now: _open(now, forced="open", force_expires_at=now + 4.0, force_reason=None),
    "force_actor_number": lambda now: _open(now, forced="open", force_expires_at=now + 4.0, force_actor=7),
    "trigger_list": lambda now: _open(now, trigger=["x"]),
    "expiry_true": lambda now: _open(now, forced="closed", force_expires_at=True),
}


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


@pytest.mark.parametrize("key", list(RECORDS))
def test_differential_record_decodes_alike(pair, differential_seed, key):
    """ST-2: from a legacy or corrupt record, every step of random sequences gives the same
    record and answer on both stores; neither store refuses a step."""
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
            answer = getattr(memory, op)(seq.name, **kwargs)  # never raises: a record reads, or reads as corrupt
            getattr(lua, op)(seq.name, **kwargs)
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


@pytest.mark.parametrize("key", list(RECORDS))
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


class PinnedClock:
    """Monotonic and wall readings are one number, the stores' clock: the breaker's times
    are then the stores' times."""

    def __init__(self, current: dict[str, float]) -> None:
        self.current = current

    def monotonic(self) -> float:
        return self.current["now"]

    def wall(self) -> float:
        return self.current["now"]

    def sleep(self, seconds: float) -> None:
        self.current["now"] += seconds


def _adopted_view(record: Record, local: bool) -> dict[str, Any]:
    """What a breaker takes from a record: all but the version (each side counts its own)
    and the probe tokens (the round by its size); a record that names no trigger is adopted
    with trigger ``adopted`` unless CLOSED meets CLOSED."""
    view = record.to_dict()
    view["state"] = str(view["state"])
    view["probes"] = len(view["probes"])
    del view["version"], view["updated_at"]
    if not local and view["trigger"] is None and view["state"] != "closed":
        view["trigger"] = "adopted"
    return view


@pytest.mark.parametrize("key", list(RECORDS))
def test_differential_record_adopted_alike(pair, key):
    """ST-2, ST-5: a breaker on the memory store reads a legacy or corrupt record as both
    stores read it: its own record takes the decoded one (times in its clock, the pinned
    store time here), or stays the fresh CLOSED record a corrupt one reads as; the Lua reads
    the record the same as the memory store."""
    current, memory, lua = pair
    current["now"] = 1_764_654_757.123_456_7
    raw = RECORDS[key](current["now"])
    memory.write_raw("adopt", raw)
    lua.queue_raw("adopt", raw)
    clock = PinnedClock(current)
    config = build_config("adopt", {"half_open_max_calls": 3}, SettingsSource(environ={}))
    breaker = CircuitBreaker("adopt", config, clock=clock, bus=EventBus())
    core = core_of(breaker)
    core.use_store(StoreGuard(memory, lambda: 60.0, lambda event: None, clock.monotonic, clock.wall))
    breaker.refresh()  # the first use reads the record and adopts it
    answer = memory.inspect("adopt")
    lua.inspect("adopt")
    written, got = lua.flush()
    assert written is True and same_answer(answer, got), f"record {raw!r}: memory {show(answer)}, lua {show(got)}"
    assert _adopted_view(core, local=True) == _adopted_view(answer.record, local=False), f"record {raw!r}"

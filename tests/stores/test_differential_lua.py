"""ST-2, ST-6: the Lua scripts apply exactly the Python rules (a differential test on real Redis).

Random sequences of events run through the Python rules (the memory store, the reference)
and through the Lua scripts on the real Redis server, and the whole record and the answer
(``result``, ``lapsed``, ``moved``, ``now``) must be equal after every step. The events:
trips of every trigger, with and without backoff and a cap; probe requests; trial outcomes
(success, failure, slow, abandon), including stale ones (an old or unknown token, an older
version); forces open and closed with a lifetime; releases; resets (``clear``); loads and inspects; sweeps;
time passing (also exactly onto a deadline: a lease, ``open_until``, a force's expiry, so
``>=`` against ``>`` shows); and Level 3 switched on and off (the ``frozen`` argument).

Both sides run on one pinned clock: the memory store on a function returning the
sequence's time, the Redis scripts on the same time passed in place of ``TIME``
(``RedisStore(clock=...)``, test-only). Times carry 16-17 significant digits, so a record
that loses precision on the way through Redis shows.

Speed: each batch of sequences is decided on the reference first (the events depend on
its record), then sent to Redis as one pipeline and compared step by step.

Replay: the seed is printed and in every failure message; ``BALDUR_DIFFERENTIAL_SEED=<n>``
replays it. ``BALDUR_DIFFERENTIAL_SEQUENCES`` (default 2,000) runs more.
"""

from __future__ import annotations

import time

import pytest

from baldur_django.core.steps import prunable
from baldur_django.core.stores.base import Answer
from baldur_django.core.stores.memory import MemoryStore
from tests.stores.differential import (
    QueuedRedisStore,
    Sequence,
    history,
    new_sequence,
    same_answer,
    seed_from_env,
    sequence_count,
    show,
    store_event,
)

pytestmark = pytest.mark.redis

SEQUENCES = sequence_count()
BATCH = 250


@pytest.fixture
def differential_seed() -> int:
    return seed_from_env()


def _expiry(reference: MemoryStore, name: str, answer: Answer) -> str:
    """What the record's key must look like with an idle lifetime: ``"none"`` (the reference
    holds no record: a read of a missing one creates none), ``"expires"`` (CLOSED and
    unforced: the rules may forget it) or ``"kept"`` (anything else never expires)."""
    if name not in reference._records:
        return "none"
    return "expires" if prunable(answer.record) else "kept"


def _key_expiry(pttl: int) -> str:
    return {-2: "none", -1: "kept"}.get(pttl, "expires")


@pytest.mark.parametrize("record_ttl", [None, 3600.0], ids=["no-expiry", "idle-expiry"])
def test_st2_differential_lua_scripts_match_the_python_rules(redis_client, differential_seed, record_ttl):
    """ST-2, ST-6: after every step of thousands of random event sequences, the Lua scripts
    on the real Redis give the same record and answer as the Python rules (memory store).
    With an idle lifetime, the record's key also expires exactly when the rules could forget
    the record (CLOSED, unforced), never otherwise, and a fleet job's read of a missing
    record creates no key, as the reference creates no record."""
    seed = differential_seed
    current = {"now": 0.0}
    reference = MemoryStore(now=lambda: current["now"])
    prefix = f"{redis_client.test_prefix}-{record_ttl}"
    lua = QueuedRedisStore(redis_client, prefix=prefix, clock=lambda: current["now"], record_ttl=record_ttl)
    started = time.perf_counter()
    compared = 0
    seen_ops: dict[str, int] = {}
    for first in range(0, SEQUENCES, BATCH):
        sent: list[tuple[Sequence, int, Answer, str]] = []  # (sequence, step, reference answer, expiry)
        for index in range(first, min(first + BATCH, SEQUENCES)):
            seq = new_sequence(index, seed)
            last: Answer | None = None
            for _ in range(seq.rng.randint(4, 16)):
                event = store_event(seq, last)
                if event is None:
                    continue
                op, kwargs = event
                current["now"] = seq.now
                kwargs = {**kwargs, "frozen": seq.frozen}
                last = getattr(reference, op)(seq.name, **kwargs)
                getattr(lua, op)(seq.name, **kwargs)
                seq.versions.append(last.record.version)
                seq.steps.append({"op": op, "now": seq.now, **kwargs})
                sent.append((seq, len(seq.steps) - 1, last, _expiry(reference, seq.name, last)))
                seen_ops[op] = seen_ops.get(op, 0) + 1
        answers = lua.flush()
        for (seq, step, ref, expiry), got, pttl in zip(sent, answers, lua.ttls, strict=True):
            compared += 1
            if record_ttl is not None and _key_expiry(pttl) != expiry:
                pytest.fail(
                    f"the record's expiry differs from the rules (seed={seed}, sequence {seq.index}, step {step}): "
                    f"key {_key_expiry(pttl)} (PTTL {pttl}), rules say {expiry}.\nsteps:\n"
                    f"{history(seq.steps[: step + 1])}\npython: {show(ref)}"
                )
            if not same_answer(ref, got):
                pytest.fail(
                    f"Lua and the Python rules differ (seed={seed}, sequence {seq.index}, step {step}; replay with "
                    f"BALDUR_DIFFERENTIAL_SEED={seed}).\nsteps:\n{history(seq.steps[: step + 1])}\n"
                    f"python: {show(ref)}\nlua:    {show(got)}"
                )
    elapsed = time.perf_counter() - started
    print(f"differential: {SEQUENCES} sequences, {compared} steps compared in {elapsed:.1f} s; ops {seen_ops}")
    assert compared >= SEQUENCES * 4  # the run really compared something
    assert set(seen_ops) == {
        "trip",
        "acquire_probe",
        "finish_probe",
        "force",
        "release",
        "clear",
        "sweep",
        "load",
        "inspect",
    }

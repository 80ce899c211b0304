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

import json
import math
import os
import random
import time
from dataclasses import dataclass, field
from typing import Any

import pytest

from baldur_django.core.rules import prunable
from baldur_django.core.stores.base import Answer
from baldur_django.core.stores.memory import MemoryStore
from baldur_django.core.stores.redis import RedisStore, decode_answer

pytestmark = pytest.mark.redis

SEQUENCES = int(os.environ.get("BALDUR_DIFFERENTIAL_SEQUENCES") or 2000)
BATCH = 250
TRIGGERS = ("consecutive_failures", "failure_rate", "slow_call_rate", "rate_limit_cascade")
OUTCOMES = ("success", "failure", "slow", "abandon")
REASONS = ("", "maintenance", 'say "hi" \\ back', "db migration ✓", "{json: [1]}")


class QueuedRedisStore(RedisStore):
    """A RedisStore whose transitions are queued on a pipeline instead of run one by one;
    :meth:`flush` runs the queue and returns the answers in order."""

    def __init__(self, client: Any, prefix: str, clock: Any, record_ttl: float | None = None) -> None:
        super().__init__(client, prefix=prefix, clock=clock, record_ttl=record_ttl)
        self.queue: list[tuple[str, str, str, list[Any]]] = []
        for script in self._scripts.values():
            client.script_load(script.script)

    def _run(self, op: str, name: str, *args: Any, frozen: bool, touch: bool = False, read: bool = False) -> Answer:
        # the registry touch of load/force is left out: the registry is not compared
        self.queue.append((op, self._scripts[op].sha, self.key(name), self._argv(args, frozen, read=read)))
        return Answer(record=None, now=math.nan)  # type: ignore[arg-type]  # filled in by flush()

    def flush(self) -> list[tuple[Answer | Exception, int]]:
        """Run the queue; each answer comes with the record key's PTTL read right after it
        (-2: no key, -1: no expiry, else milliseconds left)."""
        pipe = self.client.pipeline(transaction=False)
        for _, sha, key, argv in self.queue:
            pipe.evalsha(sha, 1, key, *argv)
            pipe.pttl(key)
        raws = pipe.execute(raise_on_error=False)
        answers = [
            (raw if isinstance(raw, Exception) else decode_answer(op, raw), ttl)
            for (op, *_), raw, ttl in zip(self.queue, raws[0::2], raws[1::2], strict=True)
        ]
        self.queue = []
        return answers


def _expiry(reference: MemoryStore, name: str, answer: Answer) -> str:
    """What the record's key must look like with an idle lifetime: ``"none"`` (the
    reference holds no record: a read of a missing one creates none), ``"expires"`` (CLOSED
    and unforced: the rules may forget it) or ``"kept"`` (anything else never expires)."""
    if name not in reference._records:
        return "none"
    return "expires" if prunable(answer.record) else "kept"


def _key_expiry(pttl: int) -> str:
    return {-2: "none", -1: "kept"}.get(pttl, "expires")


@dataclass
class Sequence:
    """One breaker's random history, decided on the reference store."""

    index: int
    rng: random.Random
    now: float
    frozen: bool = False
    max_calls: int = 1
    timing: dict[str, float] = field(default_factory=dict)
    tokens: list[str] = field(default_factory=list)  # every token ever admitted
    versions: list[int] = field(default_factory=list)  # every version seen
    steps: list[dict[str, Any]] = field(default_factory=list)  # what was sent, for the report

    @property
    def name(self) -> str:
        return f"seq-{self.index}"


def _deadlines(answer: Answer) -> list[float]:
    record = answer.record
    times = [record.open_until, record.force_expires_at, *record.probes.values()]
    return [t for t in times if t is not None]


def _event(seq: Sequence, last: Answer | None) -> tuple[str, dict[str, Any]] | None:
    """Draw the next event; returns ``(op, kwargs)`` for a store operation, or None after a
    time or Level 3 step (which changes only the sequence's inputs)."""
    rng = seq.rng
    roll = rng.random()
    if roll < 0.16:  # time passes
        deadlines = _deadlines(last) if last is not None else []
        if deadlines and rng.random() < 0.4:
            target = rng.choice(deadlines)
            seq.now = max(seq.now, target + rng.choice((0.0, 0.0, -1e-6, 1e-6)))
        else:
            seq.now += rng.choice((1e-4, 0.3, 1.0, 2.5, 6.0, 11.0, 31.0, 61.0, 700.0)) * rng.uniform(0.5, 1.5)
        seq.steps.append({"time": seq.now})
        return None
    if roll < 0.21:
        seq.frozen = not seq.frozen
        seq.steps.append({"frozen": seq.frozen})
        return None
    record = last.record if last is not None else None
    ops = ("trip", "trip", "acquire_probe", "acquire_probe", "finish_probe", "finish_probe", "finish_probe")
    ops += ("force", "release", "clear", "sweep", "load", "inspect")
    op = rng.choice(ops)
    if op == "trip":
        return op, {"trigger": rng.choice(TRIGGERS), **seq.timing}
    if op == "acquire_probe":
        token = f"t{seq.index}-{len(seq.tokens)}"
        seq.tokens.append(token)
        return op, {"token": token, "max_calls": seq.max_calls, "lease_seconds": rng.choice((0.5, 2.0, 30.0))}
    if op == "finish_probe":
        held = sorted(record.probes) if record is not None else []
        pick = rng.random()
        if held and pick < 0.6:
            token = rng.choice(held)
        elif seq.tokens and pick < 0.85:
            token = rng.choice(seq.tokens)  # an old token: finished, expired or of an older round
        else:
            token = "never-admitted"
        version = record.version if record is not None else 0
        pick = rng.random()
        if pick < 0.15:
            version -= 1
        elif pick < 0.3 and seq.versions:
            version = rng.choice(seq.versions)
        return op, {
            "token": token,
            "version": version,
            "outcome": rng.choice(OUTCOMES),
            "max_calls": seq.max_calls,
            **seq.timing,
        }
    if op == "force":
        return op, {
            "mode": rng.choice(("open", "closed")),
            "ttl_seconds": rng.choice((0.5, 5.0, 60.0, 3600.0)) * rng.uniform(0.9, 1.1),
            "reason": rng.choice(REASONS),
            "actor": rng.choice((None, "ops", "", "ünïcode")),
        }
    return op, {}


def _new_sequence(index: int, seed: int) -> Sequence:
    rng = random.Random(f"{seed}-{index}")
    timing: dict[str, float] = {"recovery_timeout": rng.choice((0.5, 1.0, 5.0, 30.0))}
    if rng.random() < 0.5:  # CB-16 backoff, sometimes with a cap below the timeout (the rules take any input)
        timing["backoff_factor"] = rng.choice((1.0, 1.5, 2.0, 3.0))
        timing["recovery_timeout_max"] = rng.choice((math.inf, 4.0, 45.0, 600.0))
    # 1.76e9 s plus a fraction with many digits: 16-17 significant digits, as from Redis TIME
    return Sequence(
        index, rng, now=1_764_000_000.0 + rng.uniform(0, 10_000_000), max_calls=rng.randint(1, 3), timing=timing
    )


def _same(ref: Answer, got: Answer | Exception) -> bool:
    if isinstance(got, Exception):
        return False
    return (
        ref.record.to_dict() == got.record.to_dict()
        and ref.now == got.now
        and ref.result == got.result
        and ref.lapsed == got.lapsed
        and ref.moved == got.moved
    )


def _show(answer: Answer | Exception) -> str:
    if isinstance(answer, Exception):
        return f"{type(answer).__name__}: {answer}"
    return json.dumps(
        {
            "record": answer.record.to_dict(),
            "now": answer.now,
            "result": answer.result,
            "lapsed": answer.lapsed,
            "moved": answer.moved,
        },
        sort_keys=True,
        default=repr,
    )


@pytest.fixture
def differential_seed() -> int:
    raw = os.environ.get("BALDUR_DIFFERENTIAL_SEED")
    seed = int(raw) if raw else random.SystemRandom().randrange(2**31)
    print(f"differential seed={seed} (replay: BALDUR_DIFFERENTIAL_SEED={seed})")
    return seed


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
        sent: list[tuple[Sequence, int, Answer]] = []  # (sequence, step index, reference answer)
        for index in range(first, min(first + BATCH, SEQUENCES)):
            seq = _new_sequence(index, seed)
            last: Answer | None = None
            for _ in range(seq.rng.randint(4, 16)):
                event = _event(seq, last)
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
        for (seq, step, ref, expiry), (got, pttl) in zip(sent, lua.flush(), strict=True):
            compared += 1
            if record_ttl is not None and _key_expiry(pttl) != expiry:
                history = "\n".join(json.dumps(s, default=repr, ensure_ascii=False) for s in seq.steps[: step + 1])
                pytest.fail(
                    f"the record's expiry differs from the rules (seed={seed}, sequence {seq.index}, step {step}): "
                    f"key {_key_expiry(pttl)} (PTTL {pttl}), rules say {expiry}.\nsteps:\n{history}\n"
                    f"python: {_show(ref)}"
                )
            if not _same(ref, got):
                history = "\n".join(json.dumps(s, default=repr, ensure_ascii=False) for s in seq.steps[: step + 1])
                pytest.fail(
                    f"Lua and the Python rules differ (seed={seed}, sequence {seq.index}, step {step}; replay with "
                    f"BALDUR_DIFFERENTIAL_SEED={seed}).\nsteps:\n{history}\n"
                    f"python: {_show(ref)}\nlua:    {_show(got)}"
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

"""Shared parts of the differential tests (test_differential_lua.py, test_differential_three_way.py).

* :class:`QueuedRedisStore`: a RedisStore whose transitions are queued on one pipeline and
  run by :meth:`QueuedRedisStore.flush` (thousands of steps in a few round trips); raw
  commands (a corrupt record written, a prune of one key) can be queued in between.
* :class:`Sequence` and :func:`store_event`: one breaker's random history of store
  operations, decided on the reference store (the memory store).
* :func:`same_answer`, :func:`show`, :func:`history`: comparing two store answers and
  printing a failing sequence so it can be replayed.
* :func:`sequence_count`, :func:`seed_from_env`: ``BALDUR_DIFFERENTIAL_SEQUENCES`` (how many
  sequences) and ``BALDUR_DIFFERENTIAL_SEED`` (replay one run).
"""

from __future__ import annotations

import json
import math
import os
import random
from dataclasses import dataclass, field
from typing import Any

from baldur_django.core.stores.base import Answer
from baldur_django.core.stores.redis import RedisStore, decode_answer

TRIGGERS = ("consecutive_failures", "failure_rate", "slow_call_rate", "rate_limit_cascade")
OUTCOMES = ("success", "failure", "slow", "abandon")
REASONS = ("", "maintenance", 'say "hi" \\ back', "db migration ✓", "{json: [1]}")
DEFAULT_SEQUENCES = 2000


def sequence_count() -> int:
    """How many random sequences a differential test runs (``BALDUR_DIFFERENTIAL_SEQUENCES``, default 2,000)."""
    return int(os.environ.get("BALDUR_DIFFERENTIAL_SEQUENCES") or DEFAULT_SEQUENCES)


def seed_from_env() -> int:
    """The run's seed: ``BALDUR_DIFFERENTIAL_SEED`` when set (a replay), else a fresh one; printed."""
    raw = os.environ.get("BALDUR_DIFFERENTIAL_SEED")
    seed = int(raw) if raw else random.SystemRandom().randrange(2**31)
    print(f"differential seed={seed} (replay: BALDUR_DIFFERENTIAL_SEED={seed})")
    return seed


class QueuedRedisStore(RedisStore):
    """A RedisStore whose transitions are queued on a pipeline instead of run one by one;
    :meth:`flush` runs the queue and returns the answers in order (an ``Exception`` where
    the server refused a command: a script error is the Lua's way to refuse). After each
    command the record key's PTTL is read too, into :attr:`ttls` (-2: no key, -1: no
    expiry, else milliseconds left), for a store made with *record_ttl*."""

    def __init__(self, client: Any, prefix: str, clock: Any, record_ttl: float | None = None) -> None:
        super().__init__(client, prefix=prefix, clock=clock, record_ttl=record_ttl)
        self.queue: list[tuple[str, tuple[Any, ...], str]] = []  # (op, command args, record key)
        self.ttls: list[int] = []
        for script in (*self._scripts.values(), self._prune):
            client.script_load(script.script)

    def _run(self, op: str, name: str, *args: Any, frozen: bool, touch: bool = False, read: bool = False) -> Answer:
        # the registry touch of load/force is left out: the registry is not compared
        command = ("EVALSHA", self._scripts[op].sha, 1, self.key(name), *self._argv(args, frozen, read=read))
        self.queue.append((op, command, self.key(name)))
        return Answer(record=None, now=math.nan)  # type: ignore[arg-type]  # filled in by flush()

    def queue_raw(self, name: str, raw: str) -> None:
        """Write *raw* as the record of *name* (a legacy or corrupt record); answers True."""
        self.queue.append(("raw", ("SET", self.key(name), raw), self.key(name)))

    def queue_prune(self, name: str) -> None:
        """The prune script on the record of *name* alone (the registry is not compared):
        answers True when it deleted the record (or there was none)."""
        self.queue.append(("prune", ("EVALSHA", self._prune.sha, 1, self.key(name)), self.key(name)))

    def flush(self) -> list[Any]:
        pipe = self.client.pipeline(transaction=False)
        for _, command, key in self.queue:
            pipe.execute_command(*command)
            pipe.pttl(key)
        raws = pipe.execute(raise_on_error=False)
        answers: list[Any] = []
        for (op, _, _), raw in zip(self.queue, raws[0::2], strict=True):
            if isinstance(raw, Exception):
                answers.append(raw)
            elif op in ("raw", "prune"):
                answers.append(bool(raw))
            else:
                answers.append(decode_answer(op, raw))
        self.ttls = list(raws[1::2])
        self.queue = []
        return answers


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


def deadlines(answer: Answer | None) -> list[float]:
    """The times at which *answer*'s record changes by itself (open end, force expiry, leases)."""
    if answer is None:
        return []
    record = answer.record
    times = [record.open_until, record.force_expires_at, *record.probes.values()]
    return [t for t in times if isinstance(t, float | int)]


def time_step(seq: Sequence, targets: list[float]) -> None:
    """Move the sequence's time: often exactly onto (or just around) one of *targets*, so
    ``>=`` against ``>`` shows, else by a random amount from 0.1 ms to about 15 minutes."""
    rng = seq.rng
    if targets and rng.random() < 0.4:
        target = rng.choice(targets)
        seq.now = max(seq.now, target + rng.choice((0.0, 0.0, -1e-6, 1e-6)))
    else:
        seq.now += rng.choice((1e-4, 0.3, 1.0, 2.5, 6.0, 11.0, 31.0, 61.0, 700.0)) * rng.uniform(0.5, 1.5)


def store_event(seq: Sequence, last: Answer | None) -> tuple[str, dict[str, Any]] | None:
    """Draw the next event; returns ``(op, kwargs)`` for a store operation, or None after a
    time or Level 3 step (which changes only the sequence's inputs)."""
    rng = seq.rng
    roll = rng.random()
    if roll < 0.16:  # time passes
        time_step(seq, deadlines(last))
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


def new_sequence(index: int, seed: int) -> Sequence:
    """Sequence *index* of the run with *seed*: its own random stream, timing and start time."""
    rng = random.Random(f"{seed}-{index}")
    timing: dict[str, float] = {"recovery_timeout": rng.choice((0.5, 1.0, 5.0, 30.0))}
    if rng.random() < 0.5:  # CB-16 backoff, sometimes with a cap below the timeout (the rules take any input)
        timing["backoff_factor"] = rng.choice((1.0, 1.5, 2.0, 3.0))
        timing["recovery_timeout_max"] = rng.choice((math.inf, 4.0, 45.0, 600.0))
    # 1.76e9 s plus a fraction with many digits: 16-17 significant digits, as from Redis TIME
    return Sequence(
        index, rng, now=1_764_000_000.0 + rng.uniform(0, 10_000_000), max_calls=rng.randint(1, 3), timing=timing
    )


def same_answer(ref: Answer | Exception, got: Answer | Exception) -> bool:
    """Two store answers are the same: the whole record, the clock and the operation's
    result, lapse and move; two refusals (exceptions) count as the same."""
    if isinstance(ref, Exception) or isinstance(got, Exception):
        return isinstance(ref, Exception) and isinstance(got, Exception)
    return (
        ref.record == got.record  # field by field (as the two records' dicts, without copying them)
        and ref.now == got.now
        and ref.result == got.result
        and ref.lapsed == got.lapsed
        and ref.moved == got.moved
    )


def show(answer: Any) -> str:
    """An answer (or an exception, or a plain value) as one line of JSON for a failure message."""
    if isinstance(answer, Exception):
        return f"{type(answer).__name__}: {answer}"
    if not isinstance(answer, Answer):
        return repr(answer)
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


def history(steps: list[dict[str, Any]]) -> str:
    """A sequence's steps, one JSON line each, for a failure message."""
    return "\n".join(json.dumps(step, default=repr, ensure_ascii=False) for step in steps)

"""ST-2, CB-5, CB-6, CB-16, OP-1..OP-3, EM-2: the local breaker, the memory store and the Lua
scripts on the real Redis apply the same transitions (a three-way differential test).

The same random sequences drive three appliers of the rules:

* a process-local :class:`CircuitBreaker` (no store) through its public API only:
  ``acquire``, ``record_success`` / ``record_failure`` / ``record_ignored``,
  ``report_rate_limit``, ``force_open`` / ``force_close`` / ``release`` / ``reset``,
  ``snapshot``, and the record its core is (``core_of(breaker)``: its fields and state
  generation, read only); Level 3 through the emergency level backend (read at once
  with ``emergency.refresh``); time through a clock whose
  monotonic and wall readings are one number (so the breaker's monotonic deadlines and
  the stores' Unix-time deadlines are the same floats, and a step exactly onto a deadline
  is exactly on it for all three);
* the memory store (the reference), one per sequence;
* the Lua scripts on the real Redis, pinned to the same time, queued and run in batches.

Events: failures that trip the breaker (per sequence one trigger: the consecutive count,
the failure rate, or the 429 cascade through ``report_rate_limit``; the store is asked to
``trip`` with that trigger), probe requests (``acquire`` in HALF_OPEN; leases never expire,
as a local breaker's slots do not), trial outcomes (success, failure, ignored; ``slow`` when
the slow-call trigger is on and the trial lasted long enough) of current and stale
rounds, forces open and closed with lifetimes that lapse, releases, resets (``clear``),
prunes, time passing (often exactly onto a deadline) and Level 3 on and off (the
``frozen`` argument). ``half_open_max_calls`` runs from 1 to 10; one sequence in four is a
"storm" (trip, wait, fail the trial, again) with a backoff factor above 1 and a cap, for
long backoff histories.

What "the same record" means. After every step each side is *observed*: the breaker by
``snapshot()`` (which applies a lapsed force and the recovery timeout, as every read of a
local breaker does), each store by ``sweep`` (the same lazy transitions on the record:
lapse, expired leases, recovery timeout). Then these fields must be equal:

===================================  ==========================================================
store record                         breaker ``snapshot()``
===================================  ==========================================================
``state``                            ``state``
``forced``                           ``forced``
``force_expires_at``, ``_reason``,   ``force_expires_at``, ``force_reason``, ``force_actor``
``_actor`` (while forced)
``opens``                            ``consecutive_opens`` (the backoff history's count)
``opened_at`` (OPEN, HALF_OPEN)      ``opened_at``
``open_until`` (OPEN, not forced)    ``open_until`` (= ``opened_at + open_duration``: the
                                     backed-off length of this open)
``len(probes) + successes``,         ``half_open_trials``, ``half_open_successes`` (HALF_OPEN)
``successes`` (HALF_OPEN)
``trigger`` (once the record has     ``last_trigger``
been written, ``version > 0``, and
while it names one after a prune)
===================================  ==========================================================

The whole record too. A breaker's core *is* a :class:`Record` (the one ``steps.step`` changes
on all three sides), its times in the breaker's monotonic seconds, which the pinned clock
makes the stores' Unix seconds: after every step it must equal the memory store's record
field by field (``same_record``): ``state``, ``version`` (the breaker's state generation),
``opened_at``, ``open_until`` (forced or not), ``trigger``, the force, ``successes``,
``updated_at``, ``opens``; the probing round by its size (the probe tokens and leases are each
side's own). What a generation decides is compared too: an outcome of an older round is
dropped by both (stale trials are reported on purpose). The memory store and the Lua are
compared on everything: the whole record and the answer of every operation and observation,
and prune's verdict.

Prune: a local breaker has no registry, so it is never forgotten; a prune of a CLOSED,
unforced record leaves a fresh record (``version`` 0), which the comparison above reads as
the same as the breaker's CLOSED state (the trigger and ``updated_at`` are not compared while
the record names no trigger after a prune: the breaker still shows the last one it took; the
versions are compared up to the breaker's version at the prune).

The smallest sequences of the divergences this test once found are pinned by the
parametrised cases at the end of this module (they agree now; the random sequences generate
their inputs too): a force over the state the breaker is in already is no transition and
keeps the trigger, ``opened_at`` and ``open_until``; a forced open lapsed during Level 3 shows
the lapse time as ``open_until`` (when it admits a probe once the level drops).

Legacy and corrupt records have no local-breaker counterpart (a local breaker decodes
nothing): test_differential_records.py compares the two stores on them.

Replay: the seed is printed and in every failure message, with the sequence's steps;
``BALDUR_DIFFERENTIAL_SEED=<n>`` replays it. ``BALDUR_DIFFERENTIAL_SEQUENCES`` (default
2,000) runs more.
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass, field
from typing import Any

import pytest

from baldur_django.core import emergency
from baldur_django.core.breaker import CircuitBreaker, Permit, core_of
from baldur_django.core.config import SettingsSource, build_config
from baldur_django.core.emergency.record import LevelState
from baldur_django.core.emergency.record import encode as encode_level
from baldur_django.core.errors import CircuitOpenError
from baldur_django.core.events import EventBus
from baldur_django.core.stores.base import Answer, Record
from baldur_django.core.stores.memory import MemoryStore
from tests.stores.differential import QueuedRedisStore, history, same_answer, seed_from_env, sequence_count, show

pytestmark = pytest.mark.redis

SEQUENCES = sequence_count()
BATCH = 200
KINDS = ("consecutive_failures", "failure_rate", "rate_limit_cascade")
REASONS = ("", "maintenance", 'say "hi" \\ back', "db migration ✓")
ACTORS = (None, "ops", "", "ünïcode")


class PinnedClock:
    """A clock whose monotonic and wall readings are one number, moved by the test."""

    def __init__(self, now: float) -> None:
        self.now = now

    def monotonic(self) -> float:
        return self.now

    def wall(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


@dataclass
class Trial:
    """A trial admitted on all three: the breaker's permit, the store's token and round."""

    permit: Permit
    token: str
    version: int
    started: float


@dataclass
class Run:
    """One sequence's three appliers and what it has sent so far."""

    index: int
    rng: random.Random
    clock: PinnedClock
    breaker: CircuitBreaker
    memory: MemoryStore
    kind: str
    storm: bool
    frozen: bool = False
    pruned: bool = False  # the stores forgot the record once (its trigger with it)
    trials: list[Trial] = field(default_factory=list)
    tokens: int = 0
    steps: list[dict[str, Any]] = field(default_factory=list)
    record: Record = field(default_factory=Record)  # the memory store's record at the last observation
    record_before: Record = field(default_factory=Record)  # ... at the one before (generations)
    generation: int = 0  # the breaker's generation at the last observation
    version_offset: int = 0  # the breaker's version minus the store's, set by a prune

    @property
    def name(self) -> str:
        return f"three-{self.index}"

    @property
    def timing(self) -> dict[str, float]:
        cfg = self.breaker.config
        return {
            "recovery_timeout": cfg.recovery_timeout,
            "backoff_factor": cfg.recovery_backoff_factor,
            "recovery_timeout_max": cfg.recovery_timeout_max,
        }


_CONFIGS: dict[tuple[Any, ...], Any] = {}


def _config(kind: str, overrides: dict[str, Any]) -> Any:
    key = (kind, *sorted(overrides.items()))
    if key not in _CONFIGS:
        environ = {
            "BALDUR_CB_RATE_LIMIT_CASCADE_THRESHOLD": "1",
            "BALDUR_CB_RATE_LIMIT_CASCADE_MIN_CALLS": "1",
            "BALDUR_CB_RATE_LIMIT_CASCADE_MIN_RATIO": "10",
            "BALDUR_CB_RATE_LIMIT_CASCADE_WINDOW_SECONDS": "60",
        }
        _CONFIGS[key] = build_config("differential", overrides, SettingsSource(environ=environ))
    return _CONFIGS[key]


def new_run(index: int, seed: int) -> Run:
    """Sequence *index*: its trigger, timeouts, backoff, probe slots and slow-call setting."""
    rng = random.Random(f"three-{seed}-{index}")
    kind = rng.choice(KINDS)
    storm = rng.random() < 0.25
    timeout = rng.choice((0.5, 1.0, 5.0, 30.0))
    factor = rng.choice((1.5, 2.0, 3.0)) if storm else rng.choice((1.0, 1.0, 1.5, 2.0, 3.0))
    caps = (600.0, 1e6, 1e9) if storm else (timeout, 4.0, 45.0, 600.0, 1e6)
    cap = rng.choice([c for c in caps if c >= timeout])
    overrides: dict[str, Any] = {
        "failure_threshold": 1 if kind == "consecutive_failures" else 1000,
        "failure_rate_threshold": 50 if kind == "failure_rate" else 0,
        "minimum_calls": 1,
        "sliding_window_size": 10,
        "recovery_timeout": timeout,
        "half_open_max_calls": rng.randint(1, 10) if rng.random() < 0.7 else rng.randint(1, 3),
        "recovery_backoff_factor": factor,
        "recovery_timeout_max": cap,
    }
    if rng.random() < 0.3:  # the slow-call trigger on: a trial that lasts this long fails its round
        overrides["slow_call_duration"] = rng.choice((0.3, 2.0, 10.0))
        overrides["slow_call_rate_threshold"] = 100
    start = 1_764_000_000.0 + rng.uniform(0, 10_000_000)  # 16-17 significant digits, as Redis TIME
    clock = PinnedClock(start)
    breaker = CircuitBreaker(f"three-{index}", _config(kind, overrides), clock=clock, bus=EventBus())
    return Run(index, rng, clock, breaker, MemoryStore(now=clock.wall), kind, storm)


# ---------------------------------------------------------------------- the comparison
def record_view(record: Record, fresh: bool) -> dict[str, Any]:
    """The fields of a store record that a local breaker shows (see the module docstring);
    *fresh*: the record names no trigger of its own (never written, or forgotten by a prune)."""
    view: dict[str, Any] = {"state": record.state, "forced": record.forced, "opens": record.opens}
    if record.forced is not None:
        view["force"] = (record.force_expires_at, record.force_reason, record.force_actor)
    if record.state != "closed":
        view["opened_at"] = record.opened_at
    if record.state == "open" and record.forced != "open":
        view["open_until"] = record.open_until
    if record.state == "half_open":
        view["trials"] = (len(record.probes) + record.successes, record.successes)
    if not fresh:
        view["trigger"] = record.trigger
    return view


def breaker_view(snap: dict[str, Any], fresh: bool) -> dict[str, Any]:
    """The same fields from a breaker's ``snapshot()``; *fresh*: the record was never written."""
    view: dict[str, Any] = {"state": snap["state"], "forced": snap["forced"], "opens": snap["consecutive_opens"]}
    if snap["forced"] is not None:
        view["force"] = (snap["force_expires_at"], snap["force_reason"], snap["force_actor"])
    if snap["state"] != "closed":
        view["opened_at"] = snap["opened_at"]
    if snap["state"] == "open" and snap["forced"] != "open":
        view["open_until"] = snap["open_until"]
    if snap["state"] == "half_open":
        view["trials"] = (snap["half_open_trials"], snap["half_open_successes"])
    if not fresh:
        view["trigger"] = snap["last_trigger"]
    return view


# ---------------------------------------------------------------------- the steps
LEVELS = emergency.MemoryLevelBackend()


def _set_frozen(run: Run, frozen: bool) -> None:
    """Level 3 on or off for the breaker: written to the level backend and read at once (no
    operator event: the audit listeners need a database)."""
    run.frozen = frozen
    now = run.clock.wall()
    LEVELS.corrupt(encode_level(LevelState(level=3, expires_at=now + 86400.0, set_at=now) if frozen else LevelState()))
    emergency.refresh()


def _time_step(run: Run) -> None:
    rng = run.rng
    record = run.record
    targets = [t for t in (record.open_until, record.force_expires_at) if t is not None]
    slow = run.breaker.config.slow_call_duration
    if slow > 0:
        targets += [trial.started + slow for trial in run.trials]
    if targets and rng.random() < (0.9 if run.storm else 0.45):
        target = rng.choice(targets)
        run.clock.now = max(run.clock.now, target + rng.choice((0.0, 0.0, -1e-6, 1e-6)))
    else:
        run.clock.now += rng.choice((1e-4, 0.3, 1.0, 2.5, 6.0, 11.0, 31.0, 61.0, 700.0)) * rng.uniform(0.5, 1.5)


def _pick_op(run: Run) -> str:
    """The next event: a storm mostly walks trip -> recovery timeout -> failed trial (long
    backoff histories); other sequences draw at random, probing more while HALF_OPEN."""
    rng = run.rng
    record = run.record
    if run.storm and rng.random() < 0.85:
        if run.frozen:
            return "frozen"
        if record.forced is not None:
            return "release"
        if record.state == "closed":
            return "trip"
        if record.state == "open":
            return "time"
        return "finish" if run.trials and rng.random() < 0.6 else "acquire"
    ops = ("time", "time", "time", "trip", "trip", "acquire", "acquire", "finish", "finish", "frozen")
    ops += ("force", "force", "release", "reset", "prune")
    if record.state == "half_open":
        ops += ("acquire", "acquire", "finish", "finish", "finish")
    op = rng.choice(ops)
    if op == "finish" and not run.trials:
        op = "acquire"
    return op


class Sender:
    """Runs one step on the breaker and the memory store, queues it on the Lua, and keeps
    what the Lua's answers are compared with at the flush."""

    def __init__(self, lua: QueuedRedisStore) -> None:
        self.lua = lua
        self.sent: list[tuple[Run, int, Any]] = []  # (run, step index, the memory store's answer)

    def store(self, run: Run, op: str, **kwargs: Any) -> Answer:
        kwargs["frozen"] = run.frozen
        answer = getattr(run.memory, op)(run.name, **kwargs)
        getattr(self.lua, op)(run.name, **kwargs)
        run.steps.append({"store": op, "now": run.clock.now, **kwargs})
        self.sent.append((run, len(run.steps) - 1, answer))
        return answer

    def prune(self, run: Run) -> None:
        registered = run.name in run.memory.names()
        gone = run.name in run.memory.prune(older_than=math.inf)
        run.pruned = run.pruned or gone
        if gone:  # the store starts again from version 0; the breaker keeps counting
            run.version_offset = core_of(run.breaker).version
        self.lua.queue_prune(run.name)
        run.steps.append({"store": "prune", "now": run.clock.now, "pruned": gone})
        self.sent.append((run, len(run.steps) - 1, gone if registered else None))


def step(run: Run, sender: Sender) -> str:
    """One random step on all three; returns the event's name."""
    rng = run.rng
    breaker = run.breaker
    op = _pick_op(run)
    if op == "time":
        _time_step(run)
        run.steps.append({"time": run.clock.now})
    elif op == "frozen":
        _set_frozen(run, not run.frozen)
        run.steps.append({"frozen": run.frozen})
    elif op == "trip":
        closed = run.record.state == "closed"
        run.steps.append({"breaker": "fail" if closed else "(not CLOSED: no call reaches the breaker)"})
        if closed:
            if run.kind == "rate_limit_cascade":
                breaker.report_rate_limit()
            else:
                breaker.record_failure(breaker.acquire())
        sender.store(run, "trip", trigger=run.kind, **run.timing)
    elif op == "acquire":
        try:
            permit: Permit | None = breaker.acquire()
        except CircuitOpenError:
            permit = None
        token = f"t{run.index}-{run.tokens}"
        run.tokens += 1
        admitted = permit is not None and permit.trial
        run.steps.append({"breaker": "acquire", "trial": admitted})
        answer = sender.store(
            run, "acquire_probe", token=token, max_calls=breaker.config.half_open_max_calls, lease_seconds=1e9
        )
        if answer.result != admitted:
            raise Divergence(f"probe admitted by the store: {answer.result}, by the breaker: {admitted}")
        if admitted:
            assert permit is not None
            run.trials.append(Trial(permit, token, answer.record.version, run.clock.now))
    elif op == "finish":
        trial = run.trials.pop(rng.randrange(len(run.trials)))
        outcome = rng.choice(
            ("failure",) * 6 + ("success", "abandon") if run.storm else ("success", "failure", "abandon")
        )
        slow = breaker.config.slow_call_duration
        sent = outcome
        if outcome != "abandon" and slow > 0 and run.clock.now - trial.started >= slow:
            sent = "slow"
        run.steps.append({"breaker": f"record_{outcome}", "token": trial.token})
        if outcome == "success":
            breaker.record_success(trial.permit)
        elif outcome == "failure":
            breaker.record_failure(trial.permit)
        else:
            breaker.record_ignored(trial.permit)
        sender.store(
            run,
            "finish_probe",
            token=trial.token,
            version=trial.version,
            outcome=sent,
            max_calls=breaker.config.half_open_max_calls,
            **run.timing,
        )
    elif op == "force":
        mode = rng.choice(("open", "closed"))
        minutes = rng.choice((0.5, 5.0, 60.0, 3600.0)) * rng.uniform(0.9, 1.1) / 60.0
        reason, actor = rng.choice(REASONS), rng.choice(ACTORS)
        run.steps.append({"breaker": f"force_{mode}", "ttl_minutes": minutes})
        (breaker.force_open if mode == "open" else breaker.force_close)(minutes, reason, actor)
        sender.store(run, "force", mode=mode, ttl_seconds=minutes * 60.0, reason=reason, actor=actor)
    elif op == "release":
        released = breaker.release()
        run.steps.append({"breaker": "release", "released": released})
        answer = sender.store(run, "release")
        if (answer.result is not None) != released:
            raise Divergence(f"release: the store removed {answer.result!r}, the breaker answered {released}")
    elif op == "reset":
        breaker.reset()
        run.steps.append({"breaker": "reset"})
        sender.store(run, "clear")
    else:
        run.steps.append({"breaker": "(prune: a local breaker has no registry)"})
        sender.prune(run)
    return op


def observe(run: Run, sender: Sender) -> None:
    """Read all three (``snapshot`` / ``sweep``) and compare the breaker with the memory store."""
    answer = sender.store(run, "sweep")
    run.record_before, run.record = run.record, answer.record
    record = answer.record
    fresh = record.version == 0 or (run.pruned and record.trigger is None)
    expected = record_view(record, fresh)
    got = breaker_view(run.breaker.snapshot(), fresh)
    if expected != got:
        raise Divergence(f"store record {expected}\nbreaker        {got}")
    same_record(run, record, fresh)
    generation = core_of(run.breaker).generation  # the state generation, kept by the breaker's core
    if record.state != run.record_before.state and generation == run.generation:
        raise Divergence(f"the state moved to {record.state} without a new generation of the breaker")
    if generation != run.generation and record.version == run.record_before.version:
        raise Divergence("the breaker took a new generation, the store record kept its version")
    run.generation = generation


def same_record(run: Run, record: Record, fresh: bool) -> None:
    """The breaker's own record (its core is a :class:`Record`; with the pinned clock its
    monotonic times are the store's Unix times) is the store's, field by field: the probe
    tokens and leases are each side's own (the breaker's slots never expire), so the round
    is compared by its size; the version up to the offset a prune left; ``trigger`` and
    ``updated_at`` only once the store wrote the record again after a prune."""
    mine = core_of(run.breaker).to_dict()
    theirs = record.to_dict()
    mine["state"] = str(mine["state"])
    for side in (mine, theirs):
        side["probes"] = len(side["probes"])
    mine["version"] -= run.version_offset
    if fresh:
        for name in ("trigger", "updated_at"):
            del mine[name], theirs[name]
    if mine != theirs:
        raise Divergence(f"store record  {theirs}\nbreaker record {mine}")


class Divergence(AssertionError):
    """The breaker and the memory store differ."""


# ---------------------------------------------------------------------- the test
@pytest.fixture
def differential_seed() -> int:
    return seed_from_env()


@pytest.fixture
def level_backend():
    emergency.use_backend(LEVELS)
    yield
    emergency.reset()


def test_differential_three_way_breaker_memory_store_and_lua_agree(redis_client, differential_seed, level_backend):
    """ST-2, CB-5, CB-6, CB-16, OP-1..OP-3, EM-2: after every step of thousands of random
    sequences the local breaker shows the memory store's record, and the Lua on the real
    Redis gives the memory store's record and answers (see the module docstring)."""
    seed = differential_seed
    holder: dict[str, PinnedClock] = {}
    lua = QueuedRedisStore(redis_client, prefix=redis_client.test_prefix, clock=lambda: holder["clock"].now)
    started = time.perf_counter()
    steps = compared = 0
    seen: dict[str, int] = {}
    most_opens = 0
    max_calls: set[int] = set()
    triggers: set[str | None] = set()
    for first in range(0, SEQUENCES, BATCH):
        sender = Sender(lua)
        for index in range(first, min(first + BATCH, SEQUENCES)):
            run = new_run(index, seed)
            holder["clock"] = run.clock
            emergency.use_clock(run.clock)
            _set_frozen(run, False)
            max_calls.add(run.breaker.config.half_open_max_calls)
            for _ in range(run.rng.randint(8, 48 if run.storm else 32)):
                try:
                    op = step(run, sender)
                    observe(run, sender)
                except Divergence as exc:
                    _fail("the local breaker and the memory store differ", seed, run, str(exc))
                seen[op] = seen.get(op, 0) + 1
                steps += 1
                most_opens = max(most_opens, run.record.opens)
                triggers.add(run.record.trigger)
        for (run, index, ref), got in zip(sender.sent, lua.flush(), strict=True):
            compared += 1
            same = (ref is None or ref == got) if isinstance(ref, bool | None) else same_answer(ref, got)
            if not same:
                _fail(
                    "the Lua and the memory store differ",
                    seed,
                    run,
                    f"memory: {show(ref)}\nlua:    {show(got)}",
                    upto=index + 1,
                )
    elapsed = time.perf_counter() - started
    print(
        f"three-way differential: {SEQUENCES} sequences, {steps} steps, {compared} store answers compared "
        f"in {elapsed:.1f} s; events {seen}; most consecutive opens {most_opens}; max_calls {sorted(max_calls)}; "
        f"triggers {sorted(map(str, triggers))}"
    )
    assert steps >= SEQUENCES * 8
    assert set(seen) == {"time", "frozen", "trip", "acquire", "finish", "force", "release", "reset", "prune"}
    if SEQUENCES >= 1000:  # every kind of transition was compared
        assert max_calls == set(range(1, 11)) and most_opens >= 8
        assert triggers >= {
            "consecutive_failures",
            "failure_rate",
            "rate_limit_cascade",
            "recovery_timeout",
            "half_open_success",
            "half_open_failure",
            "slow_call_rate",
            "forced",
            "force_lapsed",
            "released",
            "reset",
        }


def _fail(what: str, seed: int, run: Run, detail: str, upto: int | None = None) -> None:
    pytest.fail(
        f"{what} (seed={seed}, sequence {run.index}, kind {run.kind}, storm {run.storm}, config "
        f"{run.breaker.snapshot()['config']}; replay with BALDUR_DIFFERENTIAL_SEED={seed}).\n"
        f"steps:\n{history(run.steps[:upto])}\n{detail}"
    )


# ---------------------------------------------------------------------- pinned divergences
def _force_open_over_automatic_open(run: Run) -> None:
    """An automatic open, then force_open: no transition, so both keep the open's trigger
    (``consecutive_failures``), its ``opened_at`` and its ``open_until``."""
    run.breaker.record_failure(run.breaker.acquire())
    run.memory.trip(run.name, trigger="consecutive_failures", **run.timing)
    run.breaker.force_open(1.0)
    run.memory.force(run.name, mode="open", ttl_seconds=60.0)


def _frozen_lapse_open_until(run: Run) -> None:
    """A forced open lapses during Level 3: both stay OPEN, due for a probe as soon as the level
    drops, and both show the lapse time as ``open_until``."""
    run.breaker.force_open(1.0)
    run.memory.force(run.name, mode="open", ttl_seconds=60.0)
    _set_frozen(run, True)
    run.clock.now += 60.0


def _backoff_after_storm(run: Run) -> None:
    """(Agrees; the control case.) An open and three failed trials back off alike on both."""
    run.breaker.record_failure(run.breaker.acquire())
    run.memory.trip(run.name, trigger="consecutive_failures", **run.timing)
    for round_ in range(3):
        run.clock.now = run.memory.sweep(run.name).record.open_until
        permit = run.breaker.acquire()
        answer = run.memory.acquire_probe(run.name, token=f"t{round_}", max_calls=1, lease_seconds=1e9)
        run.breaker.record_failure(permit)
        run.memory.finish_probe(
            run.name, token=f"t{round_}", version=answer.record.version, outcome="failure", max_calls=1, **run.timing
        )
    assert run.memory.sweep(run.name).record.opens == 4


PINNED = [
    pytest.param(_backoff_after_storm, id="backoff_after_storm"),
    pytest.param(
        _force_open_over_automatic_open,
        id="force_open_over_automatic_open",
    ),
    pytest.param(
        _frozen_lapse_open_until,
        id="frozen_lapse_open_until",
    ),
]


@pytest.mark.parametrize("case", PINNED)
def test_differential_pinned(case, level_backend):
    """ST-2, OP-1, OP-3, EM-2: the smallest sequences of the divergences the three-way test
    once found agree, each on a local breaker and the memory store (the Lua agrees with the
    memory store on each: the Lua test covers the store side)."""
    run = new_run(0, 0)
    config = _config(
        "consecutive_failures",
        {
            "failure_threshold": 1,
            "failure_rate_threshold": 0,
            "minimum_calls": 1,
            "sliding_window_size": 10,
            "recovery_timeout": 5.0,
            "half_open_max_calls": 1,
            "recovery_backoff_factor": 2.0,
            "recovery_timeout_max": 600.0,
        },
    )
    run.breaker = CircuitBreaker(run.name, config, clock=run.clock, bus=EventBus())
    emergency.use_clock(run.clock)
    _set_frozen(run, False)
    case(run)
    record = run.memory.sweep(run.name, frozen=run.frozen).record
    expected = record_view(record, fresh=False)
    assert breaker_view(run.breaker.snapshot(), fresh=False) == expected

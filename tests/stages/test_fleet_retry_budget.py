"""RS-5, RS-9 and RS-10: the retry budget summed over a fleet through Redis.

Real Redis at 127.0.0.1:6379, database 7 (no other test uses it), under a key prefix of
each test's own that is deleted afterwards (no FLUSHDB: other runs may share the server).
Unreachable: skipped locally, a failure under CI=true (tests/conftest.py ``need_server``).

What is shown: no Redis command on the call path (commands counted on the client's
connections); one flush is one round trip; the fleet's totals are sums over the processes;
the overshoot is exactly what a process had not seen yet; the window is Redis's (pinned
clock); an unreachable server means per-worker counts and one log line, and recovery one
more; a forked child counts from zero and flushes on its own thread. RS-10: threads and
asyncio tasks on one budget never overspend; four forked processes sharing a budget stay
within it plus the retries the fleet made in the flush intervals they had not seen.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import os
import time
import uuid

import pytest

from baldur_django.core.stages import fleet_budget as fleet_module
from baldur_django.core.stages.budget import WINDOW_SECONDS
from baldur_django.core.stages.fleet_budget import FLUSH_SECONDS, SETTLE_SECONDS, FleetRetryBudget
from baldur_django.core.stores.redis import connect
from baldur_django.core.testing import FakeClock
from tests.conftest import need_server
from tests.stores.conftest import reachable
from tests.stores.redis_tools import Counter, RedisServer, counting_client, free_port, wait_for

from .budget_helpers import fast_switching, run_threads, unlocked  # noqa: F401 - fixture

pytestmark = [pytest.mark.redis]

DB = 7
URL = f"redis://127.0.0.1:6379/{DB}"
CALLS = 10_000


@pytest.fixture
def redis_prefix():
    """A key prefix of this test's own on DB 7; its keys are deleted afterwards."""
    need_server("Redis at 127.0.0.1:6379", reachable("127.0.0.1", 6379))
    client = connect(URL, socket_timeout=2.0)
    prefix = f"t-budget-{uuid.uuid4().hex[:12]}"
    yield prefix
    for key in client.scan_iter(f"{prefix}:*"):
        client.delete(key)
    client.close()


def budget(prefix: str, *, ratio=0.1, per_second=0.0, clock=None, client=None, **kwargs) -> FleetRetryBudget:
    return FleetRetryBudget(
        "payments",
        ratio,
        per_second,
        clock or FakeClock(),
        client if client is not None else connect(URL, socket_timeout=2.0),
        prefix=prefix,
        background=kwargs.pop("background", False),
        **kwargs,
    )


def spend(b: FleetRetryBudget) -> int:
    spent = 0
    while b.try_retry():
        spent += 1
        assert spent < 10**6
    return spent


# --------------------------------------------------------------------- RS-9 / RS-5 unit
def test_rs9_no_redis_command_on_the_call_path(redis_prefix):
    """RS-9: 10,000 calls and as many retry questions send nothing to Redis; a flush sends
    one script call in one round trip."""
    counter = Counter()
    client = counting_client(URL, counter)
    b = budget(redis_prefix, client=client, per_second=1.0)
    assert b.flush()  # the first flush may load the script (NOSCRIPT, SCRIPT LOAD, EVALSHA)
    before = counter.snapshot()
    for _ in range(CALLS):
        b.note_call()
        b.try_retry()
        b.left()
    assert counter.snapshot() == before
    assert b.flush()
    commands, trips = counter.snapshot()
    assert (commands - before[0], trips - before[1]) == (1, 1)
    assert counter.names.get("evalsha", 0) >= 2
    client.close()


def test_rs5_fleet_totals_are_the_sum_of_the_processes(redis_prefix):
    """RS-5 fleet: two workers' calls fund the retries of either, once each has flushed."""
    a, b = budget(redis_prefix), budget(redis_prefix)
    for _ in range(300):
        a.note_call()
    for _ in range(200):
        b.note_call()
    assert not a.using_fleet()
    assert a.left() == pytest.approx(30.0)  # before its first answer: its own counts
    assert a.flush() and b.flush() and a.flush()
    assert a.using_fleet() and b.using_fleet()
    assert a.left() == pytest.approx(50.0)
    assert b.left() == pytest.approx(50.0)  # b's answer came after a's first flush
    assert spend(b) == 50
    assert b.flush() and a.flush()
    assert a.left() == 0.0 and not a.try_retry()


def test_rs5_fleet_overshoot_is_what_a_process_had_not_seen(redis_prefix):
    """RS-5/RS-10 bound: both workers saw 100 retries left; each spends them before the other
    flushes, so the fleet made 200: the budget plus the retries one worker made in the
    interval the other had not seen. After one flush each, neither spends another."""
    a, b = budget(redis_prefix), budget(redis_prefix)
    for _ in range(500):
        a.note_call()
        b.note_call()
    assert a.flush() and b.flush() and a.flush()
    assert a.left() == b.left() == pytest.approx(100.0)
    assert spend(a) == 100
    assert spend(b) == 100  # b has not seen a's hundred yet
    assert a.flush() and b.flush()
    assert not a.try_retry() and not b.try_retry()
    assert a.left() == b.left() == 0.0
    assert a.exhausted == 2 and b.exhausted == 2


def test_rs10_after_a_beat_s_read_each_process_sees_every_count_of_that_beat(redis_prefix):
    """RS-10, RS-5 fleet: on a beat, the process that flushes first cannot see the counts
    the others send after it; the read that follows the beat (refresh, which sends
    nothing) brings them in, so each process then decides with the whole fleet's counts
    up to the beat, and what it has not seen is one interval's traffic at most."""
    a, b = budget(redis_prefix), budget(redis_prefix)
    for _ in range(500):
        a.note_call()
        b.note_call()
    assert a.flush() and b.flush()  # the beat: a's script ran first
    assert a.left() == pytest.approx(50.0)  # its own 500 calls only
    assert b.left() == pytest.approx(100.0)
    for _ in range(100):
        a.note_call()  # counted after the beat: a's own, not sent by the read
    assert a.refresh() and b.refresh()
    assert a.left() == pytest.approx(110.0)  # the fleet's 1,000 at the beat, plus its 100 since
    assert b.left() == pytest.approx(100.0)  # a's 100 since the beat are not the fleet's yet
    assert a.flush() and b.refresh()
    assert b.left() == pytest.approx(110.0)


def test_rs5_fleet_budget_on_a_redis_cluster(redis_cluster):
    """RS-5 fleet on a Redis Cluster (BALDUR_REDIS_CLUSTER): the service's counts are one key,
    so the script runs on its slot's master; two workers' calls add up there."""
    client = connect(redis_cluster.url, socket_timeout=2.0, cluster=True)
    prefix = f"t-budget-{uuid.uuid4().hex[:12]}"
    a, b = budget(prefix, client=client), budget(prefix, client=client)
    for _ in range(250):
        a.note_call()
        b.note_call()
    assert a.flush() and b.flush() and a.flush()
    assert a.using_fleet() and a.left() == pytest.approx(50.0)
    client.close()


def test_rs5_the_fleet_window_is_the_store_s_ten_seconds(redis_prefix):
    """RS-5 fleet: counts are placed in seconds of the store's clock and leave after 10 s
    (the store clock is pinned here; in production it is Redis TIME)."""
    wall = [1_700_000_000.25]
    clock = FakeClock()
    a = budget(redis_prefix, clock=clock, store_clock=lambda: wall[0])
    for _ in range(100):
        a.note_call()
    assert a.flush()
    assert spend(a) == 10
    assert a.flush()
    wall[0] += WINDOW_SECONDS - 1  # second ...009: everything is still in the window
    assert a.flush() and a.left() == 0.0
    wall[0] += 1.0  # second ...010: the calls and retries of second ...000 have left
    assert a.flush()
    assert a.left() == 0.0  # no calls, no floor
    for _ in range(20):
        a.note_call()
    assert a.flush() and a.left() == pytest.approx(2.0)


def test_rs5_stale_fleet_totals_are_not_trusted(redis_prefix):
    """RS-5 fleet: totals older than STALE_SECONDS (the flusher was held up, or the process
    idle) give way to the worker's own counts until the next flush."""
    clock = FakeClock()
    a, b = budget(redis_prefix, clock=clock), budget(redis_prefix)
    for _ in range(1000):
        b.note_call()
    assert b.flush() and a.flush()
    assert a.left() == pytest.approx(100.0)
    clock.advance(fleet_module.STALE_SECONDS)
    assert not a.using_fleet()
    assert a.left() == 0.0  # a made no call of its own
    assert a.flush() and a.using_fleet() and a.left() == pytest.approx(100.0)


def test_rs5_unreachable_store_falls_back_to_worker_counts_and_logs_once(caplog):
    """RS-5 fleet: while Redis does not answer, the worker judges by its own counts (its own
    floor), logs circuit_breaker.retry_budget_store_unavailable once, and once
    circuit_breaker.retry_budget_store_recovered when the server answers again."""
    caplog.set_level(logging.INFO, logger="baldur.circuit_breaker")
    server = RedisServer(free_port())
    client = connect(server.url(0), socket_timeout=0.2)
    a = budget("t-outage", client=client, ratio=0.0, per_second=0.5)
    try:
        for _ in range(3):
            assert not a.flush()
        assert not a.using_fleet()
        assert spend(a) == 5  # the worker's own floor
        names = [r.getMessage().split(" ")[0] for r in caplog.records if r.name == "baldur.circuit_breaker"]
        assert names.count("circuit_breaker.retry_budget_store_unavailable") == 1
        server.start()
        assert a.flush() and a.flush()
        names = [r.getMessage().split(" ")[0] for r in caplog.records if r.name == "baldur.circuit_breaker"]
        assert names.count("circuit_breaker.retry_budget_store_recovered") == 1
        assert a.using_fleet() and a.left() == 0.0  # the five retries were counted locally, and sent
    finally:
        client.close()
        server.stop()


def test_rs5_a_budget_idle_for_a_window_costs_redis_nothing(redis_prefix):
    """RS-9: the flusher reads the fleet back while the worker was busy in the last 10 s;
    after that an idle budget is not flushed at all."""
    counter = Counter()
    clock = FakeClock()
    a = budget(redis_prefix, clock=clock, client=counting_client(URL, counter))
    assert not a.flush_if_due()  # never busy: nothing to send, nothing wanted
    a.note_call()
    assert a.flush_if_due()
    clock.advance(WINDOW_SECONDS - 0.5)
    assert a.flush_if_due()  # still wanted: it was busy 9.5 s ago
    clock.advance(0.5)
    commands = counter.snapshot()[0]
    assert not a.flush_if_due()
    assert counter.snapshot()[0] == commands


def test_rs5_the_background_flusher_shares_the_counts(redis_prefix):
    """RS-5 fleet: with background=True the first call starts the process's flusher, which
    flushes at most every FLUSH_SECONDS and brings another worker's calls in."""
    other = budget(redis_prefix)
    for _ in range(400):
        other.note_call()
    assert other.flush()
    counter = Counter()
    a = budget(redis_prefix, client=counting_client(URL, counter), background=True)
    started = time.monotonic()
    a.note_call()
    wait_for(a.using_fleet, timeout=30, what="the first background flush")
    assert a.left() == pytest.approx(40.1)
    wait_for(lambda: counter.names.get("evalsha", 0) >= 4, timeout=30, what="four flushes")
    elapsed = time.monotonic() - started
    asked = counter.names["evalsha"]
    # the first flush at once, then per beat at most one flush and one read of the totals
    assert asked <= 1 + 2 * (1 + elapsed / FLUSH_SECONDS)


def test_rs5_a_forked_child_counts_from_zero_and_flushes_on_its_own(redis_prefix):
    """RS-5 fleet, fork safety: a child forked while the parent's flusher runs sends only its
    own calls, from a flusher thread of its own; the parent's unsent calls are the parent's."""
    parent = budget(redis_prefix, background=True)
    for _ in range(100):
        parent.note_call()
    assert parent.flush()
    for _ in range(50):
        parent.note_call()  # not sent yet when the child is forked (or sent by the parent)

    def calls_sent() -> int:
        client = connect(URL, socket_timeout=2.0)
        try:
            return sum(int(v) for k, v in client.hgetall(parent.key).items() if k.startswith(b"c"))
        finally:
            client.close()

    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 1
        try:
            for _ in range(7):
                parent.note_call()
            wait_for(parent.using_fleet, timeout=30, what="the child's own flush")
            # all 7 sent by the child's flusher (the parent's 50 may have been sent too)
            wait_for(lambda: calls_sent() in (107, 157), timeout=30, what="the child's 7 calls")
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert parent.flush()
    assert calls_sent() == 157  # 150 of the parent, 7 of the child, none twice


# ------------------------------------------------------------------- RS-10 concurrency
def hammer(b: FleetRetryBudget, threads: int = 16, flush_every: int = 0) -> int:
    """16 threads, 10,000 calls, a retry asked after each; thread 0 flushes every
    *flush_every* calls (0: never)."""
    granted = [0] * threads

    def work(i: int) -> None:
        for n in range(CALLS // threads):
            b.note_call()
            if b.try_retry():
                granted[i] += 1
            if i == 0 and flush_every and n % flush_every == 0:
                b.flush()

    run_threads(threads, work)
    return sum(granted)


@pytest.mark.usefixtures("fast_switching")
def test_rs10_fleet_threads_never_overspend(redis_prefix):
    """RS-10, threads: 16 threads of one process, flushing as they go: one process sees all
    its own retries, so never more than ratio * calls + floor."""
    b = budget(redis_prefix, ratio=0.1, per_second=1.0)
    granted = hammer(b, flush_every=50)
    assert CALLS * 0.1 + 10 - 16 <= granted <= CALLS * 0.1 + 10


@pytest.mark.usefixtures("fast_switching")
def test_rs10_meta_fleet_threads_catch_a_missing_lock(redis_prefix, monkeypatch):
    """RS-10 meta-test: the same run with a lock that protects nothing overspends."""
    for _ in range(40):
        with unlocked(fleet_module, monkeypatch):
            b = budget(redis_prefix, ratio=0.1, per_second=1.0)
        if hammer(b) > CALLS * 0.1 + 10:
            return
    pytest.fail("without the lock no run overspent: the thread test would not notice a missing lock")


def test_rs10_fleet_asyncio_tasks_never_overspend(redis_prefix):
    """RS-10, asyncio: 200 tasks of 50 calls on one budget, a flush every 100 steps."""
    b = budget(redis_prefix, ratio=0.2, per_second=0.5)
    granted = 0
    steps = 0

    async def task() -> None:
        nonlocal granted, steps
        for _ in range(CALLS // 200):
            b.note_call()
            await asyncio.sleep(0)
            granted += b.try_retry()
            steps += 1
            if steps % 100 == 0:
                b.flush()  # blocks the loop for one round trip: a test's stand-in for the flusher
            await asyncio.sleep(0)

    async def main() -> None:
        await asyncio.gather(*(task() for _ in range(200)))

    asyncio.run(main())
    assert CALLS * 0.2 + 5 - 200 <= granted <= CALLS * 0.2 + 5


def _fleet_process(
    b: FleetRetryBudget, role: str, barrier, callers_done, retriers, results
) -> None:  # pragma: no cover
    """One of four forked workers sharing *b* (built and used by the parent, so each child
    inherits it): 2,500 calls at about one a millisecond; a "retry" worker asks for a retry
    after each. At the end every worker flushes; the retry workers then wait for the callers
    and each other, read the fleet's totals and spend what is left."""
    barrier.wait(60)
    grants: list[float] = []
    for _ in range(CALLS // 4):
        b.note_call()
        if role == "retry" and b.try_retry():
            grants.append(time.monotonic())
        time.sleep(0.001)  # the call itself
    b.flush()
    if role == "retry":
        callers_done.wait(60)
        retriers.wait(60)
        b.flush()
        while b.try_retry():
            grants.append(time.monotonic())
    results.put((role, grants))


def most_in_any_span(times: list[float], span: float) -> int:
    times = sorted(times)
    most, j = 0, 0
    for i, t in enumerate(times):
        while times[j] <= t - span:
            j += 1
        most = max(most, i - j + 1)
    return most


@pytest.mark.multiprocess
def test_rs10_four_processes_stay_within_the_fleet_budget(redis_prefix):
    """RS-10, processes: four forked workers share one budget (built and used in the parent
    before the fork, as with gunicorn --preload): two only call, two call and retry. Their
    10,000 calls fund ratio * calls + floor retries for the fleet: the retrying workers get
    nearly all of them (alone, each could have had only a fifth of its own 2,500 calls plus
    its floor), and never more than that plus the retries the others made in one flush
    interval (and the settle time): what a worker had not seen since the last beat."""
    ratio, per_second = 0.2, 1.0
    b = budget(redis_prefix, ratio=ratio, per_second=per_second, background=True)
    b.note_call()  # the parent's flusher runs when the workers are forked
    ctx = multiprocessing.get_context("fork")
    barrier = ctx.Barrier(4)
    callers_done = ctx.Event()
    retriers = ctx.Barrier(2)
    results = ctx.Queue()
    roles = ["call", "retry", "call", "retry"]
    started = time.monotonic()
    workers = [ctx.Process(target=_fleet_process, args=(b, r, barrier, callers_done, retriers, results)) for r in roles]
    for worker in workers:
        worker.start()
    answers = []
    for _ in workers:
        answers.append(results.get(timeout=120))
        if sum(role == "call" for role, _ in answers) == 2:
            callers_done.set()
    for worker in workers:
        worker.join(60)
        assert worker.exitcode == 0
    duration = time.monotonic() - started
    assert duration < WINDOW_SECONDS - 1, "the run must fit in one window for this bound; the machine is too slow"
    per_worker = [times for role, times in answers if role == "retry"]
    grants = sum(len(times) for times in per_worker)
    budget_total = ratio * CALLS + per_second * WINDOW_SECONDS
    # what a worker may not have seen when it decided: the others' retries since the last
    # beat (one flush interval, and the settle time before the beat's read)
    unseen = max(
        most_in_any_span(
            [t for j, times in enumerate(per_worker) if j != i for t in times], FLUSH_SECONDS + SETTLE_SECONDS
        )
        for i in range(len(per_worker))
    )
    alone = 2 * (ratio * CALLS / 4 + per_second * WINDOW_SECONDS)
    assert grants <= budget_total + unseen, (grants, budget_total, unseen)
    assert grants >= 0.95 * budget_total > alone


class _BeatClock:
    """Stands in for the module's ``time``: a wall clock that moves only when slept on."""

    def __init__(self, start: float, flusher: object, steps: int) -> None:
        self.now = start
        self.flusher = flusher
        self.steps = steps

    def time(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds
        self.steps -= 1
        if self.steps <= 0:
            self.flusher.budgets.clear()  # type: ignore[attr-defined]  # the flusher's budgets


class _Recorder:
    """A fleet budget's flush and read, recorded with the time they were made at."""

    def __init__(self, clock: _BeatClock) -> None:
        self.clock = clock
        self.service = "svc"
        self.seen: list[tuple[str, float]] = []

    def flush_if_due(self) -> bool:
        self.seen.append(("flush", self.clock.now))
        return True

    def refresh(self) -> bool:
        self.seen.append(("read", self.clock.now))
        return True


def test_rs10_the_flusher_keeps_the_beat_and_reads_again_after_it(monkeypatch):
    """RS-10, RS-5 fleet: the flusher flushes at once, then on the multiples of
    FLUSH_SECONDS of the wall clock (the same moments in every process), and reads the
    totals again SETTLE_SECONDS after each such flush, once the others' flushes of that
    beat have landed."""
    flusher = fleet_module._Flusher()
    clock = _BeatClock(1000.37, flusher, steps=8)
    budget = _Recorder(clock)
    flusher.budgets.add(budget)  # type: ignore[arg-type]  # a stand-in budget
    monkeypatch.setattr(fleet_module, "time", clock)
    flusher._run()
    kinds = [kind for kind, _ in budget.seen]
    assert kinds == ["flush", "flush", "read", "flush", "read", "flush", "read", "flush", "read"]
    at = [round(t, 6) for _, t in budget.seen]
    assert at[0] == 1000.37
    beats = at[1::2]
    assert beats == [1000.5, 1001.0, 1001.5, 1002.0]
    assert [round(read - beat, 6) for beat, read in zip(beats, at[2::2], strict=True)] == [
        fleet_module.SETTLE_SECONDS
    ] * 4

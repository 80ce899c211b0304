"""RS-5 and RS-10: the retry budget of one worker.

Unit tests run on a FakeClock. The concurrency tests (RS-10) run 10,000 calls with real
threads (16, ``sys.setswitchinterval(1e-6)``, a start barrier), asyncio tasks (200) and
processes (4, each with its own budget), and every one requires the retries to stay within
``ratio * calls + min_per_second * 10``. The meta-test builds the budget with a lock that
protects nothing and requires the thread test to catch it overspending.
"""

from __future__ import annotations

import asyncio
import logging
import math
import multiprocessing

import pytest

from baldur_django.core.errors import ConfigError
from baldur_django.core.stages import budget as budget_module
from baldur_django.core.stages.budget import EXHAUSTED_EVENT, WINDOW_SECONDS, RetryBudget
from baldur_django.core.testing import FakeClock

from .budget_helpers import SharedClock, fast_switching, run_threads, unlocked  # noqa: F401 - fixture

CALLS = 10_000


def make(ratio: float = 0.1, min_per_second: float = 1.0, start: float = 1000.0) -> tuple[RetryBudget, FakeClock]:
    clock = FakeClock(start=start)
    return RetryBudget("payments", ratio, min_per_second, clock), clock


def spend(budget: RetryBudget) -> int:
    """Retries spent until the budget says no."""
    spent = 0
    while budget.try_retry():
        spent += 1
        assert spent < 10**6
    return spent


# ----------------------------------------------------------------------------- RS-5 unit
def test_rs5_the_floor_alone_allows_min_per_second_times_ten():
    """RS-5: no calls yet: min_per_second * 10 retries, then refusals, counted in ``exhausted``."""
    budget, _ = make(ratio=0.5, min_per_second=2.0)
    assert budget.left() == 20.0
    assert spend(budget) == 20
    assert budget.left() == 0.0
    assert budget.exhausted == 1
    assert not budget.try_retry()
    assert budget.exhausted == 2


def test_rs5_each_call_adds_ratio_of_a_retry():
    """RS-5: 100 calls with ratio 0.2 and no floor allow exactly 20 retries."""
    budget, _ = make(ratio=0.2, min_per_second=0.0)
    assert not budget.try_retry()
    for _ in range(100):
        budget.note_call()
    assert budget.left() == pytest.approx(20.0)
    assert spend(budget) == 20
    budget.note_call()  # 101 calls: 20.2 allowed, still no 21st retry
    assert not budget.try_retry()
    for _ in range(4):
        budget.note_call()  # 105 calls: 21 allowed
    assert budget.try_retry()
    assert not budget.try_retry()


def test_rs5_the_exact_boundary_is_inside_the_budget():
    """RS-5: 100 calls at ratio 0.29 are 29 retries, although 0.29 * 100 is 28.999999999999996."""
    budget, _ = make(ratio=0.29, min_per_second=0.0)
    for _ in range(100):
        budget.note_call()
    assert spend(budget) == 29


def test_rs5_calls_and_retries_leave_the_window_after_ten_seconds():
    """RS-5: the window is the current second and the nine before: calls of second 1000 fund
    retries until 1009.999, and the retries spent then stop counting at 1010.0."""
    budget, clock = make(ratio=0.1, min_per_second=0.1, start=1000.0)
    for _ in range(100):
        budget.note_call()
    assert spend(budget) == 11  # 10 from the calls, 1 floor
    clock.advance(9.999)
    assert budget.left() == 0.0
    assert not budget.try_retry()
    clock.advance(0.001)  # 1010.0: second 1000 has left, with its calls and its retries
    assert budget.left() == pytest.approx(1.0)
    assert spend(budget) == 1


def test_rs5_retries_count_in_the_second_they_were_spent():
    """RS-5: retries spent at second 1005 stay in the window until 1015, while the calls of
    second 1000 have left it at 1010."""
    budget, clock = make(ratio=1.0, min_per_second=0.0, start=1000.0)
    for _ in range(10):
        budget.note_call()
    clock.advance(5)
    for _ in range(10):
        budget.note_call()
    assert spend(budget) == 20
    clock.advance(5)  # 1010: the first ten calls left, the twenty retries did not
    assert budget.left() == 0.0
    for _ in range(25):
        budget.note_call()
    assert budget.left() == pytest.approx(15.0)  # 35 calls, 20 retries
    clock.advance(5)  # 1015: the retries of 1005 left, the ten calls of 1005 too
    assert budget.left() == pytest.approx(25.0)


def test_rs5_a_quiet_spell_longer_than_the_window_forgets_everything():
    """RS-5: after 10 s or more without a call the budget is back to its floor."""
    budget, clock = make(ratio=0.5, min_per_second=0.3)
    for _ in range(50):
        budget.note_call()
    spend(budget)
    clock.advance(WINDOW_SECONDS + 37.5)
    assert budget.left() == pytest.approx(3.0)
    for step in range(12):  # and the ring keeps working second by second afterwards
        clock.advance(1)
        budget.note_call()
        budget.note_call()
        assert budget.left() == pytest.approx(3.0 + min(step + 1, WINDOW_SECONDS))


def test_rs5_exhaustion_is_logged_once_per_ten_seconds(caplog):
    """RS-5: circuit_breaker.retry_budget_exhausted at most once per 10 s per service, while
    ``exhausted`` counts every refusal."""
    budget, clock = make(ratio=0.0, min_per_second=0.1)  # one retry per window
    other = RetryBudget("search", 0.0, 0.0, clock)
    caplog.set_level(logging.WARNING, logger="baldur.circuit_breaker")

    def lines() -> list[logging.LogRecord]:
        return [r for r in caplog.records if r.getMessage().startswith(EXHAUSTED_EVENT)]

    assert budget.try_retry()
    for _ in range(50):
        assert not budget.try_retry()
        clock.advance(0.1)  # 5 s of refusals
    assert not other.try_retry()
    assert [r.service for r in lines()] == ["payments", "search"]
    assert budget.exhausted == 50 and other.exhausted == 1
    clock.advance(4.9)  # 1009.9: still within 10 s of the first line
    assert not budget.try_retry()
    assert len(lines()) == 2
    clock.advance(0.1)  # 1010.0: the retry of second 1000 has left, the floor has one again
    assert budget.try_retry()
    assert not budget.try_retry()  # 10 s after the first line: a second one
    assert [r.service for r in lines()] == ["payments", "search", "payments"]
    last = lines()[-1]
    assert "ratio=0 min_per_second=0.1 calls=0 retries=1" in last.getMessage()
    assert last.scope == "worker" and last.levelno == logging.WARNING


@pytest.mark.parametrize(
    ("ratio", "per_second", "knob"),
    [
        (-0.1, 1, "retry_budget_ratio"),
        (math.nan, 1, "retry_budget_ratio"),
        (True, 1, "retry_budget_ratio"),
        ("0.2", 1, "retry_budget_ratio"),
        (0.2, -1, "retry_budget_min_per_second"),
        (0.2, math.inf, "retry_budget_min_per_second"),
        (0.2, None, "retry_budget_min_per_second"),
    ],
)
def test_rs5_bad_numbers_are_a_config_error_naming_the_knob(ratio, per_second, knob):
    """RS-8 for the budget: the error names the knob and the bad value."""
    with pytest.raises(ConfigError, match=knob) as caught:
        RetryBudget("payments", ratio, per_second, FakeClock())
    assert repr(per_second if knob.endswith("second") else ratio) in str(caught.value)


# ------------------------------------------------------------------- RS-10 concurrency
def allowed(ratio: float, min_per_second: float, calls: int) -> float:
    return ratio * calls + min_per_second * WINDOW_SECONDS


def hammer_with_threads(budget: RetryBudget, clock: FakeClock | None = None, threads: int = 16) -> int:
    """16 threads make 10,000 calls between them, each asking for a retry after every call
    (far more than the budget holds), so the budget sits at its edge throughout. With
    *clock*, every call also moves it 0.1 ms (the run crosses a second while threads race)."""
    granted = [0] * threads
    per_thread = CALLS // threads

    def work(i: int) -> None:
        mine = 0
        for _ in range(per_thread):
            budget.note_call()
            if clock is not None:
                clock.advance(0.0001)
            if budget.try_retry():
                mine += 1
        granted[i] = mine

    run_threads(threads, work)
    return sum(granted)


@pytest.mark.usefixtures("fast_switching")
def test_rs10_threads_never_spend_more_than_the_budget():
    """RS-10, threads: 16 threads, 10,000 calls, a retry asked after each: never more than
    ratio * calls + floor retries, and the budget is used (none lost)."""
    budget, _ = make(ratio=0.1, min_per_second=1.0)
    granted = hammer_with_threads(budget)
    limit = allowed(0.1, 1.0, CALLS)
    assert granted <= limit
    assert granted >= limit - 16  # each thread's last calls may come after its last ask
    assert budget.left() == pytest.approx(limit - granted)


@pytest.mark.usefixtures("fast_switching")
def test_rs10_threads_racing_a_second_roll_stay_within_the_budget():
    """RS-10, threads: the clock moves while 16 threads count (1 s over the run, starting at
    .5), so the lock-free call count races the ring's roll: still within the budget."""
    clock = SharedClock(start=1000.5)
    budget = RetryBudget("payments", 0.1, 1.0, clock)
    granted = hammer_with_threads(budget, clock)
    assert clock.monotonic() > 1001.4
    assert granted <= allowed(0.1, 1.0, CALLS)
    assert granted >= allowed(0.1, 1.0, CALLS) * 0.9


@pytest.mark.usefixtures("fast_switching")
def test_rs10_meta_the_thread_test_catches_a_missing_lock(monkeypatch):
    """RS-10 meta-test: the same run with a lock that protects nothing overspends the budget
    (check and spend are two steps; another thread slips in between). One run catches it
    about one time in four (tests/stages/helpers.py YieldingCounts): up to 40 runs."""
    over = 0
    for _ in range(40):
        with unlocked(budget_module, monkeypatch):
            budget, _ = make(ratio=0.1, min_per_second=1.0)
        if hammer_with_threads(budget) > allowed(0.1, 1.0, CALLS):
            over += 1
            break
    assert over, "without the lock no run overspent: the thread test would not notice a missing lock"


def test_rs10_asyncio_tasks_never_spend_more_than_the_budget():
    """RS-10, asyncio: 200 tasks, 50 calls each, switching at every step."""
    budget, _ = make(ratio=0.2, min_per_second=0.5)
    granted = 0

    async def task() -> None:
        nonlocal granted
        for _ in range(CALLS // 200):
            budget.note_call()
            await asyncio.sleep(0)
            if budget.try_retry():
                granted += 1
            await asyncio.sleep(0)

    async def main() -> None:
        await asyncio.gather(*(task() for _ in range(200)))

    asyncio.run(main())
    limit = allowed(0.2, 0.5, CALLS)
    assert limit - 200 <= granted <= limit


def _process_worker(calls: int, barrier, results) -> None:  # pragma: no cover - runs in a child
    clock = FakeClock()
    budget = RetryBudget("payments", 0.1, 1.0, clock)
    barrier.wait(60)
    granted = 0
    for _ in range(calls):
        budget.note_call()
        granted += budget.try_retry()
        granted += budget.try_retry()
    results.put(granted)


@pytest.mark.multiprocess
def test_rs10_processes_each_keep_their_own_budget():
    """RS-10, processes: 4 processes, 2,500 calls each (10,000 in all), two retries asked per
    call: each worker spends exactly its own ratio * calls + floor, no more."""
    ctx = multiprocessing.get_context("fork")
    barrier = ctx.Barrier(4)
    results = ctx.Queue()
    workers = [ctx.Process(target=_process_worker, args=(CALLS // 4, barrier, results)) for _ in range(4)]
    for worker in workers:
        worker.start()
    granted = [results.get(timeout=60) for _ in workers]
    for worker in workers:
        worker.join(60)
        assert worker.exitcode == 0
    assert granted == [int(allowed(0.1, 1.0, CALLS // 4))] * 4

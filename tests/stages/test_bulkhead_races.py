"""RS-4, RS-10: the per-worker bulkhead never admits more than N calls at once, with real
threads (16, ``sys.setswitchinterval(1e-6)``, a start barrier), asyncio tasks (200) and
both at once on one count.

The free slots are tokens in a ``queue.SimpleQueue``, taken and given back in one C call
each, so with the GIL few thread switches fall inside the bulkhead's own steps. The tests
therefore also run a "yielding" bulkhead whose every take and give-back of a token gives up
the GIL (``time.sleep(0)``) before and after, so another thread may run between looking at
the queue of waiters and touching the free tokens, as a free-threaded interpreter allows.
With the real lock both kinds hold the limit and lose no slot; the meta-test at the end
removes the lock and sees the same test fail, so it can see the race the lock prevents.
The order of the steps without the lock (who looks at the waiters when) is pinned by the
step-by-step tests in test_bulkhead.py, which stop the bulkhead between two of its steps.
"""

from __future__ import annotations

import contextlib
import threading
import time

import pytest

from baldur_django.core.clock import SYSTEM_CLOCK
from baldur_django.core.stages.bulkhead import Bulkhead
from tests.stages.race_tools import JOIN_SECONDS, Meter, call_in_thread, fast_switching, run_tasks, run_threads

LIMIT = 3
THREADS = 16
TASKS = 200


class YieldingBulkhead(Bulkhead):
    """A bulkhead whose token steps give up the GIL before and after: a thread switch
    between any two of its steps, as a free-threaded interpreter allows."""

    __slots__ = ()

    def __init__(self, *args: object) -> None:
        super().__init__(*args)  # type: ignore[arg-type]
        take, give = self._take, self._give

        def yielding_take() -> bool:
            time.sleep(0)
            token = take()
            time.sleep(0)
            return token

        def yielding_give(token: bool) -> None:
            time.sleep(0)
            give(token)
            time.sleep(0)

        self._take, self._give = yielding_take, yielding_give


class TryFirstBulkhead(YieldingBulkhead):
    """The yielding bulkhead entered as a decorated call enters it: ``try_enter()`` first
    (no lock, no wait), ``enter()`` only when it finds no free slot."""

    __slots__ = ()

    def enter(self, *, timeout: float | None = None) -> object:
        ticket = self.try_enter()
        return super().enter(timeout=timeout) if ticket is None else ticket


KINDS = {"plain": Bulkhead, "yielding": YieldingBulkhead, "try-first": TryFirstBulkhead}


def make(kind: str, max_wait: float) -> Bulkhead:
    return KINDS[kind]("pay", LIMIT, max_wait, SYSTEM_CLOCK)


def assert_held(bulkhead: Bulkhead, meter: Meter, total: int) -> None:
    assert not meter.errors, meter.errors[:3]
    assert meter.most <= LIMIT, f"{meter.most} calls were in flight at once; the limit is {LIMIT}"
    assert meter.calls + meter.refused == total
    assert bulkhead.in_flight() == 0 and bulkhead.waiting() == 0, bulkhead


def check_sixteen_threads(bulkhead: Bulkhead, waits: bool, meter: Meter, timeout: float | None = None) -> None:
    """16 threads, 200 calls each: the limit holds and every slot comes back; with a wait
    the limit is reached (the callers really contend) and nobody is refused."""
    run_threads(bulkhead, THREADS, 200, timeout, meter)
    assert_held(bulkhead, meter, THREADS * 200)
    if waits:
        assert meter.refused == 0, f"{meter.refused} calls were refused though each could wait"
        assert meter.most == LIMIT


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("max_wait", [0.0, 60.0])
def test_rs10_sixteen_threads_never_exceed_the_limit(kind, max_wait):
    """RS-4, RS-10: 16 threads started together, switching every microsecond, call through a
    bulkhead of 3; at most 3 are ever inside the call, and every slot comes back. With a
    wait the limit is reached (the callers really contend) and nobody is refused (no waiter
    sleeps through a slot given back); without one, refusals make up the difference."""
    check_sixteen_threads(make(kind, max_wait), max_wait > 0, Meter())


@pytest.mark.parametrize("max_wait", [0.0, 60.0])
def test_rs10_two_hundred_tasks_never_exceed_the_limit(max_wait):
    """RS-4, RS-10: 200 asyncio tasks call through a bulkhead of 3; at most 3 are ever inside
    the call (each yields to the loop while inside), every slot comes back."""
    bulkhead = Bulkhead("pay", LIMIT, max_wait, SYSTEM_CLOCK)
    meter = run_tasks(bulkhead, TASKS, 20)
    assert_held(bulkhead, meter, TASKS * 20)
    if max_wait:
        assert meter.most == LIMIT and meter.refused == 0


@pytest.mark.parametrize("kind", KINDS)
def test_rs10_threads_and_tasks_on_two_loops_share_one_count(kind):
    """RS-4, RS-10: 14 threads plus 2 event loops (each in its own thread, 100 tasks each)
    call through one bulkhead of 3 with a long wait: together they never exceed 3, a slot
    freed by a thread wakes a task on another loop and back, and nothing is refused."""
    bulkhead = make(kind, 60.0)
    meter = Meter()
    barrier = threading.Barrier(16)

    def thread_body() -> None:
        barrier.wait()
        call_in_thread(bulkhead, meter, 100)

    def loop_body() -> None:
        barrier.wait()
        run_tasks(bulkhead, 100, 5, meter)

    workers = [threading.Thread(target=thread_body, daemon=True) for _ in range(14)]
    workers += [threading.Thread(target=loop_body, daemon=True) for _ in range(2)]
    with fast_switching():
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join(JOIN_SECONDS)
    assert not any(w.is_alive() for w in workers)
    assert_held(bulkhead, meter, 14 * 100 + 2 * 100 * 5)
    assert meter.refused == 0


def see_it_fail(bulkhead_for_round, rounds: int = 15) -> list[str]:
    """Run the 16-thread test with a wait on broken bulkheads, *rounds* times at most, and
    keep what it reported. Each call may wait 1 s (not 60): a waiter left asleep next to a
    free slot, or a slot lost, shows as a refusal; the threads stop at the first trouble."""
    seen: list[str] = []
    for _ in range(rounds):
        try:
            check_sixteen_threads(bulkhead_for_round(), True, Meter(stop_on_trouble=True), timeout=1.0)
        except AssertionError as exc:
            seen.append(str(exc))
            break
    return seen


@pytest.mark.parametrize("kind", ["yielding", "try-first"])
def test_rs10_meta_without_the_lock_the_thread_race_test_fails(monkeypatch, kind):
    """RS-10 (meta): with the lock over the queue of waiters swapped for a no-op context, the
    yielding bulkhead (entered directly, or ``try_enter()`` first as a decorated call does) hands one waiter two slots, loses a slot or fails, which the 16-thread
    test above reports; so that test does see the race the lock prevents. Up to 15 rounds are
    allowed, since a race is a matter of chance (on a loaded machine a round can pass; most
    runs fail the first); the real lock never fails one."""

    def unlocked() -> Bulkhead:
        bulkhead = make(kind, 60.0)
        monkeypatch.setattr(bulkhead, "_lock", contextlib.nullcontext())
        return bulkhead

    assert see_it_fail(unlocked), "without its lock the bulkhead still passed in every round"

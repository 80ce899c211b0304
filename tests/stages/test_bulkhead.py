"""RS-4: the per-worker bulkhead's rules, one at a time, on a fake clock.

A thread that must be waiting is waited for by watching ``bulkhead.waiting()`` (an
observable condition, polled with a deadline), never by sleeping; the fake clock ends a
wait when the test advances it.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time

import pytest

from baldur_django.core.errors import BulkheadFullError, CallRefusedError, ConfigError
from baldur_django.core.stages.bulkhead import Bulkhead
from baldur_django.core.testing import FakeClock

JOIN = 10.0


def until(predicate, what: str, timeout: float = 10.0) -> None:
    """Poll *predicate* (another thread's observable state) until true, at most *timeout* s."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.001)


class Waiter(threading.Thread):
    """A thread that calls ``enter`` and keeps what came of it."""

    def __init__(self, bulkhead: Bulkhead, timeout: float | None = None, done: list | None = None) -> None:
        super().__init__(daemon=True)
        self.bulkhead = bulkhead
        self.timeout = timeout
        self.ticket: object = None
        self.error: BaseException | None = None
        self.done = done

    def run(self) -> None:
        try:
            self.ticket = self.bulkhead.enter(timeout=self.timeout)
        except BaseException as exc:
            self.error = exc
        if self.done is not None:
            self.done.append(self)


def full(limit: int = 2, max_wait: float = 0.0, clock: FakeClock | None = None) -> tuple[Bulkhead, list[object]]:
    bulkhead = Bulkhead("pay", limit, max_wait, clock or FakeClock())
    return bulkhead, [bulkhead.enter() for _ in range(limit)]


def test_rs4_refused_at_once_when_every_slot_is_taken_and_max_wait_is_zero():
    """RS-4: N slots are given; the next call is refused at once with BulkheadFullError
    (a CallRefusedError, reason "bulkhead_full", the service named)."""
    clock = FakeClock()
    bulkhead, tickets = full(3, 0.0, clock)
    assert bulkhead.in_flight() == 3
    with pytest.raises(BulkheadFullError) as caught:
        bulkhead.enter()
    assert isinstance(caught.value, CallRefusedError)
    assert (caught.value.service, caught.value.reason, caught.value.retry_after) == ("pay", "bulkhead_full", None)
    assert clock.sleeps == [] and bulkhead.waiting() == 0
    bulkhead.leave(tickets[0])
    assert bulkhead.in_flight() == 2
    bulkhead.leave(bulkhead.enter())
    assert bulkhead.in_flight() == 2


def test_rs4_leave_is_idempotent_per_ticket():
    """RS-4: giving the same ticket back twice frees one slot, not two."""
    bulkhead, tickets = full(2)
    bulkhead.leave(tickets[0])
    bulkhead.leave(tickets[0])
    assert bulkhead.in_flight() == 1
    bulkhead.enter()
    with pytest.raises(BulkheadFullError):
        bulkhead.enter()


def test_rs4_a_stale_ticket_given_back_again_never_frees_the_next_holders_slot():
    """RS-4: a ticket given back twice, the second time after its slot was taken again by
    another call, changes nothing: the new holder keeps its slot and the limit holds."""
    bulkhead = Bulkhead("pay", 1, 0.0, FakeClock())
    first = bulkhead.enter()
    bulkhead.leave(first)
    second = bulkhead.enter()
    bulkhead.leave(first)
    assert bulkhead.in_flight() == 1
    with pytest.raises(BulkheadFullError):
        bulkhead.enter()
    bulkhead.leave(second)
    assert bulkhead.in_flight() == 0


def test_rs4_a_waiting_thread_takes_the_slot_given_back():
    """RS-4: with max_wait, a call past N waits; a slot given back goes to it."""
    bulkhead, tickets = full(1, 30.0)
    waiter = Waiter(bulkhead)
    waiter.start()
    until(lambda: bulkhead.waiting() == 1, "the thread to wait")
    bulkhead.leave(tickets[0])
    waiter.join(JOIN)
    assert waiter.error is None and waiter.ticket is not None
    assert bulkhead.in_flight() == 1 and bulkhead.waiting() == 0
    bulkhead.leave(waiter.ticket)
    assert bulkhead.in_flight() == 0


@pytest.mark.parametrize(("max_wait", "timeout", "allowed"), [(5.0, None, 5.0), (10.0, 2.0, 2.0), (1.0, 4.0, 1.0)])
def test_rs4_a_wait_ends_after_the_smaller_of_max_wait_and_timeout(max_wait, timeout, allowed):
    """RS-4: the wait lasts min(max_wait, timeout) seconds of the bulkhead's clock, then the
    call is refused and leaves the queue."""
    clock = FakeClock()
    bulkhead, _ = full(1, max_wait, clock)
    waiter = Waiter(bulkhead, timeout)
    waiter.start()
    until(lambda: bulkhead.waiting() == 1, "the thread to wait")
    clock.advance(allowed - 0.01)
    assert waiter.is_alive() and bulkhead.waiting() == 1
    clock.advance(0.01)
    waiter.join(JOIN)
    assert isinstance(waiter.error, BulkheadFullError)
    assert bulkhead.waiting() == 0 and bulkhead.in_flight() == 1


def test_rs4_timeout_zero_or_less_refuses_at_once_even_with_max_wait():
    """RS-4: a caller with no time left is refused at once when every slot is taken."""
    bulkhead, _ = full(1, 30.0)
    for timeout in (0.0, -1.0):
        with pytest.raises(BulkheadFullError):
            bulkhead.enter(timeout=timeout)
    assert bulkhead.waiting() == 0


def test_rs4_waiters_are_served_first_come_first_served_and_no_newcomer_jumps_the_queue():
    """RS-4: three waiting threads get the slots in the order they came; a slot given back
    while someone waits is theirs, so a newcomer is refused meanwhile."""
    bulkhead, tickets = full(1, 30.0)
    served: list[Waiter] = []
    waiters = []
    for n in range(3):
        waiter = Waiter(bulkhead, done=served)
        waiter.start()
        until(lambda n=n: bulkhead.waiting() == n + 1, f"waiter {n} to queue")
        waiters.append(waiter)
    held = tickets[0]
    for n in range(3):
        bulkhead.leave(held)
        with pytest.raises(BulkheadFullError):
            bulkhead.enter(timeout=0)
        until(lambda n=n: len(served) == n + 1, f"waiter {n} to be served")
        held = served[n].ticket
    assert served == waiters
    bulkhead.leave(held)
    assert bulkhead.in_flight() == 0


class Interrupted(BaseException):
    """Raised by a clock read, as a KeyboardInterrupt would land in a waiting thread."""


class InterruptingClock(FakeClock):
    def __init__(self) -> None:
        super().__init__()
        self.armed = False

    def monotonic(self) -> float:
        if self.armed:
            raise Interrupted
        return super().monotonic()


def test_rs4_a_thread_interrupted_while_waiting_leaves_the_queue_and_takes_nothing():
    """RS-4: an exception (KeyboardInterrupt-like) that ends a thread's wait leaves no
    waiter behind and takes no slot."""
    clock = InterruptingClock()
    bulkhead, tickets = full(1, 30.0, clock)
    waiter = Waiter(bulkhead)
    waiter.start()
    until(lambda: bulkhead.waiting() == 1, "the thread to wait")
    clock.armed = True
    waiter.join(JOIN)
    assert isinstance(waiter.error, Interrupted)
    clock.armed = False
    assert bulkhead.waiting() == 0
    bulkhead.leave(tickets[0])
    assert bulkhead.in_flight() == 0


def test_rs4_a_slot_is_given_back_when_the_call_raises():
    """RS-4: the exception path: ``try/finally`` around the call gives the slot back."""
    bulkhead = Bulkhead("pay", 1, 0.0, FakeClock())

    def call() -> None:
        ticket = bulkhead.enter()
        try:
            raise ValueError("boom")
        finally:
            bulkhead.leave(ticket)

    for _ in range(3):
        with pytest.raises(ValueError):
            call()
    assert bulkhead.in_flight() == 0


def test_rs4_async_wait_never_blocks_the_event_loop():
    """RS-4: a task waiting for a slot leaves the loop free: another task runs (ticks) and
    gives a slot back, which the waiter then takes."""
    bulkhead, tickets = full(1, 30.0)

    async def main() -> tuple[object, int]:
        waiting = asyncio.ensure_future(bulkhead.aenter())
        ticks = 0
        while bulkhead.waiting() == 0:
            await asyncio.sleep(0)
        for _ in range(5):
            ticks += 1
            await asyncio.sleep(0)
        assert not waiting.done()
        bulkhead.leave(tickets[0])
        return await asyncio.wait_for(waiting, JOIN), ticks

    ticket, ticks = asyncio.run(main())
    assert ticks == 5 and bulkhead.in_flight() == 1
    bulkhead.leave(ticket)
    assert bulkhead.in_flight() == 0


def test_rs4_a_thread_giving_a_slot_back_wakes_a_task_on_another_loop():
    """RS-4: threads and tasks share one count: a slot given back by a plain thread wakes
    the task waiting on an event loop in another thread."""
    bulkhead, tickets = full(1, 30.0)

    async def main() -> object:
        waiting = asyncio.ensure_future(bulkhead.aenter())
        while bulkhead.waiting() == 0:
            await asyncio.sleep(0)
        giver = threading.Thread(target=bulkhead.leave, args=(tickets[0],))
        giver.start()
        ticket = await asyncio.wait_for(waiting, JOIN)
        giver.join(JOIN)
        return ticket

    ticket = asyncio.run(main())
    assert bulkhead.in_flight() == 1
    bulkhead.leave(ticket)
    assert bulkhead.in_flight() == 0


def test_rs4_async_wait_ends_after_max_wait_on_the_clock():
    """RS-4: a task's wait ends when the clock passes max_wait, with BulkheadFullError."""
    clock = FakeClock()
    bulkhead, _ = full(1, 3.0, clock)

    async def main() -> None:
        waiting = asyncio.ensure_future(bulkhead.aenter())
        while bulkhead.waiting() == 0:
            await asyncio.sleep(0)
        clock.advance(3.0)
        with pytest.raises(BulkheadFullError):
            await asyncio.wait_for(waiting, JOIN)

    asyncio.run(main())
    assert bulkhead.waiting() == 0 and bulkhead.in_flight() == 1


def test_rs4_a_cancelled_waiting_task_leaves_the_queue_and_takes_nothing():
    """RS-4: cancelling a waiting task removes it from the queue; the next slot given back
    is free again (nothing leaked, nothing stolen)."""
    bulkhead, tickets = full(1, 30.0)

    async def main() -> None:
        waiting = asyncio.ensure_future(bulkhead.aenter())
        while bulkhead.waiting() == 0:
            await asyncio.sleep(0)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting

    asyncio.run(main())
    assert bulkhead.waiting() == 0 and bulkhead.in_flight() == 1
    bulkhead.leave(tickets[0])
    assert bulkhead.in_flight() == 0


def test_rs4_a_task_cancelled_after_it_was_handed_a_slot_passes_the_slot_on():
    """RS-4: a slot handed to a waiting task that is cancelled before it resumes goes to
    the next waiter (here: back to the free slots), never lost."""
    bulkhead, tickets = full(1, 30.0)

    async def main() -> None:
        first = asyncio.ensure_future(bulkhead.aenter())
        second = asyncio.ensure_future(bulkhead.aenter())
        while bulkhead.waiting() < 2:
            await asyncio.sleep(0)
        bulkhead.leave(tickets[0])  # handed to `first`, which has not run yet
        assert bulkhead.waiting() == 1
        first.cancel()
        with pytest.raises(asyncio.CancelledError):
            await first
        bulkhead.leave(await asyncio.wait_for(second, JOIN))  # `second` got the slot `first` gave up

    asyncio.run(main())
    assert bulkhead.in_flight() == 0 and bulkhead.waiting() == 0


@pytest.mark.parametrize(
    ("limit", "max_wait", "named"),
    [
        (0, 0.0, "limit=0"),
        (True, 0.0, "limit=True"),
        ("3", 0.0, "limit='3'"),
        (2.5, 0.0, "limit=2.5"),
        (1, -1.0, "max_wait=-1.0"),
        (1, float("nan"), "max_wait=nan"),
        (1, float("inf"), "max_wait=inf"),
        (1, "1", "max_wait='1'"),
    ],
)
def test_rs8_bad_arguments_raise_config_error_naming_them(limit, max_wait, named):
    """RS-4, RS-8: a bad limit or max_wait is a ConfigError naming the argument and value."""
    with pytest.raises(ConfigError, match=named.replace("(", r"\(")):
        Bulkhead("pay", limit, max_wait, FakeClock())


def test_rs4_leave_refuses_a_ticket_that_is_not_its_own():
    """RS-4: a foreign ticket (another bulkhead's, or anything else) is a ConfigError."""
    one, other = Bulkhead("a", 1, 0.0, FakeClock()), Bulkhead("b", 1, 0.0, FakeClock())
    ticket = other.enter()
    for wrong in (ticket, object(), None):
        with pytest.raises(ConfigError, match="ticket="):
            one.leave(wrong)
    assert other.in_flight() == 1


# The steps a give-back takes without the lock, pinned one interleaving at a time: the test
# swaps the bulkhead's token give-back (``_give``, the ``put`` of a free token) for one that
# lets another caller act just before or just after the token lands among the free ones.


class JumpingBulkhead(Bulkhead):
    """Broken on purpose (meta-test): takes a free token without looking for waiters."""

    __slots__ = ()

    async def aenter(self, *, timeout: float | None = None) -> object:
        try:
            self._take()
        except queue.Empty:
            return await super().aenter(timeout=timeout)
        return [self]

    def enter(self, *, timeout: float | None = None) -> object:
        try:
            self._take()
        except queue.Empty:
            return super().enter(timeout=timeout)
        return [self]


class PutOnlyBulkhead(Bulkhead):
    """Broken on purpose (meta-test): a give-back that puts the token back and never looks
    for waiters."""

    __slots__ = ()

    def leave(self, ticket: object) -> None:
        assert isinstance(ticket, list)
        ticket.remove(self)
        self._give(True)


class LookFirstBulkhead(Bulkhead):
    """Broken on purpose (meta-test): a give-back that looks for waiters first and puts the
    token back after, without looking again."""

    __slots__ = ()

    def leave(self, ticket: object) -> None:
        assert isinstance(ticket, list)
        ticket.remove(self)
        anyone = self.waiting() > 0
        self._give(True)
        if anyone:
            self._grant()


def check_a_waiter_queued_just_before_the_give_back_is_served(kind: type[Bulkhead], monkeypatch) -> None:
    """A thread queues up while a give-back is under way, just before the token lands among
    the free ones: when ``leave`` returns, the slot is the waiter's (no lost wake-up)."""
    clock = FakeClock()
    bulkhead = kind("pay", 1, 30.0, clock)
    ticket = bulkhead.enter()
    waiter = Waiter(bulkhead)
    give = bulkhead._give

    def queue_a_waiter_then_give(token: bool) -> None:
        waiter.start()
        until(lambda: bulkhead.waiting() == 1, "the thread to wait")
        give(token)

    monkeypatch.setattr(bulkhead, "_give", queue_a_waiter_then_give)
    try:
        bulkhead.leave(ticket)
        assert bulkhead.waiting() == 0, "leave returned with the slot free and a thread asleep"
        waiter.join(JOIN)
        assert waiter.error is None and waiter.ticket is not None
    finally:
        clock.advance(30.0)  # a broken bulkhead's sleeper: its wait ends, refused
        waiter.join(JOIN)


def check_a_newcomer_never_takes_the_slot_freed_for_a_waiter(kind: type[Bulkhead], monkeypatch) -> None:
    """Newcomers (a thread, then a task) arrive just after a freed token lands among the free
    ones while a thread waits: each is refused (none jumps the queue), and the slot is the
    waiter's."""
    clock = FakeClock()
    bulkhead = kind("pay", 1, 30.0, clock)
    ticket = bulkhead.enter()
    waiter = Waiter(bulkhead)
    waiter.start()
    until(lambda: bulkhead.waiting() == 1, "the thread to wait")
    give = bulkhead._give
    newcomers: list[object] = []

    def give_then_newcomers(token: bool) -> None:
        give(token)
        for enter in (bulkhead.enter, lambda timeout: asyncio.run(bulkhead.aenter(timeout=timeout))):
            try:
                newcomers.append(enter(timeout=0))
            except BulkheadFullError:
                newcomers.append("refused")

    monkeypatch.setattr(bulkhead, "_give", give_then_newcomers)
    try:
        bulkhead.leave(ticket)
        assert newcomers == ["refused", "refused"], "a newcomer took the slot freed for the waiting thread"
        waiter.join(JOIN)
        assert waiter.error is None and waiter.ticket is not None
    finally:
        clock.advance(30.0)
        waiter.join(JOIN)


def test_rs4_a_thread_that_queues_while_a_slot_is_given_back_is_not_left_asleep(monkeypatch):
    """RS-4, RS-10: the lost wake-up: a thread queues up between a give-back's start and its
    token landing among the free ones; the give-back still hands it the slot."""
    check_a_waiter_queued_just_before_the_give_back_is_served(Bulkhead, monkeypatch)


def test_rs4_a_newcomer_never_takes_a_slot_freed_while_someone_waits(monkeypatch):
    """RS-4: first come, first served at the instant a slot is freed: a newcomer that finds
    the token free while a thread waits is refused, and the waiter gets the slot."""
    check_a_newcomer_never_takes_the_slot_freed_for_a_waiter(Bulkhead, monkeypatch)


@pytest.mark.parametrize("broken", [PutOnlyBulkhead, LookFirstBulkhead])
def test_rs10_meta_a_give_back_that_does_not_look_for_waiters_after_its_put_is_caught(broken, monkeypatch):
    """RS-10 (meta): a give-back that never looks for waiters, or looks before it puts the
    token back, leaves the waiter asleep next to a free slot; the lost wake-up test says so."""
    with pytest.raises(AssertionError, match="a thread asleep"):
        check_a_waiter_queued_just_before_the_give_back_is_served(broken, monkeypatch)


class JumpingTaskBulkhead(JumpingBulkhead):
    """Broken on purpose (meta-test): only the task's take ignores the waiters."""

    __slots__ = ()

    def enter(self, *, timeout: float | None = None) -> object:
        return Bulkhead.enter(self, timeout=timeout)


@pytest.mark.parametrize("broken", [JumpingBulkhead, JumpingTaskBulkhead])
def test_rs10_meta_a_fast_path_that_ignores_waiters_is_caught(broken, monkeypatch):
    """RS-10 (meta): a lock-free take (a thread's or a task's) that does not first look for
    waiters lets a newcomer jump the queue; the first-come-first-served test says so."""
    with pytest.raises(AssertionError, match="took the slot"):
        check_a_newcomer_never_takes_the_slot_freed_for_a_waiter(broken, monkeypatch)

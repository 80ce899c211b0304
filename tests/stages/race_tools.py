"""Shared pieces of the bulkhead race tests: a meter of calls in flight and drivers that call
through a bulkhead from many threads or asyncio tasks at once.

A driver never sleeps to order anything: threads start together at a barrier, tasks at
``asyncio.gather``; inside the protected call a thread gives up the GIL (``time.sleep(0)``)
and a task yields to the loop (``asyncio.sleep(0)``), so the callers interleave as much as
they can.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from baldur_django.core.errors import BulkheadFullError

JOIN_SECONDS = 120.0  # a hung driver fails the test instead of hanging the run


@dataclass
class Meter:
    """Counts calls inside the protected function: now, at most, in all; refusals and any
    other error raised by the bulkhead."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    now: int = 0
    most: int = 0
    calls: int = 0
    refused: int = 0
    errors: list[BaseException] = field(default_factory=list)
    stop_on_trouble: bool = False  # a meta-test's broken bulkhead: stop at the first refusal or error

    def troubled(self) -> bool:
        return self.stop_on_trouble and bool(self.refused or self.errors)

    def arrive(self) -> None:
        with self.lock:
            self.now += 1
            self.calls += 1
            self.most = max(self.most, self.now)

    def depart(self) -> None:
        with self.lock:
            self.now -= 1

    def refusal(self) -> None:
        with self.lock:
            self.refused += 1

    def error(self, exc: BaseException) -> None:
        with self.lock:
            self.errors.append(exc)


@contextmanager
def fast_switching() -> Iterator[None]:
    """Ask the interpreter to switch threads every microsecond, for the block's duration."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        yield
    finally:
        sys.setswitchinterval(before)


def call_in_thread(bulkhead, meter: Meter, calls: int, timeout: float | None = None) -> None:
    """*calls* protected calls in this thread; the call itself gives up the GIL once."""
    for _ in range(calls):
        if meter.troubled():
            return
        try:
            ticket = bulkhead.enter(timeout=timeout)
        except BulkheadFullError:
            meter.refusal()
            continue
        except Exception as exc:
            meter.error(exc)
            continue
        try:
            meter.arrive()
            time.sleep(0)
            meter.depart()
        finally:
            try:
                bulkhead.leave(ticket)
            except Exception as exc:
                meter.error(exc)


async def call_in_task(bulkhead, meter: Meter, calls: int, timeout: float | None = None) -> None:
    """*calls* protected calls in this task; the call itself yields to the loop once."""
    for _ in range(calls):
        if meter.troubled():
            return
        try:
            ticket = await bulkhead.aenter(timeout=timeout)
        except BulkheadFullError:
            meter.refusal()
            continue
        except Exception as exc:
            meter.error(exc)
            continue
        try:
            meter.arrive()
            await asyncio.sleep(0)
            meter.depart()
        finally:
            try:
                bulkhead.leave(ticket)
            except Exception as exc:
                meter.error(exc)


def run_threads(bulkhead, threads: int, calls: int, timeout: float | None = None, meter: Meter | None = None) -> Meter:
    """*threads* threads, started together at a barrier, each making *calls* calls."""
    meter = meter or Meter()
    barrier = threading.Barrier(threads)

    def body() -> None:
        barrier.wait()
        call_in_thread(bulkhead, meter, calls, timeout)

    workers = [threading.Thread(target=body, daemon=True) for _ in range(threads)]
    with fast_switching():
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join(JOIN_SECONDS)
    assert not any(w.is_alive() for w in workers), "a thread never finished"
    return meter


def run_tasks(bulkhead, tasks: int, calls: int, meter: Meter | None = None, timeout: float | None = None) -> Meter:
    """*tasks* asyncio tasks on a new event loop in this thread, each making *calls* calls."""
    meter = meter or Meter()

    async def main() -> None:
        await asyncio.gather(*(call_in_task(bulkhead, meter, calls, timeout) for _ in range(tasks)))

    asyncio.run(main())
    return meter


def run_processes(target: Callable[..., None], arg_lists: list[tuple]) -> list:
    """One spawned process per tuple of *arg_lists*, each running ``target(*args, start, out)``:
    they begin together at the *start* barrier once every one of them is ready (imported,
    connected), so they race; each puts its result on *out*. Returns the results in the order
    they came, after every process ended with exit code 0."""
    ctx = multiprocessing.get_context("spawn")
    start, out = ctx.Barrier(len(arg_lists) + 1), ctx.Queue()
    workers = [ctx.Process(target=target, args=(*args, start, out)) for args in arg_lists]
    for process in workers:
        process.start()
    start.wait(JOIN_SECONDS)
    results = [out.get(timeout=JOIN_SECONDS) for _ in workers]
    for process in workers:
        process.join(JOIN_SECONDS)
        assert process.exitcode == 0, f"a worker process ended with exit code {process.exitcode}"
    return results

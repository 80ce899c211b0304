"""Timing primitives: interleaved rounds, paired against a bare baseline.

Every scenario measures its contenders *and* the bare baseline in the same round, in an
order shuffled per round, so slow phases of a busy machine hit all of them alike. Per
round the overhead of a contender is its ns/call minus the baseline's ns/call of that
same round; the reported figure is the median of those paired differences.
"""

from __future__ import annotations

import gc
import random
import statistics
import threading
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from itertools import repeat
from typing import Any

__all__ = [
    "Sample",
    "use_cpu_time",
    "clock_name",
    "now_ns",
    "loop_calls",
    "loop_rejections",
    "loop_protect",
    "loop_protect_knob",
    "loop_protect_knobs3",
    "loop_protect_knobs5",
    "aloop_calls",
    "aloop_protect",
    "aloop_protect_knob",
    "interleave",
    "ainterleave",
    "thread_batch",
    "interleave_threads",
    "quantiles",
]

_now = time.perf_counter_ns
_wall = time.perf_counter_ns  # the thread scenario's clock, whatever use_cpu_time() chose


def use_cpu_time(on: bool) -> None:
    """Time the loops with this thread's CPU time (``time.thread_time_ns``) instead of wall
    time (``time.perf_counter_ns``, the default). On a busy machine wall time also counts
    the slices other processes take while a loop runs; CPU time leaves them out (cache and
    frequency effects of the neighbours stay in). Throughput (:func:`thread_batch`) is
    always wall time."""
    global _now
    _now = time.thread_time_ns if on else time.perf_counter_ns


def now_ns() -> int:
    """The loops' clock right now (nanoseconds; wall or thread CPU, see :func:`use_cpu_time`)."""
    return _now()


def clock_name() -> str:
    """``"wall"`` or ``"thread CPU"``: the clock the loops use now."""
    return "thread CPU" if _now is time.thread_time_ns else "wall"


def loop_calls(func: Callable[[], Any], n: int) -> int:
    """Call ``func()`` *n* times; return the elapsed nanoseconds (int)."""
    start = _now()
    for _ in repeat(None, n):
        func()
    return _now() - start


def loop_rejections(func: Callable[[], Any], n: int, catch: type[BaseException] | tuple = Exception) -> int:
    """Call ``func()`` *n* times inside ``try/except catch``; return elapsed nanoseconds.

    The bare baseline runs through the same loop with a function that returns normally,
    so the overhead of a rejection includes raising and catching its exception.
    """
    start = _now()
    for _ in repeat(None, n):
        try:
            func()
        except catch:
            pass
    return _now() - start


def loop_protect(protect: Callable[..., Any], service: str, call: Callable[[], Any], n: int) -> int:
    """Run ``protect(service, call)`` *n* times, as a view writes it inline; return elapsed ns."""
    start = _now()
    for _ in repeat(None, n):
        protect(service, call)
    return _now() - start


def loop_protect_knob(protect: Callable[..., Any], service: str, call: Callable[[], Any], n: int) -> int:
    """Run ``protect(service, call, failure_threshold=3)`` *n* times: the same per-call knob
    passed on every call, as inline code does; return elapsed ns."""
    start = _now()
    for _ in repeat(None, n):
        protect(service, call, failure_threshold=3)
    return _now() - start


def loop_protect_knobs3(protect: Callable[..., Any], service: str, call: Callable[[], Any], n: int) -> int:
    """Run ``protect(service, call, retry=False, failure_threshold=5, recovery_timeout=3600)``
    *n* times (the three-knob row, written literally as a view writes it); return elapsed ns."""
    start = _now()
    for _ in repeat(None, n):
        protect(service, call, retry=False, failure_threshold=5, recovery_timeout=3600)
    return _now() - start


def loop_protect_knobs5(protect: Callable[..., Any], service: str, call: Callable[[], Any], n: int) -> int:
    """The five-knob row: the three knobs of :func:`loop_protect_knobs3` plus
    ``failure_rate_threshold=50, minimum_calls=10``; return elapsed ns."""
    start = _now()
    for _ in repeat(None, n):
        protect(
            service,
            call,
            retry=False,
            failure_threshold=5,
            recovery_timeout=3600,
            failure_rate_threshold=50,
            minimum_calls=10,
        )
    return _now() - start


async def aloop_protect(
    aprotect: Callable[..., Awaitable[Any]], service: str, factory: Callable[[], Any], n: int
) -> int:
    """Await ``aprotect(service, factory)`` *n* times in the running event loop; return elapsed ns."""
    start = _now()
    for _ in repeat(None, n):
        await aprotect(service, factory)
    return _now() - start


async def aloop_protect_knob(
    aprotect: Callable[..., Awaitable[Any]], service: str, factory: Callable[[], Any], n: int
) -> int:
    """Await ``aprotect(service, factory, failure_threshold=3)`` *n* times; return elapsed ns."""
    start = _now()
    for _ in repeat(None, n):
        await aprotect(service, factory, failure_threshold=3)
    return _now() - start


async def aloop_calls(func: Callable[[], Awaitable[Any]], n: int) -> int:
    """Await ``func()`` *n* times in the running event loop; return elapsed nanoseconds."""
    start = _now()
    for _ in repeat(None, n):
        await func()
    return _now() - start


def quantiles(values: list[float]) -> tuple[float, float, float]:
    """(25th percentile, median, 75th percentile) of *values* (at least one value)."""
    if len(values) == 1:
        return values[0], values[0], values[0]
    q = statistics.quantiles(values, n=4, method="inclusive")
    return q[0], statistics.median(values), q[2]


@dataclass
class Sample:
    """Per-round figures of one contender in one scenario.

    Attributes:
        per_call (list[float]): ns per call in each round (or calls/s for throughput).
        over_bare (list[float]): the paired figure against the baseline of the same round:
            ns over the bare call (latency scenarios) or contender/bare ratio (throughput).
    """

    per_call: list[float] = field(default_factory=list)
    over_bare: list[float] = field(default_factory=list)

    @property
    def median(self) -> float:
        return statistics.median(self.per_call)

    @property
    def overhead(self) -> float:
        return statistics.median(self.over_bare)

    def spread(self) -> tuple[float, float]:
        """(p25, p75) of the paired figure, to show how noisy the rounds were."""
        low, _, high = quantiles(self.over_bare)
        return low, high


def _rounds_order(names: list[str], rounds: int, seed: int) -> list[list[str]]:
    rng = random.Random(seed)
    orders = []
    for _ in range(rounds):
        order = list(names)
        rng.shuffle(order)
        orders.append(order)
    return orders


def interleave(
    runners: Mapping[str, Callable[[int], int]],
    *,
    baseline: str,
    rounds: int,
    n: int,
    seed: int = 0,
) -> dict[str, Sample]:
    """Run every runner once per round, in a shuffled order, and pair it with *baseline*.

    Args:
        runners: name -> ``runner(n) -> elapsed ns`` for *n* calls; must include *baseline*.
        baseline: the name of the bare runner.
        rounds: measured rounds (one unrecorded warm-up round runs first).
        n: calls per runner per round.
        seed: seeds the per-round shuffle, so runs are repeatable.

    Returns:
        name -> :class:`Sample` (ns/call; ``over_bare`` is ns over the bare call). The
        baseline's own ``over_bare`` is all zeros.
    """
    names = list(runners)
    for name in names:  # warm-up: let the adaptive interpreter specialise every loop
        runners[name](n)
    samples = {name: Sample() for name in names}
    gc_was_enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        for order in _rounds_order(names, rounds, seed):
            elapsed = {name: runners[name](n) for name in order}
            _record_round(samples, elapsed, baseline, n)
    finally:
        if gc_was_enabled:
            gc.enable()
    return samples


def _record_round(samples: dict[str, Sample], elapsed: Mapping[str, int], baseline: str, n: int) -> None:
    """File one round: each contender's ns per call, and its overhead over the same round's bare call."""
    bare = elapsed[baseline] / n
    for name, total in elapsed.items():
        per_call = total / n
        samples[name].per_call.append(per_call)
        samples[name].over_bare.append(per_call - bare)


async def ainterleave(
    runners: Mapping[str, Callable[[int], Awaitable[int]]],
    *,
    baseline: str,
    rounds: int,
    n: int,
    seed: int = 0,
) -> dict[str, Sample]:
    """:func:`interleave` for coroutine runners, awaited inside the running event loop."""
    names = list(runners)
    for name in names:
        await runners[name](n)
    samples = {name: Sample() for name in names}
    gc_was_enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        for order in _rounds_order(names, rounds, seed):
            elapsed = {}
            for name in order:
                elapsed[name] = await runners[name](n)
            _record_round(samples, elapsed, baseline, n)
    finally:
        if gc_was_enabled:
            gc.enable()
    return samples


def thread_batch(
    func: Callable[[], Any] | None, threads: int, per_thread: int, loop: Callable[[int], Any] | None = None
) -> float:
    """Hammer ``func`` from *threads* threads, *per_thread* calls each; return calls/second.

    With *loop*, each thread runs ``loop(per_thread)`` instead, a loop that makes the calls
    itself (a call with arguments, written as the caller would write it).

    The clock starts when every thread has passed a start barrier and stops when the
    last one has finished, so thread creation is not measured.
    """
    barrier = threading.Barrier(threads + 1)
    errors: list[BaseException] = []
    run: Callable[[int], Any] = loop if loop is not None else (lambda n: loop_calls(func, n))  # type: ignore[arg-type]

    def work() -> None:
        try:
            barrier.wait()
            run(per_thread)
        except BaseException as exc:  # surfaced below, never swallowed
            errors.append(exc)

    pool = [threading.Thread(target=work, daemon=True) for _ in range(threads)]
    for thread in pool:
        thread.start()
    barrier.wait()
    start = _wall()
    for thread in pool:
        thread.join()
    elapsed = _wall() - start
    if errors:
        raise RuntimeError(f"a benchmark thread failed: {errors[0]!r}") from errors[0]
    return threads * per_thread / (elapsed / 1e9)


def interleave_threads(
    funcs: Mapping[str, Callable[[], Any]],
    *,
    baseline: str,
    rounds: int,
    threads: int,
    per_thread: int,
    seed: int = 0,
    loops: Mapping[str, Callable[[int], Any]] | None = None,
) -> dict[str, Sample]:
    """Throughput rounds: every function hammered by *threads* threads once per round.

    Args:
        loops: name -> ``loop(n)`` making *n* calls itself, for contenders whose call
            takes arguments (see :func:`thread_batch`); measured alongside *funcs*.

    Returns:
        name -> :class:`Sample` whose ``per_call`` holds calls/second per round and whose
        ``over_bare`` holds the contender/bare throughput ratio of the same round.
    """
    loops = dict(loops or {})
    names = [*funcs, *loops]

    def batch(name: str, count: int) -> float:
        if name in loops:
            return thread_batch(None, threads, count, loops[name])
        return thread_batch(funcs[name], threads, count)

    for name in names:
        batch(name, max(1, per_thread // 10))
    samples = {name: Sample() for name in names}
    gc_was_enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        for order in _rounds_order(names, rounds, seed):
            rate = {name: batch(name, per_thread) for name in order}
            for name in names:
                samples[name].per_call.append(rate[name])
                samples[name].over_bare.append(rate[name] / rate[baseline])
    finally:
        if gc_was_enabled:
            gc.enable()
    return samples

"""``python -m benchmarks --profile``: where the nanoseconds of a CLOSED success go.

Two views of ``circuit_breaker``'s CLOSED hot path (steady state, window full):

1. cProfile of many calls, top entries by own time. cProfile adds a fixed cost to every
   function call it sees, so it shows *which* calls happen, not their true cost.
2. A step ladder: wrappers that rebuild the hot path of ``hotpath.sync_wrapper`` one
   line at a time, measured with the same interleaved, bare-paired harness as the
   benchmarks. The increments say what each line costs. ``tests/test_hot_path.py`` runs the
   full replica and the real wrapper (``core/hotpath.py``) on a tracing breaker and fails
   when they take different steps, so the ladder cannot drift from the code it explains.
"""

from __future__ import annotations

import cProfile
import io
import pstats
from collections.abc import Callable
from typing import Any

import baldur_django as baldur
from baldur_django.core.breaker import core_of

from .harness import interleave, loop_calls
from .scenarios import BenchSettings, _service, _target, _target_response, _warm_up_baldur

__all__ = ["profile_closed", "ladder", "measure_ladder", "format_ladder"]


def profile_closed(calls: int = 300_000, top: int = 12, warmup: int = 1_000, response: bool = False) -> str:
    """cProfile *calls* CLOSED successes through ``circuit_breaker``; return the top entries.

    Args:
        calls: number of profiled calls.
        top: how many entries (by own time) to print.
        warmup: calls before profiling (raised to fill the window).
        response: the wrapped function returns a response object (``status_code`` 200)
            instead of an int, which takes the status-classifying path.
    """
    target = _target_response if response else _target
    func = baldur.circuit_breaker(_service("profile", "cprofile"))(target)
    _warm_up_baldur(func, warmup)
    profiler = cProfile.Profile()
    profiler.runcall(loop_calls, func, calls)
    text = io.StringIO()
    stats = pstats.Stats(profiler, stream=text)
    stats.sort_stats("tottime").print_stats(top)
    return text.getvalue()


def ladder(func: Callable[[], Any]) -> list[tuple[str, Callable[[], Any]]]:
    """Wrappers rebuilding the hot path of the ``circuit_breaker``-wrapped *func* step by step.

    Args:
        func: a function returned by ``baldur.circuit_breaker(...)`` (it has ``.breaker``
            and ``.__wrapped__``), already warmed up to the steady CLOSED state.

    Returns:
        ``[(description, wrapper), ...]`` from the cheapest step to the full replica, then
        the real wrapper itself.
    """
    breaker = core_of(func.breaker)  # type: ignore[attr-defined]  # the core the wrapper reads
    inner = func.__wrapped__  # type: ignore[attr-defined]
    cascade = breaker.cascade
    monotonic = breaker.mono
    record_success = breaker.record_success
    plain = breaker.plain_types  # bound once, as the wrapper binds it (PLAIN_TYPES unless a result_predicate is set)
    policy = None

    def forward(*args: Any, **kwargs: Any) -> Any:
        return inner(*args, **kwargs)

    def admit(*args: Any, **kwargs: Any) -> Any:
        permit = breaker.quiet_permit
        if permit is None or (breaker.timed and monotonic() >= breaker.sync_due):
            raise AssertionError("not CLOSED on the healthy lane")
        return inner(*args, **kwargs)

    def guarded(*args: Any, **kwargs: Any) -> Any:
        permit = breaker.quiet_permit
        if permit is None or (breaker.timed and monotonic() >= breaker.sync_due):
            raise AssertionError("not CLOSED on the healthy lane")
        if policy is not None and not permit.dry_run:
            raise AssertionError("no retry expected")
        try:
            result = inner(*args, **kwargs)
        except BaseException:
            raise
        return result

    def typed(*args: Any, **kwargs: Any) -> Any:
        permit = breaker.quiet_permit
        if permit is None or (breaker.timed and monotonic() >= breaker.sync_due):
            raise AssertionError("not CLOSED on the healthy lane")
        if policy is not None and not permit.dry_run:
            raise AssertionError("no retry expected")
        try:
            result = inner(*args, **kwargs)
        except BaseException:
            raise
        if type(result) in plain:
            pass
        return result

    def checked(*args: Any, **kwargs: Any) -> Any:
        permit = breaker.quiet_permit
        if permit is None or (breaker.timed and monotonic() >= breaker.sync_due):
            raise AssertionError("not CLOSED on the healthy lane")
        if policy is not None and not permit.dry_run:
            raise AssertionError("no retry expected")
        try:
            result = inner(*args, **kwargs)
        except BaseException:
            raise
        if type(result) in plain:  # noqa: SIM102 - one step of the wrapper per line, as it takes them
            if permit is breaker.healthy_permit and monotonic() < cascade.bucket_end:
                pass
        return result

    def counted(*args: Any, **kwargs: Any) -> Any:
        permit = breaker.quiet_permit
        if permit is None or (breaker.timed and monotonic() >= breaker.sync_due):
            raise AssertionError("not CLOSED on the healthy lane")
        if policy is not None and not permit.dry_run:
            raise AssertionError("no retry expected")
        try:
            result = inner(*args, **kwargs)
        except BaseException:
            raise
        if type(result) in plain:
            if permit is breaker.healthy_permit and monotonic() < cascade.bucket_end:
                next(cascade.counter)
            else:
                record_success(permit)
        return result

    return [
        ("python wrapper forwarding *args, **kwargs", forward),
        ("+ admit: read breaker.quiet_permit and _timed", admit),
        ("+ retry check and try/except around the call", guarded),
        ("+ type(result) in plain (the breaker's PLAIN_TYPES)", typed),
        ("+ healthy-permit test and monotonic() < bucket_end", checked),
        ("+ next(cascade.counter) (full replica)", counted),
        ("the real circuit_breaker wrapper", func),
    ]


def measure_ladder(settings: BenchSettings, rounds: int | None = None) -> list[tuple[str, float, float]]:
    """Measure every ladder step against a bare call, interleaved.

    Returns:
        ``[(description, median ns over bare, increment over the previous step), ...]``.
    """
    func = baldur.circuit_breaker(_service("profile", "ladder"))(_target)
    _warm_up_baldur(func, settings.warmup)
    steps = ladder(func)
    runners = {"bare": lambda n: loop_calls(_target, n)}
    for name, step in steps:
        runners[name] = lambda n, f=step: loop_calls(f, n)
    samples = interleave(
        runners, baseline="bare", rounds=rounds or settings.rounds, n=settings.calls, seed=settings.seed
    )
    out = []
    previous = 0.0
    for index, (name, _) in enumerate(steps):
        overhead = samples[name].overhead
        increment = overhead - previous if index < len(steps) - 1 else overhead - out[-1][1]
        out.append((name, overhead, increment))
        previous = overhead
    return out


def format_ladder(rows: list[tuple[str, float, float]], bare_ns: float | None = None) -> str:
    """The ladder as a text table (the last row's increment is real minus replica)."""
    width = max(len(name) for name, _, _ in rows)
    lines = [f"{'step':<{width}}  {'over bare':>9}  {'step cost':>9}", f"{'-' * width}  {'-' * 9}  {'-' * 9}"]
    for index, (name, overhead, increment) in enumerate(rows):
        label = "vs replica" if index == len(rows) - 1 else ""
        lines.append(f"{name:<{width}}  {overhead:>7.0f}ns  {increment:>+7.0f}ns {label}".rstrip())
    return "\n".join(lines)
